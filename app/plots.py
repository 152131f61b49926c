"""Plotly figures, each a pure function of pandas DataFrames (traces, schedules, results tables).

No model, no server, no Gradio: tests build these from hand-made frames. The frames are the ones the
library produces (`Trace.to_frame()`: step, budget, layers, skipped, ms, rows, cumulative_ms) or small
tables built from them in `app/views.py`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from skipdecode.adapters.lora import NONE as NO_ADAPTER

# One palette for the whole app: SkipDecode is indigo, full decoding is amber, warm-up is sky blue.
SKIP = "#4f46e5"
FULL = "#d97706"
WARMUP = "#38bdf8"
PROMPT = "#cbd5e1"
SKIPPED = "#f1f5f9"
HOLE = "#dc2626"
EXPERIMENT = "#94a3b8"
SERIES = ["#4f46e5", "#d97706", "#059669", "#db2777", "#0891b2", "#7c3aed", "#65a30d", "#475569"]
FONT = dict(family="Inter, ui-sans-serif, system-ui, -apple-system, Segoe UI, sans-serif", size=13, color="#1e293b")


def _style(fig: go.Figure, title: str, height: int = 340, legend: bool = True) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0.01, xanchor="left", y=0.97, font=dict(size=15)),
        template="plotly_white", font=FONT, height=height, margin=dict(l=56, r=20, t=76, b=48),
        showlegend=legend, hovermode="closest",
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0.0, xanchor="left", bgcolor="rgba(0,0,0,0)"),
        plot_bgcolor="white", paper_bgcolor="white",
    )
    fig.update_xaxes(showline=True, linecolor="#cbd5e1", gridcolor="#f1f5f9", zeroline=False)
    fig.update_yaxes(showline=True, linecolor="#cbd5e1", gridcolor="#f1f5f9", zeroline=False)
    return fig


def _require(frame: pd.DataFrame, columns, what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} needs columns {', '.join(missing)}")


def empty_figure(message: str, height: int = 300) -> go.Figure:
    """A blank figure that says why it is blank."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color="#64748b"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _style(fig, "", height=height, legend=False)


# ---- Compare tab --------------------------------------------------------------------------------
def budget_figure(run: pd.DataFrame, scheduled: pd.DataFrame, num_layers: int,
                  paper: pd.DataFrame | None = None) -> go.Figure:
    """Layers per generated position: the schedule's b(s) (line) and what each position ran (markers);
    `paper`: the paper's decaying budget at the same average (dotted), drawn beside a flat one."""
    _require(run, ["step", "budget"], "the run")
    _require(scheduled, ["step", "budget"], "the schedule")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=scheduled["step"], y=[num_layers] * len(scheduled), name="full decoding",
                             mode="lines", line=dict(color=FULL, width=2, dash="dash"),
                             hovertemplate="full decoding: %{y} layers<extra></extra>"))
    fig.add_trace(go.Scatter(x=scheduled["step"], y=scheduled["budget"], name="scheduled b(s)", mode="lines",
                             line=dict(color="#a5b4fc", width=3, shape="hv"),
                             hovertemplate="position %{x}: %{y} layers scheduled<extra></extra>"))
    if paper is not None:
        _require(paper, ["step", "budget"], "the paper's decay")
        fig.add_trace(go.Scatter(x=paper["step"], y=paper["budget"], name="the paper's decay, same average",
                                 mode="lines", line=dict(color=SKIP, width=2, dash="dot", shape="hv"),
                                 hovertemplate="position %{x}: %{y} layers in the paper's decay<extra></extra>"))
    fig.add_trace(go.Scatter(x=run["step"], y=run["budget"], name="SkipDecode ran", mode="markers",
                             marker=dict(color=SKIP, size=7, line=dict(color="white", width=1)),
                             hovertemplate="position %{x}: ran %{y} layers<extra></extra>"))
    fig.update_yaxes(title="layers run", range=[0, num_layers + 1.5])
    fig.update_xaxes(title="generated position s")
    return _style(fig, "Layer budget per position")


def layer_states(run: pd.DataFrame, num_layers: int, prompt_tokens: int, warmup: int) -> np.ndarray:
    """[layer, position] codes, prompt included: 0 skipped, 1 warm-up, 2 run, 3 prompt (prefill, all layers).

    Warm-up layers are the bottom `warmup` layers when they run; every other layer a position ran is "run"."""
    _require(run, ["layers"], "the run")
    grid = np.zeros((num_layers, prompt_tokens + len(run)), dtype=int)
    grid[:, :prompt_tokens] = 3
    for column, layers in enumerate(run["layers"], start=prompt_tokens):
        for layer in layers:
            grid[layer, column] = 1 if layer < warmup else 2
    return grid


LAYER_STATES = [("skipped", SKIPPED), ("warm-up", WARMUP), ("run", SKIP), ("prompt (prefill)", PROMPT)]


def _category_heatmap(fig, grid, categories, x, y, hover, row=None, col=None, legend=True):
    """A heat map of integer codes with one legend entry per category (no colour bar)."""
    n = len(categories)
    scale = []
    for code, (_, colour) in enumerate(categories):
        scale += [[code / n, colour], [(code + 1) / n, colour]]
    fig.add_trace(go.Heatmap(z=np.asarray(grid).tolist(), x=x, y=y, zmin=-0.5, zmax=n - 0.5, colorscale=scale, showscale=False,
                             customdata=np.array([[categories[c][0] for c in r] for r in grid]),
                             hovertemplate=hover, xgap=0.5, ygap=0.5), row=row, col=col)
    if legend:
        for name, colour in categories:
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                     marker=dict(symbol="square", size=12, color=colour,
                                                 line=dict(color="#cbd5e1", width=1))), row=row, col=col)


def layer_map_figure(run: pd.DataFrame, num_layers: int, prompt_tokens: int, warmup: int) -> go.Figure:
    """Layers x positions: what ran where. The prompt runs every layer once (prefill); each generated
    position runs the warm-up layers and the top of the stack."""
    grid = layer_states(run, num_layers, prompt_tokens, warmup)
    positions = np.arange(grid.shape[1])
    fig = go.Figure()
    _category_heatmap(fig, grid, LAYER_STATES, positions, np.arange(num_layers),
                      "position %{x}, layer %{y}: %{customdata}<extra></extra>")
    if prompt_tokens and len(run):
        fig.add_vline(x=prompt_tokens - 0.5, line=dict(color="#334155", width=1.5, dash="dot"))
        fig.add_annotation(x=prompt_tokens - 0.5, y=num_layers - 0.5, text="generation starts", showarrow=False,
                           xanchor="left", yanchor="bottom", xshift=4, font=dict(size=11, color="#334155"))
    fig.update_xaxes(title="sequence position (prompt, then generated tokens)", showgrid=False)
    fig.update_yaxes(title="layer (0 = bottom)", showgrid=False, range=[-0.5, num_layers + 0.5])
    return _style(fig, "Layers run at every position", height=360)


# Verified decoding (app/rounds.py's frames): the draft's layers per output token and the verify passes.
KEPT_COLOUR, REJECTED_COLOUR, OWN_COLOUR, COPIED_COLOUR = "#10b981", "#ef4444", "#d1d5db", "#a78bfa"
DRAFT_STATES = [("skipped by the draft", SKIPPED), ("draft: warm-up layers", WARMUP),
                ("draft: top layers, kept", KEPT_COLOUR), ("draft: top layers, rejected", REJECTED_COLOUR),
                ("no draft: the full model's own token", OWN_COLOUR), ("copied from the prompt", COPIED_COLOUR)]
OUTCOME_CODES = {"kept": 2, "rejected": 3, "none": 4, "copied": 5}


def draft_states(drafts: pd.DataFrame, num_layers: int, warmup: int) -> np.ndarray:
    """[layer, output token] codes of DRAFT_STATES: the layers each token's draft ran (warm-up, or top layers
    coloured by the verifier's verdict), the rest skipped; a column with no draft is its own token's."""
    _require(drafts, ["token", "outcome", "layers"], "the drafts")
    grid = np.zeros((num_layers, len(drafts)), dtype=int)
    for column, (outcome, layers) in enumerate(zip(drafts["outcome"], drafts["layers"])):
        if outcome in ("none", "copied"):
            grid[:, column] = OUTCOME_CODES[outcome]
            continue
        for layer in layers:
            grid[layer, column] = 1 if layer < warmup else OUTCOME_CODES[outcome]
    return grid


def _passes(fig, passes: pd.DataFrame, y, row=None, col=None, legend: bool = True) -> None:
    """Each verify pass as a bar over the output tokens it judged (drafts + 1), at `y(lane)`; tokens counted from
    1, as people count (the frames count from 0: the prefill's token)."""
    for index, p in enumerate(passes.itertuples()):
        hover = (f"verify pass {p.round}: all layers over {p.drafted + 1} positions at once; kept {p.accepted} "
                 f"of {p.drafted} drafts" + (f", {p.ms:.0f} ms with its drafts" if p.ms else "") + "<extra></extra>")
        fig.add_trace(go.Scatter(x=[p.first + 1 - 0.42, p.last + 1 + 0.42], y=[y(p.lane)] * 2, mode="lines",
                                 line=dict(color=FULL, width=9), name="verify pass: all layers, drafts + 1 positions",
                                 legendgroup="pass", showlegend=legend and index == 0, hovertemplate=hover),
                      row=row, col=col)


def rounds_map_figure(drafts: pd.DataFrame, passes: pd.DataFrame, num_layers: int, warmup: int) -> go.Figure:
    """Verified decoding's layers x output tokens: the draft's layers at each token (skipped ones as gaps),
    coloured by the verifier's verdict, and above them each round's verify pass over its drafts + 1."""
    grid = draft_states(drafts, num_layers, warmup)
    tokens = np.arange(grid.shape[1]) + 1  # counted from 1, as people count
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.16, 0.84], vertical_spacing=0.03)
    _passes(fig, passes, lambda lane: lane, row=1, col=1)
    _category_heatmap(fig, grid, DRAFT_STATES, tokens, np.arange(num_layers),
                      "token %{x}, layer %{y}: %{customdata}<extra></extra>", row=2, col=1)
    fig.update_yaxes(visible=False, range=[-0.8, 1.8], row=1, col=1)
    fig.update_yaxes(title="layer (0 = bottom)", showgrid=False, range=[-0.5, num_layers - 0.5], row=2, col=1)
    fig.update_xaxes(showgrid=False)
    fig.update_xaxes(title="output token (1: chosen by the prefill)", row=2, col=1)
    fig = _style(fig, "Rounds: the draft's layers at each token, then one verify pass over them", height=400)
    fig.update_layout(margin=dict(t=96))
    return fig


def rounds_budget_figure(drafts: pd.DataFrame, passes: pd.DataFrame, scheduled: pd.DataFrame,
                         num_layers: int) -> go.Figure:
    """Layers per output token under verified decoding: the draft's budget (scheduled line, and what each
    draft ran, kept or rejected) and the verify passes, each all layers over its drafts + 1 positions."""
    _require(drafts, ["token", "outcome", "budget"], "the drafts")
    fig = go.Figure()
    # tokens counted from 1 (1: the prefill's): step s's draft chooses token s + 2
    fig.add_trace(go.Scatter(x=scheduled["step"] + 2, y=scheduled["budget"], name="the draft's budget b(s)",
                             mode="lines", line=dict(color="#a5b4fc", width=3, shape="hv"),
                             hovertemplate="token %{x}: %{y} layers scheduled for its draft<extra></extra>"))
    _passes(fig, passes, lambda lane: num_layers + 0.9 * lane)
    for outcome, name, colour in (("kept", "draft kept", KEPT_COLOUR), ("rejected", "draft rejected", REJECTED_COLOUR)):
        part = drafts[(drafts["outcome"] == outcome) & (drafts["budget"] > 0)]
        if len(part):
            fig.add_trace(go.Scatter(x=part["token"] + 1, y=part["budget"], name=name, mode="markers",
                                     marker=dict(color=colour, size=8, line=dict(color="white", width=1)),
                                     hovertemplate="token %{x}: its draft ran %{y} layers (" + outcome + ")"
                                     "<extra></extra>"))
    fig.update_yaxes(title="layers run", range=[0, num_layers + 3])
    fig.update_xaxes(title="output token")
    return _style(fig, "Layers per token: the draft's, and the full model's checks")


def latency_figure(skip: pd.DataFrame, full: pd.DataFrame, verdict: str | None = None,
                   name: str = "SkipDecode") -> go.Figure:
    """Both sides counted alike (app/timing.py's token frames): left, the time each decoded token took
    (prefill excluded); right, the time to each output token, the prefill included (token 1 is the
    prefill's), whose ends the headline compares; the title gives the verdict (`Timing.words`)."""
    for frame, what in ((skip, f"the {name} run"), (full, "the full run")):
        _require(frame, ["token", "ms", "cumulative_ms"], what)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14)
    for frame, label, colour in ((full, "full decoding", FULL), (skip, name, SKIP)):
        decoded = frame[frame["token"] > 1]  # token 1 is the prefill's
        fig.add_trace(go.Scatter(x=decoded["token"], y=decoded["ms"], name=label, mode="lines",
                                 line=dict(color=colour, width=2), legendgroup=label,
                                 hovertemplate=label + ", token %{x}: %{y:.1f} ms<extra></extra>"), 1, 1)
        fig.add_trace(go.Scatter(x=frame["token"], y=frame["cumulative_ms"], name=label, mode="lines+markers",
                                 marker=dict(size=3), line=dict(color=colour, width=2), legendgroup=label,
                                 showlegend=False,
                                 hovertemplate=label + ", token %{x}: %{y:.0f} ms since the start<extra></extra>"),
                      1, 2)
    fig.update_xaxes(title="output token")
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title="ms per decoded token", row=1, col=1)
    fig.update_yaxes(title="ms to this token, prefill included", row=1, col=2)
    return _style(fig, "Time" + (f": {verdict}" if verdict else ""))


# ---- KV cache tab -------------------------------------------------------------------------------
def holdings(layers_per_position: list, num_layers: int) -> np.ndarray:
    """[layer, position] booleans: whether the layer computed (and so holds) that position's keys/values."""
    held = np.zeros((num_layers, len(layers_per_position)), dtype=bool)
    for position, layers in enumerate(layers_per_position):
        held[list(layers), position] = True
    return held


def cache_states(held: np.ndarray) -> np.ndarray:
    """[layer, position] codes: 0 not computed and never needed, 1 held, 2 hole.

    A hole is an entry a layer never computed although a LATER position runs that layer and attends to
    it: it must be recomputed, or approximated by copying a lower layer's state."""
    later = np.zeros_like(held)
    later[:, :-1] = np.flip(np.logical_or.accumulate(np.flip(held[:, 1:], axis=1), axis=1), axis=1)
    return np.where(held, 1, np.where(later, 2, 0))


CACHE_STATES = [("not needed", SKIPPED), ("held in the KV cache", SKIP), ("hole: needed later, never computed", HOLE)]


def kv_cache_figure(panels: list[tuple[str, np.ndarray]], prompt_tokens: int) -> go.Figure:
    """One heat map of cache states per method, stacked on the same axes."""
    if not panels:
        raise ValueError("no cache to draw")
    titles = []
    for name, states in panels:
        holes = int((states == 2).sum())
        titles.append(f"{name}: {holes} hole{'s' if holes != 1 else ''}")
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=titles)
    for index, (name, states) in enumerate(panels, start=1):
        num_layers, width = states.shape
        _category_heatmap(fig, states, CACHE_STATES, np.arange(width), np.arange(num_layers),
                          "position %{x}, layer %{y}: %{customdata}<extra></extra>", row=index, col=1,
                          legend=index == 1)
        fig.update_yaxes(title="layer", showgrid=False, row=index, col=1)
        if 0 < prompt_tokens < width:
            fig.add_vline(x=prompt_tokens - 0.5, line=dict(color="#334155", width=1.5, dash="dot"), row=index, col=1)
    fig.update_xaxes(showgrid=False)
    fig.update_xaxes(title="sequence position (prompt, then generated tokens)", row=len(panels), col=1)
    fig.update_annotations(font=dict(size=13, color="#1e293b"))
    _style(fig, "Which positions each layer holds", height=260 + 250 * len(panels))
    fig.update_layout(margin=dict(t=118), legend=dict(y=1.0 + 36 / (250 * len(panels))))
    return fig


# ---- Batch tab ----------------------------------------------------------------------------------
def batch_budget_figure(cells: pd.DataFrame, num_layers: int) -> go.Figure:
    """Rows x the batch's steps, each cell coloured by the budget its row ran there (its own position's);
    blank before a row joined and after it left. In a batch of one position every row is in step (tick =
    position); in a continuous batch rows join and leave at their own steps, each at its own position."""
    _require(cells, ["row", "step", "budget", "tick"], "the batch cells")
    rows = sorted(cells["row"].unique())
    first = int(cells["tick"].min()) if len(cells) else 0
    ticks = int(cells["tick"].max()) - first + 1 if len(cells) else 0
    grid, position = np.full((len(rows), ticks), np.nan), np.full((len(rows), ticks), np.nan)
    for cell in cells.itertuples():
        grid[rows.index(cell.row), cell.tick - first] = cell.budget
        position[rows.index(cell.row), cell.tick - first] = cell.step + 1
    in_step = bool((cells["tick"] - first == cells["step"]).all())
    fig = go.Figure(go.Heatmap(
        z=grid, x=np.arange(1, ticks + 1), y=[f"prompt {r + 1}" for r in rows], zmin=0, zmax=num_layers, xgap=1,
        ygap=2, customdata=position, colorscale=[[0, "#e0e7ff"], [1, SKIP]],
        colorbar=dict(title=dict(text="layers"), thickness=12),
        hovertemplate="%{y}, step %{x}: its token %{customdata}, %{z} layers<extra></extra>"))
    fig.update_xaxes(title="decode step of the batch", showgrid=False)
    fig.update_yaxes(autorange="reversed", showgrid=False)
    title = ("One budget per position, shared by every row" if in_step
             else "Rows join and leave the running batch, each at its own position and budget")
    if cells["budget"].nunique() == 1:  # one colour: say why, not leave the eye to hunt for a difference
        title = (f"One colour: every row ran {int(cells['budget'].iloc[0])} of {num_layers} layers at every position "
                 "(a flat budget)")
    return _style(fig, title, height=180 + 28 * len(rows), legend=False)


def throughput_figure(points: pd.DataFrame) -> go.Figure:
    """Decode tokens per second against batch size, one line per method."""
    _require(points, ["batch_size", "method", "tokens_per_s"], "the throughput table")
    fig = go.Figure()
    colours = {"SkipDecode": SKIP, "full decoding": FULL}
    for index, (method, group) in enumerate(points.groupby("method", sort=False)):
        group = group.sort_values("batch_size")
        fig.add_trace(go.Scatter(x=group["batch_size"], y=group["tokens_per_s"], name=method, mode="lines+markers",
                                 line=dict(color=colours.get(method, SERIES[index % len(SERIES)]), width=2),
                                 marker=dict(size=8),
                                 hovertemplate=method + ", batch %{x}: %{y:.0f} tokens/s<extra></extra>"))
    fig.update_xaxes(title="batch size (rows)", type="log", dtick=np.log10(2), tickformat="d")
    fig.update_yaxes(title="decode tokens per second", rangemode="tozero")
    return _style(fig, "Throughput against batch size")


# ---- Results tab --------------------------------------------------------------------------------
# Each kind of E2E row: its legend entry and look. Served adapters are drawn as a frontier (a line through
# their points, each named); experiment adapters, measured in the same run but not served, as grey points.
E2E_KINDS = {
    "served": ("served adapters", dict(mode="lines+markers+text", line=dict(color=SKIP, width=2.5),
                                       marker=dict(size=10, color=SKIP), textposition="top center",
                                       textfont=dict(size=12, color=SKIP))),
    "base": ("base model, no adapter", dict(mode="lines+markers+text", line=dict(color=FULL, width=2, dash="dot"),
                                            marker=dict(size=10, color=FULL, symbol="diamond"),
                                            textposition="middle right", textfont=dict(size=12, color=FULL))),
    "experiment": ("experiment adapters (hover for names)",
                   dict(mode="markers", marker=dict(size=8, color=EXPERIMENT, opacity=0.8,
                                                    line=dict(color="white", width=1)))),
}


def no_adapter(e2e: pd.DataFrame) -> pd.Series:
    """The E2E rows decoded by the base model, without an adapter (all of them when no column says)."""
    adapter = e2e["adapter"] if "adapter" in e2e.columns else pd.Series("none", index=e2e.index)
    return adapter.fillna("none").astype(str).str.lower().isin(NO_ADAPTER)


def e2e_kinds(e2e: pd.DataFrame) -> pd.Series:
    """Each row's kind: "served" (an adapter the app serves), "base" (a served row without adapter) or
    "experiment". Served rows are those with a true `served` column (`app.results` adds it from the
    adapters folder); a table without that column is all served."""
    base = no_adapter(e2e)
    served = e2e["served"].astype(bool) if "served" in e2e.columns else pd.Series(True, index=e2e.index)
    return pd.Series(np.where(~served, "experiment", np.where(base, "base", "served")), index=e2e.index)


def quality_speed_figure(e2e: pd.DataFrame, metric: str = "bleu", show_experiments: bool = False) -> go.Figure:
    """E2E quality against decode speedup (measured when the table has it, else the target): the served
    adapters' frontier and the base model's rows; with `show_experiments`, the other rows too, as grey
    markers under one legend entry (hover names each)."""
    _require(e2e, ["speedup", metric], "the E2E table")
    x = "decode_speedup" if "decode_speedup" in e2e.columns and e2e["decode_speedup"].notna().all() else "speedup"
    kinds = e2e_kinds(e2e)
    row = e2e["row"].astype(str) if "row" in e2e.columns else e2e["speedup"].map("{:g}x".format)
    adapter = e2e["adapter"].astype(str) if "adapter" in e2e.columns else row
    points = e2e.assign(_name=np.where(kinds == "base", row, adapter),
                        _hover=np.where(kinds == "base", row, adapter + " (" + row + ")"))
    label = "ROUGE-L" if metric == "rouge_l" else metric.replace("_", "-").upper()
    fig = go.Figure()
    # The experiments are drawn first, under the frontier and its names; the legend keeps E2E_KINDS' order.
    for kind in ("experiment", "served", "base") if show_experiments else ("served", "base"):
        group = points[kinds == kind].sort_values(x)
        if group.empty:
            continue
        name, style = E2E_KINDS[kind]
        fig.add_trace(go.Scatter(x=group[x], y=group[metric], name=name, customdata=group["_hover"],
                                 legendrank=list(E2E_KINDS).index(kind) + 1,
                                 text=group["_name"] if "text" in style["mode"] else None, cliponaxis=False,
                                 texttemplate="%{text}: %{y:.1f}" if "text" in style["mode"] else None,
                                 hovertemplate="%{customdata}: %{x:.2f}x, " + label + " %{y:.1f}<extra></extra>",
                                 **style))
    if not fig.data:
        return empty_figure("No served adapter in this table: tick the box to see the experiments")
    fig.update_xaxes(title="measured decode speedup" if x == "decode_speedup" else "target speedup")
    fig.update_yaxes(title=label)
    return _style(fig, f"E2E test set: {label} of the served adapters against decode speedup", height=420)


def house_style(fig: go.Figure) -> go.Figure:
    """A figure built elsewhere (e.g. `skipdecode.evaluation.bench.figure.speed_figure`) in this app's look, title kept."""
    return _style(fig, fig.layout.title.text or "")
