"""skipdecode.training.rank_cut: an adapter cut to a lower rank is the nearest update of that rank, and still loads."""

import json

import pytest
import torch
from safetensors.torch import load_file

from skipdecode.adapters import lora as adapters
from skipdecode.training.rank_cut import cut_pair, cut_rank

from conftest import tiny_model


def _pair(out: int, inner: int, rank: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rank, inner, generator=g), torch.randn(out, rank, generator=g)


def test_a_cut_is_the_truncated_svd_of_the_update():
    a, b = _pair(48, 40, rank=8)
    new_a, new_b, energy = cut_pair(a, b, 3)
    assert new_a.shape == (3, 40) and new_b.shape == (48, 3)
    u, s, vh = torch.linalg.svd((b @ a).double())
    nearest = (u[:, :3] * s[:3]) @ vh[:3]
    assert torch.allclose((new_b @ new_a).double(), nearest, atol=1e-4)
    assert energy == pytest.approx(float((s[:3] ** 2).sum() / (s ** 2).sum()), abs=1e-6)
    assert 0 < energy < 1


def test_an_update_of_low_rank_survives_the_cut_whole():
    a, b = _pair(32, 24, rank=2)
    a = torch.cat([a, torch.zeros(6, 24)])  # a rank-8 adapter whose update has rank 2
    b = torch.cat([b, torch.randn(32, 6)], dim=1)
    new_a, new_b, energy = cut_pair(a, b, 2)
    assert torch.allclose(new_b @ new_a, b @ a, atol=1e-4)
    assert energy == pytest.approx(1.0)


def _saved_adapter(folder, rank: int = 8):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model("llama", layers=2),
                           LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "up_proj"]))
    with torch.no_grad():  # peft starts B at zero: give the update something to keep
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    (folder / "skipdecode.json").write_text(json.dumps({"base_model": "tiny", "speedups": [3.0],
                                                         "config": {"rank": rank, "alpha": 2 * rank}}))


def test_a_cut_adapter_loads_and_merges_to_the_nearest_update(tmp_path):
    from peft import PeftModel

    source, dest = tmp_path / "r8", tmp_path / "r2"
    _saved_adapter(source)
    kept = cut_rank(source, dest, 2)
    config = json.loads((dest / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (2, 4)  # alpha / r, the update's scale, unchanged
    info = adapters.read_adapter(dest)
    assert (info.config["rank"], info.config["alpha"], info.meta["rank_cut"]["from_rank"]) == (2, 4, 8)
    assert 0 < kept["energy_kept_min"] <= kept["energy_kept_mean"] < 1
    base = tiny_model("llama", layers=2)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    merged = PeftModel.from_pretrained(base, str(dest)).merge_and_unload().state_dict()
    weights = load_file(source / adapters.WEIGHTS)
    for key in (k for k in weights if ".lora_A." in k):
        module = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        update = 2 * weights[key.replace("lora_A", "lora_B")].double() @ weights[key].double()  # scale 16/8
        u, s, vh = torch.linalg.svd(update)
        assert torch.allclose((merged[module] - before[module]).double(), (u[:, :2] * s[:2]) @ vh[:2], atol=1e-4)


def test_a_cut_must_lower_the_rank(tmp_path):
    _saved_adapter(tmp_path / "r8")
    for rank in (0, 8, 12):
        with pytest.raises(ValueError, match="rank between 1 and 7"):
            cut_rank(tmp_path / "r8", tmp_path / "out", rank)


def test_a_served_adapter_cut_says_so_on_its_card(tmp_path):
    kept = cut_rank(adapters.find_adapter("general-2x").path, tmp_path / "general-2x-r4", 4)
    card = (tmp_path / "general-2x-r4" / "README.md").read_text()
    assert "LoRA rank 4 (cut from rank 16 by an SVD of each layer's update, keeping" in card
    assert f"{kept['energy_kept_mean']:.1%}" in card
    assert load_file(tmp_path / "general-2x-r4" / adapters.WEIGHTS)[
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, 576)
