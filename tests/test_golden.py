"""The golden regression suite: the recording passes, and deliberate changes to the math fail it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import minit2i.reference.layers as layers
import minit2i.reference.mean_flow as mean_flow
import minit2i.reference.mmjit as mmjit
import minit2i.reference.sampler as sampler
import minit2i.reference.t5 as t5
from minit2i import golden
from minit2i.cli import main
from minit2i.core.errors import MiniT2IError

NETWORK_ITEMS = ["t5.hidden", "mmjit.x0", "sampler.image", "student.x0", "student.image"]
CACHED_TABLES = (layers.sincos_2d_table, layers.text_rope_angles, layers.image_rope_angles,
                 layers.text_rope, layers.joint_rope)


def copy_recording(folder) -> str:
    """Copy the committed manifest and its arrays file into `folder`; returns the arrays file name."""
    arrays_file = json.loads((golden.GOLDEN_DIR / golden.MANIFEST_NAME).read_text())["arrays_file"]
    for name in (golden.MANIFEST_NAME, arrays_file):
        shutil.copy(golden.GOLDEN_DIR / name, folder / name)
    return arrays_file


def failures(names=NETWORK_ITEMS) -> set[tuple[str, str]]:
    return {(o.item, o.check) for o in golden.check(names=names) if not o.passed}


def failing_items(names=NETWORK_ITEMS) -> set[str]:
    return {item for item, _ in failures(names)}


@pytest.fixture
def fresh_tables():
    """Position tables are lru_cached: one built under a perturbation must not leak into other
    tests, and one cached earlier must not hide the perturbation."""
    for table in CACHED_TABLES:
        table.cache_clear()
    yield
    for table in CACHED_TABLES:
        table.cache_clear()


def test_recording_passes_every_check():
    outcomes = golden.check()
    assert [(o.item, o.check) for o in outcomes] == [
        ("t5.hidden", "fp64"), ("t5.hidden", "fp32"), ("mmjit.x0", "fp64"), ("mmjit.x0", "fp32"),
        ("sampler.image", "fp64"), ("sampler.image", "fp32"), ("sampler.image", "fp32/pixels"),
        ("student.x0", "fp64"), ("student.x0", "fp32"),
        ("student.image", "fp64"), ("student.image", "fp32"), ("student.image", "fp32/pixels"),
        ("demo.png", "fp32/pixels"), ("demo-mf.png", "fp32/pixels"),
    ]
    assert all(o.passed for o in outcomes), "\n".join(o.line() for o in outcomes)


def test_recording_is_small_and_self_describing():
    sizes = sum(p.stat().st_size for p in golden.GOLDEN_DIR.iterdir())
    assert sizes < 1_000_000
    manifest, arrays = golden.load()
    assert set(manifest["items"]) == {item.name for item in golden.ITEMS}
    assert arrays["mmjit.x0"].dtype == np.float64 and arrays["mmjit.x0"].shape == (2, 3, 32, 48)
    assert arrays["sampler.image.pixels"].dtype == np.uint8
    assert arrays["demo.png.pixels"].shape == arrays["demo-mf.png.pixels"].shape == (64, 64, 3)


def test_an_install_reads_the_recording_it_ships_and_a_checkout_its_golden_folder(tmp_path):
    package = tmp_path / "site-packages" / "minit2i"
    package.mkdir(parents=True)
    assert golden.golden_dir(package) == tmp_path / "site-packages" / "golden"  # a checkout's layout
    (package / "golden_data").mkdir()
    assert golden.golden_dir(package) == package / "golden_data"
    assert golden.GOLDEN_DIR == golden.golden_dir()


def test_a_regular_install_ships_every_file_of_the_recording():
    """pyproject.toml maps golden/ to the package minit2i.golden_data and its package data globs
    match the manifest and the arrays file it names (a glob that misses one would leave
    `golden check` of an install without its recording)."""
    import fnmatch

    tomllib = pytest.importorskip("tomllib")
    setup = tomllib.loads((golden.GOLDEN_DIR.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "minit2i.golden_data" in setup["packages"] and setup["package-dir"]["minit2i.golden_data"] == "golden"
    patterns = setup["package-data"]["minit2i.golden_data"]
    arrays_file = json.loads((golden.GOLDEN_DIR / golden.MANIFEST_NAME).read_text())["arrays_file"]
    for name in (golden.MANIFEST_NAME, arrays_file):
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name


# ---------------------------------------------------------------------------------------------
# Perturbations of the math: each must be caught by the item(s) it affects, and only by them.


def test_mmjit_rms_norm_eps_is_caught(monkeypatch):
    monkeypatch.setattr(mmjit, "rms_norm", lambda x, weight, eps=1e-6: layers.rms_norm(x, weight, 1e-5))
    found = failures()
    assert ("mmjit.x0", "fp64") in found and ("sampler.image", "fp64") in found
    assert "t5.hidden" not in failing_items()


def test_t5_rms_norm_eps_is_caught(monkeypatch):
    monkeypatch.setattr(t5, "rms_norm", lambda x, weight, eps: layers.rms_norm(x, weight, 1e-5))
    found = failures()
    assert ("t5.hidden", "fp64") in found
    assert "mmjit.x0" not in failing_items()


def test_image_rope_axis_order_is_caught(fresh_tables, monkeypatch):
    real = layers.image_rope_angles

    def columns_first(grid_h, grid_w, head_dim):
        angles = real(grid_h, grid_w, head_dim)
        quarter = head_dim // 4
        return np.concatenate([angles[:, quarter:], angles[:, :quarter]], axis=1)

    monkeypatch.setattr(layers, "image_rope_angles", columns_first)
    assert failures() >= {("mmjit.x0", "fp64"), ("mmjit.x0", "fp32"), ("sampler.image", "fp32")}
    assert "t5.hidden" not in failing_items()


def test_ignoring_the_text_mask_is_caught(monkeypatch):
    monkeypatch.setattr(mmjit, "mask_text", lambda context, mask, mask_token: context)
    assert failures() >= {("mmjit.x0", "fp64"), ("mmjit.x0", "fp32"), ("sampler.image", "fp32/pixels")}
    assert "t5.hidden" not in failing_items()


def test_sincos_table_layout_is_caught(fresh_tables, monkeypatch):
    real = layers.sincos_2d_table

    def rows_first(grid_h, grid_w, dim, dtype=np.float32):
        table = real(grid_h, grid_w, dim, dtype)
        return np.concatenate([table[:, dim // 2:], table[:, :dim // 2]], axis=1)

    monkeypatch.setattr(mmjit, "sincos_2d_table", rows_first)
    assert failures() >= {("mmjit.x0", "fp64"), ("mmjit.x0", "fp32"), ("sampler.image", "fp32")}
    assert "t5.hidden" not in failing_items()


def test_cfg_formula_is_caught(monkeypatch):
    # A classic slip: push away from the unconditional prediction starting at the conditional one.
    monkeypatch.setattr(sampler, "guided_x0", lambda cond, uncond, scale: cond + scale * (cond - uncond))
    found = failures(None)
    assert {("sampler.image", "fp32"), ("sampler.image", "fp32/pixels"),
            ("demo.png", "fp32/pixels")} <= found
    assert {item for item, _ in found} == {"sampler.image", "demo.png"}


def test_rotated_student_prefix_is_caught(monkeypatch):
    monkeypatch.setattr(mean_flow, "unrotated_prefix", lambda rope, count: rope)
    assert failures() >= {("student.x0", "fp64"), ("student.x0", "fp32"), ("student.image", "fp64")}
    assert failing_items() == {"student.x0", "student.image"}


def test_sine_first_scalar_embedding_is_caught(monkeypatch):
    real = mean_flow.timestep_embedding

    def sine_first(values, dim, dtype=np.float32):
        embedding = real(values, dim, dtype)
        return np.concatenate([embedding[:, dim // 2:], embedding[:, :dim // 2]], axis=1)

    monkeypatch.setattr(mean_flow, "timestep_embedding", sine_first)
    assert failures() >= {("student.x0", "fp64"), ("student.image", "fp64")}
    assert failing_items() == {"student.x0", "student.image"}


# ---------------------------------------------------------------------------------------------
# Command line, recording and damaged recordings


def test_cli_check_reports_each_item(monkeypatch, capsys):
    assert main(["golden", "check", "--item", "t5.hidden", "--item", "mmjit.x0"]) == 0
    out = capsys.readouterr().out
    assert "PASS  t5.hidden" in out and "golden: 4/4 checks passed" in out

    monkeypatch.setattr(mmjit, "mask_text", lambda context, mask, mask_token: context)
    assert main(["golden", "check", "--item", "t5.hidden", "--item", "mmjit.x0"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  mmjit.x0" in out and "PASS  t5.hidden" in out
    assert out.strip().endswith("golden: 2/4 checks passed; failing: mmjit.x0")


def test_unknown_item_is_a_clear_error(capsys):
    assert main(["golden", "check", "--item", "nope"]) == 2
    assert "unknown golden item(s) nope; choose from t5.hidden" in capsys.readouterr().err


def test_record_refuses_to_overwrite_without_force(tmp_path, capsys):
    arrays_file = copy_recording(tmp_path)
    before = (tmp_path / arrays_file).read_bytes()
    assert main(["golden", "record", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minit2i: error: ") and "already exists" in err and "pass --force" in err
    with pytest.raises(MiniT2IError, match="pass --force"):
        golden.record(tmp_path)
    assert (tmp_path / arrays_file).read_bytes() == before


def test_record_then_check_round_trip(tmp_path):
    names = golden.record(tmp_path / "fresh")
    assert names == ["demo-mf.png.pixels", "demo.png.pixels", "mmjit.x0", "sampler.image", "sampler.image.pixels",
                     "student.image", "student.image.pixels", "student.x0", "t5.hidden"]
    assert all(o.passed for o in golden.check(tmp_path / "fresh"))
    # Same machine, same recipes: the new recording matches the committed one to float64 rounding.
    _, fresh = golden.load(tmp_path / "fresh")
    _, committed = golden.load()
    np.testing.assert_allclose(fresh["mmjit.x0"], committed["mmjit.x0"], rtol=1e-12, atol=1e-13)


def test_changed_recipe_is_reported_as_stale(tmp_path):
    copy_recording(tmp_path)
    manifest = json.loads((golden.GOLDEN_DIR / golden.MANIFEST_NAME).read_text())
    manifest["items"]["t5.hidden"]["recipe"]["weight_seed"] += 1
    (tmp_path / golden.MANIFEST_NAME).write_text(json.dumps(manifest))
    [outcome] = golden.check(tmp_path, ["t5.hidden"])
    assert not outcome.passed and outcome.check == "recording" and "golden record --force" in outcome.detail


def test_edited_array_fails_its_hash(tmp_path):
    arrays_file = copy_recording(tmp_path)
    _, arrays = golden.load()
    arrays["mmjit.x0"] = arrays["mmjit.x0"] + 1e-3
    np.savez_compressed(tmp_path / arrays_file, **arrays)
    [outcome] = golden.check(tmp_path, ["mmjit.x0"])
    assert not outcome.passed and "sha256" in outcome.detail


def test_missing_recording_is_a_clear_error(tmp_path):
    with pytest.raises(MiniT2IError, match="no golden recording in .*golden record"):
        golden.check(tmp_path)


@pytest.mark.parametrize("check, got, want, passed", [
    (golden.FloatCheck("fp32", rtol=1e-4, atol=1e-5), [1.0, 0.0], [1.0 + 0.9e-4, 0.9e-5], True),
    (golden.FloatCheck("fp32", rtol=1e-4, atol=1e-5), [1.0, 0.0], [1.0, 1.1e-5], False),
    (golden.PixelCheck("fp32"), np.array([10, 200], np.uint8), np.array([11, 199], np.uint8), True),
    (golden.PixelCheck("fp32"), np.array([10, 200], np.uint8), np.array([12, 200], np.uint8), False),
])
def test_comparisons_use_the_stated_tolerance(check, got, want, passed):
    assert check.compare(np.asarray(got), np.asarray(want))[0] is passed
