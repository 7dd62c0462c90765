"""The CuPy backend's failure path, on machines without CuPy or without a GPU (runs everywhere)."""

from __future__ import annotations

import numpy as np
import pytest

import minit2i.accelerated.kernels as kernels
from minit2i.accelerated.pipeline import CupyRunner, precision_dtype
from minit2i.cli import main
from minit2i.core.errors import MiniT2IError
from minit2i.pipeline import load_model


def _gpu_visible() -> bool:
    try:
        kernels.require_gpu()
    except MiniT2IError:
        return False
    return True


needs_no_gpu = pytest.mark.skipif(kernels._cupy is not None and _gpu_visible(), reason="a GPU is visible here")


@pytest.fixture
def without_cupy(monkeypatch):
    """Behave as if CuPy were not installed, whether or not it is."""
    monkeypatch.setattr(kernels, "_cupy", None)


def test_require_gpu_names_missing_cupy_and_the_fix(without_cupy):
    with pytest.raises(MiniT2IError) as err:
        kernels.require_gpu()
    message = str(err.value)
    assert message == ("--backend cupy needs CuPy and an NVIDIA GPU: CuPy is not installed; "
                       "pip install -e '.[gpu-cuda12]' (or '.[gpu-cuda13]' for a CUDA 13 driver) on a machine "
                       "with an NVIDIA GPU, or use --backend numpy")
    assert "\n" not in message


def test_runner_construction_fails_cleanly_without_cupy(without_cupy, tiny_model):
    model = load_model(*tiny_model)
    with pytest.raises(MiniT2IError, match="CuPy is not installed"):
        CupyRunner(model.mmjit, model.t5, "fp32")


@needs_no_gpu
@pytest.mark.skipif(kernels._cupy is None, reason="CuPy is not installed (the [compile] or [gpu] extra)")
def test_require_gpu_without_driver_names_the_cuda_error():
    with pytest.raises(MiniT2IError, match=r"^--backend cupy needs CuPy and an NVIDIA GPU: no (usable CUDA driver|GPU)"):
        kernels.require_gpu()


@pytest.mark.parametrize("precision, expected", [("fp32", np.float32), ("fp16", np.float16)])
def test_precision_dtype(precision, expected):
    assert precision_dtype(precision) == np.dtype(expected)


def test_unknown_precision_is_refused():
    with pytest.raises(MiniT2IError, match="runs fp32, fp16, bf16, not fp64"):
        precision_dtype("fp64")


def test_unsupported_kernel_dtype_is_refused():
    with pytest.raises(MiniT2IError, match="not float64"):
        kernels._kernel("rmsnorm.cu", "rms_norm", np.float64)


@pytest.mark.parametrize("patch_cupy", [True, False])
def test_cli_cupy_backend_without_gpu_prints_one_line_and_exits_2(patch_cupy, monkeypatch, tiny_model, tmp_path, capsys):
    if patch_cupy:
        monkeypatch.setattr(kernels, "_cupy", None)
    elif kernels._cupy is not None and _gpu_visible():
        pytest.skip("a GPU is visible here")
    transformer, t5 = tiny_model
    code = main(["generate", "-p", "a red cube", "--model", str(transformer), "--t5", str(t5), "--steps", "1",
                 "-W", "32", "-H", "32", "-o", str(tmp_path / "out.png"), "--backend", "cupy", "-q"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("minit2i: error: --backend cupy needs CuPy and an NVIDIA GPU: ")
    assert "--backend numpy" in err
    assert not (tmp_path / "out.png").exists()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_the_finite_check_runs_on_the_arrays_own_module(bad):
    """The sampler's per-step check reduces on the device (here cudasim's stand-in for CuPy)."""
    from minit2i.cudasim import standin
    from minit2i.pipeline import all_finite

    state = standin.asarray(np.zeros((1, 3, 4, 4), dtype=np.float32))
    assert all_finite(state)
    state[0, 1, 2, 3] = bad
    assert not all_finite(state)
    assert all_finite(np.ones(3)) and not all_finite(np.array([1.0, bad]))
