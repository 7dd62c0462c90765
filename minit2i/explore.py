"""`minit2i explore`: a local web page that shows the model's insides (docs/explore.md).

For a prompt, seed, steps, guidance (and a Mean Flow student's guidance interval), model and
backend, the page shows the picture and its timing table; for a chosen step, the state x_t, the
clean-image prediction x0 and the velocity side by side, with x0 at every step in a strip; the
word-to-patch attention map of every prompt word at a chosen double block; the conditional and
unconditional predictions of that step; and two settings of the same prompt and seed side by side.
The step and block selectors look at the finished run again, without sampling
(`explore_tutor`): steps and blocks are numbered from 1, as in the docs, and every panel links the
section of the concepts page (served by the same server) that explains it.

The page is Gradio's, the convention for model demos: its queue runs the work off the request
thread one request at a time (the others wait their turn) with a progress bar, and a bad input is
one line on the page while the server goes on serving. The page's API is a public interface, as
the command line's flags are: every field a client sends is checked here by the project's own
checks (Gradio does not convert them first), a cancelled request or one whose client left stops
at its next sampling step, and the HTTP requests themselves are checked first (`page_guard`).
Gradio is imported only here, when the subcommand runs (the optional extra `explore`).
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import socket
import sys
import threading
from pathlib import Path

import numpy as np

from minit2i.core.errors import MiniT2IError
from minit2i.core.mmjit_config import DEFAULT_VARIANT

from .api import MiniT2IPipeline, MiniT2IPipelineOutput
from .arguments import add_model_arguments, model_paths
from .console import LINE_LIMIT, emit, printable
from .code_pages import CodePages
from .demo_models import DEMO_MODELS
from .explore_architecture import FIRST_SHOWN, checked_stage, stage_choices, stage_links, stage_output
from .explore_tutor import (
    ATTENTION_SINKS,
    CONCEPTS_ROUTE,
    FIRST,
    KEPT_FOR_S,
    KEPT_RUNS,
    SHOWN_PAGES,
    Kept,
    compare_label,
    docs_markdown,
    docs_route,
    look_again,
    look_for,
    other_model,
    picked_step,
    run_request,
    sample_run,
    served_code,
    strip,
    time_line,
    velocity_label,
    velocity_look_for,
)
from .insides import finished_x0_pixels, step_pictures
from .page_guard import TEMP_VARIABLE, PageGuard, is_loopback, pictures_folder, prune
from .pipeline import BACKENDS, REQUEST_RANGES, ModelFiles, is_student, sampling_defaults
from .waits import LOOKUP_SECONDS, addresses

DEFAULT_HOST = "127.0.0.1"  # this machine only: the page runs any prompt on it
DEFAULT_PORT = 7860  # Gradio's
PRECISION = "fp32"  # what every backend runs
STEPS_RANGE = REQUEST_RANGES["steps"][1]
# The interval fields of a model that has none (hidden on the page).
UNUSED_INTERVAL = (0.0, 1.0)
# The heat maps: each patch drawn as a square of this many pixels.
MAP_PATCH_PIXELS = 8
# Pictures of 64 x 64 pixels are shown larger, as squares of pixels (not blurred), and the galleries
# as tall as their pictures.
SHOWN_SIZE = 256
PAGE_CSS = ("img { image-rendering: pixelated; } "
            ".picture img { width: 100%; height: 100%; object-fit: contain; } "
            ".gallery .grid-wrap.fixed-height { height: auto !important; min-height: 0 !important; "
            "max-height: none !important; } "
            ".look-for { font-size: 0.85em; opacity: 0.85; } "
            # The x0 strip's chosen step (explore_tutor.strip marks its caption).
            "#x0-steps .thumbnail-item:has(img[alt^='\u25b6']) { outline: 3px solid #f97316; } "
            # A link to code on the concepts page looks like a link, not only like code.
            ".docs-page a code { color: var(--link-text-color); text-decoration: underline; } "
            # A figure of the concepts page scales to the column, keeping the proportions its width and
            # height give it before it loads.
            ".docs-page img { max-width: 100%; height: auto; } "
            # The x0 strip's captions whole at ten pictures a row, the chosen step's with its t.
            "#x0-steps .caption-label { max-width: none; overflow: visible; text-overflow: clip; "
            "font-size: 0.75em; padding: 1px 3px; } "
            # The architecture's stages as a diagram: the text path (T5, the student's prefix, the text
            # embedder, the preamble) on the left, the image path (the state, the patch embed) on the
            # right, then the joint blocks, the final layer, x0 and the sampler's step across both.
            "#architecture .wrap { display: grid; grid-template-columns: 1fr 1fr; gap: 8px 16px; } "
            "#architecture .wrap > label { margin: 0; position: relative; } "
            + " ".join(f"#architecture .wrap > label:nth-child({n}) {{ grid-column: 1; grid-row: {n}; }}"
                       for n in range(1, 5))
            + " #architecture .wrap > label:nth-child(5) { grid-column: 2; grid-row: 1 / span 2; } "
            "#architecture .wrap > label:nth-child(6) { grid-column: 2; grid-row: 3 / span 2; } "
            "#architecture .wrap > label:nth-child(n+7) { grid-column: 1 / span 2; } "
            "#architecture .wrap > label:nth-child(n+2):not(:nth-child(5))::before { content: '\u2193'; "
            "position: absolute; top: -9px; left: 50%; font-size: 11px; line-height: 1; opacity: 0.6; } "
            "#architecture .wrap > label:nth-child(10) { border-style: dashed; } "
            "#architecture .wrap > label:nth-child(10)::after { content: '\u21ba to x_t'; margin-left: 0.5em; "
            "opacity: 0.6; }")
# Gradio draws a page after the browser has loaded it, so the browser's own jump to a link's #id
# finds nothing: jump when the heading appears (however long the page takes to draw), and again
# whenever the page's height changes (its maths and fonts arrive) until the reader scrolls. The
# figures keep their place before they load (their sizes are given, `figure_tag`), so nothing moves.
JUMP_TO_ANCHOR = """<script>
(() => {
  let reader = false;
  for (const kind of ["wheel", "keydown", "touchstart", "mousedown"]) {
    window.addEventListener(kind, () => { reader = true; }, {passive: true});
  }
  const jump = () => {
    let id = location.hash.slice(1);
    try { id = decodeURIComponent(id); } catch (malformed) {}
    const target = !reader && id && document.getElementById(id);
    if (target) target.scrollIntoView();
    return target;
  };
  const wait = (since) => {
    if (!jump() && !reader && Date.now() - since < 120000) setTimeout(() => wait(since), 200);
  };
  new ResizeObserver(jump).observe(document.documentElement);
  window.addEventListener("hashchange", () => { reader = false; wait(Date.now()); });
  wait(Date.now());
})();
</script>"""


def add_parser(sub) -> None:
    p = sub.add_parser("explore", help="a local web page showing the model's insides",
                       description="Serve a web page (Gradio) that generates a prompt and shows the clean-image "
                                   "prediction of every step, each word's attention map and the conditional and "
                                   "unconditional predictions. Without --model: the demo models. Needs the "
                                   "`explore` extra: pip install -e \".[explore]\".")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT})")
    add_model_arguments(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no notes on stderr")
    p.set_defaults(run=run_explore)


def run_explore(args) -> int:
    """Check the model given (headers only), then serve the page until interrupted."""
    pictures = pictures_folder(os.environ)
    try:
        with temporarily_set(TEMP_VARIABLE, str(pictures)):  # Gradio's folder while it serves (it reads it then)
            serve(args, pictures)
    finally:
        shutil.rmtree(pictures, ignore_errors=True)


def serve(args, pictures: Path) -> None:
    """Serve the page until interrupted, its pictures in the folder `pictures`."""
    gradio = import_gradio()
    check_port(args.host, args.port)
    models = Models(model_sources(args))
    page = build_page(gradio, models, default=next(iter(models.sources)), pictures=pictures)
    if not is_loopback(args.host):
        print(printable(f"minit2i explore: warning: --host {args.host} serves the page to other machines: anyone "
                        f"who reaches it can run prompts on this one (default {DEFAULT_HOST}: this machine only)"),
              file=sys.stderr, flush=True)
    page.queue(default_concurrency_limit=1).launch(prevent_thread_lock=True,
                                                    **launch_settings(gradio, args.host, args.port, pictures))
    emit(f"minit2i explore: http://{args.host}:{args.port}/ (Ctrl-C stops the server)")
    try:  # serve until Ctrl-C or SIGTERM, which `console.guarded` reports (Gradio's own wait would swallow them)
        threading.Event().wait()
    finally:
        page.close()


@contextlib.contextmanager
def temporarily_set(name: str, value: str):
    """The environment variable `name` set to `value` meanwhile, then as it was."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def import_gradio():
    """Gradio, with its usage analytics off (the page talks to this machine only)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    try:
        import gradio
    except ImportError:
        raise MiniT2IError('minit2i explore needs Gradio; install the extra: pip install -e ".[explore]"') from None
    return gradio


def check_port(host: str, port: int) -> None:
    """Refuse a port that is out of range or taken, or an address this machine cannot bind, in one line."""
    if not 1 <= port <= 65535:
        raise MiniT2IError(f"--port {port} is not a port; use one in 1..65535, e.g. --port {DEFAULT_PORT}")
    try:
        # create_server would say "Unknown error -2" of a name that does not resolve, after waiting
        # for a name server that does not answer for as long as the resolver retries, deaf to Ctrl-C
        addresses(host, port, LOOKUP_SECONDS)
        with socket.create_server((host, port)):
            pass
    except socket.gaierror as err:
        raise MiniT2IError(f"cannot serve on {host}:{port} ({err.strerror}); pass another --host") from None
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else err  # without the address, which the line names already
        raise MiniT2IError(f"cannot serve on {host}:{port} ({reason}); pass another --port or --host") from None


def launch_settings(gradio, host: str, port: int, pictures: Path) -> dict:
    """`Blocks.launch` arguments: no share link, no server-side rendering process, and the system's
    fonts instead of the default theme's web fonts, so nothing is fetched from the internet; every
    request checked by `page_guard.PageGuard` first (naming no file but the page's `pictures`), then
    /code/ answered from its allow-list (`code_pages`, made once: `served_code`); and the script
    that takes a link to its heading (JUMP_TO_ANCHOR)."""
    from starlette.middleware import Middleware

    local_fonts = gradio.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"],
                                        font_mono=["ui-monospace", "monospace"])
    return {"server_name": host, "server_port": port, "share": False, "ssr_mode": False, "quiet": True,
            "theme": local_fonts, "css": PAGE_CSS, "head": JUMP_TO_ANCHOR,
            "app_kwargs": {"middleware": [Middleware(PageGuard, loopback=is_loopback(host), pictures=pictures),
                                          Middleware(CodePages, served=served_code())]}}


def model_sources(args) -> dict[str, dict]:
    """{name shown on the page: `MiniT2IPipeline.open` arguments}, the one the page opens with first:
    the model given at start-up with --t5, --tokenizer, --variant and --jax-tree as `generate` takes
    them (checked now, from its headers, so a bad path or flag fails before the server starts),
    and the demo models."""
    sources = {name: {"pretrained_model_name_or_path": name} for name in DEMO_MODELS}
    flags = (args.model, args.t5, args.tokenizer, args.jax_tree)
    if flags == (None,) * 4 and args.variant == DEFAULT_VARIANT:
        first = next(iter(DEMO_MODELS))
        return {first: sources[first], **sources}
    model, t5 = model_paths(args)
    given = {"pretrained_model_name_or_path": model, "t5": t5, "tokenizer": args.tokenizer, "variant": args.variant,
             "jax_tree": args.jax_tree}
    MiniT2IPipeline.open(**given)
    return {str(model): given, **{name: source for name, source in sources.items() if name != str(model)}}


class Models:
    """The models the page offers, each opened once and loaded once per backend (a pipeline of the
    Python API each), kept as long as the server runs."""

    def __init__(self, sources: dict[str, dict]):
        self.sources = sources
        self._opened, self._pipelines = {}, {}
        self._lock = threading.Lock()  # the defaults of a model change can be asked during a run

    def files(self, name: str) -> ModelFiles:
        """The model's configs and headers (no tensor)."""
        if not isinstance(name, str) or name not in self.sources:
            raise MiniT2IError(f"unknown model {printable(repr(name), 100)}; choose one of {', '.join(self.sources)} "
                               "(another model: start minit2i explore --model PATH)")
        with self._lock:
            if name not in self._opened:
                self._opened[name] = MiniT2IPipeline.open(**self.sources[name]).files
            return self._opened[name]

    def pipeline(self, name: str, backend: str) -> MiniT2IPipeline:
        """The model on `backend`, its tensors read and its runner made on first use."""
        files = self.files(name)
        with self._lock:
            if (name, backend) not in self._pipelines:
                self._pipelines[name, backend] = MiniT2IPipeline(files, backend, PRECISION).load()
            return self._pipelines[name, backend]


def settings_for(models: Models, name: str) -> dict:
    """The page's defaults for a model: its steps, guidance, size and (a student's) interval, the
    middle step and the middle double block to look at."""
    files = models.files(name)
    defaults = sampling_defaults(files)
    return {"guidance_interval": UNUSED_INTERVAL, **defaults, "step": defaults["steps"] // 2 + FIRST,
            "block": files.mmjit.config.depth_double // 2 + FIRST, "student": is_student(files)}


def look(models: Models, name: str, backend: str, on_step, prompt: str, **settings):
    """A finished run on the cached model, looked at its `step` and `block` (numbered from 1)."""
    finished = sample_run(models, name, backend, PRECISION, on_step, prompt, **settings)
    kept = Kept(KEPT_RUNS.keep(finished), name, backend, 1)
    return look_again(models, kept, settings["step"], settings["block"])


def page_settings(models: Models, prompt, model_name, backend_name, seed, steps, guidance, t_min, t_max, width,
                  height, step, block) -> dict:
    """The generate endpoint's fields, in its order, as any client may send them (text, numbers,
    lists, null, NaN, ...) -> `sample_run`'s settings, after its own checks (`run_request`): a
    bad field is one line. A whole number may come as 6 or 6.0 (JSON does not tell them apart)."""
    settings = {"seed": whole(seed), "steps": whole(steps), "guidance_scale": guidance, "width": whole(width),
                "height": whole(height), "step": whole(step), "block": whole(block),
                "interval": (t_min, t_max) if is_student(models.files(model_name)) else None}
    run_request(models, model_name, backend_name, PRECISION, prompt, **settings)
    return settings


def whole(value):
    """A float that holds a whole number as that int (6.0 -> 6); anything else unchanged."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def slider_fit(steps, step) -> tuple[int, int | None] | None:
    """The step slider's (maximum, value) for the steps field's `steps` and the slider's `step`,
    as a client sent them (any JSON): None where `steps` is not a number of steps (checked as
    Generate checks it; Generate will say what is wrong with it), the value None (left as it is)
    where `step` is not a whole number in that range either."""
    steps, step = whole(steps), whole(step)
    if not STEPS_RANGE.contains(steps):
        return None
    return steps, min(step, steps) if STEPS_RANGE.contains(step) else None


class Stopped(Exception):
    """The page's request was cancelled, or its client left: its sampling stops."""


# One generation at a time, as the page's queue allows: a cancelled request's sampling ends with
# the step it is in, and the next request's waits for that.
ONE_AT_A_TIME = threading.Lock()


def stepwise(work):
    """Run `work(on_step)` in a thread of its own, one at a time (ONE_AT_A_TIME), yielding the
    `StepInfo` of each sampling step as it ends -> what `work` returned (`yield from`), or raise
    what it raised. Gradio closes the generator of a request that is cancelled or whose client
    left, at its next yield: the work then stops at its next step."""
    events, stop = queue.SimpleQueue(), threading.Event()

    def on_step(info):
        if stop.is_set():
            raise Stopped
        events.put(("step", info))

    def run():
        try:
            with ONE_AT_A_TIME:
                if stop.is_set():  # closed while it waited its turn
                    raise Stopped
                events.put(("done", work(on_step)))
        except BaseException as err:  # noqa: BLE001 (handed whole to the request's thread, which reports it)
            events.put(("failed", err))

    threading.Thread(target=run, name="minit2i explore generation", daemon=True).start()
    try:
        while True:
            kind, value = events.get()
            if kind == "failed":
                raise value
            if kind == "done":
                return value
            yield value
    finally:
        stop.set()


def error_status(err: Exception) -> str:
    """The status line for a request that failed: the project's one line for a bad request or a
    file problem; for anything else (a fault of this program) also one line on stderr, where
    the server was started, since nothing may escape to Gradio (its traceback, its bare "Error")."""
    if not isinstance(err, (MiniT2IError, OSError)):
        err = f"{type(err).__name__}: {err}"
        print(printable(f"minit2i explore: error: a request failed ({err})", LINE_LIMIT), file=sys.stderr, flush=True)
        err = f"the server failed on this request ({err}); the terminal that started it has the same line"
    return f"**error:** {printable(str(err), LINE_LIMIT)}"


def sampled(work, progress, steps: int, desc: str, idle: list):
    """`work(on_step)` run `stepwise`, moving `progress` and yielding `idle` (the page's outputs
    left as they are) after each of its `steps` -> what it returned (`yield from`)."""
    with contextlib.closing(stepwise(work)) as run:
        while True:
            try:
                info = next(run)
            except StopIteration as done:
                return done.value
            progress((info.index + 1, steps), desc=desc)
            yield idle


def heat_maps(attention: np.ndarray) -> list[np.ndarray]:
    """float [n_words, grid_h, grid_w] -> one uint8 [grid_h * p, grid_w * p, 3] picture per word, each
    patch a square of p = MAP_PATCH_PIXELS, all on one scale (0 black, the largest weight of any word
    white), brightness rising with the weight through red and yellow."""
    scaled = attention / max(float(attention.max()), np.finfo(np.float32).tiny)
    ramp = np.stack([np.clip(3 * scaled - offset, 0, 1) for offset in range(3)], axis=-1)  # black-red-yellow-white
    pixels = np.round(255 * ramp).astype(np.uint8)
    return [np.repeat(np.repeat(word, MAP_PATCH_PIXELS, axis=0), MAP_PATCH_PIXELS, axis=1) for word in pixels]


def word_captions(words: list[str], attention: np.ndarray) -> list[str]:
    """'red: 12%' per word: the share of the image patches' attention that goes to its tokens."""
    return [f"{word}: {100 * share:.1f}%" for word, share in zip(words, attention.mean(axis=(1, 2)))]


def build_page(gradio, models: Models, default: str, pictures: Path | None = None):
    """The page (a `gradio.Blocks`), not yet served; `default` is the model it opens with; the
    pictures Gradio writes to the folder `pictures` are kept within PICTURES_LIMIT bytes. Every
    event takes its fields as a client sent them (`preprocess=False`): the page checks them."""
    gr = gradio
    start = settings_for(models, default)
    with gr.Blocks(title="minit2i explore") as page:
        kept = gr.State(Kept(), time_to_live=KEPT_FOR_S)
        gr.Markdown("# minit2i explore\nGenerate a picture and look inside the model: the state, the clean-image "
                    "prediction and the velocity of every step, which image patches attend to each word, and "
                    f"what guidance changes. Every panel links the idea it shows on the [concepts page]"
                    f"({CONCEPTS_ROUTE}).")
        with gr.Row():
            with gr.Column(scale=1):
                prompt = gr.Textbox(label="prompt", value="a large red circle at the left on a gray background",
                                    elem_id="prompt")
                with gr.Row():
                    model = gr.Dropdown(list(models.sources), value=default, label="model", allow_custom_value=True,
                                        elem_id="model")
                    backend = gr.Dropdown(list(BACKENDS), value="numpy", label="backend", elem_id="backend")
                with gr.Row():
                    seed = gr.Number(1, label="seed", precision=0, elem_id="seed")
                    steps = gr.Number(start["steps"], label="steps", precision=0, elem_id="steps")
                    guidance = gr.Number(start["cfg_scale"], label="guidance", elem_id="guidance")
                with gr.Row(visible=start["student"]) as interval_row:
                    t_min = gr.Number(start["guidance_interval"][0], label="guidance interval: t_min")
                    t_max = gr.Number(start["guidance_interval"][1], label="t_max")
                with gr.Row():
                    width = gr.Number(start["width"], label="width", precision=0, elem_id="width")
                    height = gr.Number(start["height"], label="height", precision=0, elem_id="height")
                run = gr.Button("Generate", variant="primary", elem_id="generate")
                status = gr.Markdown("", elem_id="status")
                runs = gr.Markdown(Kept().runs_line(), elem_id="runs")
            with gr.Column(scale=1):
                image = gr.Image(label="image", format="png", interactive=False, height=SHOWN_SIZE,
                                 elem_id="image", elem_classes="picture")
                timings = gr.Textbox(label="timings", lines=8, interactive=False, elem_id="timings")
        gr.Markdown("## Step by step\nThe selectors look at the finished run again: moving them samples "
                    "nothing, it only runs the two forwards of the chosen step that the maps below need.")
        with gr.Row():
            # The time axis: a slider over the steps of the run (the page checks the value it sends, as
            # every field's, so a client's out-of-range step is the project's one line); clicking a
            # picture of the x0 strip moves it too.
            step = gr.Slider(FIRST, start["steps"], start["step"], step=1, scale=3, elem_id="step",
                             label="step (1 = first): drag it, or click a picture of the x0 strip")
            block = gr.Number(start["block"], label="double block (1 = first)", precision=0, elem_id="block")
        time = gr.Markdown("", elem_id="step-time")
        with gr.Row():
            panels = []
            for name, label in (("state", "the state x_t the step starts from"),
                                ("x0", "its clean-image prediction x0"),
                                ("velocity", velocity_label(start["student"]))):
                with gr.Column():
                    panels.append(gr.Image(label=label, format="png", interactive=False, height=SHOWN_SIZE,
                                           elem_id=f"step-{name}", elem_classes="picture"))
                    look = gr.Markdown(look_for(velocity_look_for(start["student"]) if name == "velocity" else name),
                                       elem_classes="look-for", elem_id=f"{name}-look")
            velocity_look = look  # the last column's: its line changes with the sampler (`velocity_look_for`)
        gr.Markdown("### The clean-image prediction at every step")
        x0_steps = gr.Gallery(label="x0 at every step (click one to look at its step)", format="png", columns=10,
                              elem_id="x0-steps", elem_classes="gallery", allow_preview=False)
        gr.Markdown(look_for("x0_steps"), elem_classes="look-for")
        gr.Markdown("## Which image patches look at each word\nAt the chosen step and double block: for every "
                    "patch, the attention its query pays to the word's tokens (mean over heads; black 0, white "
                    "the largest weight on the page). The caption is the word's share of all the patches' attention.")
        attention = gr.Gallery(label="attention of the image patches to each word", format="png", columns=6,
                               elem_id="attention", elem_classes="gallery")
        gr.Markdown(look_for("attention"), elem_classes="look-for")
        gr.Markdown(ATTENTION_SINKS, elem_id="sinks")
        gr.Markdown("## Guidance at the chosen step\nThe conditional prediction (with the prompt), the "
                    "unconditional one (an all-zero text mask) and the guided one the sampler used. A Mean Flow "
                    "student is guided inside the network: its two are made with guidance 1 (none).")
        with gr.Row():
            cond = gr.Image(label="conditional", format="png", interactive=False, height=SHOWN_SIZE,
                             elem_id="cond", elem_classes="picture")
            uncond = gr.Image(label="unconditional", format="png", interactive=False, height=SHOWN_SIZE,
                             elem_id="uncond", elem_classes="picture")
            guided = gr.Image(label="guided", format="png", interactive=False, height=SHOWN_SIZE,
                             elem_id="guided", elem_classes="picture")
        gr.Markdown(look_for("guidance"), elem_classes="look-for")
        gr.Markdown("## The model, stage by stage\nMM-JiT's data flow, drawn from the chosen model's config: each "
                    "stage with the shape of its output for one image of the run (a base model's sampler runs "
                    "each forward twice, with and without the prompt). Choose a stage to see its output at the "
                    "chosen step and double block; the line under it links the idea and the code.")
        with gr.Row(elem_id="architecture-view"):
            architecture = gr.Radio(stage_choices(models.files(default).mmjit.config, start["width"],
                                                  start["height"], start["steps"]),
                                    value=FIRST_SHOWN, label="MM-JiT, from prompt and noise to the next state",
                                    elem_id="architecture", scale=3)
            with gr.Column(scale=2):
                stage_image = gr.Image(label="the stage's output", format="png", interactive=False,
                                       height=SHOWN_SIZE, elem_id="stage-output", elem_classes="picture")
                stage_about = gr.Markdown(stage_links(FIRST_SHOWN), elem_id="stage-about")
        looked = [time, x0_steps, *panels, attention, cond, uncond, guided, stage_image, stage_about]

        def stage_shown(run_kept: Kept, insides, step_number, block_number, key):
            """(the stage's picture, the line under it) of stage `key` at the page's step and block."""
            config = models.files(run_kept.model).mmjit.config
            picture, caption = stage_output(checked_stage(key), insides, run_kept.run, config, step_number - FIRST,
                                            block_number - FIRST)
            return [picture, f"**{caption}** (step {step_number}, block {block_number}). {stage_links(key)}"]

        def shown(run_kept: Kept, insides, step_number, block_number, key):
            """The selectors' outputs (`looked`) for `insides` at the page's `step_number`."""
            return [time_line(models, run_kept, step_number), strip(insides.x0_steps, step_number, run_kept.run),
                    *step_pictures(run_kept.run, step_number - FIRST),
                    list(zip(heat_maps(insides.attention), word_captions(insides.words, insides.attention))),
                    insides.cond_x0, insides.uncond_x0, insides.x0_steps[step_number - FIRST],
                    *stage_shown(run_kept, insides, step_number, block_number, key)]

        def generate(prompt, model_name, backend_name, seed, steps, guidance, t_min, t_max, width, height, step,
                     block, stage, session,
                     progress=gr.Progress()):  # noqa: B008 (Gradio finds its progress bar by this default)
            """Nothing new on the page after each sampling step (the progress bar moves), then every panel."""
            try:
                if pictures is not None:
                    prune(pictures)
                settings = page_settings(models, prompt, model_name, backend_name, seed, steps, guidance, t_min,
                                         t_max, width, height, step, block)
                checked_stage(stage)
                finished = yield from sampled(
                    lambda on_step: sample_run(models, model_name, backend_name, PRECISION, on_step, prompt, **settings),
                    progress, settings["steps"], "sampling", [gr.skip()] * 18)
                session = Kept(KEPT_RUNS.keep(finished), model_name, backend_name, session.sampling_runs + 1)
                insides = look_again(models, session, settings["step"], settings["block"])
            except Exception as err:  # noqa: BLE001 (nothing may escape to Gradio: one line, error_status)
                yield [error_status(err)] + [gr.skip()] * 17
                return
            seed, step, block = settings["seed"], settings["step"], settings["block"]
            line, steps_strip, state, prediction, velocity, *maps = shown(session, insides, step, block, stage)
            student = settings["interval"] is not None
            request = finished.request
            yield [f"{model_name}, seed {seed}: done", insides.image,
                    MiniT2IPipelineOutput([insides.image], insides.result.timings, insides.result.step_times,
                                          backend_name, PRECISION, insides.result.blas_threads).timing_table(),
                    steps_strip, *maps, state, prediction,
                    gr.Image(velocity, label=velocity_label(student)), line, session, session.runs_line(),
                    gr.Radio(choices=stage_choices(models.files(model_name).mmjit.config, request.width,
                                                   request.height, request.steps)),
                    look_for(velocity_look_for(student))]

        def select(session, step, block, stage):
            step, block = whole(step), whole(block)
            # Nothing generated yet, or a step past the kept run's last, which the slider allows once
            # the steps field asks for a longer run: the numbers are for the next run.
            if session.run is None or (STEPS_RANGE.contains(step) and step > session.run.request.steps):
                return [gr.skip()] * 12
            try:
                insides = look_again(models, session, step, block)
                return [f"step {step}, block {block}: from the finished run",
                        *shown(session, insides, step, block, stage)]
            except Exception as err:  # noqa: BLE001 (nothing may escape to Gradio: one line, error_status)
                return [error_status(err)] + [gr.skip()] * 11

        def choose_stage(session, step, block, stage):
            """The chosen stage's output at the page's step and block (the kept run's), or, before any
            run, the line of links alone."""
            try:
                if session.run is None:
                    return [gr.skip(), gr.skip(), stage_links(checked_stage(stage))]
                step, block = whole(step), whole(block)
                insides = look_again(models, session, step, block)
                return [gr.skip(), *stage_shown(session, insides, step, block, stage)]
            except Exception as err:  # noqa: BLE001 (nothing may escape to Gradio: one line, error_status)
                return [error_status(err), gr.skip(), gr.skip()]

        def choose_model(model_name):
            try:
                chosen = settings_for(models, model_name)
                config = models.files(model_name).mmjit.config
            except Exception as err:  # noqa: BLE001 (nothing may escape to Gradio: one line, error_status)
                return [error_status(err)] + [gr.skip()] * 10
            return ["", chosen["steps"], chosen["cfg_scale"], gr.Row(visible=chosen["student"]),
                    *chosen["guidance_interval"], chosen["width"], chosen["height"], chosen["step"],
                    chosen["block"], gr.Radio(choices=stage_choices(config, chosen["width"], chosen["height"],
                                                                    chosen["steps"]))]

        run.click(generate, [prompt, model, backend, seed, steps, guidance, t_min, t_max, width, height, step, block,
                             architecture, kept],
                  [status, image, timings, x0_steps, attention, cond, uncond, guided, stage_image, stage_about,
                   *panels, time, kept, runs, architecture, velocity_look],
                  api_name="generate", preprocess=False)
        # always_last: a stage chosen while the last choice is still being answered (a loaded machine)
        # is answered after it, not dropped as Gradio's default ("once") drops it.
        architecture.change(choose_stage, [kept, step, block, architecture], [status, stage_image, stage_about],
                            api_name=False, preprocess=False, trigger_mode="always_last")

        def fit_step(steps, step):
            """The slider over the steps of the run to come (`slider_fit`)."""
            fit = slider_fit(steps, step)
            if fit is None:
                return gr.skip()
            maximum, value = fit
            return gr.Slider(maximum=maximum, value=gr.skip() if value is None else value)

        def pick_step(session, chosen):
            """The step of the strip's picture clicked, from the click's event data (checked:
            `picked_step`), or one line in the status."""
            if session.run is None:
                return [gr.skip()] * 2
            try:
                # The event's data as the client sent it: gr.SelectData would index it unchecked.
                return [gr.skip(), picked_step(chosen._data, session.run.request.steps)]
            except MiniT2IError as err:
                return [error_status(err), gr.skip()]

        # The class itself, not the string that postponed annotations make of it: Gradio finds its
        # event-data parameter by the annotation, and `gr` is not a name of this module.
        pick_step.__annotations__ = {"chosen": gr.EventData}

        step.change(select, [kept, step, block, architecture], [status, *looked], api_name=False, preprocess=False,
                    trigger_mode="always_last")
        block.blur(select, [kept, step, block, architecture], [status, *looked], api_name=False, preprocess=False)
        block.submit(select, [kept, step, block, architecture], [status, *looked], api_name=False, preprocess=False)
        x0_steps.select(pick_step, [kept], [status, step], api_name=False, preprocess=False)
        steps.change(fit_step, [steps, step], [step], api_name=False, preprocess=False)
        model.change(choose_model, [model], [status, steps, guidance, interval_row, t_min, t_max, width, height, step,
                                             block, architecture], api_name="defaults", preprocess=False)
        compare_section(gr, models, default, kept, runs, [prompt, model, backend, seed, steps, guidance, t_min, t_max,
                                                          width, height])
    # The concepts page, which every panel links, and the docs pages it links, each at its route.
    for shown_page in SHOWN_PAGES:
        title = docs_route(shown_page).replace("-", " ").capitalize()
        with page.route(title, f"/{docs_route(shown_page)}"):
            gr.Markdown(docs_markdown(shown_page), header_links=True,
                        elem_id="concepts" if shown_page == "concepts.md" else f"docs-{docs_route(shown_page)}",
                        elem_classes="docs-page",
                        latex_delimiters=[{"left": "$$", "right": "$$", "display": True},
                                          {"left": "$", "right": "$", "display": False}])
    return page


def compare_section(gr, models: Models, default: str, kept, runs, form: list) -> None:
    """Two settings of the form's prompt and seed side by side: the form's (left) and another model,
    steps and guidance (right), each its picture and its x0 at every step. Neither run is kept."""
    other = other_model(list(models.sources), default)
    right = settings_for(models, other)
    gr.Markdown("## Compare two settings\nThe same prompt and seed under two settings: the left side is the "
                "form above, the right side is chosen here (try guidance 0, 2 and 7, or the teacher's 20 steps "
                "against the student's 4).")
    with gr.Row():
        model = gr.Dropdown(list(models.sources), value=other, label="right side: model", allow_custom_value=True,
                            elem_id="compare-model")
        steps = gr.Number(right["steps"], label="steps", precision=0, elem_id="compare-steps")
        guidance = gr.Number(right["cfg_scale"], label="guidance", elem_id="compare-guidance")
    button = gr.Button("Compare", elem_id="compare")
    status = gr.Markdown("", elem_id="compare-status")
    sides = []
    with gr.Row():
        for side in ("a", "b"):
            with gr.Column():
                sides += [gr.Markdown("", elem_id=f"compare-{side}-label"),
                          gr.Image(label="image", format="png", interactive=False, height=SHOWN_SIZE,
                                   elem_id=f"compare-{side}", elem_classes="picture"),
                          gr.Gallery(label="x0 at every step", format="png", columns=5, elem_id=f"compare-{side}-steps",
                                     elem_classes="gallery")]
    gr.Markdown(look_for("compare"), elem_classes="look-for")

    def compare(prompt, model_a, backend_name, seed, steps_a, guidance_a, t_min, t_max, width, height, model_b,
                steps_b, guidance_b, session, progress=gr.Progress()):  # noqa: B008 (as generate's)
        """Nothing new on the page after each sampling step, then both sides (as generate)."""
        shown, sides = [], []
        try:
            seed, width, height = whole(seed), whole(width), whole(height)
            for name, steps, guidance in ((model_a, whole(steps_a), guidance_a), (model_b, whole(steps_b), guidance_b)):
                chosen = settings_for(models, name)
                interval = ((t_min, t_max) if name == model_a else chosen["guidance_interval"]) if chosen["student"] \
                    else None
                settings = {"seed": seed, "steps": steps, "guidance_scale": guidance, "width": width,
                            "height": height, "step": FIRST, "block": FIRST, "interval": interval}
                # Both sides are checked before either is sampled.
                run_request(models, name, backend_name, PRECISION, prompt, **settings)
                sides.append((name, steps, settings))
            for name, steps, settings in sides:
                finished = yield from sampled(
                    lambda on_step, name=name, settings=settings: sample_run(models, name, backend_name, PRECISION,
                                                                             on_step, prompt, **settings),
                    progress, steps, f"sampling {name}", [gr.skip()] * 9)
                session = Kept(session.key, session.model, session.backend, session.sampling_runs + 1)
                result = finished.result
                shown += [compare_label(name, finished.request, sum(result.step_times)), result.pixels[0],
                          [(x0, f"step {i + FIRST}") for i, x0 in enumerate(finished_x0_pixels(finished))]]
        except Exception as err:  # noqa: BLE001 (nothing may escape to Gradio: one line, error_status)
            yield [error_status(err)] + [gr.skip()] * 8
            return
        yield [f"seed {seed}: both done", *shown, session, session.runs_line()]

    def choose(model_name):
        try:
            chosen = settings_for(models, model_name)
        except Exception as err:  # noqa: BLE001 (nothing may escape to Gradio: one line, error_status)
            return [error_status(err), gr.skip(), gr.skip()]
        return ["", chosen["steps"], chosen["cfg_scale"]]

    button.click(compare, [*form, model, steps, guidance, kept], [status, *sides, kept, runs], api_name="compare",
                 preprocess=False)
    model.change(choose, [model], [status, steps, guidance], api_name=False, preprocess=False)

