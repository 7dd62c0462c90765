"""`MiniT2IPipeline`, the Python API: the same pixels and the same error lines as `minit2i generate`,
batches and seeds, output types, the per-step callback, the Mean Flow student and cudasim."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from minit2i import MiniT2IPipeline
from minit2i.cli import main
from minit2i.core.errors import MiniT2IError
from minit2i.reference.sampler import time_grid

PROMPT = "a large red circle at the left on a gray background"
# Two steps at 16 x 16 (4 x 4 patches of the demo model's 4 x 4 pixels): enough to tell images apart.
SMALL = {"num_inference_steps": 2, "height": 16, "width": 16}
SMALL_FLAGS = ["--steps", "2", "-H", "16", "-W", "16"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def pipe():
    pipe = MiniT2IPipeline.from_pretrained("demo")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def cli_png(capsys, tmp_path, *flags) -> np.ndarray:
    """The pixels of the PNG `minit2i generate FLAGS` writes."""
    path = tmp_path / "cli.png"
    code = main(["generate", *flags, "-q", "-o", str(path)])
    assert code == 0, capsys.readouterr().err
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def cli_error(capsys, *flags) -> str:
    """The message of the one error line `minit2i generate FLAGS` prints (after `minit2i: error: `)."""
    assert main(["generate", *flags, "-q", "-o", "never.png"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("minit2i: error: "), lines
    return lines[0].removeprefix("minit2i: error: ")


def api_error(call) -> str:
    with pytest.raises(MiniT2IError) as caught:
        call()
    return str(caught.value)


# ---------------------------------------------------------------------------------------------
# The same pixels as the command line


def test_demo_image_equals_the_png_of_generate_pixel_for_pixel(pipe, capsys, tmp_path):
    """The README's example, against `minit2i generate -p ... -s 1` (the model's own 20 steps at 64 x 64)."""
    image = pipe(PROMPT, generator=1).images[0]
    assert isinstance(image, Image.Image) and image.mode == "RGB" and image.size == (64, 64)
    expected = cli_png(capsys, tmp_path, "-p", PROMPT, "-s", "1")
    np.testing.assert_array_equal(np.asarray(image), expected)
    assert len(np.unique(expected)) > 10  # a picture, not a flat image


def test_student_image_equals_generate_with_demo_mf(capsys, tmp_path):
    """demo-mf by name, its own recipe (4 steps, 64 x 64, its guidance interval), and a given interval."""
    student = MiniT2IPipeline.from_pretrained("demo-mf")
    student.set_progress_bar_config(disable=True)
    for interval, flags in ((None, []), ((0.1, 0.6), ["--guidance-interval", "0.1", "0.6"])):
        output = student(PROMPT, generator=3, guidance_interval=interval, output_type="np")
        assert output.images.shape == (1, 64, 64, 3) and len(output.step_times) == 4
        expected = cli_png(capsys, tmp_path, "--model", "demo-mf", "-p", PROMPT, "-s", "3", *flags)
        np.testing.assert_array_equal(output.images[0], expected)


def test_cudasim_backend_draws_like_numpy(pipe):
    """The CuPy twin on cudasim, one step at 16 x 16: within 1 level per pixel of the numpy image.
    fp32 kernels against the fp32 reference differ by a few float32 roundings (~1e-6 of the image
    scale, 127.5 levels per unit), so a pixel can only land across one uint8 rounding boundary."""
    cudasim = MiniT2IPipeline.from_pretrained("demo", backend="cudasim")
    cudasim.set_progress_bar_config(disable=True)
    call = {"num_inference_steps": 1, "height": 16, "width": 16, "generator": 4, "output_type": "np"}
    got, expected = cudasim(PROMPT, **call).images, pipe(PROMPT, **call).images
    assert got.shape == (1, 16, 16, 3)
    assert np.abs(got.astype(int) - expected).max() <= 1


# ---------------------------------------------------------------------------------------------
# Batches, seeds and generators


def test_prompts_times_images_per_prompt_are_seeded_as_one_batch(pipe):
    """Image k of a list of prompts, `num_images_per_prompt` each, is the single image of seed + k:
    prompt-major as diffusers orders them, and as `generate -b` seeds a batch."""
    prompts = ["a red circle", "a blue square"]
    batch = pipe(prompts, num_images_per_prompt=2, generator=5, output_type="np", **SMALL).images
    assert batch.shape == (4, 16, 16, 3) and batch.dtype == np.uint8
    for k in range(4):
        single = pipe(prompts[k // 2], generator=5 + k, output_type="np", **SMALL).images[0]
        np.testing.assert_array_equal(batch[k], single)
    assert not np.array_equal(batch[0], batch[1]) and not np.array_equal(batch[0], batch[2])


def test_pil_and_np_outputs_hold_the_same_pixels(pipe):
    arrays = pipe(PROMPT, num_images_per_prompt=2, generator=8, output_type="np", **SMALL).images
    images = pipe(PROMPT, num_images_per_prompt=2, generator=8, **SMALL).images
    assert [image.size for image in images] == [(16, 16)] * 2
    np.testing.assert_array_equal(np.stack([np.asarray(image) for image in images]), arrays)


def test_numpy_generators_draw_the_noise_as_seeds_do(pipe):
    """default_rng(s) gives image 0 the pixels of seed s, a list [default_rng(s + k)] the whole
    batch of seed s; one Generator moves on, so calling again with it gives another image."""
    seeded = pipe(PROMPT, num_images_per_prompt=2, generator=11, output_type="np", **SMALL).images
    rng = np.random.default_rng(11)
    first = pipe(PROMPT, generator=rng, output_type="np", **SMALL).images[0]
    np.testing.assert_array_equal(first, seeded[0])
    again = pipe(PROMPT, generator=rng, output_type="np", **SMALL).images[0]
    assert np.abs(again.astype(int) - first).mean() > 1.0
    listed = pipe(PROMPT, num_images_per_prompt=2, output_type="np",
                  generator=[np.random.default_rng(11 + k) for k in range(2)], **SMALL).images
    np.testing.assert_array_equal(listed, seeded)


def test_no_generator_is_seed_42_as_on_the_command_line(pipe, capsys, tmp_path):
    image = pipe("a blue square", output_type="np", **SMALL).images[0]
    np.testing.assert_array_equal(image, cli_png(capsys, tmp_path, "-p", "a blue square", *SMALL_FLAGS))


# ---------------------------------------------------------------------------------------------
# The callback and the timings


def test_callback_on_step_end_sees_every_step_in_order(pipe):
    """diffusers' signature (pipe, step_index, timestep, callback_kwargs), after each step: the
    sampler's t, the state [N, 3, H, W] ("latents", the last one is the image) and the x0
    prediction; the default a_min lands the last step on its x0 (up to one rounding)."""
    calls = []

    def record(seen_pipe, step_index, timestep, callback_kwargs):
        assert seen_pipe is pipe
        calls.append((step_index, timestep, callback_kwargs["latents"].copy(), callback_kwargs["x0"].copy()))

    output = pipe(PROMPT, num_images_per_prompt=2, generator=2, output_type="np", callback_on_step_end=record,
                  num_inference_steps=3, height=16, width=16)
    assert [index for index, *_ in calls] == [0, 1, 2]
    np.testing.assert_array_equal([t for _, t, _, _ in calls], time_grid(3)[:-1])
    for _, _, latents, x0 in calls:
        assert latents.shape == x0.shape == (2, 3, 16, 16)
    np.testing.assert_array_equal(pipe.to_pixels(calls[-1][2]), output.images)
    assert np.abs(pipe.to_pixels(calls[-1][3]).astype(int) - output.images).max() <= 1


def test_timings_cover_every_stage_and_step(pipe):
    output = pipe(PROMPT, generator=1, **SMALL)
    assert set(output.timings) == {"tokenize", "t5", "sampling", "total"}
    assert len(output.step_times) == 2 and all(t > 0 for t in output.step_times)
    assert output.timings["total"] >= output.timings["sampling"] > 0  # the run's span holds the sampler's
    table = output.timing_table().splitlines()
    assert table[0] == f"timings (numpy, fp32, BLAS threads {output.blas_threads}):"
    assert [line.split()[0] for line in table[1:]] == ["tokenize", "T5", "step", "step", "sampling", "total"]


def test_import_minit2i_loads_no_model_code():
    """`import minit2i` stays light: the API is imported on first use of its name."""
    code = "import sys, minit2i; print([m for m in ('numpy', 'torch', 'cupy', 'minit2i.api') if m in sys.modules])"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


# ---------------------------------------------------------------------------------------------
# Bad arguments: the command line's line, before any tensor is read


BASE_FLAGS = ["-p", "a circle", *SMALL_FLAGS]


@pytest.mark.parametrize("keywords, flags", [
    ({"prompt": ""}, ["-p", ""]),
    ({"prompt": "!!"}, ["-p", "!!"]),
    ({"num_inference_steps": 0}, ["--steps", "0"]),
    ({"guidance_scale": float("nan")}, ["--cfg-scale", "nan"]),
    ({"width": 62}, ["-W", "62"]),
    ({"height": 0}, ["-H", "0"]),
    ({"num_images_per_prompt": 0}, ["-b", "0"]),
    ({"generator": -1}, ["-s", "-1"]),
    ({"a_min": 0.0}, ["--a-min", "0"]),
    ({"negative_prompt": "blurry"}, ["-n", "blurry"]),
    ({"guidance_interval": (0.2, 0.8)}, ["--guidance-interval", "0.2", "0.8"]),
], ids=["empty", "no-word", "steps", "cfg", "width", "height", "images", "seed", "a-min", "negative", "interval"])
def test_bad_call_argument_is_the_command_line_message(capsys, keywords, flags):
    """The same text, and refused before the tensors are read (the pipeline opened, not loaded)."""
    pipe = MiniT2IPipeline.open("demo")
    call = {"prompt": "a circle", **SMALL} | keywords
    message = api_error(lambda: pipe(**call))
    assert message == cli_error(capsys, *BASE_FLAGS, *flags)
    assert pipe.model is None


@pytest.mark.parametrize("keywords, flags", [
    ({"pretrained_model_name_or_path": "no-such-model"}, ["--model", "no-such-model"]),
    ({"backend": "tpu"}, ["--backend", "tpu"]),
    ({"precision": "fp8"}, ["--precision", "fp8"]),
], ids=["model", "backend", "precision"])
def test_bad_model_argument_is_the_command_line_message(capsys, keywords, flags):
    message = api_error(lambda: MiniT2IPipeline.from_pretrained(**({"pretrained_model_name_or_path": "demo"}
                                                                    | keywords)))
    assert message == cli_error(capsys, *BASE_FLAGS, *flags)


def test_messages_name_the_flag_and_the_keyword(pipe):
    assert api_error(lambda: pipe(PROMPT, num_inference_steps=0)) == (
        "--steps (num_inference_steps) must be an integer in [1, 10000], found 0")
    assert api_error(lambda: pipe(PROMPT, num_images_per_prompt=1.5)) == (
        "--batch-count (num_images_per_prompt) must be an integer in [1, 10000], found 1.5")


@pytest.mark.parametrize("keywords, words", [
    ({"prompt": []}, "the list of prompts is empty"),
    ({"prompt": ["a circle", 3]}, "the prompt must be a string, found int"),
    ({"generator": "7"}, ("--seed (generator) must be an integer seed, a numpy.random.Generator or a list of "
                          "them (one per image), found str")),
    ({"generator": True}, "--seed (generator) must be an integer in [0, 9223372036854775807], found True"),
    ({"generator": [np.random.default_rng(0)]},
     "generator is a list of 1 numpy Generators but the call makes 2 image(s)"),
    ({"output_type": "latent"}, "output_type must be one of 'pil', 'np', found 'latent'"),
    ({"callback_on_step_end": "print"}, "callback_on_step_end must be a function"),
], ids=["no-prompt", "not-text", "generator-type", "generator-bool", "generator-count", "output-type", "callback"])
def test_arguments_only_python_has_are_refused_in_one_line(keywords, words):
    pipe = MiniT2IPipeline.open("demo")
    call = {"prompt": "a circle", "num_images_per_prompt": 2, **SMALL} | keywords
    assert api_error(lambda: pipe(**call)).startswith(words)
    assert pipe.model is None
