"""Batch benchmark: images per second of `minit2i batch` on each engine, side by side in one run;
with --groups, by images a forward (--batch-size N) instead.

    python benchmarks/batch.py                      # 32 demo prompts, 1 image each, 20 steps (64 x 64)
    python benchmarks/batch.py --prompts 8          # a smoke run
    python benchmarks/batch.py --model demo-mf      # the four-step student
    python benchmarks/batch.py --groups             # N = 1, 2, 4, 8, 16: the demo model and B/16
    python benchmarks/batch.py --groups --jobs 8 --sizes 1 2 4 8 --b16-size 64 --rounds 1   # a brief run

The configurations, each into a fresh run folder with the same prompt file and settings: the
local engine in this process, in 1 and in 2 spawned worker processes, and Ray with 2 actors on
a local cluster (skipped without the `ray` extra). Every worker draws with 1 BLAS thread
(--threads 1). Two rates per row: over the whole run (process start, model loading and, for Ray,
the cluster's start included) and steady (from the first image written to the last, by the
PNGs' modification times). The configurations run in turns, `--rounds` times, and each row
shows its best round: on a shared machine a busy neighbour slows one run, not every round of
one configuration. The sha256s of all runs are compared: the engines must agree.

--groups: for each N, the rate at which one worker draws (`minit2i.batch.worker.Painter`, what
every engine runs; the PNGs are written beside it): the demo model's whole images (T5, 20 steps),
--jobs jobs of different prompts and seeds in groups of N, and B/16 with seeded random weights (its
real layout, `minit2i.demo_models`), one guided sampler step of N images ([cond ; uncond] of 2N
rows; an image is `--steps` of them, T5 once a prompt aside) at --b16-size. N = 16 runs where the
memory holds it (`minit2i.pipeline.estimate_memory`). The N take turns, --rounds times; the best
round counts, and each row shows its BLAS threads and the load average when it was measured.

This file lives outside tests/ on purpose: pytest never collects it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from minit2i.batch import Spec, run_batch
from minit2i.batch.store import MANIFEST
from minit2i.batch.worker import Job, Painter
from minit2i.pipeline import make_request, run_threads
from minit2i.training.score import prompt_lines

try:  # run as a script: benchmarks/ is on sys.path
    from load import load_average
except ImportError:  # imported as benchmarks.batch
    from benchmarks.load import load_average

GROUP_SIZES = (1, 2, 4, 8, 16)
B16_STEPS = 100  # the base model's recipe: a B/16 image is this many guided steps

CONFIGURATIONS = [("local, in process", "local", None), ("local, 1 worker process", "local", 1),
                  ("local, 2 worker processes", "local", 2), ("ray, 2 actors (local cluster)", "ray", 2)]


def steady_rate(out: Path) -> float:
    """Images per second between the first and the last PNG written (by modification time)."""
    times = sorted(p.stat().st_mtime for p in out.glob("*/samples/*.png"))
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else float("nan")


def demo_case(threads: int | None, count: int):
    """(draw(N) -> images drawn, BLAS threads): `count` demo images in groups of N, one Painter
    on `threads` (None: the pipeline's choice for the demo model's image, as `minit2i batch`)."""
    painter = Painter(Spec("demo", threads=threads))
    jobs = [Job(i, i, 0, line["prompt"], 42 + i) for i, line in enumerate(prompt_lines(count, held_out_prompts=0))]
    request = make_request(painter.pipe.files, jobs[0].prompt, {})

    def draw(size: int) -> int:
        for start in range(0, len(jobs), size):
            painter.draw(jobs[start:start + size])
        return len(jobs)

    return draw, threads or run_threads(request, painter.pipe.files)


def b16_case(threads: int | None, image_size: int):
    """(draw(N) -> images of a guided B/16 step: one forward of [cond ; uncond] for N images, BLAS
    threads: `threads`, else what the pipeline chooses for B/16's image at this size)."""
    from minit2i.core.mmjit_config import MMJIT_B16
    from minit2i.core.threads import blas_threads, block_product_flops, threads_for
    from minit2i.core.weights import nest
    from minit2i.demo_models import random_mmjit_weights
    from minit2i.reference.mmjit import mmjit_forward

    config, rng = MMJIT_B16, np.random.default_rng(1)
    params = nest(random_mmjit_weights(config, 0))
    tokens = (image_size // config.patch_size) ** 2 + config.prompt_length
    threads = threads or threads_for(block_product_flops(config, 2, tokens))

    def draw(size: int) -> int:
        rows = 2 * size
        images = rng.standard_normal((rows, config.in_channels, image_size, image_size), dtype=np.float32)
        context = rng.standard_normal((rows, config.prompt_length, config.txt_input_size), dtype=np.float32)
        mask = np.ones((rows, config.prompt_length), np.float32)
        mask[size:] = 0  # the unconditional rows
        with blas_threads(threads):
            mmjit_forward(params, config, images, context, mask)
        return size

    return draw, threads


def b16_sizes_that_fit(sizes, image_size: int) -> list[int]:
    """The `sizes` whose guided B/16 forward at `image_size` fits the memory available (the
    pipeline's estimate of a forward's activations; the weights are loaded already)."""
    from types import SimpleNamespace

    from minit2i.core.mmjit_config import MMJIT_B16
    from minit2i.core.t5_config import T5_FLAN_LARGE
    from minit2i.pipeline import Request, available_memory, estimate_memory

    shapes = SimpleNamespace(mmjit=SimpleNamespace(config=MMJIT_B16, num_parameters=0),
                             t5=SimpleNamespace(config=T5_FLAN_LARGE, num_parameters=0))
    have = available_memory() or float("inf")
    return [size for size in sizes
            if estimate_memory(Request("a", width=image_size, height=image_size, batch_count=size), shapes) <= have]


def group_rates(args) -> None:
    """The --groups table: each case's images per second at each N, best of --rounds turns (each
    round's rows printed as measured: a run on a busy machine that is stopped keeps what it has)."""
    cases = {"demo (whole images, 20 steps, 64 x 64)": (*demo_case(args.threads, args.jobs), args.sizes),
             f"B/16 random weights (one guided step, {args.b16_size} x {args.b16_size})":
                 (*b16_case(args.threads, args.b16_size), b16_sizes_that_fit(args.sizes, args.b16_size))}
    best: dict = {}
    header = f"{'case':<52} {'N':>3} {'images/s':>10} {'vs N=1':>7} {'BLAS threads':>13} {'load':>6}"
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}\n{header}", flush=True)
        for name, (draw, threads, sizes) in cases.items():
            draw(1)  # caches and first-touch pages out of the timing
            for size in sizes:
                start = time.perf_counter()
                drawn = draw(size)
                rate = drawn / (time.perf_counter() - start)
                if rate > best.get((name, size), (0.0,))[0]:
                    best[name, size] = (rate, load_average())
                shown = f"{rate:10.3f}" if name.startswith("demo") else f"{rate / B16_STEPS:10.5f}"
                print(f"{name:<52} {size:3d} {shown} {rate / best[name, sizes[0]][0]:7.2f} {threads:13d} "
                      f"{load_average():>6}", flush=True)
    print(f"best of {args.rounds} round(s)\n{header}")
    for name, (_, threads, sizes) in cases.items():
        for size in sizes:
            rate, load = best[name, size]
            shown = f"{rate:10.3f}" if name.startswith("demo") else f"{rate / B16_STEPS:10.5f}"
            print(f"{name:<52} {size:3d} {shown} {rate / best[name, sizes[0]][0]:7.2f} {threads:13d} {load:>6}")
    print(f"(B/16: images/s of {B16_STEPS}-step images, from the rate of one guided step; T5 left out)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32, help="demo scenes (held-in; one image each)")
    parser.add_argument("--model", default="demo")
    parser.add_argument("--steps", type=int, default=None, help="sampler steps (default: the model's)")
    parser.add_argument("--rounds", type=int, default=2, help="turns over the configurations; the best counts")
    parser.add_argument("--groups", action="store_true", help="images per second by --batch-size N instead")
    parser.add_argument("--b16-size", type=int, default=256, help="--groups: B/16's image size")
    parser.add_argument("--jobs", type=int, default=16, help="--groups: demo images drawn at each N")
    parser.add_argument("--threads", type=int, default=None,
                        help="--groups: BLAS threads (default: what the pipeline chooses for each model)")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(GROUP_SIZES), help="--groups: the N, 1 first")
    args = parser.parse_args(argv)
    if args.groups and (args.sizes[0] != 1 or max(args.sizes) > args.jobs):
        parser.error("--sizes must start with 1 (the rates are compared with it) and be at most --jobs")
    print(f"command: python benchmarks/batch.py {shlex.join(argv if argv is not None else sys.argv[1:])}")
    print(f"date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}; {os.cpu_count()} CPUs; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; python {platform.python_version()}")
    if args.groups:
        group_rates(args)
        return
    lines = prompt_lines(args.prompts, held_out_prompts=0)
    sampler = (("num_inference_steps", args.steps),) if args.steps else ()
    spec = Spec(args.model, threads=1, sampler=sampler)
    manifests, best = {}, {}
    with tempfile.TemporaryDirectory() as root:
        prompts = Path(root) / "prompts.jsonl"
        prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
        print(f"{len(lines)} prompts x 1 image, model {args.model}, BLAS threads 1 per worker, "
              f"best of {args.rounds} rounds")
        for round_ in range(args.rounds):
            for name, engine, workers in CONFIGURATIONS:
                if engine == "ray" and importlib.util.find_spec("ray") is None:
                    continue
                out = Path(root) / f"{round_}-{name.replace(' ', '_').replace(',', '')}"
                start = time.perf_counter()
                summary = run_batch(prompts, out, spec, engine=engine, workers=workers, progress=False)
                seconds = time.perf_counter() - start
                manifests[out] = sorted((out / MANIFEST).read_text().splitlines())
                rates = (summary.drawn, seconds, summary.drawn / seconds, steady_rate(out))
                best[name] = max(best.get(name, rates), rates, key=lambda r: r[2])
        blas = json.loads((out / "run.json").read_text())["numerical"]["blas"]
    print(f"{'engine':<32} {'images':>6} {'run s':>7} {'images/s':>9} {'steady images/s':>16}")
    for name, *_ in CONFIGURATIONS:
        if name not in best:
            print(f"{name:<32} skipped: needs the ray extra")
            continue
        drawn, seconds, rate, steady = best[name]
        print(f"{name:<32} {drawn:6d} {seconds:7.1f} {rate:9.2f} {steady:16.2f}")
    print(f"BLAS: {blas}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"same sha256s on every engine: {'yes' if len({tuple(m) for m in manifests.values()}) == 1 else 'NO'}")


if __name__ == "__main__":
    main()
