"""The rows of `skipdecode bench`'s table, from the timed cases (timing.py): medians, speedups, the bound
and the floor (cost.py), quality against full depth, and llama.cpp's row.

The llama.cpp row (llamacpp.py) runs llama.cpp on the very GGUF file the default model is read from, in its
own decode loop (llama_decode and its C greedy sampler, through llama-cpp-python's bindings), batch 1, greedy,
the same prompt ids and threads, in the same rounds; our batch-1 rows get vs_llamacpp = their tokens/s / its
tokens/s, and ttft_vs_llamacpp = their time to first token (prefill and first token) / its. Its floor counts
the GGUF's stored bytes. llama-cpp-python's high-level `generate`, timed in the same rounds, gives its Python
overhead per token (generate_overhead_ms), kept out of the row's figures.
"""

from __future__ import annotations

import statistics

from ..llamacpp import METHOD
from .cost import CostModel, Reads, schedule_steps, trace_steps


def summarize(engine, items, cases, new_tokens, peer_measure, labels, bandwidth) -> list[dict]:
    """Our rows from the timed cases; `bandwidth` (bytes per second) sets the floor columns."""
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
    return rows


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
