"""What the explore server's /code/ route serves (`minit2i.code_pages`): an allow-list made once,
the source files the served docs pages link to in the package's folders (and a checkout's
scripts/ and notebooks/), never through a link; any other request, whatever its bytes, is a
404 of one line. Needs no Gradio: the route is plain ASGI middleware, driven here directly."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minit2i.code_pages import (
    CHECKOUT_FOLDERS,
    CODE_LIMIT,
    CODE_ROUTE,
    PACKAGE_FOLDERS,
    CodePages,
    allow_list,
    code_page,
    repository_folders,
)

# The fake checkout's files: those the docs link and /code/ serves, then those it must not serve
# (its folders by name, so that tests/test_docs.py does not take these paths for the repository's).
REF, SCRIPTS, CORE, TESTS, BENCH, DOCS, TRAINING, NOTEBOOKS = ("reference", "scripts", "core", "tests", "benchmarks",
                                                              "docs", "training", "notebooks")
SERVED = {f"{REF}/sampler.py": "def sample():\n    return 1\n", f"{REF}/deep/inner.py": "X = 1\n",
          f"{SCRIPTS}/figures.py": "def draw():\n    pass\n", f"{NOTEBOOKS}/walkthrough.py": "# %%\nSTEPS = 4\n"}
UNLINKED = {f"{CORE}/unlinked.py": "A = 'a package file no docs page links'\n"}
NOT_SERVED = {
    "private/keys.py": "KEY = 'an untracked folder of the checkout'\n",
    ".venv/lib/python3.11/site-packages/pkg/__init__.py": "SITE = 'the checkout's environment'\n",
    f"{TESTS}/test_x.py": "def test_x():\n    pass\n",
    f"{BENCH}/bench.py": "RUNS = 3\n",
    f"{DOCS}/conf.py": "PROJECT = 'a folder of the checkout that is not code'\n",
    f"{REF}/notes.txt": "not a source file's name\n",
    f"{REF}/big.py": "#" * (CODE_LIMIT + 1),
}
OUTSIDE = {"secret.py": "TOKEN = 'a file outside the checkout'\n", "folder/a.py": "B = 'outside, in a folder'\n"}
# name in the checkout -> what the link points at (relative to the checkout's parent)
LINKS = {"linked": "outside/folder", f"{REF}/linked": "../../outside/folder", "training": "outside/folder",
         f"{REF}/link.py": "../../outside/secret.py", f"{SCRIPTS}/via.py": "../reference/sampler.py",
         f"{REF}/loop.py": "loop.py", f"{REF}/cycle": "cycle"}


def request(path: str, served: dict[str, str]) -> tuple[int, bytes]:
    """(status, body) of the /code/ middleware for a request of `path` (as the server decoded it)."""
    sent = []

    async def passed_on(scope, receive, send):
        raise AssertionError(f"{path!r} was passed on")

    async def send(message):
        sent.append(message)

    asyncio.run(CodePages(passed_on, served)({"type": "http", "method": "GET", "path": path}, None, send))
    return sent[0]["status"], sent[1]["body"]


def assert_not_served(path: str, served: dict[str, str]) -> None:
    """A 404 of one printable ASCII line."""
    status, body = request(path, served)
    assert status == 404 and body.endswith(b"\n") and body.count(b"\n") == 1, (path, status, body[:300])
    assert body.isascii() and body[:-1].decode().isprintable() and len(body) < 400, body


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A source checkout as a user's may hold one, its concepts page linking every file and link in
    it (and an absolute path, and paths leaving their folder): an untracked folder, `.venv/`,
    tests/ and benchmarks/, a folder link at its top, a package folder that is a link, links to
    files and folders outside, a link to a served file, a link loop, a FIFO and a file over the
    limit. -> its root."""
    base = tmp_path_factory.mktemp("code")
    root = base / "checkout"
    write_files(root, SERVED | NOT_SERVED | UNLINKED)
    write_files(base / "outside", OUTSIDE)
    for name, target in LINKS.items():
        os.symlink(target if name.startswith("reference/") or name.startswith("scripts/") else base / target,
                   root / name)
    os.mkfifo(root / "reference" / "fifo.py")
    linked = [*SERVED, *NOT_SERVED, "linked/a.py", f"{REF}/linked/a.py", f"{TRAINING}/a.py", f"{REF}/link.py",
              f"{SCRIPTS}/via.py", f"{REF}/loop.py", f"{REF}/cycle/x.py", f"{REF}/fifo.py", f"{REF}/../"
              "private/keys.py", f"{SCRIPTS}/../reference/sampler.py", "./reference/sampler.py"]
    links = "".join(f"[{name}](../{name}#x) " for name in linked) + f"[abs]({base}/outside/secret.py)"
    (root / "docs" / "concepts.md").write_text(f"# Concepts\n\n{links}\n")
    return root


def write_files(root: Path, files: dict[str, str]) -> None:
    """`files` ({path: text}) under `root`, with what makes it a checkout (pyproject.toml, docs/, the package)."""
    for name, text in {**files, "pyproject.toml": "", "minit2i/__init__.py": "", "docs/concepts.md": ""}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.fixture(scope="module")
def served(checkout) -> dict[str, str]:
    return allow_list([(checkout / "docs" / "concepts.md").read_text()], repository_folders(checkout / "minit2i"))


def every_name(base: Path) -> list[Path]:
    """Every file, folder and link under `base`, also as named through each folder link (not
    followed twice, so a loop ends)."""
    names, seen = [], set()
    for folder, subfolders, files in os.walk(base, followlinks=True):
        key = os.path.realpath(folder)
        if key in seen:
            subfolders.clear()
            continue
        seen.add(key)
        names += [Path(folder) / name for name in [*subfolders, *files]]
    return names


def request_paths(name: Path, root: Path) -> list[str]:
    """The ways a request may name the file `name`: its path in the checkout, absolute (the server
    decodes %2F to /, and the raw form too), from its folder, from the checkout's parent."""
    full = str(name)
    paths = [f"/{CODE_ROUTE}/{full}", f"/{CODE_ROUTE}/{quote(full, safe='')}", f"/{CODE_ROUTE}/{full[1:]}"]
    for start in (root, root.parent, *name.parents):
        if name.is_relative_to(start) and name != start:
            inner = name.relative_to(start).as_posix()
            paths += [f"/{CODE_ROUTE}/{inner}", f"/{CODE_ROUTE}/./{inner}", f"/{CODE_ROUTE}/{inner}/"]
    return paths


def test_code_serves_exactly_the_allow_list_from_a_checkout_with_untracked_linked_and_venv_folders(
        checkout, served):
    """Every path of every file, folder and link in and around the checkout, as every request
    may name it: only the four files its docs link inside the served folders are pages (each its
    own text); everything else is a 404 of one line. /code/ used to serve every top-level folder
    (private/keys.py, .venv/, tests/), any absolute path, and files through a link at the top."""
    assert sorted(served) == sorted(SERVED) and all(served[name] == text for name, text in SERVED.items())
    pages = set()
    for name in every_name(checkout.parent):
        for path in request_paths(name, checkout):
            status, body = request(path, served)
            if status == 200:
                pages.add(path)
                name = path.removeprefix(f"/{CODE_ROUTE}/")
                assert body.decode() == code_page(name, SERVED[name])
            else:
                assert_not_served(path, served)
    assert pages == {f"/{CODE_ROUTE}/{name}" for name in SERVED}


def test_an_installed_package_serves_its_own_folders_only(tmp_path):
    """Outside a checkout (an installed package), its folders are inside it, and scripts/ and
    notebooks/ (not installed) are nothing."""
    package = tmp_path / "site-packages" / "minit2i"
    assert repository_folders(package) == {top: package.joinpath(*name.split(".")[1:])
                                           for top, name in PACKAGE_FOLDERS.items()}
    assert repository_folders(package)["core"] == package / "core" and not set(CHECKOUT_FOLDERS) & set(
        repository_folders(package))


def test_the_allow_list_is_read_once(tmp_path):
    """A served file swapped for a link after the server started is served as it was, and a file
    added is not: requests never reach the file system."""
    write_files(tmp_path, SERVED)
    page = "[a](../reference/sampler.py) [b](../reference/new.py)"
    made = allow_list([page], repository_folders(tmp_path / "minit2i"))
    (tmp_path / "reference" / "sampler.py").rename(tmp_path / "moved.py")
    os.symlink(tmp_path / "moved.py", tmp_path / "reference" / "sampler.py")
    (tmp_path / "reference" / "new.py").write_text("NEW = 1\n")
    assert request(f"/{CODE_ROUTE}/reference/sampler.py", made) == (
        200, code_page("reference/sampler.py", SERVED["reference/sampler.py"]).encode())
    assert_not_served(f"/{CODE_ROUTE}/reference/new.py", made)


@pytest.mark.parametrize("path", [
    "/code/reference/sampler.py\0", "/code/\0", "/code/reference/" + "a" * 300 + ".py",
    "/code/reference/loop.py", "/code/reference/cycle/x.py", "/code/" + "a/" * 3000 + "x.py",
    "/code/reference/fifo.py", "/code/reference/big.py", "/code/\udcff.py", "/code/reference/sampler.py\n",
], ids=["nul", "only-nul", "long-name", "loop", "loop-folder", "segments", "fifo", "big", "surrogate", "newline"])
def test_odd_paths_are_one_line_404s(served, path):
    """A NUL byte, a name over 255 bytes, a link loop, 3,000 segments (each was a 500 and a
    40-line traceback), a FIFO (a read that never returns), a lone surrogate, a newline."""
    assert_not_served(path, served)


# Request paths as a client may send them: any text (the server percent-decodes them as UTF-8,
# lone surrogates included here all the same), a served file's name changed, an absolute path, a
# name through a link or loop of the fake checkout, long names and many segments.
served_names = st.sampled_from(sorted(SERVED))
changed_names = st.one_of(
    served_names.map(str.upper), served_names.map(lambda name: "/" + name), served_names.map(lambda name: name + "/"),
    served_names.map(lambda name: name.replace("/", "//")), served_names.map(lambda name: name.replace("/", "/./")),
    served_names.map(lambda name: name.replace("/", "/x/../")), served_names.map(lambda name: quote(name, safe="")),
    st.tuples(served_names, st.text(min_size=1, max_size=3)).map("".join),
    st.tuples(st.text(min_size=1, max_size=3), served_names).map("".join))
odd_paths = st.one_of(
    st.text(), st.binary().map(lambda raw: raw.decode("utf-8", "surrogateescape")),
    st.binary().map(lambda raw: raw.decode("latin-1")), changed_names,
    st.sampled_from([*NOT_SERVED, *UNLINKED, *LINKS]),
    st.integers(1, 5000).map(lambda n: "a/" * n + "x.py"), st.integers(1, 5000).map(lambda n: "a" * n + ".py"),
    st.sampled_from(["/etc/passwd", "//etc/passwd", "%2Fetc%2Fpasswd", "..", "../..", "~/.bashrc", str(Path.home()),
                     __file__, __file__.lstrip("/"), "C:\\Windows\\win.ini", "reference\\sampler.py"]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.one_of(odd_paths, served_names))
def test_generated_code_paths(served, path):
    """Any path: a page of the allow-list (its own text) or a one-line 404, nothing else."""
    status, body = request(f"/{CODE_ROUTE}/{path}", served)
    if path in SERVED:
        assert (status, body) == (200, code_page(path, SERVED[path]).encode())
    else:
        assert_not_served(f"/{CODE_ROUTE}/{path}", served)
