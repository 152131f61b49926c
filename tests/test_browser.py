"""The page in a real browser: Debian's headless chromium driven by playwright against `python app.py`.

Screenshots go to test-artifacts/, or to $SKIPDECODE_SCREENSHOTS (`make screenshots` makes docs/images
this way); look at them: they are what a visitor sees."""

import os
import re
from pathlib import Path

import pytest

from appserver import ROOT, app_url, prestart

pytestmark = pytest.mark.slow
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / (os.environ.get("SKIPDECODE_SCREENSHOTS") or "test-artifacts")
PROMPT = ("Write one sentence describing this restaurant, using every fact: name[The Cricketers], "
          "eatType[coffee shop], customer rating[high], familyFriendly[yes], near[Express by Holiday Inn]")


SERVER = dict(name="app-shipped", env={"SKIPDECODE_ADAPTERS": str(ROOT / "assets" / "adapters")})


def prestart_servers(fixtures):
    """Called by conftest.py once the tests are collected: the page's server starts loading at once."""
    if "page" in fixtures:
        prestart(**SERVER)


@pytest.fixture(scope="module")
def page():
    """The page of a server with the adapters folder the app ships: what a visitor sees (and what the
    screenshots show), the fine-tuned adapters and the Results tab's served set included."""
    if not CHROMIUM.exists():
        pytest.fail("Debian's chromium is missing: apt-get install -y chromium (.ci/run does this)")
    from playwright.sync_api import sync_playwright

    url = app_url(**SERVER)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(url)
        page.wait_for_selector("#sd-prompt textarea", timeout=60_000)
        yield page
        browser.close()


def screenshot(target, name: str) -> None:
    """`target` (a page: the whole of it; a locator: that element) as SHOTS/name, once plotly is done."""
    page = getattr(target, "page", target)
    page.mouse.move(0, 0)  # no hover label, no plotly toolbar
    page.wait_for_timeout(800)  # let plotly finish its transitions
    SHOTS.mkdir(parents=True, exist_ok=True)
    if target is page:
        page.screenshot(path=str(SHOTS / name), full_page=True)
    else:
        target.screenshot(path=str(SHOTS / name))


def errors_shown(page) -> list[str]:
    """What the page shows as an error: toasts of the error kind and "Error" badges on components."""
    page.wait_for_timeout(1500)  # a toast or badge appears after the event's answer
    toasts = page.locator(".toast-body.error")
    badges = page.get_by_text(re.compile(r"^\s*Error\s*$"))
    return [toasts.nth(i).inner_text() for i in range(toasts.count())] + \
        [badges.nth(i).inner_text() for i in range(badges.count()) if badges.nth(i).is_visible()]


def test_a_first_visit_to_every_tab_shows_guidance_not_errors(page):
    """Before any comparison (this module's first test): each tab opens, and the KV cache button says what
    to do, in the tab, with no error toast or badge; nothing the visitor did was wrong."""
    for tab in ("Batch", "KV cache", "Results", "Compare"):
        page.get_by_role("tab", name=tab).click()
        assert errors_shown(page) == [], tab
        if tab == "KV cache":
            page.click("#sd-kv-run")
            page.wait_for_selector("#sd-kv-plot .js-plotly-plot", timeout=30_000)
            assert errors_shown(page) == []
            assert "Run a comparison on the Compare tab first" in page.locator("#sd-kv-note").inner_text()
            assert "No comparison yet" in page.locator("#sd-kv-plot").inner_text()
        if tab == "Results":
            page.get_by_role("button", name="Reload results").click()
            assert errors_shown(page) == []


def test_run_streams_both_outputs_and_draws_every_plot(page):
    page.fill("#sd-prompt textarea", PROMPT)
    tokens = page.locator("#sd-max-new-tokens input[type=number]")
    tokens.fill("24")
    tokens.press("Enter")
    page.click("#sd-run")
    # Streaming: tokens show while the run is still going (the cursor marks an unfinished output).
    page.wait_for_selector("#sd-skip-output .sd-cursor .sd-token, #sd-skip-output .sd-token ~ .sd-cursor",
                           timeout=120_000)
    page.wait_for_selector("#sd-quality table", timeout=120_000)
    for side in ("#sd-skip-output", "#sd-full-output"):
        assert page.locator(f"{side} .sd-token").count() > 3
        assert page.locator(f"{side} .sd-cursor").count() == 0
    for plot, words in (("#sd-budget-plot", ["scheduled b(s)", "SkipDecode ran"]),
                        ("#sd-layer-plot", ["warm-up", "skipped", "prompt (prefill)"]),
                        ("#sd-latency-plot", ["SkipDecode", "full decoding", "ms per token"])):
        page.wait_for_selector(f"{plot} .js-plotly-plot .legend", timeout=30_000)
        text = page.locator(plot).inner_text()
        assert all(w in text for w in words), (plot, text)
    status = page.locator("#sd-status").inner_text()
    assert "batch #" in status and "interleaved" in status and re.search(r"over \d+ positions", status)
    assert "SkipDecode: e2e-all" in status and "full decoding: e2e-1x" in status  # auto: the adapters made for them
    quality = page.locator("#sd-quality").inner_text()
    assert "E2E references" in quality and "perplexity" in quality
    screenshot(page, "compare.png")
    screenshot(page.locator("#sd-layer-plot"), "layer-map.png")


SKY = "Explain in one paragraph why the sky is blue."
# The general answers' length: 32 tokens show the run, its models and its quality table; `make screenshots`
# (SKIPDECODE_SCREENSHOTS set) lets them run to 96, the paragraph the README's images show.
GENERAL_TOKENS = 96 if os.environ.get("SKIPDECODE_SCREENSHOTS") else 32


@pytest.mark.parametrize("speedup", [2, 3])
def test_a_general_prompt_runs_the_general_adapter_against_the_base_model(page, speedup):
    """What people type: "auto" gives an everyday question the general adapter for the speedup (the base
    model where none is served), full decoding by the base model beside it, and says so; the answers are
    the screenshots docs/images/general-<s>x.png."""
    from skipdecode.adapters import pick_adapter

    info, _ = pick_adapter(float(speedup), None, SKY)
    page.fill("#sd-prompt textarea", SKY)
    for field, value in (("#sd-speedup", speedup), ("#sd-max-new-tokens", GENERAL_TOKENS)):
        box = page.locator(f"{field} input[type=number]")
        box.fill(str(value))
        box.press("Enter")
    page.click("#sd-run")
    page.wait_for_selector("#sd-quality .sd-empty", timeout=60_000)  # this run's, not the last one's
    page.wait_for_selector("#sd-quality table", timeout=300_000)
    status = page.locator("#sd-status").inner_text()
    assert status.startswith("Done."), status
    assert f"SkipDecode: {info.name if info else 'SmolLM2-135M-Instruct'}" in status, status
    assert "full decoding: SmolLM2-135M-Instruct" in status, status
    quality = page.locator("#sd-quality").inner_text()
    assert "Compared against full decoding of the same prompt" in quality and "all 30 layers" in quality
    assert page.locator("#sd-skip-output .sd-token").count() > 20
    screenshot(page, f"general-{speedup}x.png")


def test_between_trained_speedups_the_preview_names_the_speedup_auto_runs(page):
    """The slider moves in steps of 0.25; no served E2E adapter is trained for 4x, so "auto" runs the nearest
    trained speedup, and the schedule preview says so before anything runs (for a general prompt it does not)."""
    from skipdecode.adapters import pick_adapter, run_speedup

    info, _ = pick_adapter(4.0, None, PROMPT)
    if info is None or 4.0 in info.speedups:
        pytest.skip("needs served E2E adapters none of which is trained for 4x")
    box = page.locator("#sd-speedup input[type=number]")
    accordion = page.get_by_text("Schedule (advanced)")
    accordion.click()  # where the preview lives
    for prompt, named in ((PROMPT, True), (SKY, False), (PROMPT, True)):
        page.fill("#sd-prompt textarea", prompt)
        box.fill("4")
        box.press("Enter")
        note = page.locator("#sd-schedule-note")
        note.get_by_text("fewer layers").wait_for(timeout=30_000)
        expected = f"runs {info.name} at {run_speedup(info, 4.0):g}×"
        page.wait_for_function("([el, text, named]) => el.innerText.includes(text) === named",
                               arg=[note.element_handle(), expected, named], timeout=30_000)
    box.fill("3")
    box.press("Enter")
    accordion.click()


def test_kv_cache_view_shows_no_holes_for_skipdecode(page):
    page.get_by_role("tab", name="KV cache").click()
    page.click("#sd-kv-run")
    page.wait_for_selector("#sd-kv-plot .js-plotly-plot .legend", timeout=120_000)
    text = page.locator("#sd-kv-plot").inner_text()
    assert "SkipDecode: 0 holes" in text and "per-token early exit:" in text
    screenshot(page, "kv-cache.png")
    page.get_by_role("tab", name="Compare").click()


def test_an_empty_prompt_gets_a_message_not_a_crash(page):
    page.fill("#sd-prompt textarea", "   ")
    page.click("#sd-run")
    page.get_by_text("enter a prompt first").first.wait_for(timeout=30_000)
    page.locator(".toast-close").first.click()  # the later screenshots show no leftover message
    page.get_by_text("enter a prompt first").first.wait_for(state="hidden", timeout=10_000)


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
    screenshot(page, "results.png")
