// RMSNorm, one warp per row (blockDim.x / 32 rows a block), any width, fp32 sums.
//   rms_norm:      out = x / sqrt(mean(x^2) + eps) * weight
//   add_rms_norm:  residual += delta + bias; out = rms_norm(residual)   (one read of delta,
//                  one read+write of residual, one write of out: the residual add that
//                  follows every attention projection and the norm that precedes the MLP)
// A row moves in 16-byte packs when its width is a multiple of one and every pointer is
// 16-byte aligned, else value by value. A lane keeps up to NORM_PACKS_PER_LANE packs in
// registers (#defined ahead of this text from KERNEL_CONSTANTS in accelerated/kernels.py), so a
// row of up to 32 x that many packs is read once, its loads all issued before the first is used;
// a wider row is read again for the output.
// NumPy twin: reference/layers.py rms_norm
#include "common.cuh"

// The row as the norm reads it: `row` itself (rms_norm), or residual + (delta + bias), stored
// back into the residual as it is read (add_rms_norm).
template <typename T, int N>
struct ReadRow {
    const T* row;
    __device__ Pack<T, N> operator()(int pack) const { return load_pack<T, N>(row + pack * N); }
};

template <typename T, int N>
struct AddIntoResidual {
    T* residual;
    const T* delta;
    const T* bias;
    __device__ Pack<T, N> operator()(int pack) const {
        Pack<T, N> r = load_pack<T, N>(residual + pack * N);
        const Pack<T, N> d = load_pack<T, N>(delta + pack * N), b = load_pack<T, N>(bias + pack * N);
#pragma unroll
        for (int e = 0; e < N; ++e) r.v[e] = from_float<T>(to_float(r.v[e]) + (to_float(d.v[e]) + to_float(b.v[e])));
        store_pack<T, N>(residual + pack * N, r);
        return r;
    }
};

// `row` is not __restrict__: add_rms_norm re-reads (for a row too wide to keep) the residual it
// has just written, which must not come through the non-coherent read-only cache. Each lane
// re-reads only the packs it wrote itself, so no barrier is needed.
template <typename T, int N, typename Source>
__device__ void norm_row(const Source& source, const T* row, const T* __restrict__ weight, T* __restrict__ out,
                         int width, float eps) {
    const int lane = threadIdx.x & 31, packs = width / N;
    Pack<T, N> held[NORM_PACKS_PER_LANE];
    float sum_sq = 0.0f;
    for (int base = 0; base < packs; base += 32 * NORM_PACKS_PER_LANE) {
#pragma unroll
        for (int j = 0; j < NORM_PACKS_PER_LANE; ++j)
            if (base + lane + 32 * j < packs) held[j] = source(base + lane + 32 * j);
#pragma unroll
        for (int j = 0; j < NORM_PACKS_PER_LANE; ++j)
            if (base + lane + 32 * j < packs)
#pragma unroll
                for (int e = 0; e < N; ++e) sum_sq += to_float(held[j].v[e]) * to_float(held[j].v[e]);
    }
    const float inv_rms = 1.0f / sqrtf(warp_sum(sum_sq) / width + eps);
    const bool row_held = packs <= 32 * NORM_PACKS_PER_LANE;
    for (int base = 0; base < packs; base += 32 * NORM_PACKS_PER_LANE) {
#pragma unroll
        for (int j = 0; j < NORM_PACKS_PER_LANE; ++j) {
            const int pack = base + lane + 32 * j;
            if (pack >= packs) continue;
            const Pack<T, N> x = row_held ? held[j] : load_pack<T, N>(row + pack * N);
            const Pack<T, N> w = load_pack<T, N>(weight + pack * N);
            Pack<T, N> y;
#pragma unroll
            for (int e = 0; e < N; ++e) y.v[e] = from_float<T>(to_float(x.v[e]) * inv_rms * to_float(w.v[e]));
            store_pack<T, N>(out + pack * N, y);
        }
    }
}

// This warp's row (warps past the last row return: no other warp waits for them).
__device__ __forceinline__ long long warp_row() {
    return (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
}

template <typename T>
__device__ void rms_norm_impl(const T* x, const T* weight, T* out, int width, float eps, int rows) {
    const long long row = warp_row();
    if (row >= rows) return;
    const T* r = x + row * width;
    constexpr int V = vector_width<T>();
    if (width % V == 0 && aligned_16(x) && aligned_16(weight) && aligned_16(out))
        norm_row<T, V>(ReadRow<T, V>{r}, r, weight, out + row * width, width, eps);
    else
        norm_row<T, 1>(ReadRow<T, 1>{r}, r, weight, out + row * width, width, eps);
}

template <typename T>
__device__ void add_rms_norm_impl(T* residual, const T* delta, const T* bias, const T* weight, T* out,
                                  int width, float eps, int rows) {
    const long long row = warp_row();
    if (row >= rows) return;
    T* r = residual + row * width;
    const T* d = delta + row * width;
    constexpr int V = vector_width<T>();
    if (width % V == 0 && aligned_16(residual) && aligned_16(delta) && aligned_16(bias) && aligned_16(weight) &&
        aligned_16(out))
        norm_row<T, V>(AddIntoResidual<T, V>{r, d, bias}, r, weight, out + row * width, width, eps);
    else
        norm_row<T, 1>(AddIntoResidual<T, 1>{r, d, bias}, r, weight, out + row * width, width, eps);
}

#define DEFINE_RMS_NORM(T, SUFFIX)                                                                  \
    extern "C" __global__ void rms_norm_##SUFFIX(const T* x, const T* weight, T* out, int width,   \
                                                 float eps, int rows) {                             \
        rms_norm_impl<T>(x, weight, out, width, eps, rows);                                         \
    }                                                                                               \
    extern "C" __global__ void add_rms_norm_##SUFFIX(T* residual, const T* delta, const T* bias,    \
                                                     const T* weight, T* out, int width, float eps, \
                                                     int rows) {                                    \
        add_rms_norm_impl<T>(residual, delta, bias, weight, out, width, eps, rows);                 \
    }
FOR_EACH_DTYPE(DEFINE_RMS_NORM)
