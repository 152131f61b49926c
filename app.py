"""SkipDecode Studio: `python app.py` serves the app (this is also the Hugging Face Spaces entry point).

Listens on 127.0.0.1:7860 by default; on 0.0.0.0 on Spaces (SPACE_ID set) or when GRADIO_SERVER_NAME
says so. The model loads before the server starts, so the first click does not wait for it.
Serving limits come from options or the environment: a host can tighten them without editing code.
On a ZeroGPU Space the models load at start and run only inside GPU calls (app/gpu.py, docs/hosting.md).
"""

from __future__ import annotations

import argparse
import logging
import os

from app import gpu  # first: on ZeroGPU it imports `spaces`, which must patch torch before CUDA is touched
from app.layout import CONCURRENCY, JS, build, theme
from app.style import CSS
from app.settings import Limits
from app.studio import Studio
from skipdecode.batcher import DEFAULT_WINDOW_S, Batcher

QUEUE_SIZE = 64  # requests waiting beyond the running ones; more are told "busy, try again"
WINDOW_ENV = "SKIPDECODE_BATCH_WINDOW_S"  # how long an idle server waits for requests to batch together
QUEUE_ENV = "SKIPDECODE_QUEUE_SIZE"
CONCURRENCY_ENV = "SKIPDECODE_CONCURRENCY"  # decoding requests in flight at once (they share batches)
TIME_LIMIT_ENV = "SKIPDECODE_TIME_LIMIT_S"  # wall time one request may take
MAX_MODELS_ENV = "SKIPDECODE_MAX_MODELS"  # models held in memory at once (the base one included)
BATCHING_ENV = "SKIPDECODE_BATCHING"  # "continuous" (rows join a running batch) or "positions" (batches of one position)
RUN_HISTORY_ENV = "SKIPDECODE_RUN_HISTORY"  # "on": Gradio keeps each visitor's runs in their browser


def server_name() -> str:
    if os.environ.get("GRADIO_SERVER_NAME"):
        return os.environ["GRADIO_SERVER_NAME"]
    return "0.0.0.0" if os.environ.get("SPACE_ID") else "127.0.0.1"


def run_history() -> bool:
    """Whether Gradio saves each visitor's runs in their browser (and links its page /gradio_api/runs): off
    unless $SKIPDECODE_RUN_HISTORY is on. On a shared classroom PC the next student would otherwise find the
    last one's prompts there; off, Gradio also deletes the runs it saved before (docs/hosting.md)."""
    value = os.environ.get(RUN_HISTORY_ENV, "off").strip().lower()
    if value not in ("on", "off", "true", "false", "1", "0", ""):
        raise ValueError(f"${RUN_HISTORY_ENV} must be on or off; got {value!r}")
    return value in ("on", "true", "1")


def positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value
    return parse


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=server_name())
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--queue-size", type=positive(int), default=os.environ.get(QUEUE_ENV, QUEUE_SIZE),
                        help=f"requests that may wait for a free slot (${QUEUE_ENV}, default {QUEUE_SIZE})")
    parser.add_argument("--concurrency", type=positive(int), default=os.environ.get(CONCURRENCY_ENV, CONCURRENCY),
                        help=f"decoding requests in flight at once (${CONCURRENCY_ENV}, default {CONCURRENCY})")
    parser.add_argument("--time-limit", type=positive(float),
                        default=os.environ.get(TIME_LIMIT_ENV, Limits.time_limit_s),
                        help=f"seconds one request may run (${TIME_LIMIT_ENV}, default {Limits.time_limit_s:g})")
    parser.add_argument("--max-models", type=positive(int), default=os.environ.get(MAX_MODELS_ENV, Limits.max_models),
                        help=f"models kept in memory, the base one included, at least 3 (${MAX_MODELS_ENV}, "
                             f"default {Limits.max_models}); others are loaded again when asked for")
    parser.add_argument("--batching", choices=["continuous", "positions"],
                        default=os.environ.get(BATCHING_ENV, "continuous"),
                        help="continuous: plain requests join a running batch at any step (skipdecode/slots.py); "
                             "positions: requests that arrive together share a batch whose rows stay at one position")
    args = parser.parse_args(argv)
    try:
        history = run_history()
    except ValueError as error:
        parser.error(str(error))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        limits = Limits(time_limit_s=gpu.time_limit(args.time_limit), max_models=args.max_models)
    except ValueError as error:
        parser.error(f"--max-models: {error}")
    window = float(os.environ.get(WINDOW_ENV, DEFAULT_WINDOW_S))
    batcher = (gpu.ProcessBatcher if gpu.zero_gpu() else Batcher)(window_s=window, time_limit_s=limits.time_limit_s,
                                                                  continuous=args.batching == "continuous")
    studio = Studio(limits=limits, batcher=batcher)
    if gpu.zero_gpu():
        gpu.preload(studio)  # every model, in this thread; no decoding here: this process has no GPU
    else:
        studio.warm_up()  # load the default model and run it once now, not at the first click
    demo = build(studio, concurrency=args.concurrency)
    demo.queue(max_size=args.queue_size)
    demo.launch(server_name=args.host, server_port=args.port, theme=theme(), css=CSS, js=JS, show_error=False,
                ssr_mode=False, run_history=history, footer_links=["api", "gradio"] + (["runs"] if history else []),
                max_threads=max(40, args.concurrency + 8))


if __name__ == "__main__":
    main()
