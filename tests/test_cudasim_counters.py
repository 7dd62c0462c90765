"""cudasim's counters (cudasim.counting, runtime.cpp "Counters") on kernels whose counts are known
by hand: every expected number below is worked out in the test's docstring from the bank rule
(32 banks of 4 bytes; 4-byte accesses served a warp at a time, 8-byte ones half a warp, 16-byte
ones a quarter warp; a phase's wavefronts are the most distinct words one bank delivers) and the
sector rule (a request touches the 32-byte sectors its lanes' bytes fall in)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from script_modules import load_benchmark

from minit2i.accelerated.kernels import KERNEL_DIR, MMA_KEY_TILES, MMA_WARPS, PTX_HEADER, kernel_source, mma_rows
from minit2i.cudasim import KernelError, LaunchCounts, Module, counting, detectors, device_array, schedules
from minit2i.reference import layers as ref

kernel_counts = load_benchmark("kernel_counts")

KERNELS = """
// One warp reads word (lane * stride) % 1024 of a shared tile, after writing the tile in 32 rows
// of 32 consecutive words; the read value goes to out[lane].
extern "C" __global__ void shared_words(float* out, int stride) {
    __shared__ float tile[1024];
    for (int i = threadIdx.x; i < 1024; i += 32) tile[i] = (float)i;
    __syncthreads();
    out[threadIdx.x] = tile[(threadIdx.x * stride) % 1024];
}

// 8- and 16-byte shared reads: lane l reads vector (l * stride) of the tile. GCC vector types, as
// one access each: g++ splits a float4 struct's copy into its fields, or loads only those used.
typedef float wide_t __attribute__((vector_size(16)));
typedef float half_t __attribute__((vector_size(8)));
extern "C" __global__ void shared_vectors(float* out, int stride) {
    __shared__ wide_t tile[256];
    for (int i = threadIdx.x; i < 256; i += 32) tile[i] = wide_t{(float)i, (float)i, (float)i, (float)i};
    __syncthreads();
    const wide_t wide = tile[(threadIdx.x * stride) % 256];
    const half_t half = reinterpret_cast<const half_t*>(tile)[(threadIdx.x * stride) % 512];
    out[threadIdx.x] = wide[0] + wide[1] + wide[2] + wide[3] + half[0] + half[1];
}

// Thread i reads in[i * stride] and writes it to out[i].
extern "C" __global__ void global_words(const float* in, float* out, int stride) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = in[i * stride];
}
"""

PTX_KERNELS = """
// Each lane points ldmatrix at row (lane * stride) % 64 of a [64][8] 16-bit tile (16 bytes a row),
// after cp.async copied the tile in (lane l: rows l and l + 32); exp2 of each register.
extern "C" __global__ void ldmatrix_rows(const unsigned* rows, float* out, int stride) {
    __shared__ uint4 tile[64];
    cp_async_16(tile + threadIdx.x, rows + 4 * threadIdx.x, true);
    cp_async_16(tile + threadIdx.x + 32, rows + 4 * (threadIdx.x + 32), true);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    ptx_u32 r[4];
    ldmatrix_x4(r, tile + (threadIdx.x * stride) % 64);
    for (int i = 0; i < 4; ++i) out[4 * threadIdx.x + i] = exp2f((float)(r[i] & 7u));
}
"""


@pytest.fixture(scope="module")
def plain():
    return Module(textwrap.dedent(KERNELS), name="counters.cu")


@pytest.fixture(scope="module")
def ptx():
    return Module((KERNEL_DIR / PTX_HEADER).read_text() + PTX_KERNELS, name="counters_ptx.cu")


def counted(kernel, grid, block, args) -> dict[str, int]:
    with counting() as launches:
        kernel(grid, block, args)
    (launch,) = launches
    assert launch.kernel == kernel.name and launch.block == block + (1,) * (3 - len(block))
    return launch.counts


@pytest.mark.parametrize("stride, wavefronts", [(1, 1), (2, 2), (8, 8), (32, 32), (0, 1)])
def test_shared_loads_count_one_wavefront_per_distinct_word_in_the_busiest_bank(plain, stride, wavefronts):
    """Word w is in bank w % 32. Stride 1: 32 banks, 1 word each (conflict-free). Stride 2:
    words 0, 2, .., 62, banks 0, 2, .., 30 twice each (2-way). Stride 8: banks 0, 8, 16, 24,
    8 words each (8-way). Stride 32: bank 0, 32 words. Stride 0: one word for every lane, a
    broadcast (1 wavefront). The fill: 32 store requests of 32 consecutive words, 1 wavefront
    each; the output: 1 global store of 32 x 4 bytes = 4 sectors."""
    out = device_array(np.zeros(32, np.float32))
    counts = counted(plain.get_function("shared_words"), (1,), (32,), (out, np.int32(stride)))
    assert out.tolist() == [float(lane * stride % 1024) for lane in range(32)]
    assert counts["smsp__inst_executed_op_shared_ld.sum"] == 1
    assert counts["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"] == wavefronts
    assert counts["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"] == wavefronts - 1
    assert counts["smsp__inst_executed_op_shared_st.sum"] == counts[
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"] == 32
    assert counts["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] == 0
    assert counts["l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"] == 1
    assert counts["l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"] == 4
    assert counts["sass__inst_executed_per_opcode.BAR"] == 1


@pytest.mark.parametrize("stride, wavefronts", [(1, 4 + 2), (2, 8 + 4)])
def test_wide_shared_loads_are_served_in_phases(plain, stride, wavefronts):
    """16-byte loads in 4 phases of 8 lanes, 8-byte loads in 2 phases of 16 (ideal: 4 + 2).
    Stride 1: a phase of 16-byte loads covers 8 x 16 = 128 consecutive bytes, every bank once;
    one of 8-byte loads 16 x 8 = 128 bytes: 4 + 2 wavefronts, no conflict. Stride 2: lane l's
    16-byte vector starts at word 8 l, so lanes l and l + 4 of a phase share bank 8 l % 32 with
    different words (2 wavefronts a phase); the 8-byte loads at words 4 l the same (lanes l and l
    + 8): 8 + 4 wavefronts, 6 of them excess. The fill: 8 requests of 16-byte stores, 4 each."""
    out = device_array(np.zeros(32, np.float32))
    counts = counted(plain.get_function("shared_vectors"), (1,), (32,), (out, np.int32(stride)))
    assert counts["smsp__inst_executed_op_shared_ld.sum"] == 2
    assert counts["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"] == wavefronts
    assert counts["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"] == wavefronts - 6
    assert counts["smsp__inst_executed_op_shared_st.sum"] == 8
    assert counts["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"] == 32


@pytest.mark.parametrize("stride, sectors", [(1, 4), (2, 8), (8, 32), (0, 1)])
def test_global_loads_count_the_sectors_their_lanes_touch(plain, stride, sectors):
    """32 lanes x 4 bytes. Stride 1: 128 consecutive bytes, 4 sectors (coalesced); stride 2:
    256 bytes, 8 sectors, half of each used; stride 8: a sector a lane (32); stride 0: every lane
    the same word, 1 sector. Always 1 request and 128 bytes requested."""
    values, out = device_array(np.arange(32 * 8, dtype=np.float32)), device_array(np.zeros(32, np.float32))
    counts = counted(plain.get_function("global_words"), (1,), (32,), (values, out, np.int32(stride)))
    assert out.tolist() == values[np.arange(32) * stride].tolist()
    assert counts["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"] == 1
    assert counts["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] == sectors
    assert counts["cudasim__bytes_requested_global_op_ld.sum"] == 128


def test_requests_are_per_warp_and_per_launch(plain):
    """Two blocks of 64 threads: 4 warps, each 1 load request of 4 sectors; a second launch starts
    from zero."""
    values, out = device_array(np.arange(128, dtype=np.float32)), device_array(np.zeros(128, np.float32))
    kernel = plain.get_function("global_words")
    with counting() as launches:
        kernel((2,), (64,), (values, out, np.int32(1)))
        kernel((2,), (64,), (values, out, np.int32(1)))
    assert [launch.counts["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"] for launch in launches] == [4, 4]
    assert launches[0].per_request("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
                                   "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum") == 4


@pytest.mark.parametrize("stride, wavefronts", [(1, 4), (8, 32), (2, 8)])
def test_ldmatrix_and_cp_async_count_their_phases(ptx, stride, wavefronts):
    """ldmatrix .x4: a phase per matrix, its 8 rows of 16 bytes (ideal 4 wavefronts). Stride 1:
    the 8 rows of a matrix are 128 consecutive bytes (4). Stride 8: rows 128 bytes apart, all in
    banks 0-3 (8-way: 32). Stride 2: rows 32 bytes apart, 2 per bank group (2-way: 8). cp.async:
    2 requests of 32 x 16 bytes, 4 conflict-free wavefronts each, reading 16 sectors each, all
    used. exp2: 4 calls a lane, 4 MUFU.EX2 for the warp; 1 barrier."""
    rows, out = device_array(np.arange(64 * 4, dtype=np.uint32)), device_array(np.zeros(128, np.float32))
    counts = counted(ptx.get_function("ldmatrix_rows"), (1,), (32,), (rows, out, np.int32(stride)))
    assert counts["smsp__inst_executed_op_ldsm.sum"] == 1
    assert counts["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum"] == wavefronts
    assert counts["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum"] == wavefronts - 4
    assert counts["smsp__inst_executed_op_ldgsts.sum"] == 2
    assert counts["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum"] == 8
    assert counts["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts.sum"] == 0
    assert counts["l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum"] == 32
    assert counts["cudasim__bytes_requested_global_op_ldgsts.sum"] == 32 * 32
    assert counts["sass__inst_executed_per_opcode.MUFU.EX2"] == 4
    assert counts["sass__inst_executed_per_opcode.BAR"] == 1
    # the emulation's own loads and stores are not requests of the kernel
    assert counts["smsp__inst_executed_op_shared_st.sum"] == counts["smsp__inst_executed_op_shared_ld.sum"] == 0
    assert counts["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"] == 0


def test_counts_are_the_same_under_every_schedule(plain):
    """Requests are grouped by instruction and trip, not by the order the lanes ran in: the four
    schedules give one set of counts (the launch raises otherwise)."""
    out = np.zeros(32, np.float32)
    with schedules():
        counts = counted(plain.get_function("shared_words"), (1,), (32,), (out, np.int32(8)))
    assert counts["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"] == 8


def test_counting_needs_the_detectors():
    with detectors(False), pytest.raises(KernelError, match="counting needs the detectors' build"):
        with counting():
            pass


# ---------------------------------------------------------------------------------------------
# The tensor-core attention at B/16's per-tile behaviour: head dim 64 (16-byte rows), whole
# 128-row blocks and 64-key tiles, no bias or mask; [1, 2, 128, 64] is 2 blocks of 2 key tiles.

SWIZZLE = "return row * DP + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));"
SIXTEEN_BYTE_COPY = "cp_async_16(dst, src, inside && fill_low);"
B16_TILE_SHAPE = kernel_counts.B16_TILE_SHAPE


def attention_counts(text: str) -> LaunchCounts:
    """Counts of one launch of `text`'s flash_attention_tc_bf16 at B16_TILE_SHAPE
    (benchmarks/kernel_counts.py), checked against float64 softmax attention first (bf16 output:
    within 2 units of its roundoff of max |v|, far above the kernel's error at 128 keys and far
    below any layout slip)."""
    launch, arrays = kernel_counts.attention_counts(text)
    q, k, v, out = (arrays[name].astype(np.float64) for name in ("q", "k", "v", "out"))
    expected = ref.merge_heads(ref.attention(q, k, v, B16_TILE_SHAPE[3]**-0.5))
    assert np.max(np.abs(out - expected)) <= 2 * 2.0**-8 * np.max(np.abs(v))
    return launch


@pytest.fixture(scope="module")
def shipped_counts() -> LaunchCounts:
    return attention_counts(kernel_source("attention_tc.cu"))


def assert_no_excess_shared_wavefronts(counts: dict[str, int]):
    """No bank conflicts in any shared-memory request: ldmatrix, cp.async's writes, plain ld/st."""
    excess = {name: n for name, n in counts.items() if "bank_conflicts" in name and n}
    assert not excess, excess


def assert_full_16_byte_global_requests(counts: dict[str, int]):
    """Every global read is a cp.async of 16 bytes a lane from all 32 lanes (512 bytes a request),
    and every sector it touches is used whole (sectors x 32 = bytes)."""
    requests = counts["smsp__inst_executed_op_ldgsts.sum"]
    sectors = counts["l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum"]
    assert counts["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"] == 0, "plain global loads"
    assert counts["cudasim__bytes_requested_global_op_ldgsts.sum"] == 512 * requests == 32 * sectors > 0


def test_tensor_core_attention_has_no_excess_shared_wavefronts(shipped_counts):
    assert_no_excess_shared_wavefronts(shipped_counts.counts)


def test_tensor_core_attention_reads_global_memory_in_full_16_byte_requests(shipped_counts):
    assert_full_16_byte_global_requests(shipped_counts.counts)


def test_tensor_core_attention_counts_per_warp_and_tile(shipped_counts):
    """Per warp: Q's copies (128 rows x 8 chunks / 128 threads = 8 a thread) once, then per 64-key
    tile the design's 128 HMMA, 40 LDSM (Q's 2 atoms x 4 fragments, re-read every tile, K's 16
    and V's 16), 8 LDGSTS, 68 MUFU.EX2 (per atom 32 probabilities and 2 corrections) and 2
    barriers, as in the SASS trip (tests/test_kernels_compile.py). Output: per warp 2 atoms x 2
    row halves x 8 column pairs of 32-bit stores (8 rows x 16 bytes: 8 sectors, half of each
    written)."""
    batch, heads, length, head_dim = B16_TILE_SHAPE
    warps, tiles = batch * heads * length // mma_rows(head_dim) * MMA_WARPS, length // MMA_KEY_TILES[64]
    counts = shipped_counts.counts
    assert counts["sass__inst_executed_per_opcode.HMMA"] == warps * 128 * tiles
    assert counts["smsp__inst_executed_op_ldsm.sum"] == warps * 40 * tiles
    assert counts["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum"] == 4 * warps * 40 * tiles
    assert counts["smsp__inst_executed_op_ldgsts.sum"] == warps * (8 + 8 * tiles)
    assert counts["sass__inst_executed_per_opcode.MUFU.EX2"] == warps * 68 * tiles
    assert counts["sass__inst_executed_per_opcode.BAR"] == warps * 2 * tiles
    assert counts["l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"] == warps * 32
    assert counts["l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"] == warps * 32 * 8


def test_planted_unswizzled_tiles_fail_the_bank_conflict_check():
    """The swizzle taken out: the 8 rows an ldmatrix matrix reads lie 128 bytes apart, all in banks
    0-3 (8-way). The results stay right (parity passes); the conflict check does not."""
    text = kernel_source("attention_tc.cu")
    assert SWIZZLE in text
    counts = attention_counts(text.replace(SWIZZLE, "return row * DP + col;")).counts
    assert counts["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum"] == 7 * counts[
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum"] // 8
    with pytest.raises(AssertionError, match="ldsm"):
        assert_no_excess_shared_wavefronts(counts)


def test_planted_two_byte_copies_fail_the_16_byte_request_check():
    """K, V and Q staged by plain 2-byte loads and stores in place of the 16-byte cp.async: right
    results, and the 16-byte request check fails."""
    text = kernel_source("attention_tc.cu")
    assert SIXTEEN_BYTE_COPY in text
    two_byte_copy = "for (int e = 0; e < 8; ++e) dst[e] = inside && fill_low ? src[e] : from_float<T>(0.0f);"
    counts = attention_counts(text.replace(SIXTEEN_BYTE_COPY, two_byte_copy)).counts
    assert counts["cudasim__bytes_requested_global_op_ld.sum"] == 2 * 32 * counts[
        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"] > 0
    with pytest.raises(AssertionError, match="plain global loads"):
        assert_full_16_byte_global_requests(counts)


def test_the_ratios_a_gpu_run_compares_are_those_of_a_conflict_free_coalesced_kernel(shipped_counts):
    """What scripts/gpu-check sets beside ncu's: 4 wavefronts an ldmatrix .x4 (a matrix each), none
    in excess, and 16 sectors a cp.async request (32 lanes x 16 bytes = 512 bytes)."""
    assert kernel_counts.per_request(shipped_counts.counts) == {
        "ldmatrix wavefronts per request": 4.0, "ldmatrix excess wavefronts per request": 0.0,
        "cp.async global sectors per request": 16.0}
