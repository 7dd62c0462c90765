"""`minit2i.insides`: one generation seen from inside, on the demo models (what `minit2i explore` shows)."""

from __future__ import annotations

import numpy as np
import pytest
from explore_server import PROMPT, SEED, generated_pixels, shape_and_background

from minit2i.core.errors import MiniT2IError
from minit2i.core.tokenizer import PromptTokenizer, make_t5_style_tokenizer
from minit2i.demo_models import demo_model
from minit2i.insides import block_attention, block_inputs, block_rope, look_inside, predictions
from minit2i.pipeline import Request, load_model, make_runner, sampling_defaults
from minit2i.reference.mmjit import double_block
from minit2i.reference.sampler import initial_noise

# (model, steps, guidance, the step looked at): few steps keep the file fast; block 2 is the demo
# models' block whose image queries look at the colour word where the shape is drawn.
CASES = {"demo": (8, 2.0, 4), "demo-mf": (4, 3.0, 2)}
BLOCK = 2


@pytest.fixture(scope="module", params=list(CASES))
def looked(request):
    """(name, model, Insides) of the demo prompt, seed 1, for each demo model."""
    name = request.param
    model = load_model(*demo_model(name)[:2])
    steps, guidance, step = CASES[name]
    return name, model, look_inside(model, PROMPT, seed=SEED, steps=steps, guidance_scale=guidance, width=64,
                                    height=64, step=step, block=BLOCK)


def test_final_image_is_the_generate_commands(looked, tmp_path):
    name, _, insides = looked
    steps, guidance, _ = CASES[name]
    np.testing.assert_array_equal(insides.image, generated_pixels(tmp_path, name, steps, guidance))


def test_last_clean_image_prediction_is_the_picture(looked):
    """Both samplers' last step factor is exactly 1, so the last state is the last x0 (up to one
    rounding of x + (x0 - x), a float32 ulp of values ~1, far below one 1/127.5 pixel level): one
    level where the floor of `to_pixels` falls between them."""
    name, _, insides = looked
    assert len(insides.x0_steps) == CASES[name][0]
    difference = np.abs(insides.x0_steps[-1].astype(np.int16) - insides.image)
    assert difference.max() <= 1


def test_colour_word_attention_is_higher_on_the_shape_than_on_the_background(looked):
    """Measured: 3.4x (demo) and 9x (demo-mf) at these steps; asserting 2x leaves room for BLAS
    rounding and still fails for a map that ignores the shape (ratio ~1) or a wrong word column."""
    _, model, insides = looked
    shape, background = shape_and_background(insides.image, model.mmjit.config.patch_size)
    assert shape.sum() >= 8 and background.sum() >= 100  # a drawn shape on a background
    red = insides.attention[insides.words.index("red")]
    assert red[shape].mean() > 2 * red[background].mean()


def test_words_and_attention_shapes(looked):
    _, model, insides = looked
    grid = 64 // model.mmjit.config.patch_size
    assert insides.words == PROMPT.split()
    assert insides.attention.shape == (len(insides.words), grid, grid) and insides.attention.dtype == np.float32
    # The words' shares are part of each patch's row, which sums to 1 over all keys.
    assert insides.attention.min() >= 0 and insides.attention.sum(axis=0).max() < 1


def step_state(model, name: str):
    """(runner, request, x, context, mask) of the noise at step 0 of the demo prompt."""
    steps, guidance, _ = CASES[name]
    config = model.mmjit.config
    request = Request(PROMPT, steps=steps, cfg_scale=guidance, width=64, height=64, seed=SEED,
                      guidance_interval=sampling_defaults(model).get("guidance_interval"))
    runner = make_runner(model)
    ids, mask = model.tokenizer([PROMPT])
    return runner, request, initial_noise(SEED, 1, config.in_channels, 64, 64), runner.encode(ids, mask), mask


def test_attention_rows_are_probabilities_over_all_keys(looked):
    """Each weight is a softmax output, >= 0; a row of K = T + N keys sums to 1 within K float32
    roundings of the summands and the normaliser (K * 2^-24 relative), K = 272 (demo) or 292
    (student) -> 2e-5."""
    name, model, _ = looked
    runner, request, x, context, mask = step_state(model, name)
    stages, _ = predictions(model, runner, request, 0, x, context, mask)
    weights = block_attention(runner, stages, BLOCK, 64, 64)
    keys = weights.shape[-1]
    assert weights.shape == (1, model.mmjit.config.num_heads, keys, keys)
    assert weights.min() >= 0
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=0, atol=keys * 2.0**-24)


def test_recomputed_block_inputs_and_tables_give_the_forwards_block_output(looked):
    """The block's inputs and RoPE tables as `insides` rebuilds them run the block to exactly what the
    forward reported (same functions, same float32 inputs: bit for bit); a wrong stage, or the
    student's prefix rows rotated, would change it."""
    name, model, _ = looked
    runner, request, x, context, mask = step_state(model, name)
    stages, _ = predictions(model, runner, request, 0, x, context, mask)
    config = model.mmjit.config
    img, txt = block_inputs(stages, BLOCK, config)
    rope = block_rope(config, txt.shape[1], 16, 16, img.dtype)
    out, _ = double_block(img, txt, runner.mmjit_params["double_blocks"][BLOCK], rope, config)
    np.testing.assert_array_equal(out, stages[f"double.{BLOCK}.img"])


def test_guided_prediction_mixes_cond_and_uncond():
    """The base sampler's x0 at a step is uncond + s (cond - uncond). With s = 2 and pixels floored
    (`to_pixels`), g - 2c + u lies in (-2, 2) for exact predictions; the separate batch-1
    forwards differ from the sampler's batch-2 one by float32 roundings far below a level, so
    |g - 2c + u| <= 2 where no value is clipped at 0 or 255, and cond != uncond."""
    model = load_model(*demo_model("demo")[:2])
    insides = look_inside(model, PROMPT, seed=SEED, steps=4, guidance_scale=2.0, width=64, height=64, step=1,
                          block=0)
    g, c, u = (a.astype(np.int16) for a in (insides.x0_steps[1], insides.cond_x0, insides.uncond_x0))
    inside = (np.minimum(np.minimum(g, c), u) > 0) & (np.maximum(np.maximum(g, c), u) < 255)
    assert inside.mean() > 0.9
    assert np.abs(g - 2 * c + u)[inside].max() <= 2
    assert np.abs(c - u).max() > 50  # the prompt changes the prediction


@pytest.mark.parametrize(("where", "message"), [({"step": 4}, "step 4 is outside 0..3"),
                                                ({"block": -1}, "block -1 is outside 0..3"),
                                                ({"step": 1.5}, "step 1.5 is outside")])
def test_step_or_block_outside_the_run_is_one_line(where, message):
    model = load_model(*demo_model("demo")[:2])
    chosen = {"step": 0, "block": 0} | where
    with pytest.raises(MiniT2IError, match=message):
        look_inside(model, PROMPT, seed=SEED, steps=4, guidance_scale=2.0, width=64, height=64, **chosen)


@pytest.mark.parametrize(("max_length", "expected"), [
    (16, [("a", [0]), ("red", [1]), ("circle", [2, 3]), ("a", [4])]),
    (4, [("a", [0]), ("red", [1]), ("ci", [2])]),  # cut to 3 pieces + </s>: what the model reads
])
def test_word_positions_gather_each_words_pieces(max_length, expected):
    """A word of several pieces (T5's unigram splits "circle" here) is all its positions; a word
    the length limit cuts is the text of its pieces that remain, and `</s>` and padding belong to
    no word."""
    pieces = [("\u2581a", -1.0), ("\u2581red", -1.0), ("\u2581ci", -2.0), ("rcle", -2.0)]
    tokenizer = PromptTokenizer(make_t5_style_tokenizer(pieces), max_length)
    assert tokenizer.word_positions("a red  circle a") == expected


def test_looking_again_at_a_kept_run_gives_what_a_fresh_look_gives():
    """The explore page's selectors: one run kept, then another step and block looked at from it,
    equal what `look_inside` computes with that step and block from a new sampling run (the same
    seed, the same float32 states: bit for bit)."""
    from minit2i.insides import look_at, sample_and_keep

    model = load_model(*demo_model("demo")[:2])
    runner = make_runner(model)
    request = Request(PROMPT, steps=6, cfg_scale=2.0, width=64, height=64, seed=SEED)
    run = sample_and_keep(model, request, runner, runner)
    assert run.states.shape == (7, 3, 64, 64) and run.x0s.shape == (6, 3, 64, 64)
    for step, block in ((1, 0), (4, 2)):
        again = look_at(model, runner, run, step, block)
        fresh = look_inside(model, PROMPT, seed=SEED, steps=6, guidance_scale=2.0, width=64, height=64, step=step,
                            block=block)
        np.testing.assert_array_equal(again.attention, fresh.attention)
        np.testing.assert_array_equal(again.cond_x0, fresh.cond_x0)
        np.testing.assert_array_equal(again.uncond_x0, fresh.uncond_x0)
        np.testing.assert_array_equal(again.x0_steps[step], fresh.x0_steps[step])


def test_the_velocity_panel_points_from_the_state_to_its_prediction():
    """The base sampler's step is x + f (x0 - x), so the move it makes is x0 - x_t scaled: the panel
    (the move on its own scale) is `to_pixels` of (x0 - x_t) / max|x0 - x_t|, up to the float32
    rounding of the step and a pixel level's floor: within 1 level."""
    from minit2i.core.images import to_pixels
    from minit2i.insides import sample_and_keep, step_pictures

    model = load_model(*demo_model("demo")[:2])
    runner = make_runner(model)
    run = sample_and_keep(model, Request(PROMPT, steps=6, cfg_scale=2.0, width=64, height=64, seed=SEED), runner,
                          runner)
    for step in (0, 3):
        state, x0, velocity = step_pictures(run, step)
        np.testing.assert_array_equal(state, to_pixels(run.states[step][None])[0])
        np.testing.assert_array_equal(x0, to_pixels(run.x0s[step][None])[0])
        toward = run.x0s[step] - run.states[step]
        expected = to_pixels((toward / np.abs(toward).max())[None])[0]
        assert np.abs(velocity.astype(np.int16) - expected).max() <= 1
        assert np.abs(velocity.astype(np.int16) - state).mean() > 10  # not the state again


def test_a_run_too_large_to_keep_is_refused_in_one_line_before_sampling():
    """2 steps + 1 float32 pictures: B/16's 100 steps at 512 x 512 keep 201 x 3 x 512 x 512 x 4 bytes =
    603 MiB, over the 256 MiB bound; the demo's 20 at 64 x 64, 1.9 MiB, fit."""
    from minit2i.insides import KEPT_RUN_LIMIT, check_kept_size, kept_bytes

    big = Request(PROMPT, steps=100, width=512, height=512)
    assert kept_bytes(big, 3) == 201 * 3 * 512 * 512 * 4 > KEPT_RUN_LIMIT
    with pytest.raises(MiniT2IError) as refused:
        check_kept_size(big, 3)
    assert str(refused.value) == ("keeping every step of this run (100 steps at 512 x 512) takes 603.0 MiB, over the "
                                  "page's 256.0 MiB per run; choose fewer steps or a smaller size")
    check_kept_size(Request(PROMPT, steps=20, width=64, height=64), 3)
