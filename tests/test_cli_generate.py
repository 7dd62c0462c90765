"""`minit2i generate` end to end on the demo model, and its error handling."""

from __future__ import annotations

import json
import os
import shutil
import stat

import numpy as np
import pytest
from PIL import Image

from minit2i import api, pipeline
from minit2i.cli import main
from minit2i.core.threads import THREAD_VARIABLES
from minit2i.demo_models import DEMO_MODEL_DIR
from minit2i.reference.pipeline import NumpyRunner

SMALL = ["--steps", "2", "-W", "64", "-H", "48"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def generate(capsys, *args):
    """Run `minit2i generate ...` -> (exit code, stdout, stderr)."""
    code = main(["generate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def read_pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.suffix in (".png", ".part"))


# ---------------------------------------------------------------------------------------------
# Happy paths


def test_writes_png_of_requested_size_and_prints_timings(tmp_path, capsys, monkeypatch):
    for name in THREAD_VARIABLES:  # the thread count the project chooses, not a user's
        monkeypatch.delenv(name, raising=False)
    code, out, err = generate(capsys, "-p", "a red circle", *SMALL, "-o", "circle.png")
    assert code == 0, err
    with Image.open(tmp_path / "circle.png") as image:
        assert image.format == "PNG" and image.size == (64, 48) and image.mode == "RGB"
    assert "timings (numpy, fp32, BLAS threads 1):" in out  # the demo model's size: one thread
    for row in ("tokenize", "T5 encoder", "step 1", "step 2", "sampling", "total"):
        assert row in out
    assert "step 3" not in out
    assert out.strip().endswith("circle.png")
    assert len(np.unique(read_pixels(tmp_path / "circle.png"))) > 10  # not a flat image


def test_png_permissions_follow_umask(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        assert generate(capsys, "-p", "a circle", *SMALL, "-q", "-o", "circle.png")[0] == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "circle.png").stat().st_mode) == 0o644


def test_same_seed_same_bytes_other_seed_or_prompt_other_image(tmp_path, capsys):
    for name, prompt, seed in (("a", "a red circle", "1"), ("b", "a red circle", "1"),
                               ("c", "a red circle", "2"), ("d", "a blue square", "1")):
        assert generate(capsys, "-p", prompt, "-s", seed, *SMALL, "-q", "-o", f"{name}.png")[0] == 0
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    a = read_pixels(tmp_path / "a.png").astype(int)
    assert np.abs(a - read_pixels(tmp_path / "c.png")).mean() > 1.0
    assert np.abs(a - read_pixels(tmp_path / "d.png")).max() > 0


def test_batch_count_images_equal_single_runs_with_seed_plus_i(tmp_path, capsys):
    code, out, _ = generate(capsys, "-p", "a circle", "-s", "5", "-b", "2", *SMALL, "-q", "-o", "circles.png")
    assert code == 0
    assert not (tmp_path / "circles.png").exists()
    assert out.split() == ["circles_0.png", "circles_1.png"]
    for i in range(2):
        assert generate(capsys, "-p", "a circle", "-s", str(5 + i), *SMALL, "-q", "-o", f"single{i}.png")[0] == 0
        np.testing.assert_array_equal(read_pixels(tmp_path / f"circles_{i}.png"), read_pixels(tmp_path / f"single{i}.png"))
    assert not np.array_equal(read_pixels(tmp_path / "circles_0.png"), read_pixels(tmp_path / "circles_1.png"))


def test_preview_dir_gets_one_png_per_step(tmp_path, capsys):
    code, _, _ = generate(capsys, "-p", "a circle", "--steps", "3", "-W", "64", "-H", "48", "-q",
                          "--preview-dir", "previews/run", "-o", "circle.png")
    assert code == 0
    previews = sorted((tmp_path / "previews" / "run").iterdir())
    assert [p.name for p in previews] == ["step_001.png", "step_002.png", "step_003.png"]
    for path in previews:
        with Image.open(path) as image:
            assert image.size == (64, 48)
    # the last step with the default a_min lands on the guided x0 that the last preview shows
    assert np.abs(read_pixels(previews[-1]).astype(int) - read_pixels(tmp_path / "circle.png")).max() <= 1


def test_size_steps_and_guidance_default_to_the_models(tmp_path, capsys, monkeypatch):
    """The demo model's config says 64 x 64 and its own steps and guidance, not MiniT2I's 512,
    100 and 6.0; a flag given by the user still wins."""
    transformer = DEMO_MODEL_DIR / "transformer" / "config.json"
    sampling = json.loads(transformer.read_text())["sampling"]
    code, out, _ = generate(capsys, "-p", "a circle", "-o", "default.png")
    assert code == 0
    with Image.open(tmp_path / "default.png") as image:
        assert image.size == (64, 64)
    assert f"steps 4-{sampling['steps']} (mean)" in out

    class Stop(Exception):
        pass

    def record(model, runner, request, on_step=None, noise=None, threads=None):
        seen.append(request)
        raise Stop

    seen = []
    monkeypatch.setattr(api, "generate", record)
    with pytest.raises(Stop):
        main(["generate", "-p", "a circle", "-q", "-o", "x.png", "--steps", "3"])
    assert (seen[0].steps, seen[0].cfg_scale, seen[0].width, seen[0].height) == (3, sampling["cfg_scale"], 64, 64)


def test_unknown_words_get_one_warning_line_listing_the_known_ones(tmp_path, capsys):
    code, _, err = generate(capsys, "-p", "a purple dragon, flying", "--steps", "1", "-q", "-o", "d.png")
    assert code == 0
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert warnings == [line for line in err.splitlines() if line]  # nothing else on stderr with -q
    assert len(warnings) == 1
    assert "'dragon', 'flying'" in warnings[0] and "purple" not in warnings[0].split("it knows")[0]
    assert "it knows: a small large red" in warnings[0]
    assert generate(capsys, "-p", "A Large, red circle!", "--steps", "1", "-q", "-o", "e.png")[2] == ""


def test_a_refused_run_says_its_error_and_no_word_warning(tmp_path, capsys, monkeypatch):
    """The unknown-word warning comes after every refusal (here: not enough memory for 2,000
    images), so that a refused run prints exactly one line."""
    monkeypatch.setattr(pipeline, "available_memory", lambda: 1024**3)
    code, _, err = generate(capsys, "-p", "a purple dragon", "-b", "2000", "-q", "-o", "d.png")
    assert code == 2
    assert err.splitlines() == [err.strip()] and err.startswith("minit2i: error: this run needs about"), err
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# User errors: one line, exit 2, no traceback, no file


def assert_user_error(tmp_path, capsys, args, words):
    code, out, err = generate(capsys, *args)
    assert code == 2
    errors = [line for line in err.splitlines() if line.startswith("minit2i: error:")]
    assert len(errors) == 1, err
    assert all(w in errors[0] for w in words), errors[0]
    assert "Traceback" not in err and "Traceback" not in out
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("args, words", [
    (["-W", "62"], ["--width 62", "multiple", "patch size 4", "60", "64"]),
    (["-H", "0"], ["--height", "[1, 16384]", "found 0"]),
    (["--steps", "0"], ["--steps", "[1, 10000]", "found 0"]),
    (["-b", "0"], ["--batch-count", "[1, 10000]", "found 0"]),
    (["--a-min", "0"], ["--a-min", "(0, 1]", "found 0.0"]),
    (["-n", "blurry"], ["negative prompt", "drop --negative-prompt"]),
    (["--precision", "fp16"], ["numpy backend runs fp32, fp64, not fp16"]),
    (["--model", "missing.safetensors", "--t5", "missing_t5"], ["missing.safetensors", "no such file"]),
    (["--t5", "missing_t5"], ["--model is missing", "MiniT2I/MiniT2I", "neither"]),
    (["-o", "no_such_folder/x.png"], ["no_such_folder", "does not exist"]),
    (["-o", "image.jpg"], ["image.jpg", ".png"]),
], ids=["width", "height", "steps", "batch", "a-min", "negative", "fp16", "missing-model", "no-model", "no-folder", "not-png"])
def test_bad_arguments(tmp_path, capsys, args, words):
    base = ["-p", "a circle", "--steps", "2", "-W", "64", "-H", "48", "-o", "out.png"]
    assert_user_error(tmp_path, capsys, base + args, words)


@pytest.mark.parametrize("prompt", ["", "   "])
def test_empty_prompt(tmp_path, capsys, prompt):
    assert_user_error(tmp_path, capsys, ["-p", prompt, *SMALL, "-o", "out.png"], ["prompt is empty"])


def test_unwritable_output_folder(tmp_path, capsys):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running with privileges that ignore folder permissions")
        assert_user_error(tmp_path, capsys, ["-p", "a circle", *SMALL, "-o", str(folder / "x.png")],
                          ["not writable"])
    finally:
        folder.chmod(0o700)


def test_output_folder_reported_unwritable(tmp_path, capsys, monkeypatch):
    """The same check where the test runs as root (os.access answers as for a normal user)."""
    real_access = os.access
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == "locked" else real_access(p, mode))
    assert_user_error(tmp_path, capsys, ["-p", "a circle", *SMALL, "-o", "locked/x.png"],
                      ["--output folder locked is not writable"])


def test_write_failure_is_one_line_and_leaves_no_part_file(tmp_path, capsys, monkeypatch):
    def disk_full(self, fp, format=None, **params):
        fp.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", disk_full)
    assert_user_error(tmp_path, capsys, ["-p", "a circle", *SMALL, "-o", "out.png"],
                      ["cannot write out.png", "No space left on device"])


def _cuda_device_count() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver or no device: all mean "no usable GPU"
        return 0


def test_cupy_backend_without_gpu_is_a_clear_error(tmp_path, capsys):
    if _cuda_device_count() > 0:
        pytest.skip("a CUDA GPU is usable here; this checks the message on machines without one")
    assert_user_error(tmp_path, capsys, ["-p", "a circle", *SMALL, "--backend", "cupy", "-o", "out.png"],
                      ["cupy", "--backend numpy"])


# ---------------------------------------------------------------------------------------------
# Failures mid-sampling leave nothing behind


def _fail_on_second_forward(monkeypatch, error):
    real = NumpyRunner.denoise
    calls = []

    def denoise(self, x, context, mask):
        calls.append(1)
        if len(calls) == 2:
            raise error
        return real(self, x, context, mask)

    monkeypatch.setattr(NumpyRunner, "denoise", denoise)


def test_crash_mid_sampling_leaves_no_file(tmp_path, capsys, monkeypatch):
    _fail_on_second_forward(monkeypatch, RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        main(["generate", "-p", "a circle", "--steps", "3", "-W", "64", "-H", "48", "-b", "2", "-o", "out.png"])
    assert leftovers(tmp_path) == []


def test_interrupt_mid_sampling_exits_130_and_leaves_no_file(tmp_path, capsys, monkeypatch):
    _fail_on_second_forward(monkeypatch, KeyboardInterrupt())
    code, _, err = generate(capsys, "-p", "a circle", "--steps", "3", "-W", "64", "-H", "48", "-o", "out.png")
    assert code == 130
    assert "interrupted" in err and "Traceback" not in err
    assert leftovers(tmp_path) == []


def test_cudasim_backend_draws_the_demo_model_like_numpy(tmp_path, capsys):
    """The CuPy twin on cudasim (CUDA kernels on the CPU), 32x32, 2 steps, CFG 6: its PNG is the
    numpy one within 1 level per pixel. fp32 kernels against the fp32 reference differ by a few
    float32 roundings (~1e-6 of the image scale, 127.5 levels per unit), so a pixel can only
    land across one uint8 rounding boundary."""
    paths = {}
    for backend in ("numpy", "cudasim"):
        paths[backend] = tmp_path / f"{backend}.png"
        assert main(["generate", "-p", "a red cat", "--steps", "2", "-W", "32", "-H", "32", "--backend", backend,
                     "-o", str(paths[backend]), "-q"]) == 0
    numpy_pixels, cudasim_pixels = (np.asarray(Image.open(paths[b])).astype(int) for b in ("numpy", "cudasim"))
    assert cudasim_pixels.shape == (32, 32, 3)
    assert np.abs(cudasim_pixels - numpy_pixels).max() <= 1


def test_cudasim_without_a_compiler_is_one_line(tmp_path, capsys, monkeypatch):
    """The check runs before any model work, so no kernel build can fail halfway with a traceback."""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert_user_error(tmp_path, capsys, ["-p", "a cat", "--backend", "cudasim", "-o", "out.png"],
                      ["cudasim", "g++", "x86-64 Linux", "--backend numpy"])
