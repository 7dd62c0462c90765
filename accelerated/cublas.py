"""The twin's GEMM: cublasGemmEx through ctypes, so that a CUDA graph can capture it.

CuPy 14.2 refuses every cuBLAS call while a stream captures: each of its cuBLAS wrappers first
calls `setStream`, which raises NotImplementedError during a capture
(cupy_backends/cuda/libs/cublas.pyx; cupy#6290). cuBLAS itself can be captured once it has a
workspace of its own, so that it allocates nothing during the capture (NVIDIA cuBLAS docs,
"CUDA Graphs support"). This module calls libcublas directly, found as CuPy 14 finds it
(`cuda.pathfinder.load_nvidia_dynamic_lib("cublas")`):

* two handles per device, created on first use, each with a preallocated 32 MiB workspace
  (NVIDIA's recommendation for Hopper) kept alive with it: handle 0 serves the current stream,
  handle 1 the text stream that a forward forks (accelerated/streams.py);
* the handle's stream is set only when it changes, and the workspace after each change, because
  `cublasSetStream` resets the workspace to cuBLAS's own pool;
* math mode stays cuBLAS's default (no TF32): fp32 stays IEEE fp32, as with CuPy's default;
* a GEMM is `cublasGemmEx` with CUBLAS_COMPUTE_32F (fp32 accumulation for fp32, fp16 and
  bf16 inputs, output in the input dtype), alpha = 1 and beta = 0 or 1 as host floats, which a
  capture records by value. beta = 1 adds the product into the output (a residual stream):
  with CUBLAS_COMPUTE_32F the scale type is CUDA_R_32F (cuBLAS docs, cublasGemmEx's table of
  types), so cuBLAS reads C, forms alpha * (A B) + beta * C in fp32 and rounds once to C's dtype;
* a product of rows that are not one contiguous matrix (one stream's rows of the attention
  output, [B, N, D] inside [B, L + N, D]) is one `cublasGemmStridedBatchedEx` over the batch:
  the same arguments, each sample's matrices a stride apart, the weight shared (stride 0).

Two streams that run GEMMs at the same time must not share a workspace (cuBLAS docs,
cublasSetWorkspace: a workspace belongs to one stream at a time), hence a handle and a workspace
for each of the two streams a forward runs at once. Each handle's GEMMs are issued to one stream
at a time, so they run one after another, eagerly and in a captured graph alike: the graph keeps
each stream's order, every GEMM node of handle 1 lies on the text stream's chain and every one
of handle 0 on the main stream's, and the workspace's address is what the nodes hold. Kept graphs
share the two workspaces and replay one after another on one stream; the streams that handle 0
serves in turn (the default stream, a call's capture stream) never run at once (the sampler
synchronises before it switches to its capture stream and after it). Constants and signatures
are those of cublas_api.h and library_types.h.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache

import numpy as np

from minit2i.core.errors import MiniT2IError

try:
    import cupy as _cupy
except ImportError:  # the pure parts below are tested without CuPy
    _cupy = None

CUBLAS_OP_N = 0
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
CUDA_DATA_TYPES = {"float32": 0, "float16": 2, "bfloat16": 14}  # CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF
STATUS_NAMES = {
    0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
    7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
    13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED",
    16: "CUBLAS_STATUS_LICENSE_ERROR",
}
WORKSPACE_BYTES = 32 * 2**20

# The C signatures of the five functions used (every one returns a cublasStatus_t).
_HANDLE, _POINTER, _INT, _STRIDE = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
SIGNATURES = {
    "cublasCreate_v2": (ctypes.POINTER(_HANDLE),),
    "cublasSetStream_v2": (_HANDLE, _POINTER),
    "cublasSetWorkspace_v2": (_HANDLE, _POINTER, ctypes.c_size_t),
    "cublasGemmEx": (_HANDLE, _INT, _INT, _INT, _INT, _INT, _POINTER, _POINTER, _INT, _INT, _POINTER, _INT, _INT,
                     _POINTER, _POINTER, _INT, _INT, _INT, _INT),
    "cublasGemmStridedBatchedEx": (_HANDLE, _INT, _INT, _INT, _INT, _INT, _POINTER, _POINTER, _INT, _INT, _STRIDE,
                                   _POINTER, _INT, _INT, _STRIDE, _POINTER, _POINTER, _INT, _INT, _STRIDE, _INT, _INT,
                                   _INT),
}


class CublasError(RuntimeError):
    """A cuBLAS call failed. A RuntimeError, so that a failure inside a graph capture makes the
    sampler fall back to eager steps (sampler.try_capture) like any other refused capture."""


def status_name(status: int) -> str:
    return STATUS_NAMES.get(status, f"unknown cublasStatus_t {status}")


def check(call: str, status: int) -> None:
    if status != 0:
        raise CublasError(f"{call} failed: {status_name(status)}")


def cuda_data_type(dtype) -> int:
    """NumPy dtype -> cudaDataType_t of its elements."""
    name = np.dtype(dtype).name
    if name not in CUDA_DATA_TYPES:
        raise MiniT2IError(f"the cuBLAS GEMM takes {', '.join(CUDA_DATA_TYPES)}, not {name}")
    return CUDA_DATA_TYPES[name]


def gemm_ex_arguments(handle, x, w_t, out, m: int, k: int, n: int, data_type: int, alpha, beta) -> tuple:
    """cublasGemmEx's arguments for row-major out[m, n] = x[m, k] @ w_t[k, n] (C-contiguous).

    cuBLAS is column-major, where a row-major [r, c] array is its transpose [c, r]; so the call
    computes out^T [n, m] = w_t^T [n, k] @ x^T [k, m]: A = w_t, B = x, no transposes, and each
    leading dimension is the row length of the row-major array.
    """
    return (handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, alpha, w_t, data_type, n, x, data_type, k, beta,
            out, data_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)


@dataclass(frozen=True)
class Batch:
    """`count` products out_b = x_b @ w_t, x_b and out_b `x_stride` and `out_stride` elements after
    x_{b-1} and out_{b-1} (w_t shared)."""

    count: int
    x_stride: int
    out_stride: int


def strided_batched_arguments(handle, x, w_t, out, m: int, k: int, n: int, data_type: int, alpha, beta,
                              batch: Batch) -> tuple:
    """cublasGemmStridedBatchedEx's arguments for out_b[m, n] = x_b[m, k] @ w_t[k, n], b < batch.count:
    `gemm_ex_arguments` with a stride after each matrix (0 for the shared w_t) and the count."""
    (handle, op_a, op_b, n, m, k, alpha, w_t, type_a, lda, x, type_b, ldb, beta, out, type_c, ldc, compute,
     algo) = gemm_ex_arguments(handle, x, w_t, out, m, k, n, data_type, alpha, beta)
    return (handle, op_a, op_b, n, m, k, alpha, w_t, type_a, lda, 0, x, type_b, ldb, batch.x_stride, beta, out,
            type_c, ldc, batch.out_stride, batch.count, compute, algo)


def declare(library):
    """Give the library's five functions their C signatures (ctypes then converts and checks)."""
    for name, argtypes in SIGNATURES.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, ctypes.c_int
    return library


def load_library(load=None):
    """libcublas as a ctypes library, found as CuPy 14 finds it, or a one-line MiniT2IError."""
    try:
        if load is None:
            from cuda.pathfinder import load_nvidia_dynamic_lib as load
        path = load("cublas").abs_path
        if path is None:
            raise OSError("cuda.pathfinder found it loaded but not where from")
        return declare(ctypes.CDLL(path))
    except (ImportError, OSError, RuntimeError) as err:  # pathfinder's DynamicLibNotFoundError is a RuntimeError
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise MiniT2IError(f"the CuPy backend needs libcublas, which could not be loaded ({reason}); "
                           "pip install -e '.[gpu-cuda12]' (or '.[gpu-cuda13]') installs it with CuPy") from None


@dataclass
class Handle:
    """A cuBLAS handle and its workspace; `stream` is the stream last set (None: not yet)."""

    library: object
    pointer: ctypes.c_void_p
    workspace: object  # the device buffer: kept alive as long as the handle uses it
    workspace_pointer: int
    stream: int | None = None

    @classmethod
    def create(cls, library, workspace, workspace_pointer: int) -> "Handle":
        pointer = ctypes.c_void_p()
        check("cublasCreate_v2", library.cublasCreate_v2(ctypes.byref(pointer)))
        return cls(library, pointer, workspace, workspace_pointer)

    def use_stream(self, stream: int) -> None:
        """Set the stream when it changed, then the workspace again (cublasSetStream resets it)."""
        if stream == self.stream:
            return
        check("cublasSetStream_v2", self.library.cublasSetStream_v2(self.pointer, stream))
        check("cublasSetWorkspace_v2", self.library.cublasSetWorkspace_v2(self.pointer, self.workspace_pointer,
                                                                          WORKSPACE_BYTES))
        self.stream = stream

    def gemm(self, stream: int, x: int, w_t: int, out: int, m: int, k: int, n: int, dtype, beta: float = 0.0,
             batch: Batch | None = None) -> None:
        """out[m, n] = x[m, k] @ w_t[k, n] + beta out[m, n] on `stream` (x, w_t, out: device pointers),
        or that for each matrix of `batch`."""
        self.use_stream(stream)
        scalars = ctypes.byref(ctypes.c_float(1.0)), ctypes.byref(ctypes.c_float(beta))
        common = (self.pointer, x, w_t, out, m, k, n, cuda_data_type(dtype), *scalars)
        if batch is None:
            check("cublasGemmEx", self.library.cublasGemmEx(*gemm_ex_arguments(*common)))
        else:
            arguments = strided_batched_arguments(*common, batch)
            check("cublasGemmStridedBatchedEx", self.library.cublasGemmStridedBatchedEx(*arguments))


@cache
def library():
    return load_library()


@cache
def handle_for_device(device: int, number: int = 0) -> Handle:
    """The device's handle `number` (0: the current stream's, 1: the text stream's), created on
    first use and kept for the life of the process (as CuPy's own): the sampler's eager step 0
    creates both, so a capture never does."""
    workspace = _cupy.empty(WORKSPACE_BYTES, dtype=_cupy.uint8)
    return Handle.create(library(), workspace, workspace.data.ptr)


def gemm(x, w_t, out, beta: float = 0.0, handle: int = 0) -> None:
    """out = x @ w_t + beta out for CuPy arrays of one dtype, on the current CuPy stream with the
    device's handle number `handle`; allowed inside a graph capture once that handle exists. x
    [M, K] and out [M, N] C-contiguous, or x [B, M, K] with C-contiguous matrices a stride apart
    (one strided batched call) and out [B, M, N] C-contiguous; w_t [K, N] C-contiguous."""
    k, n = w_t.shape
    m = x.shape[-2]
    batch = None if x.ndim == 2 else Batch(x.shape[0], x.strides[0] // x.itemsize, m * n)
    handle_for_device(_cupy.cuda.runtime.getDevice(), handle).gemm(
        _cupy.cuda.get_current_stream().ptr, x.data.ptr, w_t.data.ptr, out.data.ptr, m, k, n, x.dtype, beta, batch)
