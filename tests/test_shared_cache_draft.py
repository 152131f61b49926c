"""A draft made for verified decoding's one cache (skipdecode/training/shared_cache.py): shipped with only the
layers it runs, found for its verifier by `for_prompt` and by the app, and never decoding alone."""

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_adapter, tiny_checkpoint
from skipdecode.adapters import lora as adapters
from skipdecode.training.shared_cache import ship


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A tiny base with a verifier (1x), a plain adapter for 2x and a shared-cache draft shipped from a run
    of the verifier's kind: (base, adapters folder)."""
    base = tiny_checkpoint(tmp_path / "base")
    served = tmp_path / "adapters"
    tiny_adapter(served / "v-1x", base, speedups=(1.0,))
    tiny_adapter(served / "d-all", base, speedups=(2.0,))
    run = tmp_path / "run"
    tiny_adapter(run / "adapter", base, speedups=(2.0,))
    record = run / "adapter" / "skipdecode.json"
    meta = json.loads(record.read_text())
    meta["config"].update(init="d-all", teacher="v-1x", speedup=2.0, warmup_layers=2)  # the page's warm-up
    record.write_text(json.dumps({**meta, "shared_cache": True, "verifier": "v-1x", "layers": [0, 1, 5]}))
    monkeypatch.setenv(adapters.ADAPTERS_ENV, str(served))
    ship(run, served / "d-draft")
    return base, served


def test_ship_keeps_the_layers_the_draft_runs_in_float16(folder):
    base, served = folder
    tensors = load_file(str(served / "d-draft" / adapters.WEIGHTS))
    layers = {int(key.split(".layers.")[1].split(".")[0]) for key in tensors}
    assert layers == {0, 1, 5} and {t.dtype for t in tensors.values()} == {torch.float16}
    config = json.loads((served / "d-draft" / "adapter_config.json").read_text())
    assert config["layers_to_transform"] == [0, 1, 5]
    info = adapters.find_adapter("d-draft")
    assert info.shared_cache and info.meta["verifier"] == "v-1x" and info.speedups == (2.0,)


def test_the_draft_drafts_for_its_verifier_and_never_decodes_alone(folder):
    from skipdecode.speculative.verify import for_prompt

    base, _ = folder
    assert adapters.pick_adapter(2.0, str(base), task="e2e")[0].name == "d-all"
    verifier = adapters.pick_adapter(1.0, str(base), task="e2e")[0]
    assert verifier.name == "v-1x"
    assert adapters.shared_cache_draft(verifier, 2.0).name == "d-draft"
    assert adapters.shared_cache_draft(verifier, 3.0) is None
    assert adapters.shared_cache_draft(adapters.find_adapter("d-all"), 2.0) is None
    run, schedule, why = for_prompt(None, 2.0, str(base), dtype="float32", task="e2e")
    assert run.draft.adapter.name == "d-draft" and run.verifier.adapter.name == "v-1x"
    assert "d-draft: trained to draft on v-1x's keys and values" in why
    prompt = "name[The Punter], food[Italian]"
    want = run.verifier.generate([prompt], None, 12).token_ids
    assert run.generate([prompt], schedule, 12).token_ids == want


def test_the_app_lists_no_draft_and_drafts_with_it_on_its_schedule(folder):
    from app.choices import configured_models
    from app.studio import Studio
    from skipdecode.adapters.lora import trained_schedule

    base, _ = folder
    models = configured_models(str(base))
    assert not any("d-draft" in m.label for m in models)
    studio = Studio(models)
    verifier = next(m for m in models if m.adapter == "v-1x")
    info = adapters.find_adapter("d-draft")
    schedule = trained_schedule(info, 2.0, 6)
    draft = studio.draft(verifier, schedule)
    assert draft.adapter == "d-draft" and studio.engine(draft).adapter.name == "d-draft"
    assert studio.draft(verifier, trained_schedule(info, 1.5, 6)) is None  # not the schedule it learned
    assert studio.draft(next(m for m in models if m.adapter == "d-all"), schedule) is None


def test_a_verified_comparison_drafts_with_it_and_says_so(folder):
    from app.choices import AUTO, configured_models
    from app.settings import Settings
    from app.studio import Studio
    from skipdecode.batcher import Batcher
    from skipdecode.adapters.router import INSTRUCTION

    base, _ = folder
    studio = Studio(configured_models(str(base)), batcher=Batcher(window_s=0.0))
    try:
        final = list(studio.compare(INSTRUCTION + "name[The Punter], food[Italian]",
                                    Settings(speedup=2.0, max_new_tokens=9, verify=True), AUTO))[-1]
    finally:
        studio.batcher.close()
    assert "d-draft drafts instead, trained to read v-1x's keys and values" in final.why[0]
    assert final.skip.token_ids == final.full.token_ids and final.skip.verification["drafted"] > 0


@pytest.mark.slow
def test_generate_verify_drafts_with_the_served_draft(cli):
    """The bundled model, an E2E MR at 3x: e2e-all is picked, e2e-1x verifies, e2e-draft-3x (shipped in
    assets/adapters) drafts, and the answer is full decoding's."""
    from skipdecode.adapters.router import INSTRUCTION

    prompt = INSTRUCTION + "name[The Punter], eatType[coffee shop], food[Italian], area[riverside]"
    out = cli("generate", "--speedup", "3", "--verify", "--max-new-tokens", "12", "--json", "--prompt", prompt)
    assert out.returncode == 0, out.stderr
    assert "(draft adapter e2e-draft-3x)" in out.stderr
    full = cli("generate", "--speedup", "1", "--max-new-tokens", "12", "--json", "--prompt", prompt)
    assert json.loads(out.stdout)["outputs"][0]["token_ids"] == json.loads(full.stdout)["outputs"][0]["token_ids"]
