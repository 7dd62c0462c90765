// Softmax attention on tensor cores for fp16 and bf16, FlashAttention-2 style (Dao, arXiv
// 2307.08691), with the same arguments and results as attention.cu (which keeps fp32 on CUDA cores):
//   q [B, H, Lq, Dh], k/v [B, H, Lk, Dh] -> out [B, Lq, H*Dh]
//   score = scale * q.k  (+ bias[h, i, j] if has_bias)  (+ (1 - key_mask[b, j]) * LOWEST_FLOAT)
//
// Block: MMA_WARPS warps x 16 query rows = MMA_ROWS rows of one (b, h); DP = Dh zero-padded to 64
// (Dh <= 64: 52 -> 64) or 128. The block copies its Q rows and then tiles of MMA_KEY_TILE keys of K
// and V into shared memory with cp.async, double-buffered: tile j + 1 is in flight while tile j is
// used. Each warp loads its Q rows once into registers (ldmatrix: the A fragments of every
// 16-dim step), then per key tile
//   1. S = Q K^T [16 x MMA_KEY_TILE] with mma.sync m16n8k16 into fp32 registers (K's B fragments
//      by ldmatrix, rows of K as they are stored),
//   2. the online softmax in those registers, in log2 units (exp2): each thread holds two rows
//      (g and g + 8) and shares each with the 3 other threads of its quad; the running max is
//      reduced over the quad, the running sum stays per thread until the end,
//   3. P = exp2(S - max), rounded to the storage dtype (as FlashAttention does; the sum adds the
//      fp32 values), is packed straight into the A fragments of P V: the accumulator layout of
//      two m16n8 tiles is the A layout of one m16n8k16 step, so P never goes through shared memory,
//   4. O [16 x DP] += P V with V's B fragments by ldmatrix .trans.
// Shared rows (DP 16-bit values, 8 chunks of 16 bytes for DP 64) are swizzled: chunk c of row r is
// stored at chunk c ^ (r % 8), so the 8 rows one ldmatrix matrix reads, and the 8 chunks of a row
// that 8 threads copy, fall in 8 different 16-byte bank groups: no bank conflicts.
// NumPy twin: reference/layers.py attention
#include "common.cuh"
#include "ptx.cuh"

// MMA_WARPS, MMA_ROWS (query rows per block), MMA_KEY_TILE (keys per step) and
// MMA_MIN_BLOCKS_D64 / _D128 are #defined ahead of this text from KERNEL_CONSTANTS in
// accelerated/kernels.py, which sizes the launch and its shared memory from the same table.

constexpr float LOG2E = 1.4426950408889634f;

// Offset of element `col` of row `row` in a swizzled [rows][DP] tile.
template <int DP>
__device__ __forceinline__ int swizzled(int row, int col) {
    return row * DP + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
}

// cp.async rows first..first+count-1 of a row-major [length, head_dim] matrix into a swizzled
// [count][DP] tile, zeros past `length` and past head_dim. Rows of head_dim 16-bit values are
// 16-byte aligned when head_dim % 8 == 0 (16-byte copies), else 8-byte aligned (head_dim % 4 == 0).
template <typename T, int DP>
__device__ __forceinline__ void stage_tile(T* tile, const T* __restrict__ src, int first, int length, int head_dim, int count) {
    constexpr int CHUNKS = DP / 8;
    for (int i = threadIdx.x; i < count * CHUNKS; i += blockDim.x) {
        const int r = i / CHUNKS, col = (i % CHUNKS) * 8;
        const bool row_valid = first + r < length;
        const T* from = src + (long long)(row_valid ? first + r : 0) * head_dim;
        T* to = tile + swizzled<DP>(r, col);
        if (head_dim % 8 == 0) {
            const bool fill = row_valid && col < head_dim;
            cp_async_16(to, fill ? from + col : src, fill);
        } else {
            const bool fill_low = row_valid && col < head_dim, fill_high = row_valid && col + 4 < head_dim;
            cp_async_8(to, fill_low ? from + col : src, fill_low);
            cp_async_8(to + 4, fill_high ? from + col + 4 : src, fill_high);
        }
    }
}

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

template <typename T, int DP>
__device__ void attention_mma_impl(ATTENTION_PARAMS(T)) {
    constexpr int KEY_BLOCKS = MMA_KEY_TILE / 8;  // m16n8 tiles of S per warp
    extern __shared__ uint4 mma_smem[];  // uint4: 16-byte aligned, as cp.async and ldmatrix need
    T* q_tile = reinterpret_cast<T*>(mma_smem);      // [MMA_ROWS][DP]
    T* k_tiles = q_tile + MMA_ROWS * DP;               // [2][MMA_KEY_TILE][DP]
    T* v_tiles = k_tiles + 2 * MMA_KEY_TILE * DP;      // [2][MMA_KEY_TILE][DP]

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const int row0 = blockIdx.x * MMA_ROWS;
    const int rows[2] = {row0 + warp * 16 + g, row0 + warp * 16 + g + 8};  // the two query rows this thread holds
    const T* k_head = k + (long long)bh * lk * head_dim;
    const T* v_head = v + (long long)bh * lk * head_dim;
    const float scale_log2 = scale * LOG2E;
    const int tiles = (lk + MMA_KEY_TILE - 1) / MMA_KEY_TILE;

    stage_tile<T, DP>(q_tile, q + (long long)bh * lq * head_dim, row0, lq, head_dim, MMA_ROWS);
    stage_tile<T, DP>(k_tiles, k_head, 0, lk, head_dim, MMA_KEY_TILE);
    stage_tile<T, DP>(v_tiles, v_head, 0, lk, head_dim, MMA_KEY_TILE);
    cp_async_commit();

    ptx_u32 qf[DP / 16][4];  // A fragments of the warp's 16 rows, one per 16-dim step
    float o[DP / 8][4];      // O [16 x DP] as DP / 8 m16n8 accumulators
    for (int n = 0; n < DP / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float row_max[2] = {negative_infinity(), negative_infinity()}, row_sum[2] = {0.0f, 0.0f};

    for (int j = 0; j < tiles; ++j) {
        const T* k_tile = k_tiles + (j & 1) * MMA_KEY_TILE * DP;
        const T* v_tile = v_tiles + (j & 1) * MMA_KEY_TILE * DP;
        if (j + 1 < tiles) {  // the other buffer was released by the barrier that ended step j - 1
            const int next = (j + 1) & 1;
            stage_tile<T, DP>(k_tiles + next * MMA_KEY_TILE * DP, k_head, (j + 1) * MMA_KEY_TILE, lk, head_dim, MMA_KEY_TILE);
            stage_tile<T, DP>(v_tiles + next * MMA_KEY_TILE * DP, v_head, (j + 1) * MMA_KEY_TILE, lk, head_dim, MMA_KEY_TILE);
        }
        cp_async_commit();  // (empty on the last step: the wait below counts groups alike)
        cp_async_wait<1>();  // everything but tile j + 1 has landed ...
        __syncthreads();    // ... in every thread's copies
        if (j == 0) {
            // lanes 0-15 point at rows 0-15 of the warp at column 16 kk, lanes 16-31 at column 16 kk + 8:
            // the four 8x8 matrices are a[0..3] of the A layout
            for (int kk = 0; kk < DP / 16; ++kk)
                ldmatrix_x4(qf[kk], q_tile + swizzled<DP>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
        }

        // 1. S = Q K^T: for keys 8 n..8 n + 7, lane 8 m + r points at key r, dims 32 p + 8 m: the
        //    registers are the B fragments of dim steps 2 p (r[0], r[1]) and 2 p + 1 (r[2], r[3]).
        float s[KEY_BLOCKS][4];
        for (int n = 0; n < KEY_BLOCKS; ++n) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            for (int p = 0; p < DP / 32; ++p) {
                ptx_u32 kb[4];
                ldmatrix_x4(kb, k_tile + swizzled<DP>(n * 8 + (lane & 7), p * 32 + (lane >> 3) * 8));
                const ptx_u32 low[2] = {kb[0], kb[1]}, high[2] = {kb[2], kb[3]};
                mma_m16n8k16<T>(s[n], qf[2 * p], low);
                mma_m16n8k16<T>(s[n], qf[2 * p + 1], high);
            }
        }

        // 2. logits, the new running max of rows g (i = 0, 1) and g + 8 (i = 2, 3), over the quad
        //    (uniform branches: MM-JiT's whole tiles take the first, a multiply per score)
        if (!has_bias && !has_mask && (j + 1) * MMA_KEY_TILE <= lk) {
            for (int n = 0; n < KEY_BLOCKS; ++n)
                for (int i = 0; i < 4; ++i) s[n][i] *= scale_log2;
        } else {
            for (int n = 0; n < KEY_BLOCKS; ++n)
                for (int i = 0; i < 4; ++i) {
                    const int key = j * MMA_KEY_TILE + n * 8 + 2 * t + (i & 1);
                    s[n][i] = attention_logit2(s[n][i], scale_log2, bias, key_mask, b, h, rows[i >> 1], key, lq, lk,
                                               has_bias, has_mask);
                }
        }
        float tile_max[2] = {negative_infinity(), negative_infinity()};
        for (int n = 0; n < KEY_BLOCKS; ++n)
            for (int i = 0; i < 4; ++i) tile_max[i >> 1] = fmaxf(tile_max[i >> 1], s[n][i]);
        float correction[2];
        for (int r = 0; r < 2; ++r) {
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
            const float new_max = fmaxf(row_max[r], tile_max[r]);  // finite: every tile has a valid key
            correction[r] = exp2f(row_max[r] - new_max);          // 0 on the first tile (-inf - finite)
            row_max[r] = new_max;
            row_sum[r] *= correction[r];
        }
        for (int n = 0; n < DP / 8; ++n) {
            o[n][0] *= correction[0], o[n][1] *= correction[0];
            o[n][2] *= correction[1], o[n][3] *= correction[1];
        }

        // 3-4. P for keys 16 kk..16 kk + 15 is S's tiles 2 kk and 2 kk + 1, i.e. the A fragment
        //      {(g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8)}; V's B fragments for dims
        //      16 e..16 e + 15: lanes 0-15 point at keys 0-15 at dim 16 e, lanes 16-31 at 16 e + 8, transposed.
        for (int kk = 0; kk < MMA_KEY_TILE / 16; ++kk) {
            float p[2][4];
            for (int half = 0; half < 2; ++half)
                for (int i = 0; i < 4; ++i) {
                    p[half][i] = exp2f(s[2 * kk + half][i] - row_max[i >> 1]);
                    row_sum[i >> 1] += p[half][i];
                }
            const ptx_u32 pf[4] = {pack2<T>(p[0][0], p[0][1]), pack2<T>(p[0][2], p[0][3]),
                                   pack2<T>(p[1][0], p[1][1]), pack2<T>(p[1][2], p[1][3])};
            for (int e = 0; e < DP / 16; ++e) {
                ptx_u32 vb[4];
                ldmatrix_x4_trans(vb, v_tile + swizzled<DP>(kk * 16 + (lane & 15), e * 16 + (lane >> 4) * 8));
                const ptx_u32 low[2] = {vb[0], vb[1]}, high[2] = {vb[2], vb[3]};
                mma_m16n8k16<T>(o[2 * e], pf, low);
                mma_m16n8k16<T>(o[2 * e + 1], pf, high);
            }
        }
        __syncthreads();  // tile j's buffers are read by every warp before step j + 1 refills them
    }

    // The row sums over the quad, then O / sum, stored as pairs (dims 8 n + 2t, + 1; head_dim is
    // a multiple of 4, so a pair is inside it or past it).
    for (int r = 0; r < 2; ++r) {
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
        if (rows[r] >= lq) continue;
        const float inv_sum = 1.0f / row_sum[r];
        T* dst = out + ((long long)b * lq + rows[r]) * heads * head_dim + h * head_dim;
        for (int n = 0; n < DP / 8; ++n) {
            const int col = n * 8 + 2 * t;
            if (col >= head_dim) break;
            dst[col] = from_float<T>(o[n][2 * r] * inv_sum);
            dst[col + 1] = from_float<T>(o[n][2 * r + 1] * inv_sum);
        }
    }
}

#define DEFINE_TC_ATTENTION(T, SUFFIX)                                                                      \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32, MMA_MIN_BLOCKS_D64)                        \
        flash_attention_tc_##SUFFIX(ATTENTION_PARAMS(T)) {                                                   \
        attention_mma_impl<T, 64>(ATTENTION_ARGS);                                                           \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32, MMA_MIN_BLOCKS_D128)                       \
        flash_attention_tc_d128_##SUFFIX(ATTENTION_PARAMS(T)) {                                              \
        attention_mma_impl<T, 128>(ATTENTION_ARGS);                                                          \
    }
DEFINE_TC_ATTENTION(__half, f16)
DEFINE_TC_ATTENTION(__nv_bfloat16, bf16)
