"""Train the demo model (a tiny MMJiT + tiny T5) on the coloured-shapes data set, then export it.

    python -m minit2i.training.train                       # train (or resume) runs/demo, export to runs/demo/export
    python -m minit2i.training.train --export-dir minit2i/demo_model   # the same, replacing the shipped demo model
    python -m minit2i.training.train --steps 20 --tiny --run runs/smoke --export-dir /tmp/smoke
    python -m minit2i.training.train --export-only         # re-export the last checkpoint (checkpoint.safetensors)

The objective is MiniT2I's (model.md 4.1, 7.4): x_t = t x + (1 - t) 2 eps with t ~ sigmoid(N(mu, s)),
the network predicts x0 and the loss is the MSE between the implied velocity
(x0_pred - x_t) / max(1 - t, a_min) and the true one (x - x_t) / max(1 - t, a_min); the whole
caption is dropped (all-zero mask) with probability 0.1 so classifier-free guidance has an
unconditional branch. AdamW with warm-up and cosine decay, and an EMA of the weights, which is
what gets exported.

Everything the run depends on is a function of (seed, step): the batch, the noise and t of step
k are drawn from generators seeded with (seed, k). A run therefore resumes from its last
checkpoint to exactly the weights an uninterrupted run would have reached (up to the
non-determinism of multi-threaded float32 reductions in torch).
"""

from __future__ import annotations

from . import require_torch

require_torch("train")
import argparse
import dataclasses
import errno
import hashlib
import json
import math
import os
import shutil
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
from safetensors import SafetensorError
from tqdm import tqdm

from minit2i.console import OneLineParser, emit, guarded, printable
from minit2i.core.checks import (Range, differences, existing_path, file_kind, parse_json, read_limited, short_list,
                                 shown, writable_folder)
from minit2i.core.errors import MiniT2IError
from minit2i.core.files import write_atomically
from minit2i.core.mmjit_config import MMJiTConfig, mmjit_expected_shapes
from minit2i.core.t5_config import T5Config, t5_expected_shapes
from minit2i.core.tokenizer import PromptTokenizer, make_word_tokenizer
from minit2i.core.weights import nest
from minit2i.demo_models import save_model
from minit2i.pipeline import REQUEST_RANGES
from minit2i.reference.sampler import NOISE_SCALE, sample

from . import shapes
from .evaluate import evaluate_scenes, evaluation_scenes
from .torch_model import mmjit_forward, t5_encode

DEMO_MMJIT = MMJiTConfig(image_size=64, patch_size=4, txt_input_size=128, hidden_size=128, depth_double=4,
                         txt_preamble_depth=2, num_heads=4, head_dim=32, pca_channels=32, prompt_length=16,
                         cond_vec_size=128)
DEMO_T5 = T5Config(vocab_size=3 + len(shapes.vocabulary()), d_model=128, d_kv=32, num_heads=4, d_ff=256,
                   num_layers=2)
# For the smoke test of the script (CI): every structural feature, a fraction of the cost.
SMOKE_MMJIT = dataclasses.replace(DEMO_MMJIT, txt_input_size=32, hidden_size=32, depth_double=1, num_heads=2,
                                  head_dim=16, pca_channels=8, cond_vec_size=32)
SMOKE_T5 = dataclasses.replace(DEMO_T5, d_model=32, d_kv=8, d_ff=64, num_layers=1)


@dataclass(frozen=True)
class Schedule:
    """What every training run here shares: optimiser, learning-rate schedule, EMA, seed, and the
    share of each batch drawn at low noise instead of from the official t distribution."""

    steps: int = 5000
    batch: int = 32
    lr: float = 1e-3
    warmup: int = 200
    final_lr_fraction: float = 0.05
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    ema_decay: float = 0.999
    seed: int = 0
    # A fraction of every batch at low noise, t ~ U(low_noise_t_min, 1) in the base model's time
    # (1 = clean): the official t distributions put 2 % of t above 0.7, too few to learn the
    # pixels inside a patch. 0 is the official objective.
    low_noise_fraction: float = 0.0
    low_noise_t_min: float = 0.6
    phrase_probability: float = shapes.PHRASE_PROBABILITY


@dataclass(frozen=True)
class Recipe(Schedule):
    """The base model's settings. The defaults are the run meant to replace the shipped model;
    docs/demo-model.md says where the shipped model's differ."""

    caption_drop: float = 0.1
    t_mu: float = -0.8
    t_sigma: float = 0.8
    low_noise_fraction: float = 0.25
    a_min: float = 0.05


def learning_rate(recipe: Schedule, step: int) -> float:
    """Linear warm-up to `lr`, then a cosine down to `final_lr_fraction * lr` at `steps`."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = min(1.0, (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup))
    floor = recipe.final_lr_fraction
    return recipe.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


# ---------------------------------------------------------------------------------------------
# Parameters


def load_export(folder: Path, flag: str, t5_folder: Path | None = None):
    """The exported model in `folder` (transformer/, and t5/ unless `t5_folder` is given) as
    minit2i.pipeline.load_model reads it, every problem named after `flag`, the option the user
    passed the folder with."""
    from minit2i.pipeline import load_model

    transformer, t5 = folder / "transformer", t5_folder or folder / "t5"
    for part in (transformer, t5):
        existing_path(part, flag)
    try:
        return load_model(transformer, t5)
    except MiniT2IError as err:
        raise MiniT2IError(f"{flag} {folder} is not a usable export: {err}") from None


def exported_weights(folder: Path, mmjit: MMJiTConfig, t5: T5Config) -> dict[str, np.ndarray]:
    """An exported model's weights (folder/transformer, folder/t5) as float32 parameters with
    flat names, to continue training it; its architecture must be the run's."""
    model = load_export(folder, "--init-from")
    if model.mmjit.config != mmjit or model.t5.config != t5:
        raise MiniT2IError(f"--init-from {folder} is another architecture than this run's; pass an export of "
                           "the same architecture (--tiny or not)")
    return ({f"mmjit.{k}": v.astype(np.float32) for k, v in model.mmjit.tensors.items()}
            | {f"t5.{k}": v.astype(np.float32) for k, v in model.t5.tensors.items()})


def weights_digest(tensors: dict[str, np.ndarray]) -> str:
    """The first 16 hex digits of a sha256 over the tensors' names and float32 bytes."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode() + np.ascontiguousarray(tensors[name], np.float32).tobytes())
    return digest.hexdigest()[:16]


def initial_weights(mmjit: MMJiTConfig, t5: T5Config, seed: int) -> dict[str, np.ndarray]:
    """float32 weights for both networks, flat names prefixed "mmjit." / "t5.".

    Linear and conv weights ~ N(0, 1/fan_in), except the projections that write into a residual
    stream (attention out, MLP down), scaled by 1/sqrt(2 * depth) as in GPT-2, and the final
    layer, zero, so the untrained network predicts x0 = 0 (the data mean); norms 1, biases 0.
    """
    rng = np.random.default_rng(seed)
    depth = mmjit.depth_double + mmjit.txt_preamble_depth
    shapes_by_name = {**{f"mmjit.{k}": v for k, v in mmjit_expected_shapes(mmjit).items()},
                      **{f"t5.{k}": v for k, v in t5_expected_shapes(t5).items()}}
    weights = {}
    for name, shape in sorted(shapes_by_name.items()):
        if "norm" in name:
            value = np.ones(shape)
        elif name.endswith("bias") or name.startswith("mmjit.final_layer.linear"):
            value = np.zeros(shape)
        elif name.endswith(("mask_token", "shared.weight", "relative_attention_bias.weight")):
            value = rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
            if name.endswith(("attn_proj.weight", "w2.weight", ".o.weight", ".wo.weight")):
                value /= np.sqrt(2 * depth)
        weights[name] = value.astype(np.float32)
    return weights


def split_tree(flat: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """The flat "mmjit."/"t5." parameter dict -> (MMJiT tree, T5 tree) sharing its tensors."""
    mmjit, t5 = split_flat(flat)
    return nest(mmjit), nest(t5)


# ---------------------------------------------------------------------------------------------
# One step


def training_batch(recipe: Recipe, tokenizer: PromptTokenizer, step: int, image_size: int = shapes.IMAGE_SIZE):
    """Everything random about step `step`: images (`image_size` pixels square), ids, masks (T5's
    and MMJiT's), t and noise."""
    rng = np.random.default_rng([recipe.seed, step])
    images, captions = shapes.random_batch(rng, recipe.batch, recipe.phrase_probability, image_size)
    ids, mask = tokenizer(captions)
    dropped = rng.random(recipe.batch) < recipe.caption_drop
    mmjit_mask = mask * ~dropped[:, None]
    t = 1.0 / (1.0 + np.exp(-(recipe.t_mu + recipe.t_sigma * rng.standard_normal(recipe.batch))))
    low_noise = rng.random(recipe.batch) < recipe.low_noise_fraction
    t = np.where(low_noise, rng.uniform(recipe.low_noise_t_min, 1.0, recipe.batch), t)
    noise = rng.standard_normal(images.shape, dtype=np.float32)
    return {name: torch.from_numpy(np.asarray(value)) for name, value in (
        ("images", images), ("ids", ids), ("mask", mask), ("mmjit_mask", mmjit_mask.astype(np.float32)),
        ("t", t.astype(np.float32)), ("noise", noise))}


def v_loss(params: dict, mmjit: MMJiTConfig, t5: T5Config, batch: dict, a_min: float,
           predict_x0=None) -> torch.Tensor:
    """Mean squared velocity error of the x0 prediction (scalar). `predict_x0(mmjit_params, x_t
    [B, C, H, W], t [B, 1, 1, 1], context, mask) -> x0`, if given, stands for the network's own
    x0 (the watch-it-learn ablations: another prediction target, fewer positions)."""
    mmjit_params, t5_params = split_tree(params)
    t = batch["t"][:, None, None, None]
    # A point of the straight path from noise to the image (concepts.md 1); a dropped caption's
    # mmjit_mask is all zero, which is what trains the unconditional branch guidance uses.
    x_t = t * batch["images"] + (1 - t) * NOISE_SCALE * batch["noise"]
    context = t5_encode(t5_params, t5, batch["ids"], batch["mask"])
    if predict_x0 is None:
        x0 = mmjit_forward(mmjit_params, mmjit, x_t, context, batch["mmjit_mask"])
    else:
        x0 = predict_x0(mmjit_params, x_t, t, context, batch["mmjit_mask"])
    # The network predicts x0 but is scored on the velocity the sampler will take from it (x_t
    # cancels in the difference): an x0 error late in sampling, where 1 - t is small, moves the
    # image more, so it weighs more (model.md 7.4).
    return (((x0 - batch["images"]) / torch.clamp(1 - t, min=a_min)) ** 2).mean()


# ---------------------------------------------------------------------------------------------
# The run: checkpoint, resume, log, evaluate, export


CHECKPOINT = "checkpoint.safetensors"
CHECKPOINT_LIMIT = 16 * 2**30  # a checkpoint of the full demo run is ~40 MB
# The tensors a checkpoint holds for each parameter NAME, and the shape they have: the parameter's
# own shape, except AdamW's step count (a scalar).
CHECKPOINT_TENSORS = {"params/{}": True, "ema/{}": True, "adam/{}/exp_avg": True, "adam/{}/exp_avg_sq": True,
                      "adam/{}/step": False}


def check_values(tensors: dict[str, torch.Tensor], step: int, path: Path, fix: str) -> None:
    """Every value of a checkpoint in the range training can produce, before any step runs:
    weights, EMA and AdamW's moments finite, its second moments not negative, each step count a
    whole number from 0 to the checkpoint's step (a damaged value would otherwise surface steps
    later as a diverged run, or as torch's traceback)."""
    for name, tensor in sorted(tensors.items()):
        problem = _value_problem(name, tensor, step)
        if problem:
            raise MiniT2IError(f"{path}: {name} {problem}; the checkpoint is damaged: resume from a copy of the run "
                               f"or {fix}")


def _value_problem(name: str, tensor: torch.Tensor, step: int) -> str | None:
    """What is wrong with one checkpoint tensor's values, or None."""
    if name.endswith("/step"):
        value = float(tensor)
        if not (value.is_integer() and 0 <= value <= step):  # NaN fails every comparison
            return f"is {value:g}, expected a whole number of optimiser steps in [0, {step}]"
        return None
    bad = tensor.numel() - int(torch.isfinite(tensor).sum())
    if bad:
        return f"holds {bad} NaN or Inf value(s) of {tensor.numel()}"
    if name.endswith("/exp_avg_sq") and bool((tensor < 0).any()):
        return "holds negative values, which a mean of squares cannot have"
    return None


LOG = "log.jsonl"
LOG_LIMIT = 2**30  # a step's record is ~150 bytes: a million-step log is 150 MB


def read_log(path: Path) -> list[dict]:
    """The records of a run's log.jsonl (one JSON object a line, each with its step), read as data
    from outside: a damaged line is one line naming the file and the line; no log, no records."""
    if not os.path.lexists(path):
        return []
    records = []
    for number, line in enumerate(read_limited(path, "training log", LOG_LIMIT).splitlines(), 1):
        record = parse_json(line, f"line {number} of the training log", path)
        if not _is_log_record(record):
            raise MiniT2IError(f"line {number} of the training log {path}: expected a record with a step and "
                               f"numbers, found {shown(record)}; delete that line and run again")
        records.append(record)
    return records


def _is_log_record(record) -> bool:
    """A JSON object with a step count (an integer >= 0) and a number (NaN and Inf included: a
    diverged step logs them) for each curve it logs."""
    return (isinstance(record, dict) and Range(0, 10**7).contains(record.get("step"))
            and all(isinstance(record[name], (int, float)) and not isinstance(record[name], bool)
                    for name in CURVES if name in record))


class Run:
    """A training run in `folder`: checkpoint.safetensors (weights, EMA, optimiser state, and
    as JSON metadata the step and the settings) and log.jsonl.

    A checkpoint is data, never code: safetensors holds only tensors and strings, so a crafted
    file can at worst be refused (a pickle, as torch.save writes, runs whatever it names).
    """

    FOLDER_FLAG = "--run"  # the command's flag for the run's folder, as its messages name it
    SWITCHES: dict[str, str] = {}  # an entry of `identity` (a.b) -> the command's switch that sets it

    def __init__(self, folder: Path, recipe: Recipe, mmjit: MMJiTConfig, t5: T5Config,
                 init_from: Path | None = None):
        self.folder, self.recipe, self.mmjit, self.t5 = folder, recipe, mmjit, t5
        self.start = self.exported_start(init_from) if init_from else None
        self.tokenizer = PromptTokenizer(make_word_tokenizer(shapes.vocabulary()), mmjit.prompt_length)
        weights = self.initial_weights()
        self.params = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}
        self.ema = {k: v.detach().clone() for k, v in self.params.items()}
        self.optimizer = torch.optim.AdamW(self.params.values(), lr=recipe.lr, betas=recipe.betas,
                                           weight_decay=recipe.weight_decay)
        self.step = 0
        if (folder / "checkpoint.pt").exists():
            raise MiniT2IError(f"{folder / 'checkpoint.pt'} is a pickled checkpoint of an older version, which is "
                               f"never loaded (unpickling can run code); start a new {self.FOLDER_FLAG} folder")
        if self.checkpoint_path.exists():
            self._resume()

    def exported_start(self, folder: Path) -> dict[str, np.ndarray]:
        """The weights of an exported model to start from (--init-from), flat names."""
        return exported_weights(folder, self.mmjit, self.t5)

    def initial_weights(self) -> dict[str, np.ndarray]:
        """The trained parameters at step 0 (flat names): an exported model's (--init-from), or
        seeded random ones."""
        return self.start if self.start is not None else initial_weights(self.mmjit, self.t5, self.recipe.seed)

    def changed_setting(self, recorded: dict, wanted: dict) -> str:
        """The first entry of the run's identity where a checkpoint's `recorded` one differs from
        `wanted`, as a.b recorded -> wanted, named by its switch where SWITCHES has it."""
        first = differences(recorded, wanted)[0]
        name = first.split(" ")[0]
        return f"{self.SWITCHES[name]} ({first})" if name in self.SWITCHES else first

    @property
    def checkpoint_path(self) -> Path:
        return self.folder / CHECKPOINT

    def identity(self) -> dict:
        """What a checkpoint must share with the run that resumes it. The total step count is
        left out on purpose: resuming with another --steps extends (or shortens) the cosine."""
        recipe = dataclasses.asdict(self.recipe)
        del recipe["steps"]
        identity = {"recipe": recipe, "mmjit": dataclasses.asdict(self.mmjit), "t5": dataclasses.asdict(self.t5)}
        return identity | ({"init_from": weights_digest(self.start)} if self.start is not None else {})

    def _resume(self) -> None:
        path = self.checkpoint_path
        fix = f"use another {self.FOLDER_FLAG} folder"
        data = read_limited(path, "checkpoint", CHECKPOINT_LIMIT)
        try:
            tensors = safetensors.torch.load(data)
        except (SafetensorError, ValueError) as err:
            raise MiniT2IError(f"{path} is not a readable checkpoint ({err}); {fix}") from None
        header = parse_json(data[8:8 + int.from_bytes(data[:8], "little")], "the header of", path)
        record = parse_json((header.get("__metadata__") or {}).get("run", "").encode(), "the run record in", path)
        identity = json.loads(json.dumps(self.identity()))
        if not isinstance(record, dict) or not isinstance(record.get("identity"), dict):
            raise MiniT2IError(f"{path} holds no run record of this command; {fix}")
        if record["identity"] != identity:
            changed = self.changed_setting(record["identity"], identity)
            raise MiniT2IError(f"{path} was made with other settings: {changed}; resume with the settings it was made "
                               f"with, or {fix}")
        step = Range(0, 10**7).check(f"{path}: step", record.get("step"))
        self._check_tensors(tensors, path)
        check_values(tensors, step, path, fix)
        with torch.no_grad():
            for k in self.params:
                self.params[k].copy_(tensors[f"params/{k}"])
                self.ema[k].copy_(tensors[f"ema/{k}"])
        state = {i: {part: tensors[f"adam/{k}/{part}"] for part in ("exp_avg", "exp_avg_sq", "step")}
                 for i, k in enumerate(self.params) if f"adam/{k}/step" in tensors}
        self.optimizer.load_state_dict({"state": state, "param_groups": self.optimizer.state_dict()["param_groups"]})
        self.step = step

    def _check_tensors(self, tensors: dict[str, torch.Tensor], path: Path) -> None:
        """Every tensor a checkpoint of this run holds, of its shape and float32; the optimiser
        state of a parameter is all there or absent (a parameter that has had no gradient yet)."""
        expected = {pattern.format(k): tuple(p.shape) if same_shape else ()
                    for k, p in self.params.items() for pattern, same_shape in CHECKPOINT_TENSORS.items()}
        optional = {name for name in expected if name.startswith("adam/")}
        problems = [f"unexpected {n}" for n in sorted(set(tensors) - set(expected))]
        problems += [f"missing {n}" for n in sorted(set(expected) - set(tensors) - optional)]
        problems += [f"{n} is {str(t.dtype).removeprefix('torch.')} {list(t.shape)}, expected float32 {list(expected[n])}"
                     for n, t in sorted(tensors.items())
                     if n in expected and (t.dtype != torch.float32 or tuple(t.shape) != expected[n])]
        for k in self.params:
            held = [pattern.format(k) in tensors for pattern in CHECKPOINT_TENSORS if pattern.startswith("adam/")]
            if any(held) and not all(held):
                problems.append(f"the optimiser state of {k} is incomplete")
        if problems:
            raise MiniT2IError(f"{path} does not match this run: {short_list(problems, 3)}; use another "
                               f"{self.FOLDER_FLAG} folder")

    @property
    def log_path(self) -> Path:
        return self.folder / LOG

    def save(self) -> None:
        """Write the checkpoint atomically: a kill mid-write leaves the previous one intact."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tensors = {f"params/{k}": v.detach() for k, v in self.params.items()}
        tensors |= {f"ema/{k}": v for k, v in self.ema.items()}
        names = list(self.params)
        for i, state in self.optimizer.state_dict()["state"].items():
            tensors |= {f"adam/{names[i]}/{part}": state[part].reshape(()) if part == "step" else state[part]
                        for part in ("exp_avg", "exp_avg_sq", "step")}
        record = json.dumps({"identity": self.identity(), "step": self.step})
        write_atomically(self.checkpoint_path, safetensors.torch.save({k: v.contiguous() for k, v in tensors.items()},
                                                                      metadata={"run": record}))

    def log(self, record: dict, name: str = LOG) -> None:
        """Append `record` as a JSON line to the run folder's `name`, which must be a regular file
        if it is there: a FIFO put in its place would block the run (opened without blocking, a
        FIFO with no reader fails, one with a reader is refused)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
        except OSError as err:  # ENXIO: a FIFO that no process reads
            found = "a FIFO" if err.errno == errno.ENXIO else err.strerror
            raise MiniT2IError(f"cannot append to the run's log {path} ({found}); remove it or fix it") from None
        with os.fdopen(fd, "ab", buffering=0) as f:  # unbuffered: a full disk fails the write, not the close
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise MiniT2IError(f"cannot append to the run's log {path} (a {file_kind(mode)}); remove it or fix it")
            try:
                f.write((json.dumps(record) + "\n").encode())
            except OSError as err:
                raise MiniT2IError(f"cannot append to the run's log {path} ({err.strerror or err}); free some space, "
                                   "then run the same command again") from None

    def loss(self, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """The objective on the batch of `step` (scalar, differentiable in the parameters), and
        any other numbers worth logging."""
        batch = training_batch(self.recipe, self.tokenizer, step, self.mmjit.image_size)
        return v_loss(self.params, self.mmjit, self.t5, batch, self.recipe.a_min), {}

    def evaluate(self, scenes, steps: int, cfg_scale: float) -> dict:
        """The checker's report on the EMA weights drawing `scenes` (evaluate.accuracy_report)."""
        return evaluate_scenes(scenes, self.tokenizer, torch_encoder(self), self.sampler(steps, cfg_scale),
                               self.mmjit.image_size)

    def sampler(self, steps: int, cfg_scale: float):
        """draw(noise, context, mask) -> images: the reference sampler over the EMA weights."""
        denoise = torch_denoiser(self)
        return lambda noise, context, mask: sample(denoise, noise, context, mask, steps, cfg_scale)

    def train_step(self) -> dict[str, float]:
        """One optimiser step; {"loss": the objective before it, ...what `loss` logs}."""
        lr = learning_rate(self.recipe, self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss, logged = self.loss(self.step)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        # EMA warm-up (decay (1 + k) / (10 + k) early on) so early evaluations are not the init.
        decay = min(self.recipe.ema_decay, (1 + self.step) / (10 + self.step))
        with torch.no_grad():
            for k, p in self.params.items():
                self.ema[k].lerp_(p, 1 - decay)
        self.step += 1
        return {"loss": loss.item(), **logged}

    def export(self, folder: Path, steps: int, cfg_scale: float) -> None:
        """The EMA weights as a float16 model in the real file layouts (minit2i.demo_models),
        and beside them training-log.jsonl: the loss per 10-step window and every evaluation.

        Everything is written to a sibling staging folder that then takes `folder`'s place, so an
        interrupted export leaves the previous model whole.
        """
        check_export_dir(folder, self.folder)
        bad = [k for k, v in self.ema.items() if not torch.isfinite(v).all()]
        if bad:
            raise MiniT2IError(f"the weights hold NaN or Inf ({short_list(bad, 3)}): training diverged; nothing "
                               "exported (resume from an earlier --run checkpoint or lower the learning rate)")
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            self.write_export(staging, steps, cfg_scale)
            compact = compact_log(read_log(self.log_path), self.step)
            (staging / "training-log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in compact))
            replace_folder(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


    def write_export(self, folder: Path, steps: int, cfg_scale: float) -> None:
        """The EMA weights, float16, as folder/transformer and folder/t5 (the real layouts)."""
        mmjit, t5 = split_flat({k: v.numpy() for k, v in self.ema.items()})
        save_model(folder / "transformer", folder / "t5", self.mmjit, self.t5, mmjit, t5,
                   make_word_tokenizer(shapes.vocabulary()), np.float16, sampling={"steps": steps, "cfg_scale": cfg_scale})


# What an export writes, each with the test of its kind: the only entries a folder may hold for
# export to replace it.
EXPORT_ENTRIES = {"training-log.jsonl": stat.S_ISREG, "transformer": stat.S_ISDIR, "t5": stat.S_ISDIR,
                  **{name: stat.S_ISREG for name in ("transformer/config.json",
                                                     "transformer/diffusion_pytorch_model.safetensors",
                                                     "t5/config.json", "t5/model.safetensors", "t5/tokenizer.json")}}


def check_export_dir(folder: Path, run_folder: Path) -> None:
    """Export replaces `folder`, so it must be new, empty or a previous export: a folder of
    other files (or of files where an export has folders, or the reverse), the --run folder
    (or one holding it), the current folder, a plain file, a device or a link is refused, and
    so is a parent folder export cannot write in, before any training."""
    fix = "choose a new or empty --export-dir"
    if folder.name in ("", "..") or folder.resolve() in (Path.cwd(), *Path.cwd().parents):
        raise MiniT2IError(f"--export-dir {folder} is the current folder, one holding it or a `..` (export would "
                           f"replace it); {fix}, e.g. --export-dir export")
    check_writable_parent(folder)
    if folder.is_symlink():
        raise MiniT2IError(f"--export-dir {folder} is a symbolic link; pass the folder it points to, or {fix}")
    # Compared as paths, not as folders: neither needs to exist yet (training creates the run's).
    if folder.resolve() == run_folder.resolve() or folder.resolve() in run_folder.resolve().parents:
        raise MiniT2IError(f"--export-dir {folder} holds the --run folder {run_folder}, which export would replace; "
                           f"{fix}")
    if not os.path.lexists(folder):
        return
    mode = folder.stat().st_mode
    if not stat.S_ISDIR(mode):
        raise MiniT2IError(f"--export-dir {folder} is a {file_kind(mode)}, not a folder; {fix}")
    others = _foreign_entries(folder)
    if others:
        raise MiniT2IError(f"--export-dir {folder} holds files that are not a previous export ({short_list(others, 3)}); "
                           f"nothing there is removed: {fix}")


def check_writable_parent(folder: Path, flag: str = "--export-dir") -> None:
    """The folder `folder` is made in (its parent, or the nearest existing folder above it, where
    the rest is created: export's staging folder, a new run folder) lets this process create
    files; `flag` names the option that gave `folder`."""
    parent = folder.absolute().parent
    while not os.path.lexists(parent):
        parent = parent.parent
    writable_folder(parent, flag)


def _foreign_entries(folder: Path, prefix: str = "") -> list[str]:
    """The entries under `folder` that an export does not write, as relative names: a name it
    does not write, or one of another kind (a `t5` that is a file, a `t5/config.json` that is a
    folder, a link anywhere: shown with its kind, and never looked into)."""
    foreign = []
    for entry in sorted(os.listdir(folder)):
        name, mode = prefix + entry, (folder / entry).lstat().st_mode
        is_expected_kind = EXPORT_ENTRIES.get(name)
        if is_expected_kind is None:
            foreign.append(name)
        elif not is_expected_kind(mode):
            foreign.append(f"{name} (a {file_kind(mode)})")
        elif stat.S_ISDIR(mode):
            foreign += _foreign_entries(folder / entry, name + "/")
    return foreign


def replace_folder(new: Path, target: Path) -> None:
    """Put the folder `new` where `target` is. An existing target (a previous export, as
    `check_export_dir` made sure) is moved aside under a fresh name, moved back if `new` cannot
    take its place, and removed only once `new` is in place."""
    if not os.path.lexists(target):
        new.rename(target)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
    target.rename(aside / target.name)
    try:
        new.rename(target)
    except BaseException:
        (aside / target.name).rename(target)
        aside.rmdir()
        raise
    shutil.rmtree(aside)


# The per-step numbers an export's training log keeps, averaged per window: the objective, and the
# student's unweighted error (distill.py), where a run logs it.
CURVES = ("loss", "error")


def compact_log(records: list[dict], last_step: int, window: int = 10) -> list[dict]:
    """Per-step records -> one {"step", "loss"[, "error"]} per `window` steps (their means), plus
    every evaluation record, in step order, up to `last_step` (the exported checkpoint's). A
    step logged twice (a run stopped after it and resumed from an earlier checkpoint) counts once,
    as its last record."""
    latest = {(r["step"], "eval" in r): r for r in records if r["step"] <= last_step}
    records = [latest[key] for key in sorted(latest)]
    windows: dict[int, list[dict]] = {}
    for r in records:
        if "loss" in r:
            windows.setdefault((r["step"] - 1) // window, []).append(r)
    compact = [{"step": (w + 1) * window} | {name: float(np.mean([r[name] for r in rows]))
                                             for name in CURVES if all(name in r for r in rows)}
               for w, rows in sorted(windows.items())]
    return sorted(compact + [r for r in records if "eval" in r], key=lambda r: r["step"])


def split_flat(flat: dict) -> tuple[dict, dict]:
    """{"mmjit.x": a, "t5.y": b} -> ({"x": a}, {"y": b})."""
    return ({k[6:]: v for k, v in flat.items() if k.startswith("mmjit.")},
            {k[3:]: v for k, v in flat.items() if k.startswith("t5.")})


def torch_denoiser(run: Run):
    """A NumPy denoise(x, context, mask) over the EMA weights, for reference.sampler.sample."""
    mmjit_params, _ = split_tree(run.ema)

    def denoise(x, context, mask):
        with torch.no_grad():
            out = mmjit_forward(mmjit_params, run.mmjit, torch.from_numpy(x),
                                torch.from_numpy(context), torch.from_numpy(mask))
        return out.numpy()
    return denoise


def torch_encoder(run: Run):
    _, t5_params = split_tree(run.ema)

    def encode(ids, mask):
        with torch.no_grad():
            return t5_encode(t5_params, run.t5, torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    return encode


def shown_on_the_bar(logged: dict[str, float], losses: list[float]) -> dict[str, str]:
    """The progress bar's number after a step: a distillation's one-step error as it stands (a fixed
    batch, so no mean is needed), else the mean of `losses`, the last 50. A distillation's objective
    is adaptively weighted, each sample's error divided by about itself, so it sits near 1 however
    well the student does; the one-step error is what falls."""
    if "one_step" in logged:
        return {"one_step": f"{logged['one_step']:.4f}"}
    return {"loss": f"{np.mean(losses):.4f}"}


def train_steps(run: Run, desc: str, after_step) -> None:
    """Train `run` from where it stands to its recipe's last step, each step logged (loss, lr, time)
    and shown on a progress bar (`shown_on_the_bar`); `after_step(bar)` follows each logged step:
    the caller's checkpoints, evaluations or snapshots."""
    bar = tqdm(total=run.recipe.steps, initial=run.step, desc=desc, unit="step", dynamic_ncols=True)
    started, first_step, recent = time.time(), run.step, []
    while run.step < run.recipe.steps:
        logged = run.train_step()
        recent = (recent + [logged["loss"]])[-50:]
        bar.update(1)
        bar.set_postfix(shown_on_the_bar(logged, recent) | {"lr": f"{learning_rate(run.recipe, run.step):.1e}"})
        run.log({"step": run.step, **logged, "lr": learning_rate(run.recipe, run.step - 1),
                 "seconds": time.time() - started, "steps_this_session": run.step - first_step})
        after_step(bar)
    bar.close()


def train(run: Run, eval_every: int, checkpoint_every: int, eval_prompts: int, sample_steps: int,
          cfg_scale: float) -> None:
    """`train_steps` with a checkpoint every `checkpoint_every` steps and an evaluation every
    `eval_every` (0: none), both at the last step too."""
    def after_step(bar):
        if run.step % checkpoint_every == 0 or run.step == run.recipe.steps:
            run.save()
        if eval_every and (run.step % eval_every == 0 or run.step == run.recipe.steps):
            report = run.evaluate(evaluation_scenes(eval_prompts, seeds=1), sample_steps, cfg_scale)
            run.log({"step": run.step, "eval": report})
            bar.write(f"step {run.step}: {summary(report)}")

    train_steps(run, "training", after_step)


def summary(report: dict) -> str:
    """One line of an evaluation report: accuracies per group (background, colour, position,
    size, shape), shape by size, and the worst background error."""
    groups = [f"{group} " + " ".join(f"{v:.0%}" for v in report[group].values()) for group in ("held_in", "held_out")]
    sizes = " ".join(f"{size} {v:.0%}" for size, v in report["shape_by_size"]["held_in"].items())
    return "  ".join(groups) + f"  shape held-in {sizes}  background p99 <= {max(report['background_error'].values()):g}"


def sweep(run: Run, steps_options: list[int], cfg_options: list[float], eval_prompts: int) -> list[dict]:
    """Evaluate the EMA weights for every (sampler steps, guidance) pair: the numbers behind the
    exported "sampling" block. One row per pair, with the held-in and held-out accuracies."""
    scenes = evaluation_scenes(eval_prompts, seeds=1)
    rows = []
    for steps in steps_options:
        for cfg_scale in cfg_options:
            report = run.evaluate(scenes, steps, cfg_scale)
            rows.append({"step": run.step, "sweep": {"steps": steps, "cfg_scale": cfg_scale}, "eval": report})
            run.log(rows[-1], "sweep.jsonl")
            emit(f"steps {steps:3d} cfg {cfg_scale:4.1f}: {summary(report)}")
    return rows


# Where a run exports when --export-dir is not given: inside its own --run folder. A default never
# points into the installed package (an editable install would change the repository's files).
DEFAULT_EXPORT = "export"


def run_parser(prog: str, description: str) -> OneLineParser:
    """The flags every training script shares (train.py's defaults; distill.py changes some)."""
    p = OneLineParser(prog=prog, description=description)
    p.add_argument("--run", type=Path, default=Path("runs/demo"), help="checkpoint and log folder")
    p.add_argument("--export-dir", type=Path, default=None,
                   help=f"where the trained model is written (default: RUN/{DEFAULT_EXPORT}; never into the installed "
                        "package unless named: --export-dir minit2i/demo_model replaces the shipped model)")
    p.add_argument("--steps", type=int, default=Recipe.steps)
    p.add_argument("--batch", type=int, default=Recipe.batch)
    p.add_argument("--seed", type=int, default=Recipe.seed)
    p.add_argument("--lr", type=float, default=Recipe.lr, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=Recipe.warmup, help="warm-up steps")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="torch CPU threads")
    p.add_argument("--eval-every", type=int, default=500, help="0: never")
    p.add_argument("--eval-prompts", type=int, default=48)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--sample-steps", type=int, default=20, help="sampler steps of evaluation and export")
    p.add_argument("--cfg-scale", type=float, default=3.0, help="guidance of evaluation and export")
    p.add_argument("--export-only", action="store_true")
    p.add_argument("--sweep", action="store_true",
                   help="evaluate the checkpoint over --sweep-steps x --sweep-cfg instead of training")
    p.add_argument("--sweep-steps", type=int, nargs="+", default=[10, 20, 40])
    p.add_argument("--sweep-cfg", type=float, nargs="+", default=[1.5, 3.0, 5.0])
    p.add_argument("--low-noise-fraction", type=float, default=Recipe.low_noise_fraction,
                   help="share of each batch at low noise, t ~ U(--low-noise-t-min, 1) (1 = clean)")
    p.add_argument("--low-noise-t-min", type=float, default=Recipe.low_noise_t_min)
    p.add_argument("--phrase-probability", type=float, default=Recipe.phrase_probability,
                   help="chance that each optional caption phrase (size, position, background) is kept")
    return p


def parse_run_arguments(parser: OneLineParser, argv) -> argparse.Namespace:
    """`parser`'s arguments, with --export-dir defaulting to the --run folder's export/."""
    args = parser.parse_args(argv)
    if args.export_dir is None:
        args.export_dir = args.run / DEFAULT_EXPORT
    return args


def parse_args(argv=None):
    p = run_parser("train", __doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="the smoke-test architecture (CI)")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from an exported model (transformer/, t5/) instead of random weights")
    return parse_run_arguments(p, argv)


def check_arguments(args) -> None:
    """Every argument in its range, and the run and export folders usable, before any work (a
    zero count would train nothing or divide by zero; more threads than cores only slow torch
    down, and far more exhaust the process)."""
    for flag in ("steps", "batch", "eval_prompts", "checkpoint_every"):
        Range(1, 10**7).check(f"--{flag.replace('_', '-')}", getattr(args, flag))
    Range(1, os.cpu_count() or 1).check("--threads", args.threads)
    REQUEST_RANGES["seed"][1].check("--seed", args.seed)
    Range(0, 10**7).check("--eval-every", args.eval_every)
    Range(0, 10**7).check("--warmup", args.warmup)
    Range(0.0, 1.0, integer=False, low_open=True).check("--lr", args.lr)
    Range(0.0, 1.0, integer=False).check("--low-noise-fraction", args.low_noise_fraction)
    Range(0.0, 1.0, integer=False).check("--low-noise-t-min", args.low_noise_t_min)
    Range(0.0, 1.0, integer=False).check("--phrase-probability", args.phrase_probability)
    (_, steps), (_, cfg_scale) = REQUEST_RANGES["steps"], REQUEST_RANGES["cfg_scale"]
    steps.check("--sample-steps", args.sample_steps)
    cfg_scale.check("--cfg-scale", args.cfg_scale)
    for value in args.sweep_steps:
        steps.check("--sweep-steps", value)
    for value in args.sweep_cfg:
        cfg_scale.check("--sweep-cfg", value)
    if os.path.lexists(args.run) and not args.run.is_dir():
        raise MiniT2IError(f"--run {args.run} is not a folder; choose a folder for the checkpoint and log")
    if not args.sweep:
        check_export_dir(args.export_dir, args.run)


def main(argv=None) -> int:
    def command() -> int:
        args = parse_args(argv)
        check_arguments(args)
        return run_command(args)

    return guarded("train", command)


def run_command(args) -> int:
    torch.set_num_threads(args.threads)
    recipe = dataclasses.replace(Recipe(), **schedule_arguments(args))
    mmjit, t5 = (SMOKE_MMJIT, SMOKE_T5) if args.tiny else (DEMO_MMJIT, DEMO_T5)
    if args.init_from is not None:
        existing_path(args.init_from, "--init-from")
    return execute(Run(args.run, recipe, mmjit, t5, args.init_from), args)


def schedule_arguments(args) -> dict:
    """The `Schedule` fields the command line sets."""
    return {"steps": args.steps, "batch": args.batch, "seed": args.seed, "lr": args.lr, "warmup": args.warmup,
            "low_noise_fraction": args.low_noise_fraction, "low_noise_t_min": args.low_noise_t_min,
            "phrase_probability": args.phrase_probability}


def execute(run: Run, args) -> int:
    """Sweep, or train (resuming) and export, as the checked arguments say."""
    if (args.sweep or args.export_only) and not run.checkpoint_path.exists():
        raise MiniT2IError(f"no checkpoint in --run {args.run}: --{'sweep' if args.sweep else 'export-only'} "
                           "needs a trained run; train (or distil) first, without that flag")
    if args.sweep:
        sweep(run, args.sweep_steps, args.sweep_cfg, args.eval_prompts)
        return 0
    read_log(run.log_path)  # a damaged log is found before training, not at its export
    if not args.export_only:
        train(run, args.eval_every, args.checkpoint_every, args.eval_prompts, args.sample_steps, args.cfg_scale)
    run.export(args.export_dir, args.sample_steps, args.cfg_scale)
    emit(f"exported step {run.step} to {printable(str(args.export_dir), None)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
