"""`minit2i batch --batch-size N`: images drawn N at a time in one forward, each from its own seed.

An image drawn in a group equals the image drawn alone, byte for byte, on NumPy at the run's
BLAS threads: NumPy's matmul runs a stack of matrices one at a time, so each image's rows go
through the same BLAS calls whatever else is in the forward (every other step is elementwise or
reduces within one image's rows). Runs are still cut into groups the same way every time
(driver.groups), so that a continued run draws the groups an uninterrupted one would, on any
backend. The demo model at 3 steps throughout (test_batch.py).
"""

from __future__ import annotations

import dataclasses
import json
import signal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minit2i.batch.driver import groups
from minit2i.batch.worker import Job, Painter, Spec
from test_bad_inputs import assert_one_line_error
from test_batch import PROMPTS, batch, manifest, prompt_file, run_until, shas

SAMPLER = (("num_inference_steps", 3),)
# Eight jobs of different prompts and seeds; a group is any selection of them, in any order.
JOBS = [Job(number, number, 0, PROMPTS[number % len(PROMPTS)], 1000 + 7 * number) for number in range(8)]


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """(prompt file, run folder) of 6 prompts x 2 images drawn one image a forward."""
    root = tmp_path_factory.mktemp("alone")
    prompts = prompt_file(root)
    code, _, err = batch(prompts, "--out", root / "run", "-n", "2", "--batch-size", "1")
    assert code == 0, err
    return prompts, root / "run"


# The Ray engine's grouped run (2 actors, 4 groups of 3) is test_batch.py's Ray test: one local
# cluster's start (most of a Ray test's 20 s) shows both that and the Ray engine's bytes.
ENGINES = [
    pytest.param(["--batch-size", "4"], id="in process, 3 groups of 4"),
    pytest.param(["--batch-size", "5", "--workers", "2"], id="2 worker processes, groups of 5, 5, 2"),
]


@pytest.mark.parametrize("args", ENGINES)
def test_a_grouped_run_on_each_engine_writes_the_sha256s_of_one_image_a_forward(alone, tmp_path, args):
    prompts, whole = alone
    code, _, err = batch(prompts, "--out", tmp_path / "run", "-n", "2", *args)
    assert code == 0, err
    assert shas(tmp_path / "run") == shas(whole)
    assert json.loads((tmp_path / "run/run.json").read_text())["settings"]["batch_size"] == int(args[1])


@given(count=st.integers(1, 60), size=st.integers(1, 16), data=st.data())
def test_groups_cut_the_whole_run_and_keep_every_started_group_whole(count, size, data):
    """Whatever is done, the groups drawn are the cuts [0, N), [N, 2N), ... of the whole run
    (the last one what is left) that hold an image not done, each whole."""
    jobs = [Job(number, number // 3, number % 3, "a red circle", number) for number in range(count)]
    done = {(job.index, job.k) for job in data.draw(st.lists(st.sampled_from(jobs), unique=True))}
    drawn = groups(jobs, size, done)
    cuts = [jobs[start:start + size] for start in range(0, count, size)]
    assert drawn == [cut for cut in cuts if any((job.index, job.k) not in done for job in cut)]
    assert {(job.index, job.k) for job in jobs} - done <= {(job.index, job.k) for group in drawn for job in group}


@pytest.fixture(scope="module", params=[1, 2], ids=["1 BLAS thread", "2 BLAS threads"])
def painter_and_alone(request):
    """(a Painter of the demo model at 3 steps on 1 or 2 BLAS threads, each of JOBS drawn alone)."""
    painter = Painter(Spec("demo", threads=request.param, sampler=SAMPLER))
    return painter, [painter.draw([job])[0] for job in JOBS]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chosen=st.lists(st.integers(0, len(JOBS) - 1), min_size=2, max_size=len(JOBS), unique=True))
def test_an_image_drawn_in_a_group_is_the_image_drawn_alone_byte_for_byte(painter_and_alone, chosen):
    """Any group of any size in any order: each image's pixels are exactly those it has alone."""
    painter, pixels_alone = painter_and_alone
    grouped = painter.draw([JOBS[i] for i in chosen])
    assert grouped.shape == (len(chosen), 64, 64, 3)
    for i, pixels in zip(chosen, grouped):
        assert np.array_equal(pixels, pixels_alone[i]), f"job {i} in the group {chosen}"


def test_a_continued_run_draws_the_groups_an_uninterrupted_run_draws(alone, tmp_path, monkeypatch):
    """Images 5 and 9 of 12 missing (their lines gone) in a run of groups of 4: the rerun draws
    the groups [4, 8) and [8, 12) whole, writes the 2 missing images and nothing else."""
    from minit2i.batch import engines

    prompts, whole = alone
    out = tmp_path / "run"
    code, _, err = batch(prompts, "--out", out, "-n", "2", "--batch-size", "4")
    assert code == 0, err
    kept = [line for line in (out / "manifest.jsonl").read_text().splitlines()
            if 2 * json.loads(line)["index"] + json.loads(line)["k"] not in (5, 9)]
    (out / "manifest.jsonl").write_text("".join(line + "\n" for line in kept))
    draw, seen = engines.Painter.draw, []

    def recorded(painter, group):
        seen.append([job.number for job in group])
        return draw(painter, group)

    monkeypatch.setattr(engines.Painter, "draw", recorded)
    code, stdout, err = batch(prompts, "--out", out, "-n", "2")
    assert code == 0, err
    assert seen == [[4, 5, 6, 7], [8, 9, 10, 11]]
    assert "2 drawn now" in stdout and len(manifest(out)) == 12
    assert shas(out) == shas(whole)


def test_a_run_killed_mid_group_then_continued_on_each_engine_gives_the_uninterrupted_sha256s(alone, tmp_path):
    """SIGKILL in process after the first image of a group of 4, then in 2 worker processes,
    then the same command to the end: the sha256s of the run never interrupted."""
    prompts, whole = alone
    out = tmp_path / "run"
    args = [prompts, "--out", out, "-n", "2", "--batch-size", "4"]
    run_until(args, out, 1, signal.SIGKILL)
    run_until(args + ["--workers", "2"], out, 5, signal.SIGKILL)
    code, _, err = batch(*args)
    assert code == 0, err
    assert shas(out) == shas(whole)


def test_a_rerun_keeps_the_recorded_batch_size_and_refuses_another(alone, tmp_path):
    prompts, _ = alone
    out = tmp_path / "run"
    code, _, err = batch(prompts, "--out", out, "-n", "2", "--batch-size", "4")
    assert code == 0, err
    code, stdout, err = batch(prompts, "--out", out, "-n", "2", "--batch-size", "2")
    assert_one_line_error(code, stdout, err, "other settings", "settings.batch_size 4 -> 2")
    code, _, err = run_cli_noted(prompts, "--out", out, "-n", "2")
    assert code == 0 and err.splitlines()[1] == ("minit2i: note: 4 images a forward (--batch-size 4: as the run "
                                                  "folder's run.json records)"), err


def run_cli_noted(*args):
    """`minit2i batch` at 3 steps without -q: its notes shown."""
    from test_bad_inputs import run_cli

    return run_cli("batch", "--steps", "3", *args)


def test_the_default_on_numpy_is_one_image_a_forward_said_on_the_runs_first_line(tmp_path):
    code, _, err = run_cli_noted(prompt_file(tmp_path, PROMPTS[:1]), "--out", tmp_path / "run")
    assert code == 0, err
    assert "minit2i: note: 1 image a forward (--batch-size 1: the numpy backend draws no faster in groups)" \
        in err.splitlines()[:2]


def test_a_batch_size_larger_than_the_memory_holds_names_the_largest_that_fits(tmp_path, monkeypatch):
    """Memory for the weights and 3 images' forward: --batch-size 4 is refused naming 3, and
    nothing is created; --batch-size 3 runs."""
    import minit2i.pipeline as pipeline
    from minit2i.api import MiniT2IPipeline

    files = MiniT2IPipeline.open("demo").files
    request = pipeline.make_request(files, PROMPTS[0], {})
    three = pipeline.estimate_memory(dataclasses.replace(request, batch_count=3), files)
    monkeypatch.setattr(pipeline, "available_memory", lambda: three)
    prompts = prompt_file(tmp_path, PROMPTS[:2])
    code, stdout, err = batch(prompts, "--out", tmp_path / "o", "-n", "2", "--batch-size", "4")
    assert_one_line_error(code, stdout, err, "--batch-size 4 needs more memory", "the largest group that fits is 3",
                          "pass --batch-size 3 or fewer")
    assert not (tmp_path / "o").exists()
    code, _, err = batch(prompts, "--out", tmp_path / "o", "-n", "2", "--batch-size", "3")
    assert code == 0, err
