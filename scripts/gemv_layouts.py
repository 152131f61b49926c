"""How fast a batch-1 product streams its weights, by weight layout, against torch.sum on this CPU.

    python scripts/gemv_layouts.py            # about a minute

The engine's decode step at batch 1 is 150 matrix-vector products (5 a layer) and the LM head; in float32
they are nearly all of its time. This prints, for 30 layers' gate/up matrices (212 MB, far beyond the
caches), the read bandwidth of: the engine's oneDNN-packed product, plain F.linear on the [out, in]
weight, x @ W^T stored [in, out], the same split in two halves run as one torch.bmm (one half per thread),
and torch.sum over as many bytes (what `skipdecode bench` calls the floor), at 1, 2 and 16 rows.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from skipdecode.transformer import Linear

LAYERS, OUT, IN = 30, 3072, 576


def best_ms(fn, reps: int = 5, rounds: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - started) / reps)
    return best * 1000


def main() -> None:
    torch.manual_seed(0)
    weights = [torch.randn(OUT, IN) for _ in range(LAYERS)]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    packed = [Linear(w, None, pack=True) for w in weights]
    transposed = [w.t().contiguous() for w in weights]
    halves = [w.t().contiguous().view(IN, 2, OUT // 2).transpose(0, 1).contiguous() for w in weights]
    probe = torch.ones(nbytes // 4)
    print(f"{LAYERS} x [{OUT}, {IN}] float32 = {nbytes / 1e6:.0f} MB; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"torch.sum: {nbytes / best_ms(lambda: probe.sum()) / 1e6:.1f} GB/s")
    for rows in (1, 2, 16):
        x = torch.randn(rows, IN)
        pair = x.expand(2, rows, IN)
        cases = {
            "packed (engine)": lambda: [p(x) for p in packed],
            "F.linear [out, in]": lambda: [F.linear(x, w) for w in weights],
            "x @ W^T [in, out]": lambda: [x @ t for t in transposed],
            "bmm, two halves [2, in, out/2]": lambda: [torch.bmm(pair, h) for h in halves],
        }
        for name, fn in cases.items():
            ms = best_ms(fn)
            print(f"rows {rows:2d}  {name:32s} {ms:7.2f} ms  {nbytes / ms / 1e6:5.1f} GB/s")


if __name__ == "__main__":
    main()
