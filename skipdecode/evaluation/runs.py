"""What the E2E and the general-prompts evaluations share: decoding prompts in batches with what it
cost, and where and how a run writes its table (the app and the docs read those files)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[2] / "assets" / "results"  # what the app and README show
VALIDATION_DIR = RESULTS_DIR.parent.parent / "docs" / "results"  # validation rounds: the research log's
TEMP_PREFIX = "skipdecode-eval-"  # the temporary folders of runs that must not write to RESULTS_DIR


def decode(engine, items, schedule, batch_size: int, max_new_tokens: int, progress=None, beam=None):
    """Greedy outputs (or `beam` search's) in item order, batched by prompt length; decode ms per decoded
    token (a beam's token counts as one), layers per output token, output tokens. `items`: anything with
    a `prompt` (E2E items, general prompts wrapped)."""
    order = sorted(range(len(items)), key=lambda i: len(items[i].prompt))
    outputs = [""] * len(items)
    decode_ms = decoded = layers = tokens = 0
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        result = engine.generate([items[i].prompt for i in chunk], schedule, max_new_tokens, beam=beam)
        for i, text in zip(chunk, result.texts):
            outputs[i] = text.strip()
        decode_ms += result.trace.decode_ms
        decoded += sum(s.rows for s in result.trace.steps)
        for ids in result.token_ids:  # token 0 from the prefill (all layers), token k from step k - 1
            layers += engine.num_layers + sum(schedule.budget(s) for s in range(len(ids) - 1))
            tokens += len(ids)
        if progress is not None:
            progress.update(len(chunk))
    return outputs, decode_ms / max(decoded, 1), layers / max(tokens, 1), tokens


def write(rows: list, prefix: Path) -> None:
    """Result rows (dataclasses) as a table: `write_frame`."""
    import pandas as pd

    write_frame(pd.DataFrame([asdict(r) for r in rows]).round(3), prefix)


def write_frame(frame, prefix: Path) -> None:
    """A results table as <prefix>.csv and .json (records), the two forms the app and the docs read."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(prefix.with_suffix(".csv"), index=False)
    prefix.with_suffix(".json").write_text(json.dumps(frame.to_dict(orient="records"), indent=1))


def drop_empty_temp(folder: Path) -> None:
    """A run that failed leaves no empty temporary folder of its own behind (and touches no other folder)."""
    if folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith(TEMP_PREFIX) \
            and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
