"""The page in a real browser: Debian's headless chromium driven by playwright against `python app.py`.

Screenshots go to test-artifacts/ (look at them: they are what a visitor sees)."""

from pathlib import Path

import pytest

from appserver import ROOT, app_url

pytestmark = pytest.mark.slow
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PROMPT = ("Write one sentence describing this restaurant, using every fact: name[The Cricketers], "
          "eatType[coffee shop], customer rating[high], familyFriendly[yes], near[Express by Holiday Inn]")


@pytest.fixture(scope="module")
def page():
    if not CHROMIUM.exists():
        pytest.fail("Debian's chromium is missing: apt-get install -y chromium (.ci/run does this)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(app_url())
        page.wait_for_selector("#sd-prompt textarea", timeout=60_000)
        yield page
        browser.close()


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
    assert "batch #" in status and "interleaved" in status and "over 24 positions" in status
    quality = page.locator("#sd-quality").inner_text()
    assert "E2E references" in quality and "perplexity" in quality
    page.wait_for_timeout(800)  # let plotly finish its transitions
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT / "test-artifacts" / "compare.png"), full_page=True)


def test_kv_cache_view_shows_no_holes_for_skipdecode(page):
    page.get_by_role("tab", name="KV cache").click()
    page.click("#sd-kv-run")
    page.wait_for_selector("#sd-kv-plot .js-plotly-plot .legend", timeout=120_000)
    text = page.locator("#sd-kv-plot").inner_text()
    assert "SkipDecode: 0 holes" in text and "per-token early exit:" in text
    page.wait_for_timeout(800)
    page.screenshot(path=str(ROOT / "test-artifacts" / "kv-cache.png"), full_page=True)
    page.get_by_role("tab", name="Compare").click()


def test_an_empty_prompt_gets_a_message_not_a_crash(page):
    page.fill("#sd-prompt textarea", "   ")
    page.click("#sd-run")
    page.get_by_text("enter a prompt first").first.wait_for(timeout=30_000)
