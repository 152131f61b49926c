"""Verified decoding measured: `skipdecode bench-verified` (speed beside full decoding in one run) and
`skipdecode verify-check` (is the greedy output full decoding's, prompt by prompt?).

Both run the pairs a comparison's "auto" runs (skipdecode/speculative/verify.py `for_prompt`): for E2E test MRs the
E2E adapter drafts and e2e-1x verifies; for the general validation prompts the general adapter drafts
and the base model verifies. The bench interleaves full decoding and each verified setting prompt by
prompt, so they share the machine's load, and reports ratios inside the run. transformers'
`generate(assistant_early_exit=...)` runs as a peer on the verifier's float32 weights against its own
plain `generate`: its draft is the bottom layers and the LM head, which were never trained for early exit.
"""

from __future__ import annotations

import json
import os
import sys
import time
from statistics import median

from ..adapters.router import E2E, GENERAL
from ..speculative.verify import Verified, for_prompt
from .machine import machine

SETS = (E2E, GENERAL)


def prompt_set(kind: str, tokenizer, limit: int | None) -> list[str]:
    """E2E: the test MRs (distinct, file order); general: the validation prompts (hash order)."""
    from .data import eval_items
    from .general import VALIDATION_COUNT, validation_prompts

    if kind == E2E:
        return [item.prompt for item in eval_items(split="test")][:limit]
    return validation_prompts(tokenizer, VALIDATION_COUNT if limit is None else limit)


def pairs(speedup: float, draft_tokens: int, dtype="auto") -> dict[str, tuple[Verified, object]]:
    """kind -> (the verified pair, the draft's schedule), loaded once per kind."""
    return {kind: for_prompt(None, speedup, dtype=dtype, draft_tokens=draft_tokens, task=kind)[:2] for kind in SETS}


# ---- identity -----------------------------------------------------------------------------------
def check(runs, prompts_by_kind, new_tokens: int, say=print) -> dict:
    """Greedy verified output against full decoding, token for token. A mismatch reports where, and the
    verifier's top-2 logit margin there (a near tie: one pass over k + 1 positions and one position at a
    time may round differently)."""
    out = {}
    for kind, prompts in prompts_by_kind.items():
        run, schedule = runs[kind]
        same, misses = 0, []
        for i, prompt in enumerate(prompts):
            want = run.verifier.generate([prompt], None, new_tokens).token_ids[0]
            got = run.generate([prompt], schedule, new_tokens).token_ids[0]
            if got == want:
                same += 1
            else:
                at = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                misses.append({"index": i, "position": at, "margin": _margin(run, prompt, want[:at])})
                say(f"[verify-check] {kind} #{i}: differs at token {at} (verifier's top-2 margin "
                    f"{misses[-1]['margin']:.2e})")
            if (i + 1) % 4 == 0 or i + 1 == len(prompts):
                say(f"[verify-check] {kind}: {same} identical of {i + 1}")
        out[kind] = {"identical": same, "total": len(prompts), "mismatches": misses}
    return out


def _margin(run, prompt, prefix) -> float:
    import torch

    ids = run.encode(prompt) + list(prefix)
    logits = run.verifier.decoder.logits(run.verifier.hidden_states(torch.tensor([ids]))[-1][0, -1])
    top = logits.topk(2).values
    return float(top[0] - top[1])


# ---- speed ----------------------------------------------------------------------------------------
def bench(prompts_by_kind, speedups=(3.0,), draft_tokens=(None,), new_tokens: int = 64, repeats: int = 3,
          hf_peer: bool = True, hf_prompts: int = 8, prefix: bool = True, whole_head: bool = False,
          control: bool = False, say=print) -> list[dict]:
    """Rows: per prompt set, full decoding and "skipdecode-verified" at each speedup and k (None: the kind's
    DRAFT_TOKENS), end to end (from the request to the last token: the prefill, EOS stops), greedy, batch 1.
    `repeats` passes over the prompts after a warm-up on the first one; in each pass every prompt runs all
    cases in turns (the order rotating), and every case has its own prefix cache, emptied at each pass's
    start (`prefix`: on), so that each side sees the same earlier requests. Ratios to full decoding inside
    each pass; the rows give the worst pass and the best, and the worst prompt (its median over passes).
    `whole_head`: also a row whose draft chooses from the whole vocabulary where its adapter ships a
    shortlist (skipdecode/speculative/shortlist.py), "skipdecode-verified-whole-head", in the same turns. `control`: full
    decoding again as a case of its own ("full-again"): its ratios to full decoding are this machine's noise,
    the floor under which no per-prompt ratio means anything."""
    from ..prefix import PrefixCache
    from ..speculative.verify import DRAFT_TOKENS

    rows = []
    for kind, prompts in prompts_by_kind.items():
        loaded = {s: for_prompt(None, s, task=kind)[:2] for s in speedups}  # engines loaded once per speedup
        cases = {("full", 1.0, None): None}
        if control:
            cases[("full-again", 1.0, None)] = None
        for s in speedups:
            for k in draft_tokens:
                k = DRAFT_TOKENS if k is None else k
                run, schedule = loaded[s]
                cases[("skipdecode-verified", s, k)] = (Verified(run.draft, run.verifier, k, prefixes=None), schedule)
                if whole_head and run.shortlist:
                    cases[("skipdecode-verified-whole-head", s, k)] = (
                        Verified(run.draft, run.verifier, k, prefixes=None, shortlist=None), schedule)
        verifier = next(iter(loaded.values()))[0].verifier
        names = list(cases)
        ms = {case: [[0.0] * len(prompts) for _ in range(repeats)] for case in names}
        stats = {case: {"tokens": 0, "decode_ms": 0.0, "drafted": 0, "accepted": 0, "passes": 0, "plain": 0,
                        "copied": 0, "copies_kept": 0, "prefix": 0, "prompt_tokens": 0, "same": 0} for case in names}
        saved = verifier.prefixes
        try:
            for rep in range(-1, repeats):  # pass -1 warms up on the first prompt and is not counted
                stores = {case: PrefixCache() if prefix else None for case in names}
                for i, prompt in enumerate(prompts if rep >= 0 else prompts[:1]):
                    outs = {}
                    for case in names[i % len(names):] + names[:i % len(names)]:  # the order rotates
                        pair = cases[case]
                        if pair is None:
                            verifier.prefixes = stores[case]
                            run, schedule = verifier, None
                        else:
                            pair[0].prefixes = stores[case]
                            run, schedule = pair
                        started = time.perf_counter()
                        outs[case] = run.generate([prompt], schedule, new_tokens)
                        if rep >= 0:
                            ms[case][rep][i] = (time.perf_counter() - started) * 1000.0
                    if rep == 0:
                        for case in names:
                            _count(stats[case], outs[case], cases[case] is not None)
                            stats[case]["same"] += outs[case].token_ids == outs[names[0]].token_ids
                say(f"[bench-verified] {kind}: pass {rep + 1}/{repeats}" if rep >= 0 else f"[bench-verified] {kind}: warm")
        finally:
            verifier.prefixes = saved
        base = ms[("full", 1.0, None)]
        for case in names:
            method, speedup, k = case
            verified = cases[case] is not None
            t = stats[case]
            totals = [sum(ms[case][r]) for r in range(repeats)]
            ratios = [sum(base[r]) / totals[r] for r in range(repeats)]
            per_prompt = [median(base[r][i] / ms[case][r][i] for r in range(repeats)) for i in range(len(prompts))]
            row = {"prompts": kind, "method": method, "draft_speedup": speedup, "draft_tokens": k, "batch_size": 1,
                   "prefix_cache": prefix, "tokens": t["tokens"],
                   "e2e_tokens_per_s": _rate(t["tokens"], median(totals)),  # passes differ in load: the median
                   "e2e_vs_full": round(min(ratios), 3), "e2e_vs_full_best": round(max(ratios), 3),
                   "worst_prompt_vs_full": round(min(per_prompt), 3),
                   "tokens_per_s": _rate(t["tokens"] - len(prompts), t["decode_ms"]),
                   "prefix_share": round(t["prefix"] / t["prompt_tokens"], 3) if t["prompt_tokens"] else None,
                   "acceptance_rate": round(t["accepted"] / t["drafted"], 4) if t["drafted"] else None,
                   "passes_per_token": round(t["passes"] / t["tokens"], 4) if verified else 1.0,
                   "plain_steps": t["plain"] if verified else None,
                   "prompt_copies_kept": f"{t['copies_kept']}/{t['copied']}" if verified else None,
                   "identical": f"{t['same']}/{len(prompts)}"}
            rows.append(row)
        if hf_peer:
            rows += hf_early_exit(kind, prompts[:hf_prompts], speedups, new_tokens, say)
        say(markdown([row for row in rows if row["prompts"] == kind]))  # each set's rows as soon as they exist
    return rows


def _count(t: dict, out, verified: bool) -> None:
    """A case's first counted pass: tokens, decode time, and what verification did."""
    t["tokens"] += len(out.token_ids[0])
    t["decode_ms"] += out.trace.decode_ms
    t["prefix"] += out.trace.prefix_tokens
    t["prompt_tokens"] += out.trace.prompt_tokens
    if verified:
        v = out.verification
        t["drafted"] += v.drafted
        t["accepted"] += v.accepted
        t["passes"] += v.passes
        t["plain"] += v.plain_steps
        t["copied"] += v.prompt_drafted
        t["copies_kept"] += v.prompt_accepted


def _rate(tokens: int, ms: float) -> float:
    return round(1000.0 * tokens / ms, 2) if ms else 0.0


def hf_early_exit(kind: str, prompts, speedups, new_tokens: int, say) -> list[dict]:
    """transformers' self-speculative decoding (LayerSkip's recipe) on the verifier's float32 weights:
    `assistant_early_exit` = the layers a draft of each speedup runs on average, against plain `generate`
    in the same loop. Its draft exits after the bottom layers through the LM head, untrained for that."""
    import torch

    from ..adapters.lora import pick_adapter
    from ..engine import Engine

    engine = Engine.load(dtype="float32", adapter=pick_adapter(1.0, task=kind)[0])
    model, L = engine.model, engine.num_layers
    exits = {s: max(1, round(L / s)) for s in speedups}
    cases = {None: [0.0, 0, 0], **{s: [0.0, 0, 0] for s in speedups}}  # ms, tokens, identical
    try:
        for prompt in prompts:
            ids = torch.tensor([engine.encode(prompt)])
            plain = None
            for s in cases:
                extra = {} if s is None else {"assistant_early_exit": exits[s]}
                started = time.perf_counter()
                with torch.inference_mode():
                    out = model.generate(ids, do_sample=False, max_new_tokens=new_tokens, pad_token_id=engine.pad_id,
                                         **extra)
                ms = (time.perf_counter() - started) * 1000.0
                new = out[0, ids.shape[1]:].tolist()
                plain = new if s is None else plain
                cases[s][0] += ms
                cases[s][1] += len(new)
                cases[s][2] += new == plain
    except Exception as error:  # a transformers version without it: say so, no row
        say(f"[bench-verified] no transformers assistant_early_exit row: {type(error).__name__}: {error}")
        return []
    full_rate = _rate(cases[None][1], cases[None][0])
    rows = []
    for s, (ms, tokens, same) in cases.items():
        rate = _rate(tokens, ms)
        rows.append({"prompts": kind, "method": "hf-generate" if s is None else "hf-assistant-early-exit",
                     "draft_speedup": 1.0 if s is None else s, "draft_tokens": None if s is None else exits[s],
                     "batch_size": 1, "prefix_cache": False, "tokens": tokens, "e2e_tokens_per_s": rate,
                     "e2e_vs_full": round(rate / full_rate, 3), "identical": f"{same}/{len(prompts)}"})
    return rows


COLUMNS = ("prompts", "method", "draft_speedup", "draft_tokens", "prefix_cache", "tokens", "e2e_tokens_per_s",
           "e2e_vs_full", "e2e_vs_full_best", "worst_prompt_vs_full", "tokens_per_s", "prefix_share",
           "acceptance_rate", "passes_per_token", "plain_steps", "prompt_copies_kept", "identical")


def markdown(rows) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join("" if row.get(c) is None else str(row[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def _limits(args, tokenizer):
    """The prompt sets asked for, the general one first: the shorter run, done even if a long one is cut."""
    return {kind: prompt_set(kind, tokenizer, limit) for kind, limit in ((GENERAL, args.general), (E2E, args.e2e))
            if limit != 0}


def cmd_bench_verified(args) -> int:
    from ..engine import Engine

    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    before = machine()
    prompts = _limits(args, Engine.load().tokenizer)
    ks = tuple(None if k == "auto" else int(k) for k in args.draft_tokens.split(","))
    speedups = tuple(float(s) for s in args.speedups.split(","))
    rows = bench(prompts, speedups, ks, args.new_tokens, args.repeats, not args.no_hf, args.hf_prompts,
                 not args.no_prefix_cache, args.whole_head, args.control, say)
    report = {"command": " ".join(["skipdecode", *sys.argv[1:]]), "machine": before,
              "load_average_after": [round(x, 2) for x in os.getloadavg()], "rows": rows}
    print(json.dumps(report) if args.json else f"{before['cpu']}, load {before['load_average']}\n{markdown(rows)}")
    return 0


def cmd_verify_check(args) -> int:
    from ..engine import Engine

    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    prompts = _limits(args, Engine.load().tokenizer)
    result = check(pairs(args.speedup, args.draft_tokens), prompts, args.new_tokens, say)
    for kind, r in result.items():
        print(f"{kind}: {r['identical']} identical / {r['total']} (verified {args.speedup:g}x drafts, greedy, "
              f"{args.new_tokens} new tokens)")
    if args.json:
        print(json.dumps(result))
    return 0 if all(r["identical"] == r["total"] for r in result.values()) else 1


def register(subparsers) -> None:
    for name, func, help_ in (("bench-verified", cmd_bench_verified,
                               "verified decoding's speed beside full decoding, one run (batch 1)"),
                              ("verify-check", cmd_verify_check,
                               "is verified greedy output full decoding's? Counts identical / total")):
        p = subparsers.add_parser(name, help=help_)
        p.add_argument("--e2e", type=int, default=None, help="E2E test MRs to run (default: all 630; 0: none)")
        p.add_argument("--general", type=int, default=None,
                       help="general validation prompts to run (default: all 64; 0: none)")
        p.add_argument("--new-tokens", type=int, default=64)
        p.add_argument("--json", action="store_true")
        if func is cmd_bench_verified:
            p.add_argument("--speedups", default="3", help="the drafts' speedups")
            p.add_argument("--draft-tokens", default="auto",
                           help="k values (drafts a round at most), comma-separated; auto: DRAFT_TOKENS")
            p.add_argument("--repeats", type=int, default=3, help="counted passes over the prompts after a warm-up")
            p.add_argument("--no-prefix-cache", action="store_true",
                           help="every prefill runs the whole prompt (default: each side its own prefix cache)")
            p.add_argument("--no-hf", action="store_true", help="skip transformers' assistant_early_exit peer")
            p.add_argument("--control", action="store_true",
                           help="full decoding twice: the second's ratios to the first are the machine's noise")
            p.add_argument("--whole-head", action="store_true",
                           help="also a row whose draft's LM head is the whole vocabulary, where a shortlist is shipped")
            p.add_argument("--hf-prompts", type=int, default=8, help="prompts of each set the peer runs (it is slow)")
        else:
            p.add_argument("--speedup", type=float, default=3.0)
            p.add_argument("--draft-tokens", type=int, default=None, help="default: DRAFT_TOKENS")
        p.set_defaults(func=func)
