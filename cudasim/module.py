"""Load a built kernel library and launch its kernels the way cupy.RawModule / RawKernel do.

`Module(code=..., options=...)` and `module.get_function(name)(grid, block, args,
shared_mem=...)` take what CuPy takes. Before a launch the harness makes the checks a GPU
makes (or silently gets wrong): grid and block limits, the kernel's __launch_bounds__, shared
memory within 48 KiB unless `max_dynamic_shared_size_bytes` was raised, and every argument
against the kernel's C signature (a Python float for a `float` is the classic RawKernel bug:
CuPy passes it as an 8-byte double). Arrays are any NumPy arrays (their buffer is the
"device" memory).

Each launch runs under the current schedules (`SCHEDULES`, or `schedules(...)`): with more
than one, every schedule starts from the same argument bytes and must leave bit-identical
results, otherwise the launch raises a RaceError naming the first differing element.

With the detectors on (the default; `detectors(False)` or CUDASIM_DETECTORS=0 turns them off)
each launch runs a build whose every load and store is checked (build.py, runtime.cpp): a
race between two threads on shared or global memory raises a RaceError even when all schedules
agree; a read of shared memory no thread of the block wrote, and an out-of-bounds or
misaligned access, a KernelError; each names the kernel, the threads, the source lines, the
address and the values (or the buffer, the offset and its size). For these launches the
argument buffers are copied into mappings of their own between guards of reserved address
space, so an access even far past one is named after it; it is stopped before it happens, as is
any access outside the memory a kernel may touch.
Inside `counting()` each launch (of the build with detectors) also counts what Nsight Compute
counts, named after the ncu metric each stands for: shared-memory requests, wavefronts and bank
conflicts of ld/st.shared, ldmatrix and cp.async's shared writes; global requests, 32-byte
sectors and bytes; HMMA, MUFU.EX2 and BAR instructions (runtime.cpp, "Counters"). The counts
are the same under every schedule (checked when several run).
Words that only float `atomicAdd`s wrote may differ between schedules by the rounding of the
adds' order (as on a GPU, from run to run): they are compared within the bound that rounding
allows (`_atomic_bound`), every other byte exactly.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np

from .build import Library, build, source_lines

SCHEDULES = ("in-order", "reverse", "random", "warp-greedy")
DEFAULT_SHARED_LIMIT = 48 * 1024  # without the opt-in attribute
MAX_BLOCK_THREADS = 1024
MAX_BLOCK_DIMS = (1024, 1024, 64)
MAX_GRID_DIMS = (2**31 - 1, 65535, 65535)
PAGE_BYTES = 4096  # a guarded copy keeps its array's address modulo this: the same alignment
SCALAR_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int32": ctypes.c_int32,
                 "uint32": ctypes.c_uint32, "int64": ctypes.c_int64, "uint64": ctypes.c_uint64, "bool": ctypes.c_bool}

_active = {"schedules": ("in-order",), "seed": 0, "detectors": os.environ.get("CUDASIM_DETECTORS", "1") != "0",
           "counted": None}
_lock = threading.Lock()  # the runtime keeps one launch's state in globals


class KernelError(Exception):
    """A launch a GPU would refuse, or a fault found while the kernel ran (names kernel and fault)."""


class RaceError(KernelError):
    """Two schedules left different results: the kernel depends on the order threads run in."""


@contextmanager
def schedules(names=SCHEDULES, seed: int = 0):
    """Run every launch inside the block under each of `names` and compare the results."""
    unknown = set(names) - set(SCHEDULES)
    if unknown:
        raise ValueError(f"unknown schedules {sorted(unknown)}; choose from {SCHEDULES}")
    saved = dict(_active)
    _active.update(schedules=tuple(names), seed=seed)
    try:
        yield
    finally:
        _active.update(saved)


@contextmanager
def detectors(enabled: bool = True):
    """Run every launch inside the block with the race and initcheck detectors on (or off)."""
    saved = _active["detectors"]
    _active["detectors"] = enabled
    try:
        yield
    finally:
        _active["detectors"] = saved


@dataclass(frozen=True)
class LaunchCounts:
    """What one launch counted: its kernel, grid and block, and {ncu metric name: count}."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    counts: dict[str, int]

    def per_request(self, numerator: str, denominator: str) -> float:
        """counts[numerator] / counts[denominator], e.g. wavefronts or sectors per request."""
        return self.counts[numerator] / self.counts[denominator]


@contextmanager
def counting():
    """Count what Nsight Compute counts for every launch inside the block (which needs the
    detectors' build); yields the list that receives each launch's LaunchCounts, in order."""
    if not _active["detectors"]:
        raise KernelError("counting needs the detectors' build: do not turn them off (cudasim.detectors(False) "
                          "or CUDASIM_DETECTORS=0) around cudasim.counting()")
    saved = _active["counted"]
    _active["counted"] = launches = []
    try:
        yield launches
    finally:
        _active["counted"] = saved


class Module:
    """cupy.RawModule's interface over a g++ build of the same source.

    `options` are CuPy's NVRTC options, accepted for the same call and not used: g++ gets
    cudasim's flags. `name` names the source file as compiled (messages, gdb). A module has
    two builds, with and without the detectors, each compiled when a launch first needs it;
    `sanitize=True` builds with AddressSanitizer instead, and without the detectors.
    """

    def __init__(self, code: str, options=(), name: str = "kernel.cu", sanitize: bool = False):
        self.code, self.name, self.sanitize = code, name, sanitize
        self._builds: dict[bool, tuple[Library, ctypes.CDLL]] = {}
        self.library, dll = self.library_for(self.detecting())
        dll.cudasim_static_shared_bytes.restype = ctypes.c_size_t
        self.static_shared_bytes = int(dll.cudasim_static_shared_bytes())

    def detecting(self) -> bool:
        """Whether a launch now runs the build with detectors."""
        return _active["detectors"] and not self.sanitize

    def library_for(self, detectors: bool) -> tuple[Library, ctypes.CDLL]:
        """The library with or without detectors, compiled and loaded on first use."""
        if detectors not in self._builds:
            library = build(self.code, self.name, self.sanitize, detectors)
            dll = ctypes.CDLL(str(library.path))
            dll.cudasim_launch.restype = ctypes.c_int
            dll.cudasim_atomic_sums.restype = ctypes.c_size_t
            dll.cudasim_map_guarded.restype = ctypes.c_void_p
            self._builds[detectors] = library, dll
        return self._builds[detectors]

    def get_function(self, name: str) -> "Kernel":
        if name not in self.library.kernels:
            raise KernelError(f"{self.name} defines no extern \"C\" __global__ function {name!r}; "
                              f"it defines {', '.join(self.library.kernels)}")
        return Kernel(self, name)


class Kernel:
    """cupy.RawKernel's call interface: kernel(grid, block, args, shared_mem=0)."""

    def __init__(self, module: Module, name: str):
        self.module, self.name = module, name
        self.signature = module.library.kernels[name]
        self.max_dynamic_shared_size_bytes = 0  # CuPy's attribute: raise it to go past 48 KiB

    def __call__(self, grid, block, args, shared_mem: int = 0):
        values = self.check(grid, block, args, shared_mem)
        grid, block = _dims(grid), _dims(block)
        arrays = {str(p): np.asarray(a) for p, a in zip(self.signature.params, args) if p.pointer}
        with _lock:
            self._counted = []
            if len(_active["schedules"]) == 1:
                self._run(values, arrays, grid, block, shared_mem, _active["schedules"][0])
            else:
                self._run_all_schedules(values, arrays, grid, block, shared_mem)
        if _active["counted"] is not None and self._counted:
            if any(counts != self._counted[0] for counts in self._counted):
                raise KernelError(f"kernel {self.name}: its counts differ between schedules: {self._counted}")
            _active["counted"].append(LaunchCounts(self.name, grid, block, self._counted[0]))

    def check(self, grid, block, args, shared_mem: int = 0) -> list:
        """Refuse a launch a GPU would refuse or misread; the arguments as ctypes values."""
        self._check_launch(_dims(grid), _dims(block), shared_mem)
        return self._marshal(tuple(args))

    # -- checks ------------------------------------------------------------------------------

    def _check_launch(self, grid, block, shared_mem):
        threads = block[0] * block[1] * block[2]
        for label, dims, limits in (("grid", grid, MAX_GRID_DIMS), ("block", block, MAX_BLOCK_DIMS)):
            if any(d < 1 for d in dims):
                self._fail(f"{label} {dims} has a dimension below 1 (an empty input must skip the launch)")
            if any(d > limit for d, limit in zip(dims, limits)):
                self._fail(f"{label} {dims} exceeds the limits {limits}")
        if threads > MAX_BLOCK_THREADS:
            self._fail(f"block {block} has {threads} threads; at most {MAX_BLOCK_THREADS}")
        bound = self.signature.max_threads
        if bound is not None and threads > bound:
            self._fail(f"block {block} has {threads} threads, more than its __launch_bounds__({bound})")
        limit = max(DEFAULT_SHARED_LIMIT, self.max_dynamic_shared_size_bytes)
        total = shared_mem + self.module.static_shared_bytes
        if shared_mem < 0 or total > limit:
            self._fail(f"asks for {shared_mem} bytes of dynamic shared memory (+{self.module.static_shared_bytes} static), "
                       f"over the {limit}-byte limit; set max_dynamic_shared_size_bytes first")

    def _marshal(self, args):
        """Arguments -> ctypes values in the C types of the signature (refuses mismatches)."""
        params = self.signature.params
        if len(args) != len(params):
            self._fail(f"takes {len(params)} arguments ({', '.join(map(str, params))}), got {len(args)}")
        return [self._value(i, param, arg) for i, (param, arg) in enumerate(zip(params, args))]

    def _value(self, index, param, arg):
        where = f"argument {index} ({param})"
        if param.pointer:
            if not isinstance(arg, np.ndarray):
                self._fail(f"{where} needs a device array, got {type(arg).__name__}")
            if arg.dtype != param.dtype:
                self._fail(f"{where} points to {param.dtype_name} but gets an array of {arg.dtype}")
            if not arg.flags.c_contiguous:
                self._fail(f"{where} gets a non-contiguous array; a RawKernel ignores strides and reads the raw buffer")
            return ctypes.c_void_p(arg.ctypes.data)
        if isinstance(arg, (bool, int, float)):
            cupy_type = "double" if isinstance(arg, float) else "long long"
            self._fail(f"{where} gets a Python {type(arg).__name__}, which CuPy passes as a {cupy_type}; "
                       f"pass np.{param.dtype_name}(...)")
        if not isinstance(arg, np.generic) or arg.dtype != param.dtype:
            self._fail(f"{where} gets {type(arg).__name__}; pass np.{param.dtype_name}(...)")
        return SCALAR_CTYPES[param.dtype_name](arg.item())

    def _fail(self, message: str):
        raise KernelError(f"kernel {self.name}: {message}")

    # -- running -----------------------------------------------------------------------------

    def _run(self, values, arrays, grid, block, shared_mem, schedule: str) -> dict:
        """Launch under `schedule`; {parameter: {flat index: (float atomicAdds, largest |sum|)}}
        for the elements only float atomicAdds wrote (empty without detectors)."""
        detecting = self.module.detecting()
        library, dll = self.module.library_for(detecting)
        with guarded_copies(arrays, dll) if detecting else nullcontext(arrays) as arrays:
            values = [ctypes.c_void_p(arrays[str(p)].ctypes.data) if p.pointer else v
                      for p, v in zip(self.signature.params, values)]
            self._launch(library, dll, values, arrays, grid, block, shared_mem, schedule)
            return _atomic_sums(dll, arrays) if detecting else {}

    def _launch(self, library, dll, values, arrays, grid, block, shared_mem, schedule: str):
        pointers = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        count = max(1, len(arrays))
        bases = (ctypes.c_void_p * count)(*[a.ctypes.data for a in arrays.values()])
        sizes = (ctypes.c_size_t * count)(*[a.nbytes for a in arrays.values()])
        names = (ctypes.c_char_p * count)(*[param.encode() for param in arrays])
        error = ctypes.create_string_buffer(4096)
        counting_now = _active["counted"] is not None and self.module.detecting()
        dll.cudasim_count(ctypes.c_int(counting_now))
        status = dll.cudasim_launch(
            ctypes.cast(getattr(dll, f"cudasim_kernel_{self.name}"), ctypes.c_void_p), pointers, self.name.encode(),
            (ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), ctypes.c_size_t(shared_mem),
            SCHEDULES.index(schedule), ctypes.c_ulonglong(_active["seed"]), bases, sizes, names, len(arrays),
            error, ctypes.c_size_t(len(error)))
        if status:
            message = (f"kernel {self.name}, {source_lines(library, error.value.decode())} (schedule {schedule}; "
                       f"line numbers refer to {library.source_path})")
            raise (RaceError if status == 2 else KernelError)(message)
        if counting_now:
            self._counted.append(_counts(dll))

    def _run_all_schedules(self, values, arrays, grid, block, shared_mem):
        """Each schedule from the same starting bytes; keep the first schedule's results."""
        start = {param: a.copy() for param, a in arrays.items()}
        results, sums = [], []
        for schedule in _active["schedules"]:
            for param, array in arrays.items():
                np.copyto(array, start[param])
            sums.append(self._run(values, arrays, grid, block, shared_mem, schedule))
            results.append({param: a.copy() for param, a in arrays.items()})
        first, first_name = results[0], _active["schedules"][0]
        for name, result, sum_b in zip(_active["schedules"][1:], results[1:], sums[1:]):
            for param in arrays:
                _compare(self, param, first[param], result[param], first_name, name,
                         sums[0].get(param, {}), sum_b.get(param, {}))
        for param, array in arrays.items():
            np.copyto(array, first[param])


@contextmanager
def guarded_copies(arrays: dict[str, np.ndarray], dll: ctypes.CDLL):
    """Copies of `arrays`, each span in a mapping of its own between two guards of reserved,
    inaccessible address space (the runtime's `cudasim_map_guarded`), written back at the end.

    Arrays that share memory are copied as one span, so they still share it; each span keeps its
    address modulo PAGE_BYTES, so every alignment is as it was. Empty arrays stay as they are.
    """
    spans: list[list] = []  # [start, end, names], merged where arrays overlap
    for name, a in sorted(arrays.items(), key=lambda item: item[1].ctypes.data):
        if not a.nbytes:
            continue
        start = a.ctypes.data
        if spans and start < spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], start + a.nbytes)
            spans[-1][2].append(name)
        else:
            spans.append([start, start + a.nbytes, [name]])
    copies, staged = dict(arrays), []
    for start, end, names in spans:
        offset = start % PAGE_BYTES
        memory = _guarded_memory(dll, -(-(offset + end - start) // PAGE_BYTES) * PAGE_BYTES)
        ctypes.memmove(memory.ctypes.data + offset, start, end - start)
        staged.append((start, memory.ctypes.data + offset, end - start))
        for name in names:
            a = arrays[name]
            copies[name] = np.ndarray(a.shape, a.dtype, buffer=memory, offset=offset + a.ctypes.data - start)
    try:
        yield copies
    finally:
        for start, copy, size in staged:
            ctypes.memmove(start, copy, size)


def device_array(values) -> np.ndarray:
    """A copy of `values` at a 256-byte aligned address, as cudaMalloc returns (NumPy aligns to 16
    or 64 bytes: a sector count or a vector access depends on it)."""
    values = np.ascontiguousarray(values)
    raw = np.empty(values.nbytes + 256, np.uint8)
    start = -raw.ctypes.data % 256
    array = raw[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    array[...] = values
    return array


def _counts(dll) -> dict[str, int]:
    """The last launch's counters, by their ncu metric names."""
    dll.cudasim_counter_names.restype = ctypes.c_char_p
    names = dll.cudasim_counter_names().decode().split()
    values = (ctypes.c_uint64 * len(names))()
    dll.cudasim_counts(values)
    return dict(zip(names, map(int, values)))


def _guarded_memory(dll, length: int) -> np.ndarray:
    """`length` bytes (a multiple of PAGE_BYTES) between the runtime's guards, unmapped once no
    array uses them: a traceback may keep a copy (and show it) after its launch."""
    base = dll.cudasim_map_guarded(ctypes.c_size_t(length))
    if not base:
        raise KernelError(f"the detectors cannot reserve address space around a {length}-byte buffer; "
                          "run without them (cudasim.detectors(False) or CUDASIM_DETECTORS=0)")
    memory = np.ctypeslib.as_array((ctypes.c_uint8 * length).from_address(base))
    weakref.finalize(memory, dll.cudasim_unmap_guarded, ctypes.c_void_p(base), ctypes.c_size_t(length))
    return memory


def _atomic_sums(dll, arrays: dict[str, np.ndarray]) -> dict[str, dict[int, tuple[int, float]]]:
    """The last launch's words that only float atomicAdds wrote, by parameter and flat index."""
    count = dll.cudasim_atomic_sums(None, None, None, ctypes.c_size_t(0))
    words, adds, largest = np.zeros(count, np.uintp), np.zeros(count, np.uint32), np.zeros(count, np.float64)
    dll.cudasim_atomic_sums(words.ctypes.data_as(ctypes.c_void_p), adds.ctypes.data_as(ctypes.c_void_p),
                            largest.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(count))
    sums: dict[str, dict[int, tuple[int, float]]] = {}
    for param, a in arrays.items():
        offsets = words.astype(np.int64) - a.ctypes.data
        inside = np.flatnonzero((offsets >= 0) & (offsets < a.nbytes) & (offsets % a.itemsize == 0))
        if inside.size:
            sums[param] = {int(offsets[i]) // a.itemsize: (int(adds[i]), float(largest[i])) for i in inside}
    return sums


def _atomic_bound(dtype: np.dtype, sum_a: tuple[int, float], sum_b: tuple[int, float]) -> float:
    """How far two orders of the same float atomicAdds can leave a word apart.

    Each add rounds once, by at most u |exact sum| <= u |rounded sum| / (1 - u) (u the unit
    roundoff), and rounding errors of later adds do not grow earlier ones, so an order whose
    sums reach at most M in magnitude ends within n u M / (1 - u) of the exact total, n the
    number of adds. Two orders: n u (M_a + M_b) / (1 - u).
    """
    u = float(np.finfo(dtype).eps) / 2
    return max(sum_a[0], sum_b[0]) * u * (sum_a[1] + sum_b[1]) / (1 - u)


def _compare(kernel: Kernel, param: str, a: np.ndarray, b: np.ndarray, name_a: str, name_b: str, sums_a: dict,
             sums_b: dict):
    """Raise a RaceError where `a` and `b` differ, except in words only float atomicAdds wrote
    (`sums_a`, `sums_b`) that differ within `_atomic_bound`."""
    bytes_a, bytes_b = a.view(np.uint8).reshape(a.size, -1), b.view(np.uint8).reshape(b.size, -1)
    rounding = [i for i in sums_a.keys() & sums_b.keys()
                if abs(float(a.flat[i]) - float(b.flat[i])) <= _atomic_bound(a.dtype, sums_a[i], sums_b[i])]
    differs = np.setdiff1d(np.flatnonzero((bytes_a != bytes_b).any(axis=1)), rounding)
    if differs.size:
        position = np.unravel_index(differs[0], a.shape)
        raise RaceError(f"kernel {kernel.name}: race: {param} {a.shape} differs between schedules "
                        f"{name_a} and {name_b} at {len(differs)} elements, first at {tuple(map(int, position))}: "
                        f"{a[position]!r} vs {b[position]!r}")


def _dims(dims) -> tuple[int, int, int]:
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
