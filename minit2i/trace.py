"""Divergence tracer (`minit2i trace`): where do two backends or precisions part ways?

Both sides run the same prompt through the T5 encoder and one MMJiT forward on the seed's noise
at t = 0 (the batch the sampler sends: [cond ; uncond]); for a Mean Flow student, its first
sampler step with its recipe (one row; h, omega and the guidance interval as `generate` would
pass them, plus the "aux_tokens" stage). Every stage output is caught through
the `on_layer(name, value)` hooks of `t5_encode` and `mmjit_forward`, which the NumPy reference
and the CuPy twin share ("t5.block.{i}", "patch_embed", "txt_embed", "preamble.{i}",
"double.{i}.img", "double.{i}.txt", "final_layer"), and compared layer by layer.

Both MMJiT runs get side A's T5 output as context, so each network's error is its own and the
first divergent layer points at the stage that introduced the difference, not one that
inherited it. A layer diverges when max|b - a| > atol + rtol * max|a| (scale-relative: one
elementwise relative error near a zero would say nothing about the layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from minit2i.core.checks import Range
from minit2i.core.errors import MiniT2IError
from minit2i.core.threads import blas_threads, check_threads
from minit2i.reference.mean_flow_sampler import step_lengths
from minit2i.reference.sampler import initial_noise

from .arguments import add_model_arguments, add_threads_argument, checked_request
from .console import emit
from .pipeline import BACKENDS, Model, is_student, make_runner, run_threads, sampling_defaults

# Default tolerance (rtol, atol) by the less precise side. fp32: float32 rounding reaches ~1e-6
# of a layer's scale on the tiny and demo models (measured against fp64), so 1e-5 leaves a
# margin of 10. fp16 and bf16 keep 11 and 8 mantissa bits (one rounding: 5e-4, 4e-3) and a block
# chains a dozen roundings: the per-stage bounds of the GPU parity tests, 3e-2 and 8e-2.
TOLERANCES = {"fp64": (1e-12, 1e-12), "fp32": (1e-5, 1e-6), "fp16": (3e-2, 1e-6), "bf16": (8e-2, 1e-6)}
PRECISION_ORDER = ("bf16", "fp16", "fp32", "fp64")
TOLERANCE_RANGE = Range(0, 10**6, integer=False)


@dataclass(frozen=True)
class Side:
    """One side of a comparison, written `backend:precision` (e.g. numpy:fp64, cupy:bf16)."""

    backend: str
    precision: str

    @classmethod
    def parse(cls, text: str) -> "Side":
        backend, _, precision = text.partition(":")
        if backend not in BACKENDS or precision not in TOLERANCES:
            raise MiniT2IError(
                f"cannot read side {text!r}: write backend:precision with backend one of "
                f"{', '.join(BACKENDS)} and precision one of {', '.join(TOLERANCES)} (e.g. numpy:fp64)"
            )
        return cls(backend, precision)

    def __str__(self) -> str:
        return f"{self.backend}:{self.precision}"


@dataclass
class Adapter:
    """A backend seen through host arrays: both networks with their layer hooks.

    encode(ids [B, L], mask [B, L], on_layer) -> context [B, L, d_model];
    denoise(x [B, C, H, W], context [B, L, Dc], mask [B, L], on_layer) -> x0 [B, C, H, W];
    to_host(value) -> float64 NumPy copy of any array the backend hands out.
    """

    encode: Callable
    denoise: Callable
    to_host: Callable


def numpy_adapter(runner, student: dict | None) -> Adapter:
    """The reference functions, in the runner's dtype (fp32 or fp64)."""
    from minit2i.reference.mean_flow import mean_flow_forward
    from minit2i.reference.mmjit import mmjit_forward
    from minit2i.reference.t5 import t5_encode

    dtype = runner.dtype

    def denoise(x, context, mask, on_layer):
        x, context, mask = x.astype(dtype), context.astype(dtype), mask.astype(dtype)
        if student is None:
            return mmjit_forward(runner.mmjit_params, runner.mmjit_config, x, context, mask, on_layer)
        scalars = [np.full(len(x), student[name]) for name in STUDENT_INPUTS]
        return mean_flow_forward(runner.mmjit_params, runner.mmjit_config, x, *scalars, context, mask, on_layer)

    return Adapter(
        encode=lambda ids, mask, on_layer: t5_encode(runner.t5_params, runner.t5_config, ids, mask.astype(dtype),
                                                     on_layer),
        denoise=denoise,
        to_host=lambda value: np.array(value, dtype=np.float64),
    )


def cupy_adapter(runner, student: dict | None) -> Adapter:
    """The CuPy twin: T5 in fp32, MMJiT in the runner's dtype; arrays go up, layers come down."""
    from minit2i.accelerated.t5 import t5_encode

    cp = runner.cp

    def on_device(array):
        return cp.ascontiguousarray(cp.asarray(array).astype(runner.dtype))

    def denoise(x, context, mask, on_layer):
        x, context, mask = on_device(x), on_device(context), on_device(mask)
        if student is None:
            return runner.denoise(x, context, mask, on_layer)
        scalars = [cp.asarray(np.full(len(x), student[name], dtype=np.float32)) for name in STUDENT_INPUTS]
        return runner.denoise_student(x, *scalars, context, mask, on_layer)

    return Adapter(
        encode=lambda ids, mask, on_layer: t5_encode(runner.t5_params, runner.t5_config, ids, mask, on_layer),
        denoise=denoise,
        to_host=lambda value: runner.to_host(value).astype(np.float64),
    )


ADAPTERS = {"numpy": numpy_adapter, "cupy": cupy_adapter, "cudasim": cupy_adapter}


STUDENT_INPUTS = ("h", "omega", "t_min", "t_max")


def make_adapter(model: Model, side: Side) -> Adapter:
    """Build the side's runner (the cupy one raises the no-GPU MiniT2IError) and wrap it."""
    return ADAPTERS[side.backend](make_runner(model, side.backend, side.precision), first_student_step(model))


def first_student_step(model: Model) -> dict | None:
    """A Mean Flow student's inputs at its sampler's first step under its recipe (None for MMJiT)."""
    if not is_student(model):
        return None
    settings = sampling_defaults(model)
    t_min, t_max = settings["guidance_interval"]
    return {"h": float(step_lengths(settings["steps"])[0]), "omega": settings["cfg_scale"],
            "t_min": t_min, "t_max": t_max}


@dataclass(frozen=True)
class LayerDiff:
    """How far side B is from side A at one hooked stage."""

    name: str
    shape: tuple[int, ...]
    scale: float  # max |a|
    max_abs: float  # max |b - a|
    max_rel: float  # max |b - a| / max |a|
    within: bool


def default_tolerance(a: Side, b: Side) -> tuple[float, float]:
    """(rtol, atol) of the less precise of the two sides."""
    return TOLERANCES[min(a.precision, b.precision, key=PRECISION_ORDER.index)]


def run_side(adapter: Adapter, ids, mask, x, x_mask, context=None) -> dict[str, np.ndarray]:
    """Both networks on one side -> every hooked layer as float64, in call order.

    ids, mask [1, L]; x [B, C, H, W] with x_mask [B, L]; the MMJiT gets `context` [1, L, Dc]
    (default: this side's own T5 output) for every row. The T5 output is recorded as
    "t5.output": its final RMSNorm has no hook of its own.
    """
    layers: dict[str, np.ndarray] = {}

    def on_layer(name, value):
        layers[name] = adapter.to_host(value)

    layers["t5.output"] = adapter.to_host(adapter.encode(ids, mask, on_layer))
    context = layers["t5.output"] if context is None else context
    adapter.denoise(x, np.repeat(context, x.shape[0], axis=0), x_mask, on_layer)
    return layers


def trace(model: Model, a: Side, b: Side, prompt: str, seed: int, width: int, height: int,
          tolerance: tuple[float, float] | None = None) -> list[LayerDiff]:
    """Run both sides on one prompt and seed; one LayerDiff per hooked stage, in call order."""
    rtol, atol = tolerance or default_tolerance(a, b)
    ids, mask = model.tokenizer([prompt])
    noise = initial_noise(seed, 1, model.mmjit.config.in_channels, height, width)
    if is_student(model):  # one row: guidance is an input of the network
        x, x_mask = noise, mask
    else:
        x = np.concatenate([noise, noise])
        x_mask = np.concatenate([mask, np.zeros_like(mask)])  # [cond ; uncond], as the sampler batches it
    layers_a = run_side(make_adapter(model, a), ids, mask, x, x_mask)
    layers_b = run_side(make_adapter(model, b), ids, mask, x, x_mask, context=layers_a["t5.output"])
    missing = [name for name in layers_a if name not in layers_b]
    if missing:
        raise MiniT2IError(f"side {b} reports no layer {', '.join(missing)}; its on_layer hooks do not match side {a}")
    diffs = []
    for name, value_a in layers_a.items():
        error = float(np.max(np.abs(layers_b[name] - value_a)))
        scale = float(np.max(np.abs(value_a)))
        diffs.append(LayerDiff(name, value_a.shape, scale, error, error / scale if scale else float(error > 0),
                               error <= atol + rtol * scale))
    return diffs


def first_divergence(diffs: list[LayerDiff]) -> LayerDiff | None:
    """The earliest layer beyond tolerance, or None."""
    return next((d for d in diffs if not d.within), None)


def format_report(diffs: list[LayerDiff], a: Side, b: Side, tolerance: tuple[float, float]) -> str:
    """The per-layer table and the verdict line."""
    rtol, atol = tolerance
    name_width = max(len(d.name) for d in diffs)
    lines = [f"a = {a}, b = {b}; a layer diverges when max|b-a| > {atol:g} + {rtol:g} * max|a|",
             f"{'layer':<{name_width}}  {'shape':<18} {'max|a|':>9} {'max|b-a|':>9} {'rel':>9}"]
    for d in diffs:
        shape = "x".join(str(n) for n in d.shape)
        flag = "" if d.within else "  <- diverges"
        lines.append(f"{d.name:<{name_width}}  {shape:<18} {d.scale:9.3g} {d.max_abs:9.2e} {d.max_rel:9.2e}{flag}")
    first = first_divergence(diffs)
    if first is None:
        lines.append(f"no divergence: all {len(diffs)} layers within tolerance")
    else:
        lines.append(f"first divergence: {first.name} (max|b-a| {first.max_abs:.2e}, rel {first.max_rel:.2e})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# CLI


def add_parser(sub) -> None:
    p = sub.add_parser("trace", help="compare two backends/precisions layer by layer",
                       description="Run the T5 encoder and one MMJiT forward (noise at t=0; a Mean Flow "
                                   "student: its first sampler step) on two sides "
                                   "and print, per layer, how far they are apart and the first layer "
                                   "beyond tolerance. Without --model/--t5 the demo model is used.")
    p.add_argument("--a", default="numpy:fp64", help="reference side, backend:precision (default numpy:fp64)")
    p.add_argument("--b", default="numpy:fp32", help="compared side, backend:precision (default numpy:fp32)")
    p.add_argument("-p", "--prompt", default="a large red circle at the left on a gray background")
    p.add_argument("-s", "--seed", type=int, default=42)
    p.add_argument("-W", "--width", type=int, default=None, help="default: the model's image size")
    p.add_argument("-H", "--height", type=int, default=None, help="default: the model's image size")
    add_model_arguments(p)
    add_threads_argument(p)
    p.add_argument("--rtol", type=float, default=None, help="default: by the less precise side")
    p.add_argument("--atol", type=float, default=None, help="default: by the less precise side")
    p.add_argument("-q", "--quiet", action="store_true", help="no note about the demo model")
    p.set_defaults(run=run)


def run(args) -> int:
    """Both sides and the tolerances are checked, then, as for `generate`, the request and the
    model's headers before any work."""
    a, b = Side.parse(args.a), Side.parse(args.b)
    rtol, atol = default_tolerance(a, b)
    tolerance = (rtol if args.rtol is None else TOLERANCE_RANGE.check("--rtol", args.rtol),
                 atol if args.atol is None else TOLERANCE_RANGE.check("--atol", args.atol))
    threads = check_threads(args.threads, "--threads")
    given = {"seed": args.seed} | {name: value for name, value in (("width", args.width), ("height", args.height))
                                   if value is not None}
    sides = [(side.backend, side.precision) for side in (a, b)]
    files, request, _ = checked_request(args, given, sides, memory_itemsize=8)  # side A may run in float64
    with blas_threads(run_threads(request, files, threads)):
        diffs = trace(files.load(), a, b, args.prompt, args.seed, request.width, request.height, tolerance)
    emit(format_report(diffs, a, b, tolerance))
    return 0 if first_divergence(diffs) is None else 1
