"""The 4-bit products alone, one step's worth (30 layers of SmolLM2-135M's four fused matrices, random Q4_1
blocks, 66 MB: most of it from DRAM each step, as in decoding), on PyTorch's int4 kernel (bfloat16 inputs)
and on skipdecode/kernels/w4a8.c (int8 inputs), in turns in one process. Cited by docs/research/cpu-4bit-kernels.md
("The int8 kernel and row-exact attention") and docs/research/native-step.md.

    python experiments/q8_products.py --rows 1,4,16,64   # batch 1, 4, 16 and a prompt's 64 rows
    python experiments/q8_products.py --rows 1,5,16,64 --tile 8   # w4a8.c against its build with 8-row tiles
    python experiments/q8_products.py --rows 16 --rounds 12 --define Q8_INTEGER_ONLY   # no float work per block
    python experiments/q8_products.py --engine           # a real 64-token generation: its products' and head's share
"""

import argparse
import os
import platform
import time

import torch

from skipdecode.kernels import q4, w4a8

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, out, gate+up, down


def engine_split(rounds: int) -> None:
    """Full depth, batch 1, on the default engine: wall time per token, and the part spent inside the
    products (the head's screen included) and inside the head (screen, top-64, exact rescoring)."""
    from skipdecode.engine import Engine

    engine = Engine.load()
    engine.decoder.fused = None  # the products called one by one from PyTorch's glue (experiments/native_step.py
    spent = {"products": 0.0, "head": 0.0}  # splits the fused step)

    def timed(kind, call):
        def wrapper(self, x):
            started = time.perf_counter()
            out = call(self, x)
            spent[kind] += time.perf_counter() - started
            return out
        return wrapper

    product = w4a8.W4A8Linear if isinstance(engine.decoder.lm_head.screen, w4a8.W4A8Linear) else q4.Int4Linear
    product.__call__ = timed("products", product.__call__)
    q4.RescoredHead.__call__ = timed("head", q4.RescoredHead.__call__)
    prompt = ["Write a short poem about the sea and the sky."]
    engine.generate(prompt, max_new_tokens=8)
    print(engine.weights_label)
    for _ in range(rounds):
        spent.update(products=0.0, head=0.0)
        started = time.perf_counter()
        engine.generate(prompt, max_new_tokens=64, stop_at_eos=False)
        total = time.perf_counter() - started
        print(f"{total / 64 * 1000:.2f} ms a token: products {spent['products'] / 64 * 1000:.2f} ms, "
              f"head {spent['head'] / 64 * 1000:.2f} ms (prefill included)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1", help="input rows, comma-separated (each timed in turn)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--engine", action="store_true", help="time a real generation instead")
    parser.add_argument("--tile", type=int, default=None,
                        help="instead of PyTorch's kernel, w4a8.c built with tiles of this many input rows (-DTILE)")
    parser.add_argument("--define", default=None,
                        help="instead of PyTorch's kernel, w4a8.c built with -D this (Q8_INTEGER_ONLY: the integer "
                             "sums without any float work per block, wrong values: a bound on what the block "
                             "scaling costs)")
    args = parser.parse_args()
    if args.engine:
        return engine_split(args.rounds)
    label = "PyTorch int4 (bf16)"
    other = q4.Int4Linear.of
    if args.tile or args.define:
        from skipdecode.kernels import native

        flags = ((f"-DTILE={args.tile}",) if args.tile else ()) + ((f"-D{args.define}",) if args.define else ())
        built = native.Library(extra=flags)
        if built.lib is None:
            raise SystemExit(built.reason)
        label = "w4a8.c, " + ", ".join(([f"{args.tile}-row tiles"] if args.tile else []) + ([args.define] if args.define else []))
        other = lambda blocks: w4a8.W4A8Linear(w4a8.layout(blocks), *blocks.codes.shape, lib=built.lib)  # noqa: E731
    torch.manual_seed(0)
    layers = []
    for _ in range(30):
        for n, k in SHAPES:
            blocks = q4.quantize(torch.randn(n, k))
            blocks.d, blocks.m = blocks.d.half().float(), blocks.m.half().float()  # the file's float16 scales
            layers.append((other(blocks), w4a8.W4A8Linear.of(blocks), k))
    counts = [int(r) for r in args.rows.split(",")]
    inputs = {rows: {k: torch.randn(rows, k) for k in (576, 1536)} for rows in counts}
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, q8 kernel: "
          f"{w4a8.library().isa}; load average {os.getloadavg()}")
    for round_ in range(args.rounds):
        for rows in counts:
            x, times = inputs[rows], {}
            for i, name in ((0, label), (1, "w4a8.c (int8)")):
                for product in layers:
                    product[i](x[product[2]])
                started = time.perf_counter()
                for _ in range(10):
                    for product in layers:
                        product[i](x[product[2]])
                times[name] = (time.perf_counter() - started) / 10 * 1000
            first, second = times.values()
            print(f"round {round_ + 1}, {rows} row(s): "
                  + "  ".join(f"{name} {ms:.2f} ms a step" for name, ms in times.items()), f"ratio {first / second:.2f}")


if __name__ == "__main__":
    main()
