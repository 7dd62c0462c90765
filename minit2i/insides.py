"""What the model does inside one generation: the clean-image prediction at every step, which image
patches attend to each prompt word, and the conditional and unconditional predictions of one step
(`minit2i explore`, and the documentation's figures of attention and guidance).

All of it comes from the reference's own functions. `generate` runs the sampling, so the picture
is the one `minit2i generate` writes for the seed; one more forward at the chosen step hands the
chosen double block's inputs to the `on_layer` hook, and the block's attention weights are
recomputed from them with `joint_qkv` and `attention_weights`, the two halves of `double_block`'s
attention. The student's prefix rows (model.md 9.1) are keys too; the words' columns follow them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minit2i.core.errors import MiniT2IError
from minit2i.core.images import to_pixels
from minit2i.core.mean_flow_config import MeanFlowConfig
from minit2i.reference.layers import attention_weights, joint_rope
from minit2i.reference.mean_flow import unrotated_prefix
from minit2i.reference.mean_flow_sampler import step_lengths
from minit2i.reference.mmjit import joint_qkv
from minit2i.reference.pipeline import NumpyRunner

from .pipeline import (
    Model,
    ModelFiles,
    Request,
    Result,
    check_memory,
    generate,
    is_student,
    make_runner,
    sampling_defaults,
    seeded_noise,
    validate,
)

# The student's forwards for the conditional and unconditional predictions: omega 1 is "no
# guidance" (its conditional prediction, as the teacher's guided velocity with omega 1 is the
# conditional one, training/distill.py).
UNGUIDED = 1.0


@dataclass
class Insides:
    """One generation seen from inside; pictures are uint8 [H, W, 3]."""

    image: np.ndarray  # the final picture, as `minit2i generate` writes it
    x0_steps: list[np.ndarray]  # the (guided) clean-image prediction of every step
    words: list[str]  # the prompt's words
    attention: np.ndarray  # float32 [n_words, grid_h, grid_w]: what each image patch pays to each word
    cond_x0: np.ndarray  # the conditional prediction at the chosen step
    uncond_x0: np.ndarray  # the unconditional prediction (all-zero text mask) at the chosen step
    result: Result  # the generation itself: its pixels and timings


def look_inside(model: Model, prompt: str, *, seed: int, steps: int, guidance_scale: float, width: int, height: int,
                step: int, block: int, interval: tuple[float, float] | None = None, runner=None,
                on_step=None) -> Insides:
    """Generate `prompt` with `runner` (default: the NumPy reference) and look at sampling step
    `step` (0-based) and double-stream block `block` (0-based) through the reference.

    `interval` is a Mean Flow student's guidance interval (default: the model's). Attention is
    the conditional pass's, averaged over heads and summed over each word's tokens. `on_step(StepInfo)`
    is called after every sampler step (a progress bar).
    """
    request = inside_request(model, prompt, seed=seed, steps=steps, guidance_scale=guidance_scale, width=width,
                             height=height, step=step, block=block, interval=interval)
    runner = runner or make_runner(model)
    x0_steps, before = [], {}

    def collect(info):
        x0_steps.append(to_pixels(runner.to_host(info.x0))[0])
        if info.index == step - 1:
            before["x"] = runner.to_host(info.x)
        if on_step:
            on_step(info)

    noise = seeded_noise(request, model.mmjit.config.in_channels)  # the state before the first step
    result = generate(model, runner, request, collect, noise)
    x = before.get("x", noise)
    reference = runner if isinstance(runner, NumpyRunner) else make_runner(model)
    ids, mask = model.tokenizer([prompt])
    context = reference.encode(ids, mask)
    stages, (cond, uncond) = predictions(model, reference, request, step, x, context, mask)
    words = model.tokenizer.word_positions(prompt)
    return Insides(result.pixels[0], x0_steps, [word for word, _ in words],
                   word_attention(reference, stages, block, words, height, width), cond, uncond, result)


def inside_request(model: Model | ModelFiles, prompt: str, *, seed: int, steps: int, guidance_scale: float,
                   width: int, height: int, step: int, block: int,
                   interval: tuple[float, float] | None = None) -> Request:
    """The request `look_inside` runs, checked against the model's configs (a `ModelFiles` will do:
    no tensor is needed), so that a bad one is refused before any model is loaded."""
    given = {"steps": steps, "cfg_scale": guidance_scale, "width": width, "height": height, "seed": seed}
    if interval is not None:
        given["guidance_interval"] = interval
    request = Request(prompt, **(sampling_defaults(model) | given))
    validate(request, model, given)
    check_memory(request, model)
    check_position(step, steps, "step", "--steps")
    check_position(block, model.mmjit.config.depth_double, "block", "the model's double blocks")
    return request


def check_position(index: int, count: int, name: str, limit: str) -> None:
    """A 0-based `index` into `count` things (steps, blocks), else one line with the range."""
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < count:
        raise MiniT2IError(f"{name} {index!r} is outside 0..{count - 1} ({limit}: {count}); "
                           f"choose a {name} in that range")


def predictions(model: Model, reference: NumpyRunner, request: Request, step: int, x, context, mask):
    """(the conditional pass's stages {name: value}, (conditional, unconditional) x0 as uint8
    [H, W, 3]) at state x [1, C, H, W] of step `step`; context [1, L, Dc], mask [1, L].

    The stages are the sampler's own conditional forward: the base model's (prompt mask), the
    student's with its guidance and step length (guidance is one of its inputs); the student's
    conditional and unconditional predictions are made unguided.
    """
    stages = {}
    no_text = np.zeros_like(mask)
    if not is_student(model):
        cond = reference.denoise(x, context, mask, on_layer=stages.__setitem__)
        uncond = reference.denoise(x, context, no_text)
        return stages, (to_pixels(cond)[0], to_pixels(uncond)[0])
    t_min, t_max = request.guidance_interval

    def student(omega, text_mask, on_layer=None):
        scalars = (np.full(1, value, dtype=np.float64) for value in (step_lengths(request.steps)[step], omega,
                                                                   t_min, t_max))
        return reference.denoise_student(x, *scalars, context, text_mask, on_layer)

    student(request.cfg_scale, mask, stages.__setitem__)
    return stages, (to_pixels(student(UNGUIDED, mask))[0], to_pixels(student(UNGUIDED, no_text))[0])


def block_inputs(stages: dict, block: int, config) -> tuple[np.ndarray, np.ndarray]:
    """(img [B, N, D], txt [B, L, D]) entering double block `block`: the previous block's outputs,
    or for the first one the patch embedding and the last preamble block's text (the text
    embedding where there is no preamble)."""
    if block > 0:
        return stages[f"double.{block - 1}.img"], stages[f"double.{block - 1}.txt"]
    preamble = config.txt_preamble_depth
    return stages["patch_embed"], stages[f"preamble.{preamble - 1}" if preamble else "txt_embed"]


def prefix_length(config) -> int:
    """Text rows in front of the prompt's tokens: the student's auxiliary prefix (model.md 9.1)."""
    return config.num_aux_tokens if isinstance(config, MeanFlowConfig) else 0


def block_rope(config, text_length: int, grid_h: int, grid_w: int, dtype):
    """The joint RoPE tables (cos, sin) [text_length + N, Dh/2] that the forward hands the double
    blocks; a prefix's rows leave RoPE unrotated (model.md 9.2)."""
    return unrotated_prefix(joint_rope(text_length, grid_h, grid_w, config.head_dim, dtype), prefix_length(config))


def block_attention(reference: NumpyRunner, stages: dict, block: int, height: int, width: int) -> np.ndarray:
    """Attention weights [B, heads, T + N, T + N] of double block `block` (queries x keys, the T
    text rows first), recomputed from its inputs in `stages` with the forward's own functions."""
    config = reference.mmjit_config
    img, txt = block_inputs(stages, block, config)
    rope = block_rope(config, txt.shape[1], height // config.patch_size, width // config.patch_size, img.dtype)
    q, k, _ = joint_qkv(img, txt, reference.mmjit_params["double_blocks"][block], rope, config)
    return attention_weights(q, k, scale=config.head_dim**-0.5)


def word_attention(reference: NumpyRunner, stages: dict, block: int, words, height: int, width: int) -> np.ndarray:
    """float32 [n_words, grid_h, grid_w]: for each (word, token positions) of `words`, the weight
    the image patches give its tokens in block `block`, summed over them, averaged over heads."""
    config = reference.mmjit_config
    weights = block_attention(reference, stages, block, height, width)[0].mean(axis=0)  # [T + N, T + N]
    text = weights.shape[0] - (height // config.patch_size) * (width // config.patch_size)
    image_to_text = weights[text:, prefix_length(config):text]
    maps = [image_to_text[:, positions].sum(axis=1) for _, positions in words]
    return np.stack(maps).reshape(len(words), height // config.patch_size, width // config.patch_size).astype(
        np.float32)
