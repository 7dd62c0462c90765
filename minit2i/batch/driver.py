"""The driver of a batch run: checks, the plan, run.json, and the writing of what the engine
draws. It alone writes to the run folder; the engine only computes."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from minit2i.core.checks import Range, differences, user_path, walk
from minit2i.core.errors import MiniT2IError
from minit2i.core.images import png_bytes
from minit2i.core.threads import check_threads, current_blas_threads

from .grouping import chosen_batch_size, recorded_batch_size
from .prompts import read_prompts
from .store import IMAGES_PER_PROMPT, Store
from .worker import Job, Spec, numerical_setup

ENGINES = ("local", "ray")
WORKERS = Range(1, 4096)
BATCH_SIZE = Range(1, 4096)
# run.json's parts that must match for a run to continue an existing folder (the others, such as
# the paths the model was read from, may change between runs).
COMPARED = ("settings", "numerical")
# PNGs encoded and written beside the engine: two threads keep up with a GPU's images, and a
# bounded queue holds back an engine that runs ahead of the disk.
WRITER_THREADS = 2
MAX_PENDING = 32
HASH_CHUNK = 2**24


@dataclasses.dataclass
class Summary:
    """What a run did: images drawn now, done before, in all; seconds spent drawing."""

    drawn: int
    done_before: int
    total: int
    seconds: float


def run_batch(prompt_file, out, spec: Spec, images_per_prompt: int = 1, seed: int = 42, engine: str = "local",
              workers: int | None = None, ray_address: str | None = None, progress: bool = True,
              command: list[str] | None = None, batch_size: int | None = None) -> Summary:
    """Draw `images_per_prompt` images of each prompt of `prompt_file` into the run folder `out`
    (store.py), continuing what an earlier run with the same settings did there. Image i of the
    run (prompt index * images_per_prompt + k) is drawn from seed + i, in the group of images
    i // batch_size (`groups`), all of whose images one forward draws; `batch_size` None: the one
    the folder's run.json records, else `grouping.chosen_batch_size`'s. Cheap checks come first:
    the arguments, the prompt file, the model's configs and headers, then the folder."""
    from minit2i.api import check_call
    from minit2i.pipeline import REQUEST_RANGES, check_backend, make_request, run_threads

    check_options(images_per_prompt, engine, workers, spec.threads, batch_size)
    ray_address = check_engine(engine, ray_address)
    check_backend(spec.backend, spec.precision)
    prompt_path = user_path(prompt_file)
    prompts = read_prompts(prompt_path)
    count = len(prompts.prompts) * images_per_prompt
    given = check_call(prompts.prompts[0], generator=seed, **dict(spec.sampler))
    REQUEST_RANGES["seed"][1].check("the last image's seed, --seed + prompts x images per prompt - 1", seed + count - 1)
    # The driver reads configs and headers only: its thread count is the workers' (checked above,
    # against the cluster's nodes for Ray), not this machine's.
    pipe = dataclasses.replace(spec, threads=None).open_pipeline()
    request = make_request(pipe.files, prompts.prompts[0], given)
    # One count for every worker, recorded: the one `generate` would choose (or the user's).
    spec = dataclasses.replace(spec, threads=run_threads(request, pipe.files, spec.threads)
                               or current_blas_threads() or 1)
    batch_size, reason = chosen_batch_size(batch_size, recorded_batch_size(user_path(out)), spec.backend, request,
                                           pipe.files, spec.precision)
    record = run_record(spec, pipe.files, request, prompts.sha256, len(prompts.prompts), images_per_prompt, seed,
                        prompt_path, command, batch_size)
    with started_engine(engine, spec, workers, ray_address) as results_of:
        store = Store(user_path(out), record, COMPARED)
        try:
            logging.getLogger("minit2i").info(f"note: {batch_size} image{'s' if batch_size > 1 else ''} a forward "
                                              f"(--batch-size {batch_size}: {reason})")
            done = store.done()
            jobs = [Job(i * images_per_prompt + k, i, k, text, seed + i * images_per_prompt + k)
                    for i, text in enumerate(prompts.prompts) for k in range(images_per_prompt)]
            note_unknown_words(pipe.files.tokenizer, prompts.prompts)
            start = time.perf_counter()
            drawn = draw(store, groups(jobs, batch_size, done), results_of, record["numerical"], prompts.metadata,
                         done, count, progress)
            return Summary(drawn, len(done), count, time.perf_counter() - start)
        finally:
            store.close()


def check_options(images_per_prompt: int, engine: str, workers: int | None, threads: int | None,
                  batch_size: int | None = None) -> None:
    IMAGES_PER_PROMPT.check("-n/--images-per-prompt", images_per_prompt)
    if batch_size is not None:
        BATCH_SIZE.check("--batch-size", batch_size)
    if engine not in ENGINES:
        raise MiniT2IError(f"--engine must be one of {', '.join(ENGINES)}, found {engine!r}")
    if workers is not None:
        WORKERS.check("--workers", workers)
    # On Ray the count is each actor's, checked against the cluster's nodes (ray_engine.py).
    check_threads(threads, "--threads", limit_to_cores=engine != "ray")


def check_engine(engine: str, address: str | None) -> str | None:
    """For --engine ray, the cluster's address (`address`, else RAY_ADDRESS; None: a local
    cluster), checked and answering (ray_engine.checked_address); None for the local engine."""
    if engine != "ray":
        return None
    from .ray_engine import checked_address

    return checked_address(address)


def groups(jobs: list[Job], batch_size: int, done) -> list[list[Job]]:
    """The groups of the run still to draw: jobs (every job of the run, in order) cut into groups
    of `batch_size` from the first (the last group whatever is left), each kept whole where any
    of its jobs is not in `done` ({(index, k): ...}). A continued run draws the groups an
    uninterrupted one would, so that an image's arithmetic never depends on where a run stopped."""
    cut = (jobs[start:start + batch_size] for start in range(0, len(jobs), batch_size))
    return [group for group in cut if any((job.index, job.k) not in done for job in group)]


def draw(store: Store, work: list[list[Job]], results_of, setup: dict, metadata: list[bytes], done, total: int,
         progress: bool) -> int:
    """Run the engine (`results_of(groups)`, from `started_engine`) over the groups `work`; each
    image not in `done` is encoded and written by the writer threads while the engine draws on
    (one drawn again only to keep its group whole is not written), a prompt's folder and
    `metadata` line with its first image (a prompt file of millions of lines starts drawing at
    once) -> the images written. Leaving early (an error, Ctrl-C, SIGTERM) lets the writes under
    way finish."""
    from tqdm import tqdm

    by_number = {job.number: job for group in work for job in group if (job.index, job.k) not in done}
    if not by_number:
        return 0
    bar = tqdm(total=total, initial=len(done), unit="image", desc="images", disable=not progress, file=sys.stderr)

    def write(job: Job, pixels) -> None:
        store.write_image(job.index, job.k, job.prompt, job.seed, png_bytes(pixels), metadata[job.index])
        bar.update(1)

    pending: deque = deque()
    writer = ThreadPoolExecutor(WRITER_THREADS, thread_name_prefix="png-writer")
    results = results_of(work)
    try:
        for number, pixels, worker_setup in results:
            if worker_setup != setup:
                changed = differences(setup, worker_setup)
                raise MiniT2IError(f"a worker draws with another numerical setup than run.json records: "
                                   f"{changed[0]}; give every worker the same libraries and --threads")
            if number not in by_number:
                continue
            pending.append(writer.submit(write, by_number[number], pixels))
            while pending and (pending[0].done() or len(pending) > MAX_PENDING):
                pending.popleft().result()
    finally:
        results.close()  # ends the engine's workers
        writer.shutdown(wait=True)
        bar.close()
    for future in pending:
        future.result()
    return len(by_number)


@contextlib.contextmanager
def started_engine(engine: str, spec: Spec, workers: int | None, ray_address: str | None):
    """The engine, ready -> a function of the groups of jobs to its (job number, pixels, numerical
    setup) as groups finish. Ray's cluster is joined (or started) and its nodes checked to hold the actors
    before the run folder is touched, and left at the end."""
    if engine == "ray":
        from .ray_engine import joined_cluster

        with joined_cluster(spec, workers, ray_address) as on_cluster:
            yield on_cluster
        return
    from .engines import in_process, in_processes

    yield (lambda work: in_process(work, spec)) if workers is None else (lambda work: in_processes(work, spec, workers))


def run_record(spec: Spec, files, request, prompts_sha256: str, prompt_count: int, images_per_prompt: int,
               seed: int, prompt_path: Path, command: list[str] | None, batch_size: int = 1) -> dict:
    """run.json: the settings and numerical setup (compared when a run continues), where the
    model and prompts were read from, the command and the time."""
    setup = numerical_setup(spec)
    sampler = {name: getattr(request, name) for name in ("steps", "cfg_scale", "width", "height", "a_min")}
    sampler["guidance_interval"] = list(request.guidance_interval) if request.guidance_interval else None
    return {
        "settings": {
            "weights_sha256": {"transformer": files_sha256(files.mmjit.files), "t5": files_sha256(files.t5.files),
                               "tokenizer": files_sha256([files.tokenizer.source])},
            "variant": spec.variant, "jax_tree": spec.jax_tree, "sampler": sampler,
            "prompts": {"sha256": prompts_sha256, "count": prompt_count},
            "images_per_prompt": images_per_prompt, "seed": seed,
            "seeds": "image i = prompt index * images_per_prompt + k is drawn from seed + i",
            "batch_size": batch_size,
            "groups": "image i is drawn in one forward with the other images of the group i // batch_size",
        },
        "numerical": setup,
        "sources": {"model": spec.model, "t5": spec.t5, "tokenizer": spec.tokenizer, "prompt_file": str(prompt_path)},
        "command": command,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def files_sha256(paths) -> str:
    """One sha256 over the bytes of `paths` in order (a folder: its files in sorted order, listed
    by the bounded walk of model folders)."""
    digest = hashlib.sha256()
    for path in map(Path, paths):
        files = (path / name for name, entry in walk(path) if entry.is_file()) if path.is_dir() else [path]
        for file in sorted(files):
            with open(file, "rb") as f:
                while chunk := f.read(HASH_CHUNK):
                    digest.update(chunk)
    return digest.hexdigest()


def note_unknown_words(tokenizer, prompts: list[str]) -> None:
    """One warning for all prompts with words the model does not know (the first one named)."""
    first = {text: index for index, text in reversed(list(enumerate(prompts)))}
    unknown = [(index, words) for text, index in sorted(first.items(), key=lambda item: item[1])
               if (words := tokenizer.unknown_words(text))]
    if unknown:
        index, words = unknown[0]
        logging.getLogger("minit2i").warning(
            f"warning: {len(unknown)} of {len(first)} prompts have words the model does not know "
            f"(the first, prompt {index}: {', '.join(map(repr, words))})")
