// Packed QKV -> per-head q, k, v, one warp per (batch, token, head):
//   qkv [B, L, 3*H*Dh] (q | k | v, head-major)  + bias [3*H*Dh]
//   -> optional per-head RMSNorm of q and k (MMJiT q_norm/k_norm, applied before RoPE)
//   -> optional half-split RoPE, pairs (j, j + Dh/2), cos/sin tables [L_total, Dh/2] in fp32
//   -> q, k, v [B, H, L_total, Dh] written at token rows offset .. offset+L-1.
// The offset lets the text and image streams of a double block write straight into one joint
// [txt ; img] buffer, so the bias add, split_heads, both norms, RoPE and the concatenation are
// one pass instead of seven (T5 uses it with norm and RoPE off, as bias-free split_heads).
// NumPy twin: reference/mmjit.py project_qkv, reference/layers.py apply_rope
#include "common.cuh"

// MAX_PAIRS_PER_LANE (head_dim <= 64 * it) is #defined ahead of this text from KERNEL_CONSTANTS
// in accelerated/kernels.py.

template <typename T>
__device__ void head_to_rows(const T* __restrict__ src, const T* __restrict__ bias, const T* __restrict__ norm,
                             const float* __restrict__ cos_row, const float* __restrict__ sin_row,
                             T* __restrict__ dst, int head_dim, int apply_norm, int apply_rope, float eps) {
    const int lane = threadIdx.x & 31, half = head_dim / 2;
    float lo[MAX_PAIRS_PER_LANE], hi[MAX_PAIRS_PER_LANE];
    float sum_sq = 0.0f;
#pragma unroll
    for (int p = 0; p < MAX_PAIRS_PER_LANE; ++p) {
        const int j = lane + 32 * p;
        lo[p] = hi[p] = 0.0f;
        if (j < half) {
            lo[p] = to_float(src[j]) + to_float(bias[j]);
            hi[p] = to_float(src[j + half]) + to_float(bias[j + half]);
            sum_sq += lo[p] * lo[p] + hi[p] * hi[p];
        }
    }
    const float inv_rms = apply_norm ? 1.0f / sqrtf(warp_sum(sum_sq) / head_dim + eps) : 1.0f;
#pragma unroll
    for (int p = 0; p < MAX_PAIRS_PER_LANE; ++p) {
        const int j = lane + 32 * p;
        if (j >= half) continue;
        float a = lo[p], b = hi[p];
        if (apply_norm) {
            a *= inv_rms * to_float(norm[j]);
            b *= inv_rms * to_float(norm[j + half]);
        }
        if (apply_rope) {
            const float c = cos_row[j], s = sin_row[j];
            const float rotated_a = a * c - b * s;
            b = b * c + a * s;
            a = rotated_a;
        }
        dst[j] = from_float<T>(a);
        dst[j + half] = from_float<T>(b);
    }
}

template <typename T>
__device__ void qkv_heads_impl(const T* qkv, const T* bias, const T* q_norm, const T* k_norm, const float* cos,
                               const float* sin, T* q, T* k, T* v, int batch, int length, int heads,
                               int head_dim, int total_length, int offset, int apply_norm, int apply_rope,
                               float eps) {
    const long long item = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;  // one warp each
    if (item >= (long long)batch * length * heads) return;  // whole warps exit together
    const int h = item % heads;
    const long long token = item / heads;  // b * length + l
    const int l = token % length, b = token / length;
    const int width = heads * head_dim;
    const T* src = qkv + token * 3 * width + h * head_dim;
    const long long dst = (((long long)b * heads + h) * total_length + offset + l) * head_dim;
    const int table_row = (offset + l) * (head_dim / 2);
    const float* c = cos + (apply_rope ? table_row : 0);
    const float* s = sin + (apply_rope ? table_row : 0);
    head_to_rows(src, bias + h * head_dim, q_norm, c, s, q + dst, head_dim, apply_norm, apply_rope, eps);
    head_to_rows(src + width, bias + width + h * head_dim, k_norm, c, s, k + dst, head_dim, apply_norm,
                 apply_rope, eps);
    head_to_rows(src + 2 * width, bias + 2 * width + h * head_dim, q_norm, c, s, v + dst, head_dim, 0, 0, eps);
}

#define DEFINE_QKV_HEADS(T, SUFFIX)                                                                 \
    extern "C" __global__ void qkv_heads_##SUFFIX(                                                  \
        const T* qkv, const T* bias, const T* q_norm, const T* k_norm, const float* cos,            \
        const float* sin, T* q, T* k, T* v, int batch, int length, int heads, int head_dim,         \
        int total_length, int offset, int apply_norm, int apply_rope, float eps) {                  \
        qkv_heads_impl<T>(qkv, bias, q_norm, k_norm, cos, sin, q, k, v, batch, length, heads,       \
                          head_dim, total_length, offset, apply_norm, apply_rope, eps);             \
    }
FOR_EACH_DTYPE(DEFINE_QKV_HEADS)
