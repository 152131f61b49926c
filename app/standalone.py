"""The last comparison as one self-contained HTML file, for a projector with no network and no server.

`page(record)` draws a comparison's record (app/replay.py, run or replayed) with the page's own views and
figures: the prompt, both answers shaded by the layers run, the verdict, the cards, the layer map (a verified
run's rounds), the budget of each position, the latency and (plain SkipDecode) where full depth would choose
otherwise. plotly.js is inlined once, so the file plays offline. Every string from the prompt, the model or a
replayed file goes through the views' escaping, so markup in it shows as text. "Present" (or the P key) shows
one section at a time in large type; the arrow keys, space and Page Up/Down move, Escape leaves.
"""

from __future__ import annotations

import html
from pathlib import Path

from . import replay, teach, verified, views
from .style import CSS

SCRIPT = """
const slides = [...document.querySelectorAll('section.sd-slide')], where = document.getElementById('sd-where');
let at = 0;
// a figure in large type while presenting, as drawn in the page otherwise
const fit = (root, big) => root.querySelectorAll('.js-plotly-plot').forEach((plot) => {
  if (!window.Plotly || !plot.layout) return;
  plot.dataset.height ??= plot.layout.height; plot.dataset.font ??= plot.layout.font?.size ?? 13;
  window.Plotly.relayout(plot, big ? {height: Math.max(320, window.innerHeight - 170), 'font.size': 18}
                                   : {height: Number(plot.dataset.height), 'font.size': Number(plot.dataset.font)});
});
const show = (index) => {
  at = (index + slides.length) % slides.length;
  slides.forEach((slide, k) => slide.classList.toggle('sd-shown', k === at));
  where.textContent = `${at + 1} of ${slides.length}: → or space for the next, ← for the last, Esc to leave`;
  window.scrollTo(0, 0); fit(slides[at], true);
};
const present = (on) => { document.body.classList.toggle('sd-presenting', on); if (on) show(at); else fit(document, false); };
document.getElementById('sd-present').addEventListener('click', () => present(true));
document.addEventListener('keydown', (event) => {
  if (!document.body.classList.contains('sd-presenting')) { if (event.key === 'p' || event.key === 'P') present(true); return; }
  const next = ['ArrowRight', 'PageDown', ' '].includes(event.key), back = ['ArrowLeft', 'PageUp'].includes(event.key);
  if (next || back) { event.preventDefault(); show(at + (next ? 1 : -1)); }
  if (event.key === 'Escape') present(false);
});
"""
STYLE = """
body { font-family: ui-sans-serif, system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; color: #1e293b;
  max-width: 1200px; margin: 1.5rem auto; padding: 0 1rem; }
header h1 { font-size: 1.5rem; margin: 0 0 .3rem 0; }
header p, footer { color: #475569; font-size: .9rem; }
#sd-present { float: right; font-size: 1rem; padding: .4rem .9rem; border-radius: .5rem; border: 1px solid #c7d2fe;
  background: #eef2ff; cursor: pointer; }
.sd-prompt { white-space: pre-wrap; border: 1px solid #e2e8f0; border-radius: .6rem; padding: .6rem .8rem; background: #f8fafc; }
.sd-sides { display: grid; grid-template-columns: 1fr 1fr; gap: 1rem; }
section.sd-slide { margin: 1.2rem 0; }
section.sd-slide h2 { font-size: 1.2rem; margin: 0 0 .5rem 0; }
#sd-where { display: none; color: #475569; font-size: 1rem; }
body.sd-presenting { max-width: none; margin: 0; padding: 1rem 2rem; }
body.sd-presenting header, body.sd-presenting footer, body.sd-presenting section.sd-slide { display: none; }
body.sd-presenting section.sd-slide.sd-shown { display: block; font-size: 1.45rem; }
body.sd-presenting section.sd-slide.sd-shown h2 { font-size: 2.1rem; }
body.sd-presenting .sd-output { font-size: 1.5rem; max-height: none; }
body.sd-presenting #sd-where { display: block; }
.sd-marked .sd-tip { position: absolute; left: 0; top: 100%; }  /* the page places it by script; here below its token */
"""


def _section(name: str, title: str, body: str) -> str:
    return f'<section class="sd-slide" data-slide="{name}"><h2>{html.escape(title)}</h2>{body}</section>'


def _answers(record: dict, comparison) -> str:
    """The prompt, the verdict and both answers, each token shaded by the layers run to choose it (plain
    SkipDecode's underlined where full depth would choose otherwise; a verified run's marked as drafts kept, put
    in or the full model's own), and what the marks say."""
    L, verified_run = record["num_layers"], bool(record.get("verified"))
    skip = verified.record_html(record) if verified_run else teach.marked_html(record)
    full = views.tokens_html(record["full"]["pieces"], record["full"]["layers"], L)
    name = "Verified" if verified_run else "SkipDecode"
    sides = "".join(f"<div><p><b>{html.escape(title)}</b></p>{answer}</div>" for title, answer in
                    ((f"{name} ({record['model']})", skip), (f"Full decoding ({record['full_model']})", full)))
    legend = verified.legend_html() if verified_run else views.legend_html(L)
    said = "" if verified_run else f'<p class="sd-part-summary">{teach.summary_text(record)}</p>'
    return (f'<p><b>Prompt</b></p><div class="sd-prompt">{html.escape(record["prompt"])}</div>'
            f'{views.headline_html(comparison, False)}<div class="sd-sides">{sides}</div>{legend}{said}')


def _numbers(record: dict, comparison) -> str:
    """The cards (a verified run's with its acceptance rate and why it was faster or slower) and the quality."""
    cards = verified.summary_html(comparison) if record.get("verified") else views.metrics_html(comparison)
    return cards + views.quality_html(comparison)


def page(record: dict) -> str:
    """The whole file: the record drawn by the page's views, plotly.js inlined once (the first figure's)."""
    comparison = replay.comparison(record)
    verified_run = bool(record.get("verified"))
    budget, layer_map, latency = views.compare_figures(comparison)
    figures = [("layer map", "Rounds: the drafts' layers, then one verify pass" if verified_run else
                "Which layers ran at each position", layer_map),
               ("budget", "Layers per token: drafts and checks" if verified_run else "The budget of each position",
                budget),
               ("latency", "Time to each token", latency)]
    if not verified_run:
        figures.append(("divergence", "Same prefix, full depth: agree or not?", teach.divergence_figure(record)))
    title = "Verified decoding beside full decoding" if verified_run else "SkipDecode beside full decoding"
    sections = [_section("answers", title, _answers(record, comparison)),
                _section("numbers", "Speed and quality", _numbers(record, comparison))]
    for index, (name, heading, figure) in enumerate(figures):
        drawn = figure.to_html(full_html=False, include_plotlyjs=index == 0, div_id=f"sd-figure-{name.replace(' ', '-')}",
                               config={"displaylogo": False, "responsive": True})
        sections.append(_section(name, heading, drawn))
    hardware = record["hardware"]
    made = (f"Exported {html.escape(record['exported'])} from SkipDecode Studio; it ran on "
            f"{html.escape(hardware['cpu'])} ({html.escape(hardware['device'])}, {html.escape(hardware['dtype'])}). "
            "This file needs no network and no server.")
    short = record["prompt"][:60] + ("…" if len(record["prompt"]) > 60 else "")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>SkipDecode Studio: {html.escape(short)}</title><style>{CSS}{STYLE}</style></head><body>"
            '<header><button id="sd-present" type="button">Present ▶</button><h1>SkipDecode Studio</h1>'
            "<p>The same model answered twice, once skipping most of its layers and once using all of them. "
            "Present (or P) shows one part at a time.</p></header>"
            f'<div id="sd-where"></div>{"".join(sections)}<footer>{made}</footer>'
            f"<script>{SCRIPT}</script></body></html>")


def write(record: dict, folder: str | None = None) -> Path:
    """The record's page as an .html file to download, named after the run like its JSON export."""
    path = replay.export_path(record, ".html", folder)
    path.write_text(page(record), encoding="utf-8")
    return path
