"""The speedup a visitor reads on the page against the one the API reports, for the same request.

    python experiments/page_speedup.py            # 5 of each, interleaved, on a fresh `python app.py`

Starts the app as `make demo` serves it (the real adapters, the page's defaults) on a free 127.0.0.1 port,
then alternates: one request over the API (gradio_client), one run on the page in Debian's headless
chromium (playwright), reading the page's "measured speedup" card once the run is done. Both use the app's
example MR at 3x, 32 new tokens, greedy, model "auto". Prints each reading, the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from appserver import start  # noqa: E402
from test_browser import ARGS, CHROMIUM, PROMPT  # noqa: E402  (the page as the browser test drives it)


SPEEDUP = 3.0  # set on the page too: it starts at the speedup every kind of prompt has an adapter for


def page_run(page, tokens: int) -> float:
    page.fill("#sd-prompt textarea", PROMPT)
    for field, value in (("#sd-speedup", SPEEDUP), ("#sd-max-new-tokens", tokens)):
        box = page.locator(f"{field} input[type=number]")
        box.fill(f"{value:g}")
        box.press("Enter")
    page.evaluate("document.querySelectorAll('#sd-quality table').forEach(t => t.remove())")
    page.click("#sd-run")
    page.wait_for_selector("#sd-quality table", timeout=300_000)  # quality scores come after both runs end
    text = page.locator(".sd-card.sd-accent .sd-card-value").inner_text()
    return float(text.strip().rstrip("×"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, help="write the readings as JSON here")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 20:
        parser.error("--runs: 1..20")
    from gradio_client import Client
    from playwright.sync_api import sync_playwright

    server = start("page-speedup-server")
    api, shown = [], []
    try:
        client = Client(server.url, verbose=False)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(server.url)
            page.wait_for_selector("#sd-prompt textarea", timeout=120_000)
            for i in range(args.runs):
                result = client.predict(PROMPT, SPEEDUP, args.tokens, api_name="/compare")
                api.append(result["speedup"]["measured"])
                time.sleep(1)
                shown.append(page_run(page, args.tokens))
                print(f"run {i + 1}: API {api[-1]:.2f}x, page {shown[-1]:.2f}x", flush=True)
            browser.close()
    finally:
        server.stop()
    a, s = statistics.median(api), statistics.median(shown)
    print(f"median measured speedup: API {a:.2f}x, page {s:.2f}x; page / API = {s / a:.3f} "
          f"({args.runs} each, interleaved, {args.tokens} new tokens, {SPEEDUP:g}x, auto)")
    if args.out:
        args.out.write_text(json.dumps({"api": api, "page": shown, "api_median": a, "page_median": s,
                                        "page_over_api": round(s / a, 3)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
