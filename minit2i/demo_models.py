"""The demo models, and writing models in the real file layouts.

The demo model (`demo`, what `generate` runs without --model/--t5) is a tiny MiniT2I trained on
procedural coloured shapes (training/, see docs/demo-model.md); `demo-mf` is its four-step Mean
Flow student. Both ship inside the package in the real layouts so that the same loader,
tokenizer and checks run on them:

    minit2i/demo_model/transformer/{config.json, diffusion_pytorch_model.safetensors}
    minit2i/demo_model/t5/{config.json, model.safetensors, tokenizer.json}
    minit2i/demo_model_mf/transformer/{config.json, diffusion_pytorch_model.safetensors}

The transformer's config.json also carries the sampler settings it was tuned for (its "sampling"
block: steps and guidance), which `generate` uses when the user gives none.

`write_model` writes a model with seeded random weights in the same layouts: the tests, golden
recipes and benchmarks build their small checkpoints with it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from minit2i.core.config_fields import to_json
from minit2i.core.errors import MiniT2IError
from minit2i.core.mean_flow_config import denoiser_expected_shapes
from minit2i.core.mmjit_config import DIFFUSERS_PREFIX, MMJiTConfig
from minit2i.core.t5_config import T5Config, t5_expected_shapes
from minit2i.core.tokenizer import make_t5_style_tokenizer

DEMO_MODEL_DIR = Path(__file__).parent / "demo_model"
# The four-step student distilled from it: only a transformer/ (it reads prompts with the demo T5).
DEMO_STUDENT_DIR = Path(__file__).parent / "demo_model_mf"

# A small English vocabulary so that prompts to random-weight test models tokenize into words.
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


# The demo models by the name `--model` and `info` accept: (transformer folder, T5 folder, what it is).
DEMO_MODELS = {
    "demo": (DEMO_MODEL_DIR / "transformer", DEMO_MODEL_DIR / "t5",
             "the demo model, a tiny MiniT2I trained on procedural coloured shapes"),
    "demo-mf": (DEMO_STUDENT_DIR / "transformer", DEMO_MODEL_DIR / "t5",
                "the demo model distilled into a four-step Mean Flow student"),
}


def demo_model(name) -> tuple[Path, Path, str] | None:
    """The demo model called `name`, unless a file or folder of that name exists (a path wins)."""
    if not isinstance(name, str) or name not in DEMO_MODELS or Path(name).exists():
        return None
    return DEMO_MODELS[name]


def demo_digest(name: str) -> str:
    """The first 16 hex digits of the sha256 of a demo model's two weight files."""
    transformer, t5, _ = DEMO_MODELS[name]
    digest = hashlib.sha256()
    for path in (transformer / "diffusion_pytorch_model.safetensors", t5 / "model.safetensors"):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def random_mmjit_weights(config: MMJiTConfig, seed: int) -> dict[str, np.ndarray]:
    """Seeded weights for every live tensor of an MMJiT or a Mean Flow student (stripped names, float32)."""
    return _random_weights(denoiser_expected_shapes(config), seed)


def random_t5_weights(config: T5Config, seed: int) -> dict[str, np.ndarray]:
    """Seeded weights for every T5 encoder tensor (HF names, float32)."""
    return _random_weights(t5_expected_shapes(config), seed)


def _random_weights(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Linear/conv weights ~ N(0, 1/fan_in); norm weights ~ 1 + N(0, 0.1^2) so that a wrong
    norm (or a forgotten weight) changes the output; biases, mask_token and the Mean Flow prefix's
    learned tokens ~ N(0, 0.1^2)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in sorted(shapes.items()):
        if "norm" in name:
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(("bias", "_tokens")) or name == "mask_token":
            value = 0.1 * rng.standard_normal(shape)
        elif name.endswith("relative_attention_bias.weight") or name == "shared.weight":
            value = rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        tensors[name] = value.astype(np.float32)
    return tensors


def write_model(transformer_dir: Path, t5_dir: Path, mmjit: MMJiTConfig, t5: T5Config, seed: int,
                prefix: str = DIFFUSERS_PREFIX) -> None:
    """Write a complete model with seeded random weights (float32)."""
    save_model(transformer_dir, t5_dir, mmjit, t5, random_mmjit_weights(mmjit, seed), random_t5_weights(t5, seed + 1),
               make_t5_style_tokenizer(tokenizer_pieces(t5.vocab_size - 3)), prefix=prefix)


def save_model(transformer_dir: Path, t5_dir: Path, mmjit: MMJiTConfig, t5: T5Config,
               mmjit_weights: dict[str, np.ndarray], t5_weights: dict[str, np.ndarray], tokenizer: Tokenizer,
               dtype=np.float32, prefix: str = DIFFUSERS_PREFIX, sampling: dict | None = None) -> None:
    """Write a diffusers transformer folder and a T5 folder (with tokenizer.json), tensors in `dtype`.

    `sampling` (e.g. {"steps": 20, "cfg_scale": 2.0}) is stored in the transformer's config.json.
    """
    t5_tensors = _stored(t5_weights, dtype)
    save_transformer(transformer_dir, mmjit, mmjit_weights, dtype, prefix, sampling)
    t5_dir.mkdir(parents=True, exist_ok=True)
    save_file(t5_tensors, str(t5_dir / "model.safetensors"))
    (t5_dir / "config.json").write_text(to_json(t5))
    tokenizer.save(str(t5_dir / "tokenizer.json"))


def save_transformer(folder: Path, mmjit: MMJiTConfig, weights: dict[str, np.ndarray], dtype=np.float32,
                     prefix: str = DIFFUSERS_PREFIX, sampling: dict | None = None) -> None:
    """Write a diffusers transformer folder (config.json with the optional "sampling" block, and
    diffusion_pytorch_model.safetensors, tensors in `dtype` under `prefix`)."""
    tensors = _stored(weights, dtype, prefix)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "diffusion_pytorch_model.safetensors"))
    config = json.loads(to_json(mmjit)) | ({"sampling": sampling} if sampling else {})
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def _stored(weights: dict[str, np.ndarray], dtype, prefix: str = "") -> dict[str, np.ndarray]:
    """The tensors as contiguous `dtype` arrays under `prefix`. A finite value beyond `dtype`'s range
    is refused: stored, it would silently become infinity (float16 ends at 65504)."""
    stored = {}
    for name, value in weights.items():
        with np.errstate(over="ignore"):
            stored[prefix + name] = np.ascontiguousarray(value, dtype=dtype)
        if not np.isfinite(stored[prefix + name]).all() and np.isfinite(value).all():
            raise MiniT2IError(f"{name} holds values beyond the range of {np.dtype(dtype).name} (largest "
                               f"{float(np.finfo(dtype).max):g}), which would be stored as infinity; the model "
                               "has diverged: resume from an earlier checkpoint or lower the learning rate")
    return stored


def tokenizer_pieces(limit: int) -> list[tuple[str, float]]:
    """At most `limit` scored unigram pieces: whole words first, then characters as fallback."""
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:;()\""
    pieces = [("\u2581" + w, -5.0 - 0.01 * i) for i, w in enumerate(dict.fromkeys(WORDS))]
    pieces += [("\u2581", -8.0)] + [(c, -10.0) for c in chars] + [("\u2581" + c, -9.0) for c in chars]
    return pieces[:limit]
