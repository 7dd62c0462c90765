"""The fused CUDA kernels (`accelerated/kernels/*.cu`): compile once, validate, launch.

Each .cu file defines one extern "C" entry point per storage dtype (`rms_norm_f32`,
`rms_norm_f16`, `rms_norm_bf16`, ...); every kernel computes in fp32. A source is compiled
with `cupy.RawModule` the first time one of its kernels is needed and the module is cached
(CuPy also keeps the binary in its on-disk kernel cache).

The wrappers check shapes, dtypes and C-contiguity before launching, because a RawKernel does
none of that: it reads raw pointers, ignores strides and takes a Python float as a double
(scalars are therefore always passed as np.int32 / np.int64 / np.float32). `launch_counts`
counts launches per kernel name, so tests can prove that the fused paths actually ran.

Importing this module never needs CuPy; `require_gpu()` is the one place that decides whether
the CuPy backend can run and says why not.

The seam: every module of the twin reaches the device through `cp` (`from .kernels import cp`),
which forwards to the array module chosen by `use_array_module`: real CuPy on a GPU, or
cudasim's NumPy stand-in, whose RawModule runs these same CUDA sources on the CPU. GEMMs go
through `gemm`, which calls the GEMM chosen with the array module: cublasGemmEx through ctypes
on CuPy (accelerated/cublas.py: CuPy's own cuBLAS wrappers refuse to run inside a graph
capture), the stand-in's `gemm` on cudasim.
"""

from __future__ import annotations

import weakref
from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np

from minit2i.core.errors import MiniT2IError
from minit2i.core.mmjit_config import NORM_EPS

from . import cublas

try:
    import cupy as _cupy
except ImportError:  # the numpy backend and the no-GPU tests run without CuPy
    _cupy = None

KERNEL_DIR = Path(__file__).parent / "kernels"
SOURCES = ("rmsnorm.cu", "swiglu.cu", "rope.cu", "attention.cu", "attention_tc.cu", "sampler.cu")
DTYPE_SUFFIXES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
COMMON_HEADER = "common.cuh"
PTX_HEADER = "ptx.cuh"  # mma.sync, ldmatrix, cp.async: the instruction on a GPU, its semantics on cudasim
NVRTC_OPTIONS = ("-std=c++17",)
THREADS = 256  # rmsnorm (a warp per row), swiglu, sampler: any multiple of 32 up to 1024 works
HEAD_WARPS = 4  # qkv_heads: warps per block (each takes 32 / its group size head vectors at a time)
MAX_GRID_Y = 65535  # the most blocks a grid's y dimension may have

# Tile sizes the CUDA sources and these wrappers share. `kernel_source` writes each entry of
# KERNEL_CONSTANTS as a #define at the top of every source, so each exists once: the .cu files
# use them and define none (tests/test_kernel_sources.py checks both).
ATTENTION_WARPS = 4  # attention.cu: 4 warps x 8 query rows per block
ATTENTION_ROWS_PER_WARP = 8
MMA_WARPS = 4  # attention_tc.cu: warps of a block, each with MMA_ATOMS[Dp] atoms of 16 query rows (mma's m)
# attention_tc.cu: m16 atoms a warp keeps, by padded head dim. Two at Dp 64: each ldmatrix'd K or V
# fragment then feeds two MMAs (FlashAttention-2's 32 rows a warp); one at Dp 128, whose O
# accumulators would not fit twice in a thread's registers.
MMA_ATOMS = {64: 2, 128: 1}
# attention_tc.cu: keys per double-buffered K/V tile, by padded head dim. 64 at Dp 64 halves the
# barriers, O's rescales and the loop's own instructions per key against 32; its S (2 atoms x 16 x
# 64 fp32 a warp) fits the registers once Q's fragments are re-read each tile. At Dp 128, 64 keys
# would take the shared memory past 48 KiB (Q 16 + K and V 64 KiB), which needs an opt-in.
MMA_KEY_TILES = {64: 64, 128: 32}
KEY_TILE = 32  # attention.cu: keys staged in shared memory per step
MAX_HEAD_DIM = 128
KERNEL_CONSTANTS = {
    "WARPS": ATTENTION_WARPS,
    "ROWS_PER_WARP": ATTENTION_ROWS_PER_WARP,
    "ROWS_PER_BLOCK": ATTENTION_WARPS * ATTENTION_ROWS_PER_WARP,
    "KEY_TILE": KEY_TILE,
    "MAX_DIMS_PER_LANE": MAX_HEAD_DIM // 32,  # head dims d = lane + 32 c
    # At least 3 resident blocks per SM lets ptxas keep attention.cu's ~160 live registers per
    # thread instead of spilling on sm_90 (tests/test_kernels_compile.py).
    "MIN_BLOCKS_PER_SM": 3,
    "MMA_WARPS": MMA_WARPS,
    "MMA_ATOMS_D64": MMA_ATOMS[64],
    "MMA_ATOMS_D128": MMA_ATOMS[128],
    "MMA_KEY_TILE_D64": MMA_KEY_TILES[64],
    "MMA_KEY_TILE_D128": MMA_KEY_TILES[128],
    # Resident blocks per SM the register budget is set for (__launch_bounds__): 2 x 48 KiB of
    # shared memory and <= 255 registers a thread at Dh <= 64 (two atoms a warp and a 64-key S
    # need 230-242; at 3 blocks, 168, ptxas spills); 2 x 48 KiB at Dh <= 128.
    "MMA_MIN_BLOCKS_D64": 2,
    "MMA_MIN_BLOCKS_D128": 2,
    "MAX_PAIRS_PER_LANE": MAX_HEAD_DIM // 64,  # rope.cu: 32 lanes x 2 pairs x 2 values
    # rmsnorm.cu: 16-byte packs a lane keeps in registers, so rows up to 32 x 8 packs (2048 fp16 / bf16
    # values, 1024 fp32: B/16, L/16 and T5-large) are read once
    "NORM_PACKS_PER_LANE": 8,
}
TENSOR_CORE_DTYPES = ("float16", "bfloat16")  # attention on tensor cores; fp32 stays on CUDA cores
MMA_HEAD_DIMS = (64, 128)  # the padded head dims attention_tc.cu is compiled for (entry points _tc_, _tc_d128_)
DEFAULT_SHARED_BYTES = 48 * 1024

launch_counts: Counter = Counter()
_device_caches: list = []
# The runners' captured sampler steps (sampler.StepGraphs), which read the cached tables: they go
# when the tables go. Weak: a runner's graphs live as long as the runner.
_graph_caches: weakref.WeakSet = weakref.WeakSet()


class ArrayModule:
    """Forwards `cp.<name>` to the selected array module (CuPy, or cudasim.standin).

    `gemm(x, w_t, out, beta, handle)` is the GEMM that goes with it (see `gemm` below).
    """

    def __init__(self):
        self.target, self.gemm = None, None

    def __getattr__(self, name):
        if self.target is None:
            raise MiniT2IError("no device selected: build a CupyRunner or CudasimRunner first")
        return getattr(self.target, name)


cp = ArrayModule()


def device_cache(maxsize: int):
    """lru_cache for functions that return device arrays; emptied when the array module changes."""
    def wrap(function):
        cached = lru_cache(maxsize=maxsize)(function)
        _device_caches.append(cached)
        return cached
    return wrap


def register_graph_cache(graphs) -> None:
    """Have `clear_device_caches` clear `graphs` (a `cache_clear()` of their own) too."""
    _graph_caches.add(graphs)


def clear_device_caches() -> None:
    """Forget every compiled module, cached device array and captured step built on them (the
    next use builds them anew)."""
    for cached in [*_device_caches, *_graph_caches]:
        cached.cache_clear()


def use_array_module(module, gemm):
    """Point the twin at `module` (cupy or cudasim.standin) and its `gemm(x, w_t, out, beta, handle)`;
    returns the seam object `cp`."""
    if cp.target is not module:
        clear_device_caches()
        cp.target = module
    cp.gemm = gemm
    return cp

_FIX = ("pip install -e '.[gpu-cuda12]' (or '.[gpu-cuda13]' for a CUDA 13 driver) on a machine with an "
        "NVIDIA GPU, or use --backend numpy")


def require_gpu():
    """Select CuPy and return the seam `cp`, or raise MiniT2IError naming what is missing and the fix."""
    if _cupy is None:
        raise MiniT2IError(f"--backend cupy needs CuPy and an NVIDIA GPU: CuPy is not installed; {_FIX}")
    try:
        count = _cupy.cuda.runtime.getDeviceCount()
    except _cupy.cuda.runtime.CUDARuntimeError as err:
        reason = str(err).split(":")[0]
        raise MiniT2IError(f"--backend cupy needs CuPy and an NVIDIA GPU: no usable CUDA driver ({reason}); {_FIX}") from None
    if count == 0:
        raise MiniT2IError(f"--backend cupy needs CuPy and an NVIDIA GPU: no GPU is visible; {_FIX}")
    return use_array_module(_cupy, cublas.gemm)


def bfloat16_dtype():
    """The NumPy bfloat16 dtype CuPy >= 14 uses (from ml_dtypes), or a clear error."""
    try:
        import ml_dtypes
    except ImportError:
        raise MiniT2IError("--precision bf16 needs the ml_dtypes package (CuPy's bfloat16 dtype); "
                           "pip install ml_dtypes, or use --precision fp16") from None
    return np.dtype(ml_dtypes.bfloat16)


def kernel_source(source: str) -> str:
    """A .cu file as NVRTC compiles it: `KERNEL_CONSTANTS` as #defines, then the source with
    common.cuh and ptx.cuh pasted in place of their #includes.

    CuPy's kernel cache is keyed by the source text, so the header and the constants must be
    part of that text (with -I, an edited header would silently reuse stale binaries).
    """
    defines = "".join(f"#define {name} {value}\n" for name, value in KERNEL_CONSTANTS.items())
    body = (KERNEL_DIR / source).read_text()
    for header in (COMMON_HEADER, PTX_HEADER):
        body = body.replace(f'#include "{header}"', (KERNEL_DIR / header).read_text(), 1)
    return defines + body


@device_cache(maxsize=None)
def _module(source: str):
    return cp.RawModule(code=kernel_source(source), options=NVRTC_OPTIONS)


@device_cache(maxsize=None)
def _function(source: str, full_name: str):
    """The RawKernel, looked up once: launches are host-bound, so none of it per call."""
    return _module(source).get_function(full_name)


def _kernel(source: str, name: str, dtype):
    """The `name` kernel for `dtype` (e.g. rms_norm_bf16), counted as one launch."""
    suffix = DTYPE_SUFFIXES.get(np.dtype(dtype).name)
    if suffix is None:
        raise MiniT2IError(f"GPU kernels support {', '.join(DTYPE_SUFFIXES)}, not {np.dtype(dtype).name}")
    launch_counts[name] += 1
    return _function(source, f"{name}_{suffix}")


def _check(name: str, array, dtype, shape=None):
    """A RawKernel reads raw memory: insist on the exact dtype, shape and C layout."""
    if array.dtype != dtype:
        raise MiniT2IError(f"kernel argument {name} has dtype {array.dtype}, expected {np.dtype(dtype)}")
    if shape is not None and tuple(array.shape) != tuple(shape):
        raise MiniT2IError(f"kernel argument {name} has shape {tuple(array.shape)}, expected {tuple(shape)}")
    if not array.flags.c_contiguous:
        raise MiniT2IError(f"kernel argument {name} is not C-contiguous; pass cupy.ascontiguousarray(...)")


def _blocks(total: int, per_block: int = THREADS) -> int:
    return max(1, min((total + per_block - 1) // per_block, 65535))


# ---------------------------------------------------------------------------------------------
# Wrappers


def _norm_blocks(rows: int) -> int:
    """rmsnorm.cu's grid: one warp per row."""
    return -(-rows // (THREADS // 32))


def rms_norm(x, weight, eps: float = NORM_EPS, out=None):
    """[..., D], [D] -> [..., D]; one warp per row."""
    width = x.shape[-1]
    _check("x", x, x.dtype)
    _check("weight", weight, x.dtype, (width,))
    out = cp.empty_like(x) if out is None else out
    _check("out", out, x.dtype, x.shape)
    rows = x.size // max(width, 1)
    if rows and width:  # an empty input has nothing to do (a (0, 1, 1) grid is an invalid launch)
        _kernel("rmsnorm.cu", "rms_norm", x.dtype)((_norm_blocks(rows),), (THREADS,),
                                                   (x, weight, out, np.int32(width), np.float32(eps), np.int32(rows)))
    return out


def add_rms_norm(residual, delta, bias, weight, eps: float = NORM_EPS, out=None):
    """residual += delta + bias (in place), then -> rms_norm(residual): all [..., D], bias/weight [D]."""
    width = residual.shape[-1]
    _check("residual", residual, residual.dtype)
    _check("delta", delta, residual.dtype, residual.shape)
    _check("bias", bias, residual.dtype, (width,))
    _check("weight", weight, residual.dtype, (width,))
    out = cp.empty_like(residual) if out is None else out
    _check("out", out, residual.dtype, residual.shape)
    rows = residual.size // max(width, 1)
    if rows and width:
        _kernel("rmsnorm.cu", "add_rms_norm", residual.dtype)(
            (_norm_blocks(rows),), (THREADS,),
            (residual, delta, bias, weight, out, np.int32(width), np.float32(eps), np.int32(rows)))
    return out


def gated_activation(packed, activation: str):
    """[..., 2*hidden] (gate | up) -> [..., hidden]: act(gate) * up; activation 'swiglu' or 'geglu'."""
    if activation not in ("swiglu", "geglu"):
        raise MiniT2IError(f"unknown gated activation {activation!r}; use 'swiglu' or 'geglu'")
    _check("packed", packed, packed.dtype)
    if packed.shape[-1] % 2:
        raise MiniT2IError(f"packed gate|up width {packed.shape[-1]} is odd; concatenate W_gate and W_up")
    hidden = packed.shape[-1] // 2
    out = cp.empty((*packed.shape[:-1], hidden), dtype=packed.dtype)
    rows = out.size // max(hidden, 1)
    if rows and hidden:
        # x: enough threads for a row's 16-byte packs (the by-value path strides over the rest); y: rows
        packs = -(-hidden // (16 // packed.dtype.itemsize))
        _kernel("swiglu.cu", activation, packed.dtype)(
            (_blocks(packs), min(rows, MAX_GRID_Y)), (THREADS,), (packed, out, np.int32(hidden), np.int32(rows)))
    return out


def qkv_heads(qkv, bias, heads: int, q, k, v, offset: int = 0, norms=None, rope=None, eps: float = NORM_EPS):
    """Packed qkv [B, L, 3*H*Dh] + bias [3*H*Dh] -> rows offset..offset+L-1 of q, k, v [B, H, Lt, Dh].

    norms: (q_norm, k_norm) weights [Dh] for the per-head RMSNorm, or None;
    rope: (cos, sin) float32 [Lt, Dh/2] tables, or None. Writes q, k, v in place.
    """
    batch, length, packed_width = qkv.shape
    head_dim = packed_width // (3 * heads)
    total_length = q.shape[2]
    dtype = qkv.dtype
    if head_dim * 3 * heads != packed_width or head_dim % 2 or head_dim > MAX_HEAD_DIM:
        raise MiniT2IError(f"qkv width {packed_width} is not 3*{heads}*head_dim with an even head_dim <= {MAX_HEAD_DIM}")
    if offset < 0 or offset + length > total_length:
        raise MiniT2IError(f"rows {offset}..{offset + length} do not fit in a {total_length}-row q/k/v buffer")
    _check("qkv", qkv, dtype)
    _check("bias", bias, dtype, (packed_width,))
    for name, buffer in (("q", q), ("k", k), ("v", v)):
        _check(name, buffer, dtype, (batch, heads, total_length, head_dim))
    q_norm, k_norm = norms if norms is not None else (bias, bias)  # unread when the norm is off
    if norms is not None:
        _check("q_norm", q_norm, dtype, (head_dim,))
        _check("k_norm", k_norm, dtype, (head_dim,))
    cos, sin = rope if rope is not None else (_placeholder(), _placeholder())
    if rope is not None:
        _check("cos", cos, np.float32, (total_length, head_dim // 2))
        _check("sin", sin, np.float32, (total_length, head_dim // 2))
    vectors = batch * length * 3 * heads
    if vectors == 0:
        return
    if vectors >= 2**31:
        raise MiniT2IError(f"qkv_heads takes at most 2^31 - 1 head vectors, not {vectors}: split the batch")
    # A lane per 16-byte pack pair of a head vector (the by-value path and the grid stride cover any grid).
    lanes = -(-head_dim // (2 * 16 // np.dtype(dtype).itemsize))
    _kernel("rope.cu", "qkv_heads", dtype)(
        (_blocks(vectors * lanes, HEAD_WARPS * 32),), (HEAD_WARPS * 32,),
        (qkv, bias, q_norm, k_norm, cos, sin, q, k, v, np.int32(batch), np.int32(length), np.int32(heads),
         np.int32(head_dim), np.int32(total_length), np.int32(offset), np.int32(norms is not None),
         np.int32(rope is not None), np.float32(eps)))


def mma_head_dim(head_dim: int) -> int:
    """The padded head dim of the tensor-core kernel: 64 up to 64 (52 -> 64), else 128."""
    return next(padded for padded in MMA_HEAD_DIMS if head_dim <= padded)


def mma_rows(head_dim: int) -> int:
    """Query rows a block of the tensor-core kernel takes: its warps' atoms of 16."""
    return MMA_WARPS * 16 * MMA_ATOMS[mma_head_dim(head_dim)]


def attention_shared_bytes(head_dim: int, dtype) -> int:
    """Dynamic shared memory of the attention kernel for `dtype` (see the two sources' layouts)."""
    if np.dtype(dtype).name in TENSOR_CORE_DTYPES:
        # Q [mma_rows, Dp], K and V [2 buffers, MMA_KEY_TILES[Dp], Dp], 16-bit
        padded = mma_head_dim(head_dim)
        return 2 * (mma_rows(head_dim) + 4 * MMA_KEY_TILES[padded]) * padded
    # Q [ROWS_PER_BLOCK, Dh], K [KEY_TILE, Dh + 1] (padded against bank conflicts), V [KEY_TILE, Dh]
    return 4 * (KERNEL_CONSTANTS["ROWS_PER_BLOCK"] * head_dim + KEY_TILE * (2 * head_dim + 1))


def attention(q, k, v, scale: float, bias=None, key_mask=None):
    """Flash-style attention: q [B, H, Lq, Dh], k/v [B, H, Lk, Dh] -> [B, Lq, H*Dh] (heads merged).

    bias: float32 [H, Lq, Lk] added to the scores; key_mask: float32 [B, Lk], 1 keep / 0 pad.
    fp16 and bf16 run on tensor cores (attention_tc.cu, head_dim a multiple of 4: its rows are
    copied in 8-byte pieces at least), fp32 on CUDA cores (attention.cu).
    """
    batch, heads, lq, head_dim = q.shape
    lk = k.shape[2]
    dtype = q.dtype
    if head_dim > MAX_HEAD_DIM:
        raise MiniT2IError(f"attention head_dim {head_dim} > {MAX_HEAD_DIM} is not supported by the kernel")
    if min(batch, heads, lq, lk, head_dim) < 1:
        raise MiniT2IError(f"attention needs non-empty q {tuple(q.shape)} and k {tuple(k.shape)}")
    _check("q", q, dtype)
    _check("k", k, dtype, (batch, heads, lk, head_dim))
    _check("v", v, dtype, (batch, heads, lk, head_dim))
    if bias is not None:
        _check("bias", bias, np.float32, (heads, lq, lk))
    if key_mask is not None:
        _check("key_mask", key_mask, np.float32, (batch, lk))
    out = cp.empty((batch, lq, heads * head_dim), dtype=dtype)
    shared = attention_shared_bytes(head_dim, dtype)
    if np.dtype(dtype).name in TENSOR_CORE_DTYPES:
        if head_dim % 4:
            raise MiniT2IError(f"fp16/bf16 attention needs a head_dim that is a multiple of 4, not {head_dim}; "
                               "use fp32 precision")
        name = "flash_attention_tc" if mma_head_dim(head_dim) == 64 else "flash_attention_tc_d128"
        kernel, rows, warps = _kernel("attention_tc.cu", name, dtype), mma_rows(head_dim), MMA_WARPS
    else:
        kernel, rows, warps = (_kernel("attention.cu", "flash_attention", dtype), KERNEL_CONSTANTS["ROWS_PER_BLOCK"],
                               ATTENTION_WARPS)
    if shared > DEFAULT_SHARED_BYTES:
        kernel.max_dynamic_shared_size_bytes = shared
    grid = ((lq + rows - 1) // rows, batch * heads)
    kernel(grid, (warps * 32,),
           (q, k, v, _placeholder() if bias is None else bias, _placeholder() if key_mask is None else key_mask,
            out, np.int32(heads), np.int32(lq), np.int32(lk), np.int32(head_dim), np.float32(scale),
            np.int32(bias is not None), np.int32(key_mask is not None)),
           shared_mem=shared)
    return out


def gemm(x, w_t, accumulate=None):
    """[M, K] @ [K, N] -> [M, N] in x's dtype with fp32 accumulation: one cublasGemmEx on CuPy,
    which a graph capture can record (cp.matmul cannot be captured on CuPy 14).

    x may also be [B, M, K] whose matrices are C-contiguous and a stride apart (one stream's rows of
    a larger array, read where they are: one strided batched GEMM) -> [B, M, N]. `accumulate`, a
    C-contiguous array of the product's shape and dtype, receives the sum instead: accumulate +=
    x @ w_t as cuBLAS's beta = 1 (fp32 sum of the product and the old value, rounded once); it is
    returned.
    """
    k, n = x.shape[-1], w_t.shape[1]
    _check_rows("x", x)
    _check("w_t", w_t, x.dtype, (k, n))
    shape = (*x.shape[:-1], n)
    if accumulate is not None:
        _check("accumulate", accumulate, x.dtype, shape)
    if 0 in (*shape, k):  # nothing for cuBLAS to do (and its leading dimensions must be >= 1)
        return cp.zeros(shape, dtype=x.dtype) if accumulate is None else accumulate
    out = cp.empty(shape, dtype=x.dtype) if accumulate is None else accumulate
    cp.gemm(x, w_t, out, 0.0 if accumulate is None else 1.0, gemm_handle())
    return out


def gemm_handle() -> int:
    """The cuBLAS handle for the current stream: 1 on the text stream, 0 on any other (two
    streams that run GEMMs at once need a workspace each; accelerated/cublas.py)."""
    return int(cp.cuda.get_current_stream() == text_stream())


@device_cache(maxsize=None)
def _text_stream_for_device(device_id: int):
    return cp.cuda.Stream(non_blocking=True)


def text_stream():
    """The device's second stream, on which a forward runs its text stream's work
    (accelerated/streams.py); created once, like the handles."""
    return _text_stream_for_device(cp.cuda.runtime.getDevice())


def _check_rows(name: str, x):
    """A GEMM operand: 2-D C-contiguous, or 3-D whose matrices are C-contiguous (any batch stride)."""
    matrices_contiguous = x.ndim == 3 and x.strides[1:] == (x.shape[2] * x.itemsize, x.itemsize)
    if not (x.ndim == 2 and x.flags.c_contiguous or matrices_contiguous and x.strides[0] % x.itemsize == 0):
        raise MiniT2IError(f"kernel argument {name} is not C-contiguous; pass cupy.ascontiguousarray(...)")


def cfg_euler(state, next_input, x0_both, x0_guided, cfg_scale: float, factor):
    """One guided Euler step in place: state/x0_guided float32 [B, ...], next_input/x0_both [2B, ...].

    factor is a float32 device array [1] (so a captured graph can be replayed with a new value).
    """
    n = state.size
    _check("state", state, np.float32)
    _check("x0_guided", x0_guided, np.float32, state.shape)
    _check("x0_both", x0_both, x0_both.dtype, (2 * state.shape[0], *state.shape[1:]))
    _check("next_input", next_input, x0_both.dtype, x0_both.shape)
    _check("factor", factor, np.float32, (1,))
    _kernel("sampler.cu", "cfg_euler", x0_both.dtype)(
        (_blocks(n),), (THREADS,), (state, next_input, x0_both, x0_guided, np.int64(n), np.float32(cfg_scale), factor))


def student_euler(state, next_input, x0, factor):
    """The Mean Flow student's Euler step in place (kernel `euler_step`; no guidance branch, unlike
    cfg_euler): state float32 [B, ...] += f (x0 - state); next_input [B, ...] (x0's dtype) <- the
    new state. factor: float32 device array [1] (read at run time, as in cfg_euler)."""
    n = state.size
    _check("state", state, np.float32)
    _check("x0", x0, x0.dtype, state.shape)
    _check("next_input", next_input, x0.dtype, state.shape)
    _check("factor", factor, np.float32, (1,))
    _kernel("sampler.cu", "euler_step", x0.dtype)(
        (_blocks(n),), (THREADS,), (state, next_input, x0, np.int64(n), factor))


@device_cache(maxsize=None)
def _placeholder_for_device(device_id: int):
    return cp.zeros(1, dtype=np.float32)


def _placeholder():
    """A valid pointer for an optional argument the kernel is told not to read."""
    return _placeholder_for_device(cp.cuda.runtime.getDevice())
