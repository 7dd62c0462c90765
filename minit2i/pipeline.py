"""Prompt -> PNG, for any backend: tokenize, encode, sample, convert to pixels, time each stage.

A backend is a runner class with `encode(ids, mask)`, `sample(noise, context, mask, steps,
cfg_scale, a_min, callback)` and `to_host(array)`; `reference.pipeline.NumpyRunner` and
`accelerated.pipeline.CupyRunner` are the two; `CudasimRunner` is the CuPy one on cudasim (no GPU).
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reference.sampler import initial_noise

from .errors import MiniT2IError
from .images import to_pixels
from .tokenizer import PromptTokenizer
from .weights import LoadedWeights, find_t5_files, find_tokenizer_json, load_mmjit, load_t5

BACKENDS = {"numpy": ("reference.pipeline", "NumpyRunner"), "cupy": ("accelerated.pipeline", "CupyRunner"),
            "cudasim": ("accelerated.pipeline", "CudasimRunner")}


@dataclass
class Request:
    """One generation: `batch_count` images, image i from seed + i."""

    prompt: str
    steps: int = 100
    cfg_scale: float = 6.0
    width: int = 512
    height: int = 512
    seed: int = 0
    batch_count: int = 1
    a_min: float = 0.001


@dataclass
class Model:
    """Everything loaded from disk: checked weights of both networks and the tokenizer."""

    mmjit: LoadedWeights
    t5: LoadedWeights
    tokenizer: PromptTokenizer


@dataclass
class Result:
    pixels: np.ndarray  # uint8 [B, H, W, 3]
    images: np.ndarray  # float32 [B, 3, H, W], the sampler's final state
    timings: dict[str, float] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)


def load_model(model_path, t5_path, tokenizer_path=None, variant: str = "minit2i-b-16") -> Model:
    """Load and cross-check the MMJiT, the T5 (its width must match) and the tokenizer."""
    mmjit = load_mmjit(model_path, variant)
    t5 = load_t5(t5_path, expected_d_model=mmjit.config.txt_input_size)
    tokenizer = PromptTokenizer.from_file(
        find_tokenizer_json(find_t5_files(t5_path)[0], tokenizer_path), mmjit.config.prompt_length)
    if tokenizer.vocab_size > t5.config.vocab_size:
        raise MiniT2IError(
            f"{tokenizer.source} has {tokenizer.vocab_size} tokens but the T5 embedding has only "
            f"{t5.config.vocab_size} rows; use the tokenizer.json that belongs to this T5"
        )
    return Model(mmjit, t5, tokenizer)


def make_runner(model: Model, backend: str = "numpy", precision: str = "fp32"):
    """Instantiate a backend's runner (imported lazily: the cupy one needs CuPy and a GPU)."""
    if backend not in BACKENDS:
        raise MiniT2IError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    module_name, class_name = BACKENDS[backend]
    # Importing never needs CuPy; a runner without CuPy or a GPU raises the clear error itself.
    runner_class = getattr(importlib.import_module(module_name), class_name)
    return runner_class(model.mmjit, model.t5, precision)


def validate(request: Request, model: Model) -> None:
    """Reject bad requests before any expensive work, each with the fix in the message."""
    patch = model.mmjit.config.patch_size
    if request.steps < 1:
        raise MiniT2IError(f"--steps must be at least 1, got {request.steps}")
    if request.batch_count < 1:
        raise MiniT2IError(f"--batch-count must be at least 1, got {request.batch_count}")
    if not request.a_min > 0:
        raise MiniT2IError(f"--a-min must be positive, got {request.a_min}")
    if not np.isfinite(request.cfg_scale):
        raise MiniT2IError(f"--cfg-scale must be a finite number, got {request.cfg_scale}")
    for name, size in (("width", request.width), ("height", request.height)):
        if size < patch or size % patch:
            lower = max(patch, size // patch * patch)
            raise MiniT2IError(
                f"--{name} {size} is not a positive multiple of the patch size {patch}; "
                f"use e.g. {lower} or {lower + patch}"
            )
    if not request.prompt or not request.prompt.strip():
        raise MiniT2IError("the prompt is empty; pass some text with --prompt")


def generate(model: Model, runner, request: Request, on_step=None) -> Result:
    """Run one request end to end; `on_step(StepInfo)` is called after every sampler step."""
    validate(request, model)
    timings: dict[str, float] = {}
    step_times: list[float] = []
    start = time.perf_counter()
    ids, mask = model.tokenizer([request.prompt] * request.batch_count)
    timings["tokenize"] = time.perf_counter() - start

    mark = time.perf_counter()
    context = runner.encode(ids, mask)
    timings["t5"] = time.perf_counter() - mark

    channels = model.mmjit.config.in_channels
    noise = np.concatenate([initial_noise(request.seed + i, 1, channels, request.height, request.width)
                            for i in range(request.batch_count)])
    last = [time.perf_counter()]

    def callback(info):
        now = time.perf_counter()
        step_times.append(now - last[0])
        if on_step:
            on_step(info)
        last[0] = time.perf_counter()

    mark = time.perf_counter()
    images = runner.sample(noise, context, mask, request.steps, request.cfg_scale, request.a_min, callback)
    timings["sampling"] = time.perf_counter() - mark
    timings["total"] = time.perf_counter() - start
    return Result(to_pixels(images), images, timings, step_times)


def output_paths(output: Path, count: int) -> list[Path]:
    """`cat.png` for one image; `cat_0.png`, `cat_1.png`, ... for a batch."""
    if count == 1:
        return [output]
    return [output.with_name(f"{output.stem}_{i}{output.suffix}") for i in range(count)]
