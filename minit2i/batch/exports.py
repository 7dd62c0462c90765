"""Other tools' layouts, made from a finished run folder read as it is (`store.read_run`, which
changes nothing in it): DPG-Bench's (one 2 x 2 grid of a prompt's four images per item) and a flat
folder of every image (what FID tools read). Every name is chosen before anything is written."""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from pathlib import Path

from minit2i.core.checks import short_list
from minit2i.core.errors import MiniT2IError
from minit2i.core.images import grid, png_bytes

from .store import Run, holds, plain_folder, read_metadata, write_durably

EXPORTS = ("dpg", "flat")
DPG_GRID = 2  # DPG-Bench scores a 2 x 2 grid of four images per prompt
# An item's own name (a metadata "id") is used as its file name only when it is a plain one, not
# a name an index gets (`is_index_name`) and no other prompt's (compared as a case-insensitive
# file system compares them).
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


def export(run: Run, kind: str) -> tuple[Path, int]:
    """Write the `kind` export (checked by `check_exports`) into DIR/<kind>/ -> (that folder, files written)."""
    folder = plain_folder(run.root / kind, create=False)
    if kind == "dpg":
        check_exports(["dpg"], run.record["settings"]["images_per_prompt"])
        return folder, export_dpg(run, item_names(run, complete_prompts(run)), folder)
    return folder, export_flat(run, folder)


def check_exports(kinds: list[str], images_per_prompt: int | None) -> None:
    """The exports asked for are known, and a DPG export has its four images a prompt (not
    checked where `images_per_prompt` is None, not yet known)."""
    for kind in kinds:
        if kind not in EXPORTS:
            raise MiniT2IError(f"--export must be one of {', '.join(EXPORTS)}, found {kind!r}")
    if "dpg" in kinds and images_per_prompt not in (None, DPG_GRID**2):
        raise MiniT2IError(f"--export dpg tiles four images per prompt, and this run draws {images_per_prompt}; "
                           "draw it with -n 4")


def complete_prompts(run: Run) -> list[int]:
    """The prompts with all their images done, in order."""
    per_prompt = run.record["settings"]["images_per_prompt"]
    return sorted(index for index in {index for index, _ in run.done}
                  if all((index, k) in run.done for k in range(per_prompt)))


def item_names(run: Run, indexes: list[int]) -> dict[int, str]:
    """{index: file name without .png} of each prompt's DPG grid: its metadata "id" where that is
    a plain name that no other prompt shares, else its index (`index:05d`). Ids left for their
    index are one warning."""
    ids = {index: read_metadata(run.root, index).get("id") for index in indexes}
    usable = {index: name for index, name in ids.items()
              if isinstance(name, str) and PLAIN_NAME.fullmatch(name) and not is_index_name(name)}
    counts = Counter(name.casefold() for name in usable.values())
    shared = sorted({name.casefold() for name in usable.values() if counts[name.casefold()] > 1})
    if shared:
        logging.getLogger("minit2i").warning(f"warning: DPG grids named by their prompt's index where prompts share "
                                             f"an id ({short_list([repr(name) for name in shared])})")
    return {index: usable[index] if index in usable and counts[usable[index].casefold()] == 1 else f"{index:05d}"
            for index in indexes}


def is_index_name(name: str) -> bool:
    """Whether `name` is the name some prompt's index gets (`index:05d`): DPG-Bench's own ids,
    "1" and "256", are not."""
    return name.isdigit() and name == f"{int(name):05d}"


def export_dpg(run: Run, names: dict[int, str], folder: Path) -> int:
    """One PNG per prompt with all four images done, named by `names`: its images tiled 2 x 2 in
    k order, each checked before it is decoded (`Run.image`)."""
    for index, name in names.items():
        tiles = [run.image(run.done[index, k])[1] for k in range(DPG_GRID**2)]
        write_durably(plain_folder(folder) / f"{name}.png", png_bytes(grid(tiles, DPG_GRID)))
    return len(names)


def export_flat(run: Run, folder: Path) -> int:
    """Every image done as <index:05d>_<k:04d>.png in one folder: a hard link to the store's file
    where the file system allows, else a copy. Each image is checked first as every export and
    score check it (`Run.image`: a plain file, the bytes its manifest line records, a PNG of the
    run's size)."""
    for (index, k), entry in sorted(run.done.items()):
        source, target = run.root / entry["path"], folder / f"{index:05d}_{k:04d}.png"
        data = run.image(entry)[0]
        plain_folder(folder)
        if holds(target, data) and os.path.samefile(source, target):
            continue
        if not linked(source, target, data):
            write_durably(target, data)
    return len(run.done)


def linked(source: Path, target: Path, data: bytes) -> bool:
    """Whether `source` is now hard-linked at `target` (through a temporary name beside it),
    which is done only where the link holds `data`, the bytes checked: a file swapped since, or
    a file system without hard links, is left to a copy."""
    temporary = target.with_name(f".{target.name}.link")
    try:
        temporary.unlink(missing_ok=True)
        os.link(source, temporary, follow_symlinks=False)
        if holds(temporary, data):
            os.replace(temporary, target)
            return True
        temporary.unlink()
    except OSError:
        pass
    return False
