"""The shipped demo models draw what the prompt says (a regression test of the trained weights).

Both demo models are held to it: the base demo model (20 Euler steps) and the four-step
student distilled from it (`--model demo-mf`). The full evaluation (training/evaluate.py,
docs/demo-model.md) draws 192 images per model; CI draws a dozen through the same `generate`
path and holds them to floors set below the full table, so that a broken loader, tokenizer,
sampler default or a damaged model file fails here.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from minit2i.cli import main
from minit2i.demo_models import DEMO_MODELS
from minit2i.pipeline import load_model, sampling_defaults
from minit2i.training import shapes
from minit2i.training.evaluate import (
    ATTRIBUTES,
    accuracy_report,
    classify,
    evaluation_scenes,
    generate_scenes,
    model_folders,
)
from minit2i.training.probe import main as probe_main
from minit2i.training.probe import noised, probe

MODELS = list(DEMO_MODELS)

# Held-in accuracy of the full evaluation over 128 images, per model and attribute (docs/demo-model.md).
FULL_EVALUATION = {
    "demo": {"background": 1.0, "colour": 1.0, "position": 1.0, "size": 1.0, "shape": 0.98},
    "demo-mf": {"background": 1.0, "colour": 1.0, "position": 1.0, "size": 1.0, "shape": 0.97},
}


def sample_floor(accuracy: float, images: int = 8) -> float:
    """The floor for a sample of `images`: `accuracy` less one image, rounded down to a whole
    image. 100 % over 128 images still allows a rate of about 2 % (the 95 % upper bound for no
    failure in 128 is 3/128), which a sample of 8 meets with one failure one time in six, as an
    earlier demo model did here (a stray blob below a small triangle read as a large shape); two
    failures in 8 at that rate happen one time in seventy."""
    return np.floor((accuracy - 1 / images) * images + 1e-9) / images


HELD_IN_FLOORS = {name: {a: sample_floor(v) for a, v in full.items()} for name, full in FULL_EVALUATION.items()}
# The background error (99th percentile, levels) on the sample: the goal of at most 4 levels
# (docs/demo-model.md), which the full evaluations meet at 1-3 per background and this sample,
# seed 0, at 2, plus one level for a pixel rounded the other way under another BLAS. A patch grid
# that came back (the first-stage model, 5-8 in its full evaluation, read 9 on it) or noise left
# in the image fails it.
BACKGROUND_ERROR_LIMIT = 5


def model_flags(name: str) -> list[str]:
    return [] if name == "demo" else ["--model", name]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("prompt, scene", [
    ("a small green triangle at the right on a gray background",
     {"background": "gray", "colour": "green", "position": "right", "size": "small", "shape": "triangle"}),
    ("a small blue square at the top on a white background",
     {"background": "white", "colour": "blue", "position": "top", "size": "small", "shape": "square"}),
])
def test_a_prompt_draws_exactly_that_scene(name, prompt, scene, tmp_path):
    out = tmp_path / "x.png"
    assert main(["generate", *model_flags(name), "-p", prompt, "-o", str(out), "-q"]) == 0
    with Image.open(out) as image:
        assert image.size == (64, 64)
        assert classify(np.asarray(image.convert("RGB"))) == scene


@pytest.mark.parametrize("name", MODELS)
def test_a_small_evaluation_meets_its_floors(name):
    scenes = evaluation_scenes(8, seeds=1, held_out_prompts=4)
    report = accuracy_report(scenes, generate_scenes(scenes, name))
    assert report["counts"] == {"held_in": 8, "held_out": 4}
    short = {a: report["held_in"][a] for a in ATTRIBUTES if report["held_in"][a] < HELD_IN_FLOORS[name][a]}
    assert short == {}, report
    assert max(report["background_error"].values()) <= BACKGROUND_ERROR_LIMIT, report["background_error"]


def test_evaluation_settings_replace_the_model_defaults():
    """`evaluate --steps/--cfg-scale` reach the sampler: the model's own settings given explicitly
    draw its default image, and one step without guidance, the network's single x0 guess, differs
    from the 20-step guided default by far more than rounding."""
    scenes = evaluation_scenes(1, seeds=1, held_out_prompts=0)
    default, = generate_scenes(scenes, "demo")
    again, = generate_scenes(scenes, "demo", settings=sampling_defaults(load_model(*model_folders("demo"))))
    one_step, = generate_scenes(scenes, "demo", settings={"steps": 1, "cfg_scale": 1.0})
    assert np.array_equal(default, again)
    assert np.abs(default.astype(int) - one_step).max() > 50


def test_info_describes_both_demo_models(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("demo: the demo model, a tiny MiniT2I trained on procedural coloured shapes")
    assert "Euler x0 -> v" in out and "20 steps" in out and "64x64" in out
    assert "words:      a small large red orange" in out and "also:       demo-mf" in out
    assert str(DEMO_MODELS["demo"][0].parent) in out and "T5 encoder" in out and "MMJiT" in out
    assert main(["info", "demo-mf"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("demo-mf: the demo model distilled into a four-step Mean Flow student")
    assert "Mean Flow, one forward per step: 4 steps" in out and "(T5: " in out
    assert "Mean Flow student" in out and "--model demo-mf" in out


def test_a_path_named_like_a_demo_model_wins(tmp_path, monkeypatch, capsys):
    """`--model demo-mf` names the demo student unless a file or folder of that name exists
    (as a path wins over a Hub repo id)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo-mf").mkdir()
    assert main(["generate", "--model", "demo-mf", "-p", "a red circle", "-o", "x.png", "-q"]) == 2
    assert "demo-mf" in capsys.readouterr().err and not (tmp_path / "x.png").exists()


def test_noising_follows_the_training_convention():
    """x_t = t x + (1 - t) 2 eps: t = 1 is the image itself; t = 0 is noise of standard deviation 2,
    whose estimate over 3 x 64 x 64 values is within 3 % of it (the standard error is 1.1 %)."""
    clean = shapes.to_model_range(shapes.render(shapes.all_scenes()[0])[None])
    assert np.array_equal(noised(clean, 1.0), clean)
    assert abs(noised(np.zeros_like(clean), 0.0).std() - 2.0) < 0.06


PROBE_SCENES = shapes.all_scenes()[::150]  # 7 held-in scenes, small and large


def shapes_kept_at_099(model: str) -> int:
    """How many of PROBE_SCENES the model's x0 prediction at t = 0.99 keeps the shape of, after
    checking that the checker reads every input (the image to within 2 % noise) back."""
    report = probe(model, [0.99], PROBE_SCENES)[0.99]
    assert report["input"] == {"small": 1.0, "large": 1.0}
    sizes = [s.size for s in PROBE_SCENES]
    return round(sum(report["prediction"][size] * sizes.count(size) for size in set(sizes)))


def test_the_probe_reads_nearly_clean_inputs_and_predictions_back():
    """The demo model's x0 prediction from a nearly clean input keeps the shape of all 7 scenes
    (100 % and 99 % over every held-in scene, docs/demo-model-trials.md), held to 6: one scene of slack
    for BLAS rounding at a checker boundary."""
    assert shapes_kept_at_099("demo") >= 6


def test_the_probe_reads_a_student_through_its_flow_matching_prediction():
    """The student's h = 0 prediction from a nearly clean input is a drawing of the scene: the
    shipped student keeps the shape of all 7 scenes (100 % and 97 % over every held-in scene,
    docs/demo-model-trials.md), held to 6: one scene of slack for BLAS rounding at a checker boundary."""
    assert shapes_kept_at_099("demo-mf") >= 6


@pytest.mark.parametrize("argv, words", [
    (["--t", "0"], "--t must be"),
    (["--t5", "nowhere/at/all"], "--t5"),
    (["--model", "nowhere/at/all"], "--model"),
])
def test_bad_probe_arguments_are_one_line(argv, words, capsys):
    assert probe_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("probe: error:") and err.count("\n") == 1 and words in err, err


def test_a_weight_beyond_float16_is_refused_before_anything_is_written(tmp_path):
    """3e38 is a finite float32 that float16 (largest 65504) would store as infinity: the export names
    the tensor and writes no folder, instead of shipping a model that draws NaN."""
    from minit2i.core.errors import MiniT2IError
    from minit2i.core.mmjit_config import MMJIT_TINY
    from minit2i.demo_models import random_mmjit_weights, save_transformer

    weights = random_mmjit_weights(MMJIT_TINY, 0)
    weights["final_layer.linear.weight"] = weights["final_layer.linear.weight"] * np.float32(3e38)
    with pytest.raises(MiniT2IError, match=r"final_layer\.linear\.weight holds values beyond the range of float16"):
        save_transformer(tmp_path / "transformer", MMJIT_TINY, weights, np.float16)
    assert not (tmp_path / "transformer").exists()
