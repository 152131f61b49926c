"""GPU hosting: ZeroGPU's conventions where they apply, nothing changed anywhere else.

A dedicated GPU (a T4 or A10G Space, `docker run --gpus all`) needs nothing from this module: the engine
runs on CUDA whenever torch sees a device (skipdecode.models.resolve_device), in the batcher's thread.

ZeroGPU (Spaces hardware `zero-a10g`) is different: the server process never has a GPU. The `spaces`
package patches torch there, so that weights moved to "cuda" in the main thread are only registered, and
lends a GPU for each call of a function decorated with `spaces.GPU(duration=...)`; `duration` may be a
callable of the call's arguments, and a shorter one gets a better place in ZeroGPU's queue. That call runs in a
worker process forked from the server, where the registered weights are on the real device; arguments
and results (each item, for a generator) travel between the two processes pickled. Hence:

- the Gradio handlers that run a model are decorated (`gpu_callbacks`), as bound methods, so that only
  the widgets' values are pickled, never the studio;
- every model is loaded in the main thread before the server starts (`preload`), and nothing decodes in
  the server process: the usual warm-up would need the GPU there;
- the studio's batcher is one per process (`ProcessBatcher`): a fork keeps objects but not threads, so
  the server's batcher would queue jobs that no thread of the worker ever runs;
- each call asks for the seconds its own request needs (`request_seconds`: its new tokens, beams, sides and
  verification), capped by the GPU duration; a request's time limit stays below that cap (`time_limit`),
  so the app's own message, not ZeroGPU's abort, tells a user that a request was too long.

Inside one GPU call the batcher works as everywhere (a comparison's two runs interleaved, the Batch tab's
prompts as one batch), but each request gets a GPU call of its own: the batching of different users'
requests that a CPU or dedicated-GPU server does is lost on ZeroGPU.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import threading
import weakref

ZERO_GPU_ENV = "SPACES_ZERO_GPU"  # "true" on ZeroGPU Spaces (the `spaces` package reads the same variable)
DURATION_ENV = "SKIPDECODE_GPU_DURATION_S"  # seconds a ZeroGPU call may hold the GPU
DEFAULT_DURATION_S = 60  # ZeroGPU's own default; a shorter request gets a better place in its queue
# A request's estimate (request_seconds). Not measured on ZeroGPU (none was reachable): the fixed part covers
# a call's start in its worker (moving to the GPU, capturing CUDA graphs: 0.25-0.8 s on an H100) many times
# over; a step is 20x the 2.3 ms a full-depth float32 step took in the app on an H200 (docs/hosting.md).
FIXED_S = 10.0
STEP_S = 0.05  # seconds per decode step of one side's batch
PASSES = {"throughput": 4}  # handlers that decode more than once: Studio.throughput's batch sizes, in turn
MARGIN_S = 5.0  # the app's time limit ends this long before ZeroGPU would abort the call
# The Gradio handlers (app.callbacks.Callbacks) that run a model. `preview` and `results` do not.
GPU_CALLBACKS = ("stream_compare", "compare_api", "kv_cache", "batch", "throughput")


def zero_gpu() -> bool:
    """Whether this process runs on a ZeroGPU Space: $SPACES_ZERO_GPU set true and `spaces` importable."""
    flag = os.environ.get(ZERO_GPU_ENV, "").strip().lower() in ("1", "t", "true")
    return flag and importlib.util.find_spec("spaces") is not None


def gpu_duration() -> int:
    """Seconds a decorated call asks the GPU for: $SKIPDECODE_GPU_DURATION_S, else 60."""
    value = os.environ.get(DURATION_ENV, "").strip()
    seconds = int(float(value)) if value else DEFAULT_DURATION_S
    if seconds < 1:
        raise ValueError(f"${DURATION_ENV} must be at least 1 second; got {value!r}")
    return seconds


def request_seconds(handler, *args, **kwargs) -> int:
    """Seconds one call of `handler` with these arguments asks the GPU for (ZeroGPU's `duration` callable):
    FIXED_S plus STEP_S per decode step, never more than gpu_duration(). Steps: the new tokens, on both sides
    (SkipDecode and full depth run as separate passes), times the beams of a beam search, twice for verified
    decoding (a draft and a verify pass per token at worst), times PASSES. A handler without `max_new_tokens`
    decodes nothing (one pass over a finished comparison): the fixed part only."""
    cap = gpu_duration()
    try:
        call = inspect.signature(handler).bind(*args, **kwargs)
    except TypeError:  # not a call the handler takes: it fails on its own, at the cap
        return cap
    call.apply_defaults()
    given = call.arguments
    try:
        tokens = max(int(float(given.get("max_new_tokens") or 0)), 0)
        beams = max(int(float(given.get("beams") or 1)), 1) if given.get("decoding") == "beam search" else 1
    except (TypeError, ValueError):  # the studio refuses it with its own message; ask for the cap meanwhile
        return cap
    from .verified import VERIFIED  # here: this module is imported before torch, and that one imports it

    verified = bool(given.get("verify")) or given.get("family") == VERIFIED
    steps = tokens * 2 * beams * (2 if verified else 1) * PASSES.get(getattr(handler, "__name__", ""), 1)
    return max(1, min(cap, math.ceil(FIXED_S + STEP_S * steps)))


def gpu_task(fn, duration: int | None = None):
    """`spaces.GPU(duration=...)(fn)` on ZeroGPU, by default with a duration from each call's own arguments
    (request_seconds); `fn` itself anywhere else. Generators stay generators."""
    if not zero_gpu():
        return fn
    import spaces

    return spaces.GPU(duration=duration or (lambda *args, **kwargs: request_seconds(fn, *args, **kwargs)))(fn)


def gpu_callbacks(callbacks, names=GPU_CALLBACKS):
    """Decorate the model-running handlers of one Callbacks instance in place and return it. Bound methods
    are decorated, not the class's functions: ZeroGPU pickles a call's arguments, and `self` holds the
    studio (threads, locks, models)."""
    if zero_gpu():
        for name in names:
            setattr(callbacks, name, gpu_task(getattr(callbacks, name)))
    return callbacks


def time_limit(requested: float) -> float:
    """A request's wall-time limit: on ZeroGPU, within the GPU duration."""
    return min(requested, max(gpu_duration() - MARGIN_S, 1.0)) if zero_gpu() else requested


def preload(studio) -> None:
    """Load every configured model now, in this (main) thread, without decoding anything: on ZeroGPU this
    is where their weights are registered for the GPU workers, which fork with them. A model that fails
    is logged and left out, as on a CPU: the studio answers its requests with the same error."""
    from .choices import AUTO
    from .studio import log

    for choice in studio.models:
        if choice.label != AUTO:
            try:
                studio.engine(choice)
            except Exception as error:  # noqa: BLE001 (the studio keeps it for the model's requests)
                log.warning("%s failed to load: %s", choice.label, error)


class ProcessBatcher:
    """A skipdecode Batcher per process, started on first use in each: the batcher of the process that
    calls it, be it the server or a ZeroGPU worker forked from it. Otherwise a Batcher: its methods and
    attributes are those of the current process's batcher."""

    def __init__(self, **options):
        self._options = options
        self._batcher = None
        self._pid = None
        self._lock = threading.Lock()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: ref() and ref()._forked())

    def _forked(self) -> None:
        self._lock = threading.Lock()  # a lock held by another thread at the fork would stay held

    @property
    def current(self):
        from skipdecode.batcher import Batcher

        with self._lock:
            if self._pid != os.getpid():
                self._batcher, self._pid = Batcher(**self._options), os.getpid()
            return self._batcher

    def close(self, timeout: float = 5.0) -> None:
        if self._batcher is not None and self._pid == os.getpid():  # never start one only to close it
            self._batcher.close(timeout)

    def __getattr__(self, name):
        if name.startswith("_"):  # not set yet (a copy, an unpickled object): never the batcher's
            raise AttributeError(name)
        return getattr(self.current, name)


if zero_gpu():  # before anything touches CUDA: `spaces` patches torch when it is imported
    importlib.import_module("spaces")
