// One fused CFG + Euler step (model.md 4): for every element of the B-sample state,
//   g = u + s * (c - u)          (c, u: cond and uncond halves of the [2B, ...] x0 prediction)
//   x = x + f * (g - x)          (f = dt / max(1 - t, a_min), read from device memory so a
//                                 captured CUDA graph can be replayed with a new factor)
// and the next forward's input [x ; x] is written in the network dtype. The state x and the
// guided x0 stay fp32 whatever the network dtype, so 100 bf16 steps do not accumulate rounding.
// NumPy twin: reference/sampler.py guided_x0, reference/sampler.py sample
#include "common.cuh"

template <typename T>
__device__ void cfg_euler_impl(float* __restrict__ state, T* __restrict__ next_input, const T* __restrict__ x0_both,
                               float* __restrict__ x0_guided, long long n, float cfg_scale,
                               const float* __restrict__ factor) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const float f = *factor;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float cond = to_float(x0_both[i]), uncond = to_float(x0_both[n + i]);
        const float guided = uncond + cfg_scale * (cond - uncond);
        const float x = state[i] + f * (guided - state[i]);
        state[i] = x;
        x0_guided[i] = guided;
        next_input[i] = next_input[n + i] = from_float<T>(x);
    }
}

#define DEFINE_CFG_EULER(T, SUFFIX)                                                                 \
    extern "C" __global__ void cfg_euler_##SUFFIX(float* state, T* next_input, const T* x0_both,   \
                                                  float* x0_guided, long long n, float cfg_scale,   \
                                                  const float* factor) {                            \
        cfg_euler_impl<T>(state, next_input, x0_both, x0_guided, n, cfg_scale, factor);             \
    }
FOR_EACH_DTYPE(DEFINE_CFG_EULER)
