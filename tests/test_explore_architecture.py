"""The explorer's architecture view (minit2i/explore_architecture.py) without a browser: every stage's
shape from a model's config (the demo model, its student, the released B/16 at 512 x 512), and
every stage's output for a kept run, at the reference's own stage names."""

from __future__ import annotations

import numpy as np
import pytest

from minit2i.core.errors import MiniT2IError
from minit2i.core.images import to_pixels
from minit2i.core.mean_flow_config import MeanFlowConfig
from minit2i.core.mmjit_config import MMJIT_B16
from minit2i.explore_architecture import (
    PATCH_PIXELS,
    ROW_PIXELS,
    STAGE_KEYS,
    checked_stage,
    stage_links,
    stage_output,
    stage_shapes,
)
from minit2i.insides import inside_request, look_at, sample_and_keep
from minit2i.pipeline import load_model, make_runner


def test_b16_at_512_has_the_shapes_of_the_released_model():
    """B/16: 1024 patches of 768 numbers through the 128-channel bottleneck to width 768, 256 T5
    tokens of 1024, 2 preamble and 17 double blocks, joint attention over 1280 tokens."""
    shapes = stage_shapes(MMJIT_B16, 512, 512, 100)
    assert shapes == {
        "t5": "[1, 256, 1024]", "aux_tokens": "none: a base model", "txt_embed": "[1, 256, 768]",
        "preamble": "2 x [1, 256, 768]", "state": "[1, 3, 512, 512]",
        "patch_embed": "[1, 1024, 768] -> [1, 1024, 128] -> [1, 1024, 768]",
        "double": "17 x img [1, 1024, 768], txt [1, 256, 768]; attention over 1280 tokens",
        "final_layer": "[1, 1024, 768]", "x0": "[1, 3, 512, 512]", "step": "[1, 3, 512, 512], 100 steps"}
    student = stage_shapes(MeanFlowConfig(**vars(MMJIT_B16)), 512, 512, 4)
    assert student["aux_tokens"] == "[1, 20, 768]" and student["txt_embed"] == "[1, 276, 768]"
    assert student["double"].endswith("attention over 1300 tokens")


@pytest.fixture(scope="module", params=["demo", "demo-mf"])
def looked(request):
    """(the model, its kept run of 4 steps, the insides at step 2 and block 2, both from 0)."""
    model = load_model(request.param)
    runner = make_runner(model)
    settings = {"seed": 1, "steps": 4, "guidance_scale": 2.0, "width": 64, "height": 64}
    run = sample_and_keep(model, inside_request(model, "a large red circle at the left on a gray background",
                                                step=2, block=2, **settings), runner, runner)
    return model, run, look_at(model, runner, run, 2, 2)


def test_every_stage_shows_the_reference_output_it_names(looked):
    """Text stages: a table of their tokens (ROW_PIXELS a row) by features; image-token stages: a map
    of the 16 x 16 patches; the state, x0 and the next state: the run's own pictures; the final
    layer's patches put back: that forward's x0 (to the last bit: the same float32 array)."""
    model, run, insides = looked
    config = model.mmjit.config
    student = isinstance(config, MeanFlowConfig)
    shown = {key: stage_output(key, insides, run, config, 2, 2) for key in STAGE_KEYS}
    text = config.prompt_length + (config.num_aux_tokens if student else 0)
    assert shown["t5"][0].shape == (config.prompt_length * ROW_PIXELS, config.txt_input_size, 3)
    assert shown["txt_embed"][0].shape == shown["preamble"][0].shape == (text * ROW_PIXELS, config.hidden_size, 3)
    assert shown["patch_embed"][0].shape == shown["double"][0].shape == (16 * PATCH_PIXELS, 16 * PATCH_PIXELS, 3)
    for key, picture in (("state", run.states[2]), ("x0", run.x0s[2]), ("step", run.states[3])):
        np.testing.assert_array_equal(shown[key][0], to_pixels(picture[None])[0])
    # The stages are the sampler's own forward: the base model's conditional pass, the student's guided one.
    np.testing.assert_array_equal(shown["final_layer"][0], to_pixels(run.x0s[2][None])[0] if student
                                  else insides.cond_x0)
    if student:
        assert shown["aux_tokens"][0].shape == (20 * ROW_PIXELS, config.hidden_size, 3)
    else:
        assert shown["aux_tokens"][0] is None and "no prefix" in shown["aux_tokens"][1]
    assert not np.array_equal(shown["patch_embed"][0], shown["double"][0])


def test_every_stage_links_its_concepts_section_and_a_served_code_page():
    for key in STAGE_KEYS:
        line = stage_links(key)
        assert "](concepts#h-" in line and "](code/reference/" in line, line


@pytest.mark.parametrize("key", ["nope", 3, None, ["t5"]])
def test_a_stage_a_client_forged_is_one_line(key):
    with pytest.raises(MiniT2IError, match="is not a stage of the model; choose one of t5, aux_tokens"):
        checked_stage(key)
