"""What merging an adapter into the bundled float32 model costs, with the weights first copied off the
checkpoint file (as adapters.merge_adapter does) and written in place (pages of the file mapped copy-on-write),
in turns in one process, and whether both give the same weights.

    python experiments/merge_cost.py --adapter e2e-1x --rounds 3
"""

import argparse
import time

import torch

from skipdecode import models
from skipdecode.adapters import lora as adapters
from skipdecode.evaluation.machine import machine


def merged(info, own: bool):
    model = models.load_model(device="cpu", dtype="float32").model
    keep = adapters._own
    adapters._own = keep if own else (lambda model: None)
    try:
        started = time.perf_counter()
        model = adapters.merge_adapter(model, info, models.DEFAULT_MODEL)
        return model, time.perf_counter() - started
    finally:
        adapters._own = keep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", default="e2e-1x")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    where = machine()
    print(f"{where['cpu']}, {where['cores']} cores, {where['torch_threads']} torch threads; "
          f"load average {where['load_average']}")
    info = adapters.find_adapter(args.adapter)
    for r in range(args.rounds):
        copied, a = merged(info, own=True)
        in_place, b = merged(info, own=False)
        same = all(torch.equal(x, y) for x, y in zip(copied.state_dict().values(), in_place.state_dict().values()))
        print(f"round {r + 1}: copied first {a:.2f} s, in place {b:.2f} s, {b / a:.1f}x; same weights: {same}",
              flush=True)


if __name__ == "__main__":
    main()
