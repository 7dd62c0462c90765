"""Watch it learn: a small MiniT2I trained from scratch on a laptop CPU in minutes, from gray to shapes.

    python -m minit2i.training.learn --out runs/learn      # train (or resume), then draw and score
    python -m minit2i.training.learn --out runs/quick --steps 500
    python -m minit2i.training.learn --out runs/velocity --predict velocity   # an experiment (below)

The model is the demo model's architecture at a fraction of its size (32 x 32 images, patch 4,
hidden 64, two double blocks, one T5 layer) trained with train.py's objective and run machinery
(checkpoint, log, resume), on the same data set with its geometry halved. At a few steps spread
over the run (SNAPSHOT_FRACTIONS of it), the EMA weights draw a fixed row of prompts with fixed
seeds, and the checker (evaluate.py) reads back the same EVAL_PROMPTS prompts. The --out folder
ends up holding

    samples.png   columns: the prompts of SHEET_SCENES, each with its own seed; rows: the data set's
                  image of each, then the samples at each snapshot step
    loss.png      the training loss, 10-step means, log scale, the snapshot steps marked, and the
                  floor the switches predict (--predict velocity or noise: `predicted_floor`)
    samples/      one row per snapshot (the rows of samples.png; a resumed run keeps them)
    export/       the final model (EMA weights) as train.py exports it: `minit2i generate --model
                  OUT/export/transformer --t5 OUT/export/t5 -p ...` draws with it
    checkpoint.safetensors, log.jsonl   train.py's run: the same command resumes an interrupted run

and it prints, per snapshot, the loss and how many images the checker read right per attribute,
then the final model's colour and position counts.

Experiment switches, each a run of the same length beside the default one (docs/concepts.md
shows them): --predict velocity or noise (the loss stays on the velocity, training/ablations.py),
--positions rope, sincos or none, --caption-drop (0: guidance has no unconditional branch to
push from), --patch 8 (four times the numbers per patch through the same 16-channel bottleneck),
--bottleneck (the channels every patch passes through: 48 hides nothing of a 4-pixel patch).
A run with another prediction or positions is not exported: `minit2i generate` draws with the
model's x0 and both position signals.
"""

from __future__ import annotations

from . import require_torch

require_torch("learn")
import dataclasses
import os
import re
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from minit2i.console import OneLineParser, emit, guarded, printable
from minit2i.core.checks import Range, file_kind, read_limited, shown, walk, writable_folder
from minit2i.core.errors import MiniT2IError
from minit2i.core.images import decode_png, grid, save_png

from . import shapes
from .ablations import POSITION_CHOICES, PREDICTIONS, AblationRun, Variant, predicted_floor
from .charts import font, loss_chart
from .evaluate import ATTRIBUTES, draw_scenes, evaluation_scenes
from .train import (CHECKPOINT, DEFAULT_EXPORT, DEMO_MMJIT, DEMO_T5, Recipe, Run, check_export_dir,
                    check_writable_parent, compact_log, read_log, torch_encoder, train_steps)

LEARN_MMJIT = dataclasses.replace(DEMO_MMJIT, image_size=32, txt_input_size=64, hidden_size=64, depth_double=2,
                                  txt_preamble_depth=1, num_heads=2, pca_channels=16, cond_vec_size=64)
LEARN_T5 = dataclasses.replace(DEMO_T5, d_model=64, num_heads=2, d_ff=128, num_layers=1)
# The official t distribution (no low-noise share: from scratch it starves the high-noise steps
# where layout is learnt, docs/demo-model-trials.md), a higher rate than the demo model's for a
# narrower network, an EMA short enough to follow a run of a few thousand steps, and full captions
# only (every attribute named: keeping each optional phrase with the demo's 0.75, colour was read
# right on 87-88 of 96 images after 3,000 steps, with full captions on 95; docs/demo-model.md).
LEARN_RECIPE = Recipe(steps=3000, lr=2e-3, warmup=100, ema_decay=0.995, low_noise_fraction=0.0,
                      phrase_probability=1.0)
SAMPLE_STEPS, CFG_SCALE = 20, 3.0
# Snapshots at these fractions of the run: dense early, where the pictures change most.
SNAPSHOT_FRACTIONS = (0, 1 / 64, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1)
CHECKPOINT_EVERY = 250
EVAL_PROMPTS = 64  # held-in prompts of the checker's read-back; held-out pairs: half as many
# The columns of samples.png: every colour, shape, position and background, no held-out pair.
SHEET_SCENES = tuple(shapes.Scene(*words.split()) for words in (
    "large red circle left black", "small blue square right white", "large yellow triangle top navy",
    "small green cross bottom gray", "large purple square center white", "small orange circle top black",
    "large cyan triangle bottom gray", "small white cross left navy"))
PATCH_SIZES = (4, 8)  # 8: 8 x 8 x 3 = 192 numbers a patch, through the bottleneck 4's 48 go through
SHEET_SCALE = 3  # each 32 x 32 sample is shown at 96 x 96
ROWS = "samples"
ROW_LIMIT = 2**20  # a snapshot row: 8 samples of 32 x 32 as one PNG, about 10 kB


def snapshot_steps(steps: int) -> list[int]:
    """The steps (0 to `steps`, no repeats) after which the model draws a row and is read back."""
    return sorted({round(steps * f) for f in SNAPSHOT_FRACTIONS})


def row_path(folder: Path, step: int) -> Path:
    return folder / ROWS / f"step-{step:07d}.png"


def rows_taken(folder: Path) -> list[int]:
    """The steps of the snapshot rows in the run `folder`, in order (a run extended with a larger
    --steps keeps the rows of its shorter schedule). The run folder is read as any file from
    outside: an entry named like a row that is not a plain file (a link, a FIFO, a folder) is one
    line, never followed or opened."""
    rows = folder / ROWS
    if not os.path.lexists(rows):
        return []
    kind = file_kind(rows.lstat().st_mode)
    if kind != "folder":
        raise MiniT2IError(f"{rows} is a {kind}, not the folder of snapshot rows this command writes; delete it "
                           "and run the same command again")
    steps = []
    for entry in walk(rows, enter=lambda name: False):
        name = re.fullmatch(r"step-(\d{7})\.png", entry[0])
        if name and not entry[1].is_file(follow_symlinks=False):
            raise MiniT2IError(f"{rows / entry[0]} is a {file_kind(entry[1].stat(follow_symlinks=False).st_mode)}, "
                               "not a snapshot row this command wrote; delete it and run the same command again")
        if name:
            steps.append(int(name[1]))
    return sorted(steps)


def snapshot(run: Run, eval_scenes) -> None:
    """Draw the sheet's row with the EMA weights, read back `eval_scenes` with the checker (into
    the log, as train.py's evaluations), and save the row (last: a row on disk is a finished
    snapshot)."""
    row = sheet_row(run, CFG_SCALE)
    run.log({"step": run.step, "eval": run.evaluate(eval_scenes, SAMPLE_STEPS, CFG_SCALE)})
    (run.folder / ROWS).mkdir(exist_ok=True)
    save_png(row, row_path(run.folder, run.step))


def sheet_row(run: Run, cfg_scale: float) -> np.ndarray:
    """uint8 [S, S * n, 3]: the EMA weights' samples of the n SHEET_SCENES, scene i with seed i, at
    guidance `cfg_scale`."""
    draw = run.sampler(SAMPLE_STEPS, cfg_scale)
    row = draw_scenes([(scene, seed, False) for seed, scene in enumerate(SHEET_SCENES)], run.tokenizer,
                      torch_encoder(run), draw, run.mmjit.image_size)
    return grid(list(row), len(row))


def learn(run: Run, eval_prompts: int) -> None:
    """Train `run` to its recipe's steps from where it stands, checkpointing every
    CHECKPOINT_EVERY steps and at every snapshot step, taking each snapshot not yet on disk."""
    snapshots = snapshot_steps(run.recipe.steps)
    eval_scenes = evaluation_scenes(eval_prompts, seeds=1)
    if not run.checkpoint_path.exists():
        run.save()  # the folder is a run from its first moment, so the same command resumes it

    def take_missing_snapshot():
        if run.step in snapshots and not row_path(run.folder, run.step).exists():
            snapshot(run, eval_scenes)

    def after_step(bar):
        if run.step % CHECKPOINT_EVERY == 0 or run.step in snapshots:
            run.save()
        take_missing_snapshot()

    take_missing_snapshot()  # step 0, or the snapshot an interrupted run saved its checkpoint for
    train_steps(run, "learning", after_step)


# ---------------------------------------------------------------------------------------------
# The pictures


def data_row(image_size: int) -> np.ndarray:
    """uint8 [S, S * n, 3]: the data set's own image of each of the n SHEET_SCENES, what the samples
    should become."""
    return grid([shapes.render(scene, image_size) for scene in SHEET_SCENES], len(SHEET_SCENES))


def sample_sheet(rows: list[np.ndarray], labels: list[str]) -> np.ndarray:
    """Rows of n [32, 32, 3] samples ([32, 32 * n, 3] each) -> uint8 image: the rows enlarged
    SHEET_SCALE times, framed by gaps, each with its label on the left, under a header naming
    each column's scene."""
    cell, gap, margin, header = LEARN_MMJIT.image_size * SHEET_SCALE, 4, 90, 52
    columns = len(SHEET_SCENES)
    width = margin + columns * (cell + gap)
    height = header + len(rows) * (cell + gap)
    sheet = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for c, scene in enumerate(SHEET_SCENES):
        label = f"{scene.size} {scene.colour}\n{scene.shape}, {scene.position}\non {scene.background}"
        draw.multiline_text((margin + c * (cell + gap), 4), label, fill=(0, 0, 0), font=font(12), spacing=2)
    for r, (row, label) in enumerate(zip(rows, labels)):
        top = header + r * (cell + gap)
        draw.text((6, top + cell // 2 - 8), label, fill=(0, 0, 0), font=font(14))
        enlarged = row.repeat(SHEET_SCALE, axis=0).repeat(SHEET_SCALE, axis=1)
        for c in range(columns):
            tile = enlarged[:, c * cell:(c + 1) * cell]
            sheet.paste(Image.fromarray(np.ascontiguousarray(tile)), (margin + c * (cell + gap), top))
    return np.asarray(sheet)


def read_row(path: Path, columns: int, image_size: int) -> np.ndarray:
    """A snapshot row this command wrote, checked to be one before it is decoded (a plain file of
    at most ROW_LIMIT bytes, a PNG of the row's size): uint8 [S, S * columns, 3]."""
    data = read_limited(path, "snapshot row", ROW_LIMIT, follow_links=False)
    return decode_png(data, path, "a PNG row this command wrote", (image_size * columns, image_size),
                      "delete it and run the same command again")


# ---------------------------------------------------------------------------------------------
# What it prints


def checked_evaluations(records: list[dict], steps: list[int], folder: Path, log_path: Path) -> dict[int, dict]:
    """{step: the checker's read-back logged for it} for each snapshot row's step, each checked to
    be one this command logs (`is_evaluation`): a log cut or edited since is one line, with the
    fix (without the row, its snapshot is left out, or taken again at the run's last step)."""
    logged = {r["step"]: r["eval"] for r in records if "eval" in r}
    for step in steps:
        fix = f"delete {row_path(folder, step)} and run the same command again"
        if step not in logged:
            raise MiniT2IError(f"the training log {log_path} has no read-back of the snapshot at step {step} (it was "
                               f"cut or edited); {fix}")
        if not is_evaluation(logged[step]):
            raise MiniT2IError(f"the training log {log_path} holds a read-back at step {step} that this command did "
                               f"not write ({shown(logged[step])}); {fix}")
    return {step: logged[step] for step in steps}


def is_evaluation(report) -> bool:
    """A read-back as `accuracy_report` writes it, as far as the results use it: image counts per
    group (whole numbers, some images in all), and for each group with images a share in [0, 1]
    of each ATTRIBUTE."""
    counts = report.get("counts") if isinstance(report, dict) else None
    if not (isinstance(counts, dict) and counts and set(counts) <= {"held_in", "held_out"}
            and all(Range(0, 10**6).contains(n) for n in counts.values()) and sum(counts.values()) > 0):
        return False
    share = Range(0, 1, integer=False)
    return all(isinstance(report.get(group), dict) and all(share.contains(report[group].get(a)) for a in ATTRIBUTES)
               for group, count in counts.items() if count)


def right_counts(report: dict) -> dict[str, int]:
    """{attribute: images read right}, held-in and held-out together (accuracy_report's shares
    times its counts)."""
    groups = [g for g in ("held_in", "held_out") if g in report]
    return {a: round(sum(report[g][a] * report["counts"][g] for g in groups)) for a in ATTRIBUTES}


def score_table(evaluations: dict[int, dict], losses: dict[int, float]) -> str:
    """One line per snapshot: its step, the last 10-step mean of the loss up to it (`losses`: by
    each window's last step) and how many images the checker read right per attribute."""
    total = sum(next(iter(evaluations.values()))["counts"].values())
    lines = [f"{'step':>6} {'loss':>7}  " + "  ".join(f"{a:>10}" for a in ATTRIBUTES) + f"   (right of {total})"]
    for step, report in sorted(evaluations.items()):
        windows = [w for w in losses if w <= step]
        loss = f"{losses[max(windows)]:7.4f}" if windows else f"{'-':>7}"
        lines.append(f"{step:6d} {loss}  " + "  ".join(f"{n:10d}" for n in right_counts(report).values()))
    return "\n".join(lines)


def final_line(report: dict) -> str:
    """The final model's colour and position read-back, as counts and shares of all images."""
    total = sum(report["counts"].values())
    right = right_counts(report)
    return (f"the checker read the final model's {total} images right by colour on {right['colour']} "
            f"({right['colour'] / total:.0%}) and by position on {right['position']} ({right['position'] / total:.0%})")


def write_results(run: Run) -> None:
    """samples.png and loss.png from the run's rows and log, and the scores printed."""
    steps = rows_taken(run.folder)
    records = read_log(run.log_path)
    evaluations = checked_evaluations(records, steps, run.folder, run.log_path)
    curve = [r for r in compact_log(records, run.step) if "loss" in r]
    losses = {r["step"]: r["loss"] for r in curve}
    rows = [read_row(row_path(run.folder, step), len(SHEET_SCENES), run.mmjit.image_size) for step in steps]
    sheet = sample_sheet([data_row(run.mmjit.image_size), *rows], ["the data", *(f"step {s}" for s in steps)])
    save_png(sheet, run.folder / "samples.png")
    if curve:
        floor = predicted_floor(run.variant.predict, run.mmjit.patch_size, run.mmjit.pca_channels, run.recipe)
        chart = loss_chart(np.array([r["step"] for r in curve]), np.array([r["loss"] for r in curve]),
                           title="loss (10-step means)", x_label="training step (dotted: snapshots)", marks=steps,
                           floor=(floor, f"predicted floor {floor:.2f}") if floor else None)
        save_png(chart, run.folder / "loss.png")
    emit(score_table(evaluations, losses))
    emit(final_line(evaluations[run.step]))
    emit(f"wrote {printable(str(run.folder / 'samples.png'), None)} (rows: steps {', '.join(map(str, steps))}; "
         f"columns: {'; '.join(scene.caption() for scene in SHEET_SCENES)}) and loss.png")


# ---------------------------------------------------------------------------------------------
# The command


def parse_args(argv=None):
    p = OneLineParser(prog="learn", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/learn"),
                   help="the run's folder: new, empty, or an earlier run of this command (resumed)")
    p.add_argument("--steps", type=int, default=LEARN_RECIPE.steps, help="training steps")
    p.add_argument("--eval-prompts", type=int, default=EVAL_PROMPTS,
                   help="held-in prompts the checker reads back at each snapshot (held-out pairs: half as many)")
    p.add_argument("--predict", choices=PREDICTIONS, default="x0",
                   help="what the network predicts (an experiment: the model predicts x0; the loss is always on the "
                        "velocity)")
    p.add_argument("--positions", choices=tuple(POSITION_CHOICES), default="both",
                   help="the position signals the network gets (an experiment: the model has both, sin/cos and RoPE)")
    p.add_argument("--caption-drop", type=float, default=LEARN_RECIPE.caption_drop,
                   help="share of training captions dropped, the unconditional branch guidance pushes from")
    p.add_argument("--patch", type=int, choices=PATCH_SIZES, default=LEARN_MMJIT.patch_size,
                   help="patch size in pixels")
    p.add_argument("--bottleneck", type=int, default=LEARN_MMJIT.pca_channels,
                   help="channels of the patch embedding's bottleneck (a 4-pixel patch holds 48 numbers)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: on a machine whose cores are busy, two threads ran ten "
                        "times slower than one, each waiting for the other)")
    return p.parse_args(argv)


def check_arguments(args) -> None:
    """Every count in range and --out usable (a folder this command may write in), before any work."""
    Range(1, 10**6).check("--steps", args.steps)
    Range(1, 10**4).check("--eval-prompts", args.eval_prompts)
    Range(1, os.cpu_count() or 1).check("--threads", args.threads)
    Range(0.0, 1.0, integer=False).check("--caption-drop", args.caption_drop)
    Range(1, 3 * max(PATCH_SIZES) ** 2).check("--bottleneck", args.bottleneck)
    out = args.out
    if not os.path.lexists(out):
        check_writable_parent(out, "--out")
        return
    if out.is_symlink() or not out.is_dir():
        raise MiniT2IError(f"--out {out} is a {file_kind(out.lstat().st_mode)}, not a folder; choose a new folder")
    if any(out.iterdir()) and not (out / CHECKPOINT).exists():
        raise MiniT2IError(f"--out {out} holds files but no {CHECKPOINT} of an earlier run; choose a new or empty "
                           "folder")
    writable_folder(out, "--out")
    check_export_dir(out / DEFAULT_EXPORT, out)


def run_of(args) -> AblationRun:
    """The run the checked arguments describe, resumed from --out's checkpoint if there is one."""
    recipe = dataclasses.replace(LEARN_RECIPE, steps=args.steps, caption_drop=args.caption_drop)
    mmjit = dataclasses.replace(LEARN_MMJIT, patch_size=args.patch, pca_channels=args.bottleneck)
    return AblationRun(args.out, recipe, mmjit, LEARN_T5, Variant(args.predict, args.positions))


def main(argv=None) -> int:
    def command() -> int:
        args = parse_args(argv)
        check_arguments(args)
        torch.set_num_threads(args.threads)
        args.out.mkdir(parents=True, exist_ok=True)
        run = run_of(args)
        if run.step > args.steps:
            raise MiniT2IError(f"--out {args.out} holds a run at step {run.step}, past --steps {args.steps}; pass "
                               f"--steps {run.step} or more, or choose a new folder")
        # The log and the rows it must account for are read before training, which appends to the one
        # and rewrites the checkpoint: a damaged log is refused with the run as it was.
        checked_evaluations(read_log(run.log_path), rows_taken(run.folder), run.folder, run.log_path)
        learn(run, args.eval_prompts)
        write_results(run)
        if not run.variant.is_the_model:
            emit("not exported: minit2i generate draws with the model's x0 prediction and both position signals")
            return 0
        export = args.out / DEFAULT_EXPORT
        run.export(export, SAMPLE_STEPS, CFG_SCALE)
        emit(f"exported the final model: minit2i generate --model {printable(str(export / 'transformer'), None)} "
             f"--t5 {printable(str(export / 't5'), None)} -p \"{SHEET_SCENES[0].caption()}\" -o circle.png")
        return 0

    return guarded("learn", command)


if __name__ == "__main__":
    sys.exit(main())
