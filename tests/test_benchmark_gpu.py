"""benchmarks/gpu.py without a GPU: it parses its arguments, counts FLOPs right and exits cleanly."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minit2i.accelerated.kernels as kernels
from minit2i.core.mmjit_config import MMJIT_B16, MMJIT_TINY, mmjit_expected_shapes
from minit2i.core.weights import nest
from minit2i.reference.mmjit import mmjit_forward
from minit2i.reference.sampler import initial_noise, sample

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"


@pytest.fixture(scope="module")
def bench():
    """The script as a module, with its folder on sys.path as running it would put it
    (it imports its sibling performance_model)."""
    spec = importlib.util.spec_from_file_location("benchmark_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(SCRIPT.parent))
        yield module


def test_help_runs_without_a_gpu():
    result = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--precisions" in result.stdout and "--no-torch" in result.stdout


def test_defaults_are_the_documented_run(bench):
    args = bench.parse_args([])
    assert (args.variant, args.size, args.steps, args.precisions) == ("b16", 512, [10, 100], ["fp32", "fp16", "bf16"])


def test_no_gpu_exits_2_with_one_line(bench, monkeypatch, capsys):
    monkeypatch.setattr(kernels, "_cupy", None)
    assert bench.main(["--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CuPy is not installed" in err


def test_b16_forward_flops_match_the_spec_estimate(bench):
    """model.md 4.8: ~0.4 TFLOP per one-sample B/16 forward at 512x512; CFG doubles it."""
    assert bench.forward_flops(MMJIT_B16, 512, 1) == pytest.approx(0.4033e12, rel=1e-3)
    assert bench.forward_flops(MMJIT_B16, 512, 2) == 2 * bench.forward_flops(MMJIT_B16, 512, 1)


def test_random_params_have_checkpoint_shapes(bench):
    params = nest(bench.random_tensors(MMJIT_TINY))
    expected = mmjit_expected_shapes(MMJIT_TINY)
    assert params["double_blocks"][1]["img_mlp"]["w1"]["weight"].shape == expected["double_blocks.1.img_mlp.w1.weight"]
    assert np.all(params["final_layer"]["norm_final"]["weight"] == 1.0)


@pytest.mark.parametrize("name, precision, peak", [("NVIDIA H100 80GB HBM3", "bf16", 989.0),
                                                    ("NVIDIA H100 PCIe", "fp16", 756.0),
                                                    ("NVIDIA H200", "fp32", 67.0),
                                                    ("Tesla T4", "fp16", None)])
def test_peak_table(bench, name, precision, peak):
    assert bench.peak_tflops(name, precision) == peak


@pytest.mark.parametrize("name, model", [("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
                                         ("NVIDIA A100-SXM4-80GB", "A100 SXM"), ("Tesla T4", None)])
def test_the_performance_model_knows_the_device(bench, name, model):
    """Its predicted column is filled on the GPUs it describes (an H200: 4.8 TB/s, the H100's peaks)."""
    device = bench.model_device(name)
    assert (device.name if device else None) == model


def test_torch_baseline_is_the_reference_math(bench):
    """The eager PyTorch baseline, run on the CPU here, reproduces the reference sampler."""
    torch = pytest.importorskip("torch", reason="the PyTorch peer needs the [crosscheck] extra")
    config, steps, cfg_scale = MMJIT_TINY, 3, 4.0
    params = nest(bench.random_tensors(config, seed=3))
    got = bench.torch_sampler(torch, params, config, 32, steps, "fp32", cfg_scale, dev="cpu")().numpy()
    context = np.random.default_rng(1).standard_normal((1, config.prompt_length, config.txt_input_size), dtype=np.float32)
    mask = np.ones((1, config.prompt_length), np.float32)
    expected = sample(lambda x, c, m: mmjit_forward(params, config, x, c, m), initial_noise(0, 1, 3, 32, 32),
                      context, mask, steps, cfg_scale)
    assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) < 1e-5


def test_smoke_run_on_cudasim_runs_every_component(bench, capsys):
    """--smoke: the sampler with graph replay (alone and in a group of 2 images a forward, as
    gpu-check runs it) and every per-kernel case run on cudasim, untimed."""
    assert bench.main(["--smoke", "--precisions", "bf16", "--groups", "2"]) == 0
    out = capsys.readouterr().out
    assert "sampler, bf16: 2 steps ran" in out and "sampler, bf16: 2 steps of a group of 2 ran" in out
    assert "attention, bf16: 3 shapes ran (untimed; SDPA needs a GPU)" in out
    assert "attention, bf16: the 32-key tiles ran too (timed beside the shipped ones on a GPU)" in out

    for name in ("rms_norm", "add_rms_norm", "swiglu", "geglu", "qkv_heads (img)", "attention", "cfg_euler", "GEMM qkv (cuBLAS)"):
        assert any(line.split()[:len(name.split())] == name.split() and line.rstrip().endswith("-")
                   for line in out.splitlines()), name
    gemms = [line for line in out.splitlines() if line.startswith("gemm ") and "M x K x N" not in line]
    assert len(gemms) == 8 and all(" - " in line for line in gemms)  # captured and launched, untimed
    assert "sampler 2 steps bf16" in out and "a first and a second call ran (untimed)" in out


def test_the_gemm_shapes_timed_are_the_forwards_eight(bench):
    """B/16's trunk at 512 x 512 with CFG: per stream (512 text rows, 2,048 image rows) qkv
    [768 -> 2304], the attention projection [768 -> 768], w1|w3 [768 -> 4096] and w2 [2048 -> 768]."""
    from minit2i.accelerated.pipeline import CudasimRunner

    cases = bench.gemm_shape_cases(CudasimRunner.array_module(), MMJIT_B16, 512, "bf16")
    widths = {"qkv": (768, 2304), "attn proj": (768, 768), "w1|w3": (768, 4096), "w2": (2048, 768)}
    expected = {f"{name} ({stream})": (rows, *width) for name, width in widths.items()
                for stream, rows in (("txt", 512), ("img", 2048))}
    assert {name: shape for name, (_, shape) in cases.items()} == expected


def test_a_runner_with_the_fork_is_run_both_ways(bench, capsys):
    """Where the runner takes `fork_streams`, the sampler's two calls run with the text stream
    forked and without (here a cudasim runner that accepts and records it); where it does not, one
    line says so and the calls run once."""
    from minit2i.accelerated.pipeline import CudasimRunner

    seen = []

    class ForkingRunner(CudasimRunner):
        def __init__(self, mmjit, t5, precision="fp32", use_graph=True, fork_streams=True):
            seen.append(fork_streams)
            super().__init__(mmjit, t5, precision, use_graph)

    tensors = bench.random_tensors(MMJIT_TINY)
    bench.print_stream_fork(ForkingRunner, MMJIT_TINY, tensors, 32, 2, "fp32", 4.0, None, timed=False)
    out = capsys.readouterr().out
    assert seen == [True, False]
    assert "stream fork on: a first and a second call ran" in out and "stream fork off: a first" in out


def test_attention_shapes_are_the_b16_ones(bench):
    """The shapes timed beside SDPA: the joint attention at 512 and 256 pixels, the text preamble's."""
    from minit2i.core.mmjit_config import MMJIT_B16

    assert bench.attention_shapes(MMJIT_B16, 512) == [(2, 12, 1280, 64), (2, 12, 512, 64), (2, 12, 256, 64)]


def test_the_planted_32_key_tiles_follow_the_constant_and_the_shipped_ones_return(bench):
    """Inside key_tile_at_64(32) the source's #define, the launch's shared memory (Q [128, 64] and
    K, V [2, 32, 64], 16-bit: 32 KiB) and the kernel that runs are the 32-key version; after it the
    shipped 64-key one (48 KiB). Both compute the same attention: on [1, 2, 96, 64] bf16 (a whole
    and a partial 64-key tile, three 32-key ones) each is within 2 u_bf16 max|v| of the exact
    result plus fp32 terms under 1e-4 max|v| (test_accelerated's tensor-core bound: (Dh + 3) A +
    2.4 Lk + 2 ceil(Lk / 32) + 6 fp32 roundings with A < 20 here), so they differ by at most
    4 u_bf16 max|v| (u_bf16 = 2^-8) and that 2e-4."""
    from minit2i.accelerated.pipeline import CudasimRunner

    cp = CudasimRunner.array_module()
    shipped = kernels.MMA_KEY_TILES[64]
    rng = np.random.default_rng(3)
    q, k, v = (cp.asarray(rng.standard_normal((1, 2, 96, 64), dtype=np.float32)).astype(kernels.bfloat16_dtype())
               for _ in range(3))
    with bench.key_tile_at_64(32):
        assert "#define MMA_KEY_TILE_D64 32\n" in kernels.kernel_source("attention_tc.cu")
        assert kernels.attention_shared_bytes(64, kernels.bfloat16_dtype()) == 32 * 1024
        planted = cp.asnumpy(kernels.attention(q, k, v, 0.125).astype(np.float32))
    assert kernels.MMA_KEY_TILES[64] == shipped == 64
    assert f"#define MMA_KEY_TILE_D64 {shipped}\n" in kernels.kernel_source("attention_tc.cu")
    assert kernels.attention_shared_bytes(64, kernels.bfloat16_dtype()) == 48 * 1024
    ours = cp.asnumpy(kernels.attention(q, k, v, 0.125).astype(np.float32))
    v_max = float(np.max(np.abs(cp.asnumpy(v.astype(np.float32)))))
    assert np.max(np.abs(ours - planted)) <= (4 * 2.0**-8 + 2e-4) * v_max


def test_the_key_tile_comparison_predicts_each_version_from_its_own_machine_code(bench, monkeypatch, capsys):
    """print_key_tiles as gpu-check's benchmark part runs it, with the timer replaced (cudasim has
    no GPU clock): the 64-key and the planted 32-key version each get the pipe model's prediction
    from their own SASS, 30.9 and 34.1 µs at [2, 12, 1280, 64] bf16 (docs/performance-model.md): a
    predicted speed-up of 1.10, beside the measured one (here the fake timer's 1.25)."""
    from minit2i.accelerated.pipeline import CudasimRunner

    fake_us = {64: 40.0, 32: 50.0}
    monkeypatch.setattr(bench, "time_attention",
                        lambda cp, torch, shape, precision: (fake_us[kernels.MMA_KEY_TILES[64]], None))
    bench.print_key_tiles(CudasimRunner.array_module(), MMJIT_B16, 512, "bf16", images=(1,))
    line = capsys.readouterr().out.strip().splitlines()[-1]
    if line.endswith("predicted ?"):  # model_attention printed why it could not read the SASS
        pytest.skip("reading the attention kernel's SASS needs the [compile] extra")
    assert line == ("attention [2, 12, 1280, 64] bf16: 64-key tiles 40.0 µs, 32-key tiles 50.0 µs; "
                    "32-key / 64-key measured 1.25, predicted 1.10")
    assert kernels.MMA_KEY_TILES[64] == 64
