// Packed QKV -> per-head q, k, v, one group of lanes per head vector (batch, token, q|k|v, head):
//   qkv [B, L, 3*H*Dh] (q | k | v, head-major)  + bias [3*H*Dh]
//   -> optional per-head RMSNorm of q and k (MMJiT q_norm/k_norm, applied before RoPE)
//   -> optional half-split RoPE, pairs (j, j + Dh/2), cos/sin tables [L_total, Dh/2] in fp32
//   -> q, k, v [B, H, L_total, Dh] written at token rows offset .. offset+L-1.
// The offset lets the text and image streams of a double block write straight into one joint
// [txt ; img] buffer, so the bias add, split_heads, both norms, RoPE and the concatenation are
// one pass instead of seven (T5 uses it with norm and RoPE off, as bias-free split_heads).
// A head vector's pairs (j, j + Dh/2) move in 16-byte packs when Dh/2 is a multiple of one and
// every pointer is 16-byte aligned, else value by value; a group has a power-of-2 number of
// lanes, enough for one pack pair each (at most 32: a lane then takes up to MAX_PAIRS_PER_LANE,
// #defined ahead of this text from KERNEL_CONSTANTS in accelerated/kernels.py), and sums its
// squares with group_sum. Warps walk the head vectors with a grid stride.
// NumPy twin: reference/mmjit.py project_qkv, reference/layers.py apply_rope
#include "common.cuh"

template <typename T, int N>
__device__ void qkv_packs(const T* __restrict__ qkv, const T* __restrict__ bias, const T* __restrict__ q_norm,
                          const T* __restrict__ k_norm, const float* __restrict__ cos, const float* __restrict__ sin,
                          T* __restrict__ q, T* __restrict__ k, T* __restrict__ v, int batch, int length, int heads,
                          int head_dim, int total_length, int offset, int apply_norm, int apply_rope, float eps) {
    const int half = head_dim / 2, packs = half / N, width = heads * head_dim;
    int lanes = 1;
    while (lanes < packs && lanes < 32) lanes <<= 1;
    const int lane = threadIdx.x & 31, member = lane & (lanes - 1), per_warp = 32 / lanes;
    const int vectors = batch * length * 3 * heads;  // kernels.qkv_heads keeps it below 2^31
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, warps = (gridDim.x * blockDim.x) >> 5;
    // Every lane of a warp makes the same trips (the group sums shuffle across the whole warp).
    for (int first = warp * per_warp; first < vectors; first += warps * per_warp) {
        const int vector = first + lane / lanes;
        const bool active = vector < vectors;
        const int h = vector % heads, part = vector / heads % 3, token = vector / heads / 3;  // part: q, k, v
        const int l = token % length, b = token / length;
        const T* src = qkv + (long long)token * 3 * width + part * width + h * head_dim;
        const T* add = bias + part * width + h * head_dim;
        float lo[MAX_PAIRS_PER_LANE][N], hi[MAX_PAIRS_PER_LANE][N];
        float sum_sq = 0.0f;
#pragma unroll
        for (int c = 0; c < MAX_PAIRS_PER_LANE; ++c) {
            const int j = (member + lanes * c) * N;
            if (!active || j >= half) continue;
            const Pack<T, N> a = load_pack<T, N>(src + j), a_bias = load_pack<T, N>(add + j);
            const Pack<T, N> b = load_pack<T, N>(src + half + j), b_bias = load_pack<T, N>(add + half + j);
#pragma unroll
            for (int e = 0; e < N; ++e) {
                lo[c][e] = to_float(a.v[e]) + to_float(a_bias.v[e]);
                hi[c][e] = to_float(b.v[e]) + to_float(b_bias.v[e]);
                sum_sq += lo[c][e] * lo[c][e] + hi[c][e] * hi[c][e];
            }
        }
        const bool norm = apply_norm && part < 2, rope = apply_rope && part < 2;
        const float inv_rms = 1.0f / sqrtf(group_sum(sum_sq, lanes) / head_dim + eps);
        const T* weight = part == 0 ? q_norm : k_norm;
        const int table_row = (offset + l) * half;
        const long long row = ((long long)b * heads + h) * total_length + offset + l;
        T* dst = (part == 0 ? q : part == 1 ? k : v) + row * head_dim;
#pragma unroll
        for (int c = 0; c < MAX_PAIRS_PER_LANE; ++c) {
            const int j = (member + lanes * c) * N;
            if (!active || j >= half) continue;
            if (norm) {
                const Pack<T, N> w_lo = load_pack<T, N>(weight + j), w_hi = load_pack<T, N>(weight + half + j);
#pragma unroll
                for (int e = 0; e < N; ++e) {
                    lo[c][e] *= inv_rms * to_float(w_lo.v[e]);
                    hi[c][e] *= inv_rms * to_float(w_hi.v[e]);
                }
            }
            if (rope) {
                const Pack<float, N> cs = load_pack<float, N>(cos + table_row + j);
                const Pack<float, N> sn = load_pack<float, N>(sin + table_row + j);
#pragma unroll
                for (int e = 0; e < N; ++e) {
                    const float rotated = lo[c][e] * cs.v[e] - hi[c][e] * sn.v[e];
                    hi[c][e] = hi[c][e] * cs.v[e] + lo[c][e] * sn.v[e];
                    lo[c][e] = rotated;
                }
            }
            Pack<T, N> out_lo, out_hi;
#pragma unroll
            for (int e = 0; e < N; ++e) {
                out_lo.v[e] = from_float<T>(lo[c][e]);
                out_hi.v[e] = from_float<T>(hi[c][e]);
            }
            store_pack<T, N>(dst + j, out_lo);
            store_pack<T, N>(dst + half + j, out_hi);
        }
    }
}

template <typename T>
__device__ void qkv_heads_impl(const T* qkv, const T* bias, const T* q_norm, const T* k_norm, const float* cos,
                               const float* sin, T* q, T* k, T* v, int batch, int length, int heads,
                               int head_dim, int total_length, int offset, int apply_norm, int apply_rope,
                               float eps) {
    constexpr int V = vector_width<T>();
    const bool aligned = aligned_16(qkv) && aligned_16(bias) && aligned_16(q_norm) && aligned_16(k_norm) &&
                         aligned_16(cos) && aligned_16(sin) && aligned_16(q) && aligned_16(k) && aligned_16(v);
    if (head_dim / 2 % V == 0 && aligned)
        qkv_packs<T, V>(qkv, bias, q_norm, k_norm, cos, sin, q, k, v, batch, length, heads, head_dim, total_length,
                        offset, apply_norm, apply_rope, eps);
    else
        qkv_packs<T, 1>(qkv, bias, q_norm, k_norm, cos, sin, q, k, v, batch, length, heads, head_dim, total_length,
                        offset, apply_norm, apply_rope, eps);
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
