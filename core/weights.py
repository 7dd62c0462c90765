"""What a loaded model is, apart from how its files are read: its checked float32 tensors
(`LoadedWeights`) and those tensors as the tree the model code walks (`nest`).

The model code (reference/, accelerated/) imports this module, never the file readers of
`checkpoint`, so importing a model pulls in no safetensors, Orbax or temporary-file module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .mmjit_config import MMJiTConfig
from .t5_config import T5Config


@dataclass
class LoadedWeights:
    """Checked float32 tensors under their stripped names, plus where they came from."""

    config: MMJiTConfig | T5Config
    tensors: dict[str, np.ndarray]
    files: list[Path]
    prefix: str
    stored_dtypes: list[str]
    config_source: str
    ignored: list[str] = field(default_factory=list)

    @property
    def num_parameters(self) -> int:
        return sum(int(t.size) for t in self.tensors.values())


def nest(flat: dict[str, np.ndarray]) -> dict:
    """{'a.0.b': x} -> {'a': [{'b': x}]}: the checkpoint's names as a tree, picoGPT style."""
    tree: dict = {}
    for name, value in flat.items():
        node = tree
        parts = name.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return _lists_for_numbered(tree)


def _lists_for_numbered(node):
    if not isinstance(node, dict):
        return node
    node = {k: _lists_for_numbered(v) for k, v in node.items()}
    # Only 0..n-1 becomes a list: a torch Sequential's "mlp.0", "mlp.2" (the SiLU between has no
    # tensors) stays a dict keyed by those numbers.
    if node and set(node) == {str(i) for i in range(len(node))}:
        return [node[str(i)] for i in range(len(node))]
    return node
