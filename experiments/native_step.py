"""Where a decode step goes on the C kernels: every layer of a position in one native call (skipdecode/kernels/layer.c)
against the same kernels called product by product from eager PyTorch glue, in turns in one process.

    python experiments/native_step.py                    # full depth, batch 1, 2 threads, 4 rounds
    python experiments/native_step.py --batch 16 --threads 1

For each round and each form: wall time per decode step (median over the 64 steps of one generation) and
CPU time per step (process time: what the threads ran, waits for a descheduled partner excluded, so it moves
less than wall time when other work shares the cores). For the fused form the step is split by timers around
its parts: the native call (inside ctypes), the Python that prepares it (Decoder.run_layers less the call),
the head (final norm, 4-bit screen, top-64, exact rescoring), and the rest of the engine's loop (embedding,
RoPE rows, the token choice, bookkeeping).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from skipdecode.engine import Engine
from skipdecode.evaluation.machine import machine

PROMPT = "name[The Cricketers], eatType[coffee shop], food[Chinese], near[Express by Holiday Inn]"


class Timed:
    """A callable, with the milliseconds of each call."""

    def __init__(self, call):
        self.call, self.ms = call, []

    def __call__(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self.call(*args, **kwargs)
        finally:
            self.ms.append((time.perf_counter() - started) * 1000)

    def last(self, calls: int) -> float:
        """Milliseconds of the last `calls` calls (a generation's decode steps come after its prefill)."""
        return sum(self.ms[-calls:]) if calls else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: as set)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine.load()
    dec = engine.decoder
    fused = dec.fused
    if fused is None:
        raise SystemExit(f"no fused layers on this host: {engine.weights_label}")
    where = machine()
    print(f"{where['cpu']}, {torch.get_num_threads()} threads, batch {args.batch}, {engine.weights_label}; "
          f"load average {where['load_average']}")
    prompts = [PROMPT] * args.batch
    native_call = Timed(fused.lib.layers_forward)
    fused.lib.layers_forward = native_call  # the ctypes function, timed
    run_layers, logits = Timed(dec.run_layers), Timed(dec.logits)
    dec.run_layers, dec.logits = run_layers, logits
    engine.generate(prompts, max_new_tokens=4)
    results = {"fused": [], "per-op": []}
    for _ in range(args.rounds):
        for form in results:
            dec.fused = fused if form == "fused" else None
            for t in (native_call, run_layers, logits):
                t.ms = []
            cpu = time.process_time()
            trace = engine.generate(prompts, max_new_tokens=args.tokens, stop_at_eos=False).trace
            cpu = time.process_time() - cpu
            steps = len(trace.steps)
            wall = statistics.median(s.ms for s in trace.steps)
            total = sum(s.ms for s in trace.steps)
            head_ms = logits.last(steps)  # the decode steps' heads (the prefill's comes first)
            split = ""
            if form == "fused":  # one run_layers and one native call a step, after the prefill's per-layer calls
                call_ms, layers_ms = native_call.last(steps), run_layers.last(steps)
                split = (f"  native call {call_ms / steps:.3f}, python around it {(layers_ms - call_ms) / steps:.3f}, "
                         f"head {head_ms / steps:.3f}, rest of the loop {(total - layers_ms - head_ms) / steps:.3f}")
            results[form].append(wall)
            print(f"{form:7s} {wall:7.3f} ms a step (wall, median), CPU {cpu * 1000 / (steps + 1):7.3f} ms a step"
                  + split)
    a, b = results["per-op"], results["fused"]
    ratios = [x / y for x, y in zip(a, b)]
    print(f"per-op / fused wall: {min(ratios):.2f}-{max(ratios):.2f} (worst-best of {len(ratios)} rounds)")


if __name__ == "__main__":
    main()
