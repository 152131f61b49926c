"""`skipdecode bench`: decoding speed, measured against our own full decoding, the cost-model bound,
transformers' `generate` and the per-token early-exit peer, all in one run.

The cost model counts work in multiply-accumulates per generated token. For the matrix products that is
also the number of weights a token touches, which is what a small batch on a CPU pays for:
    embedding           d                              (one row read)
    each layer it runs  its norm, attention and MLP weights
                        + 2 x heads x head_dim x context   (attention scores and weighted sum over the cache)
    final norm, LM head d + vocab x d                  (SmolLM2-135M: the tied head is ~1/5 of a token's weights)
bound = work per token at full depth / work per token under the method, summed over the decode steps.
A 3x schedule (a third of the layers) cannot give 3x: the head and embedding stay. efficiency =
measured decode speedup / bound. The per-token peer's own work adds the keys and values it must still
compute for the layers above its exit (and an LM head per checked layer with the "softmax" measure).

The weight-streaming floor: a decode step cannot be faster than reading what it needs from memory once:
the weights the batch runs (each row's embedding row, the layers, the key/value rows of the layers only
filled, the heads) plus each row's cached keys and values in the layers it runs, in the bytes the decoder
actually holds them in (`Reads`: each product's `.nbytes`, so 4-bit weights count their codes and scales),
over the read bandwidth `torch.sum` reaches on a tensor of the model's weight size in the same run
(`read_bandwidth`, once per round, round-robin with the cases; the best round counts: a floor is a limit).
floor_ms_per_token = those bytes / that bandwidth, averaged over the decode steps; vs_floor = measured ms
per token / floor (1.0 would be a step that only streams its weights).

The llama.cpp row (llamacpp.py) runs llama.cpp on the very GGUF file the default model is read from, in its
own decode loop (llama_decode and its C greedy sampler, through llama-cpp-python's bindings), batch 1, greedy,
the same prompt ids and threads, in the same rounds; our batch-1 rows get vs_llamacpp = their tokens/s / its
tokens/s, and ttft_vs_llamacpp = their time to first token (prefill and first token) / its. Its floor counts
the GGUF's stored bytes. llama-cpp-python's high-level `generate`, timed in the same rounds, gives its Python
overhead per token (generate_overhead_ms), kept out of the row's figures.

`--step default,eager` times every case with each decode step in turns, in the same rounds (on a GPU: CUDA
graphs and the eager step), so that the graphs' gain is a ratio inside one run; each row names its step, and
the goals are checked per step.

Every run generates exactly `new_tokens` tokens per row (EOS does not stop it), so all rows of a run are
comparable. Rounds go round-robin over the cases, so slow drift in machine load hits every case alike;
the first round is a warm-up and is not counted.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..data import E2E_ENV, read_items, resolve
from ..llamacpp import METHOD

E2E_TEST = "testset_w_refs.csv"
DEFAULT_OUT = Path(__file__).resolve().parents[3] / "assets" / "results" / "bench.csv"  # the app shows it
TABLE_FILE = Path("docs") / "speed.md"  # where `--readme` with no path writes the table (between the markers)
README_BEGIN, README_END = "<!-- skipdecode bench: begin -->", "<!-- skipdecode bench: end -->"
GOALS = {"vs_hf": 1.5, "efficiency": 0.9, "batch_scaling": 6.0, "vs_peer": 1.0, "vs_floor": 1.3,
         "vs_llamacpp": 1.3, "vs_llamacpp_3x": 3.0, "ttft_vs_llamacpp": 1.0}  # the last three: against llama.cpp
# on the same GGUF, timed in its own decode loop (the native layers' goals; docs/speed.md)
GPU_GOALS = {"vs_hf": 3.0, "speedup_3x": 2.0}  # on a GPU (docs/speed.md, "On a GPU"): launches set the pace there


# ---- the cost model -----------------------------------------------------------------------------
@dataclass(frozen=True)
class CostModel:
    """Multiply-accumulates per token, from the decoder's own weight shapes."""

    embedding: int
    layer: int  # weights of one layer (norms, attention projections, MLP)
    kv_only: int  # what `Decoder.fill_kv` touches: the first norm and the key/value rows
    head: int  # final norm and LM head
    attention_width: int  # heads x head_dim: MACs per cached column, for scores and again for values
    kv_width: int = 0  # key/value heads x head_dim: cached elements read per column, for keys and for values

    @classmethod
    def of(cls, dec) -> "CostModel":
        block = dec.blocks[0]
        norms = sum(t.numel() for norm in (block.norm1, block.norm2) for t in norm if t is not None)
        layer = norms + sum(outputs * inputs for outputs, inputs in map(_shape, (block.qkv, block.out, block.up,
                                                                                  block.down)))
        kv_rows = _shape(block.qkv)[1] * 2 * dec.kv_size
        d = dec.embed_tokens.shape[1]
        head = _shape(dec.lm_head)
        return cls(embedding=d, layer=layer, kv_only=block.norm1[0].numel() + kv_rows,
                   head=head[0] * head[1] + d, attention_width=dec.q_size, kv_width=dec.kv_size)

    def token(self, layers: int, context: int, kv_only: int = 0, heads: int = 1) -> int:
        """Work for one token that runs `layers` layers over `context` cached columns."""
        attention = 2 * self.attention_width * context
        return self.embedding + layers * (self.layer + attention) + kv_only * self.kv_only + heads * self.head

    def bound(self, num_layers: int, prompt: int, per_step) -> float:
        """Full-depth work over the decode steps / the method's work. `per_step` lists, for each decode
        step, the tokens' (layers, kv_only, heads) triples."""
        full = method = 0
        for step, tokens in enumerate(per_step):
            context = prompt + step + 1
            full += len(tokens) * self.token(num_layers, context)
            method += sum(self.token(layers, context, kv, heads) for layers, kv, heads in tokens)
        return full / method

    def reads(self, element_bytes: int = 1) -> "Reads":
        """What a step reads if every weight and cached element took `element_bytes` (a dense decoder in
        one dtype; `Reads.of` counts a decoder's real bytes)."""
        return Reads(*(n * element_bytes for n in (self.embedding, self.layer, self.kv_only, self.head,
                                                    2 * self.kv_width)))


def _shape(product) -> tuple[int, int]:
    """(outputs, inputs) of a product, whatever holds its weights: a dense matrix (transformer.Linear), the
    GGUF's 4-bit blocks (q4.Int4Linear) or the 4-bit screened head (q4.RescoredHead, its exact rows)."""
    if hasattr(product, "out_features"):
        return product.out_features, product.in_features
    weight = product.exact if hasattr(product, "exact") else product.weight
    return tuple(weight.shape)


@dataclass(frozen=True)
class Reads:
    """What a decode step reads from memory, part by part, in bytes as the decoder holds its weights
    (`of`): each product's own `.nbytes` (a dense float32 weight 4 bytes an element; a 4-bit one its codes
    and their scales), the norms, one embedding row a token and the cached keys and values in the cache's
    dtype. The floor is these bytes over the read bandwidth; MACs (`CostModel`) do not see a weight's
    format, the floor must."""

    embedding: int  # one row
    layer: int  # norms and the four products of a layer (the mean over the layers)
    kv_only: int  # what `Decoder.fill_kv` reads: the first norm and the key/value rows of the fused product
    head: int  # final norm and LM head, in the head's own format
    cache_column: int  # one cached column of one layer and one row: its keys and values

    @classmethod
    def of(cls, dec) -> "Reads":
        from ...cache import cache_dtype

        size = lambda *tensors: sum(t.numel() * t.element_size() for t in tensors if t is not None)  # noqa: E731
        layers = [size(*b.norm1, *b.norm2) + sum(lin.nbytes for lin in (b.qkv, b.out, b.up, b.down))
                  for b in dec.blocks]
        block = dec.blocks[0]
        # the key/value rows' share of the fused query/key/value product: every row of it takes the same bytes
        kv_rows = block.qkv.nbytes * 2 * dec.kv_size // (dec.q_size + 2 * dec.kv_size)
        cache = cache_dtype(dec.dtype, dec.device).itemsize
        return cls(embedding=size(dec.embed_tokens[0]), layer=round(sum(layers) / len(layers)),
                   kv_only=size(block.norm1[0]) + kv_rows, head=dec.lm_head.nbytes + size(*dec.final_norm),
                   cache_column=2 * dec.kv_size * cache)

    def step(self, layers: int, context: int, rows: int = 1, kv_only: int = 0, heads: int = 1) -> int:
        """What one decode step of `rows` rows reads: the weights, once for the whole batch, and each row's
        embedding row and cached keys and values over `context` columns in the `layers` it runs."""
        cache = rows * layers * self.cache_column * context
        return rows * self.embedding + layers * self.layer + kv_only * self.kv_only + heads * self.head + cache

    def weights(self, num_layers: int) -> int:
        """The bytes of a full-depth token's weights (the size of the bandwidth probe)."""
        return num_layers * self.layer + self.head

    def floor_ms(self, prompt: int, per_step, bytes_per_s: float) -> float:
        """The weight-streaming floor: mean ms per decode step to read `step` at `bytes_per_s`. `per_step`
        as for `CostModel.bound`; the batch runs its deepest row's layers, fills the keys and values of the
        layers above them and checks as many heads as its busiest row."""
        total = sum(self.step(max(t[0] for t in tokens), prompt + step + 1, len(tokens),
                              min(t[1] for t in tokens), max(t[2] for t in tokens))
                    for step, tokens in enumerate(per_step))
        return 1000.0 * total / bytes_per_s / len(per_step)


def schedule_steps(schedule, steps: int, rows: int = 1):
    return [[(schedule.budget(s), 0, 1)] * rows for s in range(steps)]


def trace_steps(trace, heads_per_layer: bool = False):
    """Per decode step, each row's (layers, kv_only, heads) as it ran, from a peer's trace."""
    out = []
    for record in trace.steps:
        exits = getattr(record, "exits", None) or (record.budget,) * record.rows
        L = trace.num_layers
        out.append([(e, L - e, e if heads_per_layer else 1) for e in exits])
    return out


# ---- timing ---------------------------------------------------------------------------------------
def read_bandwidth(probe, repeats: int = 3) -> float:
    """Bytes per second `torch.sum` streams from `probe` (a tensor larger than the caches), best of `repeats`."""
    import torch

    sync = torch.cuda.synchronize if probe.device.type == "cuda" else (lambda: None)
    best = float("inf")
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        torch.sum(probe)
        sync()
        best = min(best, time.perf_counter() - started)
    return probe.numel() * probe.element_size() / best


@dataclass
class Case:
    method: str  # "full", "skipdecode", "early_exit_peer"
    speedup: float
    batch_size: int
    policy: object  # a Schedule or a peers.EarlyExit
    step: str = "default"  # the decode step (STEPS): the engine's own, or eager
    kernel: str = "default"  # the 4-bit products' kernel (KERNELS): the engine's own, or q8 or bf16
    label: str = ""  # the step as it ran (Engine.step_label)
    samples: list = field(default_factory=list)  # (total_ms, first_token_ms, decode_ms per step)
    generation: object = None
    hf: list = field(default_factory=list)  # (total_ms, first_token_ms) of transformers' generate
    hf_tokens: list | None = None
    generate: list = field(default_factory=list)  # llama.cpp's row: samples of llama-cpp-python's Llama.generate


STEPS = {"default": None, "eager": "off"}  # engine.graphs


KERNELS = ("default", "q8", "bf16")  # $SKIPDECODE_KERNEL's settings (skipdecode/kernels/w4a8.py); default: as loaded


def kernel_decoders(engine, kernels, load) -> dict:
    """A decoder for each kernel named (`load()` makes an engine under the current $SKIPDECODE_KERNEL):
    the engine's own for "default", one on each other kernel's base beside it, for timing in turns."""
    from ...kernels.w4a8 import KERNEL_ENV

    decoders = {"default": engine.decoder}
    for kernel in kernels:
        if kernel in decoders:
            continue
        before = os.environ.get(KERNEL_ENV)
        os.environ[KERNEL_ENV] = kernel
        try:
            decoders[kernel] = load().decoder
        finally:
            if before is None:
                del os.environ[KERNEL_ENV]
            else:
                os.environ[KERNEL_ENV] = before
    return decoders


def use_step(engine, step: str) -> str:
    """Set the engine's decode step (STEPS) and return its label (Engine.step_label)."""
    if STEPS[step] is not None:
        engine.graphs = STEPS[step]
    return engine.step_label


def time_engine(engine, ids, policy, new_tokens):
    """Wall clock of one generation: to the first token (the prefill) and over the decode steps after it."""
    started = time.perf_counter()
    first = None
    for generation in engine.stream(ids, policy, max_new_tokens=new_tokens, stop_at_eos=False):
        if first is None:
            first = time.perf_counter()  # the first yield follows the prefill's token
    end = time.perf_counter()
    steps = len(generation.trace.steps)
    return ((end - started) * 1000, (first - started) * 1000, (end - first) * 1000 / max(steps, 1)), generation


def hf_generate(engine, ids, new_tokens):
    """transformers' generate at full depth on the same left-padded token ids, EOS stopping off."""
    import torch

    width = max(len(i) for i in ids)
    device = engine.decoder.device
    input_ids = torch.tensor([[engine.pad_id] * (width - len(i)) + i for i in ids], device=device)
    attention = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids], device=device)
    config = engine.model.generation_config.__class__.from_dict(engine.model.generation_config.to_dict())
    # eos_token_id=[] (not None, which falls back to the model's EOS) generates exactly new_tokens tokens,
    # the same ones our engine generates with stop_at_eos=False (min_new_tokens would mask EOS instead)
    config.update(do_sample=False, max_new_tokens=new_tokens, eos_token_id=[], pad_token_id=engine.pad_id)
    dtype = next(engine.model.parameters()).dtype
    if dtype != engine.decoder.dtype:  # like with like: transformers runs the very weights, in our dtype
        raise RuntimeError(f"transformers' model is in {dtype}, the engine in {engine.decoder.dtype}")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = time.perf_counter()
    with torch.inference_mode():
        out = engine.model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config)
    sync()
    elapsed = (time.perf_counter() - started) * 1000
    if out.shape[1] - width != new_tokens:  # a shorter run would flatter its tokens per second
        raise RuntimeError(f"transformers generated {out.shape[1] - width} tokens, not {new_tokens}")
    return elapsed, out[:, width:].tolist()


# ---- quality --------------------------------------------------------------------------------------
def cut_at_eos(ids: list[int], eos_ids) -> list[int]:
    return next((ids[: i + 1] for i, t in enumerate(ids) if t in eos_ids), ids)


def agreement(ids: list[list[int]], full: list[list[int]], eos_ids) -> float:
    """Share of the full-depth outputs' tokens (each up to its EOS) reproduced at the same position."""
    same = total = 0
    for mine, ref in zip(ids, full):
        ref = cut_at_eos(ref, eos_ids)
        same += sum(a == b for a, b in zip(mine, ref))
        total += len(ref)
    return same / total if total else 0.0


# ---- the run --------------------------------------------------------------------------------------
def run(engine, items, speedups=(1, 2, 3, 4, 5), batch_sizes=(1, 4, 16), new_tokens=64, repeats=5,
        warmup_rounds=1, hf=True, peer=True, peer_measure="state", progress=None, labels=None, llamacpp=None,
        steps=("default",), decoders=None):
    """All cases of one benchmark; returns (rows, goals). `items`: E2E items (data.Item), at least as
    many as the largest batch; a batch of B takes the first B. `labels` go into every row of ours.
    `steps`: the decode steps (STEPS) every case runs with, in turns; `decoders` (kernel_decoders): the
    product kernels every case runs on, in turns.
    `llamacpp` (llamacpp_child.for_engine's runner) adds its row: the first prompt, batch 1, full depth, in the same
    rounds; where it ends (its child crashed, llamacpp_child.py), one line says why and the rest goes on."""
    import torch

    from ..llamacpp import Unavailable

    from ..peers import calibrate
    from ...schedule import Schedule, for_speedup

    say = progress or (lambda message: None)
    L = engine.num_layers
    if 1 not in speedups:
        speedups = (1, *speedups)  # every measured speedup is against full decoding in the same run
    ids = [engine.encode(item.prompt) for item in items]
    schedules = {s: Schedule.full(L) if s == 1 else for_speedup(s, L, horizon=new_tokens) for s in speedups}
    decoders = decoders or {"default": engine.decoder}
    cases = [Case("full" if s == 1 else "skipdecode", s, b, schedules[s], step, kernel)
             for kernel in decoders for step in steps for s in speedups for b in batch_sizes]
    if peer:
        biggest = ids[: max(batch_sizes)]
        for s in speedups:
            if s == 1:
                continue
            target = schedules[s].average_budget(new_tokens - 1)
            say(f"calibrating the early-exit peer to {target:.2f} layers per token ({s}x)")
            policy, reached = calibrate(engine, biggest, target, new_tokens, measure=peer_measure)
            say(f"  threshold {policy.threshold:.5f}: {reached:.2f} layers per token")
            cases += [Case("early_exit_peer", s, b, policy, step, kernel) for kernel in decoders for step in steps
                      for b in batch_sizes]

    timed = cases + [Case(METHOD, 1, 1, llamacpp)] if llamacpp is not None else cases
    weight_bytes = Reads.of(engine.decoder).weights(L)
    probe = torch.ones(weight_bytes // 4, dtype=torch.float32, device=engine.decoder.device)
    bandwidth = []  # bytes per second, one per counted round
    for round_ in range(warmup_rounds + repeats):
        counted = round_ >= warmup_rounds
        say(f"round {round_ + 1}/{warmup_rounds + repeats}" + ("" if counted else " (warm-up, not counted)"))
        if counted:
            bandwidth.append(read_bandwidth(probe))
        for case in list(timed):
            if case.method == METHOD:
                try:
                    sample, case.generation = llamacpp.time(ids[0], new_tokens)
                    generate_sample, case.hf_tokens = llamacpp.time_generate(ids[0], new_tokens)
                except Unavailable as why:
                    say(str(why))
                    llamacpp, timed = None, cases
                    continue
                if counted:
                    case.samples.append(sample)
                    case.generate.append(generate_sample)
                continue
            engine.decoder = decoders[case.kernel]
            use_step(engine, case.step)
            sample, generation = time_engine(engine, ids[: case.batch_size], case.policy, new_tokens)
            case.label = engine.step_label + (f"; {engine.weights_label}" if len(decoders) > 1 else "")
            if counted:
                case.samples.append(sample)
            case.generation = generation
            if hf and case.method == "full":
                total, tokens = hf_generate(engine, ids[: case.batch_size], new_tokens)
                first, _ = hf_generate(engine, ids[: case.batch_size], 1)
                if counted:
                    case.hf.append((total, first))
                case.hf_tokens = tokens
    del probe
    engine.decoder = decoders["default"]
    rows, _ = summarize(engine, items, cases, new_tokens, peer_measure, labels or {}, max(bandwidth))
    if llamacpp is not None:
        rows = with_llamacpp(rows, llamacpp_row(engine, timed[-1], cases, new_tokens, max(bandwidth)))
    return rows, goals(rows)


def summarize(engine, items, cases, new_tokens, peer_measure, labels, bandwidth):
    """Rows and goals from the timed cases; `bandwidth` (bytes per second) sets the floor columns."""
    from ..evaluate import score
    from ...models import dtype_name
    from ..peers import average_token_layers

    cost, reads = CostModel.of(engine.decoder), Reads.of(engine.decoder)
    dtype = engine.decoder.dtype
    L, eos = engine.num_layers, engine.eos_ids
    full = {(c.step, c.kernel, c.batch_size): c for c in cases if c.method == "full"}
    biggest = {}
    for case in cases:  # quality is scored on the largest batch of each method, speedup and step
        key = (case.method, case.speedup, case.step, case.kernel)
        if key not in biggest or case.batch_size > biggest[key].batch_size:
            biggest[key] = case
    rows = []
    for case in cases:
        B, trace = case.batch_size, case.generation.trace
        ms = statistics.median(s[2] for s in case.samples)
        steps = len(trace.steps)
        if case.method == "early_exit_peer":
            per_step = trace_steps(trace, heads_per_layer=peer_measure == "softmax")
            layers = average_token_layers(trace)
        else:
            per_step = schedule_steps(case.policy, steps, rows=B)
            layers = trace.average_layers
        bound = cost.bound(L, trace.prompt_tokens, per_step)
        floor = reads.floor_ms(trace.prompt_tokens, per_step, bandwidth)
        base = full[(case.step, case.kernel, B)]
        base_ms = statistics.median(sorted(s[2] for s in base.samples))
        base_total = statistics.median(sorted(s[0] for s in base.samples))
        total = statistics.median(s[0] for s in case.samples)
        scored = biggest[(case.method, case.speedup, case.step, case.kernel)].generation
        reference = biggest[("full", 1, case.step, case.kernel)].generation.token_ids
        texts = [engine.tokenizer.decode(cut_at_eos(t, eos), skip_special_tokens=True) for t in scored.token_ids]
        row = {
            "method": case.method, "dtype": dtype_name(dtype), "device": engine.decoder.device.type, **labels,
            "step": case.label,
            "speedup": case.speedup, "batch_size": B, "new_tokens": new_tokens, "prompt_tokens": trace.prompt_tokens,
            "repeats": len(case.samples), "layers_per_token": round(layers, 3),
            "batch_layers_per_step": round(trace.average_layers, 3),
            **timings(case.samples, B, new_tokens, floor, bandwidth),
            "measured_speedup": round(base_ms / ms, 3), "e2e_speedup": round(base_total / total, 3),
            "bound": round(bound, 3), "efficiency": round(base_ms / ms / bound, 3),
            **{metric: round(value, 2) for metric, value in score(items[: len(texts)], texts).items()},
            "agreement": round(agreement(scored.token_ids, reference, eos), 4), "quality_prompts": len(texts),
        }
        if case.method == "early_exit_peer":
            row["peer_threshold"] = case.policy.threshold
            row["peer_measure"] = case.policy.measure
        if case.hf:
            hf_total = statistics.median(sorted(h[0] for h in case.hf))
            hf_decode = statistics.median(sorted((h[0] - h[1]) / (new_tokens - 1) for h in case.hf))
            row.update({
                "hf_generate_tokens_per_s": round(1000 * B * new_tokens / hf_total, 2),
                "hf_generate_ms_per_token": round(hf_decode, 3),
                "hf_generate_decode_tokens_per_s": round(1000 * B / hf_decode, 2),
                "vs_hf": round(hf_total / total, 3), "vs_hf_decode": round(hf_decode / ms, 3),
                "hf_same_tokens": case.hf_tokens == case.generation.token_ids, "hf_dtype": row["dtype"],
            })
        rows.append(row)
    return rows, goals(rows)


def timings(samples, batch: int, new_tokens: int, floor_ms: float, bandwidth: float) -> dict:
    """A row's timing columns from its (total ms, first-token ms, decode ms per step) samples: medians,
    the decode range, and the floor and bandwidth of the run."""
    totals, firsts, decodes = (sorted(x) for x in zip(*samples))
    ms, total = statistics.median(decodes), statistics.median(totals)
    return {"ms_per_token": round(ms, 3), "ms_per_token_min": round(decodes[0], 3),
            "ms_per_token_max": round(decodes[-1], 3), "tokens_per_s": round(1000 * batch / ms, 2),
            "floor_ms_per_token": round(floor_ms, 3), "vs_floor": round(ms / floor_ms, 3),
            "read_gb_s": round(bandwidth / 1e9, 2), "first_token_ms": round(statistics.median(firsts), 3),
            "e2e_ms_per_token": round(total / new_tokens, 3),
            "e2e_tokens_per_s": round(1000 * batch * new_tokens / total, 2)}


def llamacpp_row(engine, case, cases, new_tokens: int, bandwidth: float) -> dict:
    """llama.cpp's row, timed like ours; its floor from the bytes of its GGUF file as stored (4-bit blocks
    and scales, the tied head in its own type; float16 keys and values); and how many of our full-depth
    batch-1 tokens its greedy tokens reproduce (its 4-bit products against our float32 copy of the same
    blocks: close, not equal)."""
    from ..llamacpp import CACHE_BYTES, gguf_bytes
    from ..quality import common_prefix
    from ...schedule import Schedule

    runner, L = case.policy, engine.num_layers
    full = next(c for c in cases if c.method == "full" and c.batch_size == 1)
    prompt, reference = full.generation.trace.prompt_tokens, full.generation.token_ids[0]
    stored = gguf_bytes(runner.gguf)
    reads = Reads(stored["embedding"], stored["layer"], 0, stored["head"], 2 * engine.decoder.kv_size * CACHE_BYTES)
    floor = reads.floor_ms(prompt, schedule_steps(Schedule.full(L), new_tokens - 1), bandwidth)
    return {"method": METHOD, "weights": f"GGUF {runner.gguf.name} ({', '.join(stored['types'])})",
            "device": "cpu", "threads": runner.threads, "llama_cpp_python": runner.version, "speedup": 1,
            "batch_size": 1, "new_tokens": new_tokens, "prompt_tokens": prompt, "repeats": len(case.samples),
            "layers_per_token": float(L), "batch_layers_per_step": float(L),
            **timings(case.samples, 1, new_tokens, floor, bandwidth),
            "agreement": round(agreement([case.generation], [reference], engine.eos_ids), 4),
            "same_prefix_tokens": common_prefix(case.generation, reference),
            **high_level(case)}


def high_level(case) -> dict:
    """llama-cpp-python's `Llama.generate` beside llama.cpp's own loop (the row's figures): its medians, its
    Python overhead per decoded token and at the first token, and whether its tokens are the loop's."""
    if not case.generate:
        return {}
    (_, first, decode), (_, native_first, native_decode) = ([statistics.median(x) for x in zip(*samples)]
                                                            for samples in (case.generate, case.samples))
    return {"generate_ms_per_token": round(decode, 3), "generate_first_token_ms": round(first, 3),
            "generate_overhead_ms": round(decode - native_decode, 3),
            "generate_first_token_overhead_ms": round(first - native_first, 3),
            "generate_same_tokens": case.hf_tokens == case.generation}


def with_llamacpp(rows, cpp: dict) -> list[dict]:
    """Our batch-1 rows with their tokens per second over llama.cpp's (decode; and end to end), then its row."""
    for row in rows:
        if row["batch_size"] == 1:
            row["vs_llamacpp"] = round(row["tokens_per_s"] / cpp["tokens_per_s"], 3)
            row["vs_llamacpp_e2e"] = round(row["e2e_tokens_per_s"] / cpp["e2e_tokens_per_s"], 3)
            row["ttft_vs_llamacpp"] = round(row["first_token_ms"] / cpp["first_token_ms"], 3)
    return rows + [cpp]


def goals(rows) -> list[dict]:
    """The speed goals, each as the ratio this run measured against its threshold; with rows of more than
    one decode step, checked for each step (named in the goal)."""
    steps = list(dict.fromkeys(r["step"] for r in rows if "step" in r))
    if len(steps) < 2:
        return step_goals(rows)
    return [{**g, "goal": f"[{step}] {g['goal']}"} for step in steps
            for g in step_goals([r for r in rows if r.get("step", step) == step])]


def step_goals(rows) -> list[dict]:
    out = []
    at = {(r["method"], r["speedup"], r["batch_size"]): r for r in rows}

    def goal(name, value, threshold, op=">="):
        ok = {">=": value >= threshold, ">": value > threshold, "<=": value <= threshold}[op]
        out.append({"goal": name, "value": round(value, 3), "op": op, "threshold": threshold, "holds": bool(ok)})

    if rows and rows[0].get("device") == "cuda":
        if "vs_hf" in at.get(("full", 1, 1), {}):
            goal("GPU, full depth, batch 1: tokens/s vs transformers generate (end to end)",
                 at[("full", 1, 1)]["vs_hf"], GPU_GOALS["vs_hf"])
        for b in (1, 16):
            if ("skipdecode", 3, b) in at:
                goal(f"GPU, SkipDecode 3x, batch {b}: speedup over full depth",
                     at[("skipdecode", 3, b)]["measured_speedup"], GPU_GOALS["speedup_3x"])
        return out

    if ("full", 1, 1) in at and "vs_hf" in at[("full", 1, 1)]:
        goal("full depth, batch 1: tokens/s vs transformers generate (end to end)", at[("full", 1, 1)]["vs_hf"],
             GOALS["vs_hf"])
    if "vs_floor" in at.get(("full", 1, 1), {}):
        goal("full depth, batch 1: ms/token / weight-streaming floor", at[("full", 1, 1)]["vs_floor"],
             GOALS["vs_floor"], op="<=")
    if (METHOD, 1, 1) in at and "vs_llamacpp" in at.get(("full", 1, 1), {}):
        goal("full depth, batch 1: tokens/s / llama.cpp's (same GGUF, threads and prompt)",
             at[("full", 1, 1)]["vs_llamacpp"], GOALS["vs_llamacpp"])
    if (METHOD, 1, 1) in at and "vs_llamacpp" in at.get(("skipdecode", 3, 1), {}):
        goal("SkipDecode 3x, batch 1: tokens/s / llama.cpp's full-depth tokens/s",
             at[("skipdecode", 3, 1)]["vs_llamacpp"], GOALS["vs_llamacpp_3x"])
    if (METHOD, 1, 1) in at and "ttft_vs_llamacpp" in at.get(("full", 1, 1), {}):
        full = at[("full", 1, 1)]
        goal(f"full depth, batch 1: time to first token of the {full['prompt_tokens']}-token prompt / llama.cpp's",
             full["ttft_vs_llamacpp"], GOALS["ttft_vs_llamacpp"], op="<=")
    speedups = sorted({r["speedup"] for r in rows})
    for s in (s for s in speedups if s != 1):
        for b in (1, 16):
            if ("skipdecode", s, b) in at:
                goal(f"SkipDecode {s}x, batch {b}: efficiency (measured / bound)",
                     at[("skipdecode", s, b)]["efficiency"], GOALS["efficiency"])
    for s in speedups:
        method = "full" if s == 1 else "skipdecode"
        if (method, s, 1) in at and (method, s, 16) in at:
            goal(f"{s}x: batch 16 tokens/s / batch 1 tokens/s",
                 at[(method, s, 16)]["tokens_per_s"] / at[(method, s, 1)]["tokens_per_s"], GOALS["batch_scaling"])
    for s in speedups:
        if ("early_exit_peer", s, 16) in at and ("skipdecode", s, 16) in at:
            goal(f"{s}x, batch 16: SkipDecode tokens/s / early-exit peer tokens/s (equal layers per token)",
                 at[("skipdecode", s, 16)]["tokens_per_s"] / at[("early_exit_peer", s, 16)]["tokens_per_s"],
                 GOALS["vs_peer"], op=">")
    return out


def machine() -> dict:
    import torch

    from ...models import cpu_flags

    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "isa": sorted(cpu_flags()), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "device": "cuda: " + torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "load_average": [round(x, 2) for x in os.getloadavg()]}


# ---- output ---------------------------------------------------------------------------------------
COLUMNS = [("method", "method", "{}"), ("speedup", "x", "{:g}"), ("batch_size", "batch", "{}"),
           ("layers_per_token", "layers/token", "{:.1f}"), ("batch_layers_per_step", "layers/step", "{:.1f}"),
           ("ms_per_token", "ms/token", "{:.1f}"), ("floor_ms_per_token", "floor ms", "{:.1f}"),
           ("vs_floor", "vs floor", "{:.2f}"),
           ("tokens_per_s", "tok/s", "{:.1f}"), ("e2e_tokens_per_s", "e2e tok/s", "{:.1f}"),
           ("first_token_ms", "TTFT ms", "{:.1f}"),
           ("measured_speedup", "speedup", "{:.2f}"), ("bound", "bound", "{:.2f}"),
           ("efficiency", "efficiency", "{:.2f}"), ("hf_generate_tokens_per_s", "HF tok/s", "{:.1f}"),
           ("vs_hf", "vs HF", "{:.2f}"), ("vs_llamacpp", "vs llama.cpp", "{:.2f}"), ("bleu", "BLEU", "{:.1f}"), ("ser", "SER %", "{:.1f}"),
           ("agreement", "agree", "{:.2f}"), ("step", "step", "{}")]


def markdown(rows, goal_rows) -> str:
    lines = ["| " + " | ".join(title for _, title, _ in COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt.format(row[key]) if key in row else "" for key, _, fmt in COLUMNS) + " |")
    lines.append("")
    for g in goal_rows:
        lines.append(f"- {g['goal']}: {g['value']:.2f} (goal {g['op']} {g['threshold']:g}): "
                     f"{'holds' if g['holds'] else 'does NOT hold'}")
    return "\n".join(lines)


def headline(report: dict) -> str:
    m = report["machine"]
    labels = ", ".join(f"{k} {v}" for k, v in report["labels"].items())
    isa = f" [{' '.join(m['isa']) or 'no avx2'}]" if "isa" in m else ""
    precision = f"; {report['precision']}" if "precision" in report else ""
    bandwidth = f"; read bandwidth {report['read_gb_s']} GB/s" if "read_gb_s" in report else ""
    steps = f"; decode steps: {', '.join(report['steps'])}" if report.get("steps") else ""
    return (f"{report['model']} on {m['cpu']}{isa} ({m['cores']} cores, {m['torch_threads']} torch threads, "
            f"{m['device']}), torch {m['torch']}, {report['date']}{precision}{steps}{bandwidth}; load average "
            f"{m['load_average'][0]} before, {report['load_average_after'][0]} after; {labels}; "
            f"{report['seconds']:.0f} s")


def readme_parts(path: Path) -> tuple[str, str]:
    """The text before and after the README's benchmark section (checked before a long run starts)."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    if README_BEGIN not in text or README_END not in text.split(README_BEGIN, 1)[1]:
        raise ValueError(f"{path} has no '{README_BEGIN}' ... '{README_END}' section to fill")
    head, rest = text.split(README_BEGIN, 1)
    return head, rest.split(README_END, 1)[1]


def update_readme(path: Path, report: dict) -> None:
    """Put this run's table between the README's markers, so the figures there are this command's."""
    head, tail = readme_parts(path)
    body = (f"\n`{report['command']}`\n\n{headline(report)}\n\n"
            f"{markdown(report['rows'], report['goals'])}\n")
    path.write_text(head + README_BEGIN + body + README_END + tail, encoding="utf-8")


def write_results(rows, report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with open(out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def speed_figure(rows):
    """Measured decode speedup against the cost-model bound, per batch size (a pure function of the
    benchmark rows, a list of dicts or a DataFrame; the app's Results tab shows it)."""
    import plotly.graph_objects as go

    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)
    figure = go.Figure()
    bound = sorted({(r["speedup"], r["bound"]) for r in rows if r["method"] in ("full", "skipdecode")})
    if bound:
        figure.add_trace(go.Scatter(x=[b[0] for b in bound], y=[b[1] for b in bound], name="cost-model bound",
                                    mode="lines", line=dict(dash="dash", color="gray")))
    for method, symbol in (("skipdecode", "circle"), ("early_exit_peer", "x")):
        for batch in sorted({r["batch_size"] for r in rows}):
            pts = sorted((r["speedup"], r["measured_speedup"], r["tokens_per_s"]) for r in rows
                         if r["batch_size"] == batch and (r["method"] == method or
                                                         (method == "skipdecode" and r["method"] == "full")))
            if pts:
                figure.add_trace(go.Scatter(
                    x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", marker_symbol=symbol,
                    name=f"{'SkipDecode' if method == 'skipdecode' else 'early-exit peer'}, batch {batch}",
                    customdata=[p[2] for p in pts],
                    hovertemplate="target %{x}x: measured %{y:.2f}x, %{customdata:.0f} tokens/s<extra></extra>"))
    figure.update_layout(title="Decode speedup against full decoding", xaxis_title="target speedup (layers)",
                         yaxis_title="measured speedup", template="plotly_white", legend_title_text="")
    return figure


# ---- the command ----------------------------------------------------------------------------------
def _numbers(text: str, kind=float) -> tuple:
    try:
        values = tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"expected a comma-separated list of numbers, got {text!r}") from None
    if not values:
        raise ValueError("expected at least one value")
    return values


def cmd_bench(args) -> int:
    import torch

    from ...engine import Engine
    from ...models import dtype_name, precision_reason

    speedups = tuple(int(s) if float(s).is_integer() else s for s in _numbers(args.speedups))
    batch_sizes = _numbers(args.batch_sizes, int)
    if any(b < 1 for b in batch_sizes) or any(s < 1 for s in speedups):
        raise ValueError("batch sizes and speedups must be >= 1")
    if args.new_tokens < 2 or args.repeats < 1 or args.threads < 0:
        raise ValueError("--new-tokens must be >= 2, --repeats >= 1 and --threads >= 0")
    if args.readme:
        readme_parts(Path(args.readme))
    try:
        items = read_items(resolve(args.data, E2E_TEST))
    except FileNotFoundError as error:
        raise ValueError(str(error)) from None
    if len(items) < max(batch_sizes):
        raise ValueError(f"the E2E file holds {len(items)} distinct MRs; the largest batch needs {max(batch_sizes)}")
    items = items[: max(batch_sizes)]
    if args.threads:
        torch.set_num_threads(args.threads)
    say = (lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))
    before = machine()
    if before["load_average"][0] > 0.5 * (before["cores"] or 1):
        say(f"warning: load average {before['load_average'][0]} on {before['cores']} cores before the run; "
            "other processes will distort the timings (both the figures and their ratios)")
    started = time.perf_counter()
    engine = Engine.load(args.model, device=args.device, dtype=args.dtype, adapter=args.adapter)
    if args.no_pack:
        from ...transformer import Decoder

        engine.decoder = Decoder(engine.model, pack=False)
    engine.graphs = args.graphs
    # Every round prefills its whole prompt, as llama.cpp's row does from its cleared cache: the prefix cache
    # would otherwise serve the warm-up's copy of the prompt, and the time to first token would time a copy.
    engine.prefixes = None
    steps = tuple(dict.fromkeys(s.strip() for s in args.step.split(",") if s.strip()))
    if not steps or any(s not in STEPS for s in steps):
        raise ValueError(f"--step takes a comma-separated list of {', '.join(STEPS)}; got {args.step!r}")
    kernels = tuple(dict.fromkeys(k.strip() for k in args.kernel.split(",") if k.strip()))
    if not kernels or any(k not in KERNELS for k in kernels):
        raise ValueError(f"--kernel takes a comma-separated list of {', '.join(KERNELS)}; got {args.kernel!r}")
    if kernels != ("default",) and engine.decoder.weights is None:
        raise ValueError("--kernel compares the 4-bit path's product kernels; this run is not on it")
    decoders = kernel_decoders(engine, kernels, lambda: Engine.load(args.model, device=args.device, dtype=args.dtype,
                                                                       adapter=args.adapter))
    dtype = dtype_name(engine.decoder.dtype)
    labels = {"weights": getattr(engine, "weights_label", dtype), "packed": engine.decoder.pack,
              "compiled": args.compile, "cuda_graphs": engine.decoder.device.type == "cuda" and args.graphs != "off"}
    if args.compile:
        labels["compile_s"] = compile_engine(engine, items, batch_sizes, args.new_tokens, say)
    llamacpp = None if args.no_llamacpp else open_llamacpp(engine, items, batch_sizes, args.new_tokens, say)
    rows, goal_rows = run(engine, items, speedups, batch_sizes, args.new_tokens, args.repeats,
                          hf=not args.no_hf, peer=not args.no_peer, peer_measure=args.peer_measure, progress=say,
                          labels=labels, llamacpp=llamacpp, steps=steps, decoders=decoders)
    if llamacpp is not None:
        llamacpp.close()
    report = {"command": " ".join(["skipdecode", *sys.argv[1:]]), "model": engine.name, "machine": before,
              "date": time.strftime("%Y-%m-%d"), "dtype": dtype, "weights": labels["weights"],
              "precision": precision_reason(engine.decoder.device) if args.dtype == "auto" else f"{dtype}: --dtype",
              "read_gb_s": rows[0]["read_gb_s"], "labels": labels,
              "steps": list(dict.fromkeys(r["step"] for r in rows if "step" in r)),
              "load_average_after": [round(x, 2) for x in os.getloadavg()],
              "seconds": round(time.perf_counter() - started, 1), "rows": rows, "goals": goal_rows}
    out = output_path(args.out, args.readme)
    if out:
        write_results(rows, report, Path(out))
        say(f"results written to {out} and its .json")
    if args.readme:
        update_readme(Path(args.readme), report)
    if args.json:
        print(json.dumps(report))
    else:
        print(headline(report))
        print(markdown(rows, goal_rows))
    return 0


def output_path(out: str | None, readme: str | None) -> str:
    """--out as given ('' for none); else assets/results/bench.csv for a run that writes the docs' table
    (--readme), which the app's Results tab then shows beside it; any other run goes to a fresh temporary
    folder, so that a quick measurement never replaces the shipped table."""
    if out is not None:
        return out
    if readme:
        return str(DEFAULT_OUT)
    return str(Path(tempfile.mkdtemp(prefix="skipdecode-bench-")) / "bench.csv")


def open_llamacpp(engine, items, batch_sizes, new_tokens, say):
    """llama.cpp for this run's row (llamacpp.py), or None after one line saying why there is none."""
    import torch

    from ..llamacpp import Unavailable
    from ..llamacpp_child import for_engine

    try:
        if 1 not in batch_sizes:
            raise Unavailable("no llama.cpp row: it runs batch 1, and --batch-sizes has no 1")
        if engine.decoder.device.type != "cpu":
            raise Unavailable("no llama.cpp row: it is compared on the CPU, and this run is on "
                              f"{engine.decoder.device.type}")
        runner = for_engine(engine, len(engine.encode(items[0].prompt)) + new_tokens, torch.get_num_threads())
    except Unavailable as why:
        say(str(why))
        return None
    say(f"llama.cpp (llama-cpp-python {runner.version}) on {runner.gguf.name}, {runner.threads} threads")
    return runner


def compile_engine(engine, items, batch_sizes, new_tokens, say) -> float:
    """torch.compile the decoder and run one generation per batch size so that every graph (prefill and
    decode, batch 1 and batch > 1) is compiled before timing; returns those seconds, compilation included."""
    say("compiling (torch.compile)")
    engine.decoder.compile()
    started = time.perf_counter()
    for batch in sorted(set(batch_sizes)):
        engine.generate([item.prompt for item in items[:batch]], max_new_tokens=new_tokens, stop_at_eos=False)
    return round(time.perf_counter() - started, 1)


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="measure decoding speed against full depth, the bound, transformers "
                                                "and the per-token early-exit peer")
    bench.add_argument("--speedups", default="1,2,3,4,5", help="comma-separated (1, full depth, is always run)")
    bench.add_argument("--batch-sizes", default="1,4,16")
    bench.add_argument("--new-tokens", type=int, default=64, help="tokens per row; EOS does not stop a run")
    bench.add_argument("--repeats", type=int, default=5, help="counted rounds after one warm-up round")
    bench.add_argument("--data", default=None, help=f"E2E test CSV or folder (default: ${E2E_ENV} or ../shared/data/e2e)")
    bench.add_argument("--model", default=None)
    bench.add_argument("--adapter", default=None, help="LoRA adapter merged for every row (speed is unchanged; "
                                                       "the quality columns follow it)")
    bench.add_argument("--device", default="auto")
    bench.add_argument("--dtype", default="auto", help="auto (skipdecode.models.precision: the app's default on "
                                                      "this machine), float32, bfloat16 or float16")
    bench.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    bench.add_argument("--compile", action="store_true",
                       help="torch.compile the layer math first (compile time reported as compile_s)")
    bench.add_argument("--no-pack", action="store_true", help="plain F.linear instead of oneDNN-packed weights")
    bench.add_argument("--graphs", choices=("auto", "on", "off"), default="auto",
                       help="CUDA graphs for the decode steps (auto: on a GPU; off: eager, to compare)")
    bench.add_argument("--kernel", default="default",
                       help="4-bit product kernels to time in turns, comma-separated: default (the engine's own: "
                            "$SKIPDECODE_KERNEL), q8 (skipdecode/kernels/w4a8.c), bf16 (PyTorch's int4 kernel); each row "
                            "names its weights")
    bench.add_argument("--step", default="default",
                       help="decode steps to time in turns, comma-separated: default (the engine's own: CUDA graphs "
                            "on a GPU), eager; each row names its step")
    bench.add_argument("--no-hf", action="store_true", help="skip transformers' generate")
    bench.add_argument("--no-peer", action="store_true", help="skip the per-token early-exit peer")
    bench.add_argument("--no-llamacpp", action="store_true",
                       help="skip llama.cpp on the same GGUF (a batch-1 row; needs llama-cpp-python: make bench-peers)")
    bench.add_argument("--peer-measure", choices=("state", "softmax"), default="state")
    bench.add_argument("--out", default=None,
                       help="CSV to write (and .json beside it); '' for none (default: assets/results/bench.csv with "
                            "--readme, the table the docs and the app show; otherwise a temporary folder)")
    bench.add_argument("--readme", nargs="?", const=str(TABLE_FILE), default=None,
                       help=f"also write the table into this file (alone: {TABLE_FILE}) between "
                            f"'{README_BEGIN}' and '{README_END}'")
    bench.add_argument("--json", action="store_true", help="print one JSON object (rows, goals, machine)")
    bench.set_defaults(func=cmd_bench)
