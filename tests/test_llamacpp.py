"""llama.cpp in the benchmark: its row from a real run when llama-cpp-python is installed (`make
bench-peers`; CI does not install it, and then these skip), a clear line naming that command when it is
missing, and one line when its child process crashes, after which the bench goes on."""

import json
import os
import sys
from pathlib import Path

import pytest

from skipdecode.evaluation.llamacpp import INSTALL, METHOD, Unavailable, import_llama_cpp
from skipdecode.evaluation.quality import common_prefix

BENCH = ("bench", "--speedups", "1,3", "--batch-sizes", "1", "--new-tokens", "8", "--repeats", "1", "--no-hf",
         "--no-peer", "--json", "--out", "")


def test_missing_llamacpp_is_one_line_naming_make_bench_peers(monkeypatch, cli):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if it were not installed: `import` fails
    with pytest.raises(Unavailable, match=f"`{INSTALL}` installs"):
        import_llama_cpp()
    done = cli("bench", "--speedups", "1", "--batch-sizes", "1", "--new-tokens", "2", "--repeats", "1", "--no-hf",
               "--json", "--out", "")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if INSTALL in line]
    assert len(lines) == 1 and "no llama.cpp row" in lines[0] and "llama-cpp-python" in lines[0]
    rows = json.loads(done.stdout)["rows"]
    assert [r["method"] for r in rows] == ["full"] and "vs_llamacpp" not in rows[0]  # and the bench went on


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2 and common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([5], [1]) == 0


def test_llamacpp_row_from_a_real_run(cli):
    pytest.importorskip("llama_cpp")
    done = cli(*BENCH)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = {r["method"]: r for r in report["rows"]}
    assert list(rows) == ["full", "skipdecode", METHOD]
    cpp, full = rows[METHOD], rows["full"]
    # like with like: the same prompt ids, length, batch and threads as our full-depth row
    assert (cpp["prompt_tokens"], cpp["new_tokens"], cpp["batch_size"]) == (full["prompt_tokens"], 8, 1)
    assert cpp["threads"] == report["machine"]["torch_threads"] and cpp["repeats"] == 1
    assert cpp["weights"].startswith("GGUF SmolLM2-135M-Instruct.Q4_1.gguf") and "Q4_1" in cpp["weights"]
    assert cpp["tokens_per_s"] == pytest.approx(1000 / cpp["ms_per_token"], rel=0.01)
    assert 0 < cpp["first_token_ms"] and 0 < cpp["e2e_tokens_per_s"] < cpp["tokens_per_s"]
    # its floor counts the GGUF's 4-bit bytes: far fewer than our float32 weights
    assert 0 < cpp["floor_ms_per_token"] < full["floor_ms_per_token"] / 3
    assert 0 <= cpp["agreement"] <= 1 and 0 <= cpp["same_prefix_tokens"] <= 8
    for ours in (full, rows["skipdecode"]):
        assert ours["vs_llamacpp"] == pytest.approx(ours["tokens_per_s"] / cpp["tokens_per_s"], rel=0.01)
    # llama-cpp-python's own generate, timed beside the native loop: the same tokens, its Python overhead reported
    assert cpp["generate_same_tokens"] is True
    assert cpp["generate_overhead_ms"] == pytest.approx(cpp["generate_ms_per_token"] - cpp["ms_per_token"], abs=2e-3)
    assert full["ttft_vs_llamacpp"] == pytest.approx(full["first_token_ms"] / cpp["first_token_ms"], rel=0.01)
    goals = {g["goal"]: g for g in report["goals"]}
    assert goals["full depth, batch 1: tokens/s / llama.cpp's (same GGUF, threads and prompt)"]["value"] == \
        pytest.approx(full["vs_llamacpp"], rel=0.01)
    assert goals["SkipDecode 3x, batch 1: tokens/s / llama.cpp's full-depth tokens/s"]["threshold"] == 3.0
    ttft = goals[f"full depth, batch 1: time to first token of the {full['prompt_tokens']}-token prompt / llama.cpp's"]
    assert ttft["op"] == "<=" and ttft["value"] == pytest.approx(full["ttft_vs_llamacpp"], rel=0.01)


def test_llamacpp_runs_the_whole_prompt_every_call_in_its_own_loop(engine):
    """Each timed call starts from an empty cache and generates exactly the tokens asked for, past EOS, in
    llama.cpp's own loop (llama_decode of the prompt, then of one token a step, each followed by its C greedy
    sampler): greedy, so the same tokens every time, and the tokens of llama-cpp-python's generate."""
    pytest.importorskip("llama_cpp")
    from skipdecode.evaluation import llamacpp

    ids = engine.encode("name[The Eagle], food[Italian]")
    from skipdecode.models import default_gguf

    runner = llamacpp.LlamaCpp(default_gguf(), 1, len(ids) + 6)  # in this process: its module is counted here
    decoded = []
    real = runner.cpp.llama_decode

    class Counting:  # the module's functions, llama_decode counted by the tokens of each batch it gets
        def __getattr__(self, name):
            return getattr(llamacpp.import_llama_cpp(), name)

        @staticmethod
        def llama_decode(ctx, batch):
            decoded.append(batch.n_tokens)
            return real(ctx, batch)

    runner.cpp = Counting()
    timings, first = runner.time(ids, 6)
    _, again = runner.time(ids, 6)
    assert len(first) == 6 and again == first
    assert decoded == [len(ids), 1, 1, 1, 1, 1] * 2  # the prompt, then one token a step, twice
    total, to_first, per_step = timings
    assert 0 < to_first < total and per_step == pytest.approx((total - to_first) / 5)
    generated_timings, generated = runner.time_generate(ids, 6)
    assert generated == first and len(generated_timings) == 3
    assert runner.time(ids, 6)[1] == first  # the high-level call left nothing behind in the cache


# The child's program with a stand-in for llamacpp.LlamaCpp (llamacpp_child.serve's runner): its first
# FAKE_LLAMACPP_ANSWERS calls answer, and the next kills its process with SIGSEGV, as llama.cpp's AMX kernel does
# where the kernel does not grant AMX.
FAKE = """
import os, signal
from skipdecode.evaluation.llamacpp_child import serve

class Crashing:
    version = "fake"

    def __init__(self, gguf, threads, context):
        self.calls = int(os.environ.get("FAKE_LLAMACPP_ANSWERS", "0"))

    def time(self, ids, new_tokens):
        if self.calls == 0:
            os.kill(os.getpid(), signal.SIGSEGV)
        self.calls -= 1
        return (3.0, 1.0, 1.0), list(ids)[:new_tokens]

    time_generate = time

serve(Crashing)
"""


@pytest.fixture
def crashing(tmp_path, monkeypatch):
    """The child's command swapped for the crashing stand-in, which imports this checkout's package."""
    from skipdecode.evaluation import llamacpp_child

    (tmp_path / "fake_llamacpp.py").write_text(FAKE)
    root = str(Path(__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(llamacpp_child, "CHILD", (str(tmp_path / "fake_llamacpp.py"),))
    return monkeypatch


def test_the_child_answers_then_its_crash_is_one_line_naming_make_bench_peers(crashing):
    from skipdecode.evaluation.llamacpp_child import Crashed, InChild

    crashing.setenv("FAKE_LLAMACPP_ANSWERS", "1")
    runner = InChild("model.gguf", 2, 64)
    assert runner.version == "fake" and runner.threads == 2 and runner.gguf.name == "model.gguf"
    assert runner.time([5, 6, 7], 2) == ((3.0, 1.0, 1.0), [5, 6])  # a round trip through the pipes
    with pytest.raises(Crashed, match=r"^llama\.cpp crashed: signal 11 \(SIGSEGV\).*`make bench-peers` rebuilds"):
        runner.time_generate([5, 6, 7], 2)
    runner.close()


def test_bench_goes_on_when_llamacpp_crashes(crashing, engine):
    from skipdecode.evaluation.bench import timing
    from skipdecode.evaluation.data import Item
    from skipdecode.evaluation.llamacpp_child import InChild

    crashing.setenv("FAKE_LLAMACPP_ANSWERS", "2")  # the warm-up round's two timings, then the crash
    said = []
    rows, _ = timing.run(engine, [Item("name[The Eagle], food[French]", ("x",))], speedups=(1,), batch_sizes=(1,),
                         new_tokens=2, repeats=1, hf=False, peer=False, progress=said.append,
                         llamacpp=InChild("model.gguf", 1, 64))
    lines = [line for line in said if "llama.cpp crashed" in line]
    assert len(lines) == 1 and "signal 11" in lines[0] and INSTALL in lines[0], said
    assert [r["method"] for r in rows] == ["full"] and "vs_llamacpp" not in rows[0]  # and the bench went on
