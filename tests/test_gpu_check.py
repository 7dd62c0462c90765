"""scripts/gpu-check --cudasim, run as the GPU machine runs it: from a copy of the checkout (the
files a device run receives), with no install step (the copy is not the installed package) and
nothing but this interpreter's third-party packages. It must pass and write a report small
enough to copy back in one go."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu-check"
MAX_FILES, MAX_FILE_BYTES = 8, 16 * 2**20


@pytest.fixture(scope="module")
def gpu_check():
    """The script as a module (registered while it runs: its dataclasses look themselves up)."""
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("gpu_check", loader))
    sys.modules["gpu_check"] = module
    loader.exec_module(module)
    yield module
    del sys.modules["gpu_check"]


@pytest.fixture(scope="module")
def checkout_copy(tmp_path_factory):
    """The tracked and untracked-but-not-ignored files, as a device run carries them."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    copy = tmp_path_factory.mktemp("checkout")
    for name in files:
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    return copy


@pytest.fixture(scope="module")
def report(checkout_copy, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([sys.executable, str(checkout_copy / "scripts" / "gpu-check"), "--cudasim", "--out", str(out)],
                            cwd=checkout_copy, env=env, capture_output=True, text=True, timeout=600)
    return result, out


def test_cudasim_check_passes_from_a_copy_of_the_checkout(report, checkout_copy):
    result, out = report
    summary = (out / "summary.md").read_text()
    assert result.returncode == 0, result.stdout + result.stderr
    assert summary.startswith("# gpu-check PASSED (cudasim")
    assert f"minit2i imported from {checkout_copy.resolve()}" in summary  # the copy, not the installed package
    for part in ("versions", "parity", "sanitizer", "benchmark", "profile"):
        assert f"* {part}: passed" in summary, part


def test_report_names_every_kernel_and_dtype(report):
    _, out = report
    summary = (out / "summary.md").read_text()
    parity_line = next(line for line in summary.splitlines() if line.startswith("* parity"))
    assert "passed" in parity_line.split(": ", 2)[2] and "failed" not in parity_line  # counts of 0 are left out
    assert "test_tensor_core_attention_matches_softmax_attention[64-65-31-1-bf16]:" in summary
    for kernel in ("rms_norm", "add_rms_norm", "swiglu", "geglu", "qkv_heads", "cfg_euler", "euler_step"):
        for suffix in ("f32", "f16", "bf16"):
            assert f"| {kernel}_{suffix} |" in summary
    assert "| flash_attention_f32 |" in summary and "| flash_attention_tc_bf16 |" in summary


def test_report_fits_one_copy_back(report):
    _, out = report
    files = list(out.rglob("*"))
    assert 0 < len(files) <= MAX_FILES and all(f.is_file() and f.stat().st_size <= MAX_FILE_BYTES for f in files)


def test_import_root_maps_every_layer_folder(gpu_check, tmp_path):
    """The links follow pyproject.toml's package-dir: each layer folder appears as minit2i.<layer>."""
    root = gpu_check.import_root(REPO, tmp_path / "import")
    package = root / "minit2i"
    for layer in ("core", "reference", "accelerated", "cudasim", "training"):
        assert (package / layer).resolve() == REPO / layer
    assert (package / "__init__.py").resolve() == REPO / "minit2i" / "__init__.py"


def test_gpu_tests_are_the_marked_files(gpu_check):
    assert gpu_check.gpu_test_files() == ["tests/test_accelerated.py", "tests/test_accelerated_mean_flow.py"]


def test_ncu_csv_is_read_per_kernel_and_metric(gpu_check):
    output = ('==PROF== Connected to process 1\n'
              '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
              '"0","rms_norm_bf16(const __nv_bfloat16 *, int)","gpu__time_duration.sum","nsecond","12,480"\n'
              '"0","rms_norm_bf16(const __nv_bfloat16 *, int)","dram__bytes.sum","byte","41943040"\n')
    assert gpu_check.ncu_metrics(output) == {"rms_norm_bf16": {"gpu__time_duration.sum": 12480.0,
                                                                   "dram__bytes.sum": 41943040.0}}
