"""`minit2i explore` in a real browser: headless Chromium (Debian's chromium and chromium-driver),
driven by Selenium, types a prompt, generates, and reads the files the page shows."""

from __future__ import annotations

import importlib.util
import io
import shutil
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from explore_server import HAVE_GRADIO, NO_GRADIO, PROMPT, read_pixels, serving, shape_and_background
from explore_server import generated_pixels as generate_command_pixels

from minit2i.explore import MAP_PATCH_PIXELS

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# No network: no background requests, updates, sync or QUIC probes; a fresh profile each run.
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
                  "--window-size=1400,2000"]
# Hang guards only: the page loads in ~5 s and a 6-step request takes ~3 s on the loaded 2-core machine.
PAGE_LIMIT_S = 120
REQUEST_LIMIT_S = 300
STEPS, STEP, BLOCK, GUIDANCE = 6, 3, 2, 2.0

pytestmark = [
    pytest.mark.skipif(not HAVE_GRADIO, reason=NO_GRADIO),
    pytest.mark.skipif(importlib.util.find_spec("selenium") is None,
                       reason='the browser tests need Selenium: pip install -e ".[browser]"'),
    pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
                       reason="the browser tests need Debian's chromium and chromium-driver packages "
                              "(apt-get install chromium chromium-driver)"),
]


@pytest.fixture(scope="module")
def page():
    """A Chromium showing a freshly started `minit2i explore`."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    with serving() as url:
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        try:
            driver.get(url)
            WebDriverWait(driver, PAGE_LIMIT_S).until(lambda d: d.find_elements(By.ID, "generate"))
            yield driver
        finally:
            driver.quit()
            shutil.rmtree(profile, ignore_errors=True)


def fill(driver, elem_id: str, value) -> None:
    """Type `value` into the page's field `elem_id`, replacing what it held."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    field = driver.find_element(By.CSS_SELECTOR, f"#{elem_id} input, #{elem_id} textarea")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.DELETE, str(value), Keys.TAB)


def generate(driver, expected: str, **fields) -> str:
    """Fill `fields`, press Generate and wait for a status line other than the last; it must start
    with `expected`. -> the status line."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def status():  # the message itself, not the progress bar drawn over it during a run
        return driver.find_element(By.CSS_SELECTOR, '#status [data-testid="markdown"]').text.strip()

    before = status()
    for elem_id, value in fields.items():
        fill(driver, elem_id, value)
    driver.find_element(By.ID, "generate").click()
    WebDriverWait(driver, REQUEST_LIMIT_S).until(lambda d: status() not in ("", before))
    assert status().startswith(expected), status()
    return status()


def shown_pixels(driver, selector: str) -> np.ndarray:
    """uint8 [H, W, 3] of the PNG file an <img> of the page shows (fetched, not a screenshot)."""
    from selenium.webdriver.common.by import By

    source = driver.find_element(By.CSS_SELECTOR, selector).get_attribute("src")
    with urllib.request.urlopen(source, timeout=60) as reply:
        return read_pixels(io.BytesIO(reply.read()))


@pytest.fixture(scope="module")
def shown(page):
    """The page after generating the demo prompt, seed 1, typed in: (driver, image pixels)."""
    generate(page, "demo, seed 1: done", prompt=PROMPT, seed=1, steps=STEPS, guidance=GUIDANCE, step=STEP,
             block=BLOCK)
    return page, shown_pixels(page, "#image img")


def test_typed_prompt_draws_generates_pixels(shown, tmp_path):
    _, image = shown
    np.testing.assert_array_equal(image, generate_command_pixels(tmp_path, "demo", STEPS, GUIDANCE))


def test_colour_words_map_is_brighter_on_the_shape(shown):
    """The heat map's brightness (the sum of its channels) is 765 times the weight over the
    page's largest (`heat_maps`), so the ratio of the shape's and the background's mean brightness
    is that of their weights, ~3.4 here (test_explore_insides measures it): more than 2 asserted."""
    driver, image = shown
    red = shown_pixels(driver, '#attention img[alt^="red:"]')
    brightness = red[::MAP_PATCH_PIXELS, ::MAP_PATCH_PIXELS].astype(int).sum(axis=-1)  # [grid_h, grid_w]
    shape, background = shape_and_background(image, image.shape[0] // brightness.shape[0])
    assert shape.sum() >= 8 and background.sum() >= 100
    assert brightness[shape].mean() > 2 * brightness[background].mean()


def test_bad_input_is_one_message_then_the_next_request_works(shown):
    driver, _ = shown
    message = generate(driver, "error: ", steps=0)
    assert "--steps must be" in message and "found 0" in message and "\n" not in message
    generate(driver, "demo, seed 2: done", seed=2, steps=STEPS)
