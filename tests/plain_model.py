"""A deliberately plain float64 re-computation of MMJiT (model.md 3), for the forward tests.

It reads the flat checkpoint dict by name and writes every op out by hand (explicit conv
windows, per-token position tables, per-pair RoPE, per-head attention with a hand-written
softmax), sharing no code with `reference.layers`. `plain_body` is the part after the text
embedding, so that tests/test_mean_flow.py can bring the student's prefix and angles to it.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-6


def plain_mmjit(w, cfg, images, context, mask):
    """Flat weights, images [B, 3, H, W], context [B, L, Dc], mask [B, L] -> float64 x0 [B, 3, H, W]."""
    w = as_float64(w)
    return np.stack([_plain_one(w, cfg, images[b], context[b], mask[b]) for b in range(images.shape[0])])


def as_float64(w):
    return {name: np.asarray(value, dtype=np.float64) for name, value in w.items()}


def _plain_one(w, cfg, image, context, mask):
    txt = masked_context(w, context, mask) @ w["txt_embedder.weight"].T
    text_angles = [text_angles_at(cfg, pos) for pos in range(len(txt))]
    return plain_body(w, cfg, image, txt, text_angles, text_angles)


def masked_context(w, context, mask):
    """3.2: masked positions become mask_token in T5 space -> [L, Dc]."""
    return np.stack([context[pos] if mask[pos] > 0.5 else w["mask_token"][0, 0] for pos in range(len(mask))])


def plain_body(w, cfg, image, txt, preamble_angles, text_angles):
    """Patch embed, preamble blocks (`preamble_angles` per text row), double blocks (`text_angles`
    per text row, then the image's), final layer, unpatchify -> x0 [3, H, W]."""
    p, d = cfg.patch_size, cfg.hidden_size
    grid_h, grid_w = image.shape[1] // p, image.shape[2] // p
    positions = [(r, c) for r in range(grid_h) for c in range(grid_w)]

    # 3.3 bottleneck patch embed: conv k=s=p without bias, then a 1x1 conv with bias
    img = np.zeros((len(positions), d))
    for n, (r, c) in enumerate(positions):
        window = image[:, r * p:(r + 1) * p, c * p:(c + 1) * p]
        pca = np.einsum("cij,ocij->o", window, w["img_embedder.proj1.weight"])
        img[n] = w["img_embedder.proj2.weight"][:, :, 0, 0] @ pca + w["img_embedder.proj2.bias"]
        img[n] += _sincos_row(r, c, d)

    for i in range(cfg.txt_preamble_depth):
        txt = _preamble(w, cfg, f"txt_preamble_blocks.{i}", txt, preamble_angles)
    joint_angles = list(text_angles) + [_image_angles(cfg, r, c) for r, c in positions]
    for i in range(cfg.depth_double):
        img, txt = _double(w, cfg, f"double_blocks.{i}", img, txt, joint_angles)

    final = norm(img, w["final_layer.norm_final.weight"])
    out = final @ w["final_layer.linear.weight"].T + w["final_layer.linear.bias"]
    x0 = np.zeros(image.shape)
    for n, (r, c) in enumerate(positions):
        for i in range(p):
            for j in range(p):
                for ch in range(3):
                    x0[ch, r * p + i, c * p + j] = out[n, (i * p + j) * 3 + ch]
    return x0


def _sincos_row(r, c, dim):
    quarter = dim // 4
    omega = np.array([10000.0 ** (-k / quarter) for k in range(quarter)])
    return np.concatenate([np.sin(c * omega), np.cos(c * omega), np.sin(r * omega), np.cos(r * omega)])


def text_angles_at(cfg, pos):
    dh = cfg.head_dim
    return np.array([pos * 10000.0 ** (-2 * j / dh) for j in range(dh // 2)])


def _image_angles(cfg, r, c):
    quarter = cfg.head_dim // 4
    freqs = [10000.0 ** (-2 * k / (cfg.head_dim // 2)) for k in range(quarter)]
    return np.array([r * g for g in freqs] + [c * g for g in freqs])


def norm(x, weight):
    return np.stack([row / np.sqrt(np.mean(row * row) + EPS) * weight for row in x])


def _rotate(vec, angles):
    half = len(vec) // 2
    out = np.empty(len(vec))
    for j in range(half):
        cos, sin = np.cos(angles[j]), np.sin(angles[j])
        out[j] = vec[j] * cos - vec[j + half] * sin
        out[j + half] = vec[j + half] * cos + vec[j] * sin
    return out


def _heads(w, cfg, block, prefix, h):
    """Per-head q, k (normed with the block's shared q_norm/k_norm), v: lists of [L, Dh]."""
    qkv = h @ w[f"{block}.{prefix}qkv.weight"].T + w[f"{block}.{prefix}qkv.bias"]
    d, dh = cfg.hidden_size, cfg.head_dim
    q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
    heads = []
    for head in range(cfg.num_heads):
        cols = slice(head * dh, (head + 1) * dh)
        heads.append((norm(q[:, cols], w[f"{block}.q_norm.weight"]),
                      norm(k[:, cols], w[f"{block}.k_norm.weight"]), v[:, cols]))
    return heads


def _attend(cfg, heads, angles):
    """Per-head softmax attention with RoPE on q and k; heads concatenated head-major -> [L, D]."""
    outputs = []
    for q, k, v in heads:
        q = np.stack([_rotate(q[i], angles[i]) for i in range(len(q))])
        k = np.stack([_rotate(k[i], angles[i]) for i in range(len(k))])
        out = np.zeros_like(v)
        for i in range(len(q)):
            logits = np.array([np.dot(q[i], k[j]) for j in range(len(k))]) / np.sqrt(cfg.head_dim)
            probs = np.exp(logits - logits.max())
            out[i] = (probs / probs.sum()) @ v
        outputs.append(out)
    return np.concatenate(outputs, axis=1)


def _swiglu(w, prefix, x):
    gate = x @ w[f"{prefix}.w1.weight"].T
    return (gate / (1.0 + np.exp(-gate)) * (x @ w[f"{prefix}.w3.weight"].T)) @ w[f"{prefix}.w2.weight"].T


def _preamble(w, cfg, b, txt, angles):
    out = _attend(cfg, _heads(w, cfg, b, "", norm(txt, w[f"{b}.norm1.weight"])), angles)
    txt = txt + out @ w[f"{b}.attn_proj.weight"].T + w[f"{b}.attn_proj.bias"]
    return txt + _swiglu(w, f"{b}.mlp", norm(txt, w[f"{b}.norm2.weight"]))


def _double(w, cfg, b, img, txt, angles):
    img_heads = _heads(w, cfg, b, "img_", norm(img, w[f"{b}.img_norm1.weight"]))
    txt_heads = _heads(w, cfg, b, "txt_", norm(txt, w[f"{b}.txt_norm1.weight"]))
    joint = [tuple(np.concatenate([t, i]) for t, i in zip(th, ih)) for th, ih in zip(txt_heads, img_heads)]
    out = _attend(cfg, joint, angles)
    length = len(txt)
    img = img + out[length:] @ w[f"{b}.img_attn_proj.weight"].T + w[f"{b}.img_attn_proj.bias"]
    txt = txt + out[:length] @ w[f"{b}.txt_attn_proj.weight"].T + w[f"{b}.txt_attn_proj.bias"]
    img = img + _swiglu(w, f"{b}.img_mlp", norm(img, w[f"{b}.img_norm2.weight"]))
    txt = txt + _swiglu(w, f"{b}.txt_mlp", norm(txt, w[f"{b}.txt_norm2.weight"]))
    return img, txt
