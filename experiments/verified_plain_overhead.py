"""What the verified loop itself costs: verified decoding forced to run every step plain (drafts priced out of
reach by fixed costs, no copies from the prompt) against full decoding, on the general validation prompts,
timed in turns. Prints full decoding's time over the verified loop's, once per pass (1.0: no overhead).

    python experiments/verified_plain_overhead.py --prompts 16 --passes 3
"""

from __future__ import annotations

import argparse
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--passes", type=int, default=3)
    args = p.parse_args(argv)

    from skipdecode.speculative.drafting import Costs
    from skipdecode.evaluation.verified import prompt_set
    from skipdecode.speculative.verify import Verified, for_prompt

    run, schedule = for_prompt(None, 3.0, task="general")[:2]
    prompts = prompt_set("general", run.tokenizer, args.prompts)
    full = run.verifier
    full.prefixes = None
    plain = Verified(run.draft, run.verifier, 4, prefixes=None, costs=Costs(draft=50.0, extra=50.0, fixed=True),
                     lookup=None)
    for _ in range(args.passes):
        full_s = plain_s = 0.0
        for prompt in prompts:
            started = time.perf_counter()
            want = full.generate([prompt], None, 64)
            full_s += time.perf_counter() - started
            started = time.perf_counter()
            got = plain.generate([prompt], schedule, 64)
            plain_s += time.perf_counter() - started
            assert got.token_ids == want.token_ids
        print(f"full / verified-all-plain {full_s / plain_s:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
