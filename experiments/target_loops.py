"""How much the general-prompt training targets loop, and what `--cut-loops N` leaves of them.

    python experiments/target_loops.py checkpoints/targets-SmolLM2-135M-Instruct-float32-160tokens.jsonl [--n 8]

The targets are the full-depth base model's greedy answers, cached by `skipdecode train --task general`
in --checkpoint-dir. For the training prompts among them (the held-out ones are left out) this prints the
repetition measure of `eval --prompts` (the share of word 3-grams said before) over the whole answer and
over its first 96 tokens (what eval reads), how many answers end with the end token, and, cut with
`targets.cut_at_loop`, how many are cut and how long they are before and after.
"""

from __future__ import annotations

import argparse
import json
import statistics

from skipdecode.evaluation import general
from skipdecode.models import load_model
from skipdecode.training import targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", help="a targets-*.jsonl file of the training cache")
    parser.add_argument("--n", type=int, default=8, help="the run length of --cut-loops (default 8)")
    args = parser.parse_args()
    tokenizer = load_model(None).tokenizer
    rows = [json.loads(line) for line in open(args.targets, encoding="utf-8")]
    rows = [r for r in rows if not general.held_out(r["prompt"])]
    ids = [r["token_ids"] for r in rows]
    text = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    whole = [general.repetition(text(t)) for t in ids]
    first = [general.repetition(text(t[:general.EVAL_TOKENS])) for t in ids]
    cut = [targets.cut_at_loop(t, args.n) for t in ids]
    kept = [general.repetition(text(t)) for t in cut]
    ended = sum(1 for t in ids if t and t[-1] == tokenizer.eos_token_id)
    print(f"{len(rows)} training targets of {args.targets}")
    print(f"repetition (share of word 3-grams said before), mean: whole answer {statistics.mean(whole):.3f}, "
          f"first {general.EVAL_TOKENS} tokens {statistics.mean(first):.3f}, after --cut-loops {args.n} "
          f"{statistics.mean(kept):.3f}")
    print(f"answers repeating over 30% of their 3-grams: whole {sum(r > 0.3 for r in whole)}, first "
          f"{general.EVAL_TOKENS} tokens {sum(r > 0.3 for r in first)}, after the cut {sum(r > 0.3 for r in kept)}")
    print(f"ended with the end token: {ended}; cut by --cut-loops {args.n}: "
          f"{sum(len(c) < len(t) for c, t in zip(cut, ids))}")
    print(f"tokens per target, mean: {statistics.mean(map(len, ids)):.1f} -> {statistics.mean(map(len, cut)):.1f}")


if __name__ == "__main__":
    main()
