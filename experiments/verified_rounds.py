"""Where verified decoding's time goes against full decoding's, from its own records: each prompt decoded by
full decoding and by the verified pair in turns (the pair a comparison's "auto" runs), and the verified time
split into its prefill, its plain rounds, its drafting rounds and the loop's own work between rounds
(`Verification.rounds`, `trace.prefill_ms`), beside full decoding's prefill and steps. Cited by
docs/research/verified-decoding.md.

    python experiments/verified_rounds.py --kind general --prompts 24
"""

from __future__ import annotations

import argparse
import os
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=("general", "e2e"), default="general")
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--new-tokens", type=int, default=64)
    args = p.parse_args(argv)

    from skipdecode.evaluation.verified import prompt_set
    from skipdecode.speculative.verify import for_prompt

    run, schedule = for_prompt(None, 3.0, task=args.kind)[:2]
    prompts = prompt_set(args.kind, run.tokenizer, args.prompts)
    full = run.verifier
    full.generate([prompts[0]], None, args.new_tokens), run.generate([prompts[0]], schedule, args.new_tokens)
    t = dict.fromkeys(("full", "full_prefill", "full_steps", "verified", "prefill", "plain", "drafting", "rest"), 0.0)
    n = dict.fromkeys(("steps", "plain", "drafting", "drafted_tokens"), 0)
    print(f"load average {os.getloadavg()}")
    for prompt in prompts:
        started = time.perf_counter()
        g = full.generate([prompt], None, args.new_tokens)
        t["full"] += (time.perf_counter() - started) * 1000.0
        t["full_prefill"] += g.trace.prefill_ms
        t["full_steps"] += sum(s.ms for s in g.trace.steps)
        n["steps"] += len(g.trace.steps)
        started = time.perf_counter()
        v = run.generate([prompt], schedule, args.new_tokens).verification
        t["verified"] += (time.perf_counter() - started) * 1000.0
        t["prefill"] += v.prefill_ms
        for r in v.rounds:
            kind = "drafting" if r.drafted else "plain"
            t[kind] += r.draft_ms + r.verify_ms
            n[kind] += 1
            n["drafted_tokens"] += r.emitted if r.drafted else 0
    t["rest"] = t["verified"] - t["prefill"] - t["plain"] - t["drafting"]
    step = t["full_steps"] / n["steps"]
    print(f"full decoding over verified, end to end: {t['full'] / t['verified']:.3f}")
    print(f"prefill ms: full {t['full_prefill']:.0f}, verified {t['prefill']:.0f}")
    plain = (f"a plain round {t['plain'] / n['plain']:.3f} ms ({t['plain'] / n['plain'] / step:.3f}x, "
             f"{n['plain']} rounds)" if n["plain"] else "no plain rounds")
    print(f"a full-depth step {step:.3f} ms; {plain}")
    print(f"drafting rounds: {n['drafting']}, {t['drafting'] / n['drafted_tokens'] / step:.3f}x a step per token "
          f"they yield; their excess over full steps {(t['drafting'] - n['drafted_tokens'] * step) / t['full']:.1%} "
          f"of full decoding's time")
    print(f"the cost model at the end, in full-depth steps (drafting.Costs): {v.costs}")
    print(f"the loop between rounds: verified {t['rest']:.0f} ms, full {t['full'] - t['full_prefill'] - t['full_steps']:.0f} ms "
          f"({(t['rest'] - (t['full'] - t['full_prefill'] - t['full_steps'])) / t['full']:.1%} of full decoding's time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
