"""The FLAN-T5 (v1.1) encoder's configuration and, beside it, the tensors it owns (model.md 6).

`T5Config` holds the hyper-parameters; `t5_expected_shapes` lists every encoder tensor of
that config with its shape (model.md 6.3); `infer_t5_config` reads a config off those shapes
when no config.json sits beside the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .checks import Range, read_json_object
from .config_fields import check_fields, config_from_file, config_from_shapes, count_blocks, require_dims
from .errors import MiniT2IError

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


@dataclass(frozen=True)
class T5Config:
    """Hyper-parameters of a T5 v1.1 encoder (model.md 6)."""

    vocab_size: int = 32128
    d_model: int = 1024
    d_kv: int = 64  # per-head width
    num_heads: int = 16
    d_ff: int = 2816  # gated-GELU width
    num_layers: int = 24
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6

    def __post_init__(self):
        check_fields(self, T5_RANGES)
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
        return config_from_file(cls, path, raw)


T5_FLAN_LARGE = T5Config()
T5_TINY = T5Config(vocab_size=512, d_model=64, d_kv=16, num_heads=4, d_ff=96, num_layers=2)

# A full T5ForConditionalGeneration file also carries these; the encoder ignores them.
T5_IGNORED_PREFIXES = ("decoder.", "lm_head.")
T5_TIED_EMBEDDING = "encoder.embed_tokens.weight"
T5_NAMES_BY_WIDTH = {512: "flan-t5-small", 768: "flan-t5-base", 1024: "flan-t5-large",
                     2048: "flan-t5-xl", 4096: "flan-t5-xxl"}
# Fields that tensor shapes cannot tell: without config.json they keep their defaults.
T5_ASSUMED = ("relative_attention_max_distance", "layer_norm_epsilon")


def t5_expected_shapes(cfg: T5Config) -> dict[str, tuple[int, ...]]:
    """Every T5 encoder tensor (HF name -> shape), model.md 6.3."""
    d, inner, ff = cfg.d_model, cfg.inner_dim, cfg.d_ff
    shapes = {
        "shared.weight": (cfg.vocab_size, d),
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight":
            (cfg.relative_attention_num_buckets, cfg.num_heads),
        "encoder.final_layer_norm.weight": (d,),
    }
    for i in range(cfg.num_layers):
        b = f"encoder.block.{i}.layer"
        shapes.update({
            f"{b}.0.SelfAttention.q.weight": (inner, d), f"{b}.0.SelfAttention.k.weight": (inner, d),
            f"{b}.0.SelfAttention.v.weight": (inner, d), f"{b}.0.SelfAttention.o.weight": (d, inner),
            f"{b}.0.layer_norm.weight": (d,),
            f"{b}.1.DenseReluDense.wi_0.weight": (ff, d), f"{b}.1.DenseReluDense.wi_1.weight": (ff, d),
            f"{b}.1.DenseReluDense.wo.weight": (d, ff),
            f"{b}.1.layer_norm.weight": (d,),
        })
    return shapes


def infer_t5_config(shapes: dict[str, tuple[int, ...]]) -> T5Config:
    """Read a T5 v1.1 encoder's size off its tensor shapes."""
    if "encoder.block.0.layer.1.DenseReluDense.wi.weight" in shapes:
        raise MiniT2IError(
            "this T5 has an ungated ReLU feed-forward (original T5); MiniT2I needs the T5 v1.1 "
            "gated-gelu encoder of google/flan-t5-large"
        )
    bias = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    need = ["shared.weight", bias, "encoder.block.0.layer.0.SelfAttention.q.weight",
            "encoder.block.0.layer.1.DenseReluDense.wi_0.weight"]
    missing = [k for k in need if k not in shapes]
    if missing:
        raise MiniT2IError(
            "not a T5 encoder checkpoint: missing " + ", ".join(missing)
            + "; pass google/flan-t5-large's model.safetensors (or its folder)"
        )
    require_dims(shapes, {bias: 2, "shared.weight": 2, "encoder.block.0.layer.0.SelfAttention.q.weight": 2,
                           "encoder.block.0.layer.1.DenseReluDense.wi_0.weight": 2})
    buckets, heads = shapes[bias]
    vocab, d_model = shapes["shared.weight"]
    return config_from_shapes(
        T5Config, vocab_size=vocab, d_model=d_model, num_heads=heads,
        d_kv=shapes["encoder.block.0.layer.0.SelfAttention.q.weight"][0] // heads,
        d_ff=shapes["encoder.block.0.layer.1.DenseReluDense.wi_0.weight"][0],
        num_layers=count_blocks(shapes, "encoder.block"),
        relative_attention_num_buckets=buckets,
    )
