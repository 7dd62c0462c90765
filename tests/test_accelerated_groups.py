"""The twin drawing a group of images in one forward (what `minit2i batch --batch-size N` runs):
each image of the group against the same image drawn alone, and the captured steps a runner keeps
per shape of its work.

A group's image is not its image alone bit for bit on the twin: its GEMMs are 2-D products over
all the group's rows ([rows, K] @ [K, N]), and the sums of one output row depend on the row
count: cuBLAS picks its algorithm by the shape, and OpenBLAS, cudasim's GEMM, measured here
(0.3.31, Haswell kernels) gives other bits for a row of a product of another height, on one
thread or two. Both are fp32 computations of the same image, each within the whole sampler's
bound of the exact one (tests/test_accelerated.py, tests/test_accelerated_mean_flow.py:
(2s - 1) STAGE_BOUND fp32 of the base model's guided image at scale s, 2 STAGE_BOUND fp32 of the
student's), so they are within twice that of each other: GROUP_BOUND. Two draws of the same
group are the same bits (the same products), which is what a batch run relies on (driver.groups).

Tiny seeded models (conftest.py), 3 steps at 32 x 32.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import BACKEND, RUNNER, STAGE_BOUND
from hypothesis import given, settings
from hypothesis import strategies as st

from minit2i.accelerated import kernels, sampler
from minit2i.accelerated.mean_flow_sampler import StudentStep
from minit2i.core.mean_flow_config import MeanFlowConfig
from minit2i.pipeline import load_model
from minit2i.reference.sampler import initial_noise

PROMPTS = ["a dog", "a red cat on a mat", "two birds", "a house by the sea", "a blue car"]
STEPS, SIZE, CFG_SCALE, A_MIN = 3, 32, 3.0, 0.001
OMEGA, INTERVAL = 4.0, (0.2, 0.8)
GROUP_BOUND = {"base": 2 * (2 * CFG_SCALE - 1) * STAGE_BOUND["fp32"], "student": 2 * 2 * STAGE_BOUND["fp32"]}
# The same products on a GPU: replay against eager keeps 1e-6 (tests/test_accelerated.py).
GPU_SAME_GROUP_BOUND = 1e-6


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return load_model(*tiny_model)


@pytest.fixture(scope="module")
def student(tiny_student):
    return load_model(*tiny_student)


def draw(model, runner, picks: list[int]) -> np.ndarray:
    """The final states [len(picks), 3, SIZE, SIZE] of PROMPTS[i] from seed 100 + i, i in `picks`,
    drawn in one group: one T5 batch, one sampler run."""
    ids, mask = model.tokenizer([PROMPTS[i] for i in picks])
    context = runner.encode(ids, mask)
    noise = np.concatenate([initial_noise(100 + i, 1, 3, SIZE, SIZE) for i in picks])
    if isinstance(model.mmjit.config, MeanFlowConfig):
        return runner.sample_mean_flow(noise, context, mask, STEPS, OMEGA, INTERVAL)
    return runner.sample(noise, context, mask, STEPS, CFG_SCALE, A_MIN)


def relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def assert_same_group_same_bits(a: np.ndarray, b: np.ndarray) -> None:
    if BACKEND == "cudasim":
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    else:
        assert relative_difference(a, b) <= GPU_SAME_GROUP_BOUND


@pytest.fixture(scope="module", params=["base", "student"])
def model_runner_alone(request, tiny, student):
    """(model, runner, each prompt's state drawn alone, GROUP_BOUND) of the tiny base model or its student."""
    model = tiny if request.param == "base" else student
    runner = RUNNER(model.mmjit, model.t5, "fp32")
    return model, runner, [draw(model, runner, [i])[0] for i in range(len(PROMPTS))], GROUP_BOUND[request.param]


@settings(max_examples=4, deadline=None)
@given(picks=st.lists(st.integers(0, len(PROMPTS) - 1), min_size=2, max_size=len(PROMPTS), unique=True))
def test_an_image_drawn_in_a_group_is_within_the_bound_of_the_image_drawn_alone(model_runner_alone, picks):
    """Any group of the prompts in any order, on the base model and the student: GROUP_BOUND
    (measured on cudasim: about 3e-6 of the largest value, against 1e-3 and 8e-4)."""
    model, runner, alone, bound = model_runner_alone
    grouped = draw(model, runner, picks)
    for row, i in enumerate(picks):
        assert relative_difference(grouped[row], alone[i]) <= bound


def test_a_runner_captures_one_step_per_group_shape_and_replays_it(tiny, monkeypatch):
    """Groups of 3, 3 and 2 (a run's last group smaller): two captures, one per shape; every step
    after the first of a shape's first group a replay, and every step of the second group of 3; a
    third shape drops the one used least recently, so at most two graphs hold device memory. The
    second group of 3, replayed on the first one's graph, is the group drawn by a fresh runner bit
    for bit (cudasim; a GPU within replay's 1e-6)."""
    captures, launches = [], []
    real_capture, real_launch = sampler.capture, sampler.CapturedStep.launch
    monkeypatch.setattr(sampler, "capture", lambda step, stream: captures.append(1) or real_capture(step, stream))
    monkeypatch.setattr(sampler.CapturedStep, "launch",
                        lambda self, stream: launches.append(1) or real_launch(self, stream))
    runner = RUNNER(tiny.mmjit, tiny.t5, "fp32")
    draw(tiny, runner, [0, 1, 2])
    second = draw(tiny, runner, [3, 4, 0])
    draw(tiny, runner, [1, 2])
    assert (len(captures), len(launches)) == (2, (STEPS - 1) + STEPS + (STEPS - 1))
    assert [key[1][0] for key in runner.graphs.entries] == [3, 2]
    draw(tiny, runner, [4])
    assert [key[1][0] for key in runner.graphs.entries] == [2, 1] and len(captures) == 3
    fresh = draw(tiny, RUNNER(tiny.mmjit, tiny.t5, "fp32"), [3, 4, 0])
    assert_same_group_same_bits(second, fresh)


def count_captures_and_eager_steps(monkeypatch, step_class) -> tuple[list, list]:
    """(captures, step calls) lists that grow by one at each `sampler.capture` and each call of
    `step_class.step`: an eager step, or the one run inside a capture."""
    captures, eager = [], []
    real_capture, real_step = sampler.capture, step_class.step
    monkeypatch.setattr(sampler, "capture", lambda step, stream: captures.append(1) or real_capture(step, stream))
    monkeypatch.setattr(step_class, "step", lambda self: eager.append(1) or real_step(self))
    return captures, eager


def test_a_second_call_captures_nothing_and_draws_a_fresh_runners_pixels(tiny, monkeypatch):
    """Two `sample` calls of one shape on one runner: the first runs step 0 eagerly and captures
    step 1; the second (other prompts, other noise, other step count: the factors are device
    scalars, not part of the graph) captures nothing and runs no eager step, every step a replay.
    Each call's image is the one a fresh runner draws after `kernels.clear_device_caches()`, what a
    fresh process starts from (no compiled module, table, handle or graph), bit for bit on
    cudasim (a replay re-runs the recorded operations on the same values; a GPU within replay's
    1e-6). Clearing the device caches drops the kept graph: the next call captures again."""
    captures, eager = count_captures_and_eager_steps(monkeypatch, sampler.GuidedStep)
    runner = RUNNER(tiny.mmjit, tiny.t5, "fp32")
    first = draw(tiny, runner, [0])
    assert (len(captures), len(eager)) == (1, 2)  # step 0, then step 1 inside the capture
    ids, mask = tiny.tokenizer([PROMPTS[1]])
    context = runner.encode(ids, mask)
    noise = initial_noise(101, 1, 3, SIZE, SIZE)
    second = runner.sample(noise, context, mask, STEPS + 1, CFG_SCALE, A_MIN)
    assert (len(captures), len(eager)) == (1, 2)
    kernels.clear_device_caches()
    assert not runner.graphs.entries
    fresh_runner = RUNNER(tiny.mmjit, tiny.t5, "fp32")
    assert_same_group_same_bits(first, draw(tiny, fresh_runner, [0]))
    assert len(captures) == 2
    kernels.clear_device_caches()
    fresh_second = RUNNER(tiny.mmjit, tiny.t5, "fp32").sample(noise, context, mask, STEPS + 1, CFG_SCALE, A_MIN)
    assert_same_group_same_bits(second, fresh_second)


def test_a_student_group_replayed_on_a_kept_graph_hands_the_callback_the_replayed_x0(student, monkeypatch):
    """The student's x0 lives in the graph's pool: a call replaying a kept graph (every step of it,
    none eager, no second capture) must hand the callback that array after each replay."""
    captures, eager = count_captures_and_eager_steps(monkeypatch, StudentStep)
    runner = RUNNER(student.mmjit, student.t5, "fp32")
    draw(student, runner, [0, 1])
    ids, mask = student.tokenizer([PROMPTS[2], PROMPTS[3]])
    context = runner.encode(ids, mask)
    noise = np.concatenate([initial_noise(100 + i, 1, 3, SIZE, SIZE) for i in (2, 3)])
    seen = []
    final = runner.sample_mean_flow(noise, context, mask, STEPS, OMEGA, INTERVAL,
                                    lambda info: seen.append(runner.to_host(info.x0)))
    # the last step's factor is 1: the image is that step's x0, up to one fp32 rounding of x + (x0 - x)
    assert np.max(np.abs(final - seen[-1])) <= 2**-23 * np.max(np.abs(seen[-1]))
    assert not np.array_equal(seen[0], seen[-1])
    assert (len(captures), len(eager), len(seen)) == (1, 2, STEPS)

