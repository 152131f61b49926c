# Who: a maintainer choosing the page's looping threshold (docs/research/looping-answers.md).
"""How often answers repeat themselves on the general validation prompts, as the page runs them.

    python experiments/looping.py --out docs/results/looping-validation-2026-12-02.json

Each of the 64 validation prompts runs as the page runs it: the Studio, model "auto", greedy, at 48 and at 160
new tokens, and at 2x, 3x and 5x. For each answer it records `general.repetition`, the share of word 3-grams said
before. The threshold comes from the full-decoding answers alone: their largest repetition, rounded up to a
multiple of 0.05. Then it counts the SkipDecode answers the page's rule would call looping, and runs the dragon
story of tests/test_browser.py at 512 tokens and 3x as an example.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from app.choices import AUTO  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.studio import Studio  # noqa: E402
from skipdecode.evaluation import general  # noqa: E402

SPEEDUPS, TOKENS = (2.0, 3.0, 5.0), (48, 160)
STORY = "Write a long story about a dragon and a knight who become friends."  # tests/test_browser.py


def run(studio: Studio, prompt: str, speedup: float, tokens: int) -> dict:
    *_, final = studio.compare(prompt, Settings(speedup=speedup, max_new_tokens=tokens), AUTO)
    return {"skip": round(general.repetition(final.skip.text), 4), "full": round(general.repetition(final.full.text), 4),
            "model": final.model, "full_model": final.full_model}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    studio = Studio()
    prompts = general.validation_prompts(studio.engine(studio.base).tokenizer)
    rows = [{"prompt": i, "speedup": s, "tokens": n, **run(studio, p, s, n)}
            for i, p in enumerate(prompts) for n in TOKENS for s in SPEEDUPS]
    full_max = max(r["full"] for r in rows)
    threshold = math.ceil(full_max / 0.05 - 1e-9) * 0.05
    flagged = {f"{s:g}x, {n} tokens": sum(r["skip"] > threshold and r["full"] <= threshold for r in rows
                                            if r["speedup"] == s and r["tokens"] == n)
               for n in TOKENS for s in SPEEDUPS}
    story = run(studio, STORY, 3.0, 512)
    result = {"command": "python " + " ".join(sys.argv), "prompts": len(prompts), "full_max": full_max,
              "threshold": round(threshold, 2), "flagged_of_each": flagged, "story_3x_512": story, "rows": rows}
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
