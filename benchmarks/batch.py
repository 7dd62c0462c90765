"""Batch benchmark: images per second of `minit2i batch` on each engine, side by side in one run.

    python benchmarks/batch.py                      # 32 demo prompts, 1 image each, 20 steps (64 x 64)
    python benchmarks/batch.py --prompts 8          # a smoke run
    python benchmarks/batch.py --model demo-mf      # the four-step student

The configurations, each into a fresh run folder with the same prompt file and settings: the
local engine in this process, in 1 and in 2 spawned worker processes, and Ray with 2 actors on
a local cluster (skipped without the `ray` extra). Every worker draws with 1 BLAS thread
(--threads 1). Two rates per row: over the whole run (process start, model loading and, for Ray,
the cluster's start included) and steady (from the first image written to the last, by the
PNGs' modification times). The configurations run in turns, `--rounds` times, and each row
shows its best round: on a shared machine a busy neighbour slows one run, not every round of
one configuration. The sha256s of all runs are compared: the engines must agree.

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

from minit2i.batch import Spec, run_batch
from minit2i.batch.store import MANIFEST
from minit2i.training.score import prompt_lines

CONFIGURATIONS = [("local, in process", "local", None), ("local, 1 worker process", "local", 1),
                  ("local, 2 worker processes", "local", 2), ("ray, 2 actors (local cluster)", "ray", 2)]


def steady_rate(out: Path) -> float:
    """Images per second between the first and the last PNG written (by modification time)."""
    times = sorted(p.stat().st_mtime for p in out.glob("*/samples/*.png"))
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else float("nan")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32, help="demo scenes (held-in; one image each)")
    parser.add_argument("--model", default="demo")
    parser.add_argument("--steps", type=int, default=None, help="sampler steps (default: the model's)")
    parser.add_argument("--rounds", type=int, default=2, help="turns over the configurations; the best counts")
    args = parser.parse_args(argv)
    lines = prompt_lines(args.prompts, held_out_prompts=0)
    sampler = (("num_inference_steps", args.steps),) if args.steps else ()
    spec = Spec(args.model, threads=1, sampler=sampler)
    print(f"command: python benchmarks/batch.py {shlex.join(argv if argv is not None else sys.argv[1:])}")
    print(f"date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}; {os.cpu_count()} CPUs; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; python {platform.python_version()}")
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
