"""CUDA graphs for the decode step: every layer captured once per batch size and cache width, replayed.

At batch 1 a 135M model's decode step is some three hundred small kernels; on a GPU their launches (the
Python, the framework and the driver around each), not the weights, set its time. A CUDA graph replays a
captured sequence of kernels with one launch. Graphs need fixed shapes and fixed memory, so the graphed
step works on static buffers: the hidden state, the rotary cos and sin, an additive mask over the cache's
whole width (padding and the columns after the current one hidden), the column as a device tensor that
the cache write indexes with, and a static KV cache that outlives the generation (gpt-fast's design).

One graph per layer, not one per step: a SkipDecode position replays the graphs of the layers its budget
runs, so a skipped layer is a skipped launch, and the same graphs serve every schedule, 1x to 5x. Two more
graphs bracket them: the prelude (embedding, rotary tables, mask) and the head (final norm, LM head).

The prefill stays eager (one call per layer, on many positions at once), writing into the same cache. A
batch keeps its size to the end: finished rows are not compacted away, which on a GPU costs next to
nothing. Per-token policies (peers.EarlyExit) decide per row and run eagerly.

On a CPU the same static step runs without capture (`capture=False`): that is how the tests check, on any
machine, that the graphed step's math decodes exactly what the eager step decodes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from ..cache import KVCache, cache_dtype
from ..transformer import Decoder

MIN_WIDTH = 256  # cache widths are rounded up to a power of two from here, so prompts share graphs
# ... and from here on a CPU, where attention over the whole width costs in proportion to it
MIN_CPU_WIDTH = 64
MAX_STEPS = 4  # static steps kept per engine (each holds a KV cache of its batch x width) ...
MAX_CACHE_BYTES = 1 << 30  # ... and their caches together at most this (one step alone may be larger)


def cache_bytes(dec: Decoder, batch: int, width: int) -> int:
    element = cache_dtype(dec.dtype, dec.device).itemsize
    return dec.num_layers * 2 * batch * dec.num_kv_heads * width * dec.head_dim * element


def bucket(width: int, limit: int, minimum: int = MIN_WIDTH) -> int:
    """The static cache width for a generation of `width` columns."""
    return min(max(minimum, 1 << (width - 1).bit_length()), max(limit, width))


class StaticStep:
    """Buffers, cache and graphs of the decode step for one batch size and cache width."""

    def __init__(self, dec: Decoder, batch: int, width: int, capture: bool):
        self.dec, self.batch, self.width = dec, batch, width
        device, L = dec.device, dec.num_layers
        self.cache = KVCache(L, batch, dec.num_kv_heads, width, dec.head_dim, device, dec.dtype)
        self.cache.data.zero_()  # masked columns weigh 0, and 0 x NaN from uninitialized memory is NaN
        self.token = torch.zeros(batch, dtype=torch.long, device=device)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.valid = torch.ones(batch, width, dtype=torch.bool, device=device)
        self.columns = torch.arange(width, device=device)
        self.x = torch.zeros(batch, 1, dec.embed_tokens.shape[1], dtype=dec.dtype, device=device)
        self.mask = torch.zeros(batch, 1, 1, width, dtype=cache_dtype(dec.dtype, device), device=device)
        rope = dec.rope(self.position, limit=width)
        self.table = dec._rope_table  # held: a graph reads the table it was captured with
        self.rope = None if rope is None else tuple(torch.zeros_like(t) for t in rope)
        self.logits = None
        self.graphs = None
        if capture:
            self._capture()

    # ---- what the graphs run --------------------------------------------------------------------
    def _prelude(self):
        dec = self.dec
        self.x.copy_(dec.embed(self.token[:, None], self.position))
        if self.rope is not None:
            for buffer, value in zip(self.rope, dec.rope(self.position, limit=self.width)):
                buffer.copy_(value)
        self.mask.copy_(dec.attention_bias(self.valid & (self.columns <= self.column))[:, None, None, :])

    def _layer(self, layer: int):
        keys, values = self.cache.data[layer, 0], self.cache.data[layer, 1]
        self.x.copy_(self.dec.block(layer, self.x, self.rope, self.mask, keys, values, self.column))

    def _head(self):
        out = self.dec.logits(self.x[:, -1])
        if self.logits is None:
            self.logits = out
        else:
            self.logits.copy_(out)

    def _capture(self):
        """Warm up on a side stream (library handles, kernel choices), then capture into one memory pool."""
        L = self.dec.num_layers
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._prelude()
                for layer in range(L):
                    self._layer(layer)
                self._head()
        torch.cuda.current_stream().wait_stream(side)
        pool = torch.cuda.graph_pool_handle()
        graphs = []
        for run in [self._prelude, *[lambda layer=layer: self._layer(layer) for layer in range(L)], self._head]:
            graph = torch.cuda.CUDAGraph()
            # thread_local: a server's other threads (quality scoring, another engine) may use the GPU meanwhile
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                run()
            graphs.append(graph)
        self.graphs = graphs

    # ---- what the engine calls ------------------------------------------------------------------
    def begin(self, valid: torch.Tensor) -> KVCache:
        """A fresh generation: `valid` [batch, width used] marks the columns that are not padding."""
        self.valid.fill_(True)
        self.valid[:, : valid.shape[1]].copy_(valid)
        self.cache.lengths = [0] * self.dec.num_layers
        return self.cache

    def inputs(self, token: torch.Tensor, position: torch.Tensor, column: int):
        """Load one position's tokens; returns the step's hidden state, rotary tables and mask."""
        self.token.copy_(token)
        self.position.copy_(position)
        self.column.fill_(column)
        self._replay(0, self._prelude)
        return self.x, self.rope, self.mask

    def block(self, layer: int, x, rope, mask, keys, values, start):
        """`Decoder.block` for the policies: the layer's graph on the static buffers (which x must be)."""
        if x is not self.x:
            raise RuntimeError("a graphed step runs on its own hidden-state buffer")
        self._replay(1 + layer, lambda: self._layer(layer))
        return self.x

    def head(self) -> torch.Tensor:
        self._replay(-1, self._head)  # the head is the last graph
        return self.logits

    def _replay(self, index: int, eager):
        if self.graphs is None:
            eager()
        else:
            self.graphs[index].replay()


class StaticSteps:
    """An engine's static steps, lent to one generation at a time (the app interleaves generations in one
    thread: two at once get two steps). At most MAX_STEPS are kept, their caches within MAX_CACHE_BYTES:
    the least recently used free ones go first; a generation that would exceed either decodes eagerly."""

    def __init__(self, dec: Decoder, capture: bool):
        self.dec, self.capture = dec, capture
        self.free: OrderedDict[int, StaticStep] = OrderedDict()
        self.lent: dict[int, int] = {}  # id -> cache bytes of the steps out on loan
        self.lock = threading.Lock()

    def take(self, batch: int, width: int) -> StaticStep | None:
        """A step for this batch and generation width, or None when the limits leave no room for one."""
        size = bucket(width, self.dec.max_positions, MIN_WIDTH if self.capture else MIN_CPU_WIDTH)
        new = cache_bytes(self.dec, batch, size)
        with self.lock:
            for key, step in self.free.items():
                if (step.batch, step.width) == (batch, size):
                    del self.free[key]
                    self.lent[key] = new
                    return step

            def over() -> bool:
                kept = sum(cache_bytes(self.dec, s.batch, s.width) for s in self.free.values())
                held = sum(self.lent.values()) + kept
                return len(self.free) + len(self.lent) >= MAX_STEPS or (held + new > MAX_CACHE_BYTES and held > 0)

            while self.free and over():
                self.free.popitem(last=False)
            if over():
                return None
            token = object()  # holds the loan's place until the step exists
            self.lent[id(token)] = new
        try:
            step = StaticStep(self.dec, batch, size, self.capture)
        except BaseException:
            with self.lock:
                del self.lent[id(token)]
            raise
        with self.lock:
            del self.lent[id(token)]
            self.lent[id(step)] = new
        return step

    def give(self, step: StaticStep) -> None:
        with self.lock:
            del self.lent[id(step)]
            self.free[id(step)] = step
