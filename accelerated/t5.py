"""FLAN-T5 (v1.1) encoder on the GPU (twin of reference/t5.py), always in fp32.

fp32 on purpose: T5 runs once per prompt (~0.16 TFLOP), and T5 in fp16 overflows in the FFN
output projection. The relative-position bias [H, L, L] is gathered on the device once per
prompt length and read by the attention kernel together with the key mask; the
[B, H, L, L] score tensor is never built.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minit2i.core.t5_config import T5Config
from minit2i.reference.t5 import relative_position_buckets

from . import kernels
from .kernels import cp, device_cache
from .layers import gated_mlp, layer_reporter, project, to_device, upload_gated_mlp, upload_linear, upload_norm, zeros

DTYPE = np.float32


class AttentionBias(NamedTuple):
    """What the attention kernel adds to the scores: the relative-position bias float32 [H, L, L]
    and the key mask float32 [B, L] (1 keep, 0 pad), which it applies itself; the reference
    passes the two summed as one [B, H, L, L] bias."""

    position: "cp.ndarray"
    key_mask: "cp.ndarray"


def upload_t5(params, config: T5Config) -> dict:
    """Checkpoint tree -> device tree: embedding, bias table, per block [Wq|Wk|Wv], Wo, [wi_0|wi_1], wo."""
    blocks = params["encoder"]["block"]
    table = blocks[0]["layer"][0]["SelfAttention"]["relative_attention_bias"]["weight"]
    return {
        "embedding": to_device(params["shared"]["weight"], DTYPE),
        "bias_table": to_device(table, DTYPE),
        "blocks": [_upload_block(block) for block in blocks],
        "final_norm": upload_norm(params["encoder"]["final_layer_norm"], DTYPE),
    }


def _upload_block(block) -> dict:
    attn_layer, ffn_layer = block["layer"]
    attn, ffn = attn_layer["SelfAttention"], ffn_layer["DenseReluDense"]
    return {
        "attn_norm": upload_norm(attn_layer["layer_norm"], DTYPE),
        "attn": {"qkv": upload_linear([attn[name]["weight"] for name in ("q", "k", "v")], dtype=DTYPE),
                 "o": upload_linear([attn["o"]["weight"]], dtype=DTYPE)},
        "ffn_norm": upload_norm(ffn_layer["layer_norm"], DTYPE),
        "ffn": upload_gated_mlp(ffn["wi_0"], ffn["wi_1"], ffn["wo"], DTYPE),
    }


@device_cache(maxsize=8)
def device_buckets(length: int, num_buckets: int, max_distance: int):
    """reference.t5.relative_position_buckets on the device -> int64 [L, L] (uploaded once per length)."""
    return cp.asarray(relative_position_buckets(length, num_buckets, max_distance))


def position_bias(bias_table, length: int, config: T5Config):
    """bias_table [buckets, H] -> float32 [H, L, L] (the kernel adds the key mask itself)."""
    buckets = device_buckets(length, config.relative_attention_num_buckets, config.relative_attention_max_distance)
    return cp.ascontiguousarray(bias_table[buckets].transpose(2, 0, 1))


def self_attention(h, attn, bias: AttentionBias, config: T5Config):
    """h [B, L, D] (normed) -> [B, L, D] (before the residual); `attn` is a block's packed qkv and o."""
    batch, length, _ = h.shape
    shape = (batch, config.num_heads, length, config.d_kv)
    q, k, v = cp.empty(shape, DTYPE), cp.empty(shape, DTYPE), cp.empty(shape, DTYPE)
    kernels.qkv_heads(project(h, attn["qkv"]["weight"]), zeros(3 * config.inner_dim, DTYPE), config.num_heads, q, k, v)
    attended = kernels.attention(q, k, v, scale=1.0, bias=bias.position, key_mask=bias.key_mask)
    return project(attended, attn["o"]["weight"])


def encoder_block(h, block, bias: AttentionBias, config: T5Config):
    """One pre-norm block, in place on h [B, L, D]; the attention residual is fused into the FFN norm."""
    eps = config.layer_norm_epsilon
    attended = self_attention(kernels.rms_norm(h, **block["attn_norm"], eps=eps), block["attn"], bias, config)
    normed = kernels.add_rms_norm(h, attended, zeros(h.shape[-1], DTYPE), **block["ffn_norm"], eps=eps)
    h += gated_mlp(normed, **block["ffn"], activation="geglu")
    return h


def t5_encode(params, config: T5Config, ids, mask, on_layer=None):
    """ids, mask [B, L] (host or device) -> last_hidden_state float32 [B, L, d_model] on the device.

    `on_layer(name, value)` sees a device copy of every block output ("t5.block.{i}").
    """
    ids = cp.asarray(ids)
    report = layer_reporter(on_layer)
    h = params["embedding"][ids]
    bias = AttentionBias(position_bias(params["bias_table"], ids.shape[1], config),
                         cp.ascontiguousarray(cp.asarray(mask, dtype=DTYPE)))
    for i, block in enumerate(params["blocks"]):
        h = encoder_block(h, block, bias, config)
        report(f"t5.block.{i}", h)
    return kernels.rms_norm(h, **params["final_norm"], eps=config.layer_norm_epsilon)
