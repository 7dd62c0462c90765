"""Watch it learn (training/learn.py): a few steps of the same code path as the five-minute run
write the picture, the loss curve and the checker's scores, resume, and refuse bad input in one
line. The five-minute run itself is never repeated here (docs/benchmarks.md has its figures)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from minit2i.training import shapes
from minit2i.training.evaluate import ATTRIBUTES, at_checker_size, classify

torch = pytest.importorskip("torch", reason="training needs the [train] extra (torch)")
from minit2i.training import learn  # noqa: E402  (needs torch)

SHORT = ["--eval-prompts", "2"]  # 2 held-in + 1 held-out prompt read back per snapshot


def run_learn(capsys, *argv) -> tuple[int, str, str]:
    """learn.main's status (argparse's exit included), stdout and stderr."""
    try:
        code = learn.main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def learnt(tmp_path_factory):
    """A 4-step run of the watch-it-learn command: (its folder, what it printed)."""
    folder = tmp_path_factory.mktemp("learn") / "run"
    out = io.StringIO()  # a module fixture cannot take capsys
    with contextlib.redirect_stdout(out):
        assert learn.main(["--out", str(folder), "--steps", "4", *SHORT]) == 0
    return folder, out.getvalue()


def test_the_checker_reads_back_scenes_rendered_at_half_size():
    """The watch-it-learn model draws 32 x 32 images; each pixel repeated to 64 x 64, the checker
    reads every attribute of every 7th scene back exactly (7 is prime to the 4 backgrounds, 5
    positions and 4 shapes of the scene order, so every value of every attribute is among them)."""
    scenes = (shapes.all_scenes() + shapes.all_scenes(held_out=True))[::7]
    assert {a: {getattr(s, a) for s in scenes} for a in ("colour", "position", "background", "shape", "size")} == {
        "colour": set(shapes.COLOURS), "position": set(shapes.POSITIONS), "background": set(shapes.BACKGROUNDS),
        "shape": set(shapes.SHAPES), "size": set(shapes.SIZES)}
    wrong = [s for s in scenes
             if classify(at_checker_size(shapes.render(s, 32))) != {a: getattr(s, a) for a in ATTRIBUTES}]
    assert wrong == []


def test_a_half_size_rendering_is_the_full_one_halved():
    """At 32 x 32 a scene's geometry is halved: its shape covers a quarter of the pixels of the
    64 x 64 rendering, to within one pixel of outline per pixel of perimeter at 32 (the edge
    pixels are decided by their centres, which halving moves)."""
    scene = shapes.Scene("large", "red", "square", "left", "black")
    full, half = (shapes.render(scene, size) for size in (64, 32))
    covered = [(image == shapes.COLOURS["red"]).all(axis=-1).sum() for image in (full, half)]
    assert covered == [28 * 28, 14 * 14]


def test_snapshots_are_spread_over_the_run_without_repeats():
    assert learn.snapshot_steps(3000) == [0, 47, 188, 375, 750, 1500, 3000]
    assert learn.snapshot_steps(4) == [0, 1, 2, 4]


def test_a_short_run_writes_the_samples_the_loss_curve_and_the_scores(learnt):
    folder, printed = learnt
    steps = [0, 1, 2, 4]
    rows = [np.asarray(Image.open(folder / "samples" / f"step-{s:07d}.png")) for s in steps]
    assert all(row.shape == (32, 32 * len(learn.SHEET_SCENES), 3) for row in rows)
    sheet = np.asarray(Image.open(folder / "samples.png"))
    np.testing.assert_array_equal(sheet, learn.sample_sheet([learn.data_row(32), *rows],
                                                            ["the data", *(f"step {s}" for s in steps)]))
    assert np.asarray(Image.open(folder / "loss.png")).shape == (360, 640, 3)
    evaluations = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in evaluations if "eval" in r) == steps
    assert [r["step"] for r in evaluations if "loss" in r] == [1, 2, 3, 4]
    lines = printed.splitlines()
    assert lines[0].split()[:7] == ["step", "loss", *learn.ATTRIBUTES] and lines[0].endswith("(right of 3)")
    assert [int(line.split()[0]) for line in lines[1:5]] == steps
    assert lines[5].startswith("the checker read the final model's 3 images right by colour on ")
    assert "by position on" in lines[5] and lines[6].startswith(f"wrote {folder / 'samples.png'}")
    assert lines[7].startswith(f"exported the final model: minit2i generate --model {folder / 'export' / 'transformer'}")


def test_the_exported_model_is_the_run_in_the_real_layout(learnt):
    """The export loads with the ordinary loader as the run's architecture at 32 x 32."""
    from minit2i.pipeline import load_model

    model = load_model(learnt[0] / "export" / "transformer", learnt[0] / "export" / "t5")
    assert model.mmjit.config == learn.LEARN_MMJIT and model.mmjit.config.image_size == 32
    assert model.t5.config == learn.LEARN_T5


def test_the_sheet_shows_each_row_enlarged_under_its_column(learnt):
    """Each sample of a row appears in the sheet repeated SHEET_SCALE times each way, at the
    same place for the same column in every row."""
    folder, _ = learnt
    row = np.asarray(Image.open(folder / "samples" / "step-0000004.png"))
    sheet = learn.sample_sheet([row, row], ["step 4", "again"])
    cell, gap, margin, header = 96, 4, 90, 52
    for r in range(2):
        top = header + r * (cell + gap)
        third = sheet[top:top + cell, margin + 2 * (cell + gap):margin + 2 * (cell + gap) + cell]
        np.testing.assert_array_equal(third, row[:, 64:96].repeat(3, axis=0).repeat(3, axis=1))


def test_the_same_command_resumes_and_extends_a_run(learnt, tmp_path, capsys):
    """A copy of the 4-step run, asked for 6 steps, trains steps 5 and 6 only (its log's loss
    records go on from step 4), keeps its earlier rows and adds the new end's."""
    folder = tmp_path / "run"
    shutil.copytree(learnt[0], folder)
    code, out, err = run_learn(capsys, "--out", folder, "--steps", 6, *SHORT)
    assert code == 0, err
    records = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (folder / "samples").iterdir()) == [
        f"step-{s:07d}.png" for s in (0, 1, 2, 4, 6)]
    assert [int(line.split()[0]) for line in out.splitlines()[1:6]] == [0, 1, 2, 4, 6]


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, nothing existing changed


def one_line_error(capsys, *argv) -> str:
    code, _, err = run_learn(capsys, *argv)
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1 and err.startswith("learn: error:"), err
    return err


@pytest.mark.parametrize("argv, words", [
    (["--steps", "0"], ["--steps", "found 0"]),
    (["--eval-prompts", "-1"], ["--eval-prompts", "found -1"]),
    (["--threads", "0"], ["--threads", "found 0"]),
    (["--steps", "many"], ["--steps", "many"]),
])
def test_bad_arguments_are_one_line_and_make_no_folder(argv, words, tmp_path, capsys):
    err = one_line_error(capsys, "--out", tmp_path / "run", *argv)
    assert all(w in err for w in words)
    assert not (tmp_path / "run").exists()


def test_an_out_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert "is a file, not a folder" in one_line_error(capsys, "--out", tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_folder_of_other_files_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "samples.png").write_bytes(b"not ours")
    err = one_line_error(capsys, "--out", tmp_path / "photos", "--steps", 2)
    assert "holds files but no checkpoint.safetensors" in err
    assert [p.name for p in (tmp_path / "photos").iterdir()] == ["samples.png"]
    assert (tmp_path / "photos" / "samples.png").read_bytes() == b"not ours"


def test_fewer_steps_than_the_run_has_made_is_one_line(learnt, capsys):
    folder = learnt[0]
    before = (folder / "checkpoint.safetensors").read_bytes()
    assert "holds a run at step 4, past --steps 2; pass --steps 4 or more" in one_line_error(
        capsys, "--out", folder, "--steps", 2)
    assert (folder / "checkpoint.safetensors").read_bytes() == before
