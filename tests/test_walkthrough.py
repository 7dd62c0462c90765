"""The walkthrough notebook (notebooks/walkthrough.py, jupytext "percent" source) runs every cell from
a clean start and draws every figure; a cell that fails fails the run. How long it takes is a
benchmark's question (docs/benchmarks.md), not a test's."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

REASON = "the walkthrough needs the [docs] extra (jupytext, nbclient, ipykernel, matplotlib)"
jupytext = pytest.importorskip("jupytext", reason=REASON)
nbclient = pytest.importorskip("nbclient", reason=REASON)
pytest.importorskip("ipykernel", reason=REASON)
pytest.importorskip("matplotlib", reason=REASON)

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "notebooks" / "walkthrough.py"
sys.path.insert(0, str(ROOT / "docsite"))  # the site's notebook runner, as when docsite/notebook_page.py runs
notebook_page = importlib.import_module("notebook_page")
execute = notebook_page.execute


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    notebook = jupytext.read(SOURCE)
    execute(notebook, tmp_path_factory.mktemp("walkthrough"))
    return notebook


def outputs(notebook) -> list[dict]:
    return [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]


def test_the_walkthrough_runs_every_cell_without_an_error(executed):
    assert [o for o in outputs(executed) if o.output_type == "error"] == []
    assert sum(cell.cell_type == "markdown" for cell in executed.cells) >= 10


def test_every_figure_of_the_walkthrough_is_drawn(executed):
    images = [o.data["image/png"] for o in outputs(executed) if "image/png" in o.get("data", {})]
    assert len(images) == SOURCE.read_text().count("plt.show()")
    assert all(len(image) > 2000 for image in images), "an empty or near-empty figure"


def test_the_site_shows_what_the_notebook_prints(executed):
    """The walkthrough's page shows the committed printout (docsite/notebook_page.py); it must be
    this run's, character for character (shapes, settings and tokens: nothing machine-dependent)."""
    committed = json.loads(notebook_page.printed_file("notebooks/walkthrough.py").read_text())
    assert notebook_page.printed_text(executed) == committed, "run python docsite/notebook_page.py"


def test_a_failing_cell_fails_the_run(tmp_path):
    notebook = jupytext.reads("# %%\nx = 1\n\n# %%\nraise ValueError('planted')\n", fmt="py:percent")
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="planted"):
        execute(notebook, tmp_path)
