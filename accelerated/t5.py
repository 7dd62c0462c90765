"""FLAN-T5 (v1.1) encoder on the GPU (twin of reference/t5.py), always in fp32.

fp32 on purpose: T5 runs once per prompt (~0.16 TFLOP), and T5 in fp16 overflows in the FFN
output projection. The relative-position bias [H, L, L] is gathered on the device once per
prompt length and read by the attention kernel together with the key mask; the
[B, H, L, L] score tensor is never built.
"""

from __future__ import annotations

import numpy as np

from minit2i.core.t5_config import T5Config
from minit2i.reference.t5 import relative_position_buckets

from . import kernels
from .kernels import cp, device_cache
from .layers import gated_mlp, project, to_device, upload_linear, zeros

DTYPE = np.float32


def upload_t5(params, config: T5Config) -> dict:
    """Checkpoint tree -> device tree: embedding, bias table, per block [Wq|Wk|Wv], Wo, [wi_0|wi_1], wo."""
    blocks = params["encoder"]["block"]
    table = blocks[0]["layer"][0]["SelfAttention"]["relative_attention_bias"]["weight"]
    return {
        "embedding": to_device(params["shared"]["weight"], DTYPE),
        "bias_table": to_device(table, DTYPE),
        "blocks": [_upload_block(block) for block in blocks],
        "final_norm": to_device(params["encoder"]["final_layer_norm"]["weight"], DTYPE),
    }


def _upload_block(block) -> dict:
    attn_layer, ffn_layer = block["layer"]
    attn, ffn = attn_layer["SelfAttention"], ffn_layer["DenseReluDense"]
    return {
        "attn_norm": to_device(attn_layer["layer_norm"]["weight"], DTYPE),
        "qkv": upload_linear([attn[name]["weight"] for name in ("q", "k", "v")], dtype=DTYPE),
        "o": upload_linear([attn["o"]["weight"]], dtype=DTYPE),
        "ffn_norm": to_device(ffn_layer["layer_norm"]["weight"], DTYPE),
        "ffn": {"gate_up": upload_linear([ffn["wi_0"]["weight"], ffn["wi_1"]["weight"]], dtype=DTYPE),
                "down": upload_linear([ffn["wo"]["weight"]], dtype=DTYPE)},
    }


@device_cache(maxsize=8)
def device_buckets(length: int, num_buckets: int, max_distance: int):
    """reference.t5.relative_position_buckets on the device -> int64 [L, L] (uploaded once per length)."""
    return cp.asarray(relative_position_buckets(length, num_buckets, max_distance))


def position_bias(bias_table, length: int, config: T5Config):
    """bias_table [buckets, H] -> float32 [H, L, L] (the kernel adds the key mask itself)."""
    buckets = device_buckets(length, config.relative_attention_num_buckets, config.relative_attention_max_distance)
    return cp.ascontiguousarray(bias_table[buckets].transpose(2, 0, 1))


def self_attention(normed, block, bias, key_mask, config: T5Config):
    """normed [B, L, D], bias [H, L, L], key_mask [B, L] -> [B, L, D] (before the residual)."""
    batch, length, _ = normed.shape
    shape = (batch, config.num_heads, length, config.d_kv)
    q, k, v = cp.empty(shape, DTYPE), cp.empty(shape, DTYPE), cp.empty(shape, DTYPE)
    kernels.qkv_heads(project(normed, block["qkv"]["w_t"]), zeros(3 * config.inner_dim, DTYPE), config.num_heads, q, k, v)
    return project(kernels.attention(q, k, v, scale=1.0, bias=bias, key_mask=key_mask), block["o"]["w_t"])


def encoder_block(h, block, bias, key_mask, config: T5Config):
    """One pre-norm block, in place on h [B, L, D]; the attention residual is fused into the FFN norm."""
    eps = config.layer_norm_epsilon
    attended = self_attention(kernels.rms_norm(h, block["attn_norm"], eps), block, bias, key_mask, config)
    normed = kernels.add_rms_norm(h, attended, zeros(h.shape[-1], DTYPE), block["ffn_norm"], eps)
    h += gated_mlp(normed, block["ffn"], "geglu")
    return h


def t5_encode(params, config: T5Config, ids, mask, on_layer=None):
    """ids, mask [B, L] (host or device) -> last_hidden_state float32 [B, L, d_model] on the device.

    `on_layer(name, value)` sees a device copy of every block output ("t5.block.{i}").
    """
    ids = cp.asarray(ids)
    key_mask = cp.ascontiguousarray(cp.asarray(mask, dtype=DTYPE))
    h = params["embedding"][ids]
    bias = position_bias(params["bias_table"], ids.shape[1], config)
    for i, block in enumerate(params["blocks"]):
        h = encoder_block(h, block, bias, key_mask, config)
        if on_layer:
            on_layer(f"t5.block.{i}", h.copy())
    return kernels.rms_norm(h, params["final_norm"], config.layer_norm_epsilon)
