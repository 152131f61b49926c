"""scripts/replace_rows.py: one row of a long results table follows a newer run, only when the runs agree."""

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from skipdecode.evaluation.runs import write_frame

ROOT = Path(__file__).resolve().parents[1]
MRS = ["name[A]", "name[B]"]


def _replace_rows():
    spec = importlib.util.spec_from_file_location("replace_rows", ROOT / "scripts" / "replace_rows.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.replace_rows


def _table(prefix: Path, rows: list[tuple[str, str, float]], outputs: dict[str, list[str]]) -> Path:
    write_frame(pd.DataFrame([{"row": r, "adapter": a, "bleu": b} for r, a, b in rows]), prefix)
    prefix.with_name(prefix.name + "-outputs.jsonl").write_text(
        "".join(json.dumps({"mr": mr, **{k: v[i] for k, v in outputs.items()}}) + "\n" for i, mr in enumerate(MRS)))
    return prefix


def test_a_row_is_replaced_in_all_three_files_and_the_others_stay(tmp_path):
    one = ["A is.", "B is."]
    table = _table(tmp_path / "t", [("fine-tuned 1x", "e2e-1x", 64.2), ("SkipDecode 3x", "e2e-all", 64.9),
                                    ("SkipDecode 5x", "e2e-5x", 65.6)],
                   {"fine-tuned 1x e2e-1x": one, "SkipDecode 3x e2e-all": ["A.", "B."], "SkipDecode 5x e2e-5x": ["x", "y"]})
    run = _table(tmp_path / "r", [("fine-tuned 1x", "e2e-1x", 64.2), ("SkipDecode 5x", "e2e-5x", 66.1)],
                 {"fine-tuned 1x e2e-1x": one, "SkipDecode 5x e2e-5x": ["A at 5x.", "B at 5x."]})
    _replace_rows()(table, run, ["SkipDecode 5x"])
    frame = pd.read_csv(tmp_path / "t.csv")
    assert list(frame["row"]) == ["fine-tuned 1x", "SkipDecode 3x", "SkipDecode 5x"]
    assert list(frame["bleu"]) == [64.2, 64.9, 66.1]
    assert json.loads((tmp_path / "t.json").read_text())[2]["bleu"] == 66.1
    lines = [json.loads(line) for line in (tmp_path / "t-outputs.jsonl").read_text().splitlines()]
    assert lines[1] == {"mr": "name[B]", "fine-tuned 1x e2e-1x": "B is.", "SkipDecode 3x e2e-all": "B.",
                        "SkipDecode 5x e2e-5x": "B at 5x."}


def test_runs_that_disagree_on_a_shared_row_change_nothing(tmp_path):
    table = _table(tmp_path / "t", [("fine-tuned 1x", "e2e-1x", 64.2), ("SkipDecode 5x", "e2e-5x", 65.6)],
                   {"fine-tuned 1x e2e-1x": ["A is.", "B is."], "SkipDecode 5x e2e-5x": ["x", "y"]})
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    run = _table(tmp_path / "r", [("fine-tuned 1x", "e2e-1x", 63.0), ("SkipDecode 5x", "e2e-5x", 66.1)],
                 {"fine-tuned 1x e2e-1x": ["A is.", "B was."], "SkipDecode 5x e2e-5x": ["a", "b"]})
    with pytest.raises(ValueError, match="not comparable"):
        _replace_rows()(table, run, ["SkipDecode 5x"])
    with pytest.raises(ValueError, match="not in both"):
        _replace_rows()(table, run, ["SkipDecode 4x"])
    assert all((tmp_path / name).read_text() == text for name, text in before.items())
