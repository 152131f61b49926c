"""Quality scores: known values on hand-made texts, and the model-based ones against independent
computations on a small random model."""

import math

import pytest
import torch

from conftest import tiny_model
from skipdecode.evaluation import quality


def test_identical_text_scores_100_and_disjoint_text_scores_0():
    text = "The Eagle is a French coffee shop by the river."
    assert quality.bleu(text, [text]) == pytest.approx(100.0)
    assert quality.rouge_l(text, text) == pytest.approx(100.0)
    assert quality.chrf(text, text) == pytest.approx(100.0)
    assert quality.rouge_l("zebra quantum", [text]) == 0.0
    assert quality.bleu("zebra quantum", [text]) < 1.0


def test_best_reference_counts_for_rouge_and_all_references_for_bleu():
    refs = ["A pub in the city centre.", "Strada is a pub in the city centre."]
    assert quality.rouge_l(refs[1], refs) == pytest.approx(100.0)
    assert quality.rouge_l(refs[1], refs[:1]) < 100.0
    assert quality.bleu(refs[1], refs) > quality.bleu(refs[1], refs[:1])
    scores = quality.text_scores(refs[1], refs)
    assert set(scores) == {"bleu", "rouge_l", "chrf"} and scores["rouge_l"] == 100.0
    with pytest.raises(ValueError, match="reference"):
        quality.bleu("x", [])


def test_scoring_request_after_request_holds_no_memory_per_request():
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
    from sacrebleu.tokenizers.tokenizer_re import TokenizerRegexp

    for i in range(50):
        quality.text_scores(f"output number {i} of a long-running server", ["Strada is a pub.", "A pub."])
    for tokenize in (Tokenizer13a.__call__, TokenizerRegexp.__call__):  # sacrebleu would keep every line
        assert tokenize.cache_info().currsize == 0


def test_token_agreement():
    assert quality.token_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == {"agreement": 0.75, "prefix": 2}
    assert quality.token_agreement([1, 2], [1, 2, 3, 4]) == {"agreement": 0.5, "prefix": 2}
    assert quality.token_agreement([], []) == {"agreement": 1.0, "prefix": 0}


def test_perplexity_equals_transformers_loss_on_the_continuation():
    model = tiny_model("llama")
    prompt, continuation = [5, 6, 7, 8], [9, 10, 11]
    ids = torch.tensor([prompt + continuation], device=model.device)
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    with torch.no_grad():
        expected = math.exp(model(ids, labels=labels).loss.item())
    assert quality.perplexity(model, prompt, continuation) == pytest.approx(expected, rel=1e-4)
    with pytest.raises(ValueError):
        quality.perplexity(model, prompt, [])


def test_perplexities_score_several_continuations_in_one_pass_as_each_alone():
    model = tiny_model("llama")
    prompt, continuations = [5, 6, 7, 8], [[9, 10, 11], [12], [], [13, 14, 15, 16, 17]]
    together = quality.perplexities(model, prompt, continuations)
    assert together[2] is None
    for value, continuation in zip(together, continuations):
        if continuation:
            ids = torch.tensor([prompt + continuation], device=model.device)
            labels = ids.clone()
            labels[0, : len(prompt)] = -100
            with torch.no_grad():
                assert value == pytest.approx(math.exp(model(ids, labels=labels).loss.item()), rel=1e-4)


def test_exit_layers_find_the_depth_after_which_the_prediction_no_longer_changes():
    model = tiny_model("llama", layers=6)
    prompt, continuation = [5, 6, 7, 8], [9, 10, 11, 12, 13]
    exits = quality.exit_layers(model, prompt, continuation)
    assert len(exits) == len(continuation) and all(1 <= e <= 6 for e in exits)
    # Make layers 2..5 pass the residual stream through unchanged: from layer 2 on, every prediction is
    # the final one, so no token needs more than 2 layers.
    with torch.no_grad():
        for layer in model.model.layers[2:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    assert max(quality.exit_layers(model, prompt, continuation)) <= 2
