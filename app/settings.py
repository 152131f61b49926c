"""What a web request may ask for and how it is checked at the edge, before any model loads: the limits,
the Compare tab's settings (the schedule, sampling and beam search they describe) and the prompt's text."""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass

from skipdecode.beam import Beam
from skipdecode.sampling import Sampling
from skipdecode.schedule import DECAYS, DEFAULT_WARMUP, MODES, SPREAD, Schedule, for_speedup


@dataclass(frozen=True)
class Limits:
    """What one web request may ask for; the API and the UI share them. The character limit is checked
    before tokenizing, so a huge paste costs nothing; the horizon shares the token limit, since a
    schedule tabulates its budgets up to the horizon."""

    max_new_tokens: int = 512
    max_prompt_tokens: int = 1024
    max_prompt_chars: int = 16_384
    max_batch_prompts: int = 8
    max_temperature: float = 2.0
    max_beams: int = 8  # a search takes one row per beam, of each side's batch
    time_limit_s: float = 300.0
    # Models held in memory at once, the base model included (about 1.1 GB each in float32 for the
    # default model: the weights and their packed copy). "auto" needs two beside the base: the adapter for
    # the speedup and the 1x one it is compared with. Others are loaded again when asked for.
    max_models: int = 3

    def __post_init__(self):
        if self.max_models < 3:
            raise ValueError(f"max_models must be at least 3 (the base model and the two that auto compares); "
                             f"got {self.max_models}")


@dataclass
class Settings:
    """The controls of the Compare tab. `horizon` 0 means "the max new tokens"."""

    speedup: float = 3.0
    max_new_tokens: int = 48
    manual_budgets: bool = False
    max_budget: int = 20
    min_budget: int = 6
    warmup: int = DEFAULT_WARMUP
    horizon: int = 0
    decay: str = "linear"
    mode: str = "skip"
    sampling: bool = False
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 0
    seed: int = 0
    beams: int = 0  # beam search of this width; 0: none
    verify: bool = False  # verified decoding: SkipDecode drafts, the full side's model verifies (skipdecode/speculative/verify.py)

    def schedule(self, num_layers: int, default_horizon: int | None = None, limits: Limits = Limits(),
                 spread: float = SPREAD) -> Schedule:
        """The SkipDecode schedule these settings describe; ValueError says which setting is wrong.
        Horizon 0 means `default_horizon` (an adapter's training horizon), else the max new tokens; a
        speedup takes the shape (`spread`) the adapter was trained with."""
        horizon = (_whole("horizon", self.horizon) or default_horizon
                   or _whole("max new tokens", self.max_new_tokens))
        if horizon > limits.max_new_tokens:
            raise ValueError(f"horizon must be between 0 (= max new tokens) and {limits.max_new_tokens}; "
                             f"got {horizon}")
        warmup = _whole("warm-up layers", self.warmup)
        if self.decay not in DECAYS:
            raise ValueError(f"decay must be one of {', '.join(DECAYS)}; got {shown(self.decay)}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {shown(self.mode)}")
        if self.manual_budgets:
            return Schedule(num_layers, _whole("max budget", self.max_budget), _whole("min budget", self.min_budget),
                            warmup, horizon, self.decay, self.mode)
        return for_speedup(_number("speedup", self.speedup), num_layers, horizon, warmup, self.decay, self.mode,
                           spread)

    def sampler(self, limits: Limits = Limits()) -> Sampling:
        """Greedy, or sampling with settings checked against the app's ranges (the library's own checks
        then cover top-k and the seed)."""
        if not self.sampling:
            return Sampling()
        temperature, top_p = _number("temperature", self.temperature), _number("top-p", self.top_p)
        if not 0 < temperature <= limits.max_temperature:
            raise ValueError(f"temperature must be in (0, {limits.max_temperature:g}] for sampling; "
                             f"got {temperature:g}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1]; got {top_p:g}")
        return Sampling(temperature, _whole("top-k", self.top_k), top_p, _whole("seed", self.seed))

    def search(self, limits: Limits = Limits()) -> Beam | None:
        """Beam search of `beams` beams (within the app's limit), or None for one token at a time."""
        beams = _whole("beams", self.beams)
        if beams == 0:
            return None
        if self.sampling:
            raise ValueError("beam search looks for the likeliest output: choose it or sampling, not both")
        if not 2 <= beams <= limits.max_beams:
            raise ValueError(f"beams must be between 2 and {limits.max_beams} for beam search; got {beams}")
        return Beam(beams)


def decoding_name(sampling: Sampling, beam: Beam | None) -> str:
    if beam is not None:
        return f"beam search, {beam.width} beams (each side shows its best)"
    if sampling.greedy:
        return "greedy"
    return (f"sampling (temperature {sampling.temperature:g}, top-p {sampling.top_p:g}, top-k {sampling.top_k}, "
            f"seed {sampling.seed})")


def shown(value, limit: int = 60) -> str:
    """A value a web user sent, quoted for an error message and cut short: never echo a megabyte back."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(name: str, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a number; got {shown(value)}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number; got {value!r}")
    return value


def _whole(name: str, value) -> int:
    value = _number(name, value)
    if value != int(value):
        raise ValueError(f"{name} must be a whole number; got {value:g}")
    return int(value)


def clean_prompt(prompt, max_chars: int = Limits.max_prompt_chars) -> str:
    """The prompt as the model will see it, or a ValueError a person can act on. Length is checked
    first, so nothing else (not even the tokenizer) ever sees an oversized prompt."""
    if not isinstance(prompt, str):
        raise ValueError("the prompt must be text")
    if len(prompt) > max_chars:
        raise ValueError(f"the prompt is {len(prompt):,} characters long; this app takes at most {max_chars:,}")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: what invalid UTF-8 becomes on the way in
        raise ValueError("the prompt is not valid UTF-8 text") from None
    bad = sorted({c for c in prompt if unicodedata.category(c) == "Cc" and c not in "\n\t\r"})
    if bad:
        names = ", ".join(f"U+{ord(c):04X}" for c in bad[:5])
        raise ValueError(f"the prompt contains control characters ({names}); remove them and try again")
    prompt = prompt.strip()
    if not prompt:
        raise ValueError("enter a prompt first")
    return prompt
