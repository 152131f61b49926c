"""Where SkipDecode departs from full decoding, and why: teacher-forced passes over an answer on the
engine's own Decoder, and the logit lens (the final norm and LM head applied after a layer).

Two greedy answers part for good at their first different token, so a score against the full answer
cannot say where skipping mattered. Given the same prefix (teacher forcing) we can: at each position of
the SkipDecode answer, the token full depth would have chosen (`divergence`); and, layer by layer, what
each run layer already predicts and how deep the prediction settles (`lens`), under SkipDecode's own
schedule (the layers its trace ran at that position) or at full depth.

A teacher-forced pass runs all positions at once, layer by layer. A position that skips a layer keeps
its hidden state through it; because SkipDecode's budgets never grow, the positions that run a layer are
always a prefix of the sequence (the prompt and the first generated positions), so each layer is one
causal pass over that prefix and sees exactly the keys and values decoding saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .transformer import Decoder

TOP = 3  # alternatives kept per position and per layer: what a hover or a lens row shows


@torch.inference_mode()
def forward(dec: Decoder, ids: Sequence[int], runs: Sequence[Sequence[int]] | None = None,
            watch: Sequence[int] = ()) -> tuple[torch.Tensor, dict[int, list[tuple[int, torch.Tensor]]]]:
    """One causal pass over `ids` (one sequence): the decoder's own (Decoder.hidden_states, which scoring
    runs at full depth), told per layer how many leading columns run it. `runs[j]`: the layers column j
    runs (None: every column runs every layer). Returns the last hidden state of every column [S, d], and for each column in
    `watch` its hidden state after each layer it ran, [(layer, h [d])] in order.
    ValueError when the columns that run a layer are not a prefix: decoding would have lacked their keys."""
    S, L = len(ids), dec.num_layers
    if S == 0:
        raise ValueError("nothing to run: no tokens")
    runs = [range(L)] * S if runs is None else [set(r) for r in runs]
    if len(runs) != S:
        raise ValueError(f"runs has {len(runs)} columns for {S} tokens")
    prefix = []  # per layer, how many leading columns run it
    for layer in range(L):
        running = [layer in r for r in runs]
        k = running.index(False) if False in running else S
        if any(running[k:]):
            raise ValueError(f"column {k + running[k:].index(True)} runs layer {layer} but column {k} does not: "
                             "the columns that run a layer must be a prefix (budgets that never grow)")
        prefix.append(k)
    states = dec.hidden_states(torch.tensor([list(ids)]), prefix)
    watched = {j: [(layer, states[layer + 1][0, j]) for layer in range(L) if j < prefix[layer]] for j in watch}
    return states[-1][0], watched


def _top(dec: Decoder, hidden: torch.Tensor, k: int = TOP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probabilities [n, V], top-k probabilities [n, k], top-k ids [n, k]) of final norm + LM head."""
    probs = torch.softmax(dec.logits(hidden).float(), dim=-1)
    top_p, top_i = probs.topk(k, dim=-1)
    return probs, top_p, top_i


def _pairs(ids: torch.Tensor, probs: torch.Tensor) -> list[tuple[int, float]]:
    return [(int(i), round(float(p), 4)) for i, p in zip(ids.tolist(), probs.tolist())]


@dataclass
class Divergence:
    """Per token of an answer: the token full depth would have chosen from the same prefix.

    `tokens[i]`: position i, the answer's token, full depth's token and its probability, and the
    probability full depth gives the answer's token (the same where they agree). `top[i]`: full depth's
    top alternatives there, (token id, probability), likeliest first."""

    agreement: float  # share of the answer's tokens equal to full depth's choice
    first: int | None  # the first position where they differ
    tokens: list[dict]
    top: list[list[tuple[int, float]]]

    def to_dict(self) -> dict:
        return {"agreement": self.agreement, "first": self.first, "tokens": self.tokens}


@torch.inference_mode()
def divergence(dec: Decoder, prompt_ids: Sequence[int], token_ids: Sequence[int], k: int = TOP,
               states: torch.Tensor | None = None) -> Divergence:
    """One full-depth pass over prompt + answer (the answer's last token is never fed back): at each answer
    position, full depth's choice against the answer's token. `states`: that pass's last hidden states from
    the prompt's last position on, computed already (skipdecode.batcher.Batcher.states)."""
    prompt, answer = list(prompt_ids), list(token_ids)
    if not prompt:
        raise ValueError("divergence needs a non-empty prompt")
    if not answer:
        return Divergence(1.0, None, [], [])
    if states is None:
        states = forward(dec, prompt + answer[:-1])[0][len(prompt) - 1:]
    probs, top_p, top_i = _top(dec, states, k)
    own = probs[torch.arange(len(answer)), torch.tensor(answer, device=probs.device)]
    tokens, tops = [], []
    for i, token in enumerate(answer):
        tokens.append({"position": i, "token": token, "full_token": int(top_i[i, 0]),
                       "full_prob": round(float(top_p[i, 0]), 4), "skip_prob": round(float(own[i]), 4)})
        tops.append(_pairs(top_i[i], top_p[i]))
    same = [t["token"] == t["full_token"] for t in tokens]
    first = same.index(False) if False in same else None
    return Divergence(round(sum(same) / len(same), 4), first, tokens, tops)


@dataclass
class Lens:
    """One position of one run, layer by layer: the layers that ran and, after each, the top tokens of
    final norm + LM head, (token id, probability), likeliest first, and the probability of the run's final
    choice (the last row's first token), where the choice settles."""

    position: int
    layers: list[int]
    top: list[list[tuple[int, float]]]
    final: list[float]

    @property
    def choice(self) -> int:
        return self.top[-1][0][0]

    @property
    def depth(self) -> int:
        """Prediction depth: the first run layer whose top token is the final one (as the Tuned Lens
        defines it)."""
        return next(layer for layer, top in zip(self.layers, self.top) if top[0][0] == self.choice)

    @property
    def settled(self) -> int:
        """The first run layer from which the top token stays the final one."""
        index = len(self.top) - 1
        while index > 0 and self.top[index - 1][0][0] == self.choice:
            index -= 1
        return self.layers[index]

    def to_dict(self) -> dict:
        return {"position": self.position, "layers": self.layers, "top": [[list(p) for p in t] for t in self.top],
                "final": self.final, "depth": self.depth, "settled": self.settled}

    @classmethod
    def from_dict(cls, data: dict) -> "Lens":
        return cls(data["position"], list(data["layers"]), [[tuple(p) for p in t] for t in data["top"]],
                   list(data["final"]))


@torch.inference_mode()
def lens(dec: Decoder, prompt_ids: Sequence[int], token_ids: Sequence[int],
         steps: Sequence[Sequence[int]] | None = None, positions: Sequence[int] | None = None,
         k: int = TOP) -> list[Lens]:
    """The logit lens at answer `positions` (default: all). `steps[s]`: the layers decode step s ran (a
    trace's steps; None: full depth); the prefill that chose token 0 ran every layer, and step s fed
    token s and chose token s + 1."""
    prompt, answer = list(prompt_ids), list(token_ids)
    if not prompt or not answer:
        raise ValueError("the lens needs a non-empty prompt and answer")
    positions = range(len(answer)) if positions is None else list(positions)
    if any(not 0 <= i < len(answer) for i in positions):
        raise ValueError(f"positions must be within 0..{len(answer) - 1}")
    fed = answer[:-1]
    if steps is not None and len(steps) < len(fed):
        raise ValueError(f"{len(steps)} steps for {len(fed)} fed-back tokens")
    runs = None if steps is None else [range(dec.num_layers)] * len(prompt) + [steps[s] for s in range(len(fed))]
    columns = [len(prompt) - 1 + i for i in positions]
    _, watched = forward(dec, prompt + fed, runs, columns)
    out = []
    for i, column in zip(positions, columns):
        layers = [layer for layer, _ in watched[column]]
        probs, top_p, top_i = _top(dec, torch.stack([h for _, h in watched[column]]), k)
        final = [round(float(p), 4) for p in probs[:, top_i[-1, 0]]]
        out.append(Lens(i, layers, [_pairs(ids, ps) for ids, ps in zip(top_i, top_p)], final))
    return out
