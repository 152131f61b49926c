"""The targets of `skipdecode train --task general`: chat prompts come without answers, so a general
adapter learns the full-depth base model's own greedy answers (self-distillation), generated once and
cached, cut before they start to loop when asked.

The prompt pool, its held-out rule and the validation slice are the evaluation's
(skipdecode/evaluation/general.py): training reads them from there and never sees a held-out prompt.
"""

from __future__ import annotations

import re
from itertools import islice
from pathlib import Path

from ..evaluation.general import (MAX_PROMPT_TOKENS, VALIDATION_COUNT, answer, by_hash, fits, held_out, pool_file,
                                  read_prompts, validation_prompts)

ANSWER_TOKENS = 160  # training targets: chat answers of 100-200 tokens, not E2E's 32
REPEAT_NGRAM = 4  # Welleck et al.'s sequence level: a token is penalized inside a repeated 4-gram


def training_prompts(tokenizer, path=None, max_prompt_tokens: int = MAX_PROMPT_TOKENS,
                     limit: int | None = None) -> list[str]:
    """Prompts to train on: those of the file (default: the pool) that are not held out, that the router
    calls general, and whose chat-templated length is at most `max_prompt_tokens`; in hash order, the
    first `limit` of them."""
    from ..adapters.router import is_e2e

    chosen = by_hash(read_prompts(path or pool_file()), lambda p: not held_out(p) and not is_e2e(p))
    short = (p for p in chosen if fits(tokenizer, p, max_prompt_tokens))
    return list(islice(short, limit))


def targets_file(folder, engine, max_new_tokens: int) -> Path:
    """Where the full-depth answers of one model, precision and length are cached."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", engine.name).strip("-")
    dtype = "int4" if engine.decoder.weights is not None else str(engine.decoder.dtype).replace("torch.", "")
    return Path(folder) / f"targets-{name}-{dtype}-{max_new_tokens}tokens.jsonl"


def reference_answers(engine, prompts: list[str], max_new_tokens: int, batch_size: int = 16,
                      cache: Path | None = None) -> dict[str, list[int]]:
    """prompt -> the token ids of the engine's full-depth greedy answer; with `cache`, kept in that JSON-lines
    file (answer_cache), so that a run stopped halfway, or the next run on the same prompts, starts from there."""
    from .answer_cache import cached_answers

    def answer_chunk(chunk, bar):
        return answer(engine, chunk, None, max_new_tokens, batch_size, bar).token_ids

    return cached_answers(prompts, answer_chunk, cache, "prompt", "token_ids", "full-depth answers")


def training_examples(tokenizer, model=None, data=None, limit: int | None = None,
                      validation_examples: int = VALIDATION_COUNT, max_prompt_tokens: int = MAX_PROMPT_TOKENS,
                      max_answer_tokens: int = ANSWER_TOKENS, cache_folder=".", batch_size: int = 16,
                      cut_loops: int = 0):
    """(train, validation) examples for `skipdecode train --task general`: (prompt ids, target ids), the
    target being the full-depth base model's greedy answer (its end token included when it ended within
    `max_answer_tokens`), generated once and cached in `cache_folder`. Validation: the first
    `validation_examples` prompts of the validation set, which training never sees. With `cut_loops` N,
    each training target ends before its first repeated run of N tokens (`cut_at_loop`)."""
    from ..engine import Engine
    from ..prompts import encode_prompt

    train = training_prompts(tokenizer, data, max_prompt_tokens, limit)
    val = validation_prompts(tokenizer, validation_examples)
    if not train:
        raise ValueError(f"no training prompts in {data or pool_file()} (held out, or over {max_prompt_tokens} tokens)")
    engine = Engine.load(model)
    targets = reference_answers(engine, train + val, max_answer_tokens, batch_size,
                                cache=targets_file(cache_folder, engine, max_answer_tokens))
    del engine

    def examples(prompts, cut=0):
        return [(encode_prompt(tokenizer, p), cut_at_loop(targets[p], cut) if cut else targets[p]) for p in prompts]

    return examples(train, cut_loops), examples(val)


def cut_at_loop(ids: list[int], n: int) -> list[int]:
    """`ids` up to where they start repeating themselves: before the first run of n tokens that already
    occurred earlier in them (overlaps included, so "a a a ..." keeps one "a"). Why: a 135M model's greedy
    answers often end in a loop ("1. 1. 1. ...", a sentence said again and again), and an adapter trained
    on them learns the loop; a run of 8 tokens said twice is rarely anything else."""
    marked = repeated_ngrams(ids, n)
    return list(ids[:marked.index(True)] if True in marked else ids)


def repeated_ngrams(tokens: list[int], n: int = REPEAT_NGRAM) -> list[bool]:
    """Marks every token of an n-gram that already began earlier in the sequence (the first marked token
    is where the sequence first repeats itself)."""
    marked, seen = [False] * len(tokens), set()
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i:i + n])
        if gram in seen:
            marked[i:i + n] = [True] * n
        seen.add(gram)
    return marked
