"""The Euler x0 -> v CFG sampler (model.md 4.2-4.5, 7.1 item 13) driven by a stub network."""

from __future__ import annotations

import numpy as np
import pytest

from minit2i.reference.sampler import initial_noise, sample, step_factors, time_grid

BATCH, LENGTH, WIDTH_C = 2, 4, 3


class StubNet:
    """x0 = 0.5 x + 0.1 * (number of real tokens) + 0.01 * sum(context): cond and uncond differ.

    Records every call so the tests can check the doubled-batch layout.
    """

    def __init__(self):
        self.calls = []

    def __call__(self, x, context, mask):
        self.calls.append((x.copy(), context.copy(), mask.copy()))
        return self.x0(x, context, mask)

    @staticmethod
    def x0(x, context, mask):
        shift = 0.1 * mask.sum(axis=1) + 0.01 * context.sum(axis=(1, 2))
        return (0.5 * x + shift[:, None, None, None].astype(x.dtype)).astype(x.dtype)


@pytest.fixture
def problem():
    rng = np.random.default_rng(5)
    noise = initial_noise(9, BATCH, 3, 4, 6)
    context = rng.standard_normal((BATCH, LENGTH, WIDTH_C)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=np.float32)
    return noise, context, mask


def explicit_recursion(noise, context, mask, steps, cfg_scale, a_min):
    """The model.md 4.3-4.5 loop written out in float64: (final x, list of guided x0 per step)."""
    x = noise.astype(np.float64)
    guided = []
    for i in range(steps):
        t, t_next = i / steps, (i + 1) / steps
        cond = StubNet.x0(x, context.astype(np.float64), mask.astype(np.float64))
        uncond = StubNet.x0(x, context.astype(np.float64), np.zeros_like(mask, dtype=np.float64))
        v_cond, v_uncond = (cond - x) / max(1 - t, a_min), (uncond - x) / max(1 - t, a_min)
        x = x + (t_next - t) * (v_uncond + cfg_scale * (v_cond - v_uncond))
        guided.append(uncond + cfg_scale * (cond - uncond))
    return x, guided


def test_initial_noise_is_twice_a_seeded_standard_normal():
    noise = initial_noise(123, 2, 3, 16, 32)
    assert noise.shape == (2, 3, 16, 32) and noise.dtype == np.float32
    expected = 2.0 * np.random.default_rng(123).standard_normal((2, 3, 16, 32), dtype=np.float32)
    np.testing.assert_array_equal(noise, expected)
    assert not np.array_equal(noise, initial_noise(124, 2, 3, 16, 32))
    assert 1.9 < float(np.std(initial_noise(0, 1, 3, 64, 64))) < 2.1


def test_time_grid_and_step_factors():
    np.testing.assert_array_equal(time_grid(4), [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(step_factors(4, 0.001), [0.25, 1 / 3, 0.5, 1.0], rtol=1e-15)
    assert step_factors(100, 0.001)[-1] == 1.0
    assert step_factors(100, 0.01)[-1] == 1.0
    damped = step_factors(100, 0.05)
    np.testing.assert_allclose(damped[95:], 0.2, rtol=1e-12)  # 1 - t <= 0.05 for t = 0.95 ... 0.99
    np.testing.assert_allclose(damped[:95], 0.01 / (1 - np.arange(95) / 100), rtol=1e-12)


def test_one_doubled_forward_per_step(problem):
    noise, context, mask = problem
    net = StubNet()
    sample(net, noise, context, mask, steps=5, cfg_scale=3.0)
    assert len(net.calls) == 5
    for x, both_context, both_mask in net.calls:
        assert x.shape[0] == both_context.shape[0] == both_mask.shape[0] == 2 * BATCH
        np.testing.assert_array_equal(x[:BATCH], x[BATCH:])
        np.testing.assert_array_equal(both_context[:BATCH], context)
        np.testing.assert_array_equal(both_context[BATCH:], context)
        np.testing.assert_array_equal(both_mask[:BATCH], mask)
        np.testing.assert_array_equal(both_mask[BATCH:], 0.0)
    np.testing.assert_array_equal(net.calls[0][0][:BATCH], noise)


@pytest.mark.parametrize("steps, cfg_scale, a_min", [(5, 3.0, 0.001), (7, 1.0, 0.05), (10, 6.0, 0.3)])
def test_matches_the_explicit_cfg_recursion(problem, steps, cfg_scale, a_min):
    noise, context, mask = problem
    got = sample(StubNet(), noise.astype(np.float64), context.astype(np.float64), mask.astype(np.float64),
                 steps, cfg_scale, a_min)
    want, _ = explicit_recursion(noise, context, mask, steps, cfg_scale, a_min)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_guidance_uses_the_uncond_branch(problem):
    """cfg 1 is the conditional branch alone; another scale must give another image."""
    noise, context, mask = problem
    cond_only = sample(StubNet(), noise, context, mask, 4, 1.0)
    guided = sample(StubNet(), noise, context, mask, 4, 6.0)
    assert np.max(np.abs(cond_only - guided)) > 0.1


@pytest.mark.parametrize("steps, a_min", [(100, 0.001), (100, 0.01), (7, 0.001), (3, 1 / 3)])
def test_small_floor_lands_on_the_last_guided_x0(problem, steps, a_min):
    noise, context, mask = problem
    seen = []
    final = sample(StubNet(), noise, context, mask, steps, 6.0, a_min, callback=seen.append)
    assert final.dtype == np.float32
    np.testing.assert_allclose(final, seen[-1].x0, rtol=0, atol=1e-6)
    _, guided = explicit_recursion(noise, context, mask, steps, 6.0, a_min)
    np.testing.assert_allclose(final, guided[-1], rtol=1e-4, atol=1e-5)


def test_floor_005_damps_the_last_step(problem):
    """a_min = 0.05, N = 100: final = 0.8 x_99 + 0.2 x0_99 (model.md 4.4), not x0_99."""
    noise, context, mask = problem
    seen = []
    final = sample(StubNet(), noise.astype(np.float64), context, mask, 100, 6.0, 0.05,
                   callback=lambda info: seen.append((info.x.copy(), info.x0.copy())))
    x_99, last_x0 = seen[-2][0], seen[-1][1]
    np.testing.assert_allclose(final, 0.8 * x_99 + 0.2 * last_x0, rtol=1e-12, atol=1e-12)
    assert np.max(np.abs(final - last_x0)) > 1e-3
    undamped = sample(StubNet(), noise.astype(np.float64), context, mask, 100, 6.0, 0.001)
    assert np.max(np.abs(final - undamped)) > 1e-3


def test_callback_once_per_step_with_increasing_t(problem):
    noise, context, mask = problem
    seen = []
    final = sample(StubNet(), noise, context, mask, 6, 2.0, callback=seen.append)
    assert [info.index for info in seen] == list(range(6))
    np.testing.assert_allclose([info.t for info in seen], np.arange(6) / 6, rtol=1e-15)
    assert all(a.t < b.t for a, b in zip(seen, seen[1:]))
    np.testing.assert_array_equal(seen[-1].x, final)
    assert seen[0].x0.shape == noise.shape


def test_float32_state_stays_float32(problem):
    noise, context, mask = problem
    assert sample(StubNet(), noise, context, mask, 3, 6.0).dtype == np.float32
