r"""The watch-it-learn run's experiment switches that change the network's job, not the recipe:
what it predicts and which position signals it gets.

The model predicts the clean image x0 and has both position signals; an ablation's network
predicts the velocity $v = x - n$ or the noise $\varepsilon$ (with $n = 2\varepsilon$) instead,
or trains with RoPE only, the sin/cos table only, or no position at all. Whatever it predicts is
turned into the x0 it implies on the training path $x_t = t\,x + (1 - t)\,n$,

$$\hat x_0 = \hat y \;(x_0), \qquad \hat x_0 = x_t + (1 - t)\,\hat v \;(v), \qquad
\hat x_0 = \frac{x_t - (1 - t)\,2\hat\varepsilon}{\max(t,\ a_{\min})} \;(\varepsilon),$$

so the loss stays train.py's velocity loss and the sampler stays the reference's: only the
network's target moves. The conversion needs t, which the network is never told: the loss
has it from the batch, the sampler from its time grid.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from minit2i.core.mmjit_config import MMJiTConfig
from minit2i.core.t5_config import T5Config
from minit2i.reference.sampler import NOISE_SCALE, sample, time_grid

from .torch_model import POSITIONS, forward_with_positions
from .train import Recipe, Run, split_tree, training_batch, v_loss

PREDICTIONS = ("x0", "velocity", "noise")
# --positions: which of the model's two position signals the network gets.
POSITION_CHOICES = {"both": POSITIONS, "rope": ("rope",), "sincos": ("sincos",), "none": ()}


@dataclass(frozen=True)
class Variant:
    """What the network predicts and which positions it gets; the defaults are the model's."""

    predict: str = "x0"
    positions: str = "both"

    @property
    def is_the_model(self) -> bool:
        return self == Variant()


def inverse_square_mean(recipe: Recipe) -> float:
    """E[1 / max(t, a_min)^2] over the recipe's training times, exactly: t = sigmoid(z) with
    z ~ N(t_mu, t_sigma), except a share low_noise_fraction with t ~ U(low_noise_t_min, 1).

    With c = logit(a_min), below c the term is 1/a_min^2; above it 1/t^2 = (1 + e^-z)^2, and
    E[e^{-kz}; z > c] = exp(-k mu + k^2 sigma^2 / 2) Q((c - mu + k sigma^2) / sigma), Q the normal's
    upper tail. The uniform share gives 1/lo for lo = max(low_noise_t_min, a_min) (a_min < 1).
    """
    mu, sigma, a_min = recipe.t_mu, recipe.t_sigma, recipe.a_min
    cut = math.log(a_min / (1 - a_min))

    def upper_tail(x):
        return 0.5 * math.erfc(x / math.sqrt(2))

    above = sum(weight * math.exp(-k * mu + (k * sigma) ** 2 / 2) * upper_tail((cut - mu + k * sigma**2) / sigma)
                for k, weight in ((0, 1), (1, 2), (2, 1)))
    logit_normal = above + (1 - upper_tail((cut - mu) / sigma)) / a_min**2
    uniform = 1 / max(recipe.low_noise_t_min, a_min)
    return (1 - recipe.low_noise_fraction) * logit_normal + recipe.low_noise_fraction * uniform


def predicted_floor(prediction: str, patch: int, bottleneck: int, recipe: Recipe, channels: int = 3) -> float | None:
    """The velocity loss below which a network predicting `prediction` cannot go on average, or None
    where nothing forces one (x0: the clean image passes the bottleneck; or a bottleneck that hides
    nothing).

    The network sees each patch of channels * patch^2 numbers through `bottleneck` channels only,
    so the noise in the other directions never reaches it and its best answer there is 0 (model.md
    3.3). The velocity x - n holds the whole noise n = 2 eps, variance 4 a number: the hidden share
    of it stays, 4 * hidden / all. The noise's velocity error is 2 (eps - eps_hat) / t, so the same
    hidden noise costs E[1/max(t, a_min)^2] times as much (`inverse_square_mean`; the noise reading
    floors t at a_min, `x0_from`). docs/concepts.md 2 measures both."""
    numbers = channels * patch**2
    hidden = max(numbers - bottleneck, 0) / numbers
    if prediction == "x0" or hidden == 0:
        return None
    floor = NOISE_SCALE**2 * hidden
    return floor if prediction == "velocity" else floor * inverse_square_mean(recipe)


def x0_from(prediction: str, output, x_t, t, a_min: float):
    """The network's `output` [B, C, H, W] read as `prediction` -> the x0 it implies at (x_t, t),
    t a [B, 1, 1, 1] tensor or a float; the noise reading floors t at `a_min` as the velocity
    floors 1 - t (at t = 0 the noise alone says nothing about the image)."""
    if prediction == "velocity":
        return x_t + (1 - t) * output
    if prediction == "noise":
        return (x_t - (1 - t) * NOISE_SCALE * output) / torch.clamp(torch.as_tensor(t), min=a_min)
    return output


class AblationRun(Run):
    """A train.Run whose network follows `variant`; a variant other than the model's is part of
    the checkpoint's identity, so a run resumes only with the switches that started it."""

    FOLDER_FLAG = "--out"  # learn's
    SWITCHES = {"recipe.caption_drop": "--caption-drop", "mmjit.patch_size": "--patch",
                "mmjit.pca_channels": "--bottleneck", "variant.predict": "--predict",
                "variant.positions": "--positions"}

    def __init__(self, folder: Path, recipe: Recipe, mmjit: MMJiTConfig, t5: T5Config, variant: Variant):
        self.variant = variant
        super().__init__(folder, recipe, mmjit, t5)

    def identity(self) -> dict:
        variant = {} if self.variant.is_the_model else {"variant": dataclasses.asdict(self.variant)}
        return super().identity() | variant

    def changed_setting(self, recorded: dict, wanted: dict) -> str:
        """As Run's, the model's own variant (left out of an identity) filled in on both sides."""
        model = {"variant": dataclasses.asdict(Variant())}
        return super().changed_setting(model | recorded, model | wanted)

    def predict_x0(self, mmjit_params, x_t, t, context, mask):
        """x0 [B, C, H, W] from the variant's network at (x_t, t); t as in `x0_from`."""
        output = forward_with_positions(mmjit_params, self.mmjit, x_t, context, mask,
                                        POSITION_CHOICES[self.variant.positions])
        return x0_from(self.variant.predict, output, x_t, t, self.recipe.a_min)

    def loss(self, step: int):
        if self.variant.is_the_model:
            return super().loss(step)
        batch = training_batch(self.recipe, self.tokenizer, step, self.mmjit.image_size)
        return v_loss(self.params, self.mmjit, self.t5, batch, self.recipe.a_min, self.predict_x0), {}

    def sampler(self, steps: int, cfg_scale: float):
        if self.variant.is_the_model:
            return super().sampler(steps, cfg_scale)
        mmjit_params, _ = split_tree(self.ema)

        def draw(noise, context, mask):
            times = iter(time_grid(steps)[:-1])  # `sample` calls denoise once per step, in grid order

            def denoise(x, context, mask):
                with torch.no_grad():
                    x = torch.from_numpy(x)
                    return self.predict_x0(mmjit_params, x, float(next(times)), torch.from_numpy(context),
                                           torch.from_numpy(mask)).numpy().astype(np.float32)
            return sample(denoise, noise, context, mask, steps, cfg_scale)
        return draw
