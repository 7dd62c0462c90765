// cudasim stand-in for CUDA's <cuda_bf16.h>: __nv_bfloat16 (the top 16 bits of a float) and
// its conversions from and to float, rounding to nearest even as CUDA documents.
#pragma once
#include "cudasim.h"

struct __nv_bfloat16 {
    uint16_t bits;
};

__device__ __forceinline__ float __bfloat162float(__nv_bfloat16 h) {
    return cudasim::bit_cast<float>((uint32_t)h.bits << 16);
}

__device__ __forceinline__ __nv_bfloat16 __float2bfloat16_rn(float f) {
    const uint32_t x = cudasim::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((x >> 16) | 0x40u)};  // NaN stays a (quiet) NaN
    const uint32_t odd = (x >> 16) & 1u;
    return {(uint16_t)((x + 0x7fffu + odd) >> 16)};
}

__device__ __forceinline__ __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }  // CUDA's default rounding
