"""cudasim, the CPU harness for the CUDA kernels: its semantics, its checks, and planted bugs.

Planted bugs are text substitutions in a copy of a kernel source (the shipped kernels are not
touched); each must be caught with a message naming the kernel and the fault.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

from minit2i import cudasim
from minit2i.accelerated.kernels import NVRTC_OPTIONS, attention_shared_bytes, kernel_source
from minit2i.cudasim import KernelError, Module, RaceError, schedules
from minit2i.reference import layers as ref

BF16 = np.dtype(ml_dtypes.bfloat16)


def planted(source: str, old: str, new: str) -> Module:
    """kernel_source(source) with `old` replaced by `new` (which must occur), built for cudasim."""
    text = kernel_source(source)
    assert old in text, f"{old!r} not in {source}"
    return Module(text.replace(old, new), NVRTC_OPTIONS, name=source)


def module(code: str) -> Module:
    return Module(textwrap.dedent(code), name="test.cu")


def rms_norm_args(rows=3, width=300, seed=0):
    x = np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)
    return x, np.ones(width, np.float32), np.empty_like(x), np.int32(width), np.float32(1e-6)


# ---------------------------------------------------------------------------------------------
# Number formats


CONVERT = """
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void to_f32(const __half* h, const __nv_bfloat16* b, float* hf, float* bf, long long n) {
    for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        hf[i] = __half2float(h[i]);
        bf[i] = __bfloat162float(b[i]);
    }
}
extern "C" __global__ void from_f32(const float* x, __half* h, __nv_bfloat16* b, long long n) {
    for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        h[i] = __float2half_rn(x[i]);
        b[i] = __float2bfloat16_rn(x[i]);
    }
}
"""


def test_half_and_bfloat16_widen_exactly_for_all_65536_patterns():
    patterns = np.arange(2**16, dtype=np.uint16)
    h, b = patterns.view(np.float16), patterns.view(BF16)
    hf, bf = np.empty(2**16, np.float32), np.empty(2**16, np.float32)
    module(CONVERT).get_function("to_f32")((64,), (256,), (h, b, hf, bf, np.int64(2**16)))
    for ours, theirs in ((hf, h.astype(np.float32)), (bf, b.astype(np.float32))):
        nan = np.isnan(theirs)
        assert np.array_equal(np.isnan(ours), nan)
        assert np.array_equal(ours[~nan].view(np.uint32), theirs[~nan].view(np.uint32))


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["f16", "bf16"])
def test_float_to_half_and_bfloat16_round_to_nearest_even(dtype):
    """Every finite pattern's value, the midpoints to its neighbours (ties) and one float32 ulp
    either side of them, against ml_dtypes / NumPy (both round to nearest, ties to even)."""
    values = np.arange(2**16, dtype=np.uint16).view(dtype).astype(np.float32)
    values = values[np.isfinite(values)]
    ordered = np.unique(values)
    mid = ((ordered[:-1].astype(np.float64) + ordered[1:]) / 2).astype(np.float32)
    x = np.concatenate([values, mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf), [np.inf, -np.inf, 1e30]])
    x = x.astype(np.float32)
    h, b = np.empty(x.size, np.float16), np.empty(x.size, BF16)
    module(CONVERT).get_function("from_f32")((64,), (256,), (x, h, b, np.int64(x.size)))
    ours = h if dtype == np.float16 else b
    with np.errstate(over="ignore"):  # 1e30 -> inf is the point
        theirs = x.astype(dtype)
    assert np.array_equal(ours.view(np.uint16), theirs.view(np.uint16))


# ---------------------------------------------------------------------------------------------
# Execution model


def test_shuffles_follow_the_programming_guide():
    kernel = module("""
        extern "C" __global__ void shuffles(float* out) {
            const float v = threadIdx.x;
            out[threadIdx.x] = __shfl_sync(0xffffffffu, v, 3);
            out[32 + threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 5);
            out[64 + threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 4);
            out[96 + threadIdx.x] = __shfl_up_sync(0xffffffffu, v, 4, 8);
        }""").get_function("shuffles")
    out = np.empty(128, np.float32)
    with schedules():
        kernel((1,), (32,), (out,))
    lane = np.arange(32)
    assert np.array_equal(out[:32], np.full(32, 3))
    assert np.array_equal(out[32:64], lane ^ 5)
    assert np.array_equal(out[64:96], np.where(lane + 4 < 32, lane + 4, lane))
    assert np.array_equal(out[96:], np.where(lane % 8 >= 4, lane - 4, lane))


def test_shared_memory_is_poisoned_with_nan_and_fresh_per_block():
    kernel = module("""
        extern "C" __global__ void peek(float* out) {
            __shared__ float tile[64];
            if (threadIdx.x == 0) { out[blockIdx.x] = tile[5]; tile[5] = 1.0f; }
        }""").get_function("peek")
    out = np.zeros(3, np.float32)
    kernel((3,), (32,), (out,))
    assert np.isnan(out).all()  # no block sees the previous block's write


def test_a_race_is_reported_with_the_first_differing_element():
    kernel = module("""
        extern "C" __global__ void last_writer_wins(int* out) { out[1] = threadIdx.x; }""").get_function(
        "last_writer_wins")
    with pytest.raises(RaceError, match=r"kernel last_writer_wins: race: int\* out \(2,\) differs between schedules "
                                        r"in-order and reverse at 1 elements, first at \(1,\): "):
        with schedules():
            kernel((1,), (64,), (np.zeros(2, np.int32),))


def test_threads_exiting_while_others_wait_at_a_barrier():
    kernel = module("""
        extern "C" __global__ void early_exit(float* out) {
            if (threadIdx.x >= 32) return;
            __syncthreads();
            out[threadIdx.x] = 1.0f;
        }""").get_function("early_exit")
    with pytest.raises(KernelError, match=r"kernel early_exit, block \(0,0,0\): barrier divergence: thread \(0,0,0\) "
                                          r"waits at __syncthreads on line 4, but thread \(32,0,0\) has exited"):
        kernel((1,), (64,), (np.zeros(64, np.float32),))


def test_threads_waiting_at_different_barriers():
    kernel = module("""
        extern "C" __global__ void two_barriers(float* out) {
            if (threadIdx.x < 32) __syncthreads();
            else __syncthreads();
        }""").get_function("two_barriers")
    with pytest.raises(KernelError, match=r"barrier divergence: thread \(0,0,0\) waits at __syncthreads on line 3, "
                                          r"thread \(32,0,0\) at line 4"):
        kernel((1,), (64,), (np.zeros(1, np.float32),))


def test_full_mask_shuffle_in_a_partial_warp_is_refused():
    kernel = module("""
        extern "C" __global__ void sum(float* out) { out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1); }""")
    with pytest.raises(KernelError, match=r"mask 0xffffffff names lane 20, but the block has 20 threads"):
        kernel.get_function("sum")((1,), (20,), (np.zeros(20, np.float32),))


# ---------------------------------------------------------------------------------------------
# Warp matrix functions (WMMA)


WMMA = """
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;
#define PRODUCT(T, SUFFIX)                                                                              \
extern "C" __global__ void product_##SUFFIX(const T* a, const T* b_cols, const float* c, float* d) {   \
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;                                  \
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;                                  \
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;                                           \
    wmma::load_matrix_sync(fa, a, 16);                                                                  \
    wmma::load_matrix_sync(fb, b_cols, 16);                                                             \
    wmma::load_matrix_sync(acc, c, 16, wmma::mem_col_major);                                            \
    for (int i = 0; i < acc.num_elements; ++i) acc.x[i] *= 2.0f;  /* whole-fragment work is legal */   \
    wmma::mma_sync(acc, fa, fb, acc);                                                                   \
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);                                           \
}
PRODUCT(__half, f16)
PRODUCT(__nv_bfloat16, bf16)

// Reads the fragment as if element i of lane l were row l / 2, column 8 (l % 2) + i: some GPU's
// layout, perhaps, but not one CUDA promises.
extern "C" __global__ void assumes_layout(const __half* a, float* out) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a, 16);
    for (int i = 0; i < fa.num_elements; ++i) out[threadIdx.x * 8 + i] = __half2float(fa.x[i]);
}

extern "C" __global__ void misaligned(const __half* a) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + 8, 16);
}

extern "C" __global__ void divergent(const __half* a, float* d) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, a, 16);
    if (threadIdx.x != 7) wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}
"""


def device_array(values) -> np.ndarray:
    """A copy of `values` at a 256-byte aligned address, as cudaMalloc returns."""
    values = np.ascontiguousarray(values)
    raw = np.empty(values.nbytes + 256, np.uint8)
    start = -raw.ctypes.data % 256
    array = raw[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    array[...] = values
    return array


@pytest.fixture(scope="module")
def wmma():
    return module(WMMA)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["f16", "bf16"])
def test_wmma_product_in_every_layout(wmma, dtype):
    """D = A B + 2 C with A row-major, B and C column-major: the 16-bit products are exact in fp32
    and 16 of them are summed onto C, so |error| <= 17 u_fp32 * sum |terms| (gamma_17)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((16, 16)).astype(dtype) for _ in range(2))
    c = rng.standard_normal((16, 16)).astype(np.float32)
    d = device_array(np.zeros((16, 16), np.float32))
    suffix = "f16" if dtype == np.float16 else "bf16"
    with schedules():
        wmma.get_function(f"product_{suffix}")((1,), (32,), (device_array(a), device_array(b.T), device_array(c.T), d))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    terms = np.abs(a64) @ np.abs(b64) + 2 * np.abs(c)
    assert np.all(np.abs(d - (a64 @ b64 + 2 * c)) <= 17 * 2.0**-24 * terms)


def test_wmma_fragment_layout_is_scrambled_per_schedule(wmma):
    """Indexing fragment.x[i] with an assumed element-to-lane layout reads other elements than
    assumed, and different ones under each schedule: the race check reports it."""
    a = device_array(np.arange(256, dtype=np.float16).reshape(16, 16))
    out = np.zeros(256, np.float32)
    wmma.get_function("assumes_layout")((1,), (32,), (a, out))
    assert sorted(out) == list(range(256))  # a bijection: every element exactly once ...
    assert not np.array_equal(out, np.arange(256))  # ... but not in the row-major order
    with pytest.raises(RaceError, match=r"kernel assumes_layout: race: float\* out \(256,\) differs between schedules"):
        with schedules():
            wmma.get_function("assumes_layout")((1,), (32,), (a, out))


def test_wmma_pointer_must_be_256_bit_aligned(wmma):
    with pytest.raises(KernelError, match=r"kernel misaligned, block \(0,0,0\): wmma::load_matrix_sync on line \d+: "
                                          r"the pointer 0x[0-9a-f]+ is not 256-bit aligned"):
        wmma.get_function("misaligned")((1,), (32,), (device_array(np.zeros(256 + 8, np.float16)),))


def test_wmma_in_divergent_code(wmma):
    with pytest.raises(KernelError, match=r"kernel divergent, block \(0,0,0\): divergent warp collective: thread \(0,0,0\) "
                                          r"waits at wmma::mma_sync on line \d+ with mask 0xffffffff, but lane 7 "
                                          r"\(thread \(7,0,0\)\) waits at wmma::store_matrix_sync"):
        wmma.get_function("divergent")((1,), (32,), (device_array(np.zeros(256, np.float16)),
                                                    device_array(np.zeros(256, np.float32))))


# ---------------------------------------------------------------------------------------------
# Launch checks


@pytest.fixture(scope="module")
def rms():
    return Module(kernel_source("rmsnorm.cu"), NVRTC_OPTIONS, name="rmsnorm.cu").get_function("rms_norm_f32")


@pytest.mark.parametrize("grid, block, message", [
    ((0,), (256,), r"grid \(0, 1, 1\) has a dimension below 1"),
    ((1,), (1025,), r"block \(1025, 1, 1\) exceeds the limits"),
    ((1,), (512, 4), r"block \(512, 4, 1\) has 2048 threads; at most 1024"),
])
def test_launch_shapes_a_gpu_refuses(rms, grid, block, message):
    with pytest.raises(KernelError, match=message):
        rms(grid, block, rms_norm_args())


def test_launch_bounds_and_shared_memory_limits():
    attention = Module(kernel_source("attention.cu"), NVRTC_OPTIONS, name="attention.cu").get_function(
        "flash_attention_f32")
    q = np.zeros((1, 1, 1, 8), np.float32)
    args = (q, q, q, q, q, np.zeros((1, 1, 8), np.float32), *map(np.int32, (1, 1, 1, 8)), np.float32(1),
            np.int32(0), np.int32(0))
    with pytest.raises(KernelError, match=r"256 threads, more than its __launch_bounds__\(128\)"):
        attention((1, 1), (256,), args, shared_mem=4096)
    with pytest.raises(KernelError, match=r"asks for 50000 bytes of dynamic shared memory .* over the 49152-byte limit"):
        attention((1, 1), (128,), args, shared_mem=50000)
    attention.max_dynamic_shared_size_bytes = 50000
    attention((1, 1), (128,), args, shared_mem=50000)


def test_argument_types_are_checked_against_the_c_signature(rms):
    x, w, out, width, eps = rms_norm_args()
    with pytest.raises(KernelError, match=r"argument 1 \(const float\* weight\) points to float32 but gets an array of float64"):
        rms((3,), (256,), (x, w.astype(np.float64), out, width, eps))
    with pytest.raises(KernelError, match=r"argument 3 \(int width\) gets a Python int, which CuPy passes as a long long"):
        rms((3,), (256,), (x, w, out, 300, eps))
    with pytest.raises(KernelError, match=r"argument 2 \(float\* out\) gets a non-contiguous array"):
        rms((3,), (256,), (x, w, np.empty((300, 3), np.float32).T, width, eps))


# ---------------------------------------------------------------------------------------------
# Planted bugs in copies of the shipped kernels


def test_planted_python_float_argument():
    kernel = Module(kernel_source("sampler.cu"), NVRTC_OPTIONS, name="sampler.cu").get_function("cfg_euler_f32")
    state = np.zeros(4, np.float32)
    args = (state, np.zeros(8, np.float32), np.zeros(8, np.float32), np.zeros(4, np.float32), np.int64(4), 3.0,
            np.ones(1, np.float32))
    with pytest.raises(KernelError, match=r"kernel cfg_euler_f32: argument 5 \(float cfg_scale\) gets a Python float, "
                                          r"which CuPy passes as a double"):
        kernel((1,), (256,), args)


def test_planted_missing_syncthreads_is_a_race():
    """Without the barrier after `partial[warp] = v`, lanes read partial sums other warps have
    not written yet: poisoned NaN under one schedule, a number under another."""
    kernel = planted("rmsnorm.cu", "if (lane == 0) partial[warp] = v;\n    __syncthreads();",
                     "if (lane == 0) partial[warp] = v;").get_function("rms_norm_f32")
    with pytest.raises(RaceError, match=r"kernel rms_norm_f32: race: float\* out \(3, 300\) differs between schedules"):
        with schedules():
            kernel((3,), (256,), rms_norm_args())


def test_planted_wrong_shuffle_offset_breaks_the_reduction():
    """warp_sum starting at offset 8 adds only 16 lanes: every schedule agrees (it is not a race)
    but the norm is wrong, and the parity check names the kernel and the error."""
    kernel = planted("rmsnorm.cu", "for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync",
                     "for (int offset = 8; offset > 0; offset >>= 1) v += __shfl_xor_sync").get_function("rms_norm_f32")
    x, w, out, width, eps = args = rms_norm_args()
    with schedules():
        kernel((3,), (256,), args)
    error = np.max(np.abs(out - ref.rms_norm(x.astype(np.float64), w))) / np.max(np.abs(x))
    with pytest.raises(AssertionError, match=r"rms_norm_f32: max relative error [\d.]+ > 1e-04"):
        assert error < 1e-4, f"rms_norm_f32: max relative error {error:.3f} > 1e-04"


def test_planted_shuffle_in_divergent_code():
    """The per-head norm's warp_sum moved inside `if (j < half)`: lanes past half never call it."""
    kernel = planted("rope.cu", "sum_sq += lo[p] * lo[p] + hi[p] * hi[p];",
                     "sum_sq = warp_sum(sum_sq + lo[p] * lo[p] + hi[p] * hi[p]);").get_function("qkv_heads_f32")
    heads, head_dim = 1, 8
    qkv = np.ones((1, 1, 3 * heads * head_dim), np.float32)
    bias = np.zeros(3 * heads * head_dim, np.float32)
    norm = np.ones(head_dim, np.float32)
    table = np.ones((1, head_dim // 2), np.float32)
    q, k, v = (np.zeros((1, heads, 1, head_dim), np.float32) for _ in range(3))
    ints = [np.int32(n) for n in (1, 1, heads, head_dim, 1, 0, 1, 0)]
    with pytest.raises(KernelError, match=r"kernel qkv_heads_f32, block \(0,0,0\): divergent shuffle: thread \(0,0,0\) waits at "
                                          r"__shfl_xor_sync on line \d+ with mask 0xffffffff, but lane 4 "
                                          r"\(thread \(4,0,0\)\) (has exited|waits at __shfl_xor_sync on line \d+)"):
        kernel((1,), (128,), (qkv, bias, norm, norm, table, table, q, k, v, *ints, np.float32(1e-6)))


def test_planted_shared_memory_one_row_too_small():
    """v_tile placed one K row further: the launch's shared memory is one row short for it."""
    kernel = planted("attention.cu", "float* v_tile = k_tile + KEY_TILE * (head_dim + 1);",
                     "float* v_tile = k_tile + (KEY_TILE + 1) * (head_dim + 1);").get_function("flash_attention_f32")
    head_dim = 16
    q = np.random.default_rng(0).standard_normal((1, 1, 40, head_dim)).astype(np.float32)
    args = (q, q, q, q, q, np.empty((1, 40, head_dim), np.float32), *map(np.int32, (1, 40, 40, head_dim)),
            np.float32(0.25), np.int32(0), np.int32(0))
    shared = 4 * (32 * head_dim + 32 * (2 * head_dim + 1))
    with pytest.raises(KernelError, match=r"kernel flash_attention_f32, block \(\d,0,0\): wrote past the end of dynamic shared memory: "
                                          rf"the launch asked for {shared} bytes"):
        kernel((2, 1), (128,), args, shared_mem=shared)


def test_planted_fragment_layout_assumption_in_the_tensor_core_attention():
    """The score tile written from acc.x[i] with the accumulator layout an sm_80 GPU happens to use
    (lane l, element i at row l / 4 + 8 ((i / 2) % 2), column 2 (l % 4) + i % 2 + 8 (i / 4)),
    instead of wmma::store_matrix_sync. It could pass on that GPU; here the scores land in the
    wrong places (the output is far from the reference) and the layout differs per schedule
    (a race)."""
    store = "wmma::store_matrix_sync(s + n, acc, SCORE_LD, wmma::mem_row_major);"
    by_hand = ("for (int i = 0; i < acc.num_elements; ++i) { const int l = threadIdx.x & 31; "
               "s[(l / 4 + 8 * ((i / 2) % 2)) * SCORE_LD + n + 2 * (l % 4) + i % 2 + 8 * (i / 4)] = acc.x[i]; }")
    kernel = planted("attention_tc.cu", store, by_hand).get_function("flash_attention_tc_f16")
    rng = np.random.default_rng(0)
    head_dim, length = 16, 32
    q, k, v = (device_array(rng.standard_normal((1, 1, length, head_dim)).astype(np.float16)) for _ in range(3))
    out = np.zeros((1, length, head_dim), np.float16)
    unused = np.zeros(1, np.float32)
    args = (q, k, v, unused, unused, out, *map(np.int32, (1, length, length, head_dim)), np.float32(0.25),
            np.int32(0), np.int32(0))
    shared = attention_shared_bytes(head_dim, np.float16)
    kernel((1, 1), (128,), args, shared_mem=shared)
    expected = ref.attention(*(a.astype(np.float64) for a in (q, k, v)), 0.25)[0, 0]
    assert np.max(np.abs(out[0] - expected)) > 0.1
    with pytest.raises(RaceError, match=r"kernel flash_attention_tc_f16: race: __half\* out \(1, 32, 16\) differs between schedules"):
        with schedules():
            kernel((1, 1), (128,), args, shared_mem=shared)


OUT_OF_BOUNDS = """
import numpy as np, sys
from minit2i.cudasim import Module
module = Module(sys.stdin.read(), name="sampler.cu", sanitize=True)
n = 100
args = (np.zeros(n, np.float32), np.zeros(2 * n, np.float32), np.zeros(2 * n, np.float32), np.zeros(n, np.float32),
        np.int64(n), np.float32(2), np.ones(1, np.float32))
module.get_function("cfg_euler_f32")((1,), (256,), args)
print("no fault")
"""


def test_planted_out_of_bounds_global_write_under_address_sanitizer():
    """next_input's second copy shifted by one element: the last thread writes one past the end."""
    source = kernel_source("sampler.cu")
    old = "next_input[i] = next_input[n + i] = from_float<T>(x);"
    assert old in source
    result = subprocess.run([sys.executable, "-c", OUT_OF_BOUNDS], input=source.replace(
        old, "next_input[i] = next_input[n + i + 1] = from_float<T>(x);"), capture_output=True, text=True,
        env=cudasim.sanitizer_environment(), timeout=300)
    assert result.returncode != 0 and "no fault" not in result.stdout
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in result.stderr
    assert "WRITE of size 4" in result.stderr
    assert "cudasim: the fault above happened in kernel cfg_euler_f32, block (0,0,0), thread (99,0,0)" in result.stderr


# ---------------------------------------------------------------------------------------------
# The CuPy stand-in cannot drift from CuPy


def _public(namespace):
    return {name: getattr(namespace, name) for name in vars(namespace) if not name.startswith("_")}


def _compatible(ours, theirs) -> bool:
    """Every parameter we accept by name, CuPy accepts too (where CuPy exposes a signature)."""
    try:
        real = inspect.signature(theirs).parameters
    except (TypeError, ValueError):
        return True  # a Cython function without a signature: existence is all we can check
    try:
        ours = inspect.signature(ours).parameters
    except (TypeError, ValueError):
        return True  # a builtin base (exception types): nothing of ours to compare
    if any(p.kind == p.VAR_KEYWORD for p in real.values()):
        return True
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return all(name in real for name, p in ours.items() if p.kind in by_name and name != "self")


def _pairs():
    cupy = pytest.importorskip("cupy", reason="comparing with CuPy needs the [compile] extra")
    import cupyx

    from minit2i.cudasim import standin

    yield from ((f"cupy.{n}", getattr(standin, n), getattr(cupy, n, None)) for n in standin.__all__ if n != "cuda")
    for name, value in _public(standin.cuda).items():
        if name in ("runtime", "graph"):
            for inner, inner_value in _public(value).items():
                yield f"cupy.cuda.{name}.{inner}", inner_value, getattr(getattr(cupy.cuda, name), inner, None)
        else:
            yield f"cupy.cuda.{name}", value, getattr(cupy.cuda, name, None)
    yield "cupyx.allow_synchronize", standin.cupyx.allow_synchronize, getattr(cupyx, "allow_synchronize", None)


def test_every_standin_name_exists_in_cupy_with_a_compatible_signature():
    checked = 0
    for name, ours, theirs in _pairs():
        assert theirs is not None, f"{name} is offered by cudasim.standin but does not exist in CuPy"
        assert callable(ours) == callable(theirs), name
        if callable(ours):
            assert _compatible(ours, theirs), f"{name}{inspect.signature(ours)} accepts parameters CuPy's does not"
            if isinstance(ours, type):
                for method, function in vars(ours).items():
                    if callable(function) and not method.startswith("_"):
                        assert hasattr(theirs, method), f"{name}.{method} does not exist in CuPy"
                        assert _compatible(function, getattr(theirs, method)), f"{name}.{method}"
        checked += 1
    assert checked >= 25


# ---------------------------------------------------------------------------------------------
# The stand-in refuses during a graph capture what CuPy 14.2 refuses (standin.Capture cites each rule)


@pytest.fixture
def capturing():
    """A non-blocking stream capturing a graph; the capture is ended whatever the test did."""
    from minit2i.cudasim import standin

    stream = standin.cuda.Stream(non_blocking=True)
    stream.begin_capture()
    try:
        yield stream
    finally:
        if standin._capturing() is not None:
            standin._state["capture"] = None


def test_device_to_host_copy_inside_a_captured_step_fails_as_in_cupy(capturing):
    from minit2i.cudasim import standin

    x = standin.ones(4, np.float32)
    with pytest.raises(RuntimeError, match="^the current stream is capturing, so D2H transfers are disallowed$"):
        standin.asnumpy(x * 2)
    with pytest.raises(RuntimeError, match="D2H transfers are disallowed"):
        x.get()


@pytest.mark.parametrize("call, error, message", [
    (lambda sa, s: sa.asarray(np.ones(3)), RuntimeError, "so H2D transfers are disallowed"),
    (lambda sa, s: sa.matmul(sa.ones((2, 2), np.float32), sa.ones((2, 2), np.float32)), NotImplementedError,
     "calling cuBLAS API during stream capture is currently unsupported"),
])
def test_transfers_and_cublas_are_refused_during_capture(capturing, call, error, message):
    from minit2i.cudasim import standin

    with pytest.raises(error, match=message):
        call(standin, capturing)
    assert isinstance(capturing.end_capture(), standin.Graph)  # refused before CUDA saw it: capture intact


@pytest.mark.parametrize("synchronize", [lambda sa, s: s.synchronize(), lambda sa, s: sa.cuda.Device().synchronize()])
def test_synchronising_during_capture_fails_and_invalidates_it(capturing, synchronize):
    from minit2i.cudasim import standin

    with pytest.raises(standin.CUDARuntimeError, match="^cudaErrorStreamCaptureUnsupported"):
        synchronize(standin, capturing)
    with pytest.raises(standin.CUDARuntimeError, match="^cudaErrorStreamCaptureInvalidated"):
        capturing.end_capture()


def test_the_legacy_default_stream_cannot_capture():
    from minit2i.cudasim import standin

    with pytest.raises(RuntimeError, match=r"^cannot capture on the default \(legacy\) stream$"):
        standin.cuda.get_current_stream().begin_capture()


def test_kernels_and_allocations_are_recorded_during_capture(capturing):
    """Allowed in CuPy (relaxed capture mode): computed on replay, NaN until then."""
    from minit2i.cudasim import standin

    x = standin.ones(3, np.float32)
    y = x + 1
    graph = capturing.end_capture()
    assert np.isnan(y.view(np.ndarray)).all()
    graph.launch()
    assert (y.view(np.ndarray) == 2).all()
