"""The benchmark's figure: a pure function of its rows, so that the app draws it from the shipped table."""

from __future__ import annotations


def speed_figure(rows):
    """Measured decode speedup against the cost-model bound, per batch size (a pure function of the
    benchmark rows, a list of dicts or a DataFrame; the app's Results tab shows it)."""
    import plotly.graph_objects as go

    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)
    figure = go.Figure()
    bound = sorted({(r["speedup"], r["bound"]) for r in rows if r["method"] in ("full", "skipdecode")})
    if bound:
        figure.add_trace(go.Scatter(x=[b[0] for b in bound], y=[b[1] for b in bound], name="cost-model bound",
                                    mode="lines", line=dict(dash="dash", color="gray")))
    for method, symbol in (("skipdecode", "circle"), ("early_exit_peer", "x")):
        for batch in sorted({r["batch_size"] for r in rows}):
            pts = sorted((r["speedup"], r["measured_speedup"], r["tokens_per_s"]) for r in rows
                         if r["batch_size"] == batch and (r["method"] == method or
                                                         (method == "skipdecode" and r["method"] == "full")))
            if pts:
                figure.add_trace(go.Scatter(
                    x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", marker_symbol=symbol,
                    name=f"{'SkipDecode' if method == 'skipdecode' else 'early-exit peer'}, batch {batch}",
                    customdata=[p[2] for p in pts],
                    hovertemplate="target %{x}x: measured %{y:.2f}x, %{customdata:.0f} tokens/s<extra></extra>"))
    figure.update_layout(title="Decode speedup against full decoding", xaxis_title="target speedup (layers)",
                         yaxis_title="measured speedup", template="plotly_white", legend_title_text="")
    return figure
