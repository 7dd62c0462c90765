"""GPU-resident few-step sampler of the Mean Flow student (twin of reference/mean_flow_sampler.py).

As accelerated/sampler.py, but one forward of batch B per step (guidance is a network input, not
a second branch) followed by one `euler_step` kernel (launched by `kernels.student_euler`):
x <- x + f (x0 - x) on the fp32 state, and the next input written in the network dtype. Two scalars change from step to step, the factor f
(read by the kernel) and the step length h (read by the network's h embedder); both live in
device arrays written before each step, so the step captured at step 1 is replayed with the
values of the moment. omega and the guidance interval are written once. The factors, lengths
and times are reference.mean_flow_sampler's own.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from minit2i.reference.mean_flow_sampler import mean_flow_step_factors, mean_flow_time_grid, step_lengths
from minit2i.reference.sampler import StepInfo

from . import kernels
from .kernels import cp
from .sampler import run_steps


def sample_mean_flow_on_device(denoise: Callable, noise, context, mask, steps: int, omega: float,
                               interval: tuple[float, float], callback: Callable[[StepInfo], None] | None = None,
                               use_graph: bool = True):
    """Run the few-step sampler on the device: reference.mean_flow_sampler.sample_mean_flow's
    arguments, plus `use_graph`.

    denoise(x [B, C, H, W], h, omega, t_min, t_max (float32 [B] device arrays), context [B, L, Dc],
    mask [B, L]) -> x0 [B, C, H, W] (device); noise: host float32 [B, C, H, W]; context (network
    dtype) and mask [B, L] device arrays -> device float32 state [B, C, H, W]. A callback gets
    StepInfo(i, t_i, state, x0) whose arrays are device arrays the next step overwrites.
    """
    batch = noise.shape[0]
    state = cp.asarray(np.ascontiguousarray(noise, dtype=np.float32))
    next_input = state.astype(context.dtype)
    omega, t_min, t_max = (cp.full(batch, value, np.float32) for value in (omega, *interval))
    h, factor = cp.empty(batch, np.float32), cp.empty(1, np.float32)
    latest = {}  # the step's x0: once replays run, the captured step's own output buffer

    def step():
        latest["x0"] = denoise(next_input, h, omega, t_min, t_max, context, mask)
        kernels.student_euler(state, next_input, latest["x0"], factor)

    def write_scalars(length_and_factor):
        length, f = length_and_factor
        h.fill(np.float32(length))
        factor.fill(np.float32(f))

    times = mean_flow_time_grid(steps)
    after_step = (lambda i: callback(StepInfo(i, float(times[i]), state, latest["x0"]))) if callback else None
    run_steps(step, zip(step_lengths(steps), mean_flow_step_factors(steps)), write_scalars, use_graph, after_step)
    return state
