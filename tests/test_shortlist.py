"""The draft's LM head over a shortlist (skipdecode/speculative/shortlist.py): drafts only from the shortlist and the
request's tokens, the verifier's answer whatever the shortlist, a sampling draft's q a distribution."""

import pytest
import torch

from conftest import IdTokenizer, tiny_model
from skipdecode.speculative import verify
from skipdecode.speculative.drafting import Costs
from skipdecode.engine import Engine
from skipdecode.sampling import Sampling
from skipdecode.schedule import Schedule, for_speedup
from skipdecode.speculative.shortlist import count, load, shortlist_head
from skipdecode.speculative.verify import SKIPDECODE, Verified

PROMPT = [5, 17, 40, 99, 3, 250]
LAYERS = 8
SKIP = for_speedup(2.0, LAYERS, horizon=16, warmup=1)
SHORT = list(range(3, 60))  # a shortlist that lacks most of what the tiny model says


def FREE():
    """Drafts that cost nothing: every round drafts (no fallback), whatever the timer or the run before."""
    return Costs(0.0, 0.0, fixed=True)


@pytest.fixture(scope="module")
def engines():
    model = tiny_model("llama", layers=LAYERS)
    return Engine(model, IdTokenizer()), Engine(model, IdTokenizer())


def test_count_ranks_by_frequency_then_id():
    assert count([[7, 3, 3], [9, 7, 3], [1]], 3) == [3, 7, 1]
    assert count([[7, 3, 3], [9, 7, 3], [1]]) == [3, 7, 1, 9]


def test_load_reads_the_adapters_file(tmp_path):
    assert load(tmp_path) is None and load(None) is None
    (tmp_path / "shortlist.json").write_text('{"ids": [4, 2, 9], "counted_on": "test"}')
    assert load(tmp_path) == [4, 2, 9]


def _drafted(monkeypatch):
    """Every token the skipped model drafts, as verify._choose returns them."""
    seen, requests, choose = [], [], verify._choose

    def spy(dec, vocab, x, sampling, generator):
        d, q, top = choose(dec, vocab, x, sampling, generator)
        seen.append((d, None if vocab is None else set(vocab.ids.tolist()), q))
        requests.append(vocab)
        return d, q, top
    monkeypatch.setattr(verify, "_choose", spy)
    return seen, requests


@pytest.mark.parametrize("n", [5, 17])
def test_drafts_come_from_the_shortlist_and_the_request_and_the_answer_is_the_verifiers(engines, monkeypatch, n):
    verifier, draft = engines
    want = verifier.generate([PROMPT], None, n, stop_at_eos=False).token_ids
    seen, requests = _drafted(monkeypatch)
    got = Verified(draft, verifier, 3, threshold=0.0, lookup=None, costs=FREE(), shortlist=SHORT).generate(
        [PROMPT], SKIP, n, stop_at_eos=False)
    assert got.token_ids == want
    assert seen and all(vocab is not None for _, vocab, _ in seen)
    answer = want[0]
    for d, vocab, _ in seen:
        assert d in vocab
        # the shortlist, the prompt, the end of sequence, the answer so far
        assert vocab <= set(SHORT) | set(PROMPT) | set(verifier.eos_ids) | set(answer)
    assert set(PROMPT) | set(verifier.eos_ids) <= seen[0][1]
    outside = [t for t in answer if t not in SHORT and t not in PROMPT]
    assert outside and set(outside) <= set(requests[-1].ids.tolist())  # the answer's tokens join as they come
    # without a shortlist the whole vocabulary drafts
    seen.clear()
    full = Verified(draft, verifier, 3, threshold=0.0, lookup=None, costs=FREE(), shortlist=None)
    assert full.generate([PROMPT], SKIP, n, stop_at_eos=False).token_ids == want
    assert all(vocab is None for _, vocab, _ in seen)


def test_a_shortlist_that_holds_the_answer_is_kept_as_often_as_the_whole_head(engines):
    """With every token the draft would choose in the shortlist, the drafts, and so the rounds, are the same
    (costs fixed, each run its own: the pacing does not depend on a timer or on the run before)."""
    verifier, draft = engines
    schedule = Schedule.full(LAYERS)  # the draft is the verifier: it always proposes the verifier's token
    answer = verifier.generate([PROMPT], None, 12, stop_at_eos=False).token_ids[0]
    runs = [Verified(draft, verifier, 3, threshold=0.0, lookup=None, costs=FREE(),
                     shortlist=s).generate(
        [PROMPT], schedule, 12, stop_at_eos=False).verification for s in (None, sorted(set(answer)))]
    assert runs[0].acceptance_rate == runs[1].acceptance_rate == 1.0
    assert [r.to_dict()["drafted"] for r in runs[0].rounds] == [r.to_dict()["drafted"] for r in runs[1].rounds]


def test_a_sampled_drafts_q_is_a_distribution_over_the_shortlist(engines, monkeypatch):
    verifier, draft = engines
    seen, _ = _drafted(monkeypatch)
    run = Verified(draft, verifier, 3, threshold=0.0, lookup=None, costs=FREE(), shortlist=SHORT)
    out = run.generate([PROMPT], SKIP, 10, Sampling(temperature=0.9, seed=1), stop_at_eos=False)
    assert len(out.token_ids[0]) == 10 and seen
    for d, vocab, q in seen:
        assert q.shape == (verifier.decoder.embed_tokens.shape[0],)
        assert abs(float(q.sum()) - 1.0) < 1e-5 and q[d] > 0
        outside = torch.ones_like(q, dtype=torch.bool)
        outside[sorted(vocab)] = False
        assert float(q[outside].abs().sum()) == 0.0


def test_the_head_is_made_once_per_lm_head_and_shortlist(engines):
    draft = engines[1]
    assert shortlist_head(draft.decoder, None) is None
    assert shortlist_head(draft.decoder, SHORT) is shortlist_head(draft.decoder, list(SHORT))
    assert shortlist_head(draft.decoder, SHORT) is not shortlist_head(draft.decoder, SHORT[:10])
