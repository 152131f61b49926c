"""How much faster, and whether the run can tell: one set of figures for the headline, the cards and the
latency charts, so that they always agree.

Both sides are counted the same way: the time to each output token, the prefill included (the time to the
whole answer), and the time per decoded token (prefill excluded). The sides run interleaved, one turn of
each in turn (skipdecode/batcher.py): a turn is one decode step of a plain run, or one round of verified
decoding (its drafts and their verify pass, one or more tokens). Resampling those turns, each with the
other side's turn beside it, gives the spread a single run carries; where that spread holds 1, the
verdict is "too close to call" instead of a faster or slower that flips from run to run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

RESAMPLES = 2000
INTERVAL = (5.0, 95.0)  # percentiles of the resampled ratios: a 90% interval
MIN_TURNS = 4  # fewer decode turns than this: too short a run to tell anything from its spread
FASTER, SLOWER, CLOSE, SHORT = "faster", "slower", "close", "short"


def token_frame(trace) -> pd.DataFrame:
    """One row per output token, counted from 1 as people count: `token` (1 = the prefill's), `ms` (what choosing
    it took; the prefill for token 1) and `cumulative_ms` (the time to that token, prefill included)."""
    ms = [float(trace.prefill_ms)] + [float(step.ms) for step in trace.steps]
    frame = pd.DataFrame({"token": range(1, len(ms) + 1), "ms": ms})
    frame["cumulative_ms"] = frame["ms"].cumsum()
    return frame


def turns(update, verification: dict | None = None) -> list[tuple[float, int]]:
    """(ms, tokens) of each decode turn after the prefill: a round of verified decoding, else one step."""
    rounds = (verification or {}).get("rounds") or []
    if rounds:
        return [(float(r["draft_ms"]) + float(r["verify_ms"]), int(r["emitted"])) for r in rounds]
    return [(float(step.ms), 1) for step in update.trace.steps]


@dataclass(frozen=True)
class Timing:
    tokens: int  # output tokens both sides reached: the figures compare the time to token `tokens` - 1
    skip_ms: float  # time to that token, prefill included
    full_ms: float
    skip_prefill_ms: float
    full_prefill_ms: float
    end_to_end: float | None  # full_ms / skip_ms
    decode: float | None  # full ms / skip ms per decoded token (prefill excluded)
    low: float | None  # the 90% interval of end_to_end, the decode turns resampled (the prefills as timed)
    high: float | None
    decode_low: float | None
    decode_high: float | None
    turns: int  # decode turns resampled (the longer side's)

    @property
    def verdict(self) -> str:
        """FASTER or SLOWER where the whole interval says so, CLOSE where it holds 1, SHORT for a tiny run."""
        if self.end_to_end is None or self.low is None:
            return SHORT
        if self.low > 1.0:
            return FASTER
        if self.high < 1.0:
            return SLOWER
        return CLOSE

    def words(self, name: str = "SkipDecode") -> str:
        """The verdict as a phrase, as the headline and the latency chart's title give it."""
        r = self.end_to_end
        if r is None:
            return "not timed yet"
        verdict = self.verdict
        if verdict == FASTER:
            return f"{name} {r:.2f}× faster to the whole answer"
        if verdict == SLOWER:
            return f"{name} slower to the whole answer: {r:.2f}× the speed"
        if verdict == CLOSE:
            return f"too close to call: {name} {self.low:.2f}–{self.high:.2f}× the speed of full decoding"
        return f"{name} {r:.2f}× the speed (too short a run to tell)"

    def spread(self) -> str:
        """Where the interval came from, in one clause."""
        if self.low is None:
            return f"only {self.turns} decode turns: too few to tell the spread"
        return (f"{self.low:.2f}–{self.high:.2f}× over this run's {self.turns} interleaved turns (each side's "
                f"prefill timed once)")


def timing(skip, full, skip_turns: list[tuple[float, int]], full_turns: list[tuple[float, int]],
           seed: int = 0) -> Timing:
    """The figures for two finished (or partial) sides: `skip` and `full` are Updates (their traces), the
    turns as `turns` gives them. The headline figures and their spread come from the same numbers: each
    side's prefill and the turns that decoded the tokens both sides reached (a side that went on past them
    counts none of its later turns), so the figure is the resampling's own unresampled value."""
    n = min(len(skip.token_ids), len(full.token_ids), len(skip.trace.steps) + 1, len(full.trace.steps) + 1)
    if n < 1:
        return Timing(n, 0.0, 0.0, 0.0, 0.0, None, None, None, None, None, None, 0)
    s_pre, f_pre = float(skip.trace.prefill_ms), float(full.trace.prefill_ms)
    s_turns, f_turns = reaching(skip_turns, n - 1), reaching(full_turns, n - 1)
    s_tok, f_tok = per_token(s_turns), per_token(f_turns)  # ms per decoded token (None: nothing decoded)
    s_ms, f_ms = s_pre + (n - 1) * (s_tok or 0.0), f_pre + (n - 1) * (f_tok or 0.0)
    end_to_end = round(f_ms / s_ms, 3) if s_ms > 0 else None
    decode = round(f_tok / s_tok, 3) if n > 1 and s_tok and f_tok else None
    low = high = d_low = d_high = None
    count = max(len(s_turns), len(f_turns))
    if decode is not None and min(len(s_turns), len(f_turns)) >= MIN_TURNS:
        resampled = _resampled(s_turns, f_turns, count, seed)
        if resampled is not None:  # the prefills as timed, once each; the decoded tokens at each resampled cost
            s_each, f_each = resampled
            e2e = (f_pre + (n - 1) * f_each) / (s_pre + (n - 1) * s_each)
            low, high = (round(float(v), 3) for v in np.percentile(e2e, INTERVAL))
            d_low, d_high = (round(float(v), 3) for v in np.percentile(f_each / s_each, INTERVAL))
    return Timing(n, s_ms, f_ms, s_pre, f_pre, end_to_end, decode, low, high, d_low, d_high, count)


def reaching(turns: list[tuple[float, int]], tokens: int) -> list[tuple[float, int]]:
    """The first turns, up to the one that decoded token `tokens` (a round of several tokens counts whole)."""
    out, made = [], 0
    for turn in turns:
        if made >= tokens:
            break
        out.append(turn)
        made += turn[1]
    return out


def per_token(turns: list[tuple[float, int]]) -> float | None:
    tokens = sum(t for _, t in turns)
    return sum(ms for ms, _ in turns) / tokens if tokens else None


def _resampled(skip_turns, full_turns, count: int, seed: int):
    """Each side's ms per decoded token in RESAMPLES resamplings of the turn indices (the same indices for
    both sides: a turn of one ran beside the same turn of the other)."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, count, size=(RESAMPLES, count))
    out = []
    for side in (skip_turns, full_turns):
        ms = np.array([m for m, _ in side] + [0.0] * (count - len(side)))
        tokens = np.array([t for _, t in side] + [0] * (count - len(side)), dtype=float)
        total_ms, total_tokens = ms[picks].sum(axis=1), tokens[picks].sum(axis=1)
        out.append((total_ms, total_tokens))
    (s_ms, s_tok), (f_ms, f_tok) = out
    keep = (s_tok > 0) & (f_tok > 0) & (s_ms > 0)
    if not keep.any():
        return None
    return s_ms[keep] / s_tok[keep], f_ms[keep] / f_tok[keep]


def of(comparison) -> Timing | None:
    """The Timing of a comparison (a run so far, or a replayed one); None before both sides have a token."""
    skip, full = comparison.skip, comparison.full
    if not (skip and full and skip.token_ids and full.token_ids):
        return None
    verification = skip.verification if comparison.verified else None
    return timing(skip, full, turns(skip, verification), turns(full))
