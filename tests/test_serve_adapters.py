"""scripts/serve_adapters.py: trained runs become the served adapters, their lineage by served name."""

import importlib.util
import json
import shutil
from pathlib import Path

from safetensors.torch import load_file

from skipdecode.adapters import lora as adapters

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("serve_adapters", ROOT / "scripts" / "serve_adapters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_served_runs_name_their_ancestors_by_served_name(tmp_path):
    runs, served = tmp_path / "runs", tmp_path / "adapters"
    for shipped, run in (("e2e-1x", "one"), ("e2e-all", "all")):
        shutil.copytree(adapters.find_adapter(shipped).path, runs / run)
    record = runs / "all" / "skipdecode.json"
    meta = json.loads(record.read_text())
    meta["config"].update(init=str(runs / "one"), teacher=str(runs / "one"))
    record.write_text(json.dumps(meta))
    outside = "/elsewhere/e2e-train-1x"  # a run not served in this call keeps its path
    _script().serve([(runs / "one", "e2e-1x"), (runs / "all", "e2e-all")], served)
    served_all = adapters.read_adapter(served / "e2e-all")
    assert served_all.config["init"] == served_all.config["teacher"] == "e2e-1x"
    assert "# e2e-all: skip-aware LoRA" in (served / "e2e-all" / "README.md").read_text()
    assert "Started from the adapter `e2e-1x`" in (served / "e2e-all" / "README.md").read_text()
    weights = load_file(served / "e2e-all" / "adapter_model.safetensors")
    assert all(torch_equal(weights[k], v) for k, v in load_file(runs / "all" / "adapter_model.safetensors").items())
    meta["config"].update(init=outside)
    record.write_text(json.dumps(meta))
    _script().serve([(runs / "all", "e2e-all")], served)
    assert adapters.read_adapter(served / "e2e-all").config["init"] == outside


def torch_equal(a, b) -> bool:
    return a.dtype == b.dtype and bool((a == b).all())


def test_a_run_that_replaces_its_own_start_names_it_by_commit(tmp_path):
    runs, served = tmp_path / "runs", tmp_path / "adapters"
    shutil.copytree(adapters.find_adapter("e2e-5x").path, served / "e2e-5x")
    shutil.copytree(adapters.find_adapter("e2e-5x").path, runs / "more")
    record = runs / "more" / "skipdecode.json"
    meta = json.loads(record.read_text())
    meta["config"].update(init="e2e-5x", teacher="e2e-1x")
    record.write_text(json.dumps(meta))
    script = _script()
    script.serve([(runs / "more", "e2e-5x")], served)
    config = adapters.read_adapter(served / "e2e-5x").config
    assert config["init"] == f"e2e-5x@{script._head()}" != "e2e-5x@git-unknown"
    assert config["teacher"] == "e2e-1x"  # not replaced in this call: its name stays
    assert f"Started from the adapter `e2e-5x@{script._head()}`" in (served / "e2e-5x" / "README.md").read_text()


def test_adapters_served_earlier_name_a_replaced_ancestor_by_commit(tmp_path):
    """A new e2e-1x served beside e2e-all, whose init and teacher was the old one, and e2e-5x (teacher)."""
    runs, served = tmp_path / "runs", tmp_path / "adapters"
    for name in ("e2e-1x", "e2e-all", "e2e-5x"):
        shutil.copytree(adapters.find_adapter(name).path, served / name)
    for name, names in (("e2e-all", ("init", "teacher")), ("e2e-5x", ("teacher",))):  # as they were first served
        record = served / name / "skipdecode.json"
        meta = json.loads(record.read_text())
        record.write_text(json.dumps({**meta, "config": {**meta["config"], **dict.fromkeys(names, "e2e-1x")}}))
    weights = served / "e2e-all" / "adapter_model.safetensors"
    before, written = weights.read_bytes(), weights.stat().st_mtime_ns
    shutil.copytree(adapters.find_adapter("e2e-1x").path, runs / "new-1x")
    script = _script()
    script.serve([(runs / "new-1x", "e2e-1x")], served)
    tag = f"e2e-1x@{script._head()}"
    config = adapters.read_adapter(served / "e2e-all").config
    assert config["init"] == config["teacher"] == tag
    assert adapters.read_adapter(served / "e2e-5x").config["teacher"] == tag
    assert f"Started from the adapter `{tag}`" in (served / "e2e-all" / "README.md").read_text()
    assert weights.read_bytes() == before and weights.stat().st_mtime_ns == written  # its card alone rewritten
    assert adapters.read_adapter(served / "e2e-1x").config.get("init") is None


def test_a_run_that_started_from_the_served_adapters_run_folder_names_it_by_commit(tmp_path):
    """Trained on with `--init checkpoints/runs/X`, X being what is served as the name it replaces."""
    runs, served = tmp_path / "runs", tmp_path / "adapters"
    shutil.copytree(adapters.find_adapter("e2e-5x").path, served / "e2e-5x")
    shutil.copytree(adapters.find_adapter("e2e-5x").path, runs / "first")  # the run e2e-5x was served from
    shutil.copytree(adapters.find_adapter("e2e-all").path, runs / "more")
    record = runs / "more" / "skipdecode.json"
    meta = json.loads(record.read_text())
    meta["config"].update(init=str(runs / "first"), teacher="e2e-1x")
    record.write_text(json.dumps(meta))
    script = _script()
    script.serve([(runs / "more", "e2e-5x")], served)
    config = adapters.read_adapter(served / "e2e-5x").config
    assert config["init"] == f"e2e-5x@{script._head()}"
    assert config["teacher"] == "e2e-1x"


def test_the_card_of_a_served_snapshot_says_it_stopped_short_of_its_schedule(tmp_path):
    runs, served = tmp_path / "runs", tmp_path / "adapters"
    for name, snapshot in (("whole", False), ("cut", True)):
        shutil.copytree(adapters.find_adapter("e2e-5x").path, runs / name)
        record = runs / name / "skipdecode.json"
        meta = json.loads(record.read_text())
        meta.pop("snapshot", None)
        meta["config"]["steps"] = meta["steps"] + 101
        record.write_text(json.dumps({**meta, "snapshot": True} if snapshot else meta))
    _script().serve([(runs / "whole", "whole"), (runs / "cut", "cut")], served)
    steps = json.loads((runs / "cut" / "skipdecode.json").read_text())["steps"]
    assert f"{steps} steps (a snapshot of a {steps + 101}-step schedule) of batch" in (served / "cut" / "README.md").read_text()
    assert "snapshot" not in (served / "whole" / "README.md").read_text()


def test_a_replaced_draft_keeps_its_shortlist(tmp_path):
    """A shortlist is counted on the task's targets, not on the weights: serving a new run keeps it."""
    runs, served = tmp_path / "runs", tmp_path / "adapters"
    shutil.copytree(adapters.find_adapter("general-3x").path, served / "general-3x")
    shutil.copytree(adapters.find_adapter("general-3x").path, runs / "next")
    (runs / "next" / "shortlist.json").unlink()
    before = (served / "general-3x" / "shortlist.json").read_bytes()
    _script().serve([(runs / "next", "general-3x")], served)
    assert (served / "general-3x" / "shortlist.json").read_bytes() == before
    _script().serve([(runs / "next", "general-new")], served)  # a new name: nothing to keep
    assert not (served / "general-new" / "shortlist.json").exists()
