"""benchmarks/performance_model.py: its counts match the code that runs, and the docs are current."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from minit2i.accelerated import kernels
from minit2i.accelerated.pipeline import CudasimRunner
from minit2i.core.mmjit_config import MMJIT_B16, MMJIT_L16
from minit2i.pipeline import load_model, make_runner

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    """benchmarks/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model():
    return load_script("performance_model")


def test_docs_hold_the_generated_tables(model):
    docs = (ROOT / "docs" / "performance-model.md").read_text()
    for heading, rows in model.tables().items():
        assert f"## {heading}" in docs
        for row in rows:
            assert row in docs, row


@pytest.mark.parametrize("config", [MMJIT_B16, MMJIT_L16], ids=["b16", "l16"])
def test_gemm_and_attention_flops_match_the_benchmark_count(model, config):
    """fp32 (no head-dim padding): the model's FLOPs are benchmarks/gpu.py's forward_flops."""
    components = model.forward_components(config, 512, item=4)
    flops = sum(c.flops for c in components if c.kind in ("gemm", "attention"))
    assert flops == pytest.approx(load_script("gpu").forward_flops(config, 512, 2), rel=1e-12)


def test_launches_per_forward_match_a_forward_on_cudasim(model, tiny_model, monkeypatch):
    """Run one bf16 forward of the tiny model on cudasim and count its fused kernels
    (kernels.launch_counts) and cuBLAS GEMMs: the model predicts the same numbers."""
    tiny = load_model(*tiny_model)
    runner = make_runner(tiny, "cudasim", "bf16")
    cp = CudasimRunner.array_module()
    config, size = tiny.mmjit.config, 32
    gemms = []
    real_gemm = kernels.gemm
    monkeypatch.setattr(kernels, "gemm", lambda *a: gemms.append(1) or real_gemm(*a))
    kernels.launch_counts.clear()
    images = cp.zeros((2, config.in_channels, size, size), np.float32).astype(runner.dtype)
    context = cp.zeros((2, config.prompt_length, config.txt_input_size), np.float32).astype(runner.dtype)
    runner.denoise(images, context, cp.ones((2, config.prompt_length), np.float32))
    predicted = {c.name: c.launches for c in model.forward_components(config, size, item=2)}
    attention = sum(n for name, n in predicted.items() if name.startswith("attention L="))
    assert dict(kernels.launch_counts) == {
        name: predicted[name] for name in ("rms_norm", "add_rms_norm", "qkv_heads", "swiglu")} | {
        "flash_attention_tc": attention}
    assert len(gemms) == sum(n for name, n in predicted.items() if name.startswith("GEMM"))


def test_the_b16_bf16_h100_prediction_is_the_documented_one(model):
    docs = (ROOT / "docs" / "performance-model.md").read_text()
    predicted = model.cupy_run_ms(MMJIT_B16, 512, 10, model.H100, 2, model.Assumptions())
    assert f"guided bf16 generation on an H100 SXM: {predicted:.0f} ms**" in docs
