"""`minit2i generate` and `info` on a Mean Flow student: its recipe, its flags, its bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from minit2i.cli import main
from minit2i.core.images import to_pixels
from minit2i.core.weights import nest
from minit2i.pipeline import load_model
from minit2i.reference.mean_flow import mean_flow_forward
from minit2i.reference.mean_flow_sampler import sample_mean_flow
from minit2i.reference.sampler import initial_noise


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def student_args(tiny_student):
    transformer, t5 = tiny_student
    return ["--model", str(transformer), "--t5", str(t5)]


def read_pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def expected_pixels(tiny_student, prompt, seed, steps, omega, interval):
    """The same image computed here from the reference's own pieces, without the pipeline."""
    model = load_model(*tiny_student)
    ids, mask = model.tokenizer([prompt])
    from minit2i.reference.t5 import t5_encode

    context = t5_encode(nest(model.t5.tensors), model.t5.config, ids, mask.astype(np.float32))
    params, config = nest(model.mmjit.tensors), model.mmjit.config

    def denoise(x, h, om, t_min, t_max, ctx, msk):
        return mean_flow_forward(params, config, x, h, om, t_min, t_max, ctx, msk)

    noise = initial_noise(seed, 1, 3, config.image_size, config.image_size)
    image = sample_mean_flow(denoise, noise, context, mask.astype(np.float32), steps, omega, interval)
    return to_pixels(image)[0]


def test_student_draws_in_four_steps_with_its_recipe(tiny_student, tmp_path, capsys):
    code, out, err = run(capsys, "generate", "-p", "a red cat", *student_args(tiny_student), "-o", "cat.png")
    assert code == 0, err
    assert "step 4" in out and "step 5" not in out
    got = read_pixels(tmp_path / "cat.png")
    assert got.shape == (64, 64, 3)
    np.testing.assert_array_equal(got, expected_pixels(tiny_student, "a red cat", 42, 4, 12.0, (0.2, 0.8)))


def test_steps_guidance_and_interval_flags_reach_the_student(tiny_student, tmp_path, capsys):
    code, out, err = run(capsys, "generate", "-p", "a red cat", *student_args(tiny_student), "-o", "cat.png",
                         "--steps", "2", "--cfg-scale", "3.5", "--guidance-interval", "0.1", "0.6", "-s", "7")
    assert code == 0, err
    assert "step 2" in out and "step 3" not in out
    got = read_pixels(tmp_path / "cat.png")
    np.testing.assert_array_equal(got, expected_pixels(tiny_student, "a red cat", 7, 2, 3.5, (0.1, 0.6)))
    default = expected_pixels(tiny_student, "a red cat", 7, 2, 12.0, (0.2, 0.8))
    assert np.abs(got.astype(int) - default).max() > 0  # the flags changed the image


def test_preview_dir_gets_one_x0_per_step(tiny_student, tmp_path, capsys):
    code, _, err = run(capsys, "generate", "-p", "a red cat", *student_args(tiny_student), "-o", "cat.png",
                       "--preview-dir", "steps", "-q")
    assert code == 0, err
    previews = sorted(p.name for p in (tmp_path / "steps").iterdir())
    assert previews == [f"step_00{i}.png" for i in range(1, 5)]
    # the last step lands on the predicted x0 (model.md 9.4): its preview is the image
    np.testing.assert_array_equal(read_pixels(tmp_path / "steps" / "step_004.png"), read_pixels(tmp_path / "cat.png"))


def test_info_names_the_student_and_its_recipe(tiny_student, capsys):
    code, out, err = run(capsys, "info", str(tiny_student[0]))
    assert code == 0, err
    assert out.startswith("MiniT2I Mean Flow student")
    assert "num_time_tokens=2" in out
    assert "sampler:    Mean Flow, one forward per step: 4 steps, guidance 12.0 (a network input) in the interval " \
           "0.2-0.8, 64x64" in out


@pytest.mark.parametrize("flags, words", [
    (["--a-min", "0.05"], "--a-min is the floor of the base sampler's 1 - t"),
    (["--cfg-scale", "0.5"], "--cfg-scale (guidance_scale) for a Mean Flow student (omega, 1 = no guidance) must be a number in [1, "),
    (["--guidance-interval", "0.9", "0.1"], "--guidance-interval 0.9 0.1 is empty: give the smaller end first, e.g. "
                                            "0.1 0.9"),
    (["--guidance-interval", "0.2", "1.5"], "--guidance-interval must be a number in [0, 1], found 1.5"),
])
def test_bad_student_flags_are_one_line_and_exit_2(tiny_student, tmp_path, capsys, flags, words):
    code, out, err = run(capsys, "generate", "-p", "a red cat", *student_args(tiny_student), "-o", "cat.png",
                         *flags)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and words in err
    assert not (tmp_path / "cat.png").exists()


def test_guidance_interval_is_refused_for_a_base_model(tiny_model, tmp_path, capsys):
    transformer, t5 = tiny_model
    code, _, err = run(capsys, "generate", "-p", "a red cat", "--model", str(transformer), "--t5", str(t5),
                       "-o", "cat.png", "--guidance-interval", "0.2", "0.8")
    assert code == 2 and err.count("\n") == 1
    assert "--guidance-interval is an input of Mean Flow students" in err
    assert not (tmp_path / "cat.png").exists()


def test_cudasim_backend_draws_the_same_image(tiny_student, tmp_path, capsys):
    """The CuPy twin on cudasim, fp32: the whole sampler is within 2e-4 of the reference relative
    to max|x| (tests/test_accelerated_mean_flow.py; measured 5e-7). Pixels are floor(127.5 x + 128),
    so with max|x| < 4 the image moves by < 0.1 level and a pixel can only flip to the next level
    where x sits on a level boundary: every pixel within 1 level."""
    args = ["generate", "-p", "a red cat", *student_args(tiny_student), "-q"]
    assert run(capsys, *args, "-o", "numpy.png")[0] == 0
    code, _, err = run(capsys, *args, "-o", "cudasim.png", "--backend", "cudasim")
    assert code == 0, err
    a, b = read_pixels(tmp_path / "numpy.png").astype(int), read_pixels(tmp_path / "cudasim.png").astype(int)
    assert np.abs(a - b).max() <= 1
    assert np.mean(a != b) < 0.01


@pytest.mark.parametrize("value, words", [
    ("0.2-0.8", 'sampling.guidance_interval must be two numbers t_min t_max in [0, 1], found "0.2-0.8" (a string)'),
    ([0.8, 0.2], "sampling.guidance_interval 0.8 0.2 is empty"),
])
def test_bad_guidance_interval_in_config_json_is_one_line(tiny_student, tmp_path, capsys, value, words):
    transformer = tmp_path / "transformer"
    shutil.copytree(tiny_student[0], transformer)
    config = json.loads((transformer / "config.json").read_text())
    (transformer / "config.json").write_text(json.dumps(config | {"sampling": {"guidance_interval": value}}))
    code, _, err = run(capsys, "generate", "-p", "a red cat", "--model", str(transformer), "--t5",
                       str(tiny_student[1]), "-o", "cat.png")
    assert code == 2 and err.count("\n") == 1 and words in err
    assert not (tmp_path / "cat.png").exists()
