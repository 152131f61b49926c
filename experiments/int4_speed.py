"""The 4-bit GGUF path (skipdecode/kernels/q4.py) against the float32 path, in one process, on the bench's workload.

    python experiments/int4_speed.py [--batch-sizes 1,16] [--speedups 1,2,3,5] [--repeats 3] [--kernels]
                                 [--float32-attention] [--compile]

E2E test MRs, 64 new tokens a row (EOS does not stop a run), the bench's SkipDecode schedules. Engines are
timed in turns (round r times every engine before round r + 1) so that both see the same machine load;
each figure is the median over the rounds of ms per decode step (prefill excluded). `--kernels` first
times one layer's seven products and the LM head in each format the head table of
docs/research/cpu-4bit-kernels.md lists, at batch 1 and 16.
The ratios are what to read: this machine is shared.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics

import torch

from skipdecode.kernels import q4
from skipdecode.evaluation.data import E2E_TEST
from skipdecode.evaluation.data import read_items, resolve
from skipdecode.engine import Engine
from skipdecode.schedule import for_speedup
from step_time import run_times  # experiments/, beside this one


def step_ms(engine, prompts, speedup, new_tokens) -> float:
    schedule = for_speedup(speedup, engine.num_layers)
    trace = engine.generate(prompts, schedule, max_new_tokens=new_tokens, stop_at_eos=False).trace
    return statistics.median(s.ms for s in trace.steps)


def best_ms(fn, runs=30) -> float:
    return min(run_times(fn, runs)) * 1e3


def kernels(int4: Engine, f32: Engine) -> None:
    """One layer's products (layer 0) and the head in each format, at batch 1 and 16."""
    block, dense = int4.decoder.blocks[0], f32.decoder.blocks[0]
    head_rows = f32.decoder.lm_head.weight
    f32_inputs = [q4.Int4Linear(lin.packed, lin.scales_zeros.float(), lin.in_features, torch.float32)
                  for lin in (block.qkv, block.out, block.up, block.down)]
    w8 = head_rows.abs().amax(1) / 127
    q8 = (head_rows / w8[:, None]).round().to(torch.int8)
    bf_head = torch.ops.mkldnn._reorder_linear_weight(head_rows.bfloat16(), 16)
    for batch in (1, 16):
        xs = {k: torch.randn(batch, k) for k in (576, 1536)}
        layer = {
            "float32 (oneDNN packed)": [dense.qkv, dense.out, dense.up, dense.down],
            "int4, bfloat16 inputs": [block.qkv, block.out, block.up, block.down],
            "int4, float32 inputs": f32_inputs,
        }
        for name, linears in layer.items():
            ms = best_ms(lambda: [lin(xs[lin.in_features if hasattr(lin, "in_features") else lin.weight.shape[1]])
                                  for lin in linears], runs=5 if "float32 inputs" in name else 30)
            print(f"| layer 0's seven products | {name} | batch {batch} | {ms:.3f} ms |")
        x = xs[576]
        heads = {
            "float32 (oneDNN packed)": lambda: f32.decoder.lm_head(x),
            "bfloat16 (oneDNN packed)": lambda: torch.ops.mkldnn._linear_pointwise(x.bfloat16(), bf_head, None,
                                                                                    "none", [], ""),
            "int8 per row (_weight_int8pack_mm, bfloat16 inputs)":
                lambda: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), q8, w8.bfloat16()),
            "int4 alone (screen)": lambda: int4.decoder.lm_head.screen(x),
            f"int4 screen + float32 top-{q4.RESCORE} (the default)": lambda: int4.decoder.lm_head(x),
        }
        for name, fn in heads.items():
            print(f"| LM head | {name} | batch {batch} | {best_ms(fn, 10):.3f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--speedups", default="1,2,3,5")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument("--compile", action="store_true", help="also time the int4 path under torch.compile")
    parser.add_argument("--float32-attention", action="store_true", help="also time the int4 path with float32 "
                                                                         "attention (what float64 costs)")
    args = parser.parse_args()
    items = read_items(resolve(None, E2E_TEST))
    engines = {"float32": Engine.load(dtype="float32"), "int4": Engine.load(dtype=q4.INT4)}
    if args.compile:  # torch.compile of the layer math, on the same packed weights (Decoder.compile until
        engines["int4, compiled"] = Engine.load(dtype=q4.INT4)  # 2026-12-02; it never paid on a CPU)
        dec = engines["int4, compiled"].decoder
        dec._layer = torch.compile(dec._layer, dynamic=True)
    if args.float32_attention:  # the same packed weights, attention in float32 (not batch-invariant): its cost
        engines["int4, float32 attention"] = Engine.load(dtype=q4.INT4)
        engines["int4, float32 attention"].decoder.attention_dtype = None
    print(f"# {platform.processor() or 'cpu'}: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.2f}")
    if args.kernels:
        kernels(engines["int4"], engines["float32"])
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    speedups = [float(s) for s in args.speedups.split(",")]
    times = {}
    for _ in range(args.repeats + 1):  # round 0 warms up
        for batch in batch_sizes:
            prompts = [item.prompt for item in items[:batch]]
            for speedup in speedups:
                for name, engine in engines.items():
                    times.setdefault((batch, speedup, name), []).append(step_ms(engine, prompts, speedup,
                                                                               args.new_tokens))
    other = [n for n in engines if n not in ("float32", "int4")]
    print("| batch | speedup | float32 ms/step | int4 ms/step | int4 vs float32 | int4 full depth / this |"
          + "".join(f" {n} ms/step |" for n in other))
    for batch in batch_sizes:
        full = statistics.median(times[(batch, 1.0, "int4")][1:])
        for speedup in speedups:
            a, b, *c = (statistics.median(times[(batch, speedup, n)][1:]) for n in ("float32", "int4", *other))
            print(f"| {batch} | {speedup:g}x | {a:.2f} | {b:.2f} | {a / b:.2f}x | {full / b:.2f}x |"
                  + "".join(f" {x:.2f} |" for x in c))
    print(f"# load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
