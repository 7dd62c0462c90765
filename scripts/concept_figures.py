"""Draw the figures of docs/concepts.md (matplotlib, the `docs` extra; run from the repository root):

    python scripts/concept_figures.py          # writes every concept-*.png into docs/figures/

Every picture is computed by the project's own functions: the two samplers
(reference/sampler.py, reference/mean_flow_sampler.py), first on a 2-D toy whose exact answer is
known, then on the demo models through the pipeline; the position tables of reference/layers.py;
and `minit2i.insides.look_inside` for what happens inside one step (attention per word, the
conditional and unconditional predictions).
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from make_figures import FIGURES, load_demo  # noqa: E402
from minit2i.core.files import write_atomically  # noqa: E402
from minit2i.core.images import to_pixels  # noqa: E402
from minit2i.insides import (  # noqa: E402
    block_inputs,
    block_rope,
    inside_request,
    look_inside,
    predictions,
    sample_and_keep,
)
from minit2i.reference.mmjit import joint_qkv  # noqa: E402
from minit2i.pipeline import Request, generate, sampling_defaults  # noqa: E402
from minit2i.reference import layers, mean_flow_sampler, sampler  # noqa: E402

PROMPT = "a large red circle at the left on a gray background"
SEED = 42
# The toy's data: five 2-D "images" on a ring; its noise is the model's, 2 N(0, I) (sampler.NOISE_SCALE).
TOY_DATA = 1.6 * np.stack([np.sin(np.arange(5) * 2 * np.pi / 5), np.cos(np.arange(5) * 2 * np.pi / 5)], axis=1)
TOY_COUNT = 300
FINE_STEPS = 400  # the toy's exact trajectories: Euler steps this small leave no visible error
DATA_COLOUR, NOISE_COLOUR, PATH_COLOUR = "#d62728", "#9a9a9a", "#1f77b4"


# ---------------------------------------------------------------------------------------------
# The 2-D toy: noise 2 N(0, I) in the plane, data five points. Its best x0 prediction is known
# exactly (the mean of the data points weighted by how likely each is to have given x_t), so the
# samplers can run on the ideal network.


def toy_logits(x, t: float, data=TOY_DATA):
    """[N, 2] points x_t -> [N, len(data)] log p_t(x_t | data point) up to one constant: x_t = t x +
    (1 - t) n with n ~ 2 N(0, I) makes x_t Gaussian around t x, of spread 2 (1 - t)."""
    spread = sampler.NOISE_SCALE * (1.0 - t)
    return -((x[:, None, :] - t * data[None]) ** 2).sum(-1) / (2 * spread**2)


def exact_x0(x, t: float, data=TOY_DATA):
    """[N, 2] points x_t at time t (base convention: 0 noise, 1 data) -> [N, 2] the posterior mean
    of the data point, the data points weighted by how likely each is to have given x_t."""
    logits = toy_logits(x, t, data)
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (weights / weights.sum(axis=1, keepdims=True)) @ data


def toy_noise(count: int = TOY_COUNT):
    """[count, 2, 1, 1]: the model's initial noise for 2-D points (two channels of a 1 x 1 image)."""
    return sampler.initial_noise(SEED, count, 2, 1, 1)


def toy_denoiser(steps: int):
    """The ideal network for `sampler.sample`: x [B, 2, 1, 1] -> x0 [B, 2, 1, 1]. The real network
    reads how noisy its input is off the input; the toy's exact x0 needs t, so it counts the calls
    (one per step, in order). It ignores the prompt: guidance changes nothing here."""
    times = iter(sampler.time_grid(steps))

    def denoise(x, context, mask):
        return exact_x0(x[:, :, 0, 0], next(times))[:, :, None, None]

    return denoise


def toy_trajectories(steps: int, count: int = TOY_COUNT):
    """[steps + 1, count, 2]: the base sampler on the ideal network, from the noise to the end."""
    noise = toy_noise(count)
    states = [noise]
    sampler.sample(toy_denoiser(steps), noise, np.zeros((count, 1, 1)), np.ones((count, 1)), steps, 1.0,
                   callback=lambda info: states.append(info.x))
    return np.stack(states)[:, :, :, 0, 0]


def toy_axes(axis, title: str):
    axis.scatter(*TOY_DATA.T, s=60, c=DATA_COLOUR, zorder=5, label="data")
    axis.set_xlim(-5, 5)
    axis.set_ylim(-5, 5)
    axis.set_aspect("equal")
    axis.set_xticks([])
    axis.set_yticks([])
    axis.set_title(title, fontsize=10)


def draw_paths(axis, trajectories, count: int = 60):
    for path in np.swapaxes(trajectories, 0, 1)[:count]:
        axis.plot(*path.T, color=PATH_COLOUR, linewidth=0.6, alpha=0.6)
        axis.plot(*path[-1], "o", color=PATH_COLOUR, markersize=2.5)


def flow_toy_figure():
    """Training pairs on straight lines; the exact velocity field at t = 0.5; the Euler sampler on
    the ideal network with 3 and with 50 steps."""
    figure, axes = plt.subplots(1, 4, figsize=(16, 4.4))
    noise = toy_noise()[:, :, 0, 0]
    pairs = TOY_DATA[np.random.default_rng(SEED).integers(0, len(TOY_DATA), len(noise))]
    toy_axes(axes[0], "training: straight lines noise -> data,\nx_t = t x + (1 - t) n")
    for start, end in zip(noise[:40], pairs[:40]):
        axes[0].plot(*np.stack([start, end]).T, color=NOISE_COLOUR, linewidth=0.7)
    axes[0].scatter(*noise[:40].T, s=8, c=NOISE_COLOUR)
    axes[0].scatter(*(0.5 * noise + 0.5 * pairs)[:40].T, s=8, c=PATH_COLOUR, label="x_t at t = 0.5")
    axes[0].legend(loc="lower left", fontsize=8)

    t = 0.5
    grid = np.stack(np.meshgrid(np.linspace(-4.5, 4.5, 19), np.linspace(-4.5, 4.5, 19)), axis=-1).reshape(-1, 2)
    velocity = (exact_x0(grid, t) - grid) / (1.0 - t)
    toy_axes(axes[1], "the velocity field at t = 0.5:\nv = (x0 - x_t) / (1 - t), x0 the best guess")
    axes[1].quiver(*grid.T, *velocity.T, color=PATH_COLOUR, angles="xy", scale_units="xy", scale=4, width=0.004)
    for axis, steps, verdict in ((axes[2], 3, "lands on averages of the data"), (axes[3], 50, "lands on the data")):
        toy_axes(axis, f"Euler sampler, {steps} steps:\n{verdict}")
        draw_paths(axis, toy_trajectories(steps))
    return figure


def mean_flow_toy_figure():
    """One exact trajectory with the instantaneous velocity (the tangent) and the average velocity
    over [r, t] (the secant) in the student's time; then four Euler steps of the base sampler beside
    four steps of a student that predicts the average velocity exactly."""
    fine = toy_trajectories(FINE_STEPS)
    figure, axes = plt.subplots(1, 3, figsize=(13.5, 4.6))
    t, r = 0.6, 0.0
    # Student time t (1 = noise) is base time 1 - t: the fine grid's indices of t and r.
    start, end = round((1.0 - t) * FINE_STEPS), round((1.0 - r) * FINE_STEPS)
    tangents = (fine[start + 1] - fine[start]) * FINE_STEPS  # dz per unit of time, [N, 2]
    secants = (fine[end] - fine[start]) / (t - r)
    # Of the paths that start inside the picture and travel far, the one whose tangent turns most
    # away from its secant.
    turn = np.linalg.norm(tangents / np.linalg.norm(tangents, axis=1, keepdims=True)
                          - secants / np.linalg.norm(secants, axis=1, keepdims=True), axis=1)
    shown = (np.abs(fine[start]).max(axis=1) < 4) & (np.linalg.norm(fine[end] - fine[start], axis=1) > 2)
    chosen = np.argmax(np.where(shown, turn, -1.0))
    path = fine[:, chosen]
    toy_axes(axes[0], f"student time: t = 1 noise, t = 0 data;\none step from t = {t:g} to r = {r:g}")
    axes[0].plot(*path[:end + 1].T, color=PATH_COLOUR, linewidth=1.2)
    z_t, z_r = path[start], path[end]
    for finish, colour, label in ((z_t + (t - r) * tangents[chosen], "#ff7f0e",
                                   "a step along the instantaneous velocity at t"),
                                  (z_r, "#2ca02c", "a step along the average velocity over [r, t]")):
        axes[0].annotate("", finish, z_t, arrowprops={"arrowstyle": "->", "color": colour, "linewidth": 2})
        axes[0].plot([], [], color=colour, linewidth=2, label=label)
    axes[0].plot(*np.stack([z_t, z_r]).T, "ko", markersize=4)
    axes[0].legend(loc="upper left", fontsize=8)

    toy_axes(axes[1], "base sampler, 4 Euler steps\n(instantaneous velocity)")
    draw_paths(axes[1], toy_trajectories(4))
    toy_axes(axes[2], "Mean Flow sampler, 4 steps\n(a student that predicts the average velocity)")
    draw_paths(axes[2], student_trajectories(fine, 4))
    return figure


def student_trajectories(fine, steps: int):
    """[steps + 1, N, 2]: `sample_mean_flow` on a perfect student, one whose x0 makes each step land
    where the exact trajectory `fine` [FINE_STEPS + 1, N, 2] is at the end of the step (the average
    velocity over the step, times its length)."""
    stride = FINE_STEPS // steps
    factors = iter(enumerate(mean_flow_sampler.mean_flow_step_factors(steps)))

    def denoise(z, h, omega, t_min, t_max, context, mask):
        i, factor = next(factors)
        z_r = fine[(i + 1) * stride][:, :, None, None]
        return z + (z_r - z) / factor  # the x0 whose step z + f (x0 - z) lands on z_r

    noise = toy_noise(fine.shape[1])
    states = [noise]
    mean_flow_sampler.sample_mean_flow(denoise, noise, np.zeros((len(noise), 1, 1)), np.ones((len(noise), 1)),
                                       steps, 1.0, (0.0, 1.0), callback=lambda info: states.append(info.x))
    return np.stack(states)[:, :, :, 0, 0]


def a_min_figure():
    """1 / (1 - t) against its floored versions, and the step factors of `step_factors` over the
    last steps of a 100-step run with either floor."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    remaining = np.logspace(0, -5, 400)  # 1 - t, from noise (1) to almost data (1e-5)
    left.plot(remaining, 1.0 / remaining, color="black", label="1 / (1 - t): infinite at t = 1")
    for a_min, style in ((0.05, "--"), (sampler.DEFAULT_A_MIN, ":")):
        left.plot(remaining, 1.0 / np.maximum(remaining, a_min), style, linewidth=2.5, label=f"1 / max(1 - t, {a_min})")
    left.set_xscale("log")
    left.set_yscale("log")
    left.invert_xaxis()
    left.set_xlabel("1 - t (t = 0 noise on the left, t -> 1 data on the right)")
    left.set_title("the factor that turns x0 - x_t into a velocity", fontsize=10)
    left.legend(fontsize=8)
    steps, last = 100, 10
    for a_min, marker in ((sampler.DEFAULT_A_MIN, "o"), (0.05, "s")):
        right.plot(range(steps - last + 1, steps + 1), sampler.step_factors(steps, a_min)[-last:], marker,
                   linestyle="-", label=f"a_min = {a_min}")
    right.set_xlabel(f"step (of {steps})")
    right.set_ylabel("f = dt / max(1 - t, a_min)")
    right.set_title("the share of the way to x0 each Euler step goes", fontsize=10)
    right.legend(fontsize=8)
    return figure


# The toy's condition for guidance: "the upper half", the ring's points with y > 0.
TOY_CLASS = TOY_DATA[:, 1] > 0


def class_log_probability(x, t: float):
    """[N, 2] points x_t -> [N] log p_t(c | x_t) of the toy's class c (TOY_CLASS), every data point
    equally likely: the log of the class's share of the posterior weights."""
    logits = toy_logits(x, t)
    top = logits.max(axis=1, keepdims=True)
    return (np.log(np.exp(logits - top)[:, TOY_CLASS].sum(axis=1)) - np.log(np.exp(logits - top).sum(axis=1)))


def implicit_classifier_gap(t: float = 0.5, count: int = 200, step: float = 1e-5) -> float:
    """The largest difference, over `count` points x_t of the toy's noise at time t, between the
    gradient of log p_t(c | x_t) (central differences of `class_log_probability`) and the
    difference of the conditional and unconditional scores made from the exact x0 predictions,
    grad log p_t(x_t) = (t x0 - x_t) / (2 (1 - t))^2: Bayes' rule says they are one vector."""
    x = toy_noise(count)[:, :, 0, 0] * (1 - t)
    scale = t / (sampler.NOISE_SCALE * (1 - t)) ** 2
    scores = scale * (exact_x0(x, t, TOY_DATA[TOY_CLASS]) - exact_x0(x, t))
    gradient = np.stack([(class_log_probability(x + step * e, t) - class_log_probability(x - step * e, t)) / (2 * step)
                         for e in np.eye(2)], axis=1)
    return float(np.abs(gradient - scores).max() / np.abs(scores).max())


def toy_guided_denoiser(steps: int):
    """`toy_denoiser` with a condition: rows whose mask is set get the exact x0 of TOY_CLASS's points,
    the others (the sampler's unconditional half, an all-zero mask) that of all the points."""
    times = iter(sampler.time_grid(steps))

    def denoise(x, context, mask):
        t = next(times)
        points = x[:, :, 0, 0]
        conditional = mask.any(axis=1)[:, None]
        return np.where(conditional, exact_x0(points, t, TOY_DATA[TOY_CLASS]), exact_x0(points, t))[:, :, None, None]

    return denoise


def guidance_toy_figure(scales=(0.0, 1.0, 3.0), steps: int = 50):
    """The implicit classifier p_t(c | x_t) of the toy's class "upper half" at t = 0.5 with its
    gradient, then the base sampler on the exact network at guidance 0, 1 and 3."""
    figure, axes = plt.subplots(1, 1 + len(scales), figsize=(4.2 * (1 + len(scales)), 4.4))
    t = 0.5
    side = np.linspace(-4.5, 4.5, 91)
    grid = np.stack(np.meshgrid(side, side), axis=-1).reshape(-1, 2)
    toy_axes(axes[0], f"p(c | x_t) at t = {t:g}, c = the upper half,\nand its gradient: what guidance adds")
    axes[0].imshow(np.exp(class_log_probability(grid, t)).reshape(len(side), len(side)), origin="lower",
                   extent=(-4.5, 4.5, -4.5, 4.5), cmap="RdBu", vmin=0, vmax=1, alpha=0.6)
    coarse = grid.reshape(len(side), len(side), 2)[::10, ::10].reshape(-1, 2)
    step = 1e-5
    gradient = np.stack([(class_log_probability(coarse + step * e, t) - class_log_probability(coarse - step * e, t))
                         / (2 * step) for e in np.eye(2)], axis=1)
    axes[0].quiver(*coarse.T, *gradient.T, color="black", angles="xy", scale_units="xy", scale=3, width=0.004)
    axes[0].set_xlabel(f"grad log p(c | x_t) against the score difference of the\nexact predictions: largest gap "
                       f"{implicit_classifier_gap(t):.0e} of its size", fontsize=8)
    noise = toy_noise()
    for axis, scale in zip(axes[1:], scales):
        states = [noise]
        sampler.sample(toy_guided_denoiser(steps), noise, np.zeros((len(noise), 1, 1)), np.ones((len(noise), 1)),
                       steps, scale, callback=lambda info, states=states: states.append(info.x))
        toy_axes(axis, f"guidance {scale:g}" + {0.0: ": the unconditional field", 1.0: ": the conditional field"}.get(
            scale, ": past the conditional one"))
        draw_paths(axis, np.stack(states)[:, :, :, 0, 0])
    return figure


# ---------------------------------------------------------------------------------------------
# The demo models


def run_demo(name: str, prompt: str = PROMPT, **settings):
    """(the StepInfo of every step, the final uint8 image) of demo model `name` for seed SEED,
    its own defaults overridden by `settings`."""
    model, runner = load_demo(name)
    steps = []
    result = generate(model, runner, Request(prompt, seed=SEED, **(sampling_defaults(model) | settings)),
                      steps.append)
    return steps, result.pixels[0]


def picture(axis, image, title: str = ""):
    """Show a [C, H, W] array in the model's range or a uint8 [H, W, 3] image."""
    axis.imshow(image if image.dtype == np.uint8 else to_pixels(image[None])[0], interpolation="nearest")
    axis.set_xticks([])
    axis.set_yticks([])
    axis.set_title(title, fontsize=9)


def real_sampler_figure(shown=(1, 3, 6, 10, 15, 20)):
    """The demo model's run on PROMPT: the state x_t before the step, the guided x0 it predicts and
    the velocity (x0 - x_t) / max(1 - t, a_min) (each tile scaled to its own range), at some steps."""
    steps, _ = run_demo("demo")
    before = [sampler.initial_noise(SEED, 1, 3, *steps[0].x.shape[2:])[0]] + [step.x[0] for step in steps]
    figure, axes = plt.subplots(3, len(shown), figsize=(2 * len(shown), 6.4))
    for column, number in enumerate(shown):
        step = steps[number - 1]
        velocity = (step.x0[0] - before[number - 1]) / max(1.0 - step.t, sampler.DEFAULT_A_MIN)
        picture(axes[0, column], before[number - 1], f"step {number}, t = {step.t:.2f}")
        picture(axes[1, column], step.x0[0])
        picture(axes[2, column], velocity / np.abs(velocity).max())
    for row, label in enumerate(("x_t", "predicted x0", "velocity v")):
        axes[row, 0].set_ylabel(label, fontsize=10)
    figure.subplots_adjust(wspace=0.05, hspace=0.15)
    return figure


GUIDANCE_PROMPTS = (PROMPT, "a small blue square at the top on a white background")


def guidance_scales_figure(scales=(0.0, 1.0, 2.0, 4.0, 8.0)):
    """The same seed and prompt at several guidance scales (0: the unconditional prediction alone,
    1: the conditional one alone)."""
    figure, axes = plt.subplots(len(GUIDANCE_PROMPTS), len(scales), figsize=(2.2 * len(scales), 4.8))
    for row, prompt in enumerate(GUIDANCE_PROMPTS):
        for column, scale in enumerate(scales):
            picture(axes[row, column], run_demo("demo", prompt, cfg_scale=scale)[1], f"s = {scale:g}")
        axes[row, 0].set_ylabel(prompt.replace(" at ", "\nat ").replace(" on ", "\non "), fontsize=8)
    return figure


# The four-vs-twenty figure's tiles per row: ten 64-pixel states across the concepts page at 1280
# pixels are each shown at least at their own size (tests/test_site.py measures it in a browser).
FOUR_VS_TWENTY_COLUMNS = 10


def four_vs_twenty_figure(columns: int = FOUR_VS_TWENTY_COLUMNS):
    """The demo model's 20 Euler steps, `columns` to a row, each row followed by the student's Mean
    Flow states at the same moments of the path (same prompt and seed, so the same noise). Every
    tile is labelled in one time convention, the base sampler's (0 noise, 1 data): the student's
    own clock runs the other way (concepts.md 7), so its time r after a step is shown as 1 - r."""
    base, _ = run_demo("demo")
    student, _ = run_demo("demo-mf")
    stride = len(base) // len(student)
    rows = len(base) // columns
    figure, axes = plt.subplots(2 * rows, columns, figsize=(1.3 * columns, 3.0 * rows))
    for i, step in enumerate(base):
        row, column = divmod(i, columns)
        picture(axes[2 * row, column], step.x[0], f"t = {step.t + 1 / len(base):.2f}")
        axes[2 * row + 1, column].axis("off")
    for i, step in enumerate(student):
        row, column = divmod((i + 1) * stride - 1, columns)
        axes[2 * row + 1, column].axis("on")
        picture(axes[2 * row + 1, column], step.x[0], f"t = {1 - (step.t - 1 / len(student)):.2f}")
    for row in range(rows):
        axes[2 * row, 0].set_ylabel("demo\n20 steps", fontsize=9)
        axes[2 * row + 1, stride - 1].set_ylabel("demo-mf\n4 steps", fontsize=9)
    figure.subplots_adjust(wspace=0.05, hspace=0.35)
    return figure


FEW_STEPS_PROMPTS = (*GUIDANCE_PROMPTS, "a small green cross at the bottom on a navy background")
# (model, steps) of each column: the teacher at few Euler steps and its own 20, the student at 1 and 4.
FEW_STEPS_COLUMNS = (("demo", 1), ("demo", 2), ("demo", 4), ("demo", 20), ("demo-mf", 1), ("demo-mf", 4))


def few_steps_figure():
    """The demo model at 1, 2, 4 and 20 Euler steps beside the student at 1 and 4 Mean Flow steps,
    same prompts, same seed (so the same starting noise), each at its own guidance."""
    figure, axes = plt.subplots(len(FEW_STEPS_PROMPTS), len(FEW_STEPS_COLUMNS),
                                figsize=(1.9 * len(FEW_STEPS_COLUMNS), 2.0 * len(FEW_STEPS_PROMPTS)))
    for row, prompt in enumerate(FEW_STEPS_PROMPTS):
        for column, (name, steps) in enumerate(FEW_STEPS_COLUMNS):
            title = f"{'teacher' if name == 'demo' else 'student'}, {steps} step{'s' * (steps > 1)}" if row == 0 else ""
            picture(axes[row, column], run_demo(name, prompt, steps=steps)[1], title)
        axes[row, 0].set_ylabel(prompt.replace(" at ", "\nat ").replace(" on ", "\non "), fontsize=8)
    figure.subplots_adjust(wspace=0.05, hspace=0.08)
    return figure


def student_guidance_figure(omegas=(1.0, 2.0, 3.0), intervals=((0.0, 1.0), (0.2, 0.8), (0.5, 1.0))):
    """Guidance as an input of the student: which teacher guidance its target used at each time
    for a given interval, then its images at several omega and intervals (same seed, PROMPT)."""
    figure = plt.figure(figsize=(14, 3.2))
    plot = figure.add_axes([0.04, 0.18, 0.22, 0.7])
    t = np.linspace(0.0, 1.0, 501)
    for (t_min, t_max), style in zip(intervals, ("-", "--", ":")):
        inside = (t >= t_min) & (t <= t_max)
        plot.plot(t, np.where(inside, 2.0, 1.0), style, linewidth=2, label=f"interval [{t_min}, {t_max}]")
    plot.set_xlabel("student time t (1 noise, 0 data)")
    plot.set_ylabel("teacher guidance in the target")
    plot.set_yticks([1.0, 2.0], ["1 (none)", "omega"])
    plot.legend(fontsize=7)
    plot.set_title("omega applies inside the interval only", fontsize=9)
    default = sampling_defaults(load_demo("demo-mf")[0])["cfg_scale"]
    cases = [(omega, intervals[0]) for omega in omegas] + [(default, interval) for interval in intervals[1:]]
    for i, (omega, interval) in enumerate(cases):
        axis = figure.add_axes([0.3 + i * 0.14, 0.08, 0.13, 0.8])
        picture(axis, run_demo("demo-mf", cfg_scale=omega, guidance_interval=interval)[1],
                f"omega {omega:g}, [{interval[0]:g}, {interval[1]:g}]")
    return figure


# ---------------------------------------------------------------------------------------------
# Positions


def positions_figure(queries=((8, 8), (3, 12))):
    """For a query patch of the demo model's grid: how alike its sin/cos row is to every patch's
    (cosine similarity), and the RoPE score of the same vector rotated to the query's position
    against it rotated to every patch's: it depends on the offset only, so the map moves with the
    query unchanged."""
    config = load_demo("demo")[0].mmjit.config
    grid = config.image_size // config.patch_size
    table = layers.sincos_2d_table(grid, grid, config.hidden_size)
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    angles = layers.image_rope_angles(grid, grid, config.head_dim)
    ones = np.ones((1, 1, grid * grid, config.head_dim))
    rotated = layers.apply_rope(ones, np.cos(angles), np.sin(angles))[0, 0]
    figure, axes = plt.subplots(1, 2 * len(queries), figsize=(13, 3.4))
    for i, (row, col) in enumerate(queries):
        n = row * grid + col
        for axis, values, name in ((axes[i], unit @ unit[n], "sin/cos table: similarity"),
                                   (axes[len(queries) + i], rotated @ rotated[n] / config.head_dim, "RoPE: q . k")):
            axis.imshow(values.reshape(grid, grid), cmap="viridis")
            axis.plot(col, row, "r+", markersize=12, markeredgewidth=2)
            axis.set_xticks([])
            axis.set_yticks([])
            axis.set_title(f"{name}\nquery patch (row {row}, col {col})", fontsize=9)
    return figure


def text_patch_weights(step: int = 10, block: int = 2, word: str = "red"):
    """(the attention weights the demo model's image patches give `word`'s first token [grid, grid],
    with the joint RoPE and with every rotation by angle 0, both mean over heads; which patches
    the finished picture's shape covers, bool [grid, grid]) at double block `block` and sampling
    step `step` (0-based) of PROMPT, seed SEED: the block's own q and k (`joint_qkv`) and the
    softmax over all its keys (`attention_weights`), computed from its inputs twice."""
    model, runner = load_demo("demo")
    settings = sampling_defaults(model)
    request = inside_request(model, PROMPT, seed=SEED, steps=settings["steps"], guidance_scale=settings["cfg_scale"],
                             width=settings["width"], height=settings["height"], step=step, block=block)
    run = sample_and_keep(model, request, runner, runner)
    stages, _ = predictions(model, runner, request, step, run.states[step][None], run.context, run.mask)
    config = model.mmjit.config
    img, txt = block_inputs(stages, block, config)
    grid = config.image_size // config.patch_size
    rope = block_rope(config, txt.shape[1], grid, grid, img.dtype)
    token = dict(run.words)[word][0]
    maps = []
    for tables in (rope, (np.ones_like(rope[0]), np.zeros_like(rope[1]))):
        q, k, _ = joint_qkv(img, txt, runner.mmjit_params["double_blocks"][block], tables, config)
        weights = layers.attention_weights(q, k, scale=config.head_dim**-0.5)[0, :, txt.shape[1]:, token]
        maps.append(weights.mean(axis=0).reshape(grid, grid))
    return maps[0], maps[1], shape_patches(run.result.pixels[0], config.patch_size)


def shape_patches(pixels: np.ndarray, patch: int, levels: int = 60) -> np.ndarray:
    """bool [H/p, W/p]: the patches of a uint8 [H, W, 3] picture of one shape on a flat background
    where more than half the pixels are over `levels` away from the picture's median colour."""
    away = np.abs(pixels.astype(np.int16) - np.median(pixels.reshape(-1, 3), axis=0)).max(axis=-1) > levels
    h, w = away.shape
    return away.reshape(h // patch, patch, w // patch, patch).mean(axis=(1, 3)) > 0.5


def shape_contrast(weights: np.ndarray, shape: np.ndarray) -> float:
    """How many times more weight a patch of the shape gets than a patch off it, on average."""
    return float(weights[shape].mean() / weights[~shape].mean())


def joint_rope_figure(text_positions=(0, 4, 12)):
    """What a text-patch score depends on under the joint RoPE: a query of ones at every patch
    against a key of ones at text position l (the pure rotation: without RoPE, 1 everywhere);
    then the demo model's attention weights of every patch on "red", with RoPE and without."""
    config = load_demo("demo")[0].mmjit.config
    grid = config.image_size // config.patch_size
    length = max(text_positions) + 1
    cos, sin = layers.joint_rope(length, grid, grid, config.head_dim, np.float64)
    ones = np.ones((1, 1, length + grid * grid, config.head_dim))
    rotated = layers.apply_rope(ones, cos, sin)[0, 0]
    figure, axes = plt.subplots(1, len(text_positions) + 2, figsize=(3.2 * (len(text_positions) + 2), 3.8),
                                layout="constrained")
    for axis, position in zip(axes, text_positions):
        scores = rotated[length:] @ rotated[position] / config.head_dim
        shown = axis.imshow(scores.reshape(grid, grid), cmap="viridis", vmin=-1, vmax=1)
        axis.set_title(f"RoPE only: text position {position}\nagainst every patch", fontsize=9)
    with_rope, without, shape = text_patch_weights()
    high = max(with_rope.max(), without.max())
    for axis, weights, name in ((axes[-2], with_rope, "with RoPE"), (axes[-1], without, "without RoPE")):
        axis.imshow(weights, cmap="magma", vmin=0, vmax=high)
        axis.contour(shape, levels=[0.5], colors="#4fc3f7", linewidths=1)
        axis.set_title(f'demo: attention weight of every patch\non "red", {name} (block 3, step 11)', fontsize=9)
        axis.set_xlabel(f"on the disc (outlined) {shape_contrast(weights, shape):.1f} x off it", fontsize=9)
    for axis in axes:
        axis.set_xticks([])
        axis.set_yticks([])
    figure.colorbar(shown, ax=axes[:len(text_positions)], location="bottom", shrink=0.5)
    return figure


# ---------------------------------------------------------------------------------------------
# Inside one step (minit2i.insides)


def inside_demo(prompt: str, step: int, block: int):
    """`look_inside` the demo model's generation of `prompt` (seed SEED, its own settings) at
    sampling step `step` and double block `block` (both 0-based)."""
    model, _ = load_demo("demo")
    settings = sampling_defaults(model)
    return look_inside(model, prompt, seed=SEED, steps=settings["steps"], guidance_scale=settings["cfg_scale"],
                       width=settings["width"], height=settings["height"], step=step, block=block)


def attention_figure(prompts=GUIDANCE_PROMPTS, step=10, block=2, columns=6):
    """Per word of each prompt: how much attention the image patches pay to it (demo model,
    conditional pass), after the final image, `columns` panels a row."""
    insides = [inside_demo(prompt, step, block) for prompt in prompts]
    rows = [-(-(1 + len(inside.words)) // columns) for inside in insides]
    figure, axes = plt.subplots(sum(rows), columns, figsize=(1.7 * columns, 1.9 * sum(rows)))
    for axis in axes.flat:
        axis.axis("off")
    for first_row, inside in zip(np.cumsum([0] + rows), insides):
        panels = axes[first_row:].flat
        picture(next(panels), inside.image, "image")
        for word, attention in zip(inside.words, inside.attention):
            axis = next(panels)
            axis.imshow(attention, cmap="magma", vmin=0, vmax=inside.attention.max())
            axis.set_title(word, fontsize=10)
    return figure


def cond_uncond_figure(steps_shown=(1, 4, 10)):
    """At a few steps of one run: the conditional and unconditional x0 predictions and the guided
    x0 the step moves towards."""
    figure, axes = plt.subplots(3, len(steps_shown), figsize=(2.3 * len(steps_shown), 7))
    for column, number in enumerate(steps_shown):
        inside = inside_demo(PROMPT, number - 1, 0)
        for row, (image, name) in enumerate(((inside.cond_x0, "conditional x0"), (inside.uncond_x0, "unconditional x0"),
                                             (inside.x0_steps[number - 1], "guided x0"))):
            picture(axes[row, column], image, f"step {number}" if row == 0 else "")
            axes[row, 0].set_ylabel(name, fontsize=9)
    return figure


FIGURE_MAKERS = {
    "concept-flow-toy.png": flow_toy_figure,
    "concept-real-sampler.png": real_sampler_figure,
    "concept-a-min.png": a_min_figure,
    "concept-guidance-scales.png": guidance_scales_figure,
    "concept-guidance-toy.png": guidance_toy_figure,
    "concept-cond-uncond.png": cond_uncond_figure,
    "concept-attention.png": attention_figure,
    "concept-positions.png": positions_figure,
    "concept-joint-rope.png": joint_rope_figure,
    "concept-mean-flow-toy.png": mean_flow_toy_figure,
    "concept-student-guidance.png": student_guidance_figure,
    "concept-four-vs-twenty.png": four_vs_twenty_figure,
    "concept-few-steps.png": few_steps_figure,
}


def png_bytes(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES)
    parser.add_argument("names", nargs="*", help=f"only these figures (default: all): {', '.join(FIGURE_MAKERS)}")
    args = parser.parse_args()
    unknown = set(args.names) - set(FIGURE_MAKERS)
    if unknown:
        parser.error(f"no figure named {', '.join(sorted(unknown))}")
    for name in args.names or FIGURE_MAKERS:
        write_atomically(args.out / name, png_bytes(FIGURE_MAKERS[name]()))
        print(args.out / name)


if __name__ == "__main__":
    main()
