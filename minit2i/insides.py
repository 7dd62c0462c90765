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

from minit2i.core.checks import human_size
from minit2i.core.errors import MiniT2IError
from minit2i.core.images import to_pixels
from minit2i.core.mean_flow_config import MeanFlowConfig
from minit2i.core.threads import blas_threads
from minit2i.reference.layers import attention_weights, joint_rope
from minit2i.reference.mean_flow import unrotated_prefix
from minit2i.reference.mean_flow_sampler import step_lengths
from minit2i.reference.mmjit import joint_qkv
from minit2i.reference.pipeline import NumpyRunner
from minit2i.reference.sampler import time_grid

from .pipeline import (
    Model,
    ModelFiles,
    Request,
    Result,
    check_memory,
    generate,
    is_student,
    make_runner,
    run_threads,
    sampling_defaults,
    seeded_noise,
    validate,
)

# The student's forwards for the conditional and unconditional predictions: omega 1 is "no
# guidance" (its conditional prediction, as the teacher's guided velocity with omega 1 is the
# conditional one, training/distill.py).
UNGUIDED = 1.0


# The insides the explore page keeps of a finished run, per session, so that another step or block
# is looked at without sampling again: every state and prediction in float32 (`kept_bytes`). The
# demo model's 20 steps take 1.9 MiB; B/16's 100 at 512 x 512, 603 MiB, are refused.
KEPT_RUN_LIMIT = 256 * 2**20


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
    stages: dict  # the conditional forward's stage outputs at the chosen step, by the reference's names


@dataclass
class FinishedRun:
    """A generation kept whole, so that any step and block can be looked at again without sampling."""

    request: Request
    states: np.ndarray  # float32 [steps + 1, C, H, W]: the noise, then the state after every step
    x0s: np.ndarray  # float32 [steps, C, H, W]: the (guided) clean-image prediction of every step
    context: np.ndarray  # [1, L, Dc]: the prompt through the reference's T5
    mask: np.ndarray  # [1, L]
    words: list[tuple[str, list[int]]]  # each prompt word and its token positions
    result: Result


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
    reference = runner if isinstance(runner, NumpyRunner) else make_runner(model)
    return look_at(model, reference, sample_and_keep(model, request, runner, reference, on_step), step, block)


def kept_bytes(request: Request, channels: int) -> int:
    """What `sample_and_keep` holds of a run: 2 steps + 1 float32 pictures of C x H x W."""
    return (2 * request.steps + 1) * channels * request.height * request.width * np.dtype(np.float32).itemsize


def check_kept_size(request: Request, channels: int, limit: int = KEPT_RUN_LIMIT) -> None:
    """Refuse, in one line, a run whose insides would not fit the page's bound (before sampling)."""
    size = kept_bytes(request, channels)
    if size > limit:
        raise MiniT2IError(f"keeping every step of this run ({request.steps} steps at {request.width} x "
                           f"{request.height}) takes {human_size(size, binary=True)}, over the page's "
                           f"{human_size(limit, binary=True)} per run; choose fewer steps or a smaller size")


def sample_and_keep(model: Model, request: Request, runner, reference: NumpyRunner, on_step=None) -> FinishedRun:
    """Generate `request` with `runner` and keep every state and prediction (`FinishedRun`); the
    prompt is encoded again by the reference, whose forwards `look_at` runs."""
    states, x0s = [seeded_noise(request, model.mmjit.config.in_channels)[0]], []  # the state before the first step

    def collect(info):
        states.append(np.asarray(runner.to_host(info.x)[0], np.float32))
        x0s.append(np.asarray(runner.to_host(info.x0)[0], np.float32))
        if on_step:
            on_step(info)

    result = generate(model, runner, request, collect, states[0][None])
    ids, mask = model.tokenizer([request.prompt])
    with blas_threads(run_threads(request, model)):  # the reference's own forwards, sized as generate's
        context = reference.encode(ids, mask)
    return FinishedRun(request, np.stack(states), np.stack(x0s), context, mask,
                       model.tokenizer.word_positions(request.prompt), result)


def step_times(run: FinishedRun, step: int) -> tuple[float, float]:
    """(t where sampling step `step` (0-based) starts, t where it ends) on the base sampler's clock,
    0 noise and 1 image, whichever sampler ran: both grids are uniform, and the student's own
    clock (1 noise, 0 image) reads 1 - t (concepts.md 7)."""
    grid = time_grid(run.request.steps)
    return float(grid[step]), float(grid[step + 1])


def step_velocity(run: FinishedRun, step: int) -> np.ndarray:
    """float32 [C, H, W]: the velocity sampling step `step` (0-based) followed, the move from its
    state to the next over the step's length of time (base clock)."""
    start, end = step_times(run, step)
    return (run.states[step + 1] - run.states[step]) / np.float32(end - start)


def velocity_correlation(run: FinishedRun, step: int, other: int) -> float:
    """The Pearson correlation of the pixels of two steps' velocities (0-based steps): 1 when one
    is the other scaled, what a straight path from noise to image gives at every step."""
    return float(np.corrcoef(step_velocity(run, step).ravel(), step_velocity(run, other).ravel())[0, 1])


def step_pictures(run: FinishedRun, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 [H, W, 3] x3 of sampling step `step` (0-based): the state x_t it starts from, the clean
    image x0 predicted there, and the velocity the step follows (`step_velocity`), shown on its
    own scale (its largest value white or black)."""
    velocity = step_velocity(run, step)
    velocity = velocity / max(float(np.abs(velocity).max()), np.finfo(np.float32).tiny)
    return tuple(to_pixels(picture[None])[0] for picture in (run.states[step], run.x0s[step], velocity))


def finished_x0_pixels(run: FinishedRun) -> list[np.ndarray]:
    """uint8 [H, W, 3] of the clean-image prediction of every step of `run`."""
    return [to_pixels(x0[None])[0] for x0 in run.x0s]


def look_at(model: Model, reference: NumpyRunner, run: FinishedRun, step: int, block: int) -> Insides:
    """The finished `run` at step `step` and double block `block` (both 0-based): one conditional
    and one unconditional forward of the reference from the kept state, no sampling."""
    request = run.request
    check_position(step, request.steps, "step", "--steps")
    check_position(block, model.mmjit.config.depth_double, "block", "the model's double blocks")
    with blas_threads(run_threads(request, model)):
        stages, (cond, uncond) = predictions(model, reference, request, step, run.states[step][None], run.context,
                                             run.mask)
        attention = word_attention(reference, stages, block, run.words, request.height, request.width)
    return Insides(run.result.pixels[0], finished_x0_pixels(run), [word for word, _ in run.words], attention, cond,
                   uncond, run.result, stages)


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


def check_position(index: int, count: int, name: str, limit: str, first: int = 0) -> None:
    """An index into `count` things (steps, blocks) counted from `first` (0 in the code, 1 on the
    explore page), else one line with the range."""
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not first <= index < first + count:
        raise MiniT2IError(f"{name} {index!r} is outside {first}..{first + count - 1} ({limit}: {count}); "
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
