"""The page in a real browser: Debian's headless chromium driven by playwright against `python app.py`.

Screenshots go to test-artifacts/, or to $SKIPDECODE_SCREENSHOTS (`make screenshots` makes docs/images
this way); look at them: they are what a visitor sees."""

import json
import os
import re

import pytest

from appserver import ROOT, app_url

pytestmark = pytest.mark.slow
SHOTS = ROOT / (os.environ.get("SKIPDECODE_SCREENSHOTS") or "test-artifacts")
PROMPT = ("Write one sentence describing this restaurant, using every fact: name[The Cricketers], "
          "eatType[coffee shop], customer rating[high], familyFriendly[yes], near[Express by Holiday Inn]")


# The page's server: the adapters folder the app ships, on the precision a visitor's CPU gets ("auto": the 4-bit
# default, which `make screenshots` takes its pictures on), not the tests' float32 (tests/conftest.py). No test
# compares its tokens with this process's own decoding; the HTTP tests do, on the default server (appserver.py).
SERVER = dict(name="app-shipped", env={"SKIPDECODE_ADAPTERS": str(ROOT / "assets" / "adapters"),
                                       "SKIPDECODE_DTYPE": "auto"})


def servers(fixtures):
    """For conftest.py: the page's server, for the tests with a page or a browser."""
    return [SERVER] if "page" in fixtures or "browser" in fixtures else []


@pytest.fixture(scope="module")
def page(browser):
    """The page of a server with the adapters folder the app ships: what a visitor sees (and what the
    screenshots show), the fine-tuned adapters and the Results tab's served set included."""
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(app_url(**SERVER))
    page.wait_for_selector("#sd-prompt textarea", timeout=60_000)
    yield page
    page.close()


def screenshot(target, name: str, full: bool = True) -> None:
    """`target` (a page: the whole of it; a locator: that element; `full` False: what the window shows) as
    SHOTS/name, once plotly is done."""
    page = getattr(target, "page", target)
    page.mouse.move(0, 0)  # no hover label, no plotly toolbar
    page.wait_for_timeout(800)  # let plotly finish its transitions
    SHOTS.mkdir(parents=True, exist_ok=True)
    if target is page or not full:
        page.screenshot(path=str(SHOTS / name), full_page=full)
    else:
        target.screenshot(path=str(SHOTS / name))


def errors_shown(page) -> list[str]:
    """What the page shows as an error: toasts of the error kind and "Error" badges on components."""
    page.wait_for_timeout(1500)  # a toast or badge appears after the event's answer
    toasts = page.locator(".toast-body.error")
    badges = page.get_by_text(re.compile(r"^\s*Error\s*$"))
    return [toasts.nth(i).inner_text() for i in range(toasts.count())] + \
        [badges.nth(i).inner_text() for i in range(badges.count()) if badges.nth(i).is_visible()]


REPLAY_INPUT = "input[type=file][data-testid$='-upload-button']"  # "Replay a saved comparison…" opens it
JARGON = ("GGUF", "Q4_1", "Q8_1", "AVX", "VNNI", "eager step", "SKIPDECODE_")
PLACEHOLDERS = ("appears when you run", "appears here", "Waiting for")


def open_settings(page, opened: bool = True) -> None:
    """Open (or close) "More settings": the model, the length, the decoding and the schedule."""
    if page.locator("#sd-max-new-tokens").is_visible() != opened:
        page.locator("#sd-settings").get_by_text("More settings").click()
        page.locator("#sd-max-new-tokens").wait_for(state="visible" if opened else "hidden", timeout=10_000)


def set_number(page, field: str, value) -> None:
    box = page.locator(f"{field} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def set_tokens(page, tokens: int) -> None:
    open_settings(page)
    set_number(page, "#sd-max-new-tokens", tokens)
    open_settings(page, False)


def run_mark(page):
    """The mark of the run (or replay) the headline shows (keys.REVEAL_JS): each new one has its own."""
    return page.evaluate("() => document.querySelector('#sd-headline [data-reveal]')?.dataset.reveal ?? null")


def wait_for_run(page, before, timeout: int = 300_000) -> None:
    """Wait for a new run's finished comparison (its mark not `before`'s) with its layer view opened. A new run
    hides the last one's layer view, cards and charts in its first update, the one that marks it; a short
    run may be over before a poll sees them hidden, so the mark, not their hiding, says a new run began."""
    page.wait_for_function("(before) => { const mark = document.querySelector('#sd-headline [data-reveal]'); "
                           "return mark && mark.dataset.reveal !== before; }", arg=before, timeout=60_000)
    page.wait_for_selector("#sd-teach", state="visible", timeout=timeout)


def run_and_wait(page, timeout: int = 300_000) -> None:
    """Run, and wait for the finished comparison's marks (this run's: the last one's are hidden first)."""
    before = run_mark(page)
    page.click("#sd-run")
    wait_for_run(page, before, timeout)


def details(page) -> str:
    """The run's details (models, batches, schedule, timing), from their accordion, opened if closed."""
    if not page.locator("#sd-status").is_visible():
        page.locator("#sd-details").get_by_text("Details of this run").click()
    page.locator("#sd-status").wait_for(timeout=10_000)
    return page.locator("#sd-status").inner_text()


def in_view(page, selector: str) -> bool:
    box = page.locator(selector).first.bounding_box()
    size = page.viewport_size
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= size["height"]


def test_a_first_visit_to_every_tab_shows_guidance_not_errors(page):
    """Before any comparison (this module's first test): each tab opens with no error toast or badge; the
    KV cache tab says what to do, its button disabled until there is a run to show."""
    for tab in ("Batch", "KV cache", "Results", "Present", "Compare"):
        page.get_by_role("tab", name=tab).click()
        assert errors_shown(page) == [], tab
        if tab == "KV cache":
            assert page.locator("#sd-kv-run").is_disabled()
            assert "Run a comparison on the Compare tab first" in page.locator("#sd-kv-note").inner_text()
            assert not page.locator("#sd-kv-plot").is_visible()
        if tab == "Present":
            assert page.locator("#sd-next-slide").is_disabled() and page.locator("#sd-previous-slide").is_disabled()
        if tab == "Results":
            page.get_by_role("button", name="Reload results").click()
            assert errors_shown(page) == []


def test_the_first_screen_says_what_the_studio_does_and_after_run_shows_both_answers_on_a_projector(page):
    """At a projector's 1280x720: one plain sentence, the prompt and Run, no build jargon, nothing empty (at
    most two screens high, no placeholder, the results not drawn yet), the controls that cannot act yet
    disabled; Run streams both answers; after it the headline and the first line of both answers are on
    screen, focus is at the results, and Present is the next Tab stop."""
    page.set_viewport_size({"width": 1280, "height": 720})
    try:
        page.wait_for_timeout(1_000)
        text = page.evaluate("() => document.body.innerText")
        assert "answers twice" in text
        assert [word for word in JARGON if word in text] == []
        assert [words for words in PLACEHOLDERS if words in text] == []
        assert page.evaluate("() => document.documentElement.scrollHeight") <= 1440
        assert not page.locator("#sd-results").is_visible() and page.locator(".js-plotly-plot:visible").count() == 0
        assert in_view(page, "#sd-prompt textarea") and in_view(page, "#sd-run")
        assert page.locator("#sd-stop").is_disabled()
        screenshot(page, "first-screen-1280x720.png")
        page.locator("#sd-how").get_by_text("How this runs").click()  # the machinery, in plain words
        page.locator("#sd-how p").first.wait_for(state="visible", timeout=10_000)  # drawn after the click
        page.wait_for_function("() => document.querySelector('#sd-how').innerText.includes('timed')",
                               timeout=10_000)  # and its last words in (a slow machine draws it in steps)
        how = page.locator("#sd-how").inner_text()
        assert "weights" in how and "timed" in how and [w for w in JARGON if w in how] == []
        page.locator("#sd-how").get_by_text("How this runs").click()
        page.fill("#sd-prompt textarea", PROMPT)
        set_tokens(page, 24)
        # Streaming: tokens show while the run is still going (the cursor marks an unfinished output). A short
        # run on a fast CPU streams for less than a frame, which polling can miss: an observer notes every state
        # the page draws.
        page.evaluate("""() => { window.sdStreamed = false;
            const streaming = '#sd-skip-output .sd-cursor .sd-token, #sd-skip-output .sd-token ~ .sd-cursor';
            const seen = new MutationObserver(() => { const el = document.querySelector(streaming);
                if (el && el.offsetParent !== null) { window.sdStreamed = true; seen.disconnect(); } });
            seen.observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true}); }""")
        page.click("#sd-run")
        page.wait_for_function("() => window.sdStreamed", timeout=120_000)
        page.wait_for_selector("#sd-teach", state="visible", timeout=300_000)
        for side in ("#sd-skip-output", "#sd-full-output"):
            assert page.locator(f"{side} .sd-token").count() > 3
            assert page.locator(f"{side} .sd-cursor").count() == 0
        for selector in ("#sd-headline .sd-verdict", "#sd-skip-output .sd-token", "#sd-full-output .sd-token"):
            assert in_view(page, selector), selector
        assert re.search(r"(?i)faster|slower|too close to call", page.locator("#sd-headline").inner_text())
        assert [word for word in JARGON if word in page.evaluate("() => document.body.innerText")] == []
        assert page.evaluate("() => document.activeElement.id") == "sd-results"
        page.keyboard.press("Tab")
        assert page.evaluate("() => document.activeElement.id") == "sd-present"  # one key from the results
        screenshot(page.locator("body"), "answers-1280x720.png", full=False)
    finally:
        page.set_viewport_size({"width": 1440, "height": 900})


def test_export_is_two_tab_stops_from_the_results_and_one_press_downloads_the_json(page, tmp_path):
    """By keyboard after the run above: from the results, Tab reaches Present, Tab again Export, and Enter
    downloads the comparison as JSON (with every chart as PNG), no second press on a link."""
    downloads = []

    def keep(download):
        downloads.append(download)

    page.on("download", keep)
    try:
        page.evaluate("() => document.querySelector('#sd-results').focus({preventScroll: true})")
        page.keyboard.press("Tab")
        page.keyboard.press("Tab")
        assert page.evaluate("() => document.activeElement.id") == "sd-export-here"
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.querySelector('#sd-export-file a')", timeout=120_000)
        page.wait_for_timeout(3_000)  # the charts' PNGs, one after another, and the JSON
        saved = [d for d in downloads if d.suggested_filename.endswith(".json")]
        assert len(saved) == 1, [d.suggested_filename for d in downloads]
        path = tmp_path / saved[0].suggested_filename
        saved[0].save_as(path)
        data = json.loads(path.read_text())
        assert data["prompt"] == PROMPT and data["divergence"]["tokens"]
        assert any(d.suggested_filename.endswith(".png") for d in downloads)
    finally:
        page.remove_listener("download", keep)


def test_the_run_draws_every_plot_and_one_verdict(page):
    """The run above at 1440x900: both answers and the headline on screen, the plots, the headline, the card
    and the latency chart giving one verdict, the run's details, the quality table."""
    page.wait_for_selector("#sd-quality table", timeout=120_000)
    for selector in ("#sd-headline .sd-verdict", "#sd-skip-output .sd-token", "#sd-full-output .sd-token"):
        assert in_view(page, selector), selector  # at 1440x900 too: nothing to scroll
    for plot, words in (("#sd-budget-plot", ["scheduled b(s)", "SkipDecode ran"]),
                        ("#sd-layer-plot", ["warm-up", "skipped", "prompt (prefill)"]),
                        ("#sd-latency-plot", ["SkipDecode", "full decoding", "ms per decoded token"])):
        page.wait_for_selector(f"{plot} .js-plotly-plot .legend", timeout=30_000)
        text = page.locator(plot).inner_text()
        assert all(w in text for w in words), (plot, text)
    assert "token shading" in page.locator("#sd-legend").inner_text()
    agree(page, "SkipDecode")
    status = details(page)
    assert "batch #" not in status and "interleaved" in status and re.search(r"over \d+ positions", status)
    assert "SkipDecode: the e2e-all adapter" in status and "full decoding: the e2e-1x adapter" in status  # auto
    assert [word for word in JARGON if word in status] == []  # the kernels are in a fold for developers
    quality = page.locator("#sd-quality").inner_text()
    assert "E2E references" in quality and "perplexity" in quality
    screenshot(page, "compare.png")
    screenshot(page.locator("#sd-layer-plot"), "layer-map.png")


def scheduled(page) -> list[int]:
    """The budget chart's scheduled b(s), as drawn (plotly may hold it as a typed array)."""
    return page.evaluate("() => { const y = document.querySelector('#sd-budget-plot .js-plotly-plot').data"
                         ".find((t) => t.name === 'scheduled b(s)').y; return Array.from(y._inputArray || y); }")


def test_a_flat_budget_says_why_and_the_papers_decay_is_one_click_away(page):
    """The served adapter spends a flat budget: one line beside the budget chart says why (what was measured, in
    a fold), the chart draws the paper's decay beside it, and one click runs that decay (the schedule set by
    hand to it), whose chart then decays from warm-up and more layers first to fewer, never growing."""
    note = page.locator("#sd-flat-note")
    assert note.is_visible() and "flat budget" in note.inner_text() and "decaying" in note.inner_text()
    assert "the paper's decay, same average" in page.locator("#sd-budget-plot").inner_text()
    flat = scheduled(page)
    assert len(set(flat)) == 1
    try:
        before = run_mark(page)
        page.locator("#sd-paper-decay").click()
        wait_for_run(page, before)
        page.wait_for_selector("#sd-budget-plot .js-plotly-plot .legend", timeout=30_000)
        budgets = scheduled(page)
        assert budgets[0] > flat[0] > budgets[-1] and all(b <= a for a, b in zip(budgets, budgets[1:])), budgets
        assert not note.is_visible()  # the run decayed: nothing flat to explain
        assert "decay" in details(page)
    finally:  # back to the served schedule for the tests below
        open_settings(page)
        page.get_by_label("Set budgets by hand").uncheck()
        assert page.locator("#sd-horizon input[type=number]").input_value() == "0"  # the default horizon kept
        open_settings(page, False)


def agree(page, name: str) -> None:
    """The headline, the card and the latency chart's title give one verdict, from the same figures."""
    headline = page.locator("#sd-headline .sd-verdict").inner_text()
    title = page.locator("#sd-latency-plot .gtitle").text_content()
    card = page.locator("#sd-metrics .sd-card").first.inner_text()
    ratio = re.search(r"(\d+\.\d\d)×", card).group(1)
    verdict = re.search(r"faster|slower|too close to call", headline.lower()).group(0)
    assert verdict in title.lower() and (ratio in headline or verdict == "too close to call"), (headline, title, card)
    assert name in title or verdict == "too close to call"


def test_verified_decoding_is_drawn_as_rounds_of_drafts_and_verify_passes(page):
    """The verified family: the answer's marks and their legend, the draft's layers per token and the verify
    passes in the layer map and the budget plot, one verdict in the headline, the card and the latency chart,
    and slides of its own."""
    page.get_by_role("tab", name="Compare").click()
    page.fill("#sd-prompt textarea", PROMPT)
    set_tokens(page, 24)
    page.get_by_text("SkipDecode, verified").click()
    try:
        run_and_wait(page)
        assert page.locator("#sd-skip-output .sd-verified-output .sd-token").count() >= 20
        legend = page.locator("#sd-legend").inner_text()
        assert "draft accepted" in legend and "token shading" not in legend
        assert "The same answer as full decoding" in page.locator("#sd-headline").inner_text()
        for plot, words in (("#sd-layer-plot", ["verify pass", "draft: top layers, kept", "skipped by the draft"]),
                            ("#sd-budget-plot", ["draft kept", "verify pass", "the draft's budget"])):
            page.wait_for_selector(f"{plot} .js-plotly-plot .legend", timeout=30_000)
            text = page.locator(plot).inner_text()
            assert all(w in text for w in words), (plot, text)
        # the layer map's columns: each draft's layers (10 of 30 at 3x: 2 warm-up, 8 top) with the 20 skipped
        # ones as gaps; a bar for each verify pass, as many as the card counts
        columns, bars = page.evaluate("""() => { const data = document.querySelector('#sd-layer-plot .js-plotly-plot')
            .data; const z = data.find((t) => t.type === 'heatmap').z;
            const columns = z[0].map((_, c) => z.map((row) => row[c]));
            return [columns, data.filter((t) => t.legendgroup === 'pass').length]; }""")
        drafted = [c for c in columns if 2 in c or 3 in c]
        assert drafted and all(c.count(0) == 20 and c[:2] == [1, 1] for c in drafted)
        passes = page.locator("#sd-metrics .sd-card").nth(3).locator(".sd-card-value").inner_text()
        assert bars == int(passes)
        assert not page.locator("#sd-divergence-plot").is_visible()  # full depth agrees with its own answer
        agree(page, "verified")
        assert "acceptance rate" in page.locator("#sd-metrics").inner_text().lower()
        screenshot(page, "verified.png")
        screenshot(page.locator("#sd-layer-plot"), "verified-rounds.png")
        page.click("#sd-present")
        page.locator("#sd-slide h2").get_by_text("Verified decoding beside full decoding").wait_for(timeout=30_000)
        assert page.evaluate("() => window.scrollY") == 0
        titles = []
        for _ in range(3):
            page.click("#sd-next-slide")
            page.wait_for_function("(n) => document.querySelector('#sd-slide .sd-slide-note:last-child')"
                                   "?.innerText.startsWith('slide ' + n)", arg=len(titles) + 2, timeout=30_000)
            titles.append(page.locator("#sd-slide h2").inner_text())
        assert titles == ["The drafts the full model kept", "Rounds: the drafts' layers, then one verify pass",
                          "Layers per token: drafts and checks"]
        page.get_by_role("tab", name="Compare").click()
    finally:
        page.get_by_role("tab", name="Compare").click()
        page.get_by_text("SkipDecode — faster").click()


SKY = "Explain in one paragraph why the sky is blue."
# The general answers' length: 32 tokens show the run, its models and its quality table; `make screenshots`
# (SKIPDECODE_SCREENSHOTS set) lets them run to 96, the paragraph the README's images show.
GENERAL_TOKENS = 96 if os.environ.get("SKIPDECODE_SCREENSHOTS") else 32


@pytest.mark.parametrize("speedup", [2, 3, 5])
def test_a_general_prompt_runs_the_general_adapter_against_the_base_model(page, speedup):
    """What people type: "auto" gives an everyday question the general adapter for the speedup (the base
    model where none is served), full decoding by the base model beside it, and says so; the answers are
    the screenshots docs/images/general-<s>x.png. At 5x no adapter is served and the base model's answer falls
    apart: the headline says so first, and never calls it faster."""
    from skipdecode.adapters.lora import pick_adapter

    info, _ = pick_adapter(float(speedup), None, SKY)
    page.fill("#sd-prompt textarea", SKY)
    set_number(page, "#sd-speedup", speedup)
    set_tokens(page, GENERAL_TOKENS)
    run_and_wait(page)
    status = details(page)
    assert status.startswith("Done."), status
    assert f"SkipDecode: {f'the {info.name} adapter' if info else 'the base model'}" in status, status
    assert "full decoding: the base model" in status, status
    quality = page.locator("#sd-quality").inner_text()
    assert "Compared against full decoding of the same prompt" in quality and "all 30 layers" in quality
    # (at 5x, on no adapter, the skipping side may end after a few words)
    assert page.locator("#sd-skip-output .sd-token").count() > (20 if speedup < 5 else 0)
    if speedup == 5:
        verdict = page.locator("#sd-headline .sd-verdict")
        assert page.locator("#sd-headline .sd-broken").count() == 1, page.locator("#sd-headline").inner_text()
        assert "fallen apart" in verdict.inner_text() and "faster" not in verdict.inner_text().lower()
        assert in_view(page, "#sd-headline .sd-verdict")
        set_number(page, "#sd-speedup", 3)
    screenshot(page, f"general-{speedup}x.png")


def test_between_trained_speedups_the_preview_names_the_speedup_auto_runs(page):
    """The slider moves in steps of 0.25; no served E2E adapter is trained for 4x, so "auto" runs the nearest
    trained speedup, and the schedule preview says so before anything runs (for a general prompt it does not)."""
    from skipdecode.adapters.lora import pick_adapter, run_speedup

    info, _ = pick_adapter(4.0, None, PROMPT)
    if info is None or 4.0 in info.speedups:
        pytest.skip("needs served E2E adapters none of which is trained for 4x")
    box = page.locator("#sd-speedup input[type=number]")
    note = page.locator("#sd-speed-note")  # beside the slider: what a visitor must know before running
    expected = f"runs {info.name} at {run_speedup(info, 4.0):g}×"
    for prompt, named in ((PROMPT, True), (SKY, False), (PROMPT, True)):
        page.fill("#sd-prompt textarea", prompt)
        box.fill("4")
        box.press("Enter")
        if named:
            note.get_by_text(expected).wait_for(timeout=30_000)
        else:  # a question has no 4x adapter either: the note, if any, is the base model's warning
            page.wait_for_function("(text) => { const note = document.querySelector('#sd-speed-note'); "
                                   "return !note.offsetParent || !note.innerText.includes(text); }", arg=expected,
                                   timeout=30_000)
    open_settings(page)  # the schedule preview, with its note
    assert "fewer layers" in page.locator("#sd-schedule-note").inner_text()
    page.locator("#sd-preview-plot .js-plotly-plot .legend").wait_for(timeout=30_000)
    open_settings(page, False)
    box.fill("3")
    box.press("Enter")
    note.wait_for(state="hidden", timeout=30_000)


def test_kv_cache_view_shows_no_holes_for_skipdecode(page):
    page.get_by_role("tab", name="KV cache").click()
    assert page.locator("#sd-kv-run").is_enabled()  # a comparison ran
    page.click("#sd-kv-run")
    page.wait_for_selector("#sd-kv-plot .js-plotly-plot .legend", timeout=120_000)
    text = page.locator("#sd-kv-plot").inner_text()
    assert "SkipDecode: 0 holes" in text and "per-token early exit:" in text
    page.wait_for_timeout(500)
    top = page.locator("#sd-kv-plot").bounding_box()["y"]  # the chart that makes the point comes into view
    assert 0 <= top < page.viewport_size["height"] / 2, top
    screenshot(page, "kv-cache.png")
    page.get_by_role("tab", name="Compare").click()


def test_the_batch_tab_shows_progress_at_once_and_says_why_its_map_is_one_colour(page):
    """At 1280x720: Run batch says at once what is coming and draws its map's place in view; the finished map
    (the general adapter's flat budget at 3x: one colour) says why it is one colour, the outputs table below."""
    page.set_viewport_size({"width": 1280, "height": 720})
    try:
        page.get_by_role("tab", name="Batch").click()
        page.click("#sd-batch-run")
        status = page.locator("#sd-batch-status")
        status.get_by_text(re.compile(r"^(Starting…|Running…|Done\.) ")).wait_for(timeout=3_000)  # no silent seconds
        page.locator("#sd-batch-plot .js-plotly-plot").wait_for(timeout=5_000)
        status.get_by_text(re.compile(r"^Done\. ")).wait_for(timeout=300_000)
        page.wait_for_timeout(1_000)  # the last map, drawn
        title = page.locator("#sd-batch-plot .gtitle").text_content()
        cells = page.evaluate("() => { const z = document.querySelector('#sd-batch-plot .js-plotly-plot')._fullData[0].z;"
                              "return [...new Set(Array.from(z).flatMap((row) => Array.from(row))"
                              ".filter((v) => v !== null && !Number.isNaN(v)))]; }")
        assert (len(cells) == 1) == title.startswith("One colour"), (cells, title)
        assert in_view(page, "#sd-batch-plot .gtitle")
    finally:
        page.get_by_role("tab", name="Compare").click()
        page.set_viewport_size({"width": 1440, "height": 900})


STORY = "Write a long story about a dragon and a knight who become friends."


def test_stop_mid_run_says_stopped_keeps_both_answers_and_opens_present(page):
    """At 1280x720: while a 512-token run goes, Run says how far it has got and a Stop shows beside the headline;
    Stop ends the run where it stands, the headline says Stopped over both partial answers (in view), Present
    opens and Run is ready again."""
    page.set_viewport_size({"width": 1280, "height": 720})
    try:
        page.fill("#sd-prompt textarea", STORY)
        set_tokens(page, 512)
        page.click("#sd-run")
        page.wait_for_function("() => /Running… ([1-9]\\d*) of 512 tokens/.test(document.querySelector('#sd-run')"
                               ".innerText) && !document.querySelector('#sd-stop').disabled", timeout=120_000)
        assert in_view(page, "#sd-stop-here")  # a Stop where the eye is: beside the running headline
        # a long run's progress where the eye is: the running headline and both answers as they grow
        page.wait_for_function("() => document.querySelectorAll('#sd-full-output .sd-token').length > 0",
                               timeout=60_000)
        for selector in ("#sd-headline .sd-verdict", "#sd-skip-output .sd-output", "#sd-full-output .sd-output"):
            assert in_view(page, selector), selector
        assert "Running…" in page.locator("#sd-headline").inner_text()
        # Enter in the prompt while it runs starts no second run (Shift+Enter submits the box's several lines)
        joins = []
        page.on("request", lambda request: "/queue/join" in request.url and joins.append(request.url))
        page.locator("#sd-prompt textarea").press("Shift+Enter")
        page.locator("#sd-prompt textarea").press("Enter")
        page.wait_for_timeout(1_500)
        assert joins == [] and "of 512 tokens" in page.locator("#sd-run").inner_text()
        page.locator("#sd-stop-here").press("Enter")  # by keyboard: the page does not move to the button
        page.locator("#sd-headline .sd-stopped-badge").wait_for(timeout=120_000)
        page.wait_for_selector("#sd-teach", state="visible", timeout=120_000)
        headline = page.locator("#sd-headline").inner_text()
        counts = [int(n) for n in re.search(r"SkipDecode at (\d+) tokens? and full decoding at (\d+) of 512",
                                            headline).groups()]
        assert 0 < min(counts) and max(counts) < 512, headline
        for side in ("#sd-skip-output", "#sd-full-output"):
            assert page.locator(f"{side} .sd-token").count() > 0 and page.locator(f"{side} .sd-cursor").count() == 0
        for selector in ("#sd-headline .sd-verdict", "#sd-skip-output .sd-token", "#sd-full-output .sd-token"):
            assert in_view(page, selector), selector  # the stopped comparison in view, as it stands
        assert page.locator("#sd-present").is_enabled() and not page.locator("#sd-stop-here").is_visible()
        assert page.locator("#sd-run").inner_text() == "Run" and page.locator("#sd-stop").is_disabled()
        screenshot(page.locator("body"), "stopped-1280x720.png", full=False)
        assert details(page).startswith("Stopped.")
    finally:
        set_tokens(page, 24)
        page.set_viewport_size({"width": 1440, "height": 900})


def test_bad_input_after_a_run_is_one_message_beside_the_prompt_with_no_error_badges(page, tmp_path):
    """After a run, an empty or over-long prompt gets one message beside the prompt box, in view, and a file that
    is no export one beside the replay button; the page does not move to the last run's results, which stay as
    they were, with no error badge on them."""
    page.set_viewport_size({"width": 1280, "height": 720})
    try:
        before = page.locator("#sd-headline").inner_text()
        for prompt, message in (("   ", "enter a prompt first"), ("x" * 20_000, "20,000 characters long")):
            page.fill("#sd-prompt textarea", prompt)
            page.locator("#sd-prompt textarea").focus()
            page.click("#sd-run")
            page.locator("#sd-prompt-note").get_by_text(message).wait_for(timeout=120_000)
            box = page.locator("#sd-prompt textarea").bounding_box()  # a long prompt's may be taller than the window
            assert in_view(page, "#sd-prompt-note") and box["y"] + box["height"] > 0 and box["y"] < 720
            assert errors_shown(page) == [] and page.locator("#sd-headline").inner_text() == before
            assert page.locator("#sd-run").inner_text() == "Run"
        # a file that is not an export: one sentence beside its button, in view, the results as they were
        bad = tmp_path / "notes.json"
        bad.write_text("a page of notes")
        page.set_input_files(REPLAY_INPUT, str(bad))
        page.locator("#sd-replay-note .sd-refused").filter(has_text="notes.json: ").wait_for(timeout=30_000)
        assert in_view(page, "#sd-replay-note .sd-refused") and in_view(page, "#sd-replay-file")
        assert errors_shown(page) == [] and page.locator("#sd-headline").inner_text() == before
        screenshot(page.locator("body"), "refused-after-a-run-1280x720.png", full=False)
    finally:
        page.fill("#sd-prompt textarea", PROMPT)
        page.set_viewport_size({"width": 1440, "height": 900})


def test_a_phone_wide_window_has_no_sideways_scroll(page):
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        page.wait_for_timeout(500)
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    finally:
        page.set_viewport_size({"width": 1440, "height": 900})


def legend_above(plot) -> bool:
    """Whether the plot's legend sits above its plotting area, covering none of it."""
    legend, area = plot.locator(".legend").bounding_box(), plot.locator(".nsewdrag").first.bounding_box()
    return legend["y"] + legend["height"] <= area["y"] + 1


def test_results_tab_draws_the_served_frontier(page):
    """The plot draws what "auto" serves at each speedup; the shipped table's other rows (4x, which auto runs
    at 5x, and `e2e-all` at 5x, where auto runs `e2e-5x`) are experiments, which the box adds."""
    from app.results import load_table

    e2e = load_table("e2e").frame
    served = e2e[e2e["served"]]
    plot = page.locator("#sd-results-plot")
    page.get_by_role("tab", name="Results").click()
    plot.locator(".js-plotly-plot .legend").wait_for(timeout=30_000)
    entries, points = plot.locator(".legend .traces"), plot.locator(".scatterlayer .point")
    assert entries.count() <= 4 and any("served adapters" in t for t in entries.all_text_contents())
    assert legend_above(plot)
    text = plot.inner_text()
    assert all(name in text for name in served["adapter"] if name != "none"), text
    assert points.count() == len(served) and set(served["speedup"]) == {1.0, 2.0, 3.0, 5.0}
    assert page.locator("#sd-show-experiments").is_visible() == (not e2e["served"].all())
    # what people type: the shipped general-prompt table, one row a speedup, its adapters named
    general = load_table("general").frame
    table = page.locator("#sd-results-general")
    assert table.is_visible() and all(name in table.inner_text() for name in general["adapter"])
    # for people: columns named with their units, no bare ratio in the thousands, what the page runs first
    assert "perplexity vs full (×)" in table.inner_text() and "ppl_ratio" not in table.inner_text()
    assert not re.search(r"\b\d{4,}\.\d", table.inner_text())
    bench = page.locator("#sd-results-bench")
    assert "tokens per second" in bench.inner_text() and "measured_speedup" not in bench.inner_text()
    shown = bench.inner_text()
    assert shown.index("yes: one request") < shown.index("yes: requests sharing a batch") < \
        shown.index("no: measured for comparison")
    tab = page.evaluate("() => document.body.innerText")  # what shows: the Results tab (the others are hidden)
    assert ".csv" not in tab and "skipdecode eval" not in tab  # file names and commands: in folds for developers
    for table in ("#sd-results-table", "#sd-results-beams", "#sd-results-general", "#sd-results-bench"):
        assert page.locator(table).evaluate("(e) => e.querySelector('table').scrollWidth <= e.clientWidth + 2"), table
    screenshot(page, "results.png")
