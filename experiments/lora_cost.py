"""What the served adapter's LoRA terms add to a decode step: full depth, batch 1, 64 tokens (prefill
included), the base model and e2e-1x (rank 16 on every matrix, unmerged) in turns in one process. Cited by
docs/research/native-step.md ("The LoRA terms").

    python experiments/lora_cost.py --rounds 3
"""

import argparse
import os
import time

from skipdecode.engine import Engine

PROMPT = "name[The Cricketers], eatType[coffee shop], food[Chinese], near[Express by Holiday Inn]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engines = {"base": Engine.load(), "e2e-1x": Engine.load(adapter="e2e-1x")}
    for engine in engines.values():
        engine.prefixes = None  # every prefill cold, alike
        engine.generate([PROMPT], max_new_tokens=8)
    print(f"load average {os.getloadavg()}")
    for round_ in range(args.rounds):
        ms = {}
        for name, engine in engines.items():
            started = time.perf_counter()
            engine.generate([PROMPT], max_new_tokens=64, stop_at_eos=False)
            ms[name] = (time.perf_counter() - started) / 64 * 1000
        print(f"round {round_ + 1}: base {ms['base']:.2f} ms a token, e2e-1x {ms['e2e-1x']:.2f} "
              f"(+{ms['e2e-1x'] / ms['base'] - 1:.0%})", flush=True)


if __name__ == "__main__":
    main()
