"""The measured results in assets/results: the E2E quality tables, the general-prompt table and the speed
benchmark, if present.

The files stay as the commands wrote them; the page only orders and names them: in the E2E table the rows of
what this app serves ("auto"'s adapter at its speedup, from the adapters folder) first, marked in a `served`
column, then the experiments the same run measured (`arrange`, which the plots read); for the tables a
person reads, the columns they need under names with units, what the page runs first (`for_people`).
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
INTRO = ("Measured results, the figures as the measurements wrote them (the tables name their columns for "
         "reading; each table's file and command are in its fold for developers). What this page runs comes first in each table. The "
         "E2E plot draws as a frontier what \"auto\" serves at each speedup; rows of the same run that auto does not "
         "run (an adapter at a speedup it was not trained for, or one passed over for another) are experiments: "
         "after the served rows, and on the plot when the box below is ticked.")


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
    from skipdecode.adapters.lora import pick_adapter, run_speedup
    from skipdecode.adapters.router import E2E

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


# ---- for people: the tables as the Results tab shows them --------------------------------------------
# Each table's columns a reader needs, in order, each under a name with its unit; the files keep theirs.
PEOPLE = {
    "e2e": {"served": "on this page", "row": "run", "adapter": "adapter", "speedup": "target speedup (×)",
            "decode_speedup": "measured decode speedup (×)", "avg_layers": "layers per token",
            "bleu": "BLEU (0-100)", "bleu_e2e": "BLEU, the E2E challenge's script (0-100)",
            "rouge_l": "ROUGE-L (0-100)", "chrf": "chrF (0-100)", "ser": "slot errors (% of records)",
            "names": "names spelled right (%)", "length": "length (% of the references')",
            "ms_per_token": "ms per token (eval run)", "mrs": "records", "beams": "beams"},
    "general": {"speedup": "target speedup (×)", "adapter": "adapter", "rouge_l_vs_full": "ROUGE-L vs full (0-100)",
                "bleu_vs_full": "BLEU vs full (0-100)", "ppl_ratio": "perplexity vs full (×)",
                "agreement": "same token at the same place (%)", "repetition": "repeated 3-grams (%)",
                "avg_layers": "layers per token", "decode_speedup": "measured decode speedup (×)",
                "prompts": "prompts"},
    "bench": {"method": "method", "on_page": "on this page", "weights": "weights", "speedup": "target speedup (×)",
              "batch_size": "batch (rows)", "layers_per_token": "layers per token", "ms_per_token": "ms per token",
              "tokens_per_s": "tokens per second", "measured_speedup": "decode speedup vs full (×)",
              "e2e_speedup": "speedup with the prefill (×)", "bound": "speedup by weights read (×)",
              "first_token_ms": "first token (ms)", "vs_llamacpp": "vs llama.cpp (×)"},
}
PEOPLE["e2e-beams4"] = PEOPLE["e2e"]
METHODS = {"full": "full decoding", "skipdecode": "SkipDecode", "early_exit_peer": "per-token early exit",
           "llama.cpp": "llama.cpp"}
BROKEN = 100.0  # a perplexity ratio past this: the text has fallen apart (the untrained model at 5x: word salad)
# A share of repeated word 3-grams past this: the answer loops. The most any full-decoding answer to the 64 general
# validation prompts repeats, rounded up (docs/research/looping-answers.md, experiments/looping.py)
LOOPING = 0.8
NOTES = {
    "general": ("**Perplexity vs full**: how much less likely the full model finds an answer than its own (the "
                "median over prompts); 1 is as likely, past 100 the text has fallen apart (the base model, never "
                "trained to skip, at 5×)."),
    "bench": ("**What this page runs first**: one request is a batch of one, SkipDecode beside full decoding, on "
              "the CPU default (4-bit weights); requests arriving together share a batch (16 rows here). "
              "Per-token early exit and llama.cpp on the same file are measured for comparison, not run by the page."),
}


def _weights(label) -> str:
    text = str(label)
    if text.startswith("int4"):
        return "4-bit (the CPU default)"
    if text.startswith("GGUF"):
        return "4-bit, the same file"
    return f"{text} (not the page's default)" if text and text != "nan" else ""


def _on_page(row) -> str:
    """Whether (and how) the page runs a benchmark row: a comparison at batch 1 on the default weights first."""
    weights = row.get("weights")
    if row.get("method") not in ("full", "skipdecode") or (weights is not None and not str(weights).startswith("int4")):
        return "no: measured for comparison"
    return "yes: one request" if row.get("batch_size") == 1 else "yes: requests sharing a batch"


def for_people(name: str, frame: pd.DataFrame | None) -> pd.DataFrame:
    """A results table as the Results tab shows it: what the page runs first, each kept column under its
    human name, numbers rounded; ratios past BROKEN written as broken text, not as a bare figure."""
    if frame is None:
        return pd.DataFrame()
    frame = frame.copy()
    if name == "bench":
        frame["on_page"] = [_on_page(row) for row in frame.to_dict("records")]
        frame = frame.sort_values("on_page", key=lambda s: s.map({"yes: one request": 0}).fillna(
            s.str.startswith("yes").map({True: 1, False: 2})), kind="stable")
        frame["method"] = frame["method"].map(lambda m: METHODS.get(m, m))
        if "weights" in frame.columns:
            frame["weights"] = frame["weights"].map(_weights)
    if "served" in frame.columns:
        base = plots.no_adapter(frame)
        frame["served"] = ["no: an experiment" if not served else "yes: the base model" if plain else
                           "yes: \"auto\" runs it" for served, plain in zip(frame["served"], base)]
    if "ppl_ratio" in frame.columns:
        frame["ppl_ratio"] = frame["ppl_ratio"].map(
            lambda v: f"{v:,.0f}: text fallen apart" if v > BROKEN else f"{v:.2f}")
    columns = [c for c in PEOPLE[name] if c in frame.columns]
    shown = frame[columns].rename(columns=PEOPLE[name]).reset_index(drop=True).round(2)
    return shown.astype(object).where(shown.notna(), "")  # not measured: blank, not "NaN"
