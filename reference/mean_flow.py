"""The four-step Mean Flow student (MiniT2I-B/16-MF) in NumPy (model.md 9; concepts.md 6).

It is MMJiT with guidance and time as inputs. Four scalars per sample, h = t - r (the step
length), omega (the guidance scale), t_min and t_max (the guidance interval), and the pooled
prompt become a prefix of A auxiliary tokens (20 for the released model) in front of the text:

    pooled = mean over L of the masked context                           [B, Dc]
    aux    = [context | omega | t_min | t_max | time] groups             [B, A, D]
             (each group: learned rows + one embedded vector broadcast over them)
    txt    = [aux ; txt_embedder(masked context)]                        [B, A + L, D]
    preamble blocks: 1-D RoPE over all A + L text positions
    double blocks:   joint RoPE as in MMJiT over [A + L ; N], but the A prefix rows unrotated

Everything else (patch embed, blocks, final layer) is MMJiT's own code. The network never sees
t itself, only h (the checkpoints' t_embedder and pooled_embedder are dead, model.md 9.3).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from minit2i.core.mean_flow_config import AUX_EMBEDDERS, MeanFlowConfig, aux_token_groups

from .layers import joint_rope, layer_reporter, linear, silu, text_rope, unpatchify
from .mmjit import double_block, embed_image, final_layer, mask_text, preamble_block


@lru_cache(maxsize=8)
def embedding_frequencies(dim: int):
    r"""[dim/2] float64 frequencies, k = 0..dim/2-1 (model.md 9.1).

    $$f_k = 10000^{-k/(\mathrm{dim}/2)}$$
    """
    half = dim // 2
    return np.exp(-np.log(10000.0) * np.arange(half, dtype=np.float64) / half)


def timestep_embedding(values, dim: int, dtype=np.float32):
    r"""[B] scalars -> [B, dim], cosines first (model.md 9.1).

    $$e(s) = [\,\cos(s\,f) \;;\; \sin(s\,f)\,], \qquad f = (f_0, \dots, f_{K-1})$$

    elementwise over the $K = \mathrm{dim}/2$ frequencies of `embedding_frequencies`."""
    angles = np.asarray(values, dtype=np.float64)[:, None] * embedding_frequencies(dim)
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(dtype)


def scalar_embedder(values, embedder, dim: int, dtype):
    r"""[B] scalars -> [B, D]: sinusoid, Linear(dim -> D), SiLU, Linear(D -> D), both with bias.

    $$\mathrm{emb}(s) = \mathrm{SiLU}(e(s)\,W_1^\top + b_1)\,W_2^\top + b_2$$
    """
    first, second = embedder["mlp"]["0"], embedder["mlp"]["2"]
    return linear(silu(linear(timestep_embedding(values, dim, dtype), **first)), **second)


def aux_tokens(params, config: MeanFlowConfig, pooled, h, omega, t_min, t_max):
    r"""The prefix [B, A, D] in the order of `aux_token_groups` (model.md 9.1).

    pooled [B, Dc]; h, omega, t_min, t_max [B]. omega enters as 1 - 1/omega (0 = no guidance).

    $$\mathrm{aux} = [A_{ctx} \;|\; A_\omega \;|\; A_{min} \;|\; A_{max} \;|\; A_{time}]$$

    $$A_{ctx} = T_{ctx} + \bar c\,W_{pool}^\top$$

    $$A_\omega = T_\omega + \mathrm{emb}_\omega(1 - 1/\omega)$$

    $$A_{min} = T_{min} + \mathrm{emb}_{min}(t_{min})$$

    $$A_{max} = T_{max} + \mathrm{emb}_{max}(t_{max})$$

    $$A_{time} = T_{time} + \mathrm{emb}_h(h)$$
    """
    dtype = pooled.dtype
    scalars = {"omega": 1.0 - 1.0 / np.asarray(omega, np.float64), "t_min": t_min, "t_max": t_max, "time": h}
    embedded = {"context": linear(pooled, **params[AUX_EMBEDDERS["context"]])}
    for group, values in scalars.items():
        embedded[group] = scalar_embedder(values, params[AUX_EMBEDDERS[group]], config.frequency_embedding_size, dtype)
    return np.concatenate([params[f"{group}_tokens"] + embedded[group][:, None, :]
                           for group, _ in aux_token_groups(config)], axis=1)


def unrotated_prefix(rope, count: int):
    r"""(cos, sin) [L, Dh/2] -> the same tables with the first `count` rows at angle 0, so those
    rows leave RoPE exactly as they came (model.md 9.2):

    $$\cos\theta_l = 1,\ \sin\theta_l = 0 \quad (l < \mathrm{count})$$

    $$\Rightarrow\quad x \cdot 1 - y \cdot 0 = x$$
    """
    cos, sin = (table.copy() for table in rope)
    cos[:count], sin[:count] = 1, 0
    return cos, sin


def mean_flow_forward(params, config: MeanFlowConfig, images, h, omega, t_min, t_max, context, mask,
                      on_layer=None):
    """Predict the clean image x0 from a noisy image and the sampler's scalars.

    images [B, C, H, W]; h, omega, t_min, t_max [B]; context [B, L, Dc]; mask [B, L] -> x0
    [B, C, H, W] in the dtype of `images` (and of `params`). `on_layer` as for `mmjit_forward`, plus
    "aux_tokens".
    """
    dtype = images.dtype
    report = layer_reporter(on_layer)
    img = embed_image(images, params["img_embedder"], config)
    report("patch_embed", img)
    masked = mask_text(context.astype(dtype), mask, params["mask_token"])
    # The step length, guidance and interval enter as tokens in front of the text, not as a
    # modulation of every layer: the blocks read them through attention, as they read words.
    prefix = aux_tokens(params, config, masked.mean(axis=1), h, omega, t_min, t_max)
    report("aux_tokens", prefix)
    txt = np.concatenate([prefix, linear(masked, **params["txt_embedder"])], axis=1)
    report("txt_embed", txt)
    grid_h, grid_w = images.shape[2] // config.patch_size, images.shape[3] // config.patch_size
    length = txt.shape[1]
    txt_rope = text_rope(length, config.head_dim, dtype)
    # The prefix is conditioning, not a place in the text: in the joint attention it carries no
    # position (model.md 9.2).
    rope = unrotated_prefix(joint_rope(length, grid_h, grid_w, config.head_dim, dtype), prefix.shape[1])
    # From here on MMJiT's forward, block for block (`mmjit.mmjit_forward`): the prefix rides along
    # as text.
    for i, block in enumerate(params["txt_preamble_blocks"]):
        txt = preamble_block(txt, block, txt_rope, config)
        report(f"preamble.{i}", txt)
    for i, block in enumerate(params["double_blocks"]):
        img, txt = double_block(img, txt, block, rope, config)
        report(f"double.{i}.img", img)
        report(f"double.{i}.txt", txt)
    out = final_layer(img, params["final_layer"])
    report("final_layer", out)
    return unpatchify(out, grid_h, grid_w, config.patch_size, config.in_channels)
