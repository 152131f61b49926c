"""The CPU path's C kernels (w4a8.c: the 4-bit products on int8 activations; attention.c: float32 attention
with row-exact sums; layer.c: whole decoder layers in one call; topk.c: the head screen's best tokens), built once per CPU and compiler with the
host's C compiler into the model cache ($SKIPDECODE_CACHE/kernels) and called through ctypes. A host with no
compiler, or where the build fails, runs PyTorch's kernels and says why (`Library.reason`, in the weights'
label). The structs the calls take are kernels.h's, each mirrored here once by a ctypes class of the same name
(STRUCTS; layout.c reports the compiler's offsets, which a test compares with these)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Sequence

import torch  # first: its libgomp.so.1 is the one the kernels' OpenMP threads then share

from ..models import cache_dir

SOURCES = [Path(__file__).with_name(name) for name in ("w4a8.c", "attention.c", "layer.c", "topk.c", "layout.c")]
HEADERS = [Path(__file__).with_name(name) for name in ("kernels.h", "timing.h")]
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared"]
_P, _I = ctypes.c_void_p, ctypes.c_int64
DIMS = 4  # kernels.h's DIMS: the dimensions of a Tensor


# ---- kernels.h's structs, one class each (names and fields as there) ----------------------------------
class Tensor(ctypes.Structure):
    """A tensor argument: float32 data, sizes and strides in elements, outermost first (as PyTorch's); the
    dimensions past the tensor's have size 1. Tensor() is an absent one (data NULL)."""
    _fields_ = [("data", _P), ("ne", _I * DIMS), ("nb", _I * DIMS)]

    @classmethod
    def of(cls, t: torch.Tensor) -> "Tensor":
        if t.dtype != torch.float32 or t.dim() > DIMS:
            raise ValueError(f"a kernel's tensor is float32 of at most {DIMS} dimensions; got {t.dtype} {tuple(t.shape)}")
        pad = DIMS - t.dim()
        return cls(t.data_ptr(), (*t.shape, *(1,) * pad), (*t.stride(), *(0,) * pad))


class Product(ctypes.Structure):
    _fields_ = [("w", _P), ("n", _I), ("k", _I), ("a", _P), ("b", _P), ("rank", _I), ("spans", _P)]


class Layer(ctypes.Structure):
    _fields_ = [("norm1", _P), ("norm2", _P), ("qkv", Product), ("out", Product), ("up", Product), ("down", Product)]


class Config(ctypes.Structure):
    _fields_ = [("d", _I), ("heads", _I), ("kv_heads", _I), ("head_dim", _I), ("ffn", _I), ("eps", ctypes.c_float)]


class Call(ctypes.Structure):
    _fields_ = [("x", Tensor), ("cos", Tensor), ("sin", Tensor), ("mask", Tensor), ("keys", Tensor),
                ("values", Tensor), ("layer_stride", _I), ("start", _I), ("T", _I), ("rows", _P), ("starts", _P),
                ("lora", _P), ("work", _P), ("work_size", _I), ("work_need", _I)]


STRUCTS = (Tensor, Product, Layer, Config, Call)
_T = ctypes.POINTER(Tensor)
SIGNATURES = {"q8_matmul": [_P, _I, _I, _P, _I, _P], "attention": [_T, _T, _T, _T, _T],
              "layers_forward": [ctypes.POINTER(Layer), ctypes.POINTER(Config), _P, _I, ctypes.POINTER(Call)],
              "top_k": [_P, _I, _I, _I, _P]}
SHAPES = -2  # what a call returns when the sizes do not fit its kernel (-1: scratch memory short)


def found(env: str, *names: str) -> str | None:
    """The first of $env and `names` on this host's PATH (a compiler's name), or None."""
    for name in (os.environ.get(env), *names):
        if name and shutil.which(name):
            return name
    return None


def compiler() -> str | None:
    """The C compiler the kernels build with, if one is on this host."""
    return found("CC", "gcc", "cc", "clang")


def _cpu() -> str:
    """What -march=native depends on: the machine and the CPU's feature flags."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return platform.machine() + flags


def build(cc: str, extra: tuple[str, ...] = ()) -> tuple[Path, bool]:
    """The shared library for these sources, this compiler and this CPU, and whether this call built it:
    built once into the model cache (written under a temporary name and renamed, so that two processes
    starting together never load half a file)."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    text = "\0".join([*(s.read_text() for s in (*SOURCES, *HEADERS)), " ".join([*FLAGS, *extra]), version, _cpu()])
    target = cache_dir() / "kernels" / f"skipdecode-{hashlib.sha256(text.encode()).hexdigest()[:16]}.so"
    if target.exists():
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, *extra, *map(str, SOURCES), "-lm", "-o", tmp], capture_output=True, text=True)
        if done.returncode:
            lines = done.stderr.strip().splitlines()
            raise RuntimeError(next((l for l in lines if "error" in l), lines[-1] if lines else "failed"))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target, True


class Library:
    """The loaded kernels, or why there are none (`reason`); `built`: whether this process compiled them.
    `extra` compiler flags build another variant (the tests build the AVX2 forms with -mno-avx512f)."""

    def __init__(self, cc: str | None = None, extra: tuple[str, ...] = ()):
        self.lib = self.reason = self.isa = None
        self.built = False
        cc = cc or compiler()
        if platform.machine() not in ("x86_64", "AMD64"):
            self.reason = f"the C kernels are for x86-64 CPUs, not {platform.machine()}"
            return
        if cc is None:
            self.reason = "no C compiler (install gcc or set CC)"
            return
        try:
            path, self.built = build(cc, extra)
            lib = ctypes.CDLL(str(path))
        except (OSError, RuntimeError, subprocess.SubprocessError) as error:
            self.reason = f"the C kernels did not build: {str(error)[:200]}"
            return
        for name, args in SIGNATURES.items():
            getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_int, args
        for name in ("layout", "layout_fields"):
            getattr(lib, name).restype = ctypes.c_int64
        lib.layout.argtypes, lib.layout_fields.argtypes = [ctypes.c_char_p] * 2, [ctypes.c_char_p]
        lib.q8_isa.restype = ctypes.c_char_p
        self.lib, self.isa = lib, lib.q8_isa().decode()


_LIBRARY: list[Library] = []
_LOCK = threading.Lock()


def library() -> Library:
    """The process's one Library (built or loaded on first use)."""
    with _LOCK:
        if not _LIBRARY:
            _LIBRARY.append(Library())
        return _LIBRARY[0]


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
              lib: Library | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd) + mask) v for q [B, H, S, hd], keys and values [B, Hkv, T, hd] (float32, the
    last dimension contiguous) and the additive mask [B, 1, S, T] or None, row by row (attention.c). The
    result is [B, H, S, hd] as a view of a [B, S, H, hd] tensor: the caller's transpose back is free."""
    B, H, S, hd = q.shape
    if q.stride(-1) != 1:
        q = q.contiguous()
    if mask is not None:
        mask = mask.expand(B, 1, S, keys.shape[2])
        if mask.stride(-1) != 1:
            mask = mask.contiguous()
    out = torch.empty(B, S, H, hd).transpose(1, 2)
    if keys.stride() != values.stride() or keys.stride(-1) != 1:
        raise ValueError("keys and values must share their strides, the last dimension contiguous")
    done = (lib or library()).lib.attention(Tensor.of(q), Tensor.of(keys), Tensor.of(values),
                                            Tensor() if mask is None else Tensor.of(mask), Tensor.of(out))
    if done:
        raise checked(done, "attention")
    return out


def checked(code: int, kernel: str) -> Exception:
    """The error a kernel's nonzero return stands for."""
    if code == SHAPES:
        return ValueError(f"the {kernel} kernel was given sizes or strides it does not take")
    return MemoryError(f"the {kernel} kernel could not allocate its scratch rows")


def top_k(x: torch.Tensor, k: int, lib: ctypes.CDLL) -> torch.Tensor:
    """The indices [rows, k] of the k largest values of each row of x [rows, n] (float32), in no particular
    order (topk.c): the set torch.topk gives, but for which of several values tied at the k-th it keeps."""
    x = x.contiguous()
    out = torch.empty(x.shape[0], k, dtype=torch.int64)
    if lib.top_k(x.data_ptr(), x.shape[1], k, x.shape[0], out.data_ptr()):
        raise ValueError(f"top_k: k = {k} for rows of {x.shape[1]}")
    return out


# ---- layer.c: decoder layers in one call ---------------------------------------------------------------
SPAN = 64  # layer.c's SPAN: the outputs one LoRA span covers
# The most scratch a Layers keeps between calls (bytes): for the default model, a continuous batch's steps and
# prefill chunks (slots.PREFILL_CHUNK rows) fit; a call that needs more (a long prompt's prefill) allocates its
# own for that call and gives it back, as every call did before.
WORK_KEPT = 4 << 20


def lora_spans(b: torch.Tensor) -> torch.Tensor:
    """Per SPAN outputs of b [rank, n], the rank rows [j0, j1) holding a nonzero there (int32 [spans, 2]; 0, 0:
    none): layer.c skips the zero rows of a fused matrix's block-diagonal b outside them."""
    rank, n = b.shape
    chunks = -(-n // SPAN)
    nonzero = torch.nn.functional.pad(b != 0, (0, chunks * SPAN - n)).view(rank, chunks, SPAN).any(-1).t()
    rows = torch.arange(rank)
    j0 = torch.where(nonzero, rows, rank).min(-1).values
    j1 = torch.where(nonzero, rows + 1, 0).max(-1).values
    return torch.stack([torch.minimum(j0, j1), j1], -1).to(torch.int32).contiguous()


class Layers:
    """A llama-family decoder's layers on the int8 kernel, each layer (or a list of them) in one native call
    (layer.c): what `Decoder.block` and `Decoder.run_layers` run when every product is a q8.W4A8Linear. Holds
    the layers' weights as C structs, built once; the tensors they point into stay referenced here. Also the
    calls' scratch (Call.work): one buffer, grown to what a call needs up to WORK_KEPT and reused, by one call at
    a time (a call that finds it in use, from another thread, has its own allocated)."""

    def __init__(self, dec, lib: ctypes.CDLL):
        self.lib = lib
        self.config = Config(dec.embed_tokens.shape[1], dec.num_heads, dec.num_kv_heads, dec.head_dim,
                              dec.blocks[0].down.in_features, dec.eps)
        self.held = []
        self.layers = (Layer * dec.num_layers)(*(self._layer(b) for b in dec.blocks))
        self.work = torch.empty(0, dtype=torch.uint8)
        self._work_lock = threading.Lock()

    def _tensor(self, t: torch.Tensor) -> int:
        t = t.detach().float().contiguous()
        self.held.append(t)
        return t.data_ptr()

    def _product(self, lin) -> Product:
        a, b = lin.lora if lin.lora is not None else (None, None)
        spans = None
        if b is not None:
            spans = lora_spans(b.detach().float())
            self.held.append(spans)
        return Product(lin.packed.data_ptr(), lin.out_features, lin.in_features,
                        None if a is None else self._tensor(a), None if b is None else self._tensor(b),
                        0 if a is None else a.shape[1], None if spans is None else spans.data_ptr())

    def _layer(self, block) -> Layer:
        self.held.append(block)
        return Layer(self._tensor(block.norm1[0]), self._tensor(block.norm2[0]), *(
            self._product(lin) for lin in (block.qkv, block.out, block.up, block.down)))

    def forward(self, which: Sequence[int], x: torch.Tensor, rope, mask, keys: torch.Tensor, start,
                values_offset: int, layer_stride: int, rows: torch.Tensor | None = None,
                starts: torch.Tensor | None = None, lora: Sequence["Layers"] | None = None) -> torch.Tensor:
        """Layers `which`, in order, on x [B, S, d] (float32), returned as a new tensor: keys and values of
        layer l for row b, head h, column t at keys[b, h, t] + l * layer_stride and values_offset floats
        after them; the S new columns written at `start` (an int, or a one-element tensor: the graphed step's
        form), attention over the columns before start + S under the additive mask [B, 1, S or 1, >= start +
        S] (None: every column). Rows at different positions (skipdecode/slots.py) pass `rows`, each row's
        cache row, and `starts`, each row's first new column (int64 [B] each); `start` is then the largest.
        `lora`: per row, the Layers of that row's adapter over this same base, whose LoRA terms it takes."""
        B, S, _ = x.shape
        out = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
        start = int(start)
        call = Call(Tensor.of(out), layer_stride=layer_stride, start=start, T=start + S)
        if rope is not None:
            cos, sin = rope
            if cos.stride(-1) != 1 or sin.stride() != cos.stride():
                cos, sin = cos.contiguous(), sin.contiguous()
            call.cos, call.sin = Tensor.of(cos), Tensor.of(sin)
        if mask is not None:
            mask = mask.expand(B, 1, S, mask.shape[-1])
            if mask.stride(-1) != 1:
                mask = mask.contiguous()
            call.mask = Tensor.of(mask)
        if keys.stride(-1) != 1:
            raise ValueError("the cache's last dimension must be contiguous")
        call.keys, values = Tensor.of(keys), Tensor.of(keys)  # the values: the keys' shape and strides, elsewhere
        values.data += values_offset * keys.element_size()
        call.values = values
        if rows is not None:
            if rows.dtype != torch.int64 or starts is None or starts.dtype != torch.int64 or len(rows) != B \
                    or len(starts) != B or int(starts.max()) > start:
                raise ValueError("rows and starts: int64 [B] each, none past `start`")
            call.rows, call.starts = rows.data_ptr(), starts.data_ptr()
        if lora is not None:
            if len(lora) != B:
                raise ValueError(f"lora: one Layers a row; got {len(lora)} for {B} rows")
            table = (ctypes.c_void_p * B)(*(ctypes.addressof(layers.layers) for layers in lora))
            call.lora = ctypes.addressof(table)
        which = (ctypes.c_int64 * len(which))(*which)
        mine = self._work_lock.acquire(blocking=False)
        try:
            if mine:
                call.work, call.work_size = self.work.data_ptr(), self.work.numel()
            done = self.lib.layers_forward(self.layers, ctypes.byref(self.config), which, len(which), ctypes.byref(call))
            if mine and self.work.numel() < call.work_need <= WORK_KEPT:
                self.work = torch.empty(call.work_need, dtype=torch.uint8)  # the next call's
        finally:
            if mine:
                self._work_lock.release()
        if done:
            raise checked(done, "layer")
        return out
