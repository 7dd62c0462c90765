# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # One prompt through MiniT2I, stage by stage
#
# This notebook follows one prompt through the demo model that ships with the package (64 x 64
# pixels, 4 x 4 patches, a two-block T5, four double blocks, 20 sampler steps, guidance 2.0) on a
# CPU, calling the NumPy reference's own functions at every stage. Every figure is computed here,
# from the model. Read it beside the spec, [docs/model.md](../docs/model.md), and the
# [reading guide](../docs/reading-guide.md), which gives the shapes of the released B/16 model
# for the same stages.
#
# The `.py` file is the source (jupytext "percent" format); the `.ipynb` is built from it, see
# [notebooks/README.md](README.md).

# %%
import warnings

import matplotlib.pyplot as plt
import numpy as np

from minit2i.core.images import to_pixels
from minit2i.core.threads import use_blas_threads
from minit2i.core.weights import nest
from minit2i.demo_models import DEMO_MODEL_DIR
from minit2i.pipeline import load_model, make_request, run_threads, sampling_defaults
from minit2i.reference import layers, mmjit, sampler, t5

# huggingface_hub's progress bars (unused: the demo model is local) ask for ipywidgets in Jupyter.
warnings.filterwarnings("ignore", message="IProgress not found")

PROMPT = "a large red circle at the left on a gray background"
SEED = 42

folder = DEMO_MODEL_DIR
model = load_model(folder / "transformer", folder / "t5")
config, t5_config = model.mmjit.config, model.t5.config
mmjit_params, t5_params = nest(model.mmjit.tensors), nest(model.t5.tensors)
settings = sampling_defaults(model)
# NumPy's matrix products on as many threads as this model's size pays for, as `generate` runs
# them: one for the demo model (more would wait on each other; docs/benchmarks.md, BLAS threads).
use_blas_threads(run_threads(make_request(model, PROMPT, {}), model))
print(config)
print(settings)


# %% [markdown]
# A few drawing helpers: `to_pixels` is the pipeline's own conversion from the model's [-1, 1]
# range to bytes (model.md 4.6).

# %%
def as_picture(image):
    """[C, H, W] in the model's range -> uint8 [H, W, C], as the pipeline writes PNGs."""
    return to_pixels(image[None])[0]


def heat_map(axis, values, title, **style):
    axis.imshow(values, **style)
    axis.set_title(title, fontsize=9)
    axis.set_xticks([])
    axis.set_yticks([])


def picture(axis, image, title):
    heat_map(axis, as_picture(image), title)


# %% [markdown]
# ## 1. Tokens and mask (model.md 5)
#
# The tokenizer appends `</s>` and pads to the model's `prompt_length` (16 here, 256 in the
# released model). The mask is 1 on real tokens and `</s>`, 0 on padding; MMJiT uses it only to
# replace padded positions by `mask_token` (model.md 3.2).

# %%
ids, mask = model.tokenizer([PROMPT])
pieces = [model.tokenizer.tokenizer.id_to_token(int(i)) for i in ids[0]]
for position, (piece, token_id, kept) in enumerate(zip(pieces, ids[0], mask[0])):
    print(f"{position:2d}  {piece:12s} id {token_id:2d}  mask {kept:.0f}")

# %%
fig, axis = plt.subplots(figsize=(10, 1.6))
axis.imshow(mask, cmap="Greys", vmin=-0.5, vmax=1.5)
axis.set_xticks(range(len(pieces)), [f"{p}\n{i}" for p, i in zip(pieces, ids[0])], fontsize=8)
axis.set_yticks([0], ["mask"])
axis.set_title("token pieces, ids and mask (dark = 1)", fontsize=9)
plt.show()

# %% [markdown]
# ## 2. T5 states (model.md 6)
#
# [`t5_encode`](../reference/t5.py) runs once per prompt; its `on_layer` hook (the one the
# divergence tracer uses) hands us every block's output on the way. Padded positions still get
# states (T5 masks them as keys, not as queries), and MMJiT replaces them anyway.

# %%
t5_blocks = {}
context = t5.t5_encode(t5_params, t5_config, ids, mask, on_layer=t5_blocks.__setitem__)
print("context", context.shape, "blocks seen:", list(t5_blocks))


def cosine_similarity(states):
    """[L, D] -> [L, L] cosine similarity of every pair of token states."""
    unit = states / np.linalg.norm(states, axis=-1, keepdims=True)
    return unit @ unit.T


fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [2.2, 1]})
left.imshow(context[0], aspect="auto", cmap="RdBu_r", vmin=-3, vmax=3)
left.set_yticks(range(len(pieces)), pieces, fontsize=8)
left.set_xlabel("feature (d_model = 128)")
left.set_title("T5 output, one row per token", fontsize=9)
right.imshow(cosine_similarity(context[0]), cmap="viridis", vmin=-1, vmax=1)
right.set_xticks(range(len(pieces)), pieces, fontsize=7, rotation=90)
right.set_yticks(range(len(pieces)), pieces, fontsize=7)
right.set_title("cosine similarity of token states", fontsize=9)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3. Where we are going: the sampler (model.md 4)
#
# Before opening the denoiser, run the whole sampler once through the package's Python API,
# [`MiniT2IPipeline`](../minit2i/api.py) (the same code as `minit2i generate`), keeping the state x
# after every step and the guided x0 each step aimed at: its `callback_on_step_end`, as in
# diffusers. The states before each step are also the inputs we will feed the network ourselves
# below; the first is the seed's noise, [`initial_noise`](../reference/sampler.py).

# %%
from minit2i import MiniT2IPipeline  # noqa: E402

pipe = MiniT2IPipeline.from_pretrained("demo")
pipe.set_progress_bar_config(disable=True)


def run_sampler(cfg_scale, seed=SEED):
    """(the states: the noise, then the state after every step; guided x0 of every step, t of every step)."""
    steps = []

    def keep(pipe, step_index, timestep, tensors):
        steps.append((timestep, tensors["latents"], tensors["x0"]))

    pipe(PROMPT, guidance_scale=cfg_scale, generator=seed, callback_on_step_end=keep)
    noise = sampler.initial_noise(seed, 1, config.in_channels, settings["height"], settings["width"])
    return [noise] + [x for _, x, _ in steps], [x0 for _, _, x0 in steps], [t for t, _, _ in steps]


states, guided, times = run_sampler(settings["cfg_scale"])
fig, axis = plt.subplots(figsize=(3, 3))
picture(axis, states[-1][0], PROMPT.replace(" at ", "\nat "))
plt.show()

# %% [markdown]
# ## 4. Patchify, shown as a picture (model.md 3.3)
#
# [`patchify`](../reference/layers.py) cuts the image into 4 x 4 patches, row by row, and flattens
# each one channel-slowest: the 48 numbers of a token are the 16 red pixels, then the 16 green,
# then the 16 blue. Below: the image with its 16 x 16 patch grid; the token matrix [256, 48]
# (one row per patch); and one patch's row folded back into its three channel planes.

# %%
image = states[-1]
tokens = layers.patchify(image, config.patch_size)[0]
grid = settings["width"] // config.patch_size
print("image", image.shape, "-> tokens", tokens.shape)

patch_row, patch_col = 8, 3  # a patch inside the circle
token = tokens[patch_row * grid + patch_col]
fig, axes = plt.subplots(1, 5, figsize=(14, 3.4), gridspec_kw={"width_ratios": [1, 0.7, 0.33, 0.33, 0.33]})
picture(axes[0], image[0], "image, 16 x 16 patches of 4 x 4")
for line in np.arange(0, settings["width"] + 1, config.patch_size) - 0.5:
    axes[0].axhline(line, color="white", linewidth=0.3)
    axes[0].axvline(line, color="white", linewidth=0.3)
axes[0].add_patch(plt.Rectangle((patch_col * 4 - 0.5, patch_row * 4 - 0.5), 4, 4, fill=False, color="yellow"))
heat_map(axes[1], tokens, "tokens [256, 48]: R | G | B", aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1)
plane_size = config.patch_size**2
for plane, (name, colours) in enumerate(zip("RGB", ["Reds", "Greens", "Blues"])):
    values = token[plane * plane_size:(plane + 1) * plane_size].reshape(config.patch_size, config.patch_size)
    heat_map(axes[2 + plane], values, f"patch ({patch_row}, {patch_col})\n{name}: features "
             f"{plane * plane_size}-{(plane + 1) * plane_size - 1}", cmap=colours, vmin=-1, vmax=1)
plt.show()

# %% [markdown]
# ## 5. The 2-D sin/cos table (model.md 3.4)
#
# Added once to the image tokens after the patch embed. The column (x) coordinate fills the first
# half of the features, the row (y) coordinate the second: a feature of the first half, folded
# back onto the 16 x 16 grid, varies from left to right only; one of the second half, from top to
# bottom only.

# %%
table = layers.sincos_2d_table(grid, grid, config.hidden_size)
quarter = config.hidden_size // 4
fig, axes = plt.subplots(1, 5, figsize=(15, 3.2), gridspec_kw={"width_ratios": [2, 1, 1, 1, 1]})
heat_map(axes[0], table, f"table [{grid * grid}, {config.hidden_size}]: sin x | cos x | sin y | cos y",
         aspect="auto", cmap="RdBu_r")
for axis, feature in zip(axes[1:], [1, quarter + 4, 2 * quarter + 1, 3 * quarter + 4]):
    part = ["sin(col w)", "cos(col w)", "sin(row w)", "cos(row w)"][feature // quarter]
    heat_map(axis, table[:, feature].reshape(grid, grid), f"feature {feature}: {part}, k={feature % quarter}",
             cmap="RdBu_r", vmin=-1, vmax=1)
plt.show()

# %% [markdown]
# ## 6. RoPE angles (model.md 3.6)
#
# The joint attention rotates q and k by angles that depend on each token's position: text tokens
# by their index (one axis), image tokens by (row, column), **rows first**, the opposite order of
# the sin/cos table. Both position sets start at 0 (`joint_rope` stacks the text table on the
# image one). Below: the text angles [16, 16], the image angles [256, 16], and the cosine of one
# low-frequency row angle and one column angle folded onto the grid.

# %%
text_angles = layers.text_rope_angles(config.prompt_length, config.head_dim)
image_angles = layers.image_rope_angles(grid, grid, config.head_dim)
fig, axes = plt.subplots(1, 4, figsize=(14, 3.4), gridspec_kw={"width_ratios": [1, 1, 1, 1]})
heat_map(axes[0], text_angles, f"text angles {list(text_angles.shape)}", aspect="auto")
heat_map(axes[1], image_angles, f"image angles {list(image_angles.shape)}: rows | cols", aspect="auto")
frequency = 2  # of head_dim / 4 = 8 per axis
heat_map(axes[2], np.cos(image_angles[:, frequency]).reshape(grid, grid), f"cos(row angle {frequency})",
         cmap="RdBu_r", vmin=-1, vmax=1)
heat_map(axes[3], np.cos(image_angles[:, config.head_dim // 4 + frequency]).reshape(grid, grid),
         f"cos(column angle {frequency})", cmap="RdBu_r", vmin=-1, vmax=1)
plt.show()

# %% [markdown]
# ## 7. Joint attention inside one double block (model.md 3.7, 3.10)
#
# A double block attends over the joint sequence [16 text tokens ; 256 image tokens]. Its
# attention is built from two reference functions we can call ourselves:
# [`joint_qkv`](../reference/mmjit.py) (the block's norms and projections, the joint RoPE applied)
# and [`attention_weights`](../reference/layers.py) (the softmax of the scores), whose weights
# [`attention`](../reference/layers.py) then applies to v. The check below proves the weights we
# look at are the ones the block used.
#
# The block's inputs come from [`mmjit_forward`](../reference/mmjit.py)'s `on_layer` hook: the
# input of double block 2 is the output of double block 1. We look at the conditional half at the
# middle of sampling (step 10, t = 0.5), where the shape is already decided.

# %%
BLOCK, STEP = 2, 10
stages = {}
mmjit.mmjit_forward(mmjit_params, config, states[STEP], context, mask, on_layer=stages.__setitem__)
block_img, block_txt = stages[f"double.{BLOCK - 1}.img"], stages[f"double.{BLOCK - 1}.txt"]
rope = layers.joint_rope(config.prompt_length, grid, grid, config.head_dim)
q, k, v = mmjit.joint_qkv(block_img, block_txt, mmjit_params["double_blocks"][BLOCK], rope, config)
scale = config.head_dim**-0.5
probabilities = layers.attention_weights(q, k, scale)  # [B, H, 272, 272]
np.testing.assert_allclose(probabilities.sum(axis=-1), 1.0, rtol=1e-5)
np.testing.assert_allclose(probabilities @ v, layers.attention(q, k, v, scale=scale), atol=1e-5)
print("probabilities", probabilities.shape)

# %% [markdown]
# Rows are queries, columns keys. "red → image" is the row of the query "red" over the 256 image
# keys, folded onto the grid: where the word looks. "image → red" is the column of the key "red"
# over the 256 image queries: which patches look at the word. Averaged over the 4 heads, with the
# x0 the model predicted at this step beside them. In this block "red" and the patches of the
# disc look at each other; "circle" looks at the lower edge of the disc, and is looked at by the
# background around it (a map of uniform speckle here would mean a wrong block input or RoPE).

# %%
length = config.prompt_length
words = {word: pieces.index(word) for word in ("red", "circle")}
mean_heads = probabilities[0].mean(axis=0)
fig, axes = plt.subplots(1, 5, figsize=(15, 3.2))
picture(axes[0], guided[STEP][0], f"guided x0 at step {STEP}")
for column, (word, position) in enumerate(words.items()):
    heat_map(axes[1 + 2 * column], mean_heads[position, length:].reshape(grid, grid), f'"{word}" → image patches')
    heat_map(axes[2 + 2 * column], mean_heads[length:, position].reshape(grid, grid), f'image patches → "{word}"')
plt.show()

# %% [markdown]
# The whole joint matrix of each head, on a log scale: the four blocks text→text, text→image,
# image→text and image→image are visible as the bands at the top and the left.

# %%
fig, axes = plt.subplots(1, config.num_heads, figsize=(15, 3.8))
for head, axis in enumerate(axes):
    heat_map(axis, np.log10(probabilities[0, head] + 1e-6), f"head {head}: log10 P [272, 272]", vmin=-6, vmax=0)
    axis.axhline(length - 0.5, color="white", linewidth=0.5)
    axis.axvline(length - 0.5, color="white", linewidth=0.5)
plt.show()

# %% [markdown]
# ## 8. x0, velocity and x_t at every step (model.md 4.3, 4.4)
#
# At step i the network predicts x0 (guided, model.md 4.5), the sampler turns it into a velocity
# v = (x0 - x_t) / max(1 - t, a_min) and takes one Euler step x ← x + dt v. The check below
# rebuilds every state from the velocity; the last step lands on the guided x0. The velocity
# tiles are each scaled to their own range (|v| grows as 1 - t shrinks); early on v is mostly the
# noise still to be removed, with the disc showing through.

# %%
dt = 1.0 / settings["steps"]
velocities = [(x0 - x) / max(1.0 - t, sampler.DEFAULT_A_MIN) for x0, x, t in zip(guided, states, times)]
for before, after, velocity in zip(states, states[1:], velocities):
    np.testing.assert_allclose(after, before + dt * velocity, atol=1e-4)

fig, axes = plt.subplots(3, settings["steps"], figsize=(20, 3.6))
for step in range(settings["steps"]):
    velocity = velocities[step][0]
    picture(axes[0, step], states[step + 1][0], f"t={times[step] + dt:.2f}")
    picture(axes[1, step], guided[step][0], "")
    picture(axes[2, step], velocity / np.abs(velocity).max(), "")
for row, name in enumerate(["x_t after", "guided x0", "velocity"]):
    axes[row, 0].set_ylabel(name, fontsize=9)
plt.subplots_adjust(wspace=0.05, hspace=0.15)
plt.show()

# %% [markdown]
# ## 9. The effect of guidance (model.md 4.5)
#
# Same seed, same prompt, three guidance scales. s = 0 is the unconditional prediction alone, made
# with an all-zero mask (every text token replaced by `mask_token`): the model draws some shape
# that ignores the prompt. The demo model's own 2.0 follows the prompt; a strong 7.0 overshoots
# (saturated colours, a halo at the edge). Guidance pushes each step away from the unconditional
# prediction: x0_u + s (x0_c - x0_u).

# %%
scales = (0.0, settings["cfg_scale"], 7.0)
fig, axes = plt.subplots(1, len(scales), figsize=(9, 3.3))
for axis, scale_value in zip(axes, scales):
    picture(axis, run_sampler(scale_value)[0][-1][0], f"guidance {scale_value}")
plt.show()

# %% [markdown]
# ## 10. Four steps instead of twenty: the Mean Flow student (model.md 9)
#
# The package also ships a student distilled from this model (`--model demo-mf`): the same
# trunk, plus a prefix of 20 tokens in front of the text that carries the step length h = t - r,
# the guidance scale omega and the guidance interval (model.md 9.1). It needs no unconditional
# branch and no small steps: the network itself predicts where a step of length h lands, with
# guidance already applied. Its sampler runs time the other way (t = 1 is noise, model.md 9.4),
# each step moving z onto the predicted x0 by the factor (t - r) / t; the last factor is 1, so
# the image is the last x0. Same prompt, same seed (same starting noise) as the base model, through
# the same API: `from_pretrained("demo-mf")` runs
# [`sample_mean_flow`](../reference/mean_flow_sampler.py).

# %%
student = MiniT2IPipeline.from_pretrained("demo-mf")
student.set_progress_bar_config(disable=True)
student_settings = sampling_defaults(student.model)
print("prefix tokens:", student.model.mmjit.config.num_aux_tokens, "| settings:", student_settings)

student_steps = []  # (t, z after the step, x0) of each step
student(PROMPT, generator=SEED, callback_on_step_end=lambda pipe, index, t, tensors: student_steps.append(
    (t, tensors["latents"], tensors["x0"])))
noise = sampler.initial_noise(SEED, 1, config.in_channels, settings["height"], settings["width"])
# The last factor is exactly 1: z + 1 (x0 - z) is x0 up to the float32 rounding of the two operations.
np.testing.assert_allclose(student_steps[-1][1], student_steps[-1][2], atol=1e-6)

fig, axes = plt.subplots(2, len(student_steps) + 1, figsize=(12, 5))
picture(axes[0, 0], noise[0], "noise, t = 1")
picture(axes[1, 0], states[-1][0], "base model, 20 steps")
for i, (t, z, x0) in enumerate(student_steps):
    r = max(t - 1 / len(student_steps), 0.0)
    picture(axes[0, i + 1], z[0], f"z after step {i + 1}, t = {r:.2f}")
    picture(axes[1, i + 1], x0[0], f"x0 at t = {t:.2f}")
plt.show()
