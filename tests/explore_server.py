"""`minit2i explore` served from a subprocess on a free port, and a headless Chromium that drives it,
for the page's tests (test_explore*.py) and its screenshot (scripts/explore_screenshot.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image

from minit2i.cli import main

PROMPT = "a large red circle at the left on a gray background"
# The page's requests: few steps keep them fast (each ~1 s on the demo model).
STEPS, SEED = 6, 1
# Hang guards only: the server imports Gradio and starts in ~10 s on a loaded 2-core machine, the
# page loads in ~5 s, and a 6-step request takes ~3 s.
START_LIMIT_S = 180
PAGE_LIMIT_S = 120
REQUEST_LIMIT_S = 300

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# No network: no background requests, updates, sync or QUIC probes; a fresh profile each run.
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
                  "--window-size=1400,2000"]

HAVE_GRADIO = importlib.util.find_spec("gradio") is not None
NO_GRADIO = 'the explore page needs Gradio: pip install -e ".[explore]"'


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def serving(*args: str):
    """The page's URL while `minit2i explore --port P ARGS` runs (stopped afterwards)."""
    with started(*args) as (_, url):
        yield url


@contextlib.contextmanager
def started(*args: str):
    """(the server process, the page's URL) once `minit2i explore --port P ARGS` serves; the process
    is stopped afterwards if it still runs."""
    port = free_port()
    env = os.environ | {"GRADIO_ANALYTICS_ENABLED": "False"}
    server = subprocess.Popen([sys.executable, "-m", "minit2i.cli", "explore", "--port", str(port), *args],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_served(server, url)
        yield server, url
    finally:
        if server.poll() is None:
            server.terminate()
            server.communicate(timeout=60)


def wait_until_served(server: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"minit2i explore exited with {server.returncode}: {server.stderr.read()}")
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"minit2i explore did not serve {url} within {START_LIMIT_S} s")


@contextlib.contextmanager
def chromium(url: str):
    """A headless Chromium (Selenium's driver) showing the page at `url`, its Generate button drawn."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
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


def generated_pixels(tmp_path, model: str, steps: int, guidance: float, seed: int = SEED) -> np.ndarray:
    """uint8 [H, W, 3]: what `minit2i generate` writes for PROMPT."""
    output = tmp_path / f"generated-{model}-{seed}.png"
    assert main(["generate", "-p", PROMPT, "--model", model, "-s", str(seed), "--steps", str(steps),
                 "--cfg-scale", str(guidance), "-q", "-o", str(output)]) == 0
    return read_pixels(output)


def read_pixels(source) -> np.ndarray:
    """uint8 [H, W, 3] of a PNG file or file object."""
    with Image.open(source) as image:
        return np.asarray(image.convert("RGB"))


def shape_and_background(image: np.ndarray, patch: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean [grid_h, grid_w] masks of the patches wholly inside the drawn shape and wholly in the
    background: a pixel belongs to the shape when a channel is more than 40 levels from the image's
    median colour (the background fills most of the demo pictures; the shapes' colours differ from
    it by 60 levels or more in some channel, docs/demo-model.md)."""
    height, width, _ = image.shape
    median = np.median(image.reshape(-1, 3), axis=0)
    far = (np.abs(image.astype(np.int16) - median).max(axis=-1) > 40)
    patches = far.reshape(height // patch, patch, width // patch, patch).transpose(0, 2, 1, 3)
    patches = patches.reshape(height // patch, width // patch, -1)
    return patches.all(axis=-1), ~patches.any(axis=-1)
