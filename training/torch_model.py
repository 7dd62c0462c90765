"""MMJiT, the Mean Flow student and the T5 encoder in PyTorch: the reference's math in torch ops,
written once.

Written from docs/model.md like reference/, with F.scaled_dot_product_attention for attention. Both
networks are plain functions of a nested weight tree (the checkpoint's names, as
`minit2i.core.checkpoint.nest` builds them), so the same code serves three uses: the demo model's
training (training/train.py: leaves that require grad), the CPU benchmark (float32 tensors sharing
memory with the NumPy weights) and the GPU benchmark (CUDA tensors in fp32, fp16 or bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from minit2i.core.mean_flow_config import AUX_EMBEDDERS, MeanFlowConfig, aux_token_groups
from minit2i.core.mmjit_config import MMJiTConfig
from minit2i.core.t5_config import T5Config
from minit2i.reference.layers import joint_rope, sincos_2d_table, text_rope
from minit2i.reference.mean_flow import embedding_frequencies, unrotated_prefix
from minit2i.reference.t5 import relative_position_buckets


def to_torch_tree(tree, device="cpu", dtype=torch.float32):
    """A nested dict/list of NumPy arrays -> the same tree of torch tensors on `device` in `dtype`.

    A float32 array bound for the CPU as float32 is shared, not copied.
    """
    if isinstance(tree, dict):
        return {k: to_torch_tree(v, device, dtype) for k, v in tree.items()}
    if isinstance(tree, list):
        return [to_torch_tree(v, device, dtype) for v in tree]
    return torch.as_tensor(np.ascontiguousarray(tree), device=device, dtype=dtype)


def rms_norm(x, weight, eps: float = 1e-6):
    """[..., D], [D] -> [..., D]: x / rms(x) * weight over the last axis."""
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight


def swiglu(x, mlp):
    """[B, N, D] -> [B, N, D]: w2(silu(w1 x) * w3 x), weights from the `mlp` subtree."""
    return F.linear(F.silu(F.linear(x, mlp["w1"]["weight"])) * F.linear(x, mlp["w3"]["weight"]), mlp["w2"]["weight"])


def rope(x, cos, sin):
    """[B, H, N, Dh], cos/sin [N, Dh/2] -> [B, H, N, Dh]: half-split rotation of the channel pairs."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def qkv_heads(h, qkv, q_norm_weight, k_norm_weight, heads: int):
    """[B, N, D] -> q, k, v each [B, H, N, Dh], q and k RMS-normed per head (QK-norm)."""
    b, n, d = h.shape
    q, k, v = F.linear(h, qkv["weight"], qkv["bias"]).view(b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    return rms_norm(q, q_norm_weight), rms_norm(k, k_norm_weight), v


def merge_heads(x):
    """[B, H, N, Dh] -> [B, N, H*Dh]."""
    b, h, n, dh = x.shape
    return x.transpose(1, 2).reshape(b, n, h * dh)


@dataclass(frozen=True)
class PositionTables:
    """The fixed position tables of one (image size, prompt length), on the device of the run.

    image_pos: [N, D] sin/cos embedding added to the image tokens;
    text_rope / joint_rope: (cos, sin), each [L, Dh/2] / [L + N, Dh/2] (text rows first).
    """

    image_pos: torch.Tensor
    text_rope: tuple[torch.Tensor, torch.Tensor]
    joint_rope: tuple[torch.Tensor, torch.Tensor]


def position_tables(config: MMJiTConfig, size: int, length: int, device="cpu", dtype=torch.float32,
                    unrotated: int = 0) -> PositionTables:
    """The reference's tables for [size, size] images and `length` text tokens, as torch copies;
    the first `unrotated` joint rows at angle 0 (the Mean Flow student's prefix, model.md 9.2).

    Copies, because the reference caches its tables read-only and torch refuses read-only memory.
    """
    grid, head_dim = size // config.patch_size, config.head_dim

    def copy(table):
        return torch.tensor(table, device=device, dtype=dtype)

    joint = unrotated_prefix(joint_rope(length, grid, grid, head_dim, np.float32), unrotated)
    return PositionTables(copy(sincos_2d_table(grid, grid, config.hidden_size, np.float32)),
                          tuple(map(copy, text_rope(length, head_dim, np.float32))),
                          tuple(map(copy, joint)))


def mmjit_forward(params, config: MMJiTConfig, tables: PositionTables, images, context, mask):
    """[B, C, H, W], [B, L, Dc], [B, L] -> x0 [B, C, H, W], in the dtype of `params`.

    `params` is the nested weight tree (to_torch_tree) and `tables` the position_tables of this
    image size and L, both already on the device and in the dtype of the inputs.
    """
    txt = F.linear(mask_text(context, mask, params), params["txt_embedder"]["weight"])
    return transformer_body(params, config, tables, embed_image(params, config, tables, images), txt, images.shape)


def mean_flow_forward(params, config: MeanFlowConfig, tables: PositionTables, images, h, omega, t_min, t_max,
                      context, mask):
    """The Mean Flow student (model.md 9): images [B, C, H, W], h/omega/t_min/t_max [B], context
    [B, L, Dc], mask [B, L] -> x0 [B, C, H, W]. `tables` for A + L text tokens, A unrotated."""
    masked = mask_text(context, mask, params)
    scalars = {"omega": 1.0 - 1.0 / omega, "t_min": t_min, "t_max": t_max, "time": h}
    embedded = {"context": F.linear(masked.mean(dim=1), params[AUX_EMBEDDERS["context"]]["weight"])}
    for group, values in scalars.items():
        embedded[group] = scalar_embedder(values, params[AUX_EMBEDDERS[group]], config.frequency_embedding_size)
    prefix = torch.cat([params[f"{group}_tokens"].expand(len(masked), -1, -1) + embedded[group][:, None]
                        for group, _ in aux_token_groups(config)], dim=1)
    txt = torch.cat([prefix, F.linear(masked, params["txt_embedder"]["weight"])], dim=1)
    return transformer_body(params, config, tables, embed_image(params, config, tables, images), txt, images.shape)


def scalar_embedder(values, embedder, dim: int):
    """[B] -> [B, D]: [cos | sin] sinusoid of `dim`, Linear, SiLU, Linear (model.md 9.1)."""
    freqs = torch.from_numpy(embedding_frequencies(dim)).to(values.device, values.dtype)
    angles = values[:, None] * freqs
    first, second = embedder["mlp"]["0"], embedder["mlp"]["2"]
    hidden = F.silu(F.linear(torch.cat([angles.cos(), angles.sin()], dim=-1), first["weight"], first["bias"]))
    return F.linear(hidden, second["weight"], second["bias"])


def mask_text(context, mask, params):
    """[B, L, Dc] -> [B, L, Dc] with mask_token where the mask is 0."""
    return torch.where(mask[..., None] > 0.5, context, params["mask_token"][0, 0])


def embed_image(params, config: MMJiTConfig, tables: PositionTables, images):
    """[B, C, H, W] -> [B, N, D]: bottleneck patch embed + the sin/cos table."""
    b, c, size, _ = images.shape
    p, grid = config.patch_size, size // config.patch_size
    embedder = params["img_embedder"]
    patches = images.reshape(b, c, grid, p, grid, p).permute(0, 2, 4, 1, 3, 5).reshape(b, grid * grid, -1)
    img = F.linear(patches, embedder["proj1"]["weight"].reshape(config.pca_channels, -1))
    return F.linear(img, embedder["proj2"]["weight"].reshape(config.hidden_size, -1),
                    embedder["proj2"]["bias"]) + tables.image_pos


def transformer_body(params, config: MMJiTConfig, tables: PositionTables, img, txt, image_shape):
    """img [B, N, D], txt [B, L, D] -> x0 [B, C, H, W]: preamble and double blocks, final layer."""
    b, c, size, _ = image_shape
    p, heads, length = config.patch_size, config.num_heads, txt.shape[1]
    grid = size // p
    for blk in params["txt_preamble_blocks"]:
        q, k, v = qkv_heads(rms_norm(txt, blk["norm1"]["weight"]), blk["qkv"],
                            blk["q_norm"]["weight"], blk["k_norm"]["weight"], heads)
        out = F.scaled_dot_product_attention(rope(q, *tables.text_rope), rope(k, *tables.text_rope), v)
        txt = txt + F.linear(merge_heads(out), blk["attn_proj"]["weight"], blk["attn_proj"]["bias"])
        txt = txt + swiglu(rms_norm(txt, blk["norm2"]["weight"]), blk["mlp"])

    for blk in params["double_blocks"]:
        q_norm, k_norm = blk["q_norm"]["weight"], blk["k_norm"]["weight"]
        qi, ki, vi = qkv_heads(rms_norm(img, blk["img_norm1"]["weight"]), blk["img_qkv"], q_norm, k_norm, heads)
        qt, kt, vt = qkv_heads(rms_norm(txt, blk["txt_norm1"]["weight"]), blk["txt_qkv"], q_norm, k_norm, heads)
        q = rope(torch.cat([qt, qi], dim=2), *tables.joint_rope)
        k = rope(torch.cat([kt, ki], dim=2), *tables.joint_rope)
        out = merge_heads(F.scaled_dot_product_attention(q, k, torch.cat([vt, vi], dim=2)))
        img = img + F.linear(out[:, length:], blk["img_attn_proj"]["weight"], blk["img_attn_proj"]["bias"])
        txt = txt + F.linear(out[:, :length], blk["txt_attn_proj"]["weight"], blk["txt_attn_proj"]["bias"])
        img = img + swiglu(rms_norm(img, blk["img_norm2"]["weight"]), blk["img_mlp"])
        txt = txt + swiglu(rms_norm(txt, blk["txt_norm2"]["weight"]), blk["txt_mlp"])

    final = params["final_layer"]
    out = F.linear(rms_norm(img, final["norm_final"]["weight"]), final["linear"]["weight"], final["linear"]["bias"])
    out = out.reshape(b, grid, grid, p, p, c).permute(0, 5, 1, 3, 2, 4)
    return out.reshape(b, c, size, size)


def t5_encode(params, config: T5Config, ids, mask):
    """ids [B, L] (int64), mask [B, L] -> last hidden state [B, L, d_model] (torch, float32)."""
    eps, heads = config.layer_norm_epsilon, config.num_heads
    blocks = params["encoder"]["block"]
    length = ids.shape[1]
    buckets = torch.from_numpy(np.array(relative_position_buckets(
        length, config.relative_attention_num_buckets, config.relative_attention_max_distance)))
    table = blocks[0]["layer"][0]["SelfAttention"]["relative_attention_bias"]["weight"]
    bias = table[buckets].permute(2, 0, 1)[None] + ((1.0 - mask) * torch.finfo(torch.float32).min)[:, None, None, :]
    h = params["shared"]["weight"][ids]
    for blk in blocks:
        attn_layer, ffn_layer = blk["layer"]
        attn = attn_layer["SelfAttention"]
        x = rms_norm(h, attn_layer["layer_norm"]["weight"], eps)
        q, k, v = (F.linear(x, attn[n]["weight"]).unflatten(-1, (heads, -1)).transpose(1, 2) for n in "qkv")
        scores = torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1)
        h = h + F.linear(merge_heads(scores @ v), attn["o"]["weight"])
        ffn = ffn_layer["DenseReluDense"]
        x = rms_norm(h, ffn_layer["layer_norm"]["weight"], eps)
        gate = F.gelu(F.linear(x, ffn["wi_0"]["weight"]), approximate="tanh")
        h = h + F.linear(gate * F.linear(x, ffn["wi_1"]["weight"]), ffn["wo"]["weight"])
    return rms_norm(h, params["encoder"]["final_layer_norm"]["weight"], eps)
