"""Replaying trace files from strangers in a real browser (Debian's chromium against `python app.py`): each
damaged or hostile file gets one sentence beside the file box and changes nothing else on the page, with no
error badge and no traceback in the server's log; a good file whose every shown field holds markup replays
with that markup as text: no element of the file's on the page, no request leaves it.

All the files go through one page of the session's server (the teaching tests' one); the records are the
tiny model's of tests/test_teach.py, which the page replays as it would any export. Sharing, in the same
session: a link fills the Compare tab and runs nothing, and the standalone page plays from file:// with every
request refused, its markup inert."""

import json
import time
from urllib.parse import quote, urlparse

import pytest

from app import record as schema
from app import standalone
from app.verified import VERIFIED
from appserver import ARTIFACTS, app_url
from test_browser import REPLAY_INPUT, SERVER, details, open_settings
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


def test_a_link_fills_the_compare_tab_and_the_standalone_page_plays_with_no_network(browser, record, tmp_path):  # noqa: F811
    # (a) a link with the settings, one bad value and one unknown key: the widgets filled, nothing run
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    prompt = "Explain what a KV cache is & why <b>it</b> helps."
    page.goto(app_url(**SERVER) + "?prompt=" + quote(prompt) + "&speedup=2&max_new_tokens=33&decoding=sampling"
              "&temperature=0.35&top_k=banana&verify=1&evil=%3Cimg%3E")
    box = page.locator("#sd-prompt textarea")
    box.wait_for(timeout=60_000)
    page.wait_for_function("(p) => document.querySelector('#sd-prompt textarea').value === p", arg=prompt,
                           timeout=30_000)
    assert page.locator("#sd-speedup input[type=number]").input_value() == "2"
    assert page.locator("#sd-family").get_by_label(VERIFIED).is_checked()
    open_settings(page)
    assert page.locator("#sd-max-new-tokens input[type=number]").input_value() == "33"
    assert page.locator("#sd-decoding").get_by_label("sampling").is_checked()
    page.wait_for_timeout(1_500)  # a run would have shown its results by now
    assert not page.locator("#sd-results").is_visible()
    # Copy link gives the link of the comparison shown (the lesson's, replayed), not of the widgets
    page.click("#sd-lesson")
    page.wait_for_selector("#sd-copy-link", state="visible", timeout=30_000)
    page.click("#sd-copy-link")
    page.wait_for_function("() => document.querySelector('#sd-link textarea, #sd-link input')?.value.includes('?')",
                           timeout=10_000)
    shared = page.locator("#sd-link textarea, #sd-link input").first.input_value()
    assert shared.startswith(app_url(**SERVER) + "?prompt=Write+one+sentence") and "speedup=3" in shared
    page.close()
    # (b) the standalone page of a record with markup in its prompt and answer, every request refused
    bad = json.loads(json.dumps(record))
    bad["prompt"] = bad["skipdecode"]["pieces"][1] = '<img src=x onerror="window.pwned = 1">'
    path = standalone.write(bad, str(tmp_path))
    offline = browser.new_page(viewport={"width": 1280, "height": 720})
    url, refused = path.as_uri(), []
    offline.route("**/*", lambda route: route.continue_() if route.request.url == url else
                  (refused.append(route.request.url), route.abort()))
    offline.goto(url)
    offline.locator("#sd-figure-layer-map .main-svg").first.wait_for(timeout=30_000)  # plotly drew, from the file
    answers = offline.locator("section[data-slide=answers] .sd-output")
    assert answers.count() == 2 and "<img src=x" in answers.first.inner_text()
    assert "<img src=x" in offline.locator(".sd-prompt").inner_text()
    offline.keyboard.press("p")
    offline.keyboard.press("ArrowRight")
    assert offline.locator("section.sd-shown").get_attribute("data-slide") == "numbers"
    assert offline.evaluate("window.pwned") is None and offline.locator("img").count() == 0 and refused == []
    offline.close()
