"""`minit2i explore` in a real browser: headless Chromium (Debian's chromium and chromium-driver),
driven by Selenium, types a prompt, generates, and reads the files the page shows."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from explore_server import (
    CHROMEDRIVER,
    CHROMIUM,
    HAVE_GRADIO,
    NO_GRADIO,
    PROMPT,
    REQUEST_LIMIT_S,
    chromium,
    fill,
    generate,
    serving,
    shape_and_background,
    shown_pixels,
)
from explore_server import generated_pixels as generate_command_pixels

from minit2i.explore import MAP_PATCH_PIXELS

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
    with serving() as url, chromium(url) as driver:
        yield driver


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
    assert message.startswith("error: --steps") and message.endswith("found 0") and "\n" not in message
    generate(driver, "demo, seed 2: done", seed=2, steps=STEPS)


def test_a_run_shows_its_progress(shown):
    """The status line carries Gradio's progress bar while the sampler runs: "k/20 steps" appears
    after the first step and stays until the last (~1 s or more of 20 steps, polled every 50 ms)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver, _ = shown
    for elem_id, value in {"steps": 20, "step": 10, "seed": 3}.items():
        fill(driver, elem_id, value)
    driver.find_element(By.ID, "generate").click()
    tracker = '#status [data-testid="status-tracker"]'
    WebDriverWait(driver, REQUEST_LIMIT_S, poll_frequency=0.05).until(
        lambda d: "/20 steps" in d.find_element(By.CSS_SELECTOR, tracker).text)
    WebDriverWait(driver, REQUEST_LIMIT_S).until(
        lambda d: d.find_element(By.CSS_SELECTOR, '#status [data-testid="markdown"]').text == "demo, seed 3: done")
