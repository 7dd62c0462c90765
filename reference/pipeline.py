"""The NumPy backend as the shared pipeline (`minit2i.pipeline`) drives it: one prompt encoded once,
then the sampler of concepts.md 1 (the student's: concepts.md 6) calling the denoiser at every step."""

from __future__ import annotations

import numpy as np

from minit2i.core.errors import MiniT2IError
from minit2i.core.weights import LoadedWeights, nest

from .layers import cast_tree
from .mean_flow import mean_flow_forward
from .mean_flow_sampler import sample_mean_flow
from .mmjit import mmjit_forward
from .sampler import sample
from .t5 import t5_encode

PRECISIONS = {"fp32": np.float32, "fp64": np.float64}


class NumpyRunner:
    """T5 + MMJiT (or the Mean Flow student) + its sampler on the CPU. fp32 for generation; fp64
    for tracing and tests. The weight trees are cast to that dtype once, here."""

    name = "numpy"

    def __init__(self, mmjit: LoadedWeights, t5: LoadedWeights, precision: str = "fp32"):
        if precision not in PRECISIONS:
            raise MiniT2IError(
                f"the numpy backend runs fp32 or fp64, not {precision}; use --precision fp32 "
                "(fp16/bf16 are for --backend cupy)"
            )
        self.dtype = PRECISIONS[precision]
        self.mmjit_config, self.t5_config = mmjit.config, t5.config
        self.mmjit_params = cast_tree(nest(mmjit.tensors), self.dtype)
        self.t5_params = cast_tree(nest(t5.tensors), self.dtype)

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """ids, mask [B, L] -> T5 last hidden state [B, L, d_model]."""
        return t5_encode(self.t5_params, self.t5_config, ids, mask.astype(self.dtype))

    def denoise(self, x, context, mask, on_layer=None):
        """One MMJiT forward: [B, C, H, W], [B, L, Dc], [B, L] -> x0 [B, C, H, W]."""
        return mmjit_forward(self.mmjit_params, self.mmjit_config, x, context, mask, on_layer)

    def denoise_student(self, x, h, omega, t_min, t_max, context, mask, on_layer=None):
        """One Mean Flow student forward: [B, C, H, W], scalars [B] each, [B, L, Dc], [B, L] -> x0."""
        return mean_flow_forward(self.mmjit_params, self.mmjit_config, x, h, omega, t_min, t_max, context, mask,
                                 on_layer)

    def sample(self, noise, context, mask, steps, cfg_scale, a_min, callback=None) -> np.ndarray:
        """Host noise [B, C, H, W] -> final image state [B, C, H, W] as float32 NumPy."""
        x = sample(self.denoise, noise.astype(self.dtype), context, mask.astype(self.dtype),
                   steps, cfg_scale, a_min, callback)
        return x.astype(np.float32)

    def sample_mean_flow(self, noise, context, mask, steps, omega, interval, callback=None) -> np.ndarray:
        """The student's few-step sampler: host noise [B, C, H, W] -> final image [B, C, H, W] float32."""
        x = sample_mean_flow(self.denoise_student, noise.astype(self.dtype), context, mask.astype(self.dtype),
                             steps, omega, interval, callback)
        return x.astype(np.float32)

    def to_host(self, array) -> np.ndarray:
        return np.asarray(array, dtype=np.float32)
