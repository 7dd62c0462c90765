// Softmax attention in fp32 on CUDA cores (fp16 and bf16: attention_tc.cu, on tensor cores),
// with an online (flash-style) softmax: keys are visited in tiles of 32 and
// the [H, Lq, Lk] score matrix never exists in memory.
//   q [B, H, Lq, Dh], k/v [B, H, Lk, Dh] -> out [B, Lq, H*Dh] (heads merged on the store)
//   score = scale * q.k  (+ bias[h, i, j] if has_bias)  (+ (1 - key_mask[b, j]) * LOWEST_FLOAT)
// The bias is T5's relative-position table; the key-mask term is the additive mask T5 uses
// (the most negative float, as the reference does, so a fully padded row stays finite).
//
// Block: 4 warps x 8 query rows = 32 query rows of one (b, h). Each tile of 32 keys is staged in
// shared memory in fp32; lane j scores key j against the warp's 8 rows, the warp reduces the
// running max/sum, then every lane accumulates its own output dims (d = lane + 32c). Head dims
// up to 128, any value (52 for L/16): loads and stores are predicated on d < head_dim.
// NumPy twin: reference/layers.py attention
#include "common.cuh"

// WARPS, ROWS_PER_WARP, ROWS_PER_BLOCK, KEY_TILE, MAX_DIMS_PER_LANE and MIN_BLOCKS_PER_SM are
// #defined ahead of this text from KERNEL_CONSTANTS in accelerated/kernels.py, which the
// launching wrapper reads too. MIN_BLOCKS_PER_SM = 3 lets ptxas give a thread up to
// 65536 / (3 * 128) = 170 registers: the 8 x 4 accumulators, 8 scores and the running max/sum
// need ~160; aiming at 4 blocks (128 registers) spills on sm_90.

template <typename T>
__device__ void attention_impl(ATTENTION_PARAMS(T)) {
    extern __shared__ float smem[];
    float* q_tile = smem;                                   // [ROWS_PER_BLOCK][head_dim]
    float* k_tile = q_tile + ROWS_PER_BLOCK * head_dim;     // [KEY_TILE][head_dim + 1] (padded: no bank conflicts)
    float* v_tile = k_tile + KEY_TILE * (head_dim + 1);     // [KEY_TILE][head_dim]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
    const int row0 = blockIdx.x * ROWS_PER_BLOCK;
    const T* q_bh = q + (long long)bh * lq * head_dim;
    const T* k_bh = k + (long long)bh * lk * head_dim;
    const T* v_bh = v + (long long)bh * lk * head_dim;

    for (int i = threadIdx.x; i < ROWS_PER_BLOCK * head_dim; i += blockDim.x) {
        const int r = i / head_dim, d = i - r * head_dim;
        q_tile[i] = row0 + r < lq ? to_float(q_bh[(long long)(row0 + r) * head_dim + d]) : 0.0f;
    }

    float row_max[ROWS_PER_WARP], row_sum[ROWS_PER_WARP], acc[ROWS_PER_WARP][MAX_DIMS_PER_LANE];
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        row_max[r] = negative_infinity();
        row_sum[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < MAX_DIMS_PER_LANE; ++c) acc[r][c] = 0.0f;
    }

    for (int key0 = 0; key0 < lk; key0 += KEY_TILE) {
        __syncthreads();  // the previous tile is no longer read (and q_tile is complete)
        for (int i = threadIdx.x; i < KEY_TILE * head_dim; i += blockDim.x) {
            const int j = i / head_dim, d = i - j * head_dim;
            const bool valid = key0 + j < lk;
            const long long src = (long long)(key0 + j) * head_dim + d;
            k_tile[j * (head_dim + 1) + d] = valid ? to_float(k_bh[src]) : 0.0f;
            v_tile[i] = valid ? to_float(v_bh[src]) : 0.0f;
        }
        __syncthreads();

        const int key = key0 + lane;
        const bool key_valid = key < lk;
        float score[ROWS_PER_WARP];
#pragma unroll
        for (int r = 0; r < ROWS_PER_WARP; ++r) score[r] = 0.0f;
        const float* my_key = k_tile + lane * (head_dim + 1);
        const float* my_rows = q_tile + warp * ROWS_PER_WARP * head_dim;
        for (int d = 0; d < head_dim; ++d) {
            const float kd = my_key[d];
#pragma unroll
            for (int r = 0; r < ROWS_PER_WARP; ++r) score[r] += my_rows[r * head_dim + d] * kd;
        }
        const float mask_term = (has_mask && key_valid) ? (1.0f - key_mask[(long long)b * lk + key]) * LOWEST_FLOAT : 0.0f;

#pragma unroll
        for (int r = 0; r < ROWS_PER_WARP; ++r) {
            const int row = row0 + warp * ROWS_PER_WARP + r;
            float s = score[r] * scale;
            if (has_bias && key_valid && row < lq) s += bias[((long long)h * lq + row) * lk + key];
            s = key_valid ? s + mask_term : negative_infinity();
            // Every tile holds at least one valid key, so the tile max and new_max are finite.
            const float new_max = fmaxf(row_max[r], warp_max(s));
            const float correction = expf(row_max[r] - new_max);
            const float p = key_valid ? expf(s - new_max) : 0.0f;
            row_sum[r] = row_sum[r] * correction + warp_sum(p);
            row_max[r] = new_max;
#pragma unroll
            for (int c = 0; c < MAX_DIMS_PER_LANE; ++c) acc[r][c] *= correction;
            for (int j = 0; j < KEY_TILE; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
                const float* v_row = v_tile + j * head_dim;
#pragma unroll
                for (int c = 0; c < MAX_DIMS_PER_LANE; ++c) {
                    const int d = lane + 32 * c;
                    if (d < head_dim) acc[r][c] += pj * v_row[d];
                }
            }
        }
    }

    const int width = heads * head_dim;
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        const int row = row0 + warp * ROWS_PER_WARP + r;
        if (row >= lq) continue;
        T* dst = out + ((long long)b * lq + row) * width + h * head_dim;
        const float inv_sum = 1.0f / row_sum[r];
#pragma unroll
        for (int c = 0; c < MAX_DIMS_PER_LANE; ++c) {
            const int d = lane + 32 * c;
            if (d < head_dim) dst[d] = from_float<T>(acc[r][c] * inv_sum);
        }
    }
}

#define DEFINE_ATTENTION(T, SUFFIX)                                                                 \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS_PER_SM)                     \
        flash_attention_##SUFFIX(ATTENTION_PARAMS(T)) {                                              \
        attention_impl<T>(ATTENTION_ARGS);                                                           \
    }
DEFINE_ATTENTION(float, f32)  // fp16 and bf16 run on tensor cores: attention_tc.cu
