"""The studio's runtime, without any UI: the configured models, one batcher, and what a click runs.

A comparison submits SkipDecode and full decoding of the same prompt to the batcher as one group: they
start in the same round and run interleaved, one position of each in turn, in one thread. Each decode
step is timed on its own, so both runs see the same machine load and neither waits for the other to
finish; other users' requests with the same settings join the same batches.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import math
import os
import threading
import time
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import pandas as pd

from skipdecode import lens
from skipdecode.adapters.lora import (adapters_dir, pick_adapter, read_adapter, run_speedup, same_base,
                                      shared_cache_draft, shared_speedup, trained_speedups)
from skipdecode.adapters.router import E2E, route
from skipdecode.batcher import Batcher, Job, Update, follow
from skipdecode.beam import Beam
from skipdecode.engine import Engine, shares_base
from skipdecode.evaluation import quality
from skipdecode.models import DEFAULT_MODEL
from skipdecode.request import Request, check
from skipdecode.sampling import Sampling
from skipdecode.schedule import DECAYS, DEFAULT_WARMUP, MODES, SPREAD, Schedule, for_speedup
from skipdecode.speculative.verify import Verified

from . import timing
from .examples import references_for

TIMING_NOTE = ("SkipDecode and full decoding ran interleaved in one thread of this process: one position of "
               "each in turn, each step timed on its own, so both saw the same machine load.")


AUTO = "auto: the adapter for the prompt and the speedup"
log = logging.getLogger("skipdecode.app")
MODEL_ENV = "SKIPDECODE_MODEL"  # the host's choice of base model (a name, folder or hub id), fixed at start


@dataclass(frozen=True)
class ModelChoice:
    """A model the app offers: fixed at start, never a path or hub id typed by a web user."""

    label: str
    model: str | None = None  # Engine.load name (None: the bundled default)
    adapter: str | None = None  # a fine-tuned adapter's name (None: base weights)
    horizon: int | None = None  # the horizon the adapter was trained with: the default for decoding with it
    spread: float = SPREAD  # its max budget / average budget (1 = constant): the speedup's shape it learned
    speedups: tuple[float, ...] = ()  # the speedups it was trained for: "auto" runs it at the nearest
    task: str | None = None  # what its adapter was trained on ("e2e", "general")


def base_model() -> str:
    """The model the host chose at start ($SKIPDECODE_MODEL), else the default: the 4-bit GGUF every figure
    was measured on, from its wheel or, on a Space without the wheel, from the Hub at a pinned revision
    (skipdecode.models.default_gguf). The Hub's full-precision SmolLM2 runs only when a host names it."""
    return os.environ.get(MODEL_ENV) or DEFAULT_MODEL


def public_name(model: str) -> str:
    """A model's name as the page shows it: a local folder by its last part, never its full path."""
    return Path(model).name if os.path.isabs(model) or Path(model).exists() else model


def readable_adapters() -> list:
    """The adapters in the adapters folder; one that cannot be read (half written, edited by hand) is
    left out with a warning in the log rather than keeping the app from starting."""
    folder, found = adapters_dir(), []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if (path / "skipdecode.json").exists():
            try:
                found.append(read_adapter(path))
            except (ValueError, KeyError, TypeError, OSError) as error:
                log.warning("adapter folder %s left out of the model list: %s", path.name, error)
    return found


def configured_models(model: str | None = None) -> list[ModelChoice]:
    """The base model and the adapters `skipdecode train` left in assets/adapters for it; with any
    adapter, first an "auto" entry that picks the adapter made for the requested speedup. Adapters made
    for another model are left out: a web user can never ask for them."""
    model = model or base_model()
    adapters = [a for a in readable_adapters() if same_base(a.base_model, model) and not a.shared_cache]
    choices = [ModelChoice(f"{a.name} (fine-tuned for {', '.join(f'{s:g}x' for s in a.speedups)})", model,
                           a.name, a.config.get("horizon"), a.spread, a.speedups, a.task) for a in adapters]
    base = ModelChoice(f"{public_name(model)} (base)", model)
    return [ModelChoice(AUTO), base, *choices] if choices else [base]


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


class Studio:
    def __init__(self, models: list[ModelChoice] | None = None, limits: Limits = Limits(),
                 batcher: Batcher | None = None):
        self.models = models or configured_models()
        # the adapters found at start (a verifier's), and the drafts among them made for verified decoding's one
        # cache (`draft`): not in the Model list, fixed at start too
        self._served = {a.name: a for a in readable_adapters()}
        self.drafts = [a for a in self._served.values() if a.shared_cache and same_base(a.base_model, self.base.model)]
        self.limits = limits
        self.batcher = batcher or Batcher(time_limit_s=limits.time_limit_s)
        self._engines: OrderedDict[str, Engine] = OrderedDict()  # least recently used first
        self._costs: dict[str, tuple[int, int]] = {}
        self._failed: dict[str, Exception] = {}
        self._loading = threading.Lock()

    @property
    def labels(self) -> list[str]:
        return [m.label for m in self.models]

    def choice(self, label: str | None = None, speedup: float | None = None, prompt: str | None = None) -> ModelChoice:
        """The configured model a label names ("auto" resolved for the prompt and the speedup); anything
        else is refused."""
        return self.pick(label, speedup, prompt)[0]

    def pick(self, label: str | None = None, speedup: float | None = None,
             prompt: str | None = None, kind: str | None = None) -> tuple[ModelChoice, str]:
        """`choice`, and why it was picked, in words the page shows. `kind`: the router's verdict on the
        prompt when the request has it already (`kind_of`), so that one request routes its prompt once."""
        if not label:
            return self.base, "chosen"
        choice = next((m for m in self.models if m.label == label), None)
        if choice is None:  # a path, a hub id, an adapter of another model: only the list is served
            raise ValueError(f"unknown model {shown(label)}; this app serves only: {'; '.join(self.labels)}")
        if choice.label != AUTO:
            return choice, "chosen"
        target = _number("speedup", speedup or 1.0)
        try:
            picked, why = pick_adapter(target, self.base.model, prompt, kind)
        except (ValueError, KeyError, TypeError, OSError) as error:  # the folder changed under us
            log.warning("auto could not read the adapters folder, using the base model: %s", error)
            picked, why = None, "base model: the adapters folder could not be read"
        # Only what was configured at start: an adapter that appeared since is not served.
        served = next((m for m in self.models if picked and m.adapter == picked.name), None)
        if picked is not None and served is None:
            return self.base, f"base model: {picked.name} was not served at start"
        return served or self.base, why

    @property
    def served(self) -> list[tuple[str | None, tuple[float, ...]]]:
        """Each served adapter's (task, speedups)."""
        return [(m.task, m.speedups) for m in self.models if m.adapter]

    def adapter_speedups(self, prompt: str | None) -> str:
        """The speedups the served adapters for this kind of prompt were trained for ("2×, 3×"; "" if none)."""
        kind = route(prompt).kind if prompt else E2E
        return ", ".join(f"{s:g}×" for s in sorted(trained_speedups(self.served, kind)))

    @property
    def default_speedup(self) -> float:
        """The speedup the page starts at: the highest one every kind of prompt has a served adapter for."""
        return shared_speedup(self.served)

    @property
    def base(self) -> ModelChoice:
        """The first configured model without an adapter: loaded at start, the page's defaults come from it."""
        return next(m for m in self.models if m.label != AUTO and m.adapter is None)

    def engine(self, label: str | ModelChoice | None = None) -> Engine:
        """The engine of a configured model, loaded on first use. At most `limits.max_models` stay loaded:
        the base model always, the others least recently used first out, so a visitor walking the model
        list cannot grow the server's memory (a request still running keeps its engine until it ends).
        A model that fails to load (say, a broken adapter folder) is not tried again: every later request
        gets the same error at once, instead of each one reloading the base model."""
        choice = label if isinstance(label, ModelChoice) else self.choice(label)
        with self._loading:
            failed = self._failed.get(choice.label)
            if isinstance(failed, ValueError):
                raise ValueError(str(failed))
            if failed is not None:
                raise RuntimeError(f"{choice.label} failed to load earlier") from failed
            if choice.label not in self._engines:
                if not _on_shared_base(choice):  # an adapter beside the packed 4-bit base costs ~30 MB
                    self._evict(keep=self.limits.max_models - 1)  # room first: never one model over the limit
                try:
                    engine = Engine.load(choice.model, adapter=choice.adapter)
                except Exception as error:
                    self._failed[choice.label] = error
                    raise
                self._engines[choice.label] = engine
                self._costs[choice.label] = weights_per_token(engine)
            self._engines.move_to_end(choice.label)
            return self._engines[choice.label]

    def _evict(self, keep: int) -> None:
        """Drop the least recently used engines with weights of their own (never the base one) until `keep`
        such remain, and hand their memory back to the system. Engines on the shared 4-bit base (an
        adapter's LoRA factors beside it) stay: every served model fits beside it (skipdecode/kernels/q4.py)."""
        evicted = False
        owned = lambda: [label for label, e in self._engines.items() if not _shares(e)]  # noqa: E731
        while len(owned()) > keep:
            label = next(label for label in owned() if label != self.base.label)
            del self._engines[label]
            evicted = True
        if evicted:
            gc.collect()
            _trim_heap()

    @property
    def loaded(self) -> list[str]:
        """Labels of the engines in memory, least recently used first."""
        with self._loading:
            return list(self._engines)

    def warm_up(self) -> None:
        """One tiny comparison through everything a click runs (decoding, both runs, scoring): the first
        calls of a fresh process take seconds that the first visitor should not wait for."""
        for _ in self.compare("Hello", Settings(speedup=2.0, max_new_tokens=2), self.base.label):
            pass
        # which decode step and product kernel serve (and why: skipdecode/kernels/w4a8.py), in the log
        engine = self.engine(self.base)
        log.warning("decode step: %s; weights: %s", engine.step_label, engine.weights_label)

    # ---- Compare ----------------------------------------------------------------------------
    def _check_text(self, prompt, max_new_tokens) -> tuple[str, int]:
        """The checks that need no model: done before a model is loaded or the tokenizer runs."""
        prompt = clean_prompt(prompt, self.limits.max_prompt_chars)
        n = _whole("max new tokens", max_new_tokens)
        if not 1 <= n <= self.limits.max_new_tokens:
            raise ValueError(f"max new tokens must be between 1 and {self.limits.max_new_tokens}; got {n}")
        return prompt, n

    def _request(self, engine: Engine, prompt: str, schedule: Schedule, n: int, sampling: Sampling,
                 beam: Beam | None = None, stop_at_eos: bool = True) -> Request:
        """The request, checked and encoded once (skipdecode/request.py) for the whole run: both sides decode
        its ids (every model the studio serves is the base model or an adapter of it, with its tokenizer)."""
        return check(engine, prompt, schedule, n, sampling, stop_at_eos, beam=beam,
                     max_prompt_tokens=self.limits.max_prompt_tokens)

    def compare(self, prompt: str, settings: Settings, model: str | None = None,
                stop=None) -> Iterator[Comparison]:
        """Yields the comparison after every position of either run, then once more with quality scores.
        The prompt is checked, routed and encoded once; both sides' models follow that one route and
        decode those ids. `stop` (a function, asked after every position) ends both sides early: the
        comparison, marked `stopped`, is then scored on what they had written."""
        prompt, n = self._check_text(prompt, settings.max_new_tokens)
        beam = settings.search(self.limits)  # checked before any model is loaded for the request
        if settings.verify and beam is not None:
            raise ValueError("verified decoding chooses one token at a time: choose it or beam search, not both")
        kind = kind_of(prompt)
        choice, engine, schedule, sampling, why = self._setup(settings, model, prompt, kind)
        request = self._request(engine, prompt, schedule, n, sampling, beam)
        full_choice, full_why = self.reference(model, prompt, choice, why, kind)
        full_engine = self.engine(full_choice)
        comparison = Comparison(prompt, choice.label, full_choice.label, engine.num_layers, schedule, n,
                                references=references_for(prompt), cost=self._costs[choice.label],
                                why=(why, full_why), dtypes=(engine.weights_label, full_engine.weights_label),
                                decoding=decoding_name(sampling, beam), verified=bool(settings.verify),
                                settings=settings)
        if comparison.verified:  # a fresh pair per request: the batcher runs it as a batch of one
            draft = self.draft(full_choice, schedule)
            if draft is not None:  # the page names the model that drafts
                comparison.why = (f"{draft.adapter} drafts instead, trained to read {full_choice.adapter}'s keys and "
                                  f"values", comparison.why[1])
            engine = Verified(self.engine(draft) if draft else engine, full_engine)
        skip, full = self.batcher.submit_together([Job(engine, request), Job(full_engine, request.at_full_depth())])
        try:
            for comparison.skip, comparison.full in follow([skip, full]):
                if stop is not None and stop():
                    comparison.stopped = True
                    break
                yield comparison
        finally:
            skip.cancel(), full.cancel()
        if not all(side and side.token_ids for side in (comparison.skip, comparison.full)):
            yield comparison  # stopped before both sides had a token: nothing to score
            return
        started = time.perf_counter()
        states = self.answer_states(full_engine, comparison)
        comparison.quality = self.score(full_engine, comparison, states)
        comparison.divergence = self.divergence(full_engine, comparison, states)
        comparison.divergence_ms = (time.perf_counter() - started) * 1000.0
        yield comparison

    def draft(self, verifier: ModelChoice, schedule: Schedule) -> ModelChoice | None:
        """A draft trained to read `verifier`'s cache (adapters.AdapterInfo.shared_cache) on this very
        schedule, where one was in the adapters folder at start (None: the SkipDecode side drafts)."""
        made = shared_cache_draft(self._served.get(verifier.adapter), schedule=schedule, served=self.drafts)
        if made is None:
            return None
        return ModelChoice(f"{made.name} (draft for {verifier.adapter})", self.base.model, made.name,
                           made.config.get("horizon"), made.spread, made.speedups, made.task)

    def reference(self, model: str | None, prompt: str | None, choice: ModelChoice,
                  why: str, kind: str | None = None) -> tuple[ModelChoice, str]:
        """The model full decoding runs beside SkipDecode, and why. "auto" compares like the paper: the
        adapter made for the speedup against the one made for full depth (for an E2E MR the fine-tuned 1x
        baseline; for any other prompt the base model itself); a chosen model runs both."""
        return self.pick(AUTO, 1.0, prompt, kind) if model == AUTO else (choice, why)

    def answer_states(self, engine: Engine, comparison: Comparison) -> dict | None:
        """Full depth's last hidden states (under `engine`, the full run's model) at the positions that predict
        each answer's tokens, as teacher-forced rows of the engine's continuous batch, beside other visitors'
        decoding (Batcher.states); None where the batcher has no such rows (then scoring runs alone)."""
        if not self.batcher.scores_as_rows(engine):
            return None
        prompt = list(comparison.skip.prompt_ids)
        return {name: self.batcher.states(engine, prompt + list(update.token_ids[:-1]), len(prompt) - 1)
                if update.token_ids else None for name, update in (("skipdecode", comparison.skip),
                                                                   ("full", comparison.full))}

    def score(self, engine: Engine, comparison: Comparison, states: dict | None = None) -> dict:
        """Quality of the SkipDecode output against the full one (and the references, for E2E items);
        perplexities under `engine`, the model of the full run (from `states`, `answer_states`', when given)."""
        skip, full = comparison.skip, comparison.full
        with self.batcher.exclusive():  # both outputs share the prompt: one forward pass scores both
            if states is not None:
                values = quality.perplexities_from(engine.decoder, [states["skipdecode"], states["full"]],
                                                   [skip.token_ids, full.token_ids])
            else:
                values = quality.perplexities(scorer(engine), skip.prompt_ids, [skip.token_ids, full.token_ids])
        ppl = {name: None if value is None else round(value, 3) for name, value in zip(("skipdecode", "full"), values)}
        scores = {"skipdecode_vs_full": quality.text_scores(skip.text, full.text) if full.text.strip() else None,
                  "token_agreement": quality.token_agreement(skip.token_ids, full.token_ids),
                  "perplexity": ppl, "references": None}
        if comparison.references:
            scores["references"] = {name: quality.text_scores(update.text, comparison.references)
                                    for name, update in (("skipdecode", skip), ("full", full))}
        return scores

    def divergence(self, engine: Engine, comparison: Comparison, states: dict | None = None) -> lens.Divergence:
        """At each position of the SkipDecode answer, the token full depth (`engine`, the full run's model)
        would have chosen from the same prefix: one teacher-forced pass (`states`, `answer_states`', when
        given), while decoding waits."""
        skip = comparison.skip
        with self.batcher.exclusive():
            return lens.divergence(engine.decoder, skip.prompt_ids, skip.token_ids,
                                   states=None if states is None else states["skipdecode"])

    def lenses(self, comparison: Comparison) -> dict[str, list[lens.Lens]]:
        """The logit lens at every position of the SkipDecode answer: under the layers SkipDecode ran (its
        model, its trace; for verified decoding, the layers its draft ran) and at full depth on the same prefix (the full run's model). Kept on the
        comparison: the layer view, its step-through and an export read it."""
        if comparison.lenses is None:
            skip = comparison.skip
            if not (comparison.done and skip.token_ids):
                raise ValueError("run a comparison first")
            # verified decoding: the layers its draft ran at each position (its trace's steps are the verifier's)
            steps = ([comparison.schedule.layers(s) for s in range(len(skip.token_ids))] if comparison.verified
                     else [step.layers for step in skip.trace.steps])
            with self.batcher.exclusive():
                comparison.lenses = {
                    "skipdecode": lens.lens(self.engine(comparison.model).decoder, skip.prompt_ids, skip.token_ids,
                                            steps),
                    "full": lens.lens(self.engine(comparison.full_model).decoder, skip.prompt_ids, skip.token_ids)}
        return comparison.lenses

    def exit_layers(self, comparison: Comparison, limit: int = 64) -> list[int]:
        """Where an oracle per-token early exit would have stopped on the full run's own tokens."""
        full = comparison.full
        if not (comparison.done and full.token_ids):
            raise ValueError("run a comparison first")
        engine = self.engine(comparison.full_model)
        with self.batcher.exclusive():
            return quality.exit_layers(scorer(engine), full.prompt_ids, full.token_ids[:limit])

    # ---- Batch ------------------------------------------------------------------------------
    def check_batch(self, engine: Engine, prompts: list[str], settings: Settings, schedule: Schedule,
                    sampling: Sampling, stop_at_eos: bool = True) -> tuple[list[str], list[Request]]:
        """(the prompts, cleaned; their requests, checked and encoded once)."""
        prompts = [p for p in (prompts or []) if isinstance(p, str) and p.strip()]
        if not prompts:
            raise ValueError("enter at least one prompt, one per line")
        if len(prompts) > self.limits.max_batch_prompts:
            raise ValueError(f"at most {self.limits.max_batch_prompts} prompts in a batch; got {len(prompts)}")
        checked = [self._check_text(p, settings.max_new_tokens) for p in prompts]
        return ([p for p, _ in checked],
                [self._request(engine, p, schedule, n, sampling, stop_at_eos=stop_at_eos) for p, n in checked])

    def _setup(self, settings: Settings, model: str | None, prompt: str | None = None,
               kind: str | None = None) -> tuple[ModelChoice, Engine, Schedule, Sampling, str]:
        choice, why, settings = self.resolve(settings, model, prompt, kind)
        sampling = settings.sampler(self.limits)
        engine = self.engine(choice)
        schedule = settings.schedule(engine.num_layers, choice.horizon, self.limits, choice.spread)
        return choice, engine, schedule, sampling, why

    def resolve(self, settings: Settings, model: str | None, prompt: str | None = None,
                kind: str | None = None) -> tuple[ModelChoice, str, Settings]:
        """The model that runs these settings for this prompt, why (`pick`), and the settings it runs
        (`run_settings`): what a run and the schedule preview both use, before any engine is loaded."""
        choice, why = self.pick(model, settings.speedup, prompt, kind)
        return choice, why, self.run_settings(settings, model, choice)

    @staticmethod
    def run_settings(settings: Settings, model: str | None, choice: ModelChoice) -> Settings:
        """The settings a run uses: "auto" decodes an adapter at the nearest speedup it was trained for (the
        reason `pick` gives says so); a model chosen by name runs the speedup asked, as an experiment."""
        if model != AUTO or settings.manual_budgets:
            return settings
        return replace(settings, speedup=run_speedup(choice, _number("speedup", settings.speedup)))

    def batch(self, prompts: list[str], settings: Settings, model: str | None = None) -> Iterator[BatchRun]:
        """The prompts as one SkipDecode batch, and as one full-decoding batch on the model `compare` would
        run beside it (routed by the first prompt: a batch runs one model on each side)."""
        first = _one_prompt(prompts)
        kind = kind_of(first)
        choice, engine, schedule, sampling, why = self._setup(settings, model, first, kind)
        prompts, requests = self.check_batch(engine, prompts, settings, schedule, sampling)
        full_choice, full_why = self.reference(model, first, choice, why, kind)
        full_engine = self.engine(full_choice)
        run = BatchRun(prompts, schedule, engine.num_layers, (choice.label, full_choice.label), (why, full_why))
        jobs = [Job(engine, r) for r in requests] + [Job(full_engine, r.at_full_depth()) for r in requests]
        tickets = self.batcher.submit_together(jobs)
        try:
            for updates in follow(tickets):
                run.skip, run.full = list(updates[: len(prompts)]), list(updates[len(prompts):])
                yield run
        finally:
            for ticket in tickets:
                ticket.cancel()

    def throughput(self, prompts: list[str], settings: Settings, model: str | None = None,
                   sizes: tuple[int, ...] = (1, 2, 4, 8)) -> pd.DataFrame:
        """Decode tokens per second against batch size, SkipDecode and full decoding side by side, on the
        same weights so that only the layers run differ (prompts repeated to fill a batch; EOS ignored so
        every row decodes the same number of tokens).
        The sizes run one after another within one time limit for the whole measurement."""
        choice, engine, schedule, sampling, _ = self._setup(settings, model, _one_prompt(prompts))
        _, requests = self.check_batch(engine, prompts, settings, schedule, sampling, stop_at_eos=False)
        deadline = time.monotonic() + self.limits.time_limit_s
        rows = []
        for size in sizes:
            if size > self.limits.max_batch_prompts:
                break
            batch = [requests[i % len(requests)] for i in range(size)]
            jobs = [Job(engine, r) for r in batch] + [Job(engine, r.at_full_depth()) for r in batch]
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the measurement ran past its time limit and was stopped")
            tickets = self.batcher.submit_together(jobs, time_limit_s=left)
            finals = [ticket.result() for ticket in tickets]
            for method, update in (("SkipDecode", finals[0]), ("full decoding", finals[size])):
                rows.append({"batch_size": size, "method": method, "batch": update.batch.number,
                             "rows": update.batch.size,
                             "tokens_per_s": round(update.trace.decode_tokens_per_s, 2),
                             "ms_per_step": round(update.trace.decode_ms / max(len(update.trace.steps), 1), 3)})
        return pd.DataFrame(rows)


def kind_of(prompt: str | None) -> str | None:
    """The router's verdict on a request's prompt, taken once and handed to every pick the request makes
    (None without a prompt: `pick_adapter` then means the E2E task)."""
    return None if prompt is None else route(prompt).kind


def _on_shared_base(choice: ModelChoice) -> bool:
    """Whether loading `choice` puts an adapter (or the base) on the process's packed 4-bit base."""
    try:
        return shares_base(choice.model, choice.adapter)
    except ValueError:  # an adapter that cannot be read: its load will say so
        return False


def _shares(engine) -> bool:
    return getattr(getattr(engine, "decoder", None), "weights", None) is not None


def scorer(engine: Engine):
    """What scores an engine's outputs: its Hugging Face model when that holds the weights it decodes with,
    else the engine itself (the 4-bit base, an adapter unmerged beside it)."""
    return engine if _shares(engine) else engine.model


def _one_prompt(prompts) -> str | None:
    """The prompt a batch is routed by: its first (a batch runs one model, so one kind of prompt)."""
    return next((p for p in prompts or [] if isinstance(p, str) and p.strip()), None)


def _trim_heap() -> None:
    """glibc keeps freed memory for reuse; a dropped model's should go back to the system now."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator decides
        pass


def weights_per_token(engine: Engine) -> tuple[int, int]:
    """(bytes of one decoder layer, bytes of the LM head), as the decoder holds them: the cost model of one
    decoding step, the bench's own (skipdecode/evaluation/bench/cost.py, `Reads`). A step reads every weight
    of each layer it runs and all of the LM head, whatever the budget."""
    from skipdecode.evaluation.bench.cost import Reads

    reads = Reads.of(engine.decoder)
    return reads.layer, reads.head

