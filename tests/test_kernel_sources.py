"""The CUDA sources and their Python wrappers share one table of tile sizes (KERNEL_CONSTANTS):
`kernel_source` writes it into every source as #defines, no source defines those names itself,
and a launch geometry changed in the table alone still gives the reference's numbers."""

from __future__ import annotations

import re

import numpy as np
import pytest

from minit2i.accelerated import kernels
from minit2i.accelerated.kernels import KERNEL_CONSTANTS, KERNEL_DIR, SOURCES, kernel_source
from minit2i.accelerated.pipeline import CudasimRunner
from minit2i.reference import layers as ref

SOURCE_FILES = sorted(KERNEL_DIR.glob("*.cu")) + sorted(KERNEL_DIR.glob("*.cuh"))


def test_sources_are_the_listed_files():
    assert sorted(SOURCES) == sorted(p.name for p in KERNEL_DIR.glob("*.cu"))


@pytest.mark.parametrize("path", SOURCE_FILES, ids=lambda p: p.name)
def test_no_source_defines_a_shared_constant(path):
    defined = set(re.findall(r"^\s*#\s*define\s+(\w+)", path.read_text(), re.M))
    assert defined & set(KERNEL_CONSTANTS) == set()


def test_every_shared_constant_is_used_by_a_source():
    text = "".join(p.read_text() for p in SOURCE_FILES)
    assert [name for name in KERNEL_CONSTANTS if not re.search(rf"\b{name}\b", text)] == []


@pytest.mark.parametrize("source", SOURCES)
def test_compiled_text_starts_with_the_table(source):
    lines = kernel_source(source).splitlines()
    assert lines[:len(KERNEL_CONSTANTS)] == [f"#define {k} {v}" for k, v in KERNEL_CONSTANTS.items()]


@pytest.fixture
def other_geometry(monkeypatch):
    """attention.cu with 4 query rows per warp instead of 8, changed in the table alone."""
    monkeypatch.setitem(KERNEL_CONSTANTS, "ROWS_PER_WARP", 4)
    monkeypatch.setitem(KERNEL_CONSTANTS, "ROWS_PER_BLOCK", 4 * KERNEL_CONSTANTS["WARPS"])
    CudasimRunner.array_module()
    kernels.clear_device_caches()
    yield
    kernels.clear_device_caches()


def test_a_geometry_changed_in_the_table_reaches_kernel_and_launch(other_geometry):
    """40 query rows need 3 blocks of 16 rows under the changed table (2 blocks of the default
    32 would leave 8 rows unwritten). Bound: fp32 kernel, 2 (u + (Dh + Lk) u) as in
    tests/test_accelerated.py."""
    rng = np.random.default_rng(0)
    q64, k64, v64 = (rng.standard_normal((1, 2, n, 16)).astype(np.float32).astype(np.float64) for n in (40, 21, 21))
    cp = kernels.cp
    out = kernels.attention(*(cp.asarray(a, np.float32) for a in (q64, k64, v64)), 0.25)
    expected = ref.merge_heads(ref.attention(q64, k64, v64, 0.25, np.zeros((1, 2, 40, 21))))
    error = np.max(np.abs(cp.asnumpy(out) - expected)) / np.max(np.abs(expected))
    assert error < 2 * (2**-24 + (16 + 21) * 2**-24)
    assert kernel_source("attention.cu").startswith("#define WARPS 4\n#define ROWS_PER_WARP 4\n#define ROWS_PER_BLOCK 16\n")
