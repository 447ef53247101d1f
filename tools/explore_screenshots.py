"""The screenshots of results/explore.html in docs/figures/, one a panel, taken in Chromium from disk with the network off.

    python tools/explore_screenshots.py [results/explore.html] [--out docs/figures] [--step 24]

Each panel is shown as a student finds it after moving one control: the first at step --step with the cache
(and its K/V grid again without it), the second at the page's first temperature and top-p, the third at the
page's first budget. Needs Debian's Chromium and the playwright package (pip install -e ".[test]").
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 1280  # a laptop's screen


def save_small(path: Path) -> None:
    """The screenshot in 256 colours (a page of text and flat colours loses nothing a reader sees): a third the bytes."""
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", nargs="?", default=ROOT / "results" / "explore.html", type=Path)
    parser.add_argument("--out", default=ROOT / "docs" / "figures", type=Path)
    parser.add_argument("--step", default=24, type=int, help="the step the first panel shows")
    args = parser.parse_args()
    executable = shutil.which("chromium")
    if executable is None:
        sys.exit("Chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    url = args.page.resolve().as_uri()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            context = browser.new_context(offline=True, viewport={"width": WIDTH, "height": 900})
            page = context.new_page()
            page.goto(url)
            page.wait_for_selector("body[data-ready=true]", timeout=30_000)
            page.locator("#step").fill(str(args.step))
            page.evaluate("document.activeElement.blur()")  # no focus ring in the pictures
            shots = {"explore_steps": "#steps", "explore_sampling": "#sampling", "explore_serving": "#serving"}
            for name, selector in shots.items():
                page.locator(selector).screenshot(path=args.out / f"{name}.png")
                save_small(args.out / f"{name}.png")
                print(args.out / f"{name}.png")
            page.locator("input[name=mode][value=without_cache]").check()
            page.evaluate("document.activeElement.blur()")
            page.locator("#kv-grid").screenshot(path=args.out / "explore_grid_without_cache.png")
            save_small(args.out / "explore_grid_without_cache.png")
            print(args.out / "explore_grid_without_cache.png")
        finally:
            browser.close()


if __name__ == "__main__":
    main()
