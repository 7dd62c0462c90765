"""The run folder, in GenEval's layout, and the records that make it resumable:

    DIR/run.json                       what wrote the folder (format, version), the settings and
                                       numerical setup the images were drawn with
    DIR/manifest.jsonl                 one line per finished image: index, k, prompt, seed, path, sha256
    DIR/<index:05d>/metadata.jsonl     the prompt's line of the prompt file
    DIR/<index:05d>/samples/<k:04d>.png

Only the driver writes here (`Store`, holding an exclusive lock on the folder); readers (the
exports, `training.score`) read it with `read_run`, which changes nothing. A folder is a run
folder when its own run.json says so (RUN_FORMAT, RUN_VERSION): nothing in a folder is read,
removed or created before that check. Every file in it is read as a file from outside: checked
for its kind and size before a byte is read, a link never followed.

A PNG is written to a temporary file, flushed to disk and renamed (a scorer never reads half a
file), then its manifest line is appended and flushed to disk: an image is done when both exist.
A kill between the two leaves a PNG without its line; it is drawn again and, being the same
bytes, left as it is.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minit2i.core.checks import (Range, created_folder, differences, file_kind, open_checked, parse_json,
                                 read_limited, shown)
from minit2i.core.errors import MiniT2IError
from minit2i.core.files import write_temporary
from minit2i.core.images import decode_png, png_limit

from .prompts import LINE_LIMIT, json_line

RUN_FILE = "run.json"
MANIFEST = "manifest.jsonl"
MANIFEST_FIELDS = ("index", "k", "prompt", "seed", "path", "sha256")
# What run.json says of itself: a folder holding another tool's run.json is not taken for a run.
RUN_FORMAT = "minit2i batch run"
RUN_VERSION = 1
RUN_LIMIT = 2**20  # run.json: settings, setup, sources and the command line, a few kB
# The manifest is read line by line, each at most LINE_LIMIT (a 20,000-character prompt, each
# character at most 6 bytes escaped, and six short fields); in all at most MANIFEST_LIMIT, over
# three million lines of 300 bytes (an FID's 30,000 images: 9 MB).
MANIFEST_LIMIT = 2**30
IMAGES_PER_PROMPT = Range(1, 10_000)
IMAGE_SIDE = Range(1, 16384)  # as --width and --height
REDRAW = "delete it and run the batch command again to draw it again"


def image_path(index: int, k: int) -> str:
    """The store path of image k of prompt `index`, relative to the run folder (GenEval's names)."""
    return f"{index:05d}/samples/{k:04d}.png"


def metadata_path(index: int) -> str:
    return f"{index:05d}/metadata.jsonl"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_durably(path: Path, data: bytes) -> None:
    """`data` into `path` whole or not at all, on disk before the rename (a temporary file beside
    it, fsync, rename); a full disk or a folder gone is one line naming `path`."""

    def write(file):
        file.write(data)
        file.flush()
        os.fsync(file.fileno())

    try:
        tmp = write_temporary(path, write)
        try:
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as err:
        raise MiniT2IError(f"cannot write {path}: {err.strerror or err}; free some space or fix the folder, then "
                           "run the same command again") from None


def is_plain_file(path: Path) -> bool:
    """A regular file, not a link to one."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def plain_folder(path: Path, create: bool = True) -> Path:
    """`path`, a folder of the run (created if missing and `create`): a link, a file or anything
    else there is one line, so that nothing is written outside the run folder."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        if create:
            try:
                path.mkdir()
            except OSError as err:
                raise MiniT2IError(f"cannot create {path}: {err.strerror}; fix the run folder's permissions") from None
        return path
    if not stat.S_ISDIR(mode):
        raise MiniT2IError(f"{path} is a {file_kind(mode)}, not a folder of the run; move it away and run the same "
                           "command again")
    return path


def read_record(root: Path) -> dict:
    """DIR/run.json, checked to be one `minit2i batch` writes (its format and version, and the
    settings the exports read) before anything else in the folder is touched."""
    path = root / RUN_FILE
    record = parse_json(read_limited(path, RUN_FILE, RUN_LIMIT, follow_links=False), RUN_FILE, path)
    if not (isinstance(record, dict) and record.get("format") == RUN_FORMAT):
        raise MiniT2IError(f"{root} is not a run folder of minit2i batch: its {RUN_FILE} does not say "
                           f"\"format\": \"{RUN_FORMAT}\"; choose a new or empty folder")
    if record.get("version") != RUN_VERSION:
        raise MiniT2IError(f"{path} is of version {shown(record.get('version'))} of the run folder, and this minit2i "
                           f"reads version {RUN_VERSION}; use the minit2i that drew it, or draw it again in another "
                           "folder")
    settings = record.get("settings")
    sampler = settings.get("sampler") if isinstance(settings, dict) else None
    if not (isinstance(sampler, dict) and IMAGES_PER_PROMPT.contains(settings.get("images_per_prompt"))
            and IMAGE_SIDE.contains(sampler.get("width")) and IMAGE_SIDE.contains(sampler.get("height"))):
        raise MiniT2IError(f"{path} is damaged: its settings lack images_per_prompt or the image size; restore it, "
                           "or draw the run again in another folder")
    return record


def image_size(record: dict) -> tuple[int, int]:
    """(width, height) of the images of a run, from its checked run.json."""
    sampler = record["settings"]["sampler"]
    return sampler["width"], sampler["height"]


def lock_folder(root: Path, exclusive: bool) -> int:
    """An open descriptor of `root` holding a lock on it: exclusive for the one driver writing,
    shared for readers; a writer at work (or, for the writer, anyone) is one line."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        doing = "writing or reading" if exclusive else "writing"
        raise MiniT2IError(f"another minit2i batch is {doing} {root}; wait for it to finish or choose another "
                           "folder") from None
    return fd


def read_entries(manifest, path: Path, root: Path) -> tuple[dict[tuple[int, int], dict], int]:
    """({(index, k): entry} of the images done, the length of the manifest's complete lines) of an
    open manifest, read a line at a time: an image is done when its line is there and its PNG is
    a plain file. A last line without its newline (cut by a kill) is not counted."""
    manifest.seek(0)
    entries, length, number = {}, 0, 0
    while line := manifest.readline(LINE_LIMIT + 1):
        number += 1
        if not line.endswith(b"\n"):
            if len(line) > LINE_LIMIT:
                raise MiniT2IError(f"{path} line {number} is longer than the {LINE_LIMIT:,} bytes a manifest line "
                                   "can be; move the folder away to start over, or restore the file")
            break
        length += len(line)
        entry = parse_json(line, MANIFEST, f"{path} line {number}")
        if not (isinstance(entry, dict) and set(MANIFEST_FIELDS) <= set(entry)
                and all(type(entry[key]) is int and entry[key] >= 0 for key in ("index", "k"))
                and entry["path"] == image_path(entry["index"], entry["k"]) and isinstance(entry["sha256"], str)):
            raise MiniT2IError(f"{path} line {number} is not a manifest line; move the folder away to start over, "
                               "or restore the file")
        if is_plain_file(root / entry["path"]):
            entries[entry["index"], entry["k"]] = entry
    return entries, length


def inside(root: Path, relative: str) -> Path:
    """root / relative, each folder between them checked to be a folder of the run, not a link
    (`plain_folder`): a file of the run is never read through a link to another folder."""
    folder = root
    for part in Path(relative).parts[:-1]:
        folder = plain_folder(folder / part, create=False)
    return root / relative


def read_metadata(root: Path, index: int) -> dict:
    """The metadata.jsonl of prompt `index` (its line of the prompt file), read as a file from outside."""
    path = inside(root, metadata_path(index))
    return json_line(path, 1, read_limited(path, "metadata", LINE_LIMIT, follow_links=False), "metadata")


@dataclass(frozen=True)
class Run:
    """A run folder as a reader sees it: its checked run.json and the images done."""

    root: Path
    record: dict
    done: dict[tuple[int, int], dict]

    def image(self, entry: dict) -> tuple[bytes, np.ndarray]:
        """(PNG bytes, uint8 [H, W, 3]) of a manifest entry's image, checked before it is decoded: a
        plain file in plain folders (`inside`) of the size a PNG of the run's size can have, the
        bytes its line records, a PNG of the run's size."""
        path = inside(self.root, entry["path"])
        width, height = image_size(self.record)
        data = read_limited(path, "image", png_limit(width, height), follow_links=False)
        if sha256_hex(data) != entry["sha256"]:
            raise MiniT2IError(f"{path} does not hold the image its manifest line records (another sha256); {REDRAW}")
        return data, decode_png(data, path, "an image of this run", (width, height), REDRAW)


def read_run(root: Path, flag: str = "--out") -> Run:
    """The run folder `root` read without changing anything in it (no folder or manifest made, no
    line dropped, no temporary file removed): its run.json checked first, then its manifest; a
    writer at work is one line."""
    try:
        mode = os.stat(root).st_mode
    except OSError:
        mode = None
    if mode is None or not stat.S_ISDIR(mode) or not os.path.lexists(root / RUN_FILE):
        raise MiniT2IError(f"{flag} {root} is not a run folder (no {RUN_FILE}); draw it first with minit2i batch "
                           "PROMPTS --out DIR")
    lock = lock_folder(root, exclusive=False)
    try:
        record = read_record(root)
        path = root / MANIFEST
        if not os.path.lexists(path):
            return Run(root, record, {})
        with open_checked(path, "manifest", MANIFEST_LIMIT, follow_links=False) as manifest:
            return Run(root, record, read_entries(manifest, path, root)[0])
    finally:
        os.close(lock)


def open_manifest(path: Path):
    """The manifest opened for reading and appending (created if missing), checked as a file from
    outside: a link, FIFO, device or folder is one line, never followed or opened for writing."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as err:
        kind = file_kind(os.lstat(path).st_mode) if err.errno in (errno.ELOOP, errno.EISDIR) else None
        if kind:
            raise MiniT2IError(f"{path} is a {kind}, not the manifest this command writes; move it away to start "
                               "over, or restore the file") from None
        raise MiniT2IError(f"cannot open {path}: {err.strerror}; fix the run folder's permissions") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > MANIFEST_LIMIT:
        os.close(fd)
        found = (f"a {file_kind(info.st_mode)}" if not stat.S_ISREG(info.st_mode)
                 else f"{info.st_size:,} bytes, more than the {MANIFEST_LIMIT:,} a manifest can be")
        raise MiniT2IError(f"{path} is {found}, not the manifest this command writes; move it away to start over, "
                           "or restore the file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a+b")


class Store:
    """A run folder opened by one driver (an exclusive lock on the folder): created if missing; an
    existing one must be empty or a run folder whose run.json records the same `compared` parts
    as `record` (a new one gets `record` as its run.json). Then what is done, and the writing of
    images, their prompts' metadata and their manifest lines (from several threads at once)."""

    def __init__(self, out: Path, record: dict, compared: tuple[str, ...]):
        if out.exists() and not out.is_dir():
            raise MiniT2IError(f"--out {out} is a file, not a folder; choose a folder for the run")
        self.root = created_folder(out, "--out")
        self.lock = lock_folder(out, exclusive=True)
        try:
            self.check_run(record, compared)
            self.manifest_path = self.root / MANIFEST
            self.manifest = open_manifest(self.manifest_path)
        except BaseException:
            os.close(self.lock)
            raise
        self.appending = threading.Lock()
        self.prepared: set[int] = set()  # prompts whose folders and metadata.jsonl are written
        self.remove_leftovers()

    def check_run(self, record: dict, compared: tuple[str, ...]) -> None:
        """Write run.json into an empty folder; in a run folder, refuse a run whose `compared`
        parts differ from what run.json records, naming the first difference. Another folder is
        refused before anything in it is touched."""
        path = self.root / RUN_FILE
        if not os.path.lexists(path):
            if any(os.scandir(self.root)):
                raise MiniT2IError(f"--out {self.root} holds other files and no {RUN_FILE}; choose a new or empty "
                                   "folder")
            write_durably(path, (json.dumps({"format": RUN_FORMAT, "version": RUN_VERSION} | record, indent=2)
                                 + "\n").encode())
            return
        recorded = read_record(self.root)
        changed = differences({k: recorded.get(k) for k in compared}, {k: record[k] for k in compared})
        if changed:
            more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            raise MiniT2IError(f"{self.root} was drawn with other settings: {changed[0]}{more}; rerun with the "
                               "settings in its run.json, or choose another --out")

    def remove_leftovers(self) -> None:
        """Delete the temporary files (.NAME.XXXXXXXX.part) of a run killed mid-write, in the run
        folder, its prompt folders and their samples folders (never through a link)."""
        folders = [self.root]
        for folder in folders:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False) and (entry.name.isdigit() and folder == self.root
                                                                or entry.name == "samples" and folder != self.root):
                        folders.append(Path(entry.path))
                    elif entry.name.startswith(".") and entry.name.endswith(".part") and entry.is_file(
                            follow_symlinks=False):
                        os.unlink(entry.path)

    def close(self) -> None:
        self.manifest.close()
        os.close(self.lock)

    def done(self) -> dict[tuple[int, int], dict]:
        """{(index, k): manifest entry} of the images done (`read_entries`). A last line cut short
        by a kill is dropped from the file, so that the next line starts clean."""
        entries, length = read_entries(self.manifest, self.manifest_path, self.root)
        if length < os.fstat(self.manifest.fileno()).st_size:
            self.manifest.truncate(length)
        return entries

    def prepare(self, index: int, metadata: bytes) -> None:
        """The prompt's folder, its samples folder and its metadata.jsonl (left as it is when it
        holds `metadata`), once per run, before its first image."""
        with self.appending:
            if index in self.prepared:
                return
            folder = plain_folder(self.root / f"{index:05d}")
            plain_folder(folder / "samples")
            path = self.root / metadata_path(index)
            if not holds(path, metadata):
                write_durably(path, metadata)
            self.prepared.add(index)

    def write_image(self, index: int, k: int, prompt: str, seed: int, png: bytes, metadata: bytes) -> dict:
        """The PNG (left as it is when it already holds these bytes: a kill came before its
        manifest line), then its manifest line, appended and flushed to disk; the line's entry.
        The prompt's folder and `metadata` are written first, with its first image."""
        self.prepare(index, metadata)
        relative = image_path(index, k)
        path = self.root / relative
        if not holds(path, png):
            write_durably(path, png)
        entry = {"index": index, "k": k, "prompt": prompt, "seed": seed, "path": relative, "sha256": sha256_hex(png)}
        with self.appending:  # writer threads write their PNGs side by side, their lines one at a time
            try:
                self.manifest.write((json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8"))
                self.manifest.flush()
                os.fsync(self.manifest.fileno())
            except OSError as err:
                raise MiniT2IError(f"cannot write {self.manifest_path}: {err.strerror or err}; free some space, "
                                   "then run the same command again") from None
        return entry


def holds(path: Path, data: bytes) -> bool:
    """Whether `path` is a plain file (not a link) holding exactly `data`; it is read only when
    its size is that of `data`."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if not (stat.S_ISREG(info.st_mode) and info.st_size == len(data)):
        return False
    try:
        return read_limited(path, "file", len(data), follow_links=False) == data
    except MiniT2IError:
        return False
