"""The micro-batcher on a real engine (a small random Llama): who shares a batch, what each request sees,
and that bad input, errors, cancellation and time limits never stall the worker."""

import threading
import time

import pytest

from conftest import IdTokenizer, tiny_model
from skipdecode.batcher import Batcher, Job, follow
from skipdecode.beam import Beam
from skipdecode.engine import Engine
from skipdecode.sampling import Sampling
from skipdecode.schedule import Schedule

PROMPTS = [[5, 17, 33, 4], [9, 8, 7, 6, 5, 4, 3], [40, 41], [100, 101, 102, 103, 104]]


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny_model("llama", layers=6), IdTokenizer())


@pytest.fixture
def batcher():
    batcher = Batcher(window_s=0.2)
    yield batcher
    batcher.close()


def skip_schedule(engine):
    return Schedule(engine.num_layers, max_budget=5, min_budget=2, warmup=1, horizon=6)


def test_requests_submitted_from_several_threads_at_once_share_one_batch(engine, batcher):
    schedule = skip_schedule(engine)
    start, results = threading.Barrier(len(PROMPTS)), [None] * len(PROMPTS)

    def user(i):
        start.wait()
        results[i] = batcher.submit(engine, PROMPTS[i], schedule, max_new_tokens=8, stop_at_eos=False).result()

    threads = [threading.Thread(target=user, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert {r.batch.number for r in results} == {results[0].batch.number}
    assert results[0].batch.size == len(PROMPTS) == results[0].trace.batch_size
    assert sorted(r.row for r in results) == list(range(len(PROMPTS)))
    # Each request got its own row, and batching changed nothing: the same tokens as decoding alone.
    for i, result in enumerate(results):
        alone = engine.generate([PROMPTS[i]], schedule, max_new_tokens=8, stop_at_eos=False)
        assert result.token_ids == alone.token_ids[0]
        assert result.prompt_ids == PROMPTS[i]
        assert len(result.token_ids) == 8 and result.finished and result.done


def test_each_request_streams_growing_snapshots_of_its_own_row(engine, batcher):
    tickets = batcher.submit_together([Job.of(engine, p, skip_schedule(engine), 6, stop_at_eos=False)
                                       for p in PROMPTS[:2]])
    seen = [[], []]
    for updates in follow(tickets):
        for i, update in enumerate(updates):
            if update is not None:
                seen[i].append(len(update.token_ids))
    for lengths in seen:
        assert lengths == sorted(lengths) and lengths[-1] == 6


def test_different_schedules_run_as_separate_batches_interleaved(engine, batcher):
    skip, full = batcher.submit_together([Job.of(engine, PROMPTS[0], skip_schedule(engine), 10, stop_at_eos=False),
                                          Job.of(engine, PROMPTS[0], None, 10, stop_at_eos=False)])
    both_running = False
    for s, f in follow([skip, full]):
        if s is not None and f is not None and not s.done and not f.done and s.token_ids and f.token_ids:
            both_running = True
    assert both_running, "the two batches should advance position by position, side by side"
    assert s.batch.number != f.batch.number and s.batch.size == f.batch.size == 1
    assert [step.budget for step in s.trace.steps] == [skip_schedule(engine).budget(i) for i in range(9)]
    assert all(step.budget == engine.num_layers for step in f.trace.steps)


def test_max_rows_splits_a_group(engine):
    batcher = Batcher(window_s=0.2, max_rows=3)
    try:
        tickets = batcher.submit_together([Job.of(engine, p, None, 3) for p in PROMPTS])
        finals = [None] * len(tickets)
        for finals in follow(tickets):
            pass
        assert sorted(u.batch.size for u in finals) == [1, 3, 3, 3]
    finally:
        batcher.close()


def test_sampling_settings_are_part_of_the_batch_key(engine, batcher):
    greedy, sampled = batcher.submit_together([Job.of(engine, PROMPTS[0], None, 4),
                                               Job.of(engine, PROMPTS[1], None, 4, Sampling(0.8, seed=1))])
    finals = None
    for finals in follow([greedy, sampled]):
        pass
    assert finals[0].batch.number != finals[1].batch.number


def test_beam_searches_batch_by_rows_and_equal_searching_alone(engine):
    batcher = Batcher(window_s=0.2, max_rows=6)
    try:
        beam, schedule = Beam(3), skip_schedule(engine)
        jobs = [Job.of(engine, p, schedule, 6, beam=beam) for p in PROMPTS[:3]] + [Job.of(engine, PROMPTS[3], schedule, 6)]
        finals = None
        for finals in follow(batcher.submit_together(jobs)):
            pass
        searched, greedy = finals[:3], finals[3]
        assert sorted(u.batch.size for u in searched) == [1, 2, 2]  # 3 beams a request, 6 rows a batch
        assert greedy.batch.number not in {u.batch.number for u in searched}
        for prompt, update in zip(PROMPTS, searched):
            alone = engine.generate([prompt], schedule, max_new_tokens=6, beam=beam)
            assert update.token_ids == alone.token_ids[0] and update.done
        with pytest.raises(ValueError, match="at most 6 beams"):
            batcher.submit(engine, PROMPTS[0], beam=Beam(8))
    finally:
        batcher.close()


def test_bad_input_is_refused_in_the_callers_thread(engine, batcher):
    with pytest.raises(ValueError, match="context"):
        batcher.submit(engine, list(range(1, 250)), max_new_tokens=64)
    with pytest.raises(ValueError, match="max_new_tokens"):
        batcher.submit(engine, PROMPTS[0], max_new_tokens=0)
    with pytest.raises(ValueError, match="layers"):
        batcher.submit(engine, PROMPTS[0], Schedule(8, 4, 2, warmup=1))
    assert batcher.submit(engine, PROMPTS[0], max_new_tokens=2).result().done  # the worker is fine


class BrokenEngine:
    """An engine whose forward pass fails, standing in for e.g. running out of memory mid-batch."""

    def __init__(self, engine):
        self.num_layers, self.decoder, self.encode = engine.num_layers, engine.decoder, engine.encode

    def run(self, *args, **kwargs):
        raise RuntimeError("out of memory")
        yield


def test_a_failing_batch_fails_its_requests_and_the_worker_carries_on(engine, batcher):
    with pytest.raises(RuntimeError, match="out of memory"):
        batcher.submit(BrokenEngine(engine), PROMPTS[0]).result()
    assert len(batcher.submit(engine, PROMPTS[0], max_new_tokens=3, stop_at_eos=False).result().token_ids) == 3


def test_time_limit_stops_a_request(engine):
    batcher = Batcher(window_s=0.0, time_limit_s=0.05)
    try:
        with batcher.exclusive():  # hold the model so the request cannot finish in time
            ticket = batcher.submit(engine, PROMPTS[0], max_new_tokens=50, stop_at_eos=False)
            time.sleep(0.3)
        with pytest.raises(TimeoutError, match="time limit"):
            ticket.result()
    finally:
        batcher.close()


class CountingEngine:
    """The real engine, counting the positions its streams have run."""

    def __init__(self, engine):
        self.engine, self.positions = engine, 0
        self.num_layers, self.decoder, self.encode = engine.num_layers, engine.decoder, engine.encode

    def run(self, *args, **kwargs):
        for generation in self.engine.run(*args, **kwargs):
            self.positions += 1
            yield generation


def test_exclusive_work_pauses_decoding_and_cancel_stops_the_batch(engine, batcher):
    counting = CountingEngine(engine)
    with batcher.exclusive():
        ticket = batcher.submit(counting, PROMPTS[0], max_new_tokens=200, stop_at_eos=False)
        time.sleep(0.4)
        assert counting.positions == 0, "no position may run while another user of the model holds it"
    next(iter(ticket))
    ticket.cancel()
    time.sleep(0.2)
    stopped_at = counting.positions
    time.sleep(0.3)
    assert counting.positions == stopped_at < 200
    assert batcher.submit(engine, PROMPTS[1], max_new_tokens=2).result().done
