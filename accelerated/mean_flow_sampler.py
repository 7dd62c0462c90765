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
from .sampler import DeviceStep, StepGraphs, run_steps


def sample_mean_flow_on_device(denoise: Callable, noise, context, mask, steps: int, omega: float,
                               interval: tuple[float, float], callback: Callable[[StepInfo], None] | None = None,
                               use_graph: bool = True, graphs: StepGraphs | None = None):
    """Run the few-step sampler on the device: reference.mean_flow_sampler.sample_mean_flow's
    arguments, plus `use_graph` and `graphs` (as for `sample_on_device`).

    denoise(x [B, C, H, W], h, omega, t_min, t_max (float32 [B] device arrays), context [B, L, Dc],
    mask [B, L]) -> x0 [B, C, H, W] (device); noise: host float32 [B, C, H, W]; context (network
    dtype) and mask [B, L] device arrays -> device float32 state [B, C, H, W], a buffer of `graphs`
    that its next call of this shape overwrites. A callback gets StepInfo(i, t_i, state, x0) whose
    arrays are device arrays the next step overwrites.
    """
    key = ("student", noise.shape, context.shape, str(context.dtype), float(omega), tuple(map(float, interval)))
    work = (graphs or StepGraphs(1)).get(key, lambda: StudentStep(denoise, noise.shape, context, omega, interval))
    work.load(noise, context, mask)

    def write_scalars(length_and_factor):
        length, f = length_and_factor
        work.h.fill(np.float32(length))
        work.factor.fill(np.float32(f))

    times = mean_flow_time_grid(steps)

    def after_step(i):
        callback(StepInfo(i, float(times[i]), work.state, work.outputs["x0"]))

    run_steps(work, zip(step_lengths(steps), mean_flow_step_factors(steps)), write_scalars, use_graph,
              after_step if callback else None)
    return work.state


class StudentStep(DeviceStep):
    """The student's step on buffers for noise of `shape` [B, C, H, W] and prompts like `context`
    [B, L, Dc]: one forward, then `student_euler`. omega and the interval are buffers too (the
    network reads them as [B] arrays), written once: they are part of the work's key."""

    def __init__(self, denoise: Callable, shape: tuple, context, omega: float, interval: tuple[float, float]):
        super().__init__()
        self.denoise = denoise
        batch, length = shape[0], context.shape[1]
        self.state = cp.empty(shape, dtype=np.float32)
        self.next_input = cp.empty(shape, dtype=context.dtype)
        self.context = cp.empty(context.shape, dtype=context.dtype)
        self.mask = cp.empty((batch, length), dtype=np.float32)
        self.omega, self.t_min, self.t_max, self.h = (cp.empty(batch, np.float32) for _ in range(4))
        self.factor = cp.empty(1, np.float32)
        for buffer, value in zip((self.omega, self.t_min, self.t_max), (omega, *interval)):
            buffer.fill(np.float32(value))

    def load(self, noise, context, mask) -> None:
        """A call's host noise and device prompts into the buffers."""
        self.state[...] = cp.asarray(np.ascontiguousarray(noise, dtype=np.float32))
        self.next_input[...] = self.state.astype(self.next_input.dtype)
        self.context[...] = context
        self.mask[...] = mask

    def step(self) -> None:
        self.outputs["x0"] = self.denoise(self.next_input, self.h, self.omega, self.t_min, self.t_max, self.context,
                                          self.mask)
        kernels.student_euler(self.state, self.next_input, self.outputs["x0"], self.factor)
