"""A source file as a side-by-side page: its prose (docstrings and comments) left, its code right.

A file is cut into sections, each some prose and the code it explains, as the annotated
implementations people read do it: a section starts at every function, class or method (its
docstring, and any comment just above it, are its prose) and at every block of whole-line
comments that follows code (the comment is the prose of the code below it, up to the next
section). The prose is Markdown: `$...$` is an equation, an indented block is kept as written,
and `model.md N.M` (`concepts.md N`) becomes a link to that section of the spec (of the concepts page). The page is Markdown for
MkDocs (md_in_html, superfences titled with the lines they show), so it is made from the file on every build
and cannot drift from it.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field

from markdown.extensions.toc import slugify

LANGUAGES = {".py": "python", ".cu": "cuda", ".cuh": "cuda", ".cpp": "cpp", ".h": "cpp"}
COMMENT_MARKERS = {"python": "#", "cuda": "//", "cpp": "//"}
# "model.md 3.6", "concepts.md 4": a section of a page that the code cites.
SECTION_REFERENCE = r"{doc},? (?:section )?(\d+(?:\.\d+)?)"
HEADING = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\.? .*$", re.MULTILINE)
# jupytext "percent" cells: the marker lines are notebook structure, not prose.
CELL_MARKER = re.compile(r"^%%( \[markdown\])?$")
TWIN = re.compile(r"NumPy twin: (.+)")
# Front matter of a page that needs the whole window (Material hides both sidebars): code pages.
FULL_WIDTH = "---\nhide:\n  - navigation\n  - toc\n---\n\n"


@dataclass
class Section:
    """Prose lines (Markdown) and the code lines they explain, lines `first_line` to `last_line` of
    the file (the lines of a docstring, shown as prose, are left out of the code)."""

    first_line: int = 0
    last_line: int = 0
    prose: list[str] = field(default_factory=list)
    code: list[str] = field(default_factory=list)
    name: str | None = None  # the function or class that opens it ("Class.method" for a method)
    level: int = 2  # its heading level: 2 for a top-level name, 3 for a method

    def is_empty(self) -> bool:
        return not self.prose and not self.code and self.name is None

    def add_code(self, number: int, line: str) -> None:
        if not self.code and not line.strip():
            return  # a section's code starts at its first non-blank line
        if not self.code:
            self.first_line = number
        if line.strip():
            self.last_line = number
        self.code.append(line)

    def drop_trailing_blank_lines(self) -> Section:
        while self.code and not self.code[-1].strip():
            self.code.pop()
        return self

    def add_prose(self, lines: list[str]) -> None:
        """A paragraph (or more) of prose, after a blank line if there is prose already."""
        if lines and self.prose:
            self.prose.append("")
        self.prose.extend(lines)


# What a source line is to the page, as (kind, line number, payload):
#   ("name", n, (name, level, docstring)): a function, class or method starts at line n;
#   ("prose", n, text): prose that belongs before the code (a module docstring);
#   ("comment", n, text): a whole-line comment's text; ("code", n, line): a line of code.
Event = tuple[str, int, object]


def assemble(events) -> list[Section]:
    """Sections from a file's events: a new one at each name, and at each comment after code."""
    sections, run, last_comment = [Section()], [], 0

    def flush_comments():
        sections[-1].add_prose(keep_indented_lines(run))
        run.clear()

    for kind, number, payload in events:
        current = sections[-1]
        if kind == "name":
            flush_comments()
            if current.code or current.name:
                current = Section()
                sections.append(current)
            current.name, current.level, docstring = payload
            current.add_prose(docstring.splitlines())
        elif kind == "prose":
            current.add_prose(payload.splitlines())
        elif kind == "comment":
            if current.code:
                flush_comments()
                sections.append(Section())
            if run and last_comment != number - 1:
                run.append("")  # comments apart are paragraphs apart
            run.append(payload)
            last_comment = number
        else:
            if run:
                flush_comments()
            current.add_code(number, payload)
    flush_comments()
    return [s.drop_trailing_blank_lines() for s in sections if not s.is_empty()]


def comment_prose(text: str) -> str:
    """A comment's text after its marker; a blank line for a jupytext cell marker."""
    text = text.removeprefix(" ")
    return "" if CELL_MARKER.match(text.strip()) else text


def keep_indented_lines(lines: list[str]) -> list[str]:
    """Comment lines indented past the text (aligned formulas, shapes) as a Markdown code block."""
    kept, in_block = [], False
    for line in lines:
        indented = line.startswith("  ") and bool(line.strip())
        starts_block = indented and not in_block and kept and kept[-1]
        ends_block = in_block and not indented and line
        if starts_block or ends_block:
            kept.append("")  # an indented code block needs a blank line on each side
        kept.append("    " + line[2:] if indented else line)
        in_block = indented
    return kept


def python_names(tree: ast.Module) -> dict[int, tuple[str, int, ast.AST]]:
    """First line (its first decorator's) -> (name, heading level, node) of every top-level
    function and class and of every method."""
    starts = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            starts[first_line_of(node)] = (node.name, 2, node)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        starts[first_line_of(item)] = (f"{node.name}.{item.name}", 3, item)
    return starts


def first_line_of(node) -> int:
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def docstring_lines(node) -> range:
    """The lines of a node's docstring (empty when it has none)."""
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return range(body[0].lineno, body[0].end_lineno + 1)
    return range(0)


def whole_line_comments(source: str) -> dict[int, str]:
    """Line -> text of every comment alone on its line outside brackets (one inside a call or
    a literal belongs to that code and stays in it)."""
    comments, depth, code_lines = {}, 0, set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.OP and token.string in "([{":
            depth += 1
        elif token.type == tokenize.OP and token.string in ")]}":
            depth -= 1
        if token.type == tokenize.COMMENT and depth == 0 and token.start[0] not in code_lines:
            comments[token.start[0]] = comment_prose(token.string[1:])
        elif token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.update(range(token.start[0], token.end[0] + 1))
    return comments


def jupytext_header(lines: list[str]) -> range:
    """The lines of a jupytext header (`# ---` ... `# ---` at the top), which is metadata."""
    if lines and lines[0].strip() == "# ---":
        for number, line in enumerate(lines[1:], start=2):
            if line.strip() == "# ---":
                return range(1, number + 1)
    return range(0)


def python_events(source: str):
    tree = ast.parse(source)
    lines = source.splitlines()
    names = python_names(tree)
    comments = whole_line_comments(source)
    hidden = set(docstring_lines(tree)) | set(jupytext_header(lines))
    for _, _, node in names.values():
        hidden |= set(docstring_lines(node))
    yield "prose", 0, ast.get_docstring(tree) or ""
    for number, line in enumerate(lines, start=1):
        if number in names:
            name, level, node = names[number]
            yield "name", number, (name, level, ast.get_docstring(node) or "")
        if number not in hidden:
            yield ("comment", number, comments[number]) if number in comments else ("code", number, line)


def c_events(source: str, marker: str):
    """Whole-line comments are prose, except inside a macro continued with a backslash."""
    previous = ""
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith(marker) and not previous.rstrip().endswith("\\"):
            yield "comment", number, comment_prose(stripped[len(marker):])
        else:
            yield "code", number, line
        previous = line


def sections_of(source: str, language: str) -> list[Section]:
    """Cut a source file into sections (see the module docstring)."""
    events = python_events(source) if language == "python" else c_events(source, COMMENT_MARKERS[language])
    return assemble(events)


def section_anchors(doc: str) -> dict[str, str]:
    """Section number -> the anchor MkDocs gives its numbered heading in the Markdown `doc`."""
    return {match.group(1): slugify(match.group(0).lstrip("#").strip(), "-") for match in HEADING.finditer(doc)}


def link_sections(prose: str, doc_name: str, doc_link: str, anchors: dict[str, str]) -> str:
    """`<doc_name> N.M` -> a link to that section (`doc_link` is the doc seen from the page's file)."""
    def link(match):
        number = match.group(1)
        return f"[{match.group(0)}]({doc_link}#{anchors[number]})" if number in anchors else match.group(0)
    return re.sub(SECTION_REFERENCE.format(doc=re.escape(doc_name)), link, prose)


def fence(code: str) -> str:
    """A backtick fence longer than any backtick run in the code."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    return "`" * max(3, longest + 1)


def section_markdown(section: Section, language: str, prose: str) -> str:
    """One row of the page: the prose column (headed by the section's name), then the code column."""
    heading = f"{'#' * section.level} `{section.name}`\n\n" if section.name else ""
    code = "\n".join(section.code)
    code_column = ""
    if code:
        marks = fence(code)
        code_column = f'{marks}{language} title="lines {section.first_line}-{section.last_line}"\n{code}\n{marks}'
    return (f'<div class="sbs-row" markdown>\n<div class="sbs-prose" markdown>\n\n{heading}{prose}\n\n</div>\n'
            f'<div class="sbs-code" markdown>\n\n{code_column}\n\n</div>\n</div>\n')


def twin_names(source: str) -> list[tuple[str, str]]:
    """(path, function) pairs of a CUDA source's `NumPy twin: path name, path name` comment."""
    match = TWIN.search(source)
    return [tuple(item.split()) for item in match.group(1).split(",")] if match else []


def function_section(source: str, name: str, prose: list[str]) -> Section:
    """The top-level function `name` of Python `source`, whole (docstring too), as a section."""
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = first_line_of(node)
            return Section(first, node.end_lineno, prose, source.splitlines()[first - 1:node.end_lineno])
    raise KeyError(f"no function {name}")


def page_markdown(path: str, rows: list[str]) -> str:
    """The side-by-side page of the repository file `path` from its rows (`section_markdown`)."""
    return f"{FULL_WIDTH}# `{path}`\n\n<div class=\"sbs\" markdown>\n\n" + \
        "\n".join(rows) + "\n</div>\n"
