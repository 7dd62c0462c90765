"""MMJiT, the Mean Flow student and the T5 encoder in PyTorch: the reference's math in torch ops,
written once.

Written from docs/model.md like reference/, with F.scaled_dot_product_attention for attention, and
read beside it: every function that has a reference twin has its name and its parameters (a test
holds them to it). Both networks are plain functions of a nested weight tree (the checkpoint's
names, as `minit2i.core.weights.nest` builds them, its {"weight", "bias"} leaves unpacked into the
layers), so the same code serves three uses: the demo model's training (training/train.py: leaves
that require grad), the CPU benchmark (float32 tensors sharing memory with the NumPy weights) and
the GPU benchmark (CUDA tensors in fp32, fp16 or bf16).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from minit2i.core.mean_flow_config import AUX_EMBEDDERS, MeanFlowConfig, aux_token_groups
from minit2i.core.mmjit_config import NORM_EPS, MMJiTConfig
from minit2i.core.t5_config import T5Config
from minit2i.reference.layers import joint_rope, layer_reporter, sincos_2d_table, text_rope
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


def rms_norm(x, weight, eps: float = NORM_EPS):
    """[..., D], [D] -> [..., D]: x / rms(x) * weight over the last axis."""
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight


def swiglu(x, w1, w2, w3):
    """[..., D] -> [..., D]: w2(silu(w1 x) * w3 x), each layer a {"weight"} leaf."""
    return F.linear(F.silu(F.linear(x, **w1)) * F.linear(x, **w3), **w2)


def apply_rope(x, cos, sin):
    """[B, H, N, Dh], cos/sin [N, Dh/2] -> [B, H, N, Dh]: half-split rotation of the channel pairs."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def project_qkv(h, qkv, q_norm, k_norm, num_heads: int):
    """[B, N, D] -> q, k, v each [B, H, N, Dh], q and k RMS-normed per head (QK-norm)."""
    b, n, d = h.shape
    q, k, v = F.linear(h, **qkv).view(b, n, 3, num_heads, d // num_heads).permute(2, 0, 3, 1, 4)
    return rms_norm(q, **q_norm), rms_norm(k, **k_norm), v


def merge_heads(x):
    """[B, H, N, Dh] -> [B, N, H*Dh]."""
    b, h, n, dh = x.shape
    return x.transpose(1, 2).reshape(b, n, h * dh)


# ---------------------------------------------------------------------------------------------
# The reference's fixed tables as torch copies on the device of the run, built once per shape
# (copies, because the reference caches its tables read-only and torch refuses read-only memory)


def table_copy(table, device, dtype) -> torch.Tensor:
    """A torch copy of a reference table, made outside inference mode: a table cached during an
    inference-mode run (the benchmarks) still serves a training step, whose autograd refuses
    inference tensors."""
    with torch.inference_mode(False):
        return torch.tensor(table, device=device, dtype=dtype)


@lru_cache(maxsize=16)
def sincos_table(grid_h: int, grid_w: int, dim: int, device, dtype) -> torch.Tensor:
    """reference.layers.sincos_2d_table -> [grid_h*grid_w, dim] on `device` in `dtype`."""
    return table_copy(sincos_2d_table(grid_h, grid_w, dim, np.float32), device, dtype)


@lru_cache(maxsize=16)
def rope_tables(text_length: int, grid_h: int, grid_w: int, head_dim: int, unrotated: int, device, dtype):
    """(text rope, joint rope): (cos, sin) [L, Dh/2] and [L + N, Dh/2] (text rows first), the first
    `unrotated` joint rows at angle 0 (the Mean Flow student's prefix, model.md 9.2)."""
    joint = unrotated_prefix(joint_rope(text_length, grid_h, grid_w, head_dim, np.float32), unrotated)
    return tuple(tuple(table_copy(table, device, dtype) for table in tables)
                 for tables in (text_rope(text_length, head_dim, np.float32), joint))


# ---------------------------------------------------------------------------------------------
# MMJiT and the student


# The two position signals of MMJiT (model.md 3.4, 3.6): the sin/cos table added to the image
# tokens, and RoPE in every attention.
POSITIONS = ("sincos", "rope")


def mmjit_forward(params, config: MMJiTConfig, images, context, mask, on_layer=None):
    """[B, C, H, W], [B, L, Dc], [B, L] -> x0 [B, C, H, W], in the dtype of `params` (the nested
    weight tree, to_torch_tree, on the device and in the dtype of the inputs). `on_layer(name,
    value)`, if given, sees every stage output under the reference's names."""
    return forward_with_positions(params, config, images, context, mask, POSITIONS, on_layer)


def forward_with_positions(params, config: MMJiTConfig, images, context, mask, positions, on_layer=None):
    """`mmjit_forward` given only the position signals named in `positions` (a subset of
    POSITIONS): without "sincos" no table is added, without "rope" every rotation is by angle 0
    (the identity). The watch-it-learn run's ablations train with fewer; the model has both."""
    report = layer_reporter(on_layer)
    grid_h, grid_w = images.shape[2] // config.patch_size, images.shape[3] // config.patch_size
    img = (embed_image if "sincos" in positions else patch_tokens)(images, params["img_embedder"], config)
    report("patch_embed", img)
    txt = F.linear(mask_text(context, mask, params["mask_token"]), **params["txt_embedder"])
    report("txt_embed", txt)
    txt_rope, rope = rope_tables(txt.shape[1], grid_h, grid_w, config.head_dim, 0, images.device, images.dtype)
    if "rope" not in positions:
        txt_rope, rope = ((torch.ones_like(cos), torch.zeros_like(sin)) for cos, sin in (txt_rope, rope))
    return transformer_body(img, txt, params, config, grid_h, grid_w, txt_rope, rope, report)


def mean_flow_forward(params, config: MeanFlowConfig, images, h, omega, t_min, t_max, context, mask, on_layer=None):
    """The Mean Flow student (model.md 9): images [B, C, H, W], h/omega/t_min/t_max [B], context
    [B, L, Dc], mask [B, L] -> x0 [B, C, H, W]. `on_layer` as for `mmjit_forward`, plus "aux_tokens"."""
    report = layer_reporter(on_layer)
    img = embed_image(images, params["img_embedder"], config)
    report("patch_embed", img)
    masked = mask_text(context, mask, params["mask_token"])
    prefix = aux_tokens(params, config, masked.mean(dim=1), h, omega, t_min, t_max)
    report("aux_tokens", prefix)
    txt = torch.cat([prefix, F.linear(masked, **params["txt_embedder"])], dim=1)
    report("txt_embed", txt)
    grid_h, grid_w = images.shape[2] // config.patch_size, images.shape[3] // config.patch_size
    txt_rope, rope = rope_tables(txt.shape[1], grid_h, grid_w, config.head_dim, prefix.shape[1], images.device,
                                 images.dtype)
    return transformer_body(img, txt, params, config, grid_h, grid_w, txt_rope, rope, report)


def aux_tokens(params, config: MeanFlowConfig, pooled, h, omega, t_min, t_max):
    """The prefix [B, A, D] in the order of `aux_token_groups` (model.md 9.1): pooled [B, Dc]; h,
    omega, t_min, t_max [B]; omega enters as 1 - 1/omega."""
    scalars = {"omega": 1.0 - 1.0 / omega, "t_min": t_min, "t_max": t_max, "time": h}
    embedded = {"context": F.linear(pooled, **params[AUX_EMBEDDERS["context"]])}
    for group, values in scalars.items():
        embedded[group] = scalar_embedder(values, params[AUX_EMBEDDERS[group]], config.frequency_embedding_size,
                                          pooled.dtype)
    return torch.cat([params[f"{group}_tokens"].expand(len(pooled), -1, -1) + embedded[group][:, None]
                      for group, _ in aux_token_groups(config)], dim=1)


def timestep_embedding(values, dim: int, dtype):
    """[B] -> [B, dim] in `dtype`: [cos | sin] of the values times the frequencies (model.md 9.1),
    computed in the dtype of the values."""
    angles = values[:, None] * torch.from_numpy(embedding_frequencies(dim)).to(values.device, values.dtype)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)


def scalar_embedder(values, embedder, dim: int, dtype):
    """[B] -> [B, D]: sinusoid of `dim`, Linear, SiLU, Linear (model.md 9.1)."""
    first, second = embedder["mlp"]["0"], embedder["mlp"]["2"]
    return F.linear(F.silu(F.linear(timestep_embedding(values, dim, dtype), **first)), **second)


def mask_text(context, mask, mask_token):
    """[B, L, Dc], [B, L], [1, 1, Dc] -> [B, L, Dc] with mask_token where the mask is 0."""
    return torch.where(mask[..., None] > 0.5, context, mask_token[0, 0])


def embed_image(images, embedder, config: MMJiTConfig):
    """[B, C, H, W] -> [B, N, D]: bottleneck patch embed + the sin/cos table."""
    p = config.patch_size
    return (patch_tokens(images, embedder, config)
            + sincos_table(images.shape[2] // p, images.shape[3] // p, config.hidden_size, images.device, images.dtype))


def patch_tokens(images, embedder, config: MMJiTConfig):
    """[B, C, H, W] -> [B, N, D]: the bottleneck patch embed alone, no position (`embed_image`
    adds the table)."""
    b, c, height, width = images.shape
    p = config.patch_size
    grid_h, grid_w = height // p, width // p
    patches = images.reshape(b, c, grid_h, p, grid_w, p).permute(0, 2, 4, 1, 3, 5).reshape(b, grid_h * grid_w, -1)
    proj1, proj2 = embedder["proj1"], embedder["proj2"]
    img = F.linear(patches, proj1["weight"].reshape(config.pca_channels, -1))
    return F.linear(img, proj2["weight"].reshape(config.hidden_size, -1), proj2["bias"])


def preamble_block(txt, block, rope, config: MMJiTConfig):
    """Text-only pre-norm block with 1-D RoPE (model.md 3.8): [B, L, D] -> [B, L, D]."""
    q, k, v = project_qkv(rms_norm(txt, **block["norm1"]), block["qkv"], block["q_norm"], block["k_norm"],
                          config.num_heads)
    out = F.scaled_dot_product_attention(apply_rope(q, *rope), apply_rope(k, *rope), v)
    txt = txt + F.linear(merge_heads(out), **block["attn_proj"])
    return txt + swiglu(rms_norm(txt, **block["norm2"]), **block["mlp"])


def double_block(img, txt, block, rope, config: MMJiTConfig):
    """Joint attention over [txt ; img] (model.md 3.10): img [B, N, D], txt [B, L, D] -> (img, txt)."""
    length = txt.shape[1]
    qi, ki, vi = project_qkv(rms_norm(img, **block["img_norm1"]), block["img_qkv"], block["q_norm"],
                             block["k_norm"], config.num_heads)
    qt, kt, vt = project_qkv(rms_norm(txt, **block["txt_norm1"]), block["txt_qkv"], block["q_norm"],
                             block["k_norm"], config.num_heads)
    q = apply_rope(torch.cat([qt, qi], dim=2), *rope)
    k = apply_rope(torch.cat([kt, ki], dim=2), *rope)
    out = merge_heads(F.scaled_dot_product_attention(q, k, torch.cat([vt, vi], dim=2)))
    img = img + F.linear(out[:, length:], **block["img_attn_proj"])
    txt = txt + F.linear(out[:, :length], **block["txt_attn_proj"])
    img = img + swiglu(rms_norm(img, **block["img_norm2"]), **block["img_mlp"])
    txt = txt + swiglu(rms_norm(txt, **block["txt_norm2"]), **block["txt_mlp"])
    return img, txt


def final_layer(img, final):
    """[B, N, D] -> [B, N, p*p*C]: RMSNorm then linear, image tokens only (model.md 3.11)."""
    return F.linear(rms_norm(img, **final["norm_final"]), **final["linear"])


def transformer_body(img, txt, params, config: MMJiTConfig, grid_h: int, grid_w: int, txt_rope, rope, report):
    """img [B, N, D], txt [B, L, D], rope tables (cos, sin) [L, Dh/2] and [L + N, Dh/2] -> x0
    [B, C, H, W]: preamble blocks (text only, `txt_rope`), double blocks (joint, `rope`), final
    layer, unpatchify."""
    for i, block in enumerate(params["txt_preamble_blocks"]):
        txt = preamble_block(txt, block, txt_rope, config)
        report(f"preamble.{i}", txt)
    for i, block in enumerate(params["double_blocks"]):
        img, txt = double_block(img, txt, block, rope, config)
        report(f"double.{i}.img", img)
        report(f"double.{i}.txt", txt)
    out = final_layer(img, params["final_layer"])
    report("final_layer", out)
    b, p, c = out.shape[0], config.patch_size, config.in_channels
    out = out.reshape(b, grid_h, grid_w, p, p, c).permute(0, 5, 1, 3, 2, 4)
    return out.reshape(b, c, grid_h * p, grid_w * p)


# ---------------------------------------------------------------------------------------------
# T5


def t5_encode(params, config: T5Config, ids, mask, on_layer=None):
    """ids [B, L] (int64), mask [B, L] -> last hidden state [B, L, d_model] (torch, float32).
    `on_layer(name, value)`, if given, sees every block output ("t5.block.{i}")."""
    eps, heads = config.layer_norm_epsilon, config.num_heads
    report = layer_reporter(on_layer)
    blocks = params["encoder"]["block"]
    length = ids.shape[1]
    buckets = torch.from_numpy(np.array(relative_position_buckets(
        length, config.relative_attention_num_buckets, config.relative_attention_max_distance)))
    table = blocks[0]["layer"][0]["SelfAttention"]["relative_attention_bias"]["weight"]
    bias = table[buckets].permute(2, 0, 1)[None] + ((1.0 - mask) * torch.finfo(torch.float32).min)[:, None, None, :]
    h = params["shared"]["weight"][ids]
    for i, blk in enumerate(blocks):
        attn_layer, ffn_layer = blk["layer"]
        attn = attn_layer["SelfAttention"]
        x = rms_norm(h, **attn_layer["layer_norm"], eps=eps)
        q, k, v = (F.linear(x, **attn[n]).unflatten(-1, (heads, -1)).transpose(1, 2) for n in "qkv")
        scores = torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1)
        h = h + F.linear(merge_heads(scores @ v), **attn["o"])
        ffn = ffn_layer["DenseReluDense"]
        x = rms_norm(h, **ffn_layer["layer_norm"], eps=eps)
        gate = F.gelu(F.linear(x, **ffn["wi_0"]), approximate="tanh")
        h = h + F.linear(gate * F.linear(x, **ffn["wi_1"]), **ffn["wo"])
        report(f"t5.block.{i}", h)
    return rms_norm(h, **params["encoder"]["final_layer_norm"], eps=eps)
