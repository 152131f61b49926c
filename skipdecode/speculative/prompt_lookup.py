"""Prompt lookup (Saxena, prompt-lookup decoding): drafts copied from the prompt, at no model cost.

An answer grounded in its prompt copies from it: an E2E sentence repeats the MR's names and values
("Blue Spice", "city centre"). Where the last `ngram` tokens of the context (the prompt, the answer so far
and any drafts in flight) also occur inside the prompt, the tokens that followed them there are proposed as
drafts; the verifier keeps those it agrees with, like any draft. The longest n-gram that matches wins (down
to `min_ngram`), and among its occurrences the latest. Only the prompt's own n-grams are searched, never the
answer's, so a draft is always a copy of the prompt.
"""

from __future__ import annotations

from typing import Sequence

# n-gram lengths, chosen by the rule in docs/method.md ("How much to draft") on tuning prompts with the E2E
# draft made for the shared cache and its shortlist (docs/results/draft-tuning-shortlist-2026-11-29.json):
# keys of 4 tokens, down to 3, in the setting the rule chose.
NGRAM = 4
MIN_NGRAM = 3


class PromptLookup:
    """The prompt's n-grams indexed once per request; `propose` then costs a dictionary lookup per length."""

    def __init__(self, prompt: Sequence[int], ngram: int = NGRAM, min_ngram: int = MIN_NGRAM):
        if not 1 <= min_ngram <= ngram:
            raise ValueError(f"n-gram lengths must satisfy 1 <= min_ngram <= ngram; got {min_ngram}, {ngram}")
        self.prompt, self.ngram, self.min_ngram = list(prompt), ngram, min_ngram
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> where the latest occurrence ends
        for n in range(min_ngram, ngram + 1):
            for end in range(n, len(self.prompt)):  # an n-gram ending at the prompt's end has no continuation
                self.index[tuple(self.prompt[end - n:end])] = end

    def propose(self, context: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the context's last n tokens in the prompt (none: no match)."""
        if limit < 1:
            return []
        for n in range(self.ngram, self.min_ngram - 1, -1):
            if len(context) < n:
                continue
            end = self.index.get(tuple(context[-n:]))
            if end is not None:
                return self.prompt[end:end + limit]
        return []
