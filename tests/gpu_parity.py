"""What the GPU parity tests (tests/test_accelerated*.py) share: the device they run on, the
error measures, the bounds, the Hypothesis settings and the report of the check nearest its bound.

They run on the GPU when CuPy sees one; otherwise on cudasim (the same CUDA sources compiled for
the CPU, one fiber per CUDA thread, CuPy played by cudasim.standin). References run in float64
on the same dtype-rounded inputs.

Error measures: `relative_error`, max |twin - ref| / max |ref|, holds where every output element
carries its own roundings only (a product, a norm, a single rounded sum of exact operands): its
error is then a few u of itself (a RoPE rotation: of its pair's norm, which it keeps). Where a result is a difference or a combination whose operands
carry rounding errors (x + f (g - x), r + (d + b), a convex combination of values), it can cancel
to far below the operands while their errors stay: `operand_error` measures max |twin - ref|
against a scale the test computes from the operands' magnitudes, the largest intermediate.

Bounds, from the unit roundoff u (fp32 2^-24, fp16 2^-11, bf16 2^-8), first order (the u^2 terms
are far below any margin): a kernel computes in fp32 and rounds its output once, so its error is
at most u_dtype (the store) + k u_fp32, where k counts the fp32 roundings, each weighted by the
size of what it rounds against the measure's scale (a sum of n terms in any order: n), and the
library functions at their documented worst (expf, tanhf: 2 ulp = 4 u); each test derives its k
in its docstring. `kernel_bound` doubles that worst case; a real bug (a store through bf16, the
state kept in the dtype, a term too many) stays far above it: the planted-bug tests show it for
each bound measured against the operands. A network stage chains about a dozen roundings of the
storage dtype: STAGE_BOUND is 20 u (fp16 1e-2 -> 3e-2 kept, bf16 8e-2), fp32 1e-4 (TF32 off);
the stage and sampler tests run on fixed, seeded inputs, so no draw can move them.

Hypothesis draws stay random everywhere (`parity_settings`), and a failing draw is printed with
its `@reproduce_failure` line. MINIT2I_PARITY_EXAMPLES_FACTOR=20 multiplies every parity test's
number of examples (docs/testing.md); 0 draws one example a test, its `@example` cases beside it
(what `scripts/gpu-check --cudasim` runs, a check of the check).

A test module imports the two autouse fixtures, `device` and `report_worst_error`, by name.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import numpy as np
import pytest
from hypothesis import settings

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


def kernel_bound(precision: str, fp32_roundings: float) -> float:
    """2 * (u_dtype + k * u_fp32): one rounding on the store plus k fp32 roundings (a sum over n
    terms: n), each against the measure's scale; twice the first-order worst case."""
    return 2 * (UNIT_ROUNDOFF[precision] + fp32_roundings * UNIT_ROUNDOFF["fp32"])


EXAMPLES_FACTOR = int(os.environ.get("MINIT2I_PARITY_EXAMPLES_FACTOR", "1"))


def parity_settings(max_examples: int = 12) -> settings:
    """Hypothesis settings of a parity test: `max_examples` times EXAMPLES_FACTOR draws (one at least), no
    deadline (cudasim compiles on first use), random draws even where Hypothesis would load its
    derandomising "ci" profile (a fixed draw would hide a bound that some input breaks), and a
    failure printed with the `@reproduce_failure` line that replays it."""
    return settings(max_examples=max(1, max_examples * EXAMPLES_FACTOR), deadline=None, derandomize=False, print_blob=True)


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


def operand_error(device, expected, scale) -> float:
    """max |twin - ref| / scale, the scale a magnitude the test derives from the operands."""
    return float(np.max(np.abs(to_f64(device) - expected)) / max(scale, 1e-30))


def relative_error(device, expected) -> float:
    """max |twin - ref| / max |ref|."""
    return operand_error(device, expected, np.max(np.abs(expected)))


def product_scale(x, w) -> float:
    """max (|x| @ |w|): the scale of every partial sum of x @ w, against which a sum over k terms
    in any order errs by at most k u (|x| @ |w| >= |x @ w|, which cancellation can make small)."""
    return float(np.max(np.abs(x) @ np.abs(w)))


def collect(store):
    return lambda name, value: store.__setitem__(name, value)


def dtypes_of(stages: dict) -> dict:
    """{stage name: its dtype's name}: every stage of a forward must stay in the network dtype (a
    CuPy routine without a 16-bit loop would silently widen it, as `where` does for bfloat16)."""
    return {name: np.dtype(value.dtype).name for name, value in stages.items()}


def planted(monkeypatch, name: str, corrupt) -> None:
    """kernels.<name> replaced by the real kernel followed by `corrupt(arguments, result)`: a bug
    planted after the fact, for the tests that show a parity bound catches it."""
    real = getattr(kernels, name)

    def wrong(*arguments, **keywords):
        return corrupt(arguments, real(*arguments, **keywords))

    monkeypatch.setattr(kernels, name, wrong)


def in_bf16(array):
    """A device array rounded to bf16 and back to its dtype."""
    return array.astype(dtype_for("bf16")).astype(array.dtype)


def first_argument_in_bf16(arguments, result):
    """A planted bug: the array a kernel updates in place (the sampler steps' fp32 state,
    add_rms_norm's residual: its first argument) kept in bf16."""
    arguments[0][...] = in_bf16(arguments[0])
    return result


def result_in_bf16(arguments, result):
    """A planted bug: an fp32 kernel storing its result through bf16."""
    return in_bf16(result)


def fails(test, **arguments) -> bool:
    """Whether the parity test `test` (its Hypothesis wrapper taken off) fails an assertion on
    `arguments`. Its checks are not kept for `worst_error`: a planted bug is meant to exceed."""
    body = getattr(test, "hypothesis", None)
    try:
        (body.inner_test if body else test)(**arguments)
    except AssertionError:
        return True
    finally:
        ERRORS.clear()
    return False
