r"""One training step of MiniT2I, whole, in forty lines: what train.py's `Run.train_step` does
between its checkpoints, logs and exports, written out (tests/test_one_step.py holds the two to
the same weights, bit for bit).

The state is four dicts keyed by parameter name (train.py's flat "mmjit."/"t5." names): the
weights (requiring grad), their EMA, and AdamW's two moments; `step` counts the steps taken.
"""

from __future__ import annotations

import numpy as np
import torch

from minit2i.reference.sampler import NOISE_SCALE

from . import shapes
from .torch_model import mmjit_forward, t5_encode
from .train import learning_rate, split_tree


def training_step(weights, ema, first_moment, second_moment, step, recipe, mmjit, t5, tokenizer) -> float:
    """Advance every dict by one step of `recipe` (train.Recipe) at `step`; -> the loss before it."""
    # 1. The batch: images with captions, the captions dropped for guidance (an all-zero mask),
    #    t ~ sigmoid(N(mu, sigma)) (a share at low noise), the noise. All from (seed, step).
    rng = np.random.default_rng([recipe.seed, step])
    images, captions = shapes.random_batch(rng, recipe.batch, recipe.phrase_probability, mmjit.image_size)
    ids, mask = tokenizer(captions)
    kept = ~(rng.random(recipe.batch) < recipe.caption_drop)
    t = 1 / (1 + np.exp(-(recipe.t_mu + recipe.t_sigma * rng.standard_normal(recipe.batch))))
    low_noise = rng.random(recipe.batch) < recipe.low_noise_fraction
    t = np.where(low_noise, rng.uniform(recipe.low_noise_t_min, 1.0, recipe.batch), t)
    eps = torch.from_numpy(rng.standard_normal(images.shape, dtype=np.float32))
    x, t = torch.from_numpy(images), torch.from_numpy(t.astype(np.float32))[:, None, None, None]
    # 2. Mix: the point at t on the straight line from the noise 2 eps to the image.
    x_t = t * x + (1 - t) * NOISE_SCALE * eps
    # 3. Predict the clean image; the network is told the prompt, never t.
    mmjit_weights, t5_weights = split_tree(weights)
    context = t5_encode(t5_weights, t5, torch.from_numpy(ids), torch.from_numpy(mask))
    x0 = mmjit_forward(mmjit_weights, mmjit, x_t, context, torch.from_numpy((mask * kept[:, None]).astype(np.float32)))
    # 4. The loss on the velocity: (x0 - x_t)/(1 - t) against (x - x_t)/(1 - t), 1 - t floored.
    loss = (((x0 - x) / torch.clamp(1 - t, min=recipe.a_min)) ** 2).mean()
    grads = torch.autograd.grad(loss, list(weights.values()), allow_unused=True)
    # 5. AdamW: decay the weights, update both moments, step by the bias-corrected ratio. A weight
    #    the loss never reaches (the last block's text outputs) has no gradient and stays as it is.
    lr, (beta1, beta2), k = learning_rate(recipe, step), recipe.betas, step + 1
    with torch.no_grad():
        for (name, w), g in zip(weights.items(), grads):
            if g is not None:
                m, v = first_moment[name], second_moment[name]
                w.mul_(1 - lr * recipe.weight_decay)
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                w.addcdiv_(m, (v.sqrt() / (1 - beta2**k) ** 0.5).add_(ADAM_EPS), value=-lr / (1 - beta1**k))
            # 6. The EMA (its decay warms up, so early samples are not the initial weights).
            ema[name].lerp_(w, 1 - min(recipe.ema_decay, (1 + step) / (10 + step)))
    return loss.item()


ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which train.py keeps
