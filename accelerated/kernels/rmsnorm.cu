// RMSNorm, one block per row, any width (strided loop, so tails are predicated), fp32 sums.
//   rms_norm:      out = x / sqrt(mean(x^2) + eps) * weight
//   add_rms_norm:  residual += delta + bias; out = rms_norm(residual)   (one read of delta,
//                  one read+write of residual, one write of out: the residual add that
//                  follows every attention projection and the norm that precedes the MLP)
// NumPy twin: reference/layers.py rms_norm
#include "common.cuh"

// `x` is not __restrict__: add_rms_norm passes the residual it has just written, which must not
// be read through the non-coherent read-only cache.
template <typename T>
__device__ void rms_norm_row(const T* x, const T* __restrict__ weight, T* __restrict__ out,
                             int width, float eps) {
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = to_float(x[i]);
        sum_sq += v * v;
    }
    const float inv_rms = 1.0f / sqrtf(block_sum(sum_sq) / width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        out[i] = from_float<T>(to_float(x[i]) * inv_rms * to_float(weight[i]));
}

template <typename T>
__device__ void rms_norm_impl(const T* x, const T* weight, T* out, int width, float eps) {
    const long long row = blockIdx.x;
    rms_norm_row(x + row * width, weight, out + row * width, width, eps);
}

template <typename T>
__device__ void add_rms_norm_impl(T* residual, const T* delta, const T* bias, const T* weight, T* out,
                                  int width, float eps) {
    const long long offset = (long long)blockIdx.x * width;
    T* r = residual + offset;
    const T* d = delta + offset;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        r[i] = from_float<T>(to_float(r[i]) + (to_float(d[i]) + to_float(bias[i])));
    // Each thread re-reads only the elements it wrote itself, so no barrier is needed here.
    rms_norm_row(r, weight, out + offset, width, eps);
}

#define DEFINE_RMS_NORM(T, SUFFIX)                                                                  \
    extern "C" __global__ void rms_norm_##SUFFIX(const T* x, const T* weight, T* out, int width,   \
                                                 float eps) {                                       \
        rms_norm_impl<T>(x, weight, out, width, eps);                                               \
    }                                                                                               \
    extern "C" __global__ void add_rms_norm_##SUFFIX(T* residual, const T* delta, const T* bias,    \
                                                     const T* weight, T* out, int width, float eps) { \
        add_rms_norm_impl<T>(residual, delta, bias, weight, out, width, eps);                       \
    }
FOR_EACH_DTYPE(DEFINE_RMS_NORM)
