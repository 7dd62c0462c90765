"""The watch-it-learn run's experiment switches (training/ablations.py, learn's --predict,
--positions, --caption-drop, --patch): each prediction is read back as the x0 it implies, the
positions switch removes exactly the signals it names, a short run of a switch writes its rows and
scores without an export, and a run resumes only with the switches that started it. The
ten-minute runs themselves are scripts/ablation_figures.py's, never repeated here."""

from __future__ import annotations

import contextlib
import dataclasses
import io

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch", reason="training needs the [train] extra (torch)")
from minit2i.core.weights import nest  # noqa: E402
from minit2i.reference.sampler import NOISE_SCALE  # noqa: E402
from minit2i.training import ablations, charts, learn, torch_model, train  # noqa: E402  (needs torch)


def path_point(seed: int = 0):
    """(x, eps, t [B, 1, 1, 1], x_t): a point of the training path for a batch of 3."""
    rng = np.random.default_rng(seed)
    x, eps = (torch.from_numpy(rng.standard_normal((3, 3, 8, 8), dtype=np.float32)) for _ in range(2))
    t = torch.tensor([0.2, 0.5, 0.9])[:, None, None, None]
    return x, eps, t, t * x + (1 - t) * NOISE_SCALE * eps


def test_each_prediction_of_the_true_target_gives_back_the_image():
    """The velocity x - 2 eps and the noise eps, read as the x0 they imply at (x_t, t), are the
    image up to float32 rounding: a few ulps of values ~4 divided by t >= 0.2 (atol 1e-5)."""
    x, eps, t, x_t = path_point()
    targets = {"x0": x, "velocity": x - NOISE_SCALE * eps, "noise": eps}
    for prediction, target in targets.items():
        np.testing.assert_allclose(ablations.x0_from(prediction, target, x_t, t, 0.05), x, atol=1e-5, err_msg=prediction)


def test_the_noise_reading_floors_t_where_the_noise_alone_says_nothing():
    """At t = 0, x_t is the noise: a noise guess off by 1 gives x0 = -2 / a_min, divided by the
    floor, not by 0 (x_t - 2 (eps + 1) rounds at an ulp of |2 eps| <= 8, 1e-6, over 0.05: atol 2e-5)."""
    _, eps, _, _ = path_point()
    x_t = NOISE_SCALE * eps
    np.testing.assert_allclose(ablations.x0_from("noise", eps + 1, x_t, 0.0, 0.05), np.full(x_t.shape, -40.0),
                               rtol=0, atol=2e-5)


def smoke_network(seed: int = 1):
    """Random smoke-size MMJiT weights (its zero-initialised last layer made random too), and inputs."""
    weights = train.initial_weights(train.SMOKE_MMJIT, train.SMOKE_T5, seed)
    weights = {k: v for k, v in weights.items() if k.startswith("mmjit.")}
    rng = np.random.default_rng(seed)
    for name in ("mmjit.final_layer.linear.weight", "mmjit.final_layer.linear.bias"):
        weights[name] = rng.standard_normal(weights[name].shape).astype(np.float32) * 0.1
    params = torch_model.to_torch_tree(nest({k[6:]: v for k, v in weights.items()}))
    config = train.SMOKE_MMJIT
    images = torch.from_numpy(rng.standard_normal((2, 3, config.image_size, config.image_size), dtype=np.float32))
    context = torch.from_numpy(rng.standard_normal((2, config.prompt_length, config.txt_input_size), dtype=np.float32))
    mask = torch.ones(2, config.prompt_length)
    return params, config, images, context, mask


def test_both_positions_is_the_model_forward_bit_for_bit():
    params, config, images, context, mask = smoke_network()
    assert torch.equal(torch_model.forward_with_positions(params, config, images, context, mask, torch_model.POSITIONS),
                       torch_model.mmjit_forward(params, config, images, context, mask))


def swap_patches(images, patch: int, a: int, b: int):
    """[B, C, H, W] with the patches at flat grid indices a and b exchanged (row-major)."""
    out = images.clone()
    cols = images.shape[3] // patch
    (ra, ca), (rb, cb) = divmod(a, cols), divmod(b, cols)
    pa = images[..., ra * patch:(ra + 1) * patch, ca * patch:(ca + 1) * patch]
    pb = images[..., rb * patch:(rb + 1) * patch, cb * patch:(cb + 1) * patch]
    out[..., ra * patch:(ra + 1) * patch, ca * patch:(ca + 1) * patch] = pb
    out[..., rb * patch:(rb + 1) * patch, cb * patch:(cb + 1) * patch] = pa
    return out


@pytest.mark.parametrize("positions, equivariant", [((), True), (("rope",), False), (("sincos",), False)])
def test_without_positions_moving_a_patch_only_moves_its_output(positions, equivariant):
    """With no position signal, attention cannot tell where a patch is: swapping two input patches
    swaps their outputs and changes nothing else (float32 sums in another order: atol 1e-5 on
    outputs ~1); with either signal the outputs change."""
    params, config, images, context, mask = smoke_network()
    p = config.patch_size
    out = torch_model.forward_with_positions(params, config, images, context, mask, positions)
    swapped = torch_model.forward_with_positions(params, config, swap_patches(images, p, 0, 37), context, mask, positions)
    difference = (swap_patches(swapped, p, 0, 37) - out).abs().max().item()
    assert (difference < 1e-5) == equivariant, difference


def run_learn(*argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = learn.main([str(a) for a in argv])
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue()


def test_a_short_run_of_a_switch_writes_its_rows_and_scores_and_no_export(tmp_path):
    folder = tmp_path / "velocity"
    code, printed = run_learn("--out", folder, "--steps", 2, "--eval-prompts", 2, "--predict", "velocity",
                              "--positions", "sincos", "--patch", 8, "--caption-drop", 0)
    assert code == 0
    assert sorted(p.name for p in (folder / "samples").iterdir()) == ["step-0000000.png", "step-0000001.png",
                                                                    "step-0000002.png"]
    assert printed.splitlines()[-1] == ("not exported: minit2i generate draws with the model's x0 prediction and "
                                        "both position signals")
    assert not (folder / "export").exists()
    # The loss curve draws the floor these switches predict (patch 8 velocity: 4 x 176/192 = 3.67).
    with Image.open(folder / "loss.png") as png:
        chart = np.asarray(png.convert("RGB"))
    assert (chart == charts.FLOOR).all(axis=-1).sum() > 200


def test_the_predicted_floors_are_the_hidden_noise_over_the_training_times():
    """The velocity floor is the hidden share of the noise's variance 4: 4 x 32/48 = 2.67 at patch 4,
    4 x 176/192 = 3.67 at patch 8, 1.33 through 32 channels, none through 48 (nothing hidden) or
    for x0. The noise's is that times E[1/max(t, a_min)^2], exactly 23.73 for the learn run's
    sigmoid(N(-0.8, 0.8)) floored at 0.05 (63.29), and 24.94 without the floor, the closed form
    1 + 2 e^(0.8 + 0.32) + e^(1.6 + 1.28) (66.52). A Monte Carlo mean of 4 million draws agrees
    within 4 of its standard errors (measured: 0.1 % relative)."""
    recipe = learn.LEARN_RECIPE
    floors = {(prediction, patch, bottleneck): ablations.predicted_floor(prediction, patch, bottleneck, recipe)
              for prediction, patch, bottleneck in (("velocity", 4, 16), ("velocity", 8, 16), ("velocity", 4, 32),
                                                    ("velocity", 4, 48), ("x0", 4, 16), ("noise", 4, 16))}
    assert floors.pop(("velocity", 4, 48)) is None and floors.pop(("x0", 4, 16)) is None
    assert floors == pytest.approx({("velocity", 4, 16): 8 / 3, ("velocity", 8, 16): 11 / 3,
                                    ("velocity", 4, 32): 4 / 3, ("noise", 4, 16): 63.2887}, rel=1e-5)
    unfloored = dataclasses.replace(recipe, a_min=1e-12)
    assert ablations.inverse_square_mean(unfloored) == pytest.approx(1 + 2 * np.exp(1.12) + np.exp(2.88), rel=1e-12)
    t = 1 / (1 + np.exp(-np.random.default_rng(0).normal(recipe.t_mu, recipe.t_sigma, 4_000_000)))
    for chosen in (recipe, unfloored):
        draws = 1 / np.maximum(t, chosen.a_min) ** 2
        error = draws.std() / np.sqrt(draws.size)
        assert abs(draws.mean() - ablations.inverse_square_mean(chosen)) < 4 * error


def test_a_run_resumes_only_with_the_switches_that_started_it(tmp_path, capsys):
    folder = tmp_path / "noise"
    assert run_learn("--out", folder, "--steps", 1, "--eval-prompts", 2, "--predict", "noise")[0] == 0
    before = (folder / "checkpoint.safetensors").read_bytes()
    capsys.readouterr()
    for other, changed in ((["--predict", "velocity"], '--predict (variant.predict "noise" -> "velocity")'),
                           (["--predict", "noise", "--caption-drop", "0.2"],
                            "--caption-drop (recipe.caption_drop 0.1 -> 0.2)"),
                           (["--predict", "noise", "--patch", "8"], "--patch (mmjit.patch_size 4 -> 8)"),
                           (["--predict", "noise", "--bottleneck", "48"], "--bottleneck (mmjit.pca_channels 16 -> 48)"),
                           ([], '--predict (variant.predict "noise" -> "x0")')):
        code, _ = run_learn("--out", folder, "--steps", 2, "--eval-prompts", 2, *other)
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert f"was made with other settings: {changed}; resume with the settings it was made with, or use " \
               "another --out folder" in err, err
    assert (folder / "checkpoint.safetensors").read_bytes() == before


@pytest.mark.parametrize("argv, words", [
    (["--caption-drop", "1.5"], ["--caption-drop", "1.5"]),
    (["--predict", "score"], ["--predict", "score"]),
    (["--positions", "alibi"], ["--positions", "alibi"]),
    (["--patch", "5"], ["--patch", "5"]),
    (["--bottleneck", "0"], ["--bottleneck", "found 0"]),
    (["--bottleneck", "193"], ["--bottleneck", "found 193"]),
])
def test_bad_switches_are_one_line_and_make_no_folder(argv, words, tmp_path, capsys):
    code, _ = run_learn("--out", tmp_path / "run", *argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and all(w in err for w in words), err
    assert not (tmp_path / "run").exists()


def test_the_model_variant_keeps_the_identity_of_runs_made_before_the_switches(tmp_path):
    """A run without switches has the checkpoint identity it had before they existed, so earlier
    runs still resume."""
    recipe = dataclasses.replace(learn.LEARN_RECIPE, steps=1)
    plain = train.Run(tmp_path / "a", recipe, learn.LEARN_MMJIT, learn.LEARN_T5)
    switched = ablations.AblationRun(tmp_path / "b", recipe, learn.LEARN_MMJIT, learn.LEARN_T5, ablations.Variant())
    assert switched.identity() == plain.identity()
