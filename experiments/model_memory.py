"""What a loaded model costs the process: resident memory after the base engine and after each merged
adapter of assets/adapters, freed memory handed back first (gc, malloc_trim) so each step shows what stays.

    python experiments/model_memory.py        # the default model, float32
    python experiments/model_memory.py int4   # its GGUF's 4-bit blocks: one packed base, every adapter unmerged
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from scripts.loadtest import rss_mb  # noqa: E402


def rss_gb() -> float:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mb(os.getpid()) / 1e3


def main() -> int:
    from skipdecode.adapters.lora import available_adapters
    from skipdecode.engine import Engine

    dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
    start = rss_gb()
    engines = [Engine.load(dtype=dtype)]
    engines[0].generate(["Hello"], max_new_tokens=4)  # what decoding touches (the embedding's rows, the cache)
    last = rss_gb()
    print(f"process before any model {start:.2f} GB; base engine +{last - start:.2f} GB")
    for info in available_adapters():
        engines.append(Engine.load(adapter=info, dtype=dtype))
        engines[-1].generate(["Hello"], max_new_tokens=4)
        now = rss_gb()
        print(f"+ {info.name}: +{now - last:.2f} GB")
        last = now
    added = (last - start) / len(engines)
    print(f"mean per engine: {added:.2f} GB over {len(engines)} engines; all loaded together: {last:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
