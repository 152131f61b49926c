"""`skipdecode bench` on the command line: its options, checked before a long run starts, and the run from
loading the engine to the table (timing.run, then report.py)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ..data import E2E_ENV, E2E_TEST, read_items, resolve
from ..machine import machine
from .report import TABLE_FILE, README_BEGIN, README_END, headline, markdown, output_path, readme_parts, \
    update_readme, write_results
from .timing import KERNELS, STEPS, kernel_decoders, run


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
              "cuda_graphs": engine.decoder.device.type == "cuda" and args.graphs != "off"}
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
