"""The schema of a replayed trace file (app/record.py) on the record of a real comparison (tests/test_teach.py's
fixtures): a good export passes unchanged, each damaged or hostile variant is refused at once with one sentence
naming what is wrong."""

import builtins
import copy
import io
import json

import pytest

from app import record as schema
from app import replay
from test_teach import comparison, record  # noqa: F401 (fixtures)


def write(tmp_path, content) -> str:
    path = tmp_path / "trace.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def changed(record, where: str, value):
    """A deep copy of `record` with the field at dotted path `where` set to `value` (None: truncated by half;
    ...: removed)."""
    out = copy.deepcopy(record)
    *parents, last = where.split(".")
    node = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    key = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[key]
    else:
        node[key] = node[key][: len(node[key]) // 2] if value is None else value
    return out


def test_a_good_export_passes_unchanged(record, tmp_path):  # noqa: F811
    assert schema.load(write(tmp_path, record)) == json.loads(json.dumps(record))
    assert replay.read(replay.write(record, tmp_path)) == json.loads(json.dumps(record))


@pytest.mark.parametrize("where, value, named", [
    ("num_layers", "6", "num_layers: Input should be a valid integer"),
    ("num_layers", 10**9, "num_layers"),
    ("divergence.agreement", "0.5", "divergence.agreement"),
    ("skipdecode.trace.steps.0.ms", "19.0", "skipdecode.trace.steps.0.ms"),
    ("full.trace.steps.1.layers", [0, 99], "full.trace.steps.1.layers"),
    ("divergence.tokens", None, "divergence.tokens has"),
    ("lens.skipdecode", None, "lens.skipdecode has"),
    ("lens.full.2.final", None, "lens.full.2.final has"),
    ("skipdecode.pieces", None, "skipdecode.pieces has"),
    ("full.token_ids", None, "full.pieces has"),
    ("skipdecode.trace.steps", None, "skipdecode.trace.steps has"),
    ("divergence.first", 99, "divergence.first"),
    ("format", "skipdecode-studio-trace/0", "its format is not"),
    ("exported", "<h1>x</h1>", "exported"),
    ("hardware.cpu", ["<style>"], "hardware.cpu"),
    ("model", ..., "model is missing"),
    ("schedule.max_budget", 99, "schedule"),
    ("texts", {"<img>": "x"}, "texts"),
    ("settings.seed", 1.5, "settings.seed"),
    ("speedup.measured", "fast", "speedup.measured"),
])
def test_a_damaged_field_is_refused_by_name(record, tmp_path, where, value, named):  # noqa: F811
    with pytest.raises(ValueError, match=r"^[^\n]*$") as refused:
        replay.read(write(tmp_path, changed(record, where, value)))
    assert named in str(refused.value) and str(refused.value).endswith(".")


@pytest.mark.parametrize("content, says", [
    ("a page of notes, named .json", "not valid JSON"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not valid JSON"),
    ('{"format": "skipdecode-studio-trace/1"}', "is missing"),
    ("[" * 100_000, "not valid JSON (recursion limit exceeded"),  # the parser stops at its nesting limit
    ("[1, 2]", "no JSON object"),
])
def test_a_file_that_is_not_an_export_is_refused_in_one_sentence(tmp_path, content, says):
    path = write(tmp_path, content)
    with pytest.raises(ValueError, match=r"^[^\n]*$") as refused:
        schema.load(path)
    assert says in str(refused.value) and len(str(refused.value)) < 200


def test_nan_is_refused(record, tmp_path):  # noqa: F811
    text = json.dumps(changed(record, "divergence.agreement", float("nan")))
    with pytest.raises(ValueError, match="divergence.agreement: Input should be a finite number"):
        schema.load(write(tmp_path, text))


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(schema.MAX_BYTES * 3 // 2)  # 30 MB of nothing, written in no time

    def opened(*args, **kwargs):
        raise AssertionError("the file was opened")

    monkeypatch.setattr(io, "open", opened)  # what open(), Path.open and Path.read_bytes call
    monkeypatch.setattr(builtins, "open", opened)
    with pytest.raises(ValueError, match="bytes, more than the"):  # a stat, not a read
        schema.load(path)
