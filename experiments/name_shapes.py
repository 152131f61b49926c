"""Names copied exactly, by the shape of the name: what an E2E eval with made-up names gets right, and where.

    python experiments/name_shapes.py docs/results/e2e-dev-word-names-outputs.jsonl

Reads the `-outputs.jsonl` file `skipdecode eval` writes and, per row, the share of MRs whose restaurant
name the output holds exactly (eval's `names_copied`), split by the name's shape: "The Pebble", "Sleepy
Walnut", "The Crooked Willow", "Walnut and Bramble". Why: one share over all names hid that a skipping
adapter never copies a name with an "and" in it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from skipdecode.evaluation.data import Item
from skipdecode.evaluation.evaluate import names_copied

SHAPES = ("The N", "A N", "The A N", "N and N", "other")


def shape(name: str) -> str:
    words = name.split()
    if len(words) == 3 and words[1] == "and":
        return "N and N"
    if words[0] == "The":
        return {2: "The N", 3: "The A N"}.get(len(words), "other")
    return "A N" if len(words) == 2 else "other"


def by_shape(lines: list[dict]) -> dict[str, dict[str, tuple[int, float]]]:
    """row -> shape -> (MRs, % of names copied exactly)."""
    items = [Item(line["mr"], ()) for line in lines]
    groups = {}
    for i, item in enumerate(items):
        groups.setdefault(shape(item.slots.get("name", "")), []).append(i)
    return {row: {s: (len(idx), 100 * names_copied([items[i] for i in idx], [lines[i][row] for i in idx]))
                  for s, idx in sorted(groups.items(), key=lambda g: SHAPES.index(g[0]))}
            for row in lines[0] if row != "mr"}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outputs", type=Path)
    lines = [json.loads(line) for line in p.parse_args(argv).outputs.read_text(encoding="utf-8").splitlines()
             if line.strip()]
    for row, shapes in by_shape(lines).items():
        print(row + ": " + ", ".join(f"{s} {pct:.1f}% of {n}" for s, (n, pct) in shapes.items()))


if __name__ == "__main__":
    main()
