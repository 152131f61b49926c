"""The timing loop of `skipdecode bench`: every case (method, speedup, batch size, decode step, product
kernel) timed in the same rounds, with transformers' `generate` and llama.cpp beside them.

Every run generates exactly `new_tokens` tokens per row (EOS does not stop it), so all rows of a run are
comparable. Rounds go round-robin over the cases, so slow drift in machine load hits every case alike;
the first round is a warm-up and is not counted.

`--step default,eager` times every case with each decode step in turns, in the same rounds (on a GPU: CUDA
graphs and the eager step), so that the graphs' gain is a ratio inside one run; each row names its step, and
the goals are checked per step (goals.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from ..llamacpp import METHOD
from .cost import Reads
from .goals import goals
from .rows import llamacpp_row, summarize, with_llamacpp


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
    rows = summarize(engine, items, cases, new_tokens, peer_measure, labels or {}, max(bandwidth))
    if llamacpp is not None:
        rows = with_llamacpp(rows, llamacpp_row(engine, timed[-1], cases, new_tokens, max(bandwidth)))
    return rows, goals(rows)
