"""GPU-resident Euler x0 -> v sampler with CFG (twin of reference/sampler.py).

The state never leaves the device: noise is uploaded once, cond and uncond run as one batched
[2B] forward, and one fused kernel (kernels/sampler.cu) does guidance, the Euler update and
writes the next [x ; x] input. The per-step scalars come from reference.sampler.step_factors.
The caller copies the final state to the host; that is the only device-to-host transfer.

CUDA graph replay (`use_graph=True`, the default): step 0 runs eagerly (it compiles the
kernels, builds the cached tables and creates the cuBLAS handle and workspace of
accelerated/cublas.py, so the capture allocates neither), step 1 is captured on a
private memory pool that stays alive with the graph, and it and every later step replay it after
writing their factor into the captured device scalar. If the capture fails, one warning line
says why and the sampler goes on eagerly (see docs/kernels.md).
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

import numpy as np

from minit2i.reference.sampler import StepInfo, step_factors, time_grid

from . import kernels
from .kernels import cp

log = logging.getLogger("minit2i.accelerated")  # the CLI prints these notes as one stderr line each


def sample_on_device(denoise: Callable, noise, context, mask, steps: int, cfg_scale: float, a_min: float,
                     callback: Callable[[StepInfo], None] | None = None, use_graph: bool = True):
    """Run the sampler on the device: reference.sampler.sample's arguments, plus `use_graph`.

    denoise(x [2B, C, H, W], context [2B, L, Dc], mask [2B, L]) -> x0 [2B, C, H, W] (device);
    noise: host float32 [B, C, H, W]; context [B, L, Dc] (network dtype) and mask [B, L]
    device arrays -> device float32 state [B, C, H, W]. A callback gets StepInfo whose x and
    x0 are device arrays that the next step overwrites (copy them to keep them).
    """
    dtype = context.dtype
    both_context = cp.concatenate([context, context])
    both_mask = cp.concatenate([mask, cp.zeros_like(mask)])
    state = cp.asarray(np.ascontiguousarray(noise, dtype=np.float32))
    next_input = cp.concatenate([state, state]).astype(dtype)
    x0_guided = cp.empty_like(state)
    factor = cp.empty(1, dtype=np.float32)

    def step():
        x0_both = denoise(next_input, both_context, both_mask)
        kernels.cfg_euler(state, next_input, x0_both, x0_guided, cfg_scale, factor)

    t = time_grid(steps)
    after_step = (lambda i: callback(StepInfo(i, float(t[i]), state, x0_guided))) if callback else None
    run_steps(step, step_factors(steps, a_min), lambda f: factor.fill(np.float32(f)), use_graph, after_step)
    return state


def run_steps(step: Callable[[], None], per_step: Iterable, write_scalars: Callable, use_graph: bool,
              after_step: Callable[[int], None] | None = None) -> None:
    """Run `step` once per item of `per_step`, after `write_scalars(item)` has put that step's
    scalars into the device memory the step reads (the loop of `sample_on_device` and of the
    student's `sample_mean_flow_on_device`).

    With `use_graph`, step 0 runs eagerly and step 1 is captured (`try_capture`) and replayed for
    every later step; the scalars written before a replay are what it reads, since the graph holds
    their addresses, not their values. `per_step` is iterated lazily, one item per step.
    `after_step(i)` runs once step i has finished on the device.
    """
    graph = None
    own_stream = use_graph  # capture needs a stream of its own (still used if capture fails)
    stream = capture_stream() if own_stream else cp.cuda.get_current_stream()
    with stream:
        for i, item in enumerate(per_step):
            write_scalars(item)
            if use_graph and graph is None and i > 0:
                graph = try_capture(step, stream)
                use_graph = graph is not None
            if graph is not None:
                graph.launch(stream)
            else:
                step()
            if after_step:
                # Wait for the step so per-step timings measure GPU work, not kernel launches.
                stream.synchronize()
                after_step(i)
    if own_stream:
        stream.synchronize()  # the caller reads the state on the default stream


class CapturedStep:
    """A captured CUDA graph plus the private memory pool its temporaries live in.

    Replays write to the addresses seen at capture (cupy #9655), so the temporaries must never
    be handed to anyone else: they come from a pool that nothing allocates from afterwards.
    """

    def __init__(self, graph, pool):
        self.graph, self.pool = graph, pool

    def launch(self, stream):
        self.graph.launch(stream=stream)


def capture_stream():
    """A stream that graphs can be captured on, ordered after all work already queued.

    Capture is refused on the legacy default stream, and a non-blocking stream does not wait for
    it, so the uploads queued there must finish first.
    """
    cp.cuda.Device().synchronize()
    return cp.cuda.Stream(non_blocking=True)


def try_capture(step: Callable[[], None], stream) -> CapturedStep | None:
    """capture(step, stream), or None after a one-line warning when capture fails (the caller
    then runs the step eagerly: nothing of a failed capture has run)."""
    try:
        return capture(step, stream)
    except RuntimeError as err:  # CuPy's CUDARuntimeError is one
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        log.warning("CUDA graph capture failed (%s); running the sampler steps eagerly", reason)
        return None


def capture(step: Callable[[], None], stream) -> CapturedStep:
    """Record one call of `step` (already run once eagerly) as a CUDA graph on `stream`."""
    pool = cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        try:
            step()
        finally:
            graph = stream.end_capture()
    graph.upload(stream)
    return CapturedStep(graph, pool)
