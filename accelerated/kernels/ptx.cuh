// The warp-level PTX instructions of the FlashAttention-2 kernel (attention_mma.cu), as one small
// function each: on a GPU the instruction itself (inline asm, sm_80 and later), under cudasim a
// CPU implementation of what the PTX ISA documents for it, so the kernel runs in CI unchanged.
//
//   mma_m16n8k16<T>(d, a, b)    D[16x8] += A[16x16] B[16x8], T __half or __nv_bfloat16, fp32 D
//                               (mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32)
//   ldmatrix_x4 / _x2 (row)     four / two 8x8 16-bit matrices from shared memory into registers,
//   ldmatrix_x4_trans / _x2_trans  as they are or transposed (ldmatrix.sync.aligned.m8n8.{x4,x2}[.trans].shared.b16)
//   cp_async_16(dst, src, fill) 16 bytes global -> shared without a register trip, zeros when !fill
//                               (cp.async.cg.shared.global, src-size 16 or 0); cp_async_8 the same
//                               for 8 bytes (cp.async.ca: .cg copies 16 bytes only)
//   cp_async_commit()           closes the thread's current group of copies (cp.async.commit_group)
//   cp_async_wait<N>()          waits until at most N of its groups are pending (cp.async.wait_group N)
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), with
// g = lane / 4 and t = lane % 4; each 32-bit register holds two 16-bit elements, the lower-numbered
// one in its low half:
//   A (16x16, row-major): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
//   B (16x8, "col"):      b[0] = rows 2t..2t+1 of column g, b[1] = rows 2t+8..2t+9 of column g
//   C, D (16x8, fp32):    d[0], d[1] = (g, 2t), (g, 2t+1); d[2], d[3] = (g+8, 2t), (g+8, 2t+1)
// ldmatrix: lane 8j + r gives the address of row r of matrix j (16 bytes, 16-byte aligned); lane l
// receives, in register j, elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of matrix j, or
// with .trans elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4). So ldmatrix_x4 of a 16x16
// row-major tile (lanes 0-15 rows 0-15 at column 0, lanes 16-31 the same rows at column 8) is
// exactly the A fragment, and of an 8-row x 16-column tile stored key-major it is two B fragments.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned int ptx_u32;  // one register: two 16-bit elements, or one fp32

#if defined(__CUDA_ARCH__)  // NVRTC / nvcc: the instructions themselves

template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const ptx_u32 (&a)[4], const ptx_u32 (&b)[2]);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const ptx_u32 (&a)[4], const ptx_u32 (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const ptx_u32 (&a)[4], const ptx_u32 (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(ptx_u32 (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(ptx_u32 (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)));
}

__device__ __forceinline__ void ldmatrix_x2(ptx_u32 (&r)[2], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(shared_address(row)));
}

__device__ __forceinline__ void ldmatrix_x2_trans(ptx_u32 (&r)[2], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(shared_address(row)));
}

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool fill) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src), "r"(fill ? 16 : 0));
}

// .ca: the only form with 8-byte copies (rows of 52 16-bit values are 8-byte, not 16-byte, aligned)
__device__ __forceinline__ void cp_async_8(void* dst, const void* src, bool fill) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(shared_address(dst)), "l"(src), "r"(fill ? 8 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

#else  // cudasim: the documented semantics on the CPU

namespace cudasim {
namespace ptx {
inline float widen(__half x) { return __half2float(x); }
inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }

// Element `half` (0 low, 1 high) of a register holding two 16-bit values of type T, as a float.
template <typename T>
inline float element(ptx_u32 reg, int half) {
    return widen(T{static_cast<uint16_t>(half ? reg >> 16 : reg & 0xffffu)});
}

template <typename T>
struct MmaLane {
    float* d;
    const ptx_u32* a;
    const ptx_u32* b;
};

// The warp's A, B and C from every lane's registers by the layout tables above, then D = A B + C
// exactly in the products (16-bit inputs multiply exactly in fp32) and in order k = 0..15; a
// tensor core's internal summation order and rounding may differ (within the same bound).
// Not instrumented for the detectors: it touches only the lanes' registers (their fragments,
// which the runtime handed it) and its own arrays, and its thousands of accesses per mma were
// most of a tensor-core kernel's time on cudasim.
template <typename T>
__attribute__((no_sanitize("thread"))) void mma_complete(void* const* payloads, int) {
    float a[16][16], b[16][8], c[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const auto* p = static_cast<const MmaLane<T>*>(payloads[lane]);
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 8; ++i) {
            const int row = g + ((i >> 1) & 1) * 8, col = 2 * t + (i & 1) + (i >> 2) * 8;
            a[row][col] = element<T>(p->a[i >> 1], i & 1);
        }
        for (int i = 0; i < 4; ++i) b[2 * t + (i & 1) + (i >> 1) * 8][g] = element<T>(p->b[i >> 1], i & 1);
        for (int i = 0; i < 4; ++i) c[g + (i >> 1) * 8][2 * t + (i & 1)] = p->d[i];
    }
    count_mma();
    for (int lane = 0; lane < 32; ++lane) {
        const auto* p = static_cast<const MmaLane<T>*>(payloads[lane]);
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; ++i) {
            const int row = g + (i >> 1) * 8, col = 2 * t + (i & 1);
            float sum = c[row][col];
            for (int k = 0; k < 16; ++k) sum += a[row][k] * b[k][col];
            p->d[i] = sum;
        }
    }
}

struct LdmatrixLane {
    ptx_u32* r;
    const unsigned char* row;
};

// Lane 8j + r's address is row r of matrix j; lane l gets the pair of elements the table above
// names. Each row is read by the lane that gave its address (for the detectors).
template <int MATRICES, bool TRANS>
void ldmatrix_complete(void* const* payloads, int line) {
    uint16_t m[MATRICES][8][8];
    const void* rows[8 * MATRICES];
    for (int j = 0; j < MATRICES; ++j)
        for (int r = 0; r < 8; ++r) {
            const unsigned char* row = static_cast<const LdmatrixLane*>(payloads[8 * j + r])->row;
            if (reinterpret_cast<uintptr_t>(row) % 16) {
                fault("ldmatrix on line %d: lane %d's row address %p is not 16-byte aligned", line, 8 * j + r, (const void*)row);
                return;
            }
            rows[8 * j + r] = row;
            act_as_lane(8 * j + r);
            for (int c = 0; c < 8; ++c) m[j][r][c] = reinterpret_cast<const uint16_t*>(row)[c];
        }
    act_as_lane(-1);
    count_warp(REQUEST_LDSM, rows, 8 * MATRICES, 16);  // a matrix's 8 rows of 16 bytes are one phase
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        for (int j = 0; j < MATRICES; ++j) {
            const uint16_t low = TRANS ? m[j][2 * t][g] : m[j][g][2 * t];
            const uint16_t high = TRANS ? m[j][2 * t + 1][g] : m[j][g][2 * t + 1];
            static_cast<const LdmatrixLane*>(payloads[lane])->r[j] = low | (ptx_u32)high << 16;
        }
    }
}

template <int MATRICES, bool TRANS>
__forceinline__ void ldmatrix_at(int line, ptx_u32* r, const void* row) {
    LdmatrixLane payload{r, static_cast<const unsigned char*>(row)};
    cudasim::warp_collective(TRANS ? "ldmatrix .trans" : "ldmatrix", line, 0xffffffffu, &payload,
                             ldmatrix_complete<MATRICES, TRANS>);
}

// cp.async: a copy lands in shared memory at some moment between its issue and the wait that
// covers its group. Here the destination is overwritten with NaN bytes (0xff) at the issue and
// with the data at the wait, both as the issuing thread's stores: a read of it by any thread
// before the wait and a barrier reads NaN (or is a race for the detectors), and so is a copy
// issued into a buffer other threads still read. The bookkeeping is static data (no heap, which
// the detectors would report as memory a kernel may not touch): per thread, its pending copies.
constexpr int MAX_PENDING_COPIES = 128;
struct Copy {
    uint32_t* dst;
    uint32_t data[4];
    int words, group;
};
struct ThreadCopies {
    uint3 block;
    int count, open_group;  // pending copies; the group new copies join
    Copy copies[MAX_PENDING_COPIES];
};
inline ThreadCopies copies_by_thread[1024];

inline ThreadCopies& my_copies() {
    const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    ThreadCopies& mine = copies_by_thread[linear];
    if (mine.count && (mine.block.x != blockIdx.x || mine.block.y != blockIdx.y || mine.block.z != blockIdx.z))
        fault("cp.async: thread %u of block (%u,%u,%u) ended with copies it never waited for", linear, mine.block.x,
              mine.block.y, mine.block.z);
    if (!mine.count) mine.block = blockIdx, mine.open_group = 0;
    return mine;
}

// The emulation's own loads and stores are not the kernel's requests (the copy is counted as one).
struct Uncounted {
    Uncounted() { uncounted(true); }
    ~Uncounted() { uncounted(false); }
};

inline void issue(void* dst, const void* src, int bytes, bool fill) {
    if (reinterpret_cast<uintptr_t>(dst) % bytes || reinterpret_cast<uintptr_t>(src) % bytes)
        fault("cp.async of %d bytes: %p -> %p is not %d-byte aligned", bytes, src, dst, bytes);
    count_lane(REQUEST_LDGSTS, uint64_t(REQUEST_LDGSTS) << 56 | bytes, dst, fill ? src : nullptr, bytes);
    const Uncounted bookkeeping;
    ThreadCopies& mine = my_copies();
    if (mine.count == MAX_PENDING_COPIES) fault("cp.async: more than %d copies pending in one thread", MAX_PENDING_COPIES);
    Copy& copy = mine.copies[mine.count++];
    copy.dst = static_cast<uint32_t*>(dst);
    copy.words = bytes / 4;
    copy.group = mine.open_group;
    for (int i = 0; i < copy.words; ++i) {
        copy.data[i] = fill ? static_cast<const uint32_t*>(src)[i] : 0u;
        copy.dst[i] = 0xffffffffu;
    }
}

// Lands every copy of the groups older than the newest `keep` committed ones.
inline void wait_groups(int keep) {
    const Uncounted bookkeeping;
    ThreadCopies& mine = my_copies();
    int kept = 0;
    for (int i = 0; i < mine.count; ++i) {
        const Copy& copy = mine.copies[i];
        if (copy.group < mine.open_group - keep) {
            for (int w = 0; w < copy.words; ++w) copy.dst[w] = copy.data[w];
        } else {
            mine.copies[kept++] = copy;
        }
    }
    mine.count = kept;
}
}  // namespace ptx
}  // namespace cudasim

namespace cudasim {
namespace ptx {
// mma_m16n8k16<T>(d, a, b) becomes Mma{__LINE__}.run<T>(d, a, b): the collective carries its line.
struct Mma {
    int line;
    template <typename T>
    __forceinline__ void run(float (&d)[4], const ptx_u32 (&a)[4], const ptx_u32 (&b)[2]) const {
        static_assert(sizeof(T) == 2, "mma_m16n8k16 takes __half or __nv_bfloat16 inputs");
        MmaLane<T> payload{d, a, b};
        warp_collective("mma.sync.m16n8k16", line, 0xffffffffu, &payload, mma_complete<T>);
    }
};
}  // namespace ptx
}  // namespace cudasim
#define mma_m16n8k16 cudasim::ptx::Mma{__LINE__}.run
#define ldmatrix_x4(r, row) cudasim::ptx::ldmatrix_at<4, false>(__LINE__, r, row)
#define ldmatrix_x4_trans(r, row) cudasim::ptx::ldmatrix_at<4, true>(__LINE__, r, row)
#define ldmatrix_x2(r, row) cudasim::ptx::ldmatrix_at<2, false>(__LINE__, r, row)
#define ldmatrix_x2_trans(r, row) cudasim::ptx::ldmatrix_at<2, true>(__LINE__, r, row)

__forceinline__ void cp_async_16(void* dst, const void* src, bool fill) { cudasim::ptx::issue(dst, src, 16, fill); }
__forceinline__ void cp_async_8(void* dst, const void* src, bool fill) { cudasim::ptx::issue(dst, src, 8, fill); }
__forceinline__ void cp_async_commit() { ++cudasim::ptx::my_copies().open_group; }
template <int N>
__forceinline__ void cp_async_wait() { cudasim::ptx::wait_groups(N); }
#endif
