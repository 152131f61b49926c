"""Verified decoding (skipdecode/speculative/verify.py): SkipDecode drafts, full depth verifies, the output is full decoding's."""

import json

import pytest
import torch

from conftest import PROMPTS, IdTokenizer, tiny_model
from test_studio_request import MR_PROMPT, tiny_set  # noqa: F401 (tiny_set: a fixture, a tiny base with 1x and 2x adapters)
from skipdecode.engine import Engine
from skipdecode.sampling import Sampling, probabilities
from skipdecode.schedule import Schedule, for_speedup
from skipdecode.speculative.verify import ACCEPTED, REPLACED, VERIFIER, Scheduled, Verified, _cache, _draft_step, accept, forward

PROMPT = [5, 17, 40, 99, 3, 250]
LAYERS = 8


@pytest.fixture(scope="module")
def engines():
    """The verifier; the same model as a draft (skipping: some agree), and another model (a bad draft)."""
    model = tiny_model("llama", layers=LAYERS)
    return (Engine(model, IdTokenizer()), Engine(model, IdTokenizer()),
            Engine(tiny_model("llama", seed=5, layers=LAYERS), IdTokenizer()))


SKIP = for_speedup(2.0, LAYERS, horizon=16, warmup=1)
FULL = Schedule.full(LAYERS)


@pytest.mark.parametrize("draft, schedule", [(1, FULL), (1, SKIP), (2, SKIP)], ids=["agrees", "skips", "bad"])
def test_greedy_equals_full_decoding(engines, draft, schedule):
    """Lengths that end on a round's boundary and mid-round, for k = 1 and 3; EOS stopping off and on; the
    drafting rules on (measured costs, copies from the prompt) and off (threshold 0, no copies)."""
    verifier = engines[0]
    for n, stop in [(1, False), (2, False), (4, False), (5, False), (9, False), (10, False), (23, True)]:
        want = verifier.generate([PROMPT], None, n, stop_at_eos=stop).token_ids
        for k, rules in ((1, {}), (3, {}), (3, {"threshold": 0.0, "lookup": None})):
            got = Verified(engines[draft], verifier, k, **rules).generate([PROMPT], schedule, n, stop_at_eos=stop)
            assert got.token_ids == want, (n, k, stop)
            v = got.verification
            assert len(v.marks) == len(want[0]) and v.marks[0] == VERIFIER
            assert v.marks.count(ACCEPTED) == v.accepted <= v.drafted and v.passes == len(want[0]) - 1 - v.accepted
            # one round a pass; the rounds tile the answer after the prefill's token, in order
            assert len(v.rounds) == v.passes and sum(r.drafted for r in v.rounds) == v.drafted
            assert [r.first for r in v.rounds] == [1 + sum(r.emitted for r in v.rounds[:i]) for i in range(len(v.rounds))]
            assert sum(r.emitted for r in v.rounds) == len(want[0]) - 1
            assert all(v.marks[r.first:r.first + r.emitted].count(ACCEPTED) == r.accepted for r in v.rounds)
            assert [s != VERIFIER for s in v.sources] == [m == ACCEPTED for m in v.marks]
            assert all((r.source == "none") == (r.drafted == 0) for r in v.rounds)
            assert v.plain_steps == sum(r.drafted == 0 for r in v.rounds)
            assert v.prefill_ms > 0 and v.prompt_tokens == len(PROMPT)
    if draft == 1 and schedule is FULL:  # a draft that is the verifier: every draft accepted
        assert v.acceptance_rate == 1.0 and REPLACED not in v.marks


def _plain(dec, prompt, tokens, width):
    """The cache after full decoding feeds the prompt, then `tokens` one position at a time."""
    cache = _cache(dec, width)
    forward(dec, cache, prompt, 0, head=False)
    for step, token in enumerate(tokens):
        _draft_step(dec, cache, Scheduled(Schedule.full(dec.num_layers)), token, len(prompt) + step, step, width)
    return cache


def assert_rounds_leave_a_plain_decode(run, prompt, schedule, n, stop_at_eos=False, exact=False, every=True):
    """After every round (every=False: after the last), the one cache holds what full decoding of the kept
    tokens writes: every layer the prompt and all tokens but the last, nothing of the drafts; its bytes are
    full decoding's."""
    dec = run.verifier.decoder
    ids = run.encode(prompt)
    width = len(ids) + n
    full_bytes = _cache(dec, width).nbytes
    rounds = 0
    for gen in run.stream([prompt], schedule, n, stop_at_eos=stop_at_eos):
        (cache,), tokens = gen.caches, gen.token_ids[0]
        assert cache.nbytes == full_bytes
        assert cache.lengths == [len(ids) + len(tokens) - 1] * dec.num_layers
        rounds += 1
        if not (every or gen.done):
            continue
        plain = _plain(dec, ids, tokens[:-1], width)
        used = cache.lengths[0]
        if exact:
            assert torch.equal(cache.data[..., :used, :], plain.data[..., :used, :])
        else:  # a verify pass runs several positions at once: the same values up to float32 rounding
            torch.testing.assert_close(cache.data[..., :used, :], plain.data[..., :used, :], rtol=1e-5, atol=1e-5)
    assert gen.verification.cache_bytes == full_bytes
    return gen, rounds


@pytest.mark.parametrize("draft", [1, 2])
def test_one_cache_after_every_round_is_a_plain_decode(engines, draft):
    """Rounds that keep every draft and rounds that end mid-draft (the bad draft), k 3."""
    from skipdecode.speculative.drafting import Costs

    for n in (7, 12):  # each request its own cost model, so that neither starts from the other's pacing
        run = Verified(engines[draft], engines[0], 3, threshold=0.0, costs=Costs())
        gen, rounds = assert_rounds_leave_a_plain_decode(run, PROMPT, SKIP, n)
        assert len(gen.token_ids[0]) == n and rounds == gen.verification.passes + 1
    if draft == 2:
        assert REPLACED in gen.verification.marks


def test_eos_inside_a_draft_and_the_context_limit(engines):
    """An end-of-sequence token the draft proposes ends the round and, once kept, the answer; a generation
    that fills the model's whole context (256 positions) stops there with the cache full."""
    from skipdecode.speculative.drafting import Costs

    verifier, draft = engines[0], engines[1]
    free = verifier.generate([PROMPT], None, 12, stop_at_eos=False).token_ids[0]
    # drafts that cost nothing and always agree: rounds of 3 drafts and a bonus token (answer positions 1-3,
    # then 4; 5-7, then 8): a token first said at a draft's position is made the end of sequence
    eos = next(t for i, t in enumerate(free) if i % 4 and free.index(t) == i)
    run = Verified(draft, verifier, 3, threshold=0.0, lookup=None, costs=Costs(draft=0.0, extra=0.0, fixed=True))
    run.eos_ids = [eos]
    gen, _ = assert_rounds_leave_a_plain_decode(run, PROMPT, FULL, 12, stop_at_eos=True)
    assert gen.token_ids[0] == free[:free.index(eos) + 1]
    assert any(r.stop == "eos" for r in gen.verification.rounds)
    limit = verifier.decoder.max_positions - len(PROMPT)
    gen, _ = assert_rounds_leave_a_plain_decode(Verified(draft, verifier, 3), PROMPT, SKIP, limit, every=False)
    assert len(gen.token_ids[0]) == limit and gen.caches[0].lengths == [verifier.decoder.max_positions - 1] * LAYERS
    assert gen.token_ids == verifier.generate([PROMPT], None, limit, stop_at_eos=False).token_ids
    with pytest.raises(ValueError, match="context"):
        Verified(draft, verifier, 3).generate([PROMPT], SKIP, limit + 1)


class WrongDraft:
    """A draft whose every proposal is `token`, with full confidence: the verifier never agrees."""

    def __init__(self, engine, token):
        self.engine, self.token = engine, token
        self.name, self.num_layers, self.decoder = "wrong", engine.num_layers, self

    def __getattr__(self, name):  # the decoder's pieces, but its head proposes `token`
        return getattr(self.engine.decoder, name)

    def logits(self, x):
        out = torch.full((x.shape[0], 320), -1e4)
        out[:, self.token] = 1e4
        return out


def test_fallback_costs_a_draft_that_is_always_wrong_a_few_percent(engines):
    """Counted in full-depth steps (fixed costs: a draft step 0.4, each further verify position 0.15), not
    timed: 200 tokens cost at most 4% more than full decoding's 199 steps after the prefill (the fallback's
    first verdict waits for a window of drafting rounds; each probe after it costs one round)."""
    from skipdecode.speculative.drafting import Costs

    verifier = engines[0]
    want = verifier.generate([PROMPT], None, 200, stop_at_eos=False).token_ids
    never = next(t for t in range(320) if t not in want[0])
    costs = Costs(draft=0.4, extra=0.15, fixed=True)
    run = Verified(WrongDraft(verifier, never), verifier, 4, lookup=None, costs=costs)
    got = run.generate([PROMPT], SKIP, 200, stop_at_eos=False)
    assert got.token_ids == want
    v = got.verification
    assert v.accepted == 0 and v.plain_steps > 150
    spent = sum((r.drafted - r.prompt_drafts) * costs.draft + costs.pass_cost(r.drafted + 1) for r in v.rounds)
    assert spent <= 1.04 * 199, spent
    # drafting resumes when it pays: a draft that agrees is never sent to plain steps
    agrees = Verified(engines[1], verifier, 4, threshold=0.0, lookup=None, costs=costs)
    v = agrees.generate([PROMPT], FULL, 60, stop_at_eos=False).verification
    assert v.plain_steps <= 1 and v.acceptance_rate == 1.0


def test_the_next_request_of_a_pair_starts_where_drafting_left_off(engines):
    """A request whose drafts never paid leaves its pacing to the pair's next request: that one begins with
    the plain steps left before a probe, not with drafting rounds to learn it again; a draft that agrees
    leaves no plain steps behind."""
    from skipdecode.speculative.drafting import Costs

    verifier = engines[0]
    want = verifier.generate([PROMPT], None, 40, stop_at_eos=False).token_ids
    never = next(t for t in range(320) if t not in want[0])
    costs = Costs(draft=0.4, extra=0.15, fixed=True)
    wrong = WrongDraft(verifier, never)
    first = Verified(wrong, verifier, 4, lookup=None, costs=costs).generate([PROMPT], SKIP, 40, stop_at_eos=False)
    assert first.verification.rounds[0].drafted > 0  # a first request must learn by drafting
    left = costs.history[(id(wrong), Verified(wrong, verifier, 4).threshold)]
    assert left["rate"] < 1.0 and left["plain_left"] > 0
    again = Verified(wrong, verifier, 4, lookup=None, costs=costs).generate([PROMPT], SKIP, 40, stop_at_eos=False)
    assert again.token_ids == want
    assert [r.drafted for r in again.verification.rounds[:left["plain_left"]]] == [0] * left["plain_left"]
    assert again.verification.plain_steps > first.verification.plain_steps


def test_confidence_stop_and_cost_cap(engines):
    """Threshold 1: every round of the skipped model stops at its first draft (none is that sure); a cost
    model where drafts cost nothing lets a good draft run to k."""
    from skipdecode.speculative.drafting import Costs

    free = Costs(draft=0.0, extra=0.0, fixed=True)
    v = Verified(engines[1], engines[0], 4, threshold=1.0, lookup=None, costs=free).generate(
        [PROMPT], SKIP, 30, stop_at_eos=False).verification
    assert v.drafted and all(r.drafted <= 1 for r in v.rounds)
    stops = [r.stop for r in v.rounds if r.drafted]
    assert set(stops) <= {"confidence", "limit"} and stops.count("confidence") >= len(stops) - 1  # "limit": the last
    v = Verified(engines[1], engines[0], 4, threshold=0.0, lookup=None, costs=free).generate(
        [PROMPT], FULL, 30, stop_at_eos=False).verification
    assert max(r.drafted for r in v.rounds) == 4


def test_prompt_lookup_drafts_copies_of_the_prompt_only():
    from skipdecode.speculative.prompt_lookup import PromptLookup

    lookup = PromptLookup([1, 2, 3, 4, 5, 2, 3, 9, 8], ngram=2, min_ngram=1)
    assert lookup.propose([7, 2, 3], 3) == [9, 8]  # the latest occurrence of (2, 3)
    assert lookup.propose([7, 4], 2) == [5, 2]  # a 1-gram when no 2-gram matches
    assert lookup.propose([7, 8], 3) == []  # 8 ends the prompt: nothing follows it
    assert lookup.propose([6], 3) == [] and lookup.propose([2, 3], 0) == []
    with pytest.raises(ValueError):
        PromptLookup([1, 2], ngram=1, min_ngram=2)


def test_prompt_lookup_keeps_full_decodings_answer(engines):
    """A prompt whose answer repeats the prompt's last token (the tiny verifier's answer: 308 again and
    again): copies are proposed and kept; every token marked as a copy continues an n-gram of the prompt,
    and the answer is full decoding's."""
    verifier = engines[0]
    prompt = [7, 8, 9, 10] * 5 + [308] * 4
    want = verifier.generate([prompt], None, 40, stop_at_eos=False).token_ids
    run = Verified(engines[2], verifier, 4, threshold=0.0)
    got = run.generate([prompt], SKIP, 40, stop_at_eos=False)
    assert got.token_ids == want
    v = got.verification
    assert v.prompt_accepted > 0 and any(r.source == "prompt" for r in v.rounds)
    grams = {tuple(prompt[i:i + 2]) for i in range(len(prompt) - 1)}
    context = prompt + got.token_ids[0]
    for i, source in enumerate(v.sources):
        if source == "prompt":
            assert tuple(context[len(prompt) + i - 1:len(prompt) + i + 1]) in grams


def test_sampling_acceptance_follows_the_rule(engines):
    """One draft from q (a bad draft's distribution), kept with probability min(1, p/q), else replaced from
    norm(max(0, p - q)): the kept token's frequencies are the verifier's p, not q (fixed seed)."""
    sampling = Sampling(temperature=1.0, top_k=12, seed=0)
    with torch.inference_mode():
        p_logits = verifier_logits = forward_logits(engines[0])
        q = probabilities(forward_logits(engines[2]), sampling)[0]
    p = probabilities(p_logits, sampling)[0]
    generator = sampling.generator("cpu")
    trials = 6000
    counts = torch.zeros_like(p)
    for _ in range(trials):
        d = int(torch.multinomial(q, 1, generator=generator))
        kept, marks = accept(verifier_logits.expand(2, -1), [d], [q], sampling, generator)
        counts[kept[0]] += 1
    seen = counts / trials
    distance = lambda a, b: 0.5 * float((a - b).abs().sum())  # noqa: E731 (total variation)
    assert distance(p, q) > 0.3  # the draft really differs
    assert distance(seen, p) < 0.04


def forward_logits(engine):
    return forward(engine.decoder, _cache(engine.decoder, 16), PROMPT, 0)[-1:]


def test_sampled_run_is_seeded_and_batch_one(engines):
    run = Verified(engines[1], engines[0], 3)
    sampling = Sampling(temperature=0.8, seed=3)
    first, again = (run.generate([PROMPT], SKIP, 12, sampling, stop_at_eos=False).token_ids for _ in range(2))
    assert first == again and len(first[0]) == 12
    with pytest.raises(ValueError, match="batch 1"):
        run.generate([PROMPT, PROMPT], SKIP, 4)
    with pytest.raises(ValueError, match="draft tokens"):
        Verified(engines[1], engines[0], 0)


@pytest.mark.slow
def test_bundled_verified_equals_full_decoding():
    """The 4-bit default, an E2E prompt (e2e-all drafts, e2e-1x verifies) and a general one (general-3x
    drafts, the base model verifies), at 3x: the answers are full decoding's."""
    from skipdecode.adapters.router import INSTRUCTION
    from skipdecode.speculative.verify import for_prompt

    for prompt in [INSTRUCTION + PROMPTS[2].split(". Describe")[0], PROMPTS[0]]:
        run, schedule, _ = for_prompt(prompt, 3.0, dtype="int4")
        want = run.verifier.generate([prompt], None, 32).token_ids
        got = run.generate([prompt], schedule, 32)
        assert got.token_ids == want
        assert got.verification.drafted > 0


@pytest.mark.slow
def test_bundled_one_cache_is_a_plain_decode_bit_for_bit():
    """The 4-bit default on a general prompt (general-3x drafts on the base model's cache): after every round
    the one cache holds exactly the bits of full decoding's, prompt included (the second run finds its prompt
    in the prefix cache). The base model's rows are exact alone and in a pass of several; an unmerged LoRA
    verifier's (e2e-1x) are not on every CPU (q4.lora_term at one row and at several:
    docs/research/verified-decoding.md), so the E2E pair is held to its tokens
    (test_bundled_verified_equals_full_decoding)."""
    from skipdecode.speculative.verify import for_prompt

    run, schedule, _ = for_prompt(PROMPTS[0], 3.0, dtype="int4")
    assert run.verifier.adapter is None
    for _ in range(2):
        gen, rounds = assert_rounds_leave_a_plain_decode(run, PROMPTS[0], schedule, 24, stop_at_eos=True, exact=True)
        assert gen.verification.drafted > 0 and rounds == gen.verification.passes + 1
    assert gen.verification.prefix_tokens == gen.verification.prompt_tokens - 2


def test_generate_verify_json(cli, tmp_path):
    """`skipdecode generate --verify`: full decoding's answer, with the verification's counts."""
    import json

    from conftest import tiny_checkpoint

    folder = tiny_checkpoint(tmp_path / "tiny")
    common = ["generate", "--model", folder, "--prompt", PROMPTS[1], "--max-new-tokens", 12, "--json"]
    full = json.loads(cli(*common).stdout)
    out = cli(*common, "--speedup", 2, "--verify", "--draft-tokens", 3)
    got = json.loads(out.stdout)
    assert got["outputs"][0]["token_ids"] == full["outputs"][0]["token_ids"]
    assert got["verified"] is True and got["draft_tokens"] == 3 and got["verify_passes"] >= 1
    assert got["accepted"] <= got["drafted"] and 0 <= got["acceptance_rate"] <= 1
    assert len(got["marks"]) == len(got["outputs"][0]["token_ids"])
    # one prefill, one cache, the rounds and the rules' figures
    assert got["prompt_tokens"] > 20 and got["prefill_ms"] > 0 and full["prefix_tokens"] == 0
    assert got["cache_bytes"] > 0 and "prefix_tokens" in got and got["threshold"] is not None
    assert len(got["rounds"]) == got["verify_passes"] and {"draft", "extra"} <= set(got["costs"])
    assert all({"prompt_drafts", "stop", "source"} <= set(r) for r in got["rounds"])
    assert cli(*common, "--prompt", "another", "--verify").returncode == 2  # one prompt at a time


def test_the_api_compare_verifies(tiny_set, monkeypatch):
    """The compare's verify flag: the SkipDecode side drafts, the full side's model verifies, alone in its
    batch; the answer is full decoding's and the API gives the verification's fields."""
    from app.callbacks import Callbacks
    from app.choices import AUTO, configured_models
    from app.studio import Studio
    from skipdecode.batcher import Batcher

    base, adapters = tiny_set
    monkeypatch.setenv("SKIPDECODE_ADAPTERS", str(adapters))
    studio = Studio(configured_models(str(base)), batcher=Batcher(window_s=0.0))
    try:
        out = Callbacks(studio).compare_api(MR_PROMPT, speedup=2.0, max_new_tokens=9, model=AUTO, verify=True)
    finally:
        studio.batcher.close()
    assert out["verified"] is True and out["skipdecode"]["batch"]["size"] == 1
    assert out["skipdecode"]["token_ids"] == out["full"]["token_ids"]
    v = out["verification"]
    assert v["verified"] and v["verify_passes"] >= 1 and v["accepted"] <= v["drafted"]
    assert v["verifier_model"].endswith("tiny-1x") and len(v["marks"]) == len(out["full"]["token_ids"])
    assert out["speedup"]["layers"] is None and out["speedup"]["measured"] > 0


def test_the_page_marks_exports_and_replays_a_verified_comparison(tiny_set, monkeypatch, tmp_path):
    """Verified mode's answer marks each token (accepted draft, replaced, the verifier's), escaped; the
    exported record carries the verification and replays with the same marks and summary."""
    from app import replay, teach, verified
    from app.choices import AUTO, configured_models
    from app.settings import Settings
    from app.studio import Studio
    from skipdecode.batcher import Batcher

    base, adapters = tiny_set
    monkeypatch.setenv("SKIPDECODE_ADAPTERS", str(adapters))
    studio = Studio(configured_models(str(base)), batcher=Batcher(window_s=0.0))
    try:
        final = list(studio.compare(MR_PROMPT, Settings(speedup=2.0, max_new_tokens=9, verify=True), AUTO))[-1]
        tokenizer = studio.engine(final.model).tokenizer
        record = replay.record(final, tokenizer)
    finally:
        studio.batcher.close()
    marks = record["verification"]["marks"]
    page = teach.marked_html(record)
    assert page.count('class="sd-token sd-') == len(marks) == len(record["skipdecode"]["pieces"])
    assert all(f'data-mark="{mark}"' in page for mark in set(marks))
    exported = tmp_path / "verified.json"  # through the replay schema (app/record.py), as a file
    exported.write_text(json.dumps(record))
    read = replay.read(str(exported))["verification"]
    assert read["marks"] == marks
    for key in ("prompt_tokens", "prefix_tokens", "prefill_ms", "cache_bytes", "plain_steps", "prompt_drafted",
                "threshold", "costs"):  # one prefill, one cache, the drafting rules: carried through the schema
        assert read[key] == record["verification"][key], key
    assert record["verification"]["prompt_tokens"] > 0 and record["verification"]["cache_bytes"] > 0
    assert [(r["stop"], r["prompt_drafts"]) for r in read["rounds"]] == \
        [(r["stop"], r["prompt_drafts"]) for r in record["verification"]["rounds"]]
    damaged = json.loads(exported.read_text())
    damaged["verification"]["marks"] = marks[:-1]
    exported.write_text(json.dumps(damaged))
    with pytest.raises(ValueError, match="verification.marks has"):
        replay.read(str(exported))
    again = replay.comparison(record)
    assert again.verified and again.skip.verification["marks"] == marks
    summary = verified.summary_html(again)
    assert "acceptance rate" in summary and "verify passes" in summary and "full decoding" in summary
    hostile = verified.tokens_html(["<script>", "&"], ["accepted", "replaced"])
    assert "<script>" not in hostile and "&lt;script&gt;" in hostile and "&amp;" in hostile
    assert verified.chosen(verified.VERIFIED) and not verified.chosen(verified.FASTER)
    with pytest.raises(ValueError):
        verified.chosen("something else")


def test_verify_check_counts_identical_answers(engines):
    """`skipdecode verify-check`'s count, on the tiny models: a bad draft still gives full decoding's answers."""
    from skipdecode.evaluation.verified import check

    runs = {"general": (Verified(engines[2], engines[0], 3), SKIP)}
    result = check(runs, {"general": [PROMPT, [7, 8, 9]]}, 10, say=lambda message: None)
    assert result == {"general": {"identical": 2, "total": 2, "mismatches": []}}
