"""FLAN-T5 (v1.1) encoder in NumPy, model.md 6: the words as the denoiser reads them (concepts.md 4).

Differences from a textbook transformer, all deliberate (they are what T5 does):
no sqrt(d) scaling of the embedding or of the attention scores, RMSNorm without mean or bias,
one relative-position bias table from block 0 shared by all blocks, a gated tanh-GELU FFN.

`params` is the checkpoint as a tree (`minit2i.core.weights.nest`): params["encoder"]["block"][i]...,
already in the dtype to compute in (the runner casts it once), its {"weight"} leaves unpacked into
the layers that use them.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from minit2i.core.errors import MiniT2IError
from minit2i.core.t5_config import T5Config

from .layers import attention, gelu_tanh, layer_reporter, linear, merge_heads, rms_norm, split_heads


@lru_cache(maxsize=16)
def relative_position_buckets(length: int, num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """Bidirectional T5 buckets (model.md 6.2) -> int64 [length(query), length(key)].

    rel = key - query; half the buckets for rel > 0; exact buckets below max_exact, then
    logarithmic up to max_distance (computed in float32 and truncated, as HF does).
    """
    positions = np.arange(length)
    rel = positions[None, :] - positions[:, None]
    half = num_buckets // 2
    base = np.where(rel > 0, half, 0)
    distance = np.abs(rel)
    max_exact = half // 2
    safe = np.maximum(distance, 1).astype(np.float32)
    log_bucket = max_exact + (
        np.log(safe / max_exact) / np.log(np.float32(max_distance / max_exact)) * (half - max_exact)
    ).astype(np.int64)
    log_bucket = np.minimum(log_bucket, half - 1)
    buckets = base + np.where(distance < max_exact, distance, log_bucket)
    buckets.flags.writeable = False
    return buckets


def position_bias(bias_table, length: int, config: T5Config):
    """bias_table [buckets, H] -> [1, H, length, length] additive attention bias."""
    buckets = relative_position_buckets(length, config.relative_attention_num_buckets,
                                        config.relative_attention_max_distance)
    return bias_table[buckets].transpose(2, 0, 1)[None]


def key_mask_bias(mask, dtype):
    """mask [B, L] (1 keep, 0 pad) -> [B, 1, 1, L]: 0 or the dtype's most negative number."""
    return ((1.0 - mask) * np.finfo(dtype).min).astype(dtype)[:, None, None, :]


def self_attention(h, attn, bias, config: T5Config):
    """h [B, L, D] (normed), bias [B, H, L, L] (position bias + key mask) -> [B, L, D] (before the
    residual); `attn` is a block's SelfAttention subtree (q, k, v, o)."""
    q = split_heads(linear(h, **attn["q"]), config.num_heads)
    k = split_heads(linear(h, **attn["k"]), config.num_heads)
    v = split_heads(linear(h, **attn["v"]), config.num_heads)
    return linear(merge_heads(attention(q, k, v, scale=1.0, bias=bias)), **attn["o"])


def gated_gelu_ffn(h, wi_0, wi_1, wo):
    """h [B, L, D] -> [B, L, D]: wo( gelu_tanh(wi_0 h) * wi_1 h )."""
    return linear(gelu_tanh(linear(h, **wi_0)) * linear(h, **wi_1), **wo)


def encoder_block(h, block, bias, config: T5Config):
    """One pre-norm encoder block: h [B, L, D] -> [B, L, D]."""
    attn_layer, ffn_layer = block["layer"]
    eps = config.layer_norm_epsilon
    h = h + self_attention(rms_norm(h, **attn_layer["layer_norm"], eps=eps), attn_layer["SelfAttention"], bias, config)
    return h + gated_gelu_ffn(rms_norm(h, **ffn_layer["layer_norm"], eps=eps), **ffn_layer["DenseReluDense"])


def check_ids(ids, vocab_size: int) -> None:
    """Ids index the embedding: integers in [0, vocab_size) (NumPy would wrap negative ones)."""
    ids = np.asarray(ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise MiniT2IError(f"token ids must be integers [B, L], found {ids.dtype} {list(ids.shape)}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise MiniT2IError(f"token ids must be in [0, {vocab_size - 1}] (the embedding's rows), found "
                           f"ids from {ids.min()} to {ids.max()}")


def t5_encode(params, config: T5Config, ids, mask, on_layer=None):
    """Token ids [B, L] and mask [B, L] -> last_hidden_state [B, L, d_model] in the dtype of `params`.

    `on_layer(name, value)`, if given, sees every block output (`layers.layer_reporter`).
    """
    check_ids(ids, config.vocab_size)
    report = layer_reporter(on_layer)
    blocks = params["encoder"]["block"]
    h = params["shared"]["weight"][ids]
    table = blocks[0]["layer"][0]["SelfAttention"]["relative_attention_bias"]["weight"]
    bias = position_bias(table, ids.shape[1], config) + key_mask_bias(mask, h.dtype)
    for i, block in enumerate(blocks):
        h = encoder_block(h, block, bias, config)
        report(f"t5.block.{i}", h)
    return rms_norm(h, **params["encoder"]["final_layer_norm"], eps=config.layer_norm_epsilon)

