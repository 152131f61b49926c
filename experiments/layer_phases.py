"""Where the native call of a decode step goes, phase by phase: layer.c built with -DLAYER_TIMES (a timer after
each phase of every layer, behind a barrier: every thread done) runs full-depth decode steps at batch 1 and at
batch 16 in turns, and each phase's wall time per step is summed over the 30 layers. The phases: a product's
input (its norm or SwiGLU, the int8 quantization), the product itself (with its residual add), and the RoPE,
cache write and attention of the query/key/value. Cited by docs/research/native-step.md.

    python experiments/layer_phases.py --rounds 3
"""

from __future__ import annotations

import argparse
import ctypes
import statistics

import torch

PHASES = ("qkv input", "qkv product", "rope, cache, attention", "out input", "out product", "up input", "up product",
          "down input", "down product")
PROMPT = "name[The Cricketers], eatType[coffee shop], food[Chinese], near[Express by Holiday Inn]"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--batches", default="1,16")
    args = p.parse_args(argv)

    from skipdecode.kernels import native
    from skipdecode.engine import Engine
    from skipdecode.evaluation.machine import machine

    timed = native.Library(extra=("-DLAYER_TIMES",))
    if timed.lib is None:
        raise SystemExit(timed.reason)
    timed.lib.layer_times.argtypes, timed.lib.layer_times.restype = [ctypes.c_void_p], ctypes.c_int
    engine = Engine.load()
    dec = engine.decoder
    if dec.fused is None:
        raise SystemExit("the decoder does not run on the C kernels here")
    dec.fused.lib = timed.lib
    sums = (ctypes.c_double * len(PHASES))()
    steps = {"n": 0, "ms": [0.0] * len(PHASES)}
    forward = dec.fused.forward

    def counted(which, x, *rest):
        timed.lib.layer_times(sums)  # what came before this call: dropped
        out = forward(which, x, *rest)
        timed.lib.layer_times(sums)
        if x.shape[1] == 1:  # a decode step (a prefill is left out)
            steps["n"] += 1
            steps["ms"] = [a + b for a, b in zip(steps["ms"], sums)]
        return out

    dec.fused.forward = counted
    batches = [int(b) for b in args.batches.split(",")]
    info = machine()
    print(f"{info['cpu']}, {torch.get_num_threads()} threads; load average {info['load_average']}")
    engine.generate([PROMPT], None, 4)
    table = {b: [] for b in batches}
    for _ in range(args.rounds):
        for b in batches:
            steps.update(n=0, ms=[0.0] * len(PHASES))
            engine.generate([PROMPT] * b, None, args.tokens, stop_at_eos=False)
            table[b].append([ms / steps["n"] for ms in steps["ms"]])
    print(f"{'phase (ms a step, median of rounds)':36s}" + "".join(f"{'batch ' + str(b):>12s}" for b in batches)
          + (f"{'ratio':>8s}" if len(batches) == 2 else ""))
    for i, name in enumerate(PHASES + ("all phases",)):
        cells = [statistics.median(r[i] if i < len(PHASES) else sum(r) for r in table[b]) for b in batches]
        ratio = f"{cells[1] / cells[0]:8.2f}" if len(cells) == 2 and cells[0] else ""
        print(f"{name:36s}" + "".join(f"{c:12.3f}" for c in cells) + ratio)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
