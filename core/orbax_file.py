"""Orbax checkpoints (the official JAX training code's format), read without JAX through tensorstore.

A checkpoint folder (`checkpoint_<step>/`, or `checkpoint/` on the Hub) holds `_METADATA`, a JSON
file naming every leaf of the saved tree by its key path, and an OCDBT key-value store
(`manifest.ocdbt`, `d/`, `ocdbt.process_0/`) in which each leaf is a zarr array under its dotted
path (`params.net.img_embedder.proj1.kernel`). `read_tree_paths` lists the leaves from
`_METADATA`; `OrbaxArrays.info` reads one leaf's zarr metadata (dtype, shape, zarr version) and
`.tensor` its data, so that a checkpoint is checked from metadata alone before any array is read, as a
safetensors file is from its header. A checkpoint is data from outside: the store's files are
checked for their kind and size before tensorstore opens any (`check_store_files`), and what an
array declares is bounded before tensorstore allocates for it.
"""

from __future__ import annotations

import math
import stat
from pathlib import Path

import numpy as np

from .checks import JSON_LIMIT, file_kind, parse_json, read_limited, shown, sizes_compared, walk
from .errors import MiniT2IError

ORBAX_METADATA = "_METADATA"
JAX_EXTRA = 'pip install -e ".[jax]"'
# A leaf's zarr metadata (`.zarray` for zarr v2, `zarr.json` for zarr v3) is a few hundred bytes.
ARRAY_METADATA_LIMIT = 2**20
# zarr dtype -> the stored-dtype label of the safetensors reader; others are reported as found.
STORED_DTYPES = {"<f4": "F32", "float32": "F32", "<f2": "F16", "float16": "F16", "bfloat16": "BF16"}
# Where each zarr version keeps an array's metadata, and the tensorstore driver that reads it.
ZARR_DRIVERS = ((".zarray", "zarr"), ("zarr.json", "zarr3"))
# An OCDBT manifest (`manifest.ocdbt`, also under `ocdbt.process_<i>/`) names the B-tree roots and
# data files: a few hundred bytes, thousands for a checkpoint written by many processes.
MANIFEST_LIMIT = 16 * 2**20
MANIFEST = "manifest.ocdbt"
# The data one leaf may declare (its shape times 4 bytes, the widest stored dtype): the largest
# leaf of MiniT2I-L-16 is ~40 MB; a declared shape beyond this would only exhaust memory.
ARRAY_LIMIT = 2**34


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
        check_store_files(folder)
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
        if not (_is_sizes(shape, 0) and isinstance(dtype, str)):
            raise MiniT2IError(f"{where}: expected a shape (list of sizes) and a dtype, found {shown(meta)}; "
                               "re-download the checkpoint")
        if 4 * math.prod(shape) > ARRAY_LIMIT:
            found, most = sizes_compared(4 * math.prod(shape), ARRAY_LIMIT)
            raise MiniT2IError(f"{where} declares a shape of {found} ({shape}), more than the {most} a leaf can hold; "
                               "re-download the checkpoint")
        for chunks in _chunk_shapes(meta):
            if not (_is_sizes(chunks, 1) and len(chunks) == len(shape)
                    and all(c <= max(n, 1) for c, n in zip(chunks, shape))):
                raise MiniT2IError(f"{where}: chunks {shown(chunks)} do not fit the shape {shape} (one size from 1 "
                                   "to the array's per axis); re-download the checkpoint")
        return STORED_DTYPES.get(dtype, dtype), tuple(shape)

    def tensor(self, key: str) -> np.ndarray:
        """The leaf's data as float32, in the driver and axis order `layouts` gives it."""
        driver, permutation = self.layouts[key]
        # A chunk that is missing (or whose key no longer resolves) is an error, not the fill value:
        # every array is read whole or refused.
        spec = {"driver": driver, "kvstore": self.kvstore_spec, "path": key, "fill_missing_data_reads": False}
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


def _is_sizes(value, smallest: int) -> bool:
    """Whether `value` is a list of integers (not bools) of at least `smallest`."""
    return isinstance(value, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= smallest
                                           for n in value)


def _chunk_shapes(meta: dict) -> list:
    """Every chunk shape a zarr metadata declares, as found (unchecked): zarr v2's `chunks`, zarr
    v3's regular `chunk_grid` and the inner chunks of a `sharding_indexed` codec."""
    if "chunks" in meta or meta.get("zarr_format") == 2:
        return [meta.get("chunks")]
    grid = meta.get("chunk_grid")
    shapes = [grid.get("configuration", {}).get("chunk_shape") if isinstance(grid, dict) else None]
    for codec in meta.get("codecs") or []:
        if isinstance(codec, dict) and codec.get("name") == "sharding_indexed":
            shapes.append((codec.get("configuration") or {}).get("chunk_shape"))
    return shapes


def check_store_files(folder: Path) -> None:
    """Every file of the checkpoint's key-value store, before tensorstore opens any: a regular file
    (links are followed, wherever they point: an HF cache's snapshot is links into its blobs), not
    a FIFO, device, socket, broken link or link to a folder (tensorstore would block on a FIFO
    or read a device without end), and each OCDBT manifest at most `MANIFEST_LIMIT` (tensorstore
    reads it whole)."""
    for relative, entry in walk(folder):
        path = folder / relative
        if entry.is_dir(follow_symlinks=False):
            continue
        try:
            info = path.stat()
        except OSError as err:
            raise MiniT2IError(f"{path}: cannot be read ({err.strerror}); the checkpoint is damaged: "
                               "re-download it") from None
        if not stat.S_ISREG(info.st_mode):
            kind = "a link to a folder" if stat.S_ISDIR(info.st_mode) else f"a {file_kind(info.st_mode)}"
            raise MiniT2IError(f"{path}: expected a file of the checkpoint, found {kind}; re-download it")
        if entry.name == MANIFEST and info.st_size > MANIFEST_LIMIT:
            found, most = sizes_compared(info.st_size, MANIFEST_LIMIT)
            raise MiniT2IError(f"{path} is {found}, more than the {most} an OCDBT manifest can be; re-download the "
                               "checkpoint")
