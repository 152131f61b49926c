"""The shared prompt-prefix cache: keys and values of prompt prefixes computed once, reused by later prompts.

Every chat prompt begins with the template's fixed system turn (about 30 tokens of SmolLM2's), every E2E
prompt with the same instruction after it, and a request often repeats a recent one's opening. A prefill
looks up the longest prefix of its prompt that an earlier prefill of the same weights computed, copies
those columns into its own cache and runs the layers on the rest only; then it stores its whole prompt
for the requests after it. Keys and values depend only on the tokens before them and on the weights, so a
hit is exact where a pass over fewer rows gives each row the same bits: the 4-bit path's row-exact products
and attention (`tests/test_prefix.py`), the only decoders the store serves by default (`rows_exact`).

Entries belong to one decoder (one model with its adapter): a draft adapter never reads the verifier's,
nor one adapter another's. The store is bounded in bytes (least recently used entries go first), shared by
the threads that serve requests (one lock; an entry is never changed once stored, so a copy out of it
needs no lock), and used by full decoding's prefill (Engine) and verified decoding's one prefill alike.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections import OrderedDict

import torch

from .cache import KVCache
from .transformer import run_layers

BYTES_ENV = "SKIPDECODE_PREFIX_CACHE_MB"
DEFAULT_MB = 64  # about 1,400 prompt tokens of SmolLM2-135M (46 KB a token in float32)


def forward(dec, cache: KVCache, tokens, start: int, head: bool | str = True, layers=None):
    """`layers` (default: every layer) on `tokens` at cache columns [start, start + len(tokens)), batch 1,
    causal: a prefill (start 0, or past a cached prefix), a verify pass. Logits [len(tokens), V]; head="last":
    the last position's alone [1, V] (a prefill's next token, computed as a decode step computes it); with
    head=False the last position's hidden state [1, 1, d]."""
    S = len(tokens)
    device = dec.device
    positions = torch.arange(start, start + S, device=device)[None]
    mask = None
    if S > 1:
        allowed = torch.ones(S, start + S, dtype=torch.bool, device=device).tril(start)
        mask = dec.attention_bias(allowed)[None, None]
    x, rope = dec.embed(torch.tensor([list(tokens)], device=device), positions), dec.rope(positions, limit=cache.max_len)
    x = run_layers(dec, range(dec.num_layers) if layers is None else layers, x, rope, mask, cache, start)
    if head == "last":
        return dec.logits(x[:, -1])
    return dec.logits(x[0]) if head else x[:, -1:]


def rows_exact(dec) -> bool:
    """Whether a pass gives each row the bits it gets alone (the GGUF 4-bit path's products, attention and
    LoRA terms), so that a prefix computed in another pass is the bits this one would compute. Float32 and
    bfloat16 products choose kernels by the number of rows, and may round a row differently."""
    return getattr(dec, "weights", None) is not None


class PrefixCache:
    """Prompt prefixes' keys and values per decoder, at most `max_bytes` in all (0: off). Only decoders whose
    rows are exact (`rows_exact`) use it unless `any_decoder` (the tests' float32 models: equal up to rounding)."""

    def __init__(self, max_bytes: int | None = None, any_decoder: bool = False):
        if max_bytes is None:
            max_bytes = int(float(os.environ.get(BYTES_ENV, DEFAULT_MB)) * 2**20)
        if max_bytes < 0:
            raise ValueError(f"the prefix cache's size must be >= 0 bytes; got {max_bytes}")
        self.max_bytes, self.any_decoder = max_bytes, any_decoder
        self.bytes = 0
        self.hits = self.misses = 0
        self._entries: OrderedDict[tuple[int, tuple[int, ...]], torch.Tensor] = OrderedDict()
        self._spaces: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # decoder -> its number
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()

    def _space(self, dec) -> int:
        """The decoder's number (under the lock): entries are keyed by it, never by a reusable id()."""
        space = self._spaces.get(dec)
        if space is None:
            space = self._spaces[dec] = next(self._numbers)
        return space

    def lookup(self, dec, ids) -> tuple[int, torch.Tensor | None]:
        """The longest stored prefix of `ids` for this decoder, at most len(ids) - 2 tokens: its length and
        keys and values [layer, key/value, head, column, dim]. At least two prompt tokens run, because a pass
        of one row may round an unmerged adapter's LoRA term otherwise than a pass of several (q4.lora_term on
        some CPUs), and a prompt's prefill is always a pass of several."""
        if not self.serves(dec):
            return 0, None
        ids = tuple(ids)
        best, found = 0, None
        with self._lock:
            space = self._space(dec)
            for key, kv in self._entries.items():
                if key[0] != space:
                    continue
                m = _common(key[1], ids)
                if m > best:
                    best, found, best_key = m, kv, key
            if found is not None:
                self._entries.move_to_end(best_key)
            best = min(best, len(ids) - 2)
            self.hits, self.misses = self.hits + (best > 0), self.misses + (best == 0)
        return (best, found) if best > 0 else (0, None)

    def store(self, dec, ids, cache: KVCache) -> None:
        """Keep the prompt's columns of `cache` (row 0) for later prompts; entries it extends are dropped."""
        ids = tuple(ids)
        kv = cache.data[:, :, 0, :, :len(ids)].clone()
        size = kv.numel() * kv.element_size()
        if not self.serves(dec) or size > self.max_bytes:
            return
        with self._lock:
            space = self._space(dec)
            for key in [key for key in self._entries if key[0] == space and ids[:len(key[1])] == key[1]]:
                self._drop(key)  # a prefix of this prompt: the new entry holds it too
            self._entries[(space, ids)] = kv
            self.bytes += size
            while self.bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def serves(self, dec) -> bool:
        return bool(self.max_bytes) and (self.any_decoder or rows_exact(dec))

    def _drop(self, key) -> None:
        kv = self._entries.pop(key)
        self.bytes -= kv.numel() * kv.element_size()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


def _common(a: tuple, b: tuple) -> int:
    """Length of the common prefix of two token tuples."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]: halve (tuple slices compare in C)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def prefill(dec, cache: KVCache, ids, prefixes: PrefixCache | None) -> tuple[torch.Tensor, int]:
    """Every layer on the prompt `ids` (batch 1) into `cache`, reusing the longest stored prefix: the last
    position's logits [1, V], and how many prompt tokens came from the prefix cache."""
    m, kv = prefixes.lookup(dec, ids) if prefixes is not None else (0, None)
    if m:
        cache.data[:, :, 0, :, :m] = kv[:, :, :, :m]
        cache.lengths = [m] * len(cache.lengths)
    logits = forward(dec, cache, list(ids)[m:], m, head="last")
    if prefixes is not None:
        prefixes.store(dec, ids, cache)
    return logits, m


# The process's stores, each decoder its own entries: full decoding's (every Engine's), and verified
# decoding's. Two, so that a comparison's two sides, which decode the same prompt side by side, each reuse
# only what their own earlier requests computed, never the other side's copy of this very prompt.
PREFIXES = PrefixCache()
VERIFIED_PREFIXES = PrefixCache()
