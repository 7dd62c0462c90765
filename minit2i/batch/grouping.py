"""How many images one forward of a batch run draws (--batch-size): the user's count, checked
against the memory it needs, or one chosen from the backend and the free memory; a continued
run keeps the count its run.json records (its groups must be the ones an uninterrupted run
draws: driver.groups)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from minit2i.core.checks import human_size
from minit2i.core.errors import MiniT2IError

from .store import RUN_FILE, read_record

# On the GPU the rows of a group fill a device that two rows leave mostly idle: the default is
# the largest power of two up to this that the free device memory holds.
GPU_DEFAULT_LIMIT = 16
# The default on the CPU. NumPy's matmul runs a stack one image's rows at a time (the same BLAS
# calls, grouped or not: no gain measured, benchmarks/batch.py); cudasim is for tests, and alone
# its images are the bytes `generate` draws (its GEMMs' bits depend on the rows of a group).
ALONE = 1
REASONS = {"numpy": "the numpy backend draws no faster in groups",
           "cudasim": "on cudasim one image a forward draws the bytes generate draws"}


def recorded_batch_size(out: Path) -> int | None:
    """The batch size the run folder `out` records (None: no run folder yet, or one of a
    minit2i that drew one image a forward), read with the checks every reader makes first."""
    if not os.path.lexists(out / RUN_FILE) or not out.is_dir():
        return None
    size = read_record(out)["settings"].get("batch_size")
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def chosen_batch_size(asked: int | None, recorded: int | None, backend: str, request, files,
                      precision: str) -> tuple[int, str]:
    """(images a forward, why: for the run's first line). `asked` (--batch-size) is checked to fit
    the memory (`fitting_images`); without it, the run folder's `recorded` count, else the
    backend's default: ALONE on numpy and cudasim, on cupy the largest power of two up to
    GPU_DEFAULT_LIMIT that the free device memory holds."""
    most, memory = fitting_images(backend, request, files, precision)
    if asked is not None:
        if most is not None and asked > most:
            raise MiniT2IError(f"--batch-size {asked} needs more memory than the {memory} available; the largest "
                               f"group that fits is {most}: pass --batch-size {most} or fewer")
        return asked, "as asked"
    if recorded is not None:
        return recorded, "as the run folder's run.json records"
    if backend != "cupy":
        return ALONE, REASONS[backend]
    size = GPU_DEFAULT_LIMIT
    while most is not None and size > max(most, 1):
        size //= 2
    return size, f"chosen for the GPU and its {memory} free"


def fitting_images(backend: str, request, files, precision: str) -> tuple[int | None, str]:
    """(the most images of `request`'s kind one forward can draw in the memory available, that
    memory in words); (None, "") where it is not known. NumPy and cudasim work in host memory
    (float32), cupy in device memory (its precision's bytes for the activations). One image
    that does not fit is the pipeline's own error (`check_memory`)."""
    from minit2i.pipeline import available_memory, check_memory, estimate_memory

    if backend == "cupy":
        from minit2i.accelerated.kernels import cp

        have, itemsize = cp.cuda.runtime.memGetInfo()[0], 2 if precision in ("fp16", "bf16") else 4
    else:
        have, itemsize = available_memory(), 4
        check_memory(request, files)
    if have is None:
        return None, ""
    need = lambda count: estimate_memory(dataclasses.replace(request, batch_count=count), files, itemsize)  # noqa: E731
    low, high = 0, 4096
    while low < high:  # the largest count whose estimate fits (estimate_memory grows with the count)
        middle = (low + high + 1) // 2
        low, high = (middle, high) if need(middle) <= have else (low, middle - 1)
    return max(low, 1), human_size(have, binary=True)
