"""`minit2i convert SRC DST.safetensors`: a MiniT2I transformer checkpoint, an official JAX (Orbax)
one in particular, written as safetensors with a config.json beside it (docs/jax-checkpoints.md).

The base MMJiT is written in the hub's diffusers key layout (`model.net.` prefix, model.md 2.1),
with the dead `t_embedder` / `pooled_embedder` that the torch port loads strictly filled with
zeros: their sum never reaches the output (model.md 2.4), so zeros change no image. The Mean
Flow student is written under our names with no prefix, its live tensors only. The config.json
names the text encoder (`llm`), so the converted file is read back like a released one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from minit2i.core.checks import human_size
from minit2i.core.config_fields import to_json
from minit2i.core.errors import MiniT2IError
from minit2i.core.files import check_output_file, write_together
from minit2i.core.mean_flow_config import MeanFlowConfig
from minit2i.core.mmjit_config import DIFFUSERS_PREFIX, mmjit_dead_shapes

from .arguments import add_variant_arguments
from .console import emit, printable


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="write a transformer checkpoint (e.g. a JAX one) as safetensors",
                       description="Read a MiniT2I transformer checkpoint (an official JAX/Orbax checkpoint, a "
                                   "-jax Hub repo id, or any --model form) and write it as DST.safetensors with "
                                   "a config.json beside it: the diffusers key layout for the base model, our "
                                   "names for the Mean Flow student (docs/jax-checkpoints.md).")
    p.add_argument("source", help="checkpoint path, Hub repo id or demo model name (demo, demo-mf), as --model takes")
    p.add_argument("destination", help="the .safetensors file to write; config.json is written beside it")
    add_variant_arguments(p)
    p.add_argument("--force", action="store_true", help="replace an existing DST and the config.json beside it")
    p.set_defaults(run=run)


def run(args) -> int:
    """The outputs are checked first, then the source's metadata, then its tensors are read."""
    from .demo_models import demo_model
    from .repo_ids import resolve_model
    from .model_files import inspect_mmjit

    destination, config_path = check_outputs(args.destination, args.force)
    demo = demo_model(args.source)
    model_path = demo[0] if demo is not None else resolve_model(args.source, args.variant, args.jax_tree)
    checkpoint = inspect_mmjit(model_path, args.variant, args.jax_tree)
    weights = checkpoint.load()
    tensors = converted_tensors(weights.config, weights.tensors)
    config = json.loads(to_json(weights.config)) | kept_settings(checkpoint, demo_name=args.source if demo else None)
    source = f"{checkpoint.format}, {checkpoint.tree.label} tree" if checkpoint.tree else checkpoint.format
    write_together({destination: lambda f: f.write(safetensors_bytes(tensors, source)),
                    config_path: lambda f: f.write(json.dumps(config, indent=2).encode())},
                   "free some space on its disk, or choose a DST on another one")
    emit(f"wrote {printable(str(destination), None)} ({len(tensors)} tensors, "
         f"{human_size(destination.stat().st_size)}, from the {source}) and {printable(str(config_path), None)}")
    return 0


def check_outputs(name: str, force: bool) -> tuple[Path, Path]:
    """(DST, the config.json beside it), both writable and, without --force, not there yet."""
    destination = Path(name)
    if destination.name in ("", ".."):
        raise MiniT2IError(f"DST {name!r} names no file; pass the .safetensors file to write, e.g. model.safetensors")
    if destination.suffix != ".safetensors":
        raise MiniT2IError(f"DST {destination} must be a .safetensors file name; e.g. "
                           f"{destination.with_suffix('.safetensors').name}")
    destination = check_output_file(destination, "DST")
    config_path = check_output_file(destination.parent / "config.json", "DST's config.json")
    existing = [str(p) for p in (destination, config_path) if os.path.lexists(p)]
    if existing and not force:
        raise MiniT2IError(f"{' and '.join(existing)} already exist(s); pass --force to replace, or choose "
                           "another DST (an empty folder is best: config.json is written beside DST)")
    return destination, config_path


def kept_settings(checkpoint, demo_name: str | None) -> dict:
    """What the source's config.json says beyond the architecture, for DST's: the text encoder
    (`llm`; a demo model's is its name, which --t5 takes) and the sampling settings the model was
    tuned for (its "sampling" block), so that the converted model draws the source's pictures."""
    from .pipeline import read_sampling

    encoder = demo_name or checkpoint.text_encoder
    sampling = read_sampling(checkpoint.config_source)
    return ({"llm": encoder} if encoder else {}) | ({"sampling": sampling} if sampling else {})


def converted_tensors(config, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tensors as the file holds them: the student under our names; the base model with the
    diffusers prefix and zero dead tensors (read by the official torch loaders, which are strict)."""
    if isinstance(config, MeanFlowConfig):
        return dict(tensors)
    dead = {name: np.zeros(shape, np.float32) for name, shape in mmjit_dead_shapes(config).items()}
    return {DIFFUSERS_PREFIX + name: value for name, value in {**tensors, **dead}.items()}


def safetensors_bytes(tensors: dict[str, np.ndarray], source: str) -> bytes:
    from safetensors.numpy import save

    # "format": "pt" is what torch's safetensors loaders (diffusers) expect in a weights file.
    return save({name: np.ascontiguousarray(value) for name, value in tensors.items()},
                metadata={"format": "pt", "converted_from": source})
