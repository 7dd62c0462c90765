"""`minit2i batch`: a prompt file to GenEval's layout (store.py), resumable, in this process, in
spawned processes or on a Ray cluster; and exports of a finished store."""

from __future__ import annotations

import sys

from minit2i.core.checks import user_path
from minit2i.core.errors import MiniT2IError

from ..arguments import add_model_arguments, add_sampler_arguments, add_threads_argument, model_paths, sampler_keywords
from ..console import emit, printable
from .driver import ENGINES, run_batch
from .exports import EXPORTS, check_exports, export
from .store import read_run
from .worker import Spec


def add_parser(sub) -> None:
    p = sub.add_parser("batch", help="a prompt file to a folder of images (GenEval's layout), resumable",
                       description="Draw every prompt of a file (GenEval's metadata, JSON lines with a \"prompt\" "
                                   "field, or one prompt a line) into --out in GenEval's layout, with run.json "
                                   "and a manifest; the same command again continues a stopped run "
                                   "(docs/evaluation.md). Without PROMPTS: only --export, from the folder.")
    p.add_argument("prompts", nargs="?", default=None, metavar="PROMPTS", help="the prompt file")
    p.add_argument("--out", required=True, metavar="DIR", help="the run folder (created; an existing one continues)")
    p.add_argument("-n", "--images-per-prompt", type=int, default=1, help="images of each prompt (GenEval: 4)")
    add_model_arguments(p)
    add_sampler_arguments(p)
    add_threads_argument(p)
    p.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=None, metavar="N",
                   help="images drawn together in one forward, each from its own seed (default: what the run "
                        "folder records, else chosen from the backend and the free memory: 1 on numpy and "
                        "cudasim, up to 16 on a GPU; said on the run's first line)")
    p.add_argument("--engine", default="local", metavar="|".join(ENGINES),
                   help="local: this process, or --workers processes; ray: a Ray cluster (the ray extra)")
    p.add_argument("--workers", type=int, default=None,
                   help="local: spawned processes (default: none, draw in this process); ray: actors "
                        "(default: the cluster's CPUs / --threads, or its GPUs)")
    p.add_argument("--ray-address", default=None,
                   help="the Ray cluster (default: RAY_ADDRESS, else a local cluster started for the run)")
    p.add_argument("--export", action="append", default=[], metavar="|".join(EXPORTS),
                   help="after the run, also write DIR/dpg/ (a 2 x 2 grid per prompt, DPG-Bench) or DIR/flat/ "
                        "(every image in one folder, for FID tools); repeatable")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=run_batch_command)


def run_batch_command(args) -> int:
    out = user_path(args.out)
    if args.prompts is None:
        if not args.export:
            raise MiniT2IError("PROMPTS is missing: pass a prompt file to draw, or --export to export a run folder")
        check_exports(args.export, None)
    else:
        check_exports(args.export, args.images_per_prompt)
        model, t5 = model_paths(args)
        keywords = {name: value for name, value in sampler_keywords(args).items() if value is not None}
        spec = Spec(model, t5, args.tokenizer, args.variant, args.jax_tree, args.backend, args.precision,
                    args.threads, tuple(keywords.items()))
        summary = run_batch(args.prompts, out, spec, args.images_per_prompt, args.seed, args.engine, args.workers,
                            args.ray_address, progress=not args.quiet, command=sys.argv, batch_size=args.batch_size)
        rate = f", {summary.drawn / summary.seconds:.2f} images/s" if summary.drawn and summary.seconds else ""
        emit(f"{printable(str(out), None)}: {summary.done_before + summary.drawn} of {summary.total} images done "
             f"({summary.drawn} drawn now{rate})")
    if args.export:
        run = read_run(out)
        for kind in args.export:
            folder, written = export(run, kind)
            emit(f"{printable(str(folder), None)}: {written} images")
    return 0
