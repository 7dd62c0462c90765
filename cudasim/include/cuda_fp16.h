// cudasim stand-in for CUDA's <cuda_fp16.h>: the __half storage type and its conversions from
// and to float, with the rounding CUDA documents (round to nearest, ties to even).
#pragma once
#include "cudasim.h"

struct __half {
    uint16_t bits;
};

__device__ __forceinline__ float __half2float(__half h) {
    const uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16;
    const uint32_t exponent = (h.bits >> 10) & 0x1fu, mantissa = h.bits & 0x3ffu;
    uint32_t out;
    if (exponent == 0x1f) {
        out = sign | 0x7f800000u | (mantissa << 13);  // inf, or NaN with its payload
    } else if (exponent != 0) {
        out = sign | ((exponent + 112) << 23) | (mantissa << 13);  // rebias 15 -> 127
    } else {
        // zero or subnormal: the value is mantissa * 2^-24, exact in float
        out = sign | cudasim::bit_cast<uint32_t>((float)mantissa * 5.9604644775390625e-8f);
    }
    return cudasim::bit_cast<float>(out);
}

__device__ __forceinline__ __half __float2half_rn(float f) {
    const uint32_t x = cudasim::bit_cast<uint32_t>(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t magnitude = x & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return {(uint16_t)(sign | 0x7e00u)};  // NaN -> canonical quiet NaN
    if (magnitude >= 0x477ff000u) return {(uint16_t)(sign | 0x7c00u)};  // >= 65520: rounds to inf
    if (magnitude < 0x38800000u) {
        // below 2^-14: a subnormal half, i.e. a multiple of 2^-24. Adding 0.5 makes the FPU do
        // the round-to-nearest-even at exactly that step (0.5 has ulp 2^-24).
        const uint32_t sum = cudasim::bit_cast<uint32_t>(cudasim::bit_cast<float>(magnitude) + 0.5f);
        return {(uint16_t)(sign | (sum - 0x3f000000u))};
    }
    // normal: drop 13 mantissa bits with round to nearest even, then rebias 127 -> 15
    const uint32_t odd = (magnitude >> 13) & 1u;
    const uint32_t rounded = (magnitude + 0xfffu + odd) >> 13;
    return {(uint16_t)(sign | (rounded - (112u << 10)))};
}

__device__ __forceinline__ __half __float2half(float f) { return __float2half_rn(f); }  // CUDA's default rounding
