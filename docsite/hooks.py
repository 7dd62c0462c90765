"""MkDocs hooks that turn the repository into one site (mkdocs.yml names this file).

* `on_files`: the README becomes the home page, every folder README a folder page, every source
  file of the project a side-by-side page (`sidebyside.py`), the walkthrough notebook a page of its
  cells with their committed figures (`notebook_page.py`) and every folder a listing; all are
  made from the files on each build.
* `on_page_markdown`: a link to a repository file, written relative to where the Markdown lives
  in the repository (`../reference/mmjit.py` in docs/), becomes a link to that file's page, and
  to the function's row when the link text names one (`double_block`). A link to anything that
  has no page is left as it is, so MkDocs reports it and `--strict` fails.
* `on_page_content`: `$...$` equations (pymdownx.arithmatex, generic mode) become MathML, which
  browsers render natively: the site needs no JavaScript math library and no network.
"""

from __future__ import annotations

import html
import posixpath
import re
from pathlib import Path

from latex2mathml.converter import convert
from markdown.extensions.toc import slugify
from mkdocs.structure.files import File
from notebook_page import NOTEBOOKS, page_markdown as notebook_markdown
from sidebyside import (
    LANGUAGES,
    function_section,
    link_sections,
    page_markdown,
    section_anchors,
    section_markdown,
    sections_of,
    twin_names,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS_FOLDER = "docs"
SOURCE_FOLDERS = ("core", "reference", "accelerated", "cudasim", "minit2i", "training", "benchmarks", "scripts",
                  "tests", "notebooks", "docsite")
SKIPPED_PARTS = {"__pycache__", ".ipynb_checkpoints"}
STYLESHEET = "assets/sidebyside.css"
# The pages the code cites by section number ("model.md 3.6", "concepts.md 4"), linked on its pages.
CITED_DOCS = ("model.md", "concepts.md")
LINK = re.compile(r"(!?\[([^\]]*)\]\()([^)\s]+)(\))")
FENCED = re.compile(r"^(`{3,}).*?^\1[ \t]*$", re.DOTALL | re.MULTILINE)
IDENTIFIER = re.compile(r"^`([A-Za-z_][\w.]*)(?:\(\))?`$")
MATH = re.compile(r'<(span|div) class="arithmatex">\\([(\[])(.*?)\\[)\]]</\1>', re.DOTALL)

# Filled by on_files on each build: repository path -> page (src_uri), page -> repository path,
# and the names of the sections of each side-by-side page.
pages: dict[str, str] = {}
origins: dict[str, str] = {}
section_names: dict[str, set[str]] = {}


def source_files() -> list[Path]:
    """Every source file the site shows side by side, in repository order."""
    found = []
    for folder in SOURCE_FOLDERS:
        found += [p for p in sorted((ROOT / folder).rglob("*"))
                  if p.suffix in LANGUAGES and p.is_file() and not SKIPPED_PARTS & set(p.parts)]
    return found


def folders() -> list[Path]:
    """Every folder of SOURCE_FOLDERS (with its subfolders) and every folder with a README."""
    found = {p.parent for p in ROOT.glob("*/README.md")}
    for folder in SOURCE_FOLDERS:
        found |= {p for p in [ROOT / folder, *(ROOT / folder).rglob("*")]
                  if p.is_dir() and not SKIPPED_PARTS & set(p.parts)}
    return sorted(found)


def repository_path(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def twins() -> dict[tuple[str, str], list[str]]:
    """(NumPy file, function) -> the CUDA sources whose `NumPy twin:` comment names it."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in source_files():
        if LANGUAGES[path.suffix] == "cuda":
            for twin in twin_names(path.read_text()):
                found.setdefault(twin, []).append(repository_path(path))
    return found


def relative_link(target: str, start: str) -> str:
    """A link from the repository path `start` (a file) to the repository path `target`."""
    return posixpath.relpath(target, posixpath.dirname(start) or ".")


def code_page(path: Path, anchors: dict[str, dict[str, str]], twin_map: dict[tuple[str, str], list[str]]) -> str:
    """The side-by-side page of one source file; a CUDA source first shows its NumPy twins.
    `anchors`: {page the code cites by section ("model.md"): {section number: its anchor}}."""
    name = repository_path(path)
    source = path.read_text()
    language = LANGUAGES[path.suffix]
    rows = []
    for twin_path, function in twin_names(source) if language == "cuda" else []:
        prose = [(f"**NumPy twin**: [`{function}`]({relative_link(twin_path, name)}), the function this kernel "
                  "computes; the reference is the oracle its tests compare it with.")]
        rows.append(section_markdown(function_section((ROOT / twin_path).read_text(), function, prose), "python",
                                     "\n".join(prose)))
    sections = sections_of(source, language)
    section_names[name] = {slugify(s.name, "-") for s in sections if s.name}
    for section in sections:
        kernels = twin_map.get((name, section.name), [])
        note = ["", "GPU twin: " + ", ".join(f"[`{posixpath.basename(k)}`]({relative_link(k, name)})"
                                             for k in kernels)] if kernels else []
        prose = "\n".join(section.prose + note)
        for doc, doc_anchors in anchors.items():
            prose = link_sections(prose, doc, relative_link(f"{DOCS_FOLDER}/{doc}", name), doc_anchors)
        rows.append(section_markdown(section, language, prose))
    return page_markdown(name, rows)


def folder_page(folder: Path) -> str:
    """A folder's README (or its name as the title), then its subfolders and files, each linked
    to its page where it has one."""
    name = repository_path(folder)
    readme = folder / "README.md"
    text = readme.read_text() if readme.exists() else f"# `{name}/`\n"
    entries = sorted(p for p in folder.iterdir() if not SKIPPED_PARTS & set(p.parts) and p.name != "README.md"
                     and not p.name.startswith("."))
    lines = [f"* [`{p.name}/`]({p.name})" if p.is_dir() else
             f"* [`{p.name}`]({p.name})" if repository_path(p) in pages else f"* `{p.name}`" for p in entries]
    return text + f"\n\n## Files in `{name}/`\n\n" + "\n".join(lines) + "\n"


def on_files(files, config):
    pages.clear()
    origins.clear()
    section_names.clear()
    docs = ROOT / DOCS_FOLDER
    for path in docs.rglob("*.md"):
        pages[repository_path(path)] = path.relative_to(docs).as_posix()
    generated = {"README.md": "index.md"}
    generated |= {repository_path(p): f"{repository_path(p)}.md" for p in source_files()}
    generated |= {repository_path(f): f"{repository_path(f)}/index.md" for f in folders()}
    pages.update(generated)
    # A folder page reads links as its README does; a link to the README itself finds the page too.
    origins.update({page: f"{path}/README.md" if (ROOT / path).is_dir() else path for path, page in pages.items()})
    pages.update({f"{path}/README.md": page for path, page in generated.items() if (ROOT / path).is_dir()})
    anchors = {doc: section_anchors((docs / doc).read_text()) for doc in CITED_DOCS}
    twin_map = twins()
    for path, page in generated.items():
        full = ROOT / path
        if path == "README.md":
            content = full.read_text()
        elif path in NOTEBOOKS:
            content = notebook_markdown(path)
        elif full.is_dir():
            content = folder_page(full)
        else:
            content = code_page(full, anchors, twin_map)
        files.append(File.generated(config, page, content=content))
    files.append(File.generated(config, STYLESHEET, abs_src_path=str(Path(__file__).parent / "sidebyside.css")))
    return files


def rewrite_link(text: str, target: str, origin: str, page: str) -> str:
    """The site link for a Markdown link written in the repository file `origin` (shown as `page`)."""
    if re.match(r"[a-z]+:|#|/", target):
        return target
    path, _, anchor = target.partition("#")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(origin), path)).rstrip("/")
    resolved = "README.md" if resolved == "." else resolved
    if resolved in pages:
        destination = pages[resolved]
    elif resolved.startswith(DOCS_FOLDER + "/"):
        destination = resolved[len(DOCS_FOLDER) + 1:]  # a figure or other file of the docs folder
    else:
        return target  # no page: MkDocs reports it
    name = IDENTIFIER.match(text)
    if not anchor and name and slugify(name.group(1), "-") in section_names.get(resolved, ()):
        anchor = slugify(name.group(1), "-")
    link = relative_link(destination, page)
    return link + (f"#{anchor}" if anchor else "")


def on_page_markdown(markdown, page, config, files):
    origin = origins.get(page.file.src_uri, f"{DOCS_FOLDER}/{page.file.src_uri}")

    def rewrite(match):
        return match.group(1) + rewrite_link(match.group(2), match.group(3), origin, page.file.src_uri) + match.group(4)

    # Only outside fenced code: the code column is code, links in it are text.
    parts, last = [], 0
    for fenced in FENCED.finditer(markdown):
        parts += [LINK.sub(rewrite, markdown[last:fenced.start()]), fenced.group(0)]
        last = fenced.end()
    return "".join(parts) + LINK.sub(rewrite, markdown[last:])


def on_page_content(content, page, config, files):
    def mathml(match):
        display = "block" if match.group(2) == "[" else "inline"
        return convert(html.unescape(match.group(3)).strip(), display=display)

    return MATH.sub(mathml, content)
