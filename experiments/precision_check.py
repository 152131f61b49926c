"""What bfloat16 costs on general prompts: the base model's full-depth greedy answers in bfloat16 scored
against its float32 answers (the reference), on the project's validation prompts.

    python experiments/precision_check.py      # 64 held-out prompts, 96 new tokens

Prints ROUGE-L, BLEU, agreement and the median perplexity ratio (under the float32 model) of the bfloat16
answers, and the float32 answers against themselves as the check (100 and 1.0).
"""

from __future__ import annotations

import json
import sys

import torch

from skipdecode.engine import Engine
from skipdecode.evaluation.general import answer, score, validation_prompts


def main() -> int:
    full = Engine.load(dtype="float32")
    prompts = validation_prompts(full.tokenizer)
    reference = answer(full, prompts, max_new_tokens=96)
    half = Engine.load(dtype="bfloat16")
    answers = answer(half, prompts, max_new_tokens=96)
    ids = [full.encode(p) for p in prompts]
    rows = score(full.model, ids, reference, [reference, answers])
    for name, row in zip(("float32 vs itself", "bfloat16 vs float32"), rows):
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
    print(f"{len(prompts)} prompts, 96 new tokens; ms/token float32 {reference.ms_per_token:.1f}, "
          f"bfloat16 {answers.ms_per_token:.1f} (torch {torch.__version__})")
    if len(sys.argv) > 1:
        json.dump({"prompts": len(prompts), "rows": dict(zip(("float32", "bfloat16"), rows))}, open(sys.argv[1], "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
