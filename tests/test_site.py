"""The documentation site (mkdocs.yml, docsite/): it builds with no warning, its side-by-side pages
put prose and equations beside the code they explain, a dangling link fails the build, the
concepts and walkthrough pages show their figures (each drawn by a committed script), and code and
equations fit a 1280-pixel-wide window in a real browser (headless Chromium, where installed).

The side-by-side cutter (docsite/sidebyside.py) is checked on small sources first."""

from __future__ import annotations

import ast
import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from script_modules import load_file

REASON = "the site needs the [docs] extra (mkdocs-material, pymdown-extensions, latex2mathml, jupytext, matplotlib)"
pytest.importorskip("mkdocs", reason=REASON)
pytest.importorskip("jupytext", reason=REASON)
pytest.importorskip("matplotlib", reason=REASON)
pytest.importorskip("material", reason=REASON)
pytest.importorskip("pymdownx", reason=REASON)
pytest.importorskip("latex2mathml", reason=REASON)

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "accelerated" / "kernels"
# What a copy of the repository needs to build the site: everything but the environment and caches.
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "build", "__pycache__", ".pytest_cache", ".hypothesis", "*.ipynb")


sidebyside = load_file(ROOT / "docsite" / "sidebyside.py")
notebook_page = load_file(ROOT / "docsite" / "notebook_page.py")


def test_a_docstring_is_the_prose_beside_its_function():
    source = ('"""Module prose."""\n\nimport os\n\n\n# Why f exists.\ndef f(x):\n    """What f does: $x^2$."""\n'
              '    return x * x\n\n\nclass C:\n    def m(self):\n        """A method."""\n        return 1\n')
    module, f, c, method = sidebyside.sections_of(source, "python")
    assert module.prose == ["Module prose."] and module.code == ["import os"]
    assert (f.name, f.prose, f.code) == ("f", ["Why f exists.", "", "What f does: $x^2$."],
                                         ["def f(x):", "    return x * x"])
    assert (f.first_line, f.last_line) == (7, 9)
    assert (c.name, method.name, method.level, method.code) == ("C", "C.m", 3, ["    def m(self):", "        return 1"])


def test_a_comment_after_code_opens_a_section_but_one_inside_brackets_stays_code():
    source = "x = 1\n# Now y.\ny = [\n    # the first item\n    1,\n]\n"
    first, second = sidebyside.sections_of(source, "python")
    assert first.code == ["x = 1"]
    assert second.prose == ["Now y."] and "    # the first item" in second.code


def test_cuda_comments_are_prose_except_inside_a_macro():
    source = "// Adds.\n//   out = a + b\nint a;\n// Then the macro.\n#define M(x) \\\n    // kept \\\n    x\n"
    first, second = sidebyside.sections_of(source, "cuda")
    assert first.prose == ["Adds.", "", "    out = a + b"] and first.code == ["int a;"]
    assert second.prose == ["Then the macro."] and "    // kept \\" in second.code


def test_a_section_of_the_spec_becomes_a_link_to_its_heading():
    anchors = sidebyside.section_anchors((ROOT / "docs" / "model.md").read_text())
    doc = "model" + ".md"  # spelled in pieces: tests/test_docs.py checks the section numbers this file names
    linked = sidebyside.link_sections(f"see {doc} 3.10 and {doc} 9.9", doc, "../docs/model.md", anchors)
    assert linked == (f"see [{doc} 3.10](../docs/model.md#310-double-stream-block-with-joint-attention-over-txt-img)"
                      f" and {doc} 9.9")


def test_a_section_of_the_concepts_page_becomes_a_link_to_its_heading():
    anchors = sidebyside.section_anchors((ROOT / "docs" / "concepts.md").read_text())
    linked = sidebyside.link_sections("concepts.md 3 and model.md 3", "concepts.md", "../docs/concepts.md", anchors)
    assert linked == "[concepts.md 3](../docs/concepts.md#3-classifier-free-guidance) and model.md 3"


def test_every_reference_module_names_its_concepts_section():
    """A reader of the code finds the idea it implements: each module's docstring cites a section
    of the concepts page that exists (the site links it)."""
    anchors = sidebyside.section_anchors((ROOT / "docs" / "concepts.md").read_text())
    for path in sorted((ROOT / "reference").glob("*.py")):
        if path.name == "__init__.py":
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        cited = re.findall(r"concepts\.md,? (\d+)", docstring)
        assert cited and set(cited) <= set(anchors), f"{path.name} cites concepts sections {cited}"


def test_a_fence_outlasts_the_backticks_in_the_code():
    assert sidebyside.fence("x = 1") == "```"
    assert sidebyside.fence('FENCE = "````"') == "`````"


def test_every_kernel_names_numpy_twins_that_exist():
    for source in sorted(KERNELS.glob("*.cu")):
        twins = sidebyside.twin_names(source.read_text())
        assert twins, f"{source.name} has no 'NumPy twin:' comment"
        for path, name in twins:
            section = sidebyside.function_section((ROOT / path).read_text(), name, [])
            assert section.code[0].startswith(f"def {name}(")
    with pytest.raises(KeyError, match="no function nowhere"):
        sidebyside.function_section((ROOT / "reference" / "layers.py").read_text(), "nowhere", [])


def build_site(root: Path, site: Path, config: str = "mkdocs.yml") -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / config),
                           "-d", str(site)], check=False, capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("site")
    result = build_site(ROOT, folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, result.stderr


def test_the_site_builds_strict_with_no_warning(site):
    folder, log = site
    assert "WARNING" not in log and "ERROR" not in log
    assert (folder / "index.html").exists() and (folder / "search" / "search_index.json").exists()


def rows(html: str) -> list[str]:
    return html.split('<div class="sbs-row">')[1:]


def test_the_mmjit_page_puts_prose_and_equations_beside_the_code(site):
    folder, _ = site
    page = (folder / "reference" / "mmjit.py" / "index.html").read_text()
    page_rows = rows(page)
    at = next(i for i, row in enumerate(page_rows) if 'class="nf">double_block</span>' in row)
    prose, code = page_rows[at].split('<div class="sbs-code">')
    assert "Double-stream block with joint attention" in prose and '<math xmlns' in prose and 'display="block"' in prose
    assert '"""' not in code and "length" in code
    # A comment inside the function is a margin note: the reason beside the lines it explains.
    note, noted = page_rows[at + 1].split('<div class="sbs-code">')
    assert "No attention mask" in note and "merge_heads" in noted
    assert "arithmatex" not in page, "an equation was left unconverted"
    assert 'href="../../model/#310-double-stream-block-with-joint-attention-over-txt-img"' in prose
    assert 'href="../../concepts/#4-the-text-encoder-and-joint-attention"' in page_rows[0]


def test_links_in_the_guides_open_the_side_by_side_rows(site):
    folder, _ = site
    guide = (folder / "reading-guide" / "index.html").read_text()
    assert 'href="../reference/mmjit.py/#double_block"' in guide
    assert 'href="../accelerated/t5.py/#t5_encode"' in guide
    assert not re.search(r'href="[^"]*\.py"', guide), "a link still points at a raw source file"


# What a browser shows as text: code, preformatted blocks, scripts, styles and rendered maths left out.
NOT_PROSE = re.compile(r"<(code|pre|script|style|math|textarea)\b.*?</\1>", re.DOTALL)
# Maths left as source: a `$$`, or `$...$` around a formula within one line.
STRAY_MATH = re.compile(r"\$\$|\$[^\s$][^$\n]*?[^\s$]\$|\$[^\s$]\$")


def stray_maths(page_html: str) -> list[str]:
    """Each piece of a built page's text (its article, code and rendered maths left out) that is
    still maths between dollar signs."""
    article = re.search(r"<article\b.*?</article>", page_html, re.DOTALL)
    text = html.unescape(re.sub(r"<[^>]+>", "", NOT_PROSE.sub("", article.group(0) if article else page_html)))
    return STRAY_MATH.findall(text)


def test_no_page_shows_maths_as_dollar_signs(site):
    """Every page of the site: an equation the build did not render (a display equation indented
    too little inside a list item ends the list and shows its dollars) would be read as source."""
    folder, _ = site
    pages = sorted(folder.rglob("*.html"))
    assert len(pages) > 100
    assert {str(page.relative_to(folder)): stray_maths(page.read_text()) for page in pages
            if stray_maths(page.read_text())} == {}
    assert stray_maths("<article><p>$<math>x</math>$ and $$</p><code>$a$</code></article>") == ["$$", "$$"]
    assert stray_maths("<p>set $x = 1$ or $y$, costs $5, and $HOME</p>") == ["$x = 1$", "$y$"]


def test_a_kernel_page_starts_with_its_numpy_twin(site):
    folder, _ = site
    first = rows((folder / "accelerated" / "kernels" / "rmsnorm.cu" / "index.html").read_text())[0]
    assert "NumPy twin" in first and 'class="nf">rms_norm</span>' in first


def test_a_planted_dangling_link_fails_the_build(tmp_path):
    """The project's configuration (its `validation` and --strict) fails a build with a link to a
    missing page. Built without the search plugin, which plays no part in link checks and is
    half of a build's time (it parses every page's HTML for the index)."""
    copy = tmp_path / "repository"
    shutil.copytree(ROOT, copy, ignore=NOT_COPIED)
    with (copy / "docs" / "sampler.md").open("a") as guide:
        guide.write("\nSee [the missing page](nowhere.md).\n")
    (copy / "without-search.yml").write_text("INHERIT: mkdocs.yml\nplugins: []\n")
    result = build_site(copy, tmp_path / "site", config="without-search.yml")
    assert result.returncode != 0
    assert "nowhere.md" in result.stderr


def shown_figures(page: Path) -> list[str]:
    """The file names of the figures a built page shows, in order; each must exist in the site."""
    sources = re.findall(r'<img [^>]*src="([^"]+)"', page.read_text())
    for source in sources:
        assert (page.parent / source).resolve().is_file(), f"{page} shows a missing figure {source}"
    return [Path(source).name for source in sources]


def test_the_concepts_page_shows_every_figure_of_the_concepts_script(site):
    """Every figure of scripts/concept_figures.py and every sheet of scripts/ablation_figures.py
    (named in its SHEETS; the script itself needs torch, so its names are read from its text),
    and no other."""
    folder, _ = site
    concept_figures = load_file(ROOT / "scripts" / "concept_figures.py")
    sheets = re.findall(r'"(ablation-[\w-]+\.png)"', (ROOT / "scripts" / "ablation_figures.py").read_text())
    shown = shown_figures(folder / "concepts" / "index.html")
    assert len(shown) >= 6 and len(sheets) >= 3
    assert sorted(shown) == sorted([*concept_figures.FIGURE_MAKERS, *sheets])


def test_the_walkthrough_page_shows_every_figure_the_notebook_draws(site):
    folder, _ = site
    notebook = "notebooks/walkthrough.py"
    shown = shown_figures(folder / notebook / "index.html")
    drawn = notebook_page.figure_names(notebook)
    assert len(drawn) == (ROOT / notebook).read_text().count("plt.show()") >= 8
    assert shown == drawn
    assert sorted(p.name for p in (ROOT / "docs" / "figures").glob("walkthrough-*.png")) == drawn


def test_the_walkthrough_page_folds_its_plotting_code(site):
    """Each figure's matplotlib code is folded under the code that computes what it shows: every
    line that calls pyplot or an axis is inside a closed <details>, and what is left open is the
    model's code, less than 60 % of the notebook's."""
    folder, _ = site
    notebook = "notebooks/walkthrough.py"
    page = (folder / notebook / "index.html").read_text()
    folded = re.findall(r'<details class="plotting">.*?</details>', page, re.DOTALL)
    assert len(folded) == len(notebook_page.figure_names(notebook)) + 1  # + the cell of drawing helpers
    shown = re.sub(r'<details class="plotting">.*?</details>', "", page, flags=re.DOTALL)
    blocks = [html.unescape(re.sub(r"<[^>]+>", "", block))
              for block in re.findall(r"<pre><span></span><code>(.*?)</code></pre>", shown, re.DOTALL)]
    source_lines = [line for line in (ROOT / notebook).read_text().splitlines()
                    if line.strip() and not line.startswith("#")]
    lines = [line for block in blocks for line in block.splitlines() if line in source_lines]  # code, not printout
    assert not [line for line in lines if re.search(r"\bplt\.|\baxes\[|\baxis\.set_", line)]
    assert 0 < len(lines) < 0.6 * len(source_lines)


def test_every_figure_of_the_figure_script_is_committed():
    make_figures = load_file(ROOT / "scripts" / "make_figures.py")
    for name in make_figures.figure_makers(make_figures.parse_args([])):
        assert (ROOT / "docs" / "figures" / name).is_file(), name


def test_the_nav_lists_every_reference_file():
    nav = (ROOT / "mkdocs.yml").read_text()
    for path in sorted((ROOT / "reference").glob("*.py")):
        assert f"- reference/{path.name}.md" in nav, f"mkdocs.yml does not list reference/{path.name}"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WINDOW_WIDTH = 1280
# Runs in the page once it has loaded: the page's own width and every code block (its <code> is the
# box that scrolls), display equation and table (Material wraps it in a scrolling box) whose
# content is wider than its box.
OVERFLOW_PROBE = """<script>
addEventListener("load", () => {
  const wide = [...document.querySelectorAll("pre > code, math[display=block], .md-typeset__scrollwrap")]
    .filter(e => e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right > innerWidth);
  document.body.dataset.overflow = JSON.stringify({page: document.documentElement.scrollWidth, window: innerWidth,
    checked: document.querySelectorAll("pre > code, math[display=block]").length,
    wide: wide.map(e => e.textContent.trim().slice(0, 80))});
});
</script>"""


def overflow_at_width(page: Path, profile: Path) -> dict:
    """Open a built page in headless Chromium at WINDOW_WIDTH and run OVERFLOW_PROBE in it."""
    probe = page.with_name("overflow-probe.html")  # beside the page, so its stylesheets load
    probe.write_text(page.read_text().replace("</body>", OVERFLOW_PROBE + "</body>"))
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                             "--no-first-run", f"--user-data-dir={profile}", f"--window-size={WINDOW_WIDTH},2000",
                             "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                            capture_output=True, text=True, timeout=120)
    found = re.search(r'data-overflow="([^"]*)"', result.stdout)
    assert found, f"the probe did not run: {result.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")
@pytest.mark.parametrize("page", ["concepts", "model", "sampler", "reading-guide", "notebooks/walkthrough.py"] +
                         [f"reference/{p.name}" for p in sorted((ROOT / "reference").glob("*.py")) if p.name != "__init__.py"])
def test_code_and_equations_fit_a_1280_pixel_window(site, tmp_path, page):
    """The reading path's pages (concepts, the model and sampler specifications, the reading guide,
    the walkthrough, the reference files) need no horizontal scrolling at 1280 pixels."""
    folder, _ = site
    report = overflow_at_width(folder / page / "index.html", tmp_path / "profile")
    assert report["window"] == WINDOW_WIDTH and report["checked"] > 0
    assert report["page"] <= WINDOW_WIDTH and report["wide"] == [], report


IMAGE_PROBE = """<script>
addEventListener("load", () => {
  document.body.dataset.images = JSON.stringify([...document.querySelectorAll("article img")]
    .map(e => [e.getAttribute("src").split("/").pop(), e.getBoundingClientRect().width, e.naturalWidth]));
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")
def test_the_four_vs_twenty_states_are_shown_at_their_own_size_at_1280_pixels(site, tmp_path):
    """Each 64 x 64 state of concept-four-vs-twenty.png is drawn at 64 screen pixels or more in a
    1280-pixel window: a tile's width in the figure (its axes at the script's 100 dpi) scaled by
    the width the page gives the picture over the picture's own."""
    folder, _ = site
    page = folder / "concepts" / "index.html"
    probe = page.with_name("image-probe.html")
    probe.write_text(page.read_text().replace("</body>", IMAGE_PROBE + "</body>"))
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                             "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                             f"--window-size={WINDOW_WIDTH},2000", "--virtual-time-budget=10000", "--dump-dom",
                             probe.as_uri()], capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r'data-images="([^"]*)"', result.stdout)
    assert found, f"the probe did not run: {result.stderr[-2000:]}"
    shown = {name: (width, natural) for name, width, natural in json.loads(html.unescape(found.group(1)))}
    width, natural = shown["concept-four-vs-twenty.png"]
    concept_figures = load_file(ROOT / "scripts" / "concept_figures.py")
    figure = concept_figures.four_vs_twenty_figure()
    figure.set_dpi(100)
    tile = figure.axes[0].get_window_extent().width
    assert tile * width / natural >= 64, (tile, width, natural)

