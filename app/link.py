"""A link that opens a comparison: the prompt and the Compare tab's settings in the URL's query string, so that a
teacher can send a class the comparison to run.

The keys are the HTTP API's parameter names (docs/app.md), `model` a short name ("auto", "base" or an adapter's)
and `verify=1` the verified family. `encode` writes the settings that RAN, from a comparison's record, not what
the widgets hold now. `decode` reads a link, which is a stranger's text: it keeps only known keys whose values
the widget could hold (a slider's range and step, a list's choices, a prompt the studio would take) and ignores
anything else, the widget keeping its default. Opening a link fills the page and runs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

from .choices import AUTO
from .settings import Settings, clean_prompt
from .verified import FASTER, VERIFIED

MAX_QUERY = 8_000  # a longer address is refused by some servers and proxies: a longer prompt stays out of a link
MAX_FIELDS = 64  # a query string with more fields than this is not one of ours: nothing in it is read
SAFE_INTEGER = 2**53 - 1  # the largest seed a browser's number field holds exactly
# the link's key -> the Compare tab's widget it fills (the other keys are the widgets' own names)
WIDGETS = {"verify": "family"}
# The Copy link button's second step, in the browser: the query string the server wrote becomes the page's own
# address with it, copied to the clipboard where the browser allows, and shown in the read-only box either way.
COPY_JS = """(query) => {
  if (!query || !query.startsWith('?')) return query;
  const url = window.location.origin + window.location.pathname + query;
  navigator.clipboard?.writeText(url).catch(() => {});
  return url;
}"""
KEYS = ("prompt", "model", "speedup", "max_new_tokens", "decoding", "temperature", "top_p", "top_k", "seed", "beams",
        "max_budget", "min_budget", "warmup", "horizon", "decay", "mode", "verify")


@dataclass(frozen=True)
class Number:
    """A slider's (or number box's) values: within [low, high], on its steps from `low`."""

    low: float
    high: float
    step: float = 1.0

    @property
    def whole(self) -> bool:
        return float(self.step).is_integer() and float(self.low).is_integer()

    def read(self, text: str):
        try:
            value = float(text)
        except (TypeError, ValueError, OverflowError):
            return None
        if not math.isfinite(value) or not self.low <= value <= self.high:
            return None
        if self.whole and self.step == 1:  # whole numbers (a seed's range is too wide for the steps' sum)
            return int(value) if value.is_integer() else None
        steps = (value - self.low) / self.step
        if abs(steps - round(steps)) > 1e-6:  # off its steps: not a value the widget holds
            return None
        value = self.low + round(steps) * self.step
        return int(round(value)) if self.whole else round(value, 6)

    def write(self, value) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        text = str(int(value)) if self.whole and float(value).is_integer() else f"{value:g}"
        return text if self.read(text) is not None else None


@dataclass(frozen=True)
class Choice:
    """A list's values, each by its word in the link."""

    words: Mapping[str, object]  # the link's word -> the widget's value

    def read(self, text: str):
        return self.words.get(text)

    def write(self, value) -> str | None:
        return next((word for word, held in self.words.items() if held == value), None)


@dataclass(frozen=True)
class Prompt:
    """The prompt box: a prompt the studio would take (its length, UTF-8, no control characters), else none."""

    max_chars: int

    def read(self, text: str):
        try:
            clean_prompt(text, self.max_chars)
        except ValueError:
            return None
        return text.strip()

    write = read


def choices(widget) -> dict:
    """A Radio's or Dropdown's values, each its own word."""
    return {str(value): value for _, value in widget.choices}


def model_words(models) -> dict[str, str]:
    """Each served model's short name: "auto", "base" (the model without an adapter), or its adapter's name."""
    words = {}
    for m in models:
        word = "auto" if m.label == AUTO else m.adapter or "base"
        words.setdefault(word, m.label)
    return words


def fields(widgets: Mapping[str, object], models, max_prompt_chars: int) -> dict[str, object]:
    """What each key of a link may hold, read off the page's own widgets (their ranges, steps and choices), so
    a link can never set a value the page could not."""
    out: dict[str, object] = {"prompt": Prompt(max_prompt_chars), "model": Choice(model_words(models)),
                              "seed": Number(-SAFE_INTEGER, SAFE_INTEGER),
                              "verify": Choice({"1": VERIFIED, "0": FASTER})}
    for key in KEYS:
        widget = widgets.get(WIDGETS.get(key, key))
        if key in out or widget is None:
            continue
        out[key] = (Choice(choices(widget)) if hasattr(widget, "choices") else
                    Number(widget.minimum, widget.maximum, widget.step))
    return out


def _pairs(query) -> list[tuple[str, str]]:
    if isinstance(query, Mapping):
        return [(k, v) for k, v in list(query.items())[:MAX_FIELDS] if isinstance(k, str) and isinstance(v, str)]
    try:
        return parse_qsl(str(query or "").lstrip("?"), keep_blank_values=True, max_num_fields=MAX_FIELDS,
                         errors="surrogateescape")  # bytes not UTF-8: refused where read
    except ValueError:  # more fields than MAX_FIELDS
        return []


def decode(query, fields: Mapping[str, object]) -> dict[str, object]:
    """The widgets' values a link sets (by widget name), from its query string or its parsed parameters; a key
    given twice counts once (the first). Hand-set budgets count only as a pair whose min is at most its max."""
    out, seen = {}, set()
    for key, text in _pairs(query):
        if key in seen or key not in fields:
            continue
        seen.add(key)
        value = fields[key].read(text)
        if value is not None:
            out[WIDGETS.get(key, key)] = value
    budgets = out.pop("max_budget", None), out.pop("min_budget", None)
    if None not in budgets and budgets[1] <= budgets[0]:
        out.update(manual=True, max_budget=budgets[0], min_budget=budgets[1])
    return out


def ran(record: Mapping) -> dict[str, object]:
    """The Compare tab's values that ran the comparison in `record` (app/replay.py), by widget name: the settings
    that matter for its decoding, the others left to the page's defaults."""
    known = Settings.__dataclass_fields__
    settings = Settings(**{name: value for name, value in (record.get("settings") or {}).items() if name in known})
    settings.max_new_tokens = record["max_new_tokens"]
    auto = record["why"]["full"] != "chosen"  # "auto" says why it picked each side; a chosen model is "chosen"
    out = {"prompt": record["prompt"], "model": AUTO if auto else record["model"],
           "max_new_tokens": settings.max_new_tokens}
    if settings.manual_budgets:
        out.update(max_budget=settings.max_budget, min_budget=settings.min_budget)
    else:
        out["speedup"] = settings.speedup
    if settings.beams:
        out.update(decoding="beam search", beams=settings.beams)
    elif settings.sampling:
        out.update(decoding="sampling", temperature=settings.temperature, top_p=settings.top_p,
                   top_k=settings.top_k, seed=settings.seed)
    default = Settings()
    out.update({name: getattr(settings, name) for name in ("warmup", "horizon", "decay", "mode")
                if getattr(settings, name) != getattr(default, name)})
    if record.get("verified"):  # what ran, whatever the switch said
        out["family"] = VERIFIED
    return out


def encode(values: Mapping[str, object], fields: Mapping[str, object]) -> str:
    """The query string ("?prompt=…&speedup=3") of the widgets' `values`; a value the page could not hold is left
    out, so that the link opens with that widget's default, and so is a prompt too long for an address
    (MAX_QUERY)."""
    pairs = []
    for key in KEYS:
        value = values.get(WIDGETS.get(key, key))
        text = fields[key].write(value) if key in fields and value is not None else None
        if text is not None:
            pairs.append((key, text))
    query = "?" + urlencode(pairs, safe=",:")  # an E2E record's commas and colons stay readable
    return query if len(query) <= MAX_QUERY else encode({**values, "prompt": None}, fields)
