"""For a class: where SkipDecode departs from full decoding, and why, as page content.

Pure functions from a comparison's record (app/replay.py: a plain, JSON-safe dict, the same whether the
comparison just ran or was replayed from an export) to HTML and figures: the SkipDecode answer with the
tokens full depth would have chosen otherwise marked (hover: full depth's choice and its alternatives),
one position layer by layer under the logit lens (SkipDecode's run layers, and full depth on the same
prefix) with a step-through, and a presentation view, one slide at a time.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go

from . import plots, verified
from .views import _shade, model_name, safe

# Clicking a token of the SkipDecode answer picks its position for the layer view; the element itself
# (gr.HTML's js_on_load) passes the position with the click. From the keyboard (a presentation clicker): the
# answer is one Tab stop, the arrow keys move between its tokens, Enter or space picks one, and focus comes
# back to the picked token when the answer is drawn again. A token's hover card opens above it (off the
# summary below the answer), kept inside the window.
CLICK_JS = """
const pick = (token) => { element.dataset.refocus = '1'; trigger('click', {position: Number(token.dataset.pos)}); };
element.addEventListener('click', (event) => { const token = event.target.closest('[data-pos]'); if (token) pick(token); });
element.addEventListener('keydown', (event) => {
  const token = event.target.closest('[data-pos]'); if (!token) return;
  if (event.key === 'Enter' || event.key === ' ') { event.preventDefault(); pick(token); return; }
  const step = {ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1}[event.key]; if (!step) return;
  const tokens = [...element.querySelectorAll('[data-pos]')], next = tokens[tokens.indexOf(token) + step];
  if (next) { event.preventDefault(); token.tabIndex = -1; next.tabIndex = 0; next.focus(); }
});
const place = (token, y) => {
  const tip = token.querySelector(':scope > .sd-tip'); if (!tip) return;
  const rects = [...token.getClientRects()], line = rects.find((r) => y >= r.top && y <= r.bottom) || rects[0];
  if (!line) return;
  tip.style.visibility = line.bottom < 0 || line.top > window.innerHeight ? 'hidden' : 'visible';
  const width = tip.offsetWidth, height = tip.offsetHeight, gap = 6;
  let top = line.top - height - gap; if (top < gap) top = line.bottom + gap;
  tip.style.left = Math.max(gap, Math.min(line.left, window.innerWidth - width - gap)) + 'px';
  tip.style.top = Math.max(gap, Math.min(top, window.innerHeight - height - gap)) + 'px';
};
element.addEventListener('mouseover', (event) => { const token = event.target.closest('[data-pos]'); if (token) place(token, event.clientY); });
element.addEventListener('focusin', (event) => { const token = event.target.closest('[data-pos]');
  if (token) requestAnimationFrame(() => place(token, -1)); });
window.addEventListener('scroll', () => { const focused = element.querySelector('[data-pos]:focus');
  if (focused) place(focused, -1); }, {passive: true});
new MutationObserver(() => { const picked = element.querySelector('.sd-picked');
  if (element.dataset.refocus && picked) { delete element.dataset.refocus; picked.focus({preventScroll: true}); }
  const focused = element.querySelector('[data-pos]:focus'); if (focused) requestAnimationFrame(() => place(focused, -1)); })
  .observe(element, {childList: true, subtree: true});
"""
# The presentation view: arrow keys, Page Up/Down and the space bar move between slides while it shows; each
# slide drawn scrolls the view to the top of the window (the page's header out of the way, the chart's axes in).
KEYS_JS = """
const top = () => { if (element.offsetParent) document.querySelector('#sd-previous-slide')?.scrollIntoView({block: 'start'}); };
new MutationObserver(top).observe(element, {childList: true, subtree: true});
document.addEventListener('keydown', (event) => {
  if (!element.offsetParent) return;
  const tag = (event.target.tagName || '').toLowerCase(); if (tag === 'input' || tag === 'textarea') return;
  const next = ['ArrowRight', 'PageDown', ' '].includes(event.key), back = ['ArrowLeft', 'PageUp'].includes(event.key);
  if (next || back) { event.preventDefault(); top(); trigger('click', {step: next ? 1 : -1}); }
});
"""

# The layer view: what a pick or a step draws comes into view. A pick brings the whole view (its sticky step
# buttons above the two tables) into the window; a step brings the row it reveals, if it is not there already.
LENS_JS = """
new MutationObserver(() => {
  if (!element.querySelector('table')) return;
  requestAnimationFrame(() => {
    const now = element.querySelector('tr.sd-now');
    if (now) { now.scrollIntoView({block: 'nearest'}); return; }
    const view = document.querySelector('#sd-teach'), box = view.getBoundingClientRect();
    const bottom = element.getBoundingClientRect().bottom;
    if (box.top < 0 || bottom > window.innerHeight) view.scrollIntoView({block: 'start'});
  });
}).observe(element, {childList: true, subtree: true});
"""

SLIDE_HEIGHT = 460  # a slide's chart: below its title and the slide buttons it fits 1280x720 and 1440x900
CSS = """
.sd-marked { max-height: none !important; overflow: visible !important; }
.sd-marked .sd-token { cursor: pointer; position: relative; }
.sd-part { text-decoration: underline solid #ea580c; text-decoration-thickness: 3px; text-underline-offset: 4px;
  text-decoration-skip-ink: none; }  /* a straight orange bar: a mark of the lesson, not a spelling mistake */
.sd-token.sd-picked { outline: 2px solid #f59e0b; }
.sd-tip { display: none; position: fixed; left: 0; top: 0; z-index: 30; min-width: 15rem; padding: .45rem .6rem;
  background: #1e293b; color: #f8fafc; border-radius: .45rem; font-size: .8rem; line-height: 1.45; white-space: normal;
  box-shadow: 0 4px 14px rgba(15, 23, 42, .25); pointer-events: none; }  /* it never holds itself open over a control */
.sd-token:hover > .sd-tip, .sd-token:focus > .sd-tip { display: block; }
.sd-token:focus { outline: 2px solid #4f46e5; outline-offset: 1px; }
.sd-tip b { color: #fcd34d; }
.sd-tip table { border-collapse: collapse; margin-top: .25rem; width: 100%; }
.sd-tip td { padding: .05rem .3rem .05rem 0; border: none !important; background: transparent !important;
  color: #f8fafc; }
.sd-part-summary { font-size: .92rem; margin: .2rem 0 .4rem 0; }
.sd-lens { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: .5rem; }  /* never wider than its box */
.sd-lens table { width: 100%; border-collapse: collapse; font-size: .85rem; }
.sd-lens th { text-align: left; color: #475569; font-weight: 600; padding: .2rem .4rem;
  border-bottom: 1px solid #e2e8f0; }
.sd-lens td { padding: 0 .3rem; border-bottom: 1px solid #f1f5f9; overflow-wrap: anywhere; line-height: 1.2;
  font-size: .75rem; }  /* two tables and the chart beside them: a row on one line at 1280 px */
.sd-lens td:first-child, .sd-lens th:first-child { width: 2.4rem; padding-right: 0; }
.sd-lens tr { scroll-margin-top: 5.5rem; scroll-margin-bottom: 1rem; }
.sd-lens tr.sd-skipped td { color: #cbd5e1; }
.sd-lens tr.sd-hidden { visibility: hidden; }
.sd-lens tr.sd-hidden td { border-color: transparent !important; }
.sd-lens tr.sd-now td { background: #fef3c7; }
.sd-lens .sd-final { font-weight: 650; }
.sd-lens-head { font-weight: 600; margin: 0 0 .3rem 0; }
.sd-lens-note { font-size: .8rem; color: #64748b; margin-top: .3rem; }
.sd-bar { display: inline-block; height: .55rem; background: #a5b4fc; border-radius: .15rem; vertical-align: middle;
  margin-right: .25rem; }
.sd-present { font-size: 1.6rem; line-height: 1.6; }
#sd-present-tab { min-height: 100vh; }
.sd-present h2 { font-size: 2.1rem; margin: .2rem 0 .6rem 0; }
.sd-present .sd-headline { margin: 0 0 .6rem 0; line-height: 1.35; }  /* slide 1's verdict, above the answers */
.sd-present .sd-verdict { font-size: 1.7rem; }
.sd-present .sd-big { font-size: 4rem; font-weight: 700; color: #059669; line-height: 1.1; }
.sd-present .sd-slide-grid { display: grid; grid-template-columns: 1fr 1fr; gap: 1.2rem; }
.sd-present .sd-output { font-size: 1.5rem; max-height: none; line-height: 1.7; }
.sd-present .sd-slide-note { font-size: 1.05rem; color: #475569; }
.sd-guide { font-size: .95rem; color: #475569; padding: .6rem .75rem; border: 1px dashed #cbd5e1; border-radius: .6rem; }
.sd-refused { font-size: .9rem; color: #9a3412; background: #fff7ed; border: 1px solid #fed7aa; border-radius: .5rem;
  padding: .45rem .6rem; }
"""


# ---- words ------------------------------------------------------------------------------------
def shown(text: str) -> str:
    """A token's text in quotes, as a person can read it (a token of white space made visible), HTML escaped."""
    visible = text.strip() or text.replace("\n", "⏎").replace(" ", "␣") or "∅"
    return "“" + safe(visible) + "”"  # it goes into Markdown too (the summary)


def word(record: dict, token: int) -> str:
    return shown(record["texts"].get(str(token), f"#{token}"))


def _alternatives(record: dict, top: list) -> str:
    rows = "".join(f"<tr><td>{word(record, token)}</td><td>{prob:.2f}</td></tr>" for token, prob in top)
    return f"<table>{rows}</table>"


# ---- 1. marks --------------------------------------------------------------------------------
def marked_html(record: dict, picked: int | None = None) -> str:
    """The SkipDecode answer, each token shaded by the layers run to choose it (as while streaming), the
    tokens full depth would have chosen otherwise underlined; hovering one shows full depth's choice and
    its alternatives. Every token is clickable: it picks the position for the layer view. One token is a Tab
    stop (the picked one, else the first): CLICK_JS moves between them with the arrow keys."""
    if record.get("verified"):  # the verified family marks where each token came from instead
        return verified.record_html(record, picked)
    side, found = record["skipdecode"], record["divergence"]
    L = record["num_layers"]
    focused = picked if picked is not None else 0
    spans = []
    for entry, top, piece, layers in zip(found["tokens"], found["top"], side["pieces"], side["layers"]):
        i, parted = entry["position"], entry["token"] != entry["full_token"]
        classes = "sd-token" + (" sd-part" if parted else "") + (" sd-picked" if i == picked else "")
        if parted:
            tip = (f"token {i + 1}: SkipDecode chose {word(record, entry['token'])} after {layers} of {L} layers; "
                   f"<b>full depth would choose {word(record, entry['full_token'])}</b> ({entry['full_prob']:.2f}; "
                   f"SkipDecode's token: {entry['skip_prob']:.2f}){_alternatives(record, top)}")
        else:
            tip = (f"token {i + 1}: chosen after {layers} of {L} layers; full depth agrees "
                   f"({entry['full_prob']:.2f}){_alternatives(record, top)}")
        spans.append(f'<span class="{classes}" data-pos="{i}" tabindex="{0 if i == focused else -1}" role="button" '
                     f'style="background:{_shade(layers, L)}">'
                     f'{html.escape(piece) or "&#8203;"}<span class="sd-tip">{tip}</span></span>')
    return f'<div class="sd-output sd-marked">{"".join(spans)}</div>'


def summary_markdown(record: dict, clickable: bool = True) -> str:
    """How much of the SkipDecode answer full depth would have chosen, and where they first part (and, where
    the tokens are `clickable`, how to see one layer by layer)."""
    if record.get("verified"):
        return verified_summary(record, clickable)
    found = record["divergence"]
    n = len(found["tokens"])
    if not n:
        return "SkipDecode generated no tokens."
    agree = sum(t["token"] == t["full_token"] for t in found["tokens"])
    head = (f"**Full depth, given the same prefix, would choose {agree} of SkipDecode's {n} tokens "
            f"({100 * found['agreement']:.0f}%).**")
    if found["first"] is None:
        return head + " They never part: underlined tokens would mark where full depth chooses otherwise."
    first = found["tokens"][found["first"]]
    return (head + f" They first part at token {found['first'] + 1}: SkipDecode wrote {word(record, first['token'])}, "
            f"full depth would write {word(record, first['full_token'])} ({first['full_prob']:.2f}). Underlined: "
            "where full depth would choose otherwise (hover for its choice"
            + ("; click any token, or Tab to the answer and press Enter, to see it layer by layer)." if clickable
               else ")."))


def verified_summary(record: dict, clickable: bool = True) -> str:
    """What verified decoding's marks say: drafts kept, rounds, and where to look layer by layer."""
    v = record["verification"]
    marks = v["marks"]
    replaced = [i for i, mark in enumerate(marks) if mark == "replaced"]
    head = (f"**The full model kept {v['accepted']} of SkipDecode's {v['drafted']} drafts in {v['verify_passes']} "
            f"verify passes.**" if v["drafted"] else "**Nothing was drafted.**")
    where = (f" It first rejected one at token {replaced[0] + 1}, and put its own token there (red)." if replaced else
             " It rejected none: after each pass it added one token of its own (grey).")
    pick = (" Click a token (or Tab to the answer and press Enter) to see, layer by layer, what the draft saw there "
            "beside the full model." if clickable else "")
    return head + where + pick


def divergence_figure(record: dict) -> go.Figure:
    """Per position of the SkipDecode answer: the layers SkipDecode ran to choose it, and the probability
    full depth gives its token against full depth's own choice; red where they differ."""
    found, side = record["divergence"], record["skipdecode"]
    positions = [t["position"] + 1 for t in found["tokens"]]  # as people count: from 1
    parted = [t["token"] != t["full_token"] for t in found["tokens"]]
    fig = go.Figure()
    fig.add_bar(x=positions, y=side["layers"][: len(positions)], name="layers SkipDecode ran",
                marker_color=[plots.HOLE if p else plots.SKIP for p in parted], opacity=0.35,
                yaxis="y2", hovertemplate="token %{x}: %{y} layers<extra></extra>")
    fig.add_scatter(x=positions, y=[t["full_prob"] for t in found["tokens"]], name="full depth: its own choice",
                    mode="lines+markers", line=dict(color=plots.FULL),
                    hovertemplate="token %{x}: %{y:.2f}<extra></extra>")
    fig.add_scatter(x=positions, y=[t["skip_prob"] for t in found["tokens"]], name="full depth: SkipDecode's token",
                    mode="markers", marker=dict(color=["#dc2626" if p else plots.SKIP for p in parted], size=9,
                                                symbol=["x" if p else "circle" for p in parted]),
                    hovertemplate="token %{x}: %{y:.2f}<extra></extra>")
    if found["first"] is not None:
        fig.add_vline(x=found["first"] + 1, line_dash="dot", line_color="#dc2626",
                      annotation_text="first part", annotation_position="top left")
    fig.update_layout(xaxis_title="token of the SkipDecode answer", yaxis=dict(title="probability at full depth",
                      range=[0, 1.05]), yaxis2=dict(title="layers run", overlaying="y", side="right",
                                                     range=[0, record["num_layers"] * 1.05], showgrid=False),
                      barmode="overlay")
    return plots._style(fig, f"Same prefix, full depth: agrees on {100 * found['agreement']:.0f}% of SkipDecode's "
                        "tokens", height=340)


# ---- 2. one position, layer by layer -----------------------------------------------------------
def _lens_table(record: dict, view: dict, title: str, shown_layers: int | None, final_token: int | None) -> str:
    """Every layer of the model as a row: the run ones with their top tokens, the skipped ones greyed;
    with `shown_layers`, only the layers below it are revealed (the step-through)."""
    L = record["num_layers"]
    tops = dict(zip(view["layers"], view["top"]))
    rows = []
    for layer in range(L):
        classes = []
        if shown_layers is not None and layer >= shown_layers:
            classes.append("sd-hidden")
        if shown_layers is not None and layer == shown_layers - 1:
            classes.append("sd-now")
        if layer not in tops:
            rows.append(f'<tr class="{" ".join(classes + ["sd-skipped"])}"><td>{layer}</td>'
                        '<td colspan="3">skipped</td></tr>')
            continue
        cells = []
        for token, prob in tops[layer]:
            bold = ' class="sd-final"' if token == final_token else ""
            cells.append(f'<td{bold}><span class="sd-bar" style="width:{max(prob * 1.4, .1):.2f}rem"></span>'
                         f"{word(record, token)} {prob:.2f}</td>")
        rows.append(f'<tr class="{" ".join(classes)}"><td>{layer}</td>{"".join(cells)}</tr>')
    head = "<tr><th>layer</th><th>1st</th><th>2nd</th><th>3rd</th></tr>"
    note = (f"ran {len(view['layers'])} of {L} layers; prediction depth {view['depth']} (the first layer whose top "
            f"token is the final one), settled from layer {view['settled']}")
    if shown_layers is not None and shown_layers < L:  # the class guesses before the answer shows
        note = f"stepping through: layers 0-{shown_layers - 1} of {L} shown"
    return (f'<div><div class="sd-lens-head">{title}</div><table><thead>{head}</thead><tbody>{"".join(rows)}</tbody>'
            f'</table><div class="sd-lens-note">{note}</div></div>')


GUIDE = {None: "The layer view appears when you pick a token.",
         "run": "Run a comparison (or replay an exported one) first, then pick a token of its SkipDecode answer: "
                "◀ layer, layer ▶ and Play then walk up its layers.",
         "pick": "Pick a token first (click it in the SkipDecode answer, or Tab to the answer, move with the arrow "
                 "keys and press Enter): ◀ layer, layer ▶ and Play then walk up its layers."}


def guide(why: str | None = None) -> str:
    """The layer view before there is one: what to do first (controls used out of order get this, not an error)."""
    return f'<div class="sd-note sd-guide">{GUIDE[why]}</div>'


def stepping(record: dict, shown_layers: int | None) -> bool:
    """Part way up the layers: nothing may name the final tokens yet (the class is guessing)."""
    return shown_layers is not None and shown_layers < record["num_layers"]


def lens_html(record: dict, position: int, shown_layers: int | None = None) -> str:
    """One position of the SkipDecode answer under the logit lens (final norm + LM head after each layer):
    SkipDecode's run (only the layers it ran) and full depth on the same prefix, side by side."""
    if not record.get("lens"):
        return guide()
    entry = record["divergence"]["tokens"][position]
    skip, full = record["lens"]["skipdecode"][position], record["lens"]["full"][position]
    fed = ("the prompt's last token (the prefill chose it, every layer)" if position == 0 else
           f"token {position} fed back")
    if stepping(record, shown_layers):
        head = (f'<div class="sd-part-summary">Token {position + 1}, chosen from {fed}: which token will each side '
                "choose? The top layer tells.</div>")
        finals = (None, None)
    else:
        verdict = ("full depth would choose the same token" if entry["token"] == entry["full_token"] else
                   f"<b>full depth would choose {word(record, entry['full_token'])}</b> instead of "
                   f"{word(record, entry['token'])}")
        head = (f'<div class="sd-part-summary">Token {position + 1} ({word(record, entry["token"])}), chosen from {fed}: '
                f"{verdict}. Bold: the token each side finally chose.</div>")
        finals = (entry["token"], entry["full_token"])
    title = "The draft (its layers)" if record.get("verified") else "SkipDecode (its run layers)"
    return head + ('<div class="sd-lens">' + _lens_table(record, skip, title, shown_layers,
                                                         finals[0])
                   + _lens_table(record, full, "Full depth, same prefix", shown_layers, finals[1]) + "</div>")


def lens_figure(record: dict, position: int, shown_layers: int | None = None) -> go.Figure:
    """After each layer, the probability the logit lens gives the token each side finally chose: where the
    choice settles, and what skipping the middle does to it. A layer SkipDecode skipped is a gap, not a zero;
    while stepping, only the layers shown so far, and the legend does not name the tokens."""
    entry, L = record["divergence"]["tokens"][position], record["num_layers"]
    top = L if shown_layers is None else shown_layers
    fig = go.Figure()
    for name, color, token in (("skipdecode", plots.SKIP, entry["token"]), ("full", plots.FULL, entry["full_token"])):
        view = record["lens"][name][position]
        after = dict(zip(view["layers"], view["final"]))
        label = ("full depth, same prefix" if name == "full" else
                 "the draft, its layers" if record.get("verified") else "SkipDecode, its run layers")
        fig.add_scatter(x=list(range(L)), y=[after.get(layer) if layer < top else None for layer in range(L)],
                        mode="lines+markers", line=dict(color=color), connectgaps=False,
                        name=label if stepping(record, shown_layers) else f"{label}: {word(record, token)}",
                        hovertemplate="layer %{x}: %{y:.2f}<extra></extra>")
    fig.update_layout(xaxis=dict(title="layer", range=[-0.5, L - 0.5]),
                      yaxis=dict(title="probability (logit lens)", range=[0, 1.05]))
    # a title of two short lines and the legend below the axis: all of it fits the column beside the layer tables
    plots._style(fig, f"Token {position + 1}: each side's final<br>choice, its probability by layer",
                 height=380)
    return fig.update_layout(margin=dict(t=64, b=120), legend=dict(yanchor="top", y=-0.2))


def default_position(record: dict) -> int:
    """Where to look first: the first position where they part (for verified decoding, the first draft the full
    model rejected), else the first token."""
    if record.get("verified"):
        return next((i for i, mark in enumerate(record["verification"]["marks"]) if mark == "replaced"), 0)
    first = record["divergence"]["first"]
    return first if first is not None else 0


# ---- 4. presentation ----------------------------------------------------------------------------
SLIDES = ("answers", "marks", "layer map", "budget", "latency", "divergence", "lens")
# A verified comparison: its answer is full depth's own, so the slides show the drafts and their checks instead.
VERIFIED_SLIDES = ("answers", "acceptance", "layer map", "budget", "latency", "lens")
FIGURE_SLIDES = ("layer map", "budget", "latency", "divergence", "lens")


def slides(record: dict | None) -> tuple[str, ...]:
    return VERIFIED_SLIDES if record and record.get("verified") else SLIDES


def slide_html(record: dict | None, index: int, why: str = "") -> str:
    """Large type: the title of slide `index` and, for the first two, the two answers (`why`: on the first, the
    verdict, HTML; for a verified comparison's acceptance slide, the line saying why it was faster, slower or too
    close to call)."""
    if record is None:
        return '<div class="sd-present"><h2>Run or replay a comparison first.</h2></div>'
    names = slides(record)
    name, L, verified_run = names[index % len(names)], record["num_layers"], bool(record.get("verified"))
    title = {"answers": "Verified decoding beside full decoding" if verified_run else "SkipDecode beside full decoding",
             "marks": "Where full depth would choose otherwise",
             "acceptance": "The drafts the full model kept",
             "layer map": "Rounds: the drafts' layers, then one verify pass" if verified_run else
                          "Which layers ran at each position",
             "budget": "Layers per token: drafts and checks" if verified_run else "The budget of each position",
             "latency": "Time to each token", "divergence": "Same prefix, full depth: agree or not?",
             "lens": f"Token {default_position(record) + 1}, layer by layer"}[name]
    body = ""
    if name == "answers":
        first = verified.record_html(record) if verified_run else _plain(record["skipdecode"], L)
        sides = [(f"{'Verified' if verified_run else 'SkipDecode'}: {model_name(record['model'])}", first),
                 (f"Full decoding: {model_name(record['full_model'])}", _plain(record["full"], L))]
        body = "".join(f"<div><b>{html.escape(t)}</b>{o}</div>" for t, o in sides)
        body = why + f'<div class="sd-slide-grid">{body}</div>' + (verified.legend_html() if verified_run else "")
    elif name == "marks":
        body = marked_html(record) + f'<div class="sd-slide-note">{summary_text(record)}</div>'
    elif name == "acceptance":
        v = record["verification"]
        rate = f"{v['accepted'] / v['drafted']:.0%}" if v["drafted"] else "–"
        per_pass = len(v["marks"]) / v["verify_passes"] if v["verify_passes"] else 0.0
        body = (f'<div class="sd-big">{rate}</div><div>of the drafts kept: {v["accepted"]} of {v["drafted"]}, in '
                f'{v["verify_passes"]} verify passes ({per_pass:.1f} tokens a pass)</div>'
                + verified.record_html(record) + f'<div class="sd-slide-note">{html.escape(why)}</div>')
    n = len(names)
    return (f'<div class="sd-present"><h2>{title}</h2>{body}<div class="sd-slide-note">slide {index % n + 1} '
            f"of {n}: → or space for the next, ← for the last</div></div>")


def summary_text(record: dict) -> str:
    """summary_markdown as HTML (bold only), for a slide: its tokens are not clickable there."""
    parts = summary_markdown(record, clickable=False).split("**")  # its words are escaped already (`word`)
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def _plain(side: dict, L: int) -> str:
    spans = "".join(f'<span class="sd-token" style="background:{_shade(n, L)}">{html.escape(p)}</span>'
                    for p, n in zip(side["pieces"], side["layers"]))
    return f'<div class="sd-output">{spans}</div>'


# ---- 3. export: every figure as PNG, drawn by plotly in the browser ----------------------------------
FIGURES = ("sd-budget-plot", "sd-layer-plot", "sd-latency-plot", "sd-divergence-plot", "sd-lens-plot")
PNG_JS = ("async () => { for (const id of %s) { const plot = document.querySelector('#' + id + ' .js-plotly-plot'); "
          "if (!plot || !window.Plotly) continue; await window.Plotly.downloadImage(plot, {format: 'png', "
          "filename: 'skipdecode-' + id.slice(3), width: plot.offsetWidth, height: plot.offsetHeight, scale: 2}); "
          "await new Promise((done) => setTimeout(done, 400)); } }") % list(FIGURES)
