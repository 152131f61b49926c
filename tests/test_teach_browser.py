"""The teaching parts of the page in a real browser (Debian's chromium via playwright, against `python app.py`
with the shipped adapters): the marks and their hover, one token layer by layer with its step-through,
export then replay drawing the same page, the presentation view driven by the keyboard.

Screenshots go to test-artifacts/, or to $SKIPDECODE_SCREENSHOTS (`make screenshots`: docs/images, which
docs/teaching.md shows)."""

import json

import pytest

from app.teach import SLIDES
from appserver import app_url
from test_browser import PROMPT, REPLAY_INPUT, SERVER, SHOTS, details, run_and_wait, screenshot, \
    set_tokens

pytestmark = pytest.mark.slow
TOKENS = 24
# what replay draws again: the content of these (Gradio's own wrappers around them carry loading states)
SAME = ("#sd-skip-output .sd-output", "#sd-full-output .sd-output", "#sd-lens .sd-lens", "#sd-quality .sd-quality",
        "#sd-metrics .sd-cards")
# An element's HTML with its attributes sorted: a page that updates an element in place may keep the order
# of its old attributes, a fresh page writes them as the HTML gives them. A hover card's place is where it last
# opened (its style), not part of the page drawn.
HTML = ("(root) => { const walk = (n) => n.nodeType === 3 ? n.textContent : n.nodeType !== 1 ? '' : "
        "'<' + n.tagName + ' ' + [...n.attributes].filter((a) => !(a.name === 'style' && n.classList.contains('sd-tip')))"
        ".map((a) => a.name + '=' + a.value).sort().join(' ') + '>' "
        "+ [...n.childNodes].map(walk).join('') + '</' + n.tagName + '>'; return walk(root); }")
PLOTS = ("#sd-divergence-plot", "#sd-lens-plot", "#sd-budget-plot", "#sd-layer-plot")


def servers(fixtures):
    """For conftest.py: the page's server, for the tests with a browser (the lesson's test opens a page of its own)."""
    return [SERVER] if "browser" in fixtures else []


def open_page(browser):
    page = browser.new_page(viewport={"width": 1440, "height": 900}, accept_downloads=True)
    page.goto(app_url(**SERVER))
    page.wait_for_selector("#sd-prompt textarea", timeout=60_000)
    return page


@pytest.fixture(scope="module")
def teach(browser):
    """A page after one E2E comparison at 3x, its marks drawn."""
    page = open_page(browser)
    page.fill("#sd-prompt textarea", PROMPT)
    set_tokens(page, TOKENS)
    run_and_wait(page)
    page.wait_for_selector("#sd-skip-output .sd-marked", timeout=60_000)
    yield page
    page.close()


def test_marks_show_where_full_depth_would_choose_otherwise_and_hover_names_its_choice(teach):
    # before a token is picked, the step buttons cannot act: they say so by being disabled, and the view says why
    assert all(teach.locator(b).is_disabled() for b in ("#sd-previous-layer", "#sd-next-layer", "#sd-play",
                                                        "#sd-all-layers"))
    assert "Pick a token first" in teach.locator("#sd-lens").inner_text()
    tokens = teach.locator("#sd-skip-output .sd-marked > .sd-token")
    assert tokens.count() == TOKENS or teach.locator("#sd-skip-output .sd-token").count() > 3
    note = teach.locator("#sd-part-note").inner_text()
    agree, total = map(int, __import__("re").search(r"would choose (\d+) of SkipDecode's (\d+) tokens", note).groups())
    parted = teach.locator("#sd-skip-output .sd-part")
    assert parted.count() == total - agree and total == tokens.count()
    target = parted.first if parted.count() else tokens.first
    tip = target.locator(".sd-tip")
    assert not tip.is_visible()
    target.hover()
    tip.wait_for(state="visible", timeout=5_000)
    text = tip.inner_text()
    assert ("full depth would choose" if parted.count() else "full depth agrees") in text
    assert len(tip.locator("tr").all()) == 3  # its top alternatives, with probabilities
    teach.wait_for_timeout(300)
    box = teach.locator("#sd-skip-output").bounding_box()
    SHOTS.mkdir(parents=True, exist_ok=True)
    teach.screenshot(path=str(SHOTS / "teach-marks.png"),  # the box, and its hover card wherever the token is
                     clip={"x": box["x"] - 10, "y": box["y"] - 10, "width": min(box["width"] + 340, 1430 - box["x"]),
                           "height": box["height"] + 150})
    teach.mouse.move(0, 0)
    teach.locator("#sd-divergence-plot .js-plotly-plot .legend").wait_for(timeout=30_000)
    assert "full depth: SkipDecode's token" in teach.locator("#sd-divergence-plot").inner_text()


def test_a_clicked_token_shows_layer_by_layer_and_steps_through(teach):
    note = teach.locator("#sd-part-note").inner_text()
    first = __import__("re").search(r"first part at token (\d+)", note)
    number = int(first.group(1)) if first else 4  # tokens are counted from 1 on the page, from 0 in data-pos
    position = number - 1
    teach.locator(f"#sd-skip-output .sd-token[data-pos='{position}']").click()
    teach.wait_for_selector("#sd-lens table", timeout=120_000)
    lens = teach.locator("#sd-lens")
    assert f"Token {number} " in lens.inner_text()
    tables = lens.locator("table")
    assert tables.count() == 2 and tables.nth(0).locator("tbody tr").count() == 30
    run = tables.nth(0).locator("tbody tr:not(.sd-skipped)").count()
    assert 0 < run < 30 and tables.nth(1).locator("tbody tr.sd-skipped").count() == 0  # 3x skips; full runs all
    assert lens.get_by_text("prediction depth").count() == 2
    assert teach.locator(f"#sd-skip-output .sd-picked[data-pos='{position}']").count() == 1
    visible = lambda: tables.nth(1).locator("tbody tr:not(.sd-hidden)").count()  # noqa: E731
    teach.click("#sd-next-layer")
    teach.wait_for_function("() => document.querySelectorAll('#sd-lens table')[1]"
                            ".querySelectorAll('tbody tr:not(.sd-hidden)').length === 1", timeout=10_000)
    teach.click("#sd-next-layer")
    teach.wait_for_function("() => document.querySelectorAll('#sd-lens table')[1]"
                            ".querySelectorAll('tbody tr:not(.sd-hidden)').length === 2", timeout=10_000)
    teach.click("#sd-previous-layer")
    teach.wait_for_function("() => document.querySelectorAll('#sd-lens table')[1]"
                            ".querySelectorAll('tbody tr:not(.sd-hidden)').length === 1", timeout=10_000)
    teach.click("#sd-play")  # one layer a tick from the bottom (its stop at the top: tests/test_teach.py)
    teach.wait_for_function("() => document.querySelectorAll('#sd-lens table')[1]"
                            ".querySelectorAll('tbody tr:not(.sd-hidden)').length >= 4", timeout=20_000)
    screenshot(teach.locator("#sd-lens"), "teach-step.png")
    assert teach.locator("#sd-play").inner_text().strip() == "Pause"  # while it plays
    teach.click("#sd-play")
    teach.wait_for_function("() => document.querySelector('#sd-play').innerText.trim() === 'Play'", timeout=10_000)
    teach.wait_for_timeout(1_000)  # a tick already on its way may still add its layer
    paused = visible()
    teach.wait_for_timeout(2_000)  # three ticks' time: a paused player stays where it stands
    assert visible() == paused < 30 and teach.locator("#sd-play").inner_text().strip() == "Play"
    teach.click("#sd-all-layers")  # every layer
    teach.wait_for_function("() => document.querySelectorAll('#sd-lens table')[1]"
                            ".querySelectorAll('tbody tr:not(.sd-hidden)').length === 30", timeout=60_000)
    assert visible() == 30
    teach.locator("#sd-lens-plot .js-plotly-plot .legend").wait_for(timeout=30_000)
    screenshot(teach.locator("#sd-teach"), "teach-layers.png")


def test_export_then_replay_draws_the_same_page_without_a_model(teach, browser, tmp_path):
    downloads = []
    teach.on("download", lambda download: downloads.append(download))
    teach.click("#sd-export")
    link = teach.locator("#sd-export-file a").first
    link.wait_for(timeout=120_000)
    teach.wait_for_timeout(3_000)  # the figures' PNGs come first, one after another
    pngs = {d.suggested_filename: d for d in downloads if d.suggested_filename.endswith(".png")}
    assert set(pngs) == {f"skipdecode-{name[3:]}.png" for name in ("sd-budget-plot", "sd-layer-plot", "sd-latency-plot",
                                                                   "sd-divergence-plot", "sd-lens-plot")}
    for name, download in pngs.items():
        download.save_as(tmp_path / name)
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with teach.expect_download() as got:
        link.click()
    exported = tmp_path / "comparison.json"
    got.value.save_as(exported)
    record = json.loads(exported.read_text())
    assert record["prompt"] == PROMPT and record["seed"] == 0 and record["settings"]["max_new_tokens"] == TOKENS
    assert record["hardware"]["cpu"] and all(s["ms"] > 0 for s in record["skipdecode"]["trace"]["steps"])
    assert len(record["lens"]["skipdecode"]) == len(record["divergence"]["tokens"])
    position = int(teach.locator("#sd-position input[type=number]").input_value()) - 1  # the slider counts from 1
    teach.click("#sd-next-layer")  # a step first, so that the wait below sees All layers' answer arrive
    teach.wait_for_selector("#sd-lens .sd-now", timeout=10_000)
    teach.click("#sd-all-layers")  # as a pick draws it: every layer, none highlighted
    teach.wait_for_function("() => !document.querySelector('#sd-lens .sd-now') && !document.querySelector("
                            "'#sd-lens-plot [data-testid=status-tracker]:not(.hide)')", timeout=10_000)
    before = {selector: teach.locator(selector).evaluate(HTML) for selector in SAME}
    figures = {selector: teach.locator(selector).inner_text() for selector in PLOTS + ("#sd-part-note",)}

    fresh = open_page(browser)  # another visitor, who never ran anything
    fresh.set_input_files(REPLAY_INPUT, str(exported))
    fresh.wait_for_selector("#sd-skip-output .sd-marked", timeout=60_000)
    assert fresh.locator("#sd-headline .sd-replayed").is_visible()
    status = details(fresh)
    assert status.startswith("Replayed") and PROMPT in status
    fresh.locator(f"#sd-skip-output .sd-token[data-pos='{position}']").click()
    fresh.wait_for_selector(f"#sd-skip-output .sd-picked[data-pos='{position}']", timeout=30_000)
    for selector in PLOTS:
        fresh.locator(f"{selector} .js-plotly-plot .legend").wait_for(timeout=30_000)
    assert {selector: fresh.locator(selector).evaluate(HTML) for selector in SAME} == before
    assert {selector: fresh.locator(selector).inner_text() for selector in PLOTS + ("#sd-part-note",)} == figures
    screenshot(fresh, "teach-replay.png")
    fresh.close()


# A slide is drawn once its title is new and Gradio no longer tracks its update as pending (the chart may
# draw after the title): a key pressed before then was dropped (the flaky test's 30 s wait, on a loaded machine).
SLIDE_DRAWN = ("(last) => { const title = document.querySelector('#sd-slide h2'); return title && title.innerText !== "
               "last && !document.querySelector('#sd-slide [data-testid=status-tracker]:not(.hide), '"
               "+ '#sd-slide-plot [data-testid=status-tracker]:not(.hide)'); }")


def press(page, key: str) -> str:
    """`key` on the presentation view; the new slide's title, once it is drawn."""
    last = page.locator("#sd-slide h2").inner_text()
    page.keyboard.press(key)
    page.wait_for_function(SLIDE_DRAWN, arg=last, timeout=30_000)
    return page.locator("#sd-slide h2").inner_text()


def test_the_presentation_view_shows_one_thing_at_a_time_and_follows_the_keyboard(teach):
    teach.get_by_role("tab", name="Present").click()
    title = teach.locator("#sd-slide h2")
    title.get_by_text("SkipDecode beside full decoding").wait_for(timeout=30_000)
    teach.wait_for_function(SLIDE_DRAWN, arg="", timeout=30_000)
    assert teach.locator("#sd-slide .sd-output").count() == 2 and not teach.locator("#sd-slide-plot").is_visible()
    size = teach.locator("#sd-slide .sd-output").first.evaluate("e => parseFloat(getComputedStyle(e).fontSize)")
    assert size >= 22  # large type: the page's outputs are 15.7 px
    screenshot(teach, "present-answers.png")
    seen = [title.inner_text()]
    for _ in range(6):
        seen.append(press(teach, "ArrowRight"))
        if "layers ran" in seen[-1]:
            teach.locator("#sd-slide-plot .js-plotly-plot .legend").wait_for(timeout=30_000)
            screenshot(teach, "present-layer-map.png")
    assert len(set(seen)) == 7 and teach.locator("#sd-slide-plot").is_visible()
    assert press(teach, "ArrowLeft") == seen[-2]
    teach.get_by_role("tab", name="Compare").click()


@pytest.mark.parametrize("width, height", [(1280, 720), (1440, 900)])
def test_every_slide_fits_a_projector(teach, width, height):
    teach.set_viewport_size({"width": width, "height": height})
    try:
        teach.get_by_role("tab", name="Present").click()
        teach.locator("#sd-slide h2").wait_for(timeout=30_000)
        for _ in SLIDES:
            press(teach, "ArrowRight")
            top = teach.locator("#sd-slide h2").bounding_box()["y"]
            plot = teach.locator("#sd-slide-plot")
            if plot.is_visible():
                teach.locator("#sd-slide-plot .js-plotly-plot .xtitle").wait_for(timeout=30_000)
                axis = teach.locator("#sd-slide-plot .js-plotly-plot .xtitle").bounding_box()
                bottom = plot.bounding_box()["y"] + plot.bounding_box()["height"]
                assert axis["y"] + axis["height"] <= height and bottom <= height, teach.locator("#sd-slide h2").inner_text()
            else:
                box = teach.locator("#sd-slide").bounding_box()
                bottom = box["y"] + box["height"]
            assert 0 <= top and bottom <= height, teach.locator("#sd-slide h2").inner_text()
        screenshot(teach, f"present-{width}x{height}.png")
    finally:
        teach.get_by_role("tab", name="Compare").click()
        teach.set_viewport_size({"width": 1440, "height": 900})


def focused(page) -> str:
    return page.evaluate("() => { const e = document.activeElement; return e.dataset.pos !== undefined ? "
                         "'token ' + e.dataset.pos : (e.closest('[id]') || {}).id + ' ' + (e.type || ''); }")


def tab_to(page, what: str, most: int) -> int:
    """Tab until the focused element's description starts with `what`; how many presses it took."""
    for presses in range(1, most + 1):
        page.keyboard.press("Tab")
        if focused(page).startswith(what):
            return presses
    raise AssertionError(f"{what} is more than {most} Tab presses away (at {focused(page)})")


def overlap(a: dict, b: dict) -> bool:
    return not (a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"] or
                a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"])


def ring(page) -> bool:
    """Whether the focused control shows a focus ring at least 2 px wide (its own, or its label's)."""
    return page.evaluate("() => { const shown = (e) => e && getComputedStyle(e).outlineStyle !== 'none' && "
                         "parseFloat(getComputedStyle(e).outlineWidth) >= 2; const e = document.activeElement; "
                         "return shown(e) || shown(e.closest('label')); }")


def within(page, selector: str, bottom_of: str | None = None) -> bool:
    """Whether `selector` (down to the bottom of `bottom_of`) is inside the window."""
    top = page.locator(selector).first.bounding_box()
    low = page.locator(bottom_of).last.bounding_box() if bottom_of else top
    return top["y"] >= 0 and low["y"] + low["height"] <= page.viewport_size["height"]


def test_the_lesson_runs_by_keyboard_on_a_projector(teach):
    """At 1280x720, by keyboard alone: the family switch moves with the arrow keys, the Model list closes when
    focus leaves it, focus shows on every control used; from the results Present is one Tab away, Export the
    next and the answer the one after; a pick brings the layer view into the window with its step buttons and
    the top layer, and every step keeps the row it reveals, the buttons and the whole chart beside them in view."""
    page = teach
    page.set_viewport_size({"width": 1280, "height": 720})
    try:
        page.focus("#sd-speedup input[type=number]")
        tab_to(page, "sd-family", 4)
        assert ring(page)
        checked = "() => [...document.querySelectorAll('#sd-family input')].map((r) => r.checked)"
        page.keyboard.press("ArrowDown")
        page.wait_for_function(f"() => ({checked})()[1]", timeout=5_000)
        assert focused(page).startswith("sd-family") and ring(page)
        page.keyboard.press("ArrowUp")
        page.wait_for_function(f"() => ({checked})()[0]", timeout=5_000)
        page.keyboard.press("Tab")  # one Tab stop for the group: on to Run
        assert focused(page).startswith("sd-run") and ring(page)

        page.locator("#sd-settings").get_by_text("More settings").click()
        page.focus("#sd-model input")
        page.keyboard.press("ArrowDown")
        page.locator("#sd-model [role=listbox]").wait_for(timeout=5_000)
        page.keyboard.press("Tab")
        page.locator("#sd-model [role=listbox]").wait_for(state="detached", timeout=5_000)
        assert ring(page)  # the next control, the length slider's box
        page.locator("#sd-settings").get_by_text("More settings").click()

        page.focus("#sd-results")  # where Run leaves the focus
        page.keyboard.press("Tab")
        assert focused(page).startswith("sd-present") and ring(page)
        assert tab_to(page, "token", 3) == 2  # the answer is two Tab stops after Present: Export, then the answer
        start = int(focused(page).split()[1])
        page.keyboard.press("ArrowRight" if start < TOKENS - 1 else "ArrowLeft")
        position = int(focused(page).split()[1])
        assert position != start and ring(page)
        page.keyboard.press("Enter")
        page.wait_for_selector(f"#sd-skip-output .sd-picked[data-pos='{position}']", timeout=30_000)
        page.locator("#sd-lens .sd-part-summary").get_by_text(f"Token {position + 1} ").wait_for(timeout=30_000)
        page.wait_for_timeout(500)  # the layer view scrolls into the window
        assert within(page, "#sd-lens-controls", "#sd-lens tbody tr")  # the step buttons, layers 0-29
        assert focused(page) == f"token {position}"  # the redrawn answer keeps the focus on the pick
        card = page.locator(f"#sd-skip-output .sd-token[data-pos='{position}'] > .sd-tip")
        box = card.bounding_box()  # the focused token's hover card: inside the window, or hidden with it
        assert card.evaluate("(e) => getComputedStyle(e).visibility") == "hidden" or (
            box["y"] >= 0 and box["y"] + box["height"] <= 720)

        assert tab_to(page, "range_id", 8) <= 8  # the token slider: no chart toolbar on the way
        assert ring(page)
        page.keyboard.press("ArrowLeft" if position else "ArrowRight")  # the slider's keys pick as it moves
        moved = position - 1 if position else 1
        page.wait_for_selector(f"#sd-skip-output .sd-picked[data-pos='{moved}']", timeout=30_000)
        page.locator("#sd-lens .sd-part-summary").get_by_text(f"Token {moved + 1} ").wait_for(timeout=30_000)

        tab_to(page, "sd-next-layer", 3)
        assert ring(page)
        lens = page.locator("#sd-lens")
        for layer in range(1, 31):
            page.keyboard.press("Enter")
            page.wait_for_function("(n) => [...document.querySelectorAll('#sd-lens table')].every((t) => "
                                   "t.querySelectorAll('tbody tr:not(.sd-hidden)').length === n)", arg=layer,
                                   timeout=10_000)
            if layer == 2:  # the class is guessing: nothing names the final tokens, in the view or the chart
                legend = page.locator("#sd-lens-plot .js-plotly-plot .legend")
                page.wait_for_function("() => !document.querySelector('#sd-lens-plot .legend')?.textContent"
                                       ".includes('“')", timeout=10_000)
                assert "which token will each side choose" in lens.inner_text() and lens.locator(".sd-final").count() == 0
                assert "“" not in legend.text_content() and "Bold" not in lens.inner_text()
            if layer in (2, 15, 29):  # the row just revealed, the step buttons and the chart, all in the window
                page.wait_for_timeout(300)
                assert within(page, "#sd-next-layer") and within(page, "#sd-lens tr.sd-now"), layer
                assert within(page, "#sd-lens-plot .js-plotly-plot"), layer  # its title and legend not cut
                assert page.locator("#sd-lens").evaluate("(e) => e.scrollWidth <= e.clientWidth + 1")  # both tables
                chart = page.locator("#sd-lens-plot .js-plotly-plot").bounding_box()
                for part in (".gtitle", ".legend", ".xtitle"):
                    box = page.locator(f"#sd-lens-plot {part}").bounding_box()
                    assert chart["x"] <= box["x"] and box["x"] + box["width"] <= chart["x"] + chart["width"] + 1, part
                if layer == 15:
                    screenshot(page.locator("body"), "teach-step-1280x720.png", full=False)
        assert "Bold: the token each side finally chose" in lens.inner_text() and lens.locator(".sd-final").count() >= 2
        page.wait_for_function("() => document.querySelector('#sd-lens-plot .legend')?.textContent.includes('“')",
                               timeout=10_000)

        page.focus("#sd-present")  # Present: one key from the results, opening on its first slide at the top
        page.keyboard.press("Enter")
        page.locator("#sd-slide h2").get_by_text("SkipDecode beside full decoding").wait_for(timeout=30_000)
        page.wait_for_timeout(300)
        assert page.evaluate("() => window.scrollY") == 0 and within(page, "#sd-slide h2")
    finally:
        page.get_by_role("tab", name="Compare").click()
        page.set_viewport_size({"width": 1440, "height": 900})


def test_the_lessons_comparison_is_one_button_away_and_needs_no_model(browser):
    """"Open the lesson's comparison" replays the file docs/teaching.md quotes: its answer, its marks and its
    verdict on the screen, the prompt in its box, the results in view."""
    from app import replay, timing

    lesson = replay.read(replay.LESSON_FILE)
    found = lesson["divergence"]
    agree = sum(t["token"] == t["full_token"] for t in found["tokens"])
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    try:
        page.goto(app_url(**SERVER))
        page.wait_for_selector("#sd-prompt textarea", timeout=60_000)
        page.click("#sd-lesson")
        page.wait_for_selector("#sd-skip-output .sd-marked", timeout=30_000)
        assert page.locator("#sd-headline .sd-replayed").is_visible()
        headline = page.locator("#sd-headline .sd-verdict").inner_text()
        assert headline == timing.of(replay.comparison(lesson)).words()
        assert f"would choose {agree} of SkipDecode's {len(found['tokens'])} tokens" in \
            page.locator("#sd-part-note").inner_text()
        assert page.locator("#sd-prompt textarea").input_value() == lesson["prompt"]
        assert page.locator("#sd-present").is_enabled() and page.locator("#sd-skip-output .sd-part").count() == \
            len(found["tokens"]) - agree
        page.wait_for_timeout(500)
        assert page.locator("#sd-headline").bounding_box()["y"] >= 0
        assert page.locator("#sd-full-output .sd-token").first.bounding_box()["y"] < 720
    finally:
        page.close()


def per_token_ms(side: dict) -> float:
    steps = side["trace"]["steps"]
    return sum(step["ms"] for step in steps) / len(steps)


def test_the_lessons_file_was_recorded_on_todays_engine(teach):
    """The shipped lesson comparison (assets/lesson, `python -m app.replay`) is today's engine's: each side's time
    per decoded token is within 4x of a fresh run of the same request on this server (the median of three), so a
    file from an engine several times slower or faster fails. The same answers too, on the same precision."""
    from gradio_client import Client

    from app import replay
    from app.choices import AUTO

    lesson = replay.read(replay.LESSON_FILE)
    settings = lesson["settings"]
    client = Client(app_url(**SERVER), verbose=False)
    runs = [client.predict(lesson["prompt"], settings["speedup"], settings["max_new_tokens"], AUTO,
                           api_name="/compare") for _ in range(3)]
    for side in ("skipdecode", "full"):
        fresh = sorted(per_token_ms(run[side]) for run in runs)[1]
        recorded = per_token_ms(lesson[side])
        assert fresh / 4 <= recorded <= fresh * 4, (side, recorded, fresh)
        assert runs[0][side]["text"] == lesson[side]["text"], side
