"""What `minit2i explore` checks of every HTTP request before Gradio sees it, and the folder it
keeps its pictures in (docs/explore.md, "Safety").

The page runs any prompt on this machine, so it answers only what a page on this machine asks,
as local notebook servers (Jupyter) do: with the server bound to loopback, a request whose Host
is not a loopback name is refused (a DNS-rebinding page reaches 127.0.0.1 under its own name), and
so is a request whose Origin is another site than the Host it was sent to (any page open in the
browser can send requests to 127.0.0.1; a browser names its origin). The page has no file input,
so uploads are refused, and so is a request that names a file other than the page's own pictures
(Gradio would refuse it itself, after a traceback on the server's stderr and a bare "Error" on the
page); a request body is bounded. Bound to anything but loopback, the page is
served to whoever reaches it: `explore` says so in one line, and Host is not checked (the
address others use is not known), as Jupyter does with a public `--ip`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from minit2i.core.checks import user_path, walk, writable_folder

# The largest request body: a page request is a prompt (at most 20,000 characters) and a dozen
# numbers, a few kB of JSON.
BODY_LIMIT = 2**20
# The pictures Gradio writes for the page: the oldest are removed when the folder holds more (two
# requests of 100 steps at 512 x 512; each picture is a file in a folder of its own, so the
# folder's entries stay well within the listing's limit).
PICTURES_LIMIT = 64 * 2**20
TEMP_VARIABLE = "GRADIO_TEMP_DIR"


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 with or without brackets) is this machine only."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(authority: str) -> str:
    """'127.0.0.1:7860' -> '127.0.0.1', '[::1]:7860' -> '::1'; '' if it names no host."""
    try:
        return urlsplit(f"//{authority}").hostname or ""
    except ValueError:  # a port that is not a number, an unbalanced bracket
        return ""


def refusal(path: str, headers: dict[str, str], loopback: bool) -> tuple[int, str] | None:
    """(HTTP status, one line) for a request the page does not answer, or None.

    `headers` are lower-cased names; `loopback` whether the server is bound to loopback only."""
    host = headers.get("host", "")
    if loopback and not is_loopback(host_name(host)):
        return 403, (f"this page serves this machine only, under a loopback name (localhost, 127.0.0.1), "
                     f"not {host[:100]!r}")
    origin = headers.get("origin")
    if origin is not None and urlsplit(origin).netloc.lower() != host.lower():
        return 403, f"this page answers its own pages only, not requests from {origin[:100]!r}"
    if path.rstrip("/").endswith("/upload"):
        return 403, "this page takes no uploads"
    length = headers.get("content-length", "0")
    if not length.isdigit() or int(length) > BODY_LIMIT:
        return 413, f"a request to this page is at most {BODY_LIMIT:,} bytes"
    return None


def foreign_file(body: bytes, pictures: Path) -> str | None:
    """The first file a JSON request body names (any object with a "path" string, as Gradio reads
    one) outside the folder `pictures` (an absolute path; named as it is or with its links
    resolved), else None (also for a body that is not JSON)."""
    folders = (pictures, pictures.resolve())
    try:
        waiting = [json.loads(body)]
    except (ValueError, RecursionError):  # not JSON: Gradio answers it
        return None
    while waiting:
        item = waiting.pop()
        if isinstance(item, dict):
            path = item.get("path")
            if isinstance(path, str) and not any(is_inside(path, folder) for folder in folders):
                return path
            waiting += item.values()
        elif isinstance(item, list):
            waiting += item
    return None


def is_inside(path: str, folder: Path) -> bool:
    """Whether `path` (any text) names something inside `folder` (an absolute path), `..` resolved."""
    return "\0" not in path and os.path.abspath(path).startswith(f"{folder}{os.sep}")


class PageGuard:
    """ASGI middleware: the `refusal` checks on every request, a request body cut off (as if the
    client had left) past BODY_LIMIT bytes, whatever its Content-Length said, and a JSON body that
    names a file outside the page's `pictures` folder refused (`foreign_file`)."""

    def __init__(self, app, loopback: bool, pictures: Path):
        self.app, self.loopback, self.pictures = app, loopback, pictures

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        refused = refusal(scope["path"], headers, self.loopback)
        has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
        if refused is None and scope["type"] == "http" and has_body:  # JSON whatever its Content-Type says
            body, receive = await read_body(bounded(receive))
            named = foreign_file(body, self.pictures)
            if named is not None:
                refused = 403, f"this page takes no files: the request names {ascii(named[:100])}, none of its pictures"
        if refused is None:
            return await self.app(scope, bounded(receive), send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        status, line = refused
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
        await send({"type": "http.response.body", "body": line.encode() + b"\n"})


def bounded(receive):
    """`receive` that reports the client gone once more than BODY_LIMIT body bytes came."""
    received = 0

    async def receive_bounded():
        nonlocal received
        message = await receive()
        received += len(message.get("body", b""))
        return {"type": "http.disconnect"} if received > BODY_LIMIT else message

    return receive_bounded


async def read_body(receive) -> tuple[bytes, object]:
    """(the request's whole body, a `receive` that hands it over again and then what `receive` does)."""
    chunks, message = [], {"more_body": True}
    while message.get("more_body") and message.get("type") != "http.disconnect":
        message = await receive()
        chunks.append(message.get("body", b""))
    replayed = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}
                if message.get("type") != "http.disconnect" else message]

    async def receive_again():
        return replayed.pop() if replayed else await receive()

    return b"".join(chunks), receive_again


def pictures_folder(environment: dict) -> Path:
    """A new folder for the page's pictures, inside GRADIO_TEMP_DIR if set (checked to be a folder
    this process can write in, the variable named if not), else the system's temporary folder;
    the caller removes it when the server stops."""
    parent = environment.get(TEMP_VARIABLE)
    if parent:
        writable_folder(user_path(parent), TEMP_VARIABLE)
    return Path(tempfile.mkdtemp(prefix="minit2i-explore-", dir=parent or None))


def prune(folder: Path, limit: int = PICTURES_LIMIT) -> None:
    """Remove the oldest files under `folder` (and the folders they leave empty) until the rest
    take at most `limit` bytes."""
    files = []
    for name, entry in walk(folder):
        if entry.is_file(follow_symlinks=False):
            info = entry.stat(follow_symlinks=False)
            files.append((info.st_mtime_ns, info.st_size, folder / name))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= limit:
            break
        path.unlink(missing_ok=True)
        total -= size
        if path.parent != folder and not any(path.parent.iterdir()):
            shutil.rmtree(path.parent, ignore_errors=True)
