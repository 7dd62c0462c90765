"""Compile a CUDA C source for the CPU: g++, the cudasim prelude, the runtime, one shared library.

The kernel source is compiled as it is (it is `#include`d, not edited). Before that, the
preprocessor runs once with CUDASIM_SCAN defined, which turns `__global__`, `__shared__` and
`__launch_bounds__` into marker words, so the `extern "C"` kernels, their C parameter lists,
their launch bounds and the `extern __shared__` arrays can be read from the expanded text.
From these a few lines are generated after the source: one `cudasim_kernel_<name>(void** args)`
entry per kernel (CUDA's kernelParams convention: args[i] points to the i-th argument) and the
definition of the dynamic shared arrays.

With detectors, the translation unit of the kernel (not the runtime) is compiled with
-fsanitize=thread: g++ then calls a `__tsan_*` hook before every load and store, and the
runtime defines those hooks itself (libtsan is not linked) to check each access for bounds,
alignment, races and uninitialised shared reads. `source_lines` turns the instruction offsets in its reports into
source lines.

Libraries are cached under `$CUDASIM_CACHE` (default `~/.cache/cudasim`) by a hash of the prelude,
the runtime, the source, the flags and the compiler version, so only the first run builds; the
runtime, three quarters of a build, is compiled once per set of flags into a cached object that
every library links. Processes sharing the cache (the test suite's workers, two runs at once)
build each of these once: the first takes its lock file and compiles, the others wait for it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

PACKAGE = Path(__file__).parent
INCLUDE = PACKAGE / "include"
RUNTIME = PACKAGE / "runtime.cpp"
# The header folder's name in a library's debug info, the same for every checkout: race reports
# skip the runtime's frames by it, and a library built elsewhere names its frames alike.
DEBUG_INCLUDE = "/cudasim/include"
DYNAMIC_SHARED_CAPACITY = 227 * 1024  # the most dynamic shared memory an sm_90 block can opt into
# -fno-extern-tls-init: `extern __shared__` arrays are extern thread_locals defined (without a
# dynamic initializer) after the source, so no TLS init hook is to be called.
FLAGS = ("-std=c++17", "-O2", "-g", "-fPIC", "-shared", "-fvisibility=hidden", "-fno-extern-tls-init",
         "-Wno-unknown-pragmas")
# AddressSanitizer + UBSan: out-of-bounds global and shared accesses fault where they happen.
SANITIZE_FLAGS = ("-std=c++17", "-O1", "-g", "-fPIC", "-shared", "-fvisibility=hidden", "-fno-extern-tls-init",
                  "-Wno-unknown-pragmas", "-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined")

# The last thread-local of a library (linked after the kernel's unit): the guard after the
# block's shared variables (runtime.cpp, linked first, has the one before them).
BACK_GUARD_UNIT = '#include "cudasim.h"\nnamespace cudasim { thread_local unsigned char shared_back_guard[SHARED_GUARD_BYTES]; }\n'

# The detectors: only the kernel's unit is instrumented; -z defs turns a hook the runtime does
# not define into a build error instead of a failed dlopen. DWARF 4 for the unit: in DWARF 5 g++
# may give the included kernel source file number 1, which addr2line (binutils 2.40) then names
# after the unit (unit.cpp:5 instead of line 5 of the source).
DETECTOR_UNIT_FLAGS = ("-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0", "-gdwarf-4")
DETECTOR_LINK_FLAGS = ("-DCUDASIM_DETECTORS=1", "-Wl,-z,defs")
# The generated entry points read the argument values the launcher passes (memory of the
# launcher, not of the kernel): they are not instrumented, so the detectors check the kernel only.
GLUE = '__attribute__((no_sanitize("thread")))'

# C type of a parameter (qualifiers removed) -> NumPy dtype name.
C_TYPES = {
    "float": "float32", "double": "float64", "__half": "float16", "__nv_bfloat16": "bfloat16",
    "int": "int32", "unsigned int": "uint32", "unsigned": "uint32", "long long": "int64",
    "long long int": "int64", "unsigned long long": "uint64", "bool": "bool",
}
QUALIFIERS = {"const", "volatile"}


class BuildError(Exception):
    """The source does not compile for the harness, or declares something it cannot run."""


@dataclass(frozen=True)
class Param:
    """One kernel parameter as the C signature declares it."""

    name: str
    ctype: str  # as written, e.g. "const __half*"
    pointer: bool
    dtype_name: str  # of the scalar, or of the pointee

    @property
    def dtype(self) -> np.dtype:
        return dtype_from_name(self.dtype_name)

    def __str__(self) -> str:
        return f"{self.ctype} {self.name}"


@dataclass(frozen=True)
class KernelSignature:
    name: str
    params: tuple[Param, ...]
    max_threads: int | None  # from __launch_bounds__, if declared


@dataclass(frozen=True)
class Library:
    path: Path
    source_path: Path  # the source as compiled (line numbers in messages refer to it)
    kernels: dict[str, KernelSignature]


def dtype_from_name(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # CuPy's bfloat16 is ml_dtypes' too

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def cache_dir() -> Path:
    return Path(os.environ.get("CUDASIM_CACHE", Path.home() / ".cache" / "cudasim"))


@lru_cache(maxsize=None)
def compiler_version() -> str:
    if shutil.which("g++") is None:
        raise BuildError("cudasim needs g++ (Debian/Ubuntu: apt install g++)")
    try:
        return subprocess.run(["g++", "-dumpfullversion"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as err:
        raise BuildError(f"g++ does not run ({err}); reinstall it (Debian/Ubuntu: apt install --reinstall g++)") from None


def _include_flags() -> list[str]:
    """The header folder, which the debug info records as DEBUG_INCLUDE wherever it is."""
    return [f"-ffile-prefix-map={INCLUDE}={DEBUG_INCLUDE}", f"-I{INCLUDE}"]


def _prelude_text() -> str:
    return "".join(p.read_text() for p in sorted(INCLUDE.iterdir())) + RUNTIME.read_text()


def cache_key(source: str, name: str, flags) -> str:
    """The cache folder's name: everything the library is built from, but not where the checkout
    is (the debug info names the header folder DEBUG_INCLUDE), so every checkout sharing a cache
    shares its builds: the suite's and gpu-check's copy of the checkout. This file's own text is
    part of it: it generates the launch glue and the guard unit compiled beside the kernel."""
    parts = [_prelude_text(), Path(__file__).read_text(), name, source, *flags, compiler_version()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


def build(source: str, name: str = "kernel.cu", sanitize: bool = False, detectors: bool = False) -> Library:
    """Compile `source` (CUDA C text) into a cached shared library and describe its kernels.

    sanitize: AddressSanitizer and UBSan; detectors: race and initcheck hooks. g++ cannot
    combine the two sanitizers, so a build has one or the other.
    """
    if sanitize and detectors:
        raise BuildError("a build has AddressSanitizer or the detectors, not both (g++ cannot combine them)")
    flags = SANITIZE_FLAGS if sanitize else FLAGS
    unit_flags = DETECTOR_UNIT_FLAGS if detectors else ()
    folder = cache_dir() / cache_key(source, name, [*flags, *unit_flags])
    try:
        _cached(folder, "kernels.so", lambda work: _compile_in(source, name, flags, unit_flags, work, folder))
    except OSError as err:
        raise BuildError(f"cannot write to the cudasim cache {cache_dir()} ({err.strerror or err}); free some "
                         "space or set CUDASIM_CACHE to another folder") from None
    return Library(folder / "kernels.so", folder / name, scan(source, name))


def _cached(folder: Path, artifact: str, make) -> None:
    """Make `folder` unless it holds `artifact` intact: `make(work)` writes the artifact into a
    fresh folder beside it, which is renamed into place (atomic: a reader sees all or nothing).
    The build holds `folder`'s lock file, which the builder removes: a process sharing the cache
    (the suite's workers) that waited for it finds the artifact intact instead of building it
    again. O_NONBLOCK: a FIFO planted in the lock's place fails instead of blocking."""
    if _intact(folder, artifact):
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = folder.parent / f".{folder.name}.lock"
    descriptor = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        if _intact(folder, artifact):
            return
        try:
            shutil.rmtree(folder, ignore_errors=True)  # a damaged library would crash the process (SIGBUS) when loaded
            _make_in_place(folder, artifact, make)
        finally:
            lock.unlink(missing_ok=True)
    finally:
        os.close(descriptor)


def _make_in_place(folder: Path, artifact: str, make) -> None:
    work = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        make(work)
        (work / f"{artifact}.sha256").write_text(hashlib.sha256((work / artifact).read_bytes()).hexdigest())
        work.rename(folder)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        if not _intact(folder, artifact):  # else a builder that did not wait for the lock got there first
            raise
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _intact(folder: Path, artifact: str) -> bool:
    """Whether the cached `artifact` is there and has the sha256 recorded when it was built."""
    try:
        recorded = _regular_file_bytes(folder / f"{artifact}.sha256")
        return hashlib.sha256(_regular_file_bytes(folder / artifact)).hexdigest().encode() == recorded
    except OSError:
        return False


def _regular_file_bytes(path: Path) -> bytes:
    """The bytes of `path`, which must be a regular file: anyone who can write to the cache can put
    a FIFO (reading it would block forever) or a link to a device there. OSError otherwise."""
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:  # a FIFO's open must not block either
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return f.read()


def _runtime_object(flags, link_flags) -> Path:
    """runtime.cpp compiled for `flags` (three quarters of a library's build), once for every
    library built with them: a cached object beside the libraries, keyed as they are."""
    folder = cache_dir() / f"runtime-{cache_key('', RUNTIME.name, [*flags, *link_flags])}"
    _cached(folder, "runtime.o", lambda work: _gxx(RUNTIME.name, [
        "g++", *flags, *link_flags, *_include_flags(), "-c", "-o", str(work / "runtime.o"), str(RUNTIME)]))
    return folder / "runtime.o"


def _compile_in(source: str, name: str, flags, unit_flags, work: Path, folder: Path) -> None:
    (work / name).write_text(source)
    kernels, shared = _scan_file(work / name)
    (work / "unit.cpp").write_text(translation_unit(name, kernels, shared))
    (work / "back_guard.cpp").write_text(BACK_GUARD_UNIT)
    # the debug info names the final folder, so gdb finds the source after the rename
    common = ["g++", *flags, f"-fdebug-prefix-map={work}={folder}", *_include_flags()]
    unit, link_flags = work / "unit.cpp", ()
    if unit_flags:
        unit, link_flags = work / "unit.o", DETECTOR_LINK_FLAGS
        _gxx(name, [*common, *unit_flags, "-c", "-o", str(unit), str(work / "unit.cpp")])
    runtime = _runtime_object(flags, link_flags)
    # this order lays out the thread-local (shared) block: front guard, shared variables, back guard
    _gxx(name, [*common, *link_flags, "-o", str(work / "kernels.so"), str(runtime), str(unit), str(work / "back_guard.cpp")])


def _gxx(name: str, command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"g++ could not compile {name} for cudasim:\n{result.stderr.strip()}")


PC = re.compile(r"<pc 0x([0-9a-f]+)>")


def source_lines(library: Library, message: str) -> str:
    """`message` with each `<pc 0x...>` (an instruction offset in the library, as the detectors
    report it) replaced by its source line: the innermost inlined frame outside cudasim's
    prelude, "line N" in the kernel source or "file:N" elsewhere."""
    offsets = sorted(set(PC.findall(message)))
    if not offsets:
        return message
    result = subprocess.run(["addr2line", "-e", str(library.path), "-i", "-a", *(f"0x{o}" for o in offsets)],
                            capture_output=True, text=True)
    frames: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        if line.startswith("0x"):
            current = frames.setdefault(format(int(line, 16), "x"), [])
        else:
            current.append(line.split(" (discriminator")[0])
    return PC.sub(lambda m: _frame_name(library, frames.get(m.group(1), [])), message)


def _frame_name(library: Library, frames: list[str]) -> str:
    outside = [f for f in frames if not f.startswith(f"{DEBUG_INCLUDE}/") and not f.startswith("??")]
    if not outside:
        return "an unknown line"
    path, _, line = outside[0].rpartition(":")
    return f"line {line}" if Path(path).name == library.source_path.name else f"{Path(path).name}:{line}"


def translation_unit(name: str, kernels: dict[str, KernelSignature], shared: list[tuple[str, str]]) -> str:
    """The prelude, the unedited source, then one entry point per kernel and the dynamic shared arrays."""
    lines = ['#include "cudasim.h"', f'#include "{name}"', "#include <utility>"]
    # 128-byte aligned like the start of a block's shared window, where a kernel without static
    # __shared__ variables finds its dynamic shared memory (WMMA tiles need 32-byte alignment)
    lines += [f"alignas(128) thread_local {ctype} {array}[{DYNAMIC_SHARED_CAPACITY} / sizeof({ctype})];"
              for ctype, array in shared]
    bases = ", ".join(f"(void*){array}" for _, array in shared)
    lines += ["namespace cudasim {",
              f"extern const size_t dynamic_shared_capacity = {DYNAMIC_SHARED_CAPACITY};",
              "int dynamic_shared_arrays(void** bases) {",
              f"    void* arrays[] = {{{bases or 'nullptr'}}};",
              f"    for (int i = 0; i < {len(shared)}; ++i) bases[i] = arrays[i];",
              f"    return {len(shared)};", "}",
              "template <typename... A, size_t... I>",
              f"{GLUE} void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {{",
              "    kernel(*static_cast<A*>(args[I])...);", "}", "}  // namespace cudasim"]
    for kernel in kernels:
        lines.append(f'extern "C" __attribute__((visibility("default"))) {GLUE} void cudasim_kernel_{kernel}(void** args) '
                     f"{{ cudasim::call({kernel}, args, std::make_index_sequence<{len(kernels[kernel].params)}>{{}}); }}")
    return "\n".join(lines) + "\n"


def _scan_file(path: Path) -> tuple[dict[str, KernelSignature], list[tuple[str, str]]]:
    result = subprocess.run(["g++", "-E", "-P", "-x", "c++", "-std=c++17", "-DCUDASIM_SCAN", f"-I{INCLUDE}", "-include", "cudasim.h",
                             str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"g++ could not preprocess {path.name}:\n{result.stderr.strip()}")
    expanded = result.stdout
    shared = sorted(set(re.findall(r"extern\s+__cudasim_shared__\s+([\w\s]+?)\s+(\w+)\s*\[\s*\]", expanded)))
    return parse_kernels(expanded), shared


@lru_cache(maxsize=64)
def scan(source: str, name: str) -> dict[str, KernelSignature]:
    """{kernel name: signature} of every `extern "C" __global__` function in `source`."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_text(source)
        return _scan_file(path)[0]


KERNEL_HEAD = re.compile(r'extern\s+"C"\s+__cudasim_global__\s+void\s+')


def parse_kernels(expanded: str) -> dict[str, KernelSignature]:
    kernels = {}
    for match in KERNEL_HEAD.finditer(expanded):
        rest = expanded[match.end():]
        max_threads = None
        if rest.startswith("__cudasim_launch_bounds__"):
            bounds, rest = _balanced(rest[len("__cudasim_launch_bounds__"):])
            max_threads = _evaluate(bounds.split(",")[0])
        name = re.match(r"\s*(\w+)\s*", rest)
        params, _ = _balanced(rest[name.end():])
        kernels[name.group(1)] = KernelSignature(name.group(1), tuple(_param(p) for p in _split(params)), max_threads)
    return kernels


def _balanced(text: str) -> tuple[str, str]:
    """'(a(b)c) rest' -> ('a(b)c', ' rest')."""
    text = text.lstrip()
    depth = 0
    for i, char in enumerate(text):
        depth += char == "("
        depth -= char == ")"
        if depth == 0:
            return text[1:i], text[i + 1:]
    raise BuildError(f"unbalanced parentheses in {text[:80]!r}")


def _evaluate(expression: str) -> int:
    if not re.fullmatch(r"[\d\s()*+]+", expression):
        raise BuildError(f"cannot evaluate __launch_bounds__({expression})")
    return int(eval(expression, {"__builtins__": {}}))  # digits, parentheses, + and * only


def _split(params: str) -> list[str]:
    return [p.strip() for p in params.split(",") if p.strip() and p.strip() != "void"]


def _param(text: str) -> Param:
    match = re.fullmatch(r"(.*?[\s*&])(\w+)", text)
    if not match:
        raise BuildError(f"cannot read kernel parameter {text!r}")
    # restrict promises no aliasing inside the kernel; callers pass the same type without it
    ctype = " ".join(re.sub(r"\b(__restrict__|__restrict|restrict)\b", " ", match.group(1)).split())
    name = match.group(2)
    base = " ".join(word for word in ctype.replace("*", " ").split() if word not in QUALIFIERS)
    if base not in C_TYPES or ctype.count("*") > 1:
        raise BuildError(f"kernel parameter {text!r}: cudasim passes {', '.join(C_TYPES)} and pointers to them")
    return Param(name, ctype.replace(" *", "*"), "*" in ctype, C_TYPES[base])


def sanitizer_environment() -> dict[str, str]:
    """Environment for a Python process that loads a sanitize=True library (ASan must come first)."""
    runtimes = [subprocess.run(["g++", f"-print-file-name={lib}"], capture_output=True, text=True, check=True).stdout.strip()
                for lib in ("libasan.so", "libubsan.so")]
    return {**os.environ, "LD_PRELOAD": " ".join(runtimes),
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
