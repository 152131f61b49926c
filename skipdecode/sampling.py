"""Choosing the next token: greedy, or sampling with temperature, top-k and top-p, seeded."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy decoding; top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        _number("temperature", self.temperature, 0.0, 100.0)
        _number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off); got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)
                                      or not -2**63 <= self.seed < 2**64):  # what torch.Generator takes
            raise ValueError(f"seed must be an integer in [-2**63, 2**64) or None; got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self, device) -> torch.Generator | None:
        if self.greedy:
            return None
        generator = torch.Generator(device=device)
        generator.manual_seed(self.seed if self.seed is not None else torch.seed())
        return generator

    def to_dict(self) -> dict:
        return asdict(self)


def next_tokens(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """logits [B, V] -> token ids [B]; the filters follow transformers' order (temperature, top-k, top-p)."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    return torch.multinomial(probabilities(logits, sampling), 1, generator=generator).squeeze(-1)


def probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The distribution sampling draws from, [..., V] (verified decoding's acceptance rule compares the
    draft's and the verifier's)."""
    logits = logits.float() / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(logits, min(sampling.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if sampling.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= 1.0 - sampling.top_p
        drop_sorted[..., -1] = False  # always keep the most likely token
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), -math.inf)
    return logits.softmax(dim=-1)


def _number(name, value, low, high, low_open=False):
    bad = isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
    if bad or value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} must be a number in {bracket}{low:g}, {high:g}]; got {value!r}")
