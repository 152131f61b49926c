"""Replaying trace files from strangers in a real browser (Debian's chromium against `python app.py`): each
damaged or hostile file gets one sentence beside the file box and changes nothing else on the page, with no
error badge and no traceback in the server's log; a good file whose every shown field holds markup replays
with that markup as text: no element of the file's on the page, no request leaves it.

All the files go through one page of the session's server (the teaching tests' one); the records are the
tiny model's of tests/test_teach.py, which the page replays as it would any export."""

import json
from urllib.parse import urlparse

import pytest

from app import record as schema
from appserver import ARTIFACTS
from test_browser import REPLAY_INPUT, SERVER, details
from test_record import changed
from test_teach import comparison, record  # noqa: F401 (fixtures)
from test_teach_browser import open_page

pytestmark = pytest.mark.slow
# Markup for HTML and for Markdown: a heading, a link to script, a style that hides the page's header, images
# that fetch from outside (a documentation address, RFC 5737); every element carries the class `evil`.
EVIL = ('<h1 class="evil">H</h1><a class="evil" href="javascript:alert(1)">a</a>'
        '<style class="evil">#sd-header { display: none }</style><img class="evil" src="http://198.51.100.7/i.png">'
        ' ![evil](http://198.51.100.7/m.png) [evil](javascript:alert(2)) **bold** <b class="evil">b</b>')
SHOWN = ("#sd-status", "#sd-skip-output", "#sd-full-output", "#sd-part-note", "#sd-lens", "#sd-quality",
         "#sd-metrics", "#sd-replay-note")


def servers(fixtures):
    """For conftest.py: the page's server, for the tests with a browser."""
    return [SERVER] if "browser" in fixtures else []


@pytest.fixture(scope="module")
def replaying(browser):
    """A fresh page, and every request it makes to anywhere but this machine."""
    page = open_page(browser)
    outside = []
    page.on("request", lambda request: urlparse(request.url).hostname not in ("127.0.0.1", None)
            and outside.append(request.url))
    yield page, outside
    page.close()


def upload(page, path):
    """Replay `path` through the page's "Replay a saved comparison…" button."""
    page.set_input_files(REPLAY_INPUT, str(path))


def texts(page, selectors) -> dict:
    """Each element's text, shown or not (None where the page has no such element yet)."""
    return page.evaluate("(selectors) => Object.fromEntries(selectors.map((s) => "
                         "[s, document.querySelector(s)?.textContent ?? null]))", list(selectors))


def hostile(record, tmp_path):  # noqa: F811
    """(file, what its refusal says) for each kind of damaged or hostile file."""
    files = [("notes.json", "a page of notes", "not valid JSON"),
             ("image.json", b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "not valid JSON"),
             ("format-only.json", json.dumps({"format": schema.FORMAT}), "is missing"),
             ("nested.json", "[" * 100_000, "not valid JSON"),
             ("markup-date.json", changed(record, "exported", EVIL), "exported"),
             ("layers-string.json", changed(record, "num_layers", "6"), "num_layers"),
             ("agreement-string.json", changed(record, "divergence.agreement", "0.5"), "divergence.agreement"),
             ("ms-string.json", changed(record, "skipdecode.trace.steps.0.ms", "1.5"), "steps.0.ms"),
             ("short-divergence.json", changed(record, "divergence.tokens", None), "divergence.tokens"),
             ("short-lens.json", changed(record, "lens.full", None), "lens.full"),
             ("short-pieces.json", changed(record, "skipdecode.pieces", None), "skipdecode.pieces")]
    out = []
    for name, content, says in files:
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
        out.append((path, says))
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(schema.MAX_BYTES * 3 // 2)
    return out + [(huge, "bytes, more than the")]


def test_damaged_and_hostile_files_are_refused_in_one_sentence_and_change_nothing(replaying, record, tmp_path):  # noqa: F811
    page, outside = replaying
    log = ARTIFACTS / f"{SERVER['name']}.log"
    tracebacks = log.read_text().count("Traceback")
    before = texts(page, [selector for selector in SHOWN if selector != "#sd-replay-note"])
    for path, says in hostile(record, tmp_path):
        upload(page, path)
        note = page.locator("#sd-replay-note .sd-refused")
        note.filter(has_text=f"{path.name}: ").filter(has_text=says).wait_for(timeout=10_000)
        # the 30 MB file is refused by its size, never read: tests/test_record.py checks that without a clock
        text = note.inner_text()
        assert text.count(". ") == 0 and text.endswith("."), text  # one sentence
        assert texts(page, before) == before, path.name
        assert page.get_by_text("Error", exact=True).count() == 0, path.name
    assert log.read_text().count("Traceback") == tracebacks
    assert outside == []


def test_markup_in_every_shown_field_of_a_good_file_is_text(replaying, record, tmp_path):  # noqa: F811
    page, outside = replaying
    bad = json.loads(json.dumps(record))
    for name in ("prompt", "model", "full_model", "decoding"):
        bad[name] = EVIL
    bad["why"] = {"skipdecode": EVIL, "full": EVIL}
    bad["dtype"] = {"skipdecode": EVIL, "full": EVIL}
    bad["hardware"].update(cpu=EVIL, device=EVIL, dtype=EVIL)
    bad["skipdecode"]["pieces"][1] = bad["full"]["pieces"][1] = EVIL
    bad["texts"] = {key: EVIL for key in bad["texts"]}
    path = tmp_path / "markup.json"
    path.write_text(json.dumps(bad))
    upload(page, path)
    page.locator("#sd-headline .sd-replayed").wait_for(timeout=10_000)
    page.locator("#sd-skip-output .sd-marked").wait_for(timeout=10_000)
    assert page.locator("#sd-replay-note").inner_text() == ""
    assert page.locator("#sd-prompt textarea").input_value() == EVIL  # the replay's prompt, in its box
    page.locator(f"#sd-skip-output .sd-token[data-pos='{record['divergence']['first'] or 0}']").click()
    page.locator("#sd-lens table").first.wait_for(timeout=10_000)
    page.get_by_role("tab", name="Present").click()
    page.locator("#sd-slide .sd-output").first.wait_for(timeout=10_000)
    page.wait_for_timeout(1_000)  # anything the markup would fetch
    assert page.locator(".evil").count() == 0 and page.locator("img[src*='198.51.100.7']").count() == 0
    assert page.locator("a[href^='javascript']").count() == 0
    assert "<h1 class=" in page.locator("#sd-slide").inner_text()  # shown as text
    page.get_by_role("tab", name="Compare").click()
    assert "![evil](http://198.51.100.7/m.png)" in details(page)
    assert page.locator("#sd-header").is_visible()
    assert outside == []
