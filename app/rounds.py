"""Verified decoding as it ran, for drawing: each round's drafts at the layers the draft ran, and its verify
pass over the drafts and one more position, from the record's `verification` and the draft's schedule.

A round (skipdecode/speculative/verify.py) drafts up to k tokens, output[first : first + drafted], then ONE full-depth
pass over drafted + 1 positions judges them: it keeps `accepted` drafts and chooses the next token itself
(the replacement of the first rejected draft, or a bonus token when all were kept). The draft of output
token i ran the schedule's layers for step i - 1 (warm-up layers, then the top ones; the rest skipped);
token 0 came from the prefill. Drafts copied from the prompt ("prompt") ran no layer; a round of source
"none" drafted nothing (a plain full-depth step). Records exported before rounds were recorded carry only
the marks: their rounds are read back from the marks (drafts beyond a rejection then go uncounted).
"""

from __future__ import annotations

import pandas as pd

from skipdecode.schedule import Schedule

KEPT, REJECTED, NONE, COPIED = "kept", "rejected", "none", "copied"


def rounds_of(verification: dict) -> list[dict]:
    """The record's rounds, or the ones its marks imply (older files)."""
    if verification.get("rounds"):
        return [dict(r) for r in verification["rounds"]]
    marks, out, first = verification.get("marks", []), [], 1
    for i in range(1, len(marks)):
        if marks[i] in ("replaced", "verifier"):
            accepted = i - first
            drafted = accepted + (marks[i] == "replaced")
            out.append({"first": first, "drafted": drafted, "accepted": accepted, "emitted": i - first + 1,
                        "source": "skipdecode" if drafted else "none", "draft_ms": 0.0, "verify_ms": 0.0})
            first = i + 1
    if first < len(marks):  # the answer ended inside a round (the token limit cut it)
        out.append({"first": first, "drafted": len(marks) - first, "accepted": len(marks) - first,
                    "emitted": len(marks) - first, "source": "skipdecode", "draft_ms": 0.0, "verify_ms": 0.0})
    return out


def drafts_frame(verification: dict, schedule: Schedule, tokens: int) -> pd.DataFrame:
    """One row per output token: `token`, `round` (its round, 0 for the prefill's token), `outcome` (KEPT:
    a draft the verifier kept; REJECTED: a draft it replaced; NONE: no draft, the verifier's own token;
    COPIED: a kept draft copied from the prompt), `layers` the draft ran there (empty where none ran) and
    `budget` (how many)."""
    rows = [{"token": 0, "round": 0, "outcome": NONE, "layers": ()}]
    sources = verification.get("sources") or []
    for index, r in enumerate(rounds_of(verification), start=1):
        for offset in range(r["emitted"]):
            i = r["first"] + offset
            if i >= tokens:
                break
            drafted = offset < r["drafted"]
            outcome = (NONE if not drafted else KEPT if offset < r["accepted"] else REJECTED)
            # who drafted it: a kept token's own source where the record has them (a round may copy from the
            # prompt and draft with the skipped model); a rejected draft's is the round's when all were copies
            source = (sources[i] if outcome == KEPT and i < len(sources)
                      else "prompt" if r.get("prompt_drafts", 0) == r["drafted"] > 0 else r["source"])
            if outcome == KEPT and source == "prompt":
                outcome = COPIED
            layers = schedule.layers(i - 1) if drafted and source != "prompt" else ()
            rows.append({"token": i, "round": index, "outcome": outcome, "layers": tuple(layers)})
    frame = pd.DataFrame(rows[:tokens], columns=["token", "round", "outcome", "layers"])
    frame["budget"] = frame["layers"].map(len)
    return frame


def passes_frame(verification: dict, tokens: int) -> pd.DataFrame:
    """One row per verify pass: `round`, the output tokens it judged or chose, `first` to `last` (the drafts
    and the one after them: drafted + 1 positions), `drafted`, `accepted`, `source`, `ms` (drafts and pass)
    and `lane` (0 or 1, alternating: a pass after a rejection judges again the positions the last one
    threw away, so two lanes keep neighbours apart)."""
    rows = []
    for index, r in enumerate(rounds_of(verification), start=1):
        if r["first"] >= tokens:
            break
        rows.append({"round": index, "first": r["first"], "last": min(r["first"] + r["drafted"], tokens - 1),
                     "drafted": r["drafted"], "accepted": r["accepted"], "source": r["source"],
                     "ms": round(float(r["draft_ms"]) + float(r["verify_ms"]), 3), "lane": (index - 1) % 2})
    return pd.DataFrame(rows, columns=["round", "first", "last", "drafted", "accepted", "source", "ms", "lane"])


def frames(comparison) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(drafts, passes) of a verified comparison (run or replayed)."""
    verification, tokens = comparison.skip.verification or {}, len(comparison.skip.token_ids)
    return drafts_frame(verification, comparison.schedule, tokens), passes_frame(verification, tokens)
