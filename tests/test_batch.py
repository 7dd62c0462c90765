"""`minit2i batch`: GenEval's layout, the manifest, resuming after a kill, refusing changed
settings, the engines writing the same bytes, and the exports.

Every test draws with the demo model at 3 steps (64 x 64, a tenth of a second an image) so that
a run of a dozen images is quick; the bytes do not depend on the step count being the default.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from minit2i.batch.store import MANIFEST, image_path
from test_bad_inputs import assert_one_line_error, run_cli

STEPS = ["--steps", "3", "-q"]
PROMPTS = ["a large red circle at the left on a gray background", "a small blue square at the top on a white background",
           "a green triangle", "a large yellow cross at the center on a black background",
           "a small purple circle at the bottom on a navy background", "a red square"]
# A killed run is waited for at most this long to reach the point where it is killed (a hang guard:
# the demo model draws an image in about 0.1 s, the process starts in about 3 s).
KILL_WAIT_SECONDS = 60


def prompt_file(folder: Path, prompts=PROMPTS) -> Path:
    """GenEval-style metadata: a "prompt" and fields of its own on each line."""
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "tag": "shapes", "include": [i]}) + "\n"
                            for i, p in enumerate(prompts)))
    return path


def manifest(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / MANIFEST).read_text().splitlines()]


def shas(out: Path) -> dict[tuple[int, int], str]:
    return {(e["index"], e["k"]): e["sha256"] for e in manifest(out)}


def batch(*args) -> tuple[int, str, str]:
    """`minit2i batch` in process, at 3 steps unless `args` say otherwise."""
    return run_cli("batch", *STEPS, *args)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(prompt file, run folder) of an uninterrupted in-process run, 6 prompts x 2 images."""
    root = tmp_path_factory.mktemp("reference")
    prompts = prompt_file(root)
    code, _, err = batch(prompts, "--out", root / "run", "-n", "2")
    assert code == 0, err
    return prompts, root / "run"


def test_layout_manifest_and_generate_agree(reference, tmp_path):
    """GenEval's layout: DIR/<index:05d>/metadata.jsonl holding the prompt's line (its other fields
    kept) and samples/<k:04d>.png; one manifest line per image whose sha256 is its PNG's; image
    (3, 1) drawn again by `generate -p PROMPT -s SEED` is the same file byte for byte."""
    prompts, out = reference
    lines = prompts.read_text().splitlines()
    assert sorted(p.name for p in out.iterdir()) == [f"{i:05d}" for i in range(6)] + [MANIFEST, "run.json"]
    for index in range(6):
        assert json.loads((out / f"{index:05d}/metadata.jsonl").read_text()) == json.loads(lines[index])
        assert sorted(p.name for p in (out / f"{index:05d}/samples").iterdir()) == ["0000.png", "0001.png"]
    entries = manifest(out)
    assert sorted((e["index"], e["k"]) for e in entries) == [(i, k) for i in range(6) for k in range(2)]
    for e in entries:
        assert e["path"] == image_path(e["index"], e["k"]) and e["prompt"] == PROMPTS[e["index"]]
        assert e["seed"] == 42 + 2 * e["index"] + e["k"]
        assert hashlib.sha256((out / e["path"]).read_bytes()).hexdigest() == e["sha256"]
    entry = next(e for e in entries if (e["index"], e["k"]) == (3, 1))
    code, _, err = run_cli("generate", "-p", entry["prompt"], "-s", entry["seed"], "-o", tmp_path / "g.png", *STEPS)
    assert code == 0, err
    assert (tmp_path / "g.png").read_bytes() == (out / entry["path"]).read_bytes()


def test_run_json_records_settings_and_numerical_setup(reference):
    prompts, out = reference
    record = json.loads((out / "run.json").read_text())
    settings, numerical = record["settings"], record["numerical"]
    assert settings["sampler"]["steps"] == 3 and settings["sampler"]["width"] == 64
    assert settings["images_per_prompt"] == 2 and settings["seed"] == 42
    assert settings["prompts"] == {"sha256": hashlib.sha256(prompts.read_bytes()).hexdigest(), "count": 6}
    assert set(settings["weights_sha256"]) == {"transformer", "t5", "tokenizer"}
    assert numerical["backend"] == "numpy" and numerical["blas_threads"] == 1
    assert all(pool["num_threads"] == 1 for pool in numerical["blas"])
    assert {"numpy", "pillow", "zlib", "python"} <= set(numerical)


# Runs of the signal test made before one is interrupted part way (the others ended first).
TRIALS = 3


def run_until(args: list, out: Path, lines: int, signum: int = signal.SIGKILL) -> subprocess.Popen:
    """`minit2i batch ARGS` in a process of its own, sent `signum` once the manifest holds `lines`
    lines (0: once run.json is written, before any image); the ended process."""
    command = [sys.executable, "-m", "minit2i.cli", "batch", *STEPS, *map(str, args)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        written = (out / MANIFEST).read_bytes().count(b"\n") if (out / MANIFEST).exists() else -1
        if (out / "run.json").exists() and written >= lines:
            break
        time.sleep(0.02)
    assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()}"
    process.send_signal(signum)
    process.wait(KILL_WAIT_SECONDS)
    return process


def png_identities(out: Path) -> dict[Path, tuple[int, int]]:
    """(inode, mtime in ns) of every PNG in the run folder."""
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("*/samples/*.png")}


def test_resume_after_sigkill_at_several_points_rewrites_nothing(reference, tmp_path):
    """Killed before the first image, after 3, and after 7 (the last in 2 worker processes),
    then run to the end: the same sha256s as the uninterrupted run, and no PNG that existed
    before a rerun was written again (same inode and mtime)."""
    prompts, whole = reference
    out = tmp_path / "run"
    args = [prompts, "--out", out, "-n", "2"]
    seen: dict[Path, tuple[int, int]] = {}
    for lines, extra in ((0, []), (3, []), (7, ["--workers", "2"])):
        run_until(args + extra, out, lines)
        before = png_identities(out)
        assert {p: before[p] for p in seen} == seen  # the rerun before this kill kept every PNG
        seen = before
    code, _, err = batch(*args)
    assert code == 0, err
    assert {p: png_identities(out)[p] for p in seen} == seen
    assert shas(out) == shas(whole)
    assert not list(out.rglob(".*")), "temporary files left behind"


@pytest.mark.parametrize("signum, status, extra", [(signal.SIGTERM, 143, []), (signal.SIGINT, 130, ["--workers", "2"])])
def test_sigterm_and_ctrl_c_stop_cleanly_and_the_rerun_finishes(reference, tmp_path, signum, status, extra):
    """SIGTERM (in process) and Ctrl-C (2 worker processes): one line and the signal's status;
    every manifest line has its PNG, no temporary file is left, the rerun completes the set.

    The signal is sent once the manifest holds 2 of its 12 lines; on a loaded machine the poll can
    wake after the workers have drawn the rest and the run is ending, and a signal that lands in
    the interpreter's exit interrupts nothing (status 0). Such a trial must have written the whole
    set, and is made again in a fresh folder, up to TRIALS times."""
    prompts, whole = reference
    for trial in range(TRIALS):
        out = tmp_path / f"run{trial}"
        process = run_until([prompts, "--out", out, "-n", "2", *extra], out, 2, signum)
        if process.returncode != 0:
            break
        assert len(manifest(out)) == len(shas(whole)), "status 0 for a run the signal stopped part way"
    assert process.returncode == status
    assert process.stderr.read().decode().splitlines()[-1] in ("minit2i: terminated", "minit2i: interrupted")
    assert not list(out.rglob(".*"))
    for e in manifest(out):
        assert hashlib.sha256((out / e["path"]).read_bytes()).hexdigest() == e["sha256"]
    code, _, err = batch(prompts, "--out", out, "-n", "2")
    assert code == 0, err
    assert shas(out) == shas(whole)


def test_a_cut_last_line_and_a_png_without_its_line_are_redone_in_place(reference, tmp_path):
    """A manifest cut mid-line loses only that line (dropped, then written whole); a PNG whose
    line is missing is drawn again and, having the same bytes, left as it is (same inode)."""
    prompts, whole = reference
    out = tmp_path / "run"
    code, _, err = batch(prompts, "--out", out, "-n", "2")
    assert code == 0, err
    lines = (out / MANIFEST).read_bytes().splitlines(keepends=True)
    orphan = out / json.loads(lines[-2])["path"]
    identity = (orphan.stat().st_ino, orphan.stat().st_mtime_ns)
    (out / MANIFEST).write_bytes(b"".join(lines[:-2]) + lines[-1][:25])
    code, stdout, err = batch(prompts, "--out", out, "-n", "2")
    assert code == 0, err
    assert "2 drawn now" in stdout
    assert (orphan.stat().st_ino, orphan.stat().st_mtime_ns) == identity
    assert len(manifest(out)) == 12 and shas(out) == shas(whole)


@pytest.mark.parametrize("change, words", [
    (["--steps", "4"], "sampler.steps 3 -> 4"),
    (["-n", "3"], "images_per_prompt 2 -> 3"),
    (["-s", "7"], "seed 42 -> 7"),
    (["--model", "demo-mf"], "weights_sha256.transformer"),
    (["--threads", "2"], "blas_threads 1 -> 2"),
])
def test_a_rerun_with_other_settings_is_refused_naming_the_difference(reference, change, words):
    prompts, out = reference
    before = sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*"))
    code, stdout, err = batch(prompts, "--out", out, "-n", "2", *change)
    assert_one_line_error(code, stdout, err, "other settings", words, "choose another --out")
    assert sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*")) == before


def test_a_changed_prompt_file_is_refused(reference, tmp_path):
    _, out = reference
    other = prompt_file(tmp_path, PROMPTS[::-1])
    code, stdout, err = batch(other, "--out", out, "-n", "2")
    assert_one_line_error(code, stdout, err, "prompts.sha256")


def test_text_prompt_file_and_workers_give_the_same_images(reference, tmp_path):
    """A plain text file of the same prompts, drawn by 2 spawned processes: the same sha256s."""
    _, whole = reference
    text = tmp_path / "prompts.txt"
    text.write_text("\n".join(PROMPTS) + "\n\n")
    code, _, err = batch(text, "--out", tmp_path / "run", "-n", "2", "--workers", "2")
    assert code == 0, err
    assert shas(tmp_path / "run") == shas(whole)
    assert json.loads((tmp_path / "run/00002/metadata.jsonl").read_text()) == {"prompt": PROMPTS[2]}


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="needs the ray extra (pip install -e '.[ray]')")
def test_ray_engine_writes_the_sha256s_of_the_local_engine(reference, tmp_path, monkeypatch):
    """Ray Data over 2 actors on a local cluster (started and stopped by the run; its start is
    most of the test's 20 s), OMP_NUM_THREADS set to another count than --threads to show that
    the count given wins. The 12 images go in 4 groups of 3 (one dataset row a group, each drawn
    in one forward), so that this one cluster also shows a grouped run on Ray writing the bytes of
    one image a forward (`reference`: the local engine, one image a forward; the other engines'
    grouped runs are in test_batch_groups.py)."""
    prompts, whole = reference
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    code, _, err = batch(prompts, "--out", tmp_path / "run", "-n", "2", "--engine", "ray", "--workers", "2",
                         "--threads", "1", "--batch-size", "3")
    assert code == 0, err
    assert shas(tmp_path / "run") == shas(whole)
    assert json.loads((whole / "run.json").read_text())["settings"]["batch_size"] == 1
    assert json.loads((tmp_path / "run/run.json").read_text())["settings"]["batch_size"] == 3


def test_exports_dpg_grids_and_a_flat_folder(tmp_path):
    """-n 4 with --export dpg: one 2 x 2 grid per prompt of its images in k order, named by the
    metadata "id" where it is a plain name; --export flat: every image, the store's own file."""
    prompts = tmp_path / "dpg.jsonl"
    prompts.write_text(json.dumps({"prompt": PROMPTS[0], "id": "item-a"}) + "\n"
                       + json.dumps({"prompt": PROMPTS[1], "id": "../escape"}) + "\n")
    out = tmp_path / "run"
    code, _, err = batch(prompts, "--out", out, "-n", "4", "--export", "dpg", "--export", "flat")
    assert code == 0, err
    assert sorted(p.name for p in (out / "dpg").iterdir()) == ["00001.png", "item-a.png"]
    grid = np.asarray(Image.open(out / "dpg/item-a.png"))
    tiles = [np.asarray(Image.open(out / image_path(0, k))) for k in range(4)]
    assert grid.shape == (128, 128, 3)
    assert np.array_equal(grid, np.concatenate([np.concatenate(tiles[:2], 1), np.concatenate(tiles[2:], 1)], 0))
    flat = sorted((out / "flat").iterdir())
    assert [p.name for p in flat] == [f"{i:05d}_{k:04d}.png" for i in range(2) for k in range(4)]
    assert all(os.path.samefile(p, out / image_path(int(p.name[:5]), int(p.name[6:10]))) for p in flat)


@pytest.mark.parametrize("args, words", [
    (["--out", "{tmp}/o"], "PROMPTS is missing"),
    (["{prompts}", "--out", "{tmp}/o", "-n", "0"], "-n/--images-per-prompt"),
    (["{prompts}", "--out", "{tmp}/o", "--workers", "0"], "--workers"),
    (["{prompts}", "--out", "{tmp}/o", "--batch-size", "0"], "--batch-size must be an integer in [1, 4096], found 0"),
    (["{prompts}", "--out", "{tmp}/o", "--batch_size", "-3"], "--batch-size must be an integer in [1, 4096], found -3"),
    (["{prompts}", "--out", "{tmp}/o", "--batch-size", "two"], "argument --batch-size/--batch_size: invalid int"),
    (["{prompts}", "--out", "{tmp}/o", "--threads", "0"], "--threads"),
    (["{prompts}", "--out", "{tmp}/o", "--engine", "spark"], "--engine must be one of local, ray"),
    (["{prompts}", "--out", "{tmp}/o", "--export", "coco"], "--export must be one of dpg, flat"),
    (["{prompts}", "--out", "{tmp}/o", "-s", str(2**63 - 3), "-n", "2"], "the last image's seed"),
    (["{prompts}", "--out", "{tmp}/o", "-W", "65"], "width"),
    (["{tmp}/missing.txt", "--out", "{tmp}/o"], "missing.txt"),
    (["{prompts}", "--out", "{prompts}"], "is a file"),
    (["{prompts}", "--out", "{tmp}"], "holds other files and no run.json"),
    (["--out", "{tmp}", "--export", "flat"], "not a run folder"),
])
def test_bad_arguments_are_one_line_and_create_no_folder(tmp_path, args, words):
    prompts = prompt_file(tmp_path, PROMPTS[:2])
    filled = [a.format(tmp=tmp_path, prompts=prompts) for a in args]
    code, stdout, err = batch(*filled)
    assert_one_line_error(code, stdout, err, words)
    assert not (tmp_path / "o").exists()


def test_score_reads_the_run_as_evaluate_reads_its_own_draws(tmp_path):
    """`training.score` on a batch run of its own prompt file gives the report that
    `evaluate.accuracy_report` gives on the same scenes and seeds drawn by evaluate's own path,
    and lists exactly the images `evaluate.misread` finds."""
    from minit2i.training import evaluate, score

    prompts = tmp_path / "scenes.jsonl"
    assert score.main(["--write-prompts", str(prompts), "--prompts", "4"]) == 0
    out = tmp_path / "run"
    code, _, err = batch(prompts, "--out", out, "-n", "2")
    assert code == 0, err
    assert score.main([str(out)]) == 0
    report = json.loads((out / "score.json").read_text())
    lines = [json.loads(line) for line in prompts.read_text().splitlines()]
    scenes = [(evaluate.shapes.Scene(**line["scene"]), 42 + 2 * i + k, line["tag"] == "held_out")
              for i, line in enumerate(lines) for k in range(2)]
    assert report["counts"] == {"held_in": 8, "held_out": 4}
    pixels = evaluate.generate_scenes(scenes, settings={"steps": 3})
    expected = evaluate.accuracy_report(scenes, pixels)
    assert {g: report[g] for g in ("held_in", "held_out")} == {g: expected[g] for g in ("held_in", "held_out")}
    missed = [image_path(i // 2, i % 2) for i, _ in evaluate.misread(scenes, pixels)]
    assert [m["path"] for m in report["misses"]] == missed
    assert (out / "score-misses.png").exists() == bool(missed)


def test_score_refuses_a_run_of_other_prompts(reference, capsys):
    """A run whose prompts name no demo scene: one line, exit 2, nothing written."""
    from minit2i.training import score

    _, out = reference
    assert score.main([str(out)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("score: error: ") and "names no demo scene" in lines[0]
    assert not (out / "score.md").exists()


def test_a_second_run_on_the_same_folder_is_refused_while_the_first_holds_it(reference):
    """A driver holds an exclusive lock on its folder: a second run and an export are refused."""
    from minit2i.batch.store import lock_folder

    prompts, out = reference
    first = lock_folder(out, exclusive=True)
    try:
        run = batch(prompts, "--out", out, "-n", "2")
        exported = batch("--out", out, "--export", "flat")
    finally:
        os.close(first)
    assert_one_line_error(*run, "another minit2i batch is writing or reading")
    assert_one_line_error(*exported, "another minit2i batch is writing")
    assert not (out / "flat").exists()


@pytest.mark.parametrize("line", [b'{"index": "0", "k": 0, "prompt": "p", "seed": 1, "path": "x", "sha256": ""}\n',
                                  b"[1, 2]\n", b"not json\n"])
def test_a_damaged_manifest_line_is_one_line_naming_it(reference, tmp_path, line):
    import shutil

    prompts, whole = reference
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    with open(out / MANIFEST, "ab") as manifest_file:
        manifest_file.write(line)
    code, stdout, err = batch(prompts, "--out", out, "-n", "2")
    assert_one_line_error(code, stdout, err, f"{out / MANIFEST} line 13")


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="needs the ray extra (pip install -e '.[ray]')")
def test_an_actors_error_reaches_the_user_as_its_own_line():
    """An actor's MiniT2IError arrives wrapped by Ray (a RayTaskError whose message is the
    actor's traceback, inside Ray Data's UserCodeException): the engine raises the error itself."""
    from ray.exceptions import RayTaskError, UserCodeException

    from minit2i.batch.ray_engine import actor_error
    from minit2i.core.errors import MiniT2IError

    original = MiniT2IError("the image became NaN or Inf at sampling step 3 of 20")
    wrapped = RayTaskError("MapWorker.__call__", "Traceback (most recent call last):\n ...", original)
    try:
        try:
            raise wrapped.as_instanceof_cause()
        except Exception as err:
            raise UserCodeException("UDF failed") from err
    except UserCodeException as err:
        assert actor_error(err) is original
    other = RuntimeError("the raylet died")
    assert actor_error(other) is other


def test_words_the_model_does_not_know_are_one_warning_for_the_whole_file(tmp_path):
    """Two of three prompts with unknown words, two images each: one warning line, not one per image."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a zebra circle\na red circle\na blue giraffe\n")
    code, _, err = batch(prompts, "--out", tmp_path / "run", "-n", "2")
    assert code == 0, err
    assert err.splitlines() == ["minit2i: warning: 2 of 3 prompts have words the model does not know "
                                "(the first, prompt 0: 'zebra')"]


def test_a_prompts_folder_is_written_with_its_first_image(tmp_path, monkeypatch):
    """A 100 MB prompt file wrote all its 1.9 M prompt folders, each metadata.jsonl flushed to disk,
    before the first image and the progress bar (45 minutes of silence): a run of 300 prompts
    stopped at its third image holds the folders of its first two prompts only."""
    from minit2i.batch import engines

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"a red circle number {i}\n" for i in range(300)))
    draw, drawn = engines.Painter.draw, []

    def two_then_stop(painter, group):
        if len(drawn) == 2:
            raise KeyboardInterrupt
        drawn.extend(group)
        return draw(painter, group)

    monkeypatch.setattr(engines.Painter, "draw", two_then_stop)
    code, _, err = batch(prompts, "--out", tmp_path / "run")
    assert code == 130, err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["00000", "00001", MANIFEST, "run.json"]
    assert len(manifest(tmp_path / "run")) == 2


def test_a_full_disk_names_the_file_it_could_not_write(tmp_path, monkeypatch):
    """A full disk said "No space left on device" without the path."""
    from minit2i.batch import store

    def full(path, write):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "write_temporary", full)
    code, stdout, err = batch(prompt_file(tmp_path, PROMPTS[:1]), "--out", tmp_path / "run")
    assert_one_line_error(code, stdout, err, f"cannot write {tmp_path / 'run' / 'run.json'}: No space left on device; "
                                             "free some space")
