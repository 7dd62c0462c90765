"""The four-step Mean Flow student on the GPU (twin of reference/mean_flow.py; same stages, same
`on_layer` names, "aux_tokens" included).

The student is MMJiT with a prefix of A auxiliary tokens in front of the text (model.md 9). The
prefix is small (A rows of D per sample, built from four [B] scalars and the pooled prompt), so
it is made of GEMMs in the network dtype and CuPy elementwise operations, the sinusoids and the
SiLU in fp32; everything after it is MMJiT's `transformer_body`. Its double blocks get RoPE
tables whose first A rows are angle 0 (cos 1, sin 0), which `qkv_heads` turns into exactly the
unrotated values: a * 1 - b * 0 = a (docs/kernels.md, "The Mean Flow student").

h, omega, t_min and t_max are float32 device arrays [B], read when the forward runs, so a
captured sampler step replayed after a new h was written into the same array uses the new h.
"""

from __future__ import annotations

import numpy as np

from minit2i.core.mean_flow_config import AUX_EMBEDDERS, SCALAR_EMBEDDERS, MeanFlowConfig, aux_token_groups
from minit2i.reference import mean_flow as reference
from minit2i.reference.layers import joint_rope

from .kernels import cp, device_cache
from .layers import device_text_rope, layer_reporter, linear, silu, to_device, upload_linear
from .mmjit import embed_image, mask_text, transformer_body, upload_mmjit


def upload_mean_flow(params, config: MeanFlowConfig, dtype) -> dict:
    """Checkpoint tree -> `upload_mmjit`'s device tree plus the prefix, all in `dtype`:
    `{group}_tokens` [count, D], `aux_pooled_embedder` (Linear Dc -> D, no bias) and each scalar
    embedder's two linear layers, {"mlp": {"0": F -> D, "2": D -> D}} as in the checkpoint."""
    tree = upload_mmjit(params, config, dtype)
    for group, count in aux_token_groups(config):
        tree[f"{group}_tokens"] = to_device(params[f"{group}_tokens"].reshape(count, config.hidden_size), dtype)
    tree["aux_pooled_embedder"] = upload_linear([params["aux_pooled_embedder"]["weight"]], dtype=dtype)
    for name in SCALAR_EMBEDDERS:
        mlp = params[name]["mlp"]
        tree[name] = {"mlp": {index: upload_linear([mlp[index]["weight"]], [mlp[index]["bias"]], dtype)
                              for index in ("0", "2")}}
    return tree


@device_cache(maxsize=8)
def device_embedding_frequencies(dim: int):
    """reference.mean_flow.embedding_frequencies on the device: float32 [dim/2]."""
    return cp.asarray(reference.embedding_frequencies(dim).astype(np.float32))


def timestep_embedding(values, dim: int, dtype):
    """float32 [B] device scalars -> [B, dim] in `dtype`: [cos(s f_k) | sin(s f_k)], computed in fp32."""
    angles = values[:, None] * device_embedding_frequencies(dim)
    return cp.concatenate([cp.cos(angles), cp.sin(angles)], axis=1).astype(dtype)


def scalar_embedder(values, embedder, dim: int, dtype):
    """float32 [B] device scalars -> [B, D]: sinusoid, Linear(dim -> D), SiLU, Linear(D -> D)."""
    first, second = embedder["mlp"]["0"], embedder["mlp"]["2"]
    return linear(silu(linear(timestep_embedding(values, dim, dtype), **first)), **second)


def aux_tokens(params, config: MeanFlowConfig, pooled, h, omega, t_min, t_max):
    """The prefix [B, A, D] in the order of `aux_token_groups`.

    pooled [B, Dc] (network dtype); h, omega, t_min, t_max float32 [B] device arrays. omega enters
    as 1 - 1/omega (0 = no guidance), computed in fp32.
    """
    dtype = pooled.dtype
    scalars = {"omega": 1.0 - 1.0 / omega, "t_min": t_min, "t_max": t_max, "time": h}
    embedded = {"context": linear(pooled, **params[AUX_EMBEDDERS["context"]])}
    for group, values in scalars.items():
        embedded[group] = scalar_embedder(values, params[AUX_EMBEDDERS[group]], config.frequency_embedding_size, dtype)
    return cp.concatenate([params[f"{group}_tokens"] + embedded[group][:, None, :]
                           for group, _ in aux_token_groups(config)], axis=1)


@device_cache(maxsize=32)
def device_unrotated_prefix(text_length: int, grid_h: int, grid_w: int, head_dim: int, count: int):
    """(cos, sin) float32 [text_length + grid_h*grid_w, head_dim/2] on the device: the joint tables
    of `device_joint_rope` with the first `count` rows at angle 0 (reference.mean_flow.unrotated_prefix).

    Built on the host and uploaded once per shape (step 0 of the sampler does it, so a captured
    step finds it cached and copies nothing to the device).
    """
    tables = reference.unrotated_prefix(joint_rope(text_length, grid_h, grid_w, head_dim, np.float32), count)
    return tuple(cp.asarray(table) for table in tables)


def mean_flow_forward(params, config: MeanFlowConfig, images, h, omega, t_min, t_max, context, mask,
                      on_layer=None):
    """Predict x0 on the device.

    images [B, C, H, W], context [B, L, Dc] (device arrays, network dtype), h, omega, t_min, t_max
    float32 [B] device arrays, mask [B, L] (any float) -> x0 [B, C, H, W] (C-contiguous, network
    dtype). `on_layer` as for `mmjit_forward`, plus "aux_tokens".
    """
    grid_h, grid_w = images.shape[2] // config.patch_size, images.shape[3] // config.patch_size
    report = layer_reporter(on_layer)
    img = embed_image(images, params["img_embedder"], config)
    report("patch_embed", img)
    masked = mask_text(context, mask, params["mask_token"])
    pooled = masked.astype(cp.float32).mean(axis=1).astype(masked.dtype)  # an fp32 sum over L
    prefix = aux_tokens(params, config, pooled, h, omega, t_min, t_max)
    report("aux_tokens", prefix)
    txt = cp.concatenate([prefix, linear(masked, **params["txt_embedder"])], axis=1)
    report("txt_embed", txt)
    length = txt.shape[1]
    return transformer_body(img, txt, params, config, grid_h, grid_w, device_text_rope(length, config.head_dim),
                            device_unrotated_prefix(length, grid_h, grid_w, config.head_dim, prefix.shape[1]), report)
