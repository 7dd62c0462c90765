"""`minit2i` command line: generate, info (and the golden / trace tools).

Flag names follow stable-diffusion.cpp's CLI where it has one (-p, -o, -W, -H, -s, -b,
--steps, --cfg-scale, --diffusion-model/--t5xxl as aliases of --model/--t5).
Every user error is one line on stderr and exit status 2; no partial files are left behind.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from .errors import MiniT2IError

# Subcommands living in their own modules: name -> module with add_parser(subparsers) and run(args).
SUBCOMMAND_MODULES = ["minit2i.golden", "minit2i.trace"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except MiniT2IError as err:
        print(f"minit2i: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("minit2i: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minit2i", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_generate_parser(sub)
    add_info_parser(sub)
    for module_name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            continue
        module.add_parser(sub)
    return parser


# ---------------------------------------------------------------------------------------------
# generate


def add_generate_parser(sub) -> None:
    from reference.sampler import DEFAULT_A_MIN

    from .pipeline import BACKENDS

    p = sub.add_parser("generate", help="text to PNG",
                       description="Generate images from a prompt. Without --model/--t5 the built-in "
                                   "tiny default model (random weights) is used.")
    p.add_argument("-p", "--prompt", required=True, help="the text prompt")
    p.add_argument("-n", "--negative-prompt", default=None,
                   help="not supported by MiniT2I (its unconditional branch is an all-zero text mask)")
    p.add_argument("-m", "--model", "--diffusion-model", dest="model", default=None,
                   help="MiniT2I transformer: .safetensors file, diffusers folder, pipeline repo, "
                        "HF snapshot or HF cache folder")
    p.add_argument("--variant", default="minit2i-b-16", help="variant inside a pipeline repo (b16, l16, ...)")
    p.add_argument("--t5", "--t5xxl", dest="t5", default=None,
                   help="google/flan-t5-large: model.safetensors, its folder or an HF cache folder")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: next to the T5 weights)")
    p.add_argument("-o", "--output", default="output.png", help="PNG path (batches add _0, _1, ...)")
    p.add_argument("--steps", type=int, default=100, help="Euler steps (default 100, as official)")
    p.add_argument("--cfg-scale", type=float, default=6.0, help="guidance scale (pipeline default 6.0)")
    p.add_argument("-W", "--width", type=int, default=512)
    p.add_argument("-H", "--height", type=int, default=512)
    p.add_argument("-s", "--seed", type=int, default=42, help="image i of a batch uses seed + i")
    p.add_argument("-b", "--batch-count", type=int, default=1)
    p.add_argument("--a-min", type=float, default=DEFAULT_A_MIN,
                   help=f"floor of 1 - t in x0 -> v (default {DEFAULT_A_MIN}, the HF hub pipeline; "
                        "0.05 = JAX B/16 eval config)")
    p.add_argument("--preview-dir", default=None, help="save the guided x0 of every step here as PNGs")
    p.add_argument("--backend", choices=list(BACKENDS), default="numpy",
                   help="numpy (reference), cupy (NVIDIA GPU), cudasim (the CuPy twin with its CUDA kernels run "
                        "on the CPU: slow, no GPU needed)")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or timing table")
    p.set_defaults(run=run_generate)


def run_generate(args) -> int:
    from tqdm import tqdm

    from .images import check_writable, save_png, to_pixels
    from .pipeline import Request, generate, load_model, make_runner, output_paths, validate

    if args.negative_prompt:
        raise MiniT2IError(
            "MiniT2I has no negative prompt: its unconditional branch is the prompt with an all-zero "
            "text mask; drop --negative-prompt"
        )
    outputs = [check_writable(p) for p in output_paths(Path(args.output), max(args.batch_count, 1))]
    model_path, t5_path = _model_paths(args)
    request = Request(args.prompt, args.steps, args.cfg_scale, args.width, args.height, args.seed,
                      args.batch_count, args.a_min)
    model = load_model(model_path, t5_path, args.tokenizer, args.variant)
    validate(request, model)
    preview_dir = _preview_dir(args.preview_dir)
    pieces = model.tokenizer.count_pieces(args.prompt)
    if pieces > model.tokenizer.max_length - 1:
        _say(args, f"note: the prompt has {pieces} tokens; it is cut to {model.tokenizer.max_length - 1} + </s>")
    runner = make_runner(model, args.backend, args.precision)

    bar = tqdm(total=request.steps, desc="sampling", unit="step", disable=args.quiet, file=sys.stderr)

    def on_step(info):
        bar.update(1)
        if preview_dir is not None:
            pixels = to_pixels(runner.to_host(info.x0))
            save_png(pixels[0], preview_dir / f"step_{info.index + 1:03d}.png")

    try:
        result = generate(model, runner, request, on_step)
    finally:
        bar.close()
    for pixels, path in zip(result.pixels, outputs):
        save_png(pixels, path)
    if not args.quiet:
        print(timing_table(result, args.backend, args.precision))
    for path in outputs:
        print(path)
    return 0


def _model_paths(args) -> tuple[Path, Path]:
    if args.model is None and args.t5 is None:
        from .default_model import default_model_dir

        folder, created = default_model_dir()
        verb = "created" if created else "using"
        _say(args, f"no --model/--t5 given: {verb} the built-in tiny default model (random weights) at {folder}")
        return folder / "transformer", folder / "t5"
    if args.model is None or args.t5 is None:
        missing = "--model" if args.model is None else "--t5"
        raise MiniT2IError(f"{missing} is missing: pass both --model and --t5, or neither for the default model")
    return Path(args.model), Path(args.t5)


def _preview_dir(path) -> Path | None:
    if path is None:
        return None
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise MiniT2IError(f"cannot create --preview-dir {folder}: {err.strerror}; choose another folder") from None
    return folder


def timing_table(result, backend: str, precision: str) -> str:
    """Tokenize, T5, each step's forward, total: one aligned table."""
    rows = [("tokenize", result.timings["tokenize"]), ("T5 encoder", result.timings["t5"])]
    steps = result.step_times
    if len(steps) <= 12:
        rows += [(f"step {i + 1}", t) for i, t in enumerate(steps)]
    else:
        rows += [(f"step {i + 1}", t) for i, t in enumerate(steps[:3])]
        rows += [(f"steps 4-{len(steps)} (mean)", sum(steps[3:]) / len(steps[3:]))]
    rows += [("sampling", result.timings["sampling"]), ("total", result.timings["total"])]
    width = max(len(name) for name, _ in rows)
    lines = [f"timings ({backend}, {precision}):"]
    lines += [f"  {name:<{width}}  {seconds * 1000:10.1f} ms" for name, seconds in rows]
    return "\n".join(lines)


def _say(args, message: str) -> None:
    if not args.quiet:
        print(message, file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# info


def add_info_parser(sub) -> None:
    p = sub.add_parser("info", help="describe a weight file or folder",
                       description="Say what a weight file or folder is: model, config, dtype, parameters, prefix.")
    p.add_argument("path", help="MiniT2I transformer or T5 weights (file or folder)")
    p.add_argument("--variant", default="minit2i-b-16")
    p.set_defaults(run=run_info)


def run_info(args) -> int:
    print(describe(args.path, args.variant))
    return 0


def describe(path, variant: str = "minit2i-b-16") -> str:
    """A short report on what `path` holds, trying MMJiT first, then T5."""
    import dataclasses

    from .weights import find_mmjit_files, find_t5_files, load_mmjit, load_t5, read_index

    if not Path(path).expanduser().exists():
        raise MiniT2IError(f"{path}: no such file or folder; check the path")
    files, _ = _try_find(path, variant, find_mmjit_files, find_t5_files)
    names = read_index(files)
    is_t5 = any(k in names for k in ("shared.weight", "encoder.embed_tokens.weight"))
    loaded = load_t5(path) if is_t5 else load_mmjit(path, variant)
    kind = "T5 encoder" if is_t5 else "MiniT2I MMJiT transformer"
    fields = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(loaded.config).items())
    lines = [
        f"{kind}",
        f"  files:      {', '.join(str(f) for f in loaded.files)}",
        f"  config:     {loaded.config_source}",
        f"              {fields}",
        f"  dtype:      {', '.join(loaded.stored_dtypes)} (loaded as float32)",
        f"  parameters: {loaded.num_parameters:,} in {len(loaded.tensors)} tensors",
    ]
    if not is_t5:
        lines.append(f"  prefix:     {loaded.prefix or '(none)'}")
    if loaded.ignored:
        lines.append(f"  ignored:    {len(loaded.ignored)} tensors ({_ignored_groups(loaded.ignored)})")
    return "\n".join(lines)


def _try_find(path, variant, find_mmjit, find_t5):
    try:
        return find_mmjit(path, variant)
    except MiniT2IError as first:
        try:
            return find_t5(path)
        except MiniT2IError:
            raise first from None


def _ignored_groups(names: list[str]) -> str:
    return ", ".join(sorted({n.split(".")[0] for n in names}))


if __name__ == "__main__":
    sys.exit(main())
