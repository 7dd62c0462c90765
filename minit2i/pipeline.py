"""Prompt -> PNG, for any backend: tokenize, encode, sample, convert to pixels, time each stage.

A backend is a runner class with `encode(ids, mask)`, `sample(noise, context, mask, steps,
cfg_scale, a_min, callback)` and `to_host(array)`; `reference.pipeline.NumpyRunner` and
`accelerated.pipeline.CupyRunner` are the two; `CudasimRunner` is the CuPy one on cudasim (no GPU).

`MiniT2IPipeline` (api.py) is the way in from Python and from `minit2i generate`; it calls
`open_model`, `make_request`, `check_memory` and `generate` below.

Cheap checks come first, so a bad request fails in milliseconds: `Request` checks its own
fields, `open_model` resolves Hub repo ids (cached, else downloaded) and reads configs and
safetensors headers (no tensors), `validate` and `check_memory` judge the request against
them, and only then `ModelFiles.load` reads weights.
"""

from __future__ import annotations

import importlib
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minit2i.core.checkpoint import Checkpoint
from minit2i.core.checks import Range, check_prompt, human_size, read_json_object, shown
from minit2i.core.errors import MiniT2IError
from minit2i.core.images import to_pixels
from minit2i.core.mean_flow_config import MEAN_FLOW_RECIPE, MeanFlowConfig
from minit2i.core.mmjit_config import BASE_RECIPE, DEFAULT_VARIANT
from minit2i.core.threads import block_product_flops, blas_threads, chosen_threads, current_blas_threads
from minit2i.core.tokenizer import PromptTokenizer
from minit2i.core.weights import LoadedWeights
from minit2i.reference.sampler import DEFAULT_A_MIN, initial_noise

from .model_files import find_tokenizer_json, inspect_mmjit, inspect_t5
from .repo_ids import resolve_model, resolve_t5

BACKENDS = {"numpy": ("minit2i.reference.pipeline", "NumpyRunner"), "cupy": ("minit2i.accelerated.pipeline", "CupyRunner"),
            "cudasim": ("minit2i.accelerated.pipeline", "CudasimRunner")}

# What a request may ask for, whatever the model (size limits that depend on it are in
# `validate`, memory in `check_memory`). The caps keep a typo from running for days.
REQUEST_RANGES = {
    "steps": ("--steps", Range(1, 10_000)),
    "cfg_scale": ("--cfg-scale", Range(-1000, 1000, integer=False)),
    "width": ("--width", Range(1, 16384)),
    "height": ("--height", Range(1, 16384)),
    "seed": ("--seed", Range(0, 2**63 - 1)),
    "batch_count": ("--batch-count", Range(1, 10_000)),
    "a_min": ("--a-min", Range(0, 1, integer=False, low_open=True)),
}
# The Python keyword of `MiniT2IPipeline.__call__` (minit2i/api.py) for each request field whose
# flag has another name: one message then serves both, "--steps (num_inference_steps) must be ...".
KEYWORDS = {"steps": "num_inference_steps", "cfg_scale": "guidance_scale", "seed": "generator",
            "batch_count": "num_images_per_prompt"}
# A guidance interval end is a time of the student's sampler, in [0, 1] (model.md 9.4).
INTERVAL_END = Range(0, 1, integer=False)
# omega enters the student as 1 - 1/omega: 1 is "no guidance", and below 1 the input leaves the
# range it was trained on (1 <= omega <= 13) towards a pole at 0.
STUDENT_CFG_SCALE = Range(1, 1000, integer=False)


def check_guidance_interval(interval, name: str = "--guidance-interval") -> tuple[float, float]:
    """(t_min, t_max), both in [0, 1] with t_min <= t_max, as --guidance-interval gives them."""
    if not (isinstance(interval, (list, tuple)) and len(interval) == 2):
        raise MiniT2IError(f"{name} must be two numbers t_min t_max in [0, 1], found {shown(interval)}; "
                           "e.g. 0.2 0.8")
    t_min, t_max = (plain(INTERVAL_END.check(name, value)) for value in interval)
    if t_min > t_max:
        raise MiniT2IError(f"{name} {t_min} {t_max} is empty: give the smaller end first, e.g. {t_max} {t_min}")
    return t_min, t_max


def plain(value):
    """A NumPy scalar (np.int64(2) steps, from an array) as the Python number it holds; anything
    else unchanged (the range checks judge it)."""
    return value.item() if isinstance(value, np.generic) else value


def option(name: str) -> str:
    """How a message names request field `name`: its flag, and its Python keyword where that differs."""
    flag = REQUEST_RANGES[name][0]
    return f"{flag} ({KEYWORDS[name]})" if name in KEYWORDS else flag


def check_ranges(**fields) -> None:
    """Range-check request fields by name; the CLI calls it with the arguments given, so that a
    bad one is refused before any model is opened (the model supplies the others' defaults)."""
    for name, value in fields.items():
        REQUEST_RANGES[name][1].check(option(name), value)


def check_prompts(prompt) -> list[str]:
    """One prompt (a string) or a non-empty list of them, each checked -> the list."""
    if isinstance(prompt, (list, tuple)):
        if not prompt:
            raise MiniT2IError("the list of prompts is empty; pass a prompt or a list of them")
        return [check_prompt(text) for text in prompt]
    return [check_prompt(prompt)]


def check_arguments(prompt, given: dict) -> dict:
    """The cheap checks of a request before any model is opened: the prompt(s) and the request
    fields the user set (`given`, by field name; the model supplies the others) -> `given`, with
    a guidance interval as a tuple."""
    check_prompts(prompt)
    check_ranges(**{name: value for name, value in given.items() if name != "guidance_interval"})
    if "guidance_interval" in given:
        return given | {"guidance_interval": check_guidance_interval(given["guidance_interval"])}
    return given


@dataclass
class Request:
    """One generation: `batch_count` images of each prompt, image i of them all from seed + i."""

    prompt: str | list[str]  # a list: its prompts in order, `batch_count` images each
    steps: int = BASE_RECIPE["steps"]
    cfg_scale: float = BASE_RECIPE["cfg_scale"]
    width: int = 512
    height: int = 512
    seed: int = 0
    batch_count: int = 1
    a_min: float = DEFAULT_A_MIN
    guidance_interval: tuple[float, float] | None = None  # (t_min, t_max): Mean Flow students only

    def __post_init__(self):
        check_prompts(self.prompt)
        for name in REQUEST_RANGES:
            setattr(self, name, plain(getattr(self, name)))
        check_ranges(**{name: getattr(self, name) for name in REQUEST_RANGES})
        if self.guidance_interval is not None:
            self.guidance_interval = check_guidance_interval(self.guidance_interval)
        # image i uses seed + i, which must stay a valid seed too
        REQUEST_RANGES["seed"][1].check(f"the last image's seed, {option('seed')} + images - 1",
                                        self.seed + self.count - 1)

    @property
    def prompts(self) -> list[str]:
        """The prompt of each image, in order."""
        return [text for text in check_prompts(self.prompt) for _ in range(self.batch_count)]

    @property
    def count(self) -> int:
        """How many images the request makes."""
        return len(self.prompts)


@dataclass
class Model:
    """Everything loaded from disk: checked weights of both networks and the tokenizer."""

    mmjit: LoadedWeights
    t5: LoadedWeights
    tokenizer: PromptTokenizer
    sampling: dict = field(default_factory=dict)  # the config.json "sampling" block, if any


@dataclass
class Result:
    pixels: np.ndarray  # uint8 [B, H, W, 3]
    images: np.ndarray  # float32 [B, 3, H, W], the sampler's final state
    timings: dict[str, float] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    blas_threads: int | None = None  # NumPy's BLAS threads during the run (None: no BLAS library found)


@dataclass
class ModelFiles:
    """Both checkpoints checked from their headers, and the tokenizer: a model without tensors."""

    mmjit: Checkpoint
    t5: Checkpoint
    tokenizer: PromptTokenizer
    sampling: dict = field(default_factory=dict)  # the config.json "sampling" block, if any

    def load(self) -> Model:
        """Read the tensors of both networks (the expensive part)."""
        return Model(self.mmjit.load(), self.t5.load(), self.tokenizer, self.sampling)


def open_model(model, t5=None, tokenizer_path=None, variant: str = DEFAULT_VARIANT,
               jax_tree: str | None = None) -> ModelFiles:
    """Find and cross-check the MMJiT, the T5 (its width must match) and the tokenizer (its ids
    must fit the T5 embedding), reading configs and headers only.

    `model` and `t5` are paths or Hub repo ids (`minit2i.hub`: cached, else downloaded, a wrong T5
    refused from its header first); `model` may also name a demo model (`demo`, `demo-mf`: its
    T5 unless `t5` is given). Without `t5`, the encoder the transformer's config.json names
    (`llm`, google/flan-t5-large) is used. `jax_tree` chooses the parameter tree of a JAX (Orbax)
    checkpoint (`--jax-tree`; by default the official one).
    """
    from .demo_models import demo_model

    demo = demo_model(model)
    if demo is not None:  # "demo", "demo-mf": the folders shipped in the package
        model, t5 = demo[0], t5 if t5 is not None else demo[1]
    mmjit = inspect_mmjit(resolve_model(model, variant, jax_tree), variant, jax_tree)
    t5 = t5 if t5 is not None else mmjit.text_encoder
    if demo_model(t5) is not None:  # a demo model's name: its T5 (what `convert` writes as a demo's llm)
        t5 = demo_model(t5)[1]
    if t5 is None:
        raise MiniT2IError(
            f"--t5 is missing, and {model} has no config.json naming its text encoder ('llm'); "
            "pass --t5 (google/flan-t5-large, or a path to it)"
        )
    width = mmjit.config.txt_input_size
    encoder = inspect_t5(resolve_t5(t5, width), expected_d_model=width)
    tokenizer = PromptTokenizer.from_file(find_tokenizer_json(encoder.files, tokenizer_path),
                                          mmjit.config.prompt_length)
    if tokenizer.max_id >= encoder.config.vocab_size:
        raise MiniT2IError(
            f"{tokenizer.source} has token ids up to {tokenizer.max_id} but the T5 embedding has only "
            f"{encoder.config.vocab_size} rows (ids 0..{encoder.config.vocab_size - 1}); use the "
            "tokenizer.json that belongs to this T5"
        )
    return ModelFiles(mmjit, encoder, tokenizer, read_sampling(mmjit.config_source))


def load_model(model, t5=None, tokenizer_path=None, variant: str = DEFAULT_VARIANT,
               jax_tree: str | None = None) -> Model:
    """`open_model`, then read the tensors."""
    return open_model(model, t5, tokenizer_path, variant, jax_tree).load()


def make_request(model: Model | ModelFiles, prompt, given: dict) -> Request:
    """The request for `prompt` with the fields the user set (`given`, checked by `check_arguments`)
    and the model's defaults for the others, judged against the model (`validate`)."""
    request = Request(prompt, **(sampling_defaults(model) | given))
    validate(request, model, given)
    return request


def read_sampling(config_source: str) -> dict:
    """The "sampling" block of a transformer config.json, {"steps": int, "cfg_scale": float} and for
    a Mean Flow student "guidance_interval": [t_min, t_max]: the settings the model was tuned for.
    The demo models have one; released MiniT2I configs do not."""
    path = Path(config_source)
    if not path.is_file():  # the config was inferred from tensor shapes
        return {}
    block = read_json_object(path, "config").get("sampling", {})
    if not isinstance(block, dict):
        raise MiniT2IError(f"{path}: sampling must be an object with steps and cfg_scale; fix or delete it")
    found = {name: REQUEST_RANGES[name][1].check(f"{path}: sampling.{name}", block[name])
             for name in ("steps", "cfg_scale") if name in block}
    if "guidance_interval" in block:
        found["guidance_interval"] = check_guidance_interval(block["guidance_interval"],
                                                             f"{path}: sampling.guidance_interval")
    return found


def is_student(model: Model | ModelFiles) -> bool:
    """Whether the denoiser is a Mean Flow student (guidance and step length are its inputs)."""
    return isinstance(model.mmjit.config, MeanFlowConfig)


def sampling_defaults(model: Model | ModelFiles) -> dict:
    """Request settings for a model when the user gives none: its training image size, and the
    steps and guidance of its config's "sampling" block, else the official recipe (MiniT2I: 100
    steps, 6.0; the Mean Flow student: 4 steps, 12.0, guidance interval 0.2-0.8)."""
    return recipe(model.mmjit.config, model.sampling)


def recipe(config, sampling: dict) -> dict:
    """`sampling_defaults` from a denoiser's config and its config.json "sampling" block."""
    size = config.image_size
    official = MEAN_FLOW_RECIPE if isinstance(config, MeanFlowConfig) else BASE_RECIPE
    return {**official, "width": size, "height": size, **sampling}


def describe_recipe(checkpoint: Checkpoint) -> str:
    """One line for `info`: which sampler a denoiser runs and its defaults."""
    settings = recipe(checkpoint.config, read_sampling(checkpoint.config_source))
    size = f"{settings['width']}x{settings['height']}"
    if isinstance(checkpoint.config, MeanFlowConfig):
        t_min, t_max = settings["guidance_interval"]
        return (f"Mean Flow, one forward per step: {settings['steps']} steps, guidance {settings['cfg_scale']} "
                f"(a network input) in the interval {t_min}-{t_max}, {size}")
    return f"Euler x0 -> v, cond + uncond per step: {settings['steps']} steps, guidance {settings['cfg_scale']}, {size}"


def make_runner(model: Model, backend: str = "numpy", precision: str = "fp32"):
    """Instantiate a backend's runner (imported lazily: the cupy one needs CuPy and a GPU), after
    the same checks as `check_backend`."""
    check_backend(backend, precision)
    module_name, class_name = BACKENDS[backend]
    runner_class = getattr(importlib.import_module(module_name), class_name)
    return runner_class(model.mmjit, model.t5, precision)


def check_backend(backend: str, precision: str) -> None:
    """The cheap part of `make_runner`, before any model work: a known backend, a precision it
    runs, for cupy a usable GPU, for cudasim a compiler and a processor it runs on."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        name = repr(backend) if isinstance(backend, str) else shown(backend)
        raise MiniT2IError(f"unknown backend {name}; choose one of {', '.join(BACKENDS)}")
    module = importlib.import_module(BACKENDS[backend][0])
    if not isinstance(precision, str) or precision not in module.PRECISIONS:
        raise MiniT2IError(f"the {backend} backend runs {', '.join(module.PRECISIONS)}, not {precision}")
    if backend == "cupy":
        from minit2i.accelerated.kernels import require_gpu

        require_gpu()
    if backend == "cudasim" and not (shutil.which("g++") and sys.platform == "linux" and platform.machine() == "x86_64"):
        raise MiniT2IError("the cudasim backend compiles the CUDA kernels with g++ and runs them on x86-64 Linux; "
                           "install g++ (apt install g++) on such a machine, or use --backend numpy")


def validate(request: Request, model: Model | ModelFiles, given=("width", "height")) -> None:
    """Reject a request the model cannot run (only its configs are read), with the fix; a size
    not in `given` came from the model's config and is blamed on it, not on a flag."""
    student = is_student(model)
    if student and "a_min" in given:
        raise MiniT2IError("--a-min is the floor of the base sampler's 1 - t; the Mean Flow sampler clips its t at "
                           "0.05 as the official one does; drop --a-min")
    if not student and request.guidance_interval is not None:
        raise MiniT2IError("--guidance-interval is an input of Mean Flow students (MiniT2I-B-16-MF); this model "
                           "guides at every step; drop --guidance-interval")
    if student:
        STUDENT_CFG_SCALE.check(f"{option('cfg_scale')} for a Mean Flow student (omega, 1 = no guidance)",
                                request.cfg_scale)
    patch = model.mmjit.config.patch_size
    for name, size in (("width", request.width), ("height", request.height)):
        if size < patch or size % patch:
            lower = max(patch, size // patch * patch)
            found = f"--{name} {size}" if name in given else f"the model's default {name} {size} (its image_size)"
            raise MiniT2IError(f"{found} is not a positive multiple of the patch size {patch}; "
                               f"use e.g. --{name} {lower} or {lower + patch}")


def forward_size(request: Request, model: Model | ModelFiles) -> tuple[int, int]:
    """(rows, tokens) of the request's MMJiT forwards: [cond ; uncond] for the whole batch at once
    (a Mean Flow student: one row an image) over the image and text tokens (a student's
    auxiliary prefix among the text tokens)."""
    m = model.mmjit.config
    student = is_student(model)
    rows = request.count if student else 2 * request.count
    text = m.prompt_length + (m.num_aux_tokens if student else 0)
    return rows, (request.width // m.patch_size) * (request.height // m.patch_size) + text


def run_threads(request: Request, model: Model | ModelFiles, threads: int | None = None) -> int | None:
    """The BLAS threads the request runs on (`minit2i.core.threads.chosen_threads`): `threads` if
    given, else chosen from the size of its forwards' largest product (None: a *_NUM_THREADS
    variable of the user's decides)."""
    return chosen_threads(threads, block_product_flops(model.mmjit.config, *forward_size(request, model)))


def estimate_memory(request: Request, model: Model | ModelFiles, itemsize: int = 4) -> int:
    """Bytes of host memory a NumPy run needs: float32 weights (unless `model` holds them already,
    a loaded `Model`) plus the largest MMJiT forward.

    The forward runs `forward_size` rows of N image + text tokens; its peak is the attention scores [rows, heads, N, N] (with the softmax temporaries, ~3 copies)
    next to the MLP and qkv activations. An estimate, within a small factor: enough to refuse
    a run that cannot fit instead of failing minutes in with MemoryError.
    """
    m, t = model.mmjit.config, model.t5.config
    rows, tokens = forward_size(request, model)
    attention = 3 * rows * m.num_heads * tokens * tokens
    activations = 4 * rows * tokens * (3 * m.hidden_size + 2 * m.mlp_hidden)
    t5 = 3 * request.count * t.num_heads * m.prompt_length ** 2
    loaded = isinstance(model, Model)  # its weights are in memory already
    weights = 0 if loaded else 4 * (model.mmjit.num_parameters + model.t5.num_parameters)
    return weights + itemsize * (max(attention + activations, t5))


def available_memory() -> int | None:
    """Bytes the OS says a new allocation can get (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(request: Request, model: Model | ModelFiles, itemsize: int = 4) -> None:
    """Refuse a run whose estimated memory exceeds what the machine has available."""
    need, have = estimate_memory(request, model, itemsize), available_memory()
    if have is not None and need > have:
        raise MiniT2IError(
            f"this run needs about {human_size(need, binary=True)} of memory ({request.count} image(s) "
            f"of {request.width}x{request.height}) but {human_size(have, binary=True)} is available; use a smaller "
            f"--width/--height or {option('batch_count')}"
        )


def all_finite(array) -> bool:
    """Whether every value is finite, reduced where the array lives (NumPy, CuPy or cudasim's
    stand-in), so that one boolean crosses to the host each step, not the whole state.
    NaN < inf is False, so the comparison catches NaN as well as Inf."""
    return bool((abs(array) < np.inf).all())


def generate(model: Model, runner, request: Request, on_step=None, noise: np.ndarray | None = None,
             threads: int | None = None) -> Result:
    """Run one request end to end; `on_step(StepInfo)` is called after every sampler step.
    `noise` float32 [request.count, C, H, W] is the starting state; by default `seeded_noise`.
    NumPy's matrix products run on `threads` BLAS threads, by default as many as the size of the
    work pays for (`run_threads`); the Result says how many.

    A state with NaN or Inf values stops the run at the step that produced it. NumPy's overflow
    warnings are silenced meanwhile: that one error says it better than a screen of warnings.
    """
    validate(request, model)
    if noise is None:
        noise = seeded_noise(request, model.mmjit.config.in_channels)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"), \
            blas_threads(run_threads(request, model, threads)):
        result = _generate(model, runner, request, on_step, noise)
        result.blas_threads = current_blas_threads()
        return result


def seeded_noise(request: Request, channels: int) -> np.ndarray:
    """float32 [request.count, C, H, W]: image i's noise from seed + i, so that an image does not
    depend on the batch it is part of."""
    return np.concatenate([initial_noise(request.seed + i, 1, channels, request.height, request.width)
                           for i in range(request.count)])


def _generate(model: Model, runner, request: Request, on_step, noise: np.ndarray) -> Result:
    timings: dict[str, float] = {}
    step_times: list[float] = []
    start = time.perf_counter()
    ids, mask = model.tokenizer(request.prompts)
    timings["tokenize"] = time.perf_counter() - start

    mark = time.perf_counter()
    context = encode_distinct(runner, ids, mask)
    timings["t5"] = time.perf_counter() - mark

    last = [time.perf_counter()]

    def callback(info):
        if not all_finite(info.x):
            raise MiniT2IError(
                f"the image became NaN or Inf at sampling step {info.index + 1} of {request.steps}; "
                "lower --cfg-scale, or check the weights"
            )
        now = time.perf_counter()
        step_times.append(now - last[0])
        if on_step:
            on_step(info)
        last[0] = time.perf_counter()

    mark = time.perf_counter()
    if is_student(model):
        images = runner.sample_mean_flow(noise, context, mask, request.steps, request.cfg_scale,
                                         request.guidance_interval, callback)
    else:
        images = runner.sample(noise, context, mask, request.steps, request.cfg_scale, request.a_min, callback)
    timings["sampling"] = time.perf_counter() - mark
    timings["total"] = time.perf_counter() - start
    return Result(to_pixels(images), images, timings, step_times)


def encode_distinct(runner, ids: np.ndarray, mask: np.ndarray):
    """T5 once per distinct prompt: ids, mask [B, L] -> the runner's context [B, L, Dc], row i the
    encoding of prompt i.

    A request of n images a prompt, or a batch run's group holding one prompt's several seeds
    (GenEval's four), repeats rows that T5 would encode again for nothing: the encoder runs on
    the distinct rows, in the order they first appear, and the context gathers them back. On NumPy
    a row's encoding does not depend on the rows beside it (matmul runs a stack one matrix at a
    time), so the context is the one all B rows would give, byte for byte; on the twin the group
    decides the bits, as it does for the transformer (docs/evaluation.md).
    """
    first_of: dict[bytes, int] = {}
    which = [first_of.setdefault(ids[i].tobytes() + mask[i].tobytes(), len(first_of)) for i in range(len(ids))]
    if len(first_of) == len(which):
        return runner.encode(ids, mask)
    firsts = [which.index(j) for j in range(len(first_of))]
    # A list of row numbers indexes NumPy, CuPy (which uploads it) and cudasim's stand-in alike.
    return runner.encode(ids[firsts], mask[firsts])[which]


def output_paths(output: Path, count: int) -> list[Path]:
    """`cat.png` for one image; `cat_0.png`, `cat_1.png`, ... for a batch."""
    if count == 1:
        return [output]
    return [output.with_name(f"{output.stem}_{i}{output.suffix}") for i in range(count)]
