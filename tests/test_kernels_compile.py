"""Every CUDA source compiles for compute_80 and compute_90, emits every dtype entry point, and
fits its launch on sm_80 and sm_90: ptxas reports no spills, and registers x block threads fit
the 64 K registers of an SM. No GPU needed (NVRTC, the CUDA headers and ptxas come from pip
wheels; see cudasim/nvrtc.py).

Compiled twice: with NVRTC directly and kernels.py's options (PTX, for ptxas's resource report),
and through CuPy's own RawModule path (`test_cupy_compiles_*`), which adds its options and
include folders: its bundled CCCL and fp16 headers, `-ftz=true`,
`--device-as-default-execution-space`, `-arch=sm_XX` for a cubin. Only the two steps that need a
GPU are stubbed there: the device query (which arch) and loading the cubin.

What is compiled is `kernel_source(...)`, the exact text CuPy hands to NVRTC (header inlined)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
from script_modules import load_benchmark

from minit2i.accelerated import kernels
from minit2i.accelerated.kernels import DTYPE_SUFFIXES, KERNEL_DIR, NVRTC_OPTIONS, SOURCES, kernel_source
from minit2i.cudasim import nvrtc

try:
    nvrtc.version()
except nvrtc.NvrtcError as err:
    pytest.skip(f"compiling as CuPy does needs the [compile] extra: {err}", allow_module_level=True)

ARCHS = ("80", "90")
REGISTERS_PER_SM = 64 * 1024
# Kernels (entry-point stems) each source must define, once per dtype suffix, and the block
# size the wrapper in kernels.py launches them with.
EXPECTED_KERNELS = {
    "rmsnorm.cu": {"rms_norm": kernels.THREADS, "add_rms_norm": kernels.THREADS},
    "swiglu.cu": {"swiglu": kernels.THREADS, "geglu": kernels.THREADS},
    "rope.cu": {"qkv_heads": kernels.HEAD_WARPS * 32},
    "attention.cu": {"flash_attention": kernels.ATTENTION_WARPS * 32},
    "attention_tc.cu": {"flash_attention_tc": kernels.MMA_WARPS * 32, "flash_attention_tc_d128": kernels.MMA_WARPS * 32},
    "sampler.cu": {"cfg_euler": kernels.THREADS, "euler_step": kernels.THREADS},
}
# Stems not defined for every dtype: attention runs fp32 on CUDA cores, fp16 / bf16 on tensor cores.
ONLY_SUFFIXES = {"flash_attention": ("f32",), "flash_attention_tc": ("f16", "bf16"), "flash_attention_tc_d128": ("f16", "bf16")}


# Dynamic shared memory per block, at head_dim 64 (B/16, T5; 128 for the d128 entry point), for
# the occupancy column.
DYNAMIC_SHARED = {"flash_attention": kernels.attention_shared_bytes(64, np.float32),
                  "flash_attention_tc": kernels.attention_shared_bytes(64, np.float16),
                  "flash_attention_tc_d128": kernels.attention_shared_bytes(128, np.float16)}


def suffixes(stem: str) -> tuple[str, ...]:
    return ONLY_SUFFIXES.get(stem, tuple(DTYPE_SUFFIXES.values()))


@pytest.fixture(scope="module")
def ptx_by_source():
    """{(source, arch): PTX}, compiled with NVRTC in parallel (the library releases the GIL)."""
    jobs = [(source, arch) for source in SOURCES for arch in ARCHS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        texts = pool.map(lambda job: nvrtc.compile_ptx(kernel_source(job[0]), job[0], f"compute_{job[1]}",
                                                       NVRTC_OPTIONS), jobs)
    return dict(zip(jobs, texts))


@pytest.fixture(scope="module")
def resources(ptx_by_source):
    """{(kernel, arch): nvrtc.Resources} from ptxas -v."""
    found = {}
    for (source, arch), ptx in ptx_by_source.items():
        for name, usage in nvrtc.resources(ptx, f"sm_{arch}").items():
            found[name, arch] = usage
    return found


def test_every_source_is_listed_and_self_contained():
    """Headers pasted in, and of CUDA's only the two that CuPy's [ctk] (the gpu extras) ships: no
    <mma.h>, whose crt/mma.h only the nvcc wheel has."""
    assert sorted(p.name for p in KERNEL_DIR.glob("*.cu")) == sorted(SOURCES) == sorted(EXPECTED_KERNELS)
    for source in SOURCES:
        text = kernel_source(source)
        assert '#include "' not in text and "FOR_EACH_DTYPE" in text
        assert set(re.findall(r"#include <([^>]+)>", text)) == {"cuda_fp16.h", "cuda_bf16.h"}, source


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", SOURCES)
def test_source_emits_every_dtype_entry_point(ptx_by_source, source, arch):
    entries = set(re.findall(r"\.entry\s+(\w+)\(", ptx_by_source[source, arch]))
    expected = {f"{stem}_{suffix}" for stem in EXPECTED_KERNELS[source] for suffix in suffixes(stem)}
    assert entries == expected


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", SOURCES)
def test_kernels_fit_their_launch_without_spilling(resources, source, arch):
    """A spill puts per-thread state in local memory (slow); more registers than the SM holds
    for one block of the wrapper's size makes the launch fail."""
    for stem, threads in EXPECTED_KERNELS[source].items():
        for suffix in suffixes(stem):
            usage = resources[f"{stem}_{suffix}", arch]
            assert usage.spill_stores == usage.spill_loads == 0, usage
            assert usage.registers * threads <= REGISTERS_PER_SM, usage
            assert usage.shared <= kernels.DEFAULT_SHARED_BYTES, usage


def test_resource_table_in_the_docs_is_current(resources):
    """docs/kernels.md lists what ptxas reports, per kernel stem (the dtypes' maximum), and the
    resident blocks per SM that follow (the least over the dtypes)."""
    docs = (KERNEL_DIR.parents[1] / "docs" / "kernels.md").read_text()
    assert f"NVRTC {nvrtc.version()}" in docs
    for source, stems in EXPECTED_KERNELS.items():
        for stem, threads in stems.items():
            cells = []
            for arch in ARCHS:
                usage = [resources[f"{stem}_{suffix}", arch] for suffix in suffixes(stem)]
                blocks = min(nvrtc.blocks_per_sm(u, threads, DYNAMIC_SHARED.get(stem, 0)) for u in usage)
                cells.append(f"{max(u.registers for u in usage)} | {max(u.spill_stores + u.spill_loads for u in usage)} | "
                             f"{blocks} ({100 * blocks * threads // 2048} %)")
            row = f"| `{stem}` | {threads} | {cells[0]} | {cells[1]} | {max(u.shared for u in usage)} |"
            assert row in docs, row


def test_the_performance_model_runs_the_fused_kernels_at_their_occupancy(resources):
    """benchmarks/performance_model.py's round-trip model launches the fused kernels with the
    block size of their wrappers and the blocks per SM ptxas's registers give the bf16 entry
    points on sm_90 (the H200 and H100)."""
    model = load_benchmark("performance_model")
    blocks = {stem: threads for stems in EXPECTED_KERNELS.values() for stem, threads in stems.items()}
    for stem, launch in model.fused_kernel_launches().items():
        assert launch.threads == blocks[stem], stem
        assert launch.resident == nvrtc.blocks_per_sm(resources[f"{stem}_bf16", "90"], launch.threads), stem


def test_occupancy_follows_the_limits():
    """ptxas figures -> blocks per SM, each limit in turn (guide's tables for sm_80 / sm_90)."""
    usage = nvrtc.Resources("k", "sm_90", registers=32, spill_stores=0, spill_loads=0, shared=0)
    assert nvrtc.blocks_per_sm(usage, 256) == 8  # 64 warps per SM
    assert nvrtc.blocks_per_sm(usage, 32) == 32  # 32 blocks per SM
    assert nvrtc.blocks_per_sm(nvrtc.Resources("k", "sm_90", 168, 0, 0, 0), 128) == 3  # 168 -> 5376 per warp, 12 warps
    assert nvrtc.blocks_per_sm(usage, 128, 49152) == 4  # (48 + 1) KiB of 228 KiB
    assert nvrtc.blocks_per_sm(nvrtc.Resources("k", "sm_80", 32, 0, 0, 0), 128, 49152) == 3  # of 164 KiB


# ---------------------------------------------------------------------------------------------
# CuPy's own compile path


class LoadedCubin:
    """Stands for cupy.cuda.function.Module: keeps the cubin CuPy would load onto the device."""

    def load(self, cubin):
        self.cubin = cubin

    def _set_mapping(self, mapping):  # CuPy's name-expression lookup; our kernels are extern "C"
        pass


@contextmanager
def cupy_compile_path():
    """A function text, arch -> (the options NVRTC got, cubin), compiling as
    `cupy.RawModule(code=text, options=NVRTC_OPTIONS)` compiles on a device of that compute
    capability.

    RawModule calls `cupy._core.core.compile_with_cache` (cupy/_core/raw.pyx: _get_raw_module),
    which assembles CuPy's options (`assemble_cupy_compiler_options`) and hands the source to
    `cupy.cuda.compiler._compile_module_with_cache`; that is called here the same way, with the
    cubin load replaced (its return type is a Cython Module, so the call is made one level down).
    """
    pytest.importorskip("cupy", reason="CuPy's compile path needs the [compile] extra")
    from cupy._core import core
    from cupy.cuda import compiler

    seen_options = {}
    real_compile = compiler._NVRTCProgram.compile

    def recording_compile(program, options=(), log_stream=None):
        seen_options[program.src] = tuple(options)
        return real_compile(program, options, log_stream)

    def compile_for(text: str, arch: str):
        patch.setattr(compiler, "_get_arch", lambda: arch)  # device.Device().compute_capability
        module = compiler._compile_module_with_cache(
            text, core.assemble_cupy_compiler_options(NVRTC_OPTIONS), extra_source=core._get_header_source(),
            backend="nvrtc")
        return seen_options[text], module.cubin

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CUPY_CACHE_IN_MEMORY", "1")  # never a stale cubin from the on-disk cache
        patch.setattr(compiler, "function", SimpleNamespace(Module=LoadedCubin))
        patch.setattr(compiler._NVRTCProgram, "compile", recording_compile)
        # memoized per device (it needs a device id); the rule itself is CuPy's
        patch.setattr(compiler, "_get_arch_for_options_for_nvrtc", compiler._get_arch_for_options_for_nvrtc.__wrapped__)
        yield compile_for


@pytest.fixture(scope="module")
def cupy_compiled():
    """{(source, arch): (the options NVRTC got, cubin)} of every source, by CuPy's path."""
    with cupy_compile_path() as compile_for:
        return {(source, arch): compile_for(kernel_source(source), arch) for arch in ARCHS for source in SOURCES}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", SOURCES)
def test_cupy_compiles_every_entry_point(cupy_compiled, source, arch):
    """The cubin's symbol table (NUL-separated names) holds every dtype's entry point."""
    options, cubin = cupy_compiled[source, arch]
    assert cubin[:4] == b"\x7fELF"
    for stem in EXPECTED_KERNELS[source]:
        for suffix in suffixes(stem):
            assert f"\0{stem}_{suffix}\0".encode() in cubin, f"{stem}_{suffix}"


@pytest.mark.parametrize("arch", ARCHS)
def test_cupy_path_adds_its_own_options(cupy_compiled, arch):
    """What makes this path differ from compile_ptx above, so what the test above covers."""
    from cupy._core import core

    options, _ = cupy_compiled["attention_tc.cu", arch]
    assert {f"-arch=sm_{arch}", "-ftz=true", "--device-as-default-execution-space",
            f"-I{core._get_header_dir_path()}", *NVRTC_OPTIONS} <= set(options)


# ---------------------------------------------------------------------------------------------
# Machine code (SASS), as CuPy compiles it


@pytest.fixture(scope="module")
def cupy_sass(cupy_compiled):
    """{(kernel, arch): instructions} of every source's cubins from CuPy's path."""
    try:
        return {(name, arch): code for (source, arch), (_, cubin) in cupy_compiled.items()
                for name, code in nvrtc.sass(cubin).items()}
    except nvrtc.NvrtcError as err:
        pytest.skip(f"reading SASS needs the [compile] extra's cuobjdump and nvdisasm: {err}")


def count(instructions, prefix: str) -> int:
    return sum(i.opcode.startswith(prefix) for i in instructions)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("stem, padded", [("flash_attention_tc", 64), ("flash_attention_tc_d128", 128)])
@pytest.mark.parametrize("suffix", ["f16", "bf16"])
def test_tensor_core_attention_machine_code_is_the_design(cupy_sass, arch, stem, padded, suffix):
    """Two key-tile loops (the loops holding HMMA), one per copy width (16-byte copies when rows
    are 16-byte aligned, 8-byte ones for head dims like 52), hold all the MMAs the design implies:
    per tile of n = MMA_KEY_TILES[Dp] keys and each of a warp's `atoms` m16 atoms, S = Q K^T is
    (n / 8) x (Dp / 16) m16n8k16 steps and P V (n / 16) x (Dp / 8), each one HMMA.16816.F32
    (.BF16 for bf16); its operands come by LDSM (Q's atoms x Dp / 16 fragments a tile, K's (n / 8)
    (Dp / 32) x4 loads, V's (n / 16) (Dp / 16) transposed x4 loads, each shared by the atoms), its
    K/V tiles by LDGSTS (cp.async) waited for with DEPBAR, and nothing anywhere goes through local
    memory (LDL/STL: spills or indexed arrays)."""
    code = cupy_sass[f"{stem}_{suffix}", arch]
    n, atoms = kernels.MMA_KEY_TILES[padded], kernels.MMA_ATOMS[padded]
    hmma = "HMMA.16816.F32.BF16" if suffix == "bf16" else "HMMA.16816.F32"
    loops = nvrtc.key_tile_loops(code)
    design = atoms * ((n // 8) * (padded // 16) + (n // 16) * (padded // 8))
    assert sorted(loops) == [8, 16] and count(code, "HMMA") == 2 * design
    for loop in loops.values():
        assert count(loop, "HMMA") == sum(i.opcode == hmma for i in loop) == design
        assert count(loop, "LDSM.16.M88.4") == atoms * padded // 16 + (n // 8) * (padded // 32)
        assert count(loop, "LDSM.16.MT88.4") == (n // 16) * (padded // 16)
        assert count(loop, "LDGSTS") > 0 and count(loop, "DEPBAR") > 0
    assert count(code, "LDL") == count(code, "STL") == 0


def b16_trip(code: list[nvrtc.Instruction]) -> nvrtc.LoopTrip:
    """One key tile along B/16's path (nvrtc.loop_trip): 16-byte copies, no bias or mask, the next
    tile staged, not the first tile."""
    return nvrtc.loop_trip(nvrtc.key_tile_loops(code)[16])


def assert_one_tile_in_flight(trip: nvrtc.LoopTrip):
    """cp.async.wait_group 1 (DEPBAR.LE SB0, 0x1): the wait lets tile j + 1's copies stay in
    flight while tile j is used; wait_group 0 (SB0, 0x0) would wait for them too."""
    waits = [i.operands for i in trip.path if i.opcode == "DEPBAR.LE"]
    assert waits == ["SB0, 0x1"], waits


@pytest.mark.parametrize("suffix", ["f16", "bf16"])
def test_tensor_core_attention_key_loop_keeps_one_tile_in_flight(cupy_sass, suffix):
    assert_one_tile_in_flight(b16_trip(cupy_sass[f"flash_attention_tc_{suffix}", "90"]))


@pytest.mark.parametrize("suffix", ["f16", "bf16"])
def test_tensor_core_attention_key_loop_issues_at_most_7_instructions_per_mma(cupy_sass, suffix):
    """sm_90, B/16's path (head dim 64, two m16 atoms a warp): per warp and 64-key tile, the
    design's 128 HMMA, 40 LDSM (Q's 8 fragments, re-read every tile, and K's and V's 16 + 16, each
    feeding two MMAs: LDSM / HMMA = 0.31), 8 LDGSTS (2 x 64 rows x 8 chunks / 128 threads) and 68
    MUFU.EX2 (per atom 32 probabilities and 2 corrections a thread), and at most 7 instructions per
    HMMA in all: 32-key tiles come to 7.6 with Q's fragments re-read (489 / 64: a tile's barriers,
    O's rescale and the loop's own instructions come twice as often per key) and issued 7.4 with
    them kept; FlashAttention-2 issues 3-4 at this head dim, the first WMMA kernel about 15."""
    counts = b16_trip(cupy_sass[f"flash_attention_tc_{suffix}", "90"]).by_class()
    n, atoms = kernels.MMA_KEY_TILES[64], kernels.MMA_ATOMS[64]
    assert counts["HMMA"] == atoms * ((n // 8) * 4 + (n // 16) * 8)
    assert counts["LDSM"] == atoms * 4 + (n // 8) * 2 + (n // 16) * 4 <= counts["HMMA"] / 3
    assert counts["LDGSTS"] == 2 * n * 8 // (kernels.MMA_WARPS * 32)
    assert counts["MUFU"] == atoms * (n // 2 + 2)
    assert_at_most_7_instructions_per_mma(counts)


def assert_at_most_7_instructions_per_mma(counts: dict[str, int]):
    assert counts["total"] <= 7 * counts["HMMA"], f"{counts['total'] / counts['HMMA']:.2f} instructions per HMMA"


def test_planted_32_key_tiles_fail_the_instructions_per_mma_bound():
    """The key tile at Dp 64 set back to 32 (Q's fragments still re-read every tile): the results
    stay right, and every other SASS check holds at its own tile size, but a tile's barriers, O's
    rescale and the loop's own instructions now come twice per 64 keys: 7.6 instructions per HMMA."""
    text = kernel_source("attention_tc.cu")
    define = f"#define MMA_KEY_TILE_D64 {kernels.MMA_KEY_TILES[64]}\n"
    assert define in text
    with cupy_compile_path() as compile_for:
        _, cubin = compile_for(text.replace(define, "#define MMA_KEY_TILE_D64 32\n"), "90")
    counts = b16_trip(nvrtc.sass(cubin)["flash_attention_tc_bf16"]).by_class()
    assert counts["HMMA"] == 64
    with pytest.raises(AssertionError, match="7.6"):
        assert_at_most_7_instructions_per_mma(counts)


def test_planted_wait_for_every_copy_fails_the_wait_depth_check():
    """cp_async_wait<0> in place of <1>: no copy overlaps a tile's work any more. Every other
    SASS test and the parity tests pass with it; the wait depth check does not."""
    text = kernel_source("attention_tc.cu")
    assert "cp_async_wait<1>();" in text
    with cupy_compile_path() as compile_for:
        _, cubin = compile_for(text.replace("cp_async_wait<1>();", "cp_async_wait<0>();"), "90")
    trip = b16_trip(nvrtc.sass(cubin)["flash_attention_tc_bf16"])
    with pytest.raises(AssertionError, match="SB0, 0x0"):
        assert_one_tile_in_flight(trip)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("suffix", DTYPE_SUFFIXES.values())
def test_memory_bound_kernels_move_16_byte_packs(cupy_sass, arch, suffix):
    """The kernels bound by DRAM (docs/performance-model.md) load and store 16 bytes an access
    (LDG.E.128 / STG.E.128) on their vector paths, and nothing goes through local memory.
    swiglu / geglu: a thread's gate, up and out packs, 2 loads and 1 store, and no integer
    division (I2F.U64.RP / I2F.U32.RP start the 64- and 32-bit division sequences; the old
    kernel divided a 64-bit index per element). rms_norm / add_rms_norm: at least the
    NORM_PACKS_PER_LANE packs a lane keeps (per tensor read in the first pass). qkv_heads: per
    pair slot of a lane (MAX_PAIRS_PER_LANE), the lo and hi packs of qkv, bias and the norm
    weight, and of the cos and sin tables (fp32, N values: N / 4 loads each), and 2 stores."""
    def count_exact(code, opcode):
        return sum(i.opcode == opcode for i in code)

    constants = kernels.KERNEL_CONSTANTS
    n = 16 // (4 if suffix == "f32" else 2)  # values in a pack
    for stem in ("rms_norm", "add_rms_norm", "swiglu", "geglu", "qkv_heads"):
        code = cupy_sass[f"{stem}_{suffix}", arch]
        assert count(code, "LDL") == count(code, "STL") == 0, stem
    for stem in ("swiglu", "geglu"):
        code = cupy_sass[f"{stem}_{suffix}", arch]
        assert count_exact(code, "LDG.E.128") == 2 and count_exact(code, "STG.E.128") == 1, stem
        assert count(code, "I2F.U64") == count(code, "I2F.U32.RP") == 0, stem
    for stem, tensors in (("rms_norm", 1), ("add_rms_norm", 3)):
        code = cupy_sass[f"{stem}_{suffix}", arch]
        assert count_exact(code, "LDG.E.128") >= tensors * constants["NORM_PACKS_PER_LANE"], stem
        assert count_exact(code, "STG.E.128") >= constants["NORM_PACKS_PER_LANE"], stem
    code, pairs = cupy_sass[f"qkv_heads_{suffix}", arch], constants["MAX_PAIRS_PER_LANE"]
    assert count_exact(code, "LDG.E.128") == pairs * (6 + 2 * n // 4)
    assert count_exact(code, "STG.E.128") == 2 * pairs
