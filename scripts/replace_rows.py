# Who: a maintainer, when a served adapter changed and some rows of a results table in assets/results must follow it.
"""Put some rows of a newer eval run into a results table, in place of the table's rows with those labels.

    python scripts/replace_rows.py assets/results/e2e-beams4 /tmp/beams5/e2e-beams4 --rows "SkipDecode 5x"

Why: a served adapter changed and one row of a long table (the beam-4 test table: about an hour here) must
follow it, without decoding the rows that did not change. The new run must hold every row it shares with the
table (the fine-tuned 1x, its decode-speedup reference) with the same outputs, MR for MR, or nothing is
written: that is what makes its rows comparable with the table's. The .csv, .json and -outputs.jsonl files
are rewritten; -human.json (the references against each other) does not depend on the rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from skipdecode.evaluation.runs import write_frame


def _read(prefix: Path) -> tuple[pd.DataFrame, list[dict]]:
    frame = pd.read_csv(prefix.with_name(prefix.name + ".csv"))
    outputs = [json.loads(line) for line in prefix.with_name(prefix.name + "-outputs.jsonl").read_text().splitlines()]
    return frame, outputs


def _key(row) -> str:
    return f"{row['row']} {row['adapter']}"  # how eval names a row's field in -outputs.jsonl


def replace_rows(table: Path, run: Path, labels: list[str]) -> pd.DataFrame:
    old, old_out = _read(table)
    new, new_out = _read(run)
    if [o["mr"] for o in old_out] != [o["mr"] for o in new_out]:
        raise ValueError(f"{run} decoded other MRs than {table}")
    missing = [label for label in labels if label not in set(old["row"]) or label not in set(new["row"])]
    if missing:
        raise ValueError(f"rows {missing} are not in both {table} and {run}")
    shared = [_key(r) for _, r in new.iterrows() if r["row"] not in labels]
    for key in shared:
        if key not in old_out[0] or any(a[key] != b[key] for a, b in zip(old_out, new_out)):
            raise ValueError(f"{key!r} differs between {table} and {run}: the runs are not comparable")
    replaced = [_key(r) for _, r in old.iterrows() if r["row"] in labels]
    added = [_key(r) for _, r in new.iterrows() if r["row"] in labels]
    rows = []
    for _, r in old.iterrows():
        if r["row"] not in labels:
            rows.append(r)
        elif _key(r) == replaced[0]:  # the new rows take the place of the first one they replace
            rows += [n for _, n in new.iterrows() if n["row"] in labels]
    frame = pd.DataFrame(rows).reset_index(drop=True)
    write_frame(frame, table)
    lines = []
    for a, b in zip(old_out, new_out):
        kept = {k: v for k, v in a.items() if k not in replaced}
        lines.append(json.dumps({**kept, **{k: b[k] for k in added}}))
    table.with_name(table.name + "-outputs.jsonl").write_text("\n".join(lines) + "\n")
    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", type=Path, help="results prefix to update (e.g. assets/results/e2e-beams4)")
    parser.add_argument("run", type=Path, help="results prefix of the newer run (its --out)")
    parser.add_argument("--rows", action="append", required=True, help="a row label to replace; repeat")
    args = parser.parse_args()
    print(replace_rows(args.table, args.run, args.rows).to_string(index=False))


if __name__ == "__main__":
    main()
