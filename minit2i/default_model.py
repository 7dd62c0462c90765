"""The built-in tiny default model: seeded random weights in the real key layout.

It lets a fresh machine run `minit2i generate` in seconds without downloads. It is generated
on first use into a cache folder, laid out exactly like the real files, so the same loader,
tokenizer and checks run on it:

    <cache>/default-model-v1/transformer/{config.json, diffusion_pytorch_model.safetensors}
    <cache>/default-model-v1/t5/{config.json, model.safetensors, tokenizer.json}

The cache is $MINIT2I_CACHE, else $XDG_CACHE_HOME/minit2i, else ~/.cache/minit2i.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from .config import MMJIT_TINY, T5_TINY, MMJiTConfig, T5Config, to_json
from .tokenizer import make_t5_style_tokenizer
from .weights import mmjit_expected_shapes, t5_expected_shapes

VERSION = "default-model-v1"
DEFAULT_MMJIT = dataclasses.replace(MMJIT_TINY, image_size=512, prompt_length=256)
DEFAULT_T5 = T5_TINY
WEIGHT_SEED = 20260101

# A small English vocabulary so prompts tokenize into words, not only characters.
WORDS = (
    "a an the of in on at with and or to from by for is are under over near behind big small red "
    "green blue yellow black white orange purple pink brown gray golden silver bright dark cat dog "
    "bird fish horse cow tree flower forest mountain river lake sea ocean beach sky cloud sun moon "
    "star city street house car boat train bridge tower castle garden field road snow rain night "
    "day morning sunset portrait photo painting drawing sketch of style old young man woman child "
    "people face hand eye hat cup table chair book window door wall floor room light shadow fire "
    "water stone wood glass metal paper apple banana cake bread coffee tea robot dragon astronaut "
    "wearing holding sitting standing running flying walking looking detailed realistic cute "
    "beautiful futuristic ancient cinematic colorful watercolor oil digital art 3d render high "
    "quality"
).split()


def cache_root() -> Path:
    if os.environ.get("MINIT2I_CACHE"):
        return Path(os.environ["MINIT2I_CACHE"]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "minit2i"


def default_model_dir() -> tuple[Path, bool]:
    """(folder of the default model, whether it was created just now)."""
    target = cache_root() / VERSION
    if (target / "t5" / "tokenizer.json").is_file():
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{VERSION}.", dir=target.parent))
    try:
        write_model(staging / "transformer", staging / "t5", DEFAULT_MMJIT, DEFAULT_T5, WEIGHT_SEED)
        try:
            staging.rename(target)
        except OSError:  # another process created it first; theirs is identical
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target, True


def random_mmjit_weights(config: MMJiTConfig, seed: int) -> dict[str, np.ndarray]:
    """Seeded weights for every live MMJiT tensor (stripped names, float32)."""
    return _random_weights(mmjit_expected_shapes(config), seed)


def random_t5_weights(config: T5Config, seed: int) -> dict[str, np.ndarray]:
    """Seeded weights for every T5 encoder tensor (HF names, float32)."""
    return _random_weights(t5_expected_shapes(config), seed)


def _random_weights(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Linear/conv weights ~ N(0, 1/fan_in); norm weights ~ 1 + N(0, 0.1^2) so that a wrong
    norm (or a forgotten weight) changes the output; biases and tokens ~ N(0, 0.1^2)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in sorted(shapes.items()):
        if "norm" in name:
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("bias") or name == "mask_token":
            value = 0.1 * rng.standard_normal(shape)
        elif name.endswith("relative_attention_bias.weight") or name == "shared.weight":
            value = rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        tensors[name] = value.astype(np.float32)
    return tensors


def write_model(transformer_dir: Path, t5_dir: Path, mmjit: MMJiTConfig, t5: T5Config, seed: int,
                prefix: str = "model.net.") -> None:
    """Write a complete model (diffusers transformer folder + T5 folder with tokenizer.json)."""
    transformer_dir.mkdir(parents=True)
    t5_dir.mkdir(parents=True)
    weights = {prefix + k: v for k, v in random_mmjit_weights(mmjit, seed).items()}
    save_file(weights, str(transformer_dir / "diffusion_pytorch_model.safetensors"))
    (transformer_dir / "config.json").write_text(to_json(mmjit))
    save_file(random_t5_weights(t5, seed + 1), str(t5_dir / "model.safetensors"))
    (t5_dir / "config.json").write_text(to_json(t5))
    make_t5_style_tokenizer(tokenizer_pieces(t5.vocab_size - 3)).save(str(t5_dir / "tokenizer.json"))


def tokenizer_pieces(limit: int) -> list[tuple[str, float]]:
    """At most `limit` scored unigram pieces: whole words first, then characters as fallback."""
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:;()\""
    pieces = [("\u2581" + w, -5.0 - 0.01 * i) for i, w in enumerate(dict.fromkeys(WORDS))]
    pieces += [("\u2581", -8.0)] + [(c, -10.0) for c in chars] + [("\u2581" + c, -9.0) for c in chars]
    return pieces[:limit]
