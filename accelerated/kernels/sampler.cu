// The sampler's update after each forward, one pass over the state (model.md 4, 9.4):
//   cfg_euler (guided sampler, forward of [cond ; uncond], 2B samples):
//     g = u + s * (c - u)          (c, u: cond and uncond halves of the [2B, ...] x0 prediction)
//     x = x + f * (g - x)          and the next input [x ; x]
//   euler_step (Mean Flow student, forward of B samples, guidance is a network input):
//     x = x + f * (x0 - x)         and the next input x
// f is read from device memory so a captured CUDA graph can be replayed with a new factor. The
// next forward's input is written in the network dtype; the state x (and the guided x0) stay fp32
// whatever the network dtype, so 100 bf16 steps do not accumulate rounding.
// NumPy twin: reference/sampler.py guided_x0, reference/sampler.py sample, reference/sampler.py euler_step
#include "common.cuh"

__device__ __forceinline__ float euler_update(float x, float x0, float f) { return x + f * (x0 - x); }

template <typename T>
__device__ void cfg_euler_impl(float* __restrict__ state, T* __restrict__ next_input, const T* __restrict__ x0_both,
                               float* __restrict__ x0_guided, long long n, float cfg_scale,
                               const float* __restrict__ factor) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const float f = *factor;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float cond = to_float(x0_both[i]), uncond = to_float(x0_both[n + i]);
        const float guided = uncond + cfg_scale * (cond - uncond);
        const float x = euler_update(state[i], guided, f);
        state[i] = x;
        x0_guided[i] = guided;
        next_input[i] = next_input[n + i] = from_float<T>(x);
    }
}

template <typename T>
__device__ void euler_step_impl(float* __restrict__ state, T* __restrict__ next_input, const T* __restrict__ x0,
                                long long n, const float* __restrict__ factor) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const float f = *factor;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = euler_update(state[i], to_float(x0[i]), f);
        state[i] = x;
        next_input[i] = from_float<T>(x);
    }
}

#define DEFINE_SAMPLER_STEPS(T, SUFFIX)                                                             \
    extern "C" __global__ void cfg_euler_##SUFFIX(float* state, T* next_input, const T* x0_both,   \
                                                  float* x0_guided, long long n, float cfg_scale,   \
                                                  const float* factor) {                            \
        cfg_euler_impl<T>(state, next_input, x0_both, x0_guided, n, cfg_scale, factor);             \
    }                                                                                               \
    extern "C" __global__ void euler_step_##SUFFIX(float* state, T* next_input, const T* x0, long long n, \
                                                   const float* factor) {                           \
        euler_step_impl<T>(state, next_input, x0, n, factor);                                       \
    }
FOR_EACH_DTYPE(DEFINE_SAMPLER_STEPS)
