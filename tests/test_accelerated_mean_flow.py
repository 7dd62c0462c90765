"""CuPy twin of the Mean Flow student and its few-step sampler vs the NumPy reference (model.md 9).

Device, error measure and bounds (from the unit roundoff u): tests/gpu_parity.py. The student is
tests/test_mean_flow.py's configuration: every prefix group active (3, 2, 1, 1, 2 tokens), 3 heads
of 20, so a quarter of the head dim is odd (the kernels take any even head_dim <= 128; the
tensor-core attention pads 20 to 32), a 48 x 64 image (a 3 x 4 grid), 8 text tokens and three
prompt rows: full, partly masked, all zero.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gpu_parity import (  # noqa: F401 (device, report_worst_error: autouse fixtures)
    BACKEND,
    PRECISIONS,
    RUNNER,
    STAGE_BOUND,
    UNIT_ROUNDOFF,
    collect,
    dtypes_of,
    cp,
    device,
    dtype_for,
    every_schedule,
    fails,
    first_argument_in_bf16,
    kernel_bound,
    operand_error,
    parity_settings,
    planted,
    relative_error,
    report_worst_error,
    rounded,
    to_f64,
    within,
)
from hypothesis import given
from hypothesis import strategies as st
from test_mean_flow import CONFIG, HEIGHT, SCALARS, TEXT_LENGTH, WIDTH

from minit2i.accelerated import kernels
from minit2i.accelerated.layers import device_joint_rope
from minit2i.accelerated.mean_flow import device_unrotated_prefix, mean_flow_forward, upload_mean_flow
from minit2i.core.errors import MiniT2IError
from minit2i.core.t5_config import T5_TINY
from minit2i.core.weights import nest
from minit2i.demo_models import write_model
from minit2i.pipeline import load_model
from minit2i.reference.mean_flow import mean_flow_forward as ref_mean_flow_forward
from minit2i.reference.mean_flow_sampler import sample_mean_flow as ref_sample_mean_flow
from minit2i.reference.sampler import initial_noise

pytestmark = pytest.mark.gpu  # on the GPU when there is one (scripts/gpu-check runs every test so marked)
GRID = (HEIGHT // CONFIG.patch_size, WIDTH // CONFIG.patch_size)
PREFIX = CONFIG.num_aux_tokens
OMEGA, INTERVAL = 7.0, (0.25, 0.75)


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """The student written as a checkpoint (diffusers layout, T5 of matching width) and loaded."""
    root = tmp_path_factory.mktemp("student")
    write_model(root / "transformer", root / "t5", CONFIG, replace(T5_TINY, d_model=CONFIG.txt_input_size), 17)
    return load_model(root / "transformer", root / "t5")


def prompt_mask():
    """[3, L]: a full prompt, one with 3 real tokens, an all-zero (unconditional) row."""
    mask = np.zeros((3, TEXT_LENGTH), np.float32)
    mask[0], mask[1, :3] = 1, 1
    return mask


def prompt(dtype, seed: int = 2):
    """(device context in dtype, its float64 values, mask [3, L])."""
    context = np.random.default_rng(seed).standard_normal((3, TEXT_LENGTH, CONFIG.txt_input_size))
    return (*rounded(context, dtype), prompt_mask())


def bits(array):
    """A device array's bytes as unsigned integers of its item size, on the host."""
    host = cp.asnumpy(array)
    return host.view(f"u{host.dtype.itemsize}")


# ---------------------------------------------------------------------------------------------
# Kernels


@pytest.mark.parametrize("precision", PRECISIONS)
def test_unrotated_prefix_rows_leave_qkv_heads_as_without_rope(precision):
    """The student's double blocks reuse `qkv_heads` with tables whose first A rows are cos 1,
    sin 0: a * 1 - b * 0 and b * 1 + a * 0 are a and b exactly in fp32 (with or without FMA
    contraction), so those rows of q and k are bit for bit the rows written without RoPE (only a
    zero could flip its sign, -0 - (-0) = +0; these inputs have none), and the rows after the
    prefix are bit for bit those of the plain joint tables. Fails if the prefix were rotated:
    the joint tables' prefix rows 1..A-1 give other bits (row 0 is angle 0 in both)."""
    dtype, rng = dtype_for(precision), np.random.default_rng(3)
    heads, head_dim, length = CONFIG.num_heads, CONFIG.head_dim, PREFIX + TEXT_LENGTH
    total = length + GRID[0] * GRID[1]
    qkv, _ = rounded(rng.standard_normal((2, length, 3 * heads * head_dim)), dtype)
    bias, _ = rounded(rng.standard_normal(3 * heads * head_dim), dtype)
    norms = tuple(rounded(1 + 0.1 * rng.standard_normal(head_dim), dtype)[0] for _ in range(2))

    def q_and_k(rope):
        buffers = [cp.zeros((2, heads, total, head_dim), dtype) for _ in range(3)]
        with every_schedule():
            kernels.qkv_heads(qkv, bias, heads, *buffers, norms=norms, rope=rope)
        return np.stack([bits(buffer)[:, :, :length] for buffer in buffers[:2]])

    student = q_and_k(device_unrotated_prefix(length, *GRID, head_dim, PREFIX))
    plain, joint = q_and_k(None), q_and_k(device_joint_rope(length, *GRID, head_dim))
    assert np.array_equal(student[..., :PREFIX, :], plain[..., :PREFIX, :])
    assert np.array_equal(student[..., PREFIX:, :], joint[..., PREFIX:, :])
    assert not np.array_equal(joint[..., 1:PREFIX, :], plain[..., 1:PREFIX, :])


@pytest.mark.parametrize("precision", PRECISIONS)
@parity_settings()
@given(batch=st.integers(1, 3), size=st.integers(1, 300), factor=st.floats(0, 1), seed=st.integers(0, 2**16))
def test_student_euler(precision, batch, size, factor, seed):
    """x + f (x0 - x) on the fp32 state, x0 in the network dtype, f as fp32. Error against
    S = max(|x| + |x0|), which bounds every intermediate (f <= 1; relative to the result, x = -x0
    and f = 1/2 would make it 0/0): x0 - x, f times it and the sum round by at most u S each:
    3 u S (k = 2, the last rounding being the store); the next input rounds x' (|x'| <= S) to
    the dtype: u_dtype + 3 u (k = 3)."""
    dtype, rng = dtype_for(precision), np.random.default_rng(seed)
    state64 = rng.standard_normal((batch, size)).astype(np.float32).astype(np.float64)
    state = cp.asarray(state64, np.float32)
    x0, x064 = rounded(rng.standard_normal((batch, size)), dtype)
    next_input = cp.empty_like(x0)
    with every_schedule():
        kernels.student_euler(state, next_input, x0, cp.asarray([factor], np.float32))
    expected = state64 + np.float64(np.float32(factor)) * (x064 - state64)
    scale = np.max(np.abs(state64) + np.abs(x064))
    assert within(operand_error(state, expected, scale), kernel_bound("fp32", 2))
    assert within(operand_error(next_input, expected, scale), kernel_bound(precision, 3))


def test_student_euler_bounds_catch_a_state_kept_in_bf16(monkeypatch):
    """The state rounded to bf16 (about 2^-9 of itself, where the bound is 6 u_fp32 of S) fails
    test_student_euler."""
    planted(monkeypatch, "student_euler", first_argument_in_bf16)
    assert fails(test_student_euler, precision="fp32", batch=1, size=300, factor=0.5, seed=1)


# ---------------------------------------------------------------------------------------------
# The student's forward, stage by stage


@pytest.mark.parametrize("precision", PRECISIONS)
def test_student_every_stage_matches_reference(student, precision):
    """Every stage of `mean_flow_forward`, "aux_tokens" included, under the reference's names,
    within STAGE_BOUND (20 u; fp32 1e-4). The prefix adds to a stage's chain of roundings the
    fp32 sinusoid and SiLU, each rounded once to the dtype, two GEMMs with fp32 sums and the
    fp32 mean over L: a few u more, inside the same bound. The scalars reach the twin as float32
    (h = 0.1, t_min = 0.2, ... are not exact there): one u_fp32 on an angle, far below it."""
    dtype, rng = dtype_for(precision), np.random.default_rng(1)
    images, images64 = rounded(rng.standard_normal((3, 3, HEIGHT, WIDTH)), dtype)
    context, context64, mask = prompt(dtype)
    scalars = [SCALARS[name] for name in ("h", "omega", "t_min", "t_max")]
    expected, actual = {}, {}
    x0_ref = ref_mean_flow_forward(nest(student.mmjit.tensors), CONFIG, images64, *scalars, context64, mask,
                                   collect(expected))
    x0 = mean_flow_forward(upload_mean_flow(nest(student.mmjit.tensors), CONFIG, dtype), CONFIG, images,
                           *(cp.asarray(values, np.float32) for values in scalars), context, cp.asarray(mask),
                           collect(actual))
    assert list(actual) == list(expected) and "aux_tokens" in expected
    assert dtypes_of(actual) == {name: np.dtype(dtype).name for name in actual}
    for name in expected:
        assert within(relative_error(actual[name], expected[name]), STAGE_BOUND[precision]), name
    assert x0.shape == (3, 3, HEIGHT, WIDTH) and x0.dtype == dtype
    assert within(relative_error(x0, x0_ref), STAGE_BOUND[precision])


# ---------------------------------------------------------------------------------------------
# Sampler


def reference_sample(student, context64, mask, steps: int = 4, callback=None):
    """reference.mean_flow_sampler on the float64 student, from the seed-7 noise."""
    params = nest(student.mmjit.tensors)
    noise = initial_noise(7, 3, 3, HEIGHT, WIDTH).astype(np.float64)
    return ref_sample_mean_flow(lambda x, *inputs: ref_mean_flow_forward(params, CONFIG, x, *inputs), noise,
                                context64, mask, steps, OMEGA, INTERVAL, callback)


def twin_sample(runner, context, mask, steps: int = 4, callback=None):
    return runner.sample_mean_flow(initial_noise(7, 3, 3, HEIGHT, WIDTH), context, mask, steps, OMEGA, INTERVAL,
                                   callback)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_whole_sampler_matches_reference(student, precision):
    """Four steps from the same noise: the image is the last forward's x0 (f = 1, up to one fp32
    rounding of x + (x0 - x)). That forward's own error is a stage's, and its input carries the
    earlier steps' errors: each state is a convex combination (1 - f) z + f x0 of fp32 values,
    so it is off by at most the largest earlier x0 error plus the input's rounding to the dtype
    (u), and the network passes an input error on with a gain of about 1 (tiny random weights).
    Bound: 2 STAGE_BOUND. The callback sees the reference's step indices and times, and at the
    last step (a graph replay) the x0 the image landed on: state = z + 1 (x0 - z) rounds twice in
    fp32, so |state - x0| <= 3 u_fp32 M, M the largest |value| of the run (states are convex
    combinations of the noise and the x0s)."""
    dtype = dtype_for(precision)
    context, context64, mask = prompt(dtype)
    seen_ref, seen = [], []
    expected = reference_sample(student, context64, mask, callback=seen_ref.append)
    runner = RUNNER(student.mmjit, student.t5, precision)
    got = twin_sample(runner, context, mask, callback=lambda info: seen.append((info.index, info.t, to_f64(info.x0))))
    assert got.shape == expected.shape and got.dtype == np.float32
    assert within(float(np.max(np.abs(got - expected)) / np.max(np.abs(expected))), 2 * STAGE_BOUND[precision])
    assert [(i, t) for i, t, _ in seen] == [(info.index, info.t) for info in seen_ref] == [
        (0, 1.0), (1, 0.75), (2, 0.5), (3, 0.25)]
    largest = max(np.max(np.abs(initial_noise(7, 3, 3, HEIGHT, WIDTH))), *(np.max(np.abs(x0)) for *_, x0 in seen))
    assert np.max(np.abs(got - seen[-1][2])) <= 3 * UNIT_ROUNDOFF["fp32"] * largest


# A 4-step grid whose step lengths all differ (.1, .3, .4, .2): on the uniform grid every h is
# 0.25, so a step length frozen into the graph at capture would go unseen.
UNEVEN_GRID = np.array([1.0, 0.9, 0.6, 0.2, 0.0])


@pytest.fixture
def uneven_grid(monkeypatch):
    """Both samplers on UNEVEN_GRID: reference.mean_flow_sampler derives its step lengths and
    factors from `mean_flow_time_grid`, which the twin reads them from."""
    import minit2i.accelerated.mean_flow_sampler as twin
    import minit2i.reference.mean_flow_sampler as reference

    for module in (reference, twin):
        monkeypatch.setattr(module, "mean_flow_time_grid", lambda steps: UNEVEN_GRID)


def replay_error(student) -> float:
    """max |eager - graph replay| / max |eager| over a 4-step fp32 sample."""
    context, _, mask = prompt(np.float32)
    eager = twin_sample(RUNNER(student.mmjit, student.t5, "fp32", use_graph=False), context, mask)
    replayed = twin_sample(RUNNER(student.mmjit, student.t5, "fp32"), context, mask)
    return float(np.max(np.abs(eager - replayed)) / np.max(np.abs(eager)))


def test_graph_replay_matches_eager(student, uneven_grid, caplog, monkeypatch):
    """Steps 1..3 of 4 are replays of the step captured at step 1, each after its own h and factor
    were written into the device scalars the graph reads. Same kernels on the same values: on
    cudasim bit for bit; on a GPU within 1e-6 (cuBLAS may pick another algorithm inside a
    capture). A step length frozen at capture fails this (the next test plants one)."""
    import minit2i.accelerated.sampler as sampler

    replays = []
    real_launch = sampler.CapturedStep.launch
    monkeypatch.setattr(sampler.CapturedStep, "launch",
                        lambda self, stream: replays.append(1) or real_launch(self, stream))
    with caplog.at_level("WARNING", logger="minit2i.accelerated"):
        error = replay_error(student)
    assert error == 0 if BACKEND == "cudasim" else error <= 1e-6
    assert len(replays) == 3
    assert caplog.records == []


def test_an_h_baked_in_at_capture_makes_replay_differ(student, uneven_grid, monkeypatch):
    """The planted bug: the forward gets h as an array made while the step runs (cp.full, its
    value a kernel parameter), so the graph keeps step 1's h = 0.3 where steps 2 and 3 need 0.4
    and 0.2; moving h moves the image by far more than 1e-3 (tests/test_mean_flow.py)."""
    import minit2i.accelerated.mean_flow_sampler as twin
    import minit2i.accelerated.pipeline as pipeline

    current = []
    real_lengths, real_forward = twin.step_lengths, pipeline.mean_flow_forward

    def recorded_lengths(steps):
        for h in real_lengths(steps):
            current[:] = [h]
            yield h

    monkeypatch.setattr(twin, "step_lengths", recorded_lengths)
    monkeypatch.setattr(pipeline, "mean_flow_forward", lambda params, config, x, h, *inputs: real_forward(
        params, config, x, cp.full(h.shape, current[0], np.float32), *inputs))
    assert replay_error(student) > 1e-3


def test_a_build_fault_in_the_student_sampler_is_one_line(student, monkeypatch):
    """CudasimRunner.sample_mean_flow turns cudasim's BuildError into one MiniT2IError line."""
    if BACKEND != "cudasim":
        pytest.skip("cudasim's build faults")
    from minit2i.accelerated.pipeline import CupyRunner
    from minit2i.cudasim import BuildError

    def broken(*args, **kwargs):
        raise BuildError("g++ could not compile sampler.cu for cudasim:\nsampler.cu:1: error: something")

    monkeypatch.setattr(CupyRunner, "sample_mean_flow", broken)
    with pytest.raises(MiniT2IError, match=r"^the cudasim backend could not build its kernels: g\+\+ could not "
                                           r"compile sampler.cu for cudasim: \(sampler.cu:1: error: something\)$"):
        RUNNER(student.mmjit, student.t5, "fp32").sample_mean_flow(None, None, None, 4, OMEGA, INTERVAL)
