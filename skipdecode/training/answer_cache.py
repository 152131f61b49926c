"""A JSON-lines file of slow greedy answers (the full-depth targets of general prompts, a teacher's outputs
on the E2E training MRs). Why: they take 20-30 minutes on a CPU, a run stopped halfway should not decode
them again, and the next run with the same model (2x and 5x after 3x) should not either."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

CHUNK = 64  # answers between two appends to the file


def cached_answers(keys: list[str], answer: Callable[[list[str], object], list], cache: Path | None,
                   key: str, value: str, desc: str) -> dict:
    """key -> answer for every key in `keys`. `answer(chunk, bar)` answers a chunk of keys (the tqdm bar to
    advance). With `cache`, rows {key: ..., value: ...} already in that file are read, not answered again,
    and each chunk of new answers is appended as it is done; a line cut short by a stopped run is skipped."""
    from tqdm.auto import tqdm

    known: dict = {}
    if cache is not None and Path(cache).exists():
        for line in Path(cache).read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                known[row[key]] = row[value]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    missing = [k for k in dict.fromkeys(keys) if k not in known]
    if missing:
        if cache is not None:
            Path(cache).parent.mkdir(parents=True, exist_ok=True)
        bar = tqdm(total=len(missing), desc=desc, unit=key)
        for start in range(0, len(missing), CHUNK):
            chunk = missing[start:start + CHUNK]
            done = answer(chunk, bar)
            known.update(zip(chunk, done))
            if cache is not None:
                with open(cache, "a", encoding="utf-8") as handle:
                    handle.writelines(json.dumps({key: k, value: v}) + "\n" for k, v in zip(chunk, done))
        bar.close()
    return {k: known[k] for k in keys}
