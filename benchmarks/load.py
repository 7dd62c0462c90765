"""Busy processes that a benchmark starts itself, to measure under load as a shared machine is.

    with busy_processes(2):
        ...  # timings taken while two other processes keep the cores busy

Each process spins in pure Python (no BLAS, no memory traffic), the way another program's
compute keeps a core; they are stopped when the block ends, also on an exception.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os


def spin(parent: int) -> None:
    """Keep one core busy until terminated, or until the benchmark that started it is gone (a
    benchmark killed outright cannot stop its helpers: they notice that they were orphaned)."""
    while os.getppid() == parent:
        for _ in range(1_000_000):
            pass


@contextlib.contextmanager
def busy_processes(count: int):
    """Run the block while `count` spinning processes compete for the cores."""
    context = multiprocessing.get_context("spawn")  # no fork of a process with BLAS threads
    workers = [context.Process(target=spin, args=(os.getpid(),), daemon=True) for _ in range(count)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join()


def load_average() -> str:
    """The 1-minute load average as `uptime` shows it, or "unknown"."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"
