"""The 4-bit products with int8 activations, as llama.cpp computes them: skipdecode/kernels/w4a8.c (built and loaded
by skipdecode/kernels/native.py).

PyTorch's int4 kernel (q4.Int4Linear) rounds each product's inputs to bfloat16 and the blocks' scales too,
and on this project's CPU it took about 4 ms of a 7.7 ms full-depth step (docs/research/cpu-4bit-kernels.md). llama.cpp
quantizes the activations to int8 per block of 32 (Q8_1) and multiplies them with the 4-bit codes in
integer instructions (VNNI). This kernel does the same on the GGUF's Q4_1 blocks byte for byte (their
float16 scale and minimum exact), and keeps every row's bits whatever the batch (w4a8.c says how).

$SKIPDECODE_KERNEL chooses: "auto" (this kernel where it builds, else PyTorch's), "q8" (this kernel, or an
error saying why not), "bf16" (PyTorch's int4 kernel on bfloat16 inputs).
"""

from __future__ import annotations

import os

import torch

from .native import library
from ..transformer import lora_term

GROUP = 32  # weights per GGUF block (q4.GROUP): q4 imports this module, so it is not imported from there

KERNEL_ENV = "SKIPDECODE_KERNEL"
SETTINGS = ("auto", "q8", "bf16")


def setting() -> str:
    value = os.environ.get(KERNEL_ENV, "auto").strip() or "auto"
    if value not in SETTINGS:
        raise ValueError(f"{KERNEL_ENV} must be one of {', '.join(SETTINGS)}; got {value!r}")
    return value


def chosen() -> bool:
    """Whether the 4-bit products run on this kernel ($SKIPDECODE_KERNEL); "q8" without it raises."""
    value = setting()
    if value == "bf16":
        return False
    found = library()
    if found.lib is None and value == "q8":
        raise RuntimeError(f"{KERNEL_ENV}=q8: {found.reason}")
    return found.lib is not None


ROWS, UNIT = 16, 320  # weight rows interleaved per unit of the layout; bytes of one block of a unit (w4a8.c)


def layout(blocks) -> torch.Tensor:
    """q4.Q4Blocks in the kernel's layout (w4a8.c): [units, blocks, UNIT] bytes. Per unit of 16 weight rows and
    block of 32 inputs, four runs of 64 bytes (run i: each row's codes 4i..4i+3 in the low nibbles and
    4i+16..4i+19 in the high ones, 4 bytes a row), then the 16 rows' d and m as float16 (exact: the file's own
    float16 values). Rows past the last one, up to a multiple of 16, are zero blocks."""
    N, K = blocks.codes.shape
    if K % GROUP:
        raise ValueError(f"the int8 kernel needs inputs in whole blocks of {GROUP}; got {K}")
    nb, units = K // GROUP, -(-N // ROWS)
    pad = units * ROWS - N
    codes, d, m = blocks.codes, blocks.d, blocks.m
    if pad:
        codes = torch.cat((codes, codes.new_zeros(pad, K)))
        d, m = (torch.cat((t, t.new_zeros(pad, nb))) for t in (d, m))
    quads = codes.view(units, ROWS, nb, 8, 4)  # [unit, row, block, group of 4 codes, code]
    runs = (quads[:, :, :, :4] | (quads[:, :, :, 4:] << 4)).permute(0, 2, 3, 1, 4)  # [unit, block, run, row, 4]
    scales = [t.half().view(units, ROWS, nb).transpose(1, 2).contiguous().view(torch.uint8) for t in (d, m)]
    return torch.cat((runs.reshape(units, nb, 256), *scales), dim=-1).contiguous()


class W4A8Linear:
    """y = x W^T (+ (x A) B) with W as the GGUF's Q4_1 blocks and x quantized to int8 per block of 32 inside
    the kernel. Inputs and outputs float32; the LoRA term (transformer.lora_term) stays float32."""

    native_layer = True  # its layout is what layer.c reads: a decoder of these runs each layer in one C call

    def __init__(self, packed: torch.Tensor, out_features: int, in_features: int, lora=None, lib=None):
        self.packed, self.out_features, self.in_features, self.lora = packed, out_features, in_features, lora
        self.bias = None
        self.lib = lib if lib is not None else library().lib
        if self.lib is None:
            raise RuntimeError(library().reason)
        self.isa = self.lib.q8_isa().decode()  # the instructions its build runs on

    @classmethod
    def of(cls, blocks) -> "W4A8Linear":
        """From q4.Q4Blocks."""
        return cls(layout(blocks), *blocks.codes.shape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        y = torch.empty(x.shape[0], self.out_features)
        if self.lib.q8_matmul(self.packed.data_ptr(), self.out_features, self.in_features, x.data_ptr(), x.shape[0],
                              y.data_ptr()):
            raise MemoryError("the int8 kernel could not allocate its scratch rows")
        if self.lora is not None:
            y = lora_term(y, x, *self.lora)
        return y.view(*shape[:-1], self.out_features)

    def with_lora(self, a: torch.Tensor, b: torch.Tensor) -> "W4A8Linear":
        return W4A8Linear(self.packed, self.out_features, self.in_features, (a, b), self.lib)

    def rows(self, start: int) -> "W4A8Linear":
        """Outputs start.. only (a view of whole units: `start` a multiple of 16)."""
        if start % ROWS:
            raise ValueError(f"the int8 layout splits only at a multiple of {ROWS} rows")
        lora = None if self.lora is None else (self.lora[0], self.lora[1][:, start:])
        return W4A8Linear(self.packed[start // ROWS:], self.out_features - start, self.in_features, lora, self.lib)

    @property
    def nbytes(self) -> int:
        tensors = (self.packed, *(self.lora or ()))
        return sum(t.numel() * t.element_size() for t in tensors)
