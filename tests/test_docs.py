"""The pages a visitor reads: every relative link and #anchor in README.md, docs/ and the experiments index
opens (headings turned into anchors by GitHub's rules), the pages keep their lengths, and the tree speaks of
features and dates, not of work sessions or tracker numbers a reader cannot open."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "experiments" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
TEXT = (".py", ".md", ".sh", ".c", ".txt", ".toml", ".cfg", ".yml", ".yaml", ".json", "")  # "": Makefile, .ci/run
SESSION = re.compile(r"\bsessions? [0-9]+", re.IGNORECASE)
ISSUE = re.compile(r"\bissues? #?[0-9]+", re.IGNORECASE)
UPSTREAM = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/issues/[0-9]+")


def prose(text: str) -> str:
    """The text without fenced code and inline code, where a `](x)` is not a link."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"<[^>]+>", "", heading.strip().lower()).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for line in re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M).splitlines():
        if match := HEADING.match(line):
            name = slug(match.group(2))
            found.add(name if name not in seen else f"{name}-{seen[name]}")
            seen[name] = seen.get(name, 0) + 1
    return found


def test_slugs_follow_githubs_rules():
    assert slug("llama.cpp in the bench") == "llamacpp-in-the-bench"
    assert slug("Float32 with avx512_bf16 (2026-11-27)") == "float32-with-avx512_bf16-2026-11-27"
    assert slug("4x: which `e2e` adapter, <i>rule</i>") == "4x-which-e2e-adapter-rule"


def test_every_relative_link_and_anchor_opens():
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text())):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:: not ours to check offline
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_pages_keep_their_lengths():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 180  # for a visitor; details live in docs/
    assert len((ROOT / "docs" / "speed.md").read_text().splitlines()) <= 250  # the reference; history in research/


def test_no_work_session_or_unreachable_tracker_numbers():
    """Tracked text only (git ls-files): a local checkpoint or log is not the project's to judge."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    found = []
    for name in listed.splitlines():
        path = ROOT / name
        if path.suffix not in TEXT or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if SESSION.search(line) or (ISSUE.search(line) and not UPSTREAM.search(line)):
                found.append(f"{name}:{number}: {line.strip()[:100]}")
    assert not found, "\n".join(found)
