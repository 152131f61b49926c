"""The speed goals of `skipdecode bench` (docs/speed.md), each checked as the ratio a run measured against
its threshold: on a CPU against transformers, the bound, the floor, the early-exit peer and llama.cpp on the
same GGUF; on a GPU, where launches set the pace, against transformers and full depth."""

from __future__ import annotations

from ..llamacpp import METHOD

GOALS = {"vs_hf": 1.5, "efficiency": 0.9, "batch_scaling": 6.0, "vs_peer": 1.0, "vs_floor": 1.3,
         "vs_llamacpp": 1.3, "vs_llamacpp_3x": 3.0, "ttft_vs_llamacpp": 1.0}  # the last three: against llama.cpp
# on the same GGUF, timed in its own decode loop (the native layers' goals; docs/speed.md)
GPU_GOALS = {"vs_hf": 3.0, "speedup_3x": 2.0}  # on a GPU (docs/speed.md, "On a GPU"): launches set the pace there


def goals(rows) -> list[dict]:
    """The speed goals, each as the ratio this run measured against its threshold; with rows of more than
    one decode step, checked for each step (named in the goal)."""
    steps = list(dict.fromkeys(r["step"] for r in rows if "step" in r))
    if len(steps) < 2:
        return step_goals(rows)
    return [{**g, "goal": f"[{step}] {g['goal']}"} for step in steps
            for g in step_goals([r for r in rows if r.get("step", step) == step])]


def step_goals(rows) -> list[dict]:
    out = []
    at = {(r["method"], r["speedup"], r["batch_size"]): r for r in rows}

    def goal(name, value, threshold, op=">="):
        ok = {">=": value >= threshold, ">": value > threshold, "<=": value <= threshold}[op]
        out.append({"goal": name, "value": round(value, 3), "op": op, "threshold": threshold, "holds": bool(ok)})

    if rows and rows[0].get("device") == "cuda":
        if "vs_hf" in at.get(("full", 1, 1), {}):
            goal("GPU, full depth, batch 1: tokens/s vs transformers generate (end to end)",
                 at[("full", 1, 1)]["vs_hf"], GPU_GOALS["vs_hf"])
        for b in (1, 16):
            if ("skipdecode", 3, b) in at:
                goal(f"GPU, SkipDecode 3x, batch {b}: speedup over full depth",
                     at[("skipdecode", 3, b)]["measured_speedup"], GPU_GOALS["speedup_3x"])
        return out

    if ("full", 1, 1) in at and "vs_hf" in at[("full", 1, 1)]:
        goal("full depth, batch 1: tokens/s vs transformers generate (end to end)", at[("full", 1, 1)]["vs_hf"],
             GOALS["vs_hf"])
    if "vs_floor" in at.get(("full", 1, 1), {}):
        goal("full depth, batch 1: ms/token / weight-streaming floor", at[("full", 1, 1)]["vs_floor"],
             GOALS["vs_floor"], op="<=")
    if (METHOD, 1, 1) in at and "vs_llamacpp" in at.get(("full", 1, 1), {}):
        goal("full depth, batch 1: tokens/s / llama.cpp's (same GGUF, threads and prompt)",
             at[("full", 1, 1)]["vs_llamacpp"], GOALS["vs_llamacpp"])
    if (METHOD, 1, 1) in at and "vs_llamacpp" in at.get(("skipdecode", 3, 1), {}):
        goal("SkipDecode 3x, batch 1: tokens/s / llama.cpp's full-depth tokens/s",
             at[("skipdecode", 3, 1)]["vs_llamacpp"], GOALS["vs_llamacpp_3x"])
    if (METHOD, 1, 1) in at and "ttft_vs_llamacpp" in at.get(("full", 1, 1), {}):
        full = at[("full", 1, 1)]
        goal(f"full depth, batch 1: time to first token of the {full['prompt_tokens']}-token prompt / llama.cpp's",
             full["ttft_vs_llamacpp"], GOALS["ttft_vs_llamacpp"], op="<=")
    speedups = sorted({r["speedup"] for r in rows})
    for s in (s for s in speedups if s != 1):
        for b in (1, 16):
            if ("skipdecode", s, b) in at:
                goal(f"SkipDecode {s}x, batch {b}: efficiency (measured / bound)",
                     at[("skipdecode", s, b)]["efficiency"], GOALS["efficiency"])
    for s in speedups:
        method = "full" if s == 1 else "skipdecode"
        if (method, s, 1) in at and (method, s, 16) in at:
            goal(f"{s}x: batch 16 tokens/s / batch 1 tokens/s",
                 at[(method, s, 16)]["tokens_per_s"] / at[(method, s, 1)]["tokens_per_s"], GOALS["batch_scaling"])
    for s in speedups:
        if ("early_exit_peer", s, 16) in at and ("skipdecode", s, 16) in at:
            goal(f"{s}x, batch 16: SkipDecode tokens/s / early-exit peer tokens/s (equal layers per token)",
                 at[("skipdecode", s, 16)]["tokens_per_s"] / at[("early_exit_peer", s, 16)]["tokens_per_s"],
                 GOALS["vs_peer"], op=">")
    return out
