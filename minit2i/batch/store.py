"""The run folder, in GenEval's layout, and the records that make it resumable:

    DIR/run.json                       the settings and numerical setup the images were drawn with
    DIR/manifest.jsonl                 one line per finished image: index, k, prompt, seed, path, sha256
    DIR/<index:05d>/metadata.jsonl     the prompt's line of the prompt file
    DIR/<index:05d>/samples/<k:04d>.png

Only the driver writes here. A PNG is written to a temporary file, flushed to disk and renamed
(a scorer never reads half a file), then its manifest line is appended and flushed to disk: an
image is done when both exist. A kill between the two leaves a PNG without its line; it is drawn
again and, being the same bytes, left as it is.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
from pathlib import Path

from minit2i.core.checks import created_folder, parse_json, read_json_object
from minit2i.core.errors import MiniT2IError
from minit2i.core.files import write_temporary

RUN_FILE = "run.json"
MANIFEST = "manifest.jsonl"
MANIFEST_FIELDS = ("index", "k", "prompt", "seed", "path", "sha256")


def image_path(index: int, k: int) -> str:
    """The store path of image k of prompt `index`, relative to the run folder (GenEval's names)."""
    return f"{index:05d}/samples/{k:04d}.png"


def metadata_path(index: int) -> str:
    return f"{index:05d}/metadata.jsonl"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_durably(path: Path, data: bytes) -> None:
    """`data` into `path` whole or not at all, on disk before the rename (a temporary file beside
    it, fsync, rename)."""

    def write(file):
        file.write(data)
        file.flush()
        os.fsync(file.fileno())

    tmp = write_temporary(path, write)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_folder(out: Path) -> Path:
    """The run folder: created if missing; an existing one must be a run folder (it holds run.json)
    or empty, so that a typo cannot scatter thousands of files into a folder of other things."""
    if out.exists() and not out.is_dir():
        raise MiniT2IError(f"--out {out} is a file, not a folder; choose a folder for the run")
    created_folder(out, "--out")
    # An empty manifest alone is what a run killed before writing run.json leaves.
    if not (out / RUN_FILE).exists() and any(p.name != MANIFEST or p.stat().st_size for p in out.iterdir()):
        raise MiniT2IError(f"--out {out} holds other files and no {RUN_FILE}; choose a new or empty folder")
    return out


def differences(recorded: dict, wanted: dict, prefix: str = "") -> list[str]:
    """'key: recorded -> wanted' for each leaf where two nested dicts differ (keys as a.b.c), in
    the order of `wanted`'s keys."""
    found = []
    for key in [*wanted, *(key for key in recorded if key not in wanted)]:
        a, b = recorded.get(key), wanted.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            found += differences(a, b, name + ".")
        elif a != b:
            found.append(f"{name} {json.dumps(a)} -> {json.dumps(b)}")
    return found


class Store:
    """A run folder opened by one driver (an exclusive lock on its manifest): what is done, and
    the writing of images and their manifest lines (from several threads at once)."""

    def __init__(self, out: Path):
        self.root = open_folder(out)
        self.manifest_path = self.root / MANIFEST
        self.manifest = open(self.manifest_path, "a+b")
        self.appending = threading.Lock()
        try:
            fcntl.flock(self.manifest.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.manifest.close()
            raise MiniT2IError(f"another batch run is writing {out}; wait for it to finish or choose another "
                               "--out") from None
        self.remove_leftovers()

    def remove_leftovers(self) -> None:
        """Delete the temporary files of a run killed mid-write (ours alone: the lock is held)."""
        for pattern in ("[0-9]*/.*.part", "[0-9]*/samples/.*.part", ".*.part"):
            for leftover in self.root.glob(pattern):
                leftover.unlink(missing_ok=True)

    def close(self) -> None:
        self.manifest.close()

    def check_run(self, record: dict, compared: tuple[str, ...]) -> None:
        """Write run.json for a new run; for an existing one, refuse a run whose `compared` parts
        differ from what run.json records, naming the first difference."""
        path = self.root / RUN_FILE
        if not path.exists():
            write_durably(path, (json.dumps(record, indent=2) + "\n").encode())
            return
        recorded = read_json_object(path, RUN_FILE)
        changed = differences({k: recorded.get(k) for k in compared}, {k: record[k] for k in compared})
        if changed:
            more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            raise MiniT2IError(f"{self.root} was drawn with other settings: {changed[0]}{more}; rerun with the "
                               "settings in its run.json, or choose another --out")

    def done(self) -> dict[tuple[int, int], dict]:
        """{(index, k): manifest entry} of the images done: a manifest line whose PNG exists. A last
        line cut short by a kill is dropped from the file, so that the next line starts clean."""
        self.manifest.seek(0)
        data = self.manifest.read()
        complete = data[:data.rfind(b"\n") + 1]
        if len(complete) < len(data):
            self.manifest.truncate(len(complete))
        entries = {}
        for number, line in enumerate(complete.splitlines(), 1):
            entry = parse_json(line, MANIFEST, f"{self.manifest_path} line {number}")
            if not (isinstance(entry, dict) and set(MANIFEST_FIELDS) <= set(entry)
                    and all(type(entry[key]) is int and entry[key] >= 0 for key in ("index", "k"))
                    and entry["path"] == image_path(entry["index"], entry["k"])):
                raise MiniT2IError(f"{self.manifest_path} line {number} is not a manifest line; move the folder "
                                   "away to start over, or restore the file")
            if (self.root / entry["path"]).is_file():
                entries[entry["index"], entry["k"]] = entry
        return entries

    def write_metadata(self, index: int, line: bytes) -> None:
        """The prompt's folder and its metadata.jsonl (left as it is when it holds `line`)."""
        path = self.root / metadata_path(index)
        (path.parent / "samples").mkdir(parents=True, exist_ok=True)
        if not (path.is_file() and path.read_bytes() == line):
            write_durably(path, line)

    def write_image(self, index: int, k: int, prompt: str, seed: int, png: bytes) -> dict:
        """The PNG (left as it is when it already holds these bytes: a kill came before its
        manifest line), then its manifest line, appended and flushed to disk; the line's entry."""
        relative = image_path(index, k)
        path = self.root / relative
        if not (path.is_file() and path.read_bytes() == png):
            write_durably(path, png)
        entry = {"index": index, "k": k, "prompt": prompt, "seed": seed, "path": relative, "sha256": sha256_hex(png)}
        with self.appending:  # writer threads write their PNGs side by side, their lines one at a time
            self.manifest.write((json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8"))
            self.manifest.flush()
            os.fsync(self.manifest.fileno())
        return entry
