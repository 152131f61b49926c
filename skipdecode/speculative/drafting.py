"""How much to draft: the confidence stop, the cost cap and the fallback to plain full-depth steps.

Verified decoding pays only where the tokens a round yields outweigh what its drafts and its wider verify
pass cost. Three rules, all in units of one full-depth step of one position (`Costs`: measured on this
machine, or fixed for a test):
- the confidence stop (dynamic speculation, as in transformers' `assistant_confidence_threshold`): a round
  stops drafting after a draft whose top-1 probability is below `threshold`;
- the cost cap (as llama.cpp's measured draft table): the next draft of a round is made only if its expected
  gain, the chance that it and every draft before it are kept (the drafts' own top-1 probabilities, the
  drafter's rolling acceptance for the next), is at least what it costs: a draft step (none for a copy from
  the prompt) plus one more position of the verify pass;
- the fallback: when the last `window` rounds that drafted yielded fewer tokens per unit of cost than a plain
  step (1), plain full-depth steps run instead, and after `probe` of them drafting probes again, judged
  afresh over `window` rounds (or at once, when a probing round's first draft is rejected: a draft that is
  always wrong then costs one round a probe); a failed probe doubles the wait (up to MAX_PROBE), a paying
  one resumes drafting. One round is a poor judge: at acceptance 0.8, a round of 4 drafts keeps at most one of them
  about a third of the time.
A request starts where the last one of the same pair left off (`Costs.history`): a short answer has too
few rounds to learn on its own that drafting does not pay for prompts of its kind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

SKIPDECODE, PROMPT = "skipdecode", "prompt"  # the drafters (verify.py's Round.source names)

# The confidence stop's threshold and the fallback's window, chosen by the rule in docs/method.md ("How much to
# draft") on tuning prompts with the E2E draft made for the shared cache and its shortlist
# (docs/results/draft-tuning-shortlist-2026-11-29.json): of the settings within 1% of the best, the lowest k,
# shortest n-grams, shortest window and highest threshold.
THRESHOLD = 0.7
PRIOR_ACCEPTANCE = 0.6  # a drafter's acceptance before its first verified draft
SMOOTHING = 0.3  # weight of the newest observation in the rolling figures
PROBE, MAX_PROBE = 8, 64  # plain steps between probes: at first, and at most after failed probes
WINDOW = 2  # drafting rounds the fallback judges together


@dataclass
class Costs:
    """A draft step and each further verify position, in full-depth steps of one position. `measure`
    times this machine; later passes refine the figures (`observe_*`) unless `fixed`."""

    draft: float = 0.4  # a draft step: the schedule's layers and the LM head
    extra: float = 0.15  # each position a verify pass runs beyond the first
    fixed: bool = False
    step_ms: float | None = None  # one full-depth position, the unit
    _draft_ms: float | None = field(default=None, repr=False)
    _extra_ms: float | None = field(default=None, repr=False)
    # the pacing each pair of draft and verifier left at its last round (Pacing.state), for its next request
    history: dict = field(default_factory=dict, repr=False)

    def pass_cost(self, positions: int) -> float:
        return 1.0 + self.extra * (positions - 1)

    def observe_pass(self, positions: int, ms: float) -> None:
        """A verify pass (or plain step) over `positions` took `ms`."""
        if self.fixed:
            return
        if positions == 1 or self.step_ms is None:
            one = ms / (1.0 + self.extra * (positions - 1))
            self.step_ms = one if self.step_ms is None else _mix(self.step_ms, one)
        if positions > 1:
            extra = max(ms - self.step_ms, 0.0) / (positions - 1)
            self._extra_ms = extra if self._extra_ms is None else _mix(self._extra_ms, extra)
            self.extra = self._extra_ms / self.step_ms

    def observe_draft(self, steps: int, ms: float) -> None:
        """`steps` draft steps took `ms` in all."""
        if self.fixed or steps == 0 or self.step_ms is None:
            return
        each = ms / steps
        self._draft_ms = each if self._draft_ms is None else _mix(self._draft_ms, each)
        self.draft = self._draft_ms / self.step_ms

    def measure(self, run_pass, run_draft, positions: int, repeats: int = 5) -> "Costs":
        """This machine's figures: the fastest of `repeats` timings of `run_pass(1)`, `run_pass(positions)`
        and `run_draft()` (callables that run one full-depth pass, one draft step), taken in turns so that a
        change in the machine's speed touches all three alike."""
        times = {"one": [], "wide": [], "draft": []}
        for _ in range(repeats):
            for name, fn, args in (("one", run_pass, (1,)), ("wide", run_pass, (positions,)), ("draft", run_draft, ())):
                started = time.perf_counter()
                fn(*args)
                times[name].append((time.perf_counter() - started) * 1000.0)
        one, wide, draft = (min(times[name]) for name in ("one", "wide", "draft"))
        self.step_ms, self._draft_ms = one, draft
        self._extra_ms = max(wide - one, 0.0) / max(positions - 1, 1)
        self.draft, self.extra = draft / one, self._extra_ms / one
        return self

    def to_dict(self) -> dict:
        return {"draft": round(self.draft, 4), "extra": round(self.extra, 4),
                "step_ms": None if self.step_ms is None else round(self.step_ms, 3)}


def _mix(old: float, new: float) -> float:
    return old + SMOOTHING * (new - old)


@dataclass
class Pacing:
    """One request's drafting decisions (`Costs` are the machine's, shared between requests)."""

    k: int  # drafts a round at most
    costs: Costs
    threshold: float = THRESHOLD
    window: int = WINDOW
    probe_every: int = PROBE
    acceptance: dict = field(default_factory=lambda: {SKIPDECODE: PRIOR_ACCEPTANCE, PROMPT: PRIOR_ACCEPTANCE})
    recent: list = field(default_factory=list)  # [tokens, cost] of the last `window` drafting rounds
    plain_left: int = 0  # plain steps before the next probe
    probing: bool = False  # the rounds in `recent` are a probe's, after plain steps

    @property
    def rate(self) -> float | None:
        """Tokens per unit of cost over the recent drafting rounds (None: none yet)."""
        return sum(t for t, _ in self.recent) / sum(c for _, c in self.recent) if self.recent else None

    def resume(self, state: dict | None) -> "Pacing":
        """Go on from an earlier request's `state`: its drafters' acceptance, its recent rounds, and the
        plain steps left before its next probe (none when drafting paid)."""
        if state:
            self.acceptance, self.recent = dict(state["acceptance"]), [list(r) for r in state["recent"]]
            self.probe_every, self.plain_left = state["probe_every"], state["plain_left"]
            self.probing = state["probing"]
        return self

    def state(self) -> dict:
        return {"acceptance": dict(self.acceptance), "recent": [list(r) for r in self.recent], "rate": self.rate,
                "probe_every": self.probe_every, "plain_left": self.plain_left, "probing": self.probing}

    def drafting(self) -> bool:
        """Whether this round runs the skipped model's drafts (else a plain step, or prompt copies only)."""
        if self.plain_left > 0:
            self.plain_left -= 1
            if self.plain_left == 0:  # the next drafting rounds are a probe, judged on their own
                self.recent, self.probing = [], True
            return False
        return True

    def allows(self, source: str, sure: list[float]) -> bool:
        """Whether one more draft from `source`, after the round's drafts so far, is worth making: the chance
        that all of them are kept (`sure`: each one's chance, the skipped model's own top-1 probability for
        its drafts, a copy's the copies' rolling acceptance) times the chance of the next (its drafter's
        rolling acceptance), against a draft step (a copy from the prompt costs none) and one more verify
        position. A drafting round's first draft of the skipped model is always made: the fallback judges those."""
        if len(sure) >= self.k:
            return False
        if source == SKIPDECODE and not sure:
            return True
        reach = self.acceptance[source]
        for chance in sure:
            reach *= chance
        return reach >= self.costs.extra + (self.costs.draft if source == SKIPDECODE else 0.0)

    def record(self, drafts: list[str], kept: int, emitted: int, draft_steps: int) -> None:
        """A verify pass: `drafts` (each draft's source, in order), `kept` of them accepted, `emitted` tokens."""
        for i, source in enumerate(drafts[:kept + 1]):  # a draft after the first rejection tells nothing
            self.acceptance[source] = _mix(self.acceptance[source], float(i < kept))
        if draft_steps == 0:  # a plain step or copies from the prompt: no verdict on the skipped model
            return
        cost = draft_steps * self.costs.draft + self.costs.pass_cost(len(drafts) + 1)
        self.recent = (self.recent + [[emitted, cost]])[-self.window:]
        missed = self.probing and kept == 0 and drafts[0] == SKIPDECODE  # a probe whose first draft failed
        if len(self.recent) < self.window and not missed:  # too few rounds to judge
            return
        if self.rate < 1.0:  # drafting does not pay: plain steps, a probe now and then
            self.plain_left = min(self.probe_every * 2, MAX_PROBE) if self.probing else self.probe_every
            self.probe_every = self.plain_left
        else:
            self.probe_every = PROBE
        self.probing = False
