"""What the two model configs share: range-checked fields, reading config.json, and reading a
config off tensor shapes when no config.json sits beside the weights.

Every field of a config is checked against one table (`MMJIT_RANGES`, `T5_RANGES`) when the
config is created, however it is made, so `generate`, `trace` and `info` all refuse the same
bad values with the same message.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from .checks import Range
from .errors import MiniT2IError


def check_fields(config, ranges: dict[str, Range]) -> None:
    """Every field against its range, in declaration order (the first bad one is reported)."""
    for f in dataclasses.fields(config):
        ranges[f.name].check(f.name, getattr(config, f.name))


def config_from_file(cls, path: Path, raw: dict):
    """A config from the fields of `raw` this model uses; a bad value names the file."""
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in raw.items() if k in names})
    except MiniT2IError as err:
        raise MiniT2IError(f"{path}: {err}; fix the file, or delete it to infer the config from "
                           "the tensor shapes") from None


def config_from_shapes(cls, **values):
    """A config built from shape values, whose range checks then talk about the shapes."""
    try:
        return cls(**values)
    except MiniT2IError as err:
        raise MiniT2IError(f"the config inferred from the tensor shapes is invalid: {err}") from None


def require_dims(shapes: dict[str, tuple[int, ...]], dims: dict[str, int]) -> None:
    """Before any shape value is unpacked or divided by: each named tensor (if present) has
    the expected number of dimensions, none of them empty."""
    for name, ndim in dims.items():
        shape = shapes.get(name)
        if shape is not None and (len(shape) != ndim or 0 in shape):
            sizes = "dimensions" if len(shape) != ndim else "dimensions of size at least 1"
            raise MiniT2IError(f"{name}: expected {ndim} {sizes}, found {list(shape)}")


def count_blocks(shapes: dict[str, tuple[int, ...]], prefix: str) -> int:
    """How many numbered blocks `prefix.0.`, `prefix.1.`, ... the tensor names hold."""
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    found = {int(m.group(1)) for k in shapes if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


def to_json(config) -> str:
    """Serialise a config the way diffusers/HF would (used by the demo model and tests)."""
    return json.dumps(dataclasses.asdict(config), indent=2)
