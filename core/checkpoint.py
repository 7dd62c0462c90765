"""A checkpoint checked against its model's tensor schema, then loaded as float32 arrays.

`check_mmjit_header` / `check_t5_header` judge a checkpoint from its safetensors headers and its
config alone (names, shapes, dtypes, the config itself), so a wrong file is refused before any
tensor is read; `minit2i.hub` runs the same checks on a Hub file's header before downloading
it. `check_orbax_checkpoint` does the same for an official JAX (Orbax) checkpoint from its
`_METADATA` and array metadata. The resulting `Checkpoint` is what `info` describes;
`Checkpoint.load` reads the tensors, through the reader of the checkpoint's format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from .checks import Range, short_list
from .errors import MiniT2IError
from .flax_layout import TreeChoice, choose_tree, denoiser_root, torch_name, torch_shape
from .mean_flow_config import MeanFlowConfig, infer_mean_flow_config, is_mean_flow, mean_flow_expected_shapes
from .mmjit_config import (
    MMJIT_ASSUMED,
    MMJIT_DEAD_PREFIXES,
    MMJIT_PREFIXES,
    MMJiTConfig,
    infer_mmjit_config,
    mmjit_expected_shapes,
)
from .orbax_file import OrbaxArrays, read_tree_paths
from .safetensors_file import SUPPORTED_DTYPES, IndexEntry, MappedFile
from .t5_config import (
    T5_ASSUMED,
    T5_IGNORED_PREFIXES,
    T5_NAMES_BY_WIDTH,
    T5_TIED_EMBEDDING,
    T5Config,
    infer_t5_config,
    t5_expected_shapes,
)
from .weights import LoadedWeights


class Location(NamedTuple):
    """Where a live tensor is read from: its name in the file (with any key prefix) and the file."""

    stored_name: str
    path: Path


def check_tensors(index: dict[str, IndexEntry], expected: dict[str, tuple[int, ...]], ignored_prefixes, what: str, fix: str) -> list[str]:
    """Compare found names/shapes/dtypes with the expected ones; one error lists every problem.

    Returns the ignored names (dead or decoder tensors) for reporting.
    """
    found = {k: v for k, v in index.items() if not k.startswith(ignored_prefixes)}
    ignored = sorted(set(index) - set(found))
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    misshaped = sorted(k for k in set(expected) & set(found) if tuple(found[k].shape) != tuple(expected[k]))
    bad_dtype = sorted(k for k in found if found[k].dtype not in SUPPORTED_DTYPES)
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensor(s): {short_list(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} tensor(s): {short_list(unexpected)}")
    if misshaped:
        problems.append(f"wrong shape for {len(misshaped)} tensor(s): " + short_list(
            [f"{k} {list(found[k].shape)} (expected {list(expected[k])})" for k in misshaped]))
    if bad_dtype:
        problems.append(f"unsupported dtype for {len(bad_dtype)} tensor(s): " + short_list(
            [f"{k} {found[k].dtype}" for k in bad_dtype]) + " (supported: F32, F16, BF16)")
    if problems:
        raise MiniT2IError(f"{what}: " + "; ".join(problems) + f"; {fix}")
    return ignored


@dataclass
class Checkpoint:
    """A checkpoint checked from its headers (names, shapes, dtypes, config); no tensor read yet.

    `locations` maps each live tensor's name (stripped of any key prefix) to its name in the
    file and the file; `assumed` names the config values that neither a config.json nor the
    shapes gave. `info` stops here; `load()` reads the tensors, opening each file with
    `open_file` (a safetensors memory map, or an Orbax folder's arrays; `tree` says which
    parameter tree of an Orbax checkpoint was chosen).
    """

    config: MMJiTConfig | T5Config
    files: list[Path]
    prefix: str
    config_source: str
    ignored: list[str]
    shapes: dict[str, tuple[int, ...]]
    locations: dict[str, Location]
    stored_dtypes: list[str]
    assumed: str = ""
    text_encoder: str | None = None  # the T5 repo a MiniT2I config.json names (`llm`)
    format: str = "safetensors"
    open_file: Callable = field(default=MappedFile, repr=False)  # path -> object with .tensor(stored name)
    tree: TreeChoice | None = None

    @property
    def num_parameters(self) -> int:
        return sum(int(np.prod(shape)) for shape in self.shapes.values())

    def load(self) -> LoadedWeights:
        """Read every live tensor as float32; a NaN or Inf in any of them is a damaged file."""
        maps = {}
        tensors = {}
        for name, (stored_name, path) in self.locations.items():
            if path not in maps:
                maps[path] = self.open_file(path)
            tensors[name] = maps[path].tensor(stored_name)
            bad = tensors[name].size - int(np.count_nonzero(np.isfinite(tensors[name])))
            if bad:
                raise MiniT2IError(
                    f"{path}: tensor {stored_name} holds {bad} NaN or Inf value(s) of "
                    f"{tensors[name].size}; the checkpoint is damaged: re-download or re-convert it"
                )
        return LoadedWeights(self.config, tensors, self.files, self.prefix, self.stored_dtypes,
                             self.config_source, self.ignored)


def check_mmjit_header(index, config_path: Path | None, files: list) -> Checkpoint:
    """Check an MMJiT's tensor names and shapes (`read_index` output) against its config.

    Needs only the headers: `inspect_mmjit` runs it on local files, `minit2i.hub` on a Hub file
    before downloading it (`files` are then `repo/name` labels for the messages, not loadable).
    """
    prefix = _detect_prefix(index)
    stripped = {k[len(prefix):]: v for k, v in index.items() if k.startswith(prefix)}
    if len(stripped) != len(index):
        others = sorted(k for k in index if not k.startswith(prefix))
        raise MiniT2IError(
            f"{files[0]}: tensors outside the {prefix!r} prefix: {short_list(others)}; "
            "pass the MiniT2I transformer file alone"
        )
    config, source, assumed, ignored, expected = _check_denoiser(stripped, config_path, files[0])
    return _checkpoint(config, files, prefix, source, assumed, ignored, stripped,
                       {k: prefix + k for k in expected})


def check_orbax_checkpoint(folder: Path, tree_request: str | None = None) -> Checkpoint:
    """Check an official JAX (Orbax) checkpoint folder from `_METADATA` and each leaf's array
    metadata: the parameter tree (`choose_tree`), then our names and torch-layout shapes
    (model.md 2.5) against the schema, as `check_mmjit_header` does. No array data is read.

    The tree's denoiser leaves are all checked, so a checkpoint with leaves of no known form is
    refused naming them; the config is inferred from the shapes (the checkpoint has no
    config.json) and the text encoder is the flan-t5 of the denoiser's text width, as the
    official code maps them."""
    paths = read_tree_paths(folder)
    tree = _choose_tree(folder, paths, tree_request)
    root = denoiser_root(paths, tree.root)
    arrays = OrbaxArrays(folder)
    index, keys, layouts = {}, {}, {}
    for path in paths:
        if path[:len(root)] == root:
            name, permutation = torch_name(path[len(root):])
            keys[name] = ".".join(path)
            dtype, shape, driver = arrays.info(keys[name])
            index[name], layouts[keys[name]] = IndexEntry(dtype, torch_shape(shape, permutation), folder), (driver, permutation)
    config, source, assumed, ignored, expected = _check_denoiser(index, None, f"{folder} ({tree.label} tree)")
    checkpoint = _checkpoint(config, [folder], ".".join(root) + ".", source, assumed, ignored, index,
                             {k: keys[k] for k in expected})
    width_name = T5_NAMES_BY_WIDTH.get(config.txt_input_size)
    checkpoint.text_encoder = f"google/{width_name}" if width_name else None
    checkpoint.format, checkpoint.tree = "Orbax (JAX)", tree
    checkpoint.open_file = partial(OrbaxArrays, layouts=layouts)
    return checkpoint


def check_orbax_tree(folder: Path, tree_request: str | None = None) -> TreeChoice:
    """The parameter tree `check_orbax_checkpoint` would read, from `_METADATA` alone (the Hub
    check before a download: a wrong `--jax-tree` or a file that is no checkpoint is refused)."""
    return _choose_tree(folder, read_tree_paths(folder), tree_request)


def _choose_tree(folder: Path, paths, tree_request: str | None) -> TreeChoice:
    try:
        return choose_tree(paths, tree_request, student=any(is_mean_flow(path) for path in paths))
    except MiniT2IError as err:
        raise MiniT2IError(f"{folder} {err}") from None


def _check_denoiser(stripped, config_path: Path | None, label):
    """(config, its source, assumed values, ignored names, expected schema) of an MMJiT or Mean
    Flow student's tensors, `stripped` mapping our names to their `IndexEntry`."""
    shapes = {k: v.shape for k, v in stripped.items() if not k.startswith(MMJIT_DEAD_PREFIXES)}
    # The student is an MMJiT with more tensors; its time tokens tell the two apart (model.md 9.1).
    cls, infer, schema, what = ((MeanFlowConfig, infer_mean_flow_config, mean_flow_expected_shapes,
                                 "Mean Flow student") if is_mean_flow(shapes) else
                                (MMJiTConfig, infer_mmjit_config, mmjit_expected_shapes, "MMJiT"))
    config, source, assumed = _config(cls, config_path, infer, shapes, label, MMJIT_ASSUMED)
    expected = schema(config)
    ignored = check_tensors(
        stripped, expected, MMJIT_DEAD_PREFIXES,
        f"{label} does not match the {what} config ({source})",
        "pass an unmodified MiniT2I transformer checkpoint (and its config.json)",
    )
    return config, source, assumed, ignored, expected


def check_t5_header(index, config_path: Path | None, files: list, expected_d_model: int | None = None) -> Checkpoint:
    """Check a T5's tensor names and shapes (`read_index` output), and its width against the MMJiT's.

    Needs only the headers: `inspect_t5` runs it on local files, `minit2i.hub` refuses a wrong T5
    on the Hub with it before downloading it (`files` as for `check_mmjit_header`).
    """
    if expected_d_model is not None:
        Range(1, 65536).check("expected_d_model (the MMJiT's txt_input_size)", expected_d_model)
    index = dict(index)  # the caller's index keeps the tied alias popped below
    # Files carry the embedding as `shared.weight`, as its tied alias, or as both (model.md 6.3).
    alias = index.pop(T5_TIED_EMBEDDING, None)
    embedding_name = "shared.weight"
    if "shared.weight" not in index and alias is not None:
        index["shared.weight"], embedding_name = alias, T5_TIED_EMBEDDING
    shapes = {k: v.shape for k, v in index.items() if not k.startswith(T5_IGNORED_PREFIXES)}
    config, source, assumed = _config(T5Config, config_path, infer_t5_config, shapes, files[0], T5_ASSUMED)
    if expected_d_model is not None and config.d_model != expected_d_model:
        raise MiniT2IError(_wrong_t5_message(files[0], config, expected_d_model, index))
    expected = t5_expected_shapes(config)
    ignored = check_tensors(
        index, expected, T5_IGNORED_PREFIXES,
        f"{files[0]} does not match the T5 config ({source})",
        "pass an unmodified google/flan-t5-large model.safetensors (and its config.json)",
    )
    return _checkpoint(config, files, "", source, assumed, ignored, index,
                       {k: embedding_name if k == "shared.weight" else k for k in expected})


def _checkpoint(config, files, prefix, source, assumed, ignored, index, stored_names: dict[str, str]) -> Checkpoint:
    """A Checkpoint of the expected tensors: `index` is keyed by our names, the files by theirs."""
    return Checkpoint(config, files, prefix, source, ignored,
                      shapes={k: tuple(index[k].shape) for k in stored_names},
                      locations={k: Location(stored, index[k].source) for k, stored in stored_names.items()},
                      stored_dtypes=sorted({index[k].dtype for k in stored_names}), assumed=assumed)


def _config(cls, config_path, infer, shapes, weights_path, assumed: tuple[str, ...]):
    """(config, where it came from, assumed values): config.json if there is one, else inferred
    from the shapes, with the values the shapes cannot tell kept at their defaults."""
    if config_path is not None:
        return cls.from_json(config_path), str(config_path), ""
    try:
        config = infer(shapes)
    except MiniT2IError as err:
        raise MiniT2IError(f"{weights_path}: {err}") from None
    values = ", ".join(f"{name}={getattr(config, name)}" for name in assumed)
    return config, "inferred from tensor shapes", values


def _wrong_t5_message(path: Path, config: T5Config, expected_d_model: int, index) -> str:
    """The T5 is not the width the MMJiT reads: name what it looks like and what is needed."""
    found = list(index["shared.weight"].shape) if "shared.weight" in index else f"d_model {config.d_model}"
    looks = T5_NAMES_BY_WIDTH.get(config.d_model, f"a T5 with d_model {config.d_model}")
    needed = T5_NAMES_BY_WIDTH.get(expected_d_model)
    need, fix = ((f"google/{needed}", f"pass google/{needed}'s model.safetensors") if needed else
                 ("a T5 v1.1 encoder of that width", "pass the T5 encoder this model was trained with"))
    return (f"{path} is the wrong T5 encoder: it has d_model {config.d_model} (looks like {looks}), "
            f"but this MiniT2I model needs d_model {expected_d_model} ({need}): expected shared.weight "
            f"[{config.vocab_size}, {expected_d_model}], found {found}; {fix}")


def _detect_prefix(index) -> str:
    for prefix in MMJIT_PREFIXES:
        if any(k.startswith(prefix + "img_embedder.") for k in index):
            return prefix
    return ""
