"""Verified decoding (self-speculative: LayerSkip, Draft & Verify, SWIFT): SkipDecode drafts, full depth verifies.

One cache, one prefill. The verifier (full depth: the model a comparison's full side runs) prefills the
prompt once, into the one KV cache a full decode would use (its bytes are full decoding's). The draft (the
SkipDecode schedule on its adapter) reads the verifier's keys and values at every layer it runs, for the
prompt and for every verified position, and writes entries only for its drafts in flight, at its layers:
scratch that the verify pass overwrites (the cache is cut back to the kept columns before it runs). There is
no draft prefill, no catch-up pass and no second cache.

A round: drafts (the skipped model's, one position at a time, and copies from the prompt: skipdecode/
prompt_lookup.py), then ONE verifier pass over the last kept token and the drafts (a small prefill at those cache
columns), which keeps the drafts it agrees with plus its own next token. How much to draft, and when to
run plain full-depth steps instead, is skipdecode/speculative/drafting.py's (the confidence stop, the cost cap, the
fallback with probes). Greedy output is full decoding's, token for token, where a pass over several
positions rounds as one position does: on the 4-bit path it does (row-exact products and attention, the
row-exact LoRA term q4.lora_term; `skipdecode verify-check`). Sampling accepts a draft with probability
min(1, p/q) and otherwise draws from norm(max(0, p - q)) (a copy from the prompt has q a point mass), a
bonus token from p when all are accepted, so the output follows the verifier's distribution (Leviathan et
al. 2023; Chen et al. 2023).

Why a module beside Engine._decode rather than a column policy: a policy runs one column of one engine,
while this loop drives two decoders over one cache and moves a varying number of columns per round, rolling
back. It reuses the engine's pieces (Decoder blocks, KVCache, the Scheduled column, sampling, Generation,
Trace) and offers Engine's `stream`/`generate`/`encode`, so the batcher runs it unchanged. Batch 1 only: the
rows of a batch would accept different numbers of drafts and drift apart in position. On the 4-bit path the
draft and the verifier are adapters beside one packed base: no second copy.
"""

from __future__ import annotations

import numbers
import time
import weakref
from dataclasses import dataclass, field
from typing import Iterator

import torch

from ..cache import KVCache
from .drafting import PROMPT, SKIPDECODE, THRESHOLD, Costs, Pacing
from ..engine import Decoding, Engine, Generation, Prompt, Scheduled
from ..request import Request, check
from .prompt_lookup import MIN_NGRAM, NGRAM, PromptLookup
from ..prefix import VERIFIED_PREFIXES, PrefixCache, forward, prefill
from ..sampling import Sampling, next_tokens, probabilities
from ..schedule import Schedule
from .shortlist import RequestVocabulary, load as load_shortlist, shortlist_head
from ..trace import StepRecord, Trace

# The most drafts a round makes: chosen by the rule in docs/method.md ("How much to draft") on tuning prompts
# (experiments/draft_tuning.py, docs/results/draft-tuning-shortlist-2026-11-29.json): 4 for E2E and general
# prompts alike, the lowest k within 1% of the best setting. The drafting rules decide how many a round makes.
DRAFT_TOKENS = 4


ACCEPTED, REPLACED, VERIFIER = "accepted", "replaced", "verifier"  # how each output token came to be
# Who proposed a token (Verification.sources) or a round's drafts (Round.source): SKIPDECODE, the skipped
# model; PROMPT, a copy from the prompt; the verifier itself (its own next token, or the one it put in place
# of a rejected draft). A round that drafted nothing is a plain full-depth step: source NONE.
NONE = "none"


@dataclass
class Round:
    """One verify pass: the drafts proposed, how many the verifier kept, and the output tokens the round
    emitted, output[first : first + emitted] (drafts kept, then the verifier's token; cut at EOS or the token
    limit). The pass ran over drafted + 1 positions. `source` is the round's first drafter (SKIPDECODE or
    PROMPT; a round may go on with the other: `prompt_drafts` of its drafts were copied from the prompt, the
    rest are the skipped model's, one draft step each), NONE for a plain full-depth step. `stop`: why drafting
    ended ("limit": k, the cost cap or the token limit; "confidence": a draft below the threshold; "eos"; "prompt":
    copies from the prompt end a round; "" for a plain step)."""

    first: int
    drafted: int
    accepted: int
    emitted: int
    source: str = SKIPDECODE
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    prompt_drafts: int = 0
    stop: str = ""

    def to_dict(self) -> dict:
        return {"first": self.first, "drafted": self.drafted, "accepted": self.accepted, "emitted": self.emitted,
                "source": self.source, "draft_ms": round(self.draft_ms, 3), "verify_ms": round(self.verify_ms, 3),
                "prompt_drafts": self.prompt_drafts, "stop": self.stop}


@dataclass
class Verification:
    """What verification did: drafts made and kept, full-depth passes, and each output token's origin
    (ACCEPTED: a draft the verifier agreed with; REPLACED: the verifier's token where it rejected a draft;
    VERIFIER: its own next token with no draft rejected, the first token, a round's bonus, a plain step's)."""

    draft_tokens: int  # k, drafts per round at most
    draft_model: str = ""
    verifier_model: str = ""
    drafted: int = 0
    accepted: int = 0
    passes: int = 0  # full-depth passes after the prefill: verify passes and plain steps
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    marks: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # per output token: who proposed it
    rounds: list[Round] = field(default_factory=list)  # one per full-depth pass, in order
    plain_steps: int = 0  # passes with nothing drafted (the fallback, or the last token)
    prompt_drafted: int = 0  # drafts copied from the prompt (counted in drafted)
    prompt_accepted: int = 0
    prompt_tokens: int = 0
    prefix_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache (skipdecode/prefix.py)
    prefill_ms: float = 0.0  # the one prefill, the verifier's (the draft reads its keys and values)
    cache_bytes: int = 0  # the one KV cache: the bytes full decoding's holds
    threshold: float = THRESHOLD
    costs: dict = field(default_factory=dict)  # the cost model's figures (drafting.Costs.to_dict) at the end

    @classmethod
    def from_dict(cls, d: dict) -> "Verification":
        """Back from `to_dict` (an exported record's; fields it lacks keep their defaults)."""
        plain = {"draft_tokens", "draft_model", "verifier_model", "drafted", "accepted", "draft_ms", "verify_ms",
                 "marks", "sources", "plain_steps", "prompt_drafted", "prompt_accepted", "prompt_tokens",
                 "prefix_tokens", "prefill_ms", "cache_bytes", "threshold", "costs"}
        return cls(**{k: v for k, v in d.items() if k in plain}, passes=d.get("verify_passes", 0),
                   rounds=[Round(**r) for r in d.get("rounds", [])])

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
                "sources": list(self.sources), "rounds": [r.to_dict() for r in self.rounds],
                "plain_steps": self.plain_steps, "prompt_drafted": self.prompt_drafted,
                "prompt_accepted": self.prompt_accepted, "prompt_tokens": self.prompt_tokens,
                "prefix_tokens": self.prefix_tokens, "prefill_ms": round(self.prefill_ms, 3),
                "cache_bytes": self.cache_bytes, "threshold": self.threshold, "costs": dict(self.costs)}


@dataclass
class VerifiedGeneration(Generation):
    verification: Verification | None = None
    caches: tuple = field(default=(), repr=False)  # (the one KVCache,), for inspection

    def to_dict(self) -> dict:
        return {**super().to_dict(), "verification": self.verification.to_dict()}


class Verified(Decoding):
    """`draft` drafts under the stream's schedule; `verifier` checks at full depth. Both must share a
    tokenizer (adapters of one base). `draft_tokens`: k, drafts a round at most; `threshold`: the
    confidence stop; `lookup`: prompt lookup's (longest, shortest) n-gram, or None for no copies from the
    prompt; `costs`: the cost model (default: measured on this machine once per verifier and draft budget);
    `prefixes`: the prefix cache the verifier's prefill reads and fills (default: verified decoding's own
    store, prefix.VERIFIED_PREFIXES; None: none); `shortlist`: the token ids the draft's LM head chooses
    among, beside the request's own (skipdecode/speculative/shortlist.py; default "adapter": the one shipped with the
    draft's adapter, if any; None: the whole vocabulary)."""

    batch_one = True  # the batcher runs each request as its own batch

    def __init__(self, draft: Engine, verifier: Engine, draft_tokens: int = DRAFT_TOKENS,
                 threshold: float = THRESHOLD, lookup: tuple[int, int] | None = (NGRAM, MIN_NGRAM),
                 costs: Costs | None = None, prefixes: PrefixCache | None = VERIFIED_PREFIXES,
                 shortlist: list[int] | str | None = "adapter"):
        if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, numbers.Integral) or draft_tokens < 1:
            raise ValueError(f"draft tokens must be an integer >= 1; got {draft_tokens!r}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"the confidence threshold must be in [0, 1]; got {threshold!r}")
        if draft.num_layers != verifier.num_layers or draft.decoder.embed_tokens.shape != verifier.decoder.embed_tokens.shape:
            raise ValueError("the draft and the verifier must be the same model (adapters of one base)")
        self.draft, self.verifier, self.k = draft, verifier, int(draft_tokens)
        self.threshold, self.lookup, self.costs = float(threshold), lookup, costs
        self.prefixes = prefixes
        if shortlist == "adapter":
            adapter = getattr(draft, "adapter", None)
            shortlist = load_shortlist(adapter.path) if adapter is not None else None
        self.shortlist = shortlist
        self.draft_head = shortlist_head(draft.decoder, shortlist)  # the draft's LM head over it (None: the whole head)
        self.name = f"{draft.name} drafts, {verifier.name} verifies"
        self.tokenizer, self.decoder, self.num_layers = verifier.tokenizer, verifier.decoder, verifier.num_layers
        self.eos_ids, self.pad_id = verifier.eos_ids, verifier.pad_id
        self.weights_label = verifier.weights_label

    def encode(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        return self.verifier.encode(prompt, chat)

    def vocabulary(self, ids: list[int]) -> RequestVocabulary | None:
        """What the draft chooses among for a request of prompt `ids`: the shortlist, the prompt's tokens and
        the end of sequence (the answer's join as they are emitted); None: the whole vocabulary."""
        return self.draft_head.request(ids + list(self.eos_ids)) if self.draft_head is not None else None

    def stream(self, prompts, schedule: Schedule | None = None, max_new_tokens: int = 64,
               sampling: Sampling = Sampling(), chat: bool | None = None, stop_at_eos: bool = True,
               beam=None) -> Iterator[VerifiedGeneration]:
        """Yields the generation after the prefill and after every full-depth pass (one or more tokens)."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if len(prompts) != 1:
            raise ValueError(f"verified decoding runs one prompt at a time (batch 1); got {len(prompts)}")
        if beam is not None and beam.width > 1:
            raise ValueError("verified decoding does not search beams")
        return self.run([check(self, prompts[0], schedule, max_new_tokens, sampling, stop_at_eos, chat)], prompts)

    @torch.inference_mode()
    def run(self, requests: list[Request], prompts: list | None = None) -> Iterator[VerifiedGeneration]:
        """One checked request (skipdecode/request.py) as its own batch; `prompts` as in Engine.run."""
        (request,) = requests
        if request.beam is not None:
            raise ValueError("verified decoding does not search beams")
        prompts = prompts or [list(request.prompt_ids)]
        L, schedule, max_new_tokens = self.num_layers, request.schedule, request.max_new_tokens
        sampling, stop_at_eos = request.sampling, request.stop_at_eos
        ids = list(request.prompt_ids)
        P, width = len(ids), request.columns
        draft_dec, verify_dec = self.draft.decoder, self.verifier.decoder
        column = Scheduled(schedule)
        costs = self._costs(column)
        pair = (id(draft_dec), self.threshold)  # where this pair's last request left its pacing
        pacing = Pacing(self.k, costs, self.threshold).resume(costs.history.get(pair))
        lookup = PromptLookup(ids, *self.lookup) if self.lookup else None
        vocab = self.vocabulary(ids)
        cache = _cache(verify_dec, width)  # the one cache: the verifier's, which the draft reads
        generator = sampling.generator(verify_dec.device)
        trace = Trace(L, 1, P, {**schedule.to_dict(), "verified": True, "draft_tokens": self.k})
        stats = Verification(self.k, self.draft.name, self.verifier.name, prompt_tokens=P, threshold=self.threshold)
        gen = VerifiedGeneration(prompts, [[]], [False], trace, self.tokenizer, verification=stats, caches=(cache,))
        tokens = gen.token_ids[0]

        started = time.perf_counter()
        logits, trace.prefix_tokens = prefill(verify_dec, cache, ids, self.prefixes)  # the one prefill: the verifier's
        trace.prefill_ms = stats.prefill_ms = (time.perf_counter() - started) * 1000.0
        stats.prefix_tokens = trace.prefix_tokens

        def emit(new: list[int], marks: list[str], sources: list[str], ms: float) -> bool:
            """Append a round's tokens (cut at EOS and the limit); True once the generation is over."""
            for i, (t, mark) in enumerate(zip(new, marks)):
                tokens.append(t)
                stats.marks.append(mark)
                stats.sources.append(sources[i] if mark == ACCEPTED else VERIFIER)
                trace.generated_tokens += 1
                trace.steps.append(StepRecord(len(tokens) - 1, L, tuple(range(L)), (), ms / len(new), 1))
                if (stop_at_eos and t in self.eos_ids) or len(tokens) == max_new_tokens:
                    gen.finished[0] = True
                    return True
            return False

        done = emit(next_tokens(logits, sampling, generator).tolist(), [VERIFIER], [VERIFIER], 0.0)
        trace.steps.clear()  # the first token is the prefill's
        if vocab is not None:
            vocab.add(tokens)
        while not done:
            yield gen
            n = len(tokens)
            start = P + n - 1  # the cache holds every layer of the prompt and of all tokens but the last
            room = max_new_tokens - n - 1  # the verifier adds one token to the drafts
            started = time.perf_counter()
            drafts, sources, q, sure, steps, stop = [], [], [], [], 0, ""

            def copy() -> bool:
                """Drafts copied from the prompt after the context's last n-gram, while they pay; True if any."""
                copies = lookup.propose(ids + tokens + drafts, min(room, self.k) - len(drafts)) if lookup else []
                before = len(drafts)
                for t in copies:
                    if not pacing.allows(PROMPT, sure):
                        break
                    drafts.append(t), sources.append(PROMPT), q.append(None), sure.append(pacing.acceptance[PROMPT])
                    if stop_at_eos and t in self.eos_ids:
                        break
                return len(drafts) > before

            if room and copy():
                stop = PROMPT
            elif room and pacing.drafting():
                # The draft runs the last token, then each draft, through its layers at the next columns,
                # reading the verifier's keys and values before them and its own in-flight ones.
                x = _draft_step(draft_dec, cache, column, tokens[-1], start, n - 1, width)
                steps = 1
                while True:
                    d, p, top = _choose(draft_dec, vocab, x[:, -1], sampling, generator)
                    drafts.append(d), sources.append(SKIPDECODE), q.append(p), sure.append(top)
                    if stop_at_eos and d in self.eos_ids:
                        stop = "eos"
                    elif len(drafts) >= room:
                        stop = "limit"
                    elif copy():
                        stop = PROMPT
                    elif sure[-1] < self.threshold:
                        stop = "confidence"
                    elif not pacing.allows(SKIPDECODE, sure):
                        stop = "limit"
                    if stop:
                        break
                    x = _draft_step(draft_dec, cache, column, d, start + len(drafts), n - 1 + len(drafts), width)
                    steps += 1
                cache.truncate(start)  # the drafts' entries were scratch: the verify pass writes these columns
            drafted_at = time.perf_counter()
            logits = forward(verify_dec, cache, [tokens[-1]] + drafts, start)
            kept, marks = accept(logits, drafts, q, sampling, generator)
            cache.truncate(start + len(kept))  # forget the rejected: the cache holds all tokens but the last
            ended = time.perf_counter()
            draft_ms, verify_ms = (drafted_at - started) * 1000.0, (ended - drafted_at) * 1000.0
            costs.observe_draft(steps, draft_ms)
            costs.observe_pass(len(drafts) + 1, verify_ms)
            accepted = marks.count(ACCEPTED)
            pacing.record(sources, accepted, len(kept), steps)
            costs.history[pair] = pacing.state()
            stats.drafted += len(drafts)
            stats.accepted += accepted
            stats.prompt_drafted += sources.count(PROMPT)
            stats.prompt_accepted += sources[:accepted].count(PROMPT)
            stats.passes += 1
            stats.plain_steps += not drafts
            stats.draft_ms += draft_ms
            stats.verify_ms += verify_ms
            first = len(tokens)
            done = emit(kept, marks, sources, draft_ms + verify_ms)
            if vocab is not None:
                vocab.add(kept)
            cache.truncate(P + len(tokens) - 1)  # past an end of sequence or the limit nothing was kept
            stats.rounds.append(Round(first, len(drafts), accepted, len(tokens) - first,
                                      sources[0] if sources else NONE, draft_ms, verify_ms,
                                      sources.count(PROMPT), stop))
        trace.cache_lengths = list(cache.lengths)
        stats.cache_bytes, stats.costs = cache.nbytes, costs.to_dict()
        gen.done = True
        yield gen

    def _costs(self, column: Scheduled) -> Costs:
        """The cost model: given, or this machine's for the verifier and a draft of this many layers,
        measured once (a few passes on a scratch cache) and shared by the requests after it (a comparison
        makes a fresh pair per request)."""
        if self.costs is not None:
            return self.costs
        dec, draft = self.verifier.decoder, self.draft.decoder
        key = (len(column.schedule.layers(0)), self.k, None if self.draft_head is None else len(self.draft_head.ids))
        known = _MEASURED.setdefault(dec, {})
        if key not in known:
            width, at = self.k + 33, 32
            scratch = _cache(dec, width)
            scratch.data.zero_()

            def run_pass(positions: int):
                scratch.truncate(at)
                forward(dec, scratch, [self.pad_id] * positions, at)

            def run_draft():
                scratch.truncate(at)
                x = _draft_step(draft, scratch, column, self.pad_id, at, 0, width)
                vocab = self.vocabulary([])
                (draft.logits(x[:, -1]) if vocab is None else vocab.logits(draft, x[:, -1])).softmax(-1)

            scratch.lengths = [at] * dec.num_layers
            with torch.inference_mode():
                run_pass(1)  # a first call may pay for allocations
                known[key] = Costs().measure(run_pass, run_draft, self.k + 1)
        return known[key]


_MEASURED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # verifier decoder -> {(draft layers, k, shortlist size): Costs}


def _choose(dec, vocab: RequestVocabulary | None, x: torch.Tensor, sampling: Sampling, generator):
    """The draft after hidden state x [1, hidden] (its LM head over `vocab`, or the whole vocabulary): the token,
    its distribution over the whole vocabulary q for sampling (None when greedy) and its top-1 probability."""
    logits = dec.logits(x) if vocab is None else vocab.logits(dec, x)
    p = logits[0].softmax(-1) if sampling.greedy else probabilities(logits, sampling)[0]
    j = int(next_tokens(logits, sampling, generator))
    d = j if vocab is None else int(vocab.ids[j])
    q = None if sampling.greedy else (p if vocab is None else vocab.spread(p))
    return d, q, float(p[j])


def accept(logits: torch.Tensor, drafts: list[int], q: list, sampling: Sampling,
           generator) -> tuple[list[int], list[str]]:
    """The tokens a round keeps and their marks, from the verifier's logits [len(drafts) + 1, V] at the
    last accepted token and each draft. Greedy: the drafts up to the first the verifier's argmax differs
    from, then its argmax. Sampling: draft d (drawn from q; q None: a copy from the prompt, q a point mass
    on d) stays with probability min(1, p(d) / q(d)); the first rejected one is replaced by a draw from
    norm(max(0, p - q)); all kept: a bonus draw from p."""
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
        if u * (1.0 if q[i] is None else q[i][d]) <= p[i, d]:  # u < p/q without dividing
            kept.append(d), marks.append(ACCEPTED)
            continue
        if q[i] is None:
            residual = p[i].clone()
            residual[d] = 0.0
        else:
            residual = (p[i] - q[i]).clamp(min=0)
        residual = residual if residual.sum() > 0 else p[i]
        choice = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        return kept + [choice], marks + [REPLACED]
    last = logits[len(drafts):]
    bonus = int(last.argmax()) if sampling.greedy else int(torch.multinomial(p[len(drafts)], 1, generator=generator))
    return kept + [bonus], marks + [VERIFIER]


def _draft_step(dec, cache: KVCache, column: Scheduled, token: int, col: int, step: int, width: int):
    """One draft position: `token` at cache column `col` through the layers the schedule gives `step`."""
    position = torch.tensor([[col]], device=dec.device)
    x = dec.embed(torch.tensor([[token]], device=dec.device), position)
    x, _ = column.run(dec, cache, step, col, x, dec.rope(position, limit=width), None)
    return x


def _cache(dec, width: int) -> KVCache:
    return KVCache(dec.num_layers, 1, dec.num_kv_heads, width, dec.head_dim, dec.device, dec.dtype)


def why(verification: Verification, full_ms_per_token: float | None) -> str:
    """A few sentences: the one prefill (and what the prefix cache spared it), then why verified decoding
    ran faster or slower than full decoding (acceptance rate x draft cost against the verify cost, and the
    plain steps the fallback ran)."""
    v, tokens = verification, len(verification.marks)
    if not v.passes or not tokens:
        return "Nothing was drafted yet."
    prefill = ""
    if v.prompt_tokens:
        cached = (f", {v.prefix_tokens} of them from the prefix cache" if v.prefix_tokens else
                  ", none from the prefix cache")
        prefill = (f"One prefill of the prompt's {v.prompt_tokens} tokens{cached} ({v.prefill_ms:.1f} ms), "
                   "whose keys and values the draft reads: no second cache. ")
    rate = v.acceptance_rate or 0.0
    per_draft = v.draft_ms / max(v.drafted - v.prompt_drafted, 1)
    per_pass = v.verify_ms / v.passes
    ours = (v.draft_ms + v.verify_ms) / tokens
    copies = f", {v.prompt_accepted} of {v.prompt_drafted} copied from the prompt" if v.prompt_drafted else ""
    plain = f"; {v.plain_steps} plain full-depth steps where drafting did not pay" if v.plain_steps else ""
    line = (f"{prefill}{v.accepted} of {v.drafted} drafts accepted ({rate:.0%}{copies}){plain}; a draft cost "
            f"{per_draft:.1f} ms and a verify pass {per_pass:.1f} ms, so each pass yielded "
            f"{tokens / v.passes:.2f} tokens at {ours:.1f} ms a token")
    if not full_ms_per_token:
        return line + "."
    verdict = "faster" if ours < full_ms_per_token else "slower"
    reason = ("the drafts agreed often enough to pay for their pass" if verdict == "faster"
              else "too many drafts were rejected: their cost and the verify pass outweigh the tokens kept")
    return f"{line} against full decoding's {full_ms_per_token:.1f} ms: {verdict}, because {reason}."


def for_prompt(prompt: str | None, speedup: float, model: str | None = None, device: str = "auto",
               dtype="auto", draft_tokens: int | None = None, task: str | None = None,
               horizon: int | None = None) -> tuple[Verified, Schedule, str]:
    """The verified pair a comparison's "auto" runs for this prompt: the verifier is the adapter picked for 1x
    (e2e-1x for an E2E prompt, the base model for a general one), the draft the one trained to read that
    verifier's cache at the speedup where one is served (adapters.shared_cache_draft), else the adapter picked
    for `speedup`, on its trained schedule; and why, in words. On the 4-bit path both are adapters beside one
    packed base."""
    from ..adapters.lora import pick_adapter, run_speedup, shared_cache_draft, trained_schedule

    verify_info, verify_why = pick_adapter(1.0, model, prompt, task)
    draft_info, draft_why = pick_adapter(speedup, model, prompt, task)
    made = shared_cache_draft(verify_info, run_speedup(draft_info, speedup) if draft_info else speedup)
    if made is not None:
        draft_info, draft_why = made, f"{made.name}: trained to draft on {verify_info.name}'s keys and values"
    draft = Engine.load(model, device=device, dtype=dtype, adapter=draft_info)
    verifier = Engine.load(model, device=device, dtype=dtype, adapter=verify_info)
    at = run_speedup(draft_info, speedup)
    schedule = trained_schedule(draft_info, at, draft.num_layers, horizon)
    k = DRAFT_TOKENS if draft_tokens is None else draft_tokens
    return Verified(draft, verifier, k), schedule, f"draft: {draft_why}; verifier: {verify_why}"
