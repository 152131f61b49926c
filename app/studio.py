"""The studio's runtime, without any UI: what a click runs, over the configured models (app/choices.py), one
batcher and the engines it keeps loaded (at most a few, least recently used first out).

A request's text and settings are checked at the edge (app/settings.py) before any model loads, then its
prompt is checked and encoded once (skipdecode/request.py). A comparison (app/comparison.py) submits
SkipDecode and full decoding of the same request to the batcher as one group: they start in the same round
and share decode steps with each other and with other visitors' rows, each step timed on its own, so both
sides see the same machine load and neither waits for the other to finish.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Iterator

import pandas as pd

from skipdecode import lens
from skipdecode.adapters.lora import (pick_adapter, run_speedup, same_base, shared_cache_draft, shared_speedup,
                                      trained_speedups)
from skipdecode.adapters.router import E2E, route
from skipdecode.batcher import Batcher, Job, follow
from skipdecode.beam import Beam
from skipdecode.engine import Engine, shares_base
from skipdecode.evaluation import quality
from skipdecode.request import Request, check
from skipdecode.sampling import Sampling
from skipdecode.schedule import Schedule
from skipdecode.speculative.verify import Verified

from .choices import AUTO, ModelChoice, configured_models, readable_adapters
from .comparison import BatchRun, Comparison
from .examples import references_for
from .settings import Limits, Settings, _number, _whole, clean_prompt, decoding_name, shown

log = logging.getLogger("skipdecode.app")


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
        tickets = self.batcher.submit_together(self.jobs(engine, full_engine, request))
        scoring = None
        try:
            for updates in follow(tickets):
                comparison.skip, comparison.full, scoring = (*updates, None)[:3]
                if stop is not None and stop():
                    comparison.stopped = True
                    break
                yield comparison
        finally:
            for ticket in tickets:
                ticket.cancel()
        if not all(side and side.token_ids for side in (comparison.skip, comparison.full)):
            yield comparison  # stopped before both sides had a token: nothing to score
            return
        started = time.perf_counter()
        states = self.ridden_states(comparison, scoring) or self.answer_states(full_engine, comparison)
        comparison.quality = self.score(full_engine, comparison, states)
        comparison.divergence = self.divergence(full_engine, comparison, states)
        comparison.full.states = None  # scored: the comparison keeps no hidden states
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

    def jobs(self, engine: Engine, full_engine: Engine, request: Request) -> list[Job]:
        """A comparison's jobs: SkipDecode and full decoding of one request. Where they share a continuous batch,
        the scoring rides the decode: the full side keeps its own last hidden states (full depth, its own
        model: its answer's scoring), and a teacher-forced row of the full model follows the SkipDecode side,
        fed its tokens as they come, so the scores are ready when the answers are (`ridden_states`)."""
        jobs = [Job(engine, request), Job(full_engine, request.at_full_depth())]
        if request.beam is None and self.batcher.follows_as_rows(engine, full_engine):
            prompt = list(request.prompt_ids)
            jobs[1] = replace(jobs[1], keep_states=True)
            jobs.append(Job(full_engine, check(full_engine, prompt, max_new_tokens=1), states_from=len(prompt) - 1,
                            follows=0))
        return jobs

    @staticmethod
    def ridden_states(comparison: Comparison, scoring) -> dict | None:
        """The states the decode kept for scoring (`jobs`), where they cover both whole answers (a stopped
        comparison's do not: it is scored after)."""
        skip, full = comparison.skip, comparison.full
        if comparison.stopped or scoring is None or scoring.states is None or full.states is None:
            return None
        if len(scoring.states) != len(skip.token_ids) or len(full.states) != len(full.token_ids):
            return None
        return {"skipdecode": scoring.states, "full": full.states}

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

