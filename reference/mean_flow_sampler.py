"""The Mean Flow student's few-step sampler (model.md 9.4; concepts.md 6, its time convention
concepts.md 7).

Time runs the other way from `sampler.py`: from t = 1 (noise) to t = 0 (data), on a uniform grid.
Each step is ONE forward of batch B (guidance is an input of the network, not a second branch):

    x_pred = net(z, h = t - r, omega, t_min, t_max, prompt)
    u      = (z - x_pred) / clip(t, 0.05, 1)
    z     <- z - (t - r) * u        =  z + f * (x_pred - z),   f = (t - r) / clip(t, 0.05, 1)

so it is `sampler.euler_step` with other factors; on the last step f = t / t = 1 and the image is
x_pred. The noise is the base sampler's, 2 * N(0, I), from the same seed.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .sampler import StepInfo, euler_step

# u = (z - x_pred) / t is clipped at t = 0.05, as the official sampler does; with at most 20
# steps no grid point lies below it (the last one used is 1/steps), so it changes nothing there.
MIN_TIME = 0.05


def mean_flow_time_grid(steps: int) -> np.ndarray:
    """[steps + 1] float64 times from 1 (noise) down to 0 (data), like linspace(1, 0, N + 1)."""
    return np.linspace(1.0, 0.0, steps + 1)


def mean_flow_step_factors(steps: int) -> np.ndarray:
    r"""[steps] float64 factors; the last is exactly 1.

    $$f_i = \frac{t_i - t_{i+1}}{\mathrm{clip}(t_i, 0.05, 1)}$$
    """
    t = mean_flow_time_grid(steps)
    return (t[:-1] - t[1:]) / np.clip(t[:-1], MIN_TIME, 1.0)


def step_lengths(steps: int) -> np.ndarray:
    """[steps] float64 h_i = t_i - t_{i+1}, the network's time input at each step."""
    t = mean_flow_time_grid(steps)
    return t[:-1] - t[1:]


def sample_mean_flow(denoise: Callable, noise, context, mask, steps: int, omega: float,
                     interval: tuple[float, float], callback: Callable[[StepInfo], None] | None = None):
    """Run the few-step sampler.

    denoise(x [B, C, H, W], h, omega, t_min, t_max (each [B]), context [B, L, Dc], mask [B, L])
    -> x0 [B, C, H, W]; noise [B, C, H, W] -> image [B, C, H, W] (range ~[-1, 1]). The callback's
    StepInfo carries this sampler's t (noise time, 1 at the start) and the predicted x0.
    """
    batch = noise.shape[0]
    t_min, t_max = interval

    def per_sample(value):
        return np.full(batch, value, dtype=np.float64)

    x = noise
    times = mean_flow_time_grid(steps)
    for i, (h, factor) in enumerate(zip(step_lengths(steps), mean_flow_step_factors(steps))):
        x0 = denoise(x, per_sample(h), per_sample(omega), per_sample(t_min), per_sample(t_max), context, mask)
        x = euler_step(x, x0, factor)
        if callback:
            callback(StepInfo(i, float(times[i]), x, x0))
    return x
