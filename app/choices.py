"""The models the app offers, fixed when it starts: the base model the host chose, the served adapters over it,
and "auto" (the adapter for the prompt and the speedup). Never a path or hub id typed by a web user."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from skipdecode.adapters.lora import adapters_dir, read_adapter, same_base
from skipdecode.models import DEFAULT_MODEL
from skipdecode.schedule import SPREAD

log = logging.getLogger("skipdecode.app")

AUTO = "auto: the adapter for the prompt and the speedup"
MODEL_ENV = "SKIPDECODE_MODEL"  # the host's choice of base model (a name, folder or hub id), fixed at start


@dataclass(frozen=True)
class ModelChoice:
    """A model the app offers: fixed at start, never a path or hub id typed by a web user."""

    label: str
    model: str | None = None  # Engine.load name (None: the bundled default)
    adapter: str | None = None  # a fine-tuned adapter's name (None: base weights)
    horizon: int | None = None  # the horizon the adapter was trained with: the default for decoding with it
    spread: float = SPREAD  # its max budget / average budget (1 = constant): the speedup's shape it learned
    speedups: tuple[float, ...] = ()  # the speedups it was trained for: "auto" runs it at the nearest
    task: str | None = None  # what its adapter was trained on ("e2e", "general")


def base_model() -> str:
    """The model the host chose at start ($SKIPDECODE_MODEL), else the default: the 4-bit GGUF every figure
    was measured on, from its wheel or, on a Space without the wheel, from the Hub at a pinned revision
    (skipdecode.models.default_gguf). The Hub's full-precision SmolLM2 runs only when a host names it."""
    return os.environ.get(MODEL_ENV) or DEFAULT_MODEL


def public_name(model: str) -> str:
    """A model's name as the page shows it: a local folder by its last part, never its full path."""
    return Path(model).name if os.path.isabs(model) or Path(model).exists() else model


def readable_adapters() -> list:
    """The adapters in the adapters folder; one that cannot be read (half written, edited by hand) is
    left out with a warning in the log rather than keeping the app from starting."""
    folder, found = adapters_dir(), []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if (path / "skipdecode.json").exists():
            try:
                found.append(read_adapter(path))
            except (ValueError, KeyError, TypeError, OSError) as error:
                log.warning("adapter folder %s left out of the model list: %s", path.name, error)
    return found


def configured_models(model: str | None = None) -> list[ModelChoice]:
    """The base model and the adapters `skipdecode train` left in assets/adapters for it; with any
    adapter, first an "auto" entry that picks the adapter made for the requested speedup. Adapters made
    for another model are left out: a web user can never ask for them."""
    model = model or base_model()
    adapters = [a for a in readable_adapters() if same_base(a.base_model, model) and not a.shared_cache]
    choices = [ModelChoice(f"{a.name} (fine-tuned for {', '.join(f'{s:g}x' for s in a.speedups)})", model,
                           a.name, a.config.get("horizon"), a.spread, a.speedups, a.task) for a in adapters]
    base = ModelChoice(f"{public_name(model)} (base)", model)
    return [ModelChoice(AUTO), base, *choices] if choices else [base]
