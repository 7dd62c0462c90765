// Shared device helpers: dtype conversion (all math in fp32) and warp/block reductions.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// One extern "C" entry point per storage dtype: M(type, suffix) -> kernel_name_<suffix>.
// Plain C names keep the Python side free of mangled template names and make `nvcc -ptx`
// emit every instantiation without extra explicit-instantiation lines.
#define FOR_EACH_DTYPE(M) M(float, f32) M(__half, f16) M(__nv_bfloat16, bf16)

// The entry-point arguments of both attention kernels (attention.cu on CUDA cores, attention_tc.cu
// on tensor cores), which kernels.attention launches alike:
//   q [B, H, Lq, Dh], k/v [B, H, Lk, Dh] -> out [B, Lq, H*Dh]; bias [H, Lq, Lk]; key_mask [B, Lk]
#define ATTENTION_PARAMS(T)                                                                    \
    const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,                 \
        const float *__restrict__ bias, const float *__restrict__ key_mask, T *__restrict__ out, \
        int heads, int lq, int lk, int head_dim, float scale, int has_bias, int has_mask
#define ATTENTION_ARGS q, k, v, bias, key_mask, out, heads, lq, lk, head_dim, scale, has_bias, has_mask

// np.finfo(np.float32).min: the reference's additive key-mask value.
#define LOWEST_FLOAT (-3.4028234663852886e38f)

// -inf without <math.h> (NVRTC compiles without the host headers).
__device__ __forceinline__ float negative_infinity() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // `partial` may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}
