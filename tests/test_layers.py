"""Closed forms of the MMJiT building blocks (model.md 3.1-3.11, 7.1, 8.1), checked element by element."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minit2i.core.mmjit_config import MMJIT_B16, MMJIT_L16, MMJiTConfig
from minit2i.reference.layers import (
    apply_rope,
    attention,
    image_rope_angles,
    joint_rope,
    patchify,
    rms_norm,
    sincos_2d_table,
    softmax,
    text_rope,
    text_rope_angles,
    unpatchify,
)

FEW = settings(max_examples=15, deadline=None)


# ---------------------------------------------------------------------------------------------
# 2-D sin/cos table (model.md 3.4): [x-sin, x-cos, y-sin, y-cos]


def test_sincos_table_layout_on_non_square_grid():
    grid_h, grid_w, dim = 3, 5, 16
    table = sincos_2d_table(grid_h, grid_w, dim, np.float64)
    quarter = dim // 4
    assert table.shape == (grid_h * grid_w, dim)
    for r in range(grid_h):
        for c in range(grid_w):
            row = table[r * grid_w + c]
            for k in range(quarter):
                w = 10000.0 ** (-k / quarter)
                assert row[k] == pytest.approx(np.sin(c * w), abs=1e-15)
                assert row[quarter + k] == pytest.approx(np.cos(c * w), abs=1e-15)
                assert row[2 * quarter + k] == pytest.approx(np.sin(r * w), abs=1e-15)
                assert row[3 * quarter + k] == pytest.approx(np.cos(r * w), abs=1e-15)


def test_sincos_table_known_values():
    table = sincos_2d_table(2, 3, 8, np.float64)  # quarter 2: w = [1, 0.01]
    # token (r=1, c=2) is n = 1*3 + 2 = 5
    expected = [np.sin(2.0), np.sin(0.02), np.cos(2.0), np.cos(0.02),
                np.sin(1.0), np.sin(0.01), np.cos(1.0), np.cos(0.01)]
    np.testing.assert_allclose(table[5], expected, rtol=0, atol=1e-15)


def test_sincos_table_dtype_and_read_only():
    table = sincos_2d_table(2, 2, 8, np.float32)
    assert table.dtype == np.float32
    assert not table.flags.writeable
    np.testing.assert_allclose(table, sincos_2d_table(2, 2, 8, np.float64), atol=1e-7)


# ---------------------------------------------------------------------------------------------
# RoPE (model.md 3.6): pairs (j, j + Dh/2), text angles l*10000^(-2j/Dh), image [rows | cols]


def test_text_rope_angles():
    head_dim = 12
    angles = text_rope_angles(7, head_dim)
    assert angles.shape == (7, 6)
    for pos in range(7):
        for j in range(6):
            assert angles[pos, j] == pytest.approx(pos * 10000.0 ** (-2 * j / head_dim), rel=1e-15)


@pytest.mark.parametrize("head_dim", [32, 52, 64])
def test_image_rope_angles_rows_first(head_dim):
    grid_h, grid_w = 3, 4
    angles = image_rope_angles(grid_h, grid_w, head_dim)
    quarter = head_dim // 4
    assert angles.shape == (grid_h * grid_w, head_dim // 2)
    for r in range(grid_h):
        for c in range(grid_w):
            for k in range(quarter):
                g = 10000.0 ** (-2 * k / (head_dim // 2))
                assert angles[r * grid_w + c, k] == pytest.approx(r * g, rel=1e-15)
                assert angles[r * grid_w + c, quarter + k] == pytest.approx(c * g, rel=1e-15)


def test_image_rope_l16_frequencies():
    """L/16, Dh = 52: 13 image frequencies 10000^(-2k/26), angle layout [13 row, 13 col]."""
    angles = image_rope_angles(2, 2, 52)
    token_r1_c0, token_r0_c1 = angles[2], angles[1]
    freqs = 10000.0 ** (-2 * np.arange(13) / 26)
    np.testing.assert_allclose(token_r1_c0, np.concatenate([freqs, np.zeros(13)]), rtol=1e-15)
    np.testing.assert_allclose(token_r0_c1, np.concatenate([np.zeros(13), freqs]), rtol=1e-15)
    text = text_rope_angles(2, 52)[1]
    np.testing.assert_allclose(text, 10000.0 ** (-2 * np.arange(26) / 52), rtol=1e-15)


def test_joint_rope_is_text_first_and_both_start_at_zero():
    length, grid_h, grid_w, head_dim = 5, 2, 3, 16
    cos, sin = joint_rope(length, grid_h, grid_w, head_dim, np.float64)
    assert cos.shape == sin.shape == (length + grid_h * grid_w, head_dim // 2)
    text_cos, text_sin = text_rope(length, head_dim, np.float64)
    np.testing.assert_array_equal(cos[:length], text_cos)
    np.testing.assert_array_equal(sin[:length], text_sin)
    image = image_rope_angles(grid_h, grid_w, head_dim)
    np.testing.assert_array_equal(cos[length:], np.cos(image))
    np.testing.assert_array_equal(sin[length:], np.sin(image))
    # text position 0 and image token (0, 0) both have zero angles: not offset by the text length
    np.testing.assert_array_equal(cos[0], 1.0)
    np.testing.assert_array_equal(cos[length], 1.0)
    np.testing.assert_array_equal(sin[length], 0.0)


def _rope_by_pairs(x, angles):
    """Plain per-pair rotation of one head vector x [Dh] by angles [Dh/2]."""
    half = len(x) // 2
    out = np.empty_like(x)
    for j in range(half):
        out[j] = x[j] * np.cos(angles[j]) - x[j + half] * np.sin(angles[j])
        out[j + half] = x[j + half] * np.cos(angles[j]) + x[j] * np.sin(angles[j])
    return out


@FEW
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(1, 6), half=st.integers(1, 8))
def test_apply_rope_pairs_j_with_j_plus_half(seed, length, half):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 3, length, 2 * half))
    angles = rng.uniform(-4, 4, (length, half))
    got = apply_rope(x, np.cos(angles), np.sin(angles))
    for b in range(2):
        for h in range(3):
            for pos in range(length):
                np.testing.assert_allclose(got[b, h, pos], _rope_by_pairs(x[b, h, pos], angles[pos]),
                                           rtol=1e-13, atol=1e-14)


def test_rope_preserves_norm_and_rotates_the_right_pair():
    x = np.zeros((1, 1, 1, 8))
    x[..., 1] = 1.0  # pair (1, 5)
    angles = np.zeros((1, 4))
    angles[0, 1] = np.pi / 2
    out = apply_rope(x, np.cos(angles), np.sin(angles))[0, 0, 0]
    np.testing.assert_allclose(out, [0, 0, 0, 0, 0, 1, 0, 0], atol=1e-15)


# ---------------------------------------------------------------------------------------------
# SwiGLU widths (model.md 3.9)


def test_swiglu_widths():
    assert MMJIT_B16.mlp_hidden == 2048
    assert MMJIT_L16.mlp_hidden == 3376
    # int() truncation first, then round up to a multiple of 8: 100*2.7 = 270.0 -> 272
    assert MMJiTConfig(hidden_size=100, num_heads=1, head_dim=100, mlp_ratio=2.7).mlp_hidden == 272
    assert MMJiTConfig(hidden_size=64, num_heads=2, head_dim=32, mlp_ratio=4.0).mlp_hidden == 256


# ---------------------------------------------------------------------------------------------
# Patches (model.md 3.3, 3.11): input flattening channel-slowest, output channel-fastest


def _conv_stride_p(images, weight):
    """Direct conv, kernel = stride = p, no padding: [B, C, H, W], [O, C, p, p] -> [B, O, H/p, W/p]."""
    p = weight.shape[-1]
    b, _, h, w = images.shape
    out = np.zeros((b, weight.shape[0], h // p, w // p))
    for r in range(h // p):
        for c in range(w // p):
            window = images[:, :, r * p:(r + 1) * p, c * p:(c + 1) * p]
            out[:, :, r, c] = np.einsum("bcij,ocij->bo", window, weight)
    return out


@FEW
@given(seed=st.integers(0, 2**32 - 1), grid_h=st.integers(1, 3), grid_w=st.integers(1, 4),
       patch=st.sampled_from([1, 2, 4]), channels=st.integers(1, 3))
def test_patchify_matmul_equals_conv(seed, grid_h, grid_w, patch, channels):
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((2, channels, grid_h * patch, grid_w * patch))
    weight = rng.standard_normal((5, channels, patch, patch))
    tokens = patchify(images, patch)
    assert tokens.shape == (2, grid_h * grid_w, channels * patch * patch)
    conv = _conv_stride_p(images, weight)  # [B, O, gh, gw] -> tokens n = r*gw + c
    np.testing.assert_allclose(tokens @ weight.reshape(5, -1).T,
                               conv.reshape(2, 5, -1).transpose(0, 2, 1), rtol=1e-12, atol=1e-12)


def _patch_indices(grid_h, grid_w, p, channels):
    """Every (token row r, token column col, channel, row in patch i, column in patch j)."""
    return itertools.product(range(grid_h), range(grid_w), range(channels), range(p), range(p))


def test_patchify_index_formula():
    p, channels, grid_h, grid_w = 2, 3, 2, 3
    images = np.arange(channels * grid_h * p * grid_w * p, dtype=np.float64)
    images = images.reshape(1, channels, grid_h * p, grid_w * p)
    tokens = patchify(images, p)
    for r, col, ch, i, j in _patch_indices(grid_h, grid_w, p, channels):
        assert tokens[0, r * grid_w + col, (ch * p + i) * p + j] == images[0, ch, r * p + i, col * p + j]


def test_unpatchify_index_formula():
    p, channels, grid_h, grid_w = 2, 3, 2, 3
    tokens = np.arange(grid_h * grid_w * p * p * channels, dtype=np.float64).reshape(1, grid_h * grid_w, -1)
    images = unpatchify(tokens, grid_h, grid_w, p, channels)
    assert images.shape == (1, channels, grid_h * p, grid_w * p)
    for r, col, ch, i, j in _patch_indices(grid_h, grid_w, p, channels):
        assert images[0, ch, r * p + i, col * p + j] == tokens[0, r * grid_w + col, (i * p + j) * channels + ch]


def test_patch_shapes_on_non_square_image():
    images = np.zeros((2, 3, 48, 64), dtype=np.float32)
    tokens = patchify(images, 16)
    assert tokens.shape == (2, 12, 768)
    assert unpatchify(np.zeros((2, 12, 768), np.float32), 3, 4, 16, 3).shape == (2, 3, 48, 64)


def test_patchify_and_unpatchify_flatten_differently():
    """Channel-slowest in, channel-fastest out: unpatchify(patchify(x)) is NOT x for C > 1."""
    images = np.random.default_rng(0).standard_normal((1, 3, 4, 4))
    assert not np.allclose(unpatchify(patchify(images, 2), 2, 2, 2, 3), images)
    single = images[:, :1]
    np.testing.assert_array_equal(unpatchify(patchify(single, 2), 2, 2, 2, 1), single)


# ---------------------------------------------------------------------------------------------
# rms_norm, softmax, attention against plain formulas


@FEW
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 5), dim=st.integers(1, 40))
def test_rms_norm_formula(seed, rows, dim):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, dim)) * rng.uniform(0.01, 100)
    weight = 1.0 + 0.3 * rng.standard_normal(dim)
    for row in range(rows):
        expected = x[row] / np.sqrt(np.sum(x[row] ** 2) / dim + 1e-6) * weight
        np.testing.assert_allclose(rms_norm(x, weight)[row], expected, rtol=1e-13)


def test_rms_norm_eps_is_1e6_and_no_mean_subtraction():
    x = np.full((1, 4), 1e-3)
    np.testing.assert_allclose(rms_norm(x, np.ones(4)), 1e-3 / np.sqrt(1e-6 + 1e-6), rtol=1e-14)
    assert rms_norm(np.full((1, 4), 5.0), np.ones(4))[0, 0] == pytest.approx(1.0, rel=1e-7)


@FEW
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4), keys=st.integers(1, 12))
def test_softmax_formula(seed, rows, keys):
    scores = np.random.default_rng(seed).normal(0, 30, (rows, keys))
    expected = np.exp(scores - scores.max(axis=-1, keepdims=True))
    expected /= expected.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(softmax(scores.copy()), expected, rtol=1e-12, atol=1e-300)


def test_softmax_is_shift_invariant_and_stable():
    out = softmax(np.array([[1000.0, 1000.0 + np.log(3.0)]]))
    np.testing.assert_allclose(out, [[0.25, 0.75]], rtol=1e-12)


@FEW
@given(seed=st.integers(0, 2**32 - 1), lq=st.integers(1, 5), lk=st.integers(1, 6), dh=st.integers(1, 8))
def test_attention_formula(seed, lq, lk, dh):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 2, lq, dh))
    k, v = rng.standard_normal((2, 2, lk, dh)), rng.standard_normal((2, 2, lk, dh))
    scale = dh ** -0.5
    got = attention(q, k, v, scale)
    for b in range(2):
        for h in range(2):
            for i in range(lq):
                logits = np.array([scale * np.dot(q[b, h, i], k[b, h, j]) for j in range(lk)])
                weights = np.exp(logits - logits.max())
                weights /= weights.sum()
                np.testing.assert_allclose(got[b, h, i], weights @ v[b, h], rtol=1e-12, atol=1e-13)
