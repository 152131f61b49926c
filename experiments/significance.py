"""Is one row's BLEU really above another's? Paired bootstrap resampling (Koehn 2004) over the MRs of an
eval's outputs file, by sacrebleu's own significance test: a selection rule on 27 or 109 MRs and a test
table on 630 can disagree by chance or for real, and this says which.

    python experiments/significance.py assets/results/e2e-outputs.jsonl \
        "SkipDecode 3x e2e-3x" "SkipDecode 3x e2e-3x-cur-skd"
    python experiments/significance.py docs/results/e2e-validation-v20-outputs.jsonl \
        "SkipDecode 3x e2e-3x-refs-v20" "SkipDecode 3x e2e-3x-skd-v20" --split validation --validation-share 0.2

Pass the split, share and --made-up-names the eval that wrote the file was run with: the references are
read again from the data, exactly as that eval scored them. Prints each row's BLEU with its 95% confidence
interval and the p-value of the second row against the first (1,000 resamples, sacrebleu's fixed seed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sacrebleu.metrics import BLEU  # noqa: E402
from sacrebleu.significance import PairedTest  # noqa: E402

from skipdecode.evaluation.data import VALIDATION_SHARE  # noqa: E402
from skipdecode.evaluation.evaluate import add_made_up_names, load_items, reference_streams  # noqa: E402


def paired_bootstrap(outputs: Path, base: str, other: str, split: str = "test", share: float = VALIDATION_SHARE,
                     made_up_names: bool = False, data=None, samples: int = 1000):
    by_mr = {i.mr: i for i in load_items(data, split, made_up_names, None, share)}
    rows = [json.loads(line) for line in outputs.open()]
    for name in (base, other):
        if name not in rows[0]:
            raise SystemExit(f"no row {name!r} in {outputs}; rows: {', '.join(k for k in rows[0] if k != 'mr')}")
    missing = [r["mr"] for r in rows if r["mr"] not in by_mr]
    if missing:
        raise SystemExit(f"{len(missing)} MRs of {outputs} are not in the {split} split given (first: {missing[0]})")
    streams = reference_streams([by_mr[r["mr"]] for r in rows])
    test = PairedTest([(name, [r[name] for r in rows]) for name in (base, other)],
                      {"BLEU": BLEU(references=streams)}, references=None, test_type="bs", n_samples=samples)
    _, results = test()
    return len(rows), list(zip(results["System"], results["BLEU"]))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outputs", type=Path, help="an eval's *-outputs.jsonl")
    p.add_argument("base", help="the row to compare against, as the outputs file names it")
    p.add_argument("other", help="the row to test")
    p.add_argument("--split", choices=("test", "validation"), default="test")
    p.add_argument("--validation-share", type=float, default=VALIDATION_SHARE)
    add_made_up_names(p)
    p.add_argument("--data", help="the CSV the eval read (default: the E2E file of the split)")
    args = p.parse_args(argv)
    n, results = paired_bootstrap(args.outputs, args.base, args.other, args.split, args.validation_share,
                                  args.made_up_names, args.data)
    print(f"{args.outputs.name}: {n} MRs, paired bootstrap, 1000 resamples")
    for name, r in results:
        p_value = "" if r.p_value is None else f"  p = {r.p_value:.3f}"
        print(f"  {name}: BLEU {r.score:.1f} (95% CI +-{r.ci:.1f}){p_value}")


if __name__ == "__main__":
    main()
