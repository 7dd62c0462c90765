"""The local engine: groups of jobs drawn in this process, or in N spawned processes. Engines
only compute: each takes the run's groups (each drawn whole, in one forward) and yields (job
number, uint8 pixels [H, W, 3], the worker's numerical setup) as groups finish, in any order,
and the driver writes. The Ray engine is in ray_engine.py (an extra).
"""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Iterator

from minit2i.core.errors import MiniT2IError

from .worker import Job, Painter, Spec


def in_process(work: list[list[Job]], spec: Spec) -> Iterator[tuple]:
    """Each group drawn here, one after the other."""
    painter = Painter(spec)
    for group in work:
        yield from drawn(painter, group)


def drawn(painter: Painter, group: list[Job]) -> list[tuple]:
    """A group drawn by `painter` -> (job number, pixels, numerical setup) of each of its jobs."""
    return [(job.number, pixels, painter.setup) for job, pixels in zip(group, painter.draw(group))]


def in_processes(work: list[list[Job]], spec: Spec, workers: int) -> Iterator[tuple]:
    """The groups spread over `workers` spawned processes, one pipeline each, each sent its next
    group when it returns one (a slow group holds up no other). A process talks to the driver over a
    pipe of its own: leaving early (an error, Ctrl-C) ends the processes, and a driver killed
    outright closes their pipes, which ends them too."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")
    waiting = deque(work)
    processes, busy = [], []
    try:
        for _ in range(min(workers, len(work))):
            here, there = context.Pipe()
            process = context.Process(target=serve, args=(spec, there), daemon=True)
            process.start()
            there.close()  # the worker's end lives in the worker alone: the pipe closes with either side
            processes.append(process)
            busy.append(here)
            here.send(waiting.popleft())
        while busy:
            for link in wait(busy):
                try:
                    result = link.recv()
                except EOFError:
                    raise MiniT2IError("a worker process ended unexpectedly (killed, or out of memory?); "
                                       "run the same command again to continue") from None
                if isinstance(result, BaseException):
                    raise result
                yield from result
                if waiting:
                    link.send(waiting.popleft())
                else:
                    link.send(None)
                    busy.remove(link)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.join()


def serve(spec: Spec, link) -> None:
    """A worker process: build the pipeline, then draw each group the driver sends until it sends
    None or goes away. Ctrl-C is the driver's to handle (it ends the workers)."""
    import threading

    from tqdm import tqdm

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # tqdm's default lock is a multiprocessing one, which a worker ended by the driver would leave
    # for Python's resource tracker to report as leaked; this process shows no bar.
    tqdm.set_lock(threading.RLock())
    try:
        painter = Painter(spec)
        while (group := link.recv()) is not None:
            link.send(drawn(painter, group))
    except EOFError:
        return
    except Exception as err:  # noqa: BLE001 - the driver raises it, as the in-process engine would
        link.send(err)
