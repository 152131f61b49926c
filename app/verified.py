"""The page's verified mode: the two families of early exit side by side, by what they promise.

"SkipDecode" changes the output to save layers; "SkipDecode, verified" (skipdecode/speculative/verify.py) lets the
skipped model draft and the full model check, so the answer is the full model's and only the speed depends
on how often the drafts agree. In verified mode the SkipDecode side shows each token marked as a draft the
full model accepted or a token the full model put in, with the acceptance rate, the measured speedup
against full decoding (interleaved as in the other mode) and one line saying why it is faster or slower.
Kept apart from views.py so that the other mode's views stay as they are; every string from a prompt or
the model is escaped here.
"""

from __future__ import annotations

import html

from skipdecode.speculative.verify import ACCEPTED, REPLACED

from . import timing, views

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
                     f'title="token {index + 1}: {html.escape(TITLES.get(mark, mark))}">{shown}</span>')
    cursor = '<span class="sd-cursor"></span>' if streaming else ""
    return f'<style>{CSS}</style><div class="sd-output sd-verified-output">{"".join(spans)}{cursor}</div>'


def record_html(record: dict, picked: int | None = None) -> str:
    """An exported (or just finished) verified comparison's answer with its marks (app/replay.py's record)."""
    return tokens_html(record["skipdecode"]["pieces"], record["verification"]["marks"], picked=picked)


def summary_html(comparison) -> str:
    """The speed (app/timing.py: the figures the headline and the latency chart give), the acceptance rate,
    the rounds, and one line saying why it is faster, slower or too close to call."""
    v = comparison.skip.verification if comparison and comparison.skip else None
    if not v:
        return '<div class="sd-cards"><div class="sd-card">verified decoding: waiting for the first pass</div></div>'
    t = timing.of(comparison)
    tokens = len(v["marks"])
    rate = "–" if not v["drafted"] else f"{v['accepted'] / v['drafted']:.0%}"
    per_pass = f"{tokens / v['verify_passes']:.1f} tokens a pass" if v["verify_passes"] else ""
    cards = [views.whole_answer_card(t, "verified"),
             views.decode_card(t, "full decoding's ms / verified ms per decoded token"),
             views.card("acceptance rate", rate, f"{v['accepted']} of {v['drafted']} drafts kept"),
             views.card("verify passes", str(v["verify_passes"]),
                         f"up to {v['draft_tokens']} drafts each; {per_pass}")]
    return (f'<div class="sd-cards sd-verified-cards">{"".join(cards)}</div>'
            f'<p class="sd-verified-why">{html.escape(explain(v, t))}</p>')


def explain(v: dict, t) -> str:
    """What a round cost and yielded, and why that makes verified decoding faster, slower or too close to
    call (`t`: app/timing.py's Timing, whose verdict the headline gives)."""
    tokens, passes = len(v["marks"]), v["verify_passes"]
    if not passes or not tokens:
        return "Nothing was drafted: the answer is the full model's own first token."
    rate = v["accepted"] / v["drafted"] if v["drafted"] else 0.0
    line = (f"{v['accepted']} of {v['drafted']} drafts accepted ({rate:.0%}); a draft cost "
            f"{v['draft_ms'] / max(v['drafted'], 1):.1f} ms and a verify pass {v['verify_ms'] / passes:.1f} ms, so "
            f"each pass yielded {tokens / passes:.2f} tokens")
    if t is None or t.end_to_end is None:
        return line + "."
    if t.tokens > 1:
        decoded = t.tokens - 1
        line += (f", {(t.skip_ms - t.skip_prefill_ms) / decoded:.1f} ms a decoded token against full decoding's "
                 f"{(t.full_ms - t.full_prefill_ms) / decoded:.1f} ms")
    faster_decoding = t.decode is not None and (t.decode_low or t.decode) > 1.0
    reason = {
        timing.FASTER: "faster: the drafts agreed often enough to pay for their verify passes",
        timing.SLOWER: (f"slower to the whole answer although faster per decoded token: its prefill took "
                        f"{t.skip_prefill_ms:.0f} ms against full decoding's {t.full_prefill_ms:.0f} ms"
                        if faster_decoding else
                        "slower: too many drafts were rejected, and their cost and the verify passes outweigh "
                        "the tokens kept"),
        timing.CLOSE: (f"too close to call to the whole answer, though faster per decoded token ({t.decode:.2f}×): its "
                       f"prefill took {t.skip_prefill_ms:.0f} ms against full decoding's {t.full_prefill_ms:.0f} ms"
                       if faster_decoding else
                       "too close to call on this run: the spread of its interleaved turns holds both faster and "
                       "slower"),
        timing.SHORT: "too short a run to tell faster from slower",
    }[t.verdict]
    return f"{line}: {reason}."


def legend_html() -> str:
    return ('<div class="sd-legend">' + "".join(
        f'<span class="sd-token sd-{mark}">{html.escape(text)}</span> '
        for mark, text in ((ACCEPTED, "draft accepted"), (REPLACED, "replaced by the full model"),
                           ("verifier", "the full model's own next token"))) + "</div>")
