"""scripts/publish_space.py: what a Hugging Face Space gets, checked without the network.

On this repository: the files the app needs are sent (and the pages and images README.md, the Space's
page, links), nothing from tests, docs' results, scripts, caches or the virtual environment is, every
binary or oversized file goes through LFS, and the total stays under the budget; the Docker build context
(.dockerignore) holds the same served files. On a made-up tree: the same patterns, the checks that stop a
bad upload, and that the dry run lists exactly the files huggingface_hub's upload_folder would send.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("publish_space", ROOT / "scripts" / "publish_space.py")
publish_space = sys.modules["publish_space"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(publish_space)

NEVER_SENT = (".venv/", "tests/", "test-artifacts/", "docs/results/", "scripts/", "experiments/", "checkpoints/",
              ".git/", ".gradio/", "__pycache__/", ".egg-info/", ".pytest_cache/")
CARD = "".join(f"{key}: {json.dumps(value)}\n" for key, value in publish_space.card_fields().items())
FRONT_MATTER = "---\ntitle: t\nsdk: {sdk}\napp_file: app.py\n" + CARD.replace("{", "{{").replace("}", "}}") + "---\n# t\n"
TREE = {  # a checkout with the kinds of files a working tree collects besides the served ones
    "README.md": FRONT_MATTER.format(sdk="gradio"), "app.py": "print()\n", "requirements.txt": "gradio\n",
    "pyproject.toml": "[project]\n", "app/__init__.py": "", "app/__pycache__/studio.cpython-311.pyc": b"\0pyc",
    "skipdecode/engine.py": "", "assets/adapters/a/adapter_model.safetensors": b"\0" * 64,
    "assets/adapters/a/adapter_config.json": "{}", "assets/examples/examples.json": "{}",
    "assets/results/e2e.csv": "a\n1\n", "assets/results/bench.csv": "a\n1\n",
    "assets/results/e2e-validation.csv": "a\n1\n",  # an experiment's table: the app does not read it
    "tests/test_x.py": "", "test-artifacts/shot.png": b"\0png", ".venv/lib/site.py": "",
    "docs/results/run.json": "{}", "scripts/loadtest.py": "", "experiments/step_time.py": "",
    "checkpoints/run/state.bin": b"\0",
    "skipdecode.egg-info/PKG-INFO": "", ".git/HEAD": "ref: main\n", ".gradio/flagged/x.csv": "",
    "Dockerfile": "FROM python\n", ".dockerignore": ".git\n", "docs/app.md": "# app\n",
    "docs/images/compare.png": b"\x89PNG\0", "docs/results/e2e-validation.md": "# a validation run\n",
}
SERVED = {"README.md", ".gitattributes", "app.py", "requirements.txt", "pyproject.toml", "app/__init__.py",
          "skipdecode/engine.py", "assets/adapters/a/adapter_model.safetensors",
          "assets/adapters/a/adapter_config.json", "assets/examples/examples.json", "assets/results/e2e.csv",
          "assets/results/bench.csv", "docs/app.md", "docs/images/compare.png"}


def make_tree(root: Path, extra: dict | None = None) -> Path:
    files = {**TREE, ".gitattributes": (ROOT / ".gitattributes").read_text(), **(extra or {})}
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def paths(files) -> set[str]:
    return {f.path for f in files}


# ---- this repository ---------------------------------------------------------------------------
def test_the_space_gets_what_the_app_reads():
    from app.results import RESULTS_DIR, SOURCES
    from skipdecode.adapters.lora import available_adapters

    sent = paths(publish_space.space_files())
    code = {p.relative_to(ROOT).as_posix() for folder in ("app", "skipdecode") for p in (ROOT / folder).rglob("*")
            if p.suffix in (".py", ".c", ".h")}
    adapters = {p.relative_to(ROOT).as_posix() for info in available_adapters() for p in info.path.iterdir()
                if p.is_file()}
    tables = {(RESULTS_DIR / name).relative_to(ROOT).as_posix() for name, _ in SOURCES.values()}
    assert available_adapters() and tables
    linked = {link for link in re.findall(r"\]\(([^)#:]+)", (ROOT / "README.md").read_text())
              if (ROOT / link).is_file() and not link.startswith("docs/results/")}  # its page on the Space
    missing = ({"app.py", "README.md", "requirements.txt", ".gitattributes", "assets/examples/examples.json"}
               | code | adapters | tables | linked) - sent
    assert not missing


def test_the_space_gets_nothing_else():
    from app.results import SOURCES

    sent = paths(publish_space.space_files())
    assert not [p for p in sent if any(f"/{part}" in f"/{p}" for part in NEVER_SENT) or p.endswith(".pyc")]
    results = {p for p in sent if p.startswith("assets/results/")}
    assert results == {f"assets/results/{name}" for name, _ in SOURCES.values()}  # no experiment's files
    assert "Dockerfile" not in sent  # README.md's front matter says sdk: gradio


def test_the_space_passes_the_checks_and_fits_the_budget():
    files = publish_space.space_files()
    assert publish_space.front_matter()["app_file"] == "app.py"  # the Space starts with `python app.py`
    assert publish_space.problems(files) == []
    assert sum(f.size for f in files) < publish_space.SIZE_BUDGET
    assert all(f.lfs for f in files if f.binary or f.size > publish_space.SPACE_FILE_LIMIT)


def read_front_matter(readme: Path) -> dict:
    """README.md's front matter parsed as YAML here, not by the script's own reader."""
    import yaml

    block = re.match(r"---\n(.*?)\n---\n", readme.read_text(encoding="utf-8"), re.S)
    assert block, "README.md opens with no front matter"
    return yaml.safe_load(block.group(1))


def test_the_front_matter_holds_the_hubs_fields_and_models_pins():
    from skipdecode.models import BUNDLED_GGUF, DEFAULT_HUB_ID, HUB_GGUF_REPO, HUB_GGUF_REVISION

    meta = read_front_matter(ROOT / "README.md")
    assert set(meta) <= publish_space.CARD_KEYS, set(meta) - publish_space.CARD_KEYS  # the keys the Hub documents
    assert {DEFAULT_HUB_ID, HUB_GGUF_REPO} <= set(meta["models"]) and meta["datasets"] == ["tuetschek/e2e_nlg"]
    assert meta["tags"] and all(isinstance(tag, str) and tag == tag.lower() for tag in meta["tags"])
    assert [entry.split() for entry in meta["preload_from_hub"]] == [[HUB_GGUF_REPO, BUNDLED_GGUF, HUB_GGUF_REVISION]]
    assert meta["suggested_hardware"] in publish_space.HARDWARE and meta["sdk_version"] == "6.31.0"
    assert publish_space.card_problems(meta) == []


GOOD = publish_space.card_fields()


@pytest.mark.parametrize("change, expected", [
    ({"models": None}, "has no `models`"),
    ({"datasets": "tuetschek/e2e_nlg"}, "`datasets` must be a list of strings"),
    ({"models": ["SmolLM2"]}, "must hold Hub ids"),
    ({"preload_from_hub": [GOOD["preload_from_hub"][0].rsplit(" ", 1)[0] + " main"]}, "`preload_from_hub` must hold"),
    ({"preload_form_hub": GOOD["preload_from_hub"]}, "`preload_form_hub`, which the Hub does not document"),
    ({"suggested_hardware": "zero-a10g"}, "is not a flavor the Hub lists"),
    ({"suggested_hardware": None}, "has no `suggested_hardware`"),
])
def test_the_card_check_names_a_missing_malformed_or_unknown_field(change, expected):
    meta = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    found = publish_space.card_problems(meta)
    assert any(expected in problem for problem in found), found


def test_write_card_sets_the_fields_and_leaves_the_rest(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("---\ntitle: t\ntags:\n  - old\nsdk: gradio\n---\n# t\n\ntext\n")
    publish_space.write_card(readme, GOOD)
    written = readme.read_text()
    assert written.startswith("---\ntitle: t\ntags: ") and written.endswith("---\n# t\n\ntext\n")
    assert publish_space.card_problems(read_front_matter(readme)) == [] and "old" not in written
    publish_space.write_card(readme, GOOD)
    assert readme.read_text() == written  # a second run changes nothing


def test_zero_gpu_needs_python_310_in_the_front_matter():
    assert "ZeroGPU runs Python 3.10" in publish_space.zero_gpu_problems("zero-a10g", {"python_version": "3.11"})[0]
    assert publish_space.zero_gpu_problems("zero-a10g", {"python_version": "3.10"}) == []
    assert publish_space.zero_gpu_problems("t4-small", {"python_version": "3.11"}) == []


# ---- the patterns and the checks, on a made-up tree ------------------------------------------------
def test_the_patterns_pick_the_served_files_of_any_tree(tmp_path):
    root = make_tree(tmp_path)
    assert paths(publish_space.space_files(root)) == SERVED
    assert paths(publish_space.space_files(root, sdk="docker")) == SERVED | {"Dockerfile", ".dockerignore"}
    assert publish_space.problems(publish_space.space_files(root), root) == []


def test_the_dry_run_lists_what_upload_folder_sends(tmp_path, monkeypatch):
    """huggingface_hub's own upload_folder, stopped at the commit: the same files as the dry run."""
    import huggingface_hub.hf_api as hf_api

    root = make_tree(tmp_path)
    commits = []
    monkeypatch.setattr(hf_api, "is_xet_available", lambda: False)  # the single-commit path, easiest to stop
    monkeypatch.setattr(hf_api.HfApi, "create_repo", lambda self, *a, **k: None)
    monkeypatch.setattr(hf_api.HfApi, "_validate_yaml", lambda self, *a, **k: None)
    monkeypatch.setattr(hf_api.HfApi, "_prepare_folder_deletions", lambda self, *a, **k: [])
    monkeypatch.setattr(hf_api.HfApi, "create_commit", lambda self, **k: commits.append(k["operations"]))
    publish_space.publish("me/space", "token", "gradio", root=root)
    assert {op.path_in_repo for op in commits[0]} == paths(publish_space.space_files(root)) == SERVED
    assert publish_space.IGNORE == publish_space.patterns()[1]  # upload_folder appended to a copy only


@pytest.mark.parametrize("extra, expected", [
    ({"assets/adapters/a/weights.dat": b"\0\1\2"}, "weights.dat (binary) matches no LFS pattern"),
    ({"assets/examples/big.json": "x" * (10 * 1000 * 1000 + 1)}, "big.json (10,000,001 bytes, over"),
    ({"app.py": None}, "app.py is missing"),
    ({"README.md": FRONT_MATTER.format(sdk="static")}, "must say sdk: one of gradio, docker"),
])
def test_the_checks_stop_a_bad_upload(tmp_path, extra, expected):
    root = make_tree(tmp_path, {k: v for k, v in extra.items() if v is not None})
    for name in [k for k, v in extra.items() if v is None]:
        (root / name).unlink()
    found = publish_space.problems(publish_space.space_files(root), root)
    assert any(expected in problem for problem in found), found


def test_the_size_budget_is_checked(tmp_path, monkeypatch):
    root = make_tree(tmp_path)
    monkeypatch.setattr(publish_space, "SIZE_BUDGET", 10)
    assert "over the budget of 10" in publish_space.problems(publish_space.space_files(root), root)[0]


def test_lfs_patterns_match_like_git():
    lfs = publish_space.lfs_patterns()
    assert {"*.safetensors", "*.png", "*.jpg", "*.bin", "*.gguf", "*.pt"} <= set(lfs)
    assert publish_space.is_lfs("assets/adapters/e2e-1x/adapter_model.safetensors", lfs)
    assert publish_space.is_lfs("saved_model/variables/data", lfs) and publish_space.is_lfs("saved_model/x", lfs)
    assert not publish_space.is_lfs("app/studio.py", lfs) and not publish_space.is_lfs("safetensors.md", lfs)


# ---- the Docker build context ----------------------------------------------------------------------
def docker_ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its folders decides; `!` re-includes."""
    ignored = False
    for pattern in patterns:
        negated, pattern = pattern.startswith("!"), pattern.lstrip("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        parts = path.split("/")
        if any(re.fullmatch(regex, "/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            ignored = not negated
    return ignored


def test_the_docker_context_holds_what_is_served():
    """Every file the Space gets that the image serves is in the build context; tests, docs, scripts, experiments,
    the virtual environment, caches and the results the app does not read are not."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    served = [f.path for f in publish_space.space_files(ROOT, "gradio")
              if not f.path.startswith("docs/") and f.path != ".gitattributes"]
    assert served and not [p for p in served if docker_ignored(p, patterns)]
    context = set()
    for folder, dirs, files in os.walk(ROOT):
        here = "" if Path(folder) == ROOT else Path(folder).relative_to(ROOT).as_posix() + "/"
        dirs[:] = [d for d in dirs if not docker_ignored(here + d, patterns)  # nothing below is re-included
                   or any(p.startswith(f"!{here}{d}/") for p in patterns)]
        context |= {here + name for name in files if not docker_ignored(here + name, patterns)}
    assert context <= set(served), context - set(served)


# ---- the command line ------------------------------------------------------------------------------
class FakeApi:
    calls: list = []

    def __init__(self, token=None):
        self.calls.append(("token", token))

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


@pytest.fixture
def fake_hub(monkeypatch):
    import huggingface_hub

    FakeApi.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)  # no saved login, no $HF_TOKEN
    return FakeApi.calls


@pytest.mark.parametrize("argv, reason", [([], "no --repo"), (["--repo", "me/space"], "no token"),
                                          (["--repo", "me/space", "--token", "t", "--dry-run"], "--dry-run")])
def test_without_a_repo_or_a_token_it_is_a_dry_run(fake_hub, capsys, argv, reason):
    assert publish_space.main(argv) == 0
    out = capsys.readouterr().out
    assert f"dry run ({reason}): nothing sent" in out and "total, " in out and "hf upload " in out
    assert "adapter_model.safetensors" in out and fake_hub == []


def test_with_a_repo_and_a_token_it_creates_the_space_and_uploads(fake_hub, capsys):
    assert publish_space.main(["--repo", "me/space", "--token", "t", "--hardware", "t4-small"]) == 0
    (_, token), create, upload, hardware = fake_hub
    assert token == "t"
    assert create == ("create_repo", ("me/space",), dict(repo_type="space", space_sdk="gradio", private=False,
                                                          exist_ok=True))
    allow, ignore = publish_space.patterns("gradio")
    assert upload[0] == "upload_folder" and upload[2]["folder_path"] == str(ROOT)
    assert (upload[2]["repo_type"], upload[2]["allow_patterns"], upload[2]["ignore_patterns"]) == ("space", allow,
                                                                                                    ignore)
    assert hardware == ("request_space_hardware", ("me/space", "t4-small"), {})
    assert "published: " in capsys.readouterr().out
