// cudasim stand-in for CUDA's <mma.h>: the nvcuda::wmma warp matrix functions for the 16x16x16
// shape with __half or __nv_bfloat16 inputs and float (or __half) accumulators.
//
// A fragment is per thread: 8 of the 256 elements of a 16x16 tile (no replication). Which
// element a lane holds in x[i] is unspecified by CUDA (and differs between GPUs), so here it is
// deliberately scrambled, differently for matrix_a, matrix_b and accumulator and for each
// schedule (cudasim::fragment_layout): a kernel that indexes x[i] assuming some GPU's layout
// gets wrong results, and different ones per schedule, which the race check reports. Work on
// every element alike (scaling, conversion) stays correct, as the programming guide allows.
//
// load_matrix_sync, store_matrix_sync and mma_sync are warp collectives: every lane of the warp
// must reach the same call (cudasim::warp_collective), with the same pointer and ldm; the
// pointer must be 256-bit aligned and ldm a multiple of 16 bytes, as the guide requires.
// mma_sync multiplies exactly (products of 16-bit inputs fit in fp32) and accumulates in fp32 in
// order k = 0..15 onto C; a tensor core's internal summation order and rounding may differ.
#pragma once
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cudasim.h"

namespace cudasim {
// Element i of lane `lane`'s fragment is element row * 16 + col of the tile, for this `use`
// (0 matrix_a, 1 matrix_b, 2 accumulator) and this launch's layout: an xor, an odd multiplier
// and an offset, each a bijection of 0..255, chosen per (use, layout).
inline int fragment_position(int use, int lane, int i) {
    static const int multipliers[] = {37, 91, 149, 203, 29, 77, 117, 233, 59, 167, 45, 185};
    const int salt = fragment_layout * 3 + use;
    const int scrambled = ((lane * 8 + i) ^ (0x5a + 23 * salt)) & 255;
    return (scrambled * multipliers[salt % 12] + 101 * salt) & 255;
}

inline float wmma_float(float x) { return x; }
inline float wmma_float(__half x) { return __half2float(x); }
inline float wmma_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> T wmma_from_float(float x);
template <> inline float wmma_from_float<float>(float x) { return x; }
template <> inline __half wmma_from_float<__half>(float x) { return __float2half_rn(x); }
}  // namespace cudasim

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int m, int n, int k, typename T, typename Layout = void>
class fragment {
    static_assert(m == 16 && n == 16 && k == 16, "cudasim implements the 16x16x16 WMMA shape only");

  public:
    enum { num_elements = 8 };
    T x[num_elements];
};

namespace detail {
template <typename Use> struct use_index;
template <> struct use_index<matrix_a> { enum { value = 0 }; };
template <> struct use_index<matrix_b> { enum { value = 1 }; };
template <> struct use_index<accumulator> { enum { value = 2 }; };

template <typename Layout> struct column_major { enum { value = 0 }; };
template <> struct column_major<col_major> { enum { value = 1 }; };

// One lane's side of a load or store: its fragment and the tile in memory (M may be const).
template <typename F, typename M>
struct Transfer {
    F* fragment;
    M* memory;
    unsigned ldm;
    bool column_major;
};

// The guide's rules for the warp's (uniform) pointer and ldm; a fault names the first broken one.
template <typename F, typename M>
bool valid_transfer(const char* name, void* const* payloads, int line) {
    const auto* first = static_cast<const Transfer<F, M>*>(payloads[0]);
    if (reinterpret_cast<uintptr_t>(first->memory) % 32) {
        cudasim::fault("%s on line %d: the pointer %p is not 256-bit aligned", name, line, (const void*)first->memory);
        return false;
    }
    if ((first->ldm * sizeof(M)) % 16) {
        cudasim::fault("%s on line %d: ldm %u is not a multiple of 16 bytes", name, line, first->ldm);
        return false;
    }
    for (int lane = 1; lane < 32; ++lane) {
        const auto* other = static_cast<const Transfer<F, M>*>(payloads[lane]);
        if (other->memory != first->memory || other->ldm != first->ldm || other->column_major != first->column_major) {
            cudasim::fault("%s on line %d: lane %d passes another pointer, ldm or layout than lane 0", name, line, lane);
            return false;
        }
    }
    return true;
}

// Copy between each lane's fragment and the tile, through the scrambled element positions.
template <int USE, typename F, typename M, bool LOAD>
void transfer(void* const* payloads, int line) {
    const char* name = LOAD ? "wmma::load_matrix_sync" : "wmma::store_matrix_sync";
    if (!valid_transfer<F, M>(name, payloads, line)) return;
    for (int lane = 0; lane < 32; ++lane) {
        const auto* t = static_cast<const Transfer<F, M>*>(payloads[lane]);
        cudasim::act_as_lane(lane);  // each lane loads or stores its own elements
        for (int i = 0; i < F::num_elements; ++i) {
            const int position = cudasim::fragment_position(USE, lane, i), row = position >> 4, col = position & 15;
            M& cell = t->memory[t->column_major ? col * t->ldm + row : row * t->ldm + col];
            if constexpr (LOAD) t->fragment->x[i] = cell;
            else cell = t->fragment->x[i];
        }
    }
    cudasim::act_as_lane(-1);
}

template <typename D, typename A, typename B, typename C>
struct Product {
    D* d;
    const A* a;
    const B* b;
    const C* c;
};

// The fragments of all 32 lanes as one 16x16 tile of floats.
template <int USE, typename F, typename Get>
void gather(float* tile, Get fragment_of) {
    for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < F::num_elements; ++i)
            tile[cudasim::fragment_position(USE, lane, i)] = cudasim::wmma_float(fragment_of(lane)->x[i]);
}

template <typename D, typename A, typename B, typename C>
void multiply(void* const* payloads, int) {
    using P = Product<D, A, B, C>;
    float a[256], b[256], c[256];
    gather<0, A>(a, [&](int lane) { return static_cast<const P*>(payloads[lane])->a; });
    gather<1, B>(b, [&](int lane) { return static_cast<const P*>(payloads[lane])->b; });
    gather<2, C>(c, [&](int lane) { return static_cast<const P*>(payloads[lane])->c; });
    for (int lane = 0; lane < 32; ++lane) {
        D* d = static_cast<const P*>(payloads[lane])->d;
        for (int i = 0; i < D::num_elements; ++i) {
            const int position = cudasim::fragment_position(2, lane, i), row = position >> 4, col = position & 15;
            float sum = c[position];
            for (int k = 0; k < 16; ++k) sum += a[row * 16 + k] * b[k * 16 + col];
            d->x[i] = cudasim::wmma_from_float<std::remove_reference_t<decltype(d->x[i])>>(sum);
        }
    }
}
}  // namespace detail

template <typename Use, typename T, typename Layout, typename V>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const V& value) {
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = value;
}

template <typename Use, typename T, typename Layout>
__forceinline__ void load_matrix_sync_at(int line, fragment<Use, 16, 16, 16, T, Layout>& f, const T* memory, unsigned ldm) {
    using F = fragment<Use, 16, 16, 16, T, Layout>;
    detail::Transfer<F, const T> payload{&f, memory, ldm, detail::column_major<Layout>::value != 0};
    cudasim::warp_collective("wmma::load_matrix_sync", line, 0xffffffffu, &payload,
                             detail::transfer<detail::use_index<Use>::value, F, const T, true>);
}

template <typename T>
__forceinline__ void load_matrix_sync_at(int line, fragment<accumulator, 16, 16, 16, T>& f, const T* memory, unsigned ldm,
                                layout_t layout) {
    using F = fragment<accumulator, 16, 16, 16, T>;
    detail::Transfer<F, const T> payload{&f, memory, ldm, layout == mem_col_major};
    cudasim::warp_collective("wmma::load_matrix_sync", line, 0xffffffffu, &payload, detail::transfer<2, F, const T, true>);
}

template <typename T>
__forceinline__ void store_matrix_sync_at(int line, T* memory, const fragment<accumulator, 16, 16, 16, T>& f, unsigned ldm,
                                 layout_t layout) {
    using F = fragment<accumulator, 16, 16, 16, T>;
    detail::Transfer<F, T> payload{const_cast<F*>(&f), memory, ldm, layout == mem_col_major};
    cudasim::warp_collective("wmma::store_matrix_sync", line, 0xffffffffu, &payload, detail::transfer<2, F, T, false>);
}

template <typename Tc, typename Tab, typename La, typename Lb, typename Td>
__forceinline__ void mma_sync_at(int line, fragment<accumulator, 16, 16, 16, Td>& d,
                        const fragment<matrix_a, 16, 16, 16, Tab, La>& a, const fragment<matrix_b, 16, 16, 16, Tab, Lb>& b,
                        const fragment<accumulator, 16, 16, 16, Tc>& c, bool satf = false) {
    static_assert(sizeof(Tab) == 2, "cudasim's mma_sync takes __half or __nv_bfloat16 inputs");
    (void)satf;
    using D = fragment<accumulator, 16, 16, 16, Td>;
    using A = fragment<matrix_a, 16, 16, 16, Tab, La>;
    using B = fragment<matrix_b, 16, 16, 16, Tab, Lb>;
    using C = fragment<accumulator, 16, 16, 16, Tc>;
    detail::Product<D, A, B, C> payload{&d, &a, &b, &c};
    cudasim::warp_collective("wmma::mma_sync", line, 0xffffffffu, &payload, detail::multiply<D, A, B, C>);
}
}  // namespace wmma
}  // namespace nvcuda

// The warp-wide calls carry their source line (as __syncthreads does), for the messages. They
// are inlined, so the detectors place a collective's accesses at its call in the kernel.
#define load_matrix_sync(...) load_matrix_sync_at(__LINE__, __VA_ARGS__)
#define store_matrix_sync(...) store_matrix_sync_at(__LINE__, __VA_ARGS__)
#define mma_sync(...) mma_sync_at(__LINE__, __VA_ARGS__)
