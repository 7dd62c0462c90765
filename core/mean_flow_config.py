"""The four-step Mean Flow student's configuration and, beside it, the tensors it owns (model.md 9).

The student is an MMJiT (same trunk, same tensor names) that also reads four scalars per sample
(the step length h = t - r, the guidance scale omega and the guidance interval t_min..t_max)
as a prefix of 20 auxiliary tokens in front of the text stream. `MeanFlowConfig` extends
`MMJiTConfig` with the prefix sizes; `aux_token_groups` fixes the order of the prefix once for
every reader (schema, reference, twin, JAX checkpoint reader).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from .checks import Range
from .config_fields import config_from_shapes, require_dims
from .mmjit_config import MMJIT_RANGES, MMJiTConfig, infer_mmjit_config, mmjit_expected_shapes

MEAN_FLOW_RANGES = {
    "num_context_tokens": Range(1, 1024),
    "num_cfg_tokens": Range(1, 1024),
    "num_interval_tokens": Range(1, 1024),
    "num_time_tokens": Range(1, 1024),
    "frequency_embedding_size": Range(2, 65536, multiple_of=2),  # [cos | sin] halves
}


@dataclass(frozen=True)
class MeanFlowConfig(MMJiTConfig):
    """MMJiT hyper-parameters plus the auxiliary prefix of the Mean Flow student (model.md 9.1)."""

    num_context_tokens: int = 8  # learned rows + the pooled prompt
    num_cfg_tokens: int = 4  # learned rows + omega's embedding
    num_interval_tokens: int = 2  # per end of the guidance interval (t_min, then t_max)
    num_time_tokens: int = 4  # learned rows + h's embedding
    frequency_embedding_size: int = 256  # the sinusoid fed to each scalar embedder

    RANGES: ClassVar[dict[str, Range]] = {**MMJIT_RANGES, **MEAN_FLOW_RANGES}

    @property
    def num_aux_tokens(self) -> int:
        """Length of the prefix: 8 + 4 + 2 + 2 + 4 = 20 for the released student."""
        return sum(count for _, count in aux_token_groups(self))


def aux_token_groups(config: MeanFlowConfig) -> tuple[tuple[str, int], ...]:
    """(group, token count) in prefix order (model.md 9.1): the tensor `{group}_tokens` holds the
    learned rows, and each group adds one embedded vector (see `AUX_EMBEDDERS`) to all its rows."""
    return (("context", config.num_context_tokens), ("omega", config.num_cfg_tokens),
            ("t_min", config.num_interval_tokens), ("t_max", config.num_interval_tokens),
            ("time", config.num_time_tokens))


# What each group's rows add: the pooled prompt through a linear layer, or one scalar through a
# timestep embedder (sinusoid -> Linear -> SiLU -> Linear). omega enters as 1 - 1/omega, so that
# omega = 1 ("no guidance") is the embedding of 0.
AUX_EMBEDDERS = {"context": "aux_pooled_embedder", "omega": "omega_embedder", "t_min": "t_min_embedder",
                 "t_max": "t_max_embedder", "time": "h_embedder"}
SCALAR_EMBEDDERS = ("omega_embedder", "t_min_embedder", "t_max_embedder", "h_embedder")

# Released configuration and the tiny test one (every prefix group active, odd-sized groups).
MEAN_FLOW_B16 = MeanFlowConfig()
MEAN_FLOW_TINY = MeanFlowConfig(image_size=64, txt_input_size=64, hidden_size=64, depth_double=2, num_heads=2,
                                head_dim=32, pca_channels=16, prompt_length=16, cond_vec_size=64,
                                num_context_tokens=3, num_cfg_tokens=2, num_interval_tokens=1,
                                num_time_tokens=2, frequency_embedding_size=32)
# The recipe of the released student (model.md 9.4): what `generate` uses when no flag says otherwise.
MEAN_FLOW_RECIPE = {"steps": 4, "cfg_scale": 12.0, "guidance_interval": (0.2, 0.8)}


def is_mean_flow(names) -> bool:
    """Whether stripped tensor names are a Mean Flow student's (it alone has time tokens)."""
    return "time_tokens" in names


def mean_flow_expected_shapes(cfg: MeanFlowConfig) -> dict[str, tuple[int, ...]]:
    """Every live student tensor (stripped name -> torch-layout shape), model.md 9.1: the MMJiT's
    and the prefix's. t_embedder / pooled_embedder exist in the checkpoints but are dead (9.3)."""
    d, dc, f = cfg.hidden_size, cfg.txt_input_size, cfg.frequency_embedding_size
    shapes = mmjit_expected_shapes(cfg)
    shapes.update({f"{group}_tokens": (1, count, d) for group, count in aux_token_groups(cfg)})
    shapes["aux_pooled_embedder.weight"] = (d, dc)
    for name in SCALAR_EMBEDDERS:
        shapes.update({f"{name}.mlp.0.weight": (d, f), f"{name}.mlp.0.bias": (d,),
                       f"{name}.mlp.2.weight": (d, d), f"{name}.mlp.2.bias": (d,)})
    return shapes


def denoiser_expected_shapes(config: MMJiTConfig) -> dict[str, tuple[int, ...]]:
    """The schema of either denoiser, chosen by its config's type."""
    if isinstance(config, MeanFlowConfig):
        return mean_flow_expected_shapes(config)
    return mmjit_expected_shapes(config)


def infer_mean_flow_config(shapes: dict[str, tuple[int, ...]]) -> MeanFlowConfig:
    """The MMJiT trunk as `infer_mmjit_config` reads it, plus the prefix sizes from the token tensors."""
    trunk = infer_mmjit_config(shapes)
    require_dims(shapes, {f"{group}_tokens": 3 for group in AUX_EMBEDDERS} | {"h_embedder.mlp.0.weight": 2})
    counts = {group: shapes[f"{group}_tokens"][1] for group in AUX_EMBEDDERS if f"{group}_tokens" in shapes}
    embedder = shapes.get("h_embedder.mlp.0.weight")
    defaults = MeanFlowConfig()
    return config_from_shapes(
        MeanFlowConfig, **{f.name: getattr(trunk, f.name) for f in fields(trunk)},
        num_context_tokens=counts.get("context", defaults.num_context_tokens),
        num_cfg_tokens=counts.get("omega", defaults.num_cfg_tokens),
        num_interval_tokens=counts.get("t_min", defaults.num_interval_tokens),
        num_time_tokens=counts.get("time", defaults.num_time_tokens),
        frequency_embedding_size=embedder[1] if embedder else defaults.frequency_embedding_size,
    )
