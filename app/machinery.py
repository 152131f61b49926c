"""How this runs, in plain words: what a visitor may want to know about the engine under the page (its
weights, its kernels, its decode step, how requests share batches and how the timing is kept fair), and
the fallbacks worth a warning, only when they happen (a kernel that did not build, a compile that failed).

The library's own labels (`Decoder.weights_label`, `Engine.step_label`) name the build for the log and the
bench tables; the page's first screen speaks of what a visitor sees instead. Every fact is read from the
engine that serves, never assumed; an engine that does not say (another backend) gets the general words.
"""

from __future__ import annotations

import html

from skipdecode.slots import serves

from .choices import public_name


def _products(engine) -> tuple[str, str | None]:
    """(how the 4-bit products run, a warning when the fast kernel was wanted and is not running)."""
    weights = getattr(engine.decoder, "weights", None)
    if weights is None:
        dtype = str(getattr(engine.decoder, "dtype", "float32")).removeprefix("torch.")
        return f"Its weights are kept in {dtype}, as the model was trained.", None
    screen = getattr(getattr(weights, "head", None), "screen", None)
    isa = getattr(screen, "isa", None)
    if isa:
        return ("Its weights are stored in 4 bits, as the model file ships them, and multiplied as 8-bit integers "
                "by a small C kernel built for this processor when the app started; attention runs in 32-bit "
                "floats.", None)
    plain = ("Its weights are stored in 4 bits, as the model file ships them, and multiplied by PyTorch's own "
             "4-bit kernel.")
    try:
        from skipdecode.kernels import w4a8

        if w4a8.setting() == "bf16":  # the host asked for PyTorch's kernel: nothing fell back
            return plain, None
        reason = w4a8.library().reason
    except Exception:  # noqa: BLE001 (a kernel module that does not say: no warning rather than a wrong one)
        return plain, None
    if not reason:
        return plain, None
    return plain, f"The fast 8-bit kernel is not running ({reason}): PyTorch's 4-bit kernel runs instead, slower."


def _step(engine) -> str:
    """How one decode step runs."""
    if str(getattr(engine, "step_label", "")) == "CUDA graphs":
        return "Each step replays a recorded GPU graph."
    return ("Each step runs a token's layers in one call to the C library, each layer's whole work in C."
            if getattr(engine.decoder, "fused", None) is not None else "Each step runs layer by layer in PyTorch.")


def sentences(engine) -> list[str]:
    """What runs, in plain words, one fact a sentence."""
    device = engine.decoder.device.type
    where = "on this machine's graphics card" if device == "cuda" else "on this machine's processor"
    products, _ = _products(engine)
    return [f"The model is {public_name(engine.name)}, {engine.num_layers} layers, {where}.", products, _step(engine),
            *batching(engine)]


def batching(engine) -> list[str]:
    """How requests share the machine and how each side is timed (skipdecode/batcher.py decides; slots.serves
    says which way)."""
    if serves(engine):
        return ["Every visitor's answers join one running batch at once: each row at its own position and budget, "
                "with its own model's adapter, shares every step with the others.",
                "The two answers are decoded in the same steps, and each is timed by the layers it ran there (plus "
                "the step's shared work), so both see the same machine load."]
    return ["Requests that arrive together share one batch: at each position every row runs the same layers.",
            "The two answers are decoded in turns, one token of each, and every step is timed on its own, so both "
            "see the same machine load."]


def warnings(engine) -> list[str]:
    """The fallbacks in effect, one sentence each; empty when everything runs as intended."""
    return [w for w in (_products(engine)[1],) if w]


def how_html(engine) -> str:
    return "".join(f"<p>{html.escape(s)}</p>" for s in sentences(engine))


def warnings_html(engine) -> str:
    found = warnings(engine)
    return "".join(f'<div class="sd-warning" role="status">⚠️ {html.escape(w)}</div>' for w in found)
