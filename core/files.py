"""Writing files whole: one through a temporary file beside it and a rename (`write_atomically`),
several committed together (`write_together`), and the check before any work that a path can be
written so (`check_output_file`). Apart from `checks`, which the configs import: importing a
model loads no file-writing machinery.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from .checks import user_path, writable_folder
from .errors import MiniT2IError

# A file is written as a temporary file beside it, `.NAME.XXXXXXXX.part`, then renamed: its name
# is this many bytes longer than NAME, and both must fit the file system's limit (255 bytes).
TEMPORARY_EXTRA = len("..XXXXXXXX.part")


def write_temporary(path: Path, write: Callable[[BinaryIO], object]) -> str:
    """The name of a new temporary file beside `path`, filled by `write(file)` and given the mode
    a plain open() would give, to be renamed to `path`; on any failure it is removed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.chmod(tmp, 0o666 & ~_current_umask())  # mkstemp makes the file private (0600)
            write(f)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename is None:  # a full disk names the file it could not write
            raise OSError(err.errno, err.strerror, str(path)) from None
        raise
    return tmp


def check_output_file(path: Path, flag: str) -> Path:
    """`path` can be written, checked before any work: its folder exists and is writable, it is
    not a folder, and its name and its temporary file's both fit the file system's limit."""
    path = user_path(path)
    if not path.name:
        raise MiniT2IError(f"{flag} {str(path)!r} names no file; pass a file name")
    writable_folder(path.parent, flag)
    if path.is_dir():
        raise MiniT2IError(f"{flag} {path} is a folder; pass a file name")
    length = len(os.fsencode(path.name))
    limit = _name_max(path.parent)
    if length + TEMPORARY_EXTRA > limit:
        raise MiniT2IError(f"{flag} file name {path.name[:40]}... is {length} bytes; with the {TEMPORARY_EXTRA} bytes "
                           f"of the temporary file written first, it exceeds the {limit}-byte limit on file "
                           "names; choose a shorter name")
    return path


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def write_atomically(path: Path, data: bytes) -> None:
    """`data` into `path` through a temporary file beside it and one rename: `path` is either
    left as it was or replaced whole. The file gets the mode a plain open() would give."""
    tmp = write_temporary(path, lambda f: f.write(data))
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_together(writers: dict[Path, Callable[[BinaryIO], object]], fix: str) -> None:
    """Write several files as one: each `writers[path](file)` fills a temporary file beside its
    path, then all are committed together (`commit_together`). A failure while writing (a full
    disk) is one line naming the file and ending in `fix`, and leaves every path as it was."""
    temporary = {}
    try:
        for path, write in writers.items():
            try:
                temporary[path] = write_temporary(path, write)
            except OSError as err:
                raise MiniT2IError(f"cannot write {path}: {err.strerror or err}; {fix}") from None
        commit_together(temporary)
    finally:
        for tmp in temporary.values():
            Path(tmp).unlink(missing_ok=True)


def commit_together(temporary: dict[Path, str]) -> None:
    """Rename each temporary file onto its path, all or none: SIGINT and SIGTERM wait until the
    renames are done, each replaced path is first moved aside (a rename, no copy), and if one
    rename fails the paths renamed so far get their old files back. After any failure short of
    a kill -9 or a crash, every path holds its old file (or none, as before), else every new one."""
    replaced: list[tuple[Path, str | None]] = []
    with signals_held():
        try:
            for path, tmp in temporary.items():
                replaced.append((path, _move_aside(path)))
                os.rename(tmp, path)
        except BaseException:
            for path, aside in reversed(replaced):
                if aside is None:
                    Path(path).unlink(missing_ok=True)
                else:
                    os.replace(aside, path)
            raise
        for _, aside in replaced:
            if aside is not None:
                os.unlink(aside)


def _move_aside(path: Path) -> str | None:
    """Move `path` (a file, a link, a FIFO: never followed) to a fresh name beside it, returned;
    None if there is nothing at `path`."""
    if not os.path.lexists(path):
        return None
    fd, aside = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent)
    os.close(fd)
    try:
        os.replace(path, aside)
    except BaseException:
        os.unlink(aside)  # a folder cannot replace the placeholder file: leave no litter behind
        raise
    return aside


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM are held back inside (delivered when it ends): for a few renames that
    must all happen or none."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _current_umask() -> int:
    """The process umask (reading it means setting it, so it is put straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
