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
// Shared memory: __shared__ variables are this module's thread-local storage (see cudasim.h);
// before every block it is filled with 0xff bytes, a NaN in fp32, fp16 and bf16, so a read of
// a value no thread wrote shows up. Dynamic shared memory is checked after every block: a byte
// changed past the size the launch asked for is an error (and under AddressSanitizer the bytes
// past it are poisoned, so the faulting access itself is reported).
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cudasim.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUDASIM_ASAN 1
#else
#define CUDASIM_ASAN 0
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
};

Launch launch;
std::vector<Fiber> fibers;
char* stack_pool = nullptr;
size_t stack_pool_count = 0;
void* scheduler_sp = nullptr;
Fiber* running = nullptr;
int barrier_arrivals = 0;
int shuffle_arrivals[32];  // per warp: lanes waiting at a shuffle (checked in full only when enough)
thread_local unsigned char tls_anchor;  // locates this module's thread-local (= shared) block
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

// Back to the scheduler; returns when the scheduler resumes this fiber.
void yield_to_scheduler() {
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
        if (ph.p_type == PT_TLS && data && data <= &tls_anchor && &tls_anchor < data + ph.p_memsz) {
            block->base = data;
            block->size = ph.p_memsz;
            return 1;
        }
    }
    return 0;
}

TlsBlock shared_block() {
    tls_anchor = 0;  // the block is allocated lazily, on the first access from this thread
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
    f.complete(payloads, f.line);
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
    const unsigned long long block_number = (block.z * grid_dim.y + block.y) * grid_dim.x + block.x;
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
    f.kind = WARP_COLLECTIVE;
    f.collective = name;
    f.payload = payload;
    f.complete = complete;
    yield_to_scheduler();
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
EXPORT int cudasim_launch(void (*kernel)(void**), void** args, const char* name, const unsigned* grid,
                          const unsigned* block, size_t dynamic_bytes, int schedule, unsigned long long seed,
                          char* error, size_t error_size) {
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
    for (const uint3& b : block_order()) {
        poison_shared(shared);
        asan_poison_dynamic_tail(bases, arrays, true);
        run_block(b, threads);
        asan_poison_dynamic_tail(bases, arrays, false);
        if (launch.error.empty()) check_dynamic_tail(bases, arrays);
        if (!launch.error.empty()) {
            snprintf(error, error_size, "block (%u,%u,%u): %s", b.x, b.y, b.z, launch.error.c_str());
            break;
        }
    }
    running = nullptr;
    current = nullptr;
    return launch.error.empty() ? 0 : 1;
}

// Bytes of static __shared__ variables (this module's thread-local block, less the dynamic
// arrays and the runtime's one-byte anchor; alignment padding included).
EXPORT size_t cudasim_static_shared_bytes() {
    void* bases[16];
    const size_t dynamic = dynamic_shared_arrays(bases) * dynamic_shared_capacity;
    return shared_block().size - dynamic - 1;
}

EXPORT size_t cudasim_dynamic_shared_capacity() { return dynamic_shared_capacity; }
