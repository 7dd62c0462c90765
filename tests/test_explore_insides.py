"""`minit2i.insides`: one generation seen from inside, on the demo models (what `minit2i explore` shows)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from minit2i.cli import main
from minit2i.core.errors import MiniT2IError
from minit2i.demo_models import demo_model
from minit2i.insides import block_attention, block_inputs, block_rope, look_inside, predictions
from minit2i.pipeline import Request, load_model, make_runner, sampling_defaults
from minit2i.reference.mmjit import double_block
from minit2i.reference.sampler import initial_noise

PROMPT = "a large red circle at the left on a gray background"
SEED = 1
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


def generated_png(tmp_path, capsys, name: str) -> np.ndarray:
    """The pixels `minit2i generate` writes for the demo prompt with the model's CASES settings."""
    steps, guidance, _ = CASES[name]
    output = tmp_path / "generated.png"
    code = main(["generate", "-p", PROMPT, "--model", name, "-s", str(SEED), "--steps", str(steps),
                 "--cfg-scale", str(guidance), "-q", "-o", str(output)])
    assert code == 0, capsys.readouterr().err
    with Image.open(output) as image:
        return np.asarray(image.convert("RGB"))


def shape_and_background(image: np.ndarray, patch: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean [grid_h, grid_w] masks of the patches wholly inside the drawn shape and wholly in the
    background: a pixel belongs to the shape when a channel is more than 40 levels from the image's
    median colour (the background fills most of the demo pictures; the shapes' colours differ from
    it by 60 levels or more in some channel, docs/demo-model.md)."""
    height, width, _ = image.shape
    median = np.median(image.reshape(-1, 3), axis=0)
    far = (np.abs(image.astype(np.int16) - median).max(axis=-1) > 40)
    patches = far.reshape(height // patch, patch, width // patch, patch).transpose(0, 2, 1, 3)
    patches = patches.reshape(height // patch, width // patch, -1)
    return patches.all(axis=-1), ~patches.any(axis=-1)


def test_final_image_is_the_generate_commands(looked, tmp_path, capsys):
    name, _, insides = looked
    np.testing.assert_array_equal(insides.image, generated_png(tmp_path, capsys, name))


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
