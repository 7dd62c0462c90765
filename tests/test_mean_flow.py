"""The Mean Flow student and its sampler against a plain float64 re-computation (model.md 9).

The student re-computation writes the prefix out by hand from model.md 9.1 (the sinusoid per
frequency, the two-layer embedders, the five groups in their order, omega as 1 - 1/omega, the
pooled prompt after masking) and brings it, with the angles of 9.2 (preamble: every text row
rotated at its position; double blocks: prefix rows at angle 0, T5 rows at positions A..A+L-1),
to tests/plain_model.py's MMJiT body. Configuration: every prefix group active with different
sizes (3, 2, 1, 1, 2 tokens), 3 heads of 20 (a quarter of the head dim is odd: 5 frequencies
per image axis, as L/16's 52 has 13), width 60, a 48 x 64 image, 8 text tokens, three mask rows:
full, partly masked, all zero.
"""

from __future__ import annotations

import numpy as np
import pytest
from plain_model import as_float64, masked_context, plain_body, text_angles_at

from minit2i.core.mean_flow_config import MeanFlowConfig
from minit2i.core.weights import nest
from minit2i.demo_models import random_mmjit_weights
from minit2i.reference.mean_flow import mean_flow_forward
from minit2i.reference.mean_flow_sampler import mean_flow_step_factors, sample_mean_flow, step_lengths
from minit2i.reference.sampler import initial_noise

CONFIG = MeanFlowConfig(image_size=64, patch_size=16, txt_input_size=48, hidden_size=60, depth_double=2,
                        txt_preamble_depth=2, num_heads=3, head_dim=20, pca_channels=8, prompt_length=8,
                        cond_vec_size=60, num_context_tokens=3, num_cfg_tokens=2, num_interval_tokens=1,
                        num_time_tokens=2, frequency_embedding_size=12)
HEIGHT, WIDTH, TEXT_LENGTH, PREFIX = 48, 64, 8, 3 + 2 + 1 + 1 + 2
SCALARS = {"h": np.array([0.25, 0.5, 0.1]), "omega": np.array([12.0, 1.0, 3.5]),
           "t_min": np.array([0.2, 0.0, 0.3]), "t_max": np.array([0.8, 1.0, 0.6])}


@pytest.fixture(scope="module")
def weights():
    return random_mmjit_weights(CONFIG, seed=17)


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(5)
    images = rng.standard_normal((3, 3, HEIGHT, WIDTH))
    context = rng.standard_normal((3, TEXT_LENGTH, CONFIG.txt_input_size))
    mask = np.zeros((3, TEXT_LENGTH))
    mask[0] = 1.0
    mask[1, :3] = 1.0
    return images, context, mask


@pytest.fixture(scope="module")
def expected(weights, inputs):
    w = as_float64(weights)
    images, context, mask = inputs
    return np.stack([plain_student(w, images[b], context[b], mask[b], *(SCALARS[k][b] for k in SCALARS))
                     for b in range(3)])


# ---------------------------------------------------------------------------------------------
# The plain re-computation of the prefix (model.md 9.1, 9.2)


def plain_sinusoid(value, dim):
    half = dim // 2
    freqs = [np.exp(-np.log(10000.0) * k / half) for k in range(half)]
    return np.array([np.cos(value * f) for f in freqs] + [np.sin(value * f) for f in freqs])


def plain_embedder(w, name, value):
    hidden = w[f"{name}.mlp.0.weight"] @ plain_sinusoid(value, CONFIG.frequency_embedding_size) + w[f"{name}.mlp.0.bias"]
    hidden = hidden / (1.0 + np.exp(-hidden))
    return w[f"{name}.mlp.2.weight"] @ hidden + w[f"{name}.mlp.2.bias"]


def plain_student(w, image, context, mask, h, omega, t_min, t_max, rotate_prefix=False):
    masked = masked_context(w, context, mask)
    pooled = masked.mean(axis=0)
    groups = [
        (w["context_tokens"][0], w["aux_pooled_embedder.weight"] @ pooled),
        (w["omega_tokens"][0], plain_embedder(w, "omega_embedder", 1.0 - 1.0 / omega)),
        (w["t_min_tokens"][0], plain_embedder(w, "t_min_embedder", t_min)),
        (w["t_max_tokens"][0], plain_embedder(w, "t_max_embedder", t_max)),
        (w["time_tokens"][0], plain_embedder(w, "h_embedder", h)),
    ]
    prefix = np.concatenate([rows + vector for rows, vector in groups])
    txt = np.concatenate([prefix, masked @ w["txt_embedder.weight"].T])
    preamble_angles = [text_angles_at(CONFIG, pos) for pos in range(len(txt))]
    double_angles = list(preamble_angles)
    if not rotate_prefix:
        double_angles[:len(prefix)] = [np.zeros(CONFIG.head_dim // 2)] * len(prefix)
    return plain_body(w, CONFIG, image, txt, preamble_angles, double_angles)


# ---------------------------------------------------------------------------------------------
# Tests


def _rel_error(got, want):
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def _forward(weights, inputs, dtype=np.float64, **scalars):
    images, context, mask = (a.astype(dtype) for a in inputs)
    values = {**SCALARS, **scalars}
    return mean_flow_forward(nest(weights), CONFIG, images, values["h"], values["omega"], values["t_min"],
                             values["t_max"], context, mask)


def test_config_has_every_prefix_group_and_an_odd_rope_quarter():
    assert CONFIG.num_aux_tokens == PREFIX
    assert (CONFIG.head_dim // 4) % 2 == 1 and CONFIG.head_dim // 2 % 2 == 0


def test_float64_matches_plain_recomputation(weights, inputs, expected):
    got = _forward(weights, inputs)
    assert got.shape == (3, 3, HEIGHT, WIDTH) and got.dtype == np.float64
    assert _rel_error(got, expected) < 1e-10  # measured 1.1e-15: float64 round-off only


def test_float32_matches_plain_recomputation(weights, inputs, expected):
    """float32 with unit-scale activations through 4 blocks: ~1e-7 per op, reductions of at most
    ~770 terms (the image proj1 window) -> a few 1e-6 worst case (measured 5.5e-7); 1e-4 leaves
    room and still catches a wrong op: moving any one scalar input moves the output by >= 1.4e-2."""
    got = _forward(weights, inputs, np.float32)
    assert got.dtype == np.float32
    assert _rel_error(got, expected) < 1e-4


@pytest.mark.parametrize("name, other", [("h", [0.75, 0.3, 0.9]), ("omega", [2.0, 5.0, 1.5]),
                                         ("t_min", [0.4, 0.1, 0.0]), ("t_max", [0.5, 0.9, 0.7])])
def test_every_scalar_reaches_the_output(weights, inputs, name, other):
    base = _forward(weights, inputs)
    moved = _forward(weights, inputs, **{name: np.array(other)})
    assert _rel_error(moved, base) > 1e-3


def test_prefix_rows_are_unrotated_in_double_blocks(weights, inputs, expected):
    """The same re-computation with the prefix rotated at positions 0..A-1 in the double blocks
    is far from the reference's output, so the angle-0 rows are what the reference does."""
    w = as_float64(weights)
    images, context, mask = inputs
    rotated = plain_student(w, images[0], context[0], mask[0], *(SCALARS[k][0] for k in SCALARS), rotate_prefix=True)
    assert _rel_error(rotated, expected[0]) > 1e-4


def test_pooled_prompt_is_taken_after_masking(weights, inputs):
    """Two prompts that differ only at padded positions give the same output."""
    images, context, mask = inputs
    other = context.copy()
    other[1, 3:] = np.random.default_rng(9).standard_normal(other[1, 3:].shape)
    a = _forward(weights, (images, context, mask))[1]
    b = _forward(weights, (images, other, mask))[1]
    np.testing.assert_array_equal(a, b)


def test_fully_masked_row_ignores_the_prompt(weights, inputs, expected):
    images, context, mask = inputs
    other = np.random.default_rng(10).standard_normal(context.shape)
    got = _forward(weights, (images, other, mask))[2]
    assert _rel_error(got, expected[2]) < 1e-10


def test_sampler_matches_plain_four_steps(weights, inputs):
    """sample_mean_flow against the loop of model.md 9.4 written out with the plain network:
    t = 1, .75, .5, .25; u = (z - x_pred) / clip(t, 0.05, 1); z -= (t - r) u; ends on x_pred."""
    w = as_float64(weights)
    _, context, mask = inputs
    noise = initial_noise(3, 3, 3, HEIGHT, WIDTH).astype(np.float64)
    omega, interval = 7.0, (0.25, 0.75)
    seen = []

    def denoise(x, h, om, t_min, t_max, ctx, msk):
        assert np.all(om == omega) and np.all(t_min == interval[0]) and np.all(t_max == interval[1])
        return mean_flow_forward(nest(weights), CONFIG, x, h, om, t_min, t_max, ctx, msk)

    got = sample_mean_flow(denoise, noise, context, mask, 4, omega, interval, callback=seen.append)
    z = noise.copy()
    times = [1.0, 0.75, 0.5, 0.25, 0.0]
    for i in range(4):
        t, r = times[i], times[i + 1]
        x_pred = np.stack([plain_student(w, z[b], context[b], mask[b], t - r, omega, *interval) for b in range(3)])
        z = z - (t - r) * (z - x_pred) / min(max(t, 0.05), 1.0)
    assert _rel_error(got, z) < 1e-10
    assert [info.t for info in seen] == times[:4]
    np.testing.assert_allclose(got, seen[-1].x0, rtol=0, atol=1e-12)  # the last step lands on x_pred


def test_step_factors_and_lengths():
    np.testing.assert_array_equal(step_lengths(4), [0.25] * 4)
    np.testing.assert_array_equal(mean_flow_step_factors(4), [0.25, 1 / 3, 0.5, 1.0])
    assert mean_flow_step_factors(1)[0] == 1.0
    # below t = 0.05 the denominator is clipped: with 40 steps the last step starts at t = 0.025
    assert mean_flow_step_factors(40)[-1] == pytest.approx(0.025 / 0.05)
