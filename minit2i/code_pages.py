"""The source files the concepts page links, served by `minit2i explore` at /code/PATH, so that a
link to a function on the served page opens that function (docs/explore.md).

PATH is the file's place in the repository (`reference/sampler.py`), as the docs write it. The
folders that are parts of the package (pyproject.toml's package-dir: `core/` is `minit2i.core`, ...)
are read from wherever the package is installed; the others (`scripts/`, `notebooks/`) only from
a source checkout. Each line of the page has the id `L<n>`, and each name a line defines (a
`def`, a `class`, a module constant) its own id, so `code/reference/sampler.py#sample` opens on
`def sample`.
"""

from __future__ import annotations

import html
import importlib.util
import re
from pathlib import Path, PurePosixPath

CODE_ROUTE = "code"
# Repository folder -> the package it is installed as (pyproject.toml's [tool.setuptools.package-dir]).
PACKAGE_FOLDERS = {"minit2i": "minit2i", "core": "minit2i.core", "reference": "minit2i.reference",
                   "accelerated": "minit2i.accelerated", "cudasim": "minit2i.cudasim",
                   "training": "minit2i.training"}
SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".h", ".cpp")
CODE_LIMIT = 2**20  # the project's largest source file is about 40 kB
PACKAGE = Path(__file__).resolve().parent
DEFINITION = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)|^([A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)")


def checkout_root(package: Path = PACKAGE) -> Path | None:
    """The repository around the package when it runs from a source checkout, else None."""
    root = package.parent
    return root if (root / "pyproject.toml").is_file() and (root / "docs" / "concepts.md").is_file() else None


def source_file(repo_path: str) -> Path | None:
    """The source file at `repo_path` (a repository path, `reference/sampler.py`) in this install,
    or None if it has none there (a folder outside the package, no such file, not a source file,
    a path leaving its folder)."""
    path = PurePosixPath(repo_path)
    if len(path.parts) < 2 or path.suffix not in SOURCE_SUFFIXES or any(p in ("..", ".", "") for p in path.parts):
        return None
    top, rest = path.parts[0], path.parts[1:]
    if top in PACKAGE_FOLDERS:
        spec = importlib.util.find_spec(PACKAGE_FOLDERS[top])
        if spec is None or not spec.submodule_search_locations:
            return None
        folder = Path(next(iter(spec.submodule_search_locations)))
    else:
        root = checkout_root()
        if root is None:
            return None
        folder = root / top
    file = folder.joinpath(*rest)
    try:
        inside = file.resolve().is_relative_to(folder.resolve())
    except OSError:
        return None
    return file if inside and file.is_file() and not file.is_symlink() else None


def defined_names(text: str) -> dict[str, int]:
    """{name: line number (from 1)} of the first line defining each name (def, class, constant)."""
    names = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = DEFINITION.match(line)
        if match:
            names.setdefault(match.group(1) or match.group(2), number)
    return names


def code_link(repo_path: str, name: str | None = None) -> str | None:
    """The served page's link to `repo_path`, at the definition of `name` if it defines it; None
    where this install has no such file."""
    file = source_file(repo_path)
    if file is None:
        return None
    anchor = f"#{name}" if name and name in defined_names(file.read_text(errors="replace")) else ""
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


def answer(path: str) -> tuple[int, str, str]:
    """(HTTP status, content type, body) for a request of /code/PATH: the file's page, or one line."""
    repo_path = path.removeprefix(f"/{CODE_ROUTE}/")
    file = source_file(repo_path)
    if file is None or file.stat().st_size > CODE_LIMIT:
        return 404, "text/plain; charset=utf-8", f"no source file {repo_path[:200]!r} in this install\n"
    return 200, "text/html; charset=utf-8", code_page(repo_path, file.read_text(errors="replace"))


class CodePages:
    """ASGI middleware: GET /code/PATH answered with `answer`, everything else passed on."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(f"/{CODE_ROUTE}/"):
            return await self.app(scope, receive, send)
        status, kind, body = answer(scope["path"])
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind.encode())]})
        await send({"type": "http.response.body", "body": body.encode()})
