"""Bad input, faults and odd environments: one clear line, exit 2, nothing lost, checked first.

The first half generates bad inputs with hypothesis (safetensors headers and bodies, config
files, shard indexes, tokenizer files, argument values, library calls) and asserts the promise
for every one: exit status 2 (or `MiniT2IError` from the library) with one line and no
traceback, no new output file and an existing output unchanged; or, when the generated input
happens to be valid, a normal run. The second half has one regression test per root cause
found by such runs, grouped by the kind of failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import io
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

import minit2i.pipeline as pipeline
from minit2i import golden
from minit2i.cli import main
from minit2i.core import checkpoint, safetensors_file, weights
from minit2i.core.checks import Range
from minit2i.core.config_fields import to_json
from minit2i.core.errors import MiniT2IError
from minit2i.core.images import png_bytes, save_png
from minit2i.core.mmjit_config import MMJIT_TINY, MMJiTConfig, mmjit_expected_shapes
from minit2i.core.t5_config import T5_TINY, T5Config
from minit2i.core.tokenizer import PromptTokenizer, make_t5_style_tokenizer
from minit2i.demo_models import random_mmjit_weights, random_t5_weights
from minit2i.pipeline import Request
from minit2i.reference.pipeline import NumpyRunner
from minit2i.reference.t5 import t5_encode

# Every generated case runs the real CLI; these budgets keep the module to well under a minute.
CASES = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FEW = settings(CASES, max_examples=20)  # cases that can run a whole (tiny) generation
MANY = settings(CASES, max_examples=150)  # cases refused in milliseconds
OLD_BYTES = b"an existing output that a failed run must not touch"
TINY_ARGS = ["-p", "a red cat", "--steps", "1", "-W", "16", "-H", "16", "-q"]


def run_cli(*args) -> tuple[int, str, str]:
    """`minit2i ARGS` in-process -> (exit status, stdout, stderr); argparse's exit included."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(code, out, err, *words) -> str:
    """Exit 2, exactly one stderr line `minit2i: error: ...` holding `words`, no traceback."""
    assert "Traceback" not in out + err
    assert code == 2, (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("minit2i: error: "), err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


class Outputs:
    """An output folder holding one existing image (`b_0.png`), for `-o b.png -b 2`."""

    def __init__(self, root: Path):
        self.folder = root / "out"
        self.folder.mkdir()
        (self.folder / "b_0.png").write_bytes(OLD_BYTES)
        self.args = ["-o", self.folder / "b.png", "-b", "2"]

    def assert_untouched(self):
        assert sorted(p.name for p in self.folder.iterdir()) == ["b_0.png"]
        assert (self.folder / "b_0.png").read_bytes() == OLD_BYTES

    def assert_written(self):
        assert sorted(p.name for p in self.folder.iterdir()) == ["b_0.png", "b_1.png"]


def generate_outcome(model, t5, *extra, tokenizer=None) -> tuple[int, str, str]:
    """Generate on the given model files into a fresh output folder; checks the promise
    (a clean error and nothing written, or a normal run) and returns the outcome."""
    with tempfile.TemporaryDirectory() as root:
        outputs = Outputs(Path(root))
        more = ["--tokenizer", tokenizer] if tokenizer else []
        code, out, err = run_cli("generate", *TINY_ARGS, "--model", model, "--t5", t5, *more, *outputs.args, *extra)
        assert "Traceback" not in out + err
        if code == 0:
            outputs.assert_written()
        else:
            assert_one_line_error(code, out, err)
            outputs.assert_untouched()
    return code, out, err


def info_outcome(path) -> tuple[int, str, str]:
    """`minit2i info PATH`: a report (exit 0) or one clean error line."""
    code, out, err = run_cli("info", path)
    if code != 0:
        assert_one_line_error(code, out, err)
    return code, out, err


@pytest.fixture(autouse=True)
def _modest_memory(monkeypatch):
    """Report 1 GiB available, so a generated config or argument that asks for a huge run is
    refused by the memory estimate rather than run on the CI machine (the tiny model needs MBs)."""
    monkeypatch.setattr(pipeline, "available_memory", lambda: 1024**3)


class Tiny(tuple):
    """(transformer dir, t5 dir, the MMJiT tensors, the T5 tensors), with a short repr for
    hypothesis' reports of failing cases."""

    def __repr__(self):
        return f"Tiny({self[0].parent})"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny float32 model in diffusers/HF layout, and its tensors."""
    from minit2i.demo_models import write_model

    root = tmp_path_factory.mktemp("tiny")
    write_model(root / "transformer", root / "t5", MMJIT_TINY, T5_TINY, 7)
    return Tiny((root / "transformer", root / "t5",
                 {"model.net." + k: v for k, v in random_mmjit_weights(MMJIT_TINY, 7).items()},
                 random_t5_weights(T5_TINY, 8)))


def transformer_copy(tiny, folder: Path, tensors=None, config=True) -> Path:
    """A transformer folder in `folder`: the given tensors (default: the tiny ones), config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors if tensors is not None else tiny[2], str(folder / "diffusion_pytorch_model.safetensors"))
    if config:
        shutil.copy(tiny[0] / "config.json", folder / "config.json")
    return folder


def t5_copy(tiny, folder: Path, tokenizer=True, config=True) -> Path:
    """A T5 folder in `folder` linking the tiny model's files."""
    folder.mkdir(parents=True, exist_ok=True)
    names = ["model.safetensors"] + ["tokenizer.json"] * tokenizer + ["config.json"] * config
    for name in names:
        os.symlink(tiny[1] / name, folder / name)
    return folder


# ---------------------------------------------------------------------------------------------
# Generated bad inputs

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=6)
shapes = st.lists(st.integers(0, 40), max_size=5)


@CASES
@given(data=st.data())
def test_generated_tensor_shapes(tiny, data):
    """Tensors of other ranks and sizes (also empty and scalar), extra and missing tensors."""
    tensors = dict(tiny[2])
    names = sorted(tensors)
    for name in data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
        action = data.draw(st.sampled_from(["reshape", "drop", "dtype"]))
        if action == "drop":
            del tensors[name]
        elif action == "dtype":
            tensors[name] = tensors[name].astype(data.draw(st.sampled_from([np.float16, np.float64, np.int32])))
        else:
            tensors[name] = np.ones(data.draw(shapes), np.float32)
    if data.draw(st.booleans()):
        tensors["model.net." + data.draw(st.text("abc.0123", min_size=1, max_size=12))] = np.ones(3, np.float32)
    with tempfile.TemporaryDirectory() as root:
        model = transformer_copy(tiny, Path(root) / "m", tensors, config=data.draw(st.booleans()))
        info_outcome(model)
        generate_outcome(model, tiny[1])


@CASES
@given(header=st.one_of(json_values, st.binary(max_size=64)), length_delta=st.integers(-20, 20),
       keep_body=st.booleans())
def test_generated_safetensors_headers(tiny, header, length_delta, keep_body):
    """Arbitrary header JSON (or bytes) with a right or wrong length prefix, with or without data."""
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    body = (tiny[0] / "diffusion_pytorch_model.safetensors").read_bytes()[-4096:] if keep_body else b""
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "model.safetensors"
        path.write_bytes(struct.pack("<Q", max(0, len(blob) + length_delta)) + blob + body)
        assert info_outcome(path)[0] == 2
        assert generate_outcome(path, tiny[1])[0] == 2


@FEW
@given(offset=st.integers(0, 10**6), value=st.binary(min_size=1, max_size=8), truncate=st.booleans())
def test_generated_safetensors_bodies(tiny, offset, value, truncate):
    """Overwritten bytes anywhere (header or tensor data, so also NaN/Inf weights) or a cut file."""
    data = bytearray((tiny[0] / "diffusion_pytorch_model.safetensors").read_bytes())
    offset %= len(data)
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "model.safetensors"
        path.write_bytes(bytes(data[:offset]) if truncate else
                         bytes(data[:offset] + value + data[offset + len(value):])[:len(data)])
        info_outcome(path)
        generate_outcome(path, tiny[1])


def _mutated_config(data, config) -> bytes:
    """config.json as the model has it with fields changed, or another document altogether."""
    kind = data.draw(st.sampled_from(["fields", "fields", "document", "bytes"]))
    if kind == "bytes":
        return data.draw(st.binary(max_size=40))
    if kind == "document":
        return json.dumps(data.draw(json_values)).encode()
    raw = json.loads(to_json(config))
    names = [f.name for f in dataclasses.fields(config)]
    for name in data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
        raw[name] = data.draw(st.one_of(json_scalars, st.integers(-3, 3), st.just(float(raw[name]))))
    return json.dumps(raw).encode()


@CASES
@given(data=st.data())
def test_generated_mmjit_config_files(tiny, data):
    with tempfile.TemporaryDirectory() as root:
        model = transformer_copy(tiny, Path(root) / "m")
        (model / "config.json").write_bytes(_mutated_config(data, MMJIT_TINY))
        info_code = info_outcome(model)[0]
        assert generate_outcome(model, tiny[1])[0] == info_code  # generate and info agree


@CASES
@given(data=st.data())
def test_generated_t5_config_files(tiny, data):
    with tempfile.TemporaryDirectory() as root:
        t5 = t5_copy(tiny, Path(root) / "t5", config=False)
        (t5 / "config.json").write_bytes(_mutated_config(data, T5_TINY))
        info_code = info_outcome(t5)[0]
        code = generate_outcome(tiny[0], t5)[0]
        assert code == info_code or (info_code == 0 and code == 2)  # generate also checks the pairing


@CASES
@given(index=st.one_of(
    json_values,
    st.binary(max_size=30),
    st.fixed_dictionaries({"weight_map": st.dictionaries(
        st.text(max_size=10), st.one_of(json_scalars, st.sampled_from(
            ["model.safetensors", "../model.safetensors", "/etc/passwd", "sub/x.safetensors", "", ".."])),
        max_size=4)}),
))
def test_generated_shard_indexes(tiny, index):
    with tempfile.TemporaryDirectory() as root:
        t5 = t5_copy(tiny, Path(root) / "t5")
        blob = index if isinstance(index, bytes) else json.dumps(index).encode()
        (t5 / "model.safetensors.index.json").write_bytes(blob)
        info_outcome(t5)
        generate_outcome(tiny[0], t5)


@CASES
@given(data=st.data())
def test_generated_tokenizer_files(tiny, data):
    """Arbitrary bytes or JSON, or a word-level tokenizer whose ids may exceed the embedding."""
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "tokenizer.json"
        if data.draw(st.booleans()):
            vocab = data.draw(st.dictionaries(st.sampled_from(["<pad>", "</s>", "<unk>", "a", "red", "cat"]),
                                              st.integers(0, 2000), min_size=1))
            vocab.setdefault("<unk>", max(vocab.values(), default=0) + 1)
            tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
            tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
            tokenizer.save(str(path))
        else:
            path.write_bytes(data.draw(st.one_of(st.binary(max_size=40), json_values.map(
                lambda v: json.dumps(v).encode()))))
        generate_outcome(tiny[0], tiny[1], tokenizer=path)


class _Reached(Exception):
    """Raised instead of reading weights: the arguments passed every check."""


argument_values = st.one_of(st.integers(-2**64, 2**64), st.integers(-5, 600), st.floats(allow_nan=True),
                            st.sampled_from(["", "x", "1e39", "inf", "-inf", "nan", "0x10", "٣"]))


@MANY
@given(flags=st.dictionaries(
    st.sampled_from(["--steps", "--cfg-scale", "-W", "-H", "--seed", "-b", "--a-min"]),
    argument_values, min_size=1, max_size=3),
    prompt=st.one_of(st.text(max_size=20), st.binary(max_size=8).map(lambda b: b.decode("utf-8", "surrogateescape"))))
def test_generated_argument_values(tiny, monkeypatch, flags, prompt):
    """Any mix of argument values: one error line before any weight is read, or every check
    passes (the run is then stopped where it would read the weights)."""
    def reached(self):
        raise _Reached

    monkeypatch.setattr(pipeline.ModelFiles, "load", reached)
    args = [a for flag, value in flags.items() for a in (flag, value)]
    with tempfile.TemporaryDirectory() as root:
        outputs = Outputs(Path(root))
        try:
            code, out, err = run_cli("generate", "-p", prompt, "--model", tiny[0], "--t5", tiny[1], "-q",
                                     *outputs.args, *args)
        except _Reached:
            return
        assert_one_line_error(code, out, err)
        outputs.assert_untouched()


@MANY
@given(fields=st.dictionaries(st.sampled_from([f.name for f in dataclasses.fields(Request)]),
                              st.one_of(json_scalars, argument_values), min_size=1))
def test_generated_requests(fields):
    """Library use: a Request is either valid or refused with MiniT2IError, nothing else."""
    try:
        Request(**{"prompt": "a cat", **fields})
    except MiniT2IError as err:
        assert "\n" not in str(err)


@MANY
@given(shape=st.lists(st.integers(0, 5), max_size=4), dtype=st.sampled_from([np.uint8, np.float32, np.int64]))
def test_generated_save_png_inputs(shape, dtype):
    pixels = np.zeros(shape, dtype)
    with tempfile.TemporaryDirectory() as root:
        try:
            save_png(pixels, Path(root) / "x.png")
        except MiniT2IError:
            assert os.listdir(root) == []
        else:
            assert pixels.ndim == 3 and pixels.shape[2] == 3 and dtype == np.uint8


prompt_lines = st.one_of(json_values.map(json.dumps), st.fixed_dictionaries({"prompt": st.text(max_size=12)},
                                                                           optional={"id": json_values}).map(json.dumps),
                         st.text(max_size=20))


@FEW
@given(content=st.one_of(st.binary(max_size=120), st.lists(prompt_lines, max_size=4).map("\n".join).map(str.encode)),
       flags=st.lists(st.sampled_from([["-n", "2"], ["-n", "0"], ["--threads", "0"], ["--workers", "0"],
                                       ["--export", "flat"], ["--export", "dpg"], ["-s", "-1"]]), max_size=2))
def test_generated_prompt_files(tiny, content, flags):
    """`minit2i batch` on arbitrary prompt-file bytes and flags: one line, exit 2 and no run
    folder (a bad prompt file, or a DPG export of other than four images a prompt, is refused
    before the folder is made), or a run whose manifest lists its images."""
    with tempfile.TemporaryDirectory() as root:
        prompts, out = Path(root) / "prompts", Path(root) / "out"
        prompts.write_bytes(content)
        code, stdout, err = run_cli("batch", prompts, "--out", out, "--model", tiny[0], "--t5", tiny[1], *TINY_ARGS[2:],
                                    *[flag for pair in flags for flag in pair])
        assert "Traceback" not in stdout + err
        if code == 0:
            assert out.is_dir() and (out / "manifest.jsonl").read_bytes().count(b"\n") >= 1
        else:
            assert_one_line_error(code, stdout, err)
            assert not out.exists()


# ---------------------------------------------------------------------------------------------
# Config inferred from tensor shapes trusts the shapes


@pytest.mark.parametrize("name, shape, found", [
    ("model.net.img_embedder.proj1.weight", (16, 3, 16), "img_embedder.proj1.weight: expected 4 dimensions, found [16, 3, 16]"),
    ("model.net.img_embedder.proj2.weight", (), "img_embedder.proj2.weight: expected 4 dimensions, found []"),
    ("model.net.double_blocks.0.q_norm.weight", (0,),
     "double_blocks.0.q_norm.weight: expected 1 dimensions of size at least 1, found [0]"),
])
def test_inference_checks_dimensions_first(tiny, tmp_path, name, shape, found):
    model = transformer_copy(tiny, tmp_path / "m", {**tiny[2], name: np.ones(shape, np.float32)}, config=False)
    assert_one_line_error(*run_cli("info", model), found)
    assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", model, "--t5", tiny[1]), found)


def test_inferred_values_are_range_checked(tiny, tmp_path):
    tensors = {**tiny[2], "model.net.double_blocks.0.q_norm.weight": np.ones(3, np.float32)}
    model = transformer_copy(tiny, tmp_path / "m", tensors, config=False)
    line = assert_one_line_error(*run_cli("info", model), "the config inferred from the tensor shapes is invalid",
                                 "head_dim", "found 3")
    assert "config.json" not in line  # there is none to fix (root cause 9)


# ---------------------------------------------------------------------------------------------
# config.json is checked for type and range


@pytest.mark.parametrize("edit, words", [
    ({"hidden_size": "64"}, ["hidden_size must be an integer", 'found "64" (a string)']),
    ({"hidden_size": 64.0}, ["hidden_size must be an integer", "found 64.0"]),
    ({"prompt_length": 0}, ["prompt_length must be an integer in [2, 8192], found 0"]),
    ({"prompt_length": 10**6}, ["prompt_length", "found 1000000"]),
    ({"depth_double": -1}, ["depth_double", "found -1"]),
    ({"mlp_ratio": True}, ["mlp_ratio must be a number", "found True"]),
])
def test_mmjit_config_fields(tiny, tmp_path, edit, words):
    model = transformer_copy(tiny, tmp_path / "m")
    (model / "config.json").write_text(json.dumps({**json.loads(to_json(MMJIT_TINY)), **edit}))
    generate_line = assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", model, "--t5", tiny[1]), *words)
    assert assert_one_line_error(*run_cli("info", model), *words) == generate_line


@pytest.mark.parametrize("edit, words", [
    ({"relative_attention_num_buckets": 1}, ["relative_attention_num_buckets", "[4, 65536]", "found 1"]),
    ({"relative_attention_max_distance": 0}, ["relative_attention_max_distance", "found 0"]),
    ({"relative_attention_max_distance": 8}, ["must exceed relative_attention_num_buckets/4 = 8, found 8"]),
    ({"layer_norm_epsilon": -1e-6}, ["layer_norm_epsilon must be a number in (0, 1]", "found -1e-06"]),
])
def test_t5_config_fields(tiny, tmp_path, edit, words):
    t5 = t5_copy(tiny, tmp_path / "t5", config=False)
    (t5 / "config.json").write_text(json.dumps({**json.loads(to_json(T5_TINY)), **edit}))
    assert_one_line_error(*run_cli("info", t5), *words)
    assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", t5), *words)


@pytest.mark.parametrize("content, words", [
    (b"[1, 2]", ["must hold a JSON object", "found [1, 2] (a list)"]),
    (b"null", ["must hold a JSON object", "found null"]),
    (b'{"hidden_size": "\xff"}', ["is not UTF-8 text", "byte 0xff"]),
])
def test_config_documents(tiny, tmp_path, content, words):
    model = transformer_copy(tiny, tmp_path / "m")
    (model / "config.json").write_bytes(content)
    assert_one_line_error(*run_cli("info", model), "config.json", *words)


def test_t5_without_config_json_says_what_was_assumed(tiny, tmp_path):
    t5 = t5_copy(tiny, tmp_path / "t5", config=False)
    code, out, err = run_cli("info", t5)
    assert code == 0 and "assumed (not in the shapes, no config.json): relative_attention_max_distance=128, " \
                          "layer_norm_epsilon=1e-06" in out


# ---------------------------------------------------------------------------------------------
# The shard index is validated


@pytest.mark.parametrize("content, words", [
    (b"[]", ["must hold a JSON object", "found []"]),
    (b"null", ["found null"]),
    (b'{"weight_map": {}}', ['expected a non-empty "weight_map" object, found {}']),
    (b'{"weight_map": {"a": 3, "b": ["x"]}}', ["values must be file names in its folder", "a: 3", 'b: ["x"] (a list)']),
    (b'{"weight_map": {"a": "../model.safetensors"}}', ['"../model.safetensors"']),
    (b'{"weight_map": {"a": "gone.safetensors"}}', ["names the shard", "gone.safetensors", "no such file or folder"]),
    (b'{"weight_map": {"a": "\xfe"}}', ["not UTF-8 text", "byte 0xfe"]),
])
def test_shard_index(tiny, tmp_path, content, words):
    t5 = t5_copy(tiny, tmp_path / "t5")
    (t5 / "model.safetensors.index.json").write_bytes(content)
    assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", t5), *words)


# ---------------------------------------------------------------------------------------------
# Token ids are checked by value


def test_token_ids_beyond_the_embedding(tiny, tmp_path):
    tokenizer = Tokenizer(models.WordLevel({"<pad>": 0, "</s>": 1, "<unk>": 2, "cat": 99999}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", tiny[1],
                                   "--tokenizer", tmp_path / "tokenizer.json"),
                          "token ids up to 99999", "only 512 rows")


def test_tokenizer_that_cannot_encode_the_prompt(tiny, tmp_path):
    """Found by the generated tokenizer files: <unk> sharing its id with <pad> breaks encoding."""
    tokenizer = Tokenizer(models.WordLevel({"<pad>": 1, "<unk>": 1, "</s>": 3}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    generate_outcome(tiny[0], tiny[1], tokenizer=tmp_path / "tokenizer.json")


# ---------------------------------------------------------------------------------------------
# Non-finite numbers: no PNG, no warnings


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_weight_is_named_at_load(tiny, tmp_path, value):
    tensors = dict(tiny[2])
    tensors["model.net.final_layer.linear.bias"] = tensors["model.net.final_layer.linear.bias"].copy()
    tensors["model.net.final_layer.linear.bias"][5] = value
    model = transformer_copy(tiny, tmp_path / "m", tensors)
    outputs = Outputs(tmp_path)
    assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", model, "--t5", tiny[1], *outputs.args),
                          "tensor model.net.final_layer.linear.bias holds 1 NaN or Inf value(s)")
    outputs.assert_untouched()


@pytest.mark.parametrize("flag, value", [("--cfg-scale", "1e39"), ("--cfg-scale", "1e30"), ("--a-min", "inf"),
                                         ("--cfg-scale", "nan")])
def test_non_finite_or_overflowing_arguments(tiny, flag, value):
    assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", tiny[1], flag, value), flag)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a NumPy overflow warning fails the test
def test_overflow_during_sampling_names_the_step(tiny, tmp_path, monkeypatch):
    real = NumpyRunner.denoise
    calls = []

    def overflowing(self, x, context, mask):
        calls.append(1)
        x0 = real(self, x, context, mask)
        if len(calls) == 2:  # cond and uncond far apart: guidance overflows float32
            half = len(x0) // 2
            x0[:half], x0[half:] = 3e38, -3e38
        return x0

    monkeypatch.setattr(NumpyRunner, "denoise", overflowing)
    outputs = Outputs(tmp_path)
    code, out, err = run_cli("generate", *TINY_ARGS, "--steps", "3", "--model", tiny[0], "--t5", tiny[1], *outputs.args)
    assert_one_line_error(code, out, err, "NaN or Inf at sampling step 2 of 3")
    outputs.assert_untouched()


# ---------------------------------------------------------------------------------------------
# Argument ranges, and memory


@pytest.mark.parametrize("args, words", [
    (["--seed", "-1"], ["--seed (generator) must be an integer in [0, 9223372036854775807], found -1"]),
    (["--steps", str(2**63 - 1)], ["--steps (num_inference_steps) must be an integer in [1, 10000]"]),
    (["--steps", str(10**9)], ["--steps", "found 1000000000"]),
    (["-W", "100000"], ["--width must be an integer in [1, 16384], found 100000"]),
    (["-b", str(10**6)], ["--batch-count", "found 1000000"]),
    (["-p", "\udcff"], ["the prompt is not valid UTF-8 text (byte 0xff at character 0)"]),
    (["--steps", "x"], ["argument --steps: invalid int value: 'x'"]),
])
def test_argument_ranges(tiny, tmp_path, args, words):
    outputs = Outputs(tmp_path)
    assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", tiny[1], *outputs.args, *args),
                          *words)
    outputs.assert_untouched()


def test_runs_that_do_not_fit_are_refused_with_the_estimate(tiny, monkeypatch):
    monkeypatch.setattr(pipeline, "available_memory", lambda: 2 * 1024**3)
    line = assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", tiny[1],
                                          "-W", "4096", "-H", "4096"),
                                 "this run needs about", "but 2.0 GiB is available")
    assert "TiB" in line or "GiB" in line


def test_memory_estimate_scales_with_the_attention():
    files = pipeline.ModelFiles(checkpoint.Checkpoint(MMJIT_TINY, [], "", "", [], {}, {}, []),
                                checkpoint.Checkpoint(T5_TINY, [], "", "", [], {}, {}, []), None)
    small = pipeline.estimate_memory(Request("a", width=1024, height=1024), files)
    large = pipeline.estimate_memory(Request("a", width=2048, height=2048), files)
    assert 12 < large / small < 17  # tokens x4 (plus the prompt): the attention scores ~x16


# ---------------------------------------------------------------------------------------------
# Filesystem errors are one line


def test_unreadable_model_folder(tiny, monkeypatch):
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tiny[0] else real_access(p, mode))
    assert_one_line_error(*run_cli("info", tiny[0]), "permission denied (the folder is not readable)")


def test_damaged_golden_files(tmp_path):
    manifest = json.loads((golden.GOLDEN_DIR / golden.MANIFEST_NAME).read_text())
    for name in (golden.MANIFEST_NAME, manifest["arrays_file"]):
        shutil.copy(golden.GOLDEN_DIR / name, tmp_path / name)
    arrays = tmp_path / manifest["arrays_file"]
    arrays.write_bytes(arrays.read_bytes()[:500])
    assert_one_line_error(*run_cli("golden", "check", "--dir", tmp_path), "cannot read the golden arrays")
    for damaged, words in (([], ["must hold a JSON object"]), ({"format": 2}, ['expected "items" and "arrays"']),
                           ({**manifest, "arrays_file": "../x.npz"}, ["arrays_file must be a .npz file name"])):
        (tmp_path / golden.MANIFEST_NAME).write_text(json.dumps(damaged))
        assert_one_line_error(*run_cli("golden", "check", "--dir", tmp_path), *words)


def test_golden_array_of_another_shape_is_a_failed_check(tmp_path):
    manifest = json.loads((golden.GOLDEN_DIR / golden.MANIFEST_NAME).read_text())
    _, arrays = golden.load()
    arrays["t5.hidden"] = arrays["t5.hidden"][:1]
    np.savez_compressed(tmp_path / manifest["arrays_file"], **arrays)
    manifest["arrays"]["t5.hidden"]["sha256"] = golden.array_sha256(arrays["t5.hidden"])
    (tmp_path / golden.MANIFEST_NAME).write_text(json.dumps(manifest))
    outcomes = golden.check(tmp_path, ["t5.hidden"])
    assert [o.passed for o in outcomes] == [False, False]
    assert "output shape [2, 40, 64] differs from the recorded [1, 40, 64]" in outcomes[0].detail


def test_golden_record_checks_the_folder_before_computing(tmp_path, monkeypatch):
    def computed(recipe, precision):
        pytest.fail("a recipe ran before the folder was checked")

    monkeypatch.setattr(golden, "ITEMS", (golden.Item("x", {}, computed, (golden.FloatCheck("fp64", 1, 1),)),))
    real_access = os.access
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    assert_one_line_error(*run_cli("golden", "record", "--dir", locked), "--dir folder", "is not writable")
    (tmp_path / "file").write_text("")
    assert_one_line_error(*run_cli("golden", "record", "--dir", tmp_path / "file" / "sub"), "cannot create --dir")


def test_full_stdout(tiny, tmp_path):
    result = subprocess.run([sys.executable, "-m", "minit2i.cli", "info", str(tiny[0])],
                            stdout=open("/dev/full", "w"), stderr=subprocess.PIPE, text=True)
    assert result.returncode == 2
    assert result.stderr == "minit2i: error: cannot write to stdout: No space left on device\n"


# ---------------------------------------------------------------------------------------------
# No partial or inconsistent output


def test_golden_record_failing_before_the_commit_keeps_the_old_recording(tmp_path, monkeypatch):
    manifest = json.loads((golden.GOLDEN_DIR / golden.MANIFEST_NAME).read_text())
    for name in (golden.MANIFEST_NAME, manifest["arrays_file"]):
        shutil.copy(golden.GOLDEN_DIR / name, tmp_path / name)
    monkeypatch.setattr(golden, "ITEMS", golden.ITEMS[:1])
    real = golden.write_atomically

    def fail_on_manifest(path, data):
        if path.name == golden.MANIFEST_NAME:
            raise OSError(28, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(golden, "write_atomically", fail_on_manifest)
    assert_one_line_error(*run_cli("golden", "record", "--force", "--dir", tmp_path), "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([golden.MANIFEST_NAME, manifest["arrays_file"]])
    golden.load(tmp_path)  # still the old, consistent pair


def test_batch_is_all_or_nothing(tiny, tmp_path, monkeypatch):
    from PIL import Image

    real_save = Image.Image.save
    saved = []

    def fail_third(self, fp, format=None, **params):
        saved.append(1)
        if len(saved) == 3:
            raise OSError(28, "No space left on device")
        real_save(self, fp, format=format, **params)

    monkeypatch.setattr(Image.Image, "save", fail_third)
    (tmp_path / "b_0.png").write_bytes(OLD_BYTES)
    assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", tiny[1],
                                   "-b", "3", "-o", tmp_path / "b.png"), "cannot write", "b_2.png", "No space")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b_0.png"]
    assert (tmp_path / "b_0.png").read_bytes() == OLD_BYTES


# ---------------------------------------------------------------------------------------------
# Precise messages


def test_unreadable_file_is_not_reported_missing(tiny, tmp_path, monkeypatch):
    real_access = os.access
    model = tiny[0] / "diffusion_pytorch_model.safetensors"
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == model else real_access(p, mode))
    line = assert_one_line_error(*run_cli("info", model), "permission denied (the file is not readable)")
    assert "No such file" not in line


def test_wrong_t5_message_names_what_is_needed(tiny, tmp_path):
    big = dataclasses.replace(T5_TINY, d_model=1024, d_kv=4, num_heads=2, d_ff=4, num_layers=1)
    t5 = tmp_path / "t5"
    t5.mkdir()
    save_file(random_t5_weights(big, 0), str(t5 / "model.safetensors"))
    shutil.copy(tiny[1] / "tokenizer.json", t5)
    line = assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", t5),
                                 "looks like flan-t5-large", "needs d_model 64 (a T5 v1.1 encoder of that width)")
    assert line.count("flan-t5-large") == 1


@pytest.mark.parametrize("args, words", [
    (["--b", "numpy:fp16"], ["the numpy backend runs fp32, fp64, not fp16"]),
    (["-W", "0"], ["--width must be an integer in [1, 16384], found 0"]),
    (["--rtol", "nan"], ["--rtol must be a number in [0, 1000000], found nan"]),
    (["--atol", "-1"], ["--atol", "found -1.0"]),
])
def test_trace_flags(tiny, args, words):
    line = assert_one_line_error(*run_cli("trace", "--model", tiny[0], "--t5", tiny[1], *args), *words)
    assert "--precision" not in line


def test_preview_write_failure_does_not_blame_output(tiny, tmp_path, monkeypatch):
    from PIL import Image

    def disk_full(self, fp, format=None, **params):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", disk_full)
    line = assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", tiny[1],
                                          "--preview-dir", tmp_path / "pre", "-o", tmp_path / "x.png"),
                                 "step_001.png", "No space left on device")
    assert "--output" not in line


def test_a_tilde_word_naming_no_user_is_a_path_as_typed(tiny, tmp_path, monkeypatch):
    """`~name` is the home of user `name`; where there is no such user a shell leaves the word as
    typed, and so does every path option (pathlib's expanduser raised RuntimeError: a traceback)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", tiny[1],
                             "--preview-dir", "~no-such-user-minit2i", "-o", "~no-such-user-minit2i.png")
    assert (code, err) == (0, "")
    assert (tmp_path / "~no-such-user-minit2i.png").is_file()
    assert (tmp_path / "~no-such-user-minit2i" / "step_001.png").is_file()
    assert_one_line_error(*run_cli("info", "~no-such-user-minit2i/model"), "~no-such-user-minit2i/model")


def test_a_batch_whose_second_target_cannot_be_replaced_leaves_the_first_as_it_was(tmp_path):
    """Several PNGs are committed together: when the second target cannot be replaced (a folder
    holding the user's files), the first gets its old bytes back and nothing else is left behind."""
    from minit2i.core.images import save_pngs

    first, second = tmp_path / "a.png", tmp_path / "b.png"
    first.write_bytes(OLD_BYTES)
    second.mkdir()
    (second / "photo.jpg").write_bytes(b"the user's")
    with pytest.raises(OSError):
        save_pngs([(np.zeros((4, 4, 3), np.uint8), first), (np.zeros((4, 4, 3), np.uint8), second)])
    assert first.read_bytes() == OLD_BYTES and (second / "photo.jpg").read_bytes() == b"the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png"]


def test_fifo_devices_and_symlink_loops(tiny, tmp_path):
    os.mkfifo(tmp_path / "fifo")
    assert_one_line_error(*run_cli("info", tmp_path / "fifo"), "expected a file or folder, found a FIFO")
    assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", "/dev/null", "--t5", tiny[1],
                                   "-o", tmp_path / "x.png"),
                          "--model /dev/null: expected a file or folder, found a character device")
    assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", tiny[1],
                                   "--preview-dir", "/dev/null", "-o", tmp_path / "x.png"),
                          "--preview-dir folder /dev/null is not a folder")
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    assert_one_line_error(*run_cli("info", tmp_path / "a"), "a loop of symbolic links")


# ---------------------------------------------------------------------------------------------
# Cheap checks before expensive work


@pytest.fixture
def no_tensor_reads(monkeypatch):
    """Fail the test if any tensor payload is read."""
    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read")

    monkeypatch.setattr(safetensors_file.MappedFile, "__init__", refuse)


def test_bad_argument_returns_before_reading_a_large_model(tiny, tmp_path, no_tensor_reads):
    """A sparse checkpoint of over 4 GiB whose header is valid: bad arguments are refused at
    once, also one that needs the model's config (-W 24 is no multiple of its patch size 16),
    without one tensor byte read; `info` reads the header only."""
    big = dataclasses.replace(MMJIT_TINY, hidden_size=8192, num_heads=64, head_dim=128, cond_vec_size=8192,
                              depth_double=1, txt_preamble_depth=0)
    header, offset = {}, 0
    for name, shape in mmjit_expected_shapes(big).items():
        size = 4 * int(np.prod(shape))
        header["model.net." + name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + offset)  # sparse: no data on disk
    assert path.stat().st_size > 4 * 1024**3
    for bad in (["--steps", "0"], ["--width", "24"]):
        assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", path, "--t5", tiny[1],
                                       "-o", tmp_path / "x.png", *bad), bad[0])
    code, out, _ = run_cli("info", path)
    assert code == 0 and "hidden_size=8192" in out


def test_t5_width_is_checked_before_any_tensor_is_read(tiny, tmp_path, no_tensor_reads):
    t5 = tmp_path / "t5"
    t5.mkdir()
    save_file(random_t5_weights(dataclasses.replace(T5_TINY, d_model=32, num_heads=2), 0), str(t5 / "model.safetensors"))
    assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", t5), "wrong T5 encoder")


def test_trace_without_gpu_fails_before_side_a(tiny, monkeypatch):
    from minit2i.accelerated import kernels

    def no_gpu():
        raise MiniT2IError("--backend cupy needs CuPy and an NVIDIA GPU")

    monkeypatch.setattr(kernels, "require_gpu", no_gpu)
    monkeypatch.setattr(pipeline, "open_model", lambda *a: pytest.fail("the model was opened"))
    assert_one_line_error(*run_cli("trace", "--b", "cupy:bf16"), "needs CuPy and an NVIDIA GPU")


def test_info_reads_headers_only(tiny, no_tensor_reads):
    assert run_cli("info", tiny[0])[0] == 0 and run_cli("info", tiny[1])[0] == 0


# ---------------------------------------------------------------------------------------------
# Closed stderr


@pytest.mark.parametrize("args, status", [(["--steps", "1"], 0), (["--steps", "0"], 2)])
def test_closed_stderr(tiny, tmp_path, args, status):
    command = [sys.executable, "-m", "minit2i.cli", "generate", "-p", "a cat", "-W", "16", "-H", "16",
               "--model", str(tiny[0]), "--t5", str(tiny[1]), "-o", str(tmp_path / "x.png"), *args]
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(2))
    assert result.returncode == status
    assert "Traceback" not in result.stdout and "error" not in result.stdout
    assert (tmp_path / "x.png").exists() == (status == 0)


# ---------------------------------------------------------------------------------------------
# Library functions check their inputs


def test_library_inputs(tmp_path):
    tokenizer = PromptTokenizer(make_t5_style_tokenizer([("\u2581cat", -1.0)]), 8)
    with pytest.raises(MiniT2IError, match="expected a list of prompts, found str"):
        tokenizer("a cat")
    with pytest.raises(MiniT2IError, match='--steps \\(num_inference_steps\\) must be an integer in \\[1, 10000\\], found "3" \\(a string\\)'):
        Request("a cat", steps="3")
    with pytest.raises(MiniT2IError, match="expected uint8 pixels \\[H, W, 3\\].*found uint8 \\[3, 8, 8\\]"):
        save_png(np.zeros((3, 8, 8), np.uint8), tmp_path / "never.png")
    assert list(tmp_path.iterdir()) == []
    params = weights.nest(random_t5_weights(T5_TINY, 0))
    with pytest.raises(MiniT2IError, match="token ids must be in \\[0, 511\\].*from -1 to 5"):
        t5_encode(params, T5_TINY, np.array([[5, -1]]), np.ones((1, 2), np.float32))


def test_every_config_field_has_a_range():
    from minit2i.core.mmjit_config import MMJIT_RANGES
    from minit2i.core.t5_config import T5_RANGES

    assert set(MMJIT_RANGES) == {f.name for f in dataclasses.fields(MMJiTConfig)}
    assert set(T5_RANGES) == {f.name for f in dataclasses.fields(T5Config)}
    assert Range(1, 3).describe() == "an integer in [1, 3]"


# ---------------------------------------------------------------------------------------------
# Every file from outside is checked for kind and size before it is read


def test_refs_main_that_is_a_fifo_a_device_or_huge_is_worked_around(offline_hub, tiny, tmp_path):
    from minit2i.model_files import cached_snapshot

    snapshot = offline_hub.add("org/model", {"config.json": b"{}"})
    ref = offline_hub.folder("org/model") / "refs" / "main"
    for make, words in ((lambda: os.mkfifo(ref), "found a FIFO"), (lambda: ref.symlink_to("/dev/zero"), "character device"),
                        (lambda: ref.write_bytes(b"a" * 10**6), "1.0 MB, more than the 4.1 kB")):
        ref.unlink()
        make()
        with contextlib.redirect_stderr(io.StringIO()):
            assert cached_snapshot(offline_hub.folder("org/model")) == snapshot  # the newest, at once


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_deeply_nested_json_is_one_line(tiny, tmp_path, name):
    t5 = t5_copy(tiny, tmp_path / "t5", config=name != "config.json")
    (t5 / name).write_bytes(b"[" * 100_000 + b"]" * 100_000)
    assert_one_line_error(*run_cli("info", t5), "nests deeper than 100 levels")


def test_deeply_nested_golden_manifest_and_fifo_arrays_are_one_line(tmp_path):
    (tmp_path / golden.MANIFEST_NAME).write_bytes(b"{\"a\":" * 100_000 + b"1" + b"}" * 100_000)
    assert_one_line_error(*run_cli("golden", "check", "--dir", tmp_path), "nests deeper than 100 levels")
    manifest = json.loads((golden.GOLDEN_DIR / golden.MANIFEST_NAME).read_text())
    (tmp_path / golden.MANIFEST_NAME).write_text(json.dumps(manifest))
    os.mkfifo(tmp_path / manifest["arrays_file"])
    assert_one_line_error(*run_cli("golden", "check", "--dir", tmp_path), "expected a file, found a FIFO")


def test_golden_array_declaring_a_huge_shape_is_refused_before_allocation(tmp_path):
    manifest = json.loads((golden.GOLDEN_DIR / golden.MANIFEST_NAME).read_text())
    (tmp_path / golden.MANIFEST_NAME).write_text(json.dumps(manifest))
    header = {"descr": "<f8", "fortran_order": False, "shape": (10**5, 10**5)}  # 74.5 GiB
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, header)
    import zipfile

    with zipfile.ZipFile(tmp_path / manifest["arrays_file"], "w") as archive:
        archive.writestr("t5.hidden.npy", member.getvalue() + b"\0" * 64)
    assert_one_line_error(*run_cli("golden", "check", "--dir", tmp_path), "declares 80.0 GB of data")


def test_safetensors_header_with_a_million_entries_is_refused_at_once(tiny, tmp_path):
    """Both are refused from the header's size or entry count, about a second for the two `info`
    runs; the 60 s bound is only a hang guard (a parser quadratic in the entries would not end)."""
    import time

    entry = b'"t%07d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},'
    blob = b"{" + b"".join(entry % i for i in range(1_000_000))[:-1] + b"}"
    path = tmp_path / "many.safetensors"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)
    started = time.monotonic()
    assert_one_line_error(*run_cli("info", path), "declares a safetensors header of")
    blob = b"{" + b"".join(entry % i for i in range(70_000))[:-1] + b"}"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)
    assert_one_line_error(*run_cli("info", path), "lists over 65,536 tensors")
    assert time.monotonic() - started < 60


def test_fifo_tokenizer_and_config_beside_the_weights_are_named(tiny, tmp_path):
    t5 = t5_copy(tiny, tmp_path / "t5", tokenizer=False)
    os.mkfifo(t5 / "tokenizer.json")
    assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", t5, "-o", tmp_path / "x.png"),
                          "tokenizer", "found a FIFO")
    model = transformer_copy(tiny, tmp_path / "m", config=False)
    os.symlink(tmp_path / "gone", model / "config.json")
    assert_one_line_error(*run_cli("info", model / "diffusion_pytorch_model.safetensors"), "which does not exist")


def test_info_under_an_address_space_limit_is_one_line(tiny, tmp_path):
    """A 5 GB (sparse) model under a 4 GiB address-space limit: a report or one line, never MemoryError."""
    import resource

    path = tmp_path / "big.safetensors"
    shutil.copy(tiny[0] / "diffusion_pytorch_model.safetensors", path)
    with open(path, "r+b") as f:
        f.truncate(5 * 10**9)

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))

    result = subprocess.run([sys.executable, "-m", "minit2i.cli", "info", str(path)], capture_output=True, text=True,
                            preexec_fn=limited, timeout=120)
    assert "Traceback" not in result.stderr and result.returncode == 2 and result.stderr.count("\n") == 1


# ---------------------------------------------------------------------------------------------
# Start-up, Ctrl-C and standard streams


DEMO_READS = """
import sys
from minit2i.demo_models import DEMO_MODEL_DIR

def refuse(event, args):
    if event == "open" and str(DEMO_MODEL_DIR) in str(args[0]):
        raise PermissionError(13, "the demo model was read", str(args[0]))

sys.addaudithook(refuse)
from minit2i.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_help_and_a_user_model_read_nothing_of_the_demo_model(tiny, tmp_path):
    for args in (["--help"], ["generate", "--help"], [*TINY_ARGS[:0], "generate", *TINY_ARGS, "--model", tiny[0],
                                                       "--t5", tiny[1], "-o", tmp_path / "x.png"]):
        result = subprocess.run([sys.executable, "-c", DEMO_READS, *map(str, args)], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0 and result.stderr == "", result.stderr
    assert (tmp_path / "x.png").is_file()


def ctrl_c_as_at_a_terminal() -> None:
    """A child's preexec_fn: SIGINT at its default disposition, as under a terminal. A test run in
    the background of a non-interactive shell inherits it ignored, and so would its child, which
    Python then gives no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signalled_while_held(code: str, marker: Path, signum: int) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python -c CODE`, sent `signum` once it has created
    `marker` (where the code holds itself, so the signal lands there however fast this machine is)."""
    import time

    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=ctrl_c_as_at_a_terminal)
    deadline = time.monotonic() + 120
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def test_ctrl_c_during_golden_record_exits_130_in_one_line(tmp_path):
    """SIGINT while the recipes run: the first recipe's result is held (a marker file says when)
    so the signal lands inside the recording however fast this machine computes."""
    import signal

    marker, folder = tmp_path / "inside-the-recipes", tmp_path / "golden"
    hold = (f"import pathlib, sys, time; import minit2i.golden as golden; from minit2i.cli import main\n"
            f"def held(value):\n    pathlib.Path({str(marker)!r}).touch(); time.sleep(60)\n"
            f"golden.as_pixels = held\nsys.exit(main(['golden', 'record', '--dir', {str(folder)!r}]))\n")
    assert signalled_while_held(hold, marker, signal.SIGINT) == (130, "", "minit2i: interrupted\n")
    assert not folder.exists() or list(folder.iterdir()) == []


def test_a_closed_pipe_is_a_quiet_exit_and_a_closed_stdout_an_error(tiny):
    command = [sys.executable, "-m", "minit2i.cli", "info", str(tiny[0])]
    reader = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reader.stdout.close()  # the reader goes away before the report is written
    assert reader.wait(timeout=60) == 0 and reader.stderr.read() == b""
    closed = subprocess.run(command, capture_output=False, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.close(1), timeout=60)
    assert closed.returncode == 2 and closed.stderr == (
        "minit2i: error: stdout is closed; redirect it (e.g. >/dev/null) instead of closing it\n")


# ---------------------------------------------------------------------------------------------
# Precise messages, second round


def test_output_names_too_long_for_their_temporary_file_are_refused_before_work(tiny, tmp_path, no_tensor_reads):
    for length in (241, 250, 255):
        name = "x" * (length - 4) + ".png"
        assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", tiny[0], "--t5", tiny[1],
                                       "-o", tmp_path / name), f"is {length} bytes", "limit on file names")
    assert list(tmp_path.iterdir()) == []


def test_a_t5_folder_is_named_as_a_t5(tiny, tmp_path):
    t5 = t5_copy(tiny, tmp_path / "t5")
    line = assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", t5, "--t5", tiny[1]),
                                 "holds a T5 text encoder", "pass it as --t5")
    assert "config.json" not in line.split("(")[0]
    (t5 / "model.safetensors").unlink()
    (t5 / "model.safetensors").write_bytes(b"damaged")
    line = assert_one_line_error(*run_cli("info", t5), "model.safetensors")
    assert "transformer" not in line


def test_library_width_argument_is_type_checked(tiny):
    from minit2i.model_files import load_t5

    with pytest.raises(MiniT2IError, match=r'expected_d_model .* must be an integer in \[1, 65536\], found "128"'):
        load_t5(tiny[1], expected_d_model="128")


def test_size_from_the_config_is_not_blamed_on_a_flag(tiny, tmp_path):
    model = transformer_copy(tiny, tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "image_size": 62}))
    line = assert_one_line_error(*run_cli("generate", "-p", "a cat", "--steps", "1", "-q", "--model", model,
                                          "--t5", tiny[1], "-o", tmp_path / "x.png"),
                                 "the model's default width 62 (its image_size)")
    assert "--width 62" not in line


@pytest.mark.parametrize("prompt", ["...", "!?", "— –"])
def test_a_prompt_without_a_word_is_refused(tiny, tmp_path, prompt):
    assert_one_line_error(*run_cli("generate", *TINY_ARGS[2:], "-p", prompt, "--model", tiny[0], "--t5", tiny[1],
                                   "-o", tmp_path / "x.png"), "has no word")


def test_golden_record_into_an_empty_dir_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(*run_cli("golden", "record", "--dir", ""), "an empty path names no folder")
    assert list(tmp_path.iterdir()) == []


FILE_KINDS = ["fifo", "folder", "broken link", "device", "oversize", "empty"]


def _make_kind(path: Path, kind: str) -> None:
    """Put a file of `kind` at `path` (replacing what is there)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "broken link":
        path.symlink_to(path.parent / "gone")
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "oversize":
        with open(path, "wb") as f:
            f.truncate(100 * 2**20)  # sparse: larger than any limit for these files
    else:
        path.write_bytes(b"")


@CASES
@given(name=st.sampled_from(["config.json", "tokenizer.json", "model.safetensors", "model.safetensors.index.json"]),
       kind=st.sampled_from(FILE_KINDS))
def test_generated_file_kinds_and_sizes(tiny, name, kind):
    """Every file of a model folder as a FIFO, folder, broken link, device, oversized or empty
    file: one line at once (nothing blocks or is read whole), or a normal run for a file that is
    optional and unused."""
    with tempfile.TemporaryDirectory() as root:
        t5 = t5_copy(tiny, Path(root) / "t5")
        _make_kind(t5 / name, kind)
        generate_outcome(tiny[0], t5)
        info_outcome(t5)


# ---------------------------------------------------------------------------------------------
# convert: its two files commit together, signals and a full disk, the names --model takes


def convert_pair(folder: Path) -> dict[str, bytes]:
    """The files in a convert destination folder, with their bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def old_pair(tmp_path) -> Path:
    """A destination folder holding an earlier conversion's pair (model.safetensors, config.json)."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(OLD_BYTES)
    (folder / "config.json").write_bytes(b'{"old": true}')
    return folder


@pytest.mark.parametrize("failure", [OSError(5, "Input/output error"), KeyboardInterrupt()],
                         ids=["an I/O error", "Ctrl-C"])
def test_convert_commits_its_pair_together(tiny, old_pair, monkeypatch, failure):
    """A failure as config.json is put in place, after the weights were: the old pair is put back."""
    before = convert_pair(old_pair)

    def failing(move):
        def move_or_fail(source, target, *args, **kwargs):
            if str(source).endswith(".part") and Path(target).name == "config.json":
                raise failure
            return move(source, target, *args, **kwargs)
        return move_or_fail

    monkeypatch.setattr(os, "rename", failing(os.rename))
    monkeypatch.setattr(os, "replace", failing(os.replace))
    code, out, err = run_cli("convert", tiny[0], old_pair / "model.safetensors", "--force")
    assert code == (130 if isinstance(failure, KeyboardInterrupt) else 2) and "Traceback" not in err, err
    assert convert_pair(old_pair) == before
    monkeypatch.undo()
    assert run_cli("convert", tiny[0], old_pair / "model.safetensors", "--force")[0] == 0
    after = convert_pair(old_pair)
    assert sorted(after) == sorted(before) and all(after[name] != before[name] for name in after)


def test_a_full_disk_during_convert_names_the_file_and_the_fix(tiny, old_pair, monkeypatch):
    from minit2i import convert

    def disk_full(tensors, source):
        raise OSError(28, "No space left on device")

    before = convert_pair(old_pair)
    monkeypatch.setattr(convert, "safetensors_bytes", disk_full)
    assert_one_line_error(*run_cli("convert", tiny[0], old_pair / "model.safetensors", "--force"),
                          f"cannot write {old_pair / 'model.safetensors'}: No space left on device; free some space "
                          "on its disk, or choose a DST on another one")
    assert convert_pair(old_pair) == before


def test_sigterm_during_convert_cleans_up_as_ctrl_c(tiny, tmp_path):
    """SIGTERM while the weights are being written (held there; a marker file says when): the
    temporary file is removed, as after Ctrl-C, and the exit status is 128 + 15."""
    import signal

    marker, folder = tmp_path / "writing", tmp_path / "out"
    folder.mkdir()
    hold = (f"import pathlib, sys, time; import minit2i.convert as convert; from minit2i.cli import main\n"
            f"def held(tensors, source):\n    pathlib.Path({str(marker)!r}).touch(); time.sleep(60)\n"
            f"convert.safetensors_bytes = held\n"
            f"sys.exit(main(['convert', {str(tiny[0])!r}, {str(folder / 'model.safetensors')!r}]))\n")
    assert signalled_while_held(hold, marker, signal.SIGTERM) == (143, "", "minit2i: terminated\n")
    assert list(folder.iterdir()) == []


def test_convert_takes_the_demo_model_names(tmp_path):
    from safetensors import safe_open

    for name, tensors in (("demo", "model.net.final_layer.linear.weight"), ("demo-mf", "omega_tokens")):
        folder = tmp_path / name
        folder.mkdir()
        code, out, err = run_cli("convert", name, folder / "model.safetensors")
        assert (code, err) == (0, ""), err
        with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
            assert tensors in f.keys()


@pytest.mark.parametrize("name", ["demo", "demo-mf"])
def test_a_converted_demo_model_draws_the_demo_models_picture_with_default_flags(tmp_path, name):
    """convert keeps config.json's sampling settings (the demo's 20 steps at guidance 2, the
    student's 4 steps and interval) and names the demo's T5, so `generate --model X.safetensors`
    with no other flag writes the PNG of `--model demo`, byte for byte."""
    converted = tmp_path / "converted" / "model.safetensors"
    converted.parent.mkdir()
    assert run_cli("convert", name, converted)[0] == 0
    for model, output in ((name, tmp_path / "demo.png"), (converted, tmp_path / "converted.png")):
        code, _, err = run_cli("generate", "-p", "a large red circle at the left", "--model", model, "-q",
                               "-o", output)
        assert (code, err) == (0, "")
    assert (tmp_path / "converted.png").read_bytes() == (tmp_path / "demo.png").read_bytes()


@pytest.mark.parametrize("spec", ["./no/such", "../no/such", "no/such/", "~/no/such", "no/such.safetensors",
                                  "no/such.SAFETENSORS"])
def test_a_missing_path_that_looks_local_is_not_sent_to_the_hub(tmp_path, monkeypatch, spec):
    from minit2i import hub

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hub, "local_snapshot", lambda model: pytest.fail(f"{spec} was sent to the Hub"))
    for args in (["info", spec], ["convert", spec, "x.safetensors"]):
        assert_one_line_error(*run_cli(*args), "no such file or folder")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("destination", ["", ".", "..", "/"])
def test_a_convert_destination_that_names_no_file_is_one_line(tiny, tmp_path, monkeypatch, destination):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(*run_cli("convert", tiny[0], destination), "names no file")
    assert list(tmp_path.iterdir()) == []


def within(seconds: float, call):
    """`call()` in a thread, so that a run that blocks fails the test after `seconds` instead of
    hanging it (a hang guard: each call here takes a few seconds at most)."""
    import threading

    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(call()), daemon=True)
    worker.start()
    worker.join(timeout=seconds)
    assert not worker.is_alive(), "the run blocked"
    return outcome[0]


@pytest.fixture(scope="module")
def official_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint of the official JAX writer (test_jax_checkpoints' base tree), written in a
    subprocess: JAX starts threads, after which this process's forks (the subprocess tests
    of the other modules) could deadlock."""
    for module in ("tensorstore", "flax", "orbax"):
        pytest.importorskip(module, reason="needs the jax-test extra (jax, flax, orbax): pip install -e \".[jax-test]\"")
    folder = tmp_path_factory.mktemp("jax")
    writer = (f"import sys; from pathlib import Path; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
              f"import test_jax_checkpoints as t; t.write(Path({str(folder)!r}), t.train_state(t.base_nets(), 5))\n")
    subprocess.run([sys.executable, "-c", writer], check=True, capture_output=True, timeout=300)
    return folder / "checkpoint_5"


JAX_STORE_PARTS = ["manifest.ocdbt", "ocdbt.process_0/manifest.ocdbt", "a B-tree or data file", "a root data file",
                   "_METADATA", "_CHECKPOINT_METADATA"]


@FEW
@given(part=st.sampled_from(JAX_STORE_PARTS), damage=st.one_of(
    st.sampled_from(FILE_KINDS), st.tuples(st.integers(0, 10**6), st.binary(min_size=1, max_size=8), st.booleans())))
def test_generated_jax_checkpoint_damage(official_checkpoint, part, damage):
    """The official writer's checkpoint with one of its files replaced by a FIFO, a folder, a
    broken link, a device, an oversized or an empty file, or overwritten with a few bytes at an
    offset (and cut there): convert writes the complete model (exit 0) or refuses in one line
    and writes nothing; nothing blocks (60 s guard; a conversion takes about a second)."""
    with tempfile.TemporaryDirectory() as root:
        damaged = Path(root) / "checkpoint_5"
        shutil.copytree(official_checkpoint, damaged)
        files = {"a B-tree or data file": sorted((damaged / "ocdbt.process_0" / "d").iterdir())[0],
                 "a root data file": sorted((damaged / "d").iterdir())[0]}
        target = files.get(part, damaged / part)
        if isinstance(damage, str):
            _make_kind(target, damage)
        else:
            offset, data, cut = damage
            content = bytearray(target.read_bytes())
            at = offset % (len(content) + 1)
            content[at:at + len(data)] = data
            target.write_bytes(bytes(content[:at + len(data)] if cut else content))
        out = Path(root) / "out"
        out.mkdir()
        code, stdout, err = within(60, lambda: run_cli("convert", damaged, out / "model.safetensors"))
        assert "Traceback" not in err
        if code == 0:
            assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
        else:
            assert_one_line_error(code, stdout, err)
            assert list(out.iterdir()) == []


@pytest.fixture(scope="module")
def resumable(tmp_path_factory) -> Path:
    """A run folder of a two-step tiny training run (checkpoint.safetensors, log.jsonl)."""
    pytest.importorskip("torch", reason="training needs the [train] extra (torch)")
    from minit2i.training import train

    folder = tmp_path_factory.mktemp("resumable") / "run"
    assert train.main(["--tiny", "--steps", "2", "--batch", "2", "--run", str(folder), "--eval-every", "0",
                       "--threads", "1", "--export-dir", str(folder.parent / "export")]) == 0
    return folder


@CASES
@given(data=st.data(), value=st.sampled_from([float("nan"), float("inf"), -float("inf"), -1.0, 0.0, 1.5, 3e38]),
       step=st.one_of(st.none(), st.integers(-3, 10**8), st.sampled_from(["2", 2.0, True, [2]])))
def test_generated_resumable_checkpoints(resumable, data, value, step):
    """A resumable checkpoint with one value of one tensor changed (a weight, an EMA weight, an
    AdamW moment or step count) and maybe its recorded step: the export runs (exit 0) or one
    line names what is wrong, and the run folder is left as it was."""
    from safetensors import safe_open
    from safetensors.numpy import save

    from minit2i.training import train

    with safe_open(str(resumable / train.CHECKPOINT), framework="numpy") as f:
        tensors, record = {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["run"])
    name = data.draw(st.sampled_from(sorted(tensors)))
    changed = tensors[name].copy()
    changed.reshape(-1)[data.draw(st.integers(0, changed.size - 1))] = value
    record = record if step is None else {**record, "step": step}
    with tempfile.TemporaryDirectory() as root:
        run = Path(root) / "run"
        shutil.copytree(resumable, run)
        (run / train.CHECKPOINT).write_bytes(save({**tensors, name: changed}, metadata={"run": json.dumps(record)}))
        before = {p.name: p.read_bytes() for p in run.iterdir()}
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = train.main(["--tiny", "--batch", "2", "--run", str(run), "--export-only",
                               "--export-dir", str(Path(root) / "out")])
        assert "Traceback" not in err.getvalue()
        assert code == 0 or (code == 2 and err.getvalue().count("\n") == 1 and err.getvalue().startswith("train: error:"))
        assert (Path(root) / "out").exists() == (code == 0), err.getvalue()
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before


@CASES
@given(destination=st.one_of(
    st.sampled_from(["", ".", "..", "/", "sub/", "sub/x.safetensors", "missing/x.safetensors", "x", "x.SAFETENSORS",
                     "x.safetensors/", "x" * 250 + ".safetensors", "config.json", "~.safetensors",
                     "~no-such-user-minit2i/x.safetensors"]),
    st.text(st.characters(blacklist_characters="/\0", blacklist_categories=["Cs"]), max_size=12).map(
        lambda name: name + ".safetensors")),
    force=st.booleans())
def test_generated_convert_destinations(tiny, destination, force):
    """Any destination into a folder holding an earlier pair: a new pair written whole (exit 0),
    or one line with the old pair as it was and nothing else created."""
    old = {"sub/x.safetensors": OLD_BYTES, "sub/config.json": b"{}"}
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "sub").mkdir()
        for name, data in old.items():
            (Path(root) / name).write_bytes(data)
        start = os.getcwd()
        os.chdir(root)  # the destination is relative to the folder holding the earlier pair
        try:
            code, out, err = run_cli("convert", tiny[0], destination, *["--force"] * force)
            written = sorted(str(p) for p in Path(".").rglob("*") if p.is_file() and str(p) not in old)
        finally:
            os.chdir(start)
        if code == 0:
            dst = Path(destination)
            assert written == sorted({str(dst), str(dst.parent / "config.json")} - set(old)), written
        else:
            assert_one_line_error(code, out, err)
            assert written == [] and all((Path(root) / name).read_bytes() == data for name, data in old.items())


@pytest.mark.parametrize("command", ["train", "distill", "learn"])
def test_a_training_command_without_torch_names_the_train_extra(command, tmp_path):
    """Without PyTorch (hidden here by a None entry in sys.modules, as if the `train` extra were not
    installed), each training command prints one line naming the extra and exits 2: no
    ImportError traceback, nothing written."""
    run = subprocess.run(
        [sys.executable, "-c", "import runpy, sys; sys.modules['torch'] = None; "
         f"sys.argv = ['{command}', '--out', {str(tmp_path / 'run')!r}]; "
         f"runpy.run_module('minit2i.training.{command}', run_name='__main__')"],
        capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip() == (f'{command}: error: training needs PyTorch, the train extra; install it with: '
                                  '.venv/bin/pip install -e ".[train]"')
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# The Python API and the files behind it keep the command line's promise


def test_a_prompt_of_100000_characters_is_refused_before_it_is_tokenized(tiny, tmp_path, no_tensor_reads):
    """The model reads 255 tokens (the tiny one 15): a prompt is bounded by characters before the
    tokenizer sees it (a 10 MB one took it 1.6 GB and 30 s), from the command line, Python and the
    tokenizer alike."""
    prompt = "a red cat " * 10_000
    message = "the prompt is 100,000 characters, more than the 20,000 a prompt may have"
    assert_one_line_error(*run_cli("generate", *TINY_ARGS[2:], "-p", prompt, "--model", tiny[0], "--t5", tiny[1],
                                   "-o", tmp_path / "x.png"), message)
    with pytest.raises(MiniT2IError, match=message):
        Request(prompt)
    with pytest.raises(MiniT2IError, match=message):
        PromptTokenizer(make_t5_style_tokenizer([("\u2581cat", -1.0)]), 8)([prompt])


@pytest.mark.parametrize("change", ["a tensor renamed", "a tensor stored as float16"])
def test_a_model_file_replaced_after_it_was_opened_is_one_line(tiny, tmp_path, change):
    """The tensors are read only from the file that was checked at open (its names, shapes, dtypes
    and size): a file re-exported in between is refused, not read as it now is."""
    from minit2i import MiniT2IPipeline

    model = transformer_copy(tiny, tmp_path / "m")
    pipe = MiniT2IPipeline.open(str(model), str(tiny[1]))
    tensors = dict(tiny[2])
    name = "model.net.final_layer.linear.bias"
    if change == "a tensor renamed":
        tensors[name + "_renamed"] = tensors.pop(name)
    else:
        tensors[name] = tensors[name].astype(np.float16)
    save_file(tensors, str(model / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(MiniT2IError, match=r"diffusion_pytorch_model.safetensors changed since it was opened "
                                           r"\(its size, tensor names, shapes or dtypes differ from those checked\)"):
        pipe.load()


@pytest.mark.parametrize(("arguments", "words"), [
    ((None,), "pretrained_model_name_or_path must be a path, a Hub repo id or a demo model's name, found null"),
    ((5,), "pretrained_model_name_or_path must be a path, a Hub repo id or a demo model's name, found 5 (int)"),
    ((b"demo",), "found b'demo' (bytes)"),
    (("demo", 5), "t5 must be None, a path or a Hub repo id, found 5 (int)"),
    (("demo", None, {"tokenizer": 5}), "tokenizer must be None or the path of a tokenizer.json, found 5"),
    (("demo", None, {"variant": 5}), "variant must be a variant name such as 'b16', found 5"),
    (("demo", None, {"backend": ["numpy"]}), "backend must be a backend name such as 'numpy', found [\"numpy\"] (a list)"),
    (("demo", None, {"precision": ["fp32"]}), "precision must be a precision name such as 'fp32', found"),
    (("demo", None, {"jax_tree": 5}), "jax_tree must be None or a parameter tree name such as 'ema', found 5"),
])
def test_every_argument_of_from_pretrained_is_type_checked(arguments, words):
    from minit2i import MiniT2IPipeline

    *positional, keywords = arguments if isinstance(arguments[-1], dict) else (*arguments, {})
    with pytest.raises(MiniT2IError) as raised:
        MiniT2IPipeline.open(*positional, **keywords)
    assert words in str(raised.value) and "\n" not in str(raised.value)


@pytest.fixture(scope="module")
def tiny_pipe(tiny):
    from minit2i import MiniT2IPipeline

    pipe = MiniT2IPipeline.from_pretrained(str(tiny[0]), str(tiny[1]))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize(("keywords", "words"), [
    ({"output_type": np.array(["pil", "np"])}, "output_type must be one of 'pil', 'np', found"),
    ({"negative_prompt": np.array(["dog", "cow"])}, "MiniT2I has no negative prompt"),
    ({"guidance_interval": np.array([0.2, 0.8])}, "must be two numbers t_min t_max in [0, 1], found array"),
    ({"num_inference_steps": np.float64(1.5)}, "--steps (num_inference_steps) must be an integer"),
    ({"num_inference_steps": np.bool_(True)}, "--steps (num_inference_steps) must be an integer"),
])
def test_call_arguments_of_any_type_are_one_line(tiny_pipe, keywords, words):
    with pytest.raises(MiniT2IError) as raised:
        tiny_pipe("a red cat", **{"num_inference_steps": 1, "height": 16, "width": 16, **keywords})
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_numpy_scalars_are_taken_where_a_number_is(tiny_pipe):
    """np.int64 steps, size, count and seed and an np.float32 guidance draw the pixels of the
    Python numbers they hold."""
    numbers = {"num_inference_steps": 2, "height": 16, "width": 16, "num_images_per_prompt": 2, "generator": 3}
    expected = tiny_pipe("a red cat", guidance_scale=2.5, output_type="np", **numbers).images
    scalars = {name: np.int64(value) for name, value in numbers.items()}
    got = tiny_pipe("a red cat", guidance_scale=np.float32(2.5), output_type="np", **scalars).images
    np.testing.assert_array_equal(got, expected)


@contextlib.contextmanager
def nested_folders(top: Path, depth: int):
    """`top`/a/a/.../a, `depth` folders deep (made and removed through folder descriptors: the path
    is longer than the system takes in one call, and a recursive removal would overflow)."""
    top.mkdir()
    fds = [os.open(top, os.O_RDONLY)]
    try:
        for _ in range(depth):
            os.mkdir("a", dir_fd=fds[-1])
            fds.append(os.open("a", os.O_RDONLY, dir_fd=fds[-1]))
        yield top
    finally:
        os.close(fds.pop())
        while fds:  # each folder left holds the "a" opened after it
            os.rmdir("a", dir_fd=fds[-1])
            os.close(fds.pop())
        top.rmdir()


def test_a_folder_nested_1100_deep_in_a_model_folder_is_one_line(tiny, tmp_path):
    """Folder listings are iterative and bounded: a `checkpoint_1` folder 1,100 deep (a recursive
    glob overflows Python's stack at 1,000) is one line from info, generate, convert and
    from_pretrained, naming the folder."""
    from minit2i import MiniT2IPipeline

    model = transformer_copy(tiny, tmp_path / "m")
    words = "is nested more than 16 folders deep under"
    with nested_folders(model / "checkpoint_1", 1100):
        assert_one_line_error(*run_cli("info", model), words)
        assert_one_line_error(*run_cli("generate", *TINY_ARGS, "--model", model, "--t5", tiny[1],
                                       "-o", tmp_path / "x.png"), words)
        assert_one_line_error(*run_cli("convert", model, tmp_path / "x.safetensors"), words)
        with pytest.raises(MiniT2IError, match=words):
            MiniT2IPipeline.from_pretrained(str(model), str(tiny[1]))


# Any value a client or caller may hand over: JSON (NaN and infinities included), NumPy scalars and
# arrays, bytes, paths.
odd_values = st.one_of(json_values, st.floats(allow_nan=True, allow_infinity=True),
                       st.sampled_from([np.int64(2), np.float32(1.5), np.bool_(True), np.array([1, 2]),
                                        np.array(["pil"]), b"demo", Path("demo"), 2**70, -1, 0, 1.0, "nan", "4"]))
# The page's generate endpoint: its fields in order, with a request the demo model runs.
PAGE_REQUEST = {"prompt": "a red circle", "model_name": "demo", "backend_name": "numpy", "seed": 1, "steps": 4,
                "guidance": 2.0, "t_min": 0.2, "t_max": 0.8, "width": 64, "height": 64, "step": 1, "block": 1}


@pytest.fixture(scope="module")
def page_models():
    from minit2i.explore import Models

    return Models({name: {"pretrained_model_name_or_path": name} for name in ("demo", "demo-mf")})


@MANY
@given(fields=st.dictionaries(st.sampled_from(list(PAGE_REQUEST)), odd_values, min_size=1, max_size=4))
def test_generated_page_requests(page_models, fields):
    """The page's API takes any JSON in any field (its generate and defaults endpoints): the
    request's settings, or one line of the project's checks (never another exception, which
    Gradio would show as a bare "Error" and a traceback)."""
    from minit2i.explore import page_settings, settings_for

    try:
        settings = page_settings(page_models, **(PAGE_REQUEST | fields))
    except MiniT2IError as err:
        assert "\n" not in str(err)
    else:
        assert 1 <= settings["step"] <= settings["steps"] and 1 <= settings["block"] <= 4  # the page counts from 1
    try:
        settings_for(page_models, fields.get("model_name", "demo"))
    except MiniT2IError as err:
        assert "\n" not in str(err)


@pytest.fixture(scope="module")
def page_run(page_models):
    """A session's kept run of PAGE_REQUEST (4 steps of the demo model), as the page keeps it."""
    from minit2i.explore import PRECISION, page_settings
    from minit2i.explore_tutor import KEPT_RUNS, Kept, sample_run

    settings = page_settings(page_models, **PAGE_REQUEST)
    finished = sample_run(page_models, "demo", "numpy", PRECISION, lambda info: None, PAGE_REQUEST["prompt"],
                          **settings)
    return Kept(KEPT_RUNS.keep(finished), "demo", "numpy", 1)


@MANY
@given(event_data=st.one_of(odd_values, st.dictionaries(st.sampled_from(["index", "value", "selected"]), odd_values)),
       steps=odd_values, step=odd_values, block=odd_values)
def test_generated_page_events(page_models, page_run, event_data, steps, step, block):
    """Every value the page's other events take, as any client may send it: a click on the x0
    strip (its event data), the steps field's change (the slider fitted to it), the step and block
    selectors (the kept run looked at again): a value of the run, or one line of the project's
    checks (a forged click's index was a traceback, a steps field of 10^30 an answer that never
    came)."""
    from minit2i.explore import STEPS_RANGE, slider_fit, whole
    from minit2i.explore_tutor import look_again, picked_step

    steps_run = PAGE_REQUEST["steps"]
    try:
        picked = picked_step(event_data, steps_run)
    except MiniT2IError as err:
        assert "\n" not in str(err)
    else:
        assert type(picked) is int and 1 <= picked <= steps_run
    fit = slider_fit(steps, step)
    if fit is not None:
        maximum, value = fit
        assert STEPS_RANGE.contains(maximum) and (value is None or STEPS_RANGE.contains(value) and value <= maximum)
    try:
        insides = look_again(page_models, page_run, whole(step), whole(block))
    except MiniT2IError as err:
        assert "\n" not in str(err)
    else:
        assert insides.attention.shape[0] == len(insides.words)


@MANY
@given(arguments=st.dictionaries(st.sampled_from(["pretrained_model_name_or_path", "t5", "tokenizer", "variant",
                                                   "backend", "precision", "jax_tree", "threads"]),
                                 st.one_of(odd_values, st.sampled_from(["demo", "demo-mf", "no/such", "", "cupy",
                                                                        "fp16", "ema", "b16"])), min_size=1))
def test_generated_from_pretrained_arguments(offline_hub, arguments):
    """Every argument of `MiniT2IPipeline.open` (and so of `from_pretrained`) with a value of any
    type: the pipeline, or MiniT2IError with one line (nothing is downloaded: the Hub is offline)."""
    from minit2i import MiniT2IPipeline

    try:
        MiniT2IPipeline.open(**({"pretrained_model_name_or_path": "demo"} | arguments))
    except MiniT2IError as err:
        assert "\n" not in str(err)


@pytest.fixture(scope="module")
def demo_pipe():
    from minit2i import MiniT2IPipeline

    return MiniT2IPipeline.open("demo")


@MANY
@given(keywords=st.dictionaries(st.sampled_from(["prompt", "num_inference_steps", "guidance_scale", "height", "width",
                                                 "num_images_per_prompt", "generator", "output_type",
                                                 "callback_on_step_end", "guidance_interval", "a_min",
                                                 "negative_prompt"]), odd_values, min_size=1))
def test_generated_call_arguments(demo_pipe, monkeypatch, keywords):
    """Every keyword of a pipeline call with a value of any type: every check passes (the run is
    stopped where it would sample), or MiniT2IError with one line."""
    def reached(*args):
        raise _Reached

    monkeypatch.setattr(type(demo_pipe), "_run", reached)
    try:
        demo_pipe(**({"prompt": "a red circle"} | keywords))
    except (_Reached, MiniT2IError) as err:
        assert "\n" not in str(err)


# ---------------------------------------------------------------------------------------------
# learn's run folder is read as any file from outside


@pytest.fixture(scope="module")
def learnt_run(tmp_path_factory) -> Path:
    """The folder of a finished 4-step watch-it-learn run (rows at steps 0, 1, 2 and 4)."""
    pytest.importorskip("torch", reason="training needs the [train] extra (torch)")
    from minit2i.training import learn

    folder = tmp_path_factory.mktemp("learnt") / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert learn.main(["--out", str(folder), "--steps", "4", "--eval-prompts", "2"]) == 0
    return folder


def learn_outcome(folder: Path) -> tuple[int, str, str]:
    """The same command run again on `folder` (nothing left to train: it reads the folder and
    writes the results) -> (exit status, stdout, stderr); a run that blocks fails the test."""
    from minit2i.training import learn

    def again():
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = learn.main(["--out", str(folder), "--steps", "4", "--eval-prompts", "2"])
        return code, out.getvalue(), err.getvalue()

    return within(120, again)


def assert_learn_error(outcome, *words) -> str:
    """Exit 2 and one error line, the last on stderr (after the bar of the steps run, if any), no traceback."""
    code, out, err = outcome
    line = err.rstrip("\n").split("\n")[-1]
    assert "Traceback" not in out + err
    assert code == 2 and err.count("learn: error: ") == 1 and line.startswith("learn: error: "), (code, err)
    for word in words:
        assert word in line, line
    return line


def png_declaring(width: int, height: int) -> bytes:
    """A PNG of one pixel whose header declares `width` x `height` pixels (its CRC fixed)."""
    import zlib

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    header = struct.pack(">II", width, height) + bytes(data[24:29])
    data[16:29] = header
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + header))
    return bytes(data)


def log_lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]


def write_log(folder: Path, records: list[dict]) -> None:
    (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def with_eval(records: list[dict], step: int, report) -> list[dict]:
    return [{**r, "eval": report} if "eval" in r and r["step"] == step else r for r in records]


def replaced_by_link(path: Path, target: Path) -> None:
    """`path` moved to `target`, and a link to it in its place."""
    path.rename(target)
    path.symlink_to(target)


LEARN_DAMAGE = {
    "a FIFO for a row": (lambda run: (run / "samples" / "step-0000001.png").unlink() or
                         os.mkfifo(run / "samples" / "step-0000001.png"),
                         ["samples/step-0000001.png is a FIFO, not a snapshot row this command wrote"]),
    "a link for a row": (lambda run: replaced_by_link(run / "samples" / "step-0000001.png", run / "elsewhere.png"),
                         ["samples/step-0000001.png is a symbolic link, not a snapshot row"]),
    "a row declaring 100000 x 100000 pixels": (
        lambda run: (run / "samples" / "step-0000001.png").write_bytes(png_declaring(100_000, 100_000)),
        ["step-0000001.png is not a PNG row this command wrote (Image size (10000000000 pixels) exceeds limit"]),
    "no log": (lambda run: (run / "log.jsonl").unlink(),
               ["log.jsonl has no read-back of the snapshot at step 0 (it was cut or edited)"]),
    "a cut log": (lambda run: write_log(run, [r for r in log_lines(run) if r["step"] < 2]),
                  ["has no read-back of the snapshot at step 2", "delete", "step-0000002.png and run the same"]),
    "a read-back of no images": (
        lambda run: write_log(run, with_eval(log_lines(run), 4, {"counts": {"held_in": 0, "held_out": 0}})),
        ["holds a read-back at step 4 that this command did not write"]),
    "a read-back that is a number": (lambda run: write_log(run, with_eval(log_lines(run), 2, 5)),
                                     ["holds a read-back at step 2 that this command did not write (5)"]),
}


@pytest.mark.parametrize("damage", list(LEARN_DAMAGE))
def test_learn_reads_its_run_folder_as_a_file_from_outside(learnt_run, tmp_path, damage):
    """A FIFO in place of a row used to hang learn; a link was opened wherever it pointed; an
    oversized row was a decompression-bomb traceback; a missing, cut or edited log was a
    StopIteration, KeyError, TypeError or ZeroDivisionError traceback. Each is one line now."""
    run = tmp_path / "run"
    shutil.copytree(learnt_run, run, symlinks=True)
    make, words = LEARN_DAMAGE[damage]
    make(run)
    assert_learn_error(learn_outcome(run), *words)


@FEW
@given(data=st.data())
def test_generated_learn_run_folders(learnt_run, data):
    """Any read-back in the log, any bytes (or a cut) in place of a row: the results are written,
    or one line."""
    with tempfile.TemporaryDirectory() as root:
        run = Path(root) / "run"
        shutil.copytree(learnt_run, run, symlinks=True)
        records = log_lines(run)
        steps = [r["step"] for r in records if "eval" in r]
        step = data.draw(st.sampled_from(steps))
        if data.draw(st.booleans()):
            write_log(run, with_eval(records, step, data.draw(json_values)))
        else:
            row = run / "samples" / f"step-{step:07d}.png"
            good = row.read_bytes()
            row.write_bytes(data.draw(st.one_of(st.binary(max_size=64), st.integers(0, len(good)).map(
                lambda n: good[:n]))))
        code, out, err = learn_outcome(run)
        if code != 0:
            assert_learn_error((code, out, err))


@pytest.mark.parametrize("damage", [b"{not JSON\n", b'{"step": "two"}\n'])
def test_learn_refuses_a_damaged_log_before_it_trains(learnt_run, tmp_path, damage):
    """A damaged log was found only after training: learn rewrote the checkpoint and appended its new
    steps after the bad line, then refused. Now the run is left as it was, byte for byte."""
    from minit2i.training import learn

    run = tmp_path / "run"
    shutil.copytree(learnt_run, run, symlinks=True)
    bad_line = len(log_lines(run)) + 1
    with open(run / "log.jsonl", "ab") as log:
        log.write(damage)
    before = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in run.rglob("*") if path.is_file()}
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = within(120, lambda: learn.main(["--out", str(run), "--steps", "6", "--eval-prompts", "2"]))
    assert_learn_error((code, "", err.getvalue()), f"line {bad_line} of the training log")
    assert {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in run.rglob("*") if path.is_file()} == before


def test_a_full_disk_while_a_file_is_written_whole_names_that_file(tmp_path, capsys):
    """learn's checkpoint on a full disk was `learn: error: No space left on device`, naming no file."""
    import errno

    from minit2i.console import guarded
    from minit2i.core.files import write_temporary

    def fill(file):
        raise OSError(errno.ENOSPC, "No space left on device")

    assert guarded("learn", lambda: write_temporary(tmp_path / "checkpoint.safetensors", fill)) == 2
    assert capsys.readouterr().err == f"learn: error: {tmp_path / 'checkpoint.safetensors'}: No space left on device\n"
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# The evaluation path: batch's prompt file and run folder, its exports, score and the Ray engine


EVAL_STEPS = ["--steps", "3", "-q"]  # the demo model at 3 steps: a tenth of a second an image


def tree(root: Path) -> dict[str, tuple]:
    """Every entry under `root`, hidden ones included, never followed -> (kind, size, modification
    time in ns, inode): what a command that must change nothing has to leave equal."""
    return {str(path.relative_to(root)): (stat.S_IFMT(info.st_mode), info.st_size, info.st_mtime_ns, info.st_ino)
            for path in sorted(root.rglob("*")) for info in [path.lstat()]}


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory) -> Path:
    """A finished run of score's demo scenes (2 held-in, 1 held-out), -n 4, each prompt with a
    plain "id": what the DPG and flat exports and score all read."""
    from minit2i.training import score

    root = tmp_path_factory.mktemp("scored")
    lines = [line | {"id": f"item-{i}"} for i, line in enumerate(score.prompt_lines(2))]
    (root / "scenes.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, _, err = run_cli("batch", root / "scenes.jsonl", "--out", root / "run", "-n", "4", *EVAL_STEPS)
    assert code == 0, err
    return root / "run"


def run_copy(scored_run: Path, root: Path) -> Path:
    """A copy of the run folder in `root`, with its prompt file beside it."""
    shutil.copy(scored_run.parent / "scenes.jsonl", root / "scenes.jsonl")
    shutil.copytree(scored_run, root / "run", symlinks=True)
    return root / "run"


def score_outcome(folder: Path) -> tuple[int, str, str]:
    """`python -m minit2i.training.score FOLDER` in process -> (exit status, stdout, stderr)."""
    from minit2i.training import score

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = score.main([str(folder)])
    return code, out.getvalue(), err.getvalue()


def assert_score_error(outcome, *words) -> str:
    code, out, err = outcome
    assert "Traceback" not in out + err
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("score: error: "), (code, err)
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_a_prompt_file_with_a_byte_order_mark_is_read_as_its_kind(tmp_path):
    """GenEval's metadata saved with a UTF-8 BOM (Windows editors, PowerShell) was read as one prompt
    a line: the model drew the JSON text, and the tag and include fields were lost."""
    lines = [{"prompt": "a red circle", "tag": "colors", "include": [{"class": "circle", "count": 1}]},
             {"prompt": "a blue square", "tag": "single_object", "include": []}]
    prompts = tmp_path / "metadata.jsonl"
    prompts.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(line) + "\r\n" for line in lines).encode())
    code, _, err = run_cli("batch", prompts, "--out", tmp_path / "run", *EVAL_STEPS)
    assert code == 0, err
    drawn = [json.loads(line) for line in (tmp_path / "run/manifest.jsonl").read_text().splitlines()]
    assert sorted(entry["prompt"] for entry in drawn) == ["a blue square", "a red circle"]
    for index, line in enumerate(lines):
        assert json.loads((tmp_path / f"run/{index:05d}/metadata.jsonl").read_text()) == line


def replaced_by_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def manifest_linked_outside(run: Path) -> None:
    """manifest.jsonl a link to a user's file holding the manifest and a cut line (which a rerun
    used to drop by truncating the file the link points to)."""
    user_file = run.parent / "notes.txt"
    user_file.write_bytes((run / "manifest.jsonl").read_bytes() + b'{"index": 0, "k"')
    (run / "manifest.jsonl").unlink()
    (run / "manifest.jsonl").symlink_to(user_file)


# damage -> (how the run folder is damaged, the command run on it, the words of its one line)
RUN_DAMAGE = {
    "a manifest linked to a user's file": (manifest_linked_outside, "rerun", ["manifest.jsonl is a symbolic link"]),
    "a FIFO manifest": (lambda run: replaced_by_fifo(run / "manifest.jsonl"), "rerun",
                        ["manifest.jsonl is a FIFO, not the manifest this command writes"]),
    "a FIFO manifest, exported": (lambda run: replaced_by_fifo(run / "manifest.jsonl"), "dpg",
                                  ["manifest.jsonl: expected a file, found a FIFO"]),
    "a FIFO metadata.jsonl": (lambda run: replaced_by_fifo(run / "00001/metadata.jsonl"), "dpg",
                              ["00001/metadata.jsonl: expected a file, found a FIFO"]),
    "a PNG declaring 100000 x 100000 pixels": (
        lambda run: (run / "00000/samples/0002.png").write_bytes(png_declaring(100_000, 100_000)), "dpg",
        ["0002.png does not hold the image its manifest line records"]),
    "a PNG of another size, its manifest line to match": (
        lambda run: swap_image(run, 0, 2, png_declaring(100_000, 100_000)), "dpg",
        ["0002.png is not an image of this run (Image size (10000000000 pixels) exceeds limit"]),
    "a PNG of another size, scored": (
        lambda run: swap_image(run, 1, 3, png_bytes(np.zeros((8, 8, 3), np.uint8))), "score",
        ["0003.png is 8 x 8 pixels, not an image of this run of 64 x 64"]),
    "a manifest of over 1 GiB": (lambda run: os.truncate(run / "manifest.jsonl", 2**30 + 1), "flat",
                                 ["manifest.jsonl is 1,073,741,825 bytes, more than the 1,073,741,824 bytes"]),
}


def swap_image(run: Path, index: int, k: int, png: bytes) -> None:
    """Image (index, k) replaced by `png`, its manifest line's sha256 changed to match."""
    (run / image_path_of(index, k)).write_bytes(png)
    lines = [json.loads(line) for line in (run / "manifest.jsonl").read_text().splitlines()]
    for line in lines:
        if (line["index"], line["k"]) == (index, k):
            line["sha256"] = hashlib.sha256(png).hexdigest()
    (run / "manifest.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def image_path_of(index: int, k: int) -> str:
    from minit2i.batch.store import image_path

    return image_path(index, k)


def run_folder_outcome(run: Path, command: str) -> tuple[int, str, str]:
    """`command` on the run folder: "rerun" (the batch command that drew it), an export ("dpg",
    "flat") or "score"; a command that blocks fails the test (a hang guard: each takes seconds)."""
    if command == "score":
        return within(60, lambda: score_outcome(run))
    if command == "rerun":
        return within(60, lambda: run_cli("batch", run.parent / "scenes.jsonl", "--out", run, "-n", "4",
                                           *EVAL_STEPS))
    return within(60, lambda: run_cli("batch", "--out", run, "--export", command))


@pytest.mark.parametrize("damage", list(RUN_DAMAGE))
def test_the_run_folders_files_are_read_as_files_from_outside(scored_run, tmp_path, damage):
    """A manifest linked to a user's file had that file truncated and rewritten; a FIFO manifest was
    "File or stream is not seekable." with no path, a FIFO metadata.jsonl hung the DPG export, a
    PNG of another size or a decompression bomb was a traceback, and a 3 GB manifest was read
    whole. Each is one line now, and nothing outside the run folder changes."""
    run = run_copy(scored_run, tmp_path)
    make, command, words = RUN_DAMAGE[damage]
    make(run)
    before = tree(tmp_path)
    code, out, err = run_folder_outcome(run, command)
    if command == "score":
        assert_score_error((code, out, err), *words)
    else:
        assert_one_line_error(code, out, err, *words)
    assert tree(tmp_path) == before


def test_a_prompt_line_the_limits_take_draws_a_run_its_readers_take(tmp_path):
    """A line of GenEval's metadata just under the line limit, of numbers written short (1e15):
    json.dumps wrote it back four times as long (1000000000000000.0), a metadata.jsonl of 2 MB
    that the DPG export (and score) then refused. It is kept byte for byte now."""
    from minit2i.batch.prompts import PROMPT_LINE_LIMIT

    head = b'{"prompt": "a red circle", "id": "long", "numbers": ['
    count = (PROMPT_LINE_LIMIT - len(head) - 2) // 5
    line = head + b",".join([b"1e15"] * count) + b"]}"
    assert len(line) <= PROMPT_LINE_LIMIT and len(json.dumps(json.loads(line))) > 2**20
    (tmp_path / "long.jsonl").write_bytes(line + b"\n")
    code, _, err = run_cli("batch", tmp_path / "long.jsonl", "--out", tmp_path / "run", "-n", "4", "--export", "dpg",
                           *EVAL_STEPS)
    assert code == 0, err
    assert (tmp_path / "run/00000/metadata.jsonl").read_bytes() == line + b"\n"
    assert [path.name for path in (tmp_path / "run/dpg").iterdir()] == ["long.png"]


@pytest.mark.parametrize("command", ["flat", "dpg", "score"])
def test_a_prompt_folder_linked_outside_the_run_is_not_read_through(scored_run, tmp_path, command):
    """A prompt's folder replaced by a link to a copy of it elsewhere: its images and metadata were
    read through the link (a file of the run is never read through a link). Now one line."""
    run = run_copy(scored_run, tmp_path)
    shutil.move(run / "00001", tmp_path / "elsewhere")
    (run / "00001").symlink_to(tmp_path / "elsewhere")
    code, out, err = run_folder_outcome(run, command)
    words = "00001 is a symbolic link, not a folder of the run"
    if command == "score":
        assert_score_error((code, out, err), words)
    else:
        assert_one_line_error(code, out, err, words)


def gif_bytes() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 0, 0)).save(buffer, format="GIF")
    return buffer.getvalue()


def another_image(run: Path, index: int, k: int) -> None:
    """Image (index, k) replaced by a PNG of the run's size with other pixels, its manifest line as it was."""
    (run / image_path_of(index, k)).write_bytes(png_bytes(np.full((64, 64, 3), 7, np.uint8)))


# damage of one stored image -> the words of the one line every export and score answer it with
IMAGE_DAMAGE = {
    "other bytes than the manifest records": (lambda run: another_image(run, 0, 1),
                                               "0001.png does not hold the image its manifest line records"),
    "a PNG of another size": (lambda run: swap_image(run, 0, 1, png_bytes(np.zeros((8, 8, 3), np.uint8))),
                              "0001.png is 8 x 8 pixels, not an image of this run of 64 x 64"),
    "a GIF named .png": (lambda run: swap_image(run, 0, 1, gif_bytes()), "0001.png is not a PNG image"),
    "a decompression bomb": (lambda run: swap_image(run, 0, 1, png_declaring(100_000, 100_000)),
                             "0001.png is not an image of this run (Image size (10000000000 pixels) exceeds limit"),
}


@pytest.mark.parametrize("command", ["flat", "dpg", "score"])
@pytest.mark.parametrize("damage", list(IMAGE_DAMAGE))
def test_every_export_and_score_refuse_a_damaged_image(scored_run, tmp_path, damage, command):
    """The flat export linked all four damages into the folder an FID tool reads (it checked the
    size of each file only), where the DPG export and score refused them: all three now check
    each image as `Run.image` does, and the damaged one is never exported."""
    run = run_copy(scored_run, tmp_path)
    make, words = IMAGE_DAMAGE[damage]
    make(run)
    code, out, err = run_folder_outcome(run, command)
    if command == "score":
        assert_score_error((code, out, err), words)
    else:
        assert_one_line_error(code, out, err, words)
    assert not (run / "flat/00000_0001.png").exists()


def exported_images_are_the_recorded_ones(run: Path) -> None:
    """Every file of the flat export holds the bytes its image's manifest line records."""
    recorded = {f"{line['index']:05d}_{line['k']:04d}.png": line["sha256"]
                for line in map(json.loads, (run / "manifest.jsonl").read_text().splitlines())}
    for path in (run / "flat").iterdir():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded[path.name], path.name


@FEW
@given(image=st.tuples(st.integers(0, 2), st.integers(0, 3)), command=st.sampled_from(["flat", "dpg", "score"]),
       recorded=st.booleans(), data=st.data())
def test_generated_damage_of_a_stored_image(scored_run, image, command, recorded, data):
    """Any damage of one stored image (other bytes, a cut, a flipped byte, another image, a GIF, a
    bomb), with its manifest line's sha256 left or made to match: every export and score either
    finish, exporting only images that hold what their manifest lines record, or answer in one
    line; nothing blocks."""
    with tempfile.TemporaryDirectory() as root:
        run = run_copy(scored_run, Path(root))
        path = run / image_path_of(*image)
        good = path.read_bytes()
        damage = data.draw(st.one_of(
            st.binary(max_size=64), st.integers(0, len(good) - 1).map(lambda n: good[:n]),
            st.tuples(st.integers(0, len(good) - 1), st.integers(1, 255)).map(
                lambda flip: good[:flip[0]] + bytes([good[flip[0]] ^ flip[1]]) + good[flip[0] + 1:]),
            st.sampled_from([gif_bytes(), png_declaring(100_000, 100_000), png_declaring(64, 64),
                             png_bytes(np.zeros((8, 8, 3), np.uint8)), png_bytes(np.zeros((64, 64, 3), np.uint8))])))
        if recorded:
            swap_image(run, *image, damage)
        else:
            path.write_bytes(damage)
        code, out, err = run_folder_outcome(run, command)
        if command == "score" and code:
            assert_score_error((code, out, err))
        elif code:
            assert_one_line_error(code, out, err)
        if command == "flat" and (run / "flat").exists():
            exported_images_are_the_recorded_ones(run)


def test_a_folder_with_another_tools_run_json_is_refused_untouched(tmp_path):
    """Any folder holding a file named run.json was taken for a run folder and cleaned before it
    was checked: it lost its hidden *.part files (in subfolders too) and gained a manifest, then
    was refused with a 300-character JSON dump. Now nothing in it is touched, in one short line."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    exp = tmp_path / "exp"
    (exp / "00001").mkdir(parents=True)
    (exp / "run.json").write_text(json.dumps({"settings": {"lr": 0.1}, "name": "x" * 300}))
    (exp / ".checkpoint.part").write_bytes(b"another tool's download")
    (exp / "00001" / ".weights.part").write_bytes(b"another tool's download")
    before = tree(exp)
    for args in ([prompts, "--out", exp, *EVAL_STEPS], ["--out", exp, "--export", "flat"]):
        line = assert_one_line_error(*run_cli("batch", *args), "is not a run folder of minit2i batch",
                                     'its run.json does not say "format": "minit2i batch run"')
        assert len(line) < 250, line
        assert tree(exp) == before


@pytest.mark.parametrize("edit, words", [
    (lambda record: record.pop("settings"), "run.json is damaged: its settings lack images_per_prompt"),
    (lambda record: record.update(settings=[]), "run.json is damaged"),
    (lambda record: record["settings"].update(images_per_prompt="4"), "run.json is damaged"),
    (lambda record: record.pop("format"), 'does not say "format": "minit2i batch run"'),
    (lambda record: record.update(version=2), "is of version 2 of the run folder, and this minit2i reads version 1"),
])
def test_an_export_of_a_run_json_it_does_not_understand_is_one_line(scored_run, tmp_path, edit, words):
    """A run.json without settings, or with "settings": [], was a traceback in the DPG export."""
    run = run_copy(scored_run, tmp_path)
    record = json.loads((run / "run.json").read_text())
    edit(record)
    (run / "run.json").write_text(json.dumps(record))
    assert_one_line_error(*run_cli("batch", "--out", run, "--export", "dpg"), words)
    assert not (run / "dpg").exists()


def test_dpg_grids_of_prompts_sharing_an_id_are_named_apart(tmp_path):
    """Two prompts with the same "id", or an id equal to another prompt's index name, wrote one
    grid over the other ("3 images" reported, 2 files on disk). Ids shared are left for the
    index, as is an id that is an index's name (00000), with one warning."""
    prompts = tmp_path / "dpg.jsonl"
    ids = ["twin", "TWIN", "00000", "solo"]  # a case-insensitive file system takes TWIN for twin
    texts = ["a red circle", "a blue square", "a green triangle", "a yellow cross"]
    prompts.write_text("".join(json.dumps({"prompt": text, "id": name}) + "\n" for text, name in zip(texts, ids)))
    code, out, err = run_cli("batch", prompts, "--out", tmp_path / "run", "-n", "4", "--export", "dpg", *EVAL_STEPS)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "run/dpg").iterdir()) == ["00000.png", "00001.png", "00002.png",
                                                                        "solo.png"]
    assert out.splitlines()[-1].endswith("dpg: 4 images")
    assert err.splitlines() == ["minit2i: warning: DPG grids named by their prompt's index where prompts share an id "
                                "('twin')"]


@pytest.mark.parametrize("folder", ["typo", "typo/deeper"])
def test_score_of_a_folder_that_is_not_a_run_creates_nothing(tmp_path, folder):
    """`score /path/typo` created the folder and an empty manifest.jsonl, then said there was no image."""
    assert_score_error(score_outcome(tmp_path / folder), "is not a run folder (no run.json)")
    assert list(tmp_path.iterdir()) == []


needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="needs the ray extra (pip install -e '.[ray]')")


@needs_ray
@pytest.mark.parametrize("address, words", [
    ("garbage", '--ray-address "garbage" is not a Ray cluster\'s address'),
    ("", '--ray-address "" is not a Ray cluster\'s address'),
    ("127.0.0.1:1", "--ray-address 127.0.0.1:1: the Ray cluster does not answer (Connection refused)"),
    ("nonsense.invalid:99", "cannot find the host nonsense.invalid"),
    ("ray://127.0.0.1:10001", "is a Ray Client address, and Ray Data, which --engine ray runs on, does not run"),
    ("head..cluster:6379", "cannot find the host head..cluster (not a host name: a part between dots is empty"),
    (f"{'a' * 64}.cluster:6379", "(not a host name: a part between dots is empty or longer than 63 characters)"),
])
def test_ray_addresses_are_checked_before_ray_starts(tmp_path, monkeypatch, address, words):
    """--ray-address garbage or "" was a 31-line traceback from ray.init; an address that does not
    answer hung for as long as it was let run, deaf to Ctrl-C; a host name with an empty label or
    one of 64 bytes was a 39-line UnicodeError traceback. The same checks hold for RAY_ADDRESS."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    args = [prompts, "--out", tmp_path / "run", "--engine", "ray", *EVAL_STEPS]
    assert_one_line_error(*within(60, lambda: run_cli("batch", *args, "--ray-address", address)), words)
    if address:  # an empty RAY_ADDRESS is no address, as for Ray
        monkeypatch.setenv("RAY_ADDRESS", address)
        from_environment = words.replace("--ray-address", "RAY_ADDRESS")
        assert_one_line_error(*within(60, lambda: run_cli("batch", *args)), from_environment)
    assert not (tmp_path / "run").exists()


@needs_ray
def test_actors_are_counted_against_the_nodes_that_must_hold_them():
    """--threads 4 on a 2-CPU cluster asked every actor for 4 CPUs: nothing was ever scheduled."""
    from minit2i.batch.ray_engine import actor_count

    two_cpus, four_with_a_gpu = {"CPU": 2.0, "memory": 1e9}, {"CPU": 4.0, "GPU": 1.0}
    assert actor_count([two_cpus, two_cpus], 1, 0, None) == 4
    assert actor_count([two_cpus, four_with_a_gpu], 2, 0, 3) == 3
    assert actor_count([two_cpus, four_with_a_gpu], 1, 1, None) == 1
    with pytest.raises(MiniT2IError, match=r"^--threads 4: each actor asks for 4 CPUs, and no node of the Ray cluster "
                                           r"has that many \(the largest has 2\); pass --threads 2 or fewer$"):
        actor_count([two_cpus, two_cpus], 4, 0, None)
    with pytest.raises(MiniT2IError, match=r"^--workers 5: the Ray cluster's nodes hold 4 actors of 1 CPUs each"):
        actor_count([two_cpus, two_cpus], 1, 0, 5)
    with pytest.raises(MiniT2IError, match="the Ray cluster has no GPU for --backend cupy"):
        actor_count([two_cpus], 1, 1, None)


@contextlib.contextmanager
def batch_process(tmp_path: Path, address: str):
    """`minit2i batch` in a process of its own on the Ray engine, at `address`; killed at the end
    if it is still running (a test that failed on a hang leaves no process behind)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    process = subprocess.Popen([sys.executable, "-m", "minit2i.cli", "batch", str(prompts), "--out",
                                str(tmp_path / "run"), "--engine", "ray", "--ray-address", address, *EVAL_STEPS],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
                               preexec_fn=ctrl_c_as_at_a_terminal)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@needs_ray
def test_a_ray_address_that_does_not_answer_is_one_line_within_30_seconds(tmp_path):
    """Nothing listens at 127.0.0.1:1: Ray's own connection waited for as long as it was let run
    (580 s seen). 30 s is the bound asked of it, against the 2-3 s the process needs to start."""
    with batch_process(tmp_path, "127.0.0.1:1") as process:
        _, err = process.communicate(timeout=30)
    assert process.returncode == 2
    assert err.decode().splitlines()[-1] == ("minit2i: error: --ray-address 127.0.0.1:1: the Ray cluster does not "
                                             "answer (Connection refused); start the cluster (ray start --head) or "
                                             "correct the address")
    assert not (tmp_path / "run").exists()


@needs_ray
@pytest.mark.parametrize("signum, status, last", [(signal.SIGINT, 130, "minit2i: interrupted"),
                                                  (signal.SIGTERM, 143, "minit2i: terminated"),
                                                  (None, 2, "does not answer as a Ray cluster (no HTTP/2 settings "
                                                            "within 10 s)")])
def test_a_silent_ray_address_is_waited_for_a_bounded_time_and_ctrl_c_ends_the_wait(tmp_path, signum, status, last):
    """Something takes connections and never answers (a listening socket nobody serves): the wait
    for the cluster's answer ends at Ctrl-C (130) or SIGTERM (143), else after 10 s in one line;
    Ray's own connection ignored both. The wait is reached when the command's connections are
    taken (a hang guard of 60 s: the process starts in 2-3 s)."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        silent.settimeout(60)
        with batch_process(tmp_path, f"127.0.0.1:{silent.getsockname()[1]}") as process:
            connection, _ = silent.accept()
            with connection:
                if signum is not None:
                    time.sleep(0.5)  # into the wait for an answer, which the connection just taken begins
                    process.send_signal(signum)
                _, err = process.communicate(timeout=60)
    assert_refused_in_one_line(process, err, status, last, tmp_path)


def assert_refused_in_one_line(process, err: bytes, status: int, last: str, tmp_path: Path):
    """The batch process ended with `status`, its last line holds `last`, no traceback, no run folder."""
    assert process.returncode == status, err
    assert "Traceback" not in err.decode()
    assert last in err.decode().splitlines()[-1]
    assert not (tmp_path / "run").exists()


@contextlib.contextmanager
def settings_then_silence():
    """A loopback port whose server answers the opening of HTTP/2 with its settings, then nothing:
    (the port's number, an event set once a call has come)."""
    import socket
    import threading

    preface, empty_settings = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # RFC 9113
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(60)
    called, held = threading.Event(), []

    def serve():
        with contextlib.suppress(OSError):
            connection, _ = listener.accept()
            held.append(connection)
            connection.recv(len(preface + empty_settings), socket.MSG_WAITALL)
            connection.sendall(empty_settings)
            if connection.recv(1024):
                called.set()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield listener.getsockname()[1], called
    finally:
        listener.close()
        server.join(60)
        for connection in held:
            connection.close()


@needs_ray
@pytest.mark.parametrize("signum, status, last", [
    (signal.SIGTERM, 143, "minit2i: terminated"),
    (None, 2, "something there opens HTTP/2 connections but does not answer a call as a Ray cluster does (no answer "
              "within 10 s)")])
def test_an_address_that_opens_http2_and_then_says_nothing_is_refused_before_ray_starts(tmp_path, signum, status,
                                                                                       last):
    """It passed the address check (which waited for HTTP/2's settings only), and ray.init then
    waited for over 7 minutes. The check now makes a gRPC call, which a Ray head answers in
    milliseconds: refused after 10 s, or at SIGTERM (hang guards of 60 s: the process starts in 2-3 s)."""
    with settings_then_silence() as (port, called), batch_process(tmp_path, f"127.0.0.1:{port}") as process:
        if signum is not None:
            assert called.wait(60)
            process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    assert_refused_in_one_line(process, err, status, last, tmp_path)


# A stand-in for a name server that does not answer: glibc's resolver retries in C, where Python runs
# no signal handler until it returns; here the signals are held in the thread of the lookup for as
# long, which has the same effect on the thread that looks up (and none on any other).
SILENT_NAME_SERVER = """
import pathlib, signal, socket, sys, time

def lookup_of_a_silent_name_server(*args, **kwargs):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    pathlib.Path(sys.argv[1]).touch()
    time.sleep(300)
    raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

socket.getaddrinfo = lookup_of_a_silent_name_server
from minit2i.cli import main
sys.exit(main(sys.argv[2:]))
"""


def wait_for_mark(process: subprocess.Popen, mark: Path, seconds: float) -> None:
    """Wait until the child has made `mark` (it is where the test wants it), `seconds` at most (a hang
    guard); fail with what it printed if it ends before the mark."""
    for _ in range(int(seconds * 10)):
        if mark.exists() or process.poll() is not None:
            break
        time.sleep(0.1)
    assert mark.exists(), process.communicate()


def signalled_once_marked(process: subprocess.Popen, mark: Path, signum) -> bytes:
    """Once the child has made `mark`, send it `signum` (None: no signal) and wait for its end -> its
    stderr. Hang guards of 30 s for each wait (it starts in 2-3 s); killed if it outlives the guard."""
    try:
        wait_for_mark(process, mark, 30)
        if signum is not None:
            process.send_signal(signum)
        return process.communicate(timeout=30)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@needs_ray
@pytest.mark.parametrize("signum, status, last", [
    (signal.SIGTERM, 143, "minit2i: terminated"),
    (signal.SIGINT, 130, "minit2i: interrupted"),
    (None, 2, "minit2i: error: --ray-address head.example:6379: cannot find the host head.example (no answer from "
              "the name server within 10 s); start the cluster (ray start --head) or correct the address")])
def test_a_name_lookup_that_gets_no_answer_ends_at_its_deadline_or_a_signal(tmp_path, signum, status, last):
    """Ctrl-C and SIGTERM waited for the lookup of the head's name (28 s with a silent name server,
    which had no deadline either). Now the lookup is waited for at most 10 s, and a signal ends the
    wait at once (hang guards of 30 s, the process starting in 2-3 s)."""
    prompts, looking = tmp_path / "prompts.txt", tmp_path / "looking-up"
    prompts.write_text("a red circle\n")
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    process = subprocess.Popen([sys.executable, "-c", SILENT_NAME_SERVER, str(looking), "batch", str(prompts),
                                "--out", str(tmp_path / "run"), "--engine", "ray", "--ray-address", "head.example:6379",
                                *EVAL_STEPS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
                               preexec_fn=ctrl_c_as_at_a_terminal)
    err = signalled_once_marked(process, looking, signum)
    assert process.returncode == status, err
    assert err.decode().splitlines()[-1] == last
    assert not (tmp_path / "run").exists()


# The main thread deaf to signals for a minute inside `signals_end_within` (as in C: here the two
# signals are held on it, so that another thread takes them), marked when it gets there.
DEAF_MAIN_THREAD = """
import pathlib, signal, sys, time
from minit2i.console import guarded
from minit2i.waits import signals_end_within

def command():
    with signals_end_within(2):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        pathlib.Path(sys.argv[1]).touch()
        time.sleep(60)

sys.exit(guarded("minit2i", command))
"""


@pytest.mark.parametrize("signum, status, last", [(signal.SIGTERM, 143, "minit2i: terminated"),
                                                  (signal.SIGINT, 130, "minit2i: interrupted")])
def test_a_signal_ends_a_main_thread_that_waits_in_c_within_its_grace(tmp_path, signum, status, last):
    """What ends ray.init's waits in C (30 s seen after a SIGTERM to the process group): the signal
    is seen at once, and the process ends as its handler would have 2 s later (a hang guard of 30 s)."""
    marker = tmp_path / "deaf"
    process = subprocess.Popen([sys.executable, "-c", DEAF_MAIN_THREAD, str(marker)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, preexec_fn=ctrl_c_as_at_a_terminal)
    err = signalled_once_marked(process, marker, signum)
    assert process.returncode == status and err.decode().splitlines() == [last], err


# ray.init held in the middle of starting a local cluster, then the CLI (the other arguments): once
# it has started the raylet (its SIGTERM handler set, the cluster's processes running) the file
# named first is made and ray.init waits 20 s more before going on, so that a signal sent at the
# mark lands inside ray.init however fast the machine starts a cluster (a fixed delay after the
# call did not: an idle machine finished ray.init and made the run folder first). Ray 2's
# node.py starts the raylet through this module function.
RAY_INIT_MARKED = """
import pathlib, sys, time
import ray._private.services as services

start_raylet = services.start_raylet

def marked_start_raylet(*args, **kwargs):
    started = start_raylet(*args, **kwargs)
    pathlib.Path(sys.argv[1]).touch()
    time.sleep(20)
    return started

services.start_raylet = marked_start_raylet
from minit2i.cli import main
sys.exit(main(sys.argv[2:]))
"""


@needs_ray
@pytest.mark.parametrize("to_group", [False, True], ids=["to the process", "to its process group"])
def test_sigterm_while_ray_starts_a_local_cluster_ends_the_run_in_one_line(tmp_path, to_group):
    """SIGTERM inside ray.init starting a local cluster: exit status 15 with no message (the
    handler ray.init puts in, a bare sys.exit), or, sent to the process group, no exit within 25 s
    (ray.init waiting in C for the processes the signal had ended). Now `minit2i: terminated`, 143,
    within seconds (a hang guard of 30 s), and no run folder."""
    prompts, marker = tmp_path / "prompts.txt", tmp_path / "ray-init"
    prompts.write_text("a red circle\n")
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    process = subprocess.Popen([sys.executable, "-c", RAY_INIT_MARKED, str(marker), "batch", str(prompts), "--out",
                                str(tmp_path / "run"), "--engine", "ray", *EVAL_STEPS], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=environment, start_new_session=True)
    try:
        wait_for_mark(process, marker, 60)
        if to_group:
            os.killpg(process.pid, signal.SIGTERM)
        else:
            process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 143, err
    assert err.decode().splitlines()[-1] == "minit2i: terminated"
    assert not (tmp_path / "run").exists()


RUN_PARTS = ["run.json", "manifest.jsonl", "00001/metadata.jsonl", "00001/samples/0002.png", "00002", "dpg", "flat"]
# What each command may write in the run folder (a rerun: anything).
WRITTEN_BY = {"dpg": ("dpg",), "flat": ("flat",), "score": ("score.md", "score.json", "score-misses.png")}


def damaged(path: Path, damage, outside: Path) -> None:
    """`path` (a file or folder of the run) replaced by `damage`: a kind of FILE_KINDS, a link to
    the file `outside`, or bytes."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    if isinstance(damage, bytes):
        path.unlink(missing_ok=True)
        path.write_bytes(damage)
    elif damage == "a link outside":
        path.unlink(missing_ok=True)
        path.symlink_to(outside)
    else:
        _make_kind(path, damage)


@FEW
@given(part=st.sampled_from(RUN_PARTS), command=st.sampled_from(["rerun", "dpg", "flat", "score"]),
       damage=st.one_of(st.sampled_from([*FILE_KINDS, "a link outside"]), st.binary(max_size=64)))
def test_generated_run_folder_damage(scored_run, part, command, damage):
    """Any file or folder of a finished run replaced by a FIFO, a folder, a link (broken, to a
    device, to a file outside), an oversized, empty or arbitrary file, then the run continued,
    exported or scored: done, or one line; nothing blocks, nothing outside the run folder changes,
    and an export or score changes nothing in it but what it writes."""
    with tempfile.TemporaryDirectory() as root:
        run = run_copy(scored_run, Path(root))
        outside = Path(root) / "outside.txt"
        outside.write_bytes(b"a user's file")
        damaged(run / part, damage, outside)
        before = tree(run)
        code, out, err = run_folder_outcome(run, command)
        if command == "score" and code:
            assert_score_error((code, out, err))
        elif code:
            assert_one_line_error(code, out, err)
        assert outside.read_bytes() == b"a user's file"
        if command != "rerun":
            def kept(entries):
                return {name: entry for name, entry in entries.items() if name.split("/")[0] not in WRITTEN_BY[command]}

            assert kept(tree(run)) == kept(before)


@FEW
@given(ids=st.lists(st.one_of(json_values, st.sampled_from(["a", "A", "00001", "1", "x.y", "twin", "TWIN"])),
                    min_size=3, max_size=3))
def test_generated_dpg_item_ids(scored_run, ids):
    """Any "id" in each prompt's metadata: one grid per prompt on disk, as many as reported."""
    with tempfile.TemporaryDirectory() as root:
        run = run_copy(scored_run, Path(root))
        for index, name in enumerate(ids):
            path = run / f"{index:05d}/metadata.jsonl"
            path.write_text(json.dumps(json.loads(path.read_text()) | {"id": name}) + "\n")
        code, out, err = run_cli("batch", "--out", run, "--export", "dpg")
        assert code == 0, err
        assert out.splitlines()[-1].endswith("dpg: 3 images")
        assert len(list((run / "dpg").iterdir())) == 3


# Addresses refused before Ray starts, on any machine: text, and hosts that do not resolve or are
# this machine's at a port nothing listens on (1) or none can be. Only these: in a sandbox whose
# network answers every outside address, Ray itself would be tried on the others.
ray_addresses = st.one_of(st.text(max_size=24), st.builds(
    "{}{}:{}".format, st.sampled_from(["", "ray://", "http://"]),
    st.sampled_from(["127.0.0.1", "localhost", "[::1]", "::1", "nonsense.invalid", "", "-", "a b", "head..cluster",
                     ".head", f"{'a' * 64}.cluster", "x" * 253]),
    st.sampled_from(["1", "0", "65536", "99999", "", "x", "-1"])))


@needs_ray
@MANY
@given(address=ray_addresses, flags=st.lists(st.sampled_from([["--threads", "0"], ["--threads", "4096"],
                                                                ["--workers", "0"], ["--workers", "1"]]), max_size=2))
def test_generated_ray_arguments(tmp_path, address, flags):
    """Any --ray-address (none of Ray's words, which start a cluster), with any --threads and
    --workers: one line before Ray starts, no run folder, nothing waited for (a hang guard: an
    address answers or not within 10 s)."""
    from hypothesis import assume

    assume(address.strip() not in ("auto", "local"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    code, out, err = within(60, lambda: run_cli("batch", prompts, "--out", tmp_path / "run", "--engine", "ray",
                                                 "--ray-address", address, *EVAL_STEPS,
                                                 *[flag for pair in flags for flag in pair]))
    assert_one_line_error(code, out, err)
    assert not (tmp_path / "run").exists()


@needs_ray
@pytest.mark.parametrize("address, words", [
    ("127.0.0.1:1", "the Ray cluster does not answer (Connection refused); start it again"),
    ("head..cluster:6379", "cannot find the host head..cluster (not a host name: a part between dots is empty or "
                           "longer than 63 characters); start it again"),
])
def test_a_cluster_gone_without_ray_stop_is_one_line(tmp_path, monkeypatch, address, words):
    """Without an address Ray joins the cluster `ray start` last started on this machine, from the
    address it keeps in a file: one stopped without `ray stop` left the run waiting for minutes, and
    a host name there with an empty label was a UnicodeError traceback."""
    import ray._private.utils

    address_file = tmp_path / "ray_current_cluster"
    address_file.write_text(address)
    monkeypatch.setattr(ray._private.utils, "get_ray_address_file", lambda temp_dir: str(address_file))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    outcome = within(60, lambda: run_cli("batch", prompts, "--out", tmp_path / "run", "--engine", "ray", *EVAL_STEPS))
    assert_one_line_error(*outcome, f'the Ray cluster last started on this machine ({address_file}: "{address}"): '
                                    f"{words}")
    assert not (tmp_path / "run").exists()
