"""Teacher-forced passes and the logit lens (skipdecode/lens.py) against the engine's own decoding."""

import pytest
import torch

from conftest import IdTokenizer, tiny_model
from skipdecode import lens
from skipdecode.engine import Engine
from skipdecode.schedule import for_speedup

PROMPT = [1, 10, 20, 30, 40]
# The tie test's bound: full depth may choose otherwise only where its two candidates' probabilities are
# this close (float rounding of a different batch shape can flip a near tie, nothing more).
TIE = 1e-4


@pytest.fixture(scope="module")
def tiny():
    return Engine(tiny_model("llama", layers=6), IdTokenizer())


def test_at_full_depth_the_answer_is_full_depths_choice_everywhere_but_near_ties(tiny):
    for prompt in (PROMPT, [1, 11, 21], [1, 12, 22, 32, 42, 52, 62]):
        answer = tiny.generate([prompt], None, 24, stop_at_eos=False).token_ids[0]
        found = lens.divergence(tiny.decoder, prompt, answer)
        assert len(found.tokens) == len(answer) == 24
        for entry, top in zip(found.tokens, found.top):
            assert entry["full_prob"] == top[0][1] and entry["full_token"] == top[0][0]
            if entry["token"] != entry["full_token"]:
                assert entry["full_prob"] - entry["skip_prob"] < TIE, entry
            else:
                assert entry["skip_prob"] == entry["full_prob"]
        assert found.agreement >= 0.95


def test_agreement_is_the_share_equal_to_full_depth_and_first_the_first_difference(tiny):
    schedule = for_speedup(3.0, tiny.num_layers, horizon=20, warmup=1)
    answer = tiny.generate([PROMPT], schedule, 20, stop_at_eos=False).token_ids[0]
    found = lens.divergence(tiny.decoder, PROMPT, answer)
    same = [t["token"] == t["full_token"] for t in found.tokens]
    assert [t["token"] for t in found.tokens] == answer and [t["position"] for t in found.tokens] == list(range(20))
    assert found.agreement == round(sum(same) / 20, 4)
    assert found.first == (same.index(False) if False in same else None)
    assert found.first == 0 or found.first is None or same[: found.first] == [True] * found.first
    assert not all(same), "a random 6-layer model run at 3x should depart from full depth somewhere"
    assert found.to_dict() == {"agreement": found.agreement, "first": found.first, "tokens": found.tokens}
    assert lens.divergence(tiny.decoder, PROMPT, []).to_dict() == {"agreement": 1.0, "first": None, "tokens": []}


def test_the_skipped_lens_reproduces_what_skipdecode_chose(tiny):
    """Under the trace's own layers, the lens's last row is the token SkipDecode chose at every position,
    and its rows are the layers that ran; at full depth the last row is full depth's choice."""
    schedule = for_speedup(2.0, tiny.num_layers, horizon=12, warmup=1)
    run = tiny.generate([PROMPT], schedule, 12, stop_at_eos=False)
    answer, steps = run.token_ids[0], [s.layers for s in run.trace.steps]
    skipped = lens.lens(tiny.decoder, PROMPT, answer, steps)
    assert [v.choice for v in skipped] == answer
    assert skipped[0].layers == list(range(tiny.num_layers))  # the prefill chose token 0
    assert [v.layers for v in skipped[1:]] == [list(schedule.layers(s)) for s in range(11)]
    assert all(len(row) == lens.TOP and row[0][1] >= row[1][1] >= row[2][1] for v in skipped for row in v.top)
    full = lens.lens(tiny.decoder, PROMPT, answer, positions=[0, 5, 11])
    chosen = lens.divergence(tiny.decoder, PROMPT, answer)
    assert [v.choice for v in full] == [chosen.tokens[i]["full_token"] for i in (0, 5, 11)]
    for view in skipped + full:
        assert view.depth in view.layers and view.settled in view.layers and view.depth <= view.settled
        assert view.top[view.layers.index(view.settled)][0][0] == view.choice
        assert len(view.final) == len(view.layers) and view.final[-1] == view.top[-1][0][1]
        for p, top in zip(view.final, view.top):  # the final choice's probability after each layer
            listed = dict(top)
            assert p == listed[view.choice] if view.choice in listed else p <= top[-1][1]
        assert lens.Lens.from_dict(view.to_dict()) == view


def test_prediction_depth_and_settling():
    view = lens.Lens(3, [0, 1, 4, 5], [[(7, .5)], [(9, .4)], [(7, .3)], [(9, .6)]], [.1, .4, .2, .6])
    assert (view.choice, view.depth, view.settled) == (9, 1, 5)
    view = lens.Lens(3, [0, 1, 4, 5], [[(9, .5)], [(8, .4)], [(9, .3)], [(9, .6)]], [.5, .3, .3, .6])
    assert (view.depth, view.settled) == (0, 4)


def test_layers_that_are_not_a_prefix_are_refused(tiny):
    with pytest.raises(ValueError, match="must be a prefix"):
        lens.forward(tiny.decoder, [1, 2, 3], [range(6), range(3), range(6)])
    final, _ = lens.forward(tiny.decoder, [1, 2, 3])
    assert final.shape == (3, 64) and torch.isfinite(final).all()
