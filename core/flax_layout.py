"""The official JAX (Flax) parameter trees, read as our torch-layout tensors (model.md 2.5).

A training checkpoint of the official JAX code holds several parameter trees: the online
`params`, one EMA copy per decay in `ema_params_dict` (or a legacy `ema_params`), and optimizer
state. `choose_tree` picks one by the official rules (or as the user asks); inside it the
denoiser sits under `net` (the Mean Flow student's frozen teacher beside it under `pt_net`).
`torch_name` turns each Flax leaf path of the denoiser into our tensor name and the axis
permutation that brings its array into the torch layout. Paths are tuples of keys, as Orbax
records them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import MiniT2IError

# What `--jax-tree` accepts besides `ema:<key>`.
TREE_CHOICES = ("ema", "params")
NET = "net"  # the denoiser's module name inside the training module (SimDDPM, PixelMeanFlow)


@dataclass(frozen=True)
class TreeChoice:
    """The parameter tree a checkpoint is read from: the key path of its denoiser, why it was
    chosen, and the other trees the checkpoint holds (as `--jax-tree` values)."""

    root: tuple[str, ...]
    why: str
    others: tuple[str, ...]

    @property
    def label(self) -> str:
        """The `--jax-tree` value that selects this tree."""
        return _label(self.root)


def available_trees(paths) -> list[tuple[str, ...]]:
    """Every parameter tree of a checkpoint (`params`, `ema_params`, `ema_params_dict/<key>`),
    in the official preference order reversed: online params first, EMA keys sorted as strings
    (the restored checkpoint's dict keys are strings, and the official code sorts them)."""
    tops = {path[0] for path in paths if path}
    ema_keys = sorted({path[1] for path in paths if len(path) > 1 and path[0] == "ema_params_dict"})
    trees = [("params",)] if "params" in tops else []
    trees += [("ema_params",)] if "ema_params" in tops else []
    return trees + [("ema_params_dict", key) for key in ema_keys]


def choose_tree(paths, request: str | None, student: bool) -> TreeChoice:
    """The tree `request` names (`params`, `ema`, `ema:<key>`), or by default the official
    choice: a base model's evaluation reads the highest EMA key (then a legacy `ema_params`,
    then `params`), the Mean Flow student's reads the online `params` (its eval config has
    include_ema: False)."""
    trees = available_trees(paths)
    if not trees:
        raise MiniT2IError("holds no parameter tree (no params, ema_params or ema_params_dict); "
                           "pass a checkpoint written by the official JAX training code")
    labels = [_label(tree) for tree in trees]
    emas = [tree for tree in trees if tree[0] != "params"]
    if request is None:
        if student and ("params",) in trees:
            root, why = ("params",), "the online params, as the official Mean Flow evaluation (include_ema: False)"
        elif emas:
            root, why = emas[-1], "the highest EMA key, as the official evaluation and teacher loading"
        else:
            root, why = ("params",), "the only parameter tree (a params-only checkpoint)"
    elif request == "ema" and emas:
        root, why = emas[-1], "--jax-tree ema: the highest EMA key"
    elif request in labels:
        root, why = trees[labels.index(request)], f"--jax-tree {request}"
    else:
        raise MiniT2IError(f"has no parameter tree {request!r}; it has {', '.join(labels)} "
                           f"(--jax-tree ema picks the highest EMA key)")
    return TreeChoice(root, why, tuple(label for label in labels if label != _label(root)))


def _label(tree: tuple[str, ...]) -> str:
    return {"params": "params", "ema_params": "ema"}.get(tree[0], f"ema:{tree[-1]}")


def denoiser_root(paths, tree: tuple[str, ...]) -> tuple[str, ...]:
    """Where the denoiser's leaves start inside `tree`: under `net`, or at the tree itself for a
    bare MMJiT parameter tree (which the official teacher loader also accepts)."""
    below = [path[len(tree):] for path in paths if path[:len(tree)] == tree]
    return tree + (NET,) if any(rest[:1] == (NET,) for rest in below) else tree


# Leaf wrappers of the official torch-like Flax layers (models/torch_models.py): the wrapper
# and its parameter name -> our parameter name (None: the module path is the tensor's name),
# and the axis permutation from the Flax array to the torch one.
_WRAPPED_LEAVES = {
    ("_flax_linear", "kernel"): ("weight", (1, 0)),  # Dense [in, out] -> Linear [out, in]
    ("_flax_linear", "bias"): ("bias", None),
    ("_flax_rmsnorm", "kernel"): ("weight", None),
    ("_flax_param", "param_tensor"): (None, None),
}
# A plain nn.Conv (the patch embed): kernel [kh, kw, in, out] -> torch Conv2d [out, in, kh, kw].
_CONV_LEAVES = {"kernel": ("weight", (3, 2, 0, 1)), "bias": ("bias", None)}
_SEQUENTIAL_ITEM = re.compile(r"layers_(\d+)")


def torch_name(path: tuple[str, ...]) -> tuple[str, tuple[int, ...] | None]:
    """(our tensor name, axis permutation or None) of a denoiser leaf path (relative to `net`).

    `double_blocks/layers_3/img_qkv/_flax_linear/kernel` -> ("double_blocks.3.img_qkv.weight", (1, 0)).
    A leaf of no known form keeps its Flax path, dotted, so that the schema check names it."""
    modules = [m.group(1) if (m := _SEQUENTIAL_ITEM.fullmatch(part)) else part for part in path]
    if tuple(path[-2:]) in _WRAPPED_LEAVES:
        name, permutation = _WRAPPED_LEAVES[tuple(path[-2:])]
        return ".".join(modules[:-2] + ([name] if name else [])), permutation
    if len(path) >= 2 and path[-2] in ("proj1", "proj2") and path[-1] in _CONV_LEAVES:
        name, permutation = _CONV_LEAVES[path[-1]]
        return ".".join(modules[:-1] + [name]), permutation
    return ".".join(path), None


def torch_shape(shape: tuple[int, ...], permutation: tuple[int, ...] | None) -> tuple[int, ...]:
    """A Flax array's shape in the torch layout; an array of the wrong rank keeps its shape (the
    schema check then reports it as misshaped)."""
    if permutation is None or len(shape) != len(permutation):
        return tuple(shape)
    return tuple(shape[axis] for axis in permutation)
