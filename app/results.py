"""The measured results in assets/results: the E2E quality tables, the general-prompt table and the speed
benchmark, if present.

The files stay as the commands wrote them; the page only orders them: the columns a reader needs first,
and in the E2E table the rows of what this app serves ("auto"'s adapter at its speedup, from the adapters
folder) first, marked in a `served` column, then the experiments the same run measured.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import plots

RESULTS_DIR = Path(__file__).resolve().parent.parent / "assets" / "results"
SOURCES = {
    "e2e": ("e2e.csv", "skipdecode eval --compare-adapters"),
    "e2e-beams4": ("e2e-beams4.csv", "skipdecode eval --speedups 1,2,3,5 --no-untrained --beams 4"),
    "general": ("general.csv", "skipdecode eval --prompts validation --speedups 1,2,3,5"),
    "bench": ("bench.csv", "skipdecode bench"),
}
FIRST_COLUMNS = {  # what a reader looks for first, in this order; the other columns follow as written
    "e2e": ("row", "adapter", "served", "speedup", "bleu", "bleu_e2e", "ser", "names", "decode_speedup"),
    "e2e-beams4": ("row", "adapter", "speedup", "bleu", "bleu_e2e", "ser", "names", "decode_speedup"),
    "general": ("speedup", "adapter", "rouge_l_vs_full", "ppl_ratio", "repetition", "decode_speedup"),
    "bench": ("method", "speedup", "batch_size", "measured_speedup", "tokens_per_s", "bound"),
}
log = logging.getLogger("skipdecode.app")
INTRO = ("Measured results from `assets/results/`, exactly as the commands wrote them. The E2E plot draws as a "
         "frontier what this app serves: at each speedup, the adapter \"auto\" runs there. Rows of the same run that "
         "auto does not run (an adapter at a speedup it was not trained for, or one passed over for another) are "
         "experiments: in the table after the served rows, and on the plot when the box below is ticked.")


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


def served_pairs(speedups) -> set[tuple[str, float]]:
    """(adapter, speedup) for each of `speedups` at which "auto" runs an E2E adapter of the adapters folder
    at that very speedup (`pick_adapter`, `run_speedup`): a row of another speedup (4x, which auto runs at
    5x) or of an adapter auto passes over there (`e2e-all` at 5x) is an experiment, not what a visitor
    gets. When the folder cannot be read (an adapter half written), none counts and the log says why."""
    from skipdecode.adapters import pick_adapter, run_speedup
    from skipdecode.router import E2E

    pairs = set()
    try:
        for speedup in sorted({float(s) for s in speedups}):
            picked, _ = pick_adapter(speedup, task=E2E)
            if picked is not None and run_speedup(picked, speedup) == speedup:
                pairs.add((picked.name, speedup))
    except (ValueError, KeyError, TypeError, OSError) as error:
        log.warning("results: cannot read the adapters folder, no adapter counts as served: %s", error)
        return set()
    return pairs


def arrange(name: str, frame: pd.DataFrame, served: set[tuple[str, float]] | None = None) -> pd.DataFrame:
    """The table as the page shows it: FIRST_COLUMNS first; an E2E table gets a `served` column (its
    (adapter, speedup) is in `served`, default what "auto" runs from the adapters folder, or it has no
    adapter) and its served rows first."""
    if name == "e2e" and "adapter" in frame.columns:
        pairs = served_pairs(frame["speedup"]) if served is None else set(served)
        rows = zip(frame["adapter"].astype(str), frame["speedup"].astype(float))
        frame = frame.assign(served=pd.Series([row in pairs for row in rows], index=frame.index)
                             | plots.no_adapter(frame))
        frame = frame.sort_values("served", ascending=False, kind="stable").reset_index(drop=True)
    first = [c for c in FIRST_COLUMNS.get(name, ()) if c in frame.columns]
    return frame[first + [c for c in frame.columns if c not in first]]


def load_table(name: str, folder: Path | None = None, served: set[tuple[str, float]] | None = None) -> Table:
    """One results table, arranged for the page (`arrange`); a missing or broken file is reported, never
    replaced by made-up numbers."""
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
    return Table(name, path, command, arrange(name, frame, served))


def e2e_figure(show_experiments: bool = False, folder: Path | None = None):
    """The Results tab's E2E plot, with or without the experiment adapters' points."""
    table = load_table("e2e", folder)
    if table.frame is None:
        return plots.empty_figure(table.message.replace("*", "").replace("`", ""))
    try:
        return plots.quality_speed_figure(table.frame, show_experiments=bool(show_experiments))
    except (KeyError, ValueError) as error:  # a table from another version, with other columns
        return plots.empty_figure(f"Cannot plot this table: {error}")
