"""The prompt file of a batch run: GenEval's metadata (JSON lines, each an object with a "prompt"
field; every other field is kept and written to the prompt's metadata.jsonl) or plain text (one
prompt a line; blank lines are skipped). Either is UTF-8, with or without the byte order mark
that Windows editors and PowerShell put first."""

from __future__ import annotations

import codecs
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from minit2i.core.checks import check_prompt, parse_json, read_limited, shown
from minit2i.core.errors import MiniT2IError

# GenEval has 553 prompts, DPG-Bench 1,065, an FID set 30,000 captions: a file 100 times the
# largest of them is not a prompt file.
PROMPT_FILE_LIMIT = 256 * 2**20
PROMPT_LIMIT = 3_000_000
# A line of a run folder's records (metadata.jsonl, a manifest line) is read back with this limit; a
# line of the prompt file, written out again by json.dumps (a space after each separator, 1e999
# as Infinity: at most 1.7 times as long), must stay below it. GenEval's lines are 200 bytes.
LINE_LIMIT = 2**20
PROMPT_LINE_LIMIT = LINE_LIMIT // 2


@dataclass(frozen=True)
class PromptFile:
    """The prompts in file order, each one's metadata (the JSON object of its line), and the
    file's sha256 (hex)."""

    prompts: list[str]
    metadata: list[dict]
    sha256: str


def read_prompts(path: Path) -> PromptFile:
    """Read and check a prompt file: JSON lines if its first non-blank line starts with "{",
    else one prompt a line. Each bad line is one error naming its line number."""
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
    metadata = [json_line(path, number, line.encode("utf-8")) if is_json else {"prompt": line.strip()}
                for number, line in lines]
    for (number, _), entry in zip(lines, metadata):
        try:
            check_prompt(entry["prompt"])
        except MiniT2IError as err:
            raise MiniT2IError(f"prompt file {path} line {number}: {err}") from None
    return PromptFile([entry["prompt"] for entry in metadata], metadata, hashlib.sha256(data).hexdigest())


def json_line(path: Path, number: int, line: bytes, what: str = "prompt file") -> dict:
    """One line of GenEval's metadata: a JSON object with a "prompt" string."""
    where = f"{what} {path} line {number}"
    entry = parse_json(line, what, f"{path} line {number}")
    if not isinstance(entry, dict) or not isinstance(entry.get("prompt"), str):
        raise MiniT2IError(f"{where} is {shown(entry)}, not a JSON object with a \"prompt\" string; every line "
                           "of a JSON lines prompt file needs one (or use plain text, one prompt a line)")
    return entry


def metadata_line(entry: dict) -> bytes:
    """The metadata.jsonl of one prompt: its object on one line, as GenEval writes it."""
    return (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")
