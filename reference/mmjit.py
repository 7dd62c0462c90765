"""MMJiT, the MiniT2I denoiser, in NumPy (model.md 3): it predicts the clean image (concepts.md 2)
with joint attention between words and patches (concepts.md 4) and their positions (concepts.md 5).

    image [B,3,H,W] --patch embed + sin/cos--> img tokens [B, N, D]
    T5 context [B,L,1024] --mask_token where mask=0--> txt_embedder --> txt tokens [B, L, D]
    txt --2 preamble blocks (text-only attention, 1-D RoPE)--> txt
    (img, txt) --17 double-stream blocks (joint attention over [txt ; img])--> img
    img --RMSNorm + linear--> [B, N, p*p*3] --unpatchify--> x0 [B,3,H,W]

The network never sees the timestep. `params` is the checkpoint as a tree
(`minit2i.core.weights.nest`), e.g. params["double_blocks"][3]["img_qkv"]["weight"], already in
the dtype to compute in (the runner casts it once, `layers.cast_tree`). Every layer is a
{"weight", "bias"} leaf unpacked into the function that uses it, picoGPT style:
`linear(x, **block["img_attn_proj"])`.
"""

from __future__ import annotations

import numpy as np

from minit2i.core.mmjit_config import MMJiTConfig

from .layers import (
    apply_rope,
    attention,
    joint_rope,
    layer_reporter,
    linear,
    merge_heads,
    patchify,
    rms_norm,
    sincos_2d_table,
    split_heads,
    swiglu,
    text_rope,
    unpatchify,
)


def embed_image(images, embedder, config: MMJiTConfig):
    r"""Bottleneck patch embed + 2-D sin/cos table: [B, C, H, W] -> [B, N, D] (model.md 3.3, 3.4).

    $$\mathrm{img} = (P\,W_1^\top)\,W_2^\top + b_2 + E_{\sin/\cos}$$

    proj1 (conv k=p, s=p, no bias) is a matmul $P\,W_1^\top$ on the channel-slowest flattened
    patches P; proj2 is a 1x1 conv, i.e. a linear layer. Nothing sits between them.
    """
    p = config.patch_size
    grid_h, grid_w = images.shape[2] // p, images.shape[3] // p
    proj1, proj2 = embedder["proj1"], embedder["proj2"]
    bottleneck = linear(patchify(images, p), proj1["weight"].reshape(config.pca_channels, -1))
    tokens = linear(bottleneck, proj2["weight"].reshape(config.hidden_size, config.pca_channels), proj2["bias"])
    return tokens + sincos_2d_table(grid_h, grid_w, config.hidden_size, images.dtype)


def mask_text(context, mask, mask_token):
    r"""[B, L, Dc], [B, L], [1, 1, Dc] -> [B, L, Dc]: padded positions become mask_token (model.md 3.2).

    $$c'_{b,l} = \begin{cases} c_{b,l} & m_{b,l} > 0.5 \\ \mathrm{mask\_token} & \text{otherwise} \end{cases}$$

    This is the only use of the mask in MMJiT: there is no attention mask anywhere.
    """
    return np.where(mask[..., None] > 0.5, context, mask_token[0, 0])


def project_qkv(h, qkv, q_norm, k_norm, num_heads: int):
    r"""h [B, L, D] -> q, k, v each [B, H, L, Dh]; q and k RMS-normed per head (before RoPE).

    $$[q\,|\,k\,|\,v] = h\,W_{qkv}^\top + b_{qkv}$$

    $$q \leftarrow \mathrm{RMSNorm}(q), \qquad k \leftarrow \mathrm{RMSNorm}(k)$$
    """
    q, k, v = np.split(linear(h, **qkv), 3, axis=-1)
    q = rms_norm(split_heads(q, num_heads), **q_norm)
    k = rms_norm(split_heads(k, num_heads), **k_norm)
    return q, k, split_heads(v, num_heads)


def preamble_block(txt, block, rope, config: MMJiTConfig):
    r"""Text-only pre-norm block with 1-D RoPE (model.md 3.8): [B, L, D] -> [B, L, D].

    $$t \leftarrow t + \mathrm{Attn}\big(\mathrm{RMSNorm}(t)\big)\,W_o^\top + b_o$$

    $$t \leftarrow t + \mathrm{SwiGLU}\big(\mathrm{RMSNorm}(t)\big)$$
    """
    cos, sin = rope
    q, k, v = project_qkv(rms_norm(txt, **block["norm1"]), block["qkv"], block["q_norm"], block["k_norm"],
                          config.num_heads)
    out = attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, scale=config.head_dim**-0.5)
    txt = txt + linear(merge_heads(out), **block["attn_proj"])
    return txt + swiglu(rms_norm(txt, **block["norm2"]), **block["mlp"])


def joint_qkv(img, txt, block, rope, config: MMJiTConfig):
    """The joint sequence's q, k, v of a double block, each [B, H, L + N, Dh], text first, q and k
    rotated: img [B, N, D], txt [B, L, D], rope tables (cos, sin) [L + N, Dh/2] (model.md 3.7)."""
    cos, sin = rope
    # Each stream projects with its own weights: words and patches are different kinds of token ...
    qi, ki, vi = project_qkv(rms_norm(img, **block["img_norm1"]), block["img_qkv"], block["q_norm"],
                             block["k_norm"], config.num_heads)
    qt, kt, vt = project_qkv(rms_norm(txt, **block["txt_norm1"]), block["txt_qkv"], block["q_norm"],
                             block["k_norm"], config.num_heads)
    # ... but they are scored in one sequence, so a patch can attend to a word and a word to a patch.
    # RoPE after the concatenation: one table gives the text its 1-D and the image its 2-D positions.
    q = apply_rope(np.concatenate([qt, qi], axis=2), cos, sin)
    k = apply_rope(np.concatenate([kt, ki], axis=2), cos, sin)
    return q, k, np.concatenate([vt, vi], axis=2)


def double_block(img, txt, block, rope, config: MMJiTConfig):
    r"""Double-stream block with joint attention over [txt ; img] (model.md 3.10).

    img [B, N, D], txt [B, L, D] -> (img, txt). Each stream has its own norms, qkv, output
    projection and MLP; one q_norm/k_norm pair is shared by both streams. The two streams meet
    only in one attention over the joint sequence, text first (model.md 3.7):

    $$[o_t ; o_i] = \mathrm{softmax}\!\left(\frac{q\,k^\top}{\sqrt{D_h}}\right) v$$

    $$q = \mathrm{RoPE}([q_t ; q_i]),\; k = \mathrm{RoPE}([k_t ; k_i]),\; v = [v_t ; v_i]$$
    """
    length = txt.shape[1]
    # No attention mask: padding was replaced by mask_token before the first block (`mask_text`).
    out = merge_heads(attention(*joint_qkv(img, txt, block, rope, config), scale=config.head_dim**-0.5))
    # The joint output splits back into the streams; each keeps its residual and its own weights.
    img = img + linear(out[:, length:], **block["img_attn_proj"])
    txt = txt + linear(out[:, :length], **block["txt_attn_proj"])
    img = img + swiglu(rms_norm(img, **block["img_norm2"]), **block["img_mlp"])
    txt = txt + swiglu(rms_norm(txt, **block["txt_norm2"]), **block["txt_mlp"])
    return img, txt


def final_layer(img, final):
    r"""[B, N, D] -> [B, N, p*p*C]: RMSNorm then linear, image tokens only (model.md 3.11).

    $$\mathrm{out} = \mathrm{RMSNorm}(\mathrm{img})\,W^\top + b$$
    """
    return linear(rms_norm(img, **final["norm_final"]), **final["linear"])


def mmjit_forward(params, config: MMJiTConfig, images, context, mask, on_layer=None):
    r"""Predict the clean image x0 (concepts.md 1-4, model.md 3):

    $$\mathrm{txt} \leftarrow \mathrm{Preamble}_j(\mathrm{txt}), \quad j = 1..P$$

    $$(\mathrm{img}, \mathrm{txt}) \leftarrow \mathrm{Double}_i(\mathrm{img}, \mathrm{txt}), \quad i = 1..D$$

    $$x_0 = \mathrm{unpatchify}\big(\mathrm{Final}(\mathrm{img})\big)$$

    images [B, C, H, W] (H, W multiples of the patch size), context [B, L, txt_input_size],
    mask [B, L] (1 real token, 0 padding) -> x0 [B, C, H, W], in the dtype of `images` (and of
    `params`). `on_layer(name, value)`, if given, sees every stage output (`layers.layer_reporter`).
    """
    dtype = images.dtype
    report = layer_reporter(on_layer)
    img = embed_image(images, params["img_embedder"], config)
    report("patch_embed", img)
    txt = linear(mask_text(context.astype(dtype), mask, params["mask_token"]), **params["txt_embedder"])
    report("txt_embed", txt)
    grid_h, grid_w = images.shape[2] // config.patch_size, images.shape[3] // config.patch_size
    txt_rope = text_rope(txt.shape[1], config.head_dim, dtype)
    rope = joint_rope(txt.shape[1], grid_h, grid_w, config.head_dim, dtype)
    # The text first reads itself (the image is not there yet to distract it), ...
    for i, block in enumerate(params["txt_preamble_blocks"]):
        txt = preamble_block(txt, block, txt_rope, config)
        report(f"preamble.{i}", txt)
    # ... then both streams meet in every double block's one joint attention.
    for i, block in enumerate(params["double_blocks"]):
        img, txt = double_block(img, txt, block, rope, config)
        report(f"double.{i}.img", img)
        report(f"double.{i}.txt", txt)
    out = final_layer(img, params["final_layer"])  # the text stream's last state is not used
    report("final_layer", out)
    return unpatchify(out, grid_h, grid_w, config.patch_size, config.in_channels)
