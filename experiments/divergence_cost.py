"""What the API's `divergence` costs a comparison: the wall time of whole comparisons (both decodings,
scoring, the divergence pass) and of the divergence pass alone, through the Studio the app serves.

    python experiments/divergence_cost.py                 # the shipped adapters ("auto"), 3x, 48 new tokens
    python experiments/divergence_cost.py --runs 5 --speedup 2

Prints one line per comparison and the median share.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

PROMPTS = [
    "Explain in one paragraph why the sky is blue.",
    "Write one sentence describing this restaurant, using every fact: name[The Cricketers], eatType[coffee shop], "
    "customer rating[high], familyFriendly[yes], near[Express by Holiday Inn]",
    "List three tips for staying focused while studying.",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--speedup", type=float, default=3.0)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    os.environ.setdefault("SKIPDECODE_BATCH_WINDOW_S", "0")
    from app.replay import hardware
    from app.choices import AUTO
    from app.settings import Settings
    from app.studio import Studio

    studio = Studio()
    studio.warm_up()
    model = AUTO if AUTO in studio.labels else studio.labels[0]
    settings = Settings(speedup=args.speedup, max_new_tokens=args.tokens)
    for prompt in PROMPTS:  # loads the engines each kind of prompt runs: untimed
        for _ in studio.compare(prompt, settings, model):
            pass
    shares = []
    for run in range(args.runs):
        started = time.perf_counter()
        for comparison in studio.compare(PROMPTS[run % len(PROMPTS)], settings, model):
            pass
        wall = (time.perf_counter() - started) * 1000.0
        share = comparison.divergence_ms / wall
        shares.append(share)
        print(f"{len(comparison.skip.token_ids):3d} tokens  comparison {wall:7.0f} ms  divergence "
              f"{comparison.divergence_ms:6.1f} ms  {100 * share:4.1f}%  agreement {comparison.divergence.agreement}")
    machine = hardware(studio.engine().decoder.device, "")
    print(f"median divergence share of a comparison's wall time: {100 * statistics.median(shares):.1f}% "
          f"(range {100 * min(shares):.1f}-{100 * max(shares):.1f}%; {len(shares)} comparisons, {args.speedup:g}x, "
          f"{args.tokens} new tokens, {machine.get('gpu') or machine['cpu']}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
