"""accelerated/cublas.py without a GPU: the argument mapping, the dtype and status tables, the
handle's call sequence and the loading failure, against fake libraries (libcublas is not here).
The GEMM itself runs on the GPU in tests/test_accelerated.py."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from minit2i.accelerated import cublas
from minit2i.core.errors import MiniT2IError


def column_major_gemm(arguments, memory: dict) -> None:
    """What cublasGemmEx computes, per the BLAS definition, on flat buffers named by `memory`'s keys:
    C = alpha op(A) op(B) + beta C, column-major (element (i, j) at i + j * ld)."""
    (_, transa, transb, m, n, k, alpha, a, _, lda, b, _, ldb, beta, c, _, ldc, compute, algo) = arguments
    assert (transa, transb, compute, algo) == (cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, cublas.CUBLAS_COMPUTE_32F,
                                               cublas.CUBLAS_GEMM_DEFAULT)
    assert lda >= m and ldb >= k and ldc >= m
    matrix_a = np.array([[memory[a][i + p * lda] for p in range(k)] for i in range(m)])
    matrix_b = np.array([[memory[b][p + j * ldb] for j in range(n)] for p in range(k)])
    product = alpha * matrix_a @ matrix_b
    for i in range(m):
        for j in range(n):
            memory[c][i + j * ldc] = product[i, j] + beta * memory[c][i + j * ldc]


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (2, 3, 4), (5, 1, 3), (4, 7, 1)])
def test_row_major_product_maps_to_the_column_major_call(m, k, n):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    x, w_t = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    memory = {"x": x.ravel().copy(), "w_t": w_t.ravel().copy(), "out": np.zeros(m * n)}
    arguments = cublas.gemm_ex_arguments("handle", "x", "w_t", "out", m, k, n, cublas.CUDA_DATA_TYPES["float32"],
                                         1.0, 0.0)
    column_major_gemm(arguments, memory)
    np.testing.assert_allclose(memory["out"].reshape(m, n), x @ w_t, rtol=1e-12)
    assert len(arguments) == len(cublas.SIGNATURES["cublasGemmEx"])


@pytest.mark.parametrize("dtype, expected", [(np.float32, 0), (np.float16, 2), (ml_dtypes.bfloat16, 14)])
def test_dtypes_map_to_cuda_data_types(dtype, expected):
    assert cublas.cuda_data_type(dtype) == expected


def test_other_dtypes_are_refused_in_one_line():
    with pytest.raises(MiniT2IError, match="^the cuBLAS GEMM takes float32, float16, bfloat16, not float64$"):
        cublas.cuda_data_type(np.float64)


@pytest.mark.parametrize("status, name", [(0, "CUBLAS_STATUS_SUCCESS"), (7, "CUBLAS_STATUS_INVALID_VALUE"),
                                          (15, "CUBLAS_STATUS_NOT_SUPPORTED"), (99, "unknown cublasStatus_t 99")])
def test_status_names(status, name):
    assert cublas.status_name(status) == name


def test_a_failed_call_raises_naming_the_call_and_status():
    cublas.check("cublasGemmEx", 0)
    with pytest.raises(cublas.CublasError, match="^cublasGemmEx failed: CUBLAS_STATUS_EXECUTION_FAILED$"):
        cublas.check("cublasGemmEx", 13)
    assert issubclass(cublas.CublasError, RuntimeError)  # a failed capture falls back to eager steps


class FakeLibrary:
    """The four functions the binding calls: each records (name, arguments) and returns `status`."""

    def __init__(self, fail: str | None = None):
        self.calls, self.fail = [], fail
        for name in cublas.SIGNATURES:
            setattr(self, name, self._function(name))

    def _function(self, name):
        def call(*arguments):
            if name == "cublasCreate_v2":
                arguments[0]._obj.value = 0x1234  # byref(c_void_p): cuBLAS writes the handle there
            self.calls.append((name, arguments))
            return 14 if name == self.fail else 0
        return call

    def names(self):
        return [name for name, _ in self.calls]


def test_declare_gives_every_function_its_c_signature():
    library = cublas.declare(FakeLibrary())
    for name, argtypes in cublas.SIGNATURES.items():
        assert getattr(library, name).argtypes == argtypes
        assert getattr(library, name).restype is ctypes.c_int


def test_the_handle_sets_stream_then_workspace_only_when_the_stream_changes():
    library = FakeLibrary()
    handle = cublas.Handle.create(library, workspace="buffer", workspace_pointer=0xAB00)
    assert handle.pointer.value == 0x1234
    handle.gemm(7, 0x10, 0x20, 0x30, 2, 3, 4, np.float16)
    handle.gemm(7, 0x10, 0x20, 0x30, 2, 3, 4, np.float16)
    handle.gemm(9, 0x10, 0x20, 0x30, 2, 3, 4, np.float16)
    assert library.names() == ["cublasCreate_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasGemmEx",
                               "cublasGemmEx", "cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasGemmEx"]
    streams = [arguments[1] for name, arguments in library.calls if name == "cublasSetStream_v2"]
    workspaces = [arguments[1:] for name, arguments in library.calls if name == "cublasSetWorkspace_v2"]
    assert streams == [7, 9] and workspaces == [(0xAB00, 32 * 2**20)] * 2
    gemm = library.calls[3][1]
    assert gemm[1:6] == (cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, 4, 2, 3)
    assert gemm[7:] == (0x20, 2, 4, 0x10, 2, 3, gemm[13], 0x30, 2, 4, 68, -1)
    assert (gemm[6]._obj.value, gemm[13]._obj.value) == (1.0, 0.0)  # alpha, beta: host floats


@pytest.mark.parametrize("failing", ["cublasCreate_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasGemmEx"])
def test_each_failing_call_is_named(failing):
    library = FakeLibrary(fail=failing)
    with pytest.raises(cublas.CublasError, match=f"^{failing} failed: CUBLAS_STATUS_INTERNAL_ERROR$"):
        cublas.Handle.create(library, "buffer", 0xAB00).gemm(7, 0x10, 0x20, 0x30, 2, 3, 4, np.float32)


def test_a_failed_stream_change_is_retried_on_the_next_call():
    library = FakeLibrary(fail="cublasSetWorkspace_v2")
    handle = cublas.Handle.create(library, "buffer", 0xAB00)
    with pytest.raises(cublas.CublasError):
        handle.use_stream(7)
    library.fail = None
    handle.use_stream(7)
    assert library.names()[-2:] == ["cublasSetStream_v2", "cublasSetWorkspace_v2"]


def test_a_library_that_cannot_be_found_is_one_line_with_the_fix():
    def not_found(name):
        assert name == "cublas"
        raise RuntimeError('Failure finding "libcublas.so.13 or libcublas.so.12": No such file\nsearched: ...')

    with pytest.raises(MiniT2IError) as err:
        cublas.load_library(not_found)
    assert str(err.value) == (
        'the CuPy backend needs libcublas, which could not be loaded (Failure finding "libcublas.so.13 or '
        'libcublas.so.12": No such file); pip install -e \'.[gpu-cuda12]\' (or \'.[gpu-cuda13]\') installs it with CuPy')


@pytest.mark.parametrize("path, reason", [(None, "cuda.pathfinder found it loaded but not where from"),
                                          ("/nonexistent/libcublas.so.12", "/nonexistent/libcublas.so.12")])
def test_a_library_that_cannot_be_opened_is_one_line(path, reason):
    with pytest.raises(MiniT2IError, match=f"could not be loaded \\({reason}"):
        cublas.load_library(lambda name: SimpleNamespace(abs_path=path))
