"""The one record of a finished comparison, written from what ran: the API's answer, the exported JSON, what
Present and the teaching views (app/teach.py) draw, and what a replayed page is drawn from again without a
model (a cold Space, a spent GPU quota, a projector without network); app/record.py is its schema.

Beside both answers, their traces, the scores and the divergence, it holds what the page needs to draw the
run again without a tokenizer or a model: each token's text, the prompt's ids, full depth's alternatives at
each position, the logit lens once computed, the settings that ran, the seed and the hardware.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from skipdecode.batcher import BatchInfo, Update
from skipdecode.lens import Divergence, Lens
from skipdecode.schedule import Schedule
from skipdecode.trace import StepRecord, Trace

from .record import FORMAT, load
from .comparison import Comparison, TIMING_NOTE
from .settings import Settings
from .views import TokenText, token_layers

# The comparison docs/teaching.md walks through, exported from the page and shipped: the lesson's figures come
# from it, and the page replays it ("Open the lesson's comparison") where no model can run.
ROOT = Path(__file__).resolve().parent.parent
LESSON_FILE = ROOT / "assets" / "lesson" / "the-cricketers-3x.json"


def hardware(device: torch.device, dtype: str) -> dict:
    """What ran it: the timings in a record mean something only on the same kind of machine."""
    out = {"device": device.type, "dtype": dtype, "torch": torch.__version__, "cpu_count": os.cpu_count(),
           "cpu": _cpu_name(), "platform": platform.platform()}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


@functools.cache
def _cpu_name() -> str:
    """The CPU's model name, read once a process (every record, the API's answer among them, names it)."""
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def record(comparison: Comparison, tokenizer, settings: Settings | None = None, device=None) -> dict:
    """The finished comparison as a JSON-safe dict (see the module's docstring)."""
    c = comparison
    if not c.done or c.divergence is None:
        raise ValueError("run a comparison first")
    pieces = c.pieces or [TokenText(tokenizer).pieces(u.token_ids) for u in (c.skip, c.full)]
    out = {"format": FORMAT, "prompt": c.prompt, "model": c.model, "full_model": c.full_model,
           "why": {"skipdecode": c.why[0], "full": c.why[1]}, "dtype": {"skipdecode": c.dtypes[0], "full": c.dtypes[1]},
           "num_layers": c.num_layers, "decoding": c.decoding, "schedule": c.schedule.to_dict(),
           "max_new_tokens": c.max_new_tokens, "cost": list(c.cost),
           "skipdecode": _side(c.skip, pieces[0], c.num_layers), "full": _side(c.full, pieces[1], c.num_layers),
           "speedup": c.speedups(), "quality": c.quality, "references": c.references,
           "divergence": {**c.divergence.to_dict(), "top": [[list(pair) for pair in top] for top in c.divergence.top]},
           "timing": TIMING_NOTE, "verified": c.verified, "verification": c.skip.verification}
    out["divergence_ms"] = round(comparison.divergence_ms, 3)
    settings = settings if settings is not None else comparison.settings  # what ran (Studio.compare keeps it)
    out["settings"] = asdict(settings) if settings is not None else None
    out["seed"] = settings.seed if settings is not None else None
    out["hardware"] = hardware(device or torch.device("cpu"), comparison.dtypes[0])
    out["exported"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["texts"], out["lens"] = {}, None
    _name_tokens(out, tokenizer, [t for e in out["divergence"]["tokens"] for t in (e["token"], e["full_token"])]
                 + [t for top in comparison.divergence.top for t, _ in top])
    if comparison.lenses is not None:
        add_lenses(out, comparison.lenses, tokenizer)
    return out


def _side(update: Update, pieces: list[str], num_layers: int) -> dict:
    """One side as it ran: its answer (text, ids, each token's text and layers), its batch and its trace."""
    return {"text": update.text, "token_ids": update.token_ids, "finished": update.finished,
            "batch": update.batch.to_dict(), "trace": update.trace.to_dict(), "prompt_ids": update.prompt_ids,
            "pieces": pieces, "layers": token_layers(update, num_layers)}


def add_lenses(out: dict, lenses: dict[str, list[Lens]], tokenizer) -> dict:
    """The logit lens of every position, both sides, into the record (and the texts of its tokens)."""
    out["lens"] = {name: [view.to_dict() for view in views] for name, views in lenses.items()}
    _name_tokens(out, tokenizer, [t for views in lenses.values() for v in views for top in v.top for t, _ in top])
    return out


def _name_tokens(out: dict, tokenizer, ids) -> None:
    for token in set(ids) - set(map(int, out["texts"])):
        out["texts"][str(token)] = tokenizer.decode([token])


def comparison(record: dict) -> Comparison:
    """The Comparison a record was made from, as far as the page's views need it (no model, no engine)."""
    def update(side: dict) -> Update:
        t = side["trace"]
        trace = Trace(t["num_layers"], t["batch_size"], t["prompt_tokens"], t["schedule"], t["prefill_ms"],
                      [StepRecord(s["step"], s["budget"], tuple(s["layers"]), tuple(s["skipped"]), s["ms"], s["rows"],
                                  s.get("tick"))
                       for s in t["steps"]], t["generated_tokens"], list(t["cache_lengths"]))
        batch = BatchInfo(side["batch"]["number"], side["batch"]["size"], t["schedule"], side["batch"]["started"])
        return Update(0, batch, side["prompt_ids"], side["token_ids"], side["text"], side["finished"], True, trace)

    found = record["divergence"]
    out = Comparison(record["prompt"], record["model"], record["full_model"], record["num_layers"],
                     Schedule(**record["schedule"]), record["max_new_tokens"], update(record["skipdecode"]),
                     update(record["full"]), tuple(record["references"]) if record["references"] else None,
                     record["quality"], tuple(record["cost"]), (record["why"]["skipdecode"], record["why"]["full"]),
                     (record["dtype"]["skipdecode"], record["dtype"]["full"]), record["decoding"])
    out.divergence = Divergence(found["agreement"], found["first"], found["tokens"],
                                [[tuple(pair) for pair in top] for top in found["top"]])
    out.divergence_ms = record.get("divergence_ms", 0.0)
    out.verified, out.skip.verification = bool(record.get("verified")), record.get("verification")
    out.pieces = (record["skipdecode"]["pieces"], record["full"]["pieces"])
    out.settings = Settings(**record["settings"]) if record.get("settings") else None
    if record.get("lens"):
        out.lenses = {name: [Lens.from_dict(v) for v in views] for name, views in record["lens"].items()}
    return out


def export_path(record: dict, suffix: str, folder: str | None = None) -> Path:
    """Where an export of the record goes: named after the run, in a fresh folder unless one is given."""
    folder = Path(folder or tempfile.mkdtemp(prefix="skipdecode-export-"))
    return folder / f"skipdecode-comparison-{record['exported'].replace(':', '').replace('-', '')}{suffix}"


def write(record: dict, folder: str | None = None) -> Path:
    """The record as a JSON file to download, named after the run."""
    path = export_path(record, ".json", folder)
    path.write_text(json.dumps(record, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


def read(path: str | os.PathLike) -> dict:
    """A record from an exported file, checked against its schema (app/record.py); ValueError with one
    sentence saying what is wrong with any other file."""
    data = load(path)
    try:
        comparison(data)
    except (KeyError, TypeError, ValueError) as error:  # the schema should have said; never a traceback
        raise ValueError(f"This exported comparison is damaged ({type(error).__name__}: {error}).") from None
    return data


LESSON_PROMPT = ("Write one sentence describing this restaurant, using every fact: name[The Cricketers], "
                 "eatType[coffee shop], customer rating[high], familyFriendly[yes], near[Express by Holiday Inn]")


def make_lesson(path: Path = LESSON_FILE) -> dict:
    """The lesson's comparison, as the page exports it: the E2E record above, "auto" at 3x, 24 new tokens,
    greedy, on the precision a visitor's CPU gets, the layer view of every position included."""
    from .choices import AUTO
    from .studio import Studio

    studio = Studio()
    try:
        settings = Settings(speedup=3.0, max_new_tokens=24)
        studio.warm_up()  # a fresh process's first calls are slow: time the lesson as a warm page would
        final = list(studio.compare(LESSON_PROMPT, settings, AUTO))[-1]
        engine = studio.engine(final.model)
        studio.lenses(final)
        out = record(final, engine.tokenizer, settings, engine.decoder.device)
    finally:
        studio.batcher.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1), encoding="utf-8")
    return out


if __name__ == "__main__":  # python -m app.replay: the lesson's file again (docs/teaching.md)
    written = make_lesson()
    print(f"{LESSON_FILE}: {written['divergence']['agreement']:.0%} agreement, {len(written['skipdecode']['token_ids'])} "
          f"tokens, {written['hardware']['cpu']}")
