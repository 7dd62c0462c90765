"""The lines under explore's step panels say what the panels show: each claim is measured on real
runs of both demo models (`minit2i.insides`, no Gradio), three prompts and seeds each."""

from __future__ import annotations

import numpy as np
import pytest

from minit2i.demo_models import demo_model
from minit2i.explore_tutor import LOOK_FOR, VELOCITY_AGREEMENT
from minit2i.insides import inside_request, sample_and_keep, step_velocity, velocity_correlation
from minit2i.pipeline import load_model, make_runner, sampling_defaults, seeded_noise

RUNS = (("a large red circle at the left on a gray background", 1),
        ("a small blue square at the top on a white background", 42),
        ("a small green cross at the bottom on a navy background", 7))


@pytest.fixture(scope="module", params=["demo", "demo-mf"])
def runs(request):
    """(model name, [FinishedRun of each of RUNS at the model's own settings])."""
    model = load_model(*demo_model(request.param)[:2])
    runner, settings = make_runner(model), sampling_defaults(model)
    finished = []
    for prompt, seed in RUNS:
        asked = inside_request(model, prompt, seed=seed, steps=settings["steps"], guidance_scale=settings["cfg_scale"],
                               width=settings["width"], height=settings["height"], step=0, block=0)
        finished.append(sample_and_keep(model, asked, runner, runner))
    return request.param, finished


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


def test_the_velocity_is_the_same_picture_at_every_step(runs):
    """The velocity caption's claim, "nearly the same picture at every step (its pixels correlate
    VELOCITY_AGREEMENT or more with step 1's)": measured 0.972 at the least on the demo's 20 steps
    (0.997 from one step to the next), 0.998 on the student's 4, where a caption once said the
    velocity carries the whole picture early and only corrections late. Its size stays too: the
    RMS of every step's velocity within 30 % of the first's (2.04 to 2.74 measured), as
    v = x - n of a straight path keeps it (the noise's RMS alone is 2)."""
    _, finished = runs
    assert f"correlate {VELOCITY_AGREEMENT:g} or more with step 1's" in LOOK_FOR["velocity"][0]
    for run in finished:
        steps = run.request.steps
        agreement = [velocity_correlation(run, step, 0) for step in range(steps)]
        assert min(agreement) >= VELOCITY_AGREEMENT, agreement
        rms = [float(np.sqrt(np.mean(step_velocity(run, step) ** 2))) for step in range(steps)]
        assert max(abs(r / rms[0] - 1) for r in rms) < 0.3, rms


def test_the_state_starts_as_noise_and_holds_more_of_the_picture_at_every_step(runs):
    """The state caption: step 1's state is the seed's noise itself, and its correlation with the
    final picture rises at every step (0.00 to 0.93 over the demo's 20, 0.01 to 0.40 over the
    student's 4, which starts its last step at t = 0.75)."""
    _, finished = runs
    assert "pure noise at step 1, more of the picture at every step" in LOOK_FOR["state"][0]
    for run in finished:
        np.testing.assert_array_equal(run.states[0], seeded_noise(run.request, run.states.shape[1])[0])
        likeness = [correlation(state, run.states[-1]) for state in run.states[:-1]]
        assert np.all(np.diff(likeness) > 0), likeness


def test_the_prediction_is_the_picture_from_step_2_while_the_state_is_noise(runs):
    """The x0 caption: from step 2 on x0 correlates 0.9 or more with the final picture (0.945 at
    the least measured; 0.88 at step 1 of one run), while the state of step 2 correlates 0.1 or
    less with it (0.05 at most: t = 0.05 of the demo's path, 0.25 of the student's)."""
    _, finished = runs
    assert "from step 2 on it is nearly the picture, while x_t is still mostly noise" in LOOK_FOR["x0"][0]
    for run in finished:
        final = run.states[-1]
        assert min(correlation(x0, final) for x0 in run.x0s[1:]) >= 0.9
        assert correlation(run.states[1], final) <= 0.1
