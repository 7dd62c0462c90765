"""What the GPU parity tests (tests/test_accelerated*.py) share: the device they run on, the
error measure, the bounds and the report of the check nearest its bound.

They run on the GPU when CuPy sees one; otherwise on cudasim (the same CUDA sources compiled for
the CPU, one fiber per CUDA thread, CuPy played by cudasim.standin). References run in float64
on the same dtype-rounded inputs. Error measure: max |twin - ref| / max |ref| ("relative")
unless a test says otherwise.

Bounds, from the unit roundoff u (fp32 2^-24, fp16 2^-11, bf16 2^-8): a kernel computes in
fp32 and rounds its output once, so its error is at most u_dtype (the store) + n * u_fp32 for
an fp32 reduction over n terms (the worst case gamma_n of summation); `kernel_bound` adds a
factor 2 of headroom for the few elementwise fp32 ops (exp, tanh, divide) around it. A network
stage chains about a dozen roundings of the storage dtype: STAGE_BOUND is 20 u (fp16 1e-2 ->
3e-2 kept, bf16 8e-2), fp32 1e-4 (TF32 off).

A test module imports the two autouse fixtures, `device` and `report_worst_error`, by name.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest

from minit2i.accelerated import kernels
from minit2i.accelerated.pipeline import CudasimRunner, CupyRunner, precision_dtype
from minit2i.core.errors import MiniT2IError


def _runner_class():
    """CupyRunner where CuPy sees a GPU, CudasimRunner everywhere else."""
    try:
        kernels.require_gpu()
    except MiniT2IError:
        return CudasimRunner
    return CupyRunner


RUNNER = _runner_class()
BACKEND = RUNNER.name
cp = kernels.cp
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
STAGE_BOUND = {"fp32": 1e-4, "fp16": 3e-2, "bf16": 8e-2}
PRECISIONS = list(UNIT_ROUNDOFF)


ERRORS: list[tuple[float, float]] = []  # (error, bound) of each check in the running test


def within(error: float, bound: float) -> bool:
    """error < bound, remembered for the test's `worst_error` report property."""
    ERRORS.append((error, bound))
    return error < bound


@pytest.fixture(autouse=True)
def report_worst_error(request):
    """Keep the check nearest its bound as the junit property `worst_error` ("error bound"):
    scripts/gpu-check reports it per kernel and dtype."""
    ERRORS.clear()
    yield
    if ERRORS:
        error, bound = max(ERRORS, key=lambda pair: pair[0] / pair[1])
        request.node.user_properties.append(("worst_error", f"{error:.3g} {bound:.3g}"))


def kernel_bound(precision: str, reduction_length: int) -> float:
    """2 * (u_dtype + n * u_fp32): one rounding on the store plus fp32 summation over n terms."""
    return 2 * (UNIT_ROUNDOFF[precision] + reduction_length * UNIT_ROUNDOFF["fp32"])


@pytest.fixture(scope="module", autouse=True)
def device():
    """Point the twin at this module's device (another test module may have chosen another)."""
    RUNNER.array_module()


def every_schedule():
    """On cudasim: run each launch under all schedules and insist on bit-identical results."""
    if BACKEND != "cudasim":
        return nullcontext()
    from minit2i import cudasim

    return cudasim.schedules(cudasim.SCHEDULES, seed=1)


def dtype_for(precision):
    try:
        return precision_dtype(precision)
    except MiniT2IError as err:
        pytest.skip(str(err))


def rounded(array, dtype):
    """Host array -> (device array in dtype, the same values as host float64)."""
    device = cp.asarray(np.asarray(array, np.float32)).astype(dtype)
    return device, to_f64(device)


def to_f64(device):
    return cp.asnumpy(device.astype(cp.float32)).astype(np.float64)


def relative_error(device, expected):
    return float(np.max(np.abs(to_f64(device) - expected)) / max(np.max(np.abs(expected)), 1e-30))


def collect(store):
    return lambda name, value: store.__setitem__(name, value)
