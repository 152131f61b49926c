"""Which MR slots each row of an E2E eval leaves out: the slot error rate broken down by attribute.

    python experiments/slot_misses.py docs/results/e2e-dev-3x-A-outputs.jsonl [more outputs files]

Reads the `-outputs.jsonl` files `skipdecode eval` writes (one line per MR: the MR and each row's output)
and counts, per row, the MR values its outputs miss, by the same matcher `eval` scores slot errors with.
Why: a slot error rate says how often facts drop, not which; a skipping model drops some attributes
far more often than others, and that decides what to train on.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from skipdecode.evaluation.data import Item
from skipdecode.evaluation.evaluate import slot_misses


def misses(lines: list[dict]) -> dict[str, Counter]:
    """row -> Counter(attribute -> MRs whose output misses that attribute's value), by eval's `slot_misses`;
    key "(slots)" counts every attribute the MRs hold, the denominator."""
    items = [Item(line["mr"], ()) for line in lines]
    counts = {}
    for row in (r for r in lines[0] if r != "mr"):  # eval writes the same rows on every line
        missed, total = slot_misses(items, [line[row] for line in lines])
        missed["(slots)"] = total
        counts[row] = missed
    return counts


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outputs", nargs="+", type=Path)
    args = p.parse_args(argv)
    for path in args.outputs:
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        for row, count in misses(lines).items():
            total = count.pop("(slots)")
            worst = ", ".join(f"{key} {n}" for key, n in count.most_common() if n)
            print(f"{path.name} | {row}: {sum(count.values())} of {total} values missed ({worst or 'none'})")


if __name__ == "__main__":
    main()
