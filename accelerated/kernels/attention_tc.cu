// Softmax attention on tensor cores for fp16 and bf16 (WMMA, 16x16x16 tiles, fp32 accumulation),
// with the same arguments and results as attention.cu (which keeps fp32 on CUDA cores):
//   q [B, H, Lq, Dh], k/v [B, H, Lk, Dh] -> out [B, Lq, H*Dh]
//   score = scale * q.k  (+ bias[h, i, j] if has_bias)  (+ (1 - key_mask[b, j]) * LOWEST_FLOAT)
//
// Block: 4 warps x 16 query rows = 64 rows of one (b, h). The block stages its Q rows once and
// each tile of 32 keys (K and V) in shared memory, in the storage dtype, zero-padded to
// Dp = Dh rounded up to 16 (52 -> 64). Per key tile each warp
//   1. computes its 16 x 32 scores S = Q K^T on tensor cores and stores them (fp32) to shared memory,
//   2. runs the online softmax in fp32 (two lanes per row, 16 keys each): new running max, the
//      correction exp(old max - new max) applied to the warp's output rows, P = exp(S - max)
//      rounded to the storage dtype (as FlashAttention does; the row sum adds the fp32 values),
//   3. adds P V to its output rows O [16, Dp], which live in shared memory in fp32: a fragment's
//      element-to-lane layout is unspecified, so the per-row correction cannot be applied to an
//      accumulator fragment; O is scaled in shared memory and reloaded as the MMA's C instead.
// Finally each row is divided by its sum and stored. All WMMA pointers are 32-byte aligned and
// every row stride a multiple of 16 bytes; 16-bit rows are padded by 16 bytes (SKEW) so the
// rows of a fragment load start in different banks.
// NumPy twin: reference/layers.py attention
#include "common.cuh"
#include <mma.h>

using namespace nvcuda;

// TC_WARPS, TC_ROWS (query rows per block), TC_KEY_TILE (keys per step), WMMA_TILE (the m = n = k
// of every fragment), SKEW, SCORE_LD, PROB_LD (padded shared row strides) and
// TC_MIN_BLOCKS_PER_SM are #defined ahead of this text from KERNEL_CONSTANTS in
// accelerated/kernels.py, which sizes the launch and its shared memory from the same table.

// One attention logit in the reference's order (attention.cu's, per element): scale * q.k,
// plus T5's position bias bias[h, row, key], plus the additive key mask (1 - mask) * LOWEST_FLOAT;
// -inf for a key past lk (tile padding), which gets probability 0. A query row past lq
// (padding) reads no bias.
__device__ __forceinline__ float attention_logit(float dot, float scale, const float* __restrict__ bias,
                                                 const float* __restrict__ key_mask, int b, int h, int row, int key,
                                                 int lq, int lk, int has_bias, int has_mask) {
    if (key >= lk) return negative_infinity();
    float s = dot * scale;
    if (has_bias && row < lq) s += bias[((long long)h * lq + row) * lk + key];
    if (has_mask) s += (1.0f - key_mask[(long long)b * lk + key]) * LOWEST_FLOAT;
    return s;
}

typedef wmma::fragment<wmma::accumulator, WMMA_TILE, WMMA_TILE, WMMA_TILE, float> Accumulator;

// Rows first..first+count-1 of a row-major [length, head_dim] matrix into tile [count][ld],
// zero where the row is past `length` or the column past head_dim (up to the padded dp).
template <typename T>
__device__ __forceinline__ void stage_rows(T* tile, const T* __restrict__ src, int first, int length, int head_dim, int dp, int ld,
                           int count) {
    const T zero = from_float<T>(0.0f);
    for (int i = threadIdx.x; i < count * dp; i += blockDim.x) {
        const int r = i / dp, d = i - r * dp;
        tile[r * ld + d] = first + r < length && d < head_dim ? src[(long long)(first + r) * head_dim + d] : zero;
    }
}

// s [16][SCORE_LD] (fp32) = the warp's 16 query rows [16][ld] times the key tile [TC_KEY_TILE][ld]^T.
template <typename T>
__device__ __forceinline__ void score_tile(float* s, const T* q_rows, const T* k_tile, int dp, int ld) {
    for (int n = 0; n < TC_KEY_TILE; n += WMMA_TILE) {
        Accumulator acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int d = 0; d < dp; d += WMMA_TILE) {
            wmma::fragment<wmma::matrix_a, WMMA_TILE, WMMA_TILE, WMMA_TILE, T, wmma::row_major> q_frag;
            wmma::fragment<wmma::matrix_b, WMMA_TILE, WMMA_TILE, WMMA_TILE, T, wmma::col_major> k_frag;  // K^T
            wmma::load_matrix_sync(q_frag, q_rows + d, ld);
            wmma::load_matrix_sync(k_frag, k_tile + n * ld + d, ld);
            wmma::mma_sync(acc, q_frag, k_frag, acc);
        }
        wmma::store_matrix_sync(s + n, acc, SCORE_LD, wmma::mem_row_major);
    }
}

// o [16][dp] (fp32) += p [16][PROB_LD] (storage dtype) times the value tile [TC_KEY_TILE][ld].
template <typename T>
__device__ __forceinline__ void accumulate_pv(float* o, const T* p, const T* v_tile, int dp, int ld) {
    for (int d = 0; d < dp; d += WMMA_TILE) {
        Accumulator acc;
        wmma::load_matrix_sync(acc, o + d, dp, wmma::mem_row_major);
        for (int j = 0; j < TC_KEY_TILE; j += WMMA_TILE) {
            wmma::fragment<wmma::matrix_a, WMMA_TILE, WMMA_TILE, WMMA_TILE, T, wmma::row_major> p_frag;
            wmma::fragment<wmma::matrix_b, WMMA_TILE, WMMA_TILE, WMMA_TILE, T, wmma::row_major> v_frag;
            wmma::load_matrix_sync(p_frag, p + j, PROB_LD);
            wmma::load_matrix_sync(v_frag, v_tile + j * ld + d, ld);
            wmma::mma_sync(acc, p_frag, v_frag, acc);
        }
        wmma::store_matrix_sync(o + d, acc, dp, wmma::mem_row_major);
    }
}

template <typename T>
__device__ void attention_tc_impl(ATTENTION_PARAMS(T)) {
    // The kernel has no static __shared__ variables, so this is the start of the block's shared
    // window (aligned far beyond WMMA's 32 bytes); every region below is a multiple of 32 bytes.
    extern __shared__ float tc_smem[];
    const int dp = (head_dim + WMMA_TILE - 1) / WMMA_TILE * WMMA_TILE, ld = dp + SKEW;
    float* o_all = tc_smem;                                         // [TC_ROWS][dp] output accumulators
    float* s_all = o_all + TC_ROWS * dp;                            // [TC_WARPS][16][SCORE_LD] scores
    T* q_tile = reinterpret_cast<T*>(s_all + TC_WARPS * WMMA_TILE * SCORE_LD);  // [TC_ROWS][ld]
    T* k_tile = q_tile + TC_ROWS * ld;                              // [TC_KEY_TILE][ld]
    T* v_tile = k_tile + TC_KEY_TILE * ld;                          // [TC_KEY_TILE][ld]
    T* p_all = v_tile + TC_KEY_TILE * ld;                           // [TC_WARPS][16][PROB_LD] probabilities

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const int row0 = blockIdx.x * TC_ROWS;
    float* o = o_all + warp * WMMA_TILE * dp;
    float* s = s_all + warp * WMMA_TILE * SCORE_LD;
    T* p = p_all + warp * WMMA_TILE * PROB_LD;
    // Softmax work split: lane pair (2r, 2r+1) owns row r of the warp's 16, 16 keys each.
    const int my_row = lane >> 1, my_half = lane & 1;
    const int row = row0 + warp * WMMA_TILE + my_row;

    stage_rows(q_tile, q + (long long)bh * lq * head_dim, row0, lq, head_dim, dp, ld, TC_ROWS);
    for (int i = threadIdx.x; i < TC_ROWS * dp; i += blockDim.x) o_all[i] = 0.0f;
    float row_max = negative_infinity(), row_sum = 0.0f;

    for (int key0 = 0; key0 < lk; key0 += TC_KEY_TILE) {
        __syncthreads();  // the previous K/V tile is no longer read (and Q, O are complete)
        stage_rows(k_tile, k + (long long)bh * lk * head_dim, key0, lk, head_dim, dp, ld, TC_KEY_TILE);
        stage_rows(v_tile, v + (long long)bh * lk * head_dim, key0, lk, head_dim, dp, ld, TC_KEY_TILE);
        __syncthreads();

        score_tile(s, q_tile + warp * WMMA_TILE * ld, k_tile, dp, ld);
        __syncwarp();  // the scores other lanes stored are visible

        float* s_row = s + my_row * SCORE_LD + my_half * (TC_KEY_TILE / 2);
        T* p_row = p + my_row * PROB_LD + my_half * (TC_KEY_TILE / 2);
        const int first_key = key0 + my_half * (TC_KEY_TILE / 2);
        float tile_max = negative_infinity();
        for (int j = 0; j < TC_KEY_TILE / 2; ++j) {
            s_row[j] = attention_logit(s_row[j], scale, bias, key_mask, b, h, row, first_key + j, lq, lk, has_bias, has_mask);
            tile_max = fmaxf(tile_max, s_row[j]);
        }
        // Every tile holds at least one valid key, so the tile max and new_max are finite.
        const float new_max = fmaxf(row_max, fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1)));
        const float correction = expf(row_max - new_max);
        float sum = 0.0f;
        for (int j = 0; j < TC_KEY_TILE / 2; ++j) {
            const float pj = first_key + j < lk ? expf(s_row[j] - new_max) : 0.0f;
            sum += pj;
            p_row[j] = from_float<T>(pj);
        }
        row_sum = row_sum * correction + sum + __shfl_xor_sync(0xffffffffu, sum, 1);
        row_max = new_max;
        // Rescale the output rows: lane j takes columns j, j + 32, ... of every row (consecutive
        // lanes, consecutive banks), with the row's correction from the lane pair that owns it.
        for (int r = 0; r < WMMA_TILE; ++r) {
            const float row_correction = __shfl_sync(0xffffffffu, correction, 2 * r);
            for (int d = lane; d < dp; d += 32) o[r * dp + d] *= row_correction;
        }
        __syncwarp();  // P and the corrected O rows are visible to the MMA's loads

        accumulate_pv(o, p, v_tile, dp, ld);
    }
    __syncwarp();  // the last P V store is visible

    // Normalise and store row by row, lane j writing columns j, j + 32, ... (coalesced).
    for (int r = 0; r < WMMA_TILE; ++r) {
        const float inv_sum = 1.0f / __shfl_sync(0xffffffffu, row_sum, 2 * r);
        const int out_row = row0 + warp * WMMA_TILE + r;
        if (out_row >= lq) break;  // the same for every lane: rows past lq are padding
        T* dst = out + ((long long)b * lq + out_row) * heads * head_dim + h * head_dim;
        for (int d = lane; d < head_dim; d += 32) dst[d] = from_float<T>(o[r * dp + d] * inv_sum);
    }
}

#define DEFINE_TC_ATTENTION(T, SUFFIX)                                                               \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32, TC_MIN_BLOCKS_PER_SM)                \
        flash_attention_tc_##SUFFIX(ATTENTION_PARAMS(T)) {                                            \
        attention_tc_impl<T>(ATTENTION_ARGS);                                                         \
    }
DEFINE_TC_ATTENTION(__half, f16)
DEFINE_TC_ATTENTION(__nv_bfloat16, bf16)
