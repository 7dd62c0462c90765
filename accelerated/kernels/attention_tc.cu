// Softmax attention on tensor cores for fp16 and bf16, FlashAttention-2 style (Dao, arXiv
// 2307.08691), with the same arguments and results as attention.cu (which keeps fp32 on CUDA cores):
//   q [B, H, Lq, Dh], k/v [B, H, Lk, Dh] -> out [B, Lq, H*Dh]
//   score = scale * q.k  (+ bias[h, i, j] if has_bias)  (+ (1 - key_mask[b, j]) * LOWEST_FLOAT)
//
// Block: MMA_WARPS warps, each holding ATOMS m16 atoms of 16 query rows (ROWS = MMA_WARPS x 16 x
// ATOMS rows of one (b, h)); DP = Dh zero-padded to 64 (Dh <= 64: 52 -> 64) or 128. The block
// copies its Q rows and then tiles of TILE_KEYS keys of K and V (64 at DP 64, 32 at DP 128) into
// shared memory with cp.async, double-buffered: tile j + 1 is in flight while tile j is used. Per
// key tile each warp reads its Q rows' A fragments from shared memory (ldmatrix, one per 16-dim
// step; kept in registers instead, they would leave a 64-key S too few, and ptxas would spill), then
//   1. S = Q K^T [16 ATOMS x TILE_KEYS] with mma.sync m16n8k16 into fp32 registers (K's B
//      fragments by ldmatrix, rows of K as they are stored; each fragment feeds the warp's ATOMS
//      atoms, so shared-memory reads per MMA fall with ATOMS),
//   2. the online softmax in those registers, in log2 units (exp2): each thread holds two rows
//      of each atom (g and g + 8) and shares each with the 3 other threads of its quad; the
//      running max is reduced over the quad, the running sum stays per thread until the end. The
//      max is taken on the raw scores and the scale applied inside the exponent's FMA,
//      exp2(s * scale log2(e) - max), as FlashAttention does (valid for scale > 0; other tiles take
//      the per-key path, whose logits are final),
//   3. P = exp2(S - max), rounded to the storage dtype (as FlashAttention does; the sum adds the
//      fp32 values), is packed straight into the A fragments of P V: the accumulator layout of
//      two m16n8 tiles is the A layout of one m16n8k16 step, so P never goes through shared memory,
//   4. O [16 ATOMS x DP] += P V with V's B fragments by ldmatrix .trans, again one per ATOMS MMAs.
// Shared rows (DP 16-bit values, 8 chunks of 16 bytes for DP 64) are swizzled: chunk c of row r is
// stored at chunk c ^ (r % 8), so the 8 rows one ldmatrix matrix reads, and the 8 chunks of a row
// that 8 threads copy, fall in 8 different 16-byte bank groups: no bank conflicts.
// The copies are specialised at compile time (TileCopy): the thread count and whether rows are
// 16-byte aligned (Dh % 8 == 0: one 16-byte copy a chunk, else two of 8) are template
// constants, and each thread's rows lie a multiple of 8 apart, so its shared offset is computed
// once and its global one advances by a constant stride.
// NumPy twin: reference/layers.py attention
#include "common.cuh"
#include "ptx.cuh"

// MMA_WARPS, MMA_ATOMS_D64 / _D128 (m16 atoms per warp), MMA_KEY_TILE_D64 / _D128 (keys per step)
// and MMA_MIN_BLOCKS_D64 / _D128 are #defined ahead of this text from KERNEL_CONSTANTS in
// accelerated/kernels.py, which sizes the launch and its shared memory from the same table.

constexpr float LOG2E = 1.4426950408889634f;
constexpr int MMA_THREADS = MMA_WARPS * 32;

// Offset of element `col` of row `row` in a swizzled [rows][DP] tile.
template <int DP>
__device__ __forceinline__ int swizzled(int row, int col) {
    return row * DP + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
}

// A thread's share of copying rows of a row-major [length, head_dim] matrix into a swizzled
// [rows][DP] tile with cp.async: chunk `col` (8 values) of rows `row`, row + PASS, ... (PASS =
// threads / chunks a row, a multiple of 8, so all of them share one swizzled column). Zeros past
// `length` and past head_dim. ROW16: head_dim % 8 == 0, rows 16-byte aligned (one 16-byte copy a
// chunk); else 8-byte aligned (head_dim % 4 == 0: two 8-byte copies).
template <typename T, int DP, bool ROW16>
struct TileCopy {
    static constexpr int CHUNKS = DP / 8, PASS = MMA_THREADS / CHUNKS;
    static_assert(PASS % 8 == 0, "a thread's rows must share their swizzle");
    int row, col, to, pass_stride;
    bool fill_low, fill_high;  // whether the chunk's first / last 4 values lie inside head_dim

    __device__ __forceinline__ explicit TileCopy(int head_dim)
        : row(threadIdx.x / CHUNKS), col(threadIdx.x % CHUNKS * 8), to(swizzled<DP>(threadIdx.x / CHUNKS, threadIdx.x % CHUNKS * 8)),
          pass_stride(PASS * head_dim), fill_low(col < head_dim), fill_high(col + 4 < head_dim) {}

    // ROWS rows into `tile`; `from` points at this thread's first element (its row's `col`), of
    // which `rows_left` rows (from its first) lie inside the matrix.
    template <int ROWS>
    __device__ __forceinline__ void copy(T* tile, const T* from, int rows_left) const {
        static_assert(ROWS % PASS == 0, "every thread copies the same number of chunks");
#pragma unroll
        for (int pass = 0; pass < ROWS / PASS; ++pass) {
            const bool inside = pass * PASS < rows_left;  // a copy of src-size 0 reads nothing, wherever it points
            const T* src = from + pass * pass_stride;
            T* dst = tile + to + pass * PASS * DP;
            if (ROW16) {
                cp_async_16(dst, src, inside && fill_low);
            } else {
                cp_async_8(dst, src, inside && fill_low);
                cp_async_8(dst + 4, src + 4, inside && fill_high);
            }
        }
    }
};

// One logit in log2 units: (scale * q.k + bias) * log2(e), plus the key mask's LOWEST_FLOAT (a
// masked key stays at the bottom of the float range, as in the reference: a row whose keys are all
// masked is uniform there and here); -inf for a key past lk (tile padding), which gets probability 0.
// A query row past lq (padding) reads no bias.
__device__ __forceinline__ float attention_logit2(float dot, float scale_log2, const float* __restrict__ bias,
                                                  const float* __restrict__ key_mask, int b, int h, int row, int key,
                                                  int lq, int lk, int has_bias, int has_mask) {
    if (key >= lk) return negative_infinity();
    float s = dot * scale_log2;
    if (has_bias && row < lq) s += bias[((long long)h * lq + row) * lk + key] * LOG2E;
    if (has_mask) s += (1.0f - key_mask[(long long)b * lk + key]) * LOWEST_FLOAT;
    return s;
}

// Two floats as the storage dtype, packed into one register (the lower-numbered one low).
template <typename T>
__device__ __forceinline__ ptx_u32 pack2(float low, float high) {
    const T l = from_float<T>(low), h = from_float<T>(high);
    return (ptx_u32)reinterpret_cast<const unsigned short&>(l) | (ptx_u32)reinterpret_cast<const unsigned short&>(h) << 16;
}

template <typename T, int DP, bool ROW16>
__device__ void attention_mma_impl(ATTENTION_PARAMS(T)) {
    constexpr int ATOMS = DP == 64 ? MMA_ATOMS_D64 : MMA_ATOMS_D128;
    constexpr int ROWS = MMA_WARPS * 16 * ATOMS;
    constexpr int TILE_KEYS = DP == 64 ? MMA_KEY_TILE_D64 : MMA_KEY_TILE_D128;
    constexpr int KEY_BLOCKS = TILE_KEYS / 8;  // m16n8 tiles of S per atom
    extern __shared__ uint4 mma_smem[];  // uint4: 16-byte aligned, as cp.async and ldmatrix need
    T* q_tile = reinterpret_cast<T*>(mma_smem);  // [ROWS][DP]
    T* k_tiles = q_tile + ROWS * DP;            // [2][TILE_KEYS][DP]
    T* v_tiles = k_tiles + 2 * TILE_KEYS * DP;  // [2][TILE_KEYS][DP]

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const int row0 = blockIdx.x * ROWS, warp_row = warp * 16 * ATOMS;  // the block's, the warp's first row
    const float scale_log2 = scale * LOG2E;
    const bool plain_logits = !has_bias && !has_mask && scale > 0.0f;  // the max of raw scores is the max of logits
    const int tiles = (lk + TILE_KEYS - 1) / TILE_KEYS;

    const TileCopy<T, DP, ROW16> copy(head_dim);
    const T* k_rows = k + ((long long)bh * lk + copy.row) * head_dim + copy.col;
    const T* v_rows = v + ((long long)bh * lk + copy.row) * head_dim + copy.col;
    const int tile_stride = TILE_KEYS * head_dim;
    copy.template copy<ROWS>(q_tile, q + ((long long)bh * lq + row0 + copy.row) * head_dim + copy.col, lq - row0 - copy.row);
    copy.template copy<TILE_KEYS>(k_tiles, k_rows, lk - copy.row);
    copy.template copy<TILE_KEYS>(v_tiles, v_rows, lk - copy.row);
    cp_async_commit();

    float o[ATOMS][DP / 8][4];      // O [16 x DP] of each atom as DP / 8 m16n8 accumulators
    float row_max[ATOMS][2], row_sum[ATOMS][2];  // rows g and g + 8 of each atom; the max in log2 units
    for (int a = 0; a < ATOMS; ++a) {
        for (int n = 0; n < DP / 8; ++n) o[a][n][0] = o[a][n][1] = o[a][n][2] = o[a][n][3] = 0.0f;
        row_max[a][0] = row_max[a][1] = negative_infinity();
        row_sum[a][0] = row_sum[a][1] = 0.0f;
    }

    for (int j = 0; j < tiles; ++j) {
        const T* k_tile = k_tiles + (j & 1) * TILE_KEYS * DP;
        const T* v_tile = v_tiles + (j & 1) * TILE_KEYS * DP;
        if (j + 1 < tiles) {  // the other buffer was released by the barrier that ended step j - 1
            const int next = (j + 1) & 1, rows_left = lk - (j + 1) * TILE_KEYS - copy.row;
            copy.template copy<TILE_KEYS>(k_tiles + next * TILE_KEYS * DP, k_rows + (j + 1) * tile_stride, rows_left);
            copy.template copy<TILE_KEYS>(v_tiles + next * TILE_KEYS * DP, v_rows + (j + 1) * tile_stride, rows_left);
        }
        cp_async_commit();  // (empty on the last step: the wait below counts groups alike)
        cp_async_wait<1>();  // everything but tile j + 1 has landed ...
        __syncthreads();    // ... in every thread's copies
        // Q's A fragments of each atom's 16 rows, one per 16-dim step: lanes 0-15 point at rows 0-15
        // of the atom at column 16 kk, lanes 16-31 at column 16 kk + 8 (matrices a[0..3] of the A layout)
        ptx_u32 qf[ATOMS][DP / 16][4];
        for (int a = 0; a < ATOMS; ++a)
            for (int kk = 0; kk < DP / 16; ++kk)
                ldmatrix_x4(qf[a][kk], q_tile + swizzled<DP>(warp_row + a * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));

        // 1. S = Q K^T: for keys 8 n..8 n + 7, lane 8 m + r points at key r, dims 32 p + 8 m: the
        //    registers are the B fragments of dim steps 2 p (r[0], r[1]) and 2 p + 1 (r[2], r[3]).
        float s[ATOMS][KEY_BLOCKS][4];
        for (int a = 0; a < ATOMS; ++a)
            for (int n = 0; n < KEY_BLOCKS; ++n) s[a][n][0] = s[a][n][1] = s[a][n][2] = s[a][n][3] = 0.0f;
        for (int n = 0; n < KEY_BLOCKS; ++n)
            for (int p = 0; p < DP / 32; ++p) {
                ptx_u32 kb[4];
                ldmatrix_x4(kb, k_tile + swizzled<DP>(n * 8 + (lane & 7), p * 32 + (lane >> 3) * 8));
                const ptx_u32 low[2] = {kb[0], kb[1]}, high[2] = {kb[2], kb[3]};
                for (int a = 0; a < ATOMS; ++a) {
                    mma_m16n8k16<T>(s[a][n], qf[a][2 * p], low);
                    mma_m16n8k16<T>(s[a][n], qf[a][2 * p + 1], high);
                }
            }

        // 2. Whole tiles without bias or mask (MM-JiT's) keep the raw scores: exp2's FMA scales
        //    them. Other tiles get their logits in log2 units key by key, and an exponent scale of 1.
        float exp_scale = scale_log2;
        if (!plain_logits || (j + 1) * TILE_KEYS > lk) {
            exp_scale = 1.0f;
#pragma unroll  // s stays in registers (a loop indexing it would put it in local memory)
            for (int a = 0; a < ATOMS; ++a)
#pragma unroll
                for (int n = 0; n < KEY_BLOCKS; ++n)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int key = j * TILE_KEYS + n * 8 + 2 * t + (i & 1);
                        const int row = row0 + warp_row + a * 16 + g + (i >> 1) * 8;
                        s[a][n][i] = attention_logit2(s[a][n][i], scale_log2, bias, key_mask, b, h, row, key, lq, lk,
                                                      has_bias, has_mask);
                    }
        }
        //    The new running max of rows g (i = 0, 1) and g + 8 (i = 2, 3), over the quad.
        for (int a = 0; a < ATOMS; ++a) {
            float tile_max[2] = {negative_infinity(), negative_infinity()};
            for (int n = 0; n < KEY_BLOCKS; ++n)
                for (int i = 0; i < 4; ++i) tile_max[i >> 1] = fmaxf(tile_max[i >> 1], s[a][n][i]);
            float correction[2];
            for (int r = 0; r < 2; ++r) {
                tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
                tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
                const float new_max = fmaxf(row_max[a][r], tile_max[r] * exp_scale);  // finite: every tile has a valid key
                correction[r] = exp2f(row_max[a][r] - new_max);                    // 0 on the first tile (-inf - finite)
                row_max[a][r] = new_max;
                row_sum[a][r] *= correction[r];
            }
            for (int n = 0; n < DP / 8; ++n) {
                o[a][n][0] *= correction[0], o[a][n][1] *= correction[0];
                o[a][n][2] *= correction[1], o[a][n][3] *= correction[1];
            }
        }

        // 3-4. P for keys 16 kk..16 kk + 15 is S's tiles 2 kk and 2 kk + 1, i.e. the A fragment
        //      {(g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8)}; V's B fragments for dims
        //      16 e..16 e + 15: lanes 0-15 point at keys 0-15 at dim 16 e, lanes 16-31 at 16 e + 8, transposed.
        for (int kk = 0; kk < TILE_KEYS / 16; ++kk) {
            ptx_u32 pf[ATOMS][4];
            for (int a = 0; a < ATOMS; ++a) {
                float p[2][4];
                for (int half = 0; half < 2; ++half)
                    for (int i = 0; i < 4; ++i) {
                        p[half][i] = exp2f(fmaf(s[a][2 * kk + half][i], exp_scale, -row_max[a][i >> 1]));
                        row_sum[a][i >> 1] += p[half][i];
                    }
                pf[a][0] = pack2<T>(p[0][0], p[0][1]), pf[a][1] = pack2<T>(p[0][2], p[0][3]);
                pf[a][2] = pack2<T>(p[1][0], p[1][1]), pf[a][3] = pack2<T>(p[1][2], p[1][3]);
            }
            for (int e = 0; e < DP / 16; ++e) {
                ptx_u32 vb[4];
                ldmatrix_x4_trans(vb, v_tile + swizzled<DP>(kk * 16 + (lane & 15), e * 16 + (lane >> 4) * 8));
                const ptx_u32 low[2] = {vb[0], vb[1]}, high[2] = {vb[2], vb[3]};
                for (int a = 0; a < ATOMS; ++a) {
                    mma_m16n8k16<T>(o[a][2 * e], pf[a], low);
                    mma_m16n8k16<T>(o[a][2 * e + 1], pf[a], high);
                }
            }
        }
        __syncthreads();  // tile j's buffers are read by every warp before step j + 1 refills them
    }

    // The row sums over the quad, then O / sum, stored as packed pairs (dims 8 n + 2t, + 1: one
    // 32-bit store; head_dim is a multiple of 4, so a pair is inside it or past it).
    for (int a = 0; a < ATOMS; ++a)
        for (int r = 0; r < 2; ++r) {
            row_sum[a][r] += __shfl_xor_sync(0xffffffffu, row_sum[a][r], 1);
            row_sum[a][r] += __shfl_xor_sync(0xffffffffu, row_sum[a][r], 2);
            const int row = row0 + warp_row + a * 16 + g + r * 8;
            if (row >= lq) continue;
            const float inv_sum = 1.0f / row_sum[a][r];
            T* dst = out + ((long long)b * lq + row) * heads * head_dim + h * head_dim;
            for (int n = 0; n < DP / 8; ++n) {
                const int col = n * 8 + 2 * t;
                if (col >= head_dim) break;
                *reinterpret_cast<ptx_u32*>(dst + col) = pack2<T>(o[a][n][2 * r] * inv_sum, o[a][n][2 * r + 1] * inv_sum);
            }
        }
}

// One entry point per padded head dim; the row alignment picks the copy (a uniform branch).
#define DEFINE_TC_ATTENTION(T, SUFFIX)                                                                      \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32, MMA_MIN_BLOCKS_D64)                         \
        flash_attention_tc_##SUFFIX(ATTENTION_PARAMS(T)) {                                                   \
        if (head_dim % 8 == 0) attention_mma_impl<T, 64, true>(ATTENTION_ARGS);                              \
        else attention_mma_impl<T, 64, false>(ATTENTION_ARGS);                                               \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32, MMA_MIN_BLOCKS_D128)                        \
        flash_attention_tc_d128_##SUFFIX(ATTENTION_PARAMS(T)) {                                              \
        if (head_dim % 8 == 0) attention_mma_impl<T, 128, true>(ATTENTION_ARGS);                             \
        else attention_mma_impl<T, 128, false>(ATTENTION_ARGS);                                              \
    }
DEFINE_TC_ATTENTION(__half, f16)
DEFINE_TC_ATTENTION(__nv_bfloat16, bf16)
