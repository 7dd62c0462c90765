"""Write-it-yourself exercises: the learner writes a function of the reference from a stub that
states its shapes, and `minit2i exercise NAME FILE` checks it (docs/exercises.md).

Each `Exercise` names the reference function the learner's must equal, what to compute (the
stub's docstring), and the inputs it is checked on: a few drawn arrays and the cases a first
attempt tends to miss (a step factor of 1, a floor that caps the last steps, scores large enough
to overflow a plain exponential). The sampler pieces also say where the sampler looks the
function up, so that the checker can draw a picture with the learner's function in its place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from minit2i.reference import layers, mean_flow_sampler, sampler


@dataclass(frozen=True)
class Exercise:
    """One function to write: `reference` is the function it must equal on every case of `cases`."""

    name: str
    title: str  # one line: what the function is
    signature: str  # the stub's parameters, as the reference's
    task: str  # the stub's docstring: what to compute, with the shapes
    reference: Callable
    cases: Callable[[np.random.Generator], list[dict]]  # the keyword arguments of each case
    concept: int  # the number of the concepts.md section that explains it
    # Sampler pieces: the module whose global the sampler calls, and the demo model to draw with.
    swapped_in: object = None
    draws_with: str = ""


def state(rng: np.random.Generator, shape=(2, 3, 8, 8), dtype=np.float64) -> np.ndarray:
    """A noisy state or a prediction: N(0, 1) numbers of `shape` in `dtype`."""
    return rng.standard_normal(shape).astype(dtype)


def euler_cases(rng):
    return [{"x": state(rng), "x0": state(rng), "factor": np.float64(f)} for f in (0.05, 0.5, 1.0)] + [
        {"x": state(rng, dtype=np.float32), "x0": state(rng, dtype=np.float32), "factor": np.float64(0.25)}]


def guidance_cases(rng):
    return [{"x0_cond": state(rng), "x0_uncond": state(rng), "cfg_scale": s} for s in (0.0, 1.0, 2.0, 7.5)] + [
        {"x0_cond": state(rng, dtype=np.float32), "x0_uncond": state(rng, dtype=np.float32), "cfg_scale": 3.0}]


def factor_cases(rng):
    return [{"steps": steps, "a_min": a_min} for steps, a_min in ((1, 0.001), (4, 0.001), (20, 0.001), (100, 0.05),
                                                                  (int(rng.integers(5, 50)), 0.3))]


def mean_flow_factor_cases(rng):
    return [{"steps": steps} for steps in (1, 2, 4, 25, int(rng.integers(30, 60)))]


def rms_cases(rng):
    return [{"x": rng.standard_normal(shape) * scale, "weight": rng.standard_normal(shape[-1]), "eps": eps}
            for shape, scale, eps in (((4, 16), 1.0, 1e-6), ((2, 5, 64), 3.0, 1e-6), ((3, 8), 1e-4, 1e-6))]


def rope_cases(rng):
    cases = []
    for b, h, length, head_dim in ((1, 1, 6, 8), (2, 3, 10, 16)):
        angles = rng.uniform(-10, 10, (length, head_dim // 2))
        cases.append({"x": rng.standard_normal((b, h, length, head_dim)), "cos": np.cos(angles), "sin": np.sin(angles)})
    angles = layers.image_rope_angles(4, 4, 16)  # the model's own table: rows then columns
    cases.append({"x": rng.standard_normal((1, 2, 16, 16)), "cos": np.cos(angles), "sin": np.sin(angles)})
    return cases


def attention_cases(rng):
    cases = []
    for b, h, lq, lk, dh, size in ((1, 1, 3, 5, 4, 1.0), (2, 4, 7, 12, 16, 1.0), (1, 2, 4, 9, 8, 40.0)):
        q, k, v = (rng.standard_normal((b, h, n, dh)) for n in (lq, lk, lk))
        cases.append({"q": q * size, "k": k * size, "v": v, "scale": dh ** -0.5})
    return cases


EXERCISES = {e.name: e for e in (
    Exercise(
        "euler_step", "the Euler step written with x0", "x, x0, factor",
        """x [B, C, H, W] and the clean-image prediction x0 [B, C, H, W], both of one dtype, and the
    step factor f (a float64 scalar) -> the next state [B, C, H, W] in x's dtype:

        x + f (x0 - x)

    (f = dt / max(1 - t, a_min): a move of a fraction f of the way from x to x0; the last step's f
    is 1 and lands on x0.) A float64 f times a float32 array is float64 in NumPy: keep x's dtype.""",
        sampler.euler_step, euler_cases, 2,
        swapped_in=sampler, draws_with="demo"),
    Exercise(
        "guided_x0", "classifier-free guidance of the prediction", "x0_cond, x0_uncond, cfg_scale",
        """The conditional and unconditional predictions x0_cond, x0_uncond [B, C, H, W] (one dtype) and
    the guidance scale s (a float) -> the guided prediction [B, C, H, W] in their dtype:

        x0_uncond + s (x0_cond - x0_uncond)

    (s = 0: the unconditional prediction; s = 1: the conditional one; s > 1 pushes further.)""",
        sampler.guided_x0, guidance_cases, 3, swapped_in=sampler, draws_with="demo"),
    Exercise(
        "step_factors", "the base sampler's step factors", "steps, a_min",
        """The number of steps N (an int) and the floor a_min (a float) -> float64 [N]: the factor of each
    Euler step on the uniform grid t_i = i / N (i = 0..N):

        f_i = (t_{i+1} - t_i) / max(1 - t_i, a_min)

    (Without the floor the last factor is exactly 1; compute in float64.)""",
        sampler.step_factors, factor_cases, 2,
        swapped_in=sampler, draws_with="demo"),
    Exercise(
        "mean_flow_step_factors", "the Mean Flow student's step: its average velocity over the step",
        "steps",
        """The number of steps N (an int) -> float64 [N]: the student's step factors. Its time runs from
    t = 1 (noise) down to 0 on the grid t_i = 1 - i / N; a step from t to r moves by the average
    velocity u = (z - x0) / clip(t, 0.05, 1) over the step's length t - r, which is the move
    z + f (x0 - z) with

        f_i = (t_i - t_{i+1}) / clip(t_i, 0.05, 1)

    (The last factor is 1: the last step lands on the prediction. Compute in float64.)""",
        mean_flow_sampler.mean_flow_step_factors, mean_flow_factor_cases,
        6, swapped_in=mean_flow_sampler, draws_with="demo-mf"),
    Exercise(
        "rms_norm", "RMSNorm", "x, weight, eps",
        """x [..., D], the learned scale weight [D] and eps (a float) -> [..., D]: each vector of the last
    axis divided by its root mean square, then scaled:

        x / sqrt(mean(x^2 over the last axis) + eps) * weight

    (No mean is subtracted and there is no bias: that is what sets it apart from LayerNorm.)""",
        layers.rms_norm, rms_cases, 4),
    Exercise(
        "apply_rope", "the RoPE rotation", "x, cos, sin",
        """x [B, H, L, Dh] (queries or keys), cos and sin [L, Dh/2] (of each position's angles) ->
    [B, H, L, Dh]: feature j is paired with feature j + Dh/2 (the "rotate half" layout), and each
    pair (a, b) is turned by its angle:

        (a cos - b sin,  b cos + a sin)""",
        layers.apply_rope, rope_cases, 5),
    Exercise(
        "attention", "one attention", "q, k, v, scale",
        """q [B, H, Lq, Dh], k and v [B, H, Lk, Dh] and the scale s (a float, 1/sqrt(Dh)) ->
    [B, H, Lq, Dh]: each query's softmax over all keys, weighting the values:

        softmax(s q k^T over the keys) v

    (Scores can be large: subtract each row's largest score before the exponential.)""",
        layers.attention, attention_cases, 4),
)}


def stub(exercise: Exercise) -> str:
    """The file a learner starts from: the function's signature and its task, not yet written."""
    return (f'"""Exercise {exercise.name}: {exercise.title} (docs/exercises.md).\n\n'
            f"Write the function below, then check it: minit2i exercise {exercise.name} THIS_FILE.py\n"
            '"""\n\nimport numpy as np\n\n\n'
            f"def {exercise.name}({exercise.signature}):\n"
            f'    """{exercise.task}\n    """\n'
            f'    raise NotImplementedError("write {exercise.name}")\n')
