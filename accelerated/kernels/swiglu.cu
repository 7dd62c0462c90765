// Gated activations on the packed output of one GEMM against [W_gate | W_up] (concatenated at
// upload): packed [rows, 2*hidden] -> out [rows, hidden], out = act(gate) * up.
//   swiglu: act = SiLU (MMJiT MLP);  geglu: act = tanh-GELU (T5 v1.1 gated FFN).
// Saves the two separate activation/multiply passes and one [rows, hidden] temporary.
// NumPy twin: reference/layers.py swiglu, reference/t5.py gated_gelu_ffn
#include "common.cuh"

__device__ __forceinline__ float silu(float a) { return a / (1.0f + expf(-a)); }

__device__ __forceinline__ float gelu_tanh(float a) {
    const float sqrt_2_over_pi = 0.7978845608028654f;
    return 0.5f * a * (1.0f + tanhf(sqrt_2_over_pi * (a + 0.044715f * a * a * a)));
}

template <typename T, float (*Act)(float)>
__device__ void gated_impl(const T* __restrict__ packed, T* __restrict__ out, int hidden, long long total) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const long long row = i / hidden, col = i - row * hidden;
        const T* src = packed + row * 2 * hidden;
        out[i] = from_float<T>(Act(to_float(src[col])) * to_float(src[hidden + col]));
    }
}

#define DEFINE_GATED(T, SUFFIX)                                                                     \
    extern "C" __global__ void swiglu_##SUFFIX(const T* packed, T* out, int hidden, long long total) { \
        gated_impl<T, silu>(packed, out, hidden, total);                                            \
    }                                                                                               \
    extern "C" __global__ void geglu_##SUFFIX(const T* packed, T* out, int hidden, long long total) {  \
        gated_impl<T, gelu_tanh>(packed, out, hidden, total);                                       \
    }
FOR_EACH_DTYPE(DEFINE_GATED)
