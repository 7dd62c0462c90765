"""The Ray engine (the `ray` extra): the jobs as a Ray Data dataset built in memory, drawn by
`map_batches` over a pool of actors, one pipeline built inside each actor.

The dataset comes from the planned jobs, not from a read step: a read task waiting for a CPU
that the actor pool holds would deadlock. Ray's own checkpointing is not used: the driver's
manifest (store.py) is what a resumed run starts from. The cluster is the one RAY_ADDRESS or
`address` names, else a local one started here (and stopped at the end).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator

import numpy as np

from minit2i.core.errors import MiniT2IError

from .worker import Job, Painter, Spec

GPU_BACKENDS = ("cupy",)


class RayPainter:
    """One actor of the pool: a `Painter` built here; a batch of jobs -> their pixels."""

    def __init__(self, spec: Spec):
        self.painter = Painter(spec)
        self.setup = json.dumps(self.painter.setup)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        jobs = [Job(int(number), int(index), int(k), str(prompt), int(seed)) for number, index, k, prompt, seed
                in zip(batch["number"], batch["index"], batch["k"], batch["prompt"], batch["seed"])]
        return {"number": batch["number"], "pixels": np.stack([self.painter.draw(job) for job in jobs]),
                "setup": np.array([self.setup] * len(jobs))}


def on_ray(jobs: list[Job], spec: Spec, workers: int | None, address: str | None) -> Iterator[tuple]:
    """Each job drawn on the cluster by `workers` actors (default: as many as its CPUs hold at
    `spec.threads` each, or one per GPU for a GPU backend)."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise MiniT2IError("--engine ray needs Ray: pip install 'minit2i[ray]'") from None
    for name in ("ray", "ray.data"):  # its notes would break the driver's progress bar
        logging.getLogger(name).setLevel(logging.ERROR)
    started = not ray.is_initialized()
    if started:
        # "local": with no address, ray.init would join the cluster the machine started last (its
        # /tmp/ray/ray_current_cluster), whoever started it and even while it stops.
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "local", include_dashboard=False,
                 log_to_driver=False, logging_level=logging.ERROR)
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # the driver's bar counts the images
        gpus = 1 if spec.backend in GPU_BACKENDS else 0
        actors = workers or actor_count(ray.cluster_resources(), spec.threads, gpus)
        rows = [{"number": j.number, "index": j.index, "k": j.k, "prompt": j.prompt, "seed": j.seed} for j in jobs]
        drawn = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
            RayPainter, fn_constructor_kwargs={"spec": spec}, batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=spec.threads, num_gpus=gpus)
        try:
            for batch in drawn.iter_batches(batch_size=None, batch_format="numpy"):
                for number, pixels, setup in zip(batch["number"], batch["pixels"], batch["setup"]):
                    yield int(number), pixels, json.loads(str(setup))
        except Exception as err:  # noqa: BLE001 - raised again, unwrapped where Ray wrapped ours
            raise actor_error(err) from None
    finally:
        if started:
            ray.shutdown()


def actor_count(resources: dict, threads: int, gpus: int) -> int:
    """As many actors as the cluster holds: one per GPU for a GPU backend, else CPUs // threads."""
    if gpus:
        count = int(resources.get("GPU", 0))
        if not count:
            raise MiniT2IError("the Ray cluster has no GPU for --backend cupy; add a GPU node or use --backend numpy")
        return count
    return max(1, int(resources.get("CPU", 1) // threads))


def actor_error(err: BaseException) -> BaseException:
    """The MiniT2IError an actor raised (a NaN image, a model file gone), found in the chain of
    Ray's wrappers, whose own message is the actor's whole traceback; else `err` itself."""
    from ray.exceptions import RayError

    seen, link = set(), err
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        for candidate in (link, getattr(link, "cause", None)):
            if isinstance(candidate, MiniT2IError) and not isinstance(candidate, RayError):
                return candidate
        link = link.__cause__ or link.__context__ or getattr(link, "cause", None)
    return err
