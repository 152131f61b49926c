"""A first start's dequantizing of the bundled GGUF (skipdecode.models._dequantize), with the file parsed once
(as served) and as transformers does it alone (three parses, a tensor name table per module), in turns in
one process, each into a fresh folder: seconds each, and whether both wrote the same bytes.

    python experiments/first_start.py --rounds 2
"""

import argparse
import contextlib
import hashlib
import sys
import tempfile
import time
from pathlib import Path

from skipdecode import models
from skipdecode.evaluation.machine import machine


def digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    ways = {"parsed once": models._gguf_parsed_once, "as transformers does": contextlib.nullcontext}
    where = machine()
    print(f"{where['cpu']}, {where['cores']} cores; load average {where['load_average']}")
    digests = set()
    for r in range(args.rounds):
        for name, way in ways.items():
            models._gguf_parsed_once = way
            with tempfile.TemporaryDirectory() as tmp:
                started = time.perf_counter()
                models._dequantize(models.default_gguf(), Path(tmp) / "model")
                seconds = time.perf_counter() - started
                digests.add(digest(Path(tmp) / "model"))
            print(f"round {r + 1}: {name}: {seconds:.1f} s", flush=True)
    print("the same bytes both ways" if len(digests) == 1 else f"DIFFERENT bytes: {sorted(digests)}")
    sys.exit(0 if len(digests) == 1 else 1)


if __name__ == "__main__":
    main()
