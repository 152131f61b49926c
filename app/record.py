"""The exported comparison's format as a declared schema: a replayed trace file is data from a stranger.

`load` refuses a file too large before reading it, parses it with pydantic's JSON parser (which has a
nesting limit, so 100,000 `[` cannot drive it into deep recursion), checks every field's type (strict: a
number written as a string is refused) and the lengths that must agree, and says what is wrong in one
sentence that names the field. What passes is the plain dict app/replay.py and app/teach.py read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from skipdecode.schedule import Schedule  # a dataclass: pydantic checks its fields, then its own __post_init__

from .settings import Settings

FORMAT = "skipdecode-studio-trace/1"
MAX_BYTES = 20_000_000  # a replayed file larger than this is refused before it is read
MAX_LAYERS = 1024  # the page draws a row per layer: a larger model is not one this app runs

Count = Field(ge=0)
Added = Field(default=0, ge=0)  # a count newer exports carry; older files lack it
Probability = Field(ge=0.0, le=1.0)


class Strict(BaseModel):
    """Types as written (no "6" for 6), finite numbers; unknown fields are ignored (a newer export)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


class Sides(Strict):
    skipdecode: str
    full: str


class Step(Strict):
    step: int = Count
    budget: int = Count
    layers: list[int]
    skipped: list[int]
    ms: float = Count
    rows: int = Count


class Trace(Strict):
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    batch_size: int = Count
    prompt_tokens: int = Count
    schedule: Schedule
    prefill_ms: float = Count
    prefix_tokens: int = Added  # of the prompt's, from the prefix cache
    generated_tokens: int = Count
    cache_lengths: list[int]
    steps: list[Step]


class Batch(Strict):
    number: int
    size: int = Count
    started: float


class Side(Strict):
    text: str
    token_ids: list[int]
    finished: bool
    batch: Batch
    trace: Trace
    prompt_ids: list[int]
    pieces: list[str]
    layers: list[int]


class Token(Strict):
    position: int = Count
    token: int = Count
    full_token: int = Count
    full_prob: float = Probability
    skip_prob: float = Probability


class Divergence(Strict):
    agreement: float = Probability
    first: int | None = Field(ge=0)
    tokens: list[Token]
    top: list[list[tuple[int, float]]]


class LensView(Strict):
    position: int = Count
    layers: list[int]
    top: list[list[tuple[int, float]]]
    final: list[float]
    depth: int
    settled: int


class Lens(Strict):
    skipdecode: list[LensView]
    full: list[LensView]


class Scores(Strict):
    bleu: float
    rouge_l: float


class Agreement(Strict):
    agreement: float = Probability
    prefix: int = Count


class Perplexity(Strict):
    skipdecode: float | None
    full: float | None


class Quality(Strict):
    skipdecode_vs_full: Scores | None
    token_agreement: Agreement
    perplexity: Perplexity
    references: dict[Literal["skipdecode", "full"], Scores] | None


class Speedups(Strict):
    layers: float | None
    weights: float | None
    measured: float | None


class Hardware(Strict):
    device: str
    dtype: str
    cpu: str
    cpu_count: int | None = None
    torch: str = ""
    platform: str = ""
    gpu: str = ""


class Round(Strict):
    """One verify pass (skipdecode/speculative/verify.py's Round.to_dict)."""

    first: int = Count
    drafted: int = Count
    accepted: int = Count
    emitted: int = Count
    source: Literal["skipdecode", "prompt", "none"]
    draft_ms: float = Count
    verify_ms: float = Count
    prompt_drafts: int = Added  # drafts copied from the prompt (the rest are the skipped model's)
    stop: Literal["", "limit", "confidence", "eos", "prompt"] = ""  # why the round's drafting ended


class Verification(Strict):
    """What verified decoding did (skipdecode/speculative/verify.py's Verification.to_dict): one mark per token, one
    round per verify pass (files exported before rounds were recorded have none)."""

    verified: bool
    draft_tokens: int = Field(ge=1)
    draft_model: str
    verifier_model: str
    drafted: int = Count
    accepted: int = Count
    acceptance_rate: float | None = Probability
    verify_passes: int = Count
    passes_per_token: float | None = Count
    draft_ms: float = Count
    verify_ms: float = Count
    marks: list[Literal["accepted", "replaced", "verifier"]]
    sources: list[Literal["skipdecode", "prompt", "verifier"]] = []
    rounds: list[Round] = []
    # one prefill, one cache, the drafting rules (files exported before these have none: the defaults)
    plain_steps: int = Added
    prompt_drafted: int = Added
    prompt_accepted: int = Added
    prompt_tokens: int = Added
    prefix_tokens: int = Added
    prefill_ms: float = Field(default=0.0, ge=0)
    cache_bytes: int = Added
    threshold: float | None = None
    costs: dict[str, float | None] = {}


class Record(Strict):
    format: Literal[FORMAT]
    exported: str = Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")  # it names the file a re-export writes
    prompt: str
    model: str
    full_model: str
    why: Sides
    dtype: Sides
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    decoding: str
    schedule: Schedule
    max_new_tokens: int = Field(ge=1)
    skipdecode: Side
    full: Side
    speedup: Speedups
    quality: Quality | None
    references: list[str] | None
    timing: str
    settings: Settings | None
    seed: int | None
    cost: tuple[float, float]
    divergence: Divergence
    divergence_ms: float = 0.0
    hardware: Hardware
    texts: dict[str, str]
    lens: Lens | None
    verified: bool = False
    verification: Verification | None = None

    @model_validator(mode="after")
    def _agree(self):
        """The lengths and ranges the page relies on: one piece, one layer count and one divergence entry
        per token, a step per fed-back token, the lens of every position, layers within the model."""
        L, n = self.num_layers, len(self.skipdecode.token_ids)
        for name in ("skipdecode", "full"):
            side = getattr(self, name)
            k = len(side.token_ids)
            _same(f"{name}.pieces", side.pieces, k, f"{name}.token_ids")
            _same(f"{name}.layers", side.layers, k, f"{name}.token_ids")
            if len(side.trace.steps) < k - 1:
                raise ValueError(f"{name}.trace.steps has {len(side.trace.steps)} steps for {k} tokens")
            if side.trace.num_layers != L:
                raise ValueError(f"{name}.trace.num_layers is {side.trace.num_layers}, not num_layers ({L})")
            _within(f"{name}.layers", side.layers, 0, L)
            for s in side.trace.steps:
                _within(f"{name}.trace.steps.{s.step}.layers", s.layers + s.skipped, 0, L - 1)
        if self.verified:
            if self.verification is None:
                raise ValueError("verification is missing from a verified comparison")
            _same("verification.marks", self.verification.marks, n, "skipdecode.token_ids")
            if self.verification.accepted > self.verification.drafted:
                raise ValueError("verification.accepted is more than verification.drafted")
            if self.verification.sources:
                _same("verification.sources", self.verification.sources, n, "skipdecode.token_ids")
            for i, r in enumerate(self.verification.rounds):
                if r.accepted > r.drafted or r.first + r.emitted > n:
                    raise ValueError(f"verification.rounds.{i} does not fit the answer's {n} tokens")
        _same("divergence.tokens", self.divergence.tokens, n, "skipdecode.token_ids")
        _same("divergence.top", self.divergence.top, n, "skipdecode.token_ids")
        if [t.position for t in self.divergence.tokens] != list(range(n)):
            raise ValueError("divergence.tokens are not positions 0, 1, 2, … in order")
        if self.divergence.first is not None and self.divergence.first >= n:
            raise ValueError(f"divergence.first ({self.divergence.first}) is past the last token")
        if self.schedule.num_layers != L:
            raise ValueError(f"schedule.num_layers is {self.schedule.num_layers}, not num_layers ({L})")
        if not all(key.isdigit() for key in self.texts):
            raise ValueError("texts has a key that is not a token id")
        for name in ("skipdecode", "full") if self.lens else ():
            views = getattr(self.lens, name)
            _same(f"lens.{name}", views, n, "skipdecode.token_ids")
            for i, view in enumerate(views):
                if view.position != i:
                    raise ValueError(f"lens.{name}.{i}.position is {view.position}, not {i}")
                _same(f"lens.{name}.{i}.top", view.top, len(view.layers), f"lens.{name}.{i}.layers")
                _same(f"lens.{name}.{i}.final", view.final, len(view.layers), f"lens.{name}.{i}.layers")
                _within(f"lens.{name}.{i}.layers", view.layers, 0, L - 1)
        return self


def _same(field: str, items: list, n: int, other: str) -> None:
    if len(items) != n:
        raise ValueError(f"{field} has {len(items)} entries, {other} has {n}")


def _within(field: str, values: list[int], low: int, high: int) -> None:
    if any(not low <= v <= high for v in values):
        raise ValueError(f"{field} holds a value outside {low}..{high}")


def load(path: str | os.PathLike) -> dict:
    """The record in an exported file, checked; ValueError with one sentence saying what is wrong."""
    size = Path(path).stat().st_size
    if size > MAX_BYTES:
        raise ValueError(f"This file is {size:,} bytes, more than the {MAX_BYTES:,} an exported comparison may be.")
    data = Path(path).read_bytes()
    try:
        Record.model_validate_json(data)
    except ValidationError as error:
        raise ValueError(sentence(error)) from None
    return json.loads(data)


def sentence(error: ValidationError) -> str:
    """The first problem pydantic found, as one sentence naming the field (never the value: it may be
    megabytes, or markup)."""
    first = error.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "json_invalid":
        return f"This file is not an exported comparison: it is not valid JSON ({message.removeprefix('Invalid JSON: ')})."
    if first["type"] == "missing":
        return f"This exported comparison is damaged: {where} is missing."
    if first["type"] == "string_pattern_mismatch":  # `exported`, the only field with a pattern
        return f"This exported comparison is damaged: {where} is not a date such as 2026-01-31T12:00:00Z."
    if first["type"] == "model_type" and not where:
        return "This file is not an exported comparison: it holds no JSON object."
    if where == "format":
        return f"This file is not an exported comparison: its format is not {FORMAT}."
    return f"This exported comparison is damaged: {where + ': ' if where else ''}{message.rstrip('.')}."
