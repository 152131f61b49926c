"""The standalone HTML page of a comparison (app/standalone.py), as a plain function of its record: everything in
one file (plotly.js inlined once, nothing fetched), both answers, the verdict and the figures, a verified run's
rounds, and markup in any text of the record shown as text. The browser plays it in test_replay_browser.py."""

import copy
import html
from html.parser import HTMLParser

from app import standalone
from test_teach import comparison, record  # noqa: F401 (fixtures)

EVIL = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script><a href="javascript:alert(3)">a</a>'


class Parsed(HTMLParser):
    """The page's elements and each script's text, as a browser's parser would find them."""

    def __init__(self, text: str):
        super().__init__()
        self.tags, self.scripts, self._in_script = [], [], False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def verified(record):  # noqa: F811
    """The tiny model's record as if its SkipDecode side had drafted and the full model verified (rounds from the
    marks, as app/rounds.py reads older files)."""
    out = copy.deepcopy(record)
    n = len(out["skipdecode"]["token_ids"])
    marks = ["verifier"] + [("accepted", "accepted", "replaced")[i % 3] for i in range(n - 1)]
    out.update(verified=True, verification={
        "verified": True, "draft_tokens": 3, "draft_model": "tiny", "verifier_model": "tiny", "marks": marks,
        "drafted": marks.count("accepted") + marks.count("replaced"), "accepted": marks.count("accepted"),
        "acceptance_rate": None, "verify_passes": marks.count("replaced") + 1, "passes_per_token": None,
        "draft_ms": 3.0, "verify_ms": 9.0})
    return out


def test_one_file_with_the_answers_the_verdict_and_each_figure_and_nothing_to_fetch(record):  # noqa: F811
    page = standalone.page(record)
    parsed = Parsed(page)
    slides = [attrs["data-slide"] for tag, attrs in parsed.tags if tag == "section"]
    assert slides == ["answers", "numbers", "layer map", "budget", "latency", "divergence"]
    assert sum("Plotly.newPlot" in script for script in parsed.scripts) == 4
    assert sum(len(script) > 1_000_000 for script in parsed.scripts) == 1  # plotly.js itself, once
    # nothing outside the file: no element names an address, no script loads one
    assert not [attrs for _, attrs in parsed.tags if {"src", "href"} & set(attrs)]
    for side in ("skipdecode", "full"):
        assert all(html.escape(piece) in page for piece in record[side]["pieces"])
    assert "sd-verdict" in page and "sd-part" in page and html.escape(record["prompt"]) in page


def test_a_verified_run_draws_its_rounds_and_no_divergence_figure(record):  # noqa: F811
    page = standalone.page(verified(record))
    slides = [attrs["data-slide"] for tag, attrs in Parsed(page).tags if tag == "section"]
    assert slides == ["answers", "numbers", "layer map", "budget", "latency"]
    assert "Rounds: the drafts" in page and "sd-accepted" in page and "acceptance rate" in page


def test_markup_in_the_prompt_the_answers_and_every_shown_name_is_text(record):  # noqa: F811
    bad = copy.deepcopy(record)
    bad.update(prompt=EVIL, model=EVIL, full_model=EVIL, exported=EVIL)
    bad["hardware"].update(cpu=EVIL, device=EVIL, dtype=EVIL)
    bad["skipdecode"]["pieces"][1] = bad["full"]["pieces"][1] = EVIL
    bad["texts"] = {key: EVIL for key in bad["texts"]}
    for case in (bad, verified(bad)):
        parsed = Parsed(standalone.page(case))
        assert not [tag for tag, _ in parsed.tags if tag in ("img", "a")]
        assert not [attrs for _, attrs in parsed.tags if any(name.startswith("on") for name in attrs)]
        assert not [script for script in parsed.scripts if script.strip().startswith("window.pwned")]


def test_the_file_is_named_after_the_run_like_its_json_export(record, tmp_path):  # noqa: F811
    path = standalone.write(record, str(tmp_path))
    assert path.suffix == ".html" and path.stem.startswith("skipdecode-comparison-") and path.parent == tmp_path
    assert path.read_text(encoding="utf-8") == standalone.page(record)

