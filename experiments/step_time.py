"""Where a full-depth decode step's time goes at batch 1, on the default model, against the floor.

    python experiments/step_time.py [--out FILE]       # about a minute

A float32 step on a CPU reads every weight once (the floor: weight bytes / a measured read bandwidth) and
does some small work per layer. This times, on the real weights, each kind of matrix product (30 layers of
it, so the weights stream from memory as in decoding) in three layouts: the engine's oneDNN-packed one,
the weight stored [in, out] (`x @ W^T`) and plain `F.linear`; the LM head; one layer with its products
replaced by ready-made outputs (norms, RoPE, cache writes, attention, residuals: the per-layer overhead);
and a whole engine step. Best of 20 runs each, in one process; then the step's own products in its order
(layer by layer, then the head) with nothing between them, timed like the step (median of 30): what a
step cannot beat with these kernels.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from skipdecode.evaluation.machine import machine
from skipdecode.cache import KVCache
from skipdecode.engine import Engine
from skipdecode.transformer import Linear

KINDS = ("qkv", "out", "up", "down")
PROMPT = "name[The Cricketers], eatType[coffee shop], food[Chinese], near[Express by Holiday Inn]"


def run_times(fn, runs: int) -> list[float]:
    """Seconds of each of `runs` calls of fn, after one call not counted."""
    fn()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


def best_s(fn, runs: int = 20) -> float:
    return min(run_times(fn, runs))


def median_s(fn, runs: int = 30) -> float:
    return sorted(run_times(fn, runs))[runs // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args()
    lines = []

    def say(line=""):
        print(line)
        lines.append(line)

    engine = Engine.load(dtype="float32")  # the dequantized path: this script times its float32 matrices
    dec = engine.decoder
    linears = [getattr(b, k) for b in dec.blocks for k in KINDS] + [dec.lm_head]
    weight_bytes = sum(lin.weight.numel() * lin.weight.element_size() for lin in linears)
    where = machine()
    say(f"{engine.name} on {where['cpu']} [{' '.join(f for f in where['isa'] if f.startswith(('avx', 'amx')))}], "
        f"torch {where['torch']}, {where['torch_threads']} threads, {dec.dtype}, packed {dec.pack}, "
        f"load average {where['load_average'][0]}")
    with torch.inference_mode():
        probe = torch.ones(weight_bytes // 4)
        read = weight_bytes / best_s(lambda: probe.sum()) / 1e9
        probe = None  # free it before the products run
        floor_ms = weight_bytes / read / 1e6
        say(f"weights read per token: {weight_bytes / 1e6:.0f} MB; torch.sum reads {read:.1f} GB/s: "
            f"floor {floor_ms:.1f} ms")
        say()
        say("| product (30 layers) | shape | packed GB/s | x @ W^T GB/s | F.linear GB/s | packed ms |")
        say("|---|---|---|---|---|---|")
        products_ms = 0.0
        for kind in KINDS:
            layer = [getattr(b, kind) for b in dec.blocks]
            nbytes = sum(lin.weight.numel() * lin.weight.element_size() for lin in layer)
            x = torch.randn(1, 1, layer[0].weight.shape[1])
            transposed = [lin.weight.t().contiguous() for lin in layer]
            seconds = {
                "packed": best_s(lambda: [lin(x) for lin in layer]),
                "t": best_s(lambda: [x @ t for t in transposed]),
                "plain": best_s(lambda: [F.linear(x, lin.weight, lin.bias) for lin in layer]),
            }
            transposed = None
            products_ms += seconds["packed"] * 1000
            say(f"| {kind} | {list(layer[0].weight.shape)} | "
                + " | ".join(f"{nbytes / s / 1e9:.1f}" for s in seconds.values())
                + f" | {seconds['packed'] * 1000:.1f} |")
        x = torch.randn(1, dec.lm_head.weight.shape[1])
        head_s = best_s(lambda: dec.lm_head(x))
        head_bytes = dec.lm_head.weight.numel() * dec.lm_head.weight.element_size()
        say(f"| LM head | {list(dec.lm_head.weight.shape)} | {head_bytes / head_s / 1e9:.1f} | | | "
            f"{head_s * 1000:.1f} |")

        # one layer with its products answered from ready-made outputs: what the rest of a layer costs
        ready = {lin.weight.shape[0]: torch.randn(1, 1, lin.weight.shape[0]) * 0.01 for lin in linears}
        cache = KVCache(1, 1, dec.num_kv_heads, 256, dec.head_dim, dec.device, dec.dtype)
        position = torch.tensor([[128]])
        rope, h = dec.rope(position, limit=256), torch.randn(1, 1, dec.embed_tokens.shape[1])
        real_call = Linear.__call__
        Linear.__call__ = lambda self, x: ready[self.weight.shape[0]]
        try:
            rest_us = best_s(lambda: [dec.block(0, h, rope, None, *cache.claim(0, 128, 1), 128)
                                      for _ in range(100) if not cache.lengths.__setitem__(0, 128)]) * 1e4
        finally:
            Linear.__call__ = real_call
        say(f"| one layer without its products | | | | | {rest_us / 1000:.3f} ({rest_us:.0f} us) |")

        # the products alone, in a step's order (linears: layer by layer, then the head), timed as the step is
        inputs = {n: torch.randn(1, 1, n) for n in {lin.weight.shape[1] for lin in linears}}
        in_order_ms = median_s(lambda: [lin(inputs[lin.weight.shape[1]]) for lin in linears]) * 1000

        engine.generate([PROMPT], max_new_tokens=8, stop_at_eos=False)
        steps = []
        for _ in range(3):
            trace = engine.generate([PROMPT], max_new_tokens=48, stop_at_eos=False).trace
            steps += [s.ms for s in trace.steps]
        step_ms = sorted(steps)[len(steps) // 2]
    parts = products_ms + head_s * 1000 + dec.num_layers * rest_us / 1000
    say()
    say(f"products {products_ms:.1f} ms + LM head {head_s * 1000:.1f} ms + {dec.num_layers} x the rest of a "
        f"layer {dec.num_layers * rest_us / 1000:.1f} ms = {parts:.1f} ms; an engine step (median of 144, "
        f"48 new tokens x 3): {step_ms:.1f} ms")
    say(f"step / floor: {step_ms / floor_ms:.2f}; products and LM head alone / floor: "
        f"{(products_ms + head_s * 1000) / floor_ms:.2f}")
    say(f"the step's {len(linears)} products in its order, nothing between them (median of 30): {in_order_ms:.1f} ms, "
        f"{in_order_ms / floor_ms:.2f} x the floor; the step is {step_ms / in_order_ms:.2f} x that")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
