"""Model configurations: MMJiT (the denoiser) and the T5 text encoder.

Values follow spec section 1 (MMJiT) and section 6 (flan-t5-large). A config is read from a
diffusers/HF `config.json` when one sits next to the weights, otherwise inferred from tensor
shapes (see `minit2i.weights`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import MiniT2IError


@dataclass(frozen=True)
class MMJiTConfig:
    """Hyper-parameters of the MMJiT denoiser (spec 1.1, 1.2)."""

    image_size: int = 512
    patch_size: int = 16
    in_channels: int = 3
    txt_input_size: int = 1024
    hidden_size: int = 768
    depth_double: int = 17
    txt_preamble_depth: int = 2
    num_heads: int = 12
    head_dim: int = 64
    mlp_ratio: float = 2.6666666666666665
    pca_channels: int = 128
    prompt_length: int = 256
    cond_vec_size: int = 768

    def __post_init__(self):
        if self.num_heads * self.head_dim != self.hidden_size:
            raise MiniT2IError(
                f"MMJiT config is inconsistent: num_heads*head_dim = {self.num_heads}*{self.head_dim}"
                f" != hidden_size {self.hidden_size}; fix config.json"
            )
        if self.head_dim % 4:
            raise MiniT2IError(f"MMJiT head_dim must be a multiple of 4 (2-D RoPE), got {self.head_dim}")
        if self.hidden_size % 4:
            raise MiniT2IError(f"MMJiT hidden_size must be a multiple of 4 (2-D sin/cos table), got {self.hidden_size}")

    @property
    def mlp_hidden(self) -> int:
        """SwiGLU width: int() truncation first, then round up to a multiple of 8 (spec 3.9)."""
        n = int(self.hidden_size * self.mlp_ratio)
        return (n + 7) // 8 * 8

    @property
    def patch_dim(self) -> int:
        """Values per patch, p*p*C (input of proj1 and output of the final layer)."""
        return self.patch_size * self.patch_size * self.in_channels

    @classmethod
    def from_json(cls, path: Path) -> "MMJiTConfig":
        """Read a diffusers `config.json`, keeping only the fields this model uses."""
        return cls(**_known_fields(cls, _read_json(path)))


@dataclass(frozen=True)
class T5Config:
    """Hyper-parameters of a T5 v1.1 encoder (spec 6)."""

    vocab_size: int = 32128
    d_model: int = 1024
    d_kv: int = 64
    num_heads: int = 16
    d_ff: int = 2816
    num_layers: int = 24
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6

    @property
    def inner_dim(self) -> int:
        return self.num_heads * self.d_kv

    @classmethod
    def from_json(cls, path: Path) -> "T5Config":
        """Read an HF T5 `config.json`; refuses encoders that are not gated-gelu (T5 v1.1)."""
        raw = _read_json(path)
        proj = raw.get("feed_forward_proj", "gated-gelu")
        if proj != "gated-gelu":
            raise MiniT2IError(
                f"{path}: feed_forward_proj is {proj!r}; MiniT2I needs a T5 v1.1 encoder with "
                "'gated-gelu' (google/flan-t5-large)"
            )
        return cls(**_known_fields(cls, raw))


# Released and test configurations. The tiny ones keep every structural feature (2 preamble
# blocks, several double blocks, several heads, non-square-friendly sizes) at a toy width.
MMJIT_B16 = MMJiTConfig()
MMJIT_L16 = MMJiTConfig(hidden_size=1248, depth_double=23, num_heads=24, head_dim=52,
                        mlp_ratio=2.7, cond_vec_size=1248)
MMJIT_TINY = MMJiTConfig(image_size=64, txt_input_size=64, hidden_size=64, depth_double=2,
                         num_heads=2, head_dim=32, mlp_ratio=2.6666666666666665, pca_channels=16,
                         prompt_length=16, cond_vec_size=64)
T5_FLAN_LARGE = T5Config()
T5_TINY = T5Config(vocab_size=512, d_model=64, d_kv=16, num_heads=4, d_ff=96, num_layers=2)

MODEL_VARIANTS = {"minit2i-b-16": MMJIT_B16, "minit2i-l-16": MMJIT_L16}
# Aliases accepted by the official hub pipeline (spec 1.3).
VARIANT_ALIASES = {
    **{a: "minit2i-b-16" for a in ("b", "b16", "b-16", "base", "minit2i-b16", "minit2i-b-16", "minit2i-b/16")},
    **{a: "minit2i-l-16" for a in ("l", "l16", "l-16", "large", "minit2i-l16", "minit2i-l-16", "minit2i-l/16")},
}


def read_sampling(path: Path) -> dict:
    """The "sampling" block of a transformer config.json ({"steps": int, "cfg_scale": float}):
    the settings a model was tuned for. Released MiniT2I configs have none."""
    block = _read_json(path).get("sampling", {})
    checks = {"steps": (int, lambda v: v >= 1, "an integer >= 1"),
              "cfg_scale": ((int, float), lambda v: v == v and abs(v) < 1e6, "a finite number")}
    for name, (types, ok, expected) in checks.items():
        value = block.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types) or not ok(value)):
            raise MiniT2IError(f"{path}: sampling.{name} must be {expected}, found {value!r}; fix or delete it")
    return {k: block[k] for k in checks if k in block}


def to_json(config) -> str:
    """Serialise a config the way diffusers/HF would (used by the default model and tests)."""
    return json.dumps(dataclasses.asdict(config), indent=2)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise MiniT2IError(f"cannot read config {path}: {err}; fix or delete the file") from None


def _known_fields(cls, raw: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in raw.items() if k in names}
