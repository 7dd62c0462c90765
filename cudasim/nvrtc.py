"""Compile CUDA sources as CuPy does, without a GPU: NVRTC to PTX, then ptxas for resource usage.

NVRTC (the library CuPy calls), the CUDA headers (cuda_fp16.h, cuda_bf16.h) and ptxas are found
the way CuPy 14 finds them, with `cuda.pathfinder`: pip wheels for CUDA 12 (`nvidia-cuda-*-cu12`)
or 13 (`nvidia-cuda-*`), a conda environment, or a toolkit under CUDA_PATH / CUDA_HOME. None of
them needs a GPU or a driver. `resources()` reports per kernel what `ptxas -v` prints:
registers, spill stores/loads and static shared memory; `sass()` reads a cubin's machine code
with cuobjdump (the `nvidia-cuda-cuobjdump` and `nvidia-cuda-nvdisasm` wheels, which disassemble
sm_80 and sm_90 cubins without a GPU).
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


class NvrtcError(Exception):
    """NVRTC or ptxas is missing, or the source does not compile."""


def _pathfinder():
    try:
        from cuda import pathfinder
    except ImportError:
        raise NvrtcError("cuda.pathfinder is not installed (it comes with CuPy 14): pip install -e '.[compile]'") from None
    return pathfinder


def _found(what: str, path) -> Path:
    if path is None:
        raise NvrtcError(f"{what} not found: install the [compile] extra, or set CUDA_PATH to a CUDA toolkit")
    return Path(path)


@lru_cache(maxsize=None)
def _library():
    pathfinder = _pathfinder()
    try:
        nvrtc = ctypes.CDLL(pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path)
    except (pathfinder.DynamicLibNotFoundError, pathfinder.DynamicLibNotAvailableError) as err:
        raise NvrtcError(f"NVRTC not found ({err}): install the [compile] extra, or set CUDA_PATH") from None
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    return nvrtc


def cuda_include() -> Path:
    """The folder of cuda_runtime.h (and cuda_fp16.h, cuda_bf16.h), as CuPy passes it to NVRTC."""
    return _found("the CUDA headers", _pathfinder().find_nvidia_header_directory("cudart"))


def _call(function, *args):
    status = function(*args)
    if status != 0:
        raise NvrtcError(f"{function.__name__}: {_library().nvrtcGetErrorString(status).decode()}")


def version() -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _call(_library().nvrtcVersion, ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def compile_ptx(source: str, name: str, arch: str, options=()) -> str:
    """`source` -> PTX for `arch` (e.g. "compute_90"), with CuPy's options plus the CUDA headers."""
    nvrtc = _library()
    program = ctypes.c_void_p()
    _call(nvrtc.nvrtcCreateProgram, ctypes.byref(program), source.encode(), name.encode(), 0, None, None)
    try:
        flags = [*options, f"--gpu-architecture={arch}", f"-I{cuda_include()}"]
        argv = (ctypes.c_char_p * len(flags))(*[f.encode() for f in flags])
        status = nvrtc.nvrtcCompileProgram(program, len(flags), argv)
        if status != 0:
            size = ctypes.c_size_t()
            _call(nvrtc.nvrtcGetProgramLogSize, program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            _call(nvrtc.nvrtcGetProgramLog, program, log)
            raise NvrtcError(f"NVRTC could not compile {name} for {arch}:\n{log.value.decode()}")
        size = ctypes.c_size_t()
        _call(nvrtc.nvrtcGetPTXSize, program, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        _call(nvrtc.nvrtcGetPTX, program, ptx)
        return ptx.value.decode()
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


@dataclass(frozen=True)
class Resources:
    """What ptxas allocated for one kernel."""

    kernel: str
    arch: str
    registers: int
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    shared: int  # bytes of static shared memory


def resources(ptx: str, arch: str) -> dict[str, Resources]:
    """Assemble `ptx` for `arch` (e.g. "sm_90") with `ptxas -v`; {kernel: Resources}."""
    ptxas = _found("ptxas", _pathfinder().find_nvidia_binary_utility("ptxas"))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernels.ptx"
        path.write_text(ptx)
        result = subprocess.run([str(ptxas), f"-arch={arch}", "-v", str(path), "-o", str(Path(folder) / "out.cubin")],
                                capture_output=True, text=True)
    if result.returncode != 0:
        raise NvrtcError(f"ptxas failed for {arch}:\n{result.stderr}")
    return parse_ptxas(result.stderr, arch)


def cubin(ptx: str, arch: str) -> bytes:
    """Assemble `ptx` for `arch` (e.g. "sm_90") with ptxas: the cubin."""
    ptxas = _found("ptxas", _pathfinder().find_nvidia_binary_utility("ptxas"))
    with tempfile.TemporaryDirectory() as folder:
        path, out = Path(folder) / "kernels.ptx", Path(folder) / "out.cubin"
        path.write_text(ptx)
        result = subprocess.run([str(ptxas), f"-arch={arch}", str(path), "-o", str(out)], capture_output=True,
                                text=True)
        if result.returncode != 0:
            raise NvrtcError(f"ptxas failed for {arch}:\n{result.stderr}")
        return out.read_bytes()


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: its byte offset in the kernel, its opcode with modifiers (e.g.
    HMMA.16816.F32.BF16), for a branch the offset it jumps to, whether a predicate guards it
    (@P0, @!UP1: a guarded branch may fall through) and its operands as printed."""

    offset: int
    opcode: str
    target: int | None = None
    predicated: bool = False
    operands: str = ""


SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)([^;]*);")


def sass(cubin: bytes) -> dict[str, list[Instruction]]:
    """{kernel: its instructions} of a cubin, disassembled with `cuobjdump -sass`."""
    cuobjdump = _found("cuobjdump (the nvidia-cuda-cuobjdump wheel)", _pathfinder().find_nvidia_binary_utility("cuobjdump"))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernels.cubin"
        path.write_bytes(elf_extent(cubin))
        # cuobjdump runs nvdisasm, which the nvdisasm wheel puts beside it
        result = subprocess.run([str(cuobjdump), "-sass", str(path)], capture_output=True, text=True,
                                env={"PATH": str(cuobjdump.parent)})
    if result.returncode != 0:
        raise NvrtcError(f"cuobjdump failed (is the nvidia-cuda-nvdisasm wheel installed?):\n{result.stderr}")
    return parse_sass(result.stdout)


def elf_extent(image: bytes) -> bytes:
    """A 64-bit ELF image padded with zeros to the end of its own program and section header
    tables. The cubin CuPy 14's NVRTC path returns (nvrtc.getCUBIN) is one byte shorter than its
    headers say, the last one (a 0, inside the last program header), as if read as a C string;
    cuobjdump refuses it ("does not contain device code"), ptxas's own cubin is complete."""
    e_phoff, e_shoff = int.from_bytes(image[32:40], "little"), int.from_bytes(image[40:48], "little")
    e_phentsize, e_phnum, e_shentsize, e_shnum = (int.from_bytes(image[i:i + 2], "little") for i in (54, 56, 58, 60))
    extent = max(e_phoff + e_phentsize * e_phnum, e_shoff + e_shentsize * e_shnum)
    return image + bytes(max(0, extent - len(image)))


def parse_sass(text: str) -> dict[str, list[Instruction]]:
    kernels = {}
    for block in re.split(r"\n\s*Function : ", text)[1:]:
        instructions = []
        for match in SASS_LINE.finditer(block):
            offset, guard, opcode, operands = match.groups()
            branch = re.fullmatch(r"\s*0x([0-9a-f]+)\s*", operands) if opcode.startswith("BRA") else None
            instructions.append(Instruction(int(offset, 16), opcode, int(branch.group(1), 16) if branch else None,
                                            guard is not None, operands.strip()))
        kernels[block.split("\n", 1)[0].strip()] = instructions
    return kernels


def loop_bodies(instructions: list[Instruction]) -> list[list[Instruction]]:
    """The bodies of the kernel's loops: from the target of each backward branch to the branch."""
    return [[i for i in instructions if branch.target <= i.offset <= branch.offset]
            for branch in instructions if branch.target is not None and branch.target < branch.offset]


INSTRUCTION_CLASSES = ("HMMA", "LDSM", "LDGSTS", "MUFU")  # the classes a trip is counted by, and the rest


@dataclass(frozen=True)
class LoopTrip:
    """The instructions a warp issues in one trip through a loop, in order (a predicated-off
    instruction still takes its issue slot, so it counts)."""

    path: tuple[Instruction, ...]

    def count(self, opcode_class: str) -> int:
        """Instructions whose opcode is `opcode_class` or starts with it and a dot (HMMA: HMMA.16816.F32)."""
        return sum(i.opcode == opcode_class or i.opcode.startswith(opcode_class + ".") for i in self.path)

    def by_class(self) -> dict[str, int]:
        """{HMMA, LDSM, LDGSTS, MUFU, rest, total: instructions}."""
        counts = {name: self.count(name) for name in INSTRUCTION_CLASSES}
        return counts | {"rest": len(self.path) - sum(counts.values()), "total": len(self.path)}


def loop_trip(loop: list[Instruction], must_issue: str = "LDGSTS", never: str = "LDG") -> LoopTrip:
    """The shortest trip through `loop` (one of `loop_bodies`: from its first instruction to its
    backward branch, taken) that issues every `must_issue`-class instruction of the loop and no
    `never`-class one.

    For the tensor-core attention's key-tile loop this is B/16's path: a tile that stages the
    next one (every LDGSTS), reads no bias or key mask (no LDG), and otherwise takes the fewest
    instructions: not the first tile's Q loads, not the per-key logits of a partial tile. A
    loop inside the loop is refused (ValueError): its trip count is not in the code.
    """
    def is_class(i: Instruction, name: str) -> bool:
        return i.opcode == name or i.opcode.startswith(name + ".")

    index = {i.offset: n for n, i in enumerate(loop)}
    needed, last = sum(is_class(i, must_issue) for i in loop), len(loop) - 1
    # best[n][m]: the shortest path reaching instruction n having issued m `must_issue` ones, and its predecessor
    best: list[dict[int, tuple[int, tuple[int, int] | None]]] = [{} for _ in loop]
    best[0][0] = (0, None)
    finished: dict[int, tuple[int, tuple[int, int]]] = {}
    for n, i in enumerate(loop):
        if is_class(i, never):
            continue
        successors = []
        if i.target is not None and n != last:
            if i.target < i.offset:
                raise ValueError(f"the loop holds a loop (backward branch at {i.offset:#x}); unroll it")
            if i.target in index:
                successors.append(index[i.target])
            if i.predicated:
                successors.append(n + 1)
        elif not i.opcode.startswith("EXIT") or i.predicated:
            successors.append(n + 1)
        for m, (length, _) in list(best[n].items()):
            m_after = m + is_class(i, must_issue)
            if n == last:
                if m_after not in finished or length + 1 < finished[m_after][0]:
                    finished[m_after] = (length + 1, (n, m))
                continue
            for successor in successors:
                known = best[successor].get(m_after)
                if known is None or length + 1 < known[0]:
                    best[successor][m_after] = (length + 1, (n, m))
    if needed not in finished:
        raise ValueError(f"no trip through the loop issues all its {needed} {must_issue} and no {never}")
    path, step = [], finished[needed][1]
    while step is not None:
        path.append(loop[step[0]])
        step = best[step[0]][step[1]][1]
    return LoopTrip(tuple(reversed(path)))


def key_tile_loops(instructions: list[Instruction]) -> dict[int, list[Instruction]]:
    """The tensor-core attention's key-tile loops (the loops holding HMMA), by the bytes of their
    cp.async copies: 16 (LDGSTS...128, rows 16-byte aligned) and 8 (LDGSTS...64)."""
    loops = {}
    for body in loop_bodies(instructions):
        copies = {i.opcode.rsplit(".", 1)[-1] for i in body if i.opcode.startswith("LDGSTS")}
        if any(i.opcode.startswith("HMMA") for i in body) and len(copies) == 1:
            loops[int(copies.pop()) // 8] = body
    return loops


def parse_ptxas(log: str, arch: str) -> dict[str, Resources]:
    found = {}
    for block in re.split(r"ptxas info\s*: Compiling entry function ", log)[1:]:
        name = re.match(r"'(\w+)'", block).group(1)
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
        used = re.search(r"Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?", block)
        found[name] = Resources(name, arch, int(used.group(1)), int(spills.group(1)), int(spills.group(2)),
                                int(used.group(2) or 0))
    return found


# Per-SM limits (CUDA C++ Programming Guide, compute capabilities 8.0 and 9.0).
SM_LIMITS = {
    "sm_80": {"shared": 164 * 1024, "warps": 64, "blocks": 32},
    "sm_90": {"shared": 228 * 1024, "warps": 64, "blocks": 32},
}
REGISTERS_PER_SM = 64 * 1024
REGISTER_ALLOCATION = 256  # registers are allocated per warp in units of 256
RESERVED_SHARED_PER_BLOCK = 1024  # shared memory the system keeps per resident block


def blocks_per_sm(usage: Resources, threads: int, dynamic_shared: int = 0) -> int:
    """Resident blocks of `threads` threads per SM: the least of the warp, block, register and
    shared-memory limits (what cudaOccupancyMaxActiveBlocksPerMultiprocessor computes)."""
    limits = SM_LIMITS[usage.arch]
    warps = -(-threads // 32)
    per_warp = -(-usage.registers * 32 // REGISTER_ALLOCATION) * REGISTER_ALLOCATION
    by_registers = (REGISTERS_PER_SM // per_warp) // warps if usage.registers else limits["blocks"]
    shared = usage.shared + dynamic_shared + RESERVED_SHARED_PER_BLOCK
    return min(limits["warps"] // warps, limits["blocks"], by_registers, limits["shared"] // shared)
