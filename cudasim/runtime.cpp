// cudasim runtime: runs a kernel's grid on one CPU thread, one fiber (own stack) per CUDA thread.
//
// Blocks run one after another. Within a block a scheduler resumes one runnable fiber at a
// time; a fiber runs until it reaches a rendezvous (__syncthreads, a warp shuffle) or exits.
// A barrier opens when every thread of the block waits at the same __syncthreads; a shuffle
// completes when every lane of its mask waits at the same shuffle. When no fiber can run and
// some have not finished, the block is stuck: that is reported as barrier or shuffle
// divergence, naming the threads involved. The order in which runnable fibers are resumed is
// the schedule (in order, reverse, seeded random, warp-greedy); correct kernels give
// bit-identical results under all of them.
//
// Shared memory: __shared__ variables are this module's thread-local storage (see cudasim.h),
// between two guards (the first thread-local of this file, linked first, and the last, in a
// unit build.py links last); before every block it is filled with 0xff bytes, a NaN in fp32,
// fp16 and bf16, so a read of a value no thread wrote shows up. Dynamic shared memory is
// checked after every block: a byte changed past the size the launch asked for is an error
// (and under AddressSanitizer the bytes past it are poisoned, so the faulting access itself is
// reported).
//
// Detectors (a build with CUDASIM_DETECTORS): every load and store of the kernel is checked
// against a shadow of shared and global memory for out-of-bounds and misaligned accesses,
// races and uninitialised shared reads (see "Hazard detection" below).
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "cudasim.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUDASIM_ASAN 1
#else
#define CUDASIM_ASAN 0
#endif

// build.py defines it for a build whose kernel unit is instrumented (the __tsan_* hooks are called)
#ifndef CUDASIM_DETECTORS
#define CUDASIM_DETECTORS 0
#endif

#if !defined(__x86_64__)
#error "cudasim's fiber switch is written for x86-64 (System V ABI)"
#endif

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace cudasim {
// Defined by the generated part of each build: the `extern __shared__` arrays of the source.
int dynamic_shared_arrays(void** bases);
extern const size_t dynamic_shared_capacity;

ThreadState* current;
extern thread_local unsigned char shared_back_guard[SHARED_GUARD_BYTES];  // build.py's last unit
uint3 block_idx, block_dim, grid_dim;
int fragment_layout;
}  // namespace cudasim

// Save the callee-saved registers on the current stack, store its pointer in *save, switch to
// the stack `load` and pop the registers saved there. A new fiber's stack is laid out so the
// final `ret` enters fiber_main.
extern "C" void cudasim_switch(void** save, void* load);
asm(R"(
    .text
    .globl cudasim_switch
    .hidden cudasim_switch
    .type cudasim_switch, @function
cudasim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudasim_switch, .-cudasim_switch
)");

namespace cudasim {
namespace {

enum class Wait { RUNNABLE, BARRIER, SHUFFLE, EXITED };
enum Schedule { IN_ORDER, REVERSE, RANDOM, WARP_GREEDY };

struct Fiber : ThreadState {
    int linear = 0;
    void* sp = nullptr;
    char* stack = nullptr;
    Wait wait = Wait::RUNNABLE;
    int line = 0;  // the barrier or shuffle it waits at
    ShuffleKind kind = SHFL_IDX;
    unsigned mask = 0;
    uint32_t value = 0, result = 0;
    int operand = 0, width = 32;
    const char* collective = nullptr;  // WARP_COLLECTIVE: its name, this lane's payload, the completion
    void* payload = nullptr;
    CollectiveFn complete = nullptr;
    const void* collective_pc = nullptr;  // the call site, to which the collective's accesses belong
};

#if CUDASIM_ASAN
constexpr size_t STACK_BYTES = 512 * 1024;  // instrumented frames are larger
#else
constexpr size_t STACK_BYTES = 128 * 1024;
#endif
constexpr size_t GUARD_BYTES = 4096;  // PROT_NONE below each stack: an overflow faults at once
constexpr size_t CANARY_BYTES = 256;  // dynamic shared bytes checked past the launch's size

struct Launch {
    void (*kernel)(void**) = nullptr;
    void** args = nullptr;
    const char* name = "";
    size_t dynamic_bytes = 0;
    Schedule schedule = IN_ORDER;
    unsigned long long seed = 0;
    std::string error;
    bool race = false;  // the error is a hazard between two threads
};

Launch launch;
std::vector<Fiber> fibers;
char* stack_pool = nullptr;
size_t stack_pool_count = 0;
void* scheduler_sp = nullptr;
Fiber* running = nullptr;
int barrier_arrivals = 0;
int shuffle_arrivals[32];  // per warp: lanes waiting at a shuffle (checked in full only when enough)
uint32_t block_number = 0;  // linear index of the running block
uint32_t barriers = 0;      // __syncthreads the running block has passed
uint32_t warp_syncs[32];    // __syncwarp each of its warps has passed
// The first thread-local of the library (this file is linked first): the guard before the
// kernel's shared variables, and how this module's thread-local (= shared) block is found.
thread_local unsigned char shared_front_guard[SHARED_GUARD_BYTES];
#if CUDASIM_ASAN
const void* scheduler_stack_bottom = nullptr;
size_t scheduler_stack_size = 0;
#endif

void fail(const char* format, ...) {
    if (!launch.error.empty()) return;  // keep the first fault
    char text[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
    launch.error = text;
}

std::string describe(const Fiber& f) {
    char text[96];
    snprintf(text, sizeof text, "thread (%u,%u,%u)", f.thread_idx.x, f.thread_idx.y, f.thread_idx.z);
    return text;
}

const char* shuffle_name(ShuffleKind kind) {
    static const char* names[] = {"__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync", "__shfl_up_sync"};
    return names[kind];
}

// What a lane waits at: a shuffle's name, or a warp collective's.
const char* rendezvous_name(const Fiber& f) { return f.kind == WARP_COLLECTIVE ? f.collective : shuffle_name(f.kind); }

std::string where(const Fiber& f) {
    char text[128];
    switch (f.wait) {
        case Wait::EXITED: return "has exited";
        case Wait::RUNNABLE: return "is running";
        case Wait::BARRIER: snprintf(text, sizeof text, "waits at __syncthreads on line %d", f.line); break;
        case Wait::SHUFFLE:
            snprintf(text, sizeof text, "waits at %s on line %d with mask 0x%08x", rendezvous_name(f), f.line, f.mask);
            break;
    }
    return text;
}

// ------------------------------------------------------------------------------------------
// Fibers

// Jump from the running context to the stack at `load` (whose usable range is bottom..+size,
// for AddressSanitizer's bookkeeping); returns when something switches back here.
void switch_stacks(void** save, void* load, const void* bottom, size_t size) {
#if CUDASIM_ASAN
    void* fake_stack = nullptr;  // lives on the stack being left, so each context keeps its own
    __sanitizer_start_switch_fiber(&fake_stack, bottom, size);
    cudasim_switch(save, load);
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
    (void)bottom, (void)size;
    cudasim_switch(save, load);
#endif
}

void settle_write();

// Back to the scheduler; returns when the scheduler resumes this fiber.
void yield_to_scheduler() {
    settle_write();
#if CUDASIM_ASAN
    switch_stacks(&running->sp, scheduler_sp, scheduler_stack_bottom, scheduler_stack_size);
#else
    switch_stacks(&running->sp, scheduler_sp, nullptr, 0);
#endif
}

[[noreturn]] void fiber_main() {
#if CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_bottom, &scheduler_stack_size);
#endif
    launch.kernel(launch.args);
    running->wait = Wait::EXITED;
    yield_to_scheduler();
    __builtin_unreachable();
}

void reserve_stacks(size_t count) {
    if (count <= stack_pool_count) return;
    if (stack_pool) munmap(stack_pool, stack_pool_count * (STACK_BYTES + GUARD_BYTES));
    const size_t bytes = count * (STACK_BYTES + GUARD_BYTES);
    stack_pool = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    for (size_t i = 0; i < count; ++i) mprotect(stack_pool + i * (STACK_BYTES + GUARD_BYTES), GUARD_BYTES, PROT_NONE);
    stack_pool_count = count;
}

// A fresh stack whose first switch "returns" into fiber_main with the ABI's stack alignment.
void prepare(Fiber& f) {
    f.stack = stack_pool + f.linear * (STACK_BYTES + GUARD_BYTES) + GUARD_BYTES;
    void** top = reinterpret_cast<void**>(f.stack + STACK_BYTES);
    *--top = nullptr;                                    // fiber_main's (unused) return address
    *--top = reinterpret_cast<void*>(&fiber_main);      // popped by cudasim_switch's `ret`
    for (int i = 0; i < 6; ++i) *--top = nullptr;       // rbp rbx r12 r13 r14 r15
    f.sp = top;
}

void resume(Fiber& f) {
    running = &f;
    current = &f;
    switch_stacks(&scheduler_sp, f.sp, f.stack, STACK_BYTES);
}

// ------------------------------------------------------------------------------------------
// Shared memory

struct TlsBlock {
    unsigned char* base = nullptr;
    size_t size = 0;
};

int find_tls(struct dl_phdr_info* info, size_t, void* out) {
    auto* block = static_cast<TlsBlock*>(out);
    auto* data = static_cast<unsigned char*>(info->dlpi_tls_data);
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type == PT_TLS && data && data <= shared_front_guard && shared_front_guard < data + ph.p_memsz) {
            block->base = data;
            block->size = ph.p_memsz;
            return 1;
        }
    }
    return 0;
}

TlsBlock shared_block() {
    shared_front_guard[0] = 0;  // the block is allocated lazily, on the first access from this thread
    TlsBlock block;
    dl_iterate_phdr(find_tls, &block);
    return block;
}

void poison_shared(const TlsBlock& block) { memset(block.base, 0xff, block.size); }

void check_dynamic_tail(void* const* bases, int count) {
    const size_t end = std::min(launch.dynamic_bytes + CANARY_BYTES, dynamic_shared_capacity);
    for (int a = 0; a < count; ++a) {
        const auto* bytes = static_cast<const unsigned char*>(bases[a]);
        for (size_t i = launch.dynamic_bytes; i < end; ++i) {
            if (bytes[i] != 0xff) {
                fail("wrote past the end of dynamic shared memory: the launch asked for %zu bytes, byte %zu was written",
                     launch.dynamic_bytes, i);
                return;
            }
        }
    }
}

void asan_poison_dynamic_tail(void* const* bases, int count, bool poison) {
#if CUDASIM_ASAN
    for (int a = 0; a < count; ++a) {
        char* tail = static_cast<char*>(bases[a]) + launch.dynamic_bytes;
        const size_t bytes = dynamic_shared_capacity - launch.dynamic_bytes;
        if (poison) ASAN_POISON_MEMORY_REGION(tail, bytes);
        else ASAN_UNPOISON_MEMORY_REGION(tail, bytes);
    }
#else
    (void)bases, (void)count, (void)poison;
#endif
}

// ------------------------------------------------------------------------------------------
// Hazard detection
//
// A build with detectors compiles the kernel's translation unit with -fsanitize=thread, so g++
// calls the __tsan_* hooks at the end of this file before every load and store (libtsan is not
// linked: these hooks are all there is, and they know fibers are not OS threads). Each byte of
// shared memory and of the launch's argument buffers has a shadow: its last write, its last
// read, and the last read by another thread than that one, each with the thread, its block,
// the __syncthreads and __syncwarp intervals and the instruction. Two accesses of one byte,
// at least one a write, by two threads that nothing orders (another block; the same block with
// no __syncthreads between them and, within one warp, no __syncwarp either), not both atomic,
// are a race whatever the values, as for compute-sanitizer's racecheck. A shared read of a
// byte no thread of the block has written is uninitialised. Reports name instructions as
// `<pc 0x...>` (offsets into this library); module.py turns them into source lines.

struct Access {
    uint32_t stamp = 0;      // the region's stamp when it happened: records of other blocks/launches are stale
    uint32_t block = 0;      // linear block number
    uint32_t barrier = 0;    // __syncthreads its block had passed
    uint32_t warp_sync = 0;  // __syncwarp its warp had passed
    uint32_t pc = 0;         // the instruction, as an offset into this library
    uint16_t thread = 0;     // linear thread number in the block
    bool atomic = false;
};

// Memory whose bytes are shadowed: the block's shared memory (stamped per block) or one
// argument buffer of the launch (stamped per launch).
struct Region {
    unsigned char* base = nullptr;
    size_t size = 0;
    const char* name = "";  // the kernel parameter an argument buffer was passed as
    bool shared = false;
    uint32_t stamp = 0;
    Access* writes = nullptr;
    Access* reads = nullptr;
    Access* other_reads = nullptr;
    unsigned char* before = nullptr;  // each byte's value before its last write
    unsigned char* plain = nullptr;   // whether a plain (not atomic) store wrote the byte in this launch
};

constexpr size_t SHADOW_BYTES_PER_BYTE = 3 * sizeof(Access) + 2;

// Zero pages on demand: only the shadow of bytes the kernel touches costs memory.
bool map_shadow(Region& r) {
    void* memory = mmap(nullptr, r.size * SHADOW_BYTES_PER_BYTE, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) {
        fail("the detectors cannot map %zu bytes of shadow memory for %zu bytes at %p", r.size * SHADOW_BYTES_PER_BYTE,
             r.size, (void*)r.base);
        return false;
    }
    r.writes = static_cast<Access*>(memory);
    r.reads = r.writes + r.size;
    r.other_reads = r.reads + r.size;
    r.before = reinterpret_cast<unsigned char*>(r.other_reads + r.size);
    r.plain = r.before + r.size;
    return true;
}

void unmap_shadow(Region& r) { munmap(r.writes, r.size * SHADOW_BYTES_PER_BYTE); }

bool detecting = false;     // a launch of a build with detectors is running
Region shared_region;       // mapped on the first launch, kept (the block's shared memory is fixed)
std::vector<Region> global_regions;
std::vector<Region> arguments;  // each argument buffer as passed (global_regions merges them): bounds and names
// Thread-local addresses, looked up once per launch (each lookup is a call in a shared library).
const unsigned char* shared_back = nullptr;
void* dynamic_bases[16];
int dynamic_arrays = 0;
uint32_t next_stamp = 0;
Fiber* acting = nullptr;    // a warp collective's accesses are those of this lane (else: the running fiber)
const unsigned char* collective_frames = nullptr;  // while a warp collective completes: the top of its frames
int atomic_depth = 0;       // inside an atomic function

struct PendingWrite {  // a racing write, reported once its value is stored
    bool active = false;
    const Region* region = nullptr;
    Access earlier, later;
    bool after_write = false;  // else after a read
    const unsigned char* address = nullptr;
    size_t size = 0;
    unsigned char old[16];
};
PendingWrite pending;

// Float atomicAdds per word of global memory: how many, and the largest magnitude a sum reached.
// After a launch, the words no plain store wrote are kept for the schedule comparison.
struct AtomicSum {
    size_t size = 0;
    uint32_t adds = 0;
    double largest = 0;
};
std::unordered_map<const unsigned char*, AtomicSum> atomic_sums;
std::vector<std::pair<const unsigned char*, AtomicSum>> atomic_results;  // of the last launch

uint32_t stamp() { return ++next_stamp ? next_stamp : ++next_stamp; }  // never 0, the stamp of "no access"

uint32_t pc_offset(const void* pc) {
    static const uintptr_t base = [] {
        Dl_info info;
        dladdr(reinterpret_cast<void*>(&map_shadow), &info);
        return reinterpret_cast<uintptr_t>(info.dli_fbase);
    }();
    return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(pc) - base - 1);  // -1: the call, not the return address
}

Region* region_of(const void* address) {
    const auto* byte = static_cast<const unsigned char*>(address);
    if (byte >= shared_region.base && byte < shared_region.base + shared_region.size) return &shared_region;
    for (Region& r : global_regions)
        if (byte >= r.base && byte < r.base + r.size) return &r;
    return nullptr;
}

Access now(const Region& r, const void* pc) {
    const Fiber& f = acting ? *acting : *running;
    Access a;
    a.stamp = r.stamp;
    a.block = block_number;
    a.barrier = barriers;
    a.warp_sync = warp_syncs[f.linear >> 5];
    a.pc = pc_offset(acting ? acting->collective_pc : pc);
    a.thread = static_cast<uint16_t>(f.linear);
    a.atomic = atomic_depth > 0;
    return a;
}

bool same_thread(const Access& a, const Access& b) { return a.thread == b.thread && a.block == b.block; }
bool same_warp(const Access& a, const Access& b) { return a.block == b.block && a.thread >> 5 == b.thread >> 5; }

// Does a barrier (or, within a warp, a __syncwarp) separate `earlier` from `later`?
bool ordered(const Access& earlier, const Access& later) {
    if (earlier.block != later.block) return false;
    return earlier.barrier != later.barrier || (same_warp(earlier, later) && earlier.warp_sync != later.warp_sync);
}

bool races(const Region& r, const Access& earlier, const Access& later) {
    return earlier.stamp == r.stamp && !same_thread(earlier, later) && !(earlier.atomic && later.atomic) &&
           !ordered(earlier, later);
}

std::string thread_name(const Access& a) {
    char text[96];
    const unsigned x = a.thread % block_dim.x, y = a.thread / block_dim.x % block_dim.y, z = a.thread / (block_dim.x * block_dim.y);
    int n = snprintf(text, sizeof text, "thread (%u,%u,%u)", x, y, z);
    if (a.block != block_number)
        snprintf(text + n, sizeof text - n, " of block (%u,%u,%u)", a.block % grid_dim.x, a.block / grid_dim.x % grid_dim.y,
                 a.block / (grid_dim.x * grid_dim.y));
    return text;
}

std::string place(const Region& r, const unsigned char* address) {
    char text[160];
    if (!r.shared) {
        snprintf(text, sizeof text, "%p (%s + %zu bytes)", (const void*)address, r.name, (size_t)(address - r.base));
        return text;
    }
    void* bases[16];
    const int arrays = dynamic_shared_arrays(bases);
    for (int a = 0; a < arrays; ++a) {
        const auto* base = static_cast<const unsigned char*>(bases[a]);
        if (address >= base && address < base + dynamic_shared_capacity) {
            snprintf(text, sizeof text, "%p (dynamic shared memory + %zu bytes)", (const void*)address, (size_t)(address - base));
            return text;
        }
    }
    snprintf(text, sizeof text, "%p (static shared memory + %zu bytes)", (const void*)address,
             (size_t)(address - r.base - SHARED_GUARD_BYTES));
    return text;
}

// The bytes as one little-endian number (the first 8 of a wider access).
std::string hex(const unsigned char* bytes, size_t size) {
    unsigned long long value = 0;
    const size_t shown = std::min<size_t>(size, 8);
    for (size_t i = 0; i < shown; ++i) value |= (unsigned long long)bytes[i] << (8 * i);
    char text[40];
    snprintf(text, sizeof text, "0x%0*llx%s", (int)(2 * shown), value, size > shown ? "..." : "");
    return text;
}

// Why nothing orders the two accesses.
const char* unordered(const Access& earlier, const Access& later) {
    if (earlier.block != later.block) return "blocks of one launch are not ordered";
    return same_warp(earlier, later) ? "no __syncwarp or __syncthreads between them" : "no __syncthreads between them";
}

// "shared memory race (write after read, same value): thread (1,0,0) writes 4 bytes at ..."
std::string race_head(const char* kind, bool same_value, const Region& r, const Access& later, const char* verb,
                      const unsigned char* address, size_t size) {
    char text[512];
    snprintf(text, sizeof text, "%s memory race (%s%s): %s %s %zu bytes at %s on <pc 0x%x>", r.shared ? "shared" : "global",
             kind, same_value ? ", same value" : "", thread_name(later).c_str(), verb, size, place(r, address).c_str(),
             later.pc);
    return text;
}

void report_race(const std::string& message) {
    fail("%s", message.c_str());
    launch.race = true;
}

// A read by `later` of bytes `earlier` wrote: the values before and after that write.
void report_read_after_write(const Region& r, const Access& earlier, const Access& later, const unsigned char* address,
                             size_t size) {
    unsigned char old[16];
    const size_t first = address - r.base, shown = std::min<size_t>(size, sizeof old);
    for (size_t i = 0; i < shown; ++i) {
        const Access& w = r.writes[first + i];
        old[i] = w.pc == earlier.pc && same_thread(w, earlier) ? r.before[first + i] : address[i];
    }
    char tail[256];
    snprintf(tail, sizeof tail, "; %s wrote them on <pc 0x%x> (%s -> %s), %s", thread_name(earlier).c_str(), earlier.pc,
             hex(old, shown).c_str(), hex(address, shown).c_str(), unordered(earlier, later));
    report_race(race_head("read after write", memcmp(old, address, shown) == 0, r, later, "reads", address, size) + tail);
}

// A write racing with `earlier`: reported by settle_write once the new value is stored.
void defer_write_report(const Region& r, const Access& earlier, const Access& later, bool after_write,
                        const unsigned char* address, size_t size) {
    pending.active = true;
    pending.region = &r;
    pending.earlier = earlier;
    pending.later = later;
    pending.after_write = after_write;
    pending.address = address;
    pending.size = std::min<size_t>(size, sizeof pending.old);
    memcpy(pending.old, address, pending.size);
}

void settle_write() {
    if (!pending.active) return;
    pending.active = false;
    const PendingWrite& p = pending;
    char tail[320];
    snprintf(tail, sizeof tail, " (%s -> %s); %s %s them on <pc 0x%x>, %s", hex(p.old, p.size).c_str(),
             hex(p.address, p.size).c_str(), thread_name(p.earlier).c_str(), p.after_write ? "wrote" : "read", p.earlier.pc,
             unordered(p.earlier, p.later));
    report_race(race_head(p.after_write ? "write after write" : "write after read", memcmp(p.old, p.address, p.size) == 0,
                          *p.region, p.later, "writes", p.address, p.size) + tail);
}

void uninitialised_read(const Region& r, const Access& reader, const unsigned char* address, size_t size) {
    fail("uninitialised shared memory read: %s reads %zu bytes at %s on <pc 0x%x>, which no thread of this block has written",
         thread_name(reader).c_str(), size, place(r, address).c_str(), reader.pc);
}

// ------------------------------------------------------------------------------------------
// Bounds and alignment
//
// A block's shared variables lie between two guards of SHARED_GUARD_BYTES; the launcher copies
// the argument buffers of a launch with detectors into mappings of their own, between guards of
// MEMORY_GUARD_BYTES of reserved address space (cudasim_map_guarded, cudasim/module.py). An
// access in a guard, in dynamic shared memory past what the launch asked for, or anywhere else
// the kernel has no business (permitted_elsewhere) is out of bounds, as for compute-sanitizer's
// memcheck; an access through a pointer of an aligned type (the hooks without "unaligned") at an
// address that is not a multiple of its size is misaligned. Both are reported before the access
// happens, and the thread goes no further: the host's memory is never touched.

// Of a thread-local block of `block_bytes`: less the dynamic arrays and the two guards.
size_t static_shared_bytes(size_t block_bytes) {
    void* bases[16];
    return block_bytes - dynamic_shared_arrays(bases) * dynamic_shared_capacity - 2 * SHARED_GUARD_BYTES;
}

// Memory the kernel's code may touch besides shared memory (the library's thread-local block) and
// the argument buffers, which the detectors shadow; everything else is out of bounds, however far
// from a buffer it lies (heap, other libraries, other threads' stacks):
// * the running thread's own fiber stack (its locals); while a warp collective completes, which
//   happens on the scheduler's stack (resolve_collective), its frames there and the stacks of the
//   warp's lanes, where their fragments and payloads are (mma.h);
// * reading threadIdx: the running fiber's ThreadState, which the prelude reads through `current`;
// * the library's PT_LOAD segments: __device__ globals, string literals, constant tables (mma.h's
//   multipliers), and the runtime variables the prelude reads (`current`, blockIdx, blockDim,
//   gridDim, fragment_layout); only reads in the read-only ones (code, constants, and the part
//   the loader protects after relocation, PT_GNU_RELRO), where a store would fault.
// The launch's glue reads the argument values it is given, uninstrumented (build.py); printf,
// assert and libm are not compiled with the hooks, so what they touch is not checked.
struct Span {
    uintptr_t low = 0, high = 0;
    bool writable = false;
};

bool within(uintptr_t low, uintptr_t high, const unsigned char* p, size_t size) {
    const auto address = reinterpret_cast<uintptr_t>(p);
    return address >= low && address + size <= high;
}

bool on_stack_of(const Fiber& f, const unsigned char* p, size_t size) {
    const auto stack = reinterpret_cast<uintptr_t>(f.stack);
    return within(stack, stack + STACK_BYTES, p, size);
}

// On the stack of a lane of the running thread's warp.
bool on_warp_stack(const unsigned char* p, size_t size) {
    if (p < reinterpret_cast<const unsigned char*>(stack_pool)) return false;
    const size_t owner = (p - reinterpret_cast<const unsigned char*>(stack_pool)) / (STACK_BYTES + GUARD_BYTES);
    const size_t first = running->linear & ~31;
    return owner >= first && owner < std::min(first + 32, fibers.size()) && on_stack_of(fibers[owner], p, size);
}

// The PT_LOAD segments of the object `info` describes, the read-only part of a writable one (its
// PT_GNU_RELRO) split off, if that object is this library.
int find_static_segments(struct dl_phdr_info* info, size_t, void* out) {
    std::vector<Span> loads;
    Span relro;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        const Span span{info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz, (ph.p_flags & PF_W) != 0};
        if (ph.p_type == PT_LOAD) loads.push_back(span);
        if (ph.p_type == PT_GNU_RELRO) relro = span;
    }
    const auto here = reinterpret_cast<const unsigned char*>(&find_static_segments);
    if (std::none_of(loads.begin(), loads.end(), [here](const Span& s) { return within(s.low, s.high, here, 1); })) return 0;
    auto& segments = *static_cast<std::vector<Span>*>(out);
    for (const Span& s : loads) {
        const uintptr_t low = std::max(s.low, relro.low), high = std::min(s.high, relro.high);
        if (!s.writable || low >= high) {
            segments.push_back(s);
            continue;
        }
        segments.insert(segments.end(), {{s.low, low, true}, {low, high, false}, {high, s.high, true}});
    }
    return 1;
}

// This library's PT_LOAD segments, found once.
const std::vector<Span>& static_segments() {
    static const std::vector<Span> segments = [] {
        std::vector<Span> found;
        dl_iterate_phdr(find_static_segments, &found);
        return found;
    }();
    return segments;
}

bool permitted_elsewhere(const unsigned char* p, size_t size, bool write) {
    if (collective_frames) {
        // this function's frame lies below the collective's: its frames are those in between
        const auto below = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
        if (within(below, reinterpret_cast<uintptr_t>(collective_frames), p, size) || on_warp_stack(p, size)) return true;
    } else if (on_stack_of(*running, p, size)) {
        return true;
    }
    const auto thread_state = reinterpret_cast<uintptr_t>(static_cast<ThreadState*>(running));
    if (!write && within(thread_state, thread_state + sizeof(ThreadState), p, size)) return true;
    for (const Span& s : static_segments())
        if ((s.writable || !write) && within(s.low, s.high, p, size)) return true;
    return false;
}

// "float* out + 400 bytes, outside its 400 bytes" (written to `text`) for bytes [p, p + size) that
// leave shared memory or the argument buffers (naming the nearest buffer, however far away) and
// lie in no other memory the kernel may touch (permitted_elsewhere); nullptr for bytes in bounds.
// `region` is the one p lies in (region_of); an access inside it is the common, quick case, which
// builds no text: every load and store of a kernel comes here.
const char* outside(const unsigned char* p, size_t size, bool write, const Region* region, char (&text)[200]) {
    if (region && region->shared) {
        const unsigned char *front = shared_region.base, *back = shared_back;
        if (p < front + SHARED_GUARD_BYTES || p + size > back) {
            const size_t variables = static_shared_bytes(shared_region.size);
            const long long offset = p < back ? (long long)(p - front - SHARED_GUARD_BYTES) : (long long)(variables + (p - back));
            snprintf(text, sizeof text, "static shared memory %c %lld bytes, outside its %zu bytes", offset < 0 ? '-' : '+',
                     std::llabs(offset), variables);
            return text;
        }
        for (int a = 0; a < dynamic_arrays; ++a) {
            const auto* base = static_cast<const unsigned char*>(dynamic_bases[a]);
            if (p + size > base && p < base + dynamic_shared_capacity && p + size > base + launch.dynamic_bytes) {
                snprintf(text, sizeof text, "dynamic shared memory + %zu bytes, outside the %zu bytes the launch asked for",
                         (size_t)(p - base), launch.dynamic_bytes);
                return text;
            }
        }
        return nullptr;
    }
    if (region ? p + size <= region->base + region->size : permitted_elsewhere(p, size, write)) return nullptr;
    const Region* nearest = nullptr;
    long long nearest_distance = std::numeric_limits<long long>::max();
    for (const Region& a : arguments) {
        const long long distance = std::max(a.base - p, p + size - (a.base + a.size));  // > 0: bytes outside it
        if (distance > 0 && distance < nearest_distance) nearest = &a, nearest_distance = distance;
    }
    if (!nearest) return "the launch passed no buffer";
    const long long offset = p - nearest->base;
    snprintf(text, sizeof text, "%s %c %lld bytes, outside its %zu bytes", nearest->name, offset < 0 ? '-' : '+',
             std::llabs(offset), nearest->size);
    return text;
}

// Thrown out of a warp collective's completion, which runs on the scheduler's stack: it cannot
// yield to the scheduler, so it unwinds to it (resolve_collective).
struct CollectiveStopped {};

// The launch fails with `message`; the running thread (or warp collective) stops before its
// access happens.
[[noreturn]] void stop_at(const std::string& message) {
    fail("%s", message.c_str());
    if (collective_frames) throw CollectiveStopped();
    running->wait = Wait::EXITED;
    yield_to_scheduler();  // the launch has failed: nothing resumes this thread
    __builtin_unreachable();
}

[[noreturn, gnu::cold, gnu::noinline]] void stop_out_of_bounds(const unsigned char* p, size_t size, bool write, const void* pc,
                                                              const Region* r, const char* where) {
    const Access access = now(shared_region, pc);
    const char* kind = r && r->shared ? "shared" : "global";
    char text[512];
    if (where) {
        snprintf(text, sizeof text, "out-of-bounds %s memory %s: %s %s %zu bytes at %p (%s) on <pc 0x%x>", kind,
                 write ? "write" : "read", thread_name(access).c_str(), write ? "writes" : "reads", size, (const void*)p,
                 where, access.pc);
    } else {
        snprintf(text, sizeof text, "misaligned %s memory %s: %s %s %zu bytes at %s on <pc 0x%x>, which a GPU requires to be "
                 "%zu-byte aligned", kind, write ? "write" : "read", thread_name(access).c_str(), write ? "writes" : "reads",
                 size, place(*r, p).c_str(), access.pc, size);
    }
    stop_at(text);
}

void check_bounds(const unsigned char* p, size_t size, bool write, const void* pc, bool aligned, const Region* r) {
    char text[200];
    const char* where = outside(p, size, write, r, text);
    const bool misaligned = aligned && r && (reinterpret_cast<uintptr_t>(p) & (size - 1));  // sizes 1 to 16, powers of 2
    if (where || misaligned) stop_out_of_bounds(p, size, write, pc, r, where);
}

// ------------------------------------------------------------------------------------------
// Counters
//
// With counting on (cudasim_count), a launch of a build with detectors counts what Nsight
// Compute counts, under the name of the ncu metric each stands for (COUNTERS). A warp's memory
// instruction is one request: the lanes' accesses from one instruction of the kernel's code (the
// hook's return address, or a PTX emulation's call site), the k-th of each lane's accesses there
// forming the k-th request of the warp (lanes run the same code, so in step; a divergent loop,
// whose lanes run it a different number of times, is still grouped by trip). Requests are
// gathered per block and measured when it ends:
// * shared memory: 32 banks of 4 bytes. An access of up to 4 bytes a lane is served for the whole
//   warp at once, one of 8 bytes half a warp at a time (2 phases of 16 lanes), one of 16 bytes a
//   quarter warp at a time (4 phases of 8 lanes): ldmatrix (8 row addresses a matrix) and
//   cp.async's 16-byte shared writes alike. A phase needs as many wavefronts as the most distinct
//   4-byte words one bank must deliver (lanes reading one word share it: a broadcast); its ideal
//   is 1, and the excess is ncu's bank conflicts.
// * global memory: a request touches the 32-byte sectors its lanes' bytes fall in; lanes that
//   read one sector share it (coalescing).
// Atomics, and the emulation's own bookkeeping (the uncounted scope), count as nothing.
#define CUDASIM_COUNTERS(X)                                                                                        \
    X(SHARED_LD_REQUESTS, "smsp__inst_executed_op_shared_ld.sum")                                                  \
    X(SHARED_LD_WAVEFRONTS, "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum")                                \
    X(SHARED_LD_CONFLICTS, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum")                             \
    X(SHARED_ST_REQUESTS, "smsp__inst_executed_op_shared_st.sum")                                                  \
    X(SHARED_ST_WAVEFRONTS, "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum")                                \
    X(SHARED_ST_CONFLICTS, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum")                             \
    X(LDSM_REQUESTS, "smsp__inst_executed_op_ldsm.sum")                                                            \
    X(LDSM_WAVEFRONTS, "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum")                                   \
    X(LDSM_CONFLICTS, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum")                                \
    X(LDGSTS_REQUESTS, "smsp__inst_executed_op_ldgsts.sum")                                                        \
    X(LDGSTS_SHARED_WAVEFRONTS, "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum")                        \
    X(LDGSTS_SHARED_CONFLICTS, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts.sum")                     \
    X(LDGSTS_SECTORS, "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum")                                        \
    X(LDGSTS_BYTES, "cudasim__bytes_requested_global_op_ldgsts.sum")                                               \
    X(GLOBAL_LD_REQUESTS, "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum")                                       \
    X(GLOBAL_LD_SECTORS, "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum")                                         \
    X(GLOBAL_LD_BYTES, "cudasim__bytes_requested_global_op_ld.sum")                                                \
    X(GLOBAL_ST_REQUESTS, "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum")                                       \
    X(GLOBAL_ST_SECTORS, "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum")                                         \
    X(GLOBAL_ST_BYTES, "cudasim__bytes_requested_global_op_st.sum")                                                \
    X(HMMA, "sass__inst_executed_per_opcode.HMMA")                                                                 \
    X(MUFU_EX2, "sass__inst_executed_per_opcode.MUFU.EX2")                                                         \
    X(BAR, "sass__inst_executed_per_opcode.BAR")
#define CUDASIM_COUNTER_ENUM(id, name) id,
enum Counter { CUDASIM_COUNTERS(CUDASIM_COUNTER_ENUM) COUNTER_COUNT };
#undef CUDASIM_COUNTER_ENUM

bool counting = false;  // this launch counts
uint64_t counts[COUNTER_COUNT];
int uncounted_depth = 0;

// The lanes of one request: each lane's address (and, for cp.async, its global source), as given.
struct Request {
    RequestKind kind;
    int bytes = 0;
    uint32_t lanes = 0;  // the lanes that took part
    uintptr_t address[32], source[32];
};

struct RequestKey {
    uint64_t site;
    uint32_t warp, occurrence;
    bool operator==(const RequestKey& o) const { return site == o.site && warp == o.warp && occurrence == o.occurrence; }
};
struct RequestKeyHash {
    size_t operator()(const RequestKey& k) const { return std::hash<uint64_t>()(k.site * 0x9e3779b97f4a7c15ull ^ k.warp << 20 ^ k.occurrence); }
};
std::unordered_map<RequestKey, Request, RequestKeyHash> block_requests;
std::unordered_map<RequestKey, uint32_t, RequestKeyHash> lane_occurrences;  // (site, thread, 0): its accesses there so far

// Wavefronts of a shared-memory request whose lanes access `bytes` each (see above): {wavefronts, ideal}.
std::pair<uint64_t, uint64_t> shared_wavefronts(const uintptr_t* address, uint32_t lanes, int bytes) {
    const int phase_lanes = bytes <= 4 ? 32 : 32 * 4 / bytes;
    uint64_t wavefronts = 0, ideal = 0;
    for (int first = 0; first < 32; first += phase_lanes) {
        std::vector<uintptr_t> words[32];  // per bank, the distinct words it delivers
        bool active = false;
        for (int lane = first; lane < first + phase_lanes; ++lane) {
            if (!(lanes >> lane & 1u)) continue;
            active = true;
            for (uintptr_t word = address[lane] / 4; word <= (address[lane] + bytes - 1) / 4; ++word) {
                std::vector<uintptr_t>& bank = words[word % 32];
                if (std::find(bank.begin(), bank.end(), word) == bank.end()) bank.push_back(word);
            }
        }
        size_t most = 0;
        for (const auto& bank : words) most = std::max(most, bank.size());
        wavefronts += most;
        ideal += active;
    }
    return {wavefronts, ideal};
}

// Distinct 32-byte sectors of the lanes' `bytes` each from `address` (0: a lane that reads nothing).
uint64_t sectors(const uintptr_t* address, uint32_t lanes, int bytes) {
    std::vector<uintptr_t> seen;
    for (int lane = 0; lane < 32; ++lane) {
        if (!(lanes >> lane & 1u) || !address[lane]) continue;
        for (uintptr_t s = address[lane] / 32; s <= (address[lane] + bytes - 1) / 32; ++s)
            if (std::find(seen.begin(), seen.end(), s) == seen.end()) seen.push_back(s);
    }
    return seen.size();
}

uint64_t requested_bytes(const uintptr_t* address, uint32_t lanes, int bytes) {
    uint64_t total = 0;
    for (int lane = 0; lane < 32; ++lane) total += (lanes >> lane & 1u) && address[lane] ? bytes : 0;
    return total;
}

void count_shared(const Request& r, Counter requests, Counter wavefronts, Counter conflicts) {
    const auto [found, ideal] = shared_wavefronts(r.address, r.lanes, r.bytes);
    counts[requests] += 1;
    counts[wavefronts] += found;
    counts[conflicts] += found - ideal;
}

void count_request(const Request& r) {
    switch (r.kind) {
        case REQUEST_SHARED_LD: return count_shared(r, SHARED_LD_REQUESTS, SHARED_LD_WAVEFRONTS, SHARED_LD_CONFLICTS);
        case REQUEST_SHARED_ST: return count_shared(r, SHARED_ST_REQUESTS, SHARED_ST_WAVEFRONTS, SHARED_ST_CONFLICTS);
        case REQUEST_LDSM: return count_shared(r, LDSM_REQUESTS, LDSM_WAVEFRONTS, LDSM_CONFLICTS);
        case REQUEST_LDGSTS:
            count_shared(r, LDGSTS_REQUESTS, LDGSTS_SHARED_WAVEFRONTS, LDGSTS_SHARED_CONFLICTS);
            counts[LDGSTS_SECTORS] += sectors(r.source, r.lanes, r.bytes);
            counts[LDGSTS_BYTES] += requested_bytes(r.source, r.lanes, r.bytes);
            return;
        case REQUEST_GLOBAL_LD:
        case REQUEST_GLOBAL_ST: {
            const bool load = r.kind == REQUEST_GLOBAL_LD;
            counts[load ? GLOBAL_LD_REQUESTS : GLOBAL_ST_REQUESTS] += 1;
            counts[load ? GLOBAL_LD_SECTORS : GLOBAL_ST_SECTORS] += sectors(r.address, r.lanes, r.bytes);
            counts[load ? GLOBAL_LD_BYTES : GLOBAL_ST_BYTES] += requested_bytes(r.address, r.lanes, r.bytes);
            return;
        }
        case REQUEST_EXP2: counts[MUFU_EX2] += 1; return;
    }
}

// One lane's part of a request at `site` (running thread, or a warp collective's `lane`).
void add_to_request(RequestKind kind, uint64_t site, int lane_of_warp, int thread, uintptr_t address, uintptr_t source,
                    int bytes) {
    const uint32_t occurrence = lane_occurrences[{site, static_cast<uint32_t>(thread), 0}]++;
    Request& r = block_requests[{site, static_cast<uint32_t>(thread >> 5), occurrence}];
    if (!r.lanes) r.kind = kind, r.bytes = bytes;
    r.lanes |= 1u << lane_of_warp;
    r.address[lane_of_warp] = address;
    r.source[lane_of_warp] = source;
}

// A block has ended: measure its requests.
void count_block_requests() {
    for (const auto& [key, request] : block_requests) count_request(request);
    block_requests.clear();
    lane_occurrences.clear();
}

// A plain load or store of the running thread (on_access): shared or global, by its region.
void count_access(const Region& r, const void* address, size_t size, bool write, const void* pc) {
    if (!counting || collective_frames || uncounted_depth || atomic_depth) return;
    const RequestKind kind = r.shared ? (write ? REQUEST_SHARED_ST : REQUEST_SHARED_LD)
                                      : (write ? REQUEST_GLOBAL_ST : REQUEST_GLOBAL_LD);
    add_to_request(kind, reinterpret_cast<uintptr_t>(pc), running->linear & 31, running->linear,
                   reinterpret_cast<uintptr_t>(address), 0, static_cast<int>(size));
}

// Check one access for bounds and alignment and against the shadow of its bytes, then record it there.
void on_access(const void* address, size_t size, bool write, const void* pc, bool aligned) {
    settle_write();
    if (!detecting || !running || !launch.error.empty()) return;
    const auto* bytes = static_cast<const unsigned char*>(address);
    // The running thread's own locals, first: most accesses of a kernel whose registers a warp
    // collective reads (mma, ldmatrix) are these, always in bounds and never shadowed.
    if (!collective_frames && on_stack_of(*running, bytes, size)) return;
    Region* region = region_of(address);
    check_bounds(bytes, size, write, pc, aligned, region);
    if (!region) return;  // the stack, the runtime's own data
    Region& r = *region;
    count_access(r, address, size, write, pc);
    const size_t first = bytes - r.base, last = std::min(first + size, r.size);
    const Access access = now(r, pc);
    for (size_t i = first; i < last; ++i) {
        Access &w = r.writes[i], &read = r.reads[i], &other = r.other_reads[i];
        if (write) {
            if (races(r, w, access)) return defer_write_report(r, w, access, true, bytes, size);
            if (races(r, read, access)) return defer_write_report(r, read, access, false, bytes, size);
            if (races(r, other, access)) return defer_write_report(r, other, access, false, bytes, size);
            r.before[i] = r.base[i];
            r.plain[i] |= !access.atomic;
            w = access;
        } else {
            if (races(r, w, access)) return report_read_after_write(r, w, access, bytes, size);
            if (r.shared && w.stamp != r.stamp) return uninitialised_read(r, access, bytes, size);
            if (read.stamp == r.stamp && !same_thread(read, access)) other = read;
            read = access;
        }
    }
}

// Before a launch: shadow the shared memory (once) and the argument buffers (merged where
// they overlap, so each byte has one shadow).
void start_detecting(const TlsBlock& shared, const void* const* bases, const size_t* sizes, const char* const* names,
                     int count) {
    detecting = true;
    if (!shared_region.writes) {
        shared_region.base = shared.base;
        shared_region.size = shared.size;
        shared_region.shared = true;
        if (!map_shadow(shared_region)) shared_region = Region();
    }
    std::vector<Region> buffers;
    for (int i = 0; i < count; ++i) {
        if (!sizes[i]) continue;
        Region r;
        r.base = static_cast<unsigned char*>(const_cast<void*>(bases[i]));
        r.size = sizes[i];
        r.name = names[i];
        buffers.push_back(r);
    }
    std::sort(buffers.begin(), buffers.end(), [](const Region& a, const Region& b) { return a.base < b.base; });
    arguments = buffers;
    shared_back = shared_back_guard;
    dynamic_arrays = dynamic_shared_arrays(dynamic_bases);
    atomic_sums.clear();
    const uint32_t launch_stamp = stamp();
    for (Region& r : buffers) {
        if (!global_regions.empty() && r.base < global_regions.back().base + global_regions.back().size) {
            Region& last = global_regions.back();
            last.size = std::max<size_t>(last.size, r.base + r.size - last.base);
            continue;
        }
        r.stamp = launch_stamp;
        global_regions.push_back(r);
    }
    global_regions.erase(std::remove_if(global_regions.begin(), global_regions.end(), [](Region& r) { return !map_shadow(r); }),
                         global_regions.end());
}

// The float atomic sums of words no plain store wrote (read by the launcher after the launch).
void keep_atomic_sums() {
    atomic_results.clear();
    for (const auto& [word, sum] : atomic_sums) {
        const Region* r = region_of(word);
        if (r && std::none_of(r->plain + (word - r->base), r->plain + (word - r->base) + sum.size, [](unsigned char b) { return b; }))
            atomic_results.emplace_back(word, sum);
    }
}

void stop_detecting() {
    keep_atomic_sums();
    for (Region& r : global_regions) unmap_shadow(r);
    global_regions.clear();
    arguments.clear();
    detecting = false;
    acting = nullptr;
    atomic_depth = 0;
    pending.active = false;
}

// ------------------------------------------------------------------------------------------
// Rendezvous

Fiber& lane_fiber(const Fiber& f, int lane) { return fibers[(f.linear & ~31) + lane]; }

int source_lane(const Fiber& f, int lane) {
    const int base = lane & ~(f.width - 1), operand = f.operand;
    switch (f.kind) {
        case SHFL_IDX: return base + (operand & (f.width - 1));
        case SHFL_XOR: {
            const int source = lane ^ operand;
            return source >= base + f.width ? lane : source;  // later groups: own value (guide)
        }
        case SHFL_DOWN: return lane + operand < base + f.width ? lane + operand : lane;
        case SHFL_UP: return lane - operand >= base ? lane - operand : lane;
    }
    return lane;
}

// Every lane of `f`'s shuffle is there: hand each its source lane's value.
void resolve_shuffle(const Fiber& f) {
    for (int lane = 0; lane < 32; ++lane) {
        if (!(f.mask >> lane & 1u)) continue;
        Fiber& reader = lane_fiber(f, lane);
        const int source = source_lane(reader, lane);
        if (!(f.mask >> source & 1u)) {
            fail("%s on line %d: lane %d reads lane %d, which is not in the mask 0x%08x (undefined on a GPU)",
                 shuffle_name(f.kind), f.line, lane, source, f.mask);
            return;
        }
        reader.result = lane_fiber(f, source).value;
    }
}

// Every lane of `f`'s warp collective is there: run it once, on all their payloads.
void resolve_collective(const Fiber& f) {
    void* payloads[32] = {};
    for (int lane = 0; lane < 32; ++lane)
        if (f.mask >> lane & 1u) payloads[lane] = lane_fiber(f, lane).payload;
    collective_frames = static_cast<const unsigned char*>(__builtin_frame_address(0));  // payloads lies below it
    try {
        f.complete(payloads, f.line);
    } catch (const CollectiveStopped&) {
        // an access out of bounds: the launch has failed, and the warp goes no further
    }
    collective_frames = nullptr;
}

// All lanes of `f`'s mask wait at the same shuffle or warp collective: complete it.
bool try_complete_shuffle(Fiber& f) {
    int& arrivals = shuffle_arrivals[f.linear >> 5];
    if (++arrivals < __builtin_popcount(f.mask)) return false;
    for (int lane = 0; lane < 32; ++lane) {
        if (!(f.mask >> lane & 1u)) continue;
        const Fiber& other = lane_fiber(f, lane);
        if (other.wait != Wait::SHUFFLE) return false;  // not there yet (or stuck elsewhere)
        if (other.line != f.line || other.mask != f.mask || other.collective != f.collective) return false;
    }
    if (f.kind == WARP_COLLECTIVE) resolve_collective(f);
    else resolve_shuffle(f);
    if (!launch.error.empty()) return false;
    for (int lane = 0; lane < 32; ++lane)
        if (f.mask >> lane & 1u) lane_fiber(f, lane).wait = Wait::RUNNABLE;
    arrivals -= __builtin_popcount(f.mask);
    return true;
}

void try_open_barrier(int threads) {
    if (barrier_arrivals < threads) return;
    for (Fiber& f : fibers) {
        if (f.line != fibers[0].line) {
            fail("barrier divergence: %s waits at __syncthreads on line %d, %s at line %d", describe(fibers[0]).c_str(),
                 fibers[0].line, describe(f).c_str(), f.line);
            return;
        }
    }
    for (Fiber& f : fibers) f.wait = Wait::RUNNABLE;
    barrier_arrivals = 0;
    ++barriers;
    if (counting) counts[BAR] += (threads + 31) / 32;  // each warp executes the barrier
}

// No fiber can run but some have not exited: say which rendezvous can never complete.
void diagnose_stuck() {
    for (const Fiber& f : fibers) {
        if (f.wait != Wait::SHUFFLE) continue;
        for (int lane = 0; lane < 32; ++lane) {
            const Fiber& other = lane_fiber(f, lane);
            if ((f.mask >> lane & 1u) && !(other.wait == Wait::SHUFFLE && other.line == f.line && other.mask == f.mask &&
                                           other.collective == f.collective)) {
                fail("divergent %s: %s %s, but lane %d (%s) %s", f.kind == WARP_COLLECTIVE ? "warp collective" : "shuffle",
                     describe(f).c_str(), where(f).c_str(), lane,
                     describe(other).c_str(), where(other).c_str());
                return;
            }
        }
    }
    const Fiber* waiting = nullptr;
    for (const Fiber& f : fibers)
        if (f.wait == Wait::BARRIER) waiting = waiting ? waiting : &f;
    for (const Fiber& f : fibers) {
        if (f.wait == Wait::EXITED && waiting) {
            fail("barrier divergence: %s waits at __syncthreads on line %d, but %s has exited without reaching it",
                 describe(*waiting).c_str(), waiting->line, describe(f).c_str());
            return;
        }
    }
    fail("deadlock: no thread can run");
}

// ------------------------------------------------------------------------------------------
// Scheduling

struct Scheduler {
    std::vector<int> round;
    size_t position = 0;
    int warp = -1;
    std::mt19937_64 random;

    explicit Scheduler(unsigned long long seed) : random(seed) {}

    Fiber* next() { return launch.schedule == WARP_GREEDY ? next_warp_greedy() : next_in_round(); }

    // Rounds: every runnable fiber once, in the schedule's order, then a new round.
    Fiber* next_in_round() {
        for (int attempt = 0; attempt < 2; ++attempt) {
            while (position < round.size()) {
                Fiber& f = fibers[round[position++]];
                if (f.wait == Wait::RUNNABLE) return &f;
            }
            round.clear();
            position = 0;
            for (const Fiber& f : fibers)
                if (f.wait == Wait::RUNNABLE) round.push_back(f.linear);
            if (launch.schedule == REVERSE) std::reverse(round.begin(), round.end());
            if (launch.schedule == RANDOM) std::shuffle(round.begin(), round.end(), random);
        }
        return nullptr;
    }

    // One warp (the highest first) runs as far as it can before the next one starts.
    Fiber* next_warp_greedy() {
        const int warps = (static_cast<int>(fibers.size()) + 31) / 32;
        if (warp < 0) warp = warps - 1;
        for (int tried = 0; tried <= warps; ++tried) {
            const int first = warp * 32, last = std::min(first + 32, static_cast<int>(fibers.size()));
            for (int i = first; i < last; ++i)
                if (fibers[i].wait == Wait::RUNNABLE) return &fibers[i];
            warp = (warp + warps - 1) % warps;
        }
        return nullptr;
    }
};

void run_block(const uint3& block, int threads) {
    block_idx = block;
    barrier_arrivals = 0;
    std::fill(std::begin(shuffle_arrivals), std::end(shuffle_arrivals), 0);
    for (int t = 0; t < threads; ++t) {
        Fiber& f = fibers[t];
        f = Fiber();
        f.linear = t;
        f.thread_idx = {t % block_dim.x, t / block_dim.x % block_dim.y, t / (block_dim.x * block_dim.y)};
        prepare(f);
    }
    block_number = (block.z * grid_dim.y + block.y) * grid_dim.x + block.x;
    barriers = 0;
    std::fill(std::begin(warp_syncs), std::end(warp_syncs), 0);
    Scheduler scheduler(launch.seed * 0x9e3779b97f4a7c15ull + block_number);
    int exited = 0;
    while (exited < threads && launch.error.empty()) {
        Fiber* f = scheduler.next();
        if (!f) {
            diagnose_stuck();
            break;
        }
        resume(*f);
        if (f->wait == Wait::EXITED) ++exited;
        else if (f->wait == Wait::BARRIER) ++barrier_arrivals, try_open_barrier(threads);
        else if (f->wait == Wait::SHUFFLE) try_complete_shuffle(*f);
    }
}

// The order blocks run in: the schedule's, so races between blocks show up too.
std::vector<uint3> block_order() {
    std::vector<uint3> order;
    for (unsigned z = 0; z < grid_dim.z; ++z)
        for (unsigned y = 0; y < grid_dim.y; ++y)
            for (unsigned x = 0; x < grid_dim.x; ++x) order.push_back({x, y, z});
    if (launch.schedule == REVERSE) std::reverse(order.begin(), order.end());
    if (launch.schedule == RANDOM) std::shuffle(order.begin(), order.end(), std::mt19937_64(launch.seed));
    return order;
}

#if CUDASIM_ASAN
void report_fault_location() {
    if (running)
        fprintf(stderr, "cudasim: the fault above happened in kernel %s, block (%u,%u,%u), %s\n", launch.name,
                block_idx.x, block_idx.y, block_idx.z, describe(*running).c_str());
}
#endif

}  // namespace

void syncthreads(int line) {
    running->wait = Wait::BARRIER;
    running->line = line;
    yield_to_scheduler();
}

namespace {
// The checks every warp rendezvous makes on its caller and mask; the running fiber then waits.
Fiber& arrive(const char* name, int line, unsigned mask) {
    Fiber& f = *running;
    const int lane = f.linear & 31, warp_first = f.linear & ~31;
    if (!(mask >> lane & 1u)) fail("%s on line %d: %s calls it but is not in its mask 0x%08x", name, line, describe(f).c_str(), mask);
    const int lanes = std::min(32, static_cast<int>(fibers.size()) - warp_first);
    if (lanes < 32 && (mask >> lanes))
        fail("%s on line %d: mask 0x%08x names lane %d, but the block has %zu threads (not whole warps)",
             name, line, mask, __builtin_ctz(mask >> lanes) + lanes, fibers.size());
    f.wait = Wait::SHUFFLE;
    f.line = line;
    f.mask = mask;
    f.collective = nullptr;  // a shuffle; warp_collective names itself
    return f;
}
}  // namespace

uint32_t shuffle(ShuffleKind kind, int line, unsigned mask, uint32_t value, int operand, int width) {
    if (width < 1 || width > 32 || (width & (width - 1))) fail("%s on line %d: width %d is not a power of 2 <= 32", shuffle_name(kind), line, width);
    Fiber& f = arrive(shuffle_name(kind), line, mask);
    f.kind = kind;
    f.value = value;
    f.operand = operand;
    f.width = width;
    yield_to_scheduler();
    return f.result;
}

void warp_collective(const char* name, int line, unsigned mask, void* payload, CollectiveFn complete) {
    Fiber& f = arrive(name, line, mask);
    f.collective_pc = __builtin_return_address(0);
    f.kind = WARP_COLLECTIVE;
    f.collective = name;
    f.payload = payload;
    f.complete = complete;
    yield_to_scheduler();
}

void syncwarp(int line, unsigned mask) {
    // completed by the last lane to arrive, which is of the same warp
    warp_collective("__syncwarp", line, mask, nullptr, [](void* const*, int) { ++warp_syncs[running->linear >> 5]; });
}

void act_as_lane(int lane) {
    settle_write();
    acting = lane < 0 ? nullptr : &lane_fiber(*running, lane);
}

void atomic_scope(bool enter) { atomic_depth += enter ? 1 : -1; }

void uncounted(bool enter) { uncounted_depth += enter ? 1 : -1; }

void count_lane(RequestKind kind, uint64_t site, const void* address, const void* source, int bytes) {
    if (counting && !uncounted_depth)
        add_to_request(kind, site, running->linear & 31, running->linear, reinterpret_cast<uintptr_t>(address),
                       reinterpret_cast<uintptr_t>(source), bytes);
}

void count_warp(RequestKind kind, const void* const* addresses, int lanes, int bytes) {
    if (!counting) return;
    Request r;
    r.kind = kind;
    r.bytes = bytes;
    for (int lane = 0; lane < lanes; ++lane) {
        r.lanes |= 1u << lane;
        r.address[lane] = reinterpret_cast<uintptr_t>(addresses[lane]);
    }
    count_request(r);
}

void count_mma() {
    if (counting) counts[HMMA] += 1;
}

void atomic_float_add(const void* address, size_t size, double magnitude) {
    const auto* word = static_cast<const unsigned char*>(address);
    const Region* region = detecting ? region_of(word) : nullptr;
    if (!region || region->shared) return;  // shared memory ends with its block: no result to compare
    AtomicSum& sum = atomic_sums[word];
    sum.size = size;
    sum.adds += 1;
    sum.largest = std::max(sum.largest, magnitude);
}

void fault(const char* format, ...) {
    char text[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
    fail("%s", text);
}

}  // namespace cudasim

using namespace cudasim;

// Runs kernel(args) over the grid. Returns 0, or 1 with the fault in `error`
// ("block (x,y,z): ..."). schedule: 0 in order, 1 reverse, 2 seeded random, 3 warp-greedy.
// With detectors, the argument buffers are given as `buffers` (base, bytes, parameter name):
// global memory whose accesses are checked. Returns 2 for a race between threads.
EXPORT int cudasim_launch(void (*kernel)(void**), void** args, const char* name, const unsigned* grid,
                          const unsigned* block, size_t dynamic_bytes, int schedule, unsigned long long seed,
                          const void* const* buffer_bases, const size_t* buffer_sizes, const char* const* buffer_names,
                          int buffers, char* error, size_t error_size) {
    launch = Launch();
    launch.kernel = kernel;
    launch.args = args;
    launch.name = name;
    launch.dynamic_bytes = dynamic_bytes;
    launch.schedule = static_cast<Schedule>(schedule);
    launch.seed = seed;
    fragment_layout = schedule;  // each schedule plays a GPU with its own WMMA fragment layout
    grid_dim = {grid[0], grid[1], grid[2]};
    block_dim = {block[0], block[1], block[2]};
    const int threads = static_cast<int>(block[0] * block[1] * block[2]);
#if CUDASIM_ASAN
    static bool registered = false;
    if (!registered) __sanitizer_set_death_callback(report_fault_location), registered = true;
#endif
    reserve_stacks(threads);
    fibers.assign(threads, Fiber());
    const TlsBlock shared = shared_block();
    void* bases[16];
    const int arrays = dynamic_shared_arrays(bases);
    if (CUDASIM_DETECTORS) start_detecting(shared, buffer_bases, buffer_sizes, buffer_names, buffers);
    std::fill(std::begin(counts), std::end(counts), 0);
    block_requests.clear();
    lane_occurrences.clear();
    for (const uint3& b : block_order()) {
        shared_region.stamp = stamp();  // the previous block's accesses are stale
        poison_shared(shared);
        asan_poison_dynamic_tail(bases, arrays, true);
        run_block(b, threads);
        if (counting) count_block_requests();
        asan_poison_dynamic_tail(bases, arrays, false);
        if (launch.error.empty()) check_dynamic_tail(bases, arrays);
        if (!launch.error.empty()) {
            snprintf(error, error_size, "block (%u,%u,%u): %s", b.x, b.y, b.z, launch.error.c_str());
            break;
        }
    }
    stop_detecting();
    running = nullptr;
    current = nullptr;
    return launch.error.empty() ? 0 : launch.race ? 2 : 1;
}

// Counting (see "Counters"): on or off for the launches that follow; the counters' ncu names, one a
// line, in the order cudasim_counts writes the last launch's values.
EXPORT void cudasim_count(int enable) { counting = enable != 0; }

EXPORT const char* cudasim_counter_names() {
#define CUDASIM_COUNTER_NAME(id, name) name "\n"
    return CUDASIM_COUNTERS(CUDASIM_COUNTER_NAME);
#undef CUDASIM_COUNTER_NAME
}

EXPORT void cudasim_counts(uint64_t* values) { std::copy(std::begin(counts), std::end(counts), values); }

// Bytes of static __shared__ variables (this module's thread-local block, less the dynamic
// arrays and the two guards; alignment padding included).
EXPORT size_t cudasim_static_shared_bytes() { return static_shared_bytes(shared_block().size); }

EXPORT size_t cudasim_dynamic_shared_capacity() { return dynamic_shared_capacity; }

// Memory for the launcher's copy of an argument buffer (`bytes`, a multiple of the page size):
// readable and writable, between two guards of MEMORY_GUARD_BYTES reserved and inaccessible
// (PROT_NONE costs no memory). nullptr if the address space is not there.
EXPORT void* cudasim_map_guarded(size_t bytes) {
    auto* reserved = static_cast<char*>(mmap(nullptr, bytes + 2 * MEMORY_GUARD_BYTES, PROT_NONE,
                                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (reserved == MAP_FAILED) return nullptr;
    if (mprotect(reserved + MEMORY_GUARD_BYTES, bytes, PROT_READ | PROT_WRITE) == 0) return reserved + MEMORY_GUARD_BYTES;
    munmap(reserved, bytes + 2 * MEMORY_GUARD_BYTES);
    return nullptr;
}

EXPORT void cudasim_unmap_guarded(void* memory, size_t bytes) {
    munmap(static_cast<char*>(memory) - MEMORY_GUARD_BYTES, bytes + 2 * MEMORY_GUARD_BYTES);
}

// The words of the last launch with detectors that only float atomicAdds wrote: their
// addresses, how many adds each had and the largest magnitude its sum reached (at most
// `capacity`); returns how many there are.
EXPORT size_t cudasim_atomic_sums(const void** words, unsigned* adds, double* largest, size_t capacity) {
    for (size_t i = 0; i < std::min(capacity, atomic_results.size()); ++i) {
        words[i] = atomic_results[i].first;
        adds[i] = atomic_results[i].second.adds;
        largest[i] = atomic_results[i].second.largest;
    }
    return atomic_results.size();
}

// The hooks g++ calls in a kernel unit built with -fsanitize=thread: one per load or store of
// 1 to 16 bytes (aligned or not), and of a range (aggregate copies).
// The plain hooks are for accesses through a pointer of a type aligned to SIZE.
#define CUDASIM_HOOKS(SIZE)                                                                                                \
    extern "C" void __tsan_read##SIZE(void* p) { on_access(p, SIZE, false, __builtin_return_address(0), true); }           \
    extern "C" void __tsan_write##SIZE(void* p) { on_access(p, SIZE, true, __builtin_return_address(0), true); }          \
    extern "C" void __tsan_unaligned_read##SIZE(void* p) { on_access(p, SIZE, false, __builtin_return_address(0), false); } \
    extern "C" void __tsan_unaligned_write##SIZE(void* p) { on_access(p, SIZE, true, __builtin_return_address(0), false); }
CUDASIM_HOOKS(1)
CUDASIM_HOOKS(2)
CUDASIM_HOOKS(4)
CUDASIM_HOOKS(8)
CUDASIM_HOOKS(16)
extern "C" void __tsan_read_range(void* p, size_t n) { on_access(p, n, false, __builtin_return_address(0), false); }
extern "C" void __tsan_write_range(void* p, size_t n) { on_access(p, n, true, __builtin_return_address(0), false); }
extern "C" void __tsan_init() {}  // called by the unit's constructor; nothing to set up
