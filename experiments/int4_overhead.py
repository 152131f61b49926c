"""Where a 4-bit decode step's time goes besides the products, and what was tried against it
(docs/research/cpu-4bit-kernels.md, "What is left after the products").

    PYTHONPATH=. python experiments/int4_overhead.py [--parts] [--attention] [--consistency] [--others]
                                                 [--compile]

Every timing is one decode step of the 30 layers (no head unless named) on the bundled model's 4-bit path,
at batch 1 and 16 with 100 cached columns (random hidden states and cache: the work, not the tokens,
matters here), the median of 10-30 calls; variants are timed in turns in one process so that they see the
same machine. Without flags: the products alone (the kernel, and `Int4Linear` around it), the head, and
the whole step.
  --parts       the step cut into the layer's statements (a timed copy of `Decoder._layer`)
  --attention   the decode step with each way of attending (VARIANTS): one float64 call (the default),
                float32 row by row, one float32 call
  --consistency per way of attending: batch against alone, teacher-forced scoring against decoding, and
                the prefill's time
  --others      the kernel against rows; products returning float32 (the first 4-bit default); a float64 KV cache;
                one thread
  --compile     torch.compile of the 30-layer stack, then of each layer (minutes to compile)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import types
from collections import defaultdict

import torch
import torch.nn.functional as F

from skipdecode.cache import KVCache
from skipdecode.engine import Engine
from step_time import run_times  # experiments/, beside this one

T = 100  # cached columns


def median_ms(fn, runs=30) -> float:
    return statistics.median(run_times(fn, runs)) * 1e3


def inputs(dec, batch: int):
    """A cache of T columns, one new column's hidden states, its RoPE and (batch > 1) a mask in which row
    i has i pad columns, as a left-padded batch has."""
    g = torch.Generator().manual_seed(batch)
    cache = KVCache(dec.num_layers, batch, dec.num_kv_heads, T + 8, dec.head_dim, "cpu", dec.dtype)
    cache.data.copy_(torch.randn(cache.data.shape, generator=g))
    x = torch.randn(batch, 1, dec.embed_tokens.shape[1], generator=g)
    rope = dec.rope(torch.full((batch, 1), T), limit=T + 8)
    valid = torch.ones(batch, T + 8, dtype=torch.bool)
    for row in range(batch):
        valid[row, :row] = False
    mask = dec.attention_bias(valid)[:, None, None, :T + 1] if batch > 1 else None
    return cache, x, rope, mask


def layers(dec, cache, x, rope, mask):
    for layer in range(dec.num_layers):
        cache.lengths[layer] = T
        x = dec.block(layer, x, rope, mask, *cache.claim(layer, T, 1), T)
    return x


def products(dec, batch: int) -> None:
    xs = {k: torch.randn(batch, k) for k in (576, 1536)}
    linears = [lin for b in dec.blocks for lin in (b.qkv, b.out, b.up, b.down)]
    raw = [(xs[lin.in_features].bfloat16(), lin.packed, lin.scales_zeros) for lin in linears]
    kernel = torch.ops.aten._weight_int4pack_mm_for_cpu
    step = inputs(dec, batch)
    figures = {
        "the 120 products, the kernel alone": lambda: [kernel(x, p, 32, sz) for x, p, sz in raw],
        "the 120 products through Int4Linear": lambda: [lin(xs[lin.in_features]) for lin in linears],
        "the LM head (int4 screen + float32 top-64)": lambda: dec.lm_head(xs[576]),
        "the 30 layers": lambda: layers(dec, *step),
        "the 30 layers and the head": lambda: dec.logits(layers(dec, *step)[:, -1]),
    }
    for name, fn in figures.items():
        print(f"| batch {batch} | {name} | {median_ms(fn):.2f} ms |")


def timed_layer(acc):
    """Decoder._layer with a clock between its statements (keep in step with skipdecode/transformer.py)."""
    def _layer(self, w, x, rope, mask, keys, values, start):
        clock = [time.perf_counter()]

        def lap(name):
            clock.append(time.perf_counter())
            acc[name] += clock[-1] - clock[-2]

        B, S, _ = x.shape
        H, Hkv = self.num_heads, self.num_kv_heads
        h = self._norm(x, w.norm1); lap("norms")
        qkv = w.qkv(h).view(B, S, H + 2 * Hkv, self.head_dim); lap("products")
        qk = self._rotate(qkv[:, :, : H + Hkv], rope); lap("RoPE")
        keys[:, :, start:start + S] = qk[:, :, H:].transpose(1, 2)
        values[:, :, start:start + S] = qkv[:, :, H + Hkv:].transpose(1, 2)
        keys, values = keys[:, :, :start + S], values[:, :, :start + S]; lap("cache writes")
        attn = self._attend(qk[:, :, :H].transpose(1, 2), keys, values, mask); lap("attention")
        attn = attn.transpose(1, 2).reshape(B, S, self.q_size); lap("other")
        y = w.out(attn); lap("products")
        x = x + y; lap("residual adds")
        h = self._norm(x, w.norm2); lap("norms")
        h = w.up(h).to(x.dtype); lap("products")
        gate, up = h.chunk(2, dim=-1)
        h = self.act(gate) * up; lap("SiLU and gate")
        y = w.down(h); lap("products")
        x = x + y; lap("residual adds")
        return x
    return _layer


def parts(dec, batch: int) -> None:
    acc = defaultdict(float)
    plain = dec._layer
    dec._layer = types.MethodType(timed_layer(acc), dec)
    step = inputs(dec, batch)
    for _ in range(3):
        layers(dec, *step)
    acc.clear()
    runs = 20
    started = time.perf_counter()
    for _ in range(runs):
        layers(dec, *step)
    total = (time.perf_counter() - started) * 1e3 / runs
    dec._layer = plain
    for name, seconds in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"| batch {batch} | {name} | {seconds * 1e3 / runs:.2f} ms |")
    print(f"| batch {batch} | the rest (Python calls, the cache's bookkeeping) | "
          f"{total - sum(acc.values()) * 1e3 / runs:.2f} ms |")
    print(f"| batch {batch} | **the 30 layers** | **{total:.2f} ms** |")


def rows_float32(self, q, keys, values, mask):
    """Row by row in float32 (tried on 2026-11-28): each row of a batch attends over its own columns only,
    [start, T) under left padding, which puts its keys at the same places of the kernel's vector lanes as
    its own unpadded cache: batch-invariant by construction. A prefill runs one query at a time, each
    over the columns up to its own, exactly as a decode step would: a prefill-shaped call rounds its rows
    differently than decode steps (teacher-forced scoring would then disagree with decoding). A pad
    query's output is 0: no real column reads a pad column's keys."""
    if mask is None and q.shape[2] == 1:
        return F.scaled_dot_product_attention(q, keys, values, enable_gqa=self.gqa)
    B, _, S, _ = q.shape
    starts = [0] * B if mask is None else (mask[:, 0, -1] == 0).to(torch.uint8).argmax(-1).tolist()
    if S == 1:
        return torch.cat([F.scaled_dot_product_attention(q[r:r + 1], keys[r:r + 1, :, s:], values[r:r + 1, :, s:],
                                                         enable_gqa=self.gqa) for r, s in enumerate(starts)])
    out, first = q.new_zeros(q.shape), keys.shape[2] - S  # the queries are columns [first, T)
    for r, s in enumerate(starts):
        for i in range(max(s - first, 0), S):
            out[r:r + 1, :, i:i + 1] = F.scaled_dot_product_attention(
                q[r:r + 1, :, i:i + 1], keys[r:r + 1, :, s:first + i + 1], values[r:r + 1, :, s:first + i + 1],
                enable_gqa=self.gqa)
    return out


def batched_float32(self, q, keys, values, mask):
    """One float32 call for the batch: the fastest, and not batch-invariant on this path."""
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self.gqa)


VARIANTS = {"one float64 call (the default)": None, "float32 row by row, a query at a time": rows_float32,
            "one float32 call (not batch-invariant)": batched_float32}


def use(dec, variant) -> None:
    """Decoder._attend replaced by `variant` (None: the decoder's own)."""
    dec.__dict__.pop("_attend", None)
    if variant is not None:
        dec._attend = types.MethodType(variant, dec)


def attention(dec, batch: int) -> None:
    step = inputs(dec, batch)
    times = defaultdict(list)
    for _ in range(8):
        for name, variant in VARIANTS.items():
            use(dec, variant)
            times[name].append(median_ms(lambda: layers(dec, *step), runs=8))
    use(dec, None)
    for name, found in times.items():
        print(f"| batch {batch} | decode step, attention {name} | {statistics.median(found):.2f} ms |")


def consistency(engine) -> None:
    """Per variant: a batch of 18 prompts of many lengths against each prompt alone (32 greedy tokens), the
    prefill's time at batch 1 and 16, and teacher-forced scoring against decoding: the full-depth argmax
    of one forward pass over prompt + answer (Engine.hidden_states, as the page's scores run) against the
    tokens decoding chose."""
    from skipdecode.evaluation.data import E2E_TEST
    from skipdecode.evaluation.data import read_items, resolve

    prompts = [item.prompt for item in read_items(resolve(None, E2E_TEST))[:16]]
    prompts += ["Write a haiku about the sea.", "What is the capital of France?"]
    dec = engine.decoder
    for name, variant in VARIANTS.items():
        use(dec, variant)
        batch = engine.generate(prompts, max_new_tokens=32, stop_at_eos=False).token_ids
        alone = [engine.generate([p], max_new_tokens=32, stop_at_eos=False).token_ids[0] for p in prompts]
        same = sum(a == b for a, b in zip(alone, batch))
        agree = total = 0
        for prompt, answer in zip(prompts, alone):
            ids = engine.encode(prompt) + answer
            h = engine.hidden_states(torch.tensor([ids]))[-1][0, len(ids) - len(answer) - 1:-1]
            agree += int((dec.logits(h).argmax(-1) == torch.tensor(answer)).sum())
            total += len(answer)
        prefill = {b: statistics.median(engine.generate(prompts[:b], max_new_tokens=1).trace.prefill_ms
                                        for _ in range(3)) for b in (1, 16)}
        print(f"| {name} | {same} of {len(prompts)} | {100 * agree / total:.1f}% of {total} | "
              f"{prefill[1]:.0f} / {prefill[16]:.0f} ms |")
    use(dec, None)


def in_turns(variants: dict, rounds: int = 8, runs: int = 10) -> None:
    """Each variant (name: (set-up, step)) timed in turns; the median of its rounds' medians."""
    times = defaultdict(list)
    for _ in range(rounds):
        for name, (set_up, step) in variants.items():
            set_up()
            times[name].append(median_ms(step, runs))
    for name, found in times.items():
        print(f"| {name} | {statistics.median(found):.2f} ms |")


def others(dec) -> None:
    """The smaller attempts: the kernel against rows, float32 outputs of the products (the first 4-bit default), a
    float64 KV cache, one thread."""
    from skipdecode.kernels import q4

    kernel, lin = torch.ops.aten._weight_int4pack_mm_for_cpu, dec.blocks[0].up
    for rows in (1, 4, 16):
        x = torch.randn(rows, lin.in_features).bfloat16()
        print(f"| one {lin.out_features} x {lin.in_features} product (gate and up), {rows} rows | "
              f"{median_ms(lambda: kernel(x, lin.packed, q4.GROUP, lin.scales_zeros), 200):.3f} ms |")
    bfloat16_out = q4.Int4Linear.__call__

    def float32_out(self, x):  # the first 4-bit default's products: the kernel's bfloat16 converted back to float32
        return bfloat16_out(self, x).to(x.dtype)

    for batch in (1, 16):
        step = inputs(dec, batch)
        outputs = []
        for call in (bfloat16_out, float32_out):
            q4.Int4Linear.__call__ = call
            cache = KVCache(dec.num_layers, batch, dec.num_kv_heads, T + 8, dec.head_dim, "cpu", dec.dtype)
            cache.data.copy_(step[0].data)
            outputs.append(dec.logits(layers(dec, cache, *step[1:])[:, -1]))
        print(f"| batch {batch}: the head's logits after 30 layers, bfloat16 against float32 products' outputs | "
              f"{'the same bits' if torch.equal(*outputs) else 'DIFFERENT'} |")
        in_turns({f"batch {batch}, products return bfloat16 (the default)":
                  (lambda: setattr(q4.Int4Linear, "__call__", bfloat16_out), lambda: layers(dec, *step)),
                  f"batch {batch}, products return float32 (the first default)":
                  (lambda: setattr(q4.Int4Linear, "__call__", float32_out), lambda: layers(dec, *step))})
        q4.Int4Linear.__call__ = bfloat16_out
        wide = KVCache(dec.num_layers, batch, dec.num_kv_heads, T + 8, dec.head_dim, "cpu", torch.float64)
        wide.data.copy_(step[0].data)
        in_turns({f"batch {batch}, float32 KV cache (the default)": (lambda: None, lambda: layers(dec, *step)),
                  f"batch {batch}, float64 KV cache": (lambda: None, lambda: layers(dec, wide, *step[1:]))})
    step = inputs(dec, 1)
    threads = torch.get_num_threads()
    in_turns({f"batch 1, {n} thread{'s' * (n > 1)}": (lambda n=n: torch.set_num_threads(n), lambda: layers(dec, *step))
              for n in (threads, 1)})
    torch.set_num_threads(threads)


def compiled(dec) -> None:
    """torch.compile of one product under max-autotune (does inductor bring its own int4 kernel?), of the
    30-layer stack (dynamic shapes), and of one layer (what `Decoder.compile` did until 2026-12-02)."""
    from skipdecode.kernels import q4

    lin = dec.blocks[0].up
    product = lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, lin.packed, q4.GROUP, lin.scales_zeros)  # noqa: E731
    tuned = torch.compile(product, mode="max-autotune-no-cudagraphs", dynamic=False)
    for rows in (1, 16):
        x = torch.randn(rows, lin.in_features).bfloat16()
        same = torch.equal(tuned(x), product(x))
        print(f"| one {lin.out_features} x {lin.in_features} product, {rows} rows: eager / max-autotune | "
              f"{median_ms(lambda: product(x), 200):.3f} / {median_ms(lambda: tuned(x), 200):.3f} ms"
              f"{' (the same bits)' if same else ' (other bits)'} |")
    def stack(x, rope, data, start: int):
        for layer in range(dec.num_layers):
            x = dec._layer(dec.blocks[layer], x, rope, None, data[layer, 0], data[layer, 1], start)
        return x

    cache, x, rope, _ = inputs(dec, 1)
    print(f"| batch 1 | the 30 layers, eager | {median_ms(lambda: stack(x, rope, cache.data, T)):.2f} ms |")
    for name, fn in (("the 30-layer stack", torch.compile(stack, dynamic=True)),
                     ("each layer", None)):
        if fn is None:
            dec._layer = torch.compile(dec._layer, dynamic=True)
            fn = stack
        started = time.perf_counter()
        fn(x, rope, cache.data, T)
        seconds = time.perf_counter() - started
        print(f"| batch 1 | torch.compile of {name} (compiled in {seconds:.0f} s) | "
              f"{median_ms(lambda: fn(x, rope, cache.data, T)):.2f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("parts", "attention", "consistency", "others", "compile"):
        parser.add_argument(f"--{flag}", action="store_true")
    args = parser.parse_args()
    engine = Engine.load(dtype="int4")
    dec = engine.decoder
    print(f"# {platform.processor() or 'cpu'}: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.2f}; {engine.weights_label}")
    with torch.inference_mode():
        for batch in (1, 16):
            if not (args.parts or args.attention or args.compile or args.consistency or args.others):
                products(dec, batch)
            if args.parts:
                parts(dec, batch)
            if args.attention:
                attention(dec, batch)
        if args.others:
            others(dec)
        if args.compile:
            compiled(dec)
    if args.consistency:
        print("| attention | batch of 18 = alone | teacher-forced = decoded | prefill, batch 1 / 16 |")
        print("|---|---|---|---|")
        consistency(engine)
    print(f"# load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
