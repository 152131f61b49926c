"""Verified decoding (self-speculative: LayerSkip, Draft & Verify, SWIFT): SkipDecode drafts, full depth verifies.

The draft (the SkipDecode schedule on its adapter) proposes up to k tokens, one position at a time; the
verifier (full depth: the model a comparison's full side runs) checks them in ONE pass over the last
accepted token and the drafts (k + 1 positions, a small prefill at those cache columns), keeps the drafts
it agrees with plus its own next token, and both caches forget the rest (static caches: lengths cut, the
next writes overwrite). Greedy output is full decoding's, token for token, where a pass over k + 1 positions
rounds as one position does: on the 4-bit path it does (float64 attention, row-exact LoRA terms:
q4.lora_term), and 64 of 64 general prompts and 630 of 630 E2E answers are full decoding's (docs/speed.md). Sampling accepts a draft with
probability min(1, p/q) and otherwise draws from norm(max(0, p - q)), a bonus token from p when all are
accepted, so the output follows the verifier's distribution (Leviathan et al. 2023; Chen et al. 2023).

Why a module beside Engine._decode rather than a column policy: a policy runs one column of one engine,
while this loop drives two engines' decoders and caches and moves a varying number of columns per round,
rolling back. It reuses the engine's pieces (Decoder blocks, KVCache, the Scheduled column, sampling,
Generation, Trace) and offers Engine's `stream`/`generate`/`encode`, so the batcher runs it unchanged.
Batch 1 only: the rows of a batch would accept different numbers of drafts and drift apart in position.
On the 4-bit path the draft and the verifier are adapters beside one packed base: no second copy.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .cache import KVCache
from .engine import Engine, Generation, Prompt, Scheduled, cache_width, check_new_tokens
from .sampling import Sampling, next_tokens, probabilities
from .schedule import Schedule
from .trace import StepRecord, Trace

# Drafts per round, by the kind of prompt, measured with `skipdecode bench-verified --draft-tokens 4,6,8`
# (docs/speed.md, "Verified decoding"): E2E drafts are accepted 97-100%, and k 6 beat 4 (1.47x vs 1.34x full
# decoding's tokens/s at 3x) with 8 no better; general prompts' 12-22%, and every draft past the first
# rejection is wasted: k 4 beat 6 and 8 (0.42x vs 0.33x and 0.26x at 3x). Fixed per kind, not adaptive.
DRAFT_TOKENS = {"e2e": 6, "general": 4}
DEFAULT_DRAFT_TOKENS = DRAFT_TOKENS["general"]


def draft_tokens_for(prompt: str | None = None, kind: str | None = None) -> int:
    """k for a prompt (or a kind already routed): DRAFT_TOKENS by the router's verdict."""
    from .router import route

    return DRAFT_TOKENS.get(kind or (route(prompt).kind if prompt is not None else "e2e"), DEFAULT_DRAFT_TOKENS)
ACCEPTED, REPLACED, VERIFIER = "accepted", "replaced", "verifier"  # how each output token came to be
# Who proposed a token (Verification.sources) or a round's drafts (Round.source): the skipped model; the
# verifier itself (its own next token, or the one it put in place of a rejected draft).
SKIPDECODE = "skipdecode"


@dataclass
class Round:
    """One verify pass: the drafts proposed (by `source`: SKIPDECODE, the skipped model), how many the
    verifier kept, and the output tokens the round emitted, output[first : first + emitted] (drafts kept,
    then the verifier's token; cut at EOS or the token limit). The pass ran over drafted + 1 positions.
    The page's record (app/record.py) also admits "prompt" (drafts copied from the prompt) and "none" (a
    plain full-depth step, nothing drafted) for drafters that propose that way."""

    first: int
    drafted: int
    accepted: int
    emitted: int
    source: str = SKIPDECODE
    draft_ms: float = 0.0
    verify_ms: float = 0.0

    def to_dict(self) -> dict:
        return {"first": self.first, "drafted": self.drafted, "accepted": self.accepted, "emitted": self.emitted,
                "source": self.source, "draft_ms": round(self.draft_ms, 3), "verify_ms": round(self.verify_ms, 3)}


@dataclass
class Verification:
    """What verification did: drafts made and kept, full-depth passes, and each output token's origin
    (ACCEPTED: a draft the verifier agreed with; REPLACED: the verifier's token where it rejected a draft;
    VERIFIER: its own next token with no draft rejected, the first token and a round's bonus)."""

    draft_tokens: int  # k, drafts per round at most
    draft_model: str = ""
    verifier_model: str = ""
    drafted: int = 0
    accepted: int = 0
    passes: int = 0  # full-depth verify passes (the prefill not counted)
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    marks: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # per output token: who proposed it (SKIPDECODE, VERIFIER)
    rounds: list[Round] = field(default_factory=list)  # one per verify pass, in order

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def to_dict(self) -> dict:
        tokens = len(self.marks)
        return {"verified": True, "draft_tokens": self.draft_tokens, "draft_model": self.draft_model,
                "verifier_model": self.verifier_model, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": None if self.acceptance_rate is None else round(self.acceptance_rate, 4),
                "verify_passes": self.passes,
                "passes_per_token": round(self.passes / tokens, 4) if tokens else None,
                "draft_ms": round(self.draft_ms, 3), "verify_ms": round(self.verify_ms, 3), "marks": list(self.marks),
                "sources": list(self.sources), "rounds": [r.to_dict() for r in self.rounds]}


@dataclass
class VerifiedGeneration(Generation):
    verification: Verification | None = None
    caches: tuple = field(default=(), repr=False)  # (draft, verifier) KVCache, for inspection

    def to_dict(self) -> dict:
        return {**super().to_dict(), "verification": self.verification.to_dict()}


class Verified:
    """`draft` drafts under the stream's schedule; `verifier` checks at full depth. Both must share a
    tokenizer (adapters of one base)."""

    batch_one = True  # the batcher runs each request as its own batch

    def __init__(self, draft: Engine, verifier: Engine, draft_tokens: int = DEFAULT_DRAFT_TOKENS):
        if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, numbers.Integral) or draft_tokens < 1:
            raise ValueError(f"draft tokens must be an integer >= 1; got {draft_tokens!r}")
        if draft.num_layers != verifier.num_layers or draft.decoder.embed_tokens.shape != verifier.decoder.embed_tokens.shape:
            raise ValueError("the draft and the verifier must be the same model (adapters of one base)")
        self.draft, self.verifier, self.k = draft, verifier, int(draft_tokens)
        self.name = f"{draft.name} drafts, {verifier.name} verifies"
        self.tokenizer, self.decoder, self.num_layers = verifier.tokenizer, verifier.decoder, verifier.num_layers
        self.eos_ids, self.pad_id = verifier.eos_ids, verifier.pad_id
        self.weights_label = verifier.weights_label

    def encode(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        return self.verifier.encode(prompt, chat)

    generate = Engine.generate  # the same loop over `stream` as an engine's

    @torch.inference_mode()
    def stream(self, prompts, schedule: Schedule | None = None, max_new_tokens: int = 64,
               sampling: Sampling = Sampling(), chat: bool | None = None, stop_at_eos: bool = True,
               beam=None) -> Iterator[VerifiedGeneration]:
        """Yields the generation after the prefill and after every verify pass (one or more tokens)."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if len(prompts) != 1:
            raise ValueError(f"verified decoding runs one prompt at a time (batch 1); got {len(prompts)}")
        if beam is not None and beam.width > 1:
            raise ValueError("verified decoding does not search beams")
        check_new_tokens(max_new_tokens)
        L = self.num_layers
        schedule = schedule or Schedule.full(L)
        if schedule.num_layers != L:
            raise ValueError(f"schedule is for {schedule.num_layers} layers but the model has {L}")
        ids = self.encode(prompts[0], chat)
        P, width = len(ids), cache_width(self.decoder, len(ids), max_new_tokens)
        draft_dec, verify_dec = self.draft.decoder, self.verifier.decoder
        column = Scheduled(schedule)
        draft_cache, verify_cache = (_cache(dec, width) for dec in (draft_dec, verify_dec))
        generator = sampling.generator(verify_dec.device)
        trace = Trace(L, 1, P, {**schedule.to_dict(), "verified": True, "draft_tokens": self.k})
        stats = Verification(self.k, self.draft.name, self.verifier.name)
        gen = VerifiedGeneration(prompts, [[]], [False], trace, self.tokenizer, verification=stats,
                                 caches=(draft_cache, verify_cache))
        tokens = gen.token_ids[0]

        started = time.perf_counter()
        forward(draft_dec, draft_cache, ids, 0, head=False)
        logits = forward(verify_dec, verify_cache, ids, 0)[-1:]
        trace.prefill_ms = (time.perf_counter() - started) * 1000.0
        fed = 0  # generated tokens the draft's cache holds (the verifier's holds all but the last)

        def emit(new: list[int], marks: list[str], ms: float, source: str = SKIPDECODE) -> bool:
            """Append a round's tokens (cut at EOS and the limit); True once the generation is over."""
            for t, mark in zip(new, marks):
                tokens.append(t)
                stats.marks.append(mark)
                stats.sources.append(source if mark == ACCEPTED else VERIFIER)
                trace.generated_tokens += 1
                trace.steps.append(StepRecord(len(tokens) - 1, L, tuple(range(L)), (), ms / len(new), 1))
                if (stop_at_eos and t in self.eos_ids) or len(tokens) == max_new_tokens:
                    gen.finished[0] = True
                    return True
            return False

        done = emit(next_tokens(logits, sampling, generator).tolist(), [VERIFIER], 0.0)
        trace.steps.clear()  # the first token is the prefill's
        while not done:
            yield gen
            n = len(tokens)
            k = min(self.k, max_new_tokens - n - 1)  # the verifier adds one token to the drafts
            started = time.perf_counter()
            drafts, q = [], []
            if k:
                x = _catch_up(draft_dec, draft_cache, schedule, tokens, fed, P, width)
                fed = n
                while True:
                    draft_logits = draft_dec.logits(x[:, -1])
                    d = int(next_tokens(draft_logits, sampling, generator))
                    drafts.append(d)
                    if not sampling.greedy:
                        q.append(probabilities(draft_logits, sampling)[0])
                    if len(drafts) == k or (stop_at_eos and d in self.eos_ids):
                        break
                    x = _draft_step(draft_dec, draft_cache, column, d, P + fed, fed, width)
                    fed += 1
            drafted_at = time.perf_counter()
            logits = forward(verify_dec, verify_cache, [tokens[-1]] + drafts, P + n - 1)
            kept, marks = accept(logits, drafts, q, sampling, generator)
            # both caches forget what was not kept: the verifier holds all tokens but the last
            verify_cache.truncate(P + n - 1 + len(kept))
            fed = min(fed, n - 1 + len(kept))
            draft_cache.truncate(P + fed)
            ended = time.perf_counter()
            stats.drafted += len(drafts)
            stats.accepted += sum(mark == ACCEPTED for mark in marks)
            stats.passes += 1
            stats.draft_ms += (drafted_at - started) * 1000.0
            stats.verify_ms += (ended - drafted_at) * 1000.0
            first = len(tokens)
            done = emit(kept, marks, (ended - started) * 1000.0)
            stats.rounds.append(Round(first, len(drafts), sum(mark == ACCEPTED for mark in marks),
                                      len(tokens) - first, SKIPDECODE, (drafted_at - started) * 1000.0,
                                      (ended - drafted_at) * 1000.0))
        trace.cache_lengths = list(verify_cache.lengths)
        gen.done = True
        yield gen


def accept(logits: torch.Tensor, drafts: list[int], q: list[torch.Tensor], sampling: Sampling,
           generator) -> tuple[list[int], list[str]]:
    """The tokens a round keeps and their marks, from the verifier's logits [len(drafts) + 1, V] at the
    last accepted token and each draft. Greedy: the drafts up to the first the verifier's argmax differs
    from, then its argmax. Sampling: draft d (drawn from q) stays with probability min(1, p(d) / q(d));
    the first rejected one is replaced by a draw from norm(max(0, p - q)); all kept: a bonus draw from p."""
    kept, marks = [], []
    p = None if sampling.greedy else probabilities(logits, sampling)
    for i, d in enumerate(drafts):
        if sampling.greedy:
            choice = int(logits[i].argmax())
            if choice == d:
                kept.append(d), marks.append(ACCEPTED)
                continue
            return kept + [choice], marks + [REPLACED]
        u = torch.rand((), generator=generator, device=logits.device)
        if u * q[i][d] <= p[i, d]:  # u < p/q without dividing
            kept.append(d), marks.append(ACCEPTED)
            continue
        residual = (p[i] - q[i]).clamp(min=0)
        residual = residual if residual.sum() > 0 else p[i]
        choice = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        return kept + [choice], marks + [REPLACED]
    last = logits[len(drafts):]
    bonus = int(last.argmax()) if sampling.greedy else int(torch.multinomial(p[len(drafts)], 1, generator=generator))
    return kept + [bonus], marks + [VERIFIER]


def forward(dec, cache: KVCache, tokens, start: int, head: bool = True, layers=None) -> torch.Tensor | None:
    """`layers` (default: every layer) on `tokens` at cache columns [start, start + len(tokens)), batch 1,
    causal: a prefill (start 0), a verify pass, or a draft's catch-up. Logits [len(tokens), V]; with
    head=False the last position's hidden state [1, 1, d]."""
    S = len(tokens)
    device = dec.device
    positions = torch.arange(start, start + S, device=device)[None]
    mask = None
    if S > 1:
        allowed = torch.ones(S, start + S, dtype=torch.bool, device=device).tril(start)
        mask = dec.attention_bias(allowed)[None, None]
    x, rope = dec.embed(torch.tensor([list(tokens)], device=device), positions), dec.rope(positions, limit=cache.max_len)
    for layer in range(dec.num_layers) if layers is None else layers:
        x = dec.block(layer, x, rope, mask, *cache.claim(layer, start, S), start)
    return dec.logits(x[0]) if head else x[:, -1:]


def _draft_step(dec, cache: KVCache, column: Scheduled, token: int, col: int, step: int, width: int):
    """One draft position: `token` at cache column `col` through the layers the schedule gives `step`."""
    position = torch.tensor([[col]], device=dec.device)
    x = dec.embed(torch.tensor([[token]], device=dec.device), position)
    x, _ = column.run(dec, cache, step, col, x, dec.rope(position, limit=width), None)
    return x


def _catch_up(dec, cache: KVCache, schedule: Schedule, tokens: list[int], fed: int, P: int, width: int):
    """The draft runs the tokens it has not seen (two after a round that kept every draft: the last draft
    and the verifier's bonus token); positions that run the same layers (a constant budget: the E2E
    adapters') go through them in one pass, like a prefill, instead of one position at a time."""
    steps = range(fed, len(tokens))
    if len({schedule.layers(step) for step in steps}) > 1:
        for step in steps:
            x = _draft_step(dec, cache, Scheduled(schedule), tokens[step], P + step, step, width)
        return x
    return forward(dec, cache, tokens[fed:], P + fed, head=False, layers=schedule.layers(fed))


def _cache(dec, width: int) -> KVCache:
    return KVCache(dec.num_layers, 1, dec.num_kv_heads, width, dec.head_dim, dec.device, dec.dtype)


def why(verification: Verification, full_ms_per_token: float | None) -> str:
    """One line: why verified decoding ran faster or slower than full decoding (acceptance rate x draft
    cost against the verify cost)."""
    v, tokens = verification, len(verification.marks)
    if not v.passes or not tokens:
        return "Nothing was drafted yet."
    rate = v.acceptance_rate or 0.0
    per_draft = v.draft_ms / max(v.drafted, 1)
    per_pass = v.verify_ms / v.passes
    ours = (v.draft_ms + v.verify_ms) / tokens
    line = (f"{v.accepted} of {v.drafted} drafts accepted ({rate:.0%}); a draft cost {per_draft:.1f} ms and a "
            f"verify pass {per_pass:.1f} ms, so each pass yielded {tokens / v.passes:.2f} tokens at "
            f"{ours:.1f} ms a token")
    if not full_ms_per_token:
        return line + "."
    verdict = "faster" if ours < full_ms_per_token else "slower"
    reason = ("the drafts agreed often enough to pay for their pass" if verdict == "faster"
              else "too many drafts were rejected: their cost and the verify pass outweigh the tokens kept")
    return f"{line} against full decoding's {full_ms_per_token:.1f} ms: {verdict}, because {reason}."


def for_prompt(prompt: str | None, speedup: float, model: str | None = None, device: str = "auto",
               dtype="auto", draft_tokens: int | None = None, task: str | None = None,
               horizon: int | None = None) -> tuple[Verified, Schedule, str]:
    """The verified pair a comparison's "auto" runs for this prompt: the draft is the adapter picked for
    `speedup` on its trained schedule, the verifier the one picked for 1x (e2e-1x for an E2E prompt, the base
    model for a general one); and why, in words. On the 4-bit path both are adapters beside one packed base."""
    from .adapters import pick_adapter, run_speedup, trained_schedule

    draft_info, draft_why = pick_adapter(speedup, model, prompt, task)
    verify_info, verify_why = pick_adapter(1.0, model, prompt, task)
    draft = Engine.load(model, device=device, dtype=dtype, adapter=draft_info)
    verifier = Engine.load(model, device=device, dtype=dtype, adapter=verify_info)
    at = run_speedup(draft_info, speedup)
    schedule = trained_schedule(draft_info, at, draft.num_layers, horizon)
    k = draft_tokens_for(prompt, task) if draft_tokens is None else draft_tokens
    return Verified(draft, verifier, k), schedule, f"draft: {draft_why}; verifier: {verify_why}"
