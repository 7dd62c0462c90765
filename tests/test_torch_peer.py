"""The PyTorch peers (training/torch_model.py, used by training and the benchmarks) against the
NumPy reference, in float64 so that any difference is a difference of math, not of rounding."""

from __future__ import annotations

import numpy as np
import pytest

from minit2i.core.mean_flow_config import MEAN_FLOW_TINY
from minit2i.core.weights import nest
from minit2i.demo_models import random_mmjit_weights
from minit2i.reference.mean_flow import mean_flow_forward

torch = pytest.importorskip("torch", reason="the PyTorch peers need the [train] or [crosscheck] extra (torch)")
from minit2i.training import torch_model  # noqa: E402  (needs torch)


def test_student_peer_matches_the_reference_in_float64():
    """Same weights and inputs in float64, but the peer's position tables are the reference's float32
    tables (rope_tables copies them), so every cos/sin carries a float32 rounding, 2^-24 = 6e-8
    relative: measured 1.9e-8 at the output. 1e-6 still fails on any wrong op of the prefix (a
    scalar input moved changes the output by > 1e-2, tests/test_mean_flow.py)."""
    config = MEAN_FLOW_TINY
    params = nest(random_mmjit_weights(config, seed=3))
    rng = np.random.default_rng(4)
    images = rng.standard_normal((2, 3, 64, 64))
    context = rng.standard_normal((2, config.prompt_length, config.txt_input_size))
    mask = np.zeros((2, config.prompt_length))
    mask[0, :5] = 1.0
    scalars = [np.array([0.25, 0.5]), np.array([12.0, 1.0]), np.array([0.2, 0.0]), np.array([0.8, 1.0])]
    want = mean_flow_forward(params, config, images, *scalars, context, mask)
    tensors = [torch.from_numpy(a) for a in (images, *scalars, context, mask)]
    got = torch_model.mean_flow_forward(torch_model.to_torch_tree(params, dtype=torch.float64), config, *tensors).numpy()
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-6


def test_tables_cached_in_inference_mode_serve_a_training_step():
    """The peer caches its position tables per shape; a table first built inside inference mode
    (the benchmarks) must still be usable by autograd, which refuses inference tensors."""
    from minit2i.core.mmjit_config import MMJIT_TINY

    torch_model.sincos_table.cache_clear()
    torch_model.rope_tables.cache_clear()
    params = torch_model.to_torch_tree(nest(random_mmjit_weights(MMJIT_TINY, seed=1)))
    images = torch.linspace(-1, 1, 3 * 32 * 32).reshape(1, 3, 32, 32)
    context = torch.ones(1, MMJIT_TINY.prompt_length, MMJIT_TINY.txt_input_size)
    mask = torch.ones(1, MMJIT_TINY.prompt_length)
    with torch.inference_mode():
        torch_model.mmjit_forward(params, MMJIT_TINY, images, context, mask)
    images.requires_grad_()  # then autograd keeps the RoPE tables that multiply the image's q and k
    torch_model.mmjit_forward(params, MMJIT_TINY, images, context, mask).square().sum().backward()
    assert images.grad is not None and torch.count_nonzero(images.grad) > 0


def stage_names(forward, *args) -> list[str]:
    """The names `forward(*args, on_layer=...)` reports, in order."""
    names = []
    forward(*args, on_layer=lambda name, value: names.append(name))
    return names


def test_the_peer_reports_the_reference_stages_under_the_same_names():
    """Each forward writes its own block loop; the trace (minit2i trace) pairs the backends' stages
    by name, so the names and their order must be one. The CuPy twin's are checked through cudasim
    in tests/test_trace.py."""
    from minit2i.core.mmjit_config import MMJIT_TINY
    from minit2i.reference.mmjit import mmjit_forward

    blocks = ["preamble.0", "preamble.1", "double.0.img", "double.0.txt", "double.1.img", "double.1.txt"]
    rng = np.random.default_rng(5)
    for config, forward, peer, scalars, prefix in (
            (MMJIT_TINY, mmjit_forward, torch_model.mmjit_forward, [], []),
            (MEAN_FLOW_TINY, mean_flow_forward, torch_model.mean_flow_forward, [np.array([0.5]), np.array([2.0]),
                                                                                np.array([0.0]), np.array([1.0])],
             ["aux_tokens"])):
        params = nest(random_mmjit_weights(config, seed=6))
        inputs = [rng.standard_normal((1, 3, 32, 32)), *scalars,
                  rng.standard_normal((1, config.prompt_length, config.txt_input_size)), np.ones((1, config.prompt_length))]
        names = stage_names(forward, params, config, *inputs)
        assert names == ["patch_embed", *prefix, "txt_embed", *blocks, "final_layer"]
        assert stage_names(peer, torch_model.to_torch_tree(params, dtype=torch.float64), config,
                           *[torch.from_numpy(a) for a in inputs]) == names
