"""`MiniT2IPipeline`: the model from Python, in the shape diffusers users know.

    from minit2i import MiniT2IPipeline
    pipe = MiniT2IPipeline.from_pretrained("demo")
    image = pipe("a large red circle at the left on a gray background", generator=1).images[0]
    image.save("circle.png")

`from_pretrained` takes what `minit2i generate --model` takes (a demo model's name, a Hub repo id
or a path, with `t5=`, `variant=`, `jax_tree=`, `tokenizer=`) and `backend=` and `precision=` as
`--backend` and `--precision`, and `threads=` as `--threads` (NumPy's BLAS threads; by default as
many as the size of the work pays for, `minit2i.core.threads`); it checks the backend, reads the configs and headers, then the
tensors, once. A call takes the keywords of diffusers' pipelines, each the twin of a flag:

    prompt (-p; or a list of prompts)     num_inference_steps (--steps)   guidance_scale (--cfg-scale)
    height, width (-H, -W)                num_images_per_prompt (-b)      generator (-s)
    guidance_interval (--guidance-interval, Mean Flow students)           a_min (--a-min)

and those the command line has no flag for: `output_type` ("pil": a list of PIL images, "np": a
uint8 array [N, H, W, 3]) and `callback_on_step_end`. Keywords left out take the model's own
recipe, as `generate` does. `minit2i generate` is a thin layer over this class: it turns its flags
into these keywords, calls the pipeline and writes the PNGs, so a seed gives the same pixels in
both, and a bad argument is the same `MiniT2IError` line (messages name the flag and, where it
differs, the keyword: `--steps (num_inference_steps) must be ...`). The arguments are checked
before any work: at the call, before sampling.

Seeds and generators. Image k of a call (the prompts in order, `num_images_per_prompt` images
each) starts from the noise of seed + k, as `generate -s SEED -b N` draws it, so that an image
does not depend on its batch. `generator` is that seed (an int; None: 42, the command line's
default), or a `numpy.random.Generator` from which each image's noise is drawn in turn exactly as
`initial_noise` draws from `default_rng(seed)`: `generator=np.random.default_rng(s)` gives image 0
the pixels of `generator=s` (the later images continue its stream), and a list of one Generator
per image, `[np.random.default_rng(s + k) for k in range(n)]`, gives the images of seed s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from minit2i.core.errors import MiniT2IError
from minit2i.core.images import to_pixels
from minit2i.core.mmjit_config import DEFAULT_VARIANT
from minit2i.core.threads import check_threads
from minit2i.reference.sampler import noise_from

from .pipeline import (
    ModelFiles,
    Request,
    check_arguments,
    check_backend,
    check_memory,
    generate,
    make_request,
    make_runner,
    open_model,
    option,
)

# The seed of a call without a generator, and of `minit2i generate` without -s.
DEFAULT_SEED = 42
OUTPUT_TYPES = ("pil", "np")
# A vocabulary this small is worth listing when a word is missing from it (the demo model's).
LISTED_VOCABULARY = 200


@dataclass
class MiniT2IPipelineOutput:
    """What a call returns: the images and how long each stage took (seconds)."""

    images: list | np.ndarray  # PIL images, or uint8 [N, H, W, 3] for output_type="np"
    timings: dict[str, float]  # tokenize, t5, sampling, total
    step_times: list[float]  # each sampler step
    backend: str
    precision: str
    blas_threads: int | None = None  # NumPy's BLAS threads during the call

    def timing_table(self) -> str:
        """Tokenize, T5, each step's forward, total: one aligned table, as `generate` prints it."""
        rows = [("tokenize", self.timings["tokenize"]), ("T5 encoder", self.timings["t5"])]
        steps = self.step_times
        if len(steps) <= 12:
            rows += [(f"step {i + 1}", t) for i, t in enumerate(steps)]
        else:
            rows += [(f"step {i + 1}", t) for i, t in enumerate(steps[:3])]
            rows += [(f"steps 4-{len(steps)} (mean)", sum(steps[3:]) / len(steps[3:]))]
        rows += [("sampling", self.timings["sampling"]), ("total", self.timings["total"])]
        width = max(len(name) for name, _ in rows)
        threads = "" if self.blas_threads is None else f", BLAS threads {self.blas_threads}"
        lines = [f"timings ({self.backend}, {self.precision}{threads}):"]
        lines += [f"  {name:<{width}}  {seconds * 1000:10.1f} ms" for name, seconds in rows]
        return "\n".join(lines)


class MiniT2IPipeline:
    """A MiniT2I model on one backend: `from_pretrained(...)`, then call it with a prompt.

    `files` are the checked configs and headers (`minit2i.pipeline.ModelFiles`); the tensors are
    read by `load` (`from_pretrained` does), else by the first call, after that call's checks.
    """

    def __init__(self, files: ModelFiles, backend: str = "numpy", precision: str = "fp32", threads: int | None = None):
        self.files, self.backend, self.precision = files, backend, precision
        self.threads = threads  # BLAS threads asked for; None: chosen per call from its size
        self.model = None  # minit2i.pipeline.Model once loaded
        self.runner = None
        self.progress_bar_config: dict = {}

    @classmethod
    def open(cls, pretrained_model_name_or_path, t5=None, *, variant: str = DEFAULT_VARIANT, backend: str = "numpy",
             precision: str = "fp32", tokenizer=None, jax_tree: str | None = None,
             threads: int | None = None) -> MiniT2IPipeline:
        """The pipeline with the model's configs and headers read and checked, no tensor yet."""
        threads = check_threads(threads)
        check_backend(backend, precision)
        files = open_model(pretrained_model_name_or_path, t5, tokenizer, variant, jax_tree)
        return cls(files, backend, precision, threads)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, t5=None, *, variant: str = DEFAULT_VARIANT,
                        backend: str = "numpy", precision: str = "fp32", tokenizer=None,
                        jax_tree: str | None = None, threads: int | None = None) -> MiniT2IPipeline:
        """`open`, then read the tensors of both networks and set up the backend."""
        return cls.open(pretrained_model_name_or_path, t5, variant=variant, backend=backend, precision=precision,
                        tokenizer=tokenizer, jax_tree=jax_tree, threads=threads).load()

    def load(self) -> MiniT2IPipeline:
        """Read the tensors (once) and make the backend's runner."""
        if self.model is None:
            self.model = self.files.load()
            self.runner = make_runner(self.model, self.backend, self.precision)
        return self

    def set_progress_bar_config(self, **options) -> None:
        """tqdm options of the sampling bar, as in diffusers (`disable=True` hides it)."""
        self.progress_bar_config = options

    def to_pixels(self, array) -> np.ndarray:
        """A state or x0 of `callback_on_step_end`, [B, 3, H, W] on the backend -> uint8 [B, H, W, 3] on the host."""
        return to_pixels(self.runner.to_host(array))

    def __call__(self, prompt, num_inference_steps: int | None = None, guidance_scale: float | None = None,
                 height: int | None = None, width: int | None = None, num_images_per_prompt: int = 1,
                 generator=None, output_type: str = "pil", callback_on_step_end=None,
                 guidance_interval: tuple[float, float] | None = None, a_min: float | None = None,
                 negative_prompt=None) -> MiniT2IPipelineOutput:
        """Draw `num_images_per_prompt` images of each prompt (module docstring: the keywords).

        `callback_on_step_end(pipe, step_index, timestep, callback_kwargs)` is called after each
        sampler step, as in diffusers: `timestep` is the step's time t (the sampler's own
        convention: from 0, noise, up for MiniT2I; from 1, noise, down for a Mean Flow student),
        `callback_kwargs` holds "latents", the state after the step, and "x0", the (guided)
        clean-image prediction of the step, both [N, 3, H, W] as the backend holds them (CuPy
        arrays on cupy; `pipe.to_pixels` makes host pixels of them). Its return value is not used:
        the sampler's state cannot be replaced.
        """
        given = check_call(prompt, num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
                           height=height, width=width, num_images_per_prompt=num_images_per_prompt,
                           generator=generator, guidance_interval=guidance_interval, a_min=a_min,
                           negative_prompt=negative_prompt)
        if output_type not in OUTPUT_TYPES:
            raise MiniT2IError(f"output_type must be one of {', '.join(map(repr, OUTPUT_TYPES))}, "
                               f"found {output_type!r}")
        if callback_on_step_end is not None and not callable(callback_on_step_end):
            raise MiniT2IError("callback_on_step_end must be a function (pipe, step_index, timestep, "
                               f"callback_kwargs), found {type(callback_on_step_end).__name__}")
        request = make_request(self.files, prompt, given)
        if self.backend == "numpy":  # a GPU backend's activations live in device memory
            check_memory(request, self.model or self.files)
        generators = generator_list(generator, request.count)
        self.load()
        # Only now, past every refusal, so that a refused run says its one error line and nothing else.
        for text in dict.fromkeys(request.prompts):
            note_prompt(self.files.tokenizer, text)
        result = self._run(request, generators, callback_on_step_end)
        images = result.pixels if output_type == "np" else [pil_image(pixels) for pixels in result.pixels]
        return MiniT2IPipelineOutput(images, result.timings, result.step_times, self.backend, self.precision,
                                     result.blas_threads)

    def _run(self, request: Request, generators, callback_on_step_end):
        """`minit2i.pipeline.generate` with a progress bar and the callback; its Result."""
        from tqdm import tqdm

        noise = None
        if generators is not None:
            shape = (1, self.model.mmjit.config.in_channels, request.height, request.width)
            noise = np.concatenate([noise_from(rng, *shape) for rng in generators])
        bar = tqdm(**{"total": request.steps, "desc": "sampling", "unit": "step", **self.progress_bar_config})

        def on_step(info):
            bar.update(1)
            if callback_on_step_end is not None:
                callback_on_step_end(self, info.index, info.t, {"latents": info.x, "x0": info.x0})

        try:
            return generate(self.model, self.runner, request, on_step, noise, self.threads)
        finally:
            bar.close()


def check_call(prompt, *, num_inference_steps=None, guidance_scale=None, height=None, width=None,
               num_images_per_prompt=1, generator=None, guidance_interval=None, a_min=None,
               negative_prompt=None) -> dict:
    """The checks of a call that need no model (`minit2i generate` runs them before opening one)
    -> the request fields given, by `Request` field name (the model's recipe fills the others)."""
    if negative_prompt:
        raise MiniT2IError("MiniT2I has no negative prompt: its unconditional branch is the prompt with an all-zero "
                           "text mask; drop --negative-prompt (negative_prompt)")
    fields = {"steps": num_inference_steps, "cfg_scale": guidance_scale, "height": height, "width": width,
              "batch_count": num_images_per_prompt, "a_min": a_min, "guidance_interval": guidance_interval,
              "seed": seed_of(generator)}
    return check_arguments(prompt, {name: value for name, value in fields.items() if value is not None})


def seed_of(generator):
    """The seed a `generator` argument names (None for numpy Generators: they draw the noise)."""
    if generator is None:
        return DEFAULT_SEED
    if isinstance(generator, np.random.Generator) or (
            isinstance(generator, list) and generator and all(isinstance(g, np.random.Generator) for g in generator)):
        return None
    if isinstance(generator, (int, np.integer)):  # a bool is refused by the seed's range check
        return generator if isinstance(generator, int) else int(generator)
    raise MiniT2IError(f"{option('seed')} must be an integer seed, a numpy.random.Generator or a list of them "
                       f"(one per image), found {type(generator).__name__}")


def generator_list(generator, count: int) -> list | None:
    """The numpy Generator of each of `count` images (one Generator: itself, in turn), or None for a seed."""
    if isinstance(generator, np.random.Generator):
        return [generator] * count
    if isinstance(generator, list):
        if len(generator) != count:
            raise MiniT2IError(f"generator is a list of {len(generator)} numpy Generators but the call makes "
                               f"{count} image(s) (prompts x num_images_per_prompt); give one per image")
        return generator
    return None


def pil_image(pixels: np.ndarray):
    """uint8 [H, W, 3] -> a PIL RGB image of the same pixels (what `generate` writes as PNG)."""
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(pixels))


def note_prompt(tokenizer, prompt: str) -> None:
    """The notes a prompt deserves, on the "minit2i" logger (the command line shows them on stderr;
    -q keeps the warning): words the model has never seen, and a prompt longer than the model reads."""
    notes = logging.getLogger("minit2i")
    unknown = tokenizer.unknown_words(prompt)
    if unknown:
        message = f"warning: the model does not know {', '.join(map(repr, unknown))}"
        if tokenizer.vocab_size <= LISTED_VOCABULARY:
            message += f"; it knows: {' '.join(tokenizer.known_words())}"
        notes.warning(message)
    pieces = tokenizer.count_pieces(prompt)
    if pieces > tokenizer.max_length - 1:
        notes.info(f"note: the prompt has {pieces} tokens; it is cut to {tokenizer.max_length - 1} + </s>")
