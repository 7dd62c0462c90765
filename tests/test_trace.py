"""The divergence tracer: layer order, real error sizes, and the first divergent layer."""

from __future__ import annotations

import numpy as np
import pytest

import minit2i.reference.mean_flow as mean_flow
import minit2i.reference.mmjit as mmjit
import minit2i.reference.t5 as t5
from minit2i.cli import main
from minit2i.core.errors import MiniT2IError
from minit2i.pipeline import load_model
from minit2i.trace import Side, default_tolerance, first_divergence, format_report, trace

FP64, FP32 = Side("numpy", "fp64"), Side("numpy", "fp32")
TINY_LAYERS = ["t5.block.0", "t5.block.1", "t5.output", "patch_embed", "txt_embed", "preamble.0", "preamble.1",
               "double.0.img", "double.0.txt", "double.1.img", "double.1.txt", "final_layer"]


@pytest.fixture(scope="module")
def model(tiny_model):
    return load_model(*tiny_model)


def run(model, a=FP64, b=FP32, tolerance=None):
    return trace(model, a, b, "a red cat", seed=3, width=48, height=32, tolerance=tolerance)


def test_fp32_against_fp64_stays_within_float32_rounding(model):
    diffs = run(model)
    assert [d.name for d in diffs] == TINY_LAYERS
    assert first_divergence(diffs) is None
    by_name = {d.name: d for d in diffs}
    assert by_name["t5.block.0"].shape == (1, 16, 64)
    assert by_name["double.1.img"].shape == (2, 6, 64)  # [cond ; uncond], 2x3 patches
    assert by_name["final_layer"].shape == (2, 6, 768)
    for d in diffs:  # real float32 error: present, and of float32 size relative to the layer
        assert 1e-9 < d.max_rel < 1e-5, d
        assert d.max_abs == pytest.approx(d.max_rel * d.scale)


def test_identical_sides_agree_exactly(model):
    diffs = run(model, FP32, FP32)
    assert all(d.max_abs == 0.0 for d in diffs)


def test_perturbed_double_block_is_the_first_divergence(model, monkeypatch):
    real = mmjit.double_block

    def off_in_float32(img, txt, block, rope, config):
        img, txt = real(img, txt, block, rope, config)
        return (img + np.float32(1e-3), txt) if img.dtype == np.float32 else (img, txt)

    monkeypatch.setattr(mmjit, "double_block", off_in_float32)
    diffs = run(model)
    first = first_divergence(diffs)
    assert first.name == "double.0.img"
    assert first.max_abs == pytest.approx(1e-3, rel=1e-2)
    assert all(d.within for d in diffs[:diffs.index(first)])
    assert "first divergence: double.0.img" in format_report(diffs, FP64, FP32, default_tolerance(FP64, FP32))


def test_perturbed_t5_block_is_the_first_divergence(model, monkeypatch):
    real = t5.encoder_block

    def off_in_float32(h, block, bias, config):
        out = real(h, block, bias, config)
        return out * np.float32(1.001) if out.dtype == np.float32 else out

    monkeypatch.setattr(t5, "encoder_block", off_in_float32)
    diffs = run(model)
    assert first_divergence(diffs).name == "t5.block.0"
    # The MMJiT runs share side a's context, so the T5 error does not leak into them.
    assert all(d.within for d in diffs if not d.name.startswith("t5."))


def test_tolerance_decides_divergence(model):
    assert first_divergence(run(model, tolerance=(1e-9, 0.0))).name == "t5.block.0"


@pytest.mark.parametrize("a, b, expected", [
    ("numpy:fp64", "numpy:fp32", (1e-5, 1e-6)),
    ("numpy:fp32", "cupy:bf16", (8e-2, 1e-6)),
    ("cupy:fp16", "numpy:fp64", (3e-2, 1e-6)),
])
def test_default_tolerance_follows_the_less_precise_side(a, b, expected):
    assert default_tolerance(Side.parse(a), Side.parse(b)) == expected


@pytest.mark.parametrize("text", ["numpy", "torch:fp32", "numpy:fp8", ""])
def test_bad_side_is_a_clear_error(text):
    with pytest.raises(MiniT2IError, match="write backend:precision"):
        Side.parse(text)


def test_cupy_side_without_a_gpu_is_a_clear_error(model):
    from minit2i.accelerated.kernels import require_gpu

    try:
        require_gpu()
    except MiniT2IError:
        with pytest.raises(MiniT2IError, match="--backend cupy needs CuPy and an NVIDIA GPU"):
            run(model, FP32, Side("cupy", "bf16"))
    else:
        pytest.skip("a GPU is present, so the cupy side runs instead of failing")


def test_cli_prints_the_table(tiny_model, capsys):
    transformer, t5_dir = tiny_model
    assert main(["trace", "--model", str(transformer), "--t5", str(t5_dir), "-W", "32", "-H", "32"]) == 0
    out = capsys.readouterr().out
    assert "a = numpy:fp64, b = numpy:fp32" in out
    assert "double.1.txt  2x16x64" in out  # tiny model: 16 text tokens
    assert out.strip().endswith("no divergence: all 12 layers within tolerance")


def test_cli_reports_divergence_with_status_1(tiny_model, capsys):
    transformer, t5_dir = tiny_model
    argv = ["trace", "--model", str(transformer), "--t5", str(t5_dir), "-W", "32", "-H", "32", "--rtol", "1e-9",
            "--atol", "0"]
    assert main(argv) == 1
    assert "first divergence: t5.block.0" in capsys.readouterr().out


def test_cli_rejects_bad_sizes_before_running(tiny_model, capsys):
    transformer, t5_dir = tiny_model
    assert main(["trace", "--model", str(transformer), "--t5", str(t5_dir), "-W", "40"]) == 2
    assert "--width 40 is not a positive multiple of the patch size 16" in capsys.readouterr().err


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_trace_against_the_twin_on_cudasim_prints_every_layer(model, precision):
    """numpy:fp64 against the CuPy twin run by cudasim: every layer reported, none beyond the
    tolerance of the less precise side (the GPU parity tests' per-stage bounds)."""
    b = Side("cudasim", precision)
    diffs = run(model, FP64, b)
    assert [d.name for d in diffs] == TINY_LAYERS
    assert first_divergence(diffs) is None
    assert all(d.max_abs > 0 for d in diffs)  # really another implementation, not the reference again
    report = format_report(diffs, FP64, b, default_tolerance(FP64, b))
    assert all(name in report for name in TINY_LAYERS) and "no divergence" in report


STUDENT_LAYERS = TINY_LAYERS[:4] + ["aux_tokens"] + TINY_LAYERS[4:]


@pytest.fixture(scope="module")
def student(tiny_student):
    return load_model(*tiny_student)


def test_student_trace_reports_its_prefix_and_one_row(student):
    """A Mean Flow student is traced at its first sampler step: one row (no uncond branch), the
    prefix stage reported, and its text stream A + L = 9 + 16 tokens long."""
    diffs = run(student)
    assert [d.name for d in diffs] == STUDENT_LAYERS
    assert first_divergence(diffs) is None
    by_name = {d.name: d for d in diffs}
    assert by_name["aux_tokens"].shape == (1, 9, 64)
    assert by_name["txt_embed"].shape == (1, 25, 64)
    assert by_name["double.1.img"].shape == (1, 6, 64)
    for d in diffs:
        assert 1e-9 < d.max_rel < 1e-5, d


def test_student_prefix_perturbation_is_the_first_divergence(student, monkeypatch):
    real = mean_flow.aux_tokens

    def off_in_float32(*args):
        prefix = real(*args)
        return prefix + np.float32(1e-3) if prefix.dtype == np.float32 else prefix

    monkeypatch.setattr(mean_flow, "aux_tokens", off_in_float32)
    first = first_divergence(run(student))
    assert first.name == "aux_tokens" and first.max_abs == pytest.approx(1e-3, rel=1e-2)


def test_student_trace_against_the_twin_on_cudasim_keeps_the_stage_names(student):
    """The CuPy twin writes its own block loop (accelerated/mmjit.py `transformer_body`); the
    student's stages on cudasim have the reference's names, in its order, within tolerance."""
    diffs = run(student, FP64, Side("cudasim", "fp32"))
    assert [d.name for d in diffs] == STUDENT_LAYERS
    assert first_divergence(diffs) is None and all(d.max_abs > 0 for d in diffs)
