"""Small pure layer functions shared by the T5 encoder and MMJiT (NumPy): attention (concepts.md 4)
and the two position codes, the sin/cos table and RoPE (concepts.md 5).

Every function works in the dtype of its inputs (float32 for generation, float64 for the
tracer and tests). Weights use the torch layout: a linear weight is [out, in].
Shape letters: B batch, L tokens, H heads, Dh head dim, D model width.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from minit2i.core.mmjit_config import NORM_EPS


def cast_tree(tree, dtype):
    """A (nested dict/list) weight tree in `dtype`; a no-op for float32 weights in float32.

    A runner casts its trees once, when it is built: the forwards compute in the dtype they get.
    """
    if isinstance(tree, dict):
        return {k: cast_tree(v, dtype) for k, v in tree.items()}
    if isinstance(tree, list):
        return [cast_tree(v, dtype) for v in tree]
    return tree.astype(dtype, copy=False)


def layer_reporter(on_layer):
    """on_layer(name, value) or None -> report(name, value): the per-layer hook every forward takes
    (T5, MMJiT, the student), called with each stage's output, e.g. by the divergence tracer."""
    return on_layer or (lambda name, value: None)


def linear(x, weight, bias=None):
    """[..., in] @ [out, in]^T (+ [out]) -> [..., out]."""
    y = x @ weight.T
    if bias is not None:
        y += bias
    return y


def rms_norm(x, weight, eps: float = NORM_EPS):
    r"""[..., D], [D] -> [..., D]: x / sqrt(mean(x^2) + eps) * weight (no mean, no bias).

    $$y = \frac{x}{\sqrt{\frac{1}{D}\sum_{i} x_i^2 + \epsilon}} \odot w$$
    """
    inv_rms = 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + x.dtype.type(eps))
    y = x * inv_rms
    y *= weight  # in place: one [..., D] temporary fewer than x * inv_rms * weight
    return y


def silu(x):
    """[...] -> [...]: x * sigmoid(x) = x / (1 + exp(-x))."""
    denominator = np.exp(-x)
    denominator += 1.0  # in place, and the quotient into the same array: one temporary, not three
    return np.divide(x, denominator, out=denominator)


def swiglu(x, w1, w2, w3):
    r"""[..., D] -> [..., D]: W2 (SiLU(W1 x) * W3 x), no biases (model.md 3.9); each layer a
    {"weight"} leaf of the checkpoint tree.

    $$y = W_2\,\big(\mathrm{SiLU}(W_1 x) \odot W_3 x\big), \qquad \mathrm{SiLU}(z) = z\,\sigma(z)$$
    """
    return linear(silu(linear(x, **w1)) * linear(x, **w3), **w2)


def gelu_tanh(x):
    """[...] -> [...]: the tanh approximation of GELU ("gelu_new"), used by T5 v1.1."""
    cube = x * x * x  # not x**3: np.power is ~70x slower than two multiplies
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi).astype(x.dtype) * (x + 0.044715 * cube)))


def softmax(scores):
    """[..., K] -> [..., K] over the last axis, in place on `scores` to spare memory."""
    weights = softmax_numerator(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights


def softmax_numerator(scores):
    """[..., K] -> [..., K]: exp(scores - max over K), in place: a softmax before the division by
    each row's sum (subtracting the max changes nothing after that division, and keeps exp finite)."""
    scores -= scores.max(axis=-1, keepdims=True)
    return np.exp(scores, out=scores)


def split_heads(x, num_heads: int):
    """[B, L, H*Dh] -> [B, H, L, Dh]."""
    b, n, d = x.shape
    return x.reshape(b, n, num_heads, d // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """[B, H, L, Dh] -> [B, L, H*Dh] (head-major features)."""
    b, h, n, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, n, h * dh)


def attention(q, k, v, scale: float, bias=None):
    r"""Softmax attention over all keys: softmax(q k^T * scale + bias) v.

    $$O = \mathrm{softmax}\big(s\,q\,k^\top + \mathrm{bias}\big)\,v$$

    q [B, H, Lq, Dh], k/v [B, H, Lk, Dh], bias broadcastable to [B, H, Lq, Lk] -> [B, H, Lq, Dh].
    The softmax's division by each row's sum comes after the product with v, where it divides
    Dh values a query instead of Lk: the same maths, one pass over the [Lq, Lk] table fewer.
    """
    weights = softmax_numerator(attention_scores(q, k, scale, bias))
    return (weights @ v) / weights.sum(axis=-1, keepdims=True)


def attention_weights(q, k, scale: float, bias=None):
    r"""The weights of `attention`, each query's row summing to 1 over the keys.

    $$P = \mathrm{softmax}\big(s\,q\,k^\top + \mathrm{bias}\big)$$

    q [B, H, Lq, Dh], k [B, H, Lk, Dh], bias broadcastable to [B, H, Lq, Lk] -> [B, H, Lq, Lk].
    """
    return softmax(attention_scores(q, k, scale, bias))


def attention_scores(q, k, scale: float, bias=None):
    """q [B, H, Lq, Dh], k [B, H, Lk, Dh] -> s q k^T + bias [B, H, Lq, Lk], before the softmax."""
    scores = (q * q.dtype.type(scale)) @ np.swapaxes(k, -1, -2)  # scale q: Lk/Dh times fewer multiplies
    if bias is not None:
        scores += bias
    return scores


def apply_rope(x, cos, sin):
    r"""Half-split ("rotate_half") rotary embedding (model.md 3.6).

    x [B, H, L, Dh], cos/sin [L, Dh/2] -> [B, H, L, Dh]; pairs are (j, j + Dh/2):

    $$\begin{pmatrix} y_j \\ y_{j + D_h/2} \end{pmatrix} =
    \begin{pmatrix} \cos a_j & -\sin a_j \\ \sin a_j & \cos a_j \end{pmatrix}
    \begin{pmatrix} x_j \\ x_{j + D_h/2} \end{pmatrix}$$
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = np.empty_like(x)  # each half written in place: no concatenated copy
    np.subtract(x1 * cos, x2 * sin, out=rotated[..., :half])
    np.add(x2 * cos, x1 * sin, out=rotated[..., half:])
    return rotated


# ---------------------------------------------------------------------------------------------
# Fixed tables. Cached per shape (read-only) so a sampler builds them once and reuses them at
# every step; computed in float64 and handed out in the caller's dtype.


@lru_cache(maxsize=32)
def sincos_2d_table(grid_h: int, grid_w: int, dim: int, dtype=np.float32):
    """MAE-style 2-D sin/cos position table (model.md 3.4) -> [grid_h*grid_w, dim].

    Token n = r*grid_w + c gets [sin(c w), cos(c w), sin(r w), cos(r w)], w_k = 10000^(-k/(dim/4)):
    the column (x) coordinate fills the first half, the row (y) coordinate the second.
    """
    quarter = dim // 4
    omega = 10000.0 ** (-np.arange(quarter, dtype=np.float64) / quarter)
    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    col_angles = cols.reshape(-1, 1) * omega
    row_angles = rows.reshape(-1, 1) * omega
    table = np.concatenate([np.sin(col_angles), np.cos(col_angles), np.sin(row_angles), np.cos(row_angles)], axis=1)
    return _frozen(table, dtype)


@lru_cache(maxsize=32)
def text_rope_angles(length: int, head_dim: int):
    """1-D RoPE angles (model.md 3.6) -> [length, head_dim/2]: a[l, j] = l * 10000^(-2j/head_dim)."""
    freqs = 10000.0 ** (-2.0 * np.arange(head_dim // 2, dtype=np.float64) / head_dim)
    return _frozen(np.arange(length, dtype=np.float64)[:, None] * freqs, np.float64)


@lru_cache(maxsize=32)
def image_rope_angles(grid_h: int, grid_w: int, head_dim: int):
    """2-D RoPE angles (model.md 3.6) -> [grid_h*grid_w, head_dim/2]: [row angles | column angles].

    Rows (y) come first here, the opposite of the sin/cos table; g_k = 10000^(-2k/(head_dim/2)).
    """
    quarter = head_dim // 4
    freqs = 10000.0 ** (-2.0 * np.arange(quarter, dtype=np.float64) / (head_dim // 2))
    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    angles = np.concatenate([rows.reshape(-1, 1) * freqs, cols.reshape(-1, 1) * freqs], axis=1)
    return _frozen(angles, np.float64)


@lru_cache(maxsize=32)
def text_rope(length: int, head_dim: int, dtype=np.float32):
    """(cos, sin), each [length, head_dim/2] in `dtype`, for the text stream."""
    angles = text_rope_angles(length, head_dim)
    return _frozen(np.cos(angles), dtype), _frozen(np.sin(angles), dtype)


@lru_cache(maxsize=32)
def joint_rope(text_length: int, grid_h: int, grid_w: int, head_dim: int, dtype=np.float32):
    """(cos, sin), each [text_length + grid_h*grid_w, head_dim/2]: text rows first, then image.

    Both position sets start at 0: image positions are not offset by the text length.
    """
    angles = np.concatenate([text_rope_angles(text_length, head_dim), image_rope_angles(grid_h, grid_w, head_dim)])
    return _frozen(np.cos(angles), dtype), _frozen(np.sin(angles), dtype)


def _frozen(table, dtype):
    table = np.ascontiguousarray(table, dtype=dtype)
    table.flags.writeable = False
    return table


# ---------------------------------------------------------------------------------------------
# Patches


def patchify(images, patch: int):
    """[B, C, H, W] -> [B, (H/p)*(W/p), C*p*p]; each patch flattened channel-slowest (c, i, j).

    This is the flattening of a torch conv weight [out, C, p, p], so proj1 becomes one matmul.
    """
    b, c, h, w = images.shape
    gh, gw = h // patch, w // patch
    x = images.reshape(b, c, gh, patch, gw, patch)
    return x.transpose(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * patch * patch)


def unpatchify(tokens, grid_h: int, grid_w: int, patch: int, channels: int):
    """[B, gh*gw, p*p*C] -> [B, C, gh*p, gw*p]; token features ordered (i, j, c), channel fastest.

    Pixel (c, r*p + i, col*p + j) = tokens[r*gw + col, (i*p + j)*C + c] (model.md 3.11).
    """
    b = tokens.shape[0]
    x = tokens.reshape(b, grid_h, grid_w, patch, patch, channels)
    return x.transpose(0, 5, 1, 3, 2, 4).reshape(b, channels, grid_h * patch, grid_w * patch)
