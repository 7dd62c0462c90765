"""cudasim, the CPU harness for the CUDA kernels: its semantics, its checks, and planted bugs.

Planted bugs are text substitutions in a copy of a kernel source (the shipped kernels are not
touched); each must be caught with a message naming the kernel and the fault.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
from fractions import Fraction
from functools import partial

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minit2i import cudasim
from minit2i.accelerated.kernels import (COMMON_HEADER, KERNEL_DIR, NVRTC_OPTIONS, attention_shared_bytes, kernel_source,
                                         mma_rows)
from minit2i.cudasim import KernelError, Module, RaceError, detectors, device_array, schedules
from minit2i.reference import layers as ref

BF16 = np.dtype(ml_dtypes.bfloat16)


def planted(source: str, old: str, new: str) -> Module:
    """kernel_source(source) with `old` replaced by `new` (which must occur), built for cudasim."""
    text = kernel_source(source)
    assert old in text, f"{old!r} not in {source}"
    return Module(text.replace(old, new), NVRTC_OPTIONS, name=source)


def line_of(code: str, fragment: str) -> int:
    """The line number of the one line of `code` that contains `fragment`."""
    lines = [n for n, line in enumerate(code.splitlines(), 1) if fragment in line]
    assert len(lines) == 1, f"{fragment!r} is on lines {lines}"
    return lines[0]


def module(code: str) -> Module:
    return Module(textwrap.dedent(code), name="test.cu")


def rms_norm_args(rows=3, width=300, seed=0):
    x = np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)
    return x, np.ones(width, np.float32), np.empty_like(x), np.int32(width), np.float32(1e-6), np.int32(rows)


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
# Device builtins and intrinsics, against their definitions


INT_EDGES = [0, 1, -1, 2, -2, 7, 2**31 - 1, -2**31, 0x0F0F0F0F, -0x10000]


def int_inputs(n=200, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([INT_EDGES, rng.integers(-2**31, 2**31, n - len(INT_EDGES))]).astype(np.int32)


INTEGER_BUILTINS = """
extern "C" __global__ void integer_builtins(const int* a, const int* b, const long long* c, const long long* d, int* out32,
                                            long long* out64, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned ua = a[i], ub = b[i];
    const unsigned long long uc = c[i], ud = d[i];
    int* o = out32 + 10 * i;
    long long* p = out64 + 7 * i;
    o[0] = min(a[i], b[i]);
    o[1] = max(a[i], b[i]);
    o[2] = (int)min(ua, ub);
    o[3] = (int)max(ua, ub);
    o[4] = (int)min(a[i], ub);  // mixed signedness: compared as unsigned
    o[5] = (int)max(ua, b[i]);
    o[6] = __popc(ua);
    o[7] = __ffs(a[i]);
    o[8] = __clz(a[i]);
    o[9] = (int)__brev(ua);
    p[0] = min(c[i], d[i]);
    p[1] = max(c[i], d[i]);
    p[2] = (long long)min(uc, ud);
    p[3] = (long long)max(c[i], ud);
    p[4] = __popcll(uc);
    p[5] = __ffsll(c[i]);
    p[6] = __clzll(c[i]);
}
"""


def test_integer_min_max_and_bit_intrinsics():
    a, b = int_inputs(seed=0), int_inputs(seed=1)[::-1].copy()
    c = (a.astype(np.int64) << 32) ^ b.astype(np.int64) * 3
    d = np.roll(c, 1)
    out32, out64 = np.zeros((a.size, 10), np.int32), np.zeros((a.size, 7), np.int64)
    module(INTEGER_BUILTINS).get_function("integer_builtins")((1,), (256,), (a, b, c, d, out32, out64, np.int32(a.size)))
    ua, ub, uc, ud = a.view(np.uint32), b.view(np.uint32), c.view(np.uint64), d.view(np.uint64)
    for column, expected in enumerate([np.minimum(a, b), np.maximum(a, b), np.minimum(ua, ub), np.maximum(ua, ub),
                                       np.minimum(ua, ub), np.maximum(ua, ub)]):
        assert np.array_equal(out32[:, column], expected.astype(np.uint32).view(np.int32)), column
    bits32 = [int(u) for u in ua]
    assert list(out32[:, 6]) == [bin(u).count("1") for u in bits32]
    assert list(out32[:, 7]) == [(u & -u).bit_length() for u in bits32]  # 1 + index of the lowest set bit, 0 for 0
    assert list(out32[:, 8]) == [32 - u.bit_length() for u in bits32]
    assert list(out32[:, 9].view(np.uint32)) == [int(f"{u:032b}"[::-1], 2) for u in bits32]
    for column, expected in enumerate([np.minimum(c, d), np.maximum(c, d), np.minimum(uc, ud), np.maximum(uc, ud)]):
        assert np.array_equal(out64[:, column], expected.astype(np.uint64).view(np.int64)), column
    bits64 = [int(u) for u in uc]
    assert list(out64[:, 4]) == [bin(u).count("1") for u in bits64]
    assert list(out64[:, 5]) == [(u & -u).bit_length() for u in bits64]
    assert list(out64[:, 6]) == [64 - u.bit_length() for u in bits64]


FLOAT_BUILTINS = """
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void float_builtins(const float* x, const float* y, const float* z, const double* w, float* out,
                                          double* out64, int* ints, __half* h, __nv_bfloat16* b, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float* o = out + 8 * i;
    o[0] = min(x[i], y[i]);
    o[1] = max(x[i], y[i]);
    o[2] = rsqrtf(y[i]);
    o[3] = __fdividef(x[i], y[i]);
    o[4] = __expf(z[i]);
    o[5] = __saturatef(x[i]);
    o[6] = fmaf(x[i], y[i], z[i]);
    o[7] = __uint_as_float(__float_as_uint(__ldg(x + i)));
    out64[2 * i] = min(w[i], (double)x[i]);
    out64[2 * i + 1] = max(w[i], (double)x[i]);
    ints[2 * i] = __float2int_rn(x[i]);
    ints[2 * i + 1] = __float2int_rz(x[i]);
    h[i] = __float2half(x[i]);
    b[i] = __float2bfloat16(x[i]);
}
"""


def nearest_float32(exact: Fraction) -> np.float32:
    """`exact` rounded to the nearest float32, ties to even."""
    guess = np.float32(float(exact))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - exact), int(c.view(np.uint32)) & 1))


def same(ours, theirs) -> bool:
    return np.array_equal(ours, theirs, equal_nan=True)


def test_float_intrinsics():
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 0.5, -0.5, 1.0, 1.5, 2.5, -2.5, 3e9, -3e9, np.nan, -np.nan, np.inf, -np.inf], np.float32)
    x = np.concatenate([special, rng.standard_normal(186).astype(np.float32) * 4]).astype(np.float32)
    y = np.concatenate([[1.0, np.nan, 2.0] * 4 + [3.0, 0.25], np.abs(rng.standard_normal(186)) + 0.1]).astype(np.float32)
    z = (rng.standard_normal(x.size) * 10).astype(np.float32)
    w = np.where(np.arange(x.size) % 3 == 0, np.nan, rng.standard_normal(x.size))
    n = x.size
    out, out64, ints = np.zeros((n, 8), np.float32), np.zeros((n, 2)), np.zeros((n, 2), np.int32)
    h, b = np.zeros(n, np.float16), np.zeros(n, BF16)
    module(FLOAT_BUILTINS).get_function("float_builtins")((1,), (256,), (x, y, z, w, out, out64, ints, h, b, np.int32(n)))
    assert same(out[:, 0], np.fmin(x, y)) and same(out[:, 1], np.fmax(x, y))  # a NaN loses to a number
    with np.errstate(invalid="ignore", over="ignore"):
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        valid = ~np.isnan(y)
        assert np.all(np.abs(out[valid, 2] - 1 / np.sqrt(y64[valid])) <= 2.0**-23 / np.sqrt(y64[valid]))
        assert np.isnan(out[~valid, 2]).all()
        assert same(out[:, 3], x / y)  # the correctly rounded quotient
        assert np.all(np.abs(out[:, 4] - np.exp(z.astype(np.float64))) <= 2.0**-23 * np.exp(z.astype(np.float64)))
    saturated = np.where(np.isnan(x), 0.0, np.clip(x, 0.0, 1.0)).astype(np.float32)
    assert np.array_equal(out[:, 5].view(np.uint32), np.abs(saturated).view(np.uint32))  # +0, never -0
    finite = np.isfinite(x) & np.isfinite(y) & (np.abs(x) < 1e9)
    assert all(out[i, 6] == nearest_float32(Fraction(float(x[i])) * Fraction(float(y[i])) + Fraction(float(z[i])))
               for i in np.flatnonzero(finite))
    assert np.array_equal(out[:, 7].view(np.uint32), x.view(np.uint32))
    assert same(out64[:, 0], np.fmin(w, x64)) and same(out64[:, 1], np.fmax(w, x64))
    limits = np.iinfo(np.int32)
    for column, rounded in enumerate([np.rint(x64), np.trunc(x64)]):  # rint: ties to even
        expected = np.where(np.isnan(x64), 0, np.clip(np.nan_to_num(rounded), limits.min, limits.max)).astype(np.int32)
        assert np.array_equal(ints[:, column], expected), column
    number = ~np.isnan(x)
    with np.errstate(over="ignore"):  # 3e9 -> inf in fp16 is the point
        assert np.array_equal(h.view(np.uint16)[number], x.astype(np.float16).view(np.uint16)[number])
    assert np.array_equal(b.view(np.uint16)[number], x.astype(BF16).view(np.uint16)[number])


ATOMICS = """
extern "C" __global__ void atomics(int* i, unsigned* u, long long* ll, unsigned long long* ull, float* f, double* d,
                                   int* i_old, unsigned* u_old, unsigned long long* ull_old, float* f_old, int* tickets) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int v = (t * 37) % 101 - 50;
    atomicAdd(i, v);
    atomicSub(i + 1, v);
    atomicMax(i + 2, v);
    atomicMin(i + 3, v);
    i_old[t] = atomicExch(i + 4, t);
    atomicAdd(u, (unsigned)t);
    atomicSub(u + 1, (unsigned)t);
    atomicMax(u + 2, (unsigned)v);
    atomicMin(u + 3, (unsigned)v);
    u_old[t] = atomicExch(u + 4, (unsigned)t);
    atomicMax(ll, (long long)v << 40);
    atomicMin(ll + 1, (long long)v << 40);
    atomicAdd(ull, (unsigned long long)t << 40);
    atomicMax(ull + 1, (unsigned long long)v);
    atomicMin(ull + 2, (unsigned long long)v);
    ull_old[t] = atomicExch(ull + 3, (unsigned long long)t);
    atomicAdd(f, 0.5f);  // exact in any order
    f_old[t] = atomicExch(f + 1, (float)t);
    atomicAdd(d, 0.25);
    // a ticket from compare-and-swap: retry with the value seen until the swap succeeds
    int expected = 0, seen;
    while ((seen = atomicCAS(i + 5, expected, expected + 1)) != expected) expected = seen;
    tickets[t] = expected;
    unsigned u_expected = 0, u_seen;
    while ((u_seen = atomicCAS(u + 5, u_expected, u_expected + 1)) != u_expected) u_expected = u_seen;
    unsigned long long ull_expected = 0, ull_seen;
    while ((ull_seen = atomicCAS(ull + 4, ull_expected, ull_expected + 1)) != ull_expected) ull_expected = ull_seen;
}
"""


def test_atomics_against_their_definitions():
    """512 threads in two blocks on one word per operation, under the detectors: atomics do not
    race with each other. Each result is what the operations define in any order; the tickets
    and exchanges differ between orders, so this runs one schedule."""
    n = 512
    t = np.arange(n)
    v = (t * 37) % 101 - 50
    i, u = np.array([7, 7, -1000, 1000, -1, 0], np.int32), np.array([7, 7, 0, 2**32 - 1, 2**32 - 1, 0], np.uint32)
    ll, ull = np.array([-2**62, 2**62], np.int64), np.array([5, 0, 2**64 - 1, 2**64 - 1, 0], np.uint64)
    f, d = np.array([1.0, -1.0], np.float32), np.array([1.0])
    olds = np.zeros(n, np.int32), np.zeros(n, np.uint32), np.zeros(n, np.uint64), np.zeros(n, np.float32)
    tickets = np.zeros(n, np.int32)
    module(ATOMICS).get_function("atomics")((2,), (256,), (i, u, ll, ull, f, d, *olds, tickets))
    assert list(i[:4]) == [7 + v.sum(), 7 - v.sum(), v.max(), v.min()] and i[5] == n
    unsigned_v = v.astype(np.int64) % 2**32
    assert list(u[:4]) == [(7 + t.sum()) % 2**32, (7 - t.sum()) % 2**32, unsigned_v.max(), unsigned_v.min()] and u[5] == n
    assert list(ll) == [v.max() << 40, v.min() << 40]
    unsigned_v64 = v.astype(np.int64).view(np.uint64)
    assert list(ull[:3]) == [5 + (t << 40).sum(), unsigned_v64.max(), unsigned_v64.min()]
    assert ull[4] == n and list(f[:1]) == [1 + 0.5 * n] and list(d) == [1 + 0.25 * n]
    for old, final, start in zip(olds, (i[4], u[4], ull[3], f[1]), (-1, 2**32 - 1, 2**64 - 1, -1.0)):
        assert sorted(list(old) + [final]) == sorted([start, *t.astype(old.dtype)])  # each value once, read by the next
    assert sorted(tickets) == list(range(n))


def test_an_atomic_racing_with_a_plain_write_is_reported():
    code = textwrap.dedent("""
        extern "C" __global__ void reset_while_counting(int* counter) {
            if (threadIdx.x == 0) *counter = 0;
            else atomicAdd(counter, 1);
        }""")
    with pytest.raises(RaceError, match=rf"kernel reset_while_counting, block \(0,0,0\): global memory race \(read after "
                                        rf"write, same value\): thread \(1,0,0\) reads 4 bytes at 0x[0-9a-f]+ \(int\* counter "
                                        rf"\+ 0 bytes\) on line {line_of(code, 'atomicAdd')}; thread \(0,0,0\) wrote them on "
                                        rf"line {line_of(code, '*counter = 0')} \(0x00000000 -> 0x00000000\), "
                                        r"no __syncwarp or __syncthreads between them"):
        Module(code, name="test.cu").get_function("reset_while_counting")((1,), (32,), (np.zeros(1, np.int32),))


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
    """With the detectors off (they report the read itself: test_cudasim_detectors.py)."""
    kernel = module("""
        extern "C" __global__ void peek(float* out) {
            __shared__ float tile[64];
            if (threadIdx.x == 0) { out[blockIdx.x] = tile[5]; tile[5] = 1.0f; }
        }""").get_function("peek")
    out = np.zeros(3, np.float32)
    with detectors(False):
        kernel((3,), (32,), (out,))
    assert np.isnan(out).all()  # no block sees the previous block's write


def test_a_race_is_reported_with_the_first_differing_element():
    """The schedules' comparison, which also catches what the detectors are blind to (off here:
    they report the first write-write race itself)."""
    kernel = module("""
        extern "C" __global__ void last_writer_wins(int* out) { out[1] = threadIdx.x; }""").get_function(
        "last_writer_wins")
    with pytest.raises(RaceError, match=r"kernel last_writer_wins: race: int\* out \(2,\) differs between schedules "
                                        r"in-order and reverse at 1 elements, first at \(1,\): "):
        with schedules(), detectors(False):
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

extern "C" __global__ void next_tile(const __half* a) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + 256, 16);  // the tile after a's only one
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


def test_planted_wmma_load_past_the_end_of_its_input(wmma):
    """A warp collective's accesses are checked too: lane 0 loads the first element past a's
    16x16 tile that its (scrambled) fragment holds, and is stopped there."""
    line = line_of(textwrap.dedent(WMMA), "a + 256")
    with pytest.raises(KernelError, match=r"kernel next_tile, block \(0,0,0\): out-of-bounds global memory read: thread "
                                          r"\(0,0,0\) reads 2 bytes at 0x[0-9a-f]+ \(const __half\* a \+ \d+ bytes, outside "
                                          rf"its 512 bytes\) on line {line}"):
        wmma.get_function("next_tile")((1,), (32,), (device_array(np.zeros(256, np.float16)),))


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
    x, w, out, width, eps, rows = rms_norm_args()
    with pytest.raises(KernelError, match=r"argument 1 \(const float\* weight\) points to float32 but gets an array of float64"):
        rms((1,), (256,), (x, w.astype(np.float64), out, width, eps, rows))
    with pytest.raises(KernelError, match=r"argument 3 \(int width\) gets a Python int, which CuPy passes as a long long"):
        rms((1,), (256,), (x, w, out, 300, eps, rows))
    with pytest.raises(KernelError, match=r"argument 2 \(float\* out\) gets a non-contiguous array"):
        rms((1,), (256,), (x, w, np.empty((300, 3), np.float32).T, width, eps, rows))


# ---------------------------------------------------------------------------------------------
# Detectors: races found by access (whatever the values) and uninitialised shared reads, in
# kernels written to have them. Messages come from the first schedule (in order).


# A sum over the whole block (blockDim.x a multiple of 32), every thread getting it: the detectors'
# subject below.
BLOCK_SUM = """
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // `partial` may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}
"""


def block_sum_source(kernel: str, old: str = "", new: str = "") -> str:
    """common.cuh and BLOCK_SUM (with `old` replaced by `new`), followed by `kernel`."""
    common = (KERNEL_DIR / COMMON_HEADER).read_text() + BLOCK_SUM
    assert old in common
    return common.replace(old, new) + textwrap.dedent(kernel)


SCALE_BY_SUM = """
extern "C" __global__ void scale_by_sum(const float* x, float* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = x[i] * block_sum(x[i]);
}
"""

SUM_TWICE = """
extern "C" __global__ void sum_twice(const float* x, float* out) {
    const float v = x[blockIdx.x * blockDim.x + threadIdx.x];
    const float total = block_sum(v);
    const float again = block_sum(v);  // the same partial sums, written over themselves
    if (threadIdx.x == 0) out[blockIdx.x] = total + again;
}
"""


def test_a_write_after_read_of_the_same_value_is_a_race():
    """block_sum without the barrier that keeps a second call from overwriting `partial` while
    lanes still read the first call's sums. The second call writes the very values already
    there (partial[0] = 496 = 0x43f80000), so every schedule leaves the same bytes; the detectors
    report it from the accesses."""
    code = block_sum_source(SUM_TWICE, "    __syncthreads();  // `partial` may still be read by a previous call\n")
    kernel = Module(code, name="sum_twice.cu").get_function("sum_twice")
    x, out = np.arange(256, dtype=np.float32), np.zeros(1, np.float32)
    with detectors(False), schedules():
        kernel((1,), (256,), (x, out))
    assert out[0] == 2 * x.sum()
    write, read = line_of(code, "if (lane == 0) partial[warp] = v;"), line_of(code, "? partial[lane] :")
    with pytest.raises(RaceError, match=rf"kernel sum_twice, block \(0,0,0\): shared memory race \(write after read, same "
                                        rf"value\): thread \(0,0,0\) writes 4 bytes at 0x[0-9a-f]+ \(static shared memory "
                                        rf"\+ 0 bytes\) on line {write} \(0x43f80000 -> 0x43f80000\); thread \(224,0,0\) read "
                                        rf"them on line {read}, no __syncthreads between them"):
        kernel((1,), (256,), (x, out))


CLAMP_AND_SMOOTH = """
extern "C" __global__ void clamp_and_smooth(const float* x, float* out) {
    __shared__ float s[128];
    const int t = threadIdx.x;
    s[t] = x[t];
    __syncthreads();
    s[t] = fminf(s[t], 1.0f);
    out[t] = 0.5f * (s[t] + s[(t + 1) % 128]);  // a barrier is missing before this line
}
"""


def test_a_missing_barrier_is_a_race_even_where_all_schedules_agree():
    """Inputs below the clamp: the clamp stores what is there, so all four schedules agree
    (the comparison is silent), but thread 0 reads s[1] while thread 1 writes it."""
    kernel = module(CLAMP_AND_SMOOTH).get_function("clamp_and_smooth")
    x, out = np.linspace(-1, 0.5, 128, dtype=np.float32), np.zeros(128, np.float32)
    with detectors(False), schedules():
        kernel((1,), (128,), (x, out))
    assert np.array_equal(out, 0.5 * (x + np.roll(x, -1)))
    code = textwrap.dedent(CLAMP_AND_SMOOTH)
    with pytest.raises(RaceError, match=rf"kernel clamp_and_smooth, block \(0,0,0\): shared memory race \(write after read, "
                                        rf"same value\): thread \(1,0,0\) writes 4 bytes at 0x[0-9a-f]+ \(static shared "
                                        rf"memory \+ 4 bytes\) on line {line_of(code, 'fminf')} \(0xbf7cf9f4 -> 0xbf7cf9f4\); "
                                        rf"thread \(0,0,0\) read them on line {line_of(code, 'out[t] =')}, no __syncwarp or "
                                        rf"__syncthreads between them"):
        with schedules():
            kernel((1,), (128,), (x, out))


ROW_SUMS = """
extern "C" __global__ void row_sums(const float* x, float* sums, int width) {
    if (threadIdx.x != 0) return;
    float s = 0.0f;
    for (int j = 0; j < width; ++j) s += x[blockIdx.x * width + j];
    sums[blockIdx.x / 2] = s;  // two blocks per slot
}
"""


def test_two_blocks_writing_one_global_element_is_a_race():
    kernel = module(ROW_SUMS).get_function("row_sums")
    x, sums = np.ones((4, 3), np.float32), np.zeros(4, np.float32)
    line = line_of(textwrap.dedent(ROW_SUMS), "sums[blockIdx.x / 2] = s;")
    with pytest.raises(RaceError, match=rf"kernel row_sums, block \(1,0,0\): global memory race \(write after write, same "
                                        rf"value\): thread \(0,0,0\) writes 4 bytes at 0x[0-9a-f]+ \(float\* sums \+ 0 bytes\) "
                                        rf"on line {line} \(0x40400000 -> 0x40400000\); thread \(0,0,0\) of block \(0,0,0\) "
                                        rf"wrote them on line {line}, blocks of one launch are not ordered"):
        kernel((4,), (32,), (x, sums, np.int32(3)))


TILE_SUMS = """
extern "C" __global__ void tile_sums(const float* x, float* sums, int n) {
    __shared__ float tile[256];
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i < n) tile[threadIdx.x] = x[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int j = 0; j < 256; ++j) s += tile[j];  // past n in the last block: never written
        sums[blockIdx.x] = s;
    }
}
"""


def test_an_uninitialised_shared_read_in_a_partial_last_block():
    kernel = module(TILE_SUMS).get_function("tile_sums")
    line = line_of(textwrap.dedent(TILE_SUMS), "s += tile[j]")
    with pytest.raises(KernelError, match=rf"kernel tile_sums, block \(1,0,0\): uninitialised shared memory read: thread "
                                          rf"\(0,0,0\) reads 4 bytes at 0x[0-9a-f]+ \(static shared memory \+ 176 bytes\) on "
                                          rf"line {line}, which no thread of this block has written"):
        kernel((2,), (256,), (np.ones(300, np.float32), np.zeros(2, np.float32), np.int32(300)))


WARP_SYNCHRONOUS = """
extern "C" __global__ void warp_sum_unsynced(const float* x, float* out) {
    __shared__ float s[64];
    const int t = threadIdx.x;
    s[t] = x[t];
    s[t + 32] = x[t + 32];
    __syncwarp();
    volatile float* v = s;  // the pre-Volta idiom: lanes in lockstep, no __syncwarp between steps
    v[t] += v[t + 32];
    v[t] += v[t + 16];
    v[t] += v[t + 8];
    v[t] += v[t + 4];
    v[t] += v[t + 2];
    v[t] += v[t + 1];
    if (t == 0) *out = v[0];
}
"""


def test_a_warp_synchronous_reduction_without_syncwarp_is_a_race():
    kernel = module(WARP_SYNCHRONOUS).get_function("warp_sum_unsynced")
    code = textwrap.dedent(WARP_SYNCHRONOUS)
    with pytest.raises(RaceError, match=rf"kernel warp_sum_unsynced, block \(0,0,0\): shared memory race \(write after read\): "
                                        rf"thread \(1,0,0\) writes 4 bytes at 0x[0-9a-f]+ \(static shared memory \+ 4 bytes\) "
                                        rf"on line {line_of(code, 'v[t] += v[t + 32];')} \(0x[0-9a-f]{{8}} -> 0x[0-9a-f]{{8}}\); "
                                        rf"thread \(0,0,0\) read them on line {line_of(code, 'v[t] += v[t + 1];')}, "
                                        rf"no __syncwarp or __syncthreads between them"):
        kernel((1,), (32,), (np.ones(64, np.float32), np.zeros(1, np.float32)))


TREE_SUM = """
extern "C" __global__ void tree_sum(const float* x, float* out, int n) {
    __shared__ float s[256];
    const int t = threadIdx.x, i = blockIdx.x * 256 + t;
    s[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int stride = 128; stride >= 32; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t < 32) {  // the last warp: a __syncwarp between reading and writing, and after
        float v = s[t];
        for (int stride = 16; stride > 0; stride >>= 1) {
            v += s[t + stride];
            __syncwarp();
            s[t] = v;
            __syncwarp();
        }
    }
    if (t == 0) out[blockIdx.x] = s[0];
}
"""


def test_a_correct_tree_reduction_runs_clean():
    kernel = module(TREE_SUM).get_function("tree_sum")
    x, out = np.arange(300, dtype=np.float32), np.zeros(2, np.float32)
    with schedules():
        kernel((2,), (256,), (x, out, np.int32(300)))
    assert list(out) == [x[:256].sum(), x[256:].sum()]


def tensor_core_attention_args(length: int, head_dim: int = 16, seed: int = 0):
    """Arguments of flash_attention_tc_f16 for q, k, v [1, 1, length, head_dim] (no bias, no mask)."""
    rng = np.random.default_rng(seed)
    q, k, v = (device_array(rng.standard_normal((1, 1, length, head_dim)).astype(np.float16)) for _ in range(3))
    unused = np.zeros(1, np.float32)
    out = np.zeros((1, length, head_dim), np.float16)
    return (q, k, v, unused, unused, out, *map(np.int32, (1, length, length, head_dim)), np.float32(0.25),
            np.int32(0), np.int32(0))


def test_planted_missing_barrier_before_a_kv_buffer_is_refilled():
    """The tensor-core attention without the barrier that ends a key tile: a warp done with tile
    j issues the cp.async of tile j + 2 into the buffer other warps still read with ldmatrix.
    Three tiles of keys and more (150 > 2 x 32), so a buffer is refilled; the detectors see the copy's
    store (cudasim's cp.async marks its destination NaN at the issue) into K's first buffer (after
    Q's rows x 64 x 2 bytes) and the other warp's ldmatrix read unordered (ptx.cuh is pasted into
    the source, so both lines are its lines)."""
    kernel = planted("attention_tc.cu", "__syncthreads();  // tile j's buffers", "// tile j's buffers").get_function(
        "flash_attention_tc_f16")
    code = kernel.module.code
    issue, read = line_of(code, "copy.dst[i] = 0xffffffffu;"), line_of(code, 'warp_collective(TRANS ? "ldmatrix .trans"')
    with pytest.raises(RaceError, match=r"kernel flash_attention_tc_f16, block \(0,0,0\): shared memory race \(write after "
                                        r"read\): thread \(\d+,0,0\) writes 4 bytes at 0x[0-9a-f]+ \(dynamic shared memory "
                                        rf"\+ {2 * mma_rows(16) * 64} bytes\) on line {issue} \(0x[0-9a-f]{{8}} -> 0xffffffff\); thread "
                                        rf"\(\d+,0,0\) read them on line {read}, no __syncthreads between them"):
        kernel((1, 1), (128,), tensor_core_attention_args(150), shared_mem=attention_shared_bytes(16, np.float16))


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
    not written yet: the detectors report the first such read (in order, lane 1 reads before
    warp 1 has written anything); without them, it is poisoned NaN under one schedule and a
    number under another."""
    code = block_sum_source(SCALE_BY_SUM, "if (lane == 0) partial[warp] = v;\n    __syncthreads();",
                            "if (lane == 0) partial[warp] = v;")
    kernel = Module(code, name="scale_by_sum.cu").get_function("scale_by_sum")
    read = line_of(code, "? partial[lane] :")
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    with pytest.raises(KernelError, match=rf"kernel scale_by_sum, block \(0,0,0\): uninitialised shared memory read: "
                                          rf"thread \(1,0,0\) reads 4 bytes at 0x[0-9a-f]+ \(static shared memory \+ 4 bytes\) "
                                          rf"on line {read}, which no thread of this block has written"):
        kernel((3,), (256,), (x, np.empty_like(x)))
    with pytest.raises(RaceError, match=r"kernel scale_by_sum: race: float\* out \(3, 256\) differs between schedules"):
        with schedules(), detectors(False):
            kernel((3,), (256,), (x, np.empty_like(x)))


def test_planted_wrong_shuffle_offset_breaks_the_reduction():
    """warp_sum (group_sum over 32 lanes) starting at offset 8 adds only 16 lanes: every schedule
    agrees (it is not a race) but the norm is wrong, and the parity check names the kernel and
    the error."""
    kernel = planted("rmsnorm.cu", "for (int offset = lanes >> 1; offset > 0; offset >>= 1) v += __shfl_xor_sync",
                     "for (int offset = lanes >> 2; offset > 0; offset >>= 1) v += __shfl_xor_sync").get_function("rms_norm_f32")
    x, w, out, width, eps, rows = args = rms_norm_args()
    with schedules():
        kernel((1,), (256,), args)
    error = np.max(np.abs(out - ref.rms_norm(x.astype(np.float64), w))) / np.max(np.abs(x))
    with pytest.raises(AssertionError, match=r"rms_norm_f32: max relative error [\d.]+ > 1e-04"):
        assert error < 1e-4, f"rms_norm_f32: max relative error {error:.3f} > 1e-04"


def test_planted_shuffle_in_divergent_code():
    """The per-head norm's group_sum moved inside the loop over a lane's pairs, past the `continue`
    of lanes without a head vector: one token's 3 head vectors of Dh 64 (fp32: 8 packs of 4, 8 lanes
    each) leave lanes 24-31 idle, and they never call it."""
    kernel = planted("rope.cu", "sum_sq += lo[c][e] * lo[c][e] + hi[c][e] * hi[c][e];",
                     "sum_sq = group_sum(sum_sq + lo[c][e] * lo[c][e] + hi[c][e] * hi[c][e], lanes);"
                     ).get_function("qkv_heads_f32")
    heads, head_dim = 1, 64
    qkv = np.ones((1, 1, 3 * heads * head_dim), np.float32)
    bias = np.zeros(3 * heads * head_dim, np.float32)
    norm = np.ones(head_dim, np.float32)
    table = np.ones((1, head_dim // 2), np.float32)
    q, k, v = (np.zeros((1, heads, 1, head_dim), np.float32) for _ in range(3))
    ints = [np.int32(n) for n in (1, 1, heads, head_dim, 1, 0, 1, 0)]
    with pytest.raises(KernelError, match=r"kernel qkv_heads_f32, block \(0,0,0\): divergent shuffle: thread \(0,0,0\) waits at "
                                          r"__shfl_xor_sync on line \d+ with mask 0xffffffff, but lane 24 "
                                          r"\(thread \(24,0,0\)\) (has exited|waits at __shfl_xor_sync on line \d+)"):
        kernel((1,), (128,), (qkv, bias, norm, norm, table, table, q, k, v, *ints, np.float32(1e-6)))


def test_planted_shared_memory_one_row_too_small():
    """v_tile placed one K row further: the launch's shared memory is one row short for it. The
    detectors stop the first store past it; without them the bytes past it are checked after the block."""
    kernel = planted("attention.cu", "float* v_tile = k_tile + KEY_TILE * (head_dim + 1);",
                     "float* v_tile = k_tile + (KEY_TILE + 1) * (head_dim + 1);").get_function("flash_attention_f32")
    head_dim = 16
    q = np.random.default_rng(0).standard_normal((1, 1, 40, head_dim)).astype(np.float32)
    args = (q, q, q, q, q, np.empty((1, 40, head_dim), np.float32), *map(np.int32, (1, 40, 40, head_dim)),
            np.float32(0.25), np.int32(0), np.int32(0))
    shared = 4 * (32 * head_dim + 32 * (2 * head_dim + 1))
    line = line_of(kernel_source("attention.cu"), "v_tile[i] = valid ?")
    with pytest.raises(KernelError, match=r"kernel flash_attention_f32, block \(0,0,0\): out-of-bounds shared memory write: "
                                          rf"thread \(111,0,0\) writes 4 bytes at 0x[0-9a-f]+ \(dynamic shared memory \+ "
                                          rf"{shared} bytes, outside the {shared} bytes the launch asked for\) on line {line}"):
        kernel((2, 1), (128,), args, shared_mem=shared)
    with detectors(False), pytest.raises(KernelError, match=r"kernel flash_attention_f32, block \(\d,0,0\): wrote past the "
                                                            rf"end of dynamic shared memory: the launch asked for {shared} bytes"):
        kernel((2, 1), (128,), args, shared_mem=shared)


def test_planted_untransposed_value_fragments_in_the_tensor_core_attention():
    """V's B fragments loaded with ldmatrix without .trans: each lane then holds two dims of one
    key instead of one dim of two keys, a layout slip every schedule agrees on (no race), which
    the parity check catches: the output is far from the reference."""
    kernel = planted("attention_tc.cu", "ldmatrix_x4_trans(vb,", "ldmatrix_x4(vb,").get_function("flash_attention_tc_f16")
    args = tensor_core_attention_args(32)
    with schedules():
        kernel((1, 1), (128,), args, shared_mem=attention_shared_bytes(16, np.float16))
    q, k, v, out = args[0], args[1], args[2], args[5]
    expected = ref.attention(*(a.astype(np.float64) for a in (q, k, v)), 0.25)[0, 0]
    assert np.max(np.abs(out[0] - expected)) > 0.1


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
# Out-of-bounds and misaligned accesses (memcheck on a CPU), float atomics


BOUNDS = """
extern "C" __global__ void doubled(const float* x, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float v = i < n ? x[i] : 0.0f;
    if (i <= n) out[i] = 2.0f * v;  // one past the end in the partial last block
}
extern "C" __global__ void left_neighbour(const float* x, float* out) {
    out[threadIdx.x] = x[(int)threadIdx.x - 1];  // thread 0 reads before the start
}
extern "C" __global__ void shifted_dynamic(const float* x, float* out) {
    extern __shared__ float staged[];
    staged[threadIdx.x + 1] = x[threadIdx.x];  // one past the launch's dynamic shared memory
    __syncthreads();
    out[threadIdx.x] = staged[threadIdx.x];
}
extern "C" __global__ void copy_vectors(const float* x, float* out) {
    reinterpret_cast<float4*>(out)[threadIdx.x] = reinterpret_cast<const float4*>(x + 1)[threadIdx.x];  // 4-byte aligned only
}
extern "C" __global__ void shifted_copy(const float* x, float* out, int limit, int shift) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < limit) out[i + shift] = x[i];
}
extern "C" __global__ void far_store(const float* x, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i + (1 << 18)] = x[i];  // 1 MiB past the start of out
}
extern "C" __global__ void far_left(const float* x, float* out) {
    out[threadIdx.x] = x[(int)threadIdx.x - (1 << 20)];  // 4 MiB before the start of x
}
extern "C" __global__ void poke(long long address, int value) {
    *reinterpret_cast<int*>(address) = value;  // memory the launch was not given
}
__device__ __attribute__((noinline)) void set(char* text, int i, char c) {
    text[i] = c;  // not inlined: the compiler cannot drop the store as undefined
}
extern "C" __global__ void overwrite_literal(float* out) {
    set(const_cast<char*>("cudasim"), threadIdx.x % 7, 'x');  // a string literal: read-only data
    out[threadIdx.x] = 1.0f;
}
"""


@pytest.fixture(scope="module")
def bounds():
    return module(BOUNDS)


def report(kind: str, thread: str, size: int, where: str, fragment: str, block: str = "0") -> str:
    """The pattern of an out-of-bounds report: kernel and block are matched by the caller's prefix."""
    verb = {"read": "reads", "write": "writes"}[kind.split()[-1]]
    return (rf"{kind}: thread \({thread},0,0\) {verb} {size} bytes at 0x[0-9a-f]+ \({re.escape(where)}\) on line "
            rf"{line_of(textwrap.dedent(BOUNDS), fragment)}")


def test_planted_off_by_one_store_past_the_end_of_an_output(bounds):
    """`i <= n` in the partial last block: thread 4 of block 3 stores out[100] of 100 elements.
    It is stopped before the store, so the bytes after the buffer keep their value."""
    x, memory = np.ones(100, np.float32), np.full(101, -1.0, np.float32)
    out = memory[:100]
    with pytest.raises(KernelError, match=r"kernel doubled, block \(3,0,0\): " + report(
            "out-of-bounds global memory write", "4", 4, "float* out + 400 bytes, outside its 400 bytes", "if (i <= n)")):
        bounds.get_function("doubled")((4,), (32,), (x, out, np.int32(100)))
    assert memory[100] == -1.0 and np.array_equal(out, np.full(100, 2.0, np.float32))


def test_planted_read_before_the_start_of_an_input(bounds):
    with pytest.raises(KernelError, match=r"kernel left_neighbour, block \(0,0,0\): " + report(
            "out-of-bounds global memory read", "0", 4, "const float* x - 4 bytes, outside its 128 bytes", "x[(int)threadIdx.x - 1]")):
        bounds.get_function("left_neighbour")((1,), (32,), (np.ones(32, np.float32), np.zeros(32, np.float32)))


SHIFTED_TILE = """
extern "C" __global__ void shifted_tile(const float* x, float* out) {
    __shared__ float tile[32];
    tile[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = tile[threadIdx.x + 1];  // one past the shared array
}
"""


def test_planted_read_past_a_static_shared_array():
    """Its own module: the one shared array lies between the guards (in a module with dynamic
    shared arrays too, the order the linker gives them decides which one it borders)."""
    line = line_of(textwrap.dedent(SHIFTED_TILE), "tile[threadIdx.x + 1]")
    with pytest.raises(KernelError, match=r"kernel shifted_tile, block \(0,0,0\): out-of-bounds shared memory read: thread "
                                          r"\(31,0,0\) reads 4 bytes at 0x[0-9a-f]+ \(static shared memory \+ 128 bytes, "
                                          rf"outside its 128 bytes\) on line {line}"):
        module(SHIFTED_TILE).get_function("shifted_tile")((1,), (32,), (np.ones(32, np.float32), np.zeros(32, np.float32)))


def test_planted_write_past_the_dynamic_shared_memory_of_the_launch(bounds):
    with pytest.raises(KernelError, match=r"kernel shifted_dynamic, block \(0,0,0\): " + report(
            "out-of-bounds shared memory write", "31", 4,
            "dynamic shared memory + 128 bytes, outside the 128 bytes the launch asked for", "staged[threadIdx.x + 1] =")):
        bounds.get_function("shifted_dynamic")((1,), (32,), (np.ones(32, np.float32), np.zeros(32, np.float32)),
                                               shared_mem=128)


def test_planted_misaligned_vector_load(bounds):
    code = textwrap.dedent(BOUNDS)
    with pytest.raises(KernelError, match=r"kernel copy_vectors, block \(0,0,0\): misaligned global memory read: thread "
                                          r"\(0,0,0\) reads 16 bytes at 0x[0-9a-f]+ \(const float\* x \+ 4 bytes\) on line "
                                          rf"{line_of(code, 'reinterpret_cast<float4*>(out)')}, which a GPU requires to be "
                                          r"16-byte aligned"):
        bounds.get_function("copy_vectors")((1,), (8,), (np.ones(33, np.float32), np.zeros(32, np.float32)))


PACK_COPY = """
extern "C" __global__ void pack_copy(const __half* x, __half* out, int from, int to) {
    store_pack<__half, 8>(out + to, load_pack<__half, 8>(x + from));
}
"""


@pytest.mark.parametrize("from_, to, kind, buffer", [(1, 0, "read", "const __half* x"), (0, 3, "write", "__half* out")])
def test_planted_misaligned_pack_load_and_store(from_, to, kind, buffer):
    """common.cuh's 16-byte packs move as float4 accesses, which a GPU requires 16-byte aligned
    (an n-byte access must be n-byte aligned: CUDA C++ Programming Guide, "Device Memory
    Accesses"): a pack one value or three off is reported with its buffer and offset, before it
    happens; at aligned addresses the 8 values are copied bit for bit."""
    code = (KERNEL_DIR / COMMON_HEADER).read_text() + textwrap.dedent(PACK_COPY)
    kernel = Module(code, name="pack_copy.cu").get_function("pack_copy")
    x, out = np.arange(32, dtype=np.float16), np.zeros(32, np.float16)
    kernel((1,), (1,), (x, out, np.int32(8), np.int32(16)))
    assert out[16:24].tobytes() == x[8:16].tobytes() and not out[:16].any() and not out[24:].any()
    verb = {"read": "reads", "write": "writes"}[kind]
    with pytest.raises(KernelError, match=rf"kernel pack_copy, block \(0,0,0\): misaligned global memory {kind}: thread "
                                          rf"\(0,0,0\) {verb} 16 bytes at 0x[0-9a-f]+ \({re.escape(buffer)} \+ "
                                          rf"{2 * (from_ or to)} bytes\) on line \d+, which a GPU requires to be 16-byte aligned"):
        kernel((1,), (1,), (x, out, np.int32(from_), np.int32(to)))


def test_planted_store_a_mebibyte_past_the_output_leaves_the_host_intact(bounds):
    """Far past every guard a memcheck-less run would write host memory it does not own; the
    store is stopped before it happens, with the offset from the buffer, and the host's arrays
    (a canary allocated before the launch, the bytes after out) keep their values."""
    canary = np.full(1 << 20, 3.0, np.float32)
    x, memory = np.ones(100, np.float32), np.full(2 * (1 << 18), -1.0, np.float32)
    out = memory[:100]
    with pytest.raises(KernelError, match=r"kernel far_store, block \(0,0,0\): " + report(
            "out-of-bounds global memory write", "0", 4, "float* out + 1048576 bytes, outside its 400 bytes", "1 << 18")):
        bounds.get_function("far_store")((4,), (32,), (x, out, np.int32(100)))
    assert np.all(canary == 3.0) and np.all(memory == -1.0)


def test_planted_read_far_before_the_start_of_an_input(bounds):
    with pytest.raises(KernelError, match=r"kernel far_left, block \(0,0,0\): " + report(
            "out-of-bounds global memory read", "0", 4, "const float* x - 4194304 bytes, outside its 128 bytes", "1 << 20")):
        bounds.get_function("far_left")((1,), (32,), (np.ones(32, np.float32), np.zeros(32, np.float32)))


def test_planted_store_into_host_memory_the_launch_was_not_given(bounds):
    """A pointer the kernel makes up (here: the address of a host array, passed as an integer)
    reaches no buffer of the launch: stopped, and the host array keeps its value."""
    canary = np.zeros(4, np.int32)
    with pytest.raises(KernelError, match=r"kernel poke, block \(0,0,0\): " + report(
            "out-of-bounds global memory write", "0", 4, "the launch passed no buffer", "reinterpret_cast<int*>(address)")):
        bounds.get_function("poke")((1,), (1,), (np.int64(canary.ctypes.data), np.int32(7)))
    assert np.all(canary == 0)


def test_planted_store_into_a_string_literal(bounds):
    """The library's static data may be read, but its read-only part (code, constants, string
    literals) not written: on a CPU the store would kill the process."""
    line = line_of(textwrap.dedent(BOUNDS), "text[i] = c;")
    with pytest.raises(KernelError, match=r"kernel overwrite_literal, block \(0,0,0\): out-of-bounds global memory write: "
                                          r"thread \(0,0,0\) writes 1 bytes at 0x[0-9a-f]+ \(float\* out [+-] \d+ bytes, "
                                          rf"outside its 128 bytes\) on line {line}"):
        bounds.get_function("overwrite_literal")((1,), (32,), (np.zeros(32, np.float32),))


PERMITTED = """
__device__ float scale[4] = {1.0f, 2.0f, 4.0f, 8.0f};
__device__ int started;
__device__ __attribute__((noinline)) float pick(const float* values, int k) { return values[k]; }
extern "C" __global__ void permitted(const float* x, float* out) {
    static const float offsets[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    float staged[8];  // the thread's locals: on its stack, read through a pointer (so checked)
    for (int k = 0; k < 8; ++k) staged[k] = x[(threadIdx.x + k) % 32];
    const char* digits = "0123";
    out[threadIdx.x] = pick(staged, threadIdx.x % 8) * scale[threadIdx.x % 4] + offsets[blockIdx.x % 4] +
                       (digits[threadIdx.x % 4] - '0');
    if (threadIdx.x == 0) atomicAdd(&started, 1);
}
"""


def test_locals_device_globals_constant_tables_and_string_literals_are_in_bounds():
    """What a kernel may touch outside its buffers and shared memory: its own locals, __device__
    globals, static constant tables and string literals (the library's static data). Exact:
    small integers and powers of two."""
    x = np.arange(32, dtype=np.float32)
    out = np.zeros(32, np.float32)
    with schedules():
        module(PERMITTED).get_function("permitted")((1,), (32,), (x, out))
    t = np.arange(32)
    assert np.array_equal(out, ((t + t % 8) % 32) * 2.0 ** (t % 4) + 0.5 + t % 4)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 200), block=st.sampled_from([32, 64, 128]), extra=st.integers(-3, 2),
       shift=st.one_of(st.integers(-40, 40), st.integers(-(1 << 24), 1 << 24)))
def test_every_shifted_store_outside_the_output_is_caught_and_every_other_runs_clean(bounds, n, block, extra, shift):
    """out[i + shift] = x[i] for i < limit = n + extra, with out of n elements: out of bounds
    exactly when some such i + shift leaves [0, n), whatever the length, block size, limit and
    shift (drawn by hypothesis, not chosen for the harness: near the ends, or up to 64 MiB
    away, within out's guard, so the report names out). In order, the first thread to fault
    is the lowest such i: it stores element `shift` (below 0) or max(n, shift) (at or past n)."""
    limit = max(0, n + extra)
    x, out = np.arange(n + 40, dtype=np.float32), np.zeros(n, np.float32)
    launch = partial(bounds.get_function("shifted_copy"), (max(1, (limit + block - 1) // block),), (block,),
                     (x, out, np.int32(limit), np.int32(shift)))
    first = shift if shift < 0 else max(n, shift)  # the first element outside out that a thread could store
    if limit <= first - shift:  # i = first - shift is the lowest i storing outside; no thread gets there
        launch()
        assert np.array_equal(out[shift:shift + limit], x[:limit])  # limit is 0 where shift < 0
        return
    with pytest.raises(KernelError, match=rf"out-of-bounds global memory write: thread \({(first - shift) % block},0,0\) "
                                          rf".* \(float\* out {re.escape('-' if first < 0 else '+')} {4 * abs(first)} bytes, outside "
                                          rf"its {4 * n} bytes\)"):
        launch()


FLOAT_SUMS = """
extern "C" __global__ void block_totals(const float* x, float* total, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) == 0) atomicAdd(total, v);  // one add per warp, in the order warps run
}
"""


def test_float_atomic_adds_differ_by_their_order_within_the_rounding_bound():
    """A correct warp reduction ending in one float atomicAdd per warp: 64 adds whose order each
    schedule changes. The schedules' totals differ in their last bits (without detectors that is
    the comparison's RaceError), and with detectors they are compared within 64 u (M_a + M_b) /
    (1 - u), so the launch passes."""
    kernel = module(FLOAT_SUMS).get_function("block_totals")
    x = np.random.default_rng(0).standard_normal(2048).astype(np.float32)
    total = np.zeros(1, np.float32)
    with detectors(False), schedules(), pytest.raises(RaceError, match=r"float\* total \(1,\) differs between schedules"):
        kernel((8,), (256,), (x, total, np.int32(2048)))
    total[0] = 0
    with schedules():
        kernel((8,), (256,), (x, total, np.int32(2048)))
    # any term passes through 5 shuffle adds and at most 64 atomic ones: |error| <= 69 u sum |x| (first order)
    u = np.finfo(np.float32).eps / 2
    assert abs(total[0] - x.astype(np.float64).sum()) <= 69 * u * np.abs(x.astype(np.float64)).sum() / (1 - 69 * u)


def test_a_plain_store_to_a_word_of_float_atomics_is_compared_exactly():
    """The same sum, but thread 0 first stores into the word: the word is not only atomics', so
    the schedules must agree bit for bit (the detectors also report the unordered store)."""
    code = textwrap.dedent(FLOAT_SUMS).replace("float v = i < n", "if (i == 0) *total = 1.0f;\n    float v = i < n")
    with pytest.raises(RaceError, match=r"kernel block_totals, block \(\d,0,0\): global memory race"):
        with schedules():
            module(code).get_function("block_totals")((8,), (256,), (np.ones(2048, np.float32), np.zeros(1, np.float32),
                                                                    np.int32(2048)))


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
    """A non-blocking stream, the current one, capturing a graph; the capture is ended whatever the
    test did."""
    from minit2i.cudasim import standin

    stream = standin.cuda.Stream(non_blocking=True)
    with stream:
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


# Streams and events in a capture: the graph's dependencies as CUDA builds them


def test_a_stream_joins_a_capture_by_an_event_and_must_be_joined_back(capturing):
    """Work on a second stream is captured once it waits on an event recorded in the capturing
    stream; its nodes hang off that event's point, and the capture ends only once the first stream
    has waited for the second's work (else cudaErrorStreamCaptureUnjoined)."""
    from minit2i.cudasim import standin

    side, x = standin.cuda.Stream(non_blocking=True), standin.ones(3, np.float32)
    first = x + 1
    side.wait_event(capturing.record())
    with side:
        second = x * 2
    third = first + 1  # the capturing stream goes on beside the side stream
    capturing.wait_event(side.record())
    fourth = third + second
    graph = capturing.end_capture()
    assert [(node.stream is side, sorted(node.waits_for)) for node in graph.nodes] == [
        (False, []), (True, [0]), (False, [0]), (False, [1, 2])]
    graph.launch()
    assert (fourth.view(np.ndarray) == 5).all()


def test_a_capture_with_unjoined_work_is_refused(capturing):
    from minit2i.cudasim import standin

    side = standin.cuda.Stream(non_blocking=True)
    side.wait_event(capturing.record())
    with side:
        standin.ones(3, np.float32) + 1
    with pytest.raises(standin.CUDARuntimeError, match="^cudaErrorStreamCaptureUnjoined"):
        capturing.end_capture()


def test_work_on_a_stream_outside_the_capture_is_refused(capturing):
    """A stream that never waited on the capture's events is not part of it: cudasim refuses its
    work (on a GPU it would run at once, before the captured work it reads)."""
    from minit2i.cudasim import standin

    x = standin.ones(3, np.float32)
    with standin.cuda.Stream(non_blocking=True), pytest.raises(RuntimeError, match="not part of the capture"):
        x + 1
