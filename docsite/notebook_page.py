"""A notebook's page: its cells in order, prose as prose, code as code, under each code cell what it
printed and the figures it draws. Run it to draw them again (from the repository root, the `docs`
extra):

    python docsite/notebook_page.py            # runs notebooks/walkthrough.py, writes its outputs

The outputs are committed in docs/figures/ (walkthrough-01.png and on, and walkthrough-printed.json)
and the page is made from the notebook's source on every build, so the site builds in seconds and
its prose and code cannot drift from the notebook; only the outputs are as new as the last run of
this script. tests/test_walkthrough.py runs the notebook in CI and checks that it prints what the
page shows; tests/test_site.py checks that the committed figures are the ones the notebook draws.
"""

from __future__ import annotations

import argparse
import ast
import base64
import json
import re
import tempfile
import textwrap
from pathlib import Path

import jupytext
from sidebyside import FULL_WIDTH

from minit2i.core.files import write_atomically

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ("notebooks/walkthrough.py",)
FIGURES = ROOT / "docs" / "figures"
# A cell draws one figure per call: the notebook shows every figure with plt.show().
SHOW = re.compile(r"^\s*plt\.show\(\)", re.MULTILINE)
# Where a figure's drawing starts in a cell that shows one: its first top-level line that makes a
# figure or calls pyplot. From there on the cell is matplotlib, folded on the page.
DRAWING = re.compile(r"^(fig\b.*=\s*plt\.|plt\.)", re.MULTILINE)
# A hang guard, not a budget: the whole notebook runs in under a minute on an idle 2-core machine
# (docs/benchmarks.md), so no cell expects more than 60 s; ten times that.
CELL_TIMEOUT_S = 600
LINE_LENGTH = 120  # printed lines are wrapped to the project's line length, so they fit as the code does


# Under the notebook's first cell: where the page's pictures come from.
RUN_NOTE = ("\n\n!!! note \"This page\"\n    The notebook `{path}`, its cells in order, each figure under the cell that "
            "draws it and what it printed, from its last run by `python docsite/notebook_page.py`.")


def figures_per_cell(notebook) -> list[int]:
    """How many figures each cell draws (0 for prose)."""
    return [len(SHOW.findall(cell.source)) if cell.cell_type == "code" else 0 for cell in notebook.cells]


def figure_names(path: str) -> list[str]:
    """The committed figure files of the notebook at repository path `path`, in drawing order:
    `<stem>-01.png`, `<stem>-02.png`, ..."""
    count = sum(figures_per_cell(jupytext.read(ROOT / path)))
    return [f"{Path(path).stem}-{i:02d}.png" for i in range(1, count + 1)]


def printed_file(path: str) -> Path:
    """The committed file of what each code cell of the notebook at `path` printed."""
    return FIGURES / f"{Path(path).stem}-printed.json"


def printed_text(notebook) -> list[str]:
    """What each code cell of an executed notebook printed to stdout, in order ("" for none)."""
    return ["".join(output.text for output in cell.outputs if output.get("name") == "stdout")
            for cell in notebook.cells if cell.cell_type == "code"]


def wrapped(text: str) -> str:
    return "\n".join(textwrap.fill(line, LINE_LENGTH, subsequent_indent="    ") or line for line in text.splitlines())


def page_markdown(path: str) -> str:
    """The page of the notebook at repository path `path`: Markdown cells as written, code cells
    fenced, and after each code cell what it printed and the figures it draws. Figure links are
    written from the notebook's folder, as its own links are. The page takes the whole window, as
    the code pages do, so that 120 columns of code fit."""
    notebook = jupytext.read(ROOT / path)
    names = iter(figure_names(path))
    printed = json.loads(printed_file(path).read_text())
    code_cells = sum(cell.cell_type == "code" for cell in notebook.cells)
    if len(printed) != code_cells:
        raise ValueError(f"{printed_file(path).name} has {len(printed)} cells' output, {path} has {code_cells} code "
                         "cells: run python docsite/notebook_page.py")
    printed = iter(printed)
    figure_folder = Path("..", FIGURES.relative_to(ROOT)).as_posix()
    parts = []
    for index, (cell, count) in enumerate(zip(notebook.cells, figures_per_cell(notebook))):
        if cell.cell_type == "markdown":
            parts.append(cell.source + (RUN_NOTE.format(path=path) if index == 0 else ""))
            continue
        text = next(printed)
        computing, drawing = split_drawing(cell.source)
        parts += [f"```python\n{computing}\n```"] if computing.strip() else []
        parts += [folded_drawing(drawing)] if drawing else []
        parts += [f"```text\n{wrapped(text)}\n```"] if text.strip() else []
        parts += [f"![figure {name}]({figure_folder}/{name})" for name in (next(names) for _ in range(count))]
    return FULL_WIDTH + "\n\n".join(parts) + "\n"


def split_drawing(source: str) -> tuple[str, str]:
    """(the code that computes, the code that draws) of a cell: a cell that shows a figure is cut
    at its first drawing line (`DRAWING`), any other is all computing."""
    if is_drawing_helpers(source):
        return "", source.rstrip()
    start = DRAWING.search(source) if SHOW.search(source) else None
    if start is None:
        return source, ""
    return source[:start.start()].rstrip(), source[start.start():].rstrip()


def is_drawing_helpers(source: str) -> bool:
    """A cell of nothing but function definitions, one of them drawing on a matplotlib axis."""
    body = ast.parse(source).body
    return bool(body) and all(isinstance(node, ast.FunctionDef) for node in body) and "axis." in source


def folded_drawing(code: str) -> str:
    """A cell's plotting code, folded: the reader opens it if they want to know how a figure is drawn."""
    lines = code.count("\n") + 1
    return (f'<details class="plotting" markdown>\n<summary>the plotting code ({lines} lines)</summary>\n\n'
            f"```python\n{code}\n```\n\n</details>")


def execute(notebook, folder: Path) -> None:
    """Run every cell of `notebook` in a fresh kernel started in `folder` (a failing cell raises)."""
    from nbclient import NotebookClient

    NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()


def executed(path: str):
    """The notebook at `path` run from a clean start in a scratch folder."""
    notebook = jupytext.read(ROOT / path)
    with tempfile.TemporaryDirectory() as scratch:
        execute(notebook, Path(scratch))
    return notebook


def drawn_figures(notebook) -> list[bytes]:
    """The PNG bytes of every figure an executed notebook shows, in order."""
    return [base64.b64decode(output.data["image/png"]) for cell in notebook.cells if cell.cell_type == "code"
            for output in cell.outputs if "image/png" in output.get("data", {})]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES)
    args = parser.parse_args()
    for path in NOTEBOOKS:
        notebook = executed(path)
        names, images = figure_names(path), drawn_figures(notebook)
        if len(images) != len(names):
            raise SystemExit(f"{path} showed {len(images)} figures, its source calls plt.show() {len(names)} times")
        for name, image in zip(names, images):
            write_atomically(args.out / name, image)
            print(args.out / name)
        printed = args.out / printed_file(path).name
        write_atomically(printed, (json.dumps(printed_text(notebook), indent=1) + "\n").encode())
        print(printed)


if __name__ == "__main__":
    main()
