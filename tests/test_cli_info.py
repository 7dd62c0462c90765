"""`minit2i info`: what a weight file or folder holds, and one-line errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from safetensors.numpy import save_file

from minit2i.cli import main
from minit2i.core.mmjit_config import MMJIT_TINY, mmjit_expected_shapes
from minit2i.core.t5_config import T5_TINY, t5_expected_shapes
from minit2i.demo_models import random_mmjit_weights


def parameter_count(shapes) -> int:
    return sum(int(np.prod(s)) for s in shapes.values())


def run_info(capsys, *args):
    code = main(["info", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_info_on_the_transformer_folder(tiny_model, capsys):
    transformer_dir, _ = tiny_model
    code, lines, err = run_info(capsys, transformer_dir)
    assert (code, err) == (0, "")
    assert parameter_count(mmjit_expected_shapes(MMJIT_TINY)) == 371_136
    assert lines == [
        "MiniT2I MMJiT transformer",
        f"  files:      {transformer_dir / 'diffusion_pytorch_model.safetensors'}",
        f"  config:     {transformer_dir / 'config.json'}",
        "              image_size=64, patch_size=16, in_channels=3, txt_input_size=64, hidden_size=64, "
        "depth_double=2, txt_preamble_depth=2, num_heads=2, head_dim=32, mlp_ratio=2.6666666666666665, "
        "pca_channels=16, prompt_length=16, cond_vec_size=64",
        "  dtype:      F32 (loaded as float32)",
        "  parameters: 371,136 in 70 tensors",
        "  prefix:     model.net.",
        "  sampler:    Euler x0 -> v, cond + uncond per step: 100 steps, guidance 6.0, 64x64",
    ]


def test_info_on_the_t5_folder(tiny_model, capsys):
    _, t5_dir = tiny_model
    code, lines, err = run_info(capsys, t5_dir)
    assert (code, err) == (0, "")
    assert parameter_count(t5_expected_shapes(T5_TINY)) == 102_848
    assert lines == [
        "T5 encoder",
        f"  files:      {t5_dir / 'model.safetensors'}",
        f"  config:     {t5_dir / 'config.json'}",
        "              vocab_size=512, d_model=64, d_kv=16, num_heads=4, d_ff=96, num_layers=2, "
        "relative_attention_num_buckets=32, relative_attention_max_distance=128, layer_norm_epsilon=1e-06",
        "  dtype:      F32 (loaded as float32)",
        "  parameters: 102,848 in 21 tensors",
    ]


def test_info_on_a_half_precision_file_with_dead_tensors(tmp_path, capsys):
    weights = {k: v.astype(np.float16) for k, v in random_mmjit_weights(MMJIT_TINY, 0).items()}
    weights["t_embedder.mlp.0.weight"] = np.zeros((64, 256), np.float16)
    weights["pooled_embedder.weight"] = np.zeros((64, 64), np.float16)
    path = tmp_path / "minit2i_tiny_fp16.safetensors"
    save_file({"model.diffusion_model.net." + k: v for k, v in weights.items()}, str(path))
    code, lines, err = run_info(capsys, path)
    assert (code, err) == (0, "")
    assert lines[0] == "MiniT2I MMJiT transformer"
    assert lines[2] == "  config:     inferred from tensor shapes"
    assert lines[4:] == [
        "              assumed (not in the shapes, no config.json): image_size=512, prompt_length=256",
        "  dtype:      F16 (loaded as float32)",
        "  parameters: 371,136 in 70 tensors",
        "  prefix:     model.diffusion_model.net.",
        "  sampler:    Euler x0 -> v, cond + uncond per step: 100 steps, guidance 6.0, 512x512",
        "  ignored:    2 tensors (pooled_embedder, t_embedder)",
    ]


def test_bad_path_is_one_error_line_and_status_2(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    code, lines, err = run_info(capsys, missing)
    assert (code, lines) == (2, [])
    assert err == f"minit2i: error: {missing}: no such file or folder; check the path\n"


def test_empty_folder_is_one_error_line(tmp_path, capsys):
    code, lines, err = run_info(capsys, tmp_path)
    assert (code, lines) == (2, [])
    assert err == (
        f"minit2i: error: {tmp_path}: expected the MiniT2I transformer weights "
        "(diffusion_pytorch_model.safetensors), found no .safetensors file; check the path or download the "
        "weights into it\n")


def test_corrupt_file_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "model.safetensors"
    path.write_text("not a model\n")
    code, lines, err = run_info(capsys, path)
    assert (code, lines) == (2, [])
    assert err.startswith(f"minit2i: error: {path} is not a readable safetensors file (")
    assert err.endswith("); re-download or re-convert it\n") and err.count("\n") == 1


def test_console_entry_prints_no_traceback(tmp_path):
    missing = tmp_path / "nowhere"
    result = subprocess.run([sys.executable, "-m", "minit2i.cli", "info", str(missing)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"minit2i: error: {missing}: no such file or folder; check the path\n"


def test_info_picks_the_variant_of_a_pipeline_repo(tiny_model, tmp_path, capsys):
    transformer_dir, _ = tiny_model
    variant_dir = tmp_path / "minit2i-l-16" / "transformer"
    variant_dir.mkdir(parents=True)
    for name in ("config.json", "diffusion_pytorch_model.safetensors"):
        (variant_dir / name).write_bytes((transformer_dir / name).read_bytes())
    code, lines, err = run_info(capsys, tmp_path, "--variant", "l16")
    assert (code, err) == (0, "")
    assert lines[1] == f"  files:      {variant_dir / 'diffusion_pytorch_model.safetensors'}"
    code, lines, err = run_info(capsys, tmp_path)
    assert (code, lines) == (2, [])
    assert err == (f"minit2i: error: {tmp_path} has no variant 'minit2i-b-16'; it has minit2i-l-16: "
                   "pass --variant with one of them\n")
