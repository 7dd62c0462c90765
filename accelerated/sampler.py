"""GPU-resident Euler x0 -> v sampler with CFG (twin of reference/sampler.py).

The state never leaves the device: noise is uploaded once, cond and uncond run as one batched
[2B] forward, and one fused kernel (kernels/sampler.cu) does guidance, the Euler update and
writes the next [x ; x] input. The per-step scalars come from reference.sampler.step_factors.
The caller copies the final state to the host; that is the only device-to-host transfer.

CUDA graph replay (`use_graph=True`, the default): a runner's first call of a shape of work runs
step 0 eagerly (it compiles the kernels, builds the cached tables and creates the cuBLAS handles
and workspaces of accelerated/cublas.py, so the capture allocates none of them), captures step 1
on a private memory pool that stays alive with the graph, and replays it for every later step
after writing the step's factor into the captured device scalar. If the capture fails, one
warning line says why and the sampler goes on eagerly (see docs/kernels.md).

A runner keeps its captured steps (`StepGraphs`), one per shape of the work, each with the device
buffers it reads and writes: the next call of that shape (a second `sample`, or a batch run's
next group of images) copies its noise and prompts into those buffers and replays the same
graph for every step, step 0 included: it captures nothing and runs no eager step. That changes
no bit of the image. A replay runs the kernels the eager step launches, in the same order, with
the same launch parameters, on buffers holding the same values: the graph is a recording of
the step, taken after step 0 had built everything the step reads (tables, handles), and it
holds the addresses of the work's buffers and of the weights, which the runner keeps. Its GEMMs
are the same cuBLAS calls on the same handles, workspaces and shapes, so cuBLAS's heuristic picks
the same algorithms for them (what it sees, the shape, the types, the device and the workspace
size, is equal). On cudasim a replay re-runs the recorded operations, so the bits are equal by
construction; `test_a_second_call_captures_nothing_and_draws_a_fresh_runners_pixels` shows it.

What a step's graph depends on is the work's key: the noise and prompt shapes, the network dtype
and the guidance scale (a kernel parameter of cfg_euler). The step count and a_min are not in
it: the factors are written into a device scalar before each replay. A kept graph belongs to
its runner (a new runner, new weights, starts with no graph) and is dropped when the twin's
device caches are cleared, whose tables it reads.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Callable, Iterable

import numpy as np

from minit2i.reference.sampler import StepInfo, step_factors, time_grid

from . import kernels
from .kernels import cp

log = logging.getLogger("minit2i.accelerated")  # the CLI prints these notes as one stderr line each


# A runner's captured steps: a batch run's group shape and its last, smaller group. Each holds its
# buffers and one forward's temporaries: about 60 MiB for B/16 at 512 px in bf16, one image
# (docs/kernels.md, "The kept graph").
GRAPHS_KEPT = 2


def sample_on_device(embed_prompt: Callable, denoise: Callable, noise, context, mask, steps: int, cfg_scale: float,
                     a_min: float, callback: Callable[[StepInfo], None] | None = None, use_graph: bool = True,
                     graphs: StepGraphs | None = None):
    """Run the sampler on the device: reference.sampler.sample's arguments, its denoise split in
    two, plus `use_graph` and `graphs`, the caller's captured steps (None: captured for this call
    only).

    embed_prompt(context [2B, L, Dc], mask [2B, L]) -> P, the forward's part that depends on the
    prompt only (a device array: MMJiT's text stream [2B, L, D]), run once per call;
    denoise(x [2B, C, H, W], P) -> x0 [2B, C, H, W] (device), the rest, run every step (P left
    unchanged). noise: host float32 [B, C, H, W]; context [B, L, Dc] (network dtype) and mask
    [B, L] device arrays -> device float32 state [B, C, H, W], a buffer of `graphs` that its next
    call of this shape overwrites (copy it to keep it). A callback gets StepInfo whose x and x0 are
    device arrays that the next step overwrites (copy them to keep them).
    """
    key = ("guided", noise.shape, context.shape, str(context.dtype), float(cfg_scale))
    work = (graphs or StepGraphs(1)).get(key, lambda: GuidedStep(embed_prompt, denoise, noise.shape, context.dtype,
                                                                 cfg_scale))
    work.load(noise, context, mask)
    t = time_grid(steps)
    after_step = (lambda i: callback(StepInfo(i, float(t[i]), work.state, work.x0_guided))) if callback else None
    run_steps(work, step_factors(steps, a_min), lambda f: work.factor.fill(np.float32(f)), use_graph, after_step)
    return work.state


class StepGraphs:
    """Captured sampler steps by the shape of their work, the `capacity` used last kept (a bounded
    share of device memory: each holds its buffers and the temporaries of one forward). Cleared
    with the twin's device caches (`kernels.clear_device_caches`), whose tables the graphs read."""

    def __init__(self, capacity: int = GRAPHS_KEPT):
        self.capacity = capacity
        self.entries: OrderedDict = OrderedDict()
        kernels.register_graph_cache(self)

    def get(self, key, build: Callable):
        """The work of `key`, made by `build()` if it is not kept (dropping the least recently used)."""
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        work = self.entries[key] = build()
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)
        return work

    def cache_clear(self) -> None:
        self.entries.clear()


class DeviceStep:
    """One sampler step's device buffers, `step()` on them, and its captured graph once captured
    (`graph`); `outputs` holds what the step hands the callback that is not a buffer of its own
    (the student's x0: at capture, an array of the graph's pool, which every replay rewrites)."""

    graph: CapturedStep | None = None

    def __init__(self):
        self.outputs: dict = {}
        self.graph_outputs: dict = {}

    def step(self) -> None:
        raise NotImplementedError


class GuidedStep(DeviceStep):
    """The guided Euler step of `sample_on_device` on buffers for noise of `shape` [B, C, H, W] in
    the network `dtype`: [x ; x] and the embedded [cond ; uncond] prompt into one [2B] forward,
    then `cfg_euler`."""

    def __init__(self, embed_prompt: Callable, denoise: Callable, shape: tuple, dtype, cfg_scale: float):
        super().__init__()
        self.embed_prompt, self.denoise, self.cfg_scale = embed_prompt, denoise, cfg_scale
        self.state = cp.empty(shape, dtype=np.float32)
        self.next_input = cp.empty((2 * shape[0], *shape[1:]), dtype=dtype)
        self.prompt = None  # embed_prompt's output for [cond ; uncond], made by the first `load`
        self.x0_guided = cp.empty(shape, dtype=np.float32)
        self.factor = cp.empty(1, dtype=np.float32)

    def load(self, noise, context, mask) -> None:
        """A call's host noise into the buffers, and its device prompts embedded once for the
        whole call: the conditional half with `mask`, the unconditional one all masked."""
        batch = noise.shape[0]
        self.state[...] = cp.asarray(np.ascontiguousarray(noise, dtype=np.float32))
        self.next_input[:batch] = self.state.astype(self.next_input.dtype)
        self.next_input[batch:] = self.next_input[:batch]
        both_context = cp.concatenate([context, context])
        both_mask = cp.concatenate([mask, cp.zeros_like(mask)])
        prompt = self.embed_prompt(both_context, both_mask)
        if self.prompt is None:
            self.prompt = prompt  # the buffer a captured step reads: later calls write into it
        else:
            self.prompt[...] = prompt

    def step(self) -> None:
        x0_both = self.denoise(self.next_input, self.prompt)
        kernels.cfg_euler(self.state, self.next_input, x0_both, self.x0_guided, self.cfg_scale, self.factor)


def run_steps(work: DeviceStep, per_step: Iterable, write_scalars: Callable, use_graph: bool,
              after_step: Callable[[int], None] | None = None) -> None:
    """Run `work.step` once per item of `per_step`, after `write_scalars(item)` has put that step's
    scalars into the device memory the step reads (the loop of `sample_on_device` and of the
    student's `sample_mean_flow_on_device`).

    With `use_graph`, every step replays `work.graph` once it exists; a work without one runs
    step 0 eagerly and captures step 1 (`try_capture`). The scalars written before a replay are
    what it reads, since the graph holds their addresses, not their values. `per_step` is
    iterated lazily, one item per step. `after_step(i)` runs once step i has finished on the
    device.
    """
    own_stream = use_graph  # capture needs a stream of its own (still used if capture fails)
    stream = capture_stream() if own_stream else cp.cuda.get_current_stream()
    with stream:
        for i, item in enumerate(per_step):
            write_scalars(item)
            if use_graph and work.graph is None and i > 0:
                work.graph = try_capture(work.step, stream)
                work.graph_outputs = dict(work.outputs)
                use_graph = work.graph is not None
            if use_graph and work.graph is not None:
                work.graph.launch(stream)
                work.outputs.update(work.graph_outputs)
            else:
                work.step()
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
    """Record one call of `step` (already run once eagerly) as a CUDA graph on `stream`, made the
    current stream for it: work issued to another stream would run at once, outside the graph."""
    pool = cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        try:
            step()
        finally:
            graph = stream.end_capture()
    graph.upload(stream)
    return CapturedStep(graph, pool)
