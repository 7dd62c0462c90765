"""`minit2i generate`: text to PNG, the command line over the Python API (`MiniT2IPipeline`).

Its own module, so that `cli` (every subcommand) and `golden` (which runs this command for its
demo-model items) both import it, and neither imports the other.
"""

from __future__ import annotations

import sys
from pathlib import Path

from minit2i.core.checks import created_folder, user_path
from minit2i.core.threads import check_threads

from .arguments import add_model_arguments, add_sampler_arguments, add_threads_argument, model_paths, sampler_keywords
from .console import emit, printable


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="text to PNG",
                       description="Generate images from a prompt. Without --model/--t5 the "
                                   "demo model is used: a tiny MiniT2I trained on coloured shapes "
                                   "(try \"a large red circle at the left on a gray background\").")
    p.add_argument("-p", "--prompt", required=True, help="the text prompt")
    p.add_argument("-n", "--negative-prompt", default=None,
                   help="not supported by MiniT2I (its unconditional branch is an all-zero text mask)")
    add_model_arguments(p)
    p.add_argument("-o", "--output", default="output.png", help="PNG path (batches add _0, _1, ...)")
    add_sampler_arguments(p)
    p.add_argument("-b", "--batch-count", type=int, default=1)
    p.add_argument("--preview-dir", default=None, help="save the guided x0 of every step here as PNGs")
    add_threads_argument(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or timing table")
    p.set_defaults(run=run_generate)


def run_generate(args) -> int:
    """The flags as `MiniT2IPipeline` keywords, checked from cheapest to dearest (arguments,
    backend, outputs, model headers; the call itself then the request against the model and the
    memory), then the call, and the PNGs written."""
    from minit2i.core.images import check_writable, save_pngs

    from .api import MiniT2IPipeline, check_call
    from .pipeline import check_backend, output_paths

    call = {"prompt": args.prompt, "negative_prompt": args.negative_prompt, **sampler_keywords(args),
            "num_images_per_prompt": args.batch_count, "generator": args.seed}
    check_call(**call)
    threads = check_threads(args.threads, "--threads")
    check_backend(args.backend, args.precision)
    outputs = [check_writable(p) for p in output_paths(Path(args.output), args.batch_count)]
    preview_dir = preview_folder(args.preview_dir)
    model, t5 = model_paths(args)
    pipe = MiniT2IPipeline.open(model, t5, variant=args.variant, backend=args.backend, precision=args.precision,
                                tokenizer=args.tokenizer, jax_tree=args.jax_tree, threads=threads)
    pipe.set_progress_bar_config(disable=args.quiet, file=sys.stderr)

    def save_preview(pipe, step_index, timestep, tensors):
        save_pngs([(pipe.to_pixels(tensors["x0"])[0], preview_dir / f"step_{step_index + 1:03d}.png")])

    output = pipe(**call, output_type="np", callback_on_step_end=save_preview if preview_dir else None)
    save_pngs(list(zip(output.images, outputs)))
    if not args.quiet:
        emit(output.timing_table())
    for path in outputs:
        emit(printable(str(path), None))
    return 0


def preview_folder(path) -> Path | None:
    """The --preview-dir folder, created if missing and checked writable before any work."""
    if path is None:
        return None
    return created_folder(user_path(path), "--preview-dir")
