"""The peer SkipDecode argues against: per-token early exit on a confidence threshold (CALM-style).

Each row leaves the network at the first layer where its confidence passes a threshold (Schuster et al.,
2022, "Confident Adaptive Language Modeling"). In a batch with a KV cache that costs twice:
- a row that exits below layer l still owes later tokens its keys and values at layer l. CALM copies the
  exited hidden state upward and computes them from it (`Decoder.fill_kv`), so the cache has no holes;
- the rows of a batch share one forward pass, so the batch runs until its slowest row has exited, the
  rows that left earlier riding along with their state frozen (their keys and values at those layers come
  from the frozen state, as the copying rule says).
SkipDecode avoids both by giving every row at a position the same budget, spent on the top layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..cache import KVCache
from ..trace import StepRecord, Trace
from ..transformer import Decoder

MEASURES = ("state", "softmax")
# Where a confidence threshold can lie: cosine similarity for "state", top-1 minus top-2 probability for
# "softmax". A threshold above the range never lets a row exit (full decoding).
RANGES = {"state": (-1.0, 1.0), "softmax": (0.0, 1.0)}


@dataclass
class ExitRecord(StepRecord):
    """A step of the peer: `budget`/`layers` are the layers the batch ran in full (up to its slowest row),
    `skipped` the layers it only filled with copied keys and values, `exits` each row's own exit layer."""

    exits: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {**super().to_dict(), "exits": list(self.exits)}


@dataclass(frozen=True)
class EarlyExit:
    """Exit a row after layer l (l >= min_layers) once its confidence reaches `threshold`.

    measure "state": cosine similarity of the hidden state before and after the layer (CALM's hidden-state
    saturation; a few vector operations per layer, the cheapest of CALM's measures). "softmax": the gap
    between the top two probabilities of the LM head on that layer's state (CALM's softmax response; it
    costs one LM head per layer, more than a layer itself on this model). No classifier is trained."""

    num_layers: int
    threshold: float
    measure: str = "state"
    min_layers: int = 1

    def __post_init__(self):
        if self.measure not in MEASURES:
            raise ValueError(f"measure must be one of {', '.join(MEASURES)}; got {self.measure!r}")
        if not isinstance(self.threshold, (int, float)) or not math.isfinite(self.threshold):
            raise ValueError(f"threshold must be a finite number; got {self.threshold!r}")
        if not isinstance(self.min_layers, int) or not 1 <= self.min_layers <= self.num_layers:
            raise ValueError(f"min_layers must be an integer in [1, {self.num_layers}]; got {self.min_layers!r}")

    def to_dict(self) -> dict:
        return {"method": "early_exit_peer", "num_layers": self.num_layers, "threshold": self.threshold,
                "measure": self.measure, "min_layers": self.min_layers}

    def confidence(self, dec: Decoder, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """[B] confidence of each row's prediction from `after` [B, d], the state leaving the layer."""
        if self.measure == "state":
            return torch.nn.functional.cosine_similarity(after.float(), before.float(), dim=-1)
        top = dec.logits(after).float().softmax(dim=-1).topk(2, dim=-1).values
        return top[:, 0] - top[:, 1]

    def run(self, dec: Decoder, cache: KVCache, step: int, column: int, x, rope, mask):
        """The engine's column policy (see engine.Scheduled): one position, rows exiting on their own."""
        L, B = self.num_layers, x.shape[0]
        exits = torch.full((B,), L, dtype=torch.long, device=x.device)  # layers each row ran in full
        active = torch.ones(B, dtype=torch.bool, device=x.device)
        batch_layers = L
        for layer in range(L):
            keys, values = cache.claim(layer, column, 1)
            if layer >= batch_layers:  # every row has left: the rest of the column only fills the cache
                dec.fill_kv(layer, x, rope, keys, values, column)
                continue
            out = dec.block(layer, x, rope, mask, keys, values, column)
            if layer + 1 < self.min_layers:
                x = out
                continue
            leaving = active & (self.confidence(dec, x[:, -1], out[:, -1]) >= self.threshold)
            x = torch.where(active[:, None, None], out, x)  # rows that left earlier keep their copied state
            exits.masked_fill_(leaving, layer + 1)
            active &= ~leaving
            if not bool(active.any()):  # a host sync per layer: the price of per-token decisions
                batch_layers = layer + 1
        ran = tuple(range(batch_layers))
        record = ExitRecord(step, batch_layers, ran, tuple(range(batch_layers, L)), 0.0, B,
                            exits=tuple(exits.tolist()))
        return x, record


def token_layers(trace: Trace) -> list[int]:
    """Layers each generated token ran in full, over all rows and positions (the prefill excluded)."""
    out = []
    for record in trace.steps:
        out.extend(record.exits if isinstance(record, ExitRecord) else [record.budget] * record.rows)
    return out


def average_token_layers(trace: Trace) -> float:
    layers = token_layers(trace)
    return sum(layers) / len(layers) if layers else 0.0


def calibrate(engine, prompts, average_layers: float, max_new_tokens: int, measure: str = "state",
              min_layers: int = 1, tolerance: float = 0.25, rounds: int = 14) -> tuple[EarlyExit, float]:
    """The threshold at which the peer spends `average_layers` layers per generated token on these
    prompts (greedy, EOS ignored), found by bisection on real runs: exits change the tokens that follow,
    so no single full-depth run can predict them. Returns the peer and the average it reached."""
    low, high = RANGES[measure]
    best = None
    for _ in range(rounds):
        peer = EarlyExit(engine.num_layers, (low + high) / 2, measure, min_layers)
        trace = engine.generate(prompts, peer, max_new_tokens=max_new_tokens, stop_at_eos=False).trace
        reached = average_token_layers(trace)
        if best is None or abs(reached - average_layers) < abs(best[1] - average_layers):
            best = (peer, reached)
        if abs(reached - average_layers) <= tolerance:
            break
        if reached < average_layers:
            low = peer.threshold  # exits too early: demand more confidence
        else:
            high = peer.threshold
    return best
