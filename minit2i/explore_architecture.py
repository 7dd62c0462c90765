"""The explorer's picture of the model: MM-JiT's data flow from prompt and noisy state to the next
state, drawn from the loaded model's config, each stage with its tensor shape for the current run
(docs/explore.md, "The model, stage by stage").

The stages are the reference's own (the `on_layer` names of `mmjit_forward` and
`mean_flow_forward`, which `minit2i trace` compares too), plus the T5 output before them and the
sampler's step after them. A stage chosen on the page shows its output at the chosen step of the
kept run: a picture of the image for the states and predictions, each patch's vector length for
the image tokens, the token-by-feature table for the text tokens. Each links the concepts section
that explains it and the served page of the function that computes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minit2i.core.errors import MiniT2IError
from minit2i.core.images import to_pixels
from minit2i.core.mean_flow_config import MeanFlowConfig
from minit2i.reference.layers import unpatchify

from .code_pages import code_link
from .console import printable
from .explore_tutor import concept_link, served_code
from .insides import FinishedRun, Insides

# The text tables and patch maps are drawn this many pixels a row / a patch.
ROW_PIXELS, PATCH_PIXELS = 3, 8


@dataclass(frozen=True)
class Stage:
    """One box of the diagram: its key (the page's choice), its title, and where it is explained."""

    key: str
    title: str
    concept: int  # the concepts.md section
    code: tuple[str, str]  # (repository path, function) of the code that computes it


STAGES = (
    Stage("t5", "prompt through T5", 4, ("reference/t5.py", "t5_encode")),
    Stage("aux_tokens", "the student's prefix", 6, ("reference/mean_flow.py", "aux_tokens")),
    Stage("txt_embed", "text embedder", 4, ("reference/mmjit.py", "mmjit_forward")),
    Stage("preamble", "preamble blocks (text only)", 4, ("reference/mmjit.py", "preamble_block")),
    Stage("state", "noisy state x_t", 1, ("reference/sampler.py", "sample")),
    Stage("patch_embed", "patch embed + bottleneck", 2, ("reference/mmjit.py", "embed_image")),
    Stage("double", "double blocks: joint attention", 4, ("reference/mmjit.py", "double_block")),
    Stage("final_layer", "final layer", 2, ("reference/mmjit.py", "final_layer")),
    Stage("x0", "x0: the clean-image prediction", 2, ("reference/sampler.py", "guided_x0")),
    Stage("step", "sampler step, back to x_t", 1, ("reference/sampler.py", "euler_step")),
)
STAGE_KEYS = tuple(stage.key for stage in STAGES)
FIRST_SHOWN = "patch_embed"


def checked_stage(key) -> str:
    """A stage key as a client sent it, if it is one of STAGE_KEYS; else one line."""
    if not isinstance(key, str) or key not in STAGE_KEYS:
        raise MiniT2IError(f"stage {printable(repr(key), 100)} is not a stage of the model; choose one of "
                           f"{', '.join(STAGE_KEYS)}")
    return key


def shape(*dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def stage_shapes(config, width: int, height: int, steps: int) -> dict[str, str]:
    """{stage key: its output's shape for one image of a run of `width` x `height` in `steps` steps}
    (the conditional pass; a base model's sampler runs it with the unconditional one, batch 2)."""
    p, c, d = config.patch_size, config.in_channels, config.hidden_size
    grid = (height // p) * (width // p)
    prefix = config.num_aux_tokens if isinstance(config, MeanFlowConfig) else 0
    text = config.prompt_length + prefix
    picture = shape(1, c, height, width)
    return {
        "t5": shape(1, config.prompt_length, config.txt_input_size),
        "aux_tokens": shape(1, prefix, d) if prefix else "none: a base model",
        "txt_embed": shape(1, text, d),
        "preamble": f"{config.txt_preamble_depth} x {shape(1, text, d)}",
        "state": picture,
        "patch_embed": f"{shape(1, grid, p * p * c)} -> {shape(1, grid, config.pca_channels)} -> {shape(1, grid, d)}",
        "double": f"{config.depth_double} x img {shape(1, grid, d)}, txt {shape(1, text, d)}; attention over "
                  f"{text + grid} tokens",
        "final_layer": shape(1, grid, p * p * c),
        "x0": picture,
        "step": f"{picture}, {steps} steps",
    }


def stage_choices(config, width: int, height: int, steps: int) -> list[tuple[str, str]]:
    """The diagram's (label, key) pairs, in STAGES order: each stage's title and shape."""
    shapes = stage_shapes(config, width, height, steps)
    return [(f"{stage.title}: {shapes[stage.key]}", stage.key) for stage in STAGES]


def stage_links(key: str) -> str:
    """The line under a chosen stage: the concepts section and the served code page that explain it."""
    stage = STAGES[STAGE_KEYS.index(key)]
    path, name = stage.code
    code = code_link(path, name, served_code())
    return (f"{concept_link(stage.concept, f'concepts {stage.concept}')}"
            + (f" · [`{name}` in {path}]({code})" if code else ""))


def token_table(tokens: np.ndarray) -> np.ndarray:
    """float [T, D] -> uint8 [T * ROW_PIXELS, D, 3]: each value as a colour on one scale (blue
    negative, red positive, white 0; the largest magnitude full)."""
    scaled = tokens / max(float(np.abs(tokens).max()), np.finfo(np.float32).tiny)
    positive, negative = np.clip(scaled, 0, 1), np.clip(-scaled, 0, 1)
    rgb = np.stack([1 - negative, 1 - positive - negative, 1 - positive], axis=-1).clip(0, 1)
    return np.repeat(np.round(255 * rgb).astype(np.uint8), ROW_PIXELS, axis=0)


def patch_lengths(tokens: np.ndarray, grid_h: int, grid_w: int) -> np.ndarray:
    """float [N, D] image tokens -> uint8 [grid_h * PATCH_PIXELS, grid_w * PATCH_PIXELS, 3]: each
    patch's vector length, black 0 to white the longest."""
    lengths = np.linalg.norm(tokens, axis=-1).reshape(grid_h, grid_w)
    gray = np.round(255 * lengths / max(float(lengths.max()), np.finfo(np.float32).tiny)).astype(np.uint8)
    return np.repeat(np.repeat(np.stack([gray] * 3, axis=-1), PATCH_PIXELS, axis=0), PATCH_PIXELS, axis=1)


def stage_output(key: str, insides: Insides, run: FinishedRun, config, step: int, block: int) -> tuple:
    """(uint8 [H, W, 3] or None, caption) of stage `key` at the run's `step` and double `block`
    (both from 0): its output in the conditional forward of that step, as the page shows it."""
    request = run.request
    grid_h, grid_w = request.height // config.patch_size, request.width // config.patch_size
    stages = insides.stages
    if key == "t5":
        return token_table(run.context[0]), "each T5 token (a row) by feature, blue negative and red positive"
    if key == "aux_tokens" and "aux_tokens" not in stages:
        return None, "a base model has no prefix: guidance is two forwards, not an input (concepts 3)"
    if key in ("aux_tokens", "txt_embed"):
        return token_table(stages[key][0]), "each token (a row) by feature, blue negative and red positive"
    if key == "preamble":
        last = config.txt_preamble_depth - 1
        return token_table(stages[f"preamble.{last}" if last >= 0 else "txt_embed"][0]), (
            "the last preamble block's text tokens (rows) by feature")
    if key == "state":
        return to_pixels(run.states[step][None])[0], f"the state x_t step {step + 1} starts from"
    if key == "patch_embed":
        return patch_lengths(stages["patch_embed"][0], grid_h, grid_w), "each patch token's length (white: longest)"
    if key == "double":
        return patch_lengths(stages[f"double.{block}.img"][0], grid_h, grid_w), (
            f"double block {block + 1}'s image tokens: each patch's length (white: longest)")
    if key == "final_layer":
        out = unpatchify(stages["final_layer"], grid_h, grid_w, config.patch_size, config.in_channels)
        return to_pixels(out)[0], "the final layer's patches put back in place: the conditional x0"
    if key == "x0":
        return to_pixels(run.x0s[step][None])[0], "the guided x0 the step moves towards"
    return to_pixels(run.states[step + 1][None])[0], f"the state after step {step + 1}: x + f (x0 - x)"
