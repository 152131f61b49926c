"""Acceptance of draft/verifier pairings in verified decoding (skipdecode/speculative/verify.py), on tuning prompts: the
E2E devset's first MRs and general validation prompts past the 64 the goals are measured on.

Each pairing is a draft adapter on a schedule (its trained one at a speedup, the warm-up layers optionally
changed) with the verifier of its kind (e2e-1x for E2E, the base model for general). Greedy, fixed k, no
stop rule: acceptance = accepted / drafted, tokens per verify pass. Run it with PYTHONPATH pointing at an
older checkout to measure that design (the two-cache loop) with the same prompts.

    python experiments/draft_pairings.py --e2e 32 --general 16 --pairs e2e-all@3 e2e-1x@3 general-3x@3 none@3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--e2e", type=int, default=32, help="E2E devset MRs (distinct, file order)")
    p.add_argument("--general", type=int, default=16, help="general validation prompts after the first 64")
    p.add_argument("--pairs", nargs="+", default=["e2e-all@3", "general-3x@3"],
                   help="DRAFT@SPEEDUP[w WARMUP]: a draft adapter (none: the base model) at a speedup")
    p.add_argument("--k", default="e2e=6,general=4", help="drafts a round per kind")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--out", default=None, help="a JSON file for the rows")
    args = p.parse_args(argv)

    import torch

    from skipdecode.adapters.lora import find_adapter, pick_adapter, trained_schedule
    from skipdecode.engine import Engine
    from skipdecode.evaluation.data import eval_items
    from skipdecode.evaluation.general import VALIDATION_COUNT, validation_prompts
    from skipdecode.speculative.drafting import Costs
    from skipdecode.speculative.verify import Verified

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    ks = dict(item.split("=") for item in args.k.split(","))
    base = Engine.load()
    dev = list(dict.fromkeys(item.prompt for item in eval_items(split="dev")))[:args.e2e]
    general = validation_prompts(base.tokenizer, VALIDATION_COUNT + args.general)[VALIDATION_COUNT:]
    verifiers = {}
    rows = []
    for spec in args.pairs:
        name, _, rest = spec.partition("@")
        speedup, _, warmup = rest.partition("w")
        info = None if name == "none" else find_adapter(name)
        kind = "general" if info is None or info.task == "general" else "e2e"
        if kind not in verifiers:
            verifiers[kind] = Engine.load(adapter=pick_adapter(1.0, task=kind)[0])
        draft = Engine.load(adapter=info)
        schedule = trained_schedule(info, float(speedup), draft.num_layers, warmup=int(warmup) if warmup else None)
        # fixed k, no stop rule: no confidence stop, no copies from the prompt, drafting that costs nothing (so
        # neither the cost cap nor the fallback ever stops it), no prefix cache
        run = Verified(draft, verifiers[kind], int(ks[kind]), threshold=0.0, lookup=None,
                       costs=Costs(draft=0.0, extra=0.0, fixed=True), prefixes=None)
        totals = {"drafted": 0, "accepted": 0, "passes": 0, "tokens": 0}
        started = time.perf_counter()
        for prompt in dev if kind == "e2e" else general:
            v = run.generate([prompt], schedule, args.new_tokens).verification
            totals["drafted"] += v.drafted
            totals["accepted"] += v.accepted
            totals["passes"] += v.passes
            totals["tokens"] += len(v.marks)
        row = {"pair": spec, "kind": kind, "k": int(ks[kind]), "layers": len(schedule.layers(0)),
               "prompts": len(dev if kind == "e2e" else general), **totals,
               "acceptance": round(totals["accepted"] / max(totals["drafted"], 1), 4),
               "tokens_per_pass": round((totals["tokens"] - len(dev if kind == "e2e" else general))
                                        / max(totals["passes"], 1), 3),
               "seconds": round(time.perf_counter() - started, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(["python", *sys.argv]), "tree": os.path.dirname(
                os.path.dirname(os.path.abspath(__import__("skipdecode").__file__))), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
