"""Cut a LoRA adapter to a lower rank: the best rank-k approximation of each layer's update.

Why: a rank-64 adapter learns more (docs/research/general-adapters.md, round 13) but weighs four times a rank-16 one,
more than the repository can serve. A LoRA update is scale * B @ A; its truncated SVD (Eckart-Young) is the
rank-k matrix nearest to it, so the cut keeps as much of each update as k directions can. Computed without
forming B @ A: B = Qb Rb and A^T = Qa Ra, so B @ A = Qb (Rb Ra^T) Qa^T and only the r x r core needs an SVD.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..adapters.lora import WEIGHTS, read_adapter, write_record


def cut_pair(a: torch.Tensor, b: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(A', B', share of the update's energy kept) with B' @ A' the best rank-`rank` approximation of B @ A
    (A: r x in, B: out x r), split evenly between the two factors."""
    qb, rb = torch.linalg.qr(b.double())
    qa, ra = torch.linalg.qr(a.double().T)
    u, s, vh = torch.linalg.svd(rb @ ra.T)
    root = s[:rank].sqrt()
    new_b = (qb @ u[:, :rank]) * root
    new_a = root[:, None] * (vh[:rank] @ qa.T)
    energy = float((s[:rank] ** 2).sum() / (s ** 2).sum()) if s.any() else 1.0
    return new_a.to(a.dtype), new_b.to(b.dtype), energy


def cut_rank(source: str | Path, dest: str | Path, rank: int) -> dict:
    """Write `source`'s adapter cut to `rank` into `dest` (its scale alpha / rank kept, so the cut update is
    the nearest one); returns what the cut kept: the mean and least share of energy over the updates."""
    from safetensors.torch import load_file, save_file

    from .card import finish_adapter

    source, dest = Path(source), Path(dest)
    info = read_adapter(source)
    config = json.loads((source / "adapter_config.json").read_text())
    old = config["r"]
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError(f"{source}: per-module ranks are not supported")
    if not 0 < rank < old:
        raise ValueError(f"{source} has rank {old}: cut it to a rank between 1 and {old - 1}, not {rank}")
    weights = load_file(source / WEIGHTS)
    out, energies = {}, []
    for key in sorted(k for k in weights if ".lora_A." in k):
        b_key = key.replace(".lora_A.", ".lora_B.")
        out[key], out[b_key], energy = cut_pair(weights[key].float(), weights[b_key].float(), rank)
        energies.append(energy)
    if not energies or len(out) != len(weights):
        raise ValueError(f"{source}: expected only lora_A / lora_B pairs in {WEIGHTS}")
    alpha = config["lora_alpha"] * rank / old  # the same scale, alpha / r
    alpha = int(alpha) if alpha == int(alpha) else alpha
    dest.mkdir(parents=True, exist_ok=True)
    save_file(out, dest / WEIGHTS, metadata={"format": "pt"})
    (dest / "adapter_config.json").write_text(json.dumps({**config, "r": rank, "lora_alpha": alpha}, indent=2))
    kept = {"from_rank": old, "from_alpha": config["lora_alpha"], "from": str(source.resolve()),
            "energy_kept_mean": round(sum(energies) / len(energies), 4), "energy_kept_min": round(min(energies), 4)}
    meta = dict(info.meta)
    meta["config"] = {**meta.get("config", {}), "rank": rank, "alpha": alpha}
    meta["rank_cut"] = kept
    write_record(dest, meta)
    if "steps" in meta and "train_minutes" in meta:  # a `skipdecode train` record: its card, rewritten
        finish_adapter(dest)
    return kept
