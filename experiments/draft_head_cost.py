"""What a draft step costs, in full-depth steps of one position, with the draft's LM head over the whole
vocabulary and over shortlists of the E2E training split's most frequent tokens (skipdecode/speculative/shortlist.py).
The figures are verified decoding's own cost model (skipdecode/speculative/drafting.py Costs.measure: the fastest of a
few timings of a full-depth pass and of a draft step), taken in turns, `--rounds` times.

    python experiments/draft_head_cost.py --sizes 0,1024,2048,4096 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="0,1024,2048,4096", help="shortlist sizes (0: the whole vocabulary)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--speedup", type=float, default=3.0)
    args = p.parse_args(argv)

    from skipdecode.engine import Scheduled
    from skipdecode.evaluation.machine import machine
    from skipdecode.speculative.shortlist import count
    from skipdecode.training.shortlists import e2e_targets
    from skipdecode.speculative.verify import Verified, _MEASURED, for_prompt

    run, schedule = for_prompt(None, args.speedup, task="e2e")[:2]
    sizes = [int(s) for s in args.sizes.split(",")]
    ranked = count(e2e_targets(run.tokenizer)[0], max(sizes))
    out = {size: [] for size in sizes}
    for r in range(args.rounds):
        for size in sizes:
            _MEASURED.clear()
            pair = Verified(run.draft, run.verifier, run.k, shortlist=ranked[:size] if size else None)
            costs = pair._costs(Scheduled(schedule))
            out[size].append(round(costs.draft, 4))
            print(f"round {r + 1}: shortlist {size or 'whole vocabulary'} ({len(ranked[:size]) if size else 'all'}"
                  f" tokens): draft step {costs.draft:.3f} of a full step ({costs.step_ms:.2f} ms)", flush=True)
    result = {"command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])), "machine": machine(),
              "load_average_after": list(os.getloadavg()), "draft_step_in_full_steps": out}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
