"""Safetensors files: one header reader, and float32 tensors read through a memory map.

`safetensors.safe_open` validates each file (header JSON, offsets, sizes); the offsets it does
not expose are then taken from the same header, which `read_header` parses once for both the
checks (names, dtypes, shapes) and the memory map. float32 tensors are zero-copy read-only views
of the file; float16 and bfloat16 are widened to float32 one tensor at a time, so loading never
holds two float copies of a model.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from safetensors import SafetensorError, safe_open

from .checks import open_checked, parse_json, sizes_compared
from .errors import MiniT2IError

# Stored dtype -> the NumPy dtype its bytes are viewed as (bfloat16 as its raw 16 bits).
SUPPORTED_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors header: stored dtype, shape, and byte range in the data part."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


class FileHeader(NamedTuple):
    """What a safetensors file was when its header was read: its size in bytes and its tensors."""

    size: int
    tensors: dict[str, TensorEntry]


class IndexEntry(NamedTuple):
    """One tensor of a checkpoint's index, judged before any tensor is read: its stored dtype
    ("F32", "F16", "BF16", ...), its shape, and where it is (a file, a Hub file name, an Orbax
    checkpoint folder)."""

    dtype: str
    shape: tuple[int, ...]
    source: Path | str


# A header is read whole and parsed before anything else is done with the file: its size and
# tensor count are bounded (docs/errors.md, "Limits"). A real model's header is about 100 bytes
# a tensor; flan-t5-xxl has 219 tensors.
HEADER_LIMIT = 16 * 2**20
TENSOR_LIMIT = 65_536


def read_header(path: Path) -> FileHeader:
    """The file's size and the tensors it holds (validated by the safetensors library), by name.

    The library reads and validates a header of up to 100 MB whole (a million tensors take it
    seconds and gigabytes), so the header's size and tensor count are bounded first."""
    fix = "re-download or re-convert it"
    try:
        with open_checked(path, "safetensors file", sys.maxsize) as f:
            size = os.fstat(f.fileno()).st_size
            length = int.from_bytes(f.read(8), "little")
            if HEADER_LIMIT < length <= size - 8:
                found, most = sizes_compared(length, HEADER_LIMIT)
                raise MiniT2IError(f"{path} declares a safetensors header of {found}, more than the {most} a model's "
                                   f"header can be; {fix}")
            raw = f.read(length) if length <= size - 8 else b""
    except OSError as err:
        raise MiniT2IError(f"cannot read {path}: {err.strerror or err}") from None
    if raw.count(b'"data_offsets"') > TENSOR_LIMIT:  # counted before any parsing
        raise MiniT2IError(f"{path} lists over {TENSOR_LIMIT:,} tensors, more than a model file holds; {fix}")
    try:
        with safe_open(str(path), framework="numpy"):
            pass
    except (SafetensorError, OSError, ValueError) as err:
        raise MiniT2IError(f"{path} is not a readable safetensors file ({err}); {fix}") from None
    header = parse_json(raw, "the safetensors header of", path)
    return FileHeader(size, {name: TensorEntry(entry["dtype"], tuple(entry["shape"]), *entry["data_offsets"])
                             for name, entry in header.items() if name != "__metadata__"})


def read_headers(files: list[Path]) -> dict[Path, FileHeader]:
    """The header of each file, by path."""
    return {path: read_header(path) for path in files}


def index_of(headers: dict[Path, FileHeader]) -> dict[str, IndexEntry]:
    """Every tensor of the files by name, from their headers."""
    return {name: IndexEntry(entry.dtype, entry.shape, path)
            for path, header in headers.items() for name, entry in header.tensors.items()}


def read_index(files: list[Path]) -> dict[str, IndexEntry]:
    """Every tensor of the files by name, from the headers alone."""
    return index_of(read_headers(files))


class MappedFile:
    """A read-only memory map of one safetensors file.

    `checked` holds the headers the file's tensors were checked against when it was opened (by
    path): a file that is no longer the one checked (another size, other names, shapes, dtypes or
    offsets: re-exported or replaced meanwhile, perhaps hours earlier in a server) is refused
    before any tensor is read from it."""

    def __init__(self, path: Path, checked: dict[Path, FileHeader] | None = None):
        header = read_header(path)
        if checked is not None and checked.get(path) != header:
            raise MiniT2IError(f"{path} changed since it was opened (its size, tensor names, shapes or dtypes "
                               "differ from those checked); open the model again")
        self.header = header.tensors
        raw = np.memmap(path, dtype=np.uint8, mode="r")
        self.data = raw[8 + int(raw[:8].view("<u8")[0]):]

    def tensor(self, name: str) -> np.ndarray:
        """The tensor as float32: a view for F32, a widened copy for F16 and BF16."""
        entry = self.header[name]
        raw = self.data[entry.start:entry.end].view(SUPPORTED_DTYPES[entry.dtype]).reshape(entry.shape)
        if entry.dtype == "F32":
            return raw
        if entry.dtype == "F16":
            return raw.astype(np.float32)
        # bfloat16 is the top half of a float32: shift the 16 stored bits into place.
        widened = raw.astype(np.uint32)
        widened <<= 16
        return widened.view(np.float32)
