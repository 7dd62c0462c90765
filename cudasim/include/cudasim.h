// cudasim prelude: what a CUDA C kernel source expects from nvcc/NVRTC, for g++ on a CPU.
// Included before the kernel source (which is compiled unedited). Each CUDA thread runs as a
// fiber; threadIdx is the running fiber's, and every block-level or warp-level rendezvous
// (__syncthreads, __shfl_*_sync) hands control back to the scheduler in runtime.cpp.
#pragma once
#include <math.h>
#include <cstdint>
#include <cstring>

// Function and variable space specifiers. A __shared__ variable is thread_local: fibers all run
// on one OS thread, so every thread of the running block sees the same storage (block scope:
// implicitly static), and `extern __shared__` stays valid C++. The runtime resets and poisons
// this module's thread-local storage before every block.
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#ifdef CUDASIM_SCAN  // cudasim/build.py preprocesses with this to find kernels and their signatures
#define __global__ __cudasim_global__
#define __shared__ __cudasim_shared__
#define __launch_bounds__(...) __cudasim_launch_bounds__(__VA_ARGS__)
#else
#define __global__
#define __shared__ thread_local
#define __launch_bounds__(...)
#endif

struct uint3 {
    unsigned int x, y, z;
};
typedef uint3 dim3;

namespace cudasim {
// The bits of `from` read as a `To` (C++20's std::bit_cast).
template <typename To, typename From>
inline To bit_cast(From from) {
    static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
    To to;
    std::memcpy(&to, &from, sizeof to);
    return to;
}

struct ThreadState {
    uint3 thread_idx;
};
extern ThreadState* current;  // the fiber that is running
extern uint3 block_idx, block_dim, grid_dim;

void syncthreads(int line);
enum ShuffleKind { SHFL_IDX, SHFL_XOR, SHFL_DOWN, SHFL_UP, WARP_COLLECTIVE };
// The 32-bit pattern `value` of the source lane that `operand` (srcLane, laneMask or delta)
// selects within groups of `width` lanes, once every lane of `mask` has reached this call.
uint32_t shuffle(ShuffleKind kind, int line, unsigned mask, uint32_t value, int operand, int width);

// A warp-wide operation (__syncwarp, the wmma::*_sync functions) named `name`: once every lane
// of `mask` waits at it, `complete` runs once, given each lane's payload (nullptr outside the
// mask) and the call's line, then the lanes go on.
using CollectiveFn = void (*)(void* const* payloads, int line);
void warp_collective(const char* name, int line, unsigned mask, void* payload, CollectiveFn complete);
void syncwarp(int line, unsigned mask);
// Report a fault found inside a collective (printf-style); the launch fails with it.
void fault(const char* format, ...);
// For the detectors: a collective's memory accesses count as those of `lane` of the warp
// completing it (-1: the running thread's again); accesses inside an atomic_scope are atomic.
void act_as_lane(int lane);
void atomic_scope(bool enter);
// Which scrambled WMMA element-to-lane layout the running launch uses (one per schedule; mma.h).
extern int fragment_layout;

// `__syncthreads()` and `__shfl_*_sync(...)` become calls of these objects, built with the call
// site's line: threads waiting at two different barriers (or shuffles) are an error, not a
// silent release of both.
struct Barrier {
    int line;
    void operator()() const { syncthreads(line); }
};

struct SyncWarp {
    int line;
    void operator()(unsigned mask = 0xffffffffu) const { syncwarp(line, mask); }
};

struct Shuffle {
    ShuffleKind kind;
    int line;
    template <typename T>
    T operator()(unsigned mask, T value, int operand, int width = 32) const {
        static_assert(sizeof(T) == 4, "cudasim shuffles 32-bit values only");
        return bit_cast<T>(shuffle(kind, line, mask, bit_cast<uint32_t>(value), operand, width));
    }
};
}  // namespace cudasim

#define threadIdx (cudasim::current->thread_idx)
#define blockIdx (cudasim::block_idx)
#define blockDim (cudasim::block_dim)
#define gridDim (cudasim::grid_dim)
#define warpSize 32
#define __syncthreads cudasim::Barrier{__LINE__}
#define __syncwarp cudasim::SyncWarp{__LINE__}
#define __shfl_sync cudasim::Shuffle{cudasim::SHFL_IDX, __LINE__}
#define __shfl_xor_sync cudasim::Shuffle{cudasim::SHFL_XOR, __LINE__}
#define __shfl_down_sync cudasim::Shuffle{cudasim::SHFL_DOWN, __LINE__}
#define __shfl_up_sync cudasim::Shuffle{cudasim::SHFL_UP, __LINE__}

// Math: expf, sqrtf, tanhf, fmaxf come from libm (their results may differ from the GPU's by an
// ulp); the intrinsics below are computed exactly, where the GPU's fast versions approximate.
__device__ __forceinline__ float rsqrtf(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ float __expf(float x) { return expf(x); }
__device__ __forceinline__ float __fdividef(float a, float b) { return a / b; }
__device__ __forceinline__ float __int_as_float(int x) { return cudasim::bit_cast<float>(x); }
__device__ __forceinline__ int __float_as_int(float f) { return cudasim::bit_cast<int>(f); }
