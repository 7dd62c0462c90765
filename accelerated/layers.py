"""Device-side building blocks shared by the CuPy T5 and MMJiT (twin of reference/layers.py).

Weights are uploaded once, already in the layout the GPU wants: a linear layer is a
{"weight", "bias"} leaf as in the checkpoint tree, but its weight is stored transposed, [in, out]
(C-contiguous, so every GEMM is one plain cuBLAS call, `kernels.gemm`); layers
that feed one gated activation or one attention kernel are packed side by side ([W1 | W3],
[Wq | Wk | Wv]) so one GEMM serves both. Leaves are unpacked into the functions that use them,
as in the reference: `linear(x, **layer)`.
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
    """Torch-layout weights [out_i, in] (packed along `out` if several) -> {"weight": [in, sum out]
    (transposed), "bias": [sum out] (None when the layers have none)}."""
    weight = to_device(np.concatenate(weights, axis=0).T, dtype)
    bias = None if biases is None else to_device(np.concatenate(biases), dtype)
    return {"weight": weight, "bias": bias}


def upload_norm(norm, dtype) -> dict:
    """A checkpoint's {"weight": [D]} norm leaf -> the same leaf on the device in `dtype`."""
    return {"weight": to_device(norm["weight"], dtype)}


class LayerReporter:
    """report(name, value) handing `on_layer` a device copy (the hook of reference.layers.layer_reporter):
    the blocks update the residual streams in place, so a reported array would otherwise change
    under the caller. `active`: whether anyone listens (work whose only use is a report, such as
    the last double block's text stream, is then skipped)."""

    def __init__(self, on_layer):
        self.on_layer = on_layer
        self.active = on_layer is not None

    def __call__(self, name, value):
        if self.on_layer:
            self.on_layer(name, value.copy())


def layer_reporter(on_layer) -> LayerReporter:
    """on_layer(name, value) or None -> its `LayerReporter`."""
    return LayerReporter(on_layer)


def project(x, weight, accumulate=None):
    """[..., in] @ [in, out] (an uploaded, transposed weight) -> [..., out] as one GEMM (cuBLAS, fp32 accumulation).

    A C-contiguous x folds its leading dimensions into the GEMM's rows, so a batch needs no
    batched GEMM; a [B, L, in] view whose rows are a stride apart per sample (one stream's rows of
    the attention output) is read where it is, by one strided batched GEMM. `accumulate` ([...,
    out], C-contiguous) receives the sum instead: accumulate += x @ weight in one GEMM (cuBLAS
    beta = 1), returned. Our own cuBLAS call (not cp.matmul, which CuPy refuses inside a graph
    capture) takes the 16-bit dtypes directly.
    """
    out_shape = (*x.shape[:-1], weight.shape[1])
    if x.flags.c_contiguous:
        x = x.reshape(-1, x.shape[-1])
    into = None if accumulate is None else accumulate.reshape(*x.shape[:-1], weight.shape[1])
    return kernels.gemm(x, weight, into).reshape(out_shape)


def linear(x, weight, bias=None):
    """[..., in] @ [in, out] (the uploaded transpose) (+ [out]) -> [..., out]."""
    y = project(x, weight)
    if bias is not None:
        y += bias
    return y


def silu(x):
    """[...] -> [...] in x's dtype: x * sigmoid(x), computed in fp32 and rounded once, like a kernel
    (CuPy's own 16-bit elementwise math is not relied on)."""
    x32 = x.astype(cp.float32)
    return (x32 / (1.0 + cp.exp(-x32))).astype(x.dtype)


def gated_mlp(x, gate_up, down, activation: str, accumulate=None):
    """[..., D] -> [..., D]: W_down(act(W_gate x) * W_up x) with W_gate|W_up in one GEMM (the
    layers of `upload_gated_mlp`, no biases); added into `accumulate` by the W_down GEMM when given
    (a residual stream, returned)."""
    return project(kernels.gated_activation(project(x, gate_up["weight"]), activation), down["weight"], accumulate)


def upload_gated_mlp(gate, up, down, dtype) -> dict:
    """Three checkpoint {"weight"} leaves -> {"gate_up": [W_gate | W_up] packed, "down"}, the
    arguments of `gated_mlp`."""
    return {"gate_up": upload_linear([gate["weight"], up["weight"]], dtype=dtype),
            "down": upload_linear([down["weight"]], dtype=dtype)}


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
