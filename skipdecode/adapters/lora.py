"""LoRA adapters made by `skipdecode train`: finding them, picking one for a speedup, merging it.

Each adapter folder holds peft's adapter files and `skipdecode.json` (the base model, the speedups it
was trained for, the training record). Merging the LoRA deltas into the weights before the engine packs
them keeps decoding exactly as fast as with the base model.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..schedule import SPREAD

ADAPTERS_ENV = "SKIPDECODE_ADAPTERS"
NONE = ("none", "base", "")  # names that mean: no adapter
WEIGHTS = "adapter_model.safetensors"  # peft's weights file in every adapter folder
RECORD = "skipdecode.json"  # what skipdecode knows of an adapter: base model, speedups, training record


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    path: Path
    speedups: tuple[float, ...]
    base_model: str
    meta: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def one_for_all(self) -> bool:
        return len(self.speedups) > 1

    @property
    def config(self) -> dict:
        """The `skipdecode train` settings it was made with ({} for a folder made by hand)."""
        return self.meta.get("config", {})

    @property
    def spread(self) -> float:
        """Its schedules' max budget / average budget; adapters trained before --spread had the default."""
        return self.config.get("spread", SPREAD)

    @property
    def shared_cache(self) -> bool:
        """A draft made for verified decoding's one cache (skipdecode/training/shared_cache.py): it reads its
        verifier's keys and values, so it never decodes alone and `pick_adapter` never picks it."""
        return bool(self.meta.get("shared_cache"))

    @property
    def task(self) -> str:
        """What it was trained on: "e2e" (meaning representations) or "general" (chat prompts); adapters
        made before `skipdecode train --task` are E2E."""
        return self.meta.get("task") or self.config.get("task") or "e2e"


def adapters_dir() -> Path:
    return Path(os.environ.get(ADAPTERS_ENV) or Path(__file__).resolve().parents[2] / "assets" / "adapters")


def read_adapter(path: Path) -> AdapterInfo:
    meta_file = path / RECORD
    if not (path / "adapter_config.json").exists() or not meta_file.exists():
        raise ValueError(f"{path} is not a skipdecode adapter (needs adapter_config.json and skipdecode.json)")
    meta = json.loads(meta_file.read_text())
    return AdapterInfo(path.name, path, tuple(float(s) for s in meta["speedups"]), meta["base_model"], meta)


def write_record(path: Path, meta: dict) -> None:
    """Write an adapter's record (`read_adapter` reads it back as `AdapterInfo.meta`)."""
    (Path(path) / RECORD).write_text(json.dumps(meta, indent=1))


def available_adapters(folder: Path | None = None) -> list[AdapterInfo]:
    folder = folder or adapters_dir()
    if not folder.is_dir():
        return []
    return [read_adapter(p) for p in sorted(folder.iterdir()) if (p / RECORD).exists()]


def find_adapter(name_or_path: str | os.PathLike) -> AdapterInfo:
    """An adapter by name (in the adapters folder) or by path."""
    path = Path(name_or_path)
    if path.is_dir():
        return read_adapter(path)
    for info in available_adapters():
        if info.name == str(name_or_path):
            return info
    names = ", ".join(a.name for a in available_adapters()) or "none found"
    raise ValueError(f"unknown adapter {str(name_or_path)!r}; available: {names}")


def adapter_ref(info: AdapterInfo) -> str:
    """How a training record names an adapter it started or distilled from: by name when the adapters
    folder finds it under that name (portable with the folder), else by absolute path, so that eval's
    held-out check can follow the lineage later from any working directory."""
    try:
        if find_adapter(info.name).path.resolve() == Path(info.path).resolve():
            return info.name
    except ValueError:
        pass
    return str(Path(info.path).resolve())


def same_base(a: str, b: str) -> bool:
    """The Hub's SmolLM2-135M-Instruct is the model the bundled GGUF quantizes to 4 bits: an adapter
    trained on one applies to the other (measured here on the bundled copy only)."""
    from ..models import DEFAULT_HUB_ID, DEFAULT_MODEL

    alias = {DEFAULT_HUB_ID: DEFAULT_MODEL}
    return alias.get(a, a) == alias.get(b, b)


def pick_adapter(speedup: float | None, base_model: str | None = None, prompt: str | None = None,
                 task: str | None = None) -> tuple[AdapterInfo | None, str]:
    """The adapter to decode `prompt` at `speedup` with (None: the base model), and why, in words the CLI
    and the app show ("e2e-all: an E2E meaning representation at 3x").

    The router decides the task. An E2E prompt (and no prompt at all, the E2E evaluation's case) gets an
    E2E adapter: one trained for that speedup alone, else a one-for-all adapter trained for it too, else
    the one trained nearest to it (a one-for-all one by its nearest speedup, not its range). A general
    prompt gets the base model itself at 1x (the full-depth reference is the model people know, not one
    tuned on restaurants), else a general adapter trained for that speedup or a one-for-all one whose
    range holds it, else the base model: never an E2E adapter.
    At a speedup the picked adapter was not trained for, the app and `generate` decode at the speedup
    `run_speedup` gives (the reason says so): at 4x the served E2E adapters score BLEU 14-18 (devset and
    test set, docs/research/e2e-train-split.md), at their own speedups 64-65. `eval` scores the speedup asked.
    `speedup` None means hand-set budgets: a one-for-all adapter of the task. `task` ("e2e" or "general")
    stands for the router's verdict where the kind is known without a prompt (`eval --prompts`)."""
    from ..models import DEFAULT_MODEL
    from .router import E2E, route

    kind = task or (E2E if prompt is None else route(prompt).kind)
    what = ("an E2E meaning representation" if prompt is not None or task else "the E2E task") if kind == E2E \
        else "a general prompt"
    at = "hand-set budgets" if speedup is None else f"{speedup:g}x"
    if kind != E2E and speedup == 1:
        return None, f"base model: {what} at 1x (the full-depth reference)"
    base = base_model or DEFAULT_MODEL
    candidates = [a for a in available_adapters()
                  if same_base(a.base_model, base) and a.task == kind and not a.shared_cache]
    if speedup is None:
        candidates = [a for a in candidates if a.one_for_all]
    elif kind != E2E:
        candidates = [a for a in candidates if min(a.speedups) <= speedup <= max(a.speedups)]
    if not candidates:
        return None, f"base model: no {'E2E' if kind == E2E else 'general'} adapter for {at} yet"

    def rank(info: AdapterInfo):
        if speedup is None:
            return (0, 0, 0, info.name)
        exact = speedup in info.speedups
        return (not (exact and not info.one_for_all), not exact, abs(run_speedup(info, speedup) - speedup),
                info.name)

    picked = min(candidates, key=rank)
    if speedup is None or speedup in picked.speedups:
        return picked, f"{picked.name}: {what} at {at}"
    return picked, (f"{picked.name}: {what} at {run_speedup(picked, speedup):g}x, the nearest speedup an adapter "
                    f"was trained for ({at} asked: an adapter holds up only at the speedups it was trained for)")


def shared_cache_draft(verifier: AdapterInfo | None, speedup: float | None = None, schedule=None,
                       served: list[AdapterInfo] | None = None) -> AdapterInfo | None:
    """The draft trained to read `verifier`'s keys and values (None: none served) at `speedup`, and with a
    `schedule`, on that very schedule (at `speedup`, or at any speedup it was trained for): verified decoding
    drafts with it rather than with the adapter made to decode alone, which reads its own skipped entries in
    training and agrees with its verifier less often on the verifier's (docs/method.md). `served`: the
    adapters to look among (default: the adapters folder's now; the app's: those it found at start)."""
    if verifier is None:
        return None

    def fits(a: AdapterInfo) -> bool:
        at = [s for s in a.speedups if speedup is None or s == speedup]  # the speedups to match it at
        return (a.shared_cache and a.meta.get("verifier") == verifier.name and same_base(a.base_model, verifier.base_model)
                and bool(at) and (schedule is None or any(trained_schedule(a, s, schedule.num_layers) == schedule
                                                          for s in at)))

    found = [a for a in (available_adapters() if served is None else served) if fits(a)]
    return min(found, key=lambda a: a.name) if found else None


def shared_speedup(served, fallback: float = 3.0) -> float:
    """The highest speedup above 1 that an adapter of every task was trained for, from the served adapters'
    `(task, speedups)`: where the page starts, so that a visitor's first prompt, a restaurant record or a
    question, runs an adapter made for the speedup shown (with only `general-2x` served, a question at 3x
    ran the base model's skipping: word salad). `fallback` where the tasks share none."""
    from .router import E2E, GENERAL

    common = trained_speedups(served, E2E) & trained_speedups(served, GENERAL)
    return max(common) if common else fallback


def trained_speedups(served, task: str) -> set[float]:
    """The speedups above 1 that the served adapters of `task` were trained for, from their `(task, speedups)`."""
    return {s for kind, speedups in served if kind == task for s in speedups if s > 1}


def run_speedup(info, speedup: float | None) -> float | None:
    """The speedup to decode at with `info` (anything with the `speedups` it was trained for: an adapter,
    an app's model choice) when `speedup` is asked for: the nearest one it was trained for (between two,
    the lower: more layers); as asked without an adapter or for hand-set budgets (None). A constant-budget
    adapter learns its own layer sets, not skipping in general, so between its speedups it falls apart
    (docs/research/e2e-train-split.md, 4x)."""
    if info is None or not info.speedups or speedup is None or speedup in info.speedups:
        return speedup
    return min(info.speedups, key=lambda s: (abs(s - speedup), s))


# Tasks whose adapters decode in float32 whatever "auto" says: in bfloat16 the E2E test BLEU of e2e-1x fell
# 0.53 (2x 0.26, 3x 0.32, 5x 0.0; one `skipdecode eval` run each way), past the 0.5 a precision may cost, and
# every E2E comparison runs e2e-1x as its full-depth side, so all of them stay float32 (like against like).
FLOAT32_TASKS = ("e2e",)


def adapter_dtype(info: AdapterInfo | None, dtype="auto"):
    """The dtype to load a model with this adapter in: `dtype` as asked, except that "auto" keeps the
    adapters of FLOAT32_TASKS in float32."""
    if dtype in (None, "auto") and info is not None and info.task in FLOAT32_TASKS:
        return "float32"
    return dtype


def adapter_for(speedup: float, base_model: str | None = None, prompt: str | None = None) -> AdapterInfo | None:
    """The adapter `pick_adapter` picks (None: the base model), without the reason."""
    return pick_adapter(speedup, base_model, prompt)[0]


def trained_schedule(info: AdapterInfo | None, speedup: float, num_layers: int, horizon: int | None = None,
                     warmup: int | None = None):
    """The schedule `info` learned for `speedup`: its horizon, warm-up layers, decay, mode and spread
    (`horizon` and `warmup` override). An adapter decodes on the plan it was trained with, not on the
    defaults; full depth at 1x. Without an adapter: the E2E defaults."""
    from ..schedule import DEFAULT_WARMUP, E2E_HORIZON, Schedule, for_speedup

    if speedup == 1:
        return Schedule.full(num_layers)
    c = info.config if info else {}
    return for_speedup(speedup, num_layers, horizon or c.get("horizon", E2E_HORIZON),
                       c.get("warmup_layers", DEFAULT_WARMUP) if warmup is None else warmup,
                       c.get("decay", "linear"), c.get("mode", "skip"), info.spread if info else SPREAD)


def merge_adapter(model, info: AdapterInfo, model_name: str):
    """The model with the adapter's LoRA deltas merged into its weights."""
    from peft import PeftModel

    if not same_base(info.base_model, model_name):
        raise ValueError(f"adapter {info.name!r} was made for {info.base_model}, not {model_name}")
    _own(model)
    try:
        return PeftModel.from_pretrained(model, str(info.path)).merge_and_unload()
    except (RuntimeError, ValueError, KeyError) as error:  # shapes or module names of another model
        raise ValueError(f"adapter {info.name!r} does not fit {model_name}: {str(error).splitlines()[0]}") from error


def _own(model) -> None:
    """A loaded weight is pages of the safetensors file mapped copy-on-write, and here the first write to such
    a page costs far more than a fresh copy (`python experiments/merge_cost.py`): merging an adapter writes
    every page of every matrix it touches. So every weight is copied to memory of its own first (all of them,
    so that no weight keeps the file's pages mapped beside the copies)."""
    for weight in model.parameters():
        weight.data = weight.data.clone()


def weights_digest(folder: str | os.PathLike) -> str:
    """A sha256 of an adapter folder's weights: which adapter it is wherever its folder lies (the teacher
    outputs' cache key; a run folder known as the adapter served from it)."""
    return hashlib.sha256((Path(folder) / WEIGHTS).read_bytes()).hexdigest()
