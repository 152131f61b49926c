"""The compiled CPU decode step (skipdecode/kernels/compiled.py): the same tokens as the eager step, bit for bit; one
graph for every layer, layer subset and adapter; batch invariance; the eager step, with its reason, where
nothing compiles; the cache on disk reused by a second process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from conftest import PROMPTS, IdTokenizer, tiny_model
from skipdecode import models
from skipdecode.kernels import compiled, q4
from skipdecode.engine import Engine
from skipdecode.schedule import Schedule, for_speedup

BATCH = [[1, 17, 43, 99, 5], [1, 250, 7], [1, 8, 9, 10, 11, 12, 13, 14]]  # left padding in every row but one
ROOT = Path(__file__).resolve().parents[1]


def tiny_int4(layers: int = 6, lora: int = 0, c_kernels: bool = False) -> Engine:
    """A random Llama on the 4-bit path: its matrices quantized to Q4_1-style blocks, packed for PyTorch's
    int4 kernel, or with `c_kernels` for the int8 kernel beside the C attention (skipdecode/kernels/native.py); with
    `lora`, a random rank-`lora` adapter unmerged on the fused query/key/value product."""
    from skipdecode.kernels import native, w4a8

    model = tiny_model("llama", layers=layers)
    blocks = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp

        def int4(*linears):
            found = q4.quantize(torch.cat([lin.weight.detach() for lin in linears]))
            return w4a8.W4A8Linear.of(found) if c_kernels else q4.Int4Linear.of(found)

        qkv = int4(a.q_proj, a.k_proj, a.v_proj)
        if lora:
            qkv = qkv.with_lora(torch.randn(qkv.in_features, lora) * 0.1, torch.randn(lora, qkv.out_features) * 0.1)
        blocks.append((qkv, int4(a.o_proj), int4(m.gate_proj, m.up_proj), int4(m.down_proj)))
    head = q4.RescoredHead(model.get_output_embeddings().weight.detach(), rescore=16)
    weights = q4.GGUFWeights(blocks, head, "int4 (tiny)", attention=native.attention if c_kernels else None)
    return Engine(model, IdTokenizer(), weights=weights)


def decode(engine, compile, policy=None, batch=BATCH, tokens=12, stop=True):
    engine.compile = compile
    return engine.generate(batch, policy, max_new_tokens=tokens, stop_at_eos=stop).token_ids


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.fixture(autouse=True)
def inductor_cache(tmp_path_factory, monkeypatch):
    """One inductor cache for this module's tests, not the user's."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "inductor"))


@pytest.mark.slow
def test_compiled_step_decodes_what_the_eager_steps_decode():
    engine = tiny_int4()
    # auto: measured not to pay (docs/research/compiled-step.md)
    assert engine.step_label == f"eager step: {compiled.AUTO_EAGER}"
    for policy in (None, Schedule(6, 6, 2, warmup=1, horizon=6)):
        for stop in (True, False):
            want = decode(engine, "off", policy, stop=stop)  # the eager step ...
            engine.graphs = "on"
            assert decode(engine, "off", policy, stop=stop) == want  # ... the eager static step ...
            engine.graphs = "auto"
            assert decode(engine, "on", policy, stop=stop) == want  # ... and the compiled one
    assert engine._steps.compiled.fn is not None


@pytest.mark.slow
def test_one_graph_serves_every_layer_subset_and_adapter():
    plain, adapted = tiny_int4(), tiny_int4(lora=2)
    decode(plain, "on", tokens=3)  # batch 3, width 256: compiled once
    decode(adapted, "on", tokens=3)  # a LoRA term on the fused product: its own graph
    before = graphs()
    for engine in (plain, adapted, tiny_int4(), tiny_int4(lora=2)):  # other weights, other engines
        for policy in (None, Schedule(6, 6, 2, warmup=1, horizon=6), Schedule(6, 6, 3, warmup=1, horizon=6)):
            decode(engine, "on", policy)
    assert graphs() == before  # no layer, subset, position, adapter or engine compiled anew
    decode(plain, "on", batch=BATCH[:1], tokens=3)
    assert graphs() == before + 1  # another batch size is another graph


@pytest.mark.slow
def test_a_row_decodes_the_same_in_a_batch_of_16_as_alone():
    engine = tiny_int4()
    rows = [BATCH[i % 3] for i in range(16)]
    batch = decode(engine, "on", batch=rows, stop=False)
    for i in range(3):
        assert decode(engine, "on", batch=[rows[i]], stop=False)[0] == batch[i]


def test_without_a_compiler_the_eager_step_runs_and_says_why(monkeypatch):
    engine = tiny_int4()
    want = decode(engine, "off")
    monkeypatch.setattr(compiled, "compiler", lambda: None)
    assert decode(engine, "on") == want
    assert engine.step_label == "eager step: no C++ compiler (install g++ or set CXX)"
    assert engine._steps is None or engine._steps.compiled.fn is None


def test_the_c_kernels_run_the_eager_step_and_say_why():
    """ctypes calls are opaque to dynamo: a decoder on the C kernels steps eagerly under "on" and says so."""
    engine = tiny_int4(c_kernels=True)
    want = decode(engine, "off")
    assert decode(engine, "on") == want
    assert engine.step_label == f"eager step: {compiled.NATIVE_EAGER}"


def test_a_failed_compile_falls_back_to_the_eager_step(monkeypatch):
    engine = tiny_int4()
    want = decode(engine, "off")

    def broken(*args):
        raise RuntimeError("the compiler said no")

    monkeypatch.setattr(compiled, "compiled_layer", lambda: broken)
    assert decode(engine, "on") == want
    assert engine.step_label == "eager step: compiling failed: RuntimeError: the compiler said no"


def test_the_setting_is_read_and_checked(monkeypatch):
    monkeypatch.delenv(compiled.COMPILE_ENV, raising=False)
    assert Engine(tiny_model("llama"), IdTokenizer()).step_label == f"eager step: {compiled.AUTO_EAGER}"
    monkeypatch.setenv(compiled.COMPILE_ENV, "off")
    assert tiny_int4().step_label == f"eager step: {compiled.COMPILE_ENV}=off"
    monkeypatch.setenv(compiled.COMPILE_ENV, "sometimes")
    with pytest.raises(ValueError, match=compiled.COMPILE_ENV):
        tiny_int4().generate(BATCH, max_new_tokens=2)


@pytest.mark.slow
def test_a_second_process_reuses_the_compiled_graphs_on_disk(tmp_path):
    """Inductor's cache sits in the model cache: a process started after this one compiled a graph loads it
    instead of compiling it. This process compiles into the module's inductor folder (`inductor_cache`),
    which becomes the new process's model cache's; the C kernels' folder is the session's (built once)."""
    decode(tiny_int4(), "on", batch=[[1, 5, 7]], tokens=3)  # compiled here, now or by a test before this one
    (tmp_path / "inductor").symlink_to(os.environ["TORCHINDUCTOR_CACHE_DIR"], target_is_directory=True)
    kernels = models.cache_dir() / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    (tmp_path / "kernels").symlink_to(kernels, target_is_directory=True)
    script = ("import sys; sys.path.insert(0, 'tests'); from test_compiled import tiny_int4;"
              "from torch._dynamo.utils import counters; e = tiny_int4();"
              "e.generate([[1, 5, 7]], max_new_tokens=3); print(counters['inductor']['fxgraph_cache_hit'],"
              " counters['inductor']['fxgraph_cache_miss'])")
    env = {**os.environ, "SKIPDECODE_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT), "SKIPDECODE_COMPILE": "on"}
    env.pop("TORCHINDUCTOR_CACHE_DIR")  # the new process finds its inductor folder in the model cache
    found = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    assert found == ["1", "0"]  # loaded, not compiled


@pytest.mark.slow
def test_bundled_compiled_step_decodes_what_the_eager_step_decodes(monkeypatch):
    """The default model on its 4-bit path with PyTorch's int4 kernel (what the compiled step traces): the
    eager step's tokens come out of the compiled step too, full depth and SkipDecode, in a padded batch and
    alone."""
    from skipdecode.kernels import w4a8

    monkeypatch.setenv(w4a8.KERNEL_ENV, "bf16")
    engine = Engine.load(dtype=q4.INT4)
    prompts = [*PROMPTS, "Write a haiku about the sea."]
    for schedule in (None, for_speedup(3, engine.num_layers, horizon=32)):
        want = decode(engine, "off", schedule, batch=prompts, tokens=32)
        assert decode(engine, "on", schedule, batch=prompts, tokens=32) == want
        assert decode(engine, "on", schedule, batch=prompts[-1:], tokens=32)[0] == want[-1]
    assert engine.step_label == "compiled step"
