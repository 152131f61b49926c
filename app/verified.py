"""The page's verified mode: the two families of early exit side by side, by what they promise.

"SkipDecode" changes the output to save layers; "SkipDecode, verified" (skipdecode/verify.py) lets the
skipped model draft and the full model check, so the answer is the full model's and only the speed depends
on how often the drafts agree. In verified mode the SkipDecode side shows each token marked as a draft the
full model accepted or a token the full model put in, with the acceptance rate, the measured speedup
against full decoding (interleaved as in the other mode) and one line saying why it is faster or slower.
Kept apart from views.py so that the other mode's views stay as they are; every string from a prompt or
the model is escaped here.
"""

from __future__ import annotations

import html

from skipdecode.verify import ACCEPTED, REPLACED, why

FASTER = "SkipDecode — faster, output may change"
VERIFIED = "SkipDecode, verified — the full model's output, faster only where drafts agree"
FAMILIES = (FASTER, VERIFIED)
TITLES = {ACCEPTED: "drafted by SkipDecode, accepted by the full model",
          REPLACED: "the full model's token: it rejected SkipDecode's draft here",
          "verifier": "the full model's own next token (the first token, or after every draft was accepted)"}
CSS = """
.sd-accepted { background: rgba(16, 185, 129, 0.25); border-bottom: 2px solid rgb(16, 185, 129); }
.sd-replaced { background: rgba(239, 68, 68, 0.22); border-bottom: 2px solid rgb(239, 68, 68); }
.sd-verifier { background: rgba(107, 114, 128, 0.15); border-bottom: 2px solid rgb(107, 114, 128); }
"""


def chosen(family) -> bool:
    """Whether the page's family switch asks for verified decoding (anything else: plain SkipDecode)."""
    if family not in (None, "", *FAMILIES):
        raise ValueError(f"the decoding family must be one of: {'; '.join(FAMILIES)}")
    return family == VERIFIED


def tokens_html(pieces: list[str], marks: list[str], streaming: bool = False, picked: int | None = None) -> str:
    """Each token marked by where it came from: accepted draft, replaced by the verifier, or the verifier's
    (clickable like the other mode's tokens: `data-pos` picks the position for the layer view)."""
    if not pieces:
        return '<div class="sd-output sd-empty">–</div>'
    spans = []
    for index, (piece, mark) in enumerate(zip(pieces, marks)):
        shown, mark = html.escape(piece) or "&#8203;", html.escape(mark)
        extra = " sd-picked" if index == picked else ""
        focus = 0 if index == (picked or 0) else -1  # one Tab stop; teach.CLICK_JS moves between tokens
        spans.append(f'<span class="sd-token sd-{mark}{extra}" data-pos="{index}" data-mark="{mark}" '
                     f'tabindex="{focus}" role="button" '
                     f'title="token {index}: {html.escape(TITLES.get(mark, mark))}">{shown}</span>')
    cursor = '<span class="sd-cursor"></span>' if streaming else ""
    return f'<style>{CSS}</style><div class="sd-output sd-verified-output">{"".join(spans)}{cursor}</div>'


def record_html(record: dict, picked: int | None = None) -> str:
    """An exported (or just finished) verified comparison's answer with its marks (app/replay.py's record)."""
    return tokens_html(record["skipdecode"]["pieces"], record["verification"]["marks"], picked=picked)


def legend_html() -> str:
    return ('<div class="sd-legend">' + "".join(
        f'<span class="sd-token sd-{mark}">{html.escape(text)}</span> '
        for mark, text in ((ACCEPTED, "draft accepted"), (REPLACED, "replaced by the full model"),
                           ("verifier", "the full model's own next token"))) + "</div>")


def summary_html(comparison) -> str:
    """Acceptance rate, drafts, verify passes, the measured speedup, and why it is faster or slower."""
    v = comparison.skip.verification if comparison and comparison.skip else None
    if not v:
        return '<div class="sd-cards"><div class="sd-card">verified decoding: waiting for the first pass</div></div>'
    from skipdecode.verify import Verification

    stats = Verification(v["draft_tokens"], v["draft_model"], v["verifier_model"], v["drafted"], v["accepted"],
                         v["verify_passes"], v["draft_ms"], v["verify_ms"], list(v["marks"]))
    full = comparison.full.trace if comparison.full else None
    full_ms = full.decode_ms / len(full.steps) if full and full.steps else None
    measured = comparison.speedups()["measured"]
    rate = "–" if stats.acceptance_rate is None else f"{stats.acceptance_rate:.0%}"
    skip_ids, full_ids = comparison.skip.token_ids, comparison.full.token_ids if comparison.full else []
    same = ("by distribution" if comparison.decoding != "greedy" else
            "yes" if skip_ids == full_ids[:len(skip_ids)] else "no")
    cards = [("measured speedup", "–" if measured is None else f"{measured:.2f}×",
              "full ms / verified ms per token, interleaved"),
             ("acceptance rate", rate, f"{stats.accepted} of {stats.drafted} drafts kept"),
             ("verify passes", str(stats.passes), f"up to {stats.draft_tokens} drafts each"),
             ("same as full decoding", same, "token for token (greedy)" if comparison.decoding == "greedy" else
              "sampling: same distribution, other draws")]
    body = "".join(f'<div class="sd-card"><div class="sd-card-label">{html.escape(label)}</div>'
                   f'<div class="sd-card-value">{html.escape(value)}</div>'
                   f'<div class="sd-card-note">{html.escape(note)}</div></div>' for label, value, note in cards)
    return (f'<div class="sd-cards sd-verified-cards">{body}</div>'
            f'<p class="sd-verified-why">{html.escape(why(stats, full_ms))}</p>' + legend_html())
