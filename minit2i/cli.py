"""`minit2i` command line: generate, info (and the golden / trace tools).

Flag names follow stable-diffusion.cpp's CLI where it has one (-p, -o, -W, -H, -s, -b,
--steps, --cfg-scale, --diffusion-model/--t5xxl as aliases of --model/--t5).
Every user error is one line on stderr and exit status 2; no partial files are left behind.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from minit2i.core.checks import writable_folder
from minit2i.core.errors import MiniT2IError

# Subcommands living in their own modules: name -> module with add_parser(subparsers) and run(args).
SUBCOMMAND_MODULES = ["minit2i.golden", "minit2i.trace", "minit2i.convert"]


def main(argv: list[str] | None = None) -> int:
    """Run one command; user errors are one line on stderr and exit status 2."""

    def command() -> int:
        args = build_parser().parse_args(argv)
        _show_notes(getattr(args, "quiet", False))
        return args.run(args)

    return guarded("minit2i", command)


def guarded(prog: str, command) -> int:
    """`command()`'s exit status, with every failure that is not a bug as one line: user and
    environment errors `PROG: error: ...` and status 2, Ctrl-C status 130. A reader closing
    the pipe on stdout (`| head -1`) is its choice, not an error: a quiet exit 0. Shared by the
    `minit2i` CLI and the training scripts."""
    if sys.stderr is None:  # started with stderr closed (`2>&-`): messages go nowhere, not to stdout
        sys.stderr = open(os.devnull, "w")
    previous_handler = _raise_on_sigterm()
    try:
        if sys.stdout is None:  # started with stdout closed (`>&-`): results could not be shown
            raise MiniT2IError("stdout is closed; redirect it (e.g. >/dev/null) instead of closing it")
        return command() or 0
    except MiniT2IError as err:
        return _fail(f"{prog}: error: {err}", 2)
    except BrokenPipeError:
        _silence(sys.stdout)
        return 0
    except OSError as err:  # the environment, not a bug: a file that vanished, a full disk, ...
        where = f"{err.filename}: " if err.filename is not None else ""
        return _fail(f"{prog}: error: {where}{err.strerror or err}", 2)
    except MemoryError:
        return _fail(f"{prog}: error: out of memory (the process may run under a memory or address-space "
                     "limit, `ulimit -v`); raise the limit or use a smaller model or run", 2)
    except Terminated:
        return _fail(f"{prog}: terminated", 128 + signal.SIGTERM)
    except KeyboardInterrupt:
        return _fail(f"{prog}: interrupted", 130)
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that it cleans up (temporary files) as after Ctrl-C."""


def _raise_on_sigterm():
    """Make SIGTERM raise `Terminated`; the handler it replaces, or None where Python takes no
    signals (a thread other than the main one)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminate(signum, frame):
        raise Terminated

    return signal.signal(signal.SIGTERM, terminate) or signal.SIG_DFL


def emit(text: str) -> None:
    """Print a result line to stdout; a full stdout is a one-line user error (a closed pipe is
    left to `guarded`)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        raise
    except OSError as err:
        raise MiniT2IError(f"cannot write to stdout: {err.strerror or err}") from None


def _fail(message: str, status: int) -> int:
    """Print the final message as one line: newlines and other control characters that came
    from file contents or names are escaped (they could also drive the terminal). A closed or
    full stdout/stderr must not turn it into a traceback."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    try:
        if sys.stdout is not None:  # None when started with stdout closed
            sys.stdout.flush()
    except OSError:
        _silence(sys.stdout)
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        _silence(sys.stderr)
    return status


def _silence(stream) -> None:
    """Point a failed standard stream at /dev/null, so Python's exit flush does not fail again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors (argparse's own put the usage text first), named by the
    program (`minit2i`, `train`), not the subcommand."""

    def error(self, message):
        self.exit(_fail(f"{self.prog.split()[0]}: error: {message} (see `{self.prog} --help`)", 2))


def _show_notes(quiet: bool) -> None:
    """Print the library's notes (logger "minit2i") as one stderr line each; -q keeps only warnings.

    With -q, huggingface_hub's download bars are off too (like our sampling bar).
    """
    notes = logging.getLogger("minit2i")
    for handler in list(notes.handlers):
        notes.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)  # this call's stderr (tests swap it between calls)
    handler.setFormatter(logging.Formatter("minit2i: %(message)s"))
    notes.addHandler(handler)
    notes.propagate = False
    notes.setLevel(logging.WARNING if quiet else logging.INFO)
    if quiet:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="minit2i", description=__doc__.splitlines()[0])
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
    from minit2i.reference.sampler import DEFAULT_A_MIN

    from .pipeline import BACKENDS

    p = sub.add_parser("generate", help="text to PNG",
                       description="Generate images from a prompt. Without --model/--t5 the built-in "
                                   "demo model is used: a tiny MiniT2I trained on coloured shapes "
                                   "(try \"a large red circle at the left on a gray background\").")
    p.add_argument("-p", "--prompt", required=True, help="the text prompt")
    p.add_argument("-n", "--negative-prompt", default=None,
                   help="not supported by MiniT2I (its unconditional branch is an all-zero text mask)")
    p.add_argument("-m", "--model", "--diffusion-model", dest="model", default=None,
                   help="MiniT2I transformer: a Hub repo id (MiniT2I/MiniT2I, MiniT2I/MiniT2I-B-16-jax: cached, "
                        "else downloaded) or a path (.safetensors file, diffusers folder, pipeline repo, JAX "
                        "checkpoint folder, HF snapshot or HF cache folder); an existing path wins over a repo "
                        "id of the same name")
    p.add_argument("--variant", default="minit2i-b-16", help="variant inside a pipeline repo (b16, l16, ...)")
    add_jax_tree_argument(p)
    p.add_argument("--t5", "--t5xxl", dest="t5", default=None,
                   help="text encoder: a Hub repo id or a path (model.safetensors, its folder or an HF cache "
                        "folder); default: the one --model's config.json names (google/flan-t5-large)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: next to the T5 weights)")
    p.add_argument("-o", "--output", default="output.png", help="PNG path (batches add _0, _1, ...)")
    p.add_argument("--steps", type=int, default=None,
                   help="sampler steps (default: the model's; 100 for MiniT2I, 4 for the Mean Flow student, "
                        "as official)")
    p.add_argument("--cfg-scale", type=float, default=None,
                   help="guidance scale (default: the model's; 6.0 for MiniT2I, as the official pipeline; "
                        "12.0 for the Mean Flow student, an input of its network)")
    p.add_argument("--guidance-interval", type=float, nargs=2, default=None, metavar=("T_MIN", "T_MAX"),
                   help="Mean Flow students only: the times (1 = noise, 0 = image) between which the student "
                        "applies guidance (default 0.2 0.8, as official)")
    p.add_argument("-W", "--width", type=int, default=None, help="default: the model's training size (512; demo 64)")
    p.add_argument("-H", "--height", type=int, default=None, help="default: the model's training size (512; demo 64)")
    p.add_argument("-s", "--seed", type=int, default=42, help="image i of a batch uses seed + i")
    p.add_argument("-b", "--batch-count", type=int, default=1)
    p.add_argument("--a-min", type=float, default=None,
                   help=f"floor of 1 - t in x0 -> v (default {DEFAULT_A_MIN}, the HF hub pipeline; "
                        "0.05 = JAX B/16 eval config); not for Mean Flow students")
    p.add_argument("--preview-dir", default=None, help="save the guided x0 of every step here as PNGs")
    p.add_argument("--backend", choices=list(BACKENDS), default="numpy",
                   help="numpy (reference), cupy (NVIDIA GPU), cudasim (the CuPy twin with its CUDA kernels run "
                        "on the CPU: slow, no GPU needed)")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or timing table")
    p.set_defaults(run=run_generate)


def run_generate(args) -> int:
    """Checks from cheapest to dearest (arguments, paths, headers, memory), then the work."""
    from tqdm import tqdm

    from minit2i.core.checks import check_prompt
    from minit2i.core.images import check_writable, save_pngs, to_pixels

    from .pipeline import (
        Request,
        check_backend,
        check_guidance_interval,
        check_memory,
        check_ranges,
        generate,
        make_runner,
        open_model,
        output_paths,
        sampling_defaults,
        validate,
    )

    if args.negative_prompt:
        raise MiniT2IError(
            "MiniT2I has no negative prompt: its unconditional branch is the prompt with an all-zero "
            "text mask; drop --negative-prompt"
        )
    optional = {"steps": args.steps, "cfg_scale": args.cfg_scale, "width": args.width, "height": args.height,
                "a_min": args.a_min}
    given = {k: v for k, v in optional.items() if v is not None}  # the model's defaults fill the rest
    check_prompt(args.prompt)
    check_ranges(**given, seed=args.seed, batch_count=args.batch_count)
    if args.guidance_interval is not None:
        given["guidance_interval"] = check_guidance_interval(args.guidance_interval)
    check_backend(args.backend, args.precision)
    outputs = [check_writable(p) for p in output_paths(Path(args.output), args.batch_count)]
    preview_dir = _preview_dir(args.preview_dir)
    model_path, t5_path = _model_paths(args)
    files = open_model(model_path, t5_path, args.tokenizer, args.variant, args.jax_tree)
    settings = sampling_defaults(files) | given
    request = Request(args.prompt, seed=args.seed, batch_count=args.batch_count, **settings)
    validate(request, files, given)
    if args.backend == "numpy":  # the GPU backends' activations live in device memory
        check_memory(request, files)
    model = files.load()
    runner = make_runner(model, args.backend, args.precision)
    # Only now, past every refusal, so that a refused run says its one error line and nothing else.
    _warn_unknown_words(files.tokenizer, args.prompt)
    pieces = files.tokenizer.count_pieces(args.prompt)
    if pieces > files.tokenizer.max_length - 1:
        _say(args, f"note: the prompt has {pieces} tokens; it is cut to {files.tokenizer.max_length - 1} + </s>")

    bar = tqdm(total=request.steps, desc="sampling", unit="step", disable=args.quiet, file=sys.stderr)

    def on_step(info):
        bar.update(1)
        if preview_dir is not None:
            pixels = to_pixels(runner.to_host(info.x0))
            save_pngs([(pixels[0], preview_dir / f"step_{info.index + 1:03d}.png")])

    try:
        result = generate(model, runner, request, on_step)
    finally:
        bar.close()
    save_pngs(list(zip(result.pixels, outputs)))
    if not args.quiet:
        emit(timing_table(result, args.backend, args.precision))
    for path in outputs:
        emit(str(path))
    return 0


def add_jax_tree_argument(parser) -> None:
    """--jax-tree: which parameter tree of a JAX (Orbax) training checkpoint to read."""
    parser.add_argument("--jax-tree", default=None, metavar="TREE",
                        help="parameter tree of a JAX (Orbax) checkpoint: params (online), ema (the highest EMA "
                             "key) or ema:KEY; default: the official choice (the highest EMA key; a Mean Flow "
                             "student's params), `minit2i info` lists the trees")


def _model_paths(args) -> tuple[str | Path, str | Path | None]:
    """(model, t5) as paths or Hub repo ids; t5 None means the one the model's config.json names."""
    from .default_model import built_in_model

    if args.model is None and args.t5 is None:
        transformer, t5, _ = built_in_model("demo")
        _say(args, "no --model/--t5 given: using the built-in demo model, a tiny MiniT2I trained on "
                   "coloured shapes (docs/demo-model.md)")
        return transformer, t5
    built_in = built_in_model(args.model)
    if built_in is not None:
        return built_in[0], args.t5 or built_in[1]
    if args.model is None:
        raise MiniT2IError("--model is missing: pass --model (e.g. MiniT2I/MiniT2I) with --t5, or neither "
                           "for the default model")
    return args.model, args.t5


# A vocabulary this small is worth listing when a word is missing from it (the demo model's).
LISTED_VOCABULARY = 200


def _warn_unknown_words(tokenizer, prompt: str) -> None:
    """One warning line (kept with -q) when the model has never seen some words of the prompt."""
    unknown = tokenizer.unknown_words(prompt)
    if not unknown:
        return
    message = f"warning: the model does not know {', '.join(map(repr, unknown))}"
    if tokenizer.vocab_size <= LISTED_VOCABULARY:
        message += f"; it knows: {' '.join(tokenizer.known_words())}"
    logging.getLogger("minit2i").warning(message)


def _preview_dir(path) -> Path | None:
    """The --preview-dir folder, created if missing and checked writable before any work."""
    if path is None:
        return None
    folder = Path(path).expanduser()
    if not folder.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise MiniT2IError(f"cannot create --preview-dir {folder}: {err.strerror}; choose another folder") from None
    return writable_folder(folder, "--preview-dir")


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
    p = sub.add_parser("info", help="describe a weight file, folder or Hub repo, or the built-in demo model",
                       description="Say what a weight file or folder is: model, config, dtype, parameters, prefix. "
                                   "For a Hub repo id: what is cached, and what a run would download and its "
                                   "size (nothing is downloaded). Without PATH: the built-in demo model.")
    p.add_argument("path", nargs="?", default=None,
                   help="MiniT2I transformer or T5 weights (file or folder), or a Hub repo id; "
                        "default: the built-in demo model")
    p.add_argument("--variant", default="minit2i-b-16")
    add_jax_tree_argument(p)
    p.set_defaults(run=run_info)


def run_info(args) -> int:
    from .default_model import built_in_model
    from .hub import describe_repo, is_repo_id

    if args.path is None or built_in_model(args.path) is not None:
        emit(describe_built_in(args.path or "demo"))
        return 0
    if not is_repo_id(args.path):
        emit(describe(args.path, args.variant, args.jax_tree))
        return 0
    text, snapshot = describe_repo(args.path, args.variant)
    emit(text)
    if snapshot is not None:
        emit(describe(snapshot, args.variant, args.jax_tree))
    return 0


def describe_built_in(name: str) -> str:
    """What a built-in model is, its sampler defaults, the words it knows, and the report of its
    transformer and T5 folders."""
    from .default_model import BUILT_IN_MODELS
    from .pipeline import describe_recipe, open_model

    transformer, t5, what = BUILT_IN_MODELS[name]
    model = open_model(transformer, t5)
    flag = "" if name == "demo" else f" --model {name}"
    return "\n".join([
        f"built-in model {name}: {what} (docs/demo-model.md)",
        f"  folders:    {transformer.parent}" + ("" if t5.parent == transformer.parent else f" (T5: {t5.parent})"),
        f"  sampler:    {describe_recipe(model.mmjit)}",
        f"  words:      {' '.join(model.tokenizer.known_words())}",
        f"  try:        minit2i generate{flag} -p \"a large red circle at the left on a gray background\" -o shape.png",
        f"  also:       {', '.join(n for n in BUILT_IN_MODELS if n != name)} (minit2i info NAME)",
        "",
        describe(transformer),
        "",
        describe(t5),
    ])


def describe(path, variant: str = "minit2i-b-16", jax_tree: str | None = None) -> str:
    """A short report on what `path` holds, trying MMJiT first, then T5, from the safetensors
    headers (an Orbax checkpoint's metadata) and config.json alone (no tensor is read: `info` on
    a 3 GB file is instant)."""
    import dataclasses

    from minit2i.core.checks import existing_path
    from minit2i.core.mean_flow_config import MeanFlowConfig
    from minit2i.core.safetensors_file import read_index

    from .model_files import (
        find_mmjit_files,
        find_t5_files,
        inspect_mmjit,
        inspect_t5,
        is_orbax_folder,
        local_listing,
        looks_like_t5,
    )
    from .pipeline import describe_recipe

    root = existing_path(path)
    if root.is_dir() and looks_like_t5(local_listing(root)):  # by its files, so a damaged one is blamed as a T5
        is_t5 = True
    else:
        files, _ = _try_find(path, variant, find_mmjit_files, find_t5_files)
        is_t5 = not is_orbax_folder(files[0]) and any(
            k in read_index(files) for k in ("shared.weight", "encoder.embed_tokens.weight"))
    checkpoint = inspect_t5(path) if is_t5 else inspect_mmjit(path, variant, jax_tree)
    student = isinstance(checkpoint.config, MeanFlowConfig)
    kind = "T5 encoder" if is_t5 else ("MiniT2I Mean Flow student (MMJiT + auxiliary prefix, model.md 9)" if student
                                       else "MiniT2I MMJiT transformer")
    fields = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(checkpoint.config).items())
    lines = [
        f"{kind}",
        f"  files:      {', '.join(str(f) for f in checkpoint.files)}",
        f"  config:     {checkpoint.config_source}",
        f"              {fields}",
        f"  dtype:      {', '.join(checkpoint.stored_dtypes)} (loaded as float32)",
        f"  parameters: {checkpoint.num_parameters:,} in {len(checkpoint.shapes)} tensors",
    ]
    if checkpoint.assumed:
        lines.insert(4, f"              assumed (not in the shapes, no config.json): {checkpoint.assumed}")
    if not is_t5:
        lines.append(f"  prefix:     {checkpoint.prefix or '(none)'}")
        lines.append(f"  sampler:    {describe_recipe(checkpoint)}")
    if checkpoint.tree is not None:
        lines.insert(2, f"  format:     {checkpoint.format}")
        lines.append(f"  tree:       {checkpoint.tree.label}: {checkpoint.tree.why}")
        lines.append(f"  other trees: {', '.join(checkpoint.tree.others) or 'none'} (--jax-tree chooses one)")
    if checkpoint.text_encoder and checkpoint.tree is not None:
        lines.append(f"  text encoder: {checkpoint.text_encoder} (the flan-t5 of its text width, as the official code)")
    if checkpoint.ignored:
        lines.append(f"  ignored:    {len(checkpoint.ignored)} tensors ({_ignored_groups(checkpoint.ignored)})")
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
