"""The forty-line training step (training/one_step.py) is train.py's step: from the same weights,
two steps of each give the same weights, EMA and AdamW moments, bit for bit (the same float32
operations in the same order; a mismatch in any op's order or constant shows as a difference)."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="training needs the [train] extra (torch)")
from minit2i.training import one_step, train  # noqa: E402  (needs torch)

# Every line of the step does something here: captions dropped, a low-noise share, weight decay.
RECIPE = dataclasses.replace(train.Recipe(), steps=4, batch=4, warmup=1, caption_drop=0.5, low_noise_fraction=0.5,
                             weight_decay=0.01)


def test_the_forty_line_step_gives_the_weights_of_train_py_step(tmp_path):
    run = train.Run(tmp_path / "run", RECIPE, train.SMOKE_MMJIT, train.SMOKE_T5)
    weights = {k: v.detach().clone().requires_grad_() for k, v in run.params.items()}
    ema = {k: v.clone() for k, v in run.ema.items()}
    first, second = ({k: torch.zeros_like(v) for k, v in ema.items()} for _ in range(2))
    for step in range(2):
        expected_loss = run.train_step()["loss"]
        loss = one_step.training_step(weights, ema, first, second, step, RECIPE, run.mmjit, run.t5, run.tokenizer)
        assert loss == expected_loss
    state = run.optimizer.state_dict()["state"]
    for i, name in enumerate(run.params):
        assert torch.equal(weights[name], run.params[name]), name
        assert torch.equal(ema[name], run.ema[name]), name
        unused = {"exp_avg": torch.zeros_like(ema[name]), "exp_avg_sq": torch.zeros_like(ema[name])}
        assert torch.equal(first[name], state.get(i, unused)["exp_avg"]), name
        assert torch.equal(second[name], state.get(i, unused)["exp_avg_sq"]), name
    assert any(not torch.equal(weights[k], torch.from_numpy(v)) for k, v in run.initial_weights().items())
