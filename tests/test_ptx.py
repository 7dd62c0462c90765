"""cudasim's PTX instructions (accelerated/kernels/ptx.cuh), lane by lane against the PTX ISA.

Each test writes the ISA's layout table out again here in Python, independently of the header
(g = lane // 4, t = lane % 4), feeds every lane the registers that table names, and compares what
every lane gets back with NumPy: mma.sync m16n8k16 against a product, ldmatrix against the rows
the lanes pointed at, cp.async against the bytes and the group it was waited for in.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from minit2i.accelerated.kernels import KERNEL_DIR, PTX_HEADER
from minit2i.cudasim import KernelError, Module, schedules

BF16 = np.dtype(ml_dtypes.bfloat16)
LANES = np.arange(32)
G, T = LANES // 4, LANES % 4


def ptx_module(kernels: str) -> Module:
    return Module((KERNEL_DIR / PTX_HEADER).read_text() + kernels, name="ptx_test.cu")


KERNELS = """
#define MMA(T, SUFFIX)                                                                                \\
extern "C" __global__ void mma_##SUFFIX(const unsigned* a, const unsigned* b, float* d) {           \\
    const int lane = threadIdx.x;                                                                    \\
    ptx_u32 ra[4] = {a[4 * lane], a[4 * lane + 1], a[4 * lane + 2], a[4 * lane + 3]};                \\
    ptx_u32 rb[2] = {b[2 * lane], b[2 * lane + 1]};                                                  \\
    float rd[4] = {d[4 * lane], d[4 * lane + 1], d[4 * lane + 2], d[4 * lane + 3]};                  \\
    mma_m16n8k16<T>(rd, ra, rb);                                                                     \\
    for (int i = 0; i < 4; ++i) d[4 * lane + i] = rd[i];                                             \\
}
MMA(__half, f16)
MMA(__nv_bfloat16, bf16)

// rows: [32][8] 16-bit values (as 128 words); lane l points at row order[l]; out [32][4] registers.
#define LDMATRIX(NAME, N)                                                                             \\
extern "C" __global__ void NAME##_test(const unsigned* rows, const int* order, unsigned* out) {     \\
    __shared__ uint4 rows_16[32];  /* uint4: 16-byte aligned, as ldmatrix needs */                   \\
    ptx_u32* tile = reinterpret_cast<ptx_u32*>(rows_16);                                             \\
    for (int i = 0; i < 4; ++i) tile[4 * threadIdx.x + i] = rows[4 * threadIdx.x + i];              \\
    __syncwarp();                                                                                    \\
    ptx_u32 r[N];                                                                                    \\
    NAME(r, tile + 4 * order[threadIdx.x]);                                                          \\
    for (int i = 0; i < N; ++i) out[4 * threadIdx.x + i] = r[i];                                     \\
}
LDMATRIX(ldmatrix_x4, 4)
LDMATRIX(ldmatrix_x4_trans, 4)
LDMATRIX(ldmatrix_x2, 2)
LDMATRIX(ldmatrix_x2_trans, 2)

// Thread i copies chunk i of src (16 bytes) to `early` in group 0 and chunk i + n to `late` in
// group 1 (zeros where fill[i] is 0), then reads `early` after wait_group 1 and `late` after
// wait_group 0 (read_late_early: before it).
extern "C" __global__ void copy_groups(const unsigned* src, const int* fill, unsigned* out, int read_late_early) {
    __shared__ uint4 early_16[64], late_16[64];  // uint4: 16-byte aligned, as cp.async needs
    ptx_u32 *early = reinterpret_cast<ptx_u32*>(early_16), *late = reinterpret_cast<ptx_u32*>(late_16);
    const int i = threadIdx.x, n = blockDim.x;
    cp_async_16(early + 4 * i, src + 4 * i, fill[i]);
    cp_async_commit();
    cp_async_16(late + 4 * i, src + 4 * (i + n), fill[i]);
    cp_async_commit();
    cp_async_wait<1>();
    for (int w = 0; w < 4; ++w) out[4 * i + w] = early[4 * i + w];
    if (!read_late_early) cp_async_wait<0>();
    for (int w = 0; w < 4; ++w) out[4 * (i + n) + w] = late[4 * i + w];
    cp_async_wait<0>();
}

// Thread i reads the chunk thread i ^ 1 copied, after its own wait but with no barrier between.
extern "C" __global__ void copy_then_read_neighbour(const unsigned* src, unsigned* out) {
    __shared__ uint4 tile_16[64];
    ptx_u32* tile = reinterpret_cast<ptx_u32*>(tile_16);
    const int i = threadIdx.x;
    cp_async_16(tile + 4 * i, src + 4 * i, true);
    cp_async_commit();
    cp_async_wait<0>();
    out[i] = tile[4 * (i ^ 1)];
}

extern "C" __global__ void copy_never_waited(const unsigned* src) {
    __shared__ uint4 tile[1];
    cp_async_16(tile, src, true);
    cp_async_commit();
}
"""


@pytest.fixture(scope="module")
def ptx():
    return ptx_module(KERNELS)


def pack(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Two arrays of 16-bit values -> the 32-bit registers holding them (low half first)."""
    return low.view(np.uint16).astype(np.uint32) | high.view(np.uint16).astype(np.uint32) << 16


def a_registers(a: np.ndarray) -> np.ndarray:
    """[16, 16] -> [32 lanes, 4] by the ISA's table for A: a_i at row g (+8 for i in 2,3,6,7),
    column 2t + (i & 1) (+8 for i >= 4), two elements a register."""
    rows = [G, G + 8, G, G + 8]
    cols = [2 * T, 2 * T, 2 * T + 8, 2 * T + 8]
    return np.stack([pack(a[r, c], a[r, c + 1]) for r, c in zip(rows, cols)], axis=1)


def b_registers(b: np.ndarray) -> np.ndarray:
    """[16, 8] -> [32, 2] by the ISA's table for B: b_i at row 2t + (i & 1) (+8 for i >= 2), column g."""
    return np.stack([pack(b[2 * T + 8 * j, G], b[2 * T + 8 * j + 1, G]) for j in (0, 1)], axis=1)


def d_positions() -> tuple[np.ndarray, np.ndarray]:
    """[32, 4] rows and columns of C/D by the ISA's table: d_i at row g (+8 for i >= 2), column 2t + (i & 1)."""
    rows = np.stack([G, G, G + 8, G + 8], axis=1)
    cols = np.stack([2 * T, 2 * T + 1, 2 * T, 2 * T + 1], axis=1)
    return rows, cols


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["f16", "bf16"])
def test_mma_m16n8k16_follows_the_isa_layout(ptx, dtype):
    """D = A B + C with every lane holding the registers the ISA's tables name. The 16-bit
    products are exact in fp32 and 16 are summed onto C in fp32: |error| <= 17 u_fp32 sum |terms|
    (gamma_17). Distinct values everywhere, so a lane or element swapped anywhere breaks it."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((16, 16)).astype(dtype)
    b = rng.standard_normal((16, 8)).astype(dtype)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    rows, cols = d_positions()
    d = np.ascontiguousarray(c[rows, cols])
    with schedules():
        ptx.get_function(f"mma_{'f16' if dtype == np.float16 else 'bf16'}")(
            (1,), (32,), (a_registers(a), b_registers(b), d))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    expected = (a64 @ b64 + c)[rows, cols]
    terms = (np.abs(a64) @ np.abs(b64) + np.abs(c))[rows, cols]
    assert np.all(np.abs(d - expected) <= 17 * 2.0**-24 * terms)


@pytest.mark.parametrize("name,matrices,trans", [("ldmatrix_x4", 4, False), ("ldmatrix_x4_trans", 4, True),
                                                   ("ldmatrix_x2", 2, False), ("ldmatrix_x2_trans", 2, True)])
def test_ldmatrix_follows_the_isa_layout(ptx, name, matrices, trans):
    """Lane 8j + r points at row r of matrix j (rows in shuffled places); lane l must get
    elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of matrix j in register j, the
    transposed pair (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4) with .trans. Values 0..255 are
    distinct, so every element is checked by place."""
    values = np.arange(256, dtype=np.uint16).reshape(32, 8)
    order = np.random.default_rng(2).permutation(32).astype(np.int32)
    out = np.zeros((32, 4), np.uint32)
    with schedules():
        ptx.get_function(f"{name}_test")((1,), (32,), (values.view(np.uint32).reshape(32, 4).copy(), order, out))
    for j in range(matrices):
        matrix = values[order[8 * j:8 * j + 8]]  # row r is what lane 8j + r pointed at
        if trans:
            matrix = matrix.T
        expected = pack(matrix[G, 2 * T], matrix[G, 2 * T + 1])
        np.testing.assert_array_equal(out[:, j], expected, err_msg=f"matrix {j}")


def test_cp_async_lands_by_group(ptx):
    """wait_group 1 lands the first of two groups, wait_group 0 the second; a copy without
    fill writes zeros."""
    n = 64
    src = np.random.default_rng(3).integers(0, 2**31, (2 * n, 4)).astype(np.uint32)
    fill = (np.arange(n) % 5 != 0).astype(np.int32)
    out = np.zeros((2 * n, 4), np.uint32)
    with schedules():
        ptx.get_function("copy_groups")((1,), (n,), (src, fill, out, np.int32(0)))
    np.testing.assert_array_equal(out, src * np.concatenate([fill, fill])[:, None])


def test_cp_async_read_before_its_wait_is_not_the_data(ptx):
    """A group still pending when read gives NaN bytes (its copy lands at the wait), never the data."""
    n = 32
    src = np.arange(2 * n * 4, dtype=np.uint32).reshape(2 * n, 4)
    out = np.zeros((2 * n, 4), np.uint32)
    ptx.get_function("copy_groups")((1,), (n,), (src, np.ones(n, np.int32), out, np.int32(1)))
    np.testing.assert_array_equal(out[:n], src[:n])
    assert np.all(out[n:] == 0xFFFFFFFF)


def test_cp_async_read_by_another_thread_without_a_barrier_is_reported(ptx):
    """Thread 0 runs first (in-order schedule) and reads what thread 1 has not copied yet: the
    detectors stop it there (a later reader would be a race with the landing store instead)."""
    with pytest.raises(KernelError, match=r"kernel copy_then_read_neighbour, block \(0,0,0\): uninitialised shared memory "
                                          r"read: thread \(0,0,0\) reads 4 bytes"):
        ptx.get_function("copy_then_read_neighbour")((1,), (64,), (np.zeros((64, 4), np.uint32), np.zeros(64, np.uint32)))


def test_cp_async_never_waited_for_is_reported(ptx):
    with pytest.raises(KernelError, match=r"cp.async: thread 0 of block \(0,0,0\) ended with copies it never waited for"):
        ptx.get_function("copy_never_waited")((2,), (1,), (np.zeros(4, np.uint32),))
