"""Input checks shared by the configs, the weight loader, the pipeline, the CLI and the golden
suite. Each one raises `MiniT2IError` with one line: what was expected and what was found
(`shown` and `human_size` write the values those lines show).
"""

from __future__ import annotations

import errno
import json
import math
import numbers
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .errors import MiniT2IError


def shown(value) -> str:
    """A found value as a message shows it: JSON-like, short, strings marked as strings."""
    if isinstance(value, str):
        text = json.dumps(value if len(value) <= 40 else value[:40] + "...")
        return f"{text} (a string)"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        kind = "a list" if isinstance(value, list) else "an object"
        text = json.dumps(value)
        return f"{text if len(text) <= 40 else text[:40] + '...'} ({kind})"
    text = " ".join(repr(value).split())  # one line, whatever the value (an array's repr has several)
    return text if len(text) <= 40 else f"{text[:40]}... (a {type(value).__name__})"



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


def short_list(items: list[str], limit: int = 6) -> str:
    """The first `limit` items, comma-separated, and how many more there are."""
    text = ", ".join(items[:limit])
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "")


@dataclass(frozen=True)
class Range:
    """An allowed value: an int (`integer=True`, bools excluded) or a real number in [low, high];
    `low_open` excludes `low`, `multiple_of` restricts ints further."""

    low: float
    high: float
    integer: bool = True
    low_open: bool = False
    multiple_of: int = 1

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        bracket = "(" if self.low_open else "["
        text = f"{kind} in {bracket}{_number(self.low)}, {_number(self.high)}]"
        return text + (f", a multiple of {self.multiple_of}" if self.multiple_of > 1 else "")

    def check(self, name: str, value):
        """`value` if it fits, else MiniT2IError "NAME must be <range>, found <value>"."""
        if not self.contains(value):
            raise MiniT2IError(f"{name} must be {self.describe()}, found {shown(value)}")
        return value

    def contains(self, value) -> bool:
        """NumPy's integer and float scalars count as numbers (registered with `numbers`); its
        bool_ is not registered, and JSON true/false are not numbers, even though bool is an int."""
        if isinstance(value, bool):
            return False
        if self.integer:
            if not isinstance(value, numbers.Integral) or value % self.multiple_of:
                return False
        elif not isinstance(value, numbers.Real) or not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high


def human_size(size: float, binary: bool = False) -> str:
    """Bytes for people: decimal units as the Hub shows file sizes (3.1 GB), or binary ones as
    memory is counted (`binary=True`: 22.1 GiB)."""
    step, units = (1024, ("KiB", "MiB", "GiB", "TiB")) if binary else (1000, ("kB", "MB", "GB", "TB"))
    if size < step:
        return f"{size:.0f} B"
    value = float(size)
    for unit in units:
        value /= step
        if value < step or unit == units[-1]:
            return f"{value:.1f} {unit}"


def sizes_compared(size: int, limit: int) -> tuple[str, str]:
    """(`size`, `limit`) as a line that says one is over the other shows them: `human_size`'s,
    or byte counts where those would read the same ("1.0 MB, more than the 1.0 MB")."""
    shown_size, shown_limit = human_size(size), human_size(limit)
    return (f"{size:,} bytes", f"{limit:,} bytes") if shown_size == shown_limit else (shown_size, shown_limit)


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


# How much of a file from outside is read (docs/errors.md, "Limits"): every file is checked for
# its kind (a FIFO would block, a device never end) and its size before a byte is read.
JSON_LIMIT = 64 * 2**20  # config.json, a shard index, the golden manifest, tokenizer.json (flan-t5's: 2.4 MB)
JSON_DEPTH_LIMIT = 100  # nesting of a JSON document: real ones nest under 10 deep


def open_checked(path: Path, what: str, limit: int, follow_links: bool = True) -> BinaryIO:
    """`path` opened for reading if it is a regular file (through links, unless `follow_links`
    is False: then a link is refused, as in a folder this program wrote) of at most `limit`
    bytes; a FIFO, device, folder or larger file is one line and is never read. The check is
    made on the opened file, so a path swapped meanwhile cannot slip past it."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise block before the check
        flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
        f = os.fdopen(os.open(path, flags), "rb")
    except OSError as err:
        if not follow_links and err.errno == errno.ELOOP and path.is_symlink():
            raise MiniT2IError(f"{what} {path} is a symbolic link, which is never followed here; put the file "
                               "itself there") from None
        raise MiniT2IError(f"cannot read {what} {path}: {_unusable(path, err)}") from None
    try:
        _check_kind_and_size(os.fstat(f.fileno()), path, what, limit)
    except BaseException:
        f.close()
        raise
    return f


def read_limited(path: Path, what: str, limit: int, follow_links: bool = True) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (`open_checked`). What is read is
    bounded by the size checked (a buffered read preallocates what it is asked for), so a file
    growing meanwhile is refused, not read on."""
    try:
        with open_checked(path, what, limit, follow_links) as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(size + 1)
    except OSError as err:
        raise MiniT2IError(f"cannot read {what} {path}: {err.strerror or err}") from None
    if len(data) > size:
        raise MiniT2IError(f"{what} {path} grew while being read; try again when it is complete")
    return data


def _check_kind_and_size(info: os.stat_result, path: Path, what: str, limit: int) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise MiniT2IError(f"{what} {path} is a folder, not a file; check the path")
    if not stat.S_ISREG(info.st_mode):
        raise MiniT2IError(f"{what} {path}: expected a file, found a {file_kind(info.st_mode)}; check the path")
    if info.st_size > limit:
        found, most = sizes_compared(info.st_size, limit)
        raise MiniT2IError(f"{what} {path} is {found}, more than the {most} such a file can be; check that it is the "
                           "right file")


def parse_json(data: bytes, what: str, path) -> object:
    """JSON from bytes read from outside: non-UTF-8, malformed or too deeply nested is one line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise MiniT2IError(f"{what} {path} is not UTF-8 text (byte {err.object[err.start]:#04x} at "
                           f"offset {err.start})") from None
    # Nesting is bounded before parsing: the json module recurses once per level.
    if _nesting_depth(text) > JSON_DEPTH_LIMIT:
        raise MiniT2IError(f"{what} {path} nests deeper than {JSON_DEPTH_LIMIT} levels; it is not a "
                           "file this program writes or reads")
    try:
        return json.loads(text)
    except ValueError as err:  # json.JSONDecodeError, or a number too long to convert
        raise MiniT2IError(f"{what} {path} is not valid JSON ({err})") from None


def _nesting_depth(text: str) -> int:
    """The deepest bracket nesting outside strings (an upper bound where brackets are unbalanced)."""
    depth = deepest = 0
    for token in _JSON_STRUCTURE.findall(text):
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


# A string literal (skipped whole: brackets in it do not nest) or one bracket.
_JSON_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def read_json(path: Path, what: str, limit: int = JSON_LIMIT):
    """Parse a JSON file from outside: kind, size, encoding, syntax and nesting checked, one line each."""
    return parse_json(read_limited(path, what, limit), what, path)


def read_json_object(path: Path, what: str) -> dict:
    """`read_json` for files whose top level must be a JSON object."""
    value = read_json(path, what)
    if not isinstance(value, dict):
        raise MiniT2IError(f"{what} {path} must hold a JSON object at the top level, found {shown(value)}")
    return value


# A folder listing goes at most this deep and lists at most this many entries: a model folder or
# a JAX checkpoint's store is a few levels deep (checkpoint_5/ocdbt.process_0/d/<file>).
LISTING_DEPTH = 16
LISTING_LIMIT = 100_000


def walk(root: Path, enter: Callable[[str], bool] = lambda name: True) -> Iterator[tuple[str, os.DirEntry]]:
    """(name relative to `root` with "/" separators, its directory entry) of every entry below
    `root`, a folder before its contents, entering the folders whose names `enter` accepts.

    Iterative and bounded: a folder nested deeper than LISTING_DEPTH (1,100 deep overflows a
    recursive walk; so would a loop of links) or more than LISTING_LIMIT entries is one line. A
    folder that cannot be read is left out, as a glob does."""
    pending, listed = [("", 0)], 0
    while pending:
        folder, depth = pending.pop()
        try:
            with os.scandir(root / folder) as entries:
                found = sorted(entries, key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in found:
            listed += 1
            if listed > LISTING_LIMIT:
                raise MiniT2IError(f"{root} holds more than {LISTING_LIMIT:,} files and folders, more than any folder "
                                   "this program reads: check the path")
            name = f"{folder}/{entry.name}" if folder else entry.name
            yield name, entry
            if is_folder(entry) and enter(name):
                if depth + 1 >= LISTING_DEPTH:
                    raise MiniT2IError(f"{root / name} is nested more than {LISTING_DEPTH} folders deep under {root}, "
                                       "deeper than any folder this program reads: check the path, or move that "
                                       "folder out")
                pending.append((name, depth + 1))


def is_folder(entry: os.DirEntry) -> bool:
    """A folder or a link to one (a broken link is not)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def user_path(path) -> Path:
    """`path` with a leading `~` or `~user` expanded as a shell does: a user that does not exist, or
    no home to expand to, leaves it as typed (`Path.expanduser` raises instead)."""
    return Path(os.path.expanduser(path))


def existing_path(path, flag: str = "") -> Path:
    """`path` if it is a readable file or folder; otherwise the precise reason in one line,
    naming the path after `flag` (the option it came from) if given.

    FIFOs and devices are refused (reading them could block or never end), and a broken link
    (as an interrupted download leaves in an HF cache), a symlink loop or a missing permission is
    named as such, not reported as a missing file.
    """
    p = user_path(path)
    label = f"{flag} {path}" if flag else str(path)
    try:
        mode = p.stat().st_mode
    except OSError as err:
        raise MiniT2IError(f"{label}: {_unusable(p, err)}") from None
    except ValueError:  # a NUL character (a name from a JSON index, say): no file has such a name
        raise MiniT2IError(f"{label}: a path cannot hold a NUL character; check where the name came from") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise MiniT2IError(f"{label}: expected a file or folder, found a {file_kind(mode)}")
    needed = os.R_OK | (os.X_OK if stat.S_ISDIR(mode) else 0)
    if not os.access(p, needed):
        what = "folder" if stat.S_ISDIR(mode) else "file"
        raise MiniT2IError(f"{label}: permission denied (the {what} is not readable); fix its permissions")
    return p


def _unusable(p: Path, err: OSError) -> str:
    """Why `stat` failed on `p`, with the fix."""
    if err.errno == errno.ENOENT and p.is_symlink():
        return (f"a link to {os.readlink(p)}, which does not exist (an interrupted download or a cleaned "
                "cache); re-download it")
    reason = {errno.ENOENT: "no such file or folder; check the path",
              errno.ELOOP: "a loop of symbolic links; point at the real file or folder",
              errno.EACCES: "permission denied on a folder above it; fix its permissions",
              errno.ENOTDIR: "a part of the path is a file, not a folder; check the path"}
    return reason.get(err.errno, err.strerror)


def file_kind(mode: int) -> str:
    """What a directory entry of `mode` (from stat or lstat) is, for a message: "file", "folder",
    "symbolic link", "FIFO", ..."""
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "folder"), (stat.S_ISLNK, "symbolic link"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def writable_folder(folder: Path, flag: str) -> Path:
    """`folder` if it is an existing folder this process can create files in."""
    if not folder.exists():
        raise MiniT2IError(f"{flag} folder {folder} does not exist; create it or choose another {flag}")
    if not folder.is_dir():
        raise MiniT2IError(f"{flag} folder {folder} is not a folder; choose another {flag}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise MiniT2IError(f"{flag} folder {folder} is not writable; choose another {flag}")
    return folder


def created_folder(folder: Path, flag: str) -> Path:
    """`folder`, created with its parents if missing, if this process can create files in it."""
    if not folder.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise MiniT2IError(f"cannot create {flag} {folder}: {err.strerror}; choose another {flag}") from None
    return writable_folder(folder, flag)


# A prompt's length in characters, checked before anything else is done with it: the model reads
# its first 255 tokens (prompt_length - 1), about 1,000 characters of English, and the tokenizer
# encodes all it is given (a 10 MB prompt took 1.6 GB and 30 s).
PROMPT_LIMIT = 20_000


def check_prompt(prompt) -> str:
    """A prompt is non-blank text of at most PROMPT_LIMIT characters that can be encoded as UTF-8
    (argv bytes that are not UTF-8 arrive as lone surrogates, which the tokenizer cannot take)."""
    if not isinstance(prompt, str):
        raise MiniT2IError(f"the prompt must be a string, found {type(prompt).__name__}")
    if len(prompt) > PROMPT_LIMIT:
        raise MiniT2IError(f"the prompt is {len(prompt):,} characters, more than the {PROMPT_LIMIT:,} a prompt may "
                           "have (MiniT2I reads its first 255 tokens, about 1,000 characters); shorten it")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = ord(prompt[err.start])
        byte = f"byte {bad - 0xDC00:#04x}" if 0xDC80 <= bad <= 0xDCFF else f"code point {bad:#x}"
        raise MiniT2IError(f"the prompt is not valid UTF-8 text ({byte} at character {err.start}); "
                           "pass the prompt in UTF-8") from None
    if not prompt.strip():
        raise MiniT2IError("the prompt is empty; pass some text with --prompt")
    if not any(c.isalnum() for c in prompt):  # the tokenizer would find no word: an unconditional image
        raise MiniT2IError(f"the prompt {shown(prompt)} has no word, only punctuation or symbols; "
                           "describe the image in words")
    return prompt
