"""The 4-bit products alone, one step's worth (30 layers of SmolLM2-135M's four fused matrices, random Q4_1
blocks, 66 MB: most of it from DRAM each step, as in decoding), on PyTorch's int4 kernel (bfloat16 inputs)
and on skipdecode/q8.c (int8 inputs), in turns in one process. Cited by docs/speed.md ("The int8 kernel and
row-exact attention").

    python experiments/q8_products.py --rows 1     # batch 1
    python experiments/q8_products.py --rows 16    # a batch of 16
"""

import argparse
import platform
import time

import torch

from skipdecode import q4, q8

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, out, gate+up, down


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    layers = []
    for _ in range(30):
        for n, k in SHAPES:
            blocks = q4.quantize(torch.randn(n, k))
            blocks.d, blocks.m = blocks.d.half().float(), blocks.m.half().float()  # the file's float16 scales
            layers.append((q4.Int4Linear.of(blocks), q8.Q8Linear.of(blocks), k))
    x = {k: torch.randn(args.rows, k) for k in (576, 1536)}
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, {args.rows} row(s), "
          f"q8 kernel: {q8.library().isa}")
    for _ in range(args.rounds):
        times = {}
        for i, name in ((0, "PyTorch int4 (bf16)"), (1, "q8.c (int8)")):
            for product in layers:
                product[i](x[product[2]])
            started = time.perf_counter()
            for _ in range(10):
                for product in layers:
                    product[i](x[product[2]])
            times[name] = (time.perf_counter() - started) / 10 * 1000
        first, second = times.values()
        print("  ".join(f"{name} {ms:.2f} ms a step" for name, ms in times.items()), f"ratio {first / second:.2f}")


if __name__ == "__main__":
    main()
