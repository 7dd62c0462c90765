"""How large a matrix product must be before a second BLAS thread pays: the measurement behind
`minit2i.core.threads.FLOPS_PER_THREAD`.

    python benchmarks/blas_threads.py            # about 2 minutes on 2 cores
    python benchmarks/blas_threads.py --quick    # the three smallest models, one repeat

One MMJiT forward (2 double blocks, batch 2: a guided step's conditional and unconditional rows)
at model sizes from the tiny test model to B/16 at 512 x 512, timed with NumPy's BLAS on one
thread and on every core, first on a quiet machine, then while two busy processes that this
script starts compete for the cores (benchmarks/load.py). Each row gives the size of the block's
largest product (`block_product_flops`), the two times and their ratio; the thread count
`threads_for` chooses for that size is the last column. Random weights in the real layout; the
fastest of the repeats counts, the two thread counts taking turns.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
from threadpoolctl import threadpool_limits

from minit2i.core.mmjit_config import MMJIT_B16, MMJIT_TINY, MMJiTConfig
from minit2i.core.threads import FLOPS_PER_THREAD, available_cores, block_product_flops, threads_for
from minit2i.core.weights import nest
from minit2i.demo_models import random_mmjit_weights
from minit2i.reference.mmjit import mmjit_forward

try:  # run as a script: benchmarks/ is on sys.path
    from load import busy_processes, load_average
except ImportError:  # imported as benchmarks.blas_threads
    from benchmarks.load import busy_processes, load_average

ROWS = 2
SEED = 0
DEMO = MMJiTConfig(image_size=64, patch_size=4, txt_input_size=128, hidden_size=128, num_heads=4, head_dim=32,
                   pca_channels=32, prompt_length=16, cond_vec_size=128)
# (name, config, image side): the tiny test model and the demo model, two sizes between, B/16.
LADDER = [
    ("tiny (test model)", MMJIT_TINY, 64),
    ("demo 64x64", DEMO, 64),
    ("D256 128x128", dataclasses.replace(DEMO, hidden_size=256, num_heads=8, image_size=128, patch_size=8), 128),
    ("D384 256x256", dataclasses.replace(MMJIT_B16, hidden_size=384, num_heads=6, prompt_length=64), 256),
    ("B/16 256x256", MMJIT_B16, 256),
    ("B/16 512x512", MMJIT_B16, 512),
]


def forward_case(config: MMJiTConfig, size: int):
    """(run, product FLOPs): one forward of 2 double blocks on [ROWS, C, size, size]."""
    config = dataclasses.replace(config, depth_double=2, txt_preamble_depth=1)
    params = nest(random_mmjit_weights(config, SEED))
    rng = np.random.default_rng(SEED)
    images = rng.standard_normal((ROWS, config.in_channels, size, size), dtype=np.float32)
    context = rng.standard_normal((ROWS, config.prompt_length, config.txt_input_size), dtype=np.float32)
    mask = np.ones((ROWS, config.prompt_length), dtype=np.float32)
    tokens = (size // config.patch_size) ** 2 + config.prompt_length
    return (lambda: mmjit_forward(params, config, images, context, mask)), block_product_flops(config, ROWS, tokens)


def best_seconds(run, thread_counts, repeats: int) -> dict[int, float]:
    """Fastest wall time of `run` under each BLAS thread count, the counts taking turns."""
    best = dict.fromkeys(thread_counts, float("inf"))
    for _ in range(repeats):
        for threads in thread_counts:
            with threadpool_limits(limits=threads, user_api="blas"):
                start = time.perf_counter()
                run()
                best[threads] = min(best[threads], time.perf_counter() - start)
    return best


def measure(ladder, repeats: int, cores: int) -> list[tuple]:
    rows = []
    for name, config, size in ladder:
        run, flops = forward_case(config, size)
        run()  # tables and first-touch pages out of the timing
        seconds = best_seconds(run, (1, cores), repeats)
        rows.append((name, flops, seconds[1], seconds[cores]))
    return rows


def print_rows(title: str, rows: list[tuple], cores: int) -> None:
    print(f"\n{title} (load {load_average()})")
    header = f"{'model (2 double blocks, batch 2)':<22} {'product MFLOP':>13} {'1 thread ms':>12} " \
             f"{f'{cores} threads ms':>12} {'1 / all':>8} {'chosen':>7}"
    print(header)
    print("-" * len(header))
    for name, flops, one, every in rows:
        print(f"{name:<22} {flops / 1e6:13.0f} {one * 1e3:12.1f} {every * 1e3:12.1f} {one / every:8.2f} "
              f"{threads_for(flops, cores):7d}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed forwards per thread count; the fastest counts")
    parser.add_argument("--quick", action="store_true", help="the three smallest models, one repeat")
    args = parser.parse_args(argv)
    ladder, repeats = (LADDER[:3], 1) if args.quick else (LADDER, args.repeats)
    cores = available_cores()
    print(f"numpy {np.__version__}; cores {cores}; FLOPS_PER_THREAD {FLOPS_PER_THREAD:.0e}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print_rows("quiet", measure(ladder, repeats, cores), cores)
    with busy_processes(2):
        print_rows("two busy processes", measure(ladder, repeats, cores), cores)


if __name__ == "__main__":
    main()
