"""Layer budgets per generated position: the SkipDecode schedule.

Every row of a batch at generated position s gets the same budget b(s), and b never increases with s.
In "skip" mode a token runs the warm-up layers [0, w) and the top b(s) - w layers; the middle is skipped.
Because b is non-increasing, the set of positions at which any layer runs is a prefix of the sequence:
every layer a token runs already holds the keys and values of all earlier positions, so batching and the
KV cache work with nothing recomputed. "early_exit" (the paper's ablation) runs layers [0, b(s)).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from functools import cached_property

DECAYS = ("linear", "power", "exponential", "cosine", "step")
MODES = ("skip", "early_exit")
DEFAULT_WARMUP = 2
DEFAULT_HORIZON = 64
E2E_HORIZON = 32  # E2E references average ~30 tokens with the end-of-turn token: the E2E adapters' horizon
SPREAD = 1.5  # for_speedup starts from max budget = SPREAD x the target average, like the paper's wide decays
POWER = 2.0  # power decay: (1 - x) ** POWER
EXP_RATE = 4.0  # exponential decay: exp(-EXP_RATE x), rescaled to end at 0
STEPS = 4  # step decay: STEPS equal plateaus from max to min


def decay_fraction(decay: str, x: float) -> float:
    """Share of (max - min) still granted at relative position x = s / horizon; 1 at x=0, 0 at x>=1."""
    if x >= 1.0:
        return 0.0
    if decay == "linear":
        return 1.0 - x
    if decay == "power":
        return (1.0 - x) ** POWER
    if decay == "exponential":
        return (math.exp(-EXP_RATE * x) - math.exp(-EXP_RATE)) / (1.0 - math.exp(-EXP_RATE))
    if decay == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * x))
    if decay == "step":
        return 1.0 - math.floor(x * STEPS) / (STEPS - 1)
    raise ValueError(f"decay must be one of {', '.join(DECAYS)}; got {decay!r}")


def _integer(name: str, value, low: int, high: int | None = None) -> int:
    """An integer parameter within [low, high], or a ValueError naming it and its range."""
    where = f"in [{low}, {high}]" if high is not None else f">= {low}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be an integer {where}; got {value!r}")
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{name} must be an integer {where}; got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be an integer {where}; got {value}")
    return value


@dataclass(frozen=True)
class Schedule:
    """Budget b(s): max_budget at s=0, decaying to min_budget at s=horizon, min_budget after."""

    num_layers: int
    max_budget: int
    min_budget: int
    warmup: int = DEFAULT_WARMUP
    horizon: int = DEFAULT_HORIZON
    decay: str = "linear"
    mode: str = "skip"

    def __post_init__(self):
        L = _integer("num_layers", self.num_layers, 1)
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        set_("num_layers", L)
        set_("warmup", _integer("warmup", self.warmup, 0, L - 1))
        set_("max_budget", _integer("max_budget", self.max_budget, self.warmup + 1, L))
        set_("min_budget", _integer("min_budget", self.min_budget, self.warmup + 1, self.max_budget))
        set_("horizon", _integer("horizon", self.horizon, 1))
        if self.decay not in DECAYS:
            raise ValueError(f"decay must be one of {', '.join(DECAYS)}; got {self.decay!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        # Checked, not assumed: the KV cache is only complete if no budget ever grows.
        budgets = self._budgets
        if any(later > earlier for earlier, later in zip(budgets, budgets[1:])):
            raise AssertionError(f"budgets must never increase: {budgets}")

    @classmethod
    def full(cls, num_layers: int) -> "Schedule":
        """Full decoding: every position runs every layer."""
        return cls(num_layers, num_layers, num_layers, warmup=0, horizon=1)

    @cached_property
    def _budgets(self) -> tuple[int, ...]:
        span = self.max_budget - self.min_budget
        return tuple(
            self.min_budget + round(span * decay_fraction(self.decay, s / self.horizon))
            for s in range(self.horizon + 1)
        )

    def budget(self, step: int) -> int:
        """Layers run by every row at generated position `step` (0 = first token fed back)."""
        return self._budgets[min(step, self.horizon)]

    def layers(self, step: int) -> tuple[int, ...]:
        """Indices of the layers run at `step`, bottom to top; the last one feeds the LM head."""
        b, w, L = self.budget(step), self.warmup, self.num_layers
        if self.mode == "early_exit":
            return tuple(range(b))
        return tuple(range(w)) + tuple(range(L - (b - w), L))

    def skipped(self, step: int) -> tuple[int, ...]:
        run = set(self.layers(step))
        return tuple(l for l in range(self.num_layers) if l not in run)

    def plan(self, steps: int) -> list[list[bool]]:
        """runs[s][l]: whether layer l runs at generated position s (what training follows)."""
        rows = []
        for s in range(steps):
            run = set(self.layers(s))
            rows.append([l in run for l in range(self.num_layers)])
        return rows

    def average_budget(self, steps: int | None = None) -> float:
        """Mean layers per token over the first `steps` positions (default: the horizon)."""
        n = self.horizon if steps is None else steps
        return sum(self.budget(s) for s in range(n)) / max(n, 1)

    def to_dict(self) -> dict:
        return asdict(self)


def max_speedup(num_layers: int, warmup: int = DEFAULT_WARMUP) -> float:
    """The largest target a schedule can meet: every token runs only warm-up + 1 layers."""
    return num_layers / (warmup + 1)


def for_speedup(
    target: float,
    num_layers: int,
    horizon: int = DEFAULT_HORIZON,
    warmup: int = DEFAULT_WARMUP,
    decay: str = "linear",
    mode: str = "skip",
    spread: float = SPREAD,
) -> Schedule:
    """A schedule whose average budget over the horizon is num_layers / target (the paper's
    "target average layer"), within half a layer. It starts from a max budget of `spread` x that
    average, then picks the min budget that lands closest. Spread 1 is a constant budget: no token
    gets more than the average, and none (the late ones) gets less."""
    L = _integer("num_layers", num_layers, 1)
    w = _integer("warmup", warmup, 0, L - 1)
    limit = max_speedup(L, w)
    if isinstance(target, bool) or not isinstance(target, numbers.Real) or not math.isfinite(target):
        raise ValueError(f"speedup must be a number in [1, {limit:g}]; got {target!r}")
    if not 1.0 <= target <= limit + 1e-9:
        raise ValueError(
            f"speedup must be a number in [1, {limit:g}] (num_layers / (warmup + 1)); got {target:g}"
        )
    if isinstance(spread, bool) or not isinstance(spread, numbers.Real) or not 1.0 <= spread <= L:
        raise ValueError(f"spread must be a number in [1, {L}] (max budget / average budget); got {spread!r}")
    goal = L / target
    make = lambda hi, lo: Schedule(L, hi, lo, warmup=w, horizon=horizon, decay=decay, mode=mode)  # noqa: E731
    high = min(L, max(math.ceil(goal), round(spread * goal)))
    while high > w + 1 and make(high, w + 1).average_budget() > goal + 0.5:
        high -= 1  # even the lowest min budget overshoots: start lower
    candidates = [make(high, low) for low in range(w + 1, high + 1)]
    return min(candidates, key=lambda sched: abs(sched.average_budget() - goal))
