"""Screenshots of `minit2i explore`'s architecture view in a 1280-pixel window, for docs/explore.md:

    python scripts/explore_screenshots.py          # writes docs/figures/explore-architecture*.png

Three models: the demo model (its double blocks chosen), its four-step student (its prefix
chosen), and a model of seeded random weights in B/16's layout at a tiny width (patch 16, so
768 numbers a patch through the bottleneck; 128 x 128 pixels; the released B/16's own shapes at
512 x 512 are in the docs' text and tests/test_explore_architecture.py). Each is generated on the
page, then its stage clicked; the picture is the section as Chromium draws it. Needs the
`explore` and `browser` extras and Debian's chromium and chromium-driver, as the browser tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the browser tests' server and Chromium, not written twice

from explore_server import PROMPT, REQUEST_LIMIT_S, chromium, fill, generate, serving  # noqa: E402

from minit2i.core.files import write_atomically  # noqa: E402
from minit2i.core.mmjit_config import MMJIT_B16  # noqa: E402
from minit2i.core.t5_config import T5_TINY  # noqa: E402
from minit2i.demo_models import write_model  # noqa: E402

FIGURES = ROOT / "docs" / "figures"
WIDTH = 1280
# B/16's layout (patch 16, its bottleneck's place, two preamble blocks) at a width a CPU draws at once.
B16_LAYOUT = dataclasses.replace(MMJIT_B16, image_size=128, txt_input_size=T5_TINY.d_model, hidden_size=64,
                                 depth_double=2, num_heads=2, head_dim=32, pca_channels=16, prompt_length=16,
                                 cond_vec_size=64)


def shot(driver, model: str, drawn: str, steps: int, stage: str) -> bytes:
    """PNG of the architecture section after choosing `model` (waiting until the diagram's text
    holds `drawn`), generating PROMPT in `steps` steps and choosing `stage`."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    fill(driver, "model", model)
    WebDriverWait(driver, REQUEST_LIMIT_S).until(lambda d: drawn in d.find_element(By.ID, "architecture").text)
    kept = not driver.find_element(By.ID, "runs").text.strip().endswith(": 0")
    for elem_id, value in {"prompt": PROMPT, "seed": 1, "steps": steps, "step": 1, "block": 1}.items():
        fill(driver, elem_id, value)
    if kept:  # the step and block look at the page's kept run first (its status line), then Generate draws
        WebDriverWait(driver, REQUEST_LIMIT_S).until(
            lambda d: d.find_element(By.CSS_SELECTOR, '#status [data-testid="markdown"]').text.strip()
            == "step 1, block 1: from the finished run")
    generate(driver, f"{model}, seed 1: done")
    driver.find_element(By.CSS_SELECTOR, f'#architecture input[value="{stage}"]').click()
    WebDriverWait(driver, REQUEST_LIMIT_S).until(
        lambda d: "(step " in d.find_element(By.ID, "stage-about").text)
    section = driver.find_element(By.ID, "architecture-view")
    driver.execute_script("arguments[0].scrollIntoView()", section)
    return section.screenshot_as_png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        layout = Path(folder)
        write_model(layout / "transformer", layout / "t5", B16_LAYOUT, T5_TINY, seed=16)
        with serving("--model", str(layout / "transformer"), "--t5", str(layout / "t5")) as url, \
                chromium(url) as driver:
            driver.set_window_size(WIDTH, 2400)
            for name, model, drawn, steps, stage in (
                    ("explore-architecture.png", "demo", "prefix: none", 20, "double"),
                    ("explore-architecture-student.png", "demo-mf", "prefix: [1, 20,", 4, "aux_tokens"),
                    ("explore-architecture-b16.png", str(layout / "transformer"), "[1, 64, 768]", 10, "patch_embed")):
                write_atomically(args.out / name, shot(driver, model, drawn, steps, stage))
                print(args.out / name)


if __name__ == "__main__":
    main()
