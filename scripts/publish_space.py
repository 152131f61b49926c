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
"""

from __future__ import annotations

import argparse
import fnmatch
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
    "packages.txt",  # the Debian packages it installs: g++ (gcc with it), for the C kernels and the compiled step
    "pyproject.toml",
    "app.py",  # the entry point: `python app.py`
    "app/*.py",
    "skipdecode/*.py",
    "skipdecode/*.c",  # the CPU path's C kernels, built on the Space at first start (skipdecode/native.py)
    "skipdecode/*.h",  # their shared header
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
    args = parser.parse_args(argv)
    sdk = args.sdk or front_matter().get("sdk", "gradio")
    files = space_files(ROOT, sdk)
    print(report(files))
    found = problems(files)
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
