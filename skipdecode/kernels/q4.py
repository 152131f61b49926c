"""The bundled GGUF's own 4-bit blocks, multiplied by PyTorch's int4 CPU kernel (no float32 copy).

Dequantized to float32 the default model streams 0.54 GB per decoding step; its file holds the same
matrices as Q4_1 blocks (32 weights along the input: 4-bit codes q, a scale d, a minimum m; w = d q + m),
4.5 bits a weight. `torch.ops.aten._weight_int4pack_mm_for_cpu` computes w = (c - 8) * scale + zero per
group of 32 inputs, so scale = d and zero = m + 8 d hold a Q4_1 block as it is: the codes go from the file
into the kernel untouched. The kernel's fast path takes bfloat16 inputs (float32 inputs take a reference
loop, about 40x slower on this CPU: docs/research/cpu-4bit-kernels.md); the products' inputs and outputs are rounded to
bfloat16 and so are the blocks' scale and zero, while norms, RoPE, attention, residuals and the KV cache
stay float32. The token embedding (Q8_0, tied to the LM head) stays the float32 copy the engine reads
today; the head screens the vocabulary with a 4-bit copy of it and rescores the best RESCORE tokens of
each row exactly in float32 (`RescoredHead`), so that greedy decoding picks the float32 head's token.

LoRA adapters stay unmerged beside the packed base (y = base(x) + (x A) B, the LoRA scale folded into B):
one packed base serves every adapter at once.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import native
from ..transformer import lora_term  # the unmerged LoRA term, each row's bits its own (both kernels use it)

GROUP = 32  # weights per GGUF block, along the input
INT4 = "int4"  # the dtype name that asks for this path ($SKIPDECODE_DTYPE or --dtype)
RESCORE = 64  # tokens per row whose logits the head recomputes in float32
ACTIVATIONS = torch.bfloat16  # the kernel's fast path; float32 inputs run its reference loop


@dataclass
class Q4Blocks:
    """A matrix [N, K] in GGUF Q4_1 form: codes 0..15 and each block's scale d and minimum m (float32,
    exactly the file's float16 values)."""

    codes: torch.Tensor  # uint8 [N, K]
    d: torch.Tensor  # float32 [N, K / GROUP]
    m: torch.Tensor  # float32 [N, K / GROUP]

    def dequantize(self) -> torch.Tensor:
        """w = d q + m in float32, as gguf.quants.dequantize computes it."""
        N, K = self.codes.shape
        w = self.codes.view(N, K // GROUP, GROUP).float() * self.d[..., None] + self.m[..., None]
        return w.view(N, K)

    def rows(self, index: torch.Tensor) -> "Q4Blocks":
        return Q4Blocks(self.codes[index], self.d[index], self.m[index])


def q4_1_blocks(raw: np.ndarray) -> Q4Blocks:
    """A Q4_1 tensor's bytes [N, K / 32 * 20] (per block: d and m as float16, then 16 bytes of codes, the
    low nibbles holding weights 0..15 and the high ones 16..31) as codes and scales."""
    N = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(N, -1, 20)
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32))
    m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
    packed = torch.from_numpy(blocks[..., 4:].copy())
    codes = torch.cat((packed & 0x0F, packed >> 4), dim=-1)  # [N, blocks, 32]
    return Q4Blocks(codes.reshape(N, -1), d, m)


def quantize(weight: torch.Tensor) -> Q4Blocks:
    """A float matrix as 4-bit blocks (min/max per block of 32): the head's screening copy, and the tests'
    random matrices. Lossy; the file's own Q4_1 matrices never come through here."""
    N, K = weight.shape
    w = weight.float().view(N, K // GROUP, GROUP)
    low, high = w.amin(-1), w.amax(-1)
    d = ((high - low) / 15).clamp(min=1e-12)
    codes = ((w - low[..., None]) / d[..., None]).round().clamp(0, 15).to(torch.uint8)
    return Q4Blocks(codes.view(N, K), d, low)


def unpermute_rows(blocks: Q4Blocks, heads: int) -> Q4Blocks:
    """llama.cpp stores q_proj and k_proj with each head's rows interleaved for its RoPE; transformers'
    GGUF loader puts them back (LlamaTensorProcessor._reverse_permute_weights). Rows are outputs and the
    blocks run along the input, so the same permutation moves whole rows of blocks."""
    N = blocks.codes.shape[0]
    order = torch.arange(N).view(heads, N // heads // 2, 2).transpose(1, 2).reshape(-1)
    return blocks.rows(order)


class NotQ4_1(ValueError):
    """A GGUF whose matrices are not all Q4_1: it runs on the dequantized path."""


class Int4Linear:
    """y = x W^T (+ (x A) B) with W as packed 4-bit codes and per-block bfloat16 scale and zero.

    The same packed tensors serve any number of LoRA adapters (`with_lora`). Outputs are float32, like
    the rest of the decoder; the product itself runs on bfloat16 inputs (`ACTIVATIONS`)."""

    def __init__(self, packed: torch.Tensor, scales_zeros: torch.Tensor, in_features: int,
                 activations: torch.dtype = ACTIVATIONS, lora: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.packed, self.scales_zeros, self.in_features = packed, scales_zeros, in_features
        self.out_features, self.activations, self.lora = packed.shape[0], activations, lora
        self.bias = None

    @classmethod
    def of(cls, blocks: Q4Blocks, activations: torch.dtype = ACTIVATIONS) -> "Int4Linear":
        """Pack blocks for the kernel: codes as they are, scale = d and zero = m + 8 d."""
        N, K = blocks.codes.shape
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(blocks.codes.to(torch.int32), 1)
        scales_zeros = torch.stack((blocks.d, blocks.m + 8 * blocks.d), dim=-1).transpose(0, 1)  # [K/32, N, 2]
        return cls(packed, scales_zeros.contiguous().to(activations), K, activations)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The product in the kernel's output dtype (bfloat16), or float32 with a LoRA term. The decoder's
        next operations widen bfloat16 exactly (a float32 add or multiply promotes it), so returning it as
        it is spares one conversion a product without changing a bit."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(self.activations), self.packed, GROUP,
                                                        self.scales_zeros)
        if self.lora is not None:
            y = lora_term(y.to(x.dtype), x, *self.lora)
        return y.view(*shape[:-1], self.out_features)

    def with_lora(self, a: torch.Tensor, b: torch.Tensor) -> "Int4Linear":
        """The same packed base plus y += (x a) b: a [K, r], b [r, N] (the LoRA scale already in b)."""
        return Int4Linear(self.packed, self.scales_zeros, self.in_features, self.activations, (a, b))

    def rows(self, start: int) -> "Int4Linear":
        """Outputs start.. only (views of the packed tensors; the kernel packs rows in tiles of 64)."""
        if start % 64:
            raise ValueError("the int4 layout splits only at a multiple of 64 rows")
        lora = None if self.lora is None else (self.lora[0], self.lora[1][:, start:])
        return Int4Linear(self.packed[start:], self.scales_zeros[:, start:].contiguous(), self.in_features,
                          self.activations, lora)

    @property
    def nbytes(self) -> int:
        """Bytes one product reads: the packed codes, their scales and zeros, and any LoRA factors."""
        tensors = (self.packed, self.scales_zeros, *(self.lora or ()))
        return sum(t.numel() * t.element_size() for t in tensors)


def product(blocks: Q4Blocks, activations: torch.dtype = ACTIVATIONS):
    """The product a matrix of blocks runs on: the int8-activation kernel (skipdecode/kernels/w4a8.py) when
    $SKIPDECODE_KERNEL picks it and it builds, else PyTorch's int4 kernel on `activations`."""
    from . import w4a8

    if activations == ACTIVATIONS and w4a8.chosen():
        return w4a8.W4A8Linear.of(blocks)
    return Int4Linear.of(blocks, activations)


def q8_why() -> str:
    """Why the int8 kernel is not running, as a clause for the weights' label ("" when it was not asked)."""
    from . import w4a8

    if w4a8.setting() == "bf16":
        return f": {w4a8.KERNEL_ENV}=bf16"
    reason = w4a8.library().reason
    return f": {reason}" if reason else ""


class RescoredHead:
    """The LM head: a 4-bit copy of the float32 matrix ranks the vocabulary, and each row's RESCORE best
    tokens get their logits again from the float32 rows (the dequantized Q8_0, exact). Greedy decoding then
    picks the float32 head's token whenever it ranks among the screen's best RESCORE; the other logits keep
    the 4-bit screen's values (their probabilities are tiny next to the best tokens')."""

    def __init__(self, exact: torch.Tensor, activations: torch.dtype = ACTIVATIONS, rescore: int = RESCORE,
                 rows: torch.Tensor | None = None):
        """`rows`: a head over those rows of `exact` alone (a draft's shortlist), which it reads in place."""
        self.exact, self.rows, self.rescore = exact, rows, rescore
        self.screen = product(quantize(exact if rows is None else exact[rows]), activations)
        self.bias = None

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        shape = h.shape
        h = h.reshape(-1, shape[-1]).float()
        logits = self.screen(h).float()
        lib = getattr(self.screen, "lib", None)  # the C kernels' own selection beside the int8 screen
        best = native.top_k(logits, self.rescore, lib) if lib is not None else logits.topk(self.rescore, dim=-1).indices
        rows = self.exact[best if self.rows is None else self.rows[best]]
        exact = (rows * h[:, None, :]).sum(-1)  # row by row: the same in any batch
        return logits.scatter_(1, best, exact).view(*shape[:-1], -1)

    @property
    def nbytes(self) -> int:
        """The screen's bytes and one row's rescored float32 rows."""
        return self.screen.nbytes + self.rescore * self.exact.shape[1] * self.exact.element_size()


@dataclass
class GGUFWeights:
    """Every matrix of a llama-family decoder from its GGUF blocks: per layer (qkv, out, up, down) as the
    engine's Decoder fuses them, and the head."""

    blocks: list[tuple[Int4Linear, Int4Linear, Int4Linear, Int4Linear]]
    head: RescoredHead
    label: str
    adapter: str | None = None
    attention: object = None  # native.attention beside the int8 kernel's products, else None (float64 SDPA)

    def with_adapter(self, name: str, factors: list[dict[str, tuple[torch.Tensor, torch.Tensor]]]) -> "GGUFWeights":
        """The same packed matrices with an adapter's LoRA factors beside them (`lora_factors`)."""
        blocks = [tuple(lin.with_lora(*layer[kind]) if kind in layer else lin
                        for kind, lin in zip(("qkv", "out", "up", "down"), linears))
                  for linears, layer in zip(self.blocks, factors)]
        return GGUFWeights(blocks, self.head, f"{self.label}; LoRA unmerged", name, self.attention)

    @staticmethod
    def fused_layers(dec) -> "native.Layers | None":
        """Every layer of `dec` in one C call (native.Layers) where its every product is the int8 kernel's
        (w4a8.W4A8Linear says native_layer) beside the C attention; else None."""
        linears = [lin for b in dec.blocks for lin in (b.qkv, b.out, b.up, b.down)]
        if dec.attention_kernel is None or dec.rotary is None or not all(getattr(l, "native_layer", False) for l in linears):
            return None
        return native.Layers(dec, linears[0].lib)


def read_gguf(path: Path, config, embedding: torch.Tensor, activations: torch.dtype = ACTIVATIONS) -> GGUFWeights:
    """The decoder's matrices from a llama-family GGUF, Q4_1 blocks packed as they are; a file with any
    other type among them raises NotQ4_1 (the engine then runs today's dequantized path and says so).
    `embedding` is the float32 token embedding the engine already holds (the head's exact rows when the
    head is tied to it)."""
    from gguf import GGMLQuantizationType as T, GGUFReader
    from gguf.quants import dequantize

    tensors = {t.name: t for t in GGUFReader(path).tensors}
    others = sorted({t.tensor_type.name for name, t in tensors.items()
                     if name.startswith("blk.") and name.endswith(".weight") and len(t.shape) == 2
                     and t.tensor_type != T.Q4_1})
    if others:
        raise NotQ4_1(f"{Path(path).name} holds {', '.join(others)} matrices; the int4 kernel runs Q4_1 blocks only")
    H, Hkv = config.num_attention_heads, config.num_key_value_heads

    def blocks(name: str, heads: int | None = None) -> Q4Blocks:
        found = q4_1_blocks(tensors[name].data)
        return unpermute_rows(found, heads) if heads else found

    def fused(*parts: Q4Blocks):
        return product(Q4Blocks(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "d", "m"))),
                       activations)

    layers = []
    for i in range(config.num_hidden_layers):
        p = f"blk.{i}."
        layers.append((fused(blocks(p + "attn_q.weight", H), blocks(p + "attn_k.weight", Hkv),
                             blocks(p + "attn_v.weight")),
                       fused(blocks(p + "attn_output.weight")),
                       fused(blocks(p + "ffn_gate.weight"), blocks(p + "ffn_up.weight")),
                       fused(blocks(p + "ffn_down.weight"))))
    if "output.weight" in tensors:  # an untied head: its own float32 rows
        t = tensors["output.weight"]
        head_rows = torch.from_numpy(dequantize(t.data, t.tensor_type).astype(np.float32))
    else:
        head_rows = embedding
    head = RescoredHead(head_rows, activations)
    attention = None
    if isinstance(head.screen, Int4Linear):
        kind = "bfloat16" if activations == torch.bfloat16 else "float32"
        products = f"{kind} activations (PyTorch's int4 kernel{q8_why()})"
    else:
        from .native import attention

        products = f"int8 activations (Q8_1 blocks, {head.screen.isa} kernel), float32 row-exact attention"
    label = f"int4 (GGUF Q4_1) weights, {products}; head int4 + float32 top-{RESCORE}"
    return GGUFWeights(layers, head, label, attention=attention)


def lora_factors(folder: Path, num_layers: int) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """An adapter's LoRA A and B per layer, stacked like the decoder's fused matrices: for qkv and gate/up
    the A's side by side and the B's block-diagonal, so one pair of products serves the fused matrix.
    float32, with the LoRA scale (lora_alpha / r, or / sqrt(r) for rsLoRA) folded into B."""
    from safetensors.torch import load_file

    config = json.loads((folder / "adapter_config.json").read_text())
    if config.get("use_dora") or config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError(f"adapter {folder.name}: only plain LoRA (one rank and alpha) runs unmerged")
    r = config["r"]
    scale = config["lora_alpha"] / (r ** 0.5 if config.get("use_rslora") else r)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    parts = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "out": ("self_attn.o_proj",),
             "up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}
    factors = []
    for i in range(num_layers):
        layer = {}
        for kind, modules in parts.items():
            found = [(tensors.get(f"base_model.model.model.layers.{i}.{m}.lora_A.weight"),
                      tensors.get(f"base_model.model.model.layers.{i}.{m}.lora_B.weight")) for m in modules]
            if all(a is None for a, _ in found):
                continue
            if any(a is None or b is None for a, b in found):
                raise ValueError(f"adapter {folder.name}: layer {i} adapts only some of {', '.join(modules)}")
            a = torch.cat([a.float() for a, _ in found])  # [r * parts, K]
            b = torch.block_diag(*[b.float() for _, b in found]) * scale  # [N, r * parts]
            layer[kind] = (a.t().contiguous(), b.t().contiguous())
        factors.append(layer)
    return factors


def chosen(name: str | None, device: torch.device, dtype) -> bool:
    """Whether a model runs on its GGUF blocks: `dtype` "int4" asks for it (so does $SKIPDECODE_DTYPE=int4
    under "auto"); "auto" otherwise picks it on a CPU for the bundled model, with any adapter: every served
    one scores within what a path may cost on it (docs/research/cpu-4bit-kernels.md, "Quality"). Any other
    dtype, float32 for one, is the dequantized path."""
    from ..models import DEFAULT_MODEL, DTYPE_ENV

    if dtype in (None, "auto"):
        dtype = os.environ.get(DTYPE_ENV, "").strip() or "auto"
    if dtype == INT4:
        if name not in (None, DEFAULT_MODEL) or device.type != "cpu":
            raise ValueError(f"dtype {INT4} runs the bundled GGUF ({DEFAULT_MODEL}) on a CPU only")
        return True
    return dtype == "auto" and name in (None, DEFAULT_MODEL) and device.type == "cpu"


_BASE: dict = {}
_LOCK = threading.Lock()


def load_base(activations: torch.dtype = ACTIVATIONS):
    """(LoadedModel, GGUFWeights) of the bundled model, made once per process: every engine on this path,
    with or without an adapter, shares the packed matrices and the Hugging Face model (config, tokenizer,
    norms, RoPE, the float32 embedding; its own float32 matrices stay in the file's memory map, unread
    by decoding)."""
    from ..models import default_gguf, load_model

    from .w4a8 import setting

    key = (activations, setting())  # $SKIPDECODE_KERNEL: the bench loads one base per kernel it compares
    with _LOCK:
        if key not in _BASE:
            loaded = next(iter(_BASE.values()))[0] if _BASE else load_model(None, device="cpu", dtype="float32")
            embedding = loaded.model.get_input_embeddings().weight.detach()
            _BASE[key] = (loaded, read_gguf(default_gguf(), loaded.model.config, embedding, activations))
        return _BASE[key]
