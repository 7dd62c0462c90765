"""Official JAX (Orbax) checkpoints: written here by the official writer (flax.training.checkpoints
on orbax, the `jax-test` extra), read back without JAX (tensorstore, the `jax` extra).

The Flax trees are built from our tiny random weights by the inverse of the name mapping of
model.md 2.5, written out below rule by rule from the torch side (it shares no code with
`core/flax_layout.py`), in the shape of the official training state: `params`, an
`ema_params_dict` of two decays, optimizer state and the step, the denoiser under `net` (and the
Mean Flow student's teacher under `pt_net`), or a params-only tree.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_hub import cli, pixels

from minit2i.cli import main

from minit2i.core.mean_flow_config import MEAN_FLOW_TINY
from minit2i.core.mmjit_config import MMJIT_TINY, mmjit_dead_shapes
from minit2i.core.orbax_file import OrbaxArrays
from minit2i.demo_models import random_mmjit_weights
from minit2i.model_files import inspect_mmjit

SMALL = ["-W", "64", "-H", "64", "--steps", "2", "-q"]
BASE_SEEDS = {"params": 11, "0.9999": 12, "0.99995": 13}  # one set of weights per tree


def needs_writer():
    pytest.importorskip("tensorstore", reason="needs the jax extra (tensorstore): pip install -e \".[jax]\"")
    return pytest.importorskip("flax.training.checkpoints",
                               reason="needs the jax-test extra (jax, flax, orbax): pip install -e \".[jax-test]\"")


def flax_leaf(name: str, value: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Our tensor name and torch-layout array -> the official Flax leaf path and array."""
    parts = [f"layers_{part}" if part.isdigit() else part for part in name.split(".")]
    if len(parts) > 1 and parts[-2] in ("proj1", "proj2"):  # plain nn.Conv: [out, in, kh, kw] -> [kh, kw, in, out]
        return parts[:-1] + ["kernel" if parts[-1] == "weight" else "bias"], (
            value.transpose(2, 3, 1, 0) if value.ndim == 4 else value)
    if parts[-1] == "weight" and parts[-2].endswith(("norm", "norm1", "norm2", "norm_final")):
        return parts[:-1] + ["_flax_rmsnorm", "kernel"], value
    if parts[-1] == "weight":
        return parts[:-1] + ["_flax_linear", "kernel"], value.T
    if parts[-1] == "bias":
        return parts[:-1] + ["_flax_linear", "bias"], value
    return parts + ["_flax_param", "param_tensor"], value  # mask_token, the student's *_tokens


def flax_tree(weights: dict[str, np.ndarray]) -> dict:
    tree: dict = {}
    for name, value in weights.items():
        path, array = flax_leaf(name, value)
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = np.ascontiguousarray(array, dtype=np.float32)
    return tree


def train_state(nets: dict[str, dict], step: int) -> dict:
    """The official TrainState as flax saves it: step, params, opt_state, ema_params_dict by decay."""
    zeros = {"net": {"img_embedder": {"proj2": {"bias": np.zeros(4, np.float32)}}}}
    return {"step": np.int64(step), "params": nets["params"],
            "opt_state": {"0": {"count": np.int32(step), "mu": zeros, "nu": zeros}, "1": {}},
            "ema_params_dict": {key: nets[key] for key in ("0.9999", "0.99995")}}


def base_nets(seeds=BASE_SEEDS) -> dict[str, dict]:
    return {tree: {"net": flax_tree(random_mmjit_weights(MMJIT_TINY, seed))} for tree, seed in seeds.items()}


def student_nets() -> dict[str, dict]:
    """The student under `net` (its dead t_embedder/pooled_embedder too), the teacher under `pt_net`."""
    c = MEAN_FLOW_TINY.cond_vec_size
    dead = {"t_embedder.mlp.0.weight": (c, 256), "t_embedder.mlp.0.bias": (c,),
            "t_embedder.mlp.2.weight": (c, c), "t_embedder.mlp.2.bias": (c,), "pooled_embedder.weight": (c, 64)}
    dead_weights = {name: np.full(shape, 0.5, np.float32) for name, shape in dead.items()}
    teacher = flax_tree({**random_mmjit_weights(MMJIT_TINY, 5), **dead_weights})
    return {tree: {"net": flax_tree({**random_mmjit_weights(MEAN_FLOW_TINY, seed), **dead_weights}), "pt_net": teacher}
            for tree, seed in (("params", 21), ("0.9999", 22), ("0.99995", 23))}


def write(folder: Path, state: dict, step: int = 5) -> Path:
    needs_writer().save_checkpoint_multiprocess(str(folder), state, step, keep=2)
    return folder / f"checkpoint_{step}"




@pytest.fixture(scope="session")
def base_checkpoint(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("jax-base"), train_state(base_nets(), 5))


@pytest.fixture(scope="session")
def student_checkpoint(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("jax-student"), train_state(student_nets(), 7), 7)


@pytest.fixture
def no_data_read(monkeypatch):
    """Fail the test if any array's data is read (the checks must refuse from metadata alone)."""
    def refuse(self, key):
        raise AssertionError(f"array data read before the checks finished: {key}")

    monkeypatch.setattr(OrbaxArrays, "tensor", refuse)


def assert_same(loaded: dict[str, np.ndarray], weights: dict[str, np.ndarray]) -> None:
    assert sorted(loaded) == sorted(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)


# ---------------------------------------------------------------------------------------------
# Names, layout and trees


def test_the_official_tree_is_read_in_the_torch_layout(base_checkpoint):
    checkpoint = inspect_mmjit(base_checkpoint)
    assert (checkpoint.format, checkpoint.tree.label) == ("Orbax (JAX)", "ema:0.99995")
    assert checkpoint.prefix == "ema_params_dict.0.99995.net."
    assert set(checkpoint.tree.others) == {"params", "ema:0.9999"}
    assert_same(checkpoint.load().tensors, random_mmjit_weights(MMJIT_TINY, BASE_SEEDS["0.99995"]))


@pytest.mark.parametrize("flag, tree", [("params", "params"), ("ema:0.9999", "0.9999"), ("ema", "0.99995")])
def test_jax_tree_chooses_the_tree(base_checkpoint, flag, tree):
    assert_same(inspect_mmjit(base_checkpoint, jax_tree=flag).load().tensors,
                random_mmjit_weights(MMJIT_TINY, BASE_SEEDS[tree]))


def test_a_params_only_checkpoint_reads_its_params(tmp_path):
    folder = write(tmp_path, {"params": base_nets()["params"]})
    checkpoint = inspect_mmjit(folder)
    assert (checkpoint.tree.label, checkpoint.tree.others) == ("params", ())
    assert "only parameter tree" in checkpoint.tree.why
    assert_same(checkpoint.load().tensors, random_mmjit_weights(MMJIT_TINY, BASE_SEEDS["params"]))


def test_the_student_reads_its_online_params_and_not_the_teacher(student_checkpoint):
    checkpoint = inspect_mmjit(student_checkpoint)
    assert checkpoint.tree.label == "params" and "include_ema" in checkpoint.tree.why
    assert sorted(checkpoint.ignored) == ["pooled_embedder.weight", "t_embedder.mlp.0.bias", "t_embedder.mlp.0.weight",
                                          "t_embedder.mlp.2.bias", "t_embedder.mlp.2.weight"]
    assert_same(checkpoint.load().tensors, random_mmjit_weights(MEAN_FLOW_TINY, 21))


def test_info_says_format_tree_and_the_other_trees(base_checkpoint, capsys):
    code, out, err = cli(capsys, "info", base_checkpoint)
    assert (code, err) == (0, "")
    assert "format:     Orbax (JAX)" in out
    assert "tree:       ema:0.99995: the highest EMA key" in out
    assert "other trees: params, ema:0.9999" in out


# ---------------------------------------------------------------------------------------------
# Where a checkpoint is found


def test_the_official_path_forms(tmp_path):
    runs = tmp_path / "run"
    write(runs, train_state(base_nets({"params": 1, "0.9999": 2, "0.99995": 3}), 100), 100)
    write(runs, train_state(base_nets(), 250), 250)  # the latest step
    want = random_mmjit_weights(MMJIT_TINY, BASE_SEEDS["0.99995"])
    assert_same(inspect_mmjit(runs).load().tensors, want)
    assert inspect_mmjit(runs / "checkpoint_100").files == [runs / "checkpoint_100"]
    hub_layout = tmp_path / "MiniT2I-B-16-jax"
    hub_layout.mkdir()
    shutil.copytree(runs / "checkpoint_250", hub_layout / "checkpoint")
    assert_same(inspect_mmjit(hub_layout).load().tensors, want)


def cache_files(checkpoint: Path) -> dict[str, bytes]:
    return {f"checkpoint/{p.relative_to(checkpoint).as_posix()}": p.read_bytes()
            for p in checkpoint.rglob("*") if p.is_file()}


def test_a_jax_repo_id_from_the_cache_offline(offline_hub, base_checkpoint, tiny_model, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    offline_hub.add("tiny-org/tiny-jax", {**cache_files(base_checkpoint), "README.md": b"not needed"})
    _, t5 = tiny_model
    code, out, err = cli(capsys, "generate", "-p", "a red cat", "--model", "tiny-org/tiny-jax", "--t5", t5, *SMALL,
                         "-o", "by-id.png")
    assert (code, err) == (0, ""), err
    code, _, err = cli(capsys, "generate", "-p", "a red cat", "--model", base_checkpoint, "--t5", t5, *SMALL,
                       "-o", "by-path.png")
    assert (code, err) == (0, ""), err
    np.testing.assert_array_equal(pixels("by-id.png"), pixels("by-path.png"))


def test_a_jax_repo_id_offline_and_not_cached_is_one_line(offline_hub, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", "MiniT2I/MiniT2I-B-16-jax", "-q")
    assert code == 2 and err.count("\n") == 1
    assert 'hf download MiniT2I/MiniT2I-B-16-jax --include "checkpoint*"' in err


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, no array data read


def state_with(change) -> dict:
    nets = base_nets()
    for tree in nets.values():
        change(tree["net"])
    return train_state(nets, 5)


def drop_mask_token(net):
    del net["mask_token"]


def transpose_txt_embedder(net):
    kernel = net["txt_embedder"]["_flax_linear"]["kernel"]
    net["txt_embedder"]["_flax_linear"]["kernel"] = np.ascontiguousarray(kernel[:, :32])


@pytest.mark.parametrize("change, message", [
    (drop_mask_token, "missing 1 tensor(s): mask_token"),
    (transpose_txt_embedder, "wrong shape for 1 tensor(s): txt_embedder.weight [32, 64] (expected [64, 64])"),
])
def test_a_damaged_tree_is_refused_before_any_data_is_read(tmp_path, capsys, no_data_read, change, message):
    folder = write(tmp_path, state_with(change))
    code, _, err = cli(capsys, "info", folder)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    code, _, err = cli(capsys, "generate", "-p", "a cat", "--model", folder, "--t5", folder, "-q")
    assert code == 2 and message in err, err


def test_a_tree_that_is_not_there(base_checkpoint, capsys, no_data_read):
    code, _, err = cli(capsys, "info", base_checkpoint, "--jax-tree", "ema:0.5")
    assert code == 2 and err.count("\n") == 1
    assert "has no parameter tree 'ema:0.5'; it has params, ema:0.9999, ema:0.99995" in err


def test_jax_tree_on_a_safetensors_file_is_refused(tiny_model, capsys):
    transformer, _ = tiny_model
    code, _, err = cli(capsys, "info", transformer, "--jax-tree", "params")
    assert code == 2 and "--jax-tree chooses a tree of a JAX (Orbax) checkpoint" in err


def test_a_damaged_manifest_is_one_line(base_checkpoint, tmp_path, capsys, no_data_read):
    damaged = tmp_path / "checkpoint_5"
    shutil.copytree(base_checkpoint, damaged)
    manifest = damaged / "manifest.ocdbt"
    manifest.write_bytes(manifest.read_bytes()[:20])
    code, _, err = cli(capsys, "info", damaged)
    assert code == 2 and err.count("\n") == 1
    assert "is not a readable Orbax checkpoint" in err and "re-download it" in err


def test_a_folder_named_like_a_checkpoint_without_metadata(tmp_path, capsys):
    folder = tmp_path / "checkpoint_3"
    (folder / "d").mkdir(parents=True)
    (folder / "manifest.ocdbt").write_bytes(b"\0" * 64)
    code, _, err = cli(capsys, "info", folder)
    assert code == 2 and err.count("\n") == 1 and "has no _METADATA" in err


def test_metadata_that_is_not_an_orbax_tree(tmp_path, capsys):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "_METADATA").write_text(json.dumps({"tree_metadata": {"x": {"key_metadata": "params"}}}))
    code, _, err = cli(capsys, "info", folder)
    assert code == 2 and err.count("\n") == 1 and "has no list of keys" in err


def test_without_tensorstore_a_jax_checkpoint_names_the_extra(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    leaf = {"key_metadata": [{"key": "params"}, {"key": "net"}, {"key": "mask_token"}]}
    (folder / "_METADATA").write_text(json.dumps({"tree_metadata": {"('params', 'net', 'mask_token')": leaf}}))
    monkeypatch.setitem(sys.modules, "tensorstore", None)  # `import tensorstore` raises ImportError
    code, _, err = cli(capsys, "info", folder)
    assert code == 2 and err.count("\n") == 1
    assert 'needs tensorstore, which is not installed; install the jax extra: pip install -e ".[jax]"' in err


# ---------------------------------------------------------------------------------------------
# Untrusted store files: kinds, sizes, what may be allocated, every chunk there


def damaged_copy(checkpoint: Path, folder: Path) -> Path:
    """A copy of the official writer's checkpoint folder, to damage."""
    shutil.copytree(checkpoint, folder / checkpoint.name)
    return folder / checkpoint.name


def store(folder: Path):
    """The checkpoint's OCDBT key-value store, opened through tensorstore to damage it as a writer would."""
    import tensorstore

    return tensorstore.KvStore.open({"driver": "ocdbt", "base": folder.resolve().as_uri() + "/"}).result()


# A leaf of the tree read by default (the highest EMA key), stored in one chunk of rank 4.
CHOSEN_LEAF = "ema_params_dict.0.99995.net.img_embedder.proj1.kernel"


def cli_within(capsys, seconds, *args):
    """`cli` in a thread, so that a run that blocks (tensorstore opening a FIFO) fails the test
    after `seconds` instead of hanging it."""
    import threading

    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(main([str(a) for a in args])), daemon=True)
    worker.start()
    worker.join(timeout=seconds)
    assert not worker.is_alive(), f"minit2i {args[0]} blocked"
    out, err = capsys.readouterr()
    return outcome[0], out, err


@pytest.mark.parametrize("part", ["manifest.ocdbt", "ocdbt.process_0/manifest.ocdbt", "data file"])
def test_a_fifo_in_the_store_is_refused_before_tensorstore_opens_it(base_checkpoint, tmp_path, capsys, part):
    """The hang guard is 60 s, over 10 times what `info` takes on this checkpoint."""
    damaged = damaged_copy(base_checkpoint, tmp_path)
    target = damaged / part if part != "data file" else sorted((damaged / "ocdbt.process_0" / "d").iterdir())[0]
    target.unlink()
    os.mkfifo(target)
    code, _, err = cli_within(capsys, 60, "info", damaged)
    assert code == 2 and err.count("\n") == 1
    assert f"{target}: expected a file of the checkpoint, found a FIFO; re-download it" in err, err


def test_a_huge_manifest_is_refused_by_its_size_unread(base_checkpoint, tmp_path, capsys):
    damaged = damaged_copy(base_checkpoint, tmp_path)
    with open(damaged / "manifest.ocdbt", "r+b") as manifest:
        manifest.truncate(100 * 2**20)  # sparse: nothing is written, and nothing may be read
    code, _, err = cli(capsys, "info", damaged)
    assert code == 2 and err.count("\n") == 1
    assert "manifest.ocdbt is 104.9 MB, more than the 16.8 MB an OCDBT manifest can be" in err, err


@pytest.mark.parametrize("edit, words", [
    (lambda meta: meta | {"chunks": [2**40, 1, 1, 1]}, "chunks [1099511627776, 1, 1, 1] (a list) do not fit the shape"),
    (lambda meta: meta | {"chunks": [1, 1, 1]}, "chunks [1, 1, 1] (a list) do not fit the shape"),
    (lambda meta: meta | {"shape": [2**20, 2**20, 4, 4], "chunks": [1, 1, 1, 1]}, "declares a shape of 70.4 TB"),
], ids=["a chunk beyond its axis", "chunks of another rank", "a huge shape"])
def test_a_shape_or_chunk_grid_asking_for_too_much_memory_is_refused_from_metadata(base_checkpoint, tmp_path, capsys,
                                                                                  no_data_read, edit, words):
    """A chunk larger than its array made tensorstore abort the process (std::bad_alloc)."""
    damaged = damaged_copy(base_checkpoint, tmp_path)
    key = CHOSEN_LEAF + "/.zarray"
    kvstore = store(damaged)
    kvstore.write(key, json.dumps(edit(json.loads(kvstore.read(key).result().value))).encode()).result()
    code, _, err = cli(capsys, "info", damaged)
    assert code == 2 and err.count("\n") == 1 and words in err, err


@pytest.mark.parametrize("damage", ["chunk deleted", "chunk keys renamed"])
def test_a_missing_chunk_is_refused_not_read_as_zeros(base_checkpoint, tmp_path, capsys, damage):
    """A chunk the store no longer holds, or chunk keys that no longer resolve (another
    dimension separator in the array's metadata), read as the fill value (zeros) before: convert
    wrote a wrong model and exited 0."""
    import tensorstore

    damaged = damaged_copy(base_checkpoint, tmp_path)
    leaf, kvstore = CHOSEN_LEAF, store(damaged)
    if damage == "chunk deleted":
        kvstore.delete_range(tensorstore.KvStore.KeyRange(leaf + "/0", leaf + "/1")).result()
    else:
        meta = json.loads(kvstore.read(leaf + "/.zarray").result().value)
        kvstore.write(leaf + "/.zarray", json.dumps(meta | {"dimension_separator": "/"}).encode()).result()
    (tmp_path / "out").mkdir()
    code, _, err = cli(capsys, "convert", damaged, tmp_path / "out" / "model.safetensors")
    assert code == 2 and err.count("\n") == 1
    assert f"is not a readable Orbax checkpoint (NOT_FOUND: chunk {{0, 0, 0, 0}} stored at \"{leaf}/0" in err, err
    assert list((tmp_path / "out").iterdir()) == []


def test_two_folders_of_one_step_are_refused_naming_both(base_checkpoint, tmp_path, capsys):
    for name in ("checkpoint_5", "checkpoint_05"):
        shutil.copytree(base_checkpoint, tmp_path / "run" / name)
    code, _, err = cli(capsys, "info", tmp_path / "run")
    assert code == 2 and err.count("\n") == 1
    assert "checkpoint_05 and checkpoint_5 both hold step 5; remove or rename all but one" in err, err


def test_links_out_of_a_checkpoint_are_followed_to_regular_files_only(base_checkpoint, tmp_path, capsys):
    """As in an HF cache, every file a link to a file elsewhere: read as the files themselves.
    A link to a device, or to a folder, is refused."""
    linked = tmp_path / "linked" / "checkpoint_5"
    for original in (p for p in base_checkpoint.rglob("*") if p.is_file()):
        copy = linked / original.relative_to(base_checkpoint)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.symlink_to(original)
    assert_same(inspect_mmjit(linked).load().tensors, inspect_mmjit(base_checkpoint).load().tensors)
    data = sorted((linked / "d").iterdir())[0]
    data.unlink()
    data.symlink_to("/dev/zero")
    code, _, err = cli(capsys, "info", linked)
    assert code == 2 and f"{data}: expected a file of the checkpoint, found a character device" in err, err
    data.unlink()
    data.symlink_to(tmp_path)
    code, _, err = cli(capsys, "info", linked)
    assert code == 2 and f"{data}: expected a file of the checkpoint, found a link to a folder" in err, err


# ---------------------------------------------------------------------------------------------
# convert


def test_convert_gives_the_same_images_and_the_diffusers_layout(base_checkpoint, tiny_model, tmp_path, capsys,
                                                                monkeypatch):
    from safetensors.numpy import load_file

    monkeypatch.chdir(tmp_path)
    _, t5 = tiny_model
    code, out, err = cli(capsys, "convert", base_checkpoint, "out/model.safetensors")
    assert code == 2 and "DST folder out does not exist" in err
    Path("out").mkdir()
    code, out, err = cli(capsys, "convert", base_checkpoint, "out/model.safetensors")
    assert (code, err) == (0, ""), err
    assert "ema:0.99995 tree" in out
    stored = load_file("out/model.safetensors")
    dead = mmjit_dead_shapes(MMJIT_TINY)
    assert all(name.startswith("model.net.") for name in stored)
    for name, shape in dead.items():
        assert stored["model.net." + name].shape == shape and not stored["model.net." + name].any()
    code, _, err = cli(capsys, "convert", base_checkpoint, "out/model.safetensors")
    assert code == 2 and "pass --force" in err
    code, _, err = cli(capsys, "convert", base_checkpoint, "out/model.safetensors", "--force")
    assert (code, err) == (0, "")
    for model, png in ((base_checkpoint, "orbax.png"), ("out/model.safetensors", "converted.png")):
        code, _, err = cli(capsys, "generate", "-p", "a red cat", "--model", model, "--t5", t5, *SMALL, "-o", png)
        assert (code, err) == (0, ""), err
    np.testing.assert_array_equal(pixels("orbax.png"), pixels("converted.png"))


def test_convert_keeps_the_student_bit_for_bit(student_checkpoint, tmp_path, capsys):
    destination = tmp_path / "student.safetensors"
    code, _, err = cli(capsys, "convert", student_checkpoint, destination)
    assert (code, err) == (0, ""), err
    converted = inspect_mmjit(destination)
    assert converted.prefix == "" and converted.config == inspect_mmjit(student_checkpoint).config
    original = inspect_mmjit(student_checkpoint).load().tensors
    for name, value in converted.load().tensors.items():
        assert value.dtype == original[name].dtype and value.tobytes() == original[name].tobytes(), name
    assert sorted(original) == sorted(converted.shapes)


def test_the_student_draws_from_orbax_and_converted_alike(student_checkpoint, tiny_student, tmp_path, capsys,
                                                           monkeypatch):
    """`generate` on the Orbax student and on its conversion: four steps, the same pixels."""
    monkeypatch.chdir(tmp_path)
    _, t5 = tiny_student
    assert cli(capsys, "convert", student_checkpoint, "student.safetensors")[0] == 0
    for model, png in ((student_checkpoint, "orbax.png"), ("student.safetensors", "converted.png")):
        code, out, err = cli(capsys, "generate", "-p", "a red cat", "--model", model, "--t5", t5, "-W", "64", "-H", "64",
                             "-o", png)
        assert code == 0, err
        assert "step 4" in out and "step 5" not in out
    with Image.open("orbax.png") as a, Image.open("converted.png") as b:
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_a_jax_repo_id_downloads_only_its_checkpoint_once(base_checkpoint, tiny_model, tmp_path, monkeypatch):
    import threading

    from test_hub import FakeHub, run_cli

    monkeypatch.chdir(tmp_path)
    checkpoint = cache_files(base_checkpoint)
    server = FakeHub({"tiny-org/tiny-jax": {**checkpoint, "README.md": b"# card\n",
                                            "checkpoint_100/_METADATA": b"{}"}})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"HF_ENDPOINT": server.url}
        _, t5 = tiny_model
        first = run_cli(tmp_path, env, "generate", "-p", "a cat", "--model", "tiny-org/tiny-jax", "--t5", t5,
                        *SMALL[:-1], "-o", "first.png")  # without -q: the download note
        assert first.returncode == 0, first.stderr
        notes = [line for line in first.stderr.splitlines() if line.startswith("minit2i:")]
        assert len(notes) == 1 and notes[0].startswith("minit2i: downloading tiny-org/tiny-jax checkpoint/")
        fetched = {path.split("/", 5)[-1] for method, path, _ in server.requests
                   if method == "GET" and "/resolve/" in path}
        assert fetched == set(checkpoint)
        before = len(server.requests)
        again = run_cli(tmp_path, env, "generate", "-p", "a cat", "--model", "tiny-org/tiny-jax", "--t5", t5, *SMALL,
                        "-o", "again.png")
        assert (again.returncode, again.stderr, len(server.requests)) == (0, "", before)
        np.testing.assert_array_equal(pixels("first.png"), pixels("again.png"))
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
