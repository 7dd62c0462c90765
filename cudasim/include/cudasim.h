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

// Vector types, aligned as vector_types.h aligns them: an access through a misaligned pointer to
// one is an error on a GPU (and reported by the detectors).
#define CUDASIM_VECTOR_TYPES(T, NAME)                                                                    \
    struct alignas(2 * sizeof(T)) NAME##2 { T x, y; };                                                  \
    struct alignas(4 * sizeof(T)) NAME##4 { T x, y, z, w; };                                            \
    inline NAME##2 make_##NAME##2(T x, T y) { return {x, y}; }                                          \
    inline NAME##4 make_##NAME##4(T x, T y, T z, T w) { return {x, y, z, w}; }
CUDASIM_VECTOR_TYPES(float, float)
CUDASIM_VECTOR_TYPES(int, int)
CUDASIM_VECTOR_TYPES(unsigned, uint)
#undef CUDASIM_VECTOR_TYPES

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
// The guards around a block's shared variables (runtime.cpp) and around each argument buffer of
// a launch with detectors (module.py): an access into one is out of bounds. A buffer's guards are
// address space reserved for it and never accessible, so nothing else lies within them: an access
// up to MEMORY_GUARD_BYTES from a buffer is reported as that buffer's.
constexpr size_t SHARED_GUARD_BYTES = 4096;
constexpr size_t MEMORY_GUARD_BYTES = size_t(256) << 20;
// For the detectors: a collective's memory accesses count as those of `lane` of the warp
// completing it (-1: the running thread's again); accesses inside an atomic_scope are atomic.
void act_as_lane(int lane);
void atomic_scope(bool enter);
// For the schedule comparison: a float atomicAdd on `address` (of `size` bytes) made its sum `magnitude`.
void atomic_float_add(const void* address, size_t size, double magnitude);
// For the counters (runtime.cpp, "Counters"), which count what Nsight Compute counts: a lane's part
// of a warp request of `kind` made at `site` (the instruction; a lane's k-th part there joins the
// warp's k-th request), the whole warp's part of one (ldmatrix: a row address a lane), an mma.
// The PTX emulation's own loads and stores (its bookkeeping) are made inside an uncounted scope.
enum RequestKind { REQUEST_SHARED_LD, REQUEST_SHARED_ST, REQUEST_LDSM, REQUEST_LDGSTS, REQUEST_GLOBAL_LD, REQUEST_GLOBAL_ST,
                   REQUEST_EXP2 };
void count_lane(RequestKind kind, uint64_t site, const void* address, const void* source, int bytes);
void count_warp(RequestKind kind, const void* const* addresses, int lanes, int bytes);
void count_mma();
void uncounted(bool enter);
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

// Math: expf, sqrtf, tanhf, fmaxf, fmaf come from libm (their results may differ from the
// GPU's by an ulp); the intrinsics below are computed exactly, where the GPU's fast versions
// approximate.
// exp2f is counted as the MUFU.EX2 a GPU issues for it (the lanes' calls on one source line, in turn,
// are the warp's instructions).
namespace cudasim {
inline float counted_exp2f(float x, int line) {
    count_lane(REQUEST_EXP2, uint64_t(REQUEST_EXP2) << 56 | line, nullptr, nullptr, 0);
    return exp2f(x);
}
}  // namespace cudasim
#define exp2f(x) cudasim::counted_exp2f(x, __LINE__)
__device__ __forceinline__ float rsqrtf(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ float __expf(float x) { return expf(x); }
__device__ __forceinline__ float __fdividef(float a, float b) { return a / b; }
// Clamped to [+0, 1]; NaN gives +0, as the GPU's saturating conversion does.
__device__ __forceinline__ float __saturatef(float x) { return x >= 1.0f ? 1.0f : x > 0.0f ? x : 0.0f; }
__device__ __forceinline__ float __int_as_float(int x) { return cudasim::bit_cast<float>(x); }
__device__ __forceinline__ int __float_as_int(float f) { return cudasim::bit_cast<int>(f); }
__device__ __forceinline__ float __uint_as_float(unsigned x) { return cudasim::bit_cast<float>(x); }
__device__ __forceinline__ unsigned __float_as_uint(float f) { return cudasim::bit_cast<unsigned>(f); }

// float -> int as the GPU converts (cvt.rni / cvt.rzi): out-of-range values saturate, NaN is 0.
namespace cudasim {
inline int saturated_int(float rounded) {
    if (rounded != rounded) return 0;
    if (rounded >= 2147483648.0f) return 2147483647;
    if (rounded < -2147483648.0f) return -2147483647 - 1;
    return (int)rounded;
}
}  // namespace cudasim
__device__ __forceinline__ int __float2int_rn(float x) { return cudasim::saturated_int(rintf(x)); }  // ties to even
__device__ __forceinline__ int __float2int_rz(float x) { return cudasim::saturated_int(truncf(x)); }
__device__ __forceinline__ float __int2float_rn(int x) { return (float)x; }  // the C conversion rounds to nearest even

// Bit operations.
__device__ __forceinline__ int __popc(unsigned x) { return __builtin_popcount(x); }
__device__ __forceinline__ int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
__device__ __forceinline__ int __ffs(int x) { return __builtin_ffs(x); }  // 1 + index of the lowest set bit; 0 for 0
__device__ __forceinline__ int __ffsll(long long x) { return __builtin_ffsll(x); }
__device__ __forceinline__ int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
__device__ __forceinline__ int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
__device__ __forceinline__ unsigned __brev(unsigned x) {
    unsigned reversed = 0;
    for (int bit = 0; bit < 32; ++bit) reversed |= (x >> bit & 1u) << (31 - bit);
    return reversed;
}

// CUDA's min and max: integers of mixed signedness compare as the unsigned type (C's usual
// conversions, as CUDA's overloads do); floating point is fminf / fmaxf (a NaN loses to a number).
#define CUDASIM_MIN_MAX(A, B, R)                                                                         \
    __device__ __forceinline__ R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; }                     \
    __device__ __forceinline__ R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; }
CUDASIM_MIN_MAX(int, int, int)
CUDASIM_MIN_MAX(unsigned, unsigned, unsigned)
CUDASIM_MIN_MAX(int, unsigned, unsigned)
CUDASIM_MIN_MAX(unsigned, int, unsigned)
CUDASIM_MIN_MAX(long long, long long, long long)
CUDASIM_MIN_MAX(unsigned long long, unsigned long long, unsigned long long)
CUDASIM_MIN_MAX(long long, unsigned long long, unsigned long long)
CUDASIM_MIN_MAX(unsigned long long, long long, unsigned long long)
#undef CUDASIM_MIN_MAX
__device__ __forceinline__ float min(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ float max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double min(double a, double b) { return fmin(a, b); }
__device__ __forceinline__ double max(double a, double b) { return fmax(a, b); }

// A read through the read-only data cache: on a CPU, a read.
template <typename T>
__device__ __forceinline__ T __ldg(const T* address) { return *address; }

// Atomics. One fiber runs at a time, so a plain read-modify-write is atomic here; the scope
// tells the detectors, for which two atomic accesses never race.
namespace cudasim {
template <typename T, typename Update>
__forceinline__ T atomic_update(T* address, Update update) {
    atomic_scope(true);
    const T old = *address;
    *address = update(old);
    atomic_scope(false);
    return old;
}
}  // namespace cudasim

#define CUDASIM_ATOMIC(NAME, T, NEW)                                                                     \
    __device__ __forceinline__ T NAME(T* address, T value) {                                             \
        return cudasim::atomic_update(address, [value](T old) -> T { return NEW; });                     \
    }
// Signed add and subtract wrap around, as the GPU's do (computed unsigned: no C overflow).
CUDASIM_ATOMIC(atomicAdd, int, (int)((unsigned)old + (unsigned)value))
CUDASIM_ATOMIC(atomicAdd, unsigned, old + value)
CUDASIM_ATOMIC(atomicAdd, unsigned long long, old + value)
CUDASIM_ATOMIC(atomicSub, int, (int)((unsigned)old - (unsigned)value))
CUDASIM_ATOMIC(atomicSub, unsigned, old - value)
CUDASIM_ATOMIC(atomicMax, int, max(old, value))
CUDASIM_ATOMIC(atomicMax, unsigned, max(old, value))
CUDASIM_ATOMIC(atomicMax, long long, max(old, value))
CUDASIM_ATOMIC(atomicMax, unsigned long long, max(old, value))
CUDASIM_ATOMIC(atomicMin, int, min(old, value))
CUDASIM_ATOMIC(atomicMin, unsigned, min(old, value))
CUDASIM_ATOMIC(atomicMin, long long, min(old, value))
CUDASIM_ATOMIC(atomicMin, unsigned long long, min(old, value))
CUDASIM_ATOMIC(atomicExch, int, value)
CUDASIM_ATOMIC(atomicExch, unsigned, value)
CUDASIM_ATOMIC(atomicExch, unsigned long long, value)
CUDASIM_ATOMIC(atomicExch, float, value)
#define CUDASIM_ATOMIC_CAS(T)                                                                            \
    __device__ __forceinline__ T atomicCAS(T* address, T compare, T value) {                             \
        return cudasim::atomic_update(address, [compare, value](T old) { return old == compare ? value : old; }); \
    }
CUDASIM_ATOMIC_CAS(int)
CUDASIM_ATOMIC_CAS(unsigned)
CUDASIM_ATOMIC_CAS(unsigned long long)
// Float adds round, so their sum depends on their order; the runtime records each (atomic_float_add).
#define CUDASIM_FLOAT_ATOMIC_ADD(T)                                                                      \
    __device__ __forceinline__ T atomicAdd(T* address, T value) {                                        \
        const T old = cudasim::atomic_update(address, [value](T old) -> T { return old + value; });      \
        cudasim::atomic_float_add(address, sizeof(T), fabs((double)(old + value)));                      \
        return old;                                                                                      \
    }
CUDASIM_FLOAT_ATOMIC_ADD(float)
CUDASIM_FLOAT_ATOMIC_ADD(double)
#undef CUDASIM_ATOMIC
#undef CUDASIM_ATOMIC_CAS
#undef CUDASIM_FLOAT_ATOMIC_ADD
