// Shared device helpers: dtype conversion (all math in fp32), warp reductions, 16-byte packs.
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

// Sum over aligned groups of `lanes` lanes (a power of 2 up to 32); every lane of the warp must
// call it (the shuffles name all 32), and each gets its group's sum.
__device__ __forceinline__ float group_sum(float v, int lanes) {
    for (int offset = lanes >> 1; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_sum(float v) { return group_sum(v, 32); }

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// N consecutive values of T moved by one access. 16 bytes is the widest global load and store
// (LDG.E.128 / STG.E.128) and needs a 16-byte-aligned address; narrower packs align to their size.
template <typename T, int N>
struct alignas(N * sizeof(T) < 16 ? N * sizeof(T) : 16) Pack {
    T v[N];
};

// Values of T in one 16-byte access: 8 of fp16 / bf16, 4 of fp32.
template <typename T>
__device__ constexpr int vector_width() { return 16 / sizeof(T); }

// A pack of 16-byte multiples moves as whole float4 accesses, copied bit for bit to and from the
// pack (the compiler may split a copy of a struct with an array inside, and the GPU requires,
// as cudasim checks, each 16-byte access to be 16-byte aligned).
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* at) {
    Pack<T, N> pack;
    if constexpr (N * sizeof(T) % 16 == 0) {
#pragma unroll
        for (int i = 0; i < N * (int)sizeof(T) / 16; ++i) {
            const float4 piece = reinterpret_cast<const float4*>(at)[i];
            memcpy(reinterpret_cast<char*>(&pack) + 16 * i, &piece, 16);
        }
    } else {
        pack = *reinterpret_cast<const Pack<T, N>*>(at);
    }
    return pack;
}

template <typename T, int N>
__device__ __forceinline__ void store_pack(T* at, const Pack<T, N>& pack) {
    if constexpr (N * sizeof(T) % 16 == 0) {
#pragma unroll
        for (int i = 0; i < N * (int)sizeof(T) / 16; ++i) {
            float4 piece;
            memcpy(&piece, reinterpret_cast<const char*>(&pack) + 16 * i, 16);
            reinterpret_cast<float4*>(at)[i] = piece;
        }
    } else {
        *reinterpret_cast<Pack<T, N>*>(at) = pack;
    }
}

__device__ __forceinline__ bool aligned_16(const void* at) { return ((unsigned long long)at & 15) == 0; }
