"""What the subcommands share on the command line: the flags that name a model (generate, trace,
info, convert, batch), the sampler's (generate, batch), and the order of the cheap checks before a
generation (generate, trace).
"""

from __future__ import annotations

import sys

from minit2i.core.errors import MiniT2IError
from minit2i.core.mmjit_config import DEFAULT_VARIANT

from .console import printable


def add_model_arguments(parser) -> None:
    """--model, --variant, --jax-tree, --t5 and --tokenizer: the two networks and the tokenizer
    (none of them given: the demo model)."""
    parser.add_argument("-m", "--model", "--diffusion-model", dest="model", default=None,
                        help="MiniT2I transformer: a Hub repo id (MiniT2I/MiniT2I, MiniT2I/MiniT2I-B-16-jax: cached, "
                             "else downloaded), a path (.safetensors file, diffusers folder, pipeline repo, JAX "
                             "checkpoint folder, HF snapshot or HF cache folder; an existing path wins over a repo "
                             "id of the same name) or the name of a demo model (demo, demo-mf)")
    add_variant_arguments(parser)
    parser.add_argument("--t5", "--t5xxl", dest="t5", default=None,
                        help="text encoder: a Hub repo id or a path (model.safetensors, its folder or an HF cache "
                             "folder); default: the one --model's config.json names (google/flan-t5-large)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer.json (default: next to the T5 weights)")


def add_variant_arguments(parser) -> None:
    """--variant (inside a pipeline repo) and --jax-tree (inside a JAX checkpoint)."""
    parser.add_argument("--variant", default=DEFAULT_VARIANT,
                        help=f"variant inside a pipeline repo (b16, l16, ...; default {DEFAULT_VARIANT})")
    parser.add_argument("--jax-tree", default=None, metavar="TREE",
                        help="parameter tree of a JAX (Orbax) checkpoint: params (online), ema (the highest EMA "
                             "key) or ema:KEY; default: the official choice (the highest EMA key; a Mean Flow "
                             "student's params), `minit2i info` lists the trees")


def add_sampler_arguments(parser) -> None:
    """--steps, --cfg-scale, --guidance-interval, -W/-H, -s/--seed, --a-min, --backend and
    --precision: how each image is drawn (`sampler_keywords` turns them into pipeline keywords)."""
    from minit2i.core.mean_flow_config import MEAN_FLOW_RECIPE
    from minit2i.core.mmjit_config import BASE_RECIPE
    from minit2i.reference.sampler import DEFAULT_A_MIN

    from .api import DEFAULT_SEED
    from .pipeline import BACKENDS

    parser.add_argument("--steps", type=int, default=None,
                        help=f"sampler steps (default: the model's; {BASE_RECIPE['steps']} for MiniT2I, "
                             f"{MEAN_FLOW_RECIPE['steps']} for the Mean Flow student, as official)")
    parser.add_argument("--cfg-scale", type=float, default=None,
                        help=f"guidance scale (default: the model's; {BASE_RECIPE['cfg_scale']} for MiniT2I, as "
                             f"the official pipeline; {MEAN_FLOW_RECIPE['cfg_scale']} for the Mean Flow student, an "
                             "input of its network)")
    parser.add_argument("--guidance-interval", type=float, nargs=2, default=None, metavar=("T_MIN", "T_MAX"),
                        help="Mean Flow students only: the times (1 = noise, 0 = image) between which the student "
                             "applies guidance (default {} {}, as official)".format(
                                 *MEAN_FLOW_RECIPE["guidance_interval"]))
    parser.add_argument("-W", "--width", type=int, default=None,
                        help="default: the model's training size (512; demo 64)")
    parser.add_argument("-H", "--height", type=int, default=None,
                        help="default: the model's training size (512; demo 64)")
    parser.add_argument("-s", "--seed", type=int, default=DEFAULT_SEED,
                        help="image i of the run (in order) uses seed + i")
    parser.add_argument("--a-min", type=float, default=None,
                        help=f"floor of 1 - t in x0 -> v (default {DEFAULT_A_MIN}, the HF hub pipeline; "
                             "0.05 = JAX B/16 eval config); not for Mean Flow students")
    # No argparse choices: an unknown backend or precision gets the message the Python API gives.
    parser.add_argument("--backend", default="numpy", metavar="|".join(BACKENDS),
                        help="numpy (reference), cupy (NVIDIA GPU), cudasim (the CuPy twin with its CUDA kernels "
                             "run on the CPU: slow, no GPU needed)")
    parser.add_argument("--precision", default="fp32", metavar="fp32|fp16|bf16",
                        help="fp32 (default); fp16 and bf16 on cupy and cudasim; fp64 on numpy")


def sampler_keywords(args) -> dict:
    """The sampler flags (`add_sampler_arguments`, seed aside) as `MiniT2IPipeline` call keywords."""
    return {"num_inference_steps": args.steps, "guidance_scale": args.cfg_scale, "height": args.height,
            "width": args.width, "a_min": args.a_min, "guidance_interval": args.guidance_interval}


def add_threads_argument(parser) -> None:
    """--threads: NumPy's BLAS threads (default: as many as the size of the work pays for)."""
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="BLAS threads of the NumPy backend (default: one for small models such as the demo, "
                             "every core for the real ones; OMP_NUM_THREADS and the like, if set, are obeyed)")


def say(args, message: str) -> None:
    """A note on stderr, unless -q."""
    if not args.quiet:
        print(printable(message, None), file=sys.stderr)


def model_paths(args) -> tuple:
    """(model, t5) as `open_model` takes them (paths, Hub repo ids or a demo model's name); t5 None
    means the one the model names (its config.json's, a demo model's own)."""
    if args.model is None and args.t5 is None:
        say(args, "no --model/--t5 given: using the demo model, a tiny MiniT2I trained on "
                  "coloured shapes (docs/demo-model.md)")
        return "demo", None
    if args.model is None:
        raise MiniT2IError("--model is missing: pass --model (e.g. MiniT2I/MiniT2I) with --t5, or neither "
                           "for the demo model")
    return args.model, args.t5


def checked_request(args, given: dict, sides, check_outputs=lambda: None, memory_itemsize: int | None = 4):
    """(ModelFiles, Request, what `check_outputs()` returned) after the cheap checks before a
    generation, cheapest first: the prompt and the `given` request fields (flags the user set:
    steps, seed, width, ...), each (backend, precision) of `sides`, the outputs
    (`check_outputs()`), then the model's configs and headers
    (`open_model`: no tensor is read), the request against them, and, unless `memory_itemsize`
    is None (a GPU backend's activations live in device memory), the host memory a NumPy run of
    that float size needs. `args` names the model (`add_model_arguments`) and holds the prompt."""
    from .pipeline import check_arguments, check_backend, check_memory, make_request, open_model

    given = check_arguments(args.prompt, given)
    for backend, precision in sides:  # a precision the backend lacks, or no GPU: before any model work
        check_backend(backend, precision)
    outputs = check_outputs()
    model, t5 = model_paths(args)
    files = open_model(model, t5, args.tokenizer, args.variant, args.jax_tree)
    request = make_request(files, args.prompt, given)
    if memory_itemsize is not None:
        check_memory(request, files, memory_itemsize)
    return files, request, outputs
