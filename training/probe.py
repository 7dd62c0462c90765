"""How sharp can the demo model draw at all? Its x0 prediction from a nearly clean image.

    python -m minit2i.training.probe                       # the shipped demo model, t = 0.5 ... 0.99
    python -m minit2i.training.probe --model DIR --t 0.9 0.99
    python -m minit2i.training.probe --model demo-mf        # a four-step student's own x0

The sampler's image is the guided x0 prediction of its last step (t = 0.95 at 20 steps), so a
shape the network cannot reproduce from an almost clean input it cannot draw either. The probe
noises every held-in scene's true image to x_t = t x + (1 - t) 2 eps (the training convention,
one fixed eps), asks the network (conditional branch, full caption) for x0, and reads the
prediction back with the evaluation's checker: shape accuracy per size, and the same for the
noisy input itself (x_t / t), which shows how much of the shape the input still carries.

A Mean Flow student is probed through its flow-matching prediction: step length h = 0, omega 1,
guidance interval [0, 1], at its own time 1 - t. That is the instantaneous velocity its r = t
training rows match to the teacher's, so the two tables compare directly.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from minit2i.console import OneLineParser, emit, guarded
from minit2i.core.checks import Range
from minit2i.core.images import to_pixels
from minit2i.reference.sampler import NOISE_SCALE

from . import shapes
from .evaluate import accuracy_report, add_model_arguments, check_model_arguments, model_folders

DEFAULT_TIMES = (0.5, 0.8, 0.9, 0.95, 0.99)
PROBE_SEED = 0
BATCH = 64


def noised(images: np.ndarray, t: float, seed: int = PROBE_SEED) -> np.ndarray:
    """[B, C, H, W] clean images -> x_t = t x + (1 - t) 2 eps, float32, eps ~ N(0, I) from `seed`."""
    eps = np.random.default_rng(seed).standard_normal(images.shape, dtype=np.float32)
    return (t * images + (1 - t) * NOISE_SCALE * eps).astype(np.float32)


def shape_readback(scenes, pixels) -> dict[str, float]:
    """{size: fraction of the scenes of that size whose image the checker reads as the scene's
    shape} (the evaluation's own per-size shape accuracy)."""
    return accuracy_report([(scene, 0, False) for scene in scenes], pixels)["shape_by_size"]["held_in"]


def probe(model: str | Path = "demo", times=DEFAULT_TIMES, scenes=None, t5: Path | None = None) -> dict[float, dict]:
    """{t: {"prediction": shape_readback of the conditional x0 from x_t, "input": that of x_t / t}}
    over `scenes` (default: every held-in scene), with the NumPy reference network; `model` and
    `t5` as `model_folders` takes them."""
    from minit2i.pipeline import is_student, load_model, make_runner

    loaded = load_model(*model_folders(model, t5))
    runner = make_runner(loaded, "numpy")

    def predict_x0(x, context, mask):
        if not is_student(loaded):
            return runner.denoise(x, context, mask)
        zero, one = np.zeros(len(x), np.float32), np.ones(len(x), np.float32)
        return runner.denoise_student(x, zero, one, zero, one, context, mask)

    scenes = list(shapes.all_scenes(False) if scenes is None else scenes)
    clean = shapes.to_model_range(np.stack([shapes.render(s) for s in scenes]))
    report = {}
    for t in times:
        x_t = noised(clean, t)
        predicted = []
        for start in range(0, len(scenes), BATCH):
            ids, mask = loaded.tokenizer([s.caption() for s in scenes[start:start + BATCH]])
            context = runner.encode(ids, mask)
            predicted += list(to_pixels(predict_x0(x_t[start:start + BATCH], context, mask)))
        report[t] = {"prediction": shape_readback(scenes, predicted),
                     "input": shape_readback(scenes, to_pixels(x_t / np.float32(t)))}
    return report


def markdown_table(report: dict[float, dict]) -> str:
    sizes = list(next(iter(report.values()))["prediction"])
    lines = ["| t | " + " | ".join(f"x0 right, {s}" for s in sizes) + " | " + " | ".join(f"input right, {s}" for s in sizes) + " |",
             "|---" * (2 * len(sizes) + 1) + "|"]
    for t, row in report.items():
        cells = [f"{row['prediction'][s]:.0%}" for s in sizes] + [f"{row['input'][s]:.0%}" for s in sizes]
        lines.append(f"| {t:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    def command() -> int:
        p = OneLineParser(prog="probe", description=__doc__.splitlines()[0])
        add_model_arguments(p)
        p.add_argument("--t", type=float, nargs="+", default=list(DEFAULT_TIMES),
                       help="noise levels to probe (1 = clean)")
        args = p.parse_args(argv)
        for t in args.t:
            Range(0, 1, integer=False, low_open=True).check("--t", t)
        check_model_arguments(args)
        emit(markdown_table(probe(args.model, args.t, t5=args.t5)))
        return 0

    return guarded("probe", command)


if __name__ == "__main__":
    sys.exit(main())
