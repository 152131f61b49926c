"""Tunes verified decoding's drafting rules (skipdecode/speculative/drafting.py, skipdecode/speculative/prompt_lookup.py) by a deterministic
count, not a timer: the confidence threshold, prompt lookup's n-gram lengths, k and the fallback's window.

Greedy verified decoding emits the verifier's answer whatever the rules, and the skipped model's drafts from a
verified prefix are one fixed chain. So each tuning prompt is run once: the verifier's answer, and at every
position the draft's chain of K_MAX drafts (on the shared cache, as skipdecode/speculative/verify.py drafts) with their
top-1 probabilities (its LM head over the adapter's shortlist where one is shipped, as verify.py drafts).
Each setting is then replayed on those records with skipdecode's own Pacing and PromptLookup, costs fixed
(a draft step and each further verify position in full-depth steps, measured on this machine once for each
kind's pair), and scored by the decode's cost against full decoding's steps.

    python experiments/draft_tuning.py --e2e 32 --general 16 --out /tmp/tuning.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

K_MAX = 8


def record(run, schedule, prompt: str, new_tokens: int) -> dict:
    """The verifier's answer and, after each of its first n tokens, the draft's chain and confidences."""
    import torch

    from skipdecode.engine import Scheduled
    from skipdecode.prefix import forward
    from skipdecode.sampling import Sampling
    from skipdecode.speculative.verify import _cache, _choose, _draft_step

    answer = run.verifier.generate([prompt], None, new_tokens).token_ids[0]
    ids = run.encode(prompt)
    P, width = len(ids), len(ids) + new_tokens + K_MAX
    dec, draft = run.verifier.decoder, run.draft.decoder
    column = Scheduled(schedule)
    cache = _cache(dec, width)
    chains = []
    vocab = run.vocabulary(ids)  # the draft's choices, as verify.py makes them
    with torch.inference_mode():
        forward(dec, cache, ids + answer, 0, head=False)
        for n in range(1, len(answer)):
            start = P + n - 1
            cache.truncate(start)
            if vocab is not None:
                vocab.add(answer[:n])  # the answer's tokens join the draft's choices as they are emitted
            x = _draft_step(draft, cache, column, answer[n - 1], start, n - 1, width)
            chain, sure = [], []
            for j in range(K_MAX):
                d, _, top = _choose(draft, vocab, x[:, -1], Sampling(), None)
                chain.append(d), sure.append(round(top, 4))
                if j + 1 < K_MAX:
                    x = _draft_step(draft, cache, column, d, start + j + 1, n + j, width)
            chains.append((chain, sure))
    return {"ids": ids, "answer": answer, "chains": chains, "new_tokens": new_tokens}


def replay(rec: dict, eos: set, k: int, threshold: float, lookup, costs, window: int = 1,
           state: dict | None = None) -> tuple[float, int, int, dict]:
    """skipdecode/speculative/verify.py's rounds on a record, going on from the pacing `state` the pair's last request
    left (verify.py's Costs.history): (cost in full-depth steps, tokens, drafts kept, the state it leaves)."""
    from skipdecode.speculative.drafting import PROMPT, SKIPDECODE, Pacing
    from skipdecode.speculative.prompt_lookup import PromptLookup

    ids, answer, chains = rec["ids"], rec["answer"], rec["chains"]
    pacing = Pacing(k, costs, threshold, window).resume(state)
    copier = PromptLookup(ids, *lookup) if lookup else None
    n, spent, kept_total = 1, 0.0, 0
    while n < len(answer):
        room = rec["new_tokens"] - n - 1
        drafts, sources, sure, steps = [], [], [], 0

        def copy() -> bool:
            before = len(drafts)
            for t in copier.propose(ids + answer[:n] + drafts, min(room, k) - len(drafts)) if copier else []:
                if not pacing.allows(PROMPT, sure):
                    break
                drafts.append(t), sources.append(PROMPT), sure.append(pacing.acceptance[PROMPT])
                if t in eos:
                    break
            return len(drafts) > before

        if room and copy():
            pass
        elif room and pacing.drafting():
            chain, confidence = chains[n - 1]
            for j in range(K_MAX):
                drafts.append(chain[j]), sources.append(SKIPDECODE), sure.append(confidence[j])
                steps += 1
                if (chain[j] in eos or len(drafts) >= room or copy() or confidence[j] < threshold
                        or not pacing.allows(SKIPDECODE, sure)):
                    break
        accepted = next((i for i, d in enumerate(drafts) if n + i >= len(answer) or answer[n + i] != d), len(drafts))
        emitted = min(accepted + 1, len(answer) - n)
        pacing.record(sources, accepted, accepted + 1, steps)
        spent += steps * costs.draft + costs.pass_cost(len(drafts) + 1)
        kept_total += accepted
        n += emitted
    return spent, len(answer) - 1, kept_total, pacing.state()


def measure(run, schedule, rounds: int) -> dict:
    """The pair's cost model (verify.py's own measurement), taken `rounds` times on a quiet machine: the median
    of each figure, so that one measurement caught by a change in the machine's speed does not pick the rules."""
    from statistics import median

    from skipdecode.engine import Scheduled
    from skipdecode.speculative.verify import _MEASURED

    taken = []
    for _ in range(rounds):
        _MEASURED.clear()
        taken.append(run._costs(Scheduled(schedule)).to_dict())
    return {name: round(median(t[name] for t in taken), 4) for name in ("draft", "extra", "step_ms")} | {"taken": taken}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--e2e", type=int, default=32, help="E2E devset MRs (distinct, file order)")
    p.add_argument("--general", type=int, default=16, help="general validation prompts after the first 64")
    p.add_argument("--speedup", type=float, default=3.0)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--records", default=None, help="a JSON file of records to reuse (written when missing)")
    p.add_argument("--out", default=None)
    p.add_argument("--cost-rounds", type=int, default=5, help="measurements of the costs (the median is used)")
    args = p.parse_args(argv)

    import torch

    from skipdecode.speculative.drafting import Costs
    from skipdecode.engine import Engine, Scheduled
    from skipdecode.evaluation.data import eval_items
    from skipdecode.evaluation.general import VALIDATION_COUNT, validation_prompts
    from skipdecode.speculative.verify import for_prompt

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    runs = {kind: for_prompt(None, args.speedup, task=kind)[:2] for kind in ("e2e", "general")}
    if args.records and os.path.exists(args.records):
        records = json.load(open(args.records))["records"]
    else:
        tokenizer = Engine.load().tokenizer
        prompts = {"e2e": list(dict.fromkeys(i.prompt for i in eval_items(split="dev")))[:args.e2e],
                   "general": validation_prompts(tokenizer, VALIDATION_COUNT + args.general)[VALIDATION_COUNT:]}
        records = {kind: [record(*runs[kind], prompt, args.new_tokens) for prompt in prompts[kind]]
                   for kind in prompts}
        if args.records:
            json.dump({"records": records}, open(args.records, "w"))
    measured = {kind: measure(run, schedule, args.cost_rounds) for kind, (run, schedule) in runs.items()}
    costs = {kind: Costs(draft=m["draft"], extra=m["extra"], fixed=True) for kind, m in measured.items()}
    eos = set(runs["e2e"][0].eos_ids)
    rows = []
    for k, threshold, lookup, window in itertools.product((4, 6, 8), (0.0, 0.3, 0.5, 0.7, 0.9),
                                                          (None, (1, 1), (2, 1), (2, 2), (3, 2), (4, 3)), (1, 2, 3, 4)):
        row = {"k": k, "threshold": threshold, "lookup": lookup, "window": window}
        for kind, recs in records.items():
            spent = tokens = kept = 0
            state = None  # the prompts in turn, each going on from the last one's pacing, as verify.py does
            for r in recs:
                cost, n, accepted, state = replay(r, eos, k, threshold, lookup, costs[kind], window, state)
                spent, tokens, kept = spent + cost, tokens + n, kept + accepted
            row[kind] = round(tokens / spent, 4)  # decode speed against full decoding's, in steps
        row["geomean"] = round((row["e2e"] * row["general"]) ** 0.5, 4)
        rows.append(row)
    rows.sort(key=lambda r: -r["geomean"])
    for row in rows[:12]:
        print(json.dumps(row))
    # the rule: among the settings within 1% of the best, the lowest k, the shortest n-grams, the shortest
    # window, the highest threshold
    close = [r for r in rows if r["geomean"] >= 0.99 * rows[0]["geomean"]]
    chosen = min(close, key=lambda r: (r["k"], r["lookup"][0] if r["lookup"] else 0,
                                       r["lookup"][1] if r["lookup"] else 0, r["window"], -r["threshold"]))
    print(f"{len(close)} settings within 1% of the best; chosen: {json.dumps(chosen)}")
    if args.out:
        json.dump({"command": " ".join(["python", *sys.argv]), "costs": measured, "chosen": chosen, "rows": rows},
                  open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
