"""The screenshot of `minit2i explore` in docs/explore.md: the page in headless Chromium after it
generated the demo prompt (run from the repository root; needs the explore and browser extras and
Debian's chromium and chromium-driver, as the page's browser tests do):

    .venv/bin/python scripts/explore_screenshot.py      # writes docs/figures/explore.png
"""

from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the page's test driver: the server, Chromium and its form filling

from explore_server import PROMPT, chromium, generate, serving

OUTPUT = ROOT / "docs" / "figures" / "explore.png"
SHOWN_WIDTH = 1000  # the figure's, small enough for the repository


def main() -> None:
    with serving() as url, chromium(url) as driver:
        generate(driver, "demo, seed 1: done", prompt=PROMPT, seed=1, steps=20, step=11, block=3)
        # The whole page, beyond the window's height: Chromium's own screenshot command.
        size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}})
    page = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
    shown = page.resize((SHOWN_WIDTH, round(page.height * SHOWN_WIDTH / page.width)), Image.LANCZOS)
    shown.quantize(256).save(OUTPUT, optimize=True)  # a page's few colours: a third of the size
    print(OUTPUT)


if __name__ == "__main__":
    main()
