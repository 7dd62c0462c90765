"""The source files the served docs pages link, served by `minit2i explore` at /code/PATH, so that a
link to a function on the concepts page opens that function (docs/explore.md, "What the server
serves").

What /code/ serves is an allow-list made once, when the server starts (`allow_list`): the source
files the docs pages it shows link to, each read then, without following a link, from the folder
the install has it in. PATH is the file's place in the repository (`reference/sampler.py`), as the
docs write it; the folders that are parts of the package (pyproject.toml's package-dir: `core/` is
`minit2i.core`, ...) are read from wherever the package is installed, `scripts/` and `notebooks/`
only from a source checkout, and no other folder at all. A request names a key of the allow-list
or gets a one-line 404: it never reaches the file system. Each line of a page has the id `L<n>`,
and each name a line defines (a `def`, a `class`, a module constant) its own id, so
`code/reference/sampler.py#sample` opens on `def sample`.
"""

from __future__ import annotations

import html
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

CODE_ROUTE = "code"
# Repository folder -> the package it is installed as (pyproject.toml's [tool.setuptools.package-dir]).
PACKAGE_FOLDERS = {"minit2i": "minit2i", "core": "minit2i.core", "reference": "minit2i.reference",
                   "accelerated": "minit2i.accelerated", "cudasim": "minit2i.cudasim",
                   "training": "minit2i.training"}
# The repository's other folders of code the docs link, served from a source checkout only.
CHECKOUT_FOLDERS = ("scripts", "notebooks")
SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".h", ".cpp")
CODE_LIMIT = 2**20  # the project's largest source file is about 40 kB
PACKAGE = Path(__file__).resolve().parent
DEFINITION = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)|^([A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)")
# A Markdown link (not an image) to a relative target: a file of the docs or the repository, or a heading.
RELATIVE_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\((?!https?:|#|data:)([^)\s]+)\)")
NOT_SERVED = "text/plain; charset=utf-8"


def checkout_root(package: Path = PACKAGE) -> Path | None:
    """The repository around the package when it runs from a source checkout, else None."""
    root = package.parent
    return root if (root / "pyproject.toml").is_file() and (root / "docs" / "concepts.md").is_file() else None


def repository_folders(package: Path = PACKAGE) -> dict[str, Path]:
    """{repository folder: where this install has it}: in a source checkout the package's folders
    and CHECKOUT_FOLDERS, each at the checkout's top; in an installed package its folders inside it
    (the package `minit2i.core` in the folder core inside it, as pyproject.toml installs it), and nothing else."""
    root = checkout_root(package)
    if root is None:
        return {top: package.joinpath(*name.split(".")[1:]) for top, name in PACKAGE_FOLDERS.items()}
    return {top: root / top for top in (*PACKAGE_FOLDERS, *CHECKOUT_FOLDERS)}


def linked_path(target: str) -> str:
    """A docs page's link target -> the repository path it names: '../reference/sampler.py#sample'
    -> 'reference/sampler.py' (the docs pages lie in docs/)."""
    return target.removeprefix("../").split("#")[0]


def read_source(repo_path: str, folders: dict[str, Path]) -> str | None:
    """The text of the source file at `repo_path` in `folders` ({repository folder: where it is}),
    or None where there is none to serve: a folder not in `folders`, not a source file's name, a
    name leaving its folder, a link anywhere from the folder down (the folder included), not a
    regular file, over CODE_LIMIT bytes, or unreadable."""
    path = PurePosixPath(repo_path)
    if (str(path) != repo_path or len(path.parts) < 2 or path.suffix not in SOURCE_SUFFIXES
            or path.parts[0] not in folders or ".." in path.parts):  # one name per file: none with //, ./ or /
        return None
    step = folders[path.parts[0]]
    try:
        for part in path.parts[1:]:
            if stat.S_ISLNK(os.lstat(step).st_mode):
                return None
            step = step / part
        descriptor = os.open(step, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a link or a FIFO: no wait
        with open(descriptor, "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > CODE_LIMIT:
                return None
            return file.read(CODE_LIMIT).decode(errors="replace")
    except (OSError, ValueError):
        return None


def allow_list(pages: Iterable[str], folders: dict[str, Path]) -> dict[str, str]:
    """{repository path: text} of every source file that a docs page of `pages` (Markdown texts)
    links and `read_source` serves from `folders`: all that /code/ ever serves, read once."""
    linked = {linked_path(target) for page in pages for _, target in RELATIVE_LINK.findall(page)}
    texts = {repo_path: read_source(repo_path, folders) for repo_path in sorted(linked)}
    return {repo_path: text for repo_path, text in texts.items() if text is not None}


def defined_names(text: str) -> dict[str, int]:
    """{name: line number (from 1)} of the first line defining each name (def, class, constant)."""
    names = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = DEFINITION.match(line)
        if match:
            names.setdefault(match.group(1) or match.group(2), number)
    return names


def code_link(repo_path: str, name: str | None, served: dict[str, str]) -> str | None:
    """The served page's link to `repo_path`, at the definition of `name` if it defines it; None
    where `served` (an `allow_list`) has no such file."""
    if repo_path not in served:
        return None
    anchor = f"#{name}" if name and name in defined_names(served[repo_path]) else ""
    return f"{CODE_ROUTE}/{repo_path}{anchor}"


def code_page(repo_path: str, text: str) -> str:
    """The HTML page of one source file: numbered lines, each with the id L<n>, and each defined
    name's line also with the name as id (a link's #name opens it at the top of the window)."""
    ids = {number: name for name, number in defined_names(text).items()}
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        named = f'<span id="{ids[number]}"></span>' if number in ids else ""
        rows.append(f'<span class="line" id="L{number}">{named}<span class="n">{number}</span>'
                    f'{html.escape(line)}</span>')
    title = html.escape(repo_path)
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>" + title + "</title><style>"
            "body{margin:0;font:14px/1.45 ui-monospace,monospace} h1{font:600 16px system-ui,sans-serif;"
            "margin:12px} pre{margin:0;padding:0 12px 60vh} .line{display:block} span[id]{scroll-margin-top:8px}"
            " .n{display:inline-block;width:4em;color:#999;user-select:none} .line:target,"
            " .line:has(span:target){background:#fff3b0}</style></head><body><h1>" + title + "</h1><pre>"
            + "".join(rows) + "</pre></body></html>")


def answer(path: str, served: dict[str, str]) -> tuple[int, str, str]:
    """(HTTP status, content type, body) for a request of /code/PATH (any text): the page of a file
    of `served` (an `allow_list`), else a 404 of one line (ASCII, the path cut at 200 characters)."""
    repo_path = path.removeprefix(f"/{CODE_ROUTE}/")
    if repo_path not in served:
        return 404, NOT_SERVED, (f"no source file {ascii(repo_path[:200])} is served here: /{CODE_ROUTE}/ serves "
                                 "the source files this server's docs pages link to\n")
    return 200, "text/html; charset=utf-8", code_page(repo_path, served[repo_path])


class CodePages:
    """ASGI middleware: GET /code/PATH answered with `answer` from `served` (an `allow_list`),
    everything else passed on."""

    def __init__(self, app, served: dict[str, str]):
        self.app, self.served = app, served

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(f"/{CODE_ROUTE}/"):
            return await self.app(scope, receive, send)
        status, kind, body = answer(scope["path"], self.served)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind.encode())]})
        await send({"type": "http.response.body", "body": body.encode()})
