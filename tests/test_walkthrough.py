"""The walkthrough notebook (notebooks/walkthrough.py, jupytext "percent" source) runs every cell from
a clean start in under a minute and draws every figure; a cell that fails fails the run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

REASON = "the walkthrough needs the [docs] extra (jupytext, nbclient, ipykernel, matplotlib)"
jupytext = pytest.importorskip("jupytext", reason=REASON)
nbclient = pytest.importorskip("nbclient", reason=REASON)
pytest.importorskip("ipykernel", reason=REASON)
pytest.importorskip("matplotlib", reason=REASON)

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "notebooks" / "walkthrough.py"
CELL_TIMEOUT_S = 60
BUDGET_S = 60


def execute(notebook, folder: Path) -> float:
    """Run every cell in a fresh kernel started in `folder` (errors raise); the seconds it took."""
    start = time.perf_counter()
    nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}}).execute()
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    notebook = jupytext.read(SOURCE)
    return notebook, execute(notebook, tmp_path_factory.mktemp("walkthrough"))


def outputs(notebook) -> list[dict]:
    return [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]


def test_the_walkthrough_runs_every_cell_in_under_a_minute(executed):
    notebook, seconds = executed
    assert seconds < BUDGET_S
    assert [o for o in outputs(notebook) if o.output_type == "error"] == []
    assert sum(cell.cell_type == "markdown" for cell in notebook.cells) >= 10


def test_every_figure_of_the_walkthrough_is_drawn(executed):
    notebook, _ = executed
    images = [o.data["image/png"] for o in outputs(notebook) if "image/png" in o.get("data", {})]
    assert len(images) == SOURCE.read_text().count("plt.show()")
    assert all(len(image) > 2000 for image in images), "an empty or near-empty figure"


def test_a_failing_cell_fails_the_run(tmp_path):
    notebook = jupytext.reads("# %%\nx = 1\n\n# %%\nraise ValueError('planted')\n", fmt="py:percent")
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="planted"):
        execute(notebook, tmp_path)
