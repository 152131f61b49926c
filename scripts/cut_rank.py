# Who: a maintainer, after training an adapter of a high rank and before serving it at a lower one.
"""Cut a trained adapter to a lower rank before it is served (an SVD of each layer's update):

    python scripts/cut_rank.py checkpoints/runs/general-3x-N64s300 checkpoints/runs/general-3x-N64s300-r16 --rank 16

Prints the share of the updates' energy the cut keeps (mean and least over the layers' updates). Score the
cut adapter again before serving it: what the energy loses is not what the scores lose.
"""

from __future__ import annotations

import argparse
import json

from skipdecode.training.rank_cut import cut_rank


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source")
    parser.add_argument("dest")
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    print(json.dumps(cut_rank(args.source, args.dest, args.rank)))


if __name__ == "__main__":
    main()
