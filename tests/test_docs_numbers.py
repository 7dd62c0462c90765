"""The numbers the pages quote about the shipped models are the models' own.

Every page (README.md, docs/*.md) and the walkthrough notebook is cut into sentences. A sentence
about one shipped model (the demo model, its four-step student, the released MiniT2I B/16 and its
Mean Flow student) is read for the quantities a reader would copy: sampler steps, guidance,
image size, patch size, block and layer counts, words, text length, parameter counts and file
size. Each one must equal the value computed from the shipped configs and weights
(minit2i/demo_model*, the core configs and recipes), so a retrained model, a changed default or
a page written later cannot quote a stale number. A sentence about several models, a trial, a
sweep or a command-line flag is not read: its numbers are not the shipped model's.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path

import pytest

from minit2i.core.mean_flow_config import MEAN_FLOW_RECIPE, aux_token_groups
from minit2i.core.mmjit_config import BASE_RECIPE, MMJIT_B16, mmjit_dead_shapes, mmjit_expected_shapes
from minit2i.core.t5_config import T5_FLAN_LARGE, t5_expected_shapes
from minit2i.demo_models import DEMO_MODELS
from minit2i.pipeline import open_model, sampling_defaults

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "notebooks").glob("*.py")])

NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "eight": 8, "ten": 10,
                "sixteen": 16, "twenty": 20, "hundred": 100}
# A number in digits (D), or also in words where a count is written so ("four double blocks").
D = r"(\d+(?:,\d{3})*(?:\.\d+)?)"
N = r"(\d+(?:,\d{3})*(?:\.\d+)?|%s)" % "|".join(NUMBER_WORDS)
# A sentence ends at a full stop before a space and a capital, a backtick or a bracket, at a
# semicolon, at a blank line, at a table cell's edge, and before a heading, a list item or a fence.
SENTENCE_END = re.compile(r"\.\s+(?=[A-Z`*(\[])|;|\n\s*\n|\||^```.*$|^\s*[*-] |(?=^#+ )|^\s*\d+\. ", re.M)

# Who a sentence is about: subject -> (pattern naming it, pattern of what makes it ambiguous).
SUBJECTS = {
    "demo": (r"\bdemo model\b|`demo`|\*\*demo\*\*|^# .*\bdemo models\b",
             r"student|demo-mf|Mean Flow|four-step|\bMF\b|B/16|L/16|MiniT2I[:-]|teacher"),
    "demo-mf": (r"demo-mf|demo model's (?:four-step )?student|its four-step student",
                r"B/16|L/16|MiniT2I[:-]|omega 1\b|at omega|earlier|previous"),
    "MiniT2I": (r"\bMiniT2I\b(?!-B-16-MF|-B/16-MF)|released B/16|\bB/16 model",
                r"demo|student|Mean Flow|L/16|four-step|\bMF\b|JAX|torch|benchmark|GenEval|recommend"),
    "B/16-MF": (r"B/16-MF|B-16-MF", r"demo|L/16|\bB/16\b(?!-MF)|100 steps"),
}
# What a sentence may quote: (pattern, the quantity each of its groups is). A table cell is read
# as its row's label, the cell and its column's heading ("parameters: MMJiT 2,012,976",
# "demo model: 4 steps (column: Mean Flow student)").
QUANTITIES = [
    (rf"\b{N} (?:sampler |Euler |Mean Flow )?steps\b", ("steps",)),
    (rf"\b{N}-step\b", ("steps",)),
    (rf"\bguidance(?: scale)?:? (?:= )?{D}", ("guidance",)),
    (rf"\bomega (?:= )?{D}", ("guidance",)),
    (rf": {D}, {D}, {D} x \3\b", ("steps", "guidance", "image size")),
    (rf"\b{D} x \1\b(?! patches| =| grid| tokens)", ("image size",)),
    (rf"\b{N} x \1 patches\b", ("patch",)),
    (rf"\bpatch(?: size)?:? \**{N}\b", ("patch",)),
    (rf"\b{N} double(?:-stream)? blocks\b", ("double blocks",)),
    (rf"\b{N}-(?:block|layer) T5\b", ("T5 layers",)),
    (rf"^T5: {N} layers\b", ("T5 layers",)),
    (rf"\bknows {D} words\b", ("words",)),
    (rf"\bvocabulary (?:is|of) {D} words\b", ("words",)),
    (rf"\bvocabulary {D}\b", ("vocabulary",)),
    (rf"\btext length:? {D} tokens\b", ("text length",)),
    (rf"\bprefix of {N} tokens\b", ("prefix tokens",)),
    (rf"\b{D} ?(?:M|million)?(?: learned numbers|[- ]parameters?)\b", ("parameters",)),
    (rf"^parameters: (?:MMJiT|T5) {D}\b", ("parameters",)),
    (rf"\b{D} MB\b", ("file size in MB",)),
]
# The labels of the rows of a table of a model's settings.
SETTING_ROWS = r"sampling|parameters|storage|patch|T5|MMJiT|text length|image size|steps|guidance"
# A flag's value, an experiment, training, a figure's setting or a counterfactual: numbers in such a
# sentence are not the shipped model's settings.
EXPERIMENT = (r"--[a-z-]+ \d|trial|sweep|(?:first|second|third|fourth|last) stage|previous|earlier|would|"
              r"instead|cannot|learning rate|warm-up|\bEMA\b|figure")


def parameters(checkpoint) -> int:
    return sum(math.prod(shape) for shape in checkpoint.shapes.values())


@lru_cache(maxsize=None)
def shipped() -> dict[tuple[str, str], set[float]]:
    """(subject, quantity) -> the values a page may quote, computed from the shipped files."""
    demo, student = (open_model(*DEMO_MODELS[name][:2]) for name in ("demo", "demo-mf"))
    demo_recipe, student_recipe = sampling_defaults(demo), sampling_defaults(student)
    config, t5 = demo.mmjit.config, demo.t5.config
    demo_parameters = parameters(demo.mmjit) + parameters(demo.t5)
    demo_bytes = sum(path.stat().st_size for checkpoint in (demo.mmjit, demo.t5) for path in checkpoint.files)
    b16_live = sum(math.prod(s) for s in mmjit_expected_shapes(MMJIT_B16).values())
    b16_file = b16_live + sum(math.prod(s) for s in mmjit_dead_shapes(MMJIT_B16).values())
    t5_large = sum(math.prod(s) for s in t5_expected_shapes(T5_FLAN_LARGE).values())
    return {
        ("demo", "steps"): {demo_recipe["steps"]},
        ("demo", "guidance"): {demo_recipe["cfg_scale"]},
        ("demo", "image size"): {demo_recipe["width"]},
        ("demo", "patch"): {config.patch_size},
        ("demo", "double blocks"): {config.depth_double},
        ("demo", "T5 layers"): {t5.num_layers},
        ("demo", "words"): {len(demo.tokenizer.known_words())},
        ("demo", "vocabulary"): {t5.vocab_size},
        ("demo", "text length"): {config.prompt_length},
        ("demo", "parameters"): {parameters(demo.mmjit), parameters(demo.t5), demo_parameters,
                                 round(demo_parameters / 1e6, 1)},
        ("demo", "file size in MB"): {round(demo_bytes / 1e6, 1)},
        ("demo-mf", "steps"): {student_recipe["steps"]},
        ("demo-mf", "guidance"): {student_recipe["cfg_scale"]},
        ("demo-mf", "image size"): {student_recipe["width"]},
        ("demo-mf", "parameters"): {parameters(student.mmjit)},
        ("demo-mf", "prefix tokens"): {sum(n for _, n in aux_token_groups(student.mmjit.config))},
        ("MiniT2I", "steps"): {BASE_RECIPE["steps"]},
        ("MiniT2I", "guidance"): {BASE_RECIPE["cfg_scale"]},
        ("MiniT2I", "image size"): {MMJIT_B16.image_size},
        ("MiniT2I", "patch"): {MMJIT_B16.patch_size},
        ("MiniT2I", "double blocks"): {MMJIT_B16.depth_double},
        ("MiniT2I", "parameters"): {b16_live, b16_file, round(b16_file / 1e6), t5_large, round(t5_large / 1e6)},
        ("B/16-MF", "steps"): {MEAN_FLOW_RECIPE["steps"]},
        ("B/16-MF", "guidance"): {MEAN_FLOW_RECIPE["cfg_scale"]},
        ("B/16-MF", "image size"): {MMJIT_B16.image_size},
    }


def number(text: str) -> float:
    return NUMBER_WORDS.get(text.lower()) or float(text.replace(",", ""))


def page_text(page: Path) -> str:
    """A page's prose: the notebook's comment marks are taken off its Markdown cells' lines."""
    text = page.read_text()
    return re.sub(r"^# ?", "", text, flags=re.M) if page.suffix == ".py" else text


def table_context(lines: list[str], line: int, column: int) -> tuple[str, str]:
    """The row label and the column heading of a table cell (column counted from 1), or ("", "")
    for a line that is no table row."""
    row = lines[line - 1].strip()
    if not row.startswith("|") or row.count("|") <= 2:
        return "", ""
    first = line - 1
    while first > 0 and lines[first - 1].lstrip().startswith("|"):
        first -= 1
    header = lines[first].split("|")
    heading = header[column].strip() if 1 < column < len(header) else ""
    return row.split("|")[1].strip(), heading


def sentences(text: str) -> list[tuple[int, str, bool, str]]:
    """(first line, text, whether it opens a paragraph or a table cell, its table row's label or
    "") of each sentence, as SENTENCE_END cuts it; a table cell is read in its row and column."""
    lines = text.split("\n")
    found, start, opens = [], 0, True
    for end in [*SENTENCE_END.finditer(text), None]:
        stop = end.start() if end else len(text)
        line = text.count("\n", 0, start) + 1
        sentence = text[start:stop]
        label, heading = table_context(lines, line, text[text.rfind("\n", 0, start) + 1:start].count("|"))
        column = f" (column: {heading})" if heading else ""
        cell = f"{label}: {sentence.strip()}{column}" if label and sentence.strip() != label else sentence
        found.append((line, cell, opens, label))
        start = end.end() if end else stop
        opens = end is None or not re.fullmatch(r"\.[ \t]*\n?[ \t]*|;", end.group(0))
    return found


def subjects_of(sentence: str) -> list[str]:
    return [name for name, (names, ambiguous) in SUBJECTS.items()
            if re.search(names, sentence) and not re.search(ambiguous, sentence)]


def quotes(text: str) -> list[tuple[int, str, str, float]]:
    """(line, subject, quantity, quoted value) of every number a page quotes about a shipped model.
    A sentence that names no model ("its recipe") is about the one its paragraph's previous
    sentence names; a cell that names none in a row of settings (SETTING_ROWS), about the one
    its section's heading names (a results or trials table is not read that way)."""
    found, subjects, headings = [], [], {}
    for line, sentence, opens, label in sentences(text):
        named = any(re.search(names, sentence) for names, _ in SUBJECTS.values())
        heading = re.match(r"(#+) ", sentence)
        if heading:
            level = len(heading.group(1))
            headings = {k: v for k, v in headings.items() if k < level} | {level: subjects_of(sentence)}
        if named or (opens and not label):
            subjects = subjects_of(sentence)
        elif opens:
            settings = re.fullmatch(SETTING_ROWS, label, re.I)
            subjects = next((s for _, s in sorted(headings.items(), reverse=True) if s), []) if settings else []
        else:
            subjects = [s for s in subjects if not re.search(SUBJECTS[s][1], sentence)]
        if re.search(EXPERIMENT, sentence):
            continue
        for subject in subjects:
            for pattern, kinds in QUANTITIES:
                for match in re.finditer(pattern, sentence, re.I):
                    at = line + sentence.count("\n", 0, match.start())
                    found += [(at, subject, kind, number(value)) for kind, value in zip(kinds, match.groups())
                              if (subject, kind) in shipped()]
    return found


def wrong_quotes(text: str, name: str) -> list[str]:
    """`name:line: the model's quantity: quoted Q, shipped S` for each quote that is not the model's."""
    return [f"{name}:{line}: the {subject} model's {quantity}: quoted {value:g}, shipped "
            + " or ".join(f"{v:g}" for v in sorted(shipped()[subject, quantity]))
            for line, subject, quantity, value in quotes(text) if value not in shipped()[subject, quantity]]


@pytest.fixture(scope="module")
def all_quotes() -> dict[Path, list]:
    return {page: quotes(page_text(page)) for page in PAGES}


def test_every_quoted_number_is_the_shipped_models():
    wrong = [w for page in PAGES for w in wrong_quotes(page_text(page), page.relative_to(ROOT).as_posix())]
    assert wrong == [], "\n".join(wrong)


def test_the_pages_quote_each_shipped_setting(all_quotes):
    """The check reads the pages: each model's steps and guidance are found quoted somewhere."""
    checked = {(subject, quantity) for found in all_quotes.values() for _, subject, quantity, _ in found}
    assert {(s, q) for s in SUBJECTS for q in ("steps", "guidance")} <= checked


@pytest.mark.parametrize("page, old, new, message", [
    ("the 64 x 64 `circle.png` with the demo model in\n20 steps.", "20 steps", "25 steps",
     "page.md:2: the demo model's steps: quoted 25, shipped 20"),
    ("The demo model uses guidance 2.0 and knows 27 words.", "guidance 2.0", "guidance 3.0",
     "page.md:1: the demo model's guidance: quoted 3, shipped 2"),
    ("# The demo models\n\n| part | setting |\n| --- | --- |\n| storage | float16, 4.7 MB |",
     "4.7 MB", "4.2 MB", "page.md:5: the demo model's file size in MB: quoted 4.2, shipped 4.7"),
    ("`generate` takes its recipe (4 steps, guidance 12.0) from MiniT2I-B-16-MF-jax.", "12.0", "6.0",
     "page.md:1: the B/16-MF model's guidance: quoted 6, shipped 12"),
    ("| | base sampler | Mean Flow student |\n| --- | --- | --- |\n| demo model | 20 steps | 4 steps |",
     "| 20 steps", "| 25 steps", "page.md:3: the demo model's steps: quoted 25, shipped 20"),
], ids=["sentence", "guidance", "table row", "real student", "table column"])
def test_a_changed_number_is_caught(page, old, new, message):
    """The quote is read and passes as written; with one number changed it fails, named."""
    assert quotes(page) and wrong_quotes(page, "page.md") == []
    assert wrong_quotes(page.replace(old, new), "page.md") == [message]
