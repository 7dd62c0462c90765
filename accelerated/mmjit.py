"""MMJiT on the GPU (twin of reference/mmjit.py; same stages, same `on_layer` names).

Per double block and stream the work is: RMSNorm -> packed QKV GEMM -> one qkv_heads kernel
(bias, per-head q/k RMSNorm, RoPE, split into the joint [txt ; img] buffers) -> one flash
attention over both streams -> output GEMM -> one add_rms_norm kernel (bias + residual +
norm2) -> [W1|W3] GEMM -> SwiGLU kernel -> W2 GEMM -> residual add. Activations stay in the
network dtype (fp32, fp16 or bf16); every kernel accumulates in fp32.
"""

from __future__ import annotations

from minit2i.core.mmjit_config import MMJiTConfig
from minit2i.reference.layers import patchify, unpatchify

from . import kernels
from .kernels import cp
from .layers import (
    device_joint_rope,
    device_sincos_table,
    device_text_rope,
    gated_mlp,
    linear,
    project,
    to_device,
    upload_linear,
)

NORM_EPS = 1e-6


# ---------------------------------------------------------------------------------------------
# Upload: host tree (minit2i.core.checkpoint.nest) -> device tree in the layouts the kernels want


def upload_mmjit(params, config: MMJiTConfig, dtype) -> dict:
    """Checkpoint tree -> device tree in `dtype`: transposed GEMM weights, [W1|W3] packed."""
    embedder = params["img_embedder"]
    return {
        "proj1": upload_linear([embedder["proj1"]["weight"].reshape(config.pca_channels, -1)], dtype=dtype),
        "proj2": upload_linear([embedder["proj2"]["weight"].reshape(config.hidden_size, config.pca_channels)],
                               [embedder["proj2"]["bias"]], dtype),
        "mask_token": to_device(params["mask_token"].reshape(-1), dtype),
        "txt_embedder": upload_linear([params["txt_embedder"]["weight"]], dtype=dtype),
        "preamble": [_upload_stream(block, "", dtype) | _upload_qk_norms(block, dtype)
                     for block in params["txt_preamble_blocks"]],
        "double": [{"img": _upload_stream(block, "img_", dtype), "txt": _upload_stream(block, "txt_", dtype),
                    **_upload_qk_norms(block, dtype)} for block in params["double_blocks"]],
        "final_norm": to_device(params["final_layer"]["norm_final"]["weight"], dtype),
        "final_linear": upload_linear([params["final_layer"]["linear"]["weight"]],
                                      [params["final_layer"]["linear"]["bias"]], dtype),
    }


def _upload_stream(block, prefix: str, dtype) -> dict:
    """One stream's norms, QKV, output projection and MLP (`prefix` is "", "img_" or "txt_")."""
    mlp = block[f"{prefix}mlp"]
    return {
        "norm1": to_device(block[f"{prefix}norm1"]["weight"], dtype),
        "qkv": upload_linear([block[f"{prefix}qkv"]["weight"]], [block[f"{prefix}qkv"]["bias"]], dtype),
        "attn_proj": upload_linear([block[f"{prefix}attn_proj"]["weight"]], [block[f"{prefix}attn_proj"]["bias"]], dtype),
        "norm2": to_device(block[f"{prefix}norm2"]["weight"], dtype),
        "mlp": {"gate_up": upload_linear([mlp["w1"]["weight"], mlp["w3"]["weight"]], dtype=dtype),
                "down": upload_linear([mlp["w2"]["weight"]], dtype=dtype)},
    }


def _upload_qk_norms(block, dtype) -> dict:
    return {"q_norm": to_device(block["q_norm"]["weight"], dtype), "k_norm": to_device(block["k_norm"]["weight"], dtype)}


# ---------------------------------------------------------------------------------------------
# Forward


def embed_image(images, params, config: MMJiTConfig):
    """[B, C, H, W] -> [B, N, D]: proj1, proj2 (+bias) and the cached 2-D sin/cos table."""
    p = config.patch_size
    grid_h, grid_w = images.shape[2] // p, images.shape[3] // p
    tokens = linear(project(patchify(images, p), params["proj1"]["w_t"]), params["proj2"])
    tokens += device_sincos_table(grid_h, grid_w, config.hidden_size, tokens.dtype)
    return tokens


def mask_text(context, mask, mask_token):
    """[B, L, Dc], [B, L], [Dc] -> [B, L, Dc]: padded positions become mask_token (MMJiT's only use
    of the mask)."""
    return cp.where(mask[..., None] > 0.5, context, mask_token)


def attention_inputs(batch: int, total_length: int, config: MMJiTConfig, dtype):
    """Empty q, k, v buffers [B, H, L_total, Dh] that qkv_heads fills stream by stream."""
    shape = (batch, config.num_heads, total_length, config.head_dim)
    return cp.empty(shape, dtype), cp.empty(shape, dtype), cp.empty(shape, dtype)


def write_heads(stream_tokens, stream, norms, rope, qkv_buffers, offset: int, config: MMJiTConfig):
    """[B, L, D] -> rows offset.. of q, k, v: norm1, QKV GEMM, then one fused qkv_heads kernel."""
    normed = kernels.rms_norm(stream_tokens, stream["norm1"], NORM_EPS)
    qkv = project(normed, stream["qkv"]["w_t"])
    kernels.qkv_heads(qkv, stream["qkv"]["bias"], config.num_heads, *qkv_buffers, offset=offset,
                      norms=norms, rope=rope, eps=NORM_EPS)


def finish_stream(stream_tokens, attended, stream):
    """In place on [B, L, D] tokens: += attn_proj(attended) + bias, then += SwiGLU MLP of norm2."""
    normed = kernels.add_rms_norm(stream_tokens, project(attended, stream["attn_proj"]["w_t"]),
                                  stream["attn_proj"]["bias"], stream["norm2"], NORM_EPS)
    stream_tokens += gated_mlp(normed, stream["mlp"], "swiglu")


def preamble_block(txt, block, rope, config: MMJiTConfig):
    """Text-only block with 1-D RoPE: [B, L, D] -> [B, L, D] (updated in place)."""
    buffers = attention_inputs(txt.shape[0], txt.shape[1], config, txt.dtype)
    write_heads(txt, block, (block["q_norm"], block["k_norm"]), rope, buffers, 0, config)
    finish_stream(txt, kernels.attention(*buffers, scale=config.head_dim**-0.5), block)
    return txt


def double_block(img, txt, block, rope, config: MMJiTConfig):
    """Joint attention over [txt ; img]: img [B, N, D], txt [B, L, D] -> (img, txt), in place."""
    length = txt.shape[1]
    norms = (block["q_norm"], block["k_norm"])
    buffers = attention_inputs(img.shape[0], length + img.shape[1], config, img.dtype)
    write_heads(txt, block["txt"], norms, rope, buffers, 0, config)
    write_heads(img, block["img"], norms, rope, buffers, length, config)
    attended = kernels.attention(*buffers, scale=config.head_dim**-0.5)
    finish_stream(img, attended[:, length:], block["img"])
    finish_stream(txt, attended[:, :length], block["txt"])
    return img, txt


def final_layer(img, params):
    """[B, N, D] -> [B, N, p*p*C]: RMSNorm then linear."""
    return linear(kernels.rms_norm(img, params["final_norm"], NORM_EPS), params["final_linear"])


def layer_reporter(on_layer):
    """on_layer (or None) -> report(name, value) handing it a device copy: the blocks update the
    residual streams in place, so a reported array would otherwise change under the caller."""
    def report(name, value):
        if on_layer:
            on_layer(name, value.copy())
    return report


def mmjit_forward(params, config: MMJiTConfig, images, context, mask, on_layer=None):
    """Predict x0 on the device.

    images [B, C, H, W], context [B, L, Dc] (device arrays, network dtype), mask [B, L] (any float) ->
    x0 [B, C, H, W] (C-contiguous, network dtype). `on_layer(name, value)` sees a device copy of
    every stage output under the reference's names.
    """
    grid_h, grid_w = images.shape[2] // config.patch_size, images.shape[3] // config.patch_size
    length = context.shape[1]
    report = layer_reporter(on_layer)
    img = embed_image(images, params, config)
    report("patch_embed", img)
    txt = project(mask_text(context, mask, params["mask_token"]), params["txt_embedder"]["w_t"])
    report("txt_embed", txt)
    return transformer_body(img, txt, params, config, grid_h, grid_w, device_text_rope(length, config.head_dim),
                            device_joint_rope(length, grid_h, grid_w, config.head_dim), report)


def transformer_body(img, txt, params, config: MMJiTConfig, grid_h: int, grid_w: int, txt_rope, rope, report):
    """Everything after the embeddings: preamble blocks (text only, `txt_rope`), double blocks
    (joint, `rope`), final layer, unpatchify.

    img [B, N, D], txt [B, L, D] (both updated in place), device rope tables (cos, sin) float32
    [L, Dh/2] and [L + N, Dh/2] -> x0 [B, C, H, W] (C-contiguous). Shared with the Mean Flow
    student, which only brings other tokens and tables.
    """
    for i, block in enumerate(params["preamble"]):
        txt = preamble_block(txt, block, txt_rope, config)
        report(f"preamble.{i}", txt)
    for i, block in enumerate(params["double"]):
        img, txt = double_block(img, txt, block, rope, config)
        report(f"double.{i}.img", img)
        report(f"double.{i}.txt", txt)
    out = final_layer(img, params)
    report("final_layer", out)
    return cp.ascontiguousarray(unpatchify(out, grid_h, grid_w, config.patch_size, config.in_channels))
