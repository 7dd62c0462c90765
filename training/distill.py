"""Distil the four-step demo student (a Mean Flow MMJiT) from the demo model, then export it.

    python -m minit2i.training.distill                     # distil (or resume) runs/demo-mf, export to runs/demo-mf/export
    python -m minit2i.training.distill --export-dir minit2i/demo_model_mf   # the same, replacing the shipped student
    python -m minit2i.training.distill --teacher DIR --steps 20 --run runs/smoke --export-dir /tmp/smoke-mf
    python -m minit2i.training.distill --sweep --guidance-interval 0.2 0.8   # evaluate the checkpoint's settings
    python -m minit2i.training.distill --init-from minit2i/demo_model_mf --run runs/demo-mf-2   # a retrained teacher

The objective is the official teacher-guided Mean Flow distillation (model.md 9.6), per sample:

* t and r from sigmoid(N(0.8, 0.8)), ordered t >= r, and r = t for the first half of the batch
  (plain flow matching, whose guidance interval is [0, 1]); otherwise t_min ~ U(0, 0.5) and
  t_max ~ U(0.5, 1); omega = (1 + cfg_max)^u with u ~ U(0, 1);
* z = (1 - t) x + t n with n = 2 eps (time runs from data, t = 0, to noise, t = 1);
* the frozen teacher's guided velocity v_g = omega v_c + (1 - omega) v_u where t_min <= t <= t_max,
  v_c elsewhere, with v = (z - x0) / clip(t, 0.05, 1) and the unconditional branch an all-zero mask;
* the student's u(z, t, r) = (z - x0_student(z, h = t - r, omega, t_min, t_max)) / clip(t, 0.05, 1),
  and its derivative along the flow, du/dt = JVP of u along (dz, dt, dr) = (v_g, 1, 0);
* loss = |u + (t - r) sg(du/dt) - v_g|^2 summed over pixels, divided by sg(that + 0.01) (adaptive
  weighting), averaged over the batch.

`--low-noise-fraction f` departs from it as the base model's fine-tunes do: a share f of the batch
draws t and r from U(0, 1 - --low-noise-t-min) instead (the same low-noise band as train.py's, in
the student's reversed time). The official draws put 0.3 % of t below 0.2, so a student distilled
with them alone loses the teacher's outlines near the data, where its last step lands. The default
is the shipped student's, 0.4 with --low-noise-t-min 0.4; 0 is the official objective.
`--high-noise-fraction f` does the same at the other end, t and r from U(--high-noise-t-min, 1):
the official draws put 0.4 % of t above 0.95, and the student's first step starts at t = 1, where it
must follow the teacher's guidance from pure noise (without it the student drew some white
backgrounds navy). Its rows are drawn after the low-noise ones; the default is the shipped
student's, 0.2 with --high-noise-t-min 0.75.

The student starts as the teacher (every tensor they share is copied, as the official warm start
does); the prefix's tokens and embedders start small (N(0, 0.02), biases 0) so that the first steps
draw what the teacher draws. When the teacher is retrained, `--init-from` starts instead from the
student of the earlier teacher, which already draws in four steps. The T5 encoder is the teacher's,
frozen: the export holds only the transformer, and `generate --model demo-mf` pairs it with the
demo model's t5/.

Resuming, determinism per (seed, step), checkpoints and the export's atomic replacement are the
base run's (train.py); the checkpoint also records the teacher's digest, so a run is never resumed
against another teacher.
"""

from __future__ import annotations

from . import require_torch

require_torch("distill")
import dataclasses
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from minit2i.console import guarded
from minit2i.core.checks import Range, existing_path
from minit2i.core.errors import MiniT2IError
from minit2i.core.mean_flow_config import MeanFlowConfig, mean_flow_expected_shapes
from minit2i.core.mmjit_config import MMJiTConfig
from minit2i.core.weights import nest
from minit2i.demo_models import DEMO_MODEL_DIR, save_transformer
from minit2i.pipeline import STUDENT_CFG_SCALE, check_guidance_interval, sampling_defaults
from minit2i.reference.mean_flow_sampler import MIN_TIME, sample_mean_flow
from minit2i.reference.sampler import NOISE_SCALE, initial_noise, sample

from . import shapes
from .evaluate import evaluate_scenes, evaluation_scenes, prompt
from .torch_model import mean_flow_forward, mmjit_forward, t5_encode, to_torch_tree
from .train import (Run, Schedule, check_arguments, execute, load_export, parse_run_arguments, run_parser,
                    schedule_arguments, weights_digest)

# Standard deviation of the prefix's new weights (the official initialiser of its tokens and embedders).
PREFIX_INIT_STD = 0.02
# The progress bar's number (`DistillRun.one_step_error`): the student's single step from pure noise
# against the teacher's own picture of the same noise, on this many fixed held-in prompts.
ONE_STEP_PROMPTS = 4


@dataclass(frozen=True)
class DistillRecipe(Schedule):
    """The distillation's settings; the defaults are the shipped student's (docs/demo-model.md)."""

    steps: int = 1000
    lr: float = 3e-4
    warmup: int = 100
    low_noise_fraction: float = 0.4
    low_noise_t_min: float = 0.4
    # A share drawn near pure noise, t and r ~ U(high_noise_t_min, 1) in the student's time, where
    # its first step starts and where the official draws put 0.4 % of t above 0.95.
    high_noise_fraction: float = 0.2
    high_noise_t_min: float = 0.75
    t_mu: float = 0.8
    t_sigma: float = 0.8
    flow_matching_fraction: float = 0.5  # rows with r = t ("data_proportion" officially)
    cfg_max: float = 12.0  # omega = (1 + cfg_max)^u, so 1 <= omega <= 1 + cfg_max
    norm_eps: float = 0.01
    norm_p: float = 1.0


def student_config(teacher: MMJiTConfig) -> MeanFlowConfig:
    """The teacher's trunk with the released student's prefix (8/4/2/2/4 tokens, F = 256)."""
    return MeanFlowConfig(**dataclasses.asdict(teacher))


def student_initial_weights(teacher: dict[str, np.ndarray], config: MeanFlowConfig, seed: int) -> dict[str, np.ndarray]:
    """float32 student weights: the teacher's where a tensor of that name and shape exists, the
    prefix's new tensors ~ N(0, PREFIX_INIT_STD) (biases 0)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in sorted(mean_flow_expected_shapes(config).items()):
        if name in teacher:
            if teacher[name].shape != shape:
                raise ValueError(f"the teacher's {name} is {list(teacher[name].shape)}, the student's {list(shape)}")
            weights[name] = teacher[name].astype(np.float32)
        elif name.endswith("bias"):
            weights[name] = np.zeros(shape, np.float32)
        else:
            weights[name] = (PREFIX_INIT_STD * rng.standard_normal(shape)).astype(np.float32)
    return weights


def distill_batch(recipe: DistillRecipe, tokenizer, step: int) -> dict[str, torch.Tensor]:
    """Everything random about step `step`: images, ids, mask, t >= r, t_min, t_max, omega, noise."""
    rng = np.random.default_rng([recipe.seed, step])
    images, captions = shapes.random_batch(rng, recipe.batch, recipe.phrase_probability)
    ids, mask = tokenizer(captions)

    def logit_normal():
        return 1.0 / (1.0 + np.exp(-(recipe.t_mu + recipe.t_sigma * rng.standard_normal(recipe.batch))))

    t, r = logit_normal(), logit_normal()
    interval_low, interval_high = rng.uniform(0.0, 0.5, recipe.batch), rng.uniform(0.5, 1.0, recipe.batch)
    omega = np.exp(rng.random(recipe.batch) * np.log1p(recipe.cfg_max))
    noise = NOISE_SCALE * rng.standard_normal(images.shape, dtype=np.float32)

    def redraw_share(t, r, fraction, lowest, highest):
        rows = rng.random(recipe.batch) < fraction
        return (np.where(rows, rng.uniform(lowest, highest, recipe.batch), t),
                np.where(rows, rng.uniform(lowest, highest, recipe.batch), r))

    # Drawn last, so that without the noise-band shares every value above is the official draw.
    # The student's time runs the other way (1 = noise): the low-noise band ends at 1 - t_min.
    t, r = redraw_share(t, r, recipe.low_noise_fraction, 0.0, 1.0 - recipe.low_noise_t_min)
    t, r = redraw_share(t, r, recipe.high_noise_fraction, recipe.high_noise_t_min, 1.0)
    flow_matching = np.arange(recipe.batch) < int(recipe.batch * recipe.flow_matching_fraction)
    r = np.where(flow_matching, t, r)
    t, r = np.maximum(t, r), np.minimum(t, r)
    t_min = np.where(flow_matching, 0.0, interval_low)
    t_max = np.where(flow_matching, 1.0, interval_high)
    values = {"images": images, "ids": ids, "mask": mask.astype(np.float32), "t": t, "r": r, "t_min": t_min,
              "t_max": t_max, "omega": omega, "noise": noise}
    return {name: torch.from_numpy(np.asarray(v, dtype=np.int64 if name == "ids" else np.float32))
            for name, v in values.items()}


def per_sample(values: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, 1, 1, 1], to scale images."""
    return values[:, None, None, None]


def guided_velocity(teacher, teacher_config: MMJiTConfig, z, t, omega, context, mask) -> torch.Tensor:
    """The frozen teacher's guided velocity omega v_c + (1 - omega) v_u at z [B, C, H, W] (t, omega
    [B]; omega = 1 is the conditional velocity), v = (z - x0) / clip(t, 0.05, 1)."""
    with torch.no_grad():
        x0 = mmjit_forward(teacher, teacher_config, torch.cat([z, z]), torch.cat([context, context]),
                           torch.cat([mask, torch.zeros_like(mask)]))
        v_c, v_u = ((torch.cat([z, z]) - x0) / per_sample(torch.cat([t, t]).clamp(MIN_TIME, 1.0))).chunk(2)
        return per_sample(omega) * v_c + per_sample(1 - omega) * v_u


def average_velocity_of(student, config: MeanFlowConfig, batch: dict, context):
    """The student's average velocity u(z [B, C, H, W], t [B], r [B]) = (z - x0) / clip(t, 0.05, 1),
    with the batch's guidance inputs and text (context [B, L, Dc], batch["mask"])."""
    def average_velocity(z, t, r):
        x0 = mean_flow_forward(student, config, z, t - r, batch["omega"], batch["t_min"], batch["t_max"],
                               context, batch["mask"])
        return (z - x0) / per_sample(t.clamp(MIN_TIME, 1.0))

    return average_velocity


def along_the_path(average_velocity, z, t, r, velocity) -> tuple[torch.Tensor, torch.Tensor]:
    """(u, du/dt) at (z, t, r): du/dt is the total derivative along the path, where z moves with
    `velocity` as t moves and r stays, dz/dt = v: one Jacobian-vector product with the tangent
    (v, 1, 0) = du/dz v + du/dt (concepts.md 6)."""
    # The fused attention kernels have no forward-mode derivative; the plain one (matmul, softmax) has.
    with sdpa_kernel(SDPBackend.MATH):
        return torch.func.jvp(average_velocity, (z, t, r), (velocity, torch.ones_like(t), torch.zeros_like(r)))


def mean_flow_loss(student, config: MeanFlowConfig, teacher, teacher_config: MMJiTConfig, context, batch: dict,
                   recipe: DistillRecipe) -> tuple[torch.Tensor, torch.Tensor]:
    """(the adaptively weighted Mean Flow loss of the module docstring, scalar; the unweighted
    mean squared error per pixel, detached, which is what a loss curve can show: the weighted
    loss of one sample is close to 1 whatever its error)."""
    t, r, mask = batch["t"], batch["r"], batch["mask"]
    z = per_sample(1 - t) * batch["images"] + per_sample(t) * batch["noise"]
    # The target is the teacher's guided velocity, so the student learns guidance as one of its
    # inputs and needs one forward per step instead of two (concepts.md 6).
    inside = (batch["t_min"] <= t) & (t <= batch["t_max"])
    v_g = guided_velocity(teacher, teacher_config, z, t,
                          torch.where(inside, batch["omega"], torch.ones_like(t)), context, mask)

    u, du_dt = along_the_path(average_velocity_of(student, config, batch, context), z, t, r, v_g)
    # The Mean Flow identity: the average velocity over [r, t] is the velocity at t corrected by how
    # it changes along the path, u = v - (t - r) du/dt. Its derivative is held fixed (a target, not
    # a path for gradients), so training needs no second-order derivatives; r = t is plain flow matching.
    error = ((u + per_sample(t - r) * du_dt.detach() - v_g) ** 2).sum(dim=(1, 2, 3))
    # Adaptive weighting: each sample's error divided by (about) itself, so the few very large
    # errors near pure noise do not drown the rest.
    weighted = (error / (error.detach() + recipe.norm_eps) ** recipe.norm_p).mean()
    return weighted, error.detach().mean() / z[0].numel()


class DistillRun(Run):
    """A distillation run: the student's weights, EMA and optimiser state are checkpointed like a
    base run's; the teacher (transformer and T5) is read from `teacher_dir` and stays frozen."""

    def __init__(self, folder: Path, recipe: DistillRecipe, teacher_dir: Path,
                 guidance_interval: tuple[float, float], init_from: Path | None = None):
        self.teacher_dir = teacher_dir
        teacher = load_export(teacher_dir, "--teacher")
        self.teacher_sampling = sampling_defaults(teacher)
        self.teacher_tensors = teacher.mmjit.tensors
        self.teacher_config = teacher.mmjit.config
        self.teacher = to_torch_tree(nest(teacher.mmjit.tensors))
        self.t5_params = to_torch_tree(nest(teacher.t5.tensors))
        self.guidance_interval = guidance_interval
        config = student_config(self.teacher_config)
        super().__init__(folder, recipe, config, teacher.t5.config, init_from)

    def identity(self) -> dict:
        return super().identity() | {"teacher": weights_digest(self.teacher_tensors)}

    def exported_start(self, folder: Path) -> dict[str, np.ndarray]:
        """An exported student's weights (folder/transformer), to go on distilling it from this
        teacher; it must be this teacher's student architecture."""
        student = load_export(folder, "--init-from", t5_folder=self.teacher_dir / "t5")
        if student.mmjit.config != self.mmjit:
            raise MiniT2IError(f"--init-from {folder} is not a student of this teacher's architecture; pass an "
                               "export of distill.py made from the same kind of teacher")
        return {k: v.astype(np.float32) for k, v in student.mmjit.tensors.items()}

    def initial_weights(self) -> dict[str, np.ndarray]:
        """The student at step 0: an exported student (--init-from), else the teacher's copy."""
        if self.start is not None:
            return self.start
        return student_initial_weights(self.teacher_tensors, self.mmjit, self.recipe.seed)

    def encode(self, ids, mask) -> torch.Tensor:
        with torch.no_grad():
            return t5_encode(self.t5_params, self.t5, torch.as_tensor(ids), torch.as_tensor(mask))

    def train_step(self) -> dict[str, float]:
        """A base run's step, and the student's one-step error after it (the progress bar's number)."""
        return super().train_step() | {"one_step": self.one_step_error()}

    @functools.cached_property
    def one_step_target(self) -> tuple[np.ndarray, ...]:
        """(noise, context, mask, the teacher's pictures) of ONE_STEP_PROMPTS fixed held-in prompts:
        the teacher's own sampler (its steps and guidance) on seed 0's noise, drawn once."""
        scenes = evaluation_scenes(ONE_STEP_PROMPTS, 1, held_out_prompts=0)
        ids, mask = self.tokenizer([prompt(scene) for scene, _, _ in scenes])
        context = self.encode(ids, mask).numpy()
        size = self.teacher_config.image_size
        noise = initial_noise(0, len(scenes), self.teacher_config.in_channels, size, size).astype(np.float32)

        def denoise(x, context, mask):
            with torch.no_grad():
                return mmjit_forward(self.teacher, self.teacher_config, *map(torch.from_numpy, (x, context, mask))
                                     ).numpy()

        pictures = sample(denoise, noise, context, mask, self.teacher_sampling["steps"],
                          self.teacher_sampling["cfg_scale"])
        return noise, context, mask, pictures

    def one_step_error(self) -> float:
        """The student's (current weights') single step from the fixed noise against the teacher's
        pictures of it (`one_step_target`), at the teacher's guidance over the run's interval: the
        mean squared error per pixel. It falls as the student learns to draw in one step, where the
        weighted loss stays near 1 (`mean_flow_loss`)."""
        noise, context, mask, pictures = self.one_step_target
        drawn = sample_mean_flow(self.student_denoiser(self.params), noise, context, mask, 1,
                                 self.teacher_sampling["cfg_scale"], self.guidance_interval)
        return float(np.mean((drawn - pictures) ** 2))

    def student_denoiser(self, weights: dict):
        """The reference sampler's denoise(x, h, omega, t_min, t_max, context, mask) over the
        student's flat `weights` (torch, no gradients)."""
        student = nest(weights)

        def denoise(x, h, omega, t_min, t_max, context, mask):
            with torch.no_grad():
                scalars = [torch.from_numpy(np.asarray(v, np.float32)) for v in (h, omega, t_min, t_max)]
                return mean_flow_forward(student, self.mmjit, torch.from_numpy(x), *scalars,
                                         torch.from_numpy(context), torch.from_numpy(mask)).numpy()
        return denoise

    def loss(self, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        batch = distill_batch(self.recipe, self.tokenizer, step)
        weighted, error = mean_flow_loss(nest(self.params), self.mmjit, self.teacher, self.teacher_config,
                                         self.encode(batch["ids"], batch["mask"]), batch, self.recipe)
        return weighted, {"error": error.item()}

    def evaluate(self, scenes, steps: int, cfg_scale: float) -> dict:
        """The checker's report on the EMA student drawing `scenes` in `steps` steps with
        omega = `cfg_scale` over the run's guidance interval."""
        denoise = self.student_denoiser(self.ema)
        return evaluate_scenes(scenes, self.tokenizer, lambda ids, mask: self.encode(ids, mask).numpy(),
                               lambda noise, context, mask: sample_mean_flow(denoise, noise, context, mask, steps,
                                                                             cfg_scale, self.guidance_interval))

    def write_export(self, folder: Path, steps: int, cfg_scale: float) -> None:
        """The EMA student, float16, as folder/transformer, with its sampler settings."""
        save_transformer(folder / "transformer", self.mmjit, {k: v.numpy() for k, v in self.ema.items()}, np.float16,
                         sampling={"steps": steps, "cfg_scale": cfg_scale,
                                   "guidance_interval": list(self.guidance_interval)})


def parse_args(argv=None):
    p = run_parser("distill", __doc__.splitlines()[0])
    p.add_argument("--teacher", type=Path, default=DEMO_MODEL_DIR, help="exported base model (transformer/, t5/)")
    p.add_argument("--guidance-interval", type=float, nargs=2, default=[0.0, 1.0], metavar=("T_MIN", "T_MAX"),
                   help="guidance interval of evaluation and export")
    p.add_argument("--high-noise-fraction", type=float, default=DistillRecipe.high_noise_fraction,
                   help="share of each batch with t and r ~ U(--high-noise-t-min, 1) (1 = noise)")
    p.add_argument("--high-noise-t-min", type=float, default=DistillRecipe.high_noise_t_min)
    p.add_argument("--cfg-max", type=float, default=DistillRecipe.cfg_max,
                   help="training draws omega = (1 + CFG_MAX)^u, u ~ U(0, 1) (12 officially)")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from an exported student (transformer/), e.g. one distilled from an earlier teacher")
    p.set_defaults(run=Path("runs/demo-mf"), steps=DistillRecipe.steps,
                   lr=DistillRecipe.lr, warmup=DistillRecipe.warmup, low_noise_fraction=DistillRecipe.low_noise_fraction,
                   low_noise_t_min=DistillRecipe.low_noise_t_min,
                   checkpoint_every=50, sample_steps=4, sweep_steps=[2, 4, 8], sweep_cfg=[2.0, 3.0, 5.0])
    return parse_run_arguments(p, argv)


def main(argv=None) -> int:
    def command() -> int:
        args = parse_args(argv)
        check_arguments(args)
        interval = check_guidance_interval(args.guidance_interval)
        # The student's guidance is omega, whose range `generate` holds it to (at least 1).
        for flag, values in (("--cfg-scale", [args.cfg_scale]), ("--sweep-cfg", args.sweep_cfg)):
            for value in values:
                STUDENT_CFG_SCALE.check(f"{flag} of a Mean Flow student (omega, 1 = no guidance)", value)
        Range(0.0, 1.0, integer=False).check("--high-noise-fraction", args.high_noise_fraction)
        Range(0.0, 1.0, integer=False).check("--high-noise-t-min", args.high_noise_t_min)
        Range(0.0, 1000.0, integer=False).check("--cfg-max", args.cfg_max)
        existing_path(args.teacher, "--teacher")
        if args.init_from is not None:
            existing_path(args.init_from, "--init-from")
        torch.set_num_threads(args.threads)
        recipe = dataclasses.replace(DistillRecipe(), **schedule_arguments(args),
                                     high_noise_fraction=args.high_noise_fraction,
                                     high_noise_t_min=args.high_noise_t_min, cfg_max=args.cfg_max)
        return execute(DistillRun(args.run, recipe, args.teacher, interval, args.init_from), args)

    return guarded("distill", command)


if __name__ == "__main__":
    sys.exit(main())
