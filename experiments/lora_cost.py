"""What the served adapter's LoRA terms add to a decode step: full depth, batch 1, 64 tokens (prefill
included), the base model and e2e-1x (rank 16 on every matrix, unmerged) in turns in one process. Cited by
docs/research/native-step.md ("The LoRA terms").

    python experiments/lora_cost.py --rounds 3
    python experiments/lora_cost.py --rounds 3 --spans   # e2e-1x as served against e2e-1x summing every rank row

`--spans`: layer.c skips the rank rows of a fused matrix's b that are zero for a span of 64 outputs
(native.lora_spans); the second engine has every span set to all rows, the same bits the slow way.
"""

import argparse
import os
import time

from skipdecode.engine import Engine

PROMPT = "name[The Cricketers], eatType[coffee shop], food[Chinese], near[Express by Holiday Inn]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spans", action="store_true", help="compare with e2e-1x summing every rank row")
    args = parser.parse_args()
    engines = {"base": Engine.load(), "e2e-1x": Engine.load(adapter="e2e-1x")}
    if args.spans:
        engines = {"base": engines["e2e-1x"], "e2e-1x": every_rank_row(Engine.load(adapter="e2e-1x"))}
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
        first, second = ("e2e-1x", "e2e-1x, every rank row") if args.spans else ("base", "e2e-1x")
        print(f"round {round_ + 1}: {first} {ms['base']:.2f} ms a token, {second} {ms['e2e-1x']:.2f} "
              f"(+{ms['e2e-1x'] / ms['base'] - 1:.0%})", flush=True)


def every_rank_row(engine: Engine) -> Engine:
    """The engine with each LoRA span of its native layers set to every rank row (no row skipped)."""
    import torch

    dec, held = engine.decoder, []
    for layer in dec.fused.layers:
        for product in (layer.qkv, layer.out, layer.up, layer.down):
            if product.rank:
                held.append(torch.tensor([[0, product.rank]] * -(-product.n // 64), dtype=torch.int32))
                product.spans = held[-1].data_ptr()
    dec.fused.held += held
    return engine


if __name__ == "__main__":
    main()
