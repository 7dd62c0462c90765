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

from minit2i.core.checkpoint import nest
from minit2i.core.mmjit_config import MMJiTConfig
from minit2i.default_model import random_mmjit_weights
from minit2i.reference import layers
from minit2i.reference.mmjit import mmjit_forward

CONFIG = MMJiTConfig(image_size=64, patch_size=16, in_channels=3, txt_input_size=48, hidden_size=64,
                     depth_double=2, txt_preamble_depth=2, num_heads=2, head_dim=32, pca_channels=8,
                     prompt_length=8, cond_vec_size=64)
HEIGHT, WIDTH, TEXT_LENGTH, EPS = 48, 64, 8, 1e-6


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
    return plain_mmjit(weights, *inputs)


# ---------------------------------------------------------------------------------------------
# The plain float64 re-computation (model.md 3.1-3.11)


def plain_mmjit(w, images, context, mask):
    """Flat float64 weights, images [B, 3, H, W], context [B, L, Dc], mask [B, L] -> x0 [B, 3, H, W]."""
    w = {name: np.asarray(value, dtype=np.float64) for name, value in w.items()}
    return np.stack([_plain_one(w, images[b], context[b], mask[b]) for b in range(images.shape[0])])


def _plain_one(w, image, context, mask):
    p, d = CONFIG.patch_size, CONFIG.hidden_size
    grid_h, grid_w = image.shape[1] // p, image.shape[2] // p
    positions = [(r, c) for r in range(grid_h) for c in range(grid_w)]

    # 3.3 bottleneck patch embed: conv k=s=p without bias, then a 1x1 conv with bias
    img = np.zeros((len(positions), d))
    for n, (r, c) in enumerate(positions):
        window = image[:, r * p:(r + 1) * p, c * p:(c + 1) * p]
        pca = np.einsum("cij,ocij->o", window, w["img_embedder.proj1.weight"])
        img[n] = w["img_embedder.proj2.weight"][:, :, 0, 0] @ pca + w["img_embedder.proj2.bias"]
        img[n] += _sincos_row(r, c, d)

    # 3.2 + 3.5: masked positions become mask_token in T5 space, then txt_embedder (no bias)
    txt = np.stack([context[pos] if mask[pos] > 0.5 else w["mask_token"][0, 0] for pos in range(len(mask))])
    txt = txt @ w["txt_embedder.weight"].T

    text_angles = [_text_angles(pos) for pos in range(len(txt))]
    for i in range(CONFIG.txt_preamble_depth):
        txt = _preamble(w, f"txt_preamble_blocks.{i}", txt, text_angles)
    joint_angles = text_angles + [_image_angles(r, c) for r, c in positions]
    for i in range(CONFIG.depth_double):
        img, txt = _double(w, f"double_blocks.{i}", img, txt, joint_angles)

    final = _norm(img, w["final_layer.norm_final.weight"])
    out = final @ w["final_layer.linear.weight"].T + w["final_layer.linear.bias"]
    x0 = np.zeros(image.shape)
    for n, (r, c) in enumerate(positions):
        for i in range(p):
            for j in range(p):
                for ch in range(3):
                    x0[ch, r * p + i, c * p + j] = out[n, (i * p + j) * 3 + ch]
    return x0


def _sincos_row(r, c, dim):
    quarter = dim // 4
    omega = np.array([10000.0 ** (-k / quarter) for k in range(quarter)])
    return np.concatenate([np.sin(c * omega), np.cos(c * omega), np.sin(r * omega), np.cos(r * omega)])


def _text_angles(pos):
    dh = CONFIG.head_dim
    return np.array([pos * 10000.0 ** (-2 * j / dh) for j in range(dh // 2)])


def _image_angles(r, c):
    quarter = CONFIG.head_dim // 4
    freqs = [10000.0 ** (-2 * k / (CONFIG.head_dim // 2)) for k in range(quarter)]
    return np.array([r * g for g in freqs] + [c * g for g in freqs])


def _norm(x, weight):
    return np.stack([row / np.sqrt(np.mean(row * row) + EPS) * weight for row in x])


def _rotate(vec, angles):
    half = len(vec) // 2
    out = np.empty(len(vec))
    for j in range(half):
        cos, sin = np.cos(angles[j]), np.sin(angles[j])
        out[j] = vec[j] * cos - vec[j + half] * sin
        out[j + half] = vec[j + half] * cos + vec[j] * sin
    return out


def _heads(w, block, prefix, h):
    """Per-head q, k (normed with the block's shared q_norm/k_norm), v: lists of [L, Dh]."""
    qkv = h @ w[f"{block}.{prefix}qkv.weight"].T + w[f"{block}.{prefix}qkv.bias"]
    d, dh = CONFIG.hidden_size, CONFIG.head_dim
    q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
    heads = []
    for head in range(CONFIG.num_heads):
        cols = slice(head * dh, (head + 1) * dh)
        heads.append((_norm(q[:, cols], w[f"{block}.q_norm.weight"]),
                      _norm(k[:, cols], w[f"{block}.k_norm.weight"]), v[:, cols]))
    return heads


def _attend(heads, angles):
    """Per-head softmax attention with RoPE on q and k; heads concatenated head-major -> [L, D]."""
    outputs = []
    for q, k, v in heads:
        q = np.stack([_rotate(q[i], angles[i]) for i in range(len(q))])
        k = np.stack([_rotate(k[i], angles[i]) for i in range(len(k))])
        out = np.zeros_like(v)
        for i in range(len(q)):
            logits = np.array([np.dot(q[i], k[j]) for j in range(len(k))]) / np.sqrt(CONFIG.head_dim)
            probs = np.exp(logits - logits.max())
            out[i] = (probs / probs.sum()) @ v
        outputs.append(out)
    return np.concatenate(outputs, axis=1)


def _swiglu(w, prefix, x):
    gate = x @ w[f"{prefix}.w1.weight"].T
    return (gate / (1.0 + np.exp(-gate)) * (x @ w[f"{prefix}.w3.weight"].T)) @ w[f"{prefix}.w2.weight"].T


def _preamble(w, b, txt, angles):
    out = _attend(_heads(w, b, "", _norm(txt, w[f"{b}.norm1.weight"])), angles)
    txt = txt + out @ w[f"{b}.attn_proj.weight"].T + w[f"{b}.attn_proj.bias"]
    return txt + _swiglu(w, f"{b}.mlp", _norm(txt, w[f"{b}.norm2.weight"]))


def _double(w, b, img, txt, angles):
    img_heads = _heads(w, b, "img_", _norm(img, w[f"{b}.img_norm1.weight"]))
    txt_heads = _heads(w, b, "txt_", _norm(txt, w[f"{b}.txt_norm1.weight"]))
    joint = [tuple(np.concatenate([t, i]) for t, i in zip(th, ih)) for th, ih in zip(txt_heads, img_heads)]
    out = _attend(joint, angles)
    length = len(txt)
    img = img + out[length:] @ w[f"{b}.img_attn_proj.weight"].T + w[f"{b}.img_attn_proj.bias"]
    txt = txt + out[:length] @ w[f"{b}.txt_attn_proj.weight"].T + w[f"{b}.txt_attn_proj.bias"]
    img = img + _swiglu(w, f"{b}.img_mlp", _norm(img, w[f"{b}.img_norm2.weight"]))
    txt = txt + _swiglu(w, f"{b}.txt_mlp", _norm(txt, w[f"{b}.txt_norm2.weight"]))
    return img, txt


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
