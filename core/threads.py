"""How many BLAS threads NumPy's matrix products run on, chosen from the size of the work.

OpenBLAS (and MKL) start one thread per core and hand each matrix product to all of them. For
the demo models' products (hidden 128, a few hundred tokens) waking and joining the threads
costs more than the product itself, and on a machine whose other programs keep a core busy the
threads spin waiting for one another: the demo image takes 5-17x longer than on one thread.
For the real models' products (hidden 768, 1280 tokens) every core pays. So the NumPy paths run
under `blas_threads`, which gives a product one thread per `FLOPS_PER_THREAD` of its work, and
at most one per core; threadpoolctl sets the count in the BLAS library NumPy loaded, for the
duration of a `with` block, and puts the old count back after it.

A user's own choice wins: an explicit count (`--threads`, `threads=`) first, then any of the
`*_NUM_THREADS` variables the BLAS libraries read themselves (`THREAD_VARIABLES`), which are
left to act as set.
"""

from __future__ import annotations

import contextlib
import os

from .checks import Range
from .errors import MiniT2IError

# The variables through which a user sets the BLAS libraries' thread count by hand.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# Matmul FLOPs of one product that a second BLAS thread needs before it pays: measured by
# benchmarks/blas_threads.py on 2 cores, quiet and with both cores busy (docs/benchmarks.md,
# "BLAS threads"). Each further thread needs as much again.
FLOPS_PER_THREAD = 1.0e9
THREADS = Range(1, 1024)


def available_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def block_product_flops(config, rows: int, tokens: int) -> float:
    """Matmul FLOPs of the largest product in one MMJiT block, the SwiGLU's first layer over
    `rows` sequences of `tokens` tokens ([rows * tokens, D] @ [D, mlp_hidden]): the size that
    decides whether the forward's products are worth more than one thread."""
    return 2.0 * rows * tokens * config.hidden_size * config.mlp_hidden


def threads_for(product_flops: float, cores: int | None = None) -> int:
    """The BLAS threads for matrix products of `product_flops` each: one per FLOPS_PER_THREAD, at
    least one, at most one per core."""
    cores = available_cores() if cores is None else cores
    return max(1, min(cores, int(product_flops // FLOPS_PER_THREAD)))


def variable_set() -> str | None:
    """The first of THREAD_VARIABLES the user set, or None."""
    return next((name for name in THREAD_VARIABLES if os.environ.get(name)), None)


def check_threads(threads, name: str = "--threads (threads)", limit_to_cores: bool = True) -> int | None:
    """None (chosen from the work) or a thread count in THREADS, NumPy integers accepted, and at
    most the cores this process may run on (`limit_to_cores`; not where the count is for other
    machines, a Ray cluster's nodes): BLAS threads beyond the cores only wait for one another (8
    threads on 2 busy cores drew the demo image 95 times slower than 1)."""
    if threads is None:
        return None
    threads = int(THREADS.check(name, threads))  # the range takes NumPy integers (not arrays) as numbers
    cores = available_cores()
    if limit_to_cores and threads > cores:
        raise MiniT2IError(f"{name} is {threads}, more than the {cores} cores this process may run on (more threads "
                           f"than cores only wait for one another); pass {cores} or fewer")
    return threads


def chosen_threads(threads: int | None, product_flops: float) -> int | None:
    """The BLAS thread count a run sets: `threads` if given, None (leave the library as the
    user's variable set it) where one of THREAD_VARIABLES is set, else `threads_for` the work."""
    if threads is not None:
        return threads
    if variable_set():
        return None
    return threads_for(product_flops)


@contextlib.contextmanager
def blas_threads(threads: int | None):
    """Run the block with NumPy's BLAS on `threads` threads (None: as it is)."""
    if threads is None:
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads, user_api="blas"):
        yield


def use_blas_threads(threads: int | None) -> None:
    """`blas_threads` for the rest of the process, for a notebook, whose cells share no `with`."""
    if threads is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads, user_api="blas")


def current_blas_threads() -> int | None:
    """The thread count of the BLAS library NumPy runs on (threadpoolctl), or None if unknown."""
    from threadpoolctl import threadpool_info

    counts = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    return max(counts) if counts else None
