"""Other tools' layouts, made from a finished store: DPG-Bench's (one 2 x 2 grid of a prompt's
four images per item) and a flat folder of every image (what FID tools read)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
from PIL import Image

from minit2i.core.checks import read_json_object
from minit2i.core.errors import MiniT2IError
from minit2i.core.images import grid, png_bytes

from .store import RUN_FILE, Store, metadata_path, write_durably

EXPORTS = ("dpg", "flat")
DPG_GRID = 2  # DPG-Bench scores a 2 x 2 grid of four images per prompt
# An item's own name (a metadata "id") is used as its file name only when it is a plain one.
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


def export(store: Store, kind: str) -> tuple[Path, int]:
    """Write the `kind` export (checked by `check_exports`) into DIR/<kind>/ -> (that folder, files written)."""
    done = store.done()
    folder = store.root / kind
    folder.mkdir(exist_ok=True)
    if kind == "dpg":
        return folder, export_dpg(store, done, folder)
    return folder, export_flat(store, done, folder)


def check_exports(kinds: list[str], images_per_prompt: int | None) -> None:
    """The exports asked for are known, and a DPG export has its four images a prompt (not
    checked where `images_per_prompt` is None, not yet known)."""
    for kind in kinds:
        if kind not in EXPORTS:
            raise MiniT2IError(f"--export must be one of {', '.join(EXPORTS)}, found {kind!r}")
    if "dpg" in kinds and images_per_prompt not in (None, DPG_GRID**2):
        raise MiniT2IError(f"--export dpg tiles four images per prompt, and this run draws {images_per_prompt}; "
                           "draw it with -n 4")


def export_dpg(store: Store, done: dict, folder: Path) -> int:
    """One PNG per prompt with all four images done: its images tiled 2 x 2 in k order, named by
    the prompt's metadata "id" where that is a plain name, else by its index."""
    per_prompt = read_json_object(store.root / RUN_FILE, RUN_FILE)["settings"]["images_per_prompt"]
    check_exports(["dpg"], per_prompt)
    written = 0
    for index in sorted({index for index, _ in done}):
        if all((index, k) in done for k in range(per_prompt)):
            tiles = [np.asarray(Image.open(store.root / done[index, k]["path"]).convert("RGB"))
                     for k in range(per_prompt)]
            write_durably(folder / f"{item_name(store, index)}.png", png_bytes(grid(tiles, DPG_GRID)))
            written += 1
    return written


def item_name(store: Store, index: int) -> str:
    """The file name (without .png) of a prompt's DPG grid."""
    from .prompts import json_line

    line = (store.root / metadata_path(index)).read_text(encoding="utf-8")
    name = json_line(store.root / metadata_path(index), 1, line).get("id")
    return name if isinstance(name, str) and PLAIN_NAME.fullmatch(name) else f"{index:05d}"


def export_flat(store: Store, done: dict, folder: Path) -> int:
    """Every image done as <index:05d>_<k:04d>.png in one folder: a hard link to the store's file
    where the file system allows, else a copy."""
    for (index, k), entry in sorted(done.items()):
        source, target = store.root / entry["path"], folder / f"{index:05d}_{k:04d}.png"
        if target.exists() and os.path.samefile(source, target):
            continue
        try:
            temporary = folder / f".{target.name}.link"
            temporary.unlink(missing_ok=True)
            os.link(source, temporary)
            os.replace(temporary, target)
        except OSError:
            write_durably(target, source.read_bytes())
    return len(done)
