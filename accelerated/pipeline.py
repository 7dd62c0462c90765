"""The CuPy backend as the shared pipeline (`minit2i.pipeline`) drives it."""

from __future__ import annotations

import contextlib

import numpy as np

from minit2i.core.errors import MiniT2IError
from minit2i.core.mean_flow_config import MeanFlowConfig
from minit2i.core.weights import LoadedWeights, nest

from .kernels import bfloat16_dtype, require_gpu, use_array_module
from .mean_flow import mean_flow_forward, upload_mean_flow
from .mean_flow_sampler import sample_mean_flow_on_device
from .mmjit import denoise_embedded, embed_prompt, mmjit_forward, upload_mmjit
from .sampler import StepGraphs, sample_on_device
from .streams import forked
from .t5 import t5_encode, upload_t5

PRECISIONS = ("fp32", "fp16", "bf16")


def precision_dtype(precision: str):
    """--precision name -> the MMJiT's storage dtype (bf16 needs ml_dtypes)."""
    if precision not in PRECISIONS:
        raise MiniT2IError(f"the cupy backend runs {', '.join(PRECISIONS)}, not {precision}; use --precision fp32")
    if precision == "bf16":
        return bfloat16_dtype()
    return np.dtype(np.float16 if precision == "fp16" else np.float32)


class CupyRunner:
    """T5 (fp32) + MMJiT or its Mean Flow student (fp32/fp16/bf16) + sampler on one NVIDIA GPU;
    weights uploaded once.

    fp32 GEMMs run without TF32 (CuPy's default unless CUPY_TF32=1 is set), for parity with
    the reference. `use_graph` (default on) replays sampler steps 1.. as a captured CUDA graph,
    falling back to eager steps with a one-line warning when capture fails; the graphs of the
    last two shapes of work are kept (`graphs`), and the next call of such a shape replays every
    step, capturing nothing. `fork_streams` (default on) runs each double block's text stream on a
    second CUDA stream beside the image stream's (accelerated/streams.py; the same bits either way).
    """

    name = "cupy"

    def __init__(self, mmjit: LoadedWeights, t5: LoadedWeights, precision: str = "fp32", use_graph: bool = True,
                 fork_streams: bool = True):
        self.cp = self.array_module()
        self.dtype = precision_dtype(precision)
        self.use_graph, self.fork_streams = use_graph, fork_streams
        self.graphs = StepGraphs()
        self.mmjit_config, self.t5_config = mmjit.config, t5.config
        upload = upload_mean_flow if isinstance(mmjit.config, MeanFlowConfig) else upload_mmjit
        self.mmjit_params = upload(nest(mmjit.tensors), mmjit.config, self.dtype)
        self.t5_params = upload_t5(nest(t5.tensors), t5.config)

    @staticmethod
    def array_module():
        """The device the twin runs on: CuPy on an NVIDIA GPU (or a one-line error saying why not)."""
        return require_gpu()

    def encode(self, ids: np.ndarray, mask: np.ndarray):
        """ids, mask [B, L] (host) -> T5 last hidden state, device float32 [B, L, d_model]."""
        return t5_encode(self.t5_params, self.t5_config, ids, mask)

    def denoise(self, x, context, mask, on_layer=None):
        """One MMJiT forward on device arrays: [B, C, H, W], [B, L, Dc], [B, L] -> x0 [B, C, H, W]."""
        with forked(self.fork_streams):
            return mmjit_forward(self.mmjit_params, self.mmjit_config, x, context, mask, on_layer)

    def embed_prompt(self, context, mask):
        """The prompt-only part of the forward, once per sampler call: [B, L, Dc], [B, L] -> the
        text stream [B, L, D] after the preamble blocks."""
        return embed_prompt(self.mmjit_params, self.mmjit_config, context, mask)

    def denoise_embedded(self, x, prompt):
        """The sampler's replayed step's forward: x [B, C, H, W], `embed_prompt`'s [B, L, D] -> x0."""
        with forked(self.fork_streams):
            return denoise_embedded(self.mmjit_params, self.mmjit_config, x, prompt)

    def denoise_student(self, x, h, omega, t_min, t_max, context, mask, on_layer=None):
        """One Mean Flow student forward on device arrays: [B, C, H, W], scalars float32 [B] each,
        [B, L, Dc], [B, L] -> x0 [B, C, H, W]."""
        with forked(self.fork_streams):
            return mean_flow_forward(self.mmjit_params, self.mmjit_config, x, h, omega, t_min, t_max, context, mask,
                                     on_layer)

    def sample(self, noise, context, mask, steps, cfg_scale, a_min, callback=None) -> np.ndarray:
        """Host noise [B, C, H, W] -> final image state [B, C, H, W] as float32 NumPy."""
        state = sample_on_device(self.embed_prompt, self.denoise_embedded, noise, *self.prompt_on_device(context, mask),
                                 steps, cfg_scale, a_min, callback, self.use_graph, self.graphs)
        return self.to_host(state)

    def sample_mean_flow(self, noise, context, mask, steps, omega, interval, callback=None) -> np.ndarray:
        """The student's few-step sampler: host noise [B, C, H, W] -> final image state [B, C, H, W]
        as float32 NumPy (guidance scale omega, guidance interval (t_min, t_max))."""
        state = sample_mean_flow_on_device(self.denoise_student, noise, *self.prompt_on_device(context, mask),
                                           steps, omega, interval, callback, self.use_graph, self.graphs)
        return self.to_host(state)

    def prompt_on_device(self, context, mask):
        """T5 context [B, L, Dc] and mask [B, L] -> device arrays: context in the network dtype, mask fp32."""
        # the mask is only compared with 0.5: no bf16 ufunc needed
        return self.cp.asarray(context).astype(self.dtype), self.cp.asarray(mask, dtype=np.float32)

    def to_host(self, array) -> np.ndarray:
        """Device or host array -> float32 NumPy (a device-to-host copy for device arrays)."""
        if isinstance(array, self.cp.ndarray):
            array = self.cp.asnumpy(array)
        return np.asarray(array, dtype=np.float32)


class CudasimRunner(CupyRunner):
    """The same twin with no GPU: cudasim runs the CUDA kernels on the CPU (one fiber per CUDA
    thread) and its NumPy stand-in plays CuPy. Slow; for tests, tracing and debugging kernels."""

    name = "cudasim"

    @staticmethod
    def array_module():
        from minit2i.cudasim import standin

        return use_array_module(standin, standin.gemm)

    # Kernels are compiled when first launched: a build fault (g++ broken, cache full) is a
    # problem of the environment, said in one line.
    def encode(self, ids, mask):
        with _build_faults_as_user_errors():
            return super().encode(ids, mask)

    def sample(self, *args, **kwargs) -> np.ndarray:
        with _build_faults_as_user_errors():
            return super().sample(*args, **kwargs)

    def sample_mean_flow(self, *args, **kwargs) -> np.ndarray:
        with _build_faults_as_user_errors():
            return super().sample_mean_flow(*args, **kwargs)


@contextlib.contextmanager
def _build_faults_as_user_errors():
    from minit2i.cudasim import BuildError

    try:
        yield
    except BuildError as err:
        lines = str(err).splitlines()
        detail = f" ({lines[1].strip()[:120]})" if len(lines) > 1 else ""
        raise MiniT2IError(f"the cudasim backend could not build its kernels: {lines[0]}{detail}") from None
