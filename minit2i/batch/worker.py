"""What every engine runs in each of its workers: one pipeline, built in the worker, drawing a
group of jobs (the run's --batch-size of them) in one forward, with the numerical setup of the
run pinned.

The same pixels on every engine need the same arithmetic: the BLAS library splits a matrix
product differently for another thread count (and another CPU kernel), which moves a pixel by a
level now and then. Ray sets OMP_NUM_THREADS to an actor's CPUs and a process pool inherits the
parent's environment, so each worker's pipeline is given the run's thread count explicitly (it
sets it with threadpoolctl around each call, which overrides both) and the worker reports its
`numerical_setup`, which the driver checks against run.json.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minit2i.core.mmjit_config import DEFAULT_VARIANT
from minit2i.core.threads import blas_threads


@dataclass(frozen=True)
class Spec:
    """How every image of a run is drawn: the model (as `MiniT2IPipeline.open` takes it), the
    backend, the BLAS threads of each worker (None: the driver chooses them from the size of the
    work, as `generate` does, and gives the workers that count), and the sampler keywords of a
    pipeline call (num_inference_steps, guidance_scale, height, width, a_min, guidance_interval;
    the model's own where left out). Plain values only: it travels to spawned processes and Ray
    actors."""

    model: str
    t5: str | None = None
    tokenizer: str | None = None
    variant: str = DEFAULT_VARIANT
    jax_tree: str | None = None
    backend: str = "numpy"
    precision: str = "fp32"
    threads: int | None = None
    sampler: tuple = ()  # ((keyword, value), ...): hashable and picklable

    def open_pipeline(self):
        """The pipeline's configs and headers, checked; no tensor read."""
        from minit2i.api import MiniT2IPipeline

        return MiniT2IPipeline.open(self.model, self.t5, variant=self.variant, backend=self.backend,
                                    precision=self.precision, tokenizer=self.tokenizer, jax_tree=self.jax_tree,
                                    threads=self.threads)


@dataclass(frozen=True)
class Job:
    """Image `k` of prompt `index`, drawn from `seed`; `number` is its place in the run."""

    number: int
    index: int
    k: int
    prompt: str
    seed: int


def numerical_setup(spec: Spec) -> dict:
    """What decides the pixels and the PNG bytes besides the model and the seed: backend,
    precision, the BLAS library (its version, CPU kernel and thread count as this process runs
    it under `spec.threads`) and the versions of NumPy, Pillow, zlib and Python."""
    import PIL
    from threadpoolctl import threadpool_info

    with blas_threads(spec.threads):
        pools = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
    # NumPy's own (a wheel bundles it in numpy.libs, or numpy/.dylibs), not one that another
    # library of the process loaded (SciPy's): a driver that imported SciPy must not differ from
    # its workers. A NumPy linked to a system BLAS has none of its own: then every BLAS counts.
    pools = [pool for pool in pools if Path(pool["filepath"]).parent.name == "numpy.libs"
             or Path(pool["filepath"]).parent.parent.name == "numpy"] or pools
    blas = [{key: pool.get(key) for key in ("internal_api", "version", "architecture", "num_threads")}
            for pool in pools]
    return {"backend": spec.backend, "precision": spec.precision, "blas_threads": spec.threads, "blas": blas,
            "numpy": np.__version__, "pillow": PIL.__version__, "zlib": zlib.ZLIB_RUNTIME_VERSION,
            "python": platform.python_version()}


class Painter:
    """A worker's pipeline, loaded once, on the run's BLAS threads: `draw(group)` -> uint8 [N, H, W, 3]."""

    def __init__(self, spec: Spec):
        with notes_held():
            self.pipe = spec.open_pipeline().load()
        self.pipe.set_progress_bar_config(disable=True)
        self.sampler = dict(spec.sampler)
        self.setup = numerical_setup(spec)

    def draw(self, group: list[Job]) -> np.ndarray:
        """The pixels of a group of jobs, drawn in one forward of all their rows: each job's prompt,
        and its noise from its own seed (`numpy.random.default_rng(seed)`, as `minit2i generate -p
        PROMPT -s SEED` draws it) -> uint8 [len(group), H, W, 3]."""
        generators = [np.random.default_rng(job.seed) for job in group]
        with notes_held():
            return self.pipe([job.prompt for job in group], generator=generators, output_type="np",
                             **self.sampler).images


@contextlib.contextmanager
def notes_held():
    """The library's notes and warnings (logger "minit2i") held back in the block: the driver
    showed them once for the whole prompt file, a worker would repeat them for every image."""
    notes = logging.getLogger("minit2i")
    level = notes.level
    notes.setLevel(logging.ERROR)
    try:
        yield
    finally:
        notes.setLevel(level)
