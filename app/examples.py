"""Example prompts from assets/examples, and E2E references for prompts that hold a test-set MR."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from skipdecode.evaluation.data import default_dir, e2e_prompt, read_items

EXAMPLES_FILE = Path(__file__).resolve().parent.parent / "assets" / "examples" / "examples.json"
E2E_TEST_FILE = "testset_w_refs.csv"
LABEL_CHARS = 40  # an example's label: a short line, so that the examples take two rows, not six
_SLOT = re.compile(r"([A-Za-z][A-Za-z ]*?)\s*\[([^\[\]]*)\]")
_MR = re.compile(r"[A-Za-z][A-Za-z ]*\[[^\[\]]*\](?:\s*,\s*[A-Za-z][A-Za-z ]*\[[^\[\]]*\])*")


@dataclass(frozen=True)
class Examples:
    prompts: tuple[str, ...]  # free-form prompts
    e2e: dict  # meaning representation -> its references

    @property
    def all_prompts(self) -> list[str]:
        """E2E items first (the task the adapters are trained for), then the free-form ones."""
        return [e2e_prompt(mr) for mr in self.e2e] + list(self.prompts)

    @property
    def labels(self) -> list[str]:
        """Short names for the examples, in the order of `all_prompts`."""
        e2e = [f"Restaurant: {dict(_SLOT.findall(mr)).get('name', 'a record')}" for mr in self.e2e]
        return e2e + [p if len(p) <= LABEL_CHARS else p[: LABEL_CHARS - 1].rstrip(" ,") + "…" for p in self.prompts]


@lru_cache(maxsize=4)
def load_examples(path: Path = EXAMPLES_FILE) -> Examples:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return Examples(tuple(data.get("prompts", [])), {item["mr"]: tuple(item["refs"]) for item in data.get("e2e", [])})


def normalise_mr(mr: str) -> str:
    """'name[X],eatType[ pub ]' -> 'name[X], eatType[pub]': the test set's own spelling."""
    return ", ".join(f"{key.strip()}[{value.strip()}]" for key, value in _SLOT.findall(mr))


def find_mr(prompt: str) -> str | None:
    """The meaning representation inside a prompt (the longest run of key[value] slots), if any."""
    runs = [m.group(0) for m in _MR.finditer(prompt or "")]
    return normalise_mr(max(runs, key=len)) if runs else None


@lru_cache(maxsize=1)
def _test_set() -> dict:
    """All test MRs -> references, when the E2E data is on this machine; {} otherwise (e.g. Spaces)."""
    path = default_dir() / E2E_TEST_FILE
    if not path.exists():
        return {}
    return {normalise_mr(item.mr): item.refs for item in read_items(path)}


def references_for(prompt: str, examples: Examples | None = None) -> tuple[str, ...] | None:
    """The E2E references of the MR in `prompt` when it is a test-set item, else None."""
    mr = find_mr(prompt)
    if mr is None:
        return None
    examples = examples or load_examples()
    known = {normalise_mr(k): v for k, v in examples.e2e.items()}
    return known.get(mr) or _test_set().get(mr)
