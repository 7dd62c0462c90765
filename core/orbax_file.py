"""Orbax checkpoints (the official JAX training code's format), read without JAX through tensorstore.

A checkpoint folder (`checkpoint_<step>/`, or `checkpoint/` on the Hub) holds `_METADATA`, a JSON
file naming every leaf of the saved tree by its key path, and an OCDBT key-value store
(`manifest.ocdbt`, `d/`, `ocdbt.process_0/`) in which each leaf is a zarr array under its dotted
path (`params.net.img_embedder.proj1.kernel`). `read_tree_paths` lists the leaves from
`_METADATA`; `OrbaxArrays.info` reads one leaf's zarr metadata (dtype, shape, zarr version) and
`.tensor` its data, so that a checkpoint is checked from metadata alone before any array is read, as a
safetensors file is from its header.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .checks import JSON_LIMIT, parse_json, read_limited, shown
from .errors import MiniT2IError

ORBAX_METADATA = "_METADATA"
JAX_EXTRA = 'pip install -e ".[jax]"'
# A leaf's zarr metadata (`.zarray` for zarr v2, `zarr.json` for zarr v3) is a few hundred bytes.
ARRAY_METADATA_LIMIT = 2**20
# zarr dtype -> the stored-dtype label of the safetensors reader; others are reported as found.
STORED_DTYPES = {"<f4": "F32", "float32": "F32", "<f2": "F16", "float16": "F16", "bfloat16": "BF16"}
# Where each zarr version keeps an array's metadata, and the tensorstore driver that reads it.
ZARR_DRIVERS = ((".zarray", "zarr"), ("zarr.json", "zarr3"))


def require_tensorstore():
    """The tensorstore module, or one line naming the extra that installs it."""
    try:
        import tensorstore
    except ImportError:
        raise MiniT2IError(f"reading a JAX (Orbax) checkpoint needs tensorstore, which is not installed; "
                           f"install the jax extra: {JAX_EXTRA}") from None
    return tensorstore


def read_tree_paths(folder: Path) -> list[tuple[str, ...]]:
    """The key path of every leaf the checkpoint's `_METADATA` lists (as `tree_metadata` keys'
    `key_metadata`), e.g. ("params", "net", "mask_token", "_flax_param", "param_tensor")."""
    path = folder / ORBAX_METADATA
    metadata = parse_json(read_limited(path, "Orbax metadata", JSON_LIMIT), "Orbax metadata", path)
    tree = metadata.get("tree_metadata") if isinstance(metadata, dict) else None
    if not isinstance(tree, dict):
        raise MiniT2IError(f"{path}: expected a JSON object with a \"tree_metadata\" object, found "
                           f"{shown(metadata)}; re-download the checkpoint")
    return [_key_path(path, name, leaf) for name, leaf in tree.items()]


def _key_path(path: Path, name: str, leaf) -> tuple[str, ...]:
    keys = leaf.get("key_metadata") if isinstance(leaf, dict) else None
    if not (isinstance(keys, list) and keys and all(isinstance(k, dict) and isinstance(k.get("key"), (str, int))
                                                    and not isinstance(k.get("key"), bool) for k in keys)):
        raise MiniT2IError(f"{path}: leaf {name[:80]!r} has no list of keys (key_metadata); re-download the checkpoint")
    return tuple(str(k["key"]) for k in keys)


class OrbaxArrays:
    """The arrays of one Orbax checkpoint folder, by dotted leaf key. `layouts` maps a key to the
    tensorstore driver of its zarr version and the axis order `tensor` gives its array (the Flax ->
    torch layout), as `info` found them."""

    def __init__(self, folder: Path, layouts: dict[str, tuple[str, tuple[int, ...] | None]] | None = None):
        self.tensorstore = require_tensorstore()
        self.folder = folder
        self.layouts = layouts or {}
        self.kvstore_spec = {"driver": "ocdbt", "base": folder.resolve().as_uri() + "/"}
        self.context = self.tensorstore.Context()
        self.store = self._call(lambda: self.tensorstore.KvStore.open(self.kvstore_spec, context=self.context).result())

    def info(self, key: str) -> tuple[str, tuple[int, ...], str]:
        """(stored dtype label, shape, tensorstore driver) of a leaf, from its zarr metadata alone."""
        for name, driver in ZARR_DRIVERS:
            result = self._call(lambda: self.store.read(f"{key}/{name}").result())
            if result.state == "value":
                return *self._array_metadata(key, name, bytes(result.value)), driver
        raise MiniT2IError(f"{self.folder}: _METADATA lists {key}, but the checkpoint holds no array of that "
                           "name; the checkpoint is incomplete: re-download it")

    def _array_metadata(self, key: str, name: str, raw: bytes) -> tuple[str, tuple[int, ...]]:
        where = f"{self.folder}: {key}/{name}"
        if len(raw) > ARRAY_METADATA_LIMIT:
            raise MiniT2IError(f"{where} is {len(raw)} bytes, more than array metadata can be; "
                               "re-download the checkpoint")
        meta = parse_json(raw, "the array metadata", where)
        shape = meta.get("shape") if isinstance(meta, dict) else None
        dtype = meta.get("dtype", meta.get("data_type")) if isinstance(meta, dict) else None
        if not (isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                for n in shape) and isinstance(dtype, str)):
            raise MiniT2IError(f"{where}: expected a shape (list of sizes) and a dtype, found {shown(meta)}; "
                               "re-download the checkpoint")
        return STORED_DTYPES.get(dtype, dtype), tuple(shape)

    def tensor(self, key: str) -> np.ndarray:
        """The leaf's data as float32, in the driver and axis order `layouts` gives it."""
        driver, permutation = self.layouts[key]
        spec = {"driver": driver, "kvstore": self.kvstore_spec, "path": key}
        data = self._call(lambda: self.tensorstore.open(spec, context=self.context, open=True).result().read().result())
        data = np.asarray(data, dtype=np.float32)  # bfloat16 (ml_dtypes) and float16 widen exactly
        return np.ascontiguousarray(data.transpose(permutation)) if permutation else data

    def _call(self, call):
        """Run a tensorstore call; its errors (damaged manifest, missing data file) are one line."""
        try:
            return call()
        except (ValueError, OSError) as err:  # tensorstore reports its failures as ValueError
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise MiniT2IError(f"{self.folder} is not a readable Orbax checkpoint ({reason}); "
                               "re-download it") from None
