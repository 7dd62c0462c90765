"""`minit2i` command line: generate, info, batch, explore, exercise (and the golden, trace and convert tools).

Flag names follow stable-diffusion.cpp's CLI where it has one (-p, -o, -W, -H, -s, -b,
--steps, --cfg-scale, --diffusion-model/--t5xxl as aliases of --model/--t5).
Every user error is one line on stderr and exit status 2; no partial files are left behind.
"""

from __future__ import annotations

import argparse
import logging
import sys

from minit2i.core.errors import MiniT2IError
from minit2i.core.mmjit_config import DEFAULT_VARIANT

# Every subcommand, named here: a module missing from an install fails the import loudly.
from . import batch, convert, explore, generate_command, golden, trace
from .exercises import command as exercise_command
from .arguments import add_variant_arguments
from .console import LINE_LIMIT, OneLineFormatter, OneLineParser, emit, guarded, printable


def main(argv: list[str] | None = None) -> int:
    """Run one command; user errors are one line on stderr and exit status 2."""

    def command() -> int:
        args = build_parser().parse_args(argv)
        _show_notes(getattr(args, "quiet", False))
        return args.run(args)

    return guarded("minit2i", command)


def _show_notes(quiet: bool) -> None:
    """Print the library's notes (logger "minit2i") as one stderr line each; -q keeps only warnings.

    With -q, huggingface_hub's download bars are off too (like our sampling bar).
    """
    notes = logging.getLogger("minit2i")
    for handler in list(notes.handlers):
        notes.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)  # this call's stderr (tests swap it between calls)
    handler.setFormatter(OneLineFormatter("minit2i: %(message)s"))
    notes.addHandler(handler)
    notes.propagate = False
    notes.setLevel(logging.WARNING if quiet else logging.INFO)
    if quiet:
        try:
            from huggingface_hub.utils import disable_progress_bars
        except ImportError:  # no huggingface_hub: no download bars to silence
            return
        disable_progress_bars()


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="minit2i", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in (generate_command.add_parser, add_info_parser, batch.add_parser, explore.add_parser,
                       golden.add_parser, trace.add_parser, convert.add_parser, exercise_command.add_parser):
        add_parser(sub)
    return parser


# ---------------------------------------------------------------------------------------------
# info


def add_info_parser(sub) -> None:
    p = sub.add_parser("info", help="describe a weight file, folder or Hub repo, or the demo model",
                       description="Say what a weight file or folder is: model, config, dtype, parameters, prefix. "
                                   "For a Hub repo id: what is cached, and what a run would download and its "
                                   "size (nothing is downloaded). Without PATH: the demo model.")
    p.add_argument("path", nargs="?", default=None,
                   help="MiniT2I transformer or T5 weights (file or folder), or a Hub repo id; "
                        "default: the demo model")
    add_variant_arguments(p)
    p.set_defaults(run=run_info)


def run_info(args) -> int:
    from .demo_models import demo_model
    from .repo_ids import hub, is_repo_id

    if args.path is None or demo_model(args.path) is not None:
        emit(describe_demo(args.path or "demo"))
        return 0
    if not is_repo_id(args.path):
        emit(describe(args.path, args.variant, args.jax_tree))
        return 0
    text, snapshot = hub(args.path).describe_repo(args.path, args.variant)
    emit(text)
    if snapshot is not None:
        emit(describe(snapshot, args.variant, args.jax_tree))
    return 0


def describe_demo(name: str) -> str:
    """What a demo model is, its sampler defaults, the words it knows, and the report of its
    transformer and T5 folders."""
    from .demo_models import DEMO_MODELS
    from .pipeline import describe_recipe, open_model

    transformer, t5, what = DEMO_MODELS[name]
    model = open_model(transformer, t5)
    flag = "" if name == "demo" else f" --model {name}"
    return "\n".join([
        f"{name}: {what} (docs/demo-model.md)",
        f"  folders:    {transformer.parent}" + ("" if t5.parent == transformer.parent else f" (T5: {t5.parent})"),
        f"  sampler:    {describe_recipe(model.mmjit)}",
        f"  words:      {' '.join(model.tokenizer.known_words())}",
        f"  try:        minit2i generate{flag} -p \"a large red circle at the left on a gray background\" -o shape.png",
        f"  also:       {', '.join(n for n in DEMO_MODELS if n != name)} (minit2i info NAME)",
        "",
        describe(transformer),
        "",
        describe(t5),
    ])


def describe(path, variant: str = DEFAULT_VARIANT, jax_tree: str | None = None) -> str:
    """A short report on what `path` holds, trying MMJiT first, then T5, from the safetensors
    headers (an Orbax checkpoint's metadata) and config.json alone (no tensor is read: `info` on
    a 3 GB file is instant). Each line is `printable`: a name in the files cannot add a line."""
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
    # Names, paths and keys come from the files: one report line each, whatever they hold.
    return "\n".join(printable(line, LINE_LIMIT) for line in lines)


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
