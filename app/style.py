"""The page's look: one stylesheet for the served page and the standalone export (app/standalone.py), which
draws the same views offline."""

from __future__ import annotations

from . import keys, teach

CSS = """
.gradio-container { max-width: 1360px !important; margin: auto; }
#sd-header h1 { font-size: 1.6rem; margin: 0 0 .15rem 0; letter-spacing: -0.01em; }
#sd-header p { margin: 0; color: #475569; font-size: 1rem; }
#sd-how p { margin: 0 0 .4rem 0; font-size: .85rem; color: #475569; }
.sd-warning { background: #fff7ed; color: #9a3412; border: 1px solid #fdba74; border-radius: .5rem;
  padding: .45rem .7rem; font-size: .95rem; }
.sd-headline { padding: .15rem 0; }
#sd-results { min-height: 100vh; }  /* room to bring a run's first tokens to the top before its charts are drawn */
.sd-verdict { font-size: 1.35rem; font-weight: 650; color: #1e293b; line-height: 1.3; }
.sd-faster .sd-verdict { color: #3730a3; }
.sd-slower .sd-verdict { color: #9a3412; }
.sd-same { font-size: 1rem; color: #334155; }
.sd-detail { font-size: .8rem; color: #64748b; }
.sd-replayed.sd-stopped-badge { background: #fef3c7; color: #92400e; }
.sd-broken .sd-verdict { color: #b91c1c; }
.sd-flat-note { font-size: .85rem; color: #475569; }
.sd-replayed { display: inline-block; background: #e0f2fe; color: #075985; border-radius: 999px; padding: 0 .5rem;
  font-size: .78rem; font-weight: 600; margin-right: .4rem; vertical-align: middle; }
.sd-side-title { font-weight: 600; font-size: .95rem; margin: 0 0 .35rem 0; display: flex; align-items: baseline; gap: .45rem;
  min-height: 2.6em; }  /* two lines: a title that wraps leaves the other side's box where it was */
.sd-side-model { font-weight: 500; color: #64748b; font-size: .85rem; }
.sd-side-model::before { content: "·"; margin: 0 .4rem 0 .1rem; }
.sd-dot { width: .7rem; height: .7rem; border-radius: 50%; display: inline-block; }
.sd-output { min-height: 7.5rem; max-height: 18rem; overflow-y: auto; padding: .75rem .85rem; border: 1px solid #e2e8f0;
  border-radius: .6rem; background: #fff; line-height: 1.85; font-size: .98rem; white-space: pre-wrap; }
.sd-empty { color: #94a3b8; }
.sd-token { border-radius: .25rem; padding: .08rem 0; box-decoration-break: clone; -webkit-box-decoration-break: clone; }
.sd-cursor { display: inline-block; width: .5rem; height: 1rem; background: #4f46e5; margin-left: 2px; vertical-align: text-bottom;
  animation: sd-blink 1s steps(2, start) infinite; }
@keyframes sd-blink { to { visibility: hidden; } }
.sd-legend { display: flex; align-items: center; gap: .5rem; font-size: .8rem; color: #64748b; margin: .1rem 0 .2rem 0; }
.sd-scale { width: 9rem; height: .7rem; border-radius: .2rem; border: 1px solid #e2e8f0; }
.sd-cards { display: grid; grid-template-columns: repeat(4, minmax(0, 1fr)); gap: .6rem; margin: .2rem 0; }
.sd-card { border: 1px solid #e2e8f0; border-radius: .6rem; padding: .55rem .75rem; background: #fff; }
.sd-card.sd-accent { border-color: #c7d2fe; background: #eef2ff; }
.sd-card-label { font-size: .75rem; text-transform: uppercase; letter-spacing: .04em; color: #64748b; }
.sd-card-value { font-size: 1.45rem; font-weight: 650; color: #1e293b; line-height: 1.3; }
.sd-card-value small { font-size: .85rem; font-weight: 500; color: #64748b; }
.sd-card-note { font-size: .75rem; color: #94a3b8; }
.sd-quality { border: 1px solid #e2e8f0; border-radius: .6rem; padding: .4rem .6rem; background: #fff; }
.sd-quality table { width: 100%; border-collapse: collapse; font-size: .9rem; border: none !important; margin: 0; }
.sd-quality tr, .sd-quality th, .sd-quality td { border: none !important; background: transparent !important; }
.sd-quality th { text-align: left; font-weight: 600; color: #475569; border-bottom: 1px solid #e2e8f0 !important; padding: .35rem .5rem; }
.sd-quality td { padding: .32rem .5rem; border-bottom: 1px solid #f1f5f9 !important; }
.sd-quality tr:last-child td { border-bottom: none !important; }
.sd-quality td:first-child { color: #475569; }
.sd-quality small { color: #94a3b8; }
.sd-quality.sd-empty { padding: .75rem; border: 1px dashed #e2e8f0; border-radius: .6rem; font-size: .9rem; }
.sd-note { font-size: .8rem; color: #94a3b8; margin-top: .35rem; }
#sd-status { font-size: .9rem; }
[id^=sd-results-] table { font-size: .8rem !important; }  /* the Results tables fit a 1280 px window */
[id^=sd-results-] th, [id^=sd-results-] td { padding-left: 4px !important; padding-right: 4px !important; }
@media (max-width: 600px) {  /* a phone: columns stack at the window's width, never wider */
  .row { flex-direction: column !important; }
  .column { min-width: 0 !important; width: 100% !important; }
  .tabs, .tab-wrapper { min-width: 0 !important; }
  .tab-container { flex-wrap: wrap; min-width: 0 !important; }
  .sd-cards { grid-template-columns: repeat(2, minmax(0, 1fr)); }
}
#sd-lens-controls { position: sticky; top: 0; z-index: 25; background: var(--block-background-fill, #fff); }
#sd-lens-plot { position: sticky; top: 5.5rem; }  /* below the sticky step buttons, beside the rows they reveal */
""" + teach.CSS + keys.CSS
