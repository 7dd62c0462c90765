// Gated activations on the packed output of one GEMM against [W_gate | W_up] (concatenated at
// upload): packed [rows, 2*hidden] -> out [rows, hidden], out = act(gate) * up.
//   swiglu: act = SiLU (MMJiT MLP);  geglu: act = tanh-GELU (T5 v1.1 gated FFN).
// Saves the two separate activation/multiply passes and one [rows, hidden] temporary.
// Threads walk a row's packs (x) and rows (y), each with a grid stride: no division anywhere.
// 16-byte packs when hidden is a multiple of one and both pointers are 16-byte aligned (then
// gate, up and out all are), else value by value.
// NumPy twin: reference/layers.py swiglu, reference/t5.py gated_gelu_ffn
#include "common.cuh"

__device__ __forceinline__ float silu(float a) { return a / (1.0f + expf(-a)); }

__device__ __forceinline__ float gelu_tanh(float a) {
    const float sqrt_2_over_pi = 0.7978845608028654f;
    return 0.5f * a * (1.0f + tanhf(sqrt_2_over_pi * (a + 0.044715f * a * a * a)));
}

template <typename T, int N, float (*Act)(float)>
__device__ void gated_packs(const T* __restrict__ packed, T* __restrict__ out, int hidden, int rows) {
    const int packs = hidden / N;
    for (int row = blockIdx.y; row < rows; row += gridDim.y) {
        const T* gate = packed + (long long)row * 2 * hidden;
        T* dst = out + (long long)row * hidden;
        for (int pack = blockIdx.x * blockDim.x + threadIdx.x; pack < packs; pack += gridDim.x * blockDim.x) {
            const Pack<T, N> g = load_pack<T, N>(gate + pack * N), u = load_pack<T, N>(gate + hidden + pack * N);
            Pack<T, N> y;
#pragma unroll
            for (int e = 0; e < N; ++e) y.v[e] = from_float<T>(Act(to_float(g.v[e])) * to_float(u.v[e]));
            store_pack<T, N>(dst + pack * N, y);
        }
    }
}

template <typename T, float (*Act)(float)>
__device__ void gated_impl(const T* packed, T* out, int hidden, int rows) {
    constexpr int V = vector_width<T>();
    if (hidden % V == 0 && aligned_16(packed) && aligned_16(out))
        gated_packs<T, V, Act>(packed, out, hidden, rows);
    else
        gated_packs<T, 1, Act>(packed, out, hidden, rows);
}

#define DEFINE_GATED(T, SUFFIX)                                                                     \
    extern "C" __global__ void swiglu_##SUFFIX(const T* packed, T* out, int hidden, int rows) {     \
        gated_impl<T, silu>(packed, out, hidden, rows);                                             \
    }                                                                                               \
    extern "C" __global__ void geglu_##SUFFIX(const T* packed, T* out, int hidden, int rows) {      \
        gated_impl<T, gelu_tanh>(packed, out, hidden, rows);                                        \
    }
FOR_EACH_DTYPE(DEFINE_GATED)
