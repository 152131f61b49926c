"""The E2E NLG data: meaning representations (MRs) of restaurants and human references.

Read by path (option, or $SKIPDECODE_E2E_DIR, or ../shared/data/e2e beside the repo); the files are
CC BY-SA 4.0 (Novikova, Dusek and Rieser, 2017) and are never copied into this repository.
"""

from __future__ import annotations

import csv
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

E2E_ENV = "SKIPDECODE_E2E_DIR"
INSTRUCTION = "Write one sentence describing this restaurant, using every fact: "
SLOT = re.compile(r"\s*([^\[,]+?)\s*\[([^\]]*)\]")


@dataclass(frozen=True)
class Item:
    """One meaning representation with all of its references."""

    mr: str
    refs: tuple[str, ...]

    @property
    def prompt(self) -> str:
        return e2e_prompt(self.mr)

    @property
    def slots(self) -> dict[str, str]:
        return parse_mr(self.mr)


def e2e_prompt(mr: str) -> str:
    return INSTRUCTION + mr


def parse_mr(mr: str) -> dict[str, str]:
    """'name[The Eagle], food[French]' -> {'name': 'The Eagle', 'food': 'French'}"""
    return {key.strip(): value.strip() for key, value in SLOT.findall(mr)}


def default_dir() -> Path:
    if os.environ.get(E2E_ENV):
        return Path(os.environ[E2E_ENV])
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "e2e"


def resolve(path_or_name: str | os.PathLike | None, name: str) -> Path:
    """A CSV given by path, or `name` in the E2E folder."""
    path = Path(path_or_name) if path_or_name else default_dir() / name
    if path.is_dir():
        path = path / name
    if not path.exists():
        raise FileNotFoundError(
            f"E2E file not found: {path}. Pass --data PATH or set {E2E_ENV} to the folder holding {name}"
        )
    return path


def read_items(path: str | os.PathLike) -> list[Item]:
    """Rows grouped by MR, in order of first appearance; columns `mr` and `ref` are required."""
    refs: dict[str, list[str]] = {}
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"mr", "ref"} <= set(reader.fieldnames):
            raise ValueError(f"{path}: an E2E CSV needs the columns mr and ref; found {reader.fieldnames}")
        for row in reader:
            if row["mr"].strip():
                refs.setdefault(row["mr"].strip(), []).append((row["ref"] or "").strip())
    if not refs:
        raise ValueError(f"{path}: no rows")
    return [Item(mr, tuple(r for r in rs if r)) for mr, rs in refs.items()]


def split_items(items: list[Item], validation_share: float, seed: int) -> tuple[list[Item], list[Item]]:
    """Hold out whole MRs (not single references), so validation MRs are unseen in training."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    held = max(1, round(len(items) * validation_share))
    held_out = set(order[:held])
    return ([it for i, it in enumerate(items) if i not in held_out],
            [it for i, it in enumerate(items) if i in held_out])


def pairs(items: list[Item]) -> list[tuple[str, str]]:
    """(prompt, reference) training examples: one per reference."""
    return [(item.prompt, ref) for item in items for ref in item.refs]
