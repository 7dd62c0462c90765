"""Model configurations: MMJiT (the denoiser) and the T5 text encoder.

Values follow spec section 1 (MMJiT) and section 6 (flan-t5-large). A config is read from a
diffusers/HF `config.json` when one sits next to the weights, otherwise inferred from tensor
shapes (see `minit2i.weights`). However it is made, every field is checked against one table
(`MMJIT_RANGES`, `T5_RANGES`) when the config is created, so `generate`, `trace` and `info`
all refuse the same bad values with the same message.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from .checks import Range, read_json_object
from .errors import MiniT2IError

# Allowed values of every field. The bounds are far beyond any released model; they exist so
# that a damaged config.json is refused in one line instead of dividing by zero, allocating
# terabytes or silently producing a black image.
MMJIT_RANGES = {
    "image_size": Range(1, 16384),
    "patch_size": Range(1, 256),
    "in_channels": Range(3, 3),  # PNG output is RGB
    "txt_input_size": Range(1, 65536),
    "hidden_size": Range(4, 65536, multiple_of=4),  # 2-D sin/cos table: 4 values per frequency
    "depth_double": Range(1, 1024),
    "txt_preamble_depth": Range(0, 1024),
    "num_heads": Range(1, 4096),
    "head_dim": Range(4, 4096, multiple_of=4),  # 2-D RoPE: half per axis, pairs within each half
    "mlp_ratio": Range(0, 64, integer=False, low_open=True),
    "pca_channels": Range(1, 65536),
    "prompt_length": Range(2, 8192),  # at least one token and </s>
    "cond_vec_size": Range(1, 65536),
}
T5_RANGES = {
    "vocab_size": Range(1, 1 << 24),  # the tokenizer's largest id is checked against it
    "d_model": Range(1, 65536),
    "d_kv": Range(1, 4096),
    "num_heads": Range(1, 4096),
    "d_ff": Range(1, 1 << 20),
    "num_layers": Range(1, 1024),
    "relative_attention_num_buckets": Range(4, 65536),  # half per direction, half of that exact
    "relative_attention_max_distance": Range(1, 1 << 20),
    "layer_norm_epsilon": Range(0, 1, integer=False, low_open=True),
}


def _check_fields(config, ranges: dict[str, Range]) -> None:
    """Every field against its range, in declaration order (the first bad one is reported)."""
    for f in dataclasses.fields(config):
        ranges[f.name].check(f.name, getattr(config, f.name))


def _from_file(cls, path: Path, raw: dict):
    """A config from the fields of `raw` this model uses; a bad value names the file."""
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in raw.items() if k in names})
    except MiniT2IError as err:
        raise MiniT2IError(f"{path}: {err}; fix the file, or delete it to infer the config from "
                           "the tensor shapes") from None


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
        _check_fields(self, MMJIT_RANGES)
        if self.num_heads * self.head_dim != self.hidden_size:
            raise MiniT2IError(
                f"num_heads*head_dim must equal hidden_size, found {self.num_heads}*{self.head_dim}"
                f" != {self.hidden_size}"
            )

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
        return _from_file(cls, path, read_json_object(path, "config"))


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

    def __post_init__(self):
        _check_fields(self, T5_RANGES)
        max_exact = self.relative_attention_num_buckets // 4
        if self.relative_attention_max_distance <= max_exact:
            # The log-spaced buckets span max_exact .. max_distance: an empty span divides by 0.
            raise MiniT2IError(
                f"relative_attention_max_distance must exceed relative_attention_num_buckets/4 = "
                f"{max_exact}, found {self.relative_attention_max_distance}"
            )

    @property
    def inner_dim(self) -> int:
        return self.num_heads * self.d_kv

    @classmethod
    def from_json(cls, path: Path) -> "T5Config":
        """Read an HF T5 `config.json`; refuses encoders that are not gated-gelu (T5 v1.1)."""
        raw = read_json_object(path, "config")
        proj = raw.get("feed_forward_proj", "gated-gelu")
        if proj != "gated-gelu":
            raise MiniT2IError(
                f"{path}: feed_forward_proj is {proj!r}; MiniT2I needs a T5 v1.1 encoder with "
                "'gated-gelu' (google/flan-t5-large)"
            )
        return _from_file(cls, path, raw)


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


def to_json(config) -> str:
    """Serialise a config the way diffusers/HF would (used by the default model and tests)."""
    return json.dumps(dataclasses.asdict(config), indent=2)
