"""Every CUDA source under accelerated/kernels compiles with nvcc for sm_80 and sm_90, and
every dtype entry point (f32, f16, bf16) is emitted. Needs nvcc, not a GPU.

What is compiled is `kernel_source(...)`, the exact text CuPy hands to NVRTC (header inlined)."""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from accelerated.kernels import DTYPE_SUFFIXES, KERNEL_DIR, SOURCES, kernel_source

NVCC = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin:/usr/local/bin")
ARCHS = ("sm_80", "sm_90")
# Kernels (entry-point stems) each source must define, once per dtype suffix.
EXPECTED_KERNELS = {
    "rmsnorm.cu": ("rms_norm", "add_rms_norm"),
    "swiglu.cu": ("swiglu", "geglu"),
    "rope.cu": ("qkv_heads",),
    "attention.cu": ("flash_attention",),
    "sampler.cu": ("cfg_euler",),
}

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")


def compile_ptx(source: str, arch: str, out_dir) -> str:
    ptx, cu = out_dir / f"{source}.{arch}.ptx", out_dir / f"{arch}_{source}"
    cu.write_text(kernel_source(source))
    result = subprocess.run([NVCC, "-ptx", f"-arch={arch}", "-std=c++17", str(cu), "-o", str(ptx)],
                            capture_output=True, text=True)
    assert result.returncode == 0, f"{source} ({arch}) failed to compile:\n{result.stderr}"
    return ptx.read_text()


@pytest.fixture(scope="module")
def ptx_by_source(tmp_path_factory):
    """{(source, arch): ptx text}, compiled in parallel (nvcc is single-threaded)."""
    out_dir = tmp_path_factory.mktemp("ptx")
    jobs = [(source, arch) for source in SOURCES for arch in ARCHS]
    with ThreadPoolExecutor(max_workers=4) as pool:
        texts = pool.map(lambda job: compile_ptx(*job, out_dir), jobs)
    return dict(zip(jobs, texts))


def test_every_source_is_listed_and_self_contained():
    assert sorted(p.name for p in KERNEL_DIR.glob("*.cu")) == sorted(SOURCES) == sorted(EXPECTED_KERNELS)
    for source in SOURCES:
        text = kernel_source(source)
        assert '#include "' not in text and "FOR_EACH_DTYPE" in text


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", SOURCES)
def test_source_emits_every_dtype_entry_point(ptx_by_source, source, arch):
    entries = set(re.findall(r"\.entry\s+(\w+)\(", ptx_by_source[source, arch]))
    expected = {f"{stem}_{suffix}" for stem in EXPECTED_KERNELS[source] for suffix in DTYPE_SUFFIXES.values()}
    assert entries == expected


def test_attention_kernel_does_not_spill(tmp_path):
    """The register-resident accumulators (8 rows x 4 dims per lane) must fit without local memory."""
    cu = tmp_path / "attention.cu"
    cu.write_text(kernel_source("attention.cu"))
    result = subprocess.run([NVCC, "-cubin", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", str(cu),
                             "-o", str(tmp_path / "a.cubin")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", result.stderr)]
    assert len(spills) == len(DTYPE_SUFFIXES) and max(spills) == 0
