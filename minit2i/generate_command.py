"""`minit2i generate`: text to PNG, the command line over the Python API (`MiniT2IPipeline`).

Its own module, so that `cli` (every subcommand) and `golden` (which runs this command for its
demo-model items) both import it, and neither imports the other.
"""

from __future__ import annotations

import sys
from pathlib import Path

from minit2i.core.checks import user_path, writable_folder
from minit2i.core.errors import MiniT2IError
from minit2i.core.threads import check_threads

from .arguments import add_model_arguments, add_threads_argument, model_paths
from .console import emit, printable


def add_parser(sub) -> None:
    from minit2i.core.mean_flow_config import MEAN_FLOW_RECIPE
    from minit2i.core.mmjit_config import BASE_RECIPE
    from minit2i.reference.sampler import DEFAULT_A_MIN

    from .api import DEFAULT_SEED
    from .pipeline import BACKENDS

    p = sub.add_parser("generate", help="text to PNG",
                       description="Generate images from a prompt. Without --model/--t5 the "
                                   "demo model is used: a tiny MiniT2I trained on coloured shapes "
                                   "(try \"a large red circle at the left on a gray background\").")
    p.add_argument("-p", "--prompt", required=True, help="the text prompt")
    p.add_argument("-n", "--negative-prompt", default=None,
                   help="not supported by MiniT2I (its unconditional branch is an all-zero text mask)")
    add_model_arguments(p)
    p.add_argument("-o", "--output", default="output.png", help="PNG path (batches add _0, _1, ...)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"sampler steps (default: the model's; {BASE_RECIPE['steps']} for MiniT2I, "
                        f"{MEAN_FLOW_RECIPE['steps']} for the Mean Flow student, as official)")
    p.add_argument("--cfg-scale", type=float, default=None,
                   help=f"guidance scale (default: the model's; {BASE_RECIPE['cfg_scale']} for MiniT2I, as the "
                        f"official pipeline; {MEAN_FLOW_RECIPE['cfg_scale']} for the Mean Flow student, an input "
                        "of its network)")
    p.add_argument("--guidance-interval", type=float, nargs=2, default=None, metavar=("T_MIN", "T_MAX"),
                   help="Mean Flow students only: the times (1 = noise, 0 = image) between which the student "
                        "applies guidance (default {} {}, as official)".format(*MEAN_FLOW_RECIPE["guidance_interval"]))
    p.add_argument("-W", "--width", type=int, default=None, help="default: the model's training size (512; demo 64)")
    p.add_argument("-H", "--height", type=int, default=None, help="default: the model's training size (512; demo 64)")
    p.add_argument("-s", "--seed", type=int, default=DEFAULT_SEED, help="image i of a batch uses seed + i")
    p.add_argument("-b", "--batch-count", type=int, default=1)
    p.add_argument("--a-min", type=float, default=None,
                   help=f"floor of 1 - t in x0 -> v (default {DEFAULT_A_MIN}, the HF hub pipeline; "
                        "0.05 = JAX B/16 eval config); not for Mean Flow students")
    p.add_argument("--preview-dir", default=None, help="save the guided x0 of every step here as PNGs")
    # No argparse choices: an unknown backend or precision gets the message the Python API gives.
    p.add_argument("--backend", default="numpy", metavar="|".join(BACKENDS),
                   help="numpy (reference), cupy (NVIDIA GPU), cudasim (the CuPy twin with its CUDA kernels run "
                        "on the CPU: slow, no GPU needed)")
    p.add_argument("--precision", default="fp32", metavar="fp32|fp16|bf16",
                   help="fp32 (default); fp16 and bf16 on cupy and cudasim; fp64 on numpy")
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

    call = {"prompt": args.prompt, "negative_prompt": args.negative_prompt, "num_inference_steps": args.steps,
            "guidance_scale": args.cfg_scale, "height": args.height, "width": args.width,
            "num_images_per_prompt": args.batch_count, "generator": args.seed, "a_min": args.a_min,
            "guidance_interval": args.guidance_interval}
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
    folder = user_path(path)
    if not folder.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise MiniT2IError(f"cannot create --preview-dir {folder}: {err.strerror}; choose another folder") from None
    return writable_folder(folder, "--preview-dir")
