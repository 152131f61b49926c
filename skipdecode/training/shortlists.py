"""A draft adapter's shortlist (skipdecode/speculative/shortlist.py): every token its task's training targets use, most
frequent first, written as shortlist.json in the adapter's folder. E2E: the training split's references.
General: the full-depth base model's greedy answers to the first training prompts (the targets a general
adapter learns from; validation prompts are never read).

    python -m skipdecode.training.shortlists --task e2e --adapter assets/adapters/e2e-draft-3x
    python -m skipdecode.training.shortlists --task general --prompts 1024 --adapter assets/adapters/general-3x
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..speculative.shortlist import FILE, count


def e2e_targets(tokenizer, data=None) -> tuple[list[list[int]], str]:
    """The training split's references as the answers' tokens (with the leading space a reply's words have)."""
    from ..evaluation.data import training_split

    refs = [ref for item in training_split(data)[0] for ref in item.refs]
    ids = [tokenizer(ref, add_special_tokens=False)["input_ids"] for ref in refs]
    return ids, f"the E2E NLG training split's {len(refs)} references"


def general_targets(engine, prompts: int, new_tokens: int) -> tuple[list[list[int]], str]:
    """The tokens the base model generates for the first training prompts (the targets general adapters learn)."""
    from .targets import reference_answers, training_prompts

    chosen = training_prompts(engine.tokenizer, limit=prompts)
    answers = reference_answers(engine, chosen, new_tokens)
    return [answers[p] for p in chosen], (f"{engine.name}'s full-depth greedy answers ({new_tokens} new tokens at "
                                          f"most) to the first {len(chosen)} general training prompts")


def write(dest: Path, sequences: list[list[int]], counted_on: str, size: int | None = None) -> int:
    """shortlist.json in `dest`: the `size` most frequent tokens of `sequences` (None: all of them)."""
    ids = count(sequences, size)
    (Path(dest) / FILE).write_text(json.dumps({"ids": ids, "counted_on": counted_on}) + "\n", encoding="utf-8")
    return len(ids)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=("e2e", "general"), required=True)
    p.add_argument("--adapter", required=True, nargs="+", help="the adapter folders to write it into")
    p.add_argument("--prompts", type=int, default=1024, help="general: training prompts to answer")
    p.add_argument("--new-tokens", type=int, default=64, help="general: tokens an answer runs at most")
    p.add_argument("--size", type=int, default=None, help="the most frequent N tokens only (default: all)")
    args = p.parse_args(argv)

    from ..engine import Engine

    engine = Engine.load()
    sequences, counted_on = (e2e_targets(engine.tokenizer) if args.task == "e2e"
                             else general_targets(engine, args.prompts, args.new_tokens))
    for folder in args.adapter:
        n = write(Path(folder), sequences, counted_on, args.size)
        print(f"{folder}/{FILE}: {n} tokens, counted on {counted_on}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
