"""Print the numbers docs/concepts.md quotes that no figure shows (the `train` extra; run from the
repository root):

    python scripts/concept_numbers.py

* the loss floors of the watch-it-learn switches (training/ablations.py `predicted_floor`), and the
  noise floor for the very draws of t behind the last 10-step mean of a 3,000-step run;
* the Mean Flow student's du/dt (training/distill.py `along_the_path`): the JVP with the tangent
  (v, 1, 0) against a central difference along the same path, and against the partial derivative
  in t alone (tangent (0, 1, 0)), on one distillation batch of the shipped student and teacher.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import torch

from minit2i.core.weights import nest
from minit2i.core.tokenizer import PromptTokenizer, make_word_tokenizer
from minit2i.demo_models import DEMO_MODEL_DIR, DEMO_STUDENT_DIR
from minit2i.training.ablations import inverse_square_mean, predicted_floor
from minit2i.training.distill import (DistillRecipe, DistillRun, along_the_path, average_velocity_of, distill_batch,
                                      guided_velocity, per_sample)
from minit2i.training import shapes
from minit2i.training.learn import LEARN_MMJIT, LEARN_RECIPE
from minit2i.training.torch_model import to_torch_tree
from minit2i.training.train import training_batch

# The central difference's steps along the path: its error falls as h^2 (float64 rounding, ~1e-16
# over 2h, stays far below).
STEPS = (1e-3, 1e-4, 1e-5)


def floors() -> None:
    recipe = LEARN_RECIPE
    for prediction, patch, bottleneck in (("velocity", 4, 16), ("velocity", 8, 16), ("velocity", 4, 48),
                                          ("noise", 4, 16)):
        floor = predicted_floor(prediction, patch, bottleneck, recipe)
        print(f"floor of --predict {prediction} --patch {patch} --bottleneck {bottleneck}: "
              + ("none" if floor is None else f"{floor:.2f}"))
    unfloored = dataclasses.replace(recipe, a_min=1e-12)
    print(f"E[1/max(t, {recipe.a_min})^2] = {inverse_square_mean(recipe):.2f}; "
          f"E[1/t^2] = {inverse_square_mean(unfloored):.2f} (noise floors {8 / 3 * inverse_square_mean(recipe):.2f} "
          f"and {8 / 3 * inverse_square_mean(unfloored):.2f})")
    # The loss logged at step k is that of batch k - 1; the last 10-step mean of a 3,000-step run
    # holds batches 2,990 to 2,999.
    tokenizer = PromptTokenizer(make_word_tokenizer(shapes.vocabulary()), LEARN_MMJIT.prompt_length)  # train.Run's
    t = np.concatenate([training_batch(recipe, tokenizer, step, LEARN_MMJIT.image_size)["t"].numpy()
                        for step in range(recipe.steps - 10, recipe.steps)])
    print(f"the noise floor for the t of batches {recipe.steps - 10}..{recipe.steps - 1} (the last 10-step mean): "
          f"{8 / 3 * np.mean(1 / np.maximum(t, recipe.a_min) ** 2):.2f}")


def mean_flow_derivative() -> None:
    recipe = dataclasses.replace(DistillRecipe(), batch=4)
    with tempfile.TemporaryDirectory() as folder:
        run = DistillRun(Path(folder) / "run", recipe, DEMO_MODEL_DIR, (0.0, 1.0), DEMO_STUDENT_DIR)
    drawn = distill_batch(recipe, run.tokenizer, 1)  # batch 0's rows all have r = t; this one's last two not
    # Float64 throughout, so that the central difference shows its own h^2 error, not float32's rounding.
    batch = {name: value.double() if value.is_floating_point() else value for name, value in drawn.items()}
    context = run.encode(drawn["ids"], drawn["mask"]).double()
    teacher = to_torch_tree(nest(run.teacher_tensors), dtype=torch.float64)
    student = to_torch_tree(nest(run.initial_weights()), dtype=torch.float64)
    t, r = batch["t"], batch["r"]
    z = per_sample(1 - t) * batch["images"] + per_sample(t) * batch["noise"]
    v = guided_velocity(teacher, run.teacher_config, z, t, batch["omega"], context, batch["mask"])
    u_of = average_velocity_of(student, run.mmjit, batch, context)
    with torch.no_grad():
        _, total = along_the_path(u_of, z, t, r, v)
        _, partial = along_the_path(u_of, z, t, r, torch.zeros_like(v))
        differences = {h: (u_of(z + h * v, t + h, r) - u_of(z - h * v, t - h, r)) / (2 * h) for h in STEPS}
    for i in range(recipe.batch):
        size = float(total[i].norm())
        gaps = ", ".join(f"{float((differences[h][i] - total[i]).norm()) / size:.1e} (h = {h:g})" for h in STEPS)
        print(f"sample {i}: t = {float(t[i]):.2f}, r = {float(r[i]):.2f}: |du/dt| = {size:.1f}; the central difference "
              f"along (v, 1, 0) differs from the JVP by {gaps} of it; the partial derivative in t alone by "
              f"{float((partial[i] - total[i]).norm()) / size:.2f}")


def main() -> None:
    torch.set_num_threads(1)
    floors()
    mean_flow_derivative()


if __name__ == "__main__":
    main()
