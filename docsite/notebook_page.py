"""A notebook's page: its cells in order, prose as prose, code as code, each figure under the cell
that draws it. Run it to draw the figures again (from the repository root, the `docs` extra):

    python docsite/notebook_page.py            # runs notebooks/walkthrough.py, writes its figures

The figures are committed (walkthrough-01.png and on, in docs/figures/) and the page is made from the
notebook's source on every build, so the site builds in seconds and its prose and code cannot
drift from the notebook; only the pictures are as new as the last run of this script.
tests/test_walkthrough.py runs the notebook itself in CI, and tests/test_site.py checks that the
committed figures are exactly the ones the notebook draws.
"""

from __future__ import annotations

import argparse
import base64
import re
import tempfile
from pathlib import Path

import jupytext
from sidebyside import FULL_WIDTH

from minit2i.core.files import write_atomically

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ("notebooks/walkthrough.py",)
FIGURES = ROOT / "docs" / "figures"
# A cell draws one figure per call: the notebook shows every figure with plt.show().
SHOW = re.compile(r"^\s*plt\.show\(\)", re.MULTILINE)
# A hang guard, not a budget: the whole notebook runs in under a minute on an idle 2-core machine
# (docs/benchmarks.md), so no cell expects more than 60 s; ten times that.
CELL_TIMEOUT_S = 600


# Under the notebook's first cell: where the page's pictures come from.
RUN_NOTE = ("\n\n!!! note \"This page\"\n    The notebook `{path}`, its cells in order, each figure under the cell that "
            "draws it, from its last run by `python docsite/notebook_page.py`.")


def figures_per_cell(notebook) -> list[int]:
    """How many figures each cell draws (0 for prose)."""
    return [len(SHOW.findall(cell.source)) if cell.cell_type == "code" else 0 for cell in notebook.cells]


def figure_names(path: str) -> list[str]:
    """The committed figure files of the notebook at repository path `path`, in drawing order:
    `<stem>-01.png`, `<stem>-02.png`, ..."""
    count = sum(figures_per_cell(jupytext.read(ROOT / path)))
    return [f"{Path(path).stem}-{i:02d}.png" for i in range(1, count + 1)]


def page_markdown(path: str) -> str:
    """The page of the notebook at repository path `path`: Markdown cells as written, code cells
    fenced, and after each code cell the figures it draws. Figure links are written from the
    notebook's folder, as its own links are. The page takes the whole window, as the code pages
    do, so that 120 columns of code fit."""
    notebook = jupytext.read(ROOT / path)
    names = iter(figure_names(path))
    figure_folder = Path("..", FIGURES.relative_to(ROOT)).as_posix()
    parts = []
    for index, (cell, count) in enumerate(zip(notebook.cells, figures_per_cell(notebook))):
        if cell.cell_type == "markdown":
            parts.append(cell.source + (RUN_NOTE.format(path=path) if index == 0 else ""))
        elif cell.source.strip():
            parts.append(f"```python\n{cell.source}\n```")
        parts += [f"![figure {name}]({figure_folder}/{name})" for name in (next(names) for _ in range(count))]
    return FULL_WIDTH + "\n\n".join(parts) + "\n"


def execute(notebook, folder: Path) -> None:
    """Run every cell of `notebook` in a fresh kernel started in `folder` (a failing cell raises)."""
    from nbclient import NotebookClient

    NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()


def drawn_figures(path: str) -> list[bytes]:
    """Run the notebook at `path` from a clean start in a scratch folder -> the PNG bytes of every
    figure it shows, in order."""
    notebook = jupytext.read(ROOT / path)
    with tempfile.TemporaryDirectory() as scratch:
        execute(notebook, Path(scratch))
    return [base64.b64decode(output.data["image/png"]) for cell in notebook.cells if cell.cell_type == "code"
            for output in cell.outputs if "image/png" in output.get("data", {})]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES)
    args = parser.parse_args()
    for path in NOTEBOOKS:
        names, images = figure_names(path), drawn_figures(path)
        if len(images) != len(names):
            raise SystemExit(f"{path} showed {len(images)} figures, its source calls plt.show() {len(names)} times")
        for name, image in zip(names, images):
            write_atomically(args.out / name, image)
            print(args.out / name)


if __name__ == "__main__":
    main()
