"""How much a SkipDecode output loses against full decoding: text overlap, token agreement, perplexity.

Sentence-level scores of one output against another (or against references), for the app and for any
evaluation that compares outputs one by one. The overlap scores come from the standard libraries
(sacrebleu, rouge-score) so that our numbers mean what the same names mean in papers; perplexity and the
per-layer predictions use the model at full depth, the reference every skipped layer is measured against.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import torch

METRICS = ("bleu", "rouge_l", "chrf")  # text metrics, each 0..100, higher is better


def _refs(references: str | Sequence[str]) -> list[str]:
    refs = [references] if isinstance(references, str) else list(references)
    if not refs:
        raise ValueError("at least one reference is needed")
    return refs


@lru_cache(maxsize=1)
def _rouge():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(hypothesis: str, references: str | Sequence[str]) -> float:
    """ROUGE-L F-measure x 100 against the best-matching reference (rouge-score, Porter stemmer)."""
    return 100.0 * _rouge().score_multi(_refs(references), hypothesis)["rougeL"].fmeasure


def bleu(hypothesis: str, references: str | Sequence[str]) -> float:
    """Sentence BLEU (sacrebleu, effective order so a short output is not zeroed by missing 4-grams)."""
    import sacrebleu
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
    from sacrebleu.tokenizers.tokenizer_re import TokenizerRegexp

    score = float(sacrebleu.sentence_bleu(hypothesis, _refs(references)).score)
    # sacrebleu keeps every line it tokenizes (up to 65,536 per tokenizer, keyed by a metric object made
    # for this one call): in a server scoring request after request, memory held for lines never seen again.
    for tokenize in (Tokenizer13a.__call__, TokenizerRegexp.__call__):
        tokenize.cache_clear()
    return score


def chrf(hypothesis: str, references: str | Sequence[str]) -> float:
    import sacrebleu

    return float(sacrebleu.sentence_chrf(hypothesis, _refs(references)).score)


def text_scores(hypothesis: str, references: str | Sequence[str]) -> dict[str, float]:
    """BLEU, ROUGE-L and chrF of one output, rounded for display and JSON."""
    return {name: round(fn(hypothesis, references), 2) for name, fn in
            (("bleu", bleu), ("rouge_l", rouge_l), ("chrf", chrf))}


def common_prefix(a: Sequence, b: Sequence) -> int:
    """How many leading items two sequences (token ids, strings) share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def token_agreement(tokens: Sequence[int], reference_tokens: Sequence[int]) -> dict[str, float | int]:
    """Position-by-position agreement of two generations from the same prompt.

    `agreement` is the share of positions (over the longer output) holding the same token; `prefix` is
    how many tokens match before the first difference, the point from which greedy outputs part ways."""
    a, b = list(tokens), list(reference_tokens)
    longest = max(len(a), len(b))
    same = sum(x == y for x, y in zip(a, b))
    return {"agreement": round(same / longest, 4) if longest else 1.0, "prefix": common_prefix(a, b)}


def _logits_model(model):
    """(final norm, LM head) of a Hugging Face causal LM of the families the engine supports."""
    head = model.get_output_embeddings()
    for path in ("model.norm", "model.decoder.final_layer_norm", "transformer.ln_f"):
        owner = model
        for part in path.split("."):
            owner = getattr(owner, part, None)
        if owner is not None:
            return owner, head
    raise ValueError(f"cannot find the final norm of {type(model).__name__}")


def perplexity(model, prompt_ids: Sequence[int], continuation_ids: Sequence[int]) -> float:
    """exp(mean negative log-likelihood) of the continuation given the prompt, under `model` at full depth.

    Scoring both outputs with the same full model tells how plausible each is to the model SkipDecode
    approximates, whatever layers produced it."""
    if not list(continuation_ids):
        raise ValueError("perplexity needs a non-empty prompt and continuation")
    return perplexities(model, prompt_ids, [continuation_ids])[0]


@torch.inference_mode()
def perplexities(model, prompt_ids: Sequence[int], continuations: Sequence[Sequence[int]]) -> list[float | None]:
    """The perplexity of each continuation of one prompt (None for an empty one), in a single forward pass.

    The rows are right-padded: under causal attention no real token sees the padding, so no mask is
    needed; and only the positions that predict a continuation token go through the LM head, which on a
    small model costs as much as the layers. This runs while decoding waits, so it is kept to one pass."""
    prompt, rows = list(prompt_ids), [list(c) for c in continuations]
    if not prompt:
        raise ValueError("perplexity needs a non-empty prompt and continuation")
    scored = [row for row in rows if row]
    if not scored:
        return [None] * len(rows)
    width = max(len(row) for row in scored)
    ids = torch.tensor([prompt + row + [row[-1]] * (width - len(row)) for row in scored])
    targets = torch.tensor([row + [-100] * (width - len(row)) for row in scored])
    # Positions P - 1 .. P + width - 2 predict the continuation: position P - 1 + j predicts token j.
    if hasattr(model, "hidden_states"):  # an Engine: its own weights (4-bit, an unmerged adapter)
        logits = model.decoder.logits(model.hidden_states(ids)[-1][:, -(width + 1):-1]).float()
    else:
        ids = ids.to(next(model.parameters()).device)
        logits = model(ids, logits_to_keep=width + 1).logits[:, :width].float()
    targets = targets.to(logits.device)
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100, reduction="none")
    means = (nll.sum(1) / (targets != -100).sum(1)).tolist()
    values = iter(math.exp(m) for m in means)
    return [next(values) if row else None for row in rows]


@torch.inference_mode()
def perplexities_from(dec, states: Sequence[torch.Tensor | None], continuations: Sequence[Sequence[int]]) -> list[float | None]:
    """`perplexities` from full depth's last hidden states at the positions that predict each continuation
    (skipdecode.batcher.Batcher.states: the passes ran as rows beside decoding), None for an empty one."""
    values = []
    for hidden, row in zip(states, continuations):
        if not row:
            values.append(None)
            continue
        logits = dec.logits(hidden).float()
        nll = torch.nn.functional.cross_entropy(logits, torch.tensor(list(row), device=logits.device))
        values.append(math.exp(float(nll)))
    return values


def exit_layers(model, prompt_ids: Sequence[int], continuation_ids: Sequence[int]) -> list[int]:
    """For each continuation token, the fewest bottom layers after which the model (final norm and LM
    head applied early, the "logit lens") already predicts the token it predicts at full depth.

    This is where an oracle per-token early exit would stop: the best case of methods like CALM, whose
    tokens each leave at their own depth. Returns the number of layers run, 1..num_layers, per token."""
    prompt, continuation = list(prompt_ids), list(continuation_ids)
    if not prompt or not continuation:
        raise ValueError("exit layers need a non-empty prompt and continuation")
    ids = torch.tensor([prompt + continuation])
    where = slice(len(prompt) - 1, len(prompt) - 1 + len(continuation))  # positions predicting them
    if hasattr(model, "hidden_states"):  # an Engine: its own weights (4-bit, an unmerged adapter)
        states, lens = model.hidden_states(ids), model.decoder.logits
        final = lens(states[-1][0, where]).argmax(-1)
    else:
        norm, head = _logits_model(model)
        out = model(ids.to(next(model.parameters()).device), output_hidden_states=True)
        states, lens = out.hidden_states, lambda h: head(norm(h))
        final = out.logits[0, where].argmax(-1)
    num_layers = len(states) - 1
    exits = torch.full_like(final, num_layers)
    for layer in range(num_layers - 1, 0, -1):  # states[l] is the output of the first l layers
        agrees = lens(states[layer][0, where]).argmax(-1) == final
        exits = torch.where(agrees, torch.full_like(exits, layer), exits)
    return exits.tolist()
