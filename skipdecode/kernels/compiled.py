"""The CPU decode step as compiled graphs: one torch.compile'd layer that every layer of the model runs.

Eager PyTorch spends a 4-bit decode step mostly on calling some 45 small operators a layer
(docs/research/cpu-4bit-kernels.md, "What is left after the products"). Inductor fuses them into a few C++
loops around the int4 kernel's four calls. The compiled function is the static step's layer
(skipdecode/kernels/cuda_graphs.py: fixed-width cache, the column as a tensor, the whole width under a mask) with the
layer's weights as ARGUMENTS, not constants: one graph per batch size, cache width and LoRA pattern then
serves every layer, so SkipDecode's layer subsets, every adapter on the shared base and every position replay
the same few graphs without recompiling.

The graph keeps the eager step's bits: the norms go through `transformer.rms_norm`, an op inductor calls as
it is (its own reduction sums in another order, and so does its fallback for `_fused_rms_norm`, which is
traced into the same reduction: tried on 2026-11-28, the bundled model's tokens parted at 3x), attention
stays ATen's float64 SDPA, and the operations fused around them are elementwise. A host without a C++ compiler, or where compiling fails,
runs the eager static step and says why (`Compiled.label`).
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from ..models import cache_dir
from .native import found
from ..transformer import Block, Decoder

COMPILE_ENV = "SKIPDECODE_COMPILE"  # auto (today: the eager step, see AUTO_EAGER), on, off
SETTINGS = ("auto", "on", "off")
OPTIONS = {"cpp_wrapper": True}  # the graph's calls from C++ instead of Python (docs/research/compiled-step.md)
# What "auto" runs, and why: three bench runs in a row on a quiet AMD EPYC (avx512_bf16, 2 cores) timed both
# steps in turns; the compiled step was no faster at batch 1 (full depth 7.6-8.2 against 6.9-8.3 ms a token)
# and slower at batch 16 (36.9-39.5 against 28.3-31.9 ms), and costs 19-29 s of compiling on a cold start
# (docs/research/compiled-step.md). A host whose CPU it pays on sets SKIPDECODE_COMPILE=on.
AUTO_EAGER = "the compiled step did not pay on the CPU measured (SKIPDECODE_COMPILE=on compiles it)"
# The int8 kernel and the C attention (skipdecode/kernels/native.py) are ctypes calls that dynamo cannot trace; by
# measurement they gain more than compiling did (docs/research/cpu-4bit-kernels.md,
# "The int8 kernel and row-exact attention").
NATIVE_EAGER = ("the compiled step traces PyTorch's int4 kernel, not the C kernels "
                "(SKIPDECODE_KERNEL=bf16 with SKIPDECODE_COMPILE=on compiles it)")
RECOMPILE_LIMIT = 64  # graphs per process: batch sizes x cache widths x LoRA patterns
log = logging.getLogger("skipdecode")


def setting() -> str:
    value = os.environ.get(COMPILE_ENV, "auto").strip() or "auto"
    if value not in SETTINGS:
        raise ValueError(f"{COMPILE_ENV} must be one of {', '.join(SETTINGS)}; got {value!r}")
    return value


def why_not(dec: Decoder, value: str) -> str | None:
    """Why this decoder's step stays eager under `value`, or None when it compiles."""
    if value == "off":
        return f"{COMPILE_ENV}=off"
    if dec.device.type != "cpu":
        return "compiled step is for the CPU (a GPU runs CUDA graphs)"
    if value == "auto":
        return AUTO_EAGER
    if getattr(dec.weights, "attention", None) is not None:
        return NATIVE_EAGER
    if not compiler():
        return "no C++ compiler (install g++ or set CXX)"
    return None


def compiler() -> str | None:
    """The C++ compiler inductor would call, if one is on this host."""
    return found("CXX", "g++", "clang++", "c++")


def use_model_cache() -> None:
    """Inductor's on-disk cache inside the model cache ($SKIPDECODE_CACHE), so a second start (or a Space
    whose build warmed it) loads the compiled graphs instead of compiling them; a caller's own
    TORCHINDUCTOR_CACHE_DIR wins (inductor writes its default there on first use: that one is replaced)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")


def step_layer(dec: Decoder, block: Block, x, rope, mask, keys, values, column) -> None:
    """The static step's layer (graphs.StaticStep._layer) written into x: what is compiled. The decoder
    and the block are arguments too: dynamo guards on their shapes and settings, not on which they are, so
    every engine on the shared 4-bit base (one per adapter) finds the same graphs."""
    x.copy_(dec._layer(block, x, rope, mask, keys, values, column))


_COMPILED = []
_ONCE = threading.Lock()


def compiled_layer():
    """`step_layer` compiled, one wrapper per process (its graphs are cached per code object anyway)."""
    with _ONCE:
        if not _COMPILED:
            use_model_cache()
            config = torch._dynamo.config
            config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
            _COMPILED.append(torch.compile(step_layer, dynamic=False, fullgraph=True, options=OPTIONS))
        return _COMPILED[0]


class Compiled:
    """The compiled layer of one decoder, or why there is none (`label`). Compiling happens on the first
    call for each (batch, width, LoRA pattern); a failure there switches this decoder to the eager step."""

    def __init__(self, dec: Decoder, value: str | None = None):
        self.dec, self.value = dec, setting() if value is None else value
        self.reason = why_not(dec, self.value)
        self.lock = threading.Lock()
        self.fn = None if self.reason else compiled_layer()
        if self.fn is not None:
            dec.register_packed()  # a dense decoder's oneDNN-packed products (SKIPDECODE_COMPILE=on)

    @property
    def label(self) -> str:
        return "compiled step" if self.fn is not None else f"eager step: {self.reason}"

    def layer(self, layer: int, x, rope, mask, keys, values, column) -> bool:
        """Run `layer` on the static buffers in place; False when this decoder steps eagerly (a failed
        compile included: the caller then runs the eager static layer)."""
        if self.fn is None:
            return False
        try:
            self.fn(self.dec, self.dec.blocks[layer], x, rope, mask, keys, values, column)
            return True
        except Exception as error:  # noqa: BLE001 (any compiler or inductor failure: the eager step works)
            with self.lock:
                self.fn, self.reason = None, f"compiling failed: {type(error).__name__}: {str(error)[:200]}"
            log.warning("decode step: %s", self.label)
            return False
