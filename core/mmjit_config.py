"""The MMJiT denoiser's configuration and, beside it, the tensors it owns (model.md 1, 2).

`MMJiTConfig` holds the hyper-parameters (model.md 1.1); `mmjit_expected_shapes` lists every
tensor a checkpoint of that config must hold, with its torch-layout shape (model.md 2.2), as
llama2.c keeps its weights struct beside the forward pass; `infer_mmjit_config` reads a config
off those shapes when no config.json sits beside the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from .checks import Range, read_json_object
from .config_fields import check_fields, config_from_file, config_from_shapes, count_blocks, require_dims
from .errors import MiniT2IError

# Every RMSNorm of MMJiT and its student (block norms, per-head q/k norms, final norm) adds this
# to the mean square (model.md 3.1); it is not in config.json, and the checkpoints agree on it.
NORM_EPS = 1e-6

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


@dataclass(frozen=True)
class MMJiTConfig:
    """Hyper-parameters of the MMJiT denoiser (model.md 1.1, 1.2)."""

    image_size: int = 512  # the size it was trained at; any multiple of patch_size runs
    patch_size: int = 16
    in_channels: int = 3
    txt_input_size: int = 1024  # the T5's d_model
    hidden_size: int = 768
    depth_double: int = 17  # double-stream blocks
    txt_preamble_depth: int = 2  # text-only blocks before them
    num_heads: int = 12
    head_dim: int = 64
    mlp_ratio: float = 2.6666666666666665  # SwiGLU width: see mlp_hidden
    pca_channels: int = 128  # bottleneck of the patch embed
    prompt_length: int = 256  # T5 tokens, </s> and padding included
    cond_vec_size: int = 768  # width of the dead t/pooled embedders (model.md 2.4)

    RANGES: ClassVar[dict[str, Range]] = MMJIT_RANGES  # a subclass with more fields extends it

    def __post_init__(self):
        check_fields(self, self.RANGES)
        if self.num_heads * self.head_dim != self.hidden_size:
            raise MiniT2IError(
                f"num_heads*head_dim must equal hidden_size, found {self.num_heads}*{self.head_dim}"
                f" != {self.hidden_size}"
            )

    @property
    def mlp_hidden(self) -> int:
        """SwiGLU width: int() truncation first, then round up to a multiple of 8 (model.md 3.9)."""
        n = int(self.hidden_size * self.mlp_ratio)
        return (n + 7) // 8 * 8

    @property
    def patch_dim(self) -> int:
        """Values per patch, p*p*C (input of proj1 and output of the final layer)."""
        return self.patch_size * self.patch_size * self.in_channels

    @classmethod
    def from_json(cls, path: Path) -> "MMJiTConfig":
        """Read a diffusers `config.json`, keeping only the fields this model uses."""
        return config_from_file(cls, path, read_json_object(path, "config"))


# Released and test configurations. The tiny one keeps every structural feature (2 preamble
# blocks, several double blocks, several heads) at a toy width (model.md 8.2).
MMJIT_B16 = MMJiTConfig()
MMJIT_L16 = MMJiTConfig(hidden_size=1248, depth_double=23, num_heads=24, head_dim=52,
                        mlp_ratio=2.7, cond_vec_size=1248)
MMJIT_TINY = MMJiTConfig(image_size=64, txt_input_size=64, hidden_size=64, depth_double=2,
                         num_heads=2, head_dim=32, mlp_ratio=2.6666666666666665, pca_channels=16,
                         prompt_length=16, cond_vec_size=64)

MODEL_VARIANTS = {"minit2i-b-16": MMJIT_B16, "minit2i-l-16": MMJIT_L16}
# The variant of the MiniT2I pipeline repo that `--variant` picks when not given.
DEFAULT_VARIANT = "minit2i-b-16"
# The official pipeline's sampler settings for the base model (model.md 7.3): what `generate` uses
# when neither a flag nor the model's config.json says otherwise.
BASE_RECIPE = {"steps": 100, "cfg_scale": 6.0}
# Aliases accepted by the official hub pipeline (model.md 1.3).
VARIANT_ALIASES = {
    **{a: "minit2i-b-16" for a in ("b", "b16", "b-16", "base", "minit2i-b16", "minit2i-b-16", "minit2i-b/16")},
    **{a: "minit2i-l-16" for a in ("l", "l16", "l-16", "large", "minit2i-l16", "minit2i-l-16", "minit2i-l/16")},
}

# Key prefixes of the different checkpoint files (model.md 2.1).
# The hub's diffusers transformer file (model.md 2.1): the layout the demo model and `convert` write.
DIFFUSERS_PREFIX = "model.net."
MMJIT_PREFIXES = ("model.diffusion_model.model.net.", "model.diffusion_model.net.", DIFFUSERS_PREFIX, "net.")
# Computed by the torch ports but never used by the output (model.md 2.4).
MMJIT_DEAD_PREFIXES = ("t_embedder.", "pooled_embedder.")
# Fields that tensor shapes cannot tell: without config.json they keep their defaults.
MMJIT_ASSUMED = ("image_size", "prompt_length")


def mmjit_expected_shapes(cfg: MMJiTConfig) -> dict[str, tuple[int, ...]]:
    """Every live MMJiT tensor (stripped name -> torch-layout shape), model.md 2.2."""
    d, dh, hid, p = cfg.hidden_size, cfg.head_dim, cfg.mlp_hidden, cfg.patch_size
    shapes = {
        "img_embedder.proj1.weight": (cfg.pca_channels, cfg.in_channels, p, p),
        "img_embedder.proj2.weight": (d, cfg.pca_channels, 1, 1),
        "img_embedder.proj2.bias": (d,),
        "txt_embedder.weight": (d, cfg.txt_input_size),
        "mask_token": (1, 1, cfg.txt_input_size),
        "final_layer.norm_final.weight": (d,),
        "final_layer.linear.weight": (cfg.patch_dim, d),
        "final_layer.linear.bias": (cfg.patch_dim,),
    }

    def mlp(prefix):
        return {f"{prefix}.w1.weight": (hid, d), f"{prefix}.w3.weight": (hid, d), f"{prefix}.w2.weight": (d, hid)}

    for i in range(cfg.txt_preamble_depth):
        b = f"txt_preamble_blocks.{i}"
        shapes.update({
            f"{b}.norm1.weight": (d,), f"{b}.norm2.weight": (d,),
            f"{b}.qkv.weight": (3 * d, d), f"{b}.qkv.bias": (3 * d,),
            f"{b}.q_norm.weight": (dh,), f"{b}.k_norm.weight": (dh,),
            f"{b}.attn_proj.weight": (d, d), f"{b}.attn_proj.bias": (d,),
            **mlp(f"{b}.mlp"),
        })
    for i in range(cfg.depth_double):
        b = f"double_blocks.{i}"
        shapes.update({f"{b}.q_norm.weight": (dh,), f"{b}.k_norm.weight": (dh,)})
        for s in ("img", "txt"):
            shapes.update({
                f"{b}.{s}_norm1.weight": (d,), f"{b}.{s}_norm2.weight": (d,),
                f"{b}.{s}_qkv.weight": (3 * d, d), f"{b}.{s}_qkv.bias": (3 * d,),
                f"{b}.{s}_attn_proj.weight": (d, d), f"{b}.{s}_attn_proj.bias": (d,),
                **mlp(f"{b}.{s}_mlp"),
            })
    return shapes


# Width of the dead t_embedder's sinusoid in the torch port (model.md 2.4).
DEAD_FREQUENCY_SIZE = 256


def mmjit_dead_shapes(cfg: MMJiTConfig) -> dict[str, tuple[int, ...]]:
    """The dead tensors the torch port declares and loads strictly (model.md 2.4), torch layout."""
    c = cfg.cond_vec_size
    return {"t_embedder.mlp.0.weight": (c, DEAD_FREQUENCY_SIZE), "t_embedder.mlp.0.bias": (c,),
            "t_embedder.mlp.2.weight": (c, c), "t_embedder.mlp.2.bias": (c,),
            "pooled_embedder.weight": (c, cfg.txt_input_size)}


def infer_mmjit_config(shapes: dict[str, tuple[int, ...]]) -> MMJiTConfig:
    """Read the architecture off the tensor shapes; image_size and prompt_length keep defaults."""
    need = ["img_embedder.proj1.weight", "img_embedder.proj2.weight", "txt_embedder.weight",
            "double_blocks.0.q_norm.weight", "double_blocks.0.img_mlp.w1.weight"]
    missing = [k for k in need if k not in shapes]
    if missing:
        raise MiniT2IError(
            "not a MiniT2I transformer checkpoint: missing " + ", ".join(missing)
            + "; pass minit2i-b-16/transformer/diffusion_pytorch_model.safetensors (or its folder)"
        )
    require_dims(shapes, {"img_embedder.proj1.weight": 4, "img_embedder.proj2.weight": 4,
                           "txt_embedder.weight": 2, "double_blocks.0.q_norm.weight": 1,
                           "double_blocks.0.img_mlp.w1.weight": 2, "t_embedder.mlp.0.weight": 2})
    pca, channels, patch, _ = shapes["img_embedder.proj1.weight"]
    hidden = shapes["img_embedder.proj2.weight"][0]
    head_dim = shapes["double_blocks.0.q_norm.weight"][0]
    mlp_hidden = shapes["double_blocks.0.img_mlp.w1.weight"][0]
    dead = shapes.get("t_embedder.mlp.0.weight")
    return config_from_shapes(
        MMJiTConfig, patch_size=patch, in_channels=channels, pca_channels=pca, hidden_size=hidden,
        txt_input_size=shapes["txt_embedder.weight"][1],
        depth_double=count_blocks(shapes, "double_blocks"),
        txt_preamble_depth=count_blocks(shapes, "txt_preamble_blocks"),
        num_heads=hidden // head_dim, head_dim=head_dim, mlp_ratio=mlp_hidden / hidden,
        cond_vec_size=dead[0] if dead else hidden,
    )
