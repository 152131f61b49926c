"""Verified decoding (skipdecode/verify.py): SkipDecode drafts, full depth verifies, the output is full decoding's."""

import json

import pytest
import torch

from conftest import PROMPTS, IdTokenizer, tiny_model
from test_studio_request import MR_PROMPT, tiny_set  # noqa: F401 (tiny_set: a fixture, a tiny base with 1x and 2x adapters)
from skipdecode.engine import Engine
from skipdecode.sampling import Sampling, probabilities
from skipdecode.schedule import Schedule, for_speedup
from skipdecode.verify import ACCEPTED, REPLACED, VERIFIER, Scheduled, Verified, _draft_step, accept, forward

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
    """Lengths that end on a round's boundary and mid-round, for k = 1 and 3; EOS stopping off and on."""
    verifier = engines[0]
    for n, stop in [(1, False), (2, False), (4, False), (5, False), (9, False), (10, False), (23, True)]:
        want = verifier.generate([PROMPT], None, n, stop_at_eos=stop).token_ids
        for k in (1, 3):
            got = Verified(engines[draft], verifier, k).generate([PROMPT], schedule, n, stop_at_eos=stop)
            assert got.token_ids == want, (n, k, stop)
            v = got.verification
            assert len(v.marks) == len(want[0]) and v.marks[0] == VERIFIER
            assert v.marks.count(ACCEPTED) == v.accepted <= v.drafted and v.passes == len(want[0]) - 1 - v.accepted
            # one round a pass; the rounds tile the answer after the prefill's token, in order
            assert len(v.rounds) == v.passes and sum(r.drafted for r in v.rounds) == v.drafted
            assert [r.first for r in v.rounds] == [1 + sum(r.emitted for r in v.rounds[:i]) for i in range(len(v.rounds))]
            assert sum(r.emitted for r in v.rounds) == len(want[0]) - 1
            assert all(v.marks[r.first:r.first + r.emitted].count(ACCEPTED) == r.accepted for r in v.rounds)
            assert [s == "skipdecode" for s in v.sources] == [m == ACCEPTED for m in v.marks]
    if draft == 1 and schedule is FULL:  # a draft that is the verifier: every draft accepted
        assert v.acceptance_rate == 1.0 and REPLACED not in v.marks


def _plain(dec, schedule, prompt, tokens, width):
    """Caches after a plain decode that feeds `tokens` one position at a time (draft: `schedule`)."""
    from skipdecode.verify import _cache

    cache = _cache(dec, width)
    forward(dec, cache, prompt, 0, head=False)
    for step, token in enumerate(tokens):
        _draft_step(dec, cache, Scheduled(schedule), token, len(prompt) + step, step, width)
    return cache


@pytest.mark.parametrize("draft", [1, 2])
def test_rollback_leaves_both_caches_as_a_plain_decode(engines, draft):
    verifier = engines[0]
    run = Verified(engines[draft], verifier, 3)
    for n in (7, 12):
        gen = run.generate([PROMPT], SKIP, n, stop_at_eos=False)
        tokens, (draft_cache, verify_cache) = gen.token_ids[0], gen.caches
        width = len(PROMPT) + n
        fed = max(draft_cache.lengths) - len(PROMPT)  # the draft may lag one token behind (all accepted)
        assert n - 2 <= fed <= n - 1
        for cache, engine, schedule, count in ((draft_cache, engines[draft], SKIP, fed),
                                               (verify_cache, verifier, FULL, n - 1)):
            plain = _plain(engine.decoder, schedule, PROMPT, tokens[:count], width)
            assert cache.lengths == plain.lengths
            for layer, length in enumerate(plain.lengths):
                # positions run several in one pass (a verify pass, a draft's catch-up) hold the same values
                # up to float32 rounding
                torch.testing.assert_close(cache.data[layer, ..., :length, :], plain.data[layer, ..., :length, :],
                                           rtol=1e-5, atol=1e-5)


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
    from skipdecode.verify import _cache

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
    from skipdecode.router import INSTRUCTION
    from skipdecode.verify import for_prompt

    for prompt in [INSTRUCTION + PROMPTS[2].split(". Describe")[0], PROMPTS[0]]:
        run, schedule, _ = for_prompt(prompt, 3.0, dtype="int4")
        want = run.verifier.generate([prompt], None, 32).token_ids
        got = run.generate([prompt], schedule, 32)
        assert got.token_ids == want
        assert got.verification.drafted > 0


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
    assert cli(*common, "--prompt", "another", "--verify").returncode == 2  # one prompt at a time


def test_the_api_compare_verifies(tiny_set, monkeypatch):
    """The compare's verify flag: the SkipDecode side drafts, the full side's model verifies, alone in its
    batch; the answer is full decoding's and the API gives the verification's fields."""
    from app.callbacks import Callbacks
    from app.studio import AUTO, Studio, configured_models
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
    from app.studio import AUTO, Settings, Studio, configured_models
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
    assert replay.read(str(exported))["verification"]["marks"] == marks
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
