r"""x0 -> velocity Euler sampler with classifier-free guidance (model.md 4): the straight path of
concepts.md 1, the velocity from x0 of concepts.md 2 and the guidance of concepts.md 3.

t runs from 0 (noise) to 1 (data) on a uniform grid. At every step the network predicts x0 for
the conditional and the unconditional branch in ONE batched forward ([cond ; uncond], the
uncond half with an all-zero mask), guidance mixes the two, and

$$v = \frac{x_0^{\mathrm{cfg}} - x}{\max(1 - t,\ a_{\min})}, \qquad x \leftarrow x + (t_{\mathrm{next}} - t)\,v$$

$$x_0^{\mathrm{cfg}} = x_0^{u} + s\,(x_0^{c} - x_0^{u})$$

Because cond and uncond share x and the denominator, guidance on x0 equals guidance on v.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

# The official Hugging Face pipeline (`custom_pipeline="MiniT2I/MiniT2I"`) uses 0.001; the JAX
# B/16 eval config and the GitHub torch port use 0.05 (model.md 4.4). For steps <= 100, 0.001 is the
# same as no floor: the last step lands on the guided x0.
DEFAULT_A_MIN = 0.001
NOISE_SCALE = 2.0


def initial_noise(seed: int, batch: int, channels: int, height: int, width: int) -> np.ndarray:
    """The starting noise, the state at t = 0 (not x0, the clean image): 2 * N(0, I) from
    numpy.random.default_rng(seed) -> float32 [B, C, H, W].

    Both backends start from this host array, so a seed means the same image everywhere.
    """
    return noise_from(np.random.default_rng(seed), batch, channels, height, width)


def noise_from(rng: np.random.Generator, batch: int, channels: int, height: int, width: int) -> np.ndarray:
    """The starting noise 2 * N(0, I) drawn from `rng` -> float32 [B, C, H, W] (`rng` moves on)."""
    return NOISE_SCALE * rng.standard_normal((batch, channels, height, width), dtype=np.float32)


def time_grid(steps: int) -> np.ndarray:
    """Uniform t grid [steps + 1] from 0 to 1 (float64, like linspace(0, 1, N + 1))."""
    return np.linspace(0.0, 1.0, steps + 1)


def step_factors(steps: int, a_min: float) -> np.ndarray:
    """[steps] scalars dt_i / max(1 - t_i, a_min): the Euler step is x + f_i * (x0_cfg - x).

    Computed in float64 so that, when a_min <= 1/steps, the last factor is exactly 1.0 and the
    final state is the guided x0 up to one rounding of x + (x0 - x) (model.md 7.1 item 13).
    """
    t = time_grid(steps)
    return (t[1:] - t[:-1]) / np.maximum(1.0 - t[:-1], a_min)


def euler_step(x, x0, factor: float):
    """[B, ...] x2 -> [B, ...]: x + f * (x0 - x), the Euler step of an x0-predicting network
    written with its step factor f (1 lands on x0 exactly up to one rounding)."""
    return x + x.dtype.type(factor) * (x0 - x)


def guided_x0(x0_cond, x0_uncond, cfg_scale: float):
    """[B, ...] x2 -> [B, ...]: x0_uncond + s * (x0_cond - x0_uncond)."""
    return x0_uncond + x0_uncond.dtype.type(cfg_scale) * (x0_cond - x0_uncond)


@dataclass
class StepInfo:
    """What a per-step callback sees: step index, its t, the state after the step and the guided x0."""

    index: int
    t: float
    x: np.ndarray
    x0: np.ndarray


def sample(denoise: Callable, noise, context, mask, steps: int, cfg_scale: float,
           a_min: float = DEFAULT_A_MIN, callback: Callable[[StepInfo], None] | None = None):
    """Run the Euler sampler.

    denoise(x [2B, C, H, W], context [2B, L, Dc], mask [2B, L]) -> x0 [2B, C, H, W];
    noise [B, C, H, W], context [B, L, Dc], mask [B, L] -> image x [B, C, H, W] (range ~[-1, 1]).
    """
    batch = noise.shape[0]
    # The unconditional branch is the same prompt with every token masked out: MMJiT was trained
    # with captions dropped that way, so "no prompt" needs no second encoding (concepts.md 3).
    both_context = np.concatenate([context, context])
    both_mask = np.concatenate([mask, np.zeros_like(mask)])
    x = noise
    t = time_grid(steps)
    for i, factor in enumerate(step_factors(steps, a_min)):
        # One forward of batch 2B, not two of B: both branches see the same state x.
        x0 = denoise(np.concatenate([x, x]), both_context, both_mask)
        # Guiding x0 is guiding the velocity: both branches share x and the denominator.
        x0 = guided_x0(x0[:batch], x0[batch:], cfg_scale)
        # A step of f of the way to the guess; the last f is 1, so the image is a clean guess.
        x = euler_step(x, x0, factor)
        if callback:
            callback(StepInfo(i, float(t[i]), x, x0))
    return x
