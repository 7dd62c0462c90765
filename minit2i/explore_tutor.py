"""What makes `minit2i explore` a tutor rather than a viewer: the finished run kept for the session
(any step and block looked at again without sampling), the line under each panel saying what to
look for and which section of the concepts page explains it, that page served by the explore
server itself, and the comparison of two settings of one prompt and seed.

The panels' pictures come from `minit2i.insides`; this module only decides what a session keeps and
what the page says about it. Steps and blocks are numbered from 1 here, as in docs/concepts.md and
the walkthrough; `insides` counts from 0, as the code does.
"""

from __future__ import annotations

import base64
import functools
import html
import io
import itertools
import numbers
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from minit2i.core.errors import MiniT2IError

from .code_pages import RELATIVE_LINK, allow_list, code_link, linked_path, repository_folders
from .insides import (
    KEPT_RUN_LIMIT,
    FinishedRun,
    Insides,
    check_kept_size,
    check_position,
    inside_request,
    look_at,
    sample_and_keep,
    step_times,
    velocity_correlation,
)
from .pipeline import Request, check_backend, is_student

# The page's numbers for steps and blocks start here (the docs' convention).
FIRST = 1
CONCEPTS_ROUTE = "concepts"  # the concepts page, served beside the explore page
# The docs pages the explore server shows beside its own (in docs/): the concepts page and the pages
# it links, each at its own route (`docs_route`); /code/ serves the source files they link to, and
# only those (`served_code`).
SHOWN_PAGES = ("concepts.md", "sampler.md", "reading-guide.md", "model.md", "demo-model.md", "real-weights.md",
               "explore.md", "exercises.md")
# How long a session's kept run outlives its last request (Gradio drops the state then).
KEPT_FOR_S = 3600
# The velocity panel's claim: at every step the velocity's pixels correlate at least this much with
# the first step's (a straight path from noise to image has one velocity, x - n; the demo runs give
# 0.97 and more, tests/test_explore_captions.py measures it).
VELOCITY_AGREEMENT = 0.95
# How the x0 strip marks the chosen step.
STRIP_MARK = "\u25b6"


PACKAGE = Path(__file__).resolve().parent


def concepts_dir(package: Path = PACKAGE) -> Path:
    """Where docs/concepts.md and its figures are: `docs_data/` inside an installed package
    (pyproject.toml ships them there), else `docs/` beside the package (a source checkout)."""
    shipped = package / "docs_data"
    return shipped if shipped.is_dir() else package.parent / "docs"


def section_anchor(heading: str) -> str:
    """The id Gradio's Markdown gives a heading: "h-" and GitHub's slug of it (lower case,
    punctuation dropped, spaces as hyphens)."""
    return "h-" + re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def concepts_sections(text: str) -> dict[int, tuple[str, str]]:
    """{section number: (heading, anchor)} of the concepts page's numbered sections."""
    return {int(number): (heading, section_anchor(heading))
            for heading, number in re.findall(r"^## ((\d+)\. .*)$", text, re.MULTILINE)}


@functools.cache
def served_code() -> dict[str, str]:
    """{repository path: text} of the source files /code/ serves (`code_pages.allow_list`): those
    the SHOWN_PAGES link to, read once, when the server builds its pages."""
    return allow_list([(concepts_dir() / page).read_text() for page in SHOWN_PAGES], repository_folders())


def figure_tag(alt: str, png: bytes) -> str:
    """A figure of a docs page as the served page shows it: inlined (a data: URI), with its width
    and height, so that the page keeps the figure's place before the browser has decoded it (a link
    to a heading below it stays right however late the figure comes)."""
    with Image.open(io.BytesIO(png), formats=["PNG"]) as image:
        width, height = image.size
    data = base64.b64encode(png).decode()
    return (f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}" width="{width}" '
            f'height="{height}">')


def docs_route(page: str) -> str:
    """The explore server's route of a page of SHOWN_PAGES: concepts.md at CONCEPTS_ROUTE, each other
    page at its name ("sampler.md" at "sampler")."""
    return CONCEPTS_ROUTE if page == "concepts.md" else page.removesuffix(".md")


def concepts_markdown() -> str:
    """docs/concepts.md as the explore server shows it (`docs_markdown`)."""
    return docs_markdown("concepts.md")


def docs_markdown(page: str) -> str:
    """A page of SHOWN_PAGES as the explore server shows it: its figures inlined with their sizes
    (`figure_tag`), its links within the page pointed at Gradio's heading ids, its links to the
    other shown pages at their routes (`docs_route`, at the heading a link names), its links to
    source files at the server's own pages of them (`code_pages`: at the function a link names),
    and its links to anything else, which the server does not have, left as text."""
    folder = concepts_dir()
    text = (folder / page).read_text()
    served = served_code()

    def link(match):
        label, target = match.group(1), match.group(2)
        other, _, anchor = target.partition("#")
        if other in SHOWN_PAGES:
            return f"[{label}]({docs_route(other)}{f'#h-{anchor}' if anchor else ''})"
        name = re.fullmatch(r"`(\w+)`", label)
        served_link = code_link(linked_path(target), name and name[1], served)
        return f"[{label}]({served_link})" if served_link else label

    text = re.sub(r"!\[([^\]]*)\]\((figures/[^)\s]+\.png)\)",
                  lambda match: figure_tag(match.group(1), (folder / match.group(2)).read_bytes()), text)
    text = re.sub(r"\]\(#([\w-]+)\)", r"](#h-\1)", text)  # the page's own headings, as Gradio names them
    return RELATIVE_LINK.sub(link, text)


def concept_link(section: int, text: str | None = None) -> str:
    """A Markdown link to a numbered section of the served concepts page."""
    heading, anchor = concepts_sections((concepts_dir() / "concepts.md").read_text())[section]
    return f"[{text or heading}]({CONCEPTS_ROUTE}#{anchor})"


# Under each panel: (what to look for, the concepts section that explains it).
LOOK_FOR = {
    "state": (("The state x_t the step starts from, t of the way from the noise to the image: pure noise at "
               "step 1, more of the picture at every step."), 1),
    "x0": (("The network's guess of the finished picture: from step 2 on it is nearly the picture, while x_t "
            "is still mostly noise."), 2),
    "velocity": (("The direction the step moves x_t, (x0 - x_t) over the time left, on its own scale: nearly the "
                  f"same picture at every step (its pixels correlate {VELOCITY_AGREEMENT:g} or more with step 1's; "
                  "the line above gives this step's), the image minus the noise, x - n, as a straight path has "
                  "it."), 2),
    "average_velocity": (("The student's step: its move over the step's length, the average velocity over the whole "
                          "step (concepts 6), where the teacher's panel shows the velocity at the step's start; "
                          "four steps, each a secant of the path."), 6),
    "x0_steps": (("Read the strip left to right: the guess sharpens while the state it is made from loses "
                  "its noise."), 2),
    "attention": (("A colour or shape word lights up on the patches where that shape is drawn; change the block "
                   "and the step to see where and when."), 4),
    "guidance": (("The guided prediction goes past the conditional one, away from the unconditional: what the "
                  "prompt adds is exaggerated."), 3),
    "compare": (("Guidance 0 ignores the prompt and large guidance overshoots it; the student's 4 steps land "
                 "where the teacher's 20 do."), 6),
}
ATTENTION_SINKS = (
    "**Attention sinks.** The brightest maps often belong to small words such as \"a\" and \"on\". That is "
    "not a bug: every patch's attention sums to 1 over all the tokens (a softmax), so a patch that has "
    "nothing to read from the prompt still puts its weight somewhere, and transformers learn to park it "
    "on frequent tokens that carry little meaning, the sinks (Xiao et al., arXiv:2309.17453). Compare the "
    "content words' maps with each other, not with the sinks'.")


def velocity_label(student: bool) -> str:
    """The velocity panel's label: a Mean Flow student's step follows its average velocity over the step."""
    return "the average velocity over the step" if student else "the velocity of the step"


def velocity_look_for(student: bool) -> str:
    """The LOOK_FOR entry under the velocity panel for a student's run or a base model's."""
    return "average_velocity" if student else "velocity"


def look_for(panel: str) -> str:
    """The one line under `panel`: what to look for, and a link to the section that explains it."""
    line, section = LOOK_FOR[panel]
    return f"{line} ({concept_link(section, f'concepts {section}')})"


class KeptRuns:
    """The finished runs the sessions of one server keep, oldest first, under `limit` bytes in all:
    keeping one more lets go of the oldest (whose session, asked for another step, is told to
    generate again). A session's state holds only its run's key, so that a run is freed here
    whether or not Gradio still holds the session."""

    def __init__(self, limit: int):
        self.limit = limit
        self.runs: OrderedDict[int, FinishedRun] = OrderedDict()
        self.keys = itertools.count()
        self.lock = threading.Lock()  # Gradio answers requests in several threads

    def keep(self, run: FinishedRun) -> int:
        """Keep `run` -> its key."""
        with self.lock:
            key = next(self.keys)
            self.runs[key] = run
            while len(self.runs) > 1 and sum(kept.states.nbytes + kept.x0s.nbytes
                                             for kept in self.runs.values()) > self.limit:
                self.runs.popitem(last=False)
            return key

    def get(self, key: int | None) -> FinishedRun | None:
        with self.lock:
            return self.runs.get(key)


# Every session may keep a run of up to KEPT_RUN_LIMIT for KEPT_FOR_S: 50 sessions of one server held
# over 12 GiB for an hour. All of a server's sessions together keep at most this much.
SERVER_KEPT_LIMIT = 4 * KEPT_RUN_LIMIT
KEPT_RUNS = KeptRuns(SERVER_KEPT_LIMIT)


@dataclass
class Kept:
    """What one browser session keeps: the key of its last finished run in KEPT_RUNS (what the
    step and block selectors look at) and how many sampling runs it has asked for."""

    key: int | None = None
    model: str = ""
    backend: str = ""
    sampling_runs: int = 0

    @property
    def run(self) -> FinishedRun | None:
        """The session's last finished run, None if there is none or the server has let it go."""
        return KEPT_RUNS.get(self.key)

    def runs_line(self) -> str:
        return f"sampling runs on this page: {self.sampling_runs}"


def time_line(models, kept: Kept, step: int) -> str:
    """The line above the step's panels: where the page's `step` (from 1) of the kept run lies on
    the path from noise to image, and how alike its velocity is to the first step's."""
    start, end = step_times(kept.run, step - FIRST)
    steps = kept.run.request.steps
    clock = (f" (the student's own clock, 1 noise: {1 - start:.2f} to {1 - end:.2f})"
             if is_student(models.files(kept.model)) else "")
    return (f"**step {step} of {steps}: t = {start:.2f} to {end:.2f}**{clock}, on the path from noise (t = 0) to "
            f"image (t = 1): x_t = {start:.2f} x + {1 - start:.2f} n. The velocity's correlation with step "
            f"{FIRST}'s: {velocity_correlation(kept.run, step - FIRST, 0):.3f}.")


def strip(x0_pictures: list, step: int, run: FinishedRun) -> list[tuple]:
    """The x0 strip's (picture, caption) of every step, the page's `step` (from 1) marked with its t."""
    return [(picture, f"{STRIP_MARK} {i + FIRST}: t {step_times(run, i)[0]:.2f}" if i + FIRST == step
             else f"step {i + FIRST}") for i, picture in enumerate(x0_pictures)]


def run_request(models, name: str, backend: str, precision: str, prompt: str, *, step: int, block: int,
                **settings) -> Request:
    """The request of `sample_run`, after its cheap checks (model, backend, request, the page's
    step and block numbered from 1, the memory the run keeps), whatever the types given."""
    files = models.files(name)
    check_backend(backend, precision)
    request = inside_request(files, prompt, step=0, block=0, **settings)
    check_position(step, request.steps, "step", "--steps", first=FIRST)
    check_position(block, files.mmjit.config.depth_double, "block", "the model's double blocks", first=FIRST)
    check_kept_size(request, files.mmjit.config.in_channels)
    return request


def sample_run(models, name: str, backend: str, precision: str, on_step, prompt: str, *, step: int, block: int,
               **settings) -> FinishedRun:
    """A finished run of `prompt` on the page's cached model, after `run_request`'s checks."""
    request = run_request(models, name, backend, precision, prompt, step=step, block=block, **settings)
    pipe = models.pipeline(name, backend)
    return sample_and_keep(pipe.model, request, pipe.runner, models.pipeline(name, "numpy").runner, on_step)


def picked_step(event_data, steps: int) -> int:
    """The page's step (from 1) of the x0 strip's picture a select event names: its data as a client
    sent it (any JSON; a click sends {"index": i, ...}, i from 0), checked as the slider's value
    against the run's `steps`."""
    index = event_data.get("index") if isinstance(event_data, dict) else event_data
    step = int(index) + FIRST if isinstance(index, numbers.Integral) and not isinstance(index, bool) else index
    check_position(step, steps, "step", "the run's steps", first=FIRST)
    return step


def look_again(models, kept: Kept, step: int, block: int) -> Insides:
    """The kept run at the page's `step` and `block` (from 1): two forwards of the reference, no sampling."""
    if kept.run is None:
        raise MiniT2IError("there is no finished run to look at (none yet, or the server let it go to make room for "
                           "other sessions' runs); press Generate")
    reference = models.pipeline(kept.model, "numpy")
    check_position(step, kept.run.request.steps, "step", "the run's steps", first=FIRST)
    check_position(block, reference.model.mmjit.config.depth_double, "block", "the model's double blocks",
                   first=FIRST)
    return look_at(reference.model, reference.runner, kept.run, step - FIRST, block - FIRST)



def other_model(names: list[str], first: str) -> str:
    """The compare mode's right side to start with: the first model other than the page's (the
    demo's student beside the demo), else the same one."""
    return next((name for name in names if name != first), first)


def compare_label(name: str, request, seconds: float) -> str:
    """One line naming a compared side's settings: model, steps, guidance (and interval), time."""
    interval = (f", interval {request.guidance_interval[0]:g}-{request.guidance_interval[1]:g}"
                if request.guidance_interval else "")
    return f"**{name}**: {request.steps} steps, guidance {request.cfg_scale:g}{interval} ({seconds:.1f} s)"
