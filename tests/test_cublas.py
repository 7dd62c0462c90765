"""accelerated/cublas.py without a GPU: the argument mapping, the dtype and status tables, the
handle's call sequence and the loading failure, against fake libraries (libcublas is not here).
The GEMM itself runs on the GPU in tests/test_accelerated.py."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
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


def test_a_strided_batch_maps_each_sample_to_the_column_major_call():
    """Rows 1..3 of each of 2 samples of x [2, 4, 3] (a stride of 12 elements), w_t shared (stride
    0), added into out (beta = 1): each sample is the plain call's product on its own matrices."""
    rng = np.random.default_rng(3)
    joint, w_t, old = rng.standard_normal((2, 4, 3)), rng.standard_normal((3, 5)), rng.standard_normal((2, 3, 5))
    batch = cublas.Batch(2, x_stride=12, out_stride=15)
    arguments = cublas.strided_batched_arguments("handle", "x", "w_t", "out", 3, 3, 5, 0, 1.0, 1.0, batch)
    assert len(arguments) == len(cublas.SIGNATURES["cublasGemmStridedBatchedEx"])
    (handle, op_a, op_b, m, n, k, alpha, a, type_a, lda, stride_a, b, type_b, ldb, stride_b, beta, c, type_c, ldc,
     stride_c, count, compute, algo) = arguments
    assert (stride_a, stride_b, stride_c, count) == (0, 12, 15, 2)
    flat_x, out = joint.ravel()[3:], old.ravel().copy()  # x points at sample 0, row 1
    for i in range(count):
        memory = {"x": flat_x[i * stride_b:], "w_t": w_t.ravel(), "out": out[i * stride_c:i * stride_c + 15]}
        column_major_gemm((handle, op_a, op_b, m, n, k, alpha, a, type_a, lda, b, type_b, ldb, beta, c, type_c, ldc,
                           compute, algo), memory)
        out[i * stride_c:i * stride_c + 15] = memory["out"]
    np.testing.assert_allclose(out.reshape(2, 3, 5), joint[:, 1:] @ w_t + old, rtol=1e-12)


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
        'libcublas.so.12": No such file); '
        "pip install -e '.[gpu-cuda12]' (or '.[gpu-cuda13]') installs it with CuPy")


@pytest.mark.parametrize("path, reason", [(None, "cuda.pathfinder found it loaded but not where from"),
                                          ("/nonexistent/libcublas.so.12", "/nonexistent/libcublas.so.12")])
def test_a_library_that_cannot_be_opened_is_one_line(path, reason):
    with pytest.raises(MiniT2IError, match=f"could not be loaded \\({reason}"):
        cublas.load_library(lambda name: SimpleNamespace(abs_path=path))


# A stand-in libcublas in C with the real signatures (cublas_api.h), computing on host memory:
# the binding's ctypes declarations, argument order and column-major mapping meet a C ABI.
FAKE_CUBLAS = r"""
#include <stddef.h>
static void *last_stream, *last_workspace;
static size_t last_workspace_bytes;
int cublasCreate_v2(void **handle) { *handle = (void *)0x1; return 0; }
int cublasSetStream_v2(void *handle, void *stream) { last_stream = stream; return handle ? 0 : 1; }
int cublasSetWorkspace_v2(void *handle, void *workspace, size_t bytes) {
    last_workspace = workspace; last_workspace_bytes = bytes; return handle ? 0 : 1;
}
void *recorded_stream(void) { return last_stream; }
void *recorded_workspace(void) { return last_workspace; }
size_t recorded_workspace_bytes(void) { return last_workspace_bytes; }
int cublasGemmEx(void *handle, int transa, int transb, int m, int n, int k, const void *alpha, const void *A,
                 int Atype, int lda, const void *B, int Btype, int ldb, const void *beta, void *C, int Ctype,
                 int ldc, int computeType, int algo) {
    if (!handle || transa || transb || Atype || Btype || Ctype || computeType != 68 || algo != -1) return 7;
    if (lda < m || ldb < k || ldc < m) return 7;
    const float *a = A, *b = B; float *c = C;
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
            float sum = 0;
            for (int p = 0; p < k; ++p) sum += a[i + p * lda] * b[p + j * ldb];
            float scaled = *(const float *)alpha * sum, keep = *(const float *)beta;
            c[i + j * ldc] = keep == 0 ? scaled : scaled + keep * c[i + j * ldc];  /* beta 0: C not read */
        }
    return 0;
}
int cublasGemmStridedBatchedEx(void *handle, int transa, int transb, int m, int n, int k, const void *alpha,
                               const void *A, int Atype, int lda, long long strideA, const void *B, int Btype,
                               int ldb, long long strideB, const void *beta, void *C, int Ctype, int ldc,
                               long long strideC, int batchCount, int computeType, int algo) {
    for (int i = 0; i < batchCount; ++i) {
        int status = cublasGemmEx(handle, transa, transb, m, n, k, alpha, (const float *)A + i * strideA, Atype,
                                  lda, (const float *)B + i * strideB, Btype, ldb, beta,
                                  (float *)C + i * strideC, Ctype, ldc, computeType, algo);
        if (status) return status;
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def fake_libcublas(tmp_path_factory):
    compiler = shutil.which("gcc") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C compiler")
    folder = tmp_path_factory.mktemp("fake-cublas")
    (folder / "fake.c").write_text(FAKE_CUBLAS)
    library = folder / "libcublas.so.12"
    subprocess.run([compiler, "-x", "c", "-shared", "-fPIC", "-O1", "-o", str(library), str(folder / "fake.c")],
                   check=True)
    return library


def test_the_declared_library_computes_a_row_major_product_through_ctypes(fake_libcublas):
    library = cublas.load_library(lambda name: SimpleNamespace(abs_path=str(fake_libcublas)))
    library.recorded_stream.restype = library.recorded_workspace.restype = ctypes.c_void_p
    library.recorded_workspace_bytes.restype = ctypes.c_size_t
    rng = np.random.default_rng(11)
    x, w_t = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    out, workspace = np.full((5, 4), np.nan, np.float32), np.zeros(16, np.uint8)
    handle = cublas.Handle.create(library, workspace, workspace.ctypes.data)
    handle.gemm(0x5000, x.ctypes.data, w_t.ctypes.data, out.ctypes.data, 5, 3, 4, np.float32)
    expected = x.astype(np.float64) @ w_t
    # fp32 sums of 3 products: each term rounded at most 3 times, gamma_3 < 4 u of |x| @ |w_t|
    assert np.all(np.abs(out - expected) <= 4 * 2.0**-24 * (np.abs(x) @ np.abs(w_t)))
    assert (library.recorded_stream(), library.recorded_workspace()) == (0x5000, workspace.ctypes.data)
    assert library.recorded_workspace_bytes() == cublas.WORKSPACE_BYTES


def test_the_declared_library_adds_a_strided_batch_into_the_output_through_ctypes(fake_libcublas):
    """Rows 2..4 of each sample of a [2, 5, 3] array times w_t [3, 4], added into out (beta = 1):
    the 64-bit strides and the batch count reach C in their places."""
    library = cublas.load_library(lambda name: SimpleNamespace(abs_path=str(fake_libcublas)))
    rng = np.random.default_rng(12)
    joint, w_t = rng.standard_normal((2, 5, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    old = rng.standard_normal((2, 3, 4)).astype(np.float32)
    out = old.copy()
    handle = cublas.Handle.create(library, np.zeros(16, np.uint8), 0)
    rows = joint[:, 2:]
    handle.gemm(0x5000, rows.ctypes.data, w_t.ctypes.data, out.ctypes.data, 3, 3, 4, np.float32, beta=1.0,
                batch=cublas.Batch(2, rows.strides[0] // 4, 12))
    expected = rows.astype(np.float64) @ w_t + old
    # fp32 sums of 3 products plus the old value: gamma_4 < 5 u of |rows| @ |w_t| + |old|
    assert np.all(np.abs(out - expected) <= 5 * 2.0**-24 * (np.abs(rows) @ np.abs(w_t) + np.abs(old)))
