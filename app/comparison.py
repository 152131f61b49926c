"""A run as the page follows it: SkipDecode and full decoding of one prompt (`Comparison`), or several prompts
as one batch (`BatchRun`), as far as they have got. app/replay.py writes a finished one as the run's record."""

from __future__ import annotations

from dataclasses import dataclass, field

from skipdecode import lens
from skipdecode.batcher import Update
from skipdecode.schedule import Schedule

from . import timing
from .settings import Settings

TIMING_NOTE = ("SkipDecode and full decoding ran interleaved in one thread of this process: one position of "
               "each in turn, each step timed on its own, so both saw the same machine load.")


@dataclass
class Comparison:
    """SkipDecode and full decoding of one prompt, as far as they have got."""

    prompt: str
    model: str  # the model SkipDecode ran
    full_model: str  # the model full decoding ran: `model`, or for "auto" the fine-tuned 1x one
    num_layers: int
    schedule: Schedule
    max_new_tokens: int
    skip: Update | None = None
    full: Update | None = None
    references: tuple[str, ...] | None = None
    quality: dict | None = None
    cost: tuple[int, int] = (1, 0)  # weights per layer, weights of the LM head
    why: tuple[str, str] = ("chosen", "chosen")  # why each side runs its model ("auto" says which and why)
    dtypes: tuple[str, str] = ("float32", "float32")  # each side's precision
    decoding: str = "greedy"  # how both sides chose their tokens (`decoding_name`)
    divergence: lens.Divergence | None = None  # full depth's choice at each SkipDecode position (same prefix)
    divergence_ms: float = 0.0  # what computing it took
    lenses: dict | None = None  # "skipdecode" / "full" -> [lens.Lens per position], made when first asked
    settings: Settings | None = None  # what the request asked, as it ran (an export records these, never the widgets)
    verified: bool = False  # the SkipDecode side drafted and the full side's model verified: full decoding's output
    stopped: bool = False  # Stop ended both sides early: what they had written is the comparison
    pieces: tuple[list[str], list[str]] | None = None  # each side's text per token, as the page decoded it once

    @property
    def done(self) -> bool:
        """No more tokens are coming: both sides finished, or Stop ended them."""
        return self.stopped or bool(self.skip and self.skip.done and self.full and self.full.done)

    def speedups(self) -> dict[str, float | None]:
        """Decode speedups: `layers` (full depth / average budget), `weights` (weights read per step, the LM
        head included, which every step reads whatever its budget) and `measured` (full ms / SkipDecode ms
        per decoded token over the tokens both runs reached: app/timing.py's figure, the page's own)."""
        out = {"layers": None, "weights": None, "measured": None}
        if not (self.skip and self.skip.trace.steps):
            return out
        if self.verified:  # every kept token is verified at full depth: only the measured ratio applies
            return {**out, "measured": self._measured()}
        average = self.skip.trace.average_layers
        layer, head = self.cost
        out["layers"] = round(self.num_layers / average, 3)
        out["weights"] = round((self.num_layers * layer + head) / (average * layer + head), 3)
        out["measured"] = self._measured()
        return out

    def _measured(self) -> float | None:
        figures = timing.of(self)
        return figures.decode if figures is not None else None


@dataclass
class BatchRun:
    """Several prompts decoded as one SkipDecode batch (and one full-decoding batch beside it)."""

    prompts: list[str]
    schedule: Schedule
    num_layers: int
    models: tuple[str, str] = ("", "")  # the labels of the models the two sides ran
    why: tuple[str, str] = ("chosen", "chosen")  # why "auto" picked each ("chosen": named by the user)
    skip: list[Update | None] = field(default_factory=list)
    full: list[Update | None] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return all(u is not None and u.done for u in self.skip + self.full)
