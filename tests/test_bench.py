"""The benchmark's arithmetic and wiring (not its timings: speed is what `skipdecode bench` prints)."""

import csv
import json
import os
from pathlib import Path

import pytest

from skipdecode.evaluation.bench.cost import CostModel, schedule_steps, trace_steps
from skipdecode.evaluation.bench.figure import speed_figure
from skipdecode.evaluation.bench.goals import goals
from skipdecode.evaluation.bench.rows import agreement
from skipdecode.schedule import Schedule, for_speedup
from skipdecode.trace import StepRecord, Trace

# SmolLM2-135M: d 576, 9 query heads and 3 key/value heads of 64, MLP 1536, vocabulary 49,152 (tied head).
D, Q, KV, FF, V = 576, 9 * 64, 3 * 64, 1536, 49152
LAYER = 2 * D + D * (Q + 2 * KV) + Q * D + D * 2 * FF + FF * D
HEAD = V * D + D


def test_cost_model_counts_the_default_models_weights(engine):
    cost = CostModel.of(engine.decoder)
    assert cost == CostModel(embedding=D, layer=LAYER, kv_only=D + D * 2 * KV, head=HEAD, attention_width=Q,
                             kv_width=KV)
    whole = D + 30 * LAYER + HEAD
    assert 0.19 < HEAD / whole < 0.23  # the head is about a fifth of a token's weights


def test_bound_of_known_schedules():
    cost = CostModel(embedding=D, layer=LAYER, kv_only=D + D * 2 * KV, head=HEAD, attention_width=Q)
    full = Schedule.full(30)
    assert cost.bound(30, 40, schedule_steps(full, 10)) == 1.0
    # budget 10 at every step, prompt of 40 columns, 2 steps: contexts 41 and 42
    ten = Schedule(30, 10, 10, warmup=2, horizon=1)
    work = lambda layers, ctx: D + layers * (LAYER + 2 * Q * ctx) + HEAD  # noqa: E731
    want = (work(30, 41) + work(30, 42)) / (work(10, 41) + work(10, 42))
    assert cost.bound(30, 40, schedule_steps(ten, 2, rows=4)) == pytest.approx(want)
    assert 2.0 < want < 2.2  # a third of the layers is far from 3x: the head stays
    # the nominal 5x schedule is bounded well below 5
    five = for_speedup(5, 30, horizon=64)
    assert 2.5 < cost.bound(30, 40, schedule_steps(five, 63)) < 3.0
    # without a head or embedding (and no attention), the bound is the layer ratio
    bare = CostModel(embedding=0, layer=LAYER, kv_only=0, head=0, attention_width=0)
    assert bare.bound(30, 40, schedule_steps(ten, 5)) == pytest.approx(3.0)


def test_peer_work_counts_the_copied_keys_and_values():
    trace = Trace(30, 2, 40, {})
    trace.steps.append(StepRecord(0, 30, tuple(range(30)), (), 1.0, 2))
    from skipdecode.evaluation.peers import ExitRecord

    trace.steps[0] = ExitRecord(0, 12, tuple(range(12)), tuple(range(12, 30)), 1.0, 2, exits=(5, 12))
    assert trace_steps(trace) == [[(5, 25, 1), (12, 18, 1)]]
    assert trace_steps(trace, heads_per_layer=True) == [[(5, 25, 5), (12, 18, 12)]]
    cost = CostModel(embedding=D, layer=LAYER, kv_only=D + D * 2 * KV, head=HEAD, attention_width=Q)
    peer = cost.bound(30, 40, trace_steps(trace))
    no_copy = cost.bound(30, 40, [[(5, 0, 1), (12, 0, 1)]])
    assert 1 < peer < no_copy


def test_floor_is_the_bytes_a_step_reads_over_the_bandwidth():
    cost = CostModel(embedding=10, layer=1000, kv_only=100, head=500, attention_width=8, kv_width=4)
    elements = cost.reads()  # one byte an element: the bytes count the elements
    # one row, 3 layers, context 5: 10 + 3 x 1000 + 500 weights and 3 layers x 2 x 4 x 5 cached elements
    assert elements.step(3, 5) == 10 + 3000 + 500 + 120
    # four rows share the weights; each reads its embedding row and its own cache
    assert elements.step(3, 5, rows=4) == 40 + 3000 + 500 + 480
    assert elements.step(3, 5, kv_only=2, heads=3) == 10 + 3000 + 200 + 1500 + 120
    # prompt 4: contexts 5 and 6; 2-byte elements at 1e6 bytes/s
    full = schedule_steps(Schedule.full(3), 2)
    want = (elements.step(3, 5) + elements.step(3, 6)) / 2 * 2 / 1e6 * 1000
    assert cost.reads(2).floor_ms(4, full, 1e6) == pytest.approx(want)
    assert cost.reads(4).floor_ms(4, full, 1e6) == pytest.approx(2 * want)  # float32 reads twice the bytes
    # a peer's batch runs its deepest row's layers and fills the keys and values above them
    peer = [[(1, 2, 1), (2, 1, 1)]]
    assert cost.reads(1).floor_ms(4, peer, 1e3) == pytest.approx(elements.step(2, 5, rows=2, kv_only=1) * 1000 / 1e3)


def test_read_bandwidth_is_bytes_over_seconds_of_the_fastest_pass(monkeypatch):
    """On a clock whose three passes take 0.5, 0.25 and 0.4 s: the probe's bytes over the fastest one."""
    from types import SimpleNamespace

    import torch

    from skipdecode.evaluation.bench import timing

    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.4])
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    probe = torch.ones(1 << 16)  # float32: 4 bytes an element
    assert timing.read_bandwidth(probe, repeats=3) == (1 << 16) * 4 / 0.25


def test_agreement_counts_full_outputs_tokens_up_to_eos():
    # the full output is cut at its EOS (2): 3 of its 4 tokens reproduced
    assert agreement([[5, 6, 9, 2, 7]], [[5, 6, 7, 2, 8, 8]], eos_ids=[2]) == 0.75
    assert agreement([[1, 2], [3]], [[1, 2], [4]], eos_ids=[2]) == pytest.approx(2 / 3)


def test_goals_are_ratios_against_thresholds():
    rows = [
        {"method": "full", "speedup": 1, "batch_size": 1, "tokens_per_s": 50, "vs_hf": 2.0, "vs_floor": 1.4},
        {"method": "full", "speedup": 1, "batch_size": 16, "tokens_per_s": 250},
        {"method": "skipdecode", "speedup": 3, "batch_size": 1, "tokens_per_s": 100, "efficiency": 0.95},
        {"method": "skipdecode", "speedup": 3, "batch_size": 16, "tokens_per_s": 700, "efficiency": 0.85},
        {"method": "early_exit_peer", "speedup": 3, "batch_size": 16, "tokens_per_s": 300},
    ]
    got = {g["goal"]: (g["value"], g["holds"]) for g in goals(rows)}
    assert got["full depth, batch 1: tokens/s vs transformers generate (end to end)"] == (2.0, True)
    assert got["full depth, batch 1: ms/token / weight-streaming floor"] == (1.4, False)
    assert got["SkipDecode 3x, batch 1: efficiency (measured / bound)"] == (0.95, True)
    assert got["SkipDecode 3x, batch 16: efficiency (measured / bound)"] == (0.85, False)
    assert got["1x: batch 16 tokens/s / batch 1 tokens/s"] == (5.0, False)
    assert got["3x: batch 16 tokens/s / batch 1 tokens/s"] == (7.0, True)
    assert got["3x, batch 16: SkipDecode tokens/s / early-exit peer tokens/s (equal layers per token)"][1]
    # on a GPU the GPU goals replace the CPU's: full depth against generate, 3x against full depth
    on_gpu = [{**row, "device": "cuda", "measured_speedup": row["tokens_per_s"] / 50} for row in rows[:3]]
    assert {g["goal"]: (g["value"], g["holds"]) for g in goals(on_gpu)} == {
        "GPU, full depth, batch 1: tokens/s vs transformers generate (end to end)": (2.0, False),
        "GPU, SkipDecode 3x, batch 1: speedup over full depth": (2.0, True)}


def test_goals_are_checked_for_each_decode_step():
    rows = [{"method": m, "speedup": s, "batch_size": 1, "tokens_per_s": t, "efficiency": e, "step": step}
            for step, scale in (("eager step", 1.0), ("CUDA graphs", 1.5))
            for m, s, t, e in (("full", 1, 50 * scale, 1.0), ("skipdecode", 3, 100 * scale, 0.95 * scale))]
    got = {g["goal"]: g["value"] for g in goals(rows)}
    assert got == {"[eager step] SkipDecode 3x, batch 1: efficiency (measured / bound)": 0.95,
                   "[CUDA graphs] SkipDecode 3x, batch 1: efficiency (measured / bound)": 1.425}


def test_speed_figure_is_built_from_rows():
    rows = [{"method": m, "speedup": s, "batch_size": b, "measured_speedup": s * 0.6, "bound": s * 0.65,
             "tokens_per_s": 10.0 * b} for m, s in (("full", 1), ("skipdecode", 3), ("early_exit_peer", 3))
            for b in (1, 16)]
    figure = speed_figure(rows)
    names = [t.name for t in figure.data]
    assert names == ["cost-model bound", "SkipDecode, batch 1", "SkipDecode, batch 16", "early-exit peer, batch 1",
                     "early-exit peer, batch 16"]
    assert list(figure.data[1].x) == [1, 3] and list(figure.data[0].y) == pytest.approx([0.65, 1.95])


def test_bench_command_writes_documented_rows(tmp_path, cli):
    out = tmp_path / "bench.csv"
    done = cli("bench", "--speedups", "2", "--batch-sizes", "1,2", "--new-tokens", "4", "--repeats", "1", "--json",
               "--out", out, "--no-llamacpp")  # in-process; llama.cpp's row: tests/test_llamacpp.py
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = report["rows"]
    assert [(r["method"], r["speedup"], r["batch_size"]) for r in rows] == [
        ("full", 1, 1), ("full", 1, 2), ("skipdecode", 2, 1), ("skipdecode", 2, 2),
        ("early_exit_peer", 2, 1), ("early_exit_peer", 2, 2)]
    required = {"speedup", "batch_size", "ms_per_token", "tokens_per_s", "measured_speedup", "bound", "efficiency",
                "floor_ms_per_token", "vs_floor", "read_gb_s"}
    for row in rows:
        assert required <= set(row) and row["ms_per_token"] > 0 and row["tokens_per_s"] > 0
        assert row["efficiency"] == pytest.approx(row["measured_speedup"] / row["bound"], abs=0.002)
        assert row["vs_floor"] == pytest.approx(row["ms_per_token"] / row["floor_ms_per_token"], rel=0.01)
        assert row["dtype"] == report["dtype"] and row["read_gb_s"] == report["read_gb_s"] > 0
        assert ("hf_generate_tokens_per_s" in row) == (row["speedup"] == 1)
    full = rows[0]
    assert full["bound"] == 1.0 and full["measured_speedup"] == 1.0 and full["hf_same_tokens"] is True
    assert full["hf_dtype"] == full["dtype"]  # transformers ran in the engine's dtype
    assert rows[2]["bound"] > 1 and rows[2]["layers_per_token"] < 30
    assert rows[2]["floor_ms_per_token"] < full["floor_ms_per_token"]  # fewer layers, fewer bytes
    from skipdecode.models import precision_reason

    assert report["precision"] == precision_reason("cpu") and report["precision"].startswith(report["dtype"])
    assert set(report["machine"]["isa"]) <= {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}
    assert report["goals"] and report["machine"]["cores"] >= 1
    assert {"bleu", "rouge_l", "chrf", "ser", "agreement"} <= set(full) and full["agreement"] == 1.0
    with open(out, newline="") as handle:
        written = list(csv.DictReader(handle))
    assert [float(r["bound"]) for r in written] == [r["bound"] for r in rows]
    assert json.loads(out.with_suffix(".json").read_text())["rows"] == rows


def test_bench_missing_data_is_a_clear_error(tmp_path, cli):
    done = cli("bench", "--data", tmp_path / "nowhere.csv")  # in-process: any other exception fails the test
    assert done.returncode == 2 and "E2E file not found" in done.stderr and "Traceback" not in done.stderr


def test_readme_section_is_replaced_and_the_rest_kept(tmp_path):
    from skipdecode.evaluation.bench.report import README_BEGIN, README_END, update_readme

    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nintro\n{README_BEGIN}\nold table\n{README_END}\n\n## After\n")
    row = {"method": "full", "speedup": 1, "batch_size": 1, "layers_per_token": 30.0, "ms_per_token": 20.0,
           "tokens_per_s": 50.0, "bound": 1.0, "efficiency": 1.0}
    report = {"command": "skipdecode bench --speedups 1", "model": "m", "date": "2026-01-01", "seconds": 3.0,
              "labels": {"packed": True}, "load_average_after": [0.1],
              "machine": {"cpu": "cpu", "cores": 2, "torch_threads": 2, "device": "cpu", "torch": "2",
                          "load_average": [0.2]},
              "rows": [row], "goals": goals([row])}
    update_readme(readme, report)
    text = readme.read_text()
    assert text.startswith("# Title\n\nintro\n") and text.endswith(f"{README_END}\n\n## After\n")
    assert "old table" not in text and "`skipdecode bench --speedups 1`" in text and "| full | 1 | 1 | 30.0 |" in text
    report.update(precision="bfloat16: this CPU has avx512_bf16", read_gb_s=30.5)
    report["machine"]["isa"] = ["avx2", "avx512_bf16"]
    update_readme(readme, report)
    assert "on cpu [avx2 avx512_bf16] (2 cores" in readme.read_text()
    assert "; bfloat16: this CPU has avx512_bf16; read bandwidth 30.5 GB/s;" in readme.read_text()
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="section"):
        update_readme(readme, report)


def test_readme_option_defaults_to_the_table_file():
    import argparse

    from skipdecode.evaluation.bench.command import register
    from skipdecode.evaluation.bench.report import TABLE_FILE

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["bench"]).readme is None
    assert parser.parse_args(["bench", "--readme", "--repeats", "2"]).readme == str(TABLE_FILE)
    assert parser.parse_args(["bench", "--readme", "docs/speed.md"]).readme == "docs/speed.md"
    assert parser.parse_args(["bench"]).dtype == "auto"


def test_only_a_readme_run_writes_the_shipped_table_by_default(tmp_path):
    from skipdecode.evaluation.bench.report import DEFAULT_OUT, output_path

    assert output_path(None, "docs/speed.md") == str(DEFAULT_OUT) and DEFAULT_OUT.is_absolute()
    quick = output_path(None, None)
    assert Path(quick).parent.is_dir() and Path(quick).resolve() != DEFAULT_OUT.resolve()
    assert output_path("", None) == "" and output_path(str(tmp_path / "b.csv"), "x") == str(tmp_path / "b.csv")


def test_floor_counts_the_bytes_the_decoder_holds(engine):
    """The floor reads each product's own `.nbytes`: for float32 that is 4 bytes a weight (today's floor,
    the same figures as before), in bfloat16 half of that (the cache stays float32 on a CPU), and a
    quantized product counts whatever its `.nbytes` says (its codes and scales)."""
    from types import SimpleNamespace

    import torch

    from conftest import tiny_model
    from skipdecode.evaluation.bench.cost import Reads
    from skipdecode.transformer import Decoder

    reads = Reads.of(engine.decoder)
    assert reads == Reads(embedding=4 * D, layer=4 * LAYER, kv_only=4 * (D + D * 2 * KV), head=4 * HEAD,
                          cache_column=4 * 2 * KV)
    assert reads == CostModel.of(engine.decoder).reads(4)
    assert engine.decoder.lm_head.nbytes == 4 * V * D

    half = Decoder(tiny_model("llama").to(torch.bfloat16))
    cost = CostModel.of(half)
    assert Reads.of(half) == Reads(embedding=2 * cost.embedding, layer=2 * cost.layer, kv_only=2 * cost.kv_only,
                                   head=2 * cost.head, cache_column=4 * 2 * half.kv_size)
    norms = 2 * 2 * half.embed_tokens.shape[1]  # two RMSNorm weights of d, 2 bytes each
    for block in half.blocks:
        block.qkv, block.out, block.up, block.down = (SimpleNamespace(nbytes=n) for n in (300, 100, 600, 200))
    packed = Reads.of(half)
    assert packed.layer == norms + 1200 and packed.kv_only == norms // 2 + 300 * 2 * half.kv_size // (
        half.q_size + 2 * half.kv_size)
    assert packed.weights(4) == 4 * packed.layer + packed.head


def test_kernel_decoders_load_one_engine_per_kernel_under_its_setting(monkeypatch):
    """`bench --kernel default,bf16,q8`: the engine's own decoder, and one per other kernel loaded with
    $SKIPDECODE_KERNEL set to it, the caller's setting back afterwards."""
    from types import SimpleNamespace

    from skipdecode.evaluation.bench.timing import kernel_decoders

    monkeypatch.setenv("SKIPDECODE_KERNEL", "auto")
    seen = []

    def load():
        seen.append(os.environ["SKIPDECODE_KERNEL"])
        return SimpleNamespace(decoder=f"decoder on {seen[-1]}")

    got = kernel_decoders(SimpleNamespace(decoder="own"), ("default", "bf16", "q8"), load)
    assert got == {"default": "own", "bf16": "decoder on bf16", "q8": "decoder on q8"}
    assert os.environ["SKIPDECODE_KERNEL"] == "auto"


def test_bench_kernel_choices_are_checked(tmp_path, cli):
    done = cli("bench", "--kernel", "fast", "--new-tokens", "4", "--repeats", "1", "--no-llamacpp")
    assert done.returncode == 2 and "--kernel takes a comma-separated list of default, q8, bf16" in done.stderr
    done = cli("bench", "--kernel", "default,bf16", "--new-tokens", "4", "--repeats", "1", "--no-llamacpp")
    assert done.returncode == 2 and "not on it" in done.stderr  # the tests' float32 path has no product kernels
