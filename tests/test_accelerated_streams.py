"""Both streams of a double block at once (accelerated/streams.py): on cudasim the captured
step's graph, read node by node, runs the text stream's work beside the image stream's, tied only
at each joint attention; and a forked sampler draws the bits of the unforked one.

Tiny seeded model (conftest.py), 2 steps at 32 x 32: step 1 is the captured one.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import BACKEND, RUNNER, device, report_worst_error  # noqa: F401 (autouse fixtures)

from minit2i.accelerated import kernels
from minit2i.pipeline import load_model
from minit2i.reference.sampler import initial_noise

pytestmark = pytest.mark.gpu

STEPS, SIZE, CFG_SCALE, A_MIN = 2, 32, 3.0, 0.001
# Each stream's kernels between two joint attentions (the text finish of one block, the heads of the next).
STREAM_KERNELS = ("rms_norm", "qkv_heads", "add_rms_norm", "swiglu")


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return load_model(*tiny_model)


def draw(model, runner) -> np.ndarray:
    ids, mask = model.tokenizer(["a red cat on a mat"])
    return runner.sample(initial_noise(7, 1, 3, SIZE, SIZE), runner.encode(ids, mask), mask, STEPS, CFG_SCALE, A_MIN)


def ancestors(nodes) -> list[int]:
    """For each node the set of nodes it waits for, directly or not, as a bit mask (nodes only
    wait for earlier ones)."""
    masks = []
    for node in nodes:
        mask = 0
        for before in node.waits_for:
            mask |= (1 << before) | masks[before]
        masks.append(mask)
    return masks


@pytest.mark.skipif(BACKEND != "cudasim", reason="reads the graph's nodes, which cudasim's stand-in records")
def test_the_captured_step_runs_the_text_stream_beside_the_image_stream(tiny):
    """Between two joint attentions the text stream's nodes (its add_rms_norm, MLP, norm1, QKV GEMM
    and qkv_heads) are on the text stream and the image stream's on the capture stream; no path
    joins a node of one to a node of the other (independent: either may run first, or both at
    once); both wait for the first attention (the fork) and the second waits for both (the join).
    Each stream's GEMMs use a cuBLAS handle of their own (two workspaces)."""
    runner = RUNNER(tiny.mmjit, tiny.t5, "fp32")
    draw(tiny, runner)
    (work,) = runner.graphs.entries.values()
    nodes = work.graph.graph.nodes
    before = ancestors(nodes)
    attentions = [i for i, node in enumerate(nodes) if node.name.startswith("flash_attention")]
    main, text = nodes[attentions[0]].stream, kernels.text_stream()
    assert len(attentions) == tiny.mmjit.config.depth_double >= 2
    for first, second in zip(attentions, attentions[1:]):
        between = range(first + 1, second)
        txt = [i for i in between if nodes[i].stream is text]
        img = [i for i in between if nodes[i].stream is main]
        assert len(txt) + len(img) == len(between)
        for side in (txt, img):
            names = [nodes[i].name for i in side]
            assert all(any(name.startswith(kernel) for name in names) for kernel in STREAM_KERNELS), names
            assert sum(name.startswith("gemm") for name in names) == 4  # attn proj, w1|w3, w2, qkv
            assert all(before[i] >> first & 1 and before[second] >> i & 1 for i in side)
        assert not any(before[t] >> i & 1 or before[i] >> t & 1 for t in txt for i in img)
    handles = {(node.stream is text, node.name) for node in nodes if node.name.startswith("gemm")}
    assert handles == {(True, "gemm (handle 1)"), (False, "gemm (handle 0)")}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_forked_sampler_draws_the_unforked_bits(tiny, precision):
    """Forking changes only which stream a kernel is issued to: the same kernels on the same data,
    each stream in its order, so the image is the same bits (step 0 eager, step 1 replayed)."""
    forked = draw(tiny, RUNNER(tiny.mmjit, tiny.t5, precision))
    unforked = draw(tiny, RUNNER(tiny.mmjit, tiny.t5, precision, fork_streams=False))
    assert np.array_equal(forked.view(np.uint32), unforked.view(np.uint32))
