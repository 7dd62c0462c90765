"""`reference.mmjit.mmjit_forward` against an independent, deliberately plain float64 re-computation.

The re-computation below reads the flat checkpoint dict by name and writes every op of model.md
section 3 out by hand (explicit conv windows, per-token position tables, per-pair RoPE, per-head
attention with a hand-written softmax). It shares no code with `reference.layers`.
Configuration: model.md 8.2 (hidden 64, 2 heads x 32, 2 double + 2 preamble blocks, patch 16,
8 text tokens, pca 8), on a non-square 48x64 image, with norm weights != 1 and three mask rows:
full, partly masked, all zero.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from plain_model import plain_mmjit

from minit2i.core.mmjit_config import MMJiTConfig
from minit2i.core.weights import nest
from minit2i.demo_models import random_mmjit_weights
from minit2i.reference import layers
from minit2i.reference.mmjit import mmjit_forward

CONFIG = MMJiTConfig(image_size=64, patch_size=16, in_channels=3, txt_input_size=48, hidden_size=64,
                     depth_double=2, txt_preamble_depth=2, num_heads=2, head_dim=32, pca_channels=8,
                     prompt_length=8, cond_vec_size=64)
HEIGHT, WIDTH, TEXT_LENGTH = 48, 64, 8


@pytest.fixture(scope="module")
def weights():
    return random_mmjit_weights(CONFIG, seed=7)


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(3)
    images = rng.standard_normal((3, 3, HEIGHT, WIDTH))
    context = rng.standard_normal((3, TEXT_LENGTH, CONFIG.txt_input_size))
    mask = np.zeros((3, TEXT_LENGTH))
    mask[0] = 1.0
    mask[1, :5] = 1.0
    return images, context, mask


@pytest.fixture(scope="module")
def expected(weights, inputs):
    return plain_mmjit(weights, CONFIG, *inputs)


# ---------------------------------------------------------------------------------------------
# Tests


def _rel_error(got, want):
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def test_norm_weights_are_not_one(weights):
    norms = [v for k, v in weights.items() if "norm" in k]
    assert norms and all(np.std(v) > 0.01 for v in norms)


def test_float64_matches_plain_recomputation(weights, inputs, expected):
    got = mmjit_forward(nest(weights), CONFIG, *inputs)
    assert got.shape == (3, 3, HEIGHT, WIDTH) and got.dtype == np.float64
    assert _rel_error(got, expected) < 1e-10  # measured 1.0e-15


def test_float32_matches_plain_recomputation(weights, inputs, expected):
    images, context, mask = inputs
    got = mmjit_forward(nest(weights), CONFIG, images.astype(np.float32), context.astype(np.float32),
                        mask.astype(np.float32))
    assert got.dtype == np.float32
    assert _rel_error(got, expected) < 1e-4  # measured 4.7e-7


def test_each_row_is_independent_of_the_batch(weights, inputs, expected):
    images, context, mask = inputs
    for b in range(3):
        single = mmjit_forward(nest(weights), CONFIG, images[b:b + 1], context[b:b + 1], mask[b:b + 1])
        assert _rel_error(single[0], expected[b]) < 1e-10


def test_mask_matters_row_by_row(expected):
    """The three mask rows see different text, so their outputs must differ."""
    assert _rel_error(expected[0], expected[1]) > 1e-3


def test_timestep_is_not_an_input():
    params = inspect.signature(mmjit_forward).parameters
    assert not {"t", "timestep", "time", "timesteps"} & set(params)
    assert list(params)[:5] == ["params", "config", "images", "context", "mask"]


def test_uncond_output_is_prompt_independent(weights, inputs):
    images, context, _ = inputs
    zero = np.zeros((3, TEXT_LENGTH))
    other_context = np.random.default_rng(11).standard_normal(context.shape)
    a = mmjit_forward(nest(weights), CONFIG, images, context, zero)
    b = mmjit_forward(nest(weights), CONFIG, images, other_context, zero)
    np.testing.assert_array_equal(a, b)
    full = np.ones((3, TEXT_LENGTH))
    c = mmjit_forward(nest(weights), CONFIG, images, context, full)
    d = mmjit_forward(nest(weights), CONFIG, images, other_context, full)
    assert _rel_error(c, d) > 1e-3


def test_fixed_tables_are_cached_between_calls(weights, inputs):
    images, context, mask = (a.astype(np.float32) for a in inputs)
    params = nest(weights)
    cached = (layers.sincos_2d_table, layers.text_rope, layers.joint_rope)
    mmjit_forward(params, CONFIG, images, context, mask)
    tables = (layers.sincos_2d_table(3, 4, 64, np.float32), layers.joint_rope(TEXT_LENGTH, 3, 4, 32, np.float32))
    before = [f.cache_info() for f in cached]
    mmjit_forward(params, CONFIG, images, context, mask)
    after = [f.cache_info() for f in cached]
    for old, new in zip(before, after):
        assert new.misses == old.misses
        assert new.hits > old.hits
    assert layers.sincos_2d_table(3, 4, 64, np.float32) is tables[0]
    assert layers.joint_rope(TEXT_LENGTH, 3, 4, 32, np.float32) is tables[1]


def test_mmjit_forward_shows_its_block_loops():
    """The reference reads like its equation: the loops over the preamble and double blocks are in
    `mmjit_forward` itself, calling the module's own block functions (no loop passed the block
    functions as parameters, one or two calls away)."""
    import ast
    import inspect

    import minit2i.reference.mmjit as reference

    tree = ast.parse(inspect.getsource(reference.mmjit_forward))
    loops = {ast.unparse(node.iter).replace("'", '"'): {call.func.id for call in ast.walk(node)
                                                         if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)}
             for node in ast.walk(tree) if isinstance(node, ast.For)}
    assert "preamble_block" in loops['enumerate(params["txt_preamble_blocks"])']
    assert "double_block" in loops['enumerate(params["double_blocks"])']
