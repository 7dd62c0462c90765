"""The local engine: jobs drawn in this process, or in N spawned processes. Engines only
compute: each yields (job number, uint8 pixels [H, W, 3], the worker's numerical setup) as jobs
finish, in any order, and the driver writes. The Ray engine is in ray_engine.py (an extra).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

from .worker import Job, Painter, Spec

# How often a worker process checks that the driver that started it is still there.
ORPHAN_CHECK_SECONDS = 1.0


def in_process(jobs: list[Job], spec: Spec) -> Iterator[tuple]:
    """Each job drawn here, one after the other."""
    painter = Painter(spec)
    try:
        for job in jobs:
            yield job.number, painter.draw(job), painter.setup
    finally:
        painter.limiter.restore_original_limits()


def in_processes(jobs: list[Job], spec: Spec, workers: int) -> Iterator[tuple]:
    """The jobs spread over `workers` spawned processes, one pipeline each, one job at a time
    (a slow image holds up no other). Leaving early (an error, Ctrl-C) ends the processes."""
    import multiprocessing

    pool = multiprocessing.get_context("spawn").Pool(workers, initializer=start_worker, initargs=(spec, os.getpid()))
    try:
        yield from pool.imap_unordered(draw_in_worker, jobs, chunksize=1)
    finally:
        pool.terminate()
        pool.join()


_painter: Painter | None = None  # the pipeline of a pool worker process (`start_worker`)


def start_worker(spec: Spec, driver: int) -> None:
    """A pool process's start: Ctrl-C is the driver's to handle (it ends the pool), a driver killed
    outright (SIGKILL) ends the process too, then the pipeline is built here."""
    global _painter
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=exit_when_orphaned, args=(driver,), daemon=True).start()
    _painter = Painter(spec)


def exit_when_orphaned(driver: int) -> None:
    while os.getppid() == driver:
        time.sleep(ORPHAN_CHECK_SECONDS)
    os._exit(1)


def draw_in_worker(job: Job) -> tuple:
    return job.number, _painter.draw(job), _painter.setup
