"""MMJiT on the GPU (twin of reference/mmjit.py; same stages, same `on_layer` names).

Per double block and stream the work is: RMSNorm -> packed QKV GEMM -> one qkv_heads kernel
(bias, per-head q/k RMSNorm, RoPE, split into the joint [txt ; img] buffers) -> one flash
attention over both streams -> output GEMM, reading the stream's rows of the attention output
where they are (a strided batched GEMM) -> one add_rms_norm kernel (bias + residual + norm2) ->
[W1|W3] GEMM -> SwiGLU kernel -> W2 GEMM, which adds into the residual stream itself (cuBLAS
beta = 1). Activations stay in the network dtype (fp32, fp16 or bf16); every kernel and GEMM
accumulates in fp32.

Within `streams.forked()` each double block's text stream runs on a second CUDA stream beside
the image stream's, joined before each joint attention (accelerated/streams.py).

The forward is split where the sampler needs it: `embed_prompt` (text embedder and the text-only
preamble blocks) depends on the prompt only, so the sampler runs it once per call and its
replayed step is `denoise_embedded`, the rest. The last double block's text stream feeds
nothing (the final layer reads the image tokens), so its attention output projection and MLP
run only when a layer hook asks for "double.{last}.txt".
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
    layer_reporter,
    linear,
    project,
    to_device,
    upload_gated_mlp,
    upload_linear,
    upload_norm,
)
from .streams import join_text_stream, on_text_stream


# ---------------------------------------------------------------------------------------------
# Upload: host tree (minit2i.core.weights.nest) -> device tree in the layouts the kernels want,
# under the checkpoint's names except where layers are packed (qkv: one stream's, mlp: gate_up)


def upload_mmjit(params, config: MMJiTConfig, dtype) -> dict:
    """Checkpoint tree -> device tree in `dtype`: transposed GEMM weights, [W1|W3] packed, each
    double block's two streams under "img" and "txt"."""
    embedder, final = params["img_embedder"], params["final_layer"]
    return {
        "img_embedder": {
            "proj1": upload_linear([embedder["proj1"]["weight"].reshape(config.pca_channels, -1)], dtype=dtype),
            "proj2": upload_linear([embedder["proj2"]["weight"].reshape(config.hidden_size, config.pca_channels)],
                                   [embedder["proj2"]["bias"]], dtype),
        },
        "mask_token": to_device(params["mask_token"], dtype),
        "txt_embedder": upload_linear([params["txt_embedder"]["weight"]], dtype=dtype),
        "txt_preamble_blocks": [_upload_stream(block, "", dtype) | _upload_qk_norms(block, dtype)
                                for block in params["txt_preamble_blocks"]],
        "double_blocks": [{"img": _upload_stream(block, "img_", dtype), "txt": _upload_stream(block, "txt_", dtype),
                           **_upload_qk_norms(block, dtype)} for block in params["double_blocks"]],
        "final_layer": {"norm_final": upload_norm(final["norm_final"], dtype),
                        "linear": upload_linear([final["linear"]["weight"]], [final["linear"]["bias"]], dtype)},
    }


def _upload_stream(block, prefix: str, dtype) -> dict:
    """One stream's norms, QKV, output projection and MLP (`prefix` is "", "img_" or "txt_")."""
    qkv, attn_proj, mlp = block[f"{prefix}qkv"], block[f"{prefix}attn_proj"], block[f"{prefix}mlp"]
    return {
        "norm1": upload_norm(block[f"{prefix}norm1"], dtype),
        "qkv": upload_linear([qkv["weight"]], [qkv["bias"]], dtype),
        "attn_proj": upload_linear([attn_proj["weight"]], [attn_proj["bias"]], dtype),
        "norm2": upload_norm(block[f"{prefix}norm2"], dtype),
        "mlp": upload_gated_mlp(mlp["w1"], mlp["w3"], mlp["w2"], dtype),
    }


def _upload_qk_norms(block, dtype) -> dict:
    """The block's per-head q and k norm weights [Dh], as the pair `kernels.qkv_heads` applies."""
    return {"qk_norms": tuple(to_device(block[name]["weight"], dtype) for name in ("q_norm", "k_norm"))}


# ---------------------------------------------------------------------------------------------
# Forward


def embed_image(images, embedder, config: MMJiTConfig):
    """[B, C, H, W] -> [B, N, D]: proj1, proj2 (+bias) and the cached 2-D sin/cos table."""
    p = config.patch_size
    grid_h, grid_w = images.shape[2] // p, images.shape[3] // p
    tokens = linear(linear(patchify(images, p), **embedder["proj1"]), **embedder["proj2"])
    tokens += device_sincos_table(grid_h, grid_w, config.hidden_size, tokens.dtype)
    return tokens


def mask_text(context, mask, mask_token):
    """[B, L, Dc], [B, L], [1, 1, Dc] -> [B, L, Dc] in context's dtype: padded positions become
    mask_token (MMJiT's only use of the mask).

    CuPy's where has no bfloat16 loop: bfloat16 runs its float32 loop and comes back float32
    (exactly the same values), so the dtype is pinned, never left to CuPy's promotion.
    """
    return cp.where(mask[..., None] > 0.5, context, mask_token[0, 0]).astype(context.dtype, copy=False)


def attention_inputs(batch: int, total_length: int, config: MMJiTConfig, dtype):
    """Empty q, k, v buffers [B, H, L_total, Dh] that qkv_heads fills stream by stream."""
    shape = (batch, config.num_heads, total_length, config.head_dim)
    return cp.empty(shape, dtype), cp.empty(shape, dtype), cp.empty(shape, dtype)


def write_heads(stream_tokens, stream, norms, rope, qkv_buffers, offset: int, config: MMJiTConfig):
    """[B, L, D] -> rows offset.. of q, k, v: norm1, QKV GEMM, then one fused qkv_heads kernel."""
    normed = kernels.rms_norm(stream_tokens, **stream["norm1"])
    qkv = project(normed, stream["qkv"]["weight"])
    kernels.qkv_heads(qkv, stream["qkv"]["bias"], config.num_heads, *qkv_buffers, offset=offset, norms=norms,
                      rope=rope)


def finish_stream(stream_tokens, attended, stream):
    """In place on [B, L, D] tokens: += attn_proj(attended) + bias, then += SwiGLU MLP of norm2.

    attended [B, L, D] may be one stream's rows of the joint attention output (a view whose
    samples are a stride apart): the projection GEMM reads them there, no copy. The MLP's W2 GEMM
    adds its product into the tokens (cuBLAS beta = 1: the product and the old value summed in
    fp32 and rounded once, one rounding fewer than a separate add).
    """
    normed = kernels.add_rms_norm(stream_tokens, project(attended, stream["attn_proj"]["weight"]),
                                  stream["attn_proj"]["bias"], **stream["norm2"])
    gated_mlp(normed, **stream["mlp"], activation="swiglu", accumulate=stream_tokens)


def preamble_block(txt, block, rope, config: MMJiTConfig):
    """Text-only block with 1-D RoPE: [B, L, D] -> [B, L, D] (updated in place)."""
    buffers = attention_inputs(txt.shape[0], txt.shape[1], config, txt.dtype)
    write_heads(txt, block, block["qk_norms"], rope, buffers, 0, config)
    finish_stream(txt, kernels.attention(*buffers, scale=config.head_dim**-0.5), block)
    return txt


def double_block(img, txt, block, rope, config: MMJiTConfig):
    """Joint attention over [txt ; img]: img [B, N, D], txt [B, L, D] -> (img, txt), in place.
    Within `streams.forked()` the text stream's work runs on the text stream."""
    length = txt.shape[1]
    attended = joint_attention(img, txt, block, rope, config)
    with on_text_stream(attended):
        finish_stream(txt, attended[:, :length], block["txt"])
    finish_stream(img, attended[:, length:], block["img"])
    return img, txt


def last_double_block(img, txt, block, rope, config: MMJiTConfig):
    """`double_block` when nothing reads its text stream (the final layer reads img only; no layer
    hook): the text stream stops at the joint attention. -> img [B, N, D], in place."""
    attended = joint_attention(img, txt, block, rope, config)
    finish_stream(img, attended[:, txt.shape[1]:], block["img"])
    return img


def joint_attention(img, txt, block, rope, config: MMJiTConfig):
    """Both streams' heads into the joint buffers, one attention over [txt ; img] -> [B, L + N, D]
    (the text stream joined first when forked)."""
    length = txt.shape[1]
    norms = block["qk_norms"]
    buffers = attention_inputs(img.shape[0], length + img.shape[1], config, img.dtype)
    with on_text_stream():
        write_heads(txt, block["txt"], norms, rope, buffers, 0, config)
    write_heads(img, block["img"], norms, rope, buffers, length, config)
    join_text_stream()
    return kernels.attention(*buffers, scale=config.head_dim**-0.5)


def final_layer(img, final):
    """[B, N, D] -> [B, N, p*p*C]: RMSNorm then linear."""
    return linear(kernels.rms_norm(img, **final["norm_final"]), **final["linear"])


def mmjit_forward(params, config: MMJiTConfig, images, context, mask, on_layer=None):
    """Predict x0 on the device.

    images [B, C, H, W], context [B, L, Dc] (device arrays, network dtype), mask [B, L] (any float) ->
    x0 [B, C, H, W] (C-contiguous, network dtype). `on_layer(name, value)` sees a device copy of
    every stage output under the reference's names.
    """
    report = layer_reporter(on_layer)
    img = embed_image(images, params["img_embedder"], config)
    report("patch_embed", img)
    txt = embed_prompt(params, config, context, mask, report)
    return joint_body(img, txt, params, config, *grid(images, config), report)


def embed_prompt(params, config: MMJiTConfig, context, mask, report=None):
    """What depends on the prompt only: context [B, L, Dc] (network dtype), mask [B, L] -> the text
    stream [B, L, D] after the text embedder and the text-only preamble blocks."""
    report = report or layer_reporter(None)
    txt = linear(mask_text(context, mask, params["mask_token"]), **params["txt_embedder"])
    report("txt_embed", txt)
    return text_preamble(txt, params, config, device_text_rope(context.shape[1], config.head_dim), report)


def denoise_embedded(params, config: MMJiTConfig, images, prompt):
    """`mmjit_forward` from `embed_prompt`'s text stream (the sampler's replayed step): images
    [B, C, H, W], prompt [B, L, D] (left unchanged: the blocks update a copy) -> x0 [B, C, H, W]."""
    img = embed_image(images, params["img_embedder"], config)
    return joint_body(img, prompt.copy(), params, config, *grid(images, config), layer_reporter(None))


def grid(images, config: MMJiTConfig) -> tuple[int, int]:
    """[B, C, H, W] -> (H, W) / patch size."""
    return images.shape[2] // config.patch_size, images.shape[3] // config.patch_size


def transformer_body(img, txt, params, config: MMJiTConfig, grid_h: int, grid_w: int, txt_rope, rope, report):
    """Everything after the embeddings: preamble blocks (text only, `txt_rope`), double blocks
    (joint, `rope`), final layer, unpatchify.

    img [B, N, D], txt [B, L, D] (both updated in place), device rope tables (cos, sin) float32
    [L, Dh/2] and [L + N, Dh/2] -> x0 [B, C, H, W] (C-contiguous). Shared with the Mean Flow
    student, which only brings other tokens and tables.
    """
    txt = text_preamble(txt, params, config, txt_rope, report)
    return joint_body(img, txt, params, config, grid_h, grid_w, report, rope)


def text_preamble(txt, params, config: MMJiTConfig, txt_rope, report):
    """The text-only blocks with 1-D RoPE (cos, sin) float32 [L, Dh/2]: [B, L, D] -> [B, L, D], in place."""
    for i, block in enumerate(params["txt_preamble_blocks"]):
        txt = preamble_block(txt, block, txt_rope, config)
        report(f"preamble.{i}", txt)
    return txt


def joint_body(img, txt, params, config: MMJiTConfig, grid_h: int, grid_w: int, report, rope=None):
    """Double blocks (joint RoPE `rope`, float32 [L + N, Dh/2]; default MMJiT's `device_joint_rope`),
    final layer, unpatchify: img [B, N, D], txt [B, L, D] (both updated in place) -> x0 [B, C, H, W]
    (C-contiguous)."""
    if rope is None:
        rope = device_joint_rope(txt.shape[1], grid_h, grid_w, config.head_dim)
    last = len(params["double_blocks"]) - 1
    for i, block in enumerate(params["double_blocks"]):
        if i < last or report.active:
            img, txt = double_block(img, txt, block, rope, config)
        else:
            img = last_double_block(img, txt, block, rope, config)
        if report.active:
            join_text_stream()  # the hook reads both streams
        report(f"double.{i}.img", img)
        report(f"double.{i}.txt", txt)
    out = final_layer(img, params["final_layer"])
    report("final_layer", out)
    return cp.ascontiguousarray(unpatchify(out, grid_h, grid_w, config.patch_size, config.in_channels))
