"""The prompt file of a batch run: GenEval's metadata (JSON lines, each an object with a "prompt"
field; every other field is kept and written to the prompt's metadata.jsonl) or plain text (one
prompt a line; blank lines are skipped). Either is UTF-8, with or without the byte order mark
that Windows editors and PowerShell put first."""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from minit2i.core.checks import check_prompt, file_kind, parse_json, read_limited, shown
from minit2i.core.errors import MiniT2IError

# GenEval has 553 prompts, DPG-Bench 1,065, an FID set 30,000 captions: a file 100 times the
# largest of them is not a prompt file.
PROMPT_FILE_LIMIT = 256 * 2**20
PROMPT_LIMIT = 3_000_000
# A line of a run folder's records (metadata.jsonl, a manifest line) is read back with this limit. A
# line of GenEval's metadata is written to its metadata.jsonl as it is (json.dumps would write 1e15
# back as 1000000000000000.0, four times as long), a text line as {"prompt": ...} (the prompt at
# most PROMPT_LIMIT characters, each at most 6 bytes escaped): both stay below it. GenEval's lines
# are 200 bytes.
LINE_LIMIT = 2**20
PROMPT_LINE_LIMIT = LINE_LIMIT // 2
# A prompt folder's file stem: DPG-Bench's item ids (1, partiprompts12, COCOval2014000000000328),
# what its scorer finds in a grid's name (the part before the first dot).
ITEM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,200}")


@dataclass(frozen=True)
class PromptFile:
    """The prompts in file order, each one's metadata.jsonl (its line of GenEval's metadata, byte
    for byte, or {"prompt": ...} for a line of text), and the file's sha256 (hex)."""

    prompts: list[str]
    metadata: list[bytes]
    sha256: str


def read_prompts(path: Path) -> PromptFile:
    """Read and check a prompt file: JSON lines if its first non-blank line starts with "{",
    else one prompt a line; a folder is a prompt folder (`read_prompt_folder`). Each bad line is
    one error naming its line number."""
    if path.is_dir():
        return read_prompt_folder(path)
    data = read_limited(path, "prompt file", PROMPT_FILE_LIMIT)
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        text = data[bom:].decode("utf-8")
    except UnicodeDecodeError as err:
        raise MiniT2IError(f"prompt file {path} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
                           f"{bom + err.start}); save it as UTF-8") from None
    # Split on line feeds only: str.splitlines would also cut at a U+2028 inside a JSON string.
    lines = [(number, line.rstrip("\r")) for number, line in enumerate(text.split("\n"), 1) if line.strip()]
    if not lines:
        raise MiniT2IError(f"prompt file {path} holds no prompt; write one prompt a line, or GenEval's "
                           "metadata (JSON lines with a \"prompt\" field)")
    if len(lines) > PROMPT_LIMIT:
        raise MiniT2IError(f"prompt file {path} has {len(lines):,} prompts, more than {PROMPT_LIMIT:,}; "
                           "split it into several runs")
    too_long = next((number for number, line in lines
                     if len(line) > PROMPT_LINE_LIMIT // 4 and len(line.encode("utf-8")) > PROMPT_LINE_LIMIT), None)
    if too_long:
        raise MiniT2IError(f"prompt file {path} line {too_long} is longer than the {PROMPT_LINE_LIMIT:,} bytes a line "
                           "may have; shorten it")
    is_json = lines[0][1].lstrip().startswith("{")
    prompts, metadata = [], []
    for number, line in lines:
        own = line.strip(" \t").encode("utf-8")  # JSON's own white space around the object
        prompt = json_line(path, number, own)["prompt"] if is_json else line.strip()
        try:
            check_prompt(prompt)
        except MiniT2IError as err:
            raise MiniT2IError(f"prompt file {path} line {number}: {err}") from None
        prompts.append(prompt)
        metadata.append(own + b"\n" if is_json else metadata_line({"prompt": prompt}))
    return PromptFile(prompts, metadata, hashlib.sha256(data).hexdigest())


def json_line(path: Path, number: int, line: bytes, what: str = "prompt file") -> dict:
    """One line of GenEval's metadata: a JSON object with a "prompt" string."""
    where = f"{what} {path} line {number}"
    entry = parse_json(line, what, f"{path} line {number}")
    if not isinstance(entry, dict) or not isinstance(entry.get("prompt"), str):
        raise MiniT2IError(f"{where} is {shown(entry)}, not a JSON object with a \"prompt\" string; every line "
                           "of a JSON lines prompt file needs one (or use plain text, one prompt a line)")
    return entry


def metadata_line(entry: dict) -> bytes:
    """The metadata.jsonl of a prompt given as text: its object on one line, as GenEval writes it."""
    return (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")


def read_prompt_folder(folder: Path) -> PromptFile:
    """A folder of prompts as DPG-Bench ships its `prompts/`: one UTF-8 `.txt` file a prompt (its
    text, white space around it dropped), the file's stem the item id, which each prompt's
    metadata.jsonl records as "id" (the DPG export names the grid by it). The prompts are in the
    order of the file names (code points), and the folder's sha256 is that of each name and
    content in that order. Anything else in the folder (another kind of file, a link, a FIFO, a
    sub-folder), a stem that is no plain file name, two stems that differ only in case (one file
    on a case-insensitive file system), an empty file, or more than a prompt file may hold: one
    line naming it."""
    entries = []
    with os.scandir(folder) as found:
        for entry in found:
            if len(entries) >= PROMPT_LIMIT:
                raise MiniT2IError(f"prompt folder {folder} has more than {PROMPT_LIMIT:,} files; split it into "
                                   "several runs")
            entries.append((entry.name, entry.stat(follow_symlinks=False).st_mode))
    entries.sort()
    if not entries:
        raise MiniT2IError(f"prompt folder {folder} is empty; give a folder of .txt files, one prompt each "
                           "(DPG-Bench's prompts/), or a prompt file")
    for name, mode in entries:
        if not (name.endswith(".txt") and stat.S_ISREG(mode)):
            kind = f"a {file_kind(mode)}" if not stat.S_ISREG(mode) else "not a .txt file"
            raise MiniT2IError(f"prompt folder {folder} holds {name!r}, {kind}; a prompt folder holds only .txt "
                               "files, one prompt each: move it away")
        if not ITEM_ID.fullmatch(name[:-len(".txt")]):
            raise MiniT2IError(f"prompt folder {folder} holds {name!r}, whose name is not an item id (letters, "
                               "digits, - and _, as DPG-Bench's scorer reads a grid's name up to its first dot); "
                               "rename it")
    stems = [name[:-len(".txt")] for name, _ in entries]
    seen: dict[str, str] = {}
    for stem in stems:
        other = seen.setdefault(stem.casefold(), stem)
        if other != stem:
            raise MiniT2IError(f"prompt folder {folder} holds {other}.txt and {stem}.txt, which differ only in case "
                               "(one file where case is ignored, and one DPG grid); rename one of them")
    digest, prompts, metadata, total = hashlib.sha256(), [], [], 0
    for stem in stems:
        path = folder / f"{stem}.txt"
        data = read_limited(path, "prompt", PROMPT_LINE_LIMIT, follow_links=False)
        total += len(data)
        if total > PROMPT_FILE_LIMIT:
            raise MiniT2IError(f"prompt folder {folder} holds more than the {PROMPT_FILE_LIMIT:,} bytes of prompts a "
                               "run may have; split it into several runs")
        bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
        try:
            prompt = data[bom:].decode("utf-8").strip()
        except UnicodeDecodeError as err:
            raise MiniT2IError(f"prompt {path} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
                               f"{bom + err.start}); save it as UTF-8") from None
        if not prompt:
            raise MiniT2IError(f"prompt {path} is empty; write its prompt in it, or move it away")
        try:
            check_prompt(prompt)
        except MiniT2IError as err:
            raise MiniT2IError(f"prompt {path}: {err}") from None
        for part in (stem.encode(), data):
            digest.update(len(part).to_bytes(8, "little") + part)
        prompts.append(prompt)
        metadata.append(metadata_line({"prompt": prompt, "id": stem}))
    return PromptFile(prompts, metadata, digest.hexdigest())
