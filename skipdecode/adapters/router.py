"""Which kind of prompt is this: an E2E meaning representation, or anything else (a general prompt)?

The E2E adapters learned one task, a restaurant's slot[value] pairs -> one sentence; on anything else
they shorten and bend the answer ("The sky is a place to buy a child friendly place."). So `adapter_for`
asks the router first. A prompt is E2E when it carries

- the E2E instruction (INSTRUCTION, which every E2E prompt of the data and the app begins with), or
- a comma-separated run of at least two slot[value] pairs with distinct slot names, one of them an E2E
  slot (name, eatType, food, priceRange, customer rating, area, familyFriendly, near), or
- a run of at least three such pairs with other slot names of three letters or more (a meaning
  representation with unusual slots, "venue[Blue Note], genre[jazz], price[£15]"), which is most of the
  prompt: at most MAX_OTHER_WORDS words beside it.

Everything else is general, text that merely holds brackets included ("what is a[i] in C?", "arr[0],
arr[1]", one lone "name[...]"); none of the 5,999 prompts of the general pool reads as E2E. The router
looks at form, not meaning: code with three bracketed names and little prose ("list[int], dict[str],
set[float]") reads as a meaning representation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

E2E, GENERAL = "e2e", "general"
INSTRUCTION = "Write one sentence describing this restaurant, using every fact: "  # + the MR: an E2E prompt
E2E_SLOTS = ("name", "eatType", "food", "priceRange", "customer rating", "area", "familyFriendly", "near")
MAX_OTHER_WORDS = 12  # beside an MR of unusual slots: room for an instruction, not for a question about code
PAIR = re.compile(r"([A-Za-z]+(?: [A-Za-z]+)*)\s*\[([^\[\]]*)\]")
SEPARATOR = re.compile(r"\s*,\s*")
_KNOWN = {slot.lower() for slot in E2E_SLOTS}


@dataclass(frozen=True)
class Route:
    kind: str  # E2E or GENERAL
    reason: str  # a few words: what made it so


def route(prompt: str | None) -> Route:
    """The kind of `prompt` and why."""
    text = " ".join((prompt or "").split())
    if _normal(INSTRUCTION) in _normal(text):
        return Route(E2E, "the E2E instruction")
    runs = slot_runs(text)
    if not runs:
        return Route(GENERAL, "no slot[value] pairs")
    keys, start, end = max(runs, key=lambda run: len(run[0]))
    distinct = len({k.lower() for k in keys}) == len(keys)
    known = [k for k in keys if k.lower() in _KNOWN]
    if len(keys) >= 2 and distinct and known:
        return Route(E2E, f"slot[value] pairs ({', '.join(keys)})")
    other_words = len((text[:start] + " " + text[end:]).split())
    if len(keys) >= 3 and distinct and all(len(k) >= 3 for k in keys) and other_words <= MAX_OTHER_WORDS:
        return Route(E2E, f"slot[value] pairs with unusual slots ({', '.join(keys)})")
    return Route(GENERAL, "brackets, but not a meaning representation")


def is_e2e(prompt: str | None) -> bool:
    return route(prompt).kind == E2E


def slot_runs(text: str) -> list[tuple[list[str], int, int]]:
    """Every comma-separated run of key[value] pairs: (its slot names, start, end). The regex takes the
    words before a bracket as the key; the first key of a run keeps only its last word (or its last two,
    when they name an E2E slot such as "customer rating"), the rest being the prose before the run."""
    runs: list[tuple[list[str], int, int]] = []
    previous_end = None
    for match in PAIR.finditer(text):
        key = match.group(1)
        if previous_end is not None and SEPARATOR.fullmatch(text[previous_end:match.start()]):
            keys, start, _ = runs[-1]
            runs[-1] = (keys + [key], start, match.end())
        else:
            words = key.split()
            tail = " ".join(words[-2:]) if " ".join(words[-2:]).lower() in _KNOWN else words[-1]
            runs.append(([tail], match.end(1) - len(tail), match.end()))
        previous_end = match.end()
    return runs


def _normal(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(": ")
