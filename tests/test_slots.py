"""The continuous batch (skipdecode/slots.py) on the C kernels: rows at different positions and on different
schedules share each step and decode exactly what they decode alone; rows join mid-run and leave at once;
a row's cache never has a hole; and the batcher serves plain requests through it."""

import time

import pytest
import torch

from skipdecode.batcher import Batcher
from skipdecode.sampling import Sampling
from skipdecode.schedule import Schedule
from skipdecode.slots import PREFILL_CHUNK, Row, SlotCache, Slots, segments

NEW = 12


@pytest.fixture(scope="module")
def engine():
    from conftest import tiny_int4

    return tiny_int4(c_kernels=True)


def plans(L):
    """Four schedules whose layer sets are not all nested (warm-up 1 and 2) and one sampled row."""
    return [(Schedule(L, 6, 3, warmup=1, horizon=8), Sampling()),
            (Schedule.full(L), Sampling()),
            (Schedule(L, 5, 3, warmup=2, horizon=4), Sampling(temperature=0.9, seed=7)),
            (Schedule(L, 4, 2, warmup=1, horizon=3), Sampling())]


def prompts():
    g = torch.Generator().manual_seed(3)
    long = torch.randint(2, 200, (PREFILL_CHUNK + 9,), generator=g).tolist()  # two prefill chunks
    return [[1, 17, 43, 99, 5], long, [1, 250, 7], [1, 8, 9, 10, 11, 12, 13, 14]]


def alone(engine, ids, schedule, sampling):
    return engine.generate([ids], schedule, max_new_tokens=NEW, sampling=sampling, stop_at_eos=False).token_ids[0]


def test_segments_group_the_layers_each_set_of_rows_runs():
    sets = [(0, 1, 4, 5), (0, 1, 2, 3, 4, 5), (0, 5)]  # bottom to top: a layer runs after those below it
    assert segments(sets, 6) == [([0], [0, 1, 2]), ([1], [0, 1]), ([2, 3], [1]), ([4], [0, 1]), ([5], [0, 1, 2])]
    assert segments([(0, 4, 5), (0, 4, 5)], 6) == [([0, 4, 5], [0, 1])]  # no row runs 1-3: one call
    assert segments([(0, 1, 3, 4, 5), (0, 1, 4, 5)], 6) == [([0, 1], [0, 1]), ([3], [0]), ([4, 5], [0, 1])]


def test_rows_joining_mid_run_decode_what_they_decode_alone(engine):
    L = engine.num_layers
    expected = [alone(engine, ids, s, sm) for ids, (s, sm) in zip(prompts(), plans(L))]
    slots = Slots(engine, max_rows=4, prefixes=None)
    rows = [Row(ids, s, NEW, sm, stop_at_eos=False) for ids, (s, sm) in zip(prompts(), plans(L))]
    shared = set()
    for i, row in enumerate(rows):  # one joins every other step, the rest keep decoding meanwhile
        slots.add(row)
        for _ in range(2):
            slots.advance()
    while any(not r.finished for r in rows):
        slots.advance()
        shared |= {step.rows for r in rows for step in r.trace.steps}
    assert [r.token_ids for r in rows] == expected
    assert max(shared) == 4  # all four rows shared a step at their own positions
    assert [len(r.trace.steps) for r in rows] == [NEW - 1] * 4
    for r, (s, _) in zip(rows, plans(L)):
        assert [step.layers for step in r.trace.steps] == [s.layers(k) for k in range(NEW - 1)]
        assert r.trace.cache_lengths == [len(r.prompt_ids) + sum(l in s.layers(k) for k in range(NEW - 1))
                                         for l in range(L)]
    assert slots.drop_finished() == rows and slots.cache is None  # an idle batch holds no cache


def test_a_finished_row_frees_its_slot_for_the_next(engine):
    L = engine.num_layers
    slots = Slots(engine, max_rows=2, prefixes=None)
    short = slots.add(Row([1, 5, 6], Schedule.full(L), 2, stop_at_eos=False))
    long = slots.add(Row([1, 7, 8, 9], Schedule(L, 6, 3, warmup=1, horizon=8), NEW, stop_at_eos=False))
    assert not slots.room()
    while not short.finished:
        slots.advance()
    slots.drop_finished()
    late = slots.add(Row([1, 250, 7], Schedule.full(L), 4, stop_at_eos=False))
    assert late.slot == short.slot and slots.cache.lengths[late.slot] == [0] * L
    while not (late.finished and long.finished):
        slots.advance()
    assert late.token_ids == alone(engine, [1, 250, 7], Schedule.full(L), Sampling())[:4]
    assert long.token_ids == alone(engine, [1, 7, 8, 9], Schedule(L, 6, 3, warmup=1, horizon=8), Sampling())


def test_the_cache_refuses_a_hole_row_by_row(engine):
    cache = SlotCache(engine.decoder, 2, 16)
    cache.claim(0, range(6), 0, 4)
    cache.claim(1, range(6), 0, 2)
    cache.claim(0, (0, 5), 4, 1)  # row 0 skips layers 1-4 at column 4
    with pytest.raises(RuntimeError, match="budget grow"):
        cache.claim(0, (0, 3, 5), 5, 1)  # layer 3 would attend over column 4, which it never ran
    cache.claim(1, range(6), 2, 1)  # row 1's own lengths are untouched by row 0's


def test_the_batcher_runs_plain_requests_as_one_continuous_batch(engine):
    L = engine.num_layers
    batcher = Batcher()
    try:
        first = batcher.submit(engine, prompts()[1], Schedule.full(L), NEW, stop_at_eos=False)
        next(iter(first))  # the first request is decoding before the second arrives
        second = batcher.submit(engine, prompts()[0], plans(L)[0][0], NEW, stop_at_eos=False)
        a, b = first.result(), second.result()
    finally:
        batcher.close()
    assert a.token_ids == alone(engine, prompts()[1], Schedule.full(L), Sampling())
    assert b.token_ids == alone(engine, prompts()[0], plans(L)[0][0], Sampling())
    assert a.batch.number == b.batch.number and b.batch.size == 2 and a.done and b.done
    assert max(step.rows for step in b.trace.steps) == 2


def test_cancel_and_the_time_limit_stop_a_continuous_row(engine):
    L = engine.num_layers
    batcher = Batcher(time_limit_s=0.001)
    try:
        ticket = batcher.submit(engine, prompts()[1], Schedule.full(L), 100, stop_at_eos=False)
        time.sleep(0.01)
        with pytest.raises(TimeoutError, match="time limit"):
            ticket.result()
    finally:
        batcher.close()
    batcher = Batcher()
    try:
        ticket = batcher.submit(engine, prompts()[0], Schedule.full(L), 200, stop_at_eos=False)
        next(iter(ticket))
        ticket.cancel()
        other = batcher.submit(engine, prompts()[2], Schedule.full(L), 3, stop_at_eos=False).result()
        assert other.token_ids == alone(engine, prompts()[2], Schedule.full(L), Sampling())[:3]
        assert other.batch.size == 1  # the cancelled row had left
    finally:
        batcher.close()


def test_scoring_joins_as_a_teacher_forced_row_with_the_bits_of_a_pass_alone(engine):
    """A teacher-forced row (the page's scoring) prefills in chunks beside a decoding row, which goes on
    decoding at every step meanwhile; its states are those of one full-depth pass alone, and so are the
    states Batcher.states returns."""
    L = engine.num_layers
    ids = prompts()[1] + [5, 6, 7]  # two prefill chunks
    alone_states = engine.hidden_states(torch.tensor([ids]))[-1][0, 10:]
    slots = Slots(engine, max_rows=2, prefixes=None)
    decoding = slots.add(Row(prompts()[0], Schedule.full(L), NEW, stop_at_eos=False))
    slots.advance()  # its prefill: its first token
    scoring = slots.add(Row(ids, Schedule.full(L), 0, states_from=10))
    for chunk in range(2):
        before = (len(decoding.token_ids), scoring.prefilled)
        slots.advance()
        assert len(decoding.token_ids) == before[0] + 1 and scoring.prefilled > before[1]
    assert scoring.finished and scoring.token_ids == [] and torch.equal(torch.cat(scoring.states), alone_states)
    batcher = Batcher()
    try:
        assert batcher.scores_as_rows(engine)
        assert torch.equal(batcher.states(engine, ids, 10), alone_states)
    finally:
        batcher.close()


def test_a_row_following_a_decoding_row_keeps_the_states_scoring_its_answer_as_it_comes(engine):
    """The page's scoring riding the decode: a teacher-forced row fed a SkipDecode row's tokens as they come
    (`leader`), and a full-depth row keeping its own states (`keep_states`), give the bits of one full-depth
    pass alone over each prompt and answer, and end with the answers: no step after the last token."""
    L = engine.num_layers
    prompt = prompts()[3]
    slots = Slots(engine, max_rows=4, prefixes=None)
    skip = slots.add(Row(prompt, Schedule(L, 4, 2, warmup=1, horizon=3), NEW, stop_at_eos=False))
    full = slots.add(Row(prompt, Schedule.full(L), NEW, stop_at_eos=False, keep_states=True))
    follower = slots.add(Row(prompt, Schedule.full(L), NEW, states_from=len(prompt) - 1, leader=skip))
    while not (skip.finished and full.finished):
        assert not follower.finished
        slots.advance()
    assert follower.finished and follower.token_ids == []  # it chose nothing, and ended in the same step
    for row, states in ((skip, follower.states), (full, full.states)):
        ids = prompt + row.token_ids[:-1]
        alone_states = engine.hidden_states(torch.tensor([ids]))[-1][0, len(prompt) - 1:]
        assert torch.equal(torch.cat(states), alone_states)
    assert skip.token_ids == alone(engine, prompt, skip.schedule, Sampling())  # the follower changed nothing
    slots.drop_finished()
    cancelled = slots.add(Row(prompt, Schedule.full(L), NEW, stop_at_eos=False))
    stays = slots.add(Row(prompt, Schedule.full(L), NEW, states_from=len(prompt) - 1, leader=cancelled))
    slots.advance()
    cancelled.cancelled = True
    slots.advance()
    assert stays.cancelled  # a follower leaves with its leader
    slots.drop_finished()
    elsewhere = Row(prompt, Schedule.full(L), NEW, stop_at_eos=False)  # a leader this batch never held (a failed step's)
    orphan = slots.add(Row(prompt, Schedule.full(L), NEW, states_from=len(prompt) - 1, leader=elsewhere))
    slots.advance()
    assert orphan.cancelled and slots.drop_finished() == [orphan]  # it left instead of waiting for ever


def test_the_batcher_runs_a_following_job_beside_its_leader_and_refuses_one_that_cannot_follow(engine):
    from skipdecode.batcher import Job, follow
    from skipdecode.request import check

    L, prompt = engine.num_layers, prompts()[3]
    request = check(engine, prompt, Schedule(L, 4, 2, warmup=1, horizon=3), NEW, stop_at_eos=False)
    batcher = Batcher()
    try:
        jobs = [Job(engine, request), Job(engine, request.at_full_depth(), keep_states=True),
                Job(engine, check(engine, prompt, max_new_tokens=1), states_from=len(prompt) - 1, follows=0)]
        *_, (skip, full, scoring) = follow(batcher.submit_together(jobs))
        assert skip.states is None and scoring.token_ids == []
        for answer, states in ((skip, scoring.states), (full, full.states)):
            assert torch.equal(states, batcher.states(engine, prompt + answer.token_ids[:-1], len(prompt) - 1))
        with pytest.raises(ValueError, match="following job"):  # a job cannot follow itself
            batcher.submit_together([Job(engine, request, states_from=0, follows=0)])
        with pytest.raises(ValueError, match="following job"):  # nor a job that chooses tokens follow another
            batcher.submit_together([Job(engine, request), Job(engine, request, follows=0)])
    finally:
        batcher.close()


def test_the_cache_grows_for_a_long_row_and_keeps_its_width_until_the_batch_empties(engine):
    """Rows come and go at every step under load: the cache grows for a longer row and keeps its columns (no
    copy of every slot each time the longest row leaves); an idle batch holds none."""
    L = engine.num_layers
    slots = Slots(engine, max_rows=8, prefixes=None)
    short = slots.add(Row([1, 5, 6], Schedule.full(L), 8, stop_at_eos=False))
    assert (slots.cache.slots, slots.cache.width) == (4, 128)  # a comparison's rows: one cache from the start
    long = slots.add(Row([1, 7], Schedule.full(L), 200, stop_at_eos=False))
    assert (slots.cache.slots, slots.cache.width) == (4, 256)
    slots.advance()
    held = list(slots.cache.lengths[short.slot])
    long.cancelled = True
    slots.drop_finished()
    assert slots.cache.width == 256 and slots.cache.lengths[short.slot] == held  # what the short row holds stays
    while not short.finished:
        slots.advance()
    assert short.token_ids == alone(engine, [1, 5, 6], Schedule.full(L), Sampling())[:8]


def adapter(engine, seed: int, rank: int):
    """An engine over `engine`'s very base (model, packed matrices, head) with a random LoRA term of its own on
    every product, as a served adapter has."""
    from skipdecode.kernels import native, q4

    g = torch.Generator().manual_seed(seed)
    blocks = [tuple(lin.with_lora(torch.randn(lin.in_features, rank, generator=g) * 0.1,
                                  torch.randn(rank, lin.out_features, generator=g) * 0.1) for lin in layer)
              for layer in engine.decoder.weights.blocks]
    weights = q4.GGUFWeights(blocks, engine.decoder.lm_head, f"int4 (tiny, adapter {seed})",
                             attention=native.attention)
    return type(engine)(engine.model, engine.tokenizer, weights=weights)


def test_rows_of_different_adapters_over_one_base_share_a_step_each_with_its_own_terms(engine):
    """The base and two adapters of different ranks, one row each at its own position and schedule, in one
    continuous batch: every row decodes what its own engine decodes alone, and the adapters did change the
    answers (so their terms were applied, each to its own row)."""
    from skipdecode.slots import base_of

    L = engine.num_layers
    models = [engine, adapter(engine, 1, 4), adapter(engine, 2, 8)]
    assert len({base_of(m) for m in models}) == 1
    ids, schedule = prompts()[3], Schedule(L, 6, 3, warmup=1, horizon=8)
    expected = [m.generate([ids], schedule, max_new_tokens=NEW, stop_at_eos=False).token_ids[0] for m in models]
    assert len({tuple(e) for e in expected}) == 3
    slots = Slots(engine, max_rows=3, prefixes=None)
    rows = []
    for m in models:
        rows.append(slots.add(Row(ids, schedule, NEW, stop_at_eos=False, engine=m)))
        slots.advance()
    while any(not r.finished for r in rows):
        slots.advance()
    assert [r.token_ids for r in rows] == expected
    assert max(step.rows for r in rows for step in r.trace.steps) == 3
    with pytest.raises(ValueError, match="not an adapter of this batch's base"):
        from conftest import tiny_int4

        slots.add(Row(ids, schedule, NEW, engine=tiny_int4(c_kernels=True)))


def test_a_beam_search_joins_as_its_beams_rows_and_finds_what_it_finds_alone(engine):
    """A beam search (3 beams) joins the batcher's continuous batch while a plain row decodes: its rows share
    the steps, its beams move their cache rows, and its answer is the search's alone; so is the plain row's."""
    from skipdecode.beam import Beam

    L = engine.num_layers
    schedule, beam = Schedule(L, 6, 3, warmup=1, horizon=8), Beam(3)
    searched = engine.generate([prompts()[3]], schedule, max_new_tokens=NEW, beam=beam).token_ids[0]
    batcher = Batcher()
    try:
        plain = batcher.submit(engine, prompts()[1], Schedule.full(L), 30, stop_at_eos=False)
        next(iter(plain))
        search = batcher.submit(engine, prompts()[3], schedule, NEW, beam=beam).result()
        answer = plain.result()
    finally:
        batcher.close()
    assert search.token_ids == searched and search.batch.number == answer.batch.number
    assert max(s.rows for s in search.trace.steps) == 4  # its three beams and the plain row
    assert answer.token_ids == alone(engine, prompts()[1], Schedule.full(L), Sampling())[:NEW] + answer.token_ids[NEW:]
