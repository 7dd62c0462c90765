"""`minit2i explore` in a real browser: headless Chromium (Debian's chromium and chromium-driver),
driven by Selenium, types a prompt, generates, and reads the files the page shows; then moves the
time axis and the block over the finished run, compares two settings and follows the panels'
links to the concepts page the server serves, and its links to the code."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from explore_server import (
    CHROMEDRIVER,
    CHROMIUM,
    HAVE_GRADIO,
    NO_GRADIO,
    PAGE_LIMIT_S,
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

# Step 4 and block 3, counted from 1 as on the page: the demo block whose image queries look at the
# colour word where the shape is drawn (tests/test_explore_insides.py, which counts from 0).
STEPS, STEP, BLOCK, GUIDANCE = 6, 4, 3, 2.0

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


def panels(driver) -> dict[str, np.ndarray]:
    """The pictures of the step panels, the colour word's map and the final image, as shown."""
    selectors = {name: f"#step-{name} img" for name in ("state", "x0", "velocity")}
    return {name: shown_pixels(driver, selector) for name, selector in
            (selectors | {"red": '#attention img[alt^="red:"]', "image": "#image img"}).items()}


def text_of(driver, selector: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector).text.strip()


def status_of(driver) -> str:
    return text_of(driver, '#status [data-testid="markdown"]')


def move_slider(driver, elem_id: str, keys: int) -> None:
    """Move the range slider `elem_id` by `keys` presses of the arrow key (right if positive)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    handle = driver.find_element(By.CSS_SELECTOR, f'#{elem_id} input[type="range"]')
    handle.send_keys(*[Keys.ARROW_RIGHT if keys > 0 else Keys.ARROW_LEFT] * abs(keys))


def marked_step(driver) -> str:
    """The caption of the x0 strip's marked picture."""
    from selenium.webdriver.common.by import By

    marked = [img.get_attribute("alt") for img in driver.find_elements(By.CSS_SELECTOR, "#x0-steps img")
              if img.get_attribute("alt").startswith("\u25b6")]
    assert len(marked) == 1, marked
    return marked[0]


def test_moving_the_time_control_looks_again_without_sampling(shown):
    """After one Generate, moving the step slider two steps on changes the x_t / x0 / velocity panels
    and the word maps, from the finished run: the line above the panels gives the new step's t
    (steps numbered from 1, t on the uniform grid of STEPS), the x0 strip marks that step and
    only it, its picture is the new x0 panel, and the page's count of sampling runs stays where it
    was, the picture too. Clicking a picture of the strip moves the slider to its step."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver, _ = shown
    for elem_id, value in {"seed": 1, "steps": STEPS, "step": STEP, "block": BLOCK}.items():
        fill(driver, elem_id, value)  # with a run kept, the selectors show its step at once
    WebDriverWait(driver, REQUEST_LIMIT_S).until(
        lambda d: status_of(d) == f"step {STEP}, block {BLOCK}: from the finished run")
    driver.find_element(By.ID, "generate").click()  # waited for by its own status: a look may land after the click
    WebDriverWait(driver, REQUEST_LIMIT_S).until(lambda d: status_of(d) == "demo, seed 1: done")
    runs = text_of(driver, "#runs")
    before = panels(driver)
    assert text_of(driver, "#step-time").startswith(f"step {STEP} of {STEPS}: t = {(STEP - 1) / STEPS:.2f}")
    assert marked_step(driver) == f"\u25b6 {STEP}: t {(STEP - 1) / STEPS:.2f}"
    move_slider(driver, "step", 2)
    WebDriverWait(driver, REQUEST_LIMIT_S).until(
        lambda d: status_of(d) == f"step {STEP + 2}, block {BLOCK}: from the finished run")
    after = panels(driver)
    for name in ("state", "x0", "velocity", "red"):
        assert not np.array_equal(before[name], after[name]), name
    np.testing.assert_array_equal(before["image"], after["image"])
    assert text_of(driver, "#runs") == runs
    t = f"{(STEP + 1) / STEPS:.2f}"
    assert text_of(driver, "#step-time").startswith(f"step {STEP + 2} of {STEPS}: t = {t}")
    assert marked_step(driver) == f"\u25b6 {STEP + 2}: t {t}"
    np.testing.assert_array_equal(after["x0"], shown_pixels(driver, '#x0-steps img[alt^="\u25b6"]'))
    fill(driver, "block", BLOCK + 1)
    WebDriverWait(driver, REQUEST_LIMIT_S).until(
        lambda d: status_of(d) == f"step {STEP + 2}, block {BLOCK + 1}: from the finished run")
    assert not np.array_equal(panels(driver)["red"], after["red"])
    driver.find_element(By.CSS_SELECTOR, '#x0-steps img[alt="step 1"]').click()
    WebDriverWait(driver, REQUEST_LIMIT_S).until(
        lambda d: status_of(d) == f"step 1, block {BLOCK + 1}: from the finished run")
    assert marked_step(driver) == "\u25b6 1: t 0.00"
    assert text_of(driver, "#runs") == runs


def test_compare_mode_shows_two_settings_side_by_side(shown):
    """The form's setting (the demo, 6 steps) on the left, the student's 4 steps on the right, for one
    prompt and seed: two labels naming them, two pictures, two strips of 6 and 4 predictions."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver, _ = shown
    fill(driver, "steps", STEPS)
    driver.find_element(By.ID, "compare").click()
    WebDriverWait(driver, REQUEST_LIMIT_S).until(
        lambda d: text_of(d, '#compare-status [data-testid="markdown"]') == "seed 1: both done")
    assert text_of(driver, "#compare-a-label").startswith(f"demo: {STEPS} steps, guidance")
    assert text_of(driver, "#compare-b-label").startswith("demo-mf: 4 steps, guidance")
    left, right = (shown_pixels(driver, f"#compare-{side} img") for side in "ab")
    assert left.shape == right.shape == (64, 64, 3) and not np.array_equal(left, right)
    assert [len(driver.find_elements(By.CSS_SELECTOR, f"#compare-{side}-steps img")) for side in "ab"] == [STEPS, 4]


def heading_in_view(driver, anchor: str) -> bool:
    """Whether the element `anchor` is drawn and its top lies inside the window (to a pixel: a
    scrolled-to heading's top may sit a fraction of a pixel above it)."""
    return driver.execute_script(
        "const e = document.getElementById(arguments[0]); if (!e) return false;"
        "const top = e.getBoundingClientRect().top; return top > -1 && top < window.innerHeight;", anchor)


def test_every_panel_links_its_concepts_section_served_by_the_page(page):
    """The what-to-look-for lines link sections of the concepts page, which the explore server serves
    itself (its figures inline, its maths rendered): each link, opened afresh, shows its section's
    heading inside the window (Gradio draws the page after the browser's own jump to the #id,
    which found nothing: the page's script jumps), and stays there once the page is drawn (1 s)."""
    import time

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    links = {a.get_attribute("href") for a in page.find_elements(By.CSS_SELECTOR, ".look-for a")}
    assert len(links) >= 4 and all("/concepts#" in link for link in links)
    home = page.current_url
    try:
        for link in sorted(links):
            page.get("about:blank")
            page.get(link)
            anchor = link.split("#")[1]
            WebDriverWait(page, PAGE_LIMIT_S).until(lambda d, anchor=anchor: heading_in_view(d, anchor))
            time.sleep(1)
            assert heading_in_view(page, anchor) and page.execute_script("return window.scrollY") > 0, anchor
        figures = page.find_elements(By.CSS_SELECTOR, "#concepts img")
        assert len(figures) >= 6 and all(page.execute_script("return arguments[0].naturalWidth", f) > 0
                                          for f in figures)
        assert page.find_elements(By.CSS_SELECTOR, "#concepts .katex") and "$$" not in text_of(page, "#concepts")
    finally:
        page.get(home)
        WebDriverWait(page, PAGE_LIMIT_S).until(lambda d: d.find_elements(By.ID, "generate"))


# Run before the page's own scripts: every inlined figure the page draws (Gradio's Markdown sets it
# as HTML) gets the address of a silent server instead (a connection that never answers), so the
# browser keeps it loading, as on a slow machine, until `releaseFigures()` gives it its picture.
HOLD_FIGURES = """
(() => {
  const html = Object.getOwnPropertyDescriptor(Element.prototype, "innerHTML");
  const held = [];
  Object.defineProperty(Element.prototype, "innerHTML", {configurable: true, get: html.get, set(text) {
    html.set.call(this, typeof text !== "string" ? text : text.replace(/src="(data:image\\/png[^"]*)"/g,
      (_, data) => `src="SILENT/${held.push(data) - 1}.png"`));
  }});
  window.releaseFigures = () => {
    for (const figure of document.querySelectorAll("img[src^='SILENT/']")) {
      figure.src = held[parseInt(figure.getAttribute("src").slice("SILENT/".length))];
    }
  };
})();
"""


def document_top(driver, element_id: str) -> float:
    """Where the element's top lies in the page (not the window), in CSS pixels."""
    return driver.execute_script("return document.getElementById(arguments[0]).getBoundingClientRect().top"
                                 " + window.scrollY", element_id)


def test_a_section_link_lands_right_while_the_figures_above_it_load_late(page):
    """The link to the deepest section a panel links, opened while every figure of the concepts
    page is still loading (held by HOLD_FIGURES, as a slow machine would hold them): each figure
    already takes its place (its width and height given, the CSS height its width times the
    figure's proportions, to a pixel), the heading is in the window, and once the figures come
    the heading has not moved in the page (to a pixel) and is still in the window. The figures
    used to come without a size: each arriving one pushed the heading down, out of the window
    once the page's script had stopped jumping (after 5 s; on a machine at load 4-5)."""
    import socket

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from minit2i.explore_tutor import LOOK_FOR, concepts_dir, concepts_sections

    sections = concepts_sections((concepts_dir() / "concepts.md").read_text())
    anchor = sections[max(section for _, section in LOOK_FOR.values())][1]
    home = page.current_url
    figures = "#concepts img"
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never accepts: a request that never ends
        source = HOLD_FIGURES.replace("SILENT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        script = page.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": source})["identifier"]
        try:
            page.get("about:blank")
            page.get(f"{home}concepts#{anchor}")
            WebDriverWait(page, PAGE_LIMIT_S).until(lambda d: heading_in_view(d, anchor) and len(
                d.find_elements(By.CSS_SELECTOR, f"{figures}[src^='http://127.0.0.1']")) >= 6)
            held = page.execute_script(
                "return [...document.querySelectorAll(arguments[0])].map(f => [f.naturalWidth, f.width, f.height,"
                " +f.getAttribute('width'), +f.getAttribute('height')])", figures)
            assert all(natural == 0 for natural, *_ in held), held  # none has come yet
            for _, width, height, given_width, given_height in held:
                assert given_width > 0 and height > 0 and abs(height - width * given_height / given_width) <= 1, held
            before = document_top(page, anchor)
            page.execute_script("releaseFigures()")
            WebDriverWait(page, PAGE_LIMIT_S).until(lambda d: d.execute_script(
                "return [...document.querySelectorAll(arguments[0])].every(f => f.complete && f.naturalWidth > 0)",
                figures))
            assert abs(document_top(page, anchor) - before) <= 1 and heading_in_view(page, anchor)
        finally:
            page.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script})
            page.get(home)
            WebDriverWait(page, PAGE_LIMIT_S).until(lambda d: d.find_elements(By.ID, "generate"))


def test_a_link_to_code_opens_the_function_it_names(page):
    """The concepts page's link to `sample` opens the server's page of reference/sampler.py with the
    line `def sample(` inside the window."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    home = page.current_url
    try:
        page.get(home + "concepts")
        WebDriverWait(page, PAGE_LIMIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#concepts a"))
        link = page.find_element(By.CSS_SELECTOR, '#concepts a[href$="code/reference/sampler.py#sample"]')
        page.get(link.get_attribute("href"))
        WebDriverWait(page, PAGE_LIMIT_S).until(lambda d: heading_in_view(d, "sample"))
        line = page.execute_script("return document.getElementById('sample').parentElement.textContent")
        assert "def sample(" in line
    finally:
        page.get(home)
        WebDriverWait(page, PAGE_LIMIT_S).until(lambda d: d.find_elements(By.ID, "generate"))


def stage_clicked(driver, key: str, caption: str) -> str:
    """Click the architecture's stage `key` and wait for the line under its output to start with
    `caption` -> that line.

    The click is dispatched to the stage's radio input itself: a pointer click goes to the
    element's centre measured a moment before, and on a loaded machine the panels' pictures still
    loading above it can move the diagram in between, so that the click lands beside the stage
    (the full suite lost a choice twice, waiting out the hang guard; the cause is not proven). A
    choice not answered within a third of the guard is made again, through another stage first
    (choosing the chosen stage changes nothing): the page must answer one of three."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def choose(value):
        stage = driver.find_element(By.CSS_SELECTOR, f'#architecture input[value="{value}"]')
        driver.execute_script("arguments[0].click();", stage)

    for attempt in range(3):
        choose(key)
        try:
            WebDriverWait(driver, REQUEST_LIMIT_S / 3).until(lambda d: text_of(d, "#stage-about").startswith(caption))
            return text_of(driver, "#stage-about")
        except TimeoutException:
            if attempt == 2:
                raise
            choose("patch_embed" if key != "patch_embed" else "x0")


def test_the_architecture_draws_each_stage_with_its_shape_and_shows_its_output(page):
    """At 1280 px: the diagram's ten stages, each labelled with its shape for this run (the demo's
    config at 64 x 64, STEPS steps), the text path beside the image path and the joint stages
    across both; a click on a stage shows its output at the chosen step and block (the state and
    x0 as the step panels show them, a patch map of 16 x 16 patches for the double block's image
    tokens), with links to its concepts section and to its function's code page, which opens there."""
    import urllib.request

    from selenium.webdriver.common.by import By

    from minit2i.demo_models import DEMO_MODELS
    from minit2i.explore_architecture import PATCH_PIXELS, stage_choices
    from minit2i.pipeline import open_model

    page.set_window_size(1280, 2000)
    generate(page, "demo, seed 1: done", prompt=PROMPT, seed=1, steps=STEPS, step=STEP, block=BLOCK)
    config = open_model(*DEMO_MODELS["demo"][:2]).mmjit.config
    labels = page.find_elements(By.CSS_SELECTOR, "#architecture label")
    assert [label.text for label in labels] == [text for text, _ in stage_choices(config, 64, 64, STEPS)]
    assert "patch embed + bottleneck: [1, 256, 48] -> [1, 256, 32] -> [1, 256, 128]" in labels[5].text
    boxes = [label.rect for label in labels]
    frame = page.find_element(By.ID, "architecture").rect
    assert all(frame["x"] <= b["x"] and b["x"] + b["width"] <= frame["x"] + frame["width"] + 1 for b in boxes)
    assert boxes[0]["x"] + boxes[0]["width"] <= boxes[4]["x"] and boxes[6]["width"] > 1.8 * boxes[0]["width"]
    assert stage_clicked(page, "state", f"the state x_t step {STEP} starts from (step {STEP}, block {BLOCK})")
    np.testing.assert_array_equal(shown_pixels(page, "#stage-output img"), shown_pixels(page, "#step-state img"))
    stage_clicked(page, "x0", "the guided x0 the step moves towards")
    np.testing.assert_array_equal(shown_pixels(page, "#stage-output img"), shown_pixels(page, "#step-x0 img"))
    about = stage_clicked(page, "double", f"double block {BLOCK}'s image tokens")
    assert shown_pixels(page, "#stage-output img").shape == (16 * PATCH_PIXELS, 16 * PATCH_PIXELS, 3)
    links = [a.get_attribute("href") for a in page.find_elements(By.CSS_SELECTOR, "#stage-about a")]
    assert "concepts 4" in about and links[0].endswith("/concepts#h-4-the-text-encoder-and-joint-attention")
    assert links[1].endswith("/code/reference/mmjit.py#double_block")
    with urllib.request.urlopen(links[1].split("#")[0], timeout=30) as reply:
        assert 'id="double_block"' in reply.read().decode()


def test_the_strip_captions_are_whole_at_1280_px(page):
    """Twenty steps, ten pictures a row in a 1280-px window: no caption of the x0 strip is cut
    (its text fits its box), the chosen step's with its t included."""
    from selenium.webdriver.common.by import By

    page.set_window_size(1280, 2000)
    # seed 2: a status line other than the kept run's, which `generate` waits to see replaced
    generate(page, "demo, seed 2: done", seed=2, steps=20, step=11, block=BLOCK)
    captions = page.find_elements(By.CSS_SELECTOR, "#x0-steps .caption-label")
    assert len(captions) == 20 and "\u25b6 11: t 0.50" in [c.text for c in captions]
    cut = [c.text for c in captions if page.execute_script(
        "return arguments[0].scrollWidth > arguments[0].clientWidth + 1", c)]
    assert cut == []


def test_the_students_velocity_panel_says_average_velocity_and_its_prefix_is_drawn(page):
    """demo-mf: the velocity panel's label and line say it is the average velocity over the step,
    and the architecture draws the student's prefix of 20 tokens in front of the 16 words."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    fill(page, "model", "demo-mf")
    WebDriverWait(page, REQUEST_LIMIT_S).until(lambda d: text_of(d, '#architecture input[value="aux_tokens"] + span')
                                               .startswith("the student's prefix: [1, 20, "))
    for elem_id, value in {"seed": 1, "steps": 4, "step": 2, "block": BLOCK}.items():
        fill(page, elem_id, value)  # with a run kept, the selectors look at it first
    WebDriverWait(page, REQUEST_LIMIT_S).until(
        lambda d: status_of(d) == f"step 2, block {BLOCK}: from the finished run")
    generate(page, "demo-mf, seed 1: done")
    assert text_of(page, '#step-velocity [data-testid="block-label"]') == "the average velocity over the step"
    assert text_of(page, "#velocity-look").startswith("The student's step: its move over the step's length")
    stage_clicked(page, "aux_tokens", "each token (a row) by feature")
    assert shown_pixels(page, "#stage-output img").shape[0] == 20 * 3
    fill(page, "model", "demo")
    WebDriverWait(page, REQUEST_LIMIT_S).until(lambda d: text_of(d, '#architecture input[value="aux_tokens"] + span')
                                               == "the student's prefix: none: a base model")


def test_the_concepts_pages_links_to_other_docs_pages_land_on_them(page):
    """The served concepts page links the docs pages it names at the server's own routes, and the
    one for the sampler shows that page, its links to code answered too."""
    import urllib.request

    from selenium.webdriver.common.by import By

    from minit2i.explore_tutor import concepts_dir
    from selenium.webdriver.support.ui import WebDriverWait

    home = page.current_url
    try:
        page.get(home.rstrip("/") + "/concepts")
        WebDriverWait(page, PAGE_LIMIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#concepts a"))
        hrefs = {a.get_attribute("href").split("#")[0].rsplit("/", 1)[1]
                 for a in page.find_elements(By.CSS_SELECTOR, "#concepts a") if "/code/" not in a.get_attribute("href")}
        assert {"sampler", "reading-guide", "model", "demo-model", "exercises"} <= hrefs
        title = (concepts_dir() / "sampler.md").read_text().splitlines()[0].lstrip("# ")
        page.get(page.find_element(By.CSS_SELECTOR, '#concepts a[href="sampler"]').get_attribute("href"))
        WebDriverWait(page, PAGE_LIMIT_S).until(
            lambda d: title in "".join(e.text for e in d.find_elements(By.ID, "docs-sampler")))
        code = [a.get_attribute("href") for a in page.find_elements(By.CSS_SELECTOR, "#docs-sampler a")
                if "/code/" in a.get_attribute("href")]
        assert code
        with urllib.request.urlopen(code[0].split("#")[0], timeout=30) as reply:
            assert reply.status == 200 and 'id="L1"' in reply.read().decode()
    finally:
        page.get(home)
        WebDriverWait(page, PAGE_LIMIT_S).until(lambda d: d.find_elements(By.ID, "generate"))
