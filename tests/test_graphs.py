"""The graphed decode step (skipdecode/kernels/cuda_graphs.py): the static step decodes what the eager step decodes.

On a CPU the static step runs uncaptured (`engine.graphs = "on"`), which checks its math (the column as a
tensor, the whole cache width under a mask, no compaction); on a GPU the captured graphs are checked too.
"""

import pytest
import torch

from conftest import IdTokenizer, tiny_model
from skipdecode.engine import GRAPHS_ENV, Engine
from skipdecode.kernels import cuda_graphs
from skipdecode.kernels.cuda_graphs import MAX_STEPS, MIN_CPU_WIDTH, MIN_WIDTH, bucket, cache_bytes
from skipdecode.evaluation.peers import EarlyExit
from skipdecode.schedule import Schedule

BATCH = [[1, 17, 43, 99, 5], [1, 250, 7], [1, 8, 9, 10, 11, 12, 13, 14]]  # left padding in every row but one


def decode(engine, graphs, policy, stop_at_eos=True, batch=BATCH):
    engine.graphs = graphs
    return engine.generate(batch, policy, max_new_tokens=12, stop_at_eos=stop_at_eos).token_ids


@pytest.mark.parametrize("kind", ["llama", "opt", "gpt2"])
def test_static_step_decodes_what_the_eager_step_decodes(kind):
    engine = Engine(tiny_model(kind, layers=6), IdTokenizer())
    for policy in (None, Schedule(6, 6, 2, warmup=1, horizon=6)):
        for stop in (True, False):  # with EOS on, finished rows stay in the static batch and are ignored
            assert decode(engine, "on", policy, stop) == decode(engine, "off", policy, stop)
    assert not engine._steps.lent and len(engine._steps.free) == 1  # one step, reused, given back



def test_finished_rows_stay_in_the_static_batch():
    engine = Engine(tiny_model("llama", layers=6), IdTokenizer())
    engine.graphs = "on"
    finished = engine.generate(BATCH, max_new_tokens=12)
    assert min(map(len, finished.token_ids)) < 12  # a row stopped at EOS (this seed's first row, at 9) ...
    assert {s.rows for s in finished.trace.steps} == {len(BATCH)}  # ... and its column is still computed


def test_steps_are_lent_one_generation_at_a_time_and_bounded():
    engine = Engine(tiny_model("llama"), IdTokenizer())
    engine.graphs = "on"
    streams = [engine.stream(BATCH[:1], max_new_tokens=4) for _ in range(MAX_STEPS + 1)]
    for stream in streams:  # interleaved, as the app runs a comparison's two generations
        next(stream)
    steps = engine._steps
    assert len(steps.lent) == MAX_STEPS  # the fifth generation found none free and decodes eagerly
    outs = [list(stream)[-1].token_ids for stream in streams]
    assert all(out == outs[0] for out in outs)
    assert not steps.lent and len(steps.free) <= MAX_STEPS
    # a per-token policy decides per row: it never takes a static step
    engine.generate(BATCH, EarlyExit(4, 0.5), max_new_tokens=4)
    assert not steps.lent


def test_kept_caches_stay_within_their_byte_budget(monkeypatch):
    engine = Engine(tiny_model("llama"), IdTokenizer())
    engine.graphs = "on"
    one = cache_bytes(engine.decoder, 1, MIN_WIDTH if engine.decoder.device.type == "cuda" else MIN_CPU_WIDTH)
    monkeypatch.setattr(cuda_graphs, "MAX_CACHE_BYTES", 3 * one)
    engine.generate(BATCH[:1], max_new_tokens=4)
    engine.generate(BATCH[:2], max_new_tokens=4)  # batch 2 (2 units) joins batch 1 (1 unit): 3, at the budget
    assert sorted(s.batch for s in engine._steps.free.values()) == [1, 2]
    engine.generate(BATCH[:3], max_new_tokens=4)  # batch 3 needs 3 units: both free steps go
    assert [s.batch for s in engine._steps.free.values()] == [3]
    held = engine.stream(BATCH[:3], max_new_tokens=4)
    next(held)  # batch 3 is out on loan: a batch 1 would exceed the budget and decodes eagerly
    eager = engine.generate(BATCH[:1], max_new_tokens=4).token_ids
    assert eager == [decode(engine, "off", None, batch=BATCH[:1])[0][:4]]
    assert len(engine._steps.lent) == 1 and not engine._steps.free
    list(held)
    assert [s.batch for s in engine._steps.free.values()] == [3]


def test_widths_are_bucketed():
    assert bucket(10, 2048) == MIN_WIDTH
    assert bucket(MIN_WIDTH + 1, 2048) == 2 * MIN_WIDTH
    assert bucket(1500, 2048) == 2048 and bucket(2000, 2000) == 2000
    assert bucket(10, 2048, MIN_CPU_WIDTH) == MIN_CPU_WIDTH and bucket(100, 2048, MIN_CPU_WIDTH) == 128


def test_graphs_setting_is_checked(monkeypatch):
    monkeypatch.setenv(GRAPHS_ENV, "off")  # a host's setting, read by every engine
    assert Engine(tiny_model("llama"), IdTokenizer()).graphs == "off"
    monkeypatch.setenv(GRAPHS_ENV, "sometimes")
    engine = Engine(tiny_model("llama"), IdTokenizer())
    with pytest.raises(ValueError, match="graphs"):
        engine.generate(BATCH, max_new_tokens=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_decode_what_the_eager_step_decodes():
    engine = Engine(tiny_model("llama", layers=6).to("cuda"), IdTokenizer())
    for policy in (None, Schedule(6, 6, 2, warmup=1, horizon=6)):
        want = decode(engine, "off", policy)
        assert decode(engine, "auto", policy) == want
        assert engine._steps.free and all(s.graphs for s in engine._steps.free.values())  # captured
        assert decode(engine, "auto", policy) == want  # replayed from the kept graphs
