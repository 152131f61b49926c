"""The `skipdecode` command line: generate, schedule (and the commands that training and evaluation register)."""

from __future__ import annotations

import argparse
import json
import sys

from .schedule import DECAYS, DEFAULT_WARMUP, MODES, SPREAD, Schedule, for_speedup


def add_schedule_args(parser: argparse.ArgumentParser, horizon_default: int | None = None) -> None:
    group = parser.add_argument_group("schedule (default: full decoding)")
    group.add_argument("--speedup", type=float, help="target speedup: average budget = layers / speedup (1 = full)")
    group.add_argument("--max-budget", type=int, help="layers run at the first generated position")
    group.add_argument("--min-budget", type=int, help="layers run from the horizon on")
    group.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="bottom layers every position runs")
    group.add_argument("--horizon", type=int, default=horizon_default,
                       help="position at which the budget reaches its minimum "
                            "(default: the adapter's training horizon, else max new tokens)")
    group.add_argument("--spread", type=float, default=None,
                       help=f"max budget / average budget of a --speedup schedule, 1 = constant "
                            f"(default: the adapter's, else {SPREAD:g})")
    group.add_argument("--decay", choices=DECAYS, default="linear")
    group.add_argument("--mode", choices=MODES, default="skip", help="skip middle layers, or exit early (ablation)")


def schedule_from_args(args, num_layers: int, horizon: int, trained=None) -> Schedule:
    """The schedule the flags describe. Decoding with an adapter (`trained`) takes the horizon and spread
    it was fine-tuned with, unless --horizon and --spread say otherwise."""
    trained_horizon, trained_spread = (trained.config.get("horizon"), trained.spread) if trained else (None, SPREAD)
    horizon = args.horizon or trained_horizon or horizon
    explicit = args.max_budget is not None or args.min_budget is not None
    if explicit and args.speedup is not None:
        raise ValueError("give either --speedup or --max-budget/--min-budget, not both")
    if explicit and args.spread is not None:
        raise ValueError("--spread shapes a --speedup schedule; --max-budget/--min-budget set the budgets themselves")
    if explicit:
        if args.max_budget is None or args.min_budget is None:
            raise ValueError("--max-budget and --min-budget go together")
        return Schedule(num_layers, args.max_budget, args.min_budget, args.warmup, horizon, args.decay, args.mode)
    if args.speedup is None or args.speedup == 1:
        return Schedule.full(num_layers)
    return for_speedup(args.speedup, num_layers, horizon, args.warmup, args.decay, args.mode,
                       args.spread if args.spread is not None else trained_spread)


def default_adapter(args):
    """(adapter, why): --adapter as given; else, on the default model, the adapter `pick_adapter` picks for
    the prompt at this speedup (for hand-set budgets: a one-for-all adapter of the prompt's task); else none.
    A batch whose prompts would get different adapters runs with the first prompt's, and says so."""
    from .adapters.lora import NONE, pick_adapter
    from .models import DEFAULT_MODEL

    if args.adapter is not None:
        return args.adapter, ("base model: --adapter none" if str(args.adapter) in NONE
                              else f"{args.adapter}: asked for with --adapter")
    if args.model not in (None, DEFAULT_MODEL):
        return None, f"base model: the adapters are trained for {DEFAULT_MODEL}, not {args.model}"
    budgets = args.max_budget is not None or args.min_budget is not None
    speedup = None if budgets else args.speedup or 1.0
    picks = [pick_adapter(speedup, prompt=prompt) for prompt in args.prompt]
    adapter, reason = picks[0]
    others = sum(info != adapter for info, _ in picks[1:])
    if others:
        reason += (f" (picked for the first prompt; {others} other prompt{'s' * (others > 1)} would get another:"
                   f" run {'them' if others > 1 else 'it'} separately or pass --adapter)")
    return adapter, reason


def spans(layers) -> str:
    """(0, 1, 17, 18, 19) -> '0-1,17-19'"""
    out, layers = [], list(layers)
    i = 0
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        out.append(str(layers[i]) if i == j else f"{layers[i]}-{layers[j]}")
        i = j + 1
    return ",".join(out)


def cmd_generate(args) -> int:
    from .adapters.lora import run_speedup
    from .beam import Beam
    from .engine import Engine
    from .sampling import Sampling

    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
    beam = Beam(args.beams, args.length_penalty)
    if beam.width > 1 and sampling != Sampling(seed=args.seed):
        raise ValueError("--beams searches for the likeliest output: it does not sample (drop --temperature, "
                         "--top-p, --top-k)")
    adapter, why = default_adapter(args)
    print(f"[adapter] {why}", file=sys.stderr)
    if args.adapter is None and args.speedup is not None:  # picked for us: run where it was trained
        args.speedup = run_speedup(adapter, args.speedup)
    engine = Engine.load(args.model, device=args.device, dtype=args.dtype, adapter=adapter)
    schedule = schedule_from_args(args, engine.num_layers, args.max_new_tokens, engine.adapter)
    if args.verify:
        engine = verified(engine, args, beam, schedule)
    live = not args.json and len(args.prompt) == 1 and beam.width == 1  # a search's best beam changes: no stream
    shown = [""]

    def show(generation):  # stream a single prompt's text as it grows
        text = generation.texts[0]
        sys.stdout.write(text[len(shown[0]):] if text.startswith(shown[0]) else "\n" + text)
        sys.stdout.flush()
        shown[0] = text

    result = engine.generate(args.prompt, schedule, args.max_new_tokens, sampling, chat=not args.no_chat,
                             on_step=show if live else None, beam=beam)
    trace = result.trace
    if args.json:
        print(json.dumps({
            "model": engine.name,
            "num_layers": engine.num_layers,
            "schedule": schedule.to_dict(),
            "outputs": [{"prompt": p, "text": t, "token_ids": ids}
                        for p, t, ids in zip(args.prompt, result.texts, result.token_ids)],
            "steps": [{"step": s.step, "budget": s.budget, "layers": list(s.layers), "ms": round(s.ms, 3)}
                      for s in trace.steps],
            "prefill_ms": round(trace.prefill_ms, 3),
            "prefix_tokens": trace.prefix_tokens,  # prompt tokens the prefix cache gave the prefill
            "decode_ms": round(trace.decode_ms, 3),
            "tokens_per_s": round(trace.tokens_per_s, 3),
            **(result.verification.to_dict() if args.verify else {}),
        }))
        return 0
    if live:
        print()
    else:
        for prompt, text in zip(args.prompt, result.texts):
            print(f"### {prompt}\n{text}\n")
    beams = f" over {beam.width} beams" if beam.width > 1 else ""
    if args.verify:
        from .speculative.verify import why

        print(f"[verified: {why(result.verification, None)}]", file=sys.stderr)
    print(f"[{engine.name}: {trace.generated_tokens} tokens{beams}, {trace.average_layers:.1f}/{engine.num_layers} layers "
          f"per position, prefill {trace.prefill_ms:.0f} ms, decode {trace.decode_ms:.0f} ms, "
          f"{trace.tokens_per_s:.1f} tokens/s]", file=sys.stderr)
    return 0


def verified(draft, args, beam, schedule):
    """`--verify`: `draft` drafts under the schedule and full depth verifies: the model the app's full side
    runs (with --adapter, that adapter; else the one picked at 1x: e2e-1x for an E2E prompt, the base model
    for any other). Without --adapter, a draft trained to read that verifier's cache on this very schedule
    drafts instead where one is served (adapters.shared_cache_draft)."""
    from .adapters.lora import pick_adapter, shared_cache_draft
    from .engine import Engine
    from .models import DEFAULT_MODEL
    from .speculative.verify import DRAFT_TOKENS, Verified

    if len(args.prompt) != 1 or beam.width > 1:
        raise ValueError("--verify decodes one prompt at a time (batch 1) and does not search beams")
    if args.adapter is not None:
        verifier = draft
    else:
        adapter = pick_adapter(1.0, prompt=args.prompt[0])[0] if args.model in (None, DEFAULT_MODEL) else None
        verifier = Engine.load(args.model, device=args.device, dtype=args.dtype, adapter=adapter)
        made = shared_cache_draft(adapter, args.speedup, schedule) if args.speedup is not None else None
        if made is not None:
            draft = Engine.load(args.model, device=args.device, dtype=args.dtype, adapter=made)
    run = Verified(draft, verifier, DRAFT_TOKENS if args.draft_tokens is None else args.draft_tokens)
    drafter = f" (draft adapter {draft.adapter.name})" if draft.adapter is not None else ""
    print(f"[verify] {run.name}{drafter}, up to {run.k} drafts a pass", file=sys.stderr)
    return run


def cmd_schedule(args) -> int:
    schedule = schedule_from_args(args, args.num_layers, args.horizon)
    steps = args.steps or schedule.horizon + 1
    rows = [{"step": s, "budget": schedule.budget(s), "layers": list(schedule.layers(s))} for s in range(steps)]
    if args.json:
        print(json.dumps({"schedule": schedule.to_dict(), "average_budget": schedule.average_budget(),
                          "steps": rows}))
        return 0
    print(f"{schedule.mode} schedule over {schedule.num_layers} layers: budget {schedule.max_budget} -> "
          f"{schedule.min_budget} by position {schedule.horizon} ({schedule.decay}), warm-up {schedule.warmup}, "
          f"average {schedule.average_budget():.2f} layers = {schedule.num_layers / schedule.average_budget():.2f}x")
    print(f"{'step':>5} {'budget':>6}  {'map':<{schedule.num_layers}}  layers run")
    for row in rows:
        run = set(row["layers"])
        picture = "".join("#" if l in run else "." for l in range(schedule.num_layers))
        print(f"{row['step']:>5} {row['budget']:>6}  {picture}  {spans(row['layers'])}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skipdecode", description="SkipDecode: batched, KV-cached skip decoding")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text with a schedule")
    gen.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch")
    gen.add_argument("--model", default=None, help="model folder or hub id (default: bundled SmolLM2-135M-Instruct)")
    gen.add_argument("--adapter", default=None,
                     help="LoRA adapter name or path, or 'none' (default: the one trained for this speedup)")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    add_schedule_args(gen)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--beams", type=int, default=1, help="beam search of this width (default 1: no search)")
    gen.add_argument("--length-penalty", type=float, default=1.0,
                     help="with --beams: a finished beam scores log-probability / length ** this")
    gen.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    gen.add_argument("--device", default="auto")
    gen.add_argument("--dtype", default="auto", help="auto (on a CPU the bundled model's own 4-bit GGUF blocks, "
                                                    "skipdecode/kernels/q4.py), int4, float32, bfloat16 or float16")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument("--verify", action="store_true",
                     help="verified decoding: the schedule drafts, full depth verifies; the output is full "
                          "decoding's (one prompt)")
    gen.add_argument("--draft-tokens", type=int, default=None,
                     help="with --verify: drafts per verify pass (default: skipdecode.speculative.verify.DRAFT_TOKENS)")
    gen.set_defaults(func=cmd_generate)

    sch = sub.add_parser("schedule", help="print the budget and layers run at each position")
    sch.add_argument("--num-layers", type=int, required=True)
    add_schedule_args(sch, horizon_default=64)
    sch.add_argument("--steps", type=int, default=None, help="positions to print (default: horizon + 1)")
    sch.add_argument("--json", action="store_true")
    sch.set_defaults(func=cmd_schedule)
    for register in _extra_commands():
        register(sub)
    return parser


def _extra_commands():
    """Subcommands that live beside their code (train, eval, bench), imported only when the parser is
    built: the CLI is the top layer and may import every other."""
    from .evaluation import evaluate, verified
    from .evaluation.bench import command as bench
    from .training import train

    return train.register, evaluate.register, bench.register, verified.register


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _quiet_transformers()
    try:
        return args.func(args)
    except ValueError as error:
        print(f"skipdecode {args.command}: error: {error}", file=sys.stderr)
        return 2


def _quiet_transformers() -> None:
    """Loading bars and advice from transformers would interleave with the command's own output."""
    try:
        from transformers.utils import logging

        logging.set_verbosity_error()
        logging.disable_progress_bar()
    except ImportError:
        pass


if __name__ == "__main__":
    sys.exit(main())
