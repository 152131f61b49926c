"""The measured results in assets/results: the E2E quality table and the speed benchmark, if present."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

RESULTS_DIR = Path(__file__).resolve().parent.parent / "assets" / "results"
SOURCES = {
    "e2e": ("e2e.csv", "skipdecode eval --compare-adapters"),
    "bench": ("bench.csv", "skipdecode bench"),
}


@dataclass
class Table:
    name: str
    path: Path
    command: str  # what produces the file
    frame: pd.DataFrame | None  # None when the file is missing or unreadable
    problem: str = ""

    @property
    def message(self) -> str:
        if self.frame is not None:
            return f"`{self.path.name}`: {len(self.frame)} rows, produced by `{self.command}`."
        return f"**No `{self.path.name}` yet** ({self.problem}). It is produced by `{self.command}`."


def load_table(name: str, folder: Path | None = None) -> Table:
    """One results table; a missing or broken file is reported, never replaced by made-up numbers."""
    filename, command = SOURCES[name]
    path = Path(folder or RESULTS_DIR) / filename
    if not path.exists():
        return Table(name, path, command, None, "not measured yet")
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError) as error:
        return Table(name, path, command, None, f"unreadable: {type(error).__name__}")
    if frame.empty:
        return Table(name, path, command, None, "the file has no rows")
    return Table(name, path, command, frame)
