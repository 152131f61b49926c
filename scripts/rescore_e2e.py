# Who: a maintainer, when the E2E metrics gain or change a column and the tables in assets/results must follow.
"""Score an E2E eval's saved outputs again with today's `score()`, without decoding anything.

    python scripts/rescore_e2e.py assets/results/e2e [--split test] [--made-up-names [words]]

Reads <prefix>-outputs.jsonl (what `skipdecode eval` wrote: the MR and each row's output) and rewrites
the text-metric columns of <prefix>.csv and .json (BLEU, the challenge's uncased BLEU `bleu_e2e`,
ROUGE-L, chrF, slot errors, names, length), keeping what only the decoding run measured (layers, time,
tokens). Why: when the metrics gain a column, the tables already made stay comparable without running
the decoding again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from skipdecode.evaluation.evaluate import add_made_up_names, load_items, score
from skipdecode.evaluation.runs import write_frame


def rescore(prefix: Path, split: str = "test", made_up_names: bool = False) -> pd.DataFrame:
    lines = [json.loads(line) for line in prefix.with_name(prefix.name + "-outputs.jsonl").open()]
    items = {item.mr: item for item in load_items(None, split, made_up_names)}
    missing = [line["mr"] for line in lines if line["mr"] not in items]
    if missing:
        raise ValueError(f"{len(missing)} MRs of the outputs are not in the {split} split, e.g. {missing[0]!r}")
    ordered = [items[line["mr"]] for line in lines]
    frame = pd.read_csv(prefix.with_suffix(".csv"))
    for i, row in frame.iterrows():
        key = f"{row['row']} {row['adapter']}"
        scores = score(ordered, [line[key] for line in lines])
        for metric, value in scores.items():
            frame.loc[i, metric] = round(value, 3)
    write_frame(frame, prefix)
    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", type=Path, help="the eval's results prefix, e.g. assets/results/e2e")
    parser.add_argument("--split", choices=("test", "dev", "validation"), default="test")
    add_made_up_names(parser)
    args = parser.parse_args()
    frame = rescore(args.prefix, args.split, args.made_up_names)
    print(frame[["row", "adapter", "bleu", "bleu_e2e", "ser"]].to_string(index=False))


if __name__ == "__main__":
    main()
