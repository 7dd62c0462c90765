"""Device-side building blocks shared by the CuPy T5 and MMJiT (twin of reference/layers.py).

Weights are uploaded once, already in the layout the GPU wants: a linear layer is stored as
its transpose `w_t` [in, out] (C-contiguous, so every GEMM is one plain cuBLAS call,
`kernels.gemm`, on a 2-D view) plus its bias; layers that feed one gated activation or one
attention kernel are packed side by side ([W1 | W3], [Wq | Wk | Wv]) so one GEMM serves both.
Fixed tables (RoPE, sin/cos) come from reference.layers and are uploaded once per shape.
"""

from __future__ import annotations

import numpy as np

from minit2i.reference.layers import joint_rope, sincos_2d_table, text_rope

from . import kernels
from .kernels import cp, device_cache


def to_device(array, dtype):
    """Host array -> C-contiguous device array in `dtype` (one host-to-device copy)."""
    return cp.ascontiguousarray(cp.asarray(np.asarray(array, dtype=np.float32)).astype(dtype))


def upload_linear(weights, biases=None, dtype=np.float32) -> dict:
    """Torch-layout weights [out_i, in] (packed along `out` if several) -> {"w_t": [in, sum out], "bias"}.

    `bias` is [sum out] (None when the layers have none).
    """
    w_t = to_device(np.concatenate(weights, axis=0).T, dtype)
    bias = None if biases is None else to_device(np.concatenate(biases), dtype)
    return {"w_t": w_t, "bias": bias}


def project(x, w_t):
    """[..., in] @ [in, out] -> [..., out] as one 2-D GEMM (cublasGemmEx, fp32 accumulation).

    The leading dimensions fold into the GEMM's rows, so a batch needs no batched GEMM; our own
    cublasGemmEx call (not cp.matmul, which CuPy refuses inside a graph capture) takes the
    16-bit dtypes in 2-D directly.
    """
    flat = x.reshape(-1, x.shape[-1])
    return kernels.gemm(flat, w_t).reshape(*x.shape[:-1], w_t.shape[1])


def linear(x, layer):
    """[..., in] -> [..., out] with the layer's bias, if any."""
    y = project(x, layer["w_t"])
    if layer["bias"] is not None:
        y += layer["bias"]
    return y


def silu(x):
    """[...] -> [...] in x's dtype: x * sigmoid(x), computed in fp32 and rounded once, like a kernel
    (CuPy's own 16-bit elementwise math is not relied on)."""
    x32 = x.astype(cp.float32)
    return (x32 / (1.0 + cp.exp(-x32))).astype(x.dtype)


def gated_mlp(x, mlp, activation: str):
    """[..., D] -> [..., D]: W_down(act(W_gate x) * W_up x) with W_gate|W_up in one GEMM."""
    return project(kernels.gated_activation(project(x, mlp["gate_up"]["w_t"]), activation), mlp["down"]["w_t"])


@device_cache(maxsize=16)
def zeros(width: int, dtype) -> "cp.ndarray":
    """A read-only-by-convention zero vector [width], for kernels whose bias argument is unused."""
    return cp.zeros(width, dtype=dtype)


@device_cache(maxsize=32)
def device_sincos_table(grid_h: int, grid_w: int, dim: int, dtype) -> "cp.ndarray":
    """reference.layers.sincos_2d_table on the device -> [grid_h*grid_w, dim] in `dtype`."""
    return to_device(sincos_2d_table(grid_h, grid_w, dim, np.float32), dtype)


@device_cache(maxsize=32)
def device_text_rope(length: int, head_dim: int):
    """(cos, sin) float32 [length, head_dim/2] on the device (reference.layers.text_rope)."""
    return tuple(cp.asarray(table) for table in text_rope(length, head_dim, np.float32))


@device_cache(maxsize=32)
def device_joint_rope(text_length: int, grid_h: int, grid_w: int, head_dim: int):
    """(cos, sin) float32 [text_length + grid_h*grid_w, head_dim/2] on the device (text rows first)."""
    return tuple(cp.asarray(table) for table in joint_rope(text_length, grid_h, grid_w, head_dim, np.float32))
