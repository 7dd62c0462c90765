"""The weight loader: prefixes, stored dtypes, folder layouts, config inference, every error.

Files are written in-process: float32/float16 with safetensors, bfloat16 (and dtypes the
loader must refuse) with a small raw safetensors writer, so these tests need no torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import tracemalloc

import numpy as np
import pytest
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from minit2i.core.config_fields import to_json
from minit2i.core.errors import MiniT2IError
from minit2i.core.mmjit_config import (
    MMJIT_B16,
    MMJIT_L16,
    MMJIT_TINY,
    MMJiTConfig,
    infer_mmjit_config,
    mmjit_expected_shapes,
)
from minit2i.core.safetensors_file import MappedFile
from minit2i.core.t5_config import T5_FLAN_LARGE, T5_TINY, T5Config, infer_t5_config, t5_expected_shapes
from minit2i.demo_models import random_mmjit_weights, random_t5_weights
from minit2i.model_files import find_tokenizer_json, load_mmjit, load_t5

PREFIXES = ["model.net.", "model.diffusion_model.net.", "model.diffusion_model.model.net.", "net.", ""]
DTYPES = ["F32", "F16", "BF16"]
WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"
MMJIT_FIX = "pass an unmodified MiniT2I transformer checkpoint (and its config.json)"
# A B/16-shaped config at toy width: its SwiGLU width 256 = 96 * 8/3 exactly, like 2048 = 768 * 8/3,
# so every field (mlp_ratio included) can be read back off the shapes.
B16_LIKE = MMJiTConfig(txt_input_size=48, hidden_size=96, depth_double=2, num_heads=3, head_dim=32,
                       pca_channels=8, cond_vec_size=96)
# Keys the official diffusers config.json carries besides the architecture (model.md 1.2).
DIFFUSERS_EXTRAS = {"_class_name": "MiniT2IMMJiTModel", "_diffusers_version": "0.35.1", "txt_hidden_size": 96,
                    "n_T": 100, "prediction": "x", "sampler": "euler", "cfg_channels": 3,
                    "cfg_interval": [0.0, 1.0], "llm": "google/flan-t5-large"}


# ---------------------------------------------------------------------------------------------
# Writing files


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest, ties to even (finite x)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def widen_bf16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> the float32 values they denote."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def stored_bytes(x: np.ndarray, dtype: str) -> bytes:
    """float32 array -> its little-endian payload in a safetensors dtype."""
    if dtype == "BF16":
        return bf16_bits(x).tobytes()
    numpy_dtype = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8"}[dtype]
    return np.ascontiguousarray(x).astype(numpy_dtype).tobytes()


def as_stored(x: np.ndarray, dtype: str) -> np.ndarray:
    """The float32 values a loader must return for `x` stored in `dtype`."""
    if dtype == "BF16":
        return widen_bf16(bf16_bits(x))
    return x.astype({"F32": np.float32, "F16": np.float16}[dtype]).astype(np.float32)


def write_raw(path, tensors: dict[str, np.ndarray], dtype: str = "F32", dtypes: dict | None = None) -> None:
    """A safetensors file written by hand (the format is an 8-byte header length, JSON, payload)."""
    header, payload, offset = {}, [], 0
    for name, value in tensors.items():
        kind = (dtypes or {}).get(name, dtype)
        data = stored_bytes(value, kind)
        header[name] = {"dtype": kind, "shape": list(value.shape), "data_offsets": [offset, offset + len(data)]}
        payload.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(payload))


def dead_shapes(cfg: MMJiTConfig) -> dict[str, tuple[int, ...]]:
    """The unused t_embedder / pooled_embedder tensors every torch port writes (model.md 2.4)."""
    c = cfg.cond_vec_size
    return {"t_embedder.mlp.0.weight": (c, 256), "t_embedder.mlp.0.bias": (c,),
            "t_embedder.mlp.2.weight": (c, c), "t_embedder.mlp.2.bias": (c,),
            "pooled_embedder.weight": (c, cfg.txt_input_size)}


def dead_weights(cfg: MMJiTConfig, rng) -> dict[str, np.ndarray]:
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in dead_shapes(cfg).items()}


def write_transformer(folder, cfg=MMJIT_TINY, *, prefix="model.net.", dtype="F32", config_json=True,
                      dead=True, seed=0, edit=None) -> dict[str, np.ndarray]:
    """A diffusers transformer folder; returns the float32 weights (stripped names) it holds."""
    weights = random_mmjit_weights(cfg, seed)
    if dead:
        weights.update(dead_weights(cfg, np.random.default_rng(seed + 1)))
    if edit:
        edit(weights)
    write_raw(folder / WEIGHTS_FILE, {prefix + k: v for k, v in weights.items()}, dtype)
    if config_json:
        (folder / "config.json").write_text(json.dumps({**json.loads(to_json(cfg)), **DIFFUSERS_EXTRAS}))
    return weights


def write_t5(folder, cfg=T5_TINY, *, config_json=True, seed=0) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    weights = random_t5_weights(cfg, seed)
    save_file(weights, str(folder / "model.safetensors"))
    if config_json:
        (folder / "config.json").write_text(to_json(cfg))
    return weights


def live(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v for k, v in weights.items() if not k.startswith(("t_embedder.", "pooled_embedder."))}


def assert_same_tensors(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == np.float32, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def error_of(fn, *args, **kwargs) -> str:
    with pytest.raises(MiniT2IError) as info:
        fn(*args, **kwargs)
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# Published sizes (model.md 2.2, 2.4, 6.3)


def test_b16_expected_shapes_are_the_370_live_tensors_of_the_released_model():
    shapes = mmjit_expected_shapes(MMJIT_B16)
    assert len(shapes) == 375 - 5
    assert sum(int(np.prod(s)) for s in shapes.values()) == 256_548_480
    assert sum(int(np.prod(s)) for s in dead_shapes(MMJIT_B16).values()) == 1_574_400
    assert shapes["double_blocks.16.img_mlp.w2.weight"] == (768, 2048)
    assert shapes["txt_preamble_blocks.1.qkv.weight"] == (2304, 768)
    assert shapes["final_layer.linear.weight"] == (768, 768)
    assert "double_blocks.17.q_norm.weight" not in shapes


def test_l16_expected_shapes_match_the_published_parameter_count():
    shapes = mmjit_expected_shapes(MMJIT_L16)
    assert len(shapes) == 495 - 5
    assert sum(int(np.prod(s)) for s in shapes.values()) == 908_609_256
    assert shapes["double_blocks.0.img_mlp.w1.weight"] == (3376, 1248)
    assert shapes["double_blocks.0.q_norm.weight"] == (52,)


def test_flan_t5_large_expected_shapes_have_341m_parameters():
    shapes = t5_expected_shapes(T5_FLAN_LARGE)
    assert len(shapes) == 2 + 24 * 9 + 1
    assert sum(int(np.prod(s)) for s in shapes.values()) == 341_231_104
    assert shapes["shared.weight"] == (32128, 1024)
    assert shapes["encoder.block.23.layer.1.DenseReluDense.wi_0.weight"] == (2816, 1024)
    assert shapes["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] == (32, 16)


def test_b16_config_is_inferred_exactly_from_the_released_key_set():
    shapes = {**mmjit_expected_shapes(MMJIT_B16), **dead_shapes(MMJIT_B16)}
    assert infer_mmjit_config(shapes) == MMJIT_B16


def test_l16_config_inferred_from_shapes_has_the_same_tensors():
    # 2.7 is not recoverable from the rounded SwiGLU width 3376, but every shape is.
    shapes = {**mmjit_expected_shapes(MMJIT_L16), **dead_shapes(MMJIT_L16)}
    inferred = infer_mmjit_config(shapes)
    assert inferred.mlp_hidden == 3376
    assert dataclasses.replace(inferred, mlp_ratio=2.7) == MMJIT_L16
    assert mmjit_expected_shapes(inferred) == mmjit_expected_shapes(MMJIT_L16)


def test_flan_t5_large_config_is_inferred_exactly_from_its_shapes():
    assert infer_t5_config(t5_expected_shapes(T5_FLAN_LARGE)) == T5_FLAN_LARGE


# ---------------------------------------------------------------------------------------------
# Prefixes and stored dtypes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_prefix_and_dtype_loads_as_float32(tmp_path, prefix, dtype):
    weights = write_transformer(tmp_path, prefix=prefix, dtype=dtype)
    loaded = load_mmjit(tmp_path / WEIGHTS_FILE)
    assert loaded.prefix == prefix
    assert loaded.stored_dtypes == [dtype]
    assert loaded.config == MMJIT_TINY
    assert loaded.files == [tmp_path / WEIGHTS_FILE]
    assert loaded.ignored == sorted(k for k in weights if k not in live(weights))
    assert_same_tensors(loaded.tensors, {k: as_stored(v, dtype) for k, v in live(weights).items()})


def test_bf16_widening_is_exact_for_every_representable_value(tmp_path):
    specials = np.array([0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x3F80, 0xBF80, 0x7F7F, 0xFF7F,
                         0x7F80, 0xFF80, 0x7FC0, 0x4049, 0x3DCD], dtype=np.uint16)
    rng = np.random.default_rng(3)
    bits = np.concatenate([specials, rng.integers(0, 0x7F80, 64 - len(specials), dtype=np.uint16)])
    bits[len(specials):] |= rng.integers(0, 2, 64 - len(specials), dtype=np.uint16) << 15

    def store_bits(weights):
        weights["mask_token"] = widen_bf16(bits).reshape(1, 1, 64)

    write_transformer(tmp_path, dtype="BF16", edit=store_bits)
    # Read below the checkpoint (which refuses the Inf and NaN values): the widening itself.
    mask_token = MappedFile(tmp_path / WEIGHTS_FILE).tensor("model.net.mask_token")
    np.testing.assert_array_equal(mask_token.reshape(-1).view(np.uint32), bits.astype(np.uint32) << 16)


def test_bf16_file_equals_the_float32_values_rounded_to_bf16(tmp_path):
    weights = write_transformer(tmp_path, dtype="BF16")
    loaded = load_mmjit(tmp_path).tensors["double_blocks.1.img_qkv.weight"]
    reference = weights["double_blocks.1.img_qkv.weight"]
    # Nearest bf16: error at most half a bf16 ulp (8 mantissa bits), never exactly zero everywhere.
    assert np.all(np.abs(loaded - reference) <= np.abs(reference) * 2.0 ** -8)
    assert np.any(loaded != reference)
    # Ties go to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
    assert widen_bf16(bf16_bits(np.float32([1 + 2 ** -8, 1 + 3 * 2 ** -8])))[0] == 1.0
    assert widen_bf16(bf16_bits(np.float32([1 + 3 * 2 ** -8])))[0] == 1 + 2 ** -6


def test_bf16_written_by_torch_loads_like_our_rounding(tmp_path):
    torch = pytest.importorskip("torch", reason="needs the [crosscheck] extra (torch)")
    from safetensors.torch import save_file as save_torch

    weights = live(random_mmjit_weights(MMJIT_TINY, 5))
    save_torch({"model.net." + k: torch.from_numpy(v).to(torch.bfloat16) for k, v in weights.items()},
               str(tmp_path / "model.safetensors"))
    loaded = load_mmjit(tmp_path / "model.safetensors")
    assert loaded.stored_dtypes == ["BF16"]
    assert_same_tensors(loaded.tensors, {k: widen_bf16(bf16_bits(v)) for k, v in weights.items()})


def test_f16_specials_widen_exactly(tmp_path):
    values = np.array([0.0, -0.0, 2.0 ** -24, -(2.0 ** -14), 65504.0, np.inf, -np.inf, 1 / 3] * 8, np.float32)

    def store(weights):
        weights["mask_token"] = values.reshape(1, 1, 64)

    write_transformer(tmp_path, dtype="F16", edit=store)
    got = MappedFile(tmp_path / WEIGHTS_FILE).tensor("model.net.mask_token").reshape(-1)
    np.testing.assert_array_equal(got.view(np.uint32), values.astype(np.float16).astype(np.float32).view(np.uint32))


def test_dead_tensors_are_optional_and_reported(tmp_path):
    with_dead = load_mmjit(write_dir(tmp_path / "a", dead=True))
    without = load_mmjit(write_dir(tmp_path / "b", dead=False))
    assert with_dead.ignored == ["pooled_embedder.weight", "t_embedder.mlp.0.bias", "t_embedder.mlp.0.weight",
                                 "t_embedder.mlp.2.bias", "t_embedder.mlp.2.weight"]
    assert without.ignored == []
    assert sorted(with_dead.tensors) == sorted(without.tensors) == sorted(mmjit_expected_shapes(MMJIT_TINY))
    assert with_dead.num_parameters == without.num_parameters == sum(
        int(np.prod(s)) for s in mmjit_expected_shapes(MMJIT_TINY).values())


def write_dir(folder, **kwargs):
    write_transformer(folder, **kwargs)
    return folder


# ---------------------------------------------------------------------------------------------
# Config: config.json versus shapes


def test_config_json_and_inference_agree_on_a_b16_like_file(tmp_path):
    write_transformer(tmp_path / "with", B16_LIKE)
    write_transformer(tmp_path / "without", B16_LIKE, config_json=False)
    from_json = load_mmjit(tmp_path / "with")
    inferred = load_mmjit(tmp_path / "without")
    assert from_json.config_source == str(tmp_path / "with" / "config.json")
    assert inferred.config_source == "inferred from tensor shapes"
    assert from_json.config == inferred.config == B16_LIKE
    assert inferred.config.mlp_ratio == 2.6666666666666665


def test_tiny_config_inferred_from_shapes_keeps_the_tensor_layout(tmp_path):
    loaded = load_mmjit(write_dir(tmp_path, config_json=False))
    # image_size / prompt_length are not in any shape: the released 512 / 256 are kept.
    assert (loaded.config.image_size, loaded.config.prompt_length) == (512, 256)
    assert loaded.config.mlp_hidden == MMJIT_TINY.mlp_hidden == 176
    assert mmjit_expected_shapes(loaded.config) == mmjit_expected_shapes(MMJIT_TINY)


def test_t5_config_json_and_inference_agree(tmp_path):
    write_t5(tmp_path / "with")
    write_t5(tmp_path / "without", config_json=False)
    assert load_t5(tmp_path / "with").config == load_t5(tmp_path / "without").config == T5_TINY


def test_t5_config_json_that_is_not_gated_gelu_is_refused(tmp_path):
    write_t5(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**json.loads(to_json(T5_TINY)), "feed_forward_proj": "relu"}))
    assert error_of(load_t5, tmp_path) == (
        f"{tmp_path / 'config.json'}: feed_forward_proj is 'relu'; MiniT2I needs a T5 v1.1 encoder with "
        "'gated-gelu' (google/flan-t5-large)")


def test_unreadable_config_json_is_reported(tmp_path):
    write_transformer(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    assert error_of(load_mmjit, tmp_path) == (
        f"config {tmp_path / 'config.json'} is not valid JSON (Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1))")


def test_inconsistent_config_json_is_reported(tmp_path):
    write_transformer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**json.loads(to_json(MMJIT_TINY)), "num_heads": 3}))
    assert error_of(load_mmjit, tmp_path) == (
        f"{tmp_path / 'config.json'}: num_heads*head_dim must equal hidden_size, found 3*32 != 64; fix the "
        "file, or delete it to infer the config from the tensor shapes")


# ---------------------------------------------------------------------------------------------
# Folder layouts


def test_diffusers_folder_and_its_parent_both_load(tmp_path):
    weights = write_transformer(tmp_path / "transformer")
    for path in (tmp_path, tmp_path / "transformer"):
        loaded = load_mmjit(path)
        assert loaded.files == [tmp_path / "transformer" / WEIGHTS_FILE]
        assert loaded.config_source == str(tmp_path / "transformer" / "config.json")
        assert_same_tensors(loaded.tensors, live(weights))


def make_pipeline_repo(root) -> dict[str, dict[str, np.ndarray]]:
    """The hub layout of model.md 1.3: one transformer folder per variant."""
    b = write_transformer(root / "minit2i-b-16" / "transformer", seed=1)
    small_l = dataclasses.replace(MMJIT_TINY, mlp_ratio=2.7)
    l_weights = write_transformer(root / "minit2i-l-16" / "transformer", small_l, seed=2)
    (root / "minit2i-b-16" / "scheduler").mkdir()
    (root / "minit2i-b-16" / "scheduler" / "scheduler_config.json").write_text('{"num_inference_steps": 100}')
    return {"minit2i-b-16": live(b), "minit2i-l-16": live(l_weights)}


@pytest.mark.parametrize("variant, folder", [
    ("minit2i-b-16", "minit2i-b-16"), ("b16", "minit2i-b-16"), ("minit2i-b/16", "minit2i-b-16"),
    ("base", "minit2i-b-16"), ("l", "minit2i-l-16"), ("L-16", "minit2i-l-16"), ("minit2i-l16", "minit2i-l-16"),
])
def test_pipeline_repo_variants_and_aliases(tmp_path, variant, folder):
    weights = make_pipeline_repo(tmp_path)
    loaded = load_mmjit(tmp_path, variant)
    assert loaded.files == [tmp_path / folder / "transformer" / WEIGHTS_FILE]
    assert_same_tensors(loaded.tensors, weights[folder])


def test_unknown_variant_lists_the_ones_there(tmp_path):
    make_pipeline_repo(tmp_path)
    assert error_of(load_mmjit, tmp_path, "xl16") == (
        f"{tmp_path} has no variant 'xl16'; it has minit2i-b-16, minit2i-l-16: pass --variant with one of them")


def folder_bytes(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def hub_cache(tmp_path, offline_hub):
    """An HF hub cache root with MiniT2I (two snapshots, refs/main on the older) and flan-t5.

    Returns (root, weights by variant folder plus "newer" for the other snapshot, t5 weights).
    """
    staging = tmp_path / "staging"
    current = make_pipeline_repo(staging / "current")
    newer = live(write_transformer(staging / "newer" / "minit2i-b-16" / "transformer", seed=9))
    t5 = write_t5(staging / "t5")
    offline_hub.add("MiniT2I/MiniT2I", folder_bytes(staging / "newer"), "2222bbbb", main=False)
    older = offline_hub.add("MiniT2I/MiniT2I", folder_bytes(staging / "current"), "1111aaaa")
    os.utime(older, (1_000_000, 1_000_000))
    offline_hub.add("google/flan-t5-large", folder_bytes(staging / "t5"), "3333cccc")
    return offline_hub.root, {**current, "newer": newer}, t5


def test_hf_snapshot_folder_loads(hub_cache):
    hub, weights, _ = hub_cache
    snapshot = hub / "models--MiniT2I--MiniT2I" / "snapshots" / "1111aaaa"
    loaded = load_mmjit(snapshot, "b16")
    assert loaded.files == [snapshot / "minit2i-b-16" / "transformer" / WEIGHTS_FILE]
    assert_same_tensors(loaded.tensors, weights["minit2i-b-16"])


@pytest.mark.parametrize("start", ["hub", "repo"])
def test_hf_cache_follows_refs_main(hub_cache, start):
    hub, weights, _ = hub_cache
    path = hub if start == "hub" else hub / "models--MiniT2I--MiniT2I"
    loaded = load_mmjit(path, "l16")
    assert loaded.files == [hub / "models--MiniT2I--MiniT2I" / "snapshots" / "1111aaaa" / "minit2i-l-16"
                            / "transformer" / WEIGHTS_FILE]
    assert_same_tensors(loaded.tensors, weights["minit2i-l-16"])


def test_hf_cache_without_refs_takes_the_newest_snapshot(hub_cache):
    hub, weights, _ = hub_cache
    (hub / "models--MiniT2I--MiniT2I" / "refs" / "main").unlink()
    loaded = load_mmjit(hub)
    assert loaded.files == [hub / "models--MiniT2I--MiniT2I" / "snapshots" / "2222bbbb" / "minit2i-b-16"
                            / "transformer" / WEIGHTS_FILE]
    assert_same_tensors(loaded.tensors, weights["newer"])


def test_hf_cache_root_also_finds_the_t5(hub_cache):
    hub, _, t5 = hub_cache
    loaded = load_t5(hub)
    assert loaded.files == [hub / "models--google--flan-t5-large" / "snapshots" / "3333cccc" / "model.safetensors"]
    assert loaded.config == T5_TINY
    assert_same_tensors(loaded.tensors, t5)


def test_hf_cache_folder_without_snapshots_is_reported(tmp_path):
    repo = tmp_path / "models--MiniT2I--MiniT2I"
    (repo / "snapshots").mkdir(parents=True)
    assert error_of(load_mmjit, repo) == (
        f"{repo} is an HF cache folder with no snapshots; download the model into it first")


def test_t5_sharded_checkpoint_loads_through_its_index(tmp_path):
    weights = random_t5_weights(T5_TINY, 4)
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: weights[k] for k in keys}, str(tmp_path / shard))
        weight_map.update(dict.fromkeys(keys, shard))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (tmp_path / "config.json").write_text(to_json(T5_TINY))
    loaded = load_t5(tmp_path)
    assert loaded.files == [tmp_path / s for s in shards]
    assert_same_tensors(loaded.tensors, weights)


def test_t5_sharded_index_without_weight_map_is_reported(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    assert error_of(load_t5, tmp_path) == (
        f"{tmp_path / 'model.safetensors.index.json'}: expected a non-empty \"weight_map\" object, found null; "
        "re-download it")


def test_full_t5_with_decoder_and_tied_alias_loads_the_encoder(tmp_path):
    weights = random_t5_weights(T5_TINY, 6)
    extra = {"encoder.embed_tokens.weight": weights["shared.weight"],
             "decoder.block.0.layer.0.SelfAttention.q.weight": np.ones((64, 64), np.float32),
             "lm_head.weight": np.ones((512, 64), np.float32)}
    save_file({**weights, **extra}, str(tmp_path / "model.safetensors"))
    loaded = load_t5(tmp_path / "model.safetensors")
    assert loaded.ignored == ["decoder.block.0.layer.0.SelfAttention.q.weight", "lm_head.weight"]
    assert_same_tensors(loaded.tensors, weights)


def test_t5_with_only_the_embed_tokens_alias_loads(tmp_path):
    weights = random_t5_weights(T5_TINY, 7)
    renamed = {("encoder.embed_tokens.weight" if k == "shared.weight" else k): v for k, v in weights.items()}
    save_file(renamed, str(tmp_path / "model.safetensors"))
    assert_same_tensors(load_t5(tmp_path).tensors, weights)


def test_tokenizer_json_is_found_next_to_the_t5(tiny_model):
    _, t5_dir = tiny_model
    assert find_tokenizer_json([t5_dir / "model.safetensors"]) == t5_dir / "tokenizer.json"


def test_missing_tokenizer_json_is_reported(tmp_path):
    weights = tmp_path / "t5" / "model.safetensors"
    assert error_of(find_tokenizer_json, [weights]) == (
        f"no tokenizer.json next to {weights}; put google/flan-t5-large's tokenizer.json there "
        "or pass --tokenizer PATH")


# ---------------------------------------------------------------------------------------------
# Bad inputs: one exact message each


def test_missing_tensor(tmp_path):
    write_transformer(tmp_path, edit=lambda w: w.pop("double_blocks.1.txt_mlp.w3.weight"))
    assert error_of(load_mmjit, tmp_path) == (
        f"{tmp_path / WEIGHTS_FILE} does not match the MMJiT config ({tmp_path / 'config.json'}): "
        f"missing 1 tensor(s): double_blocks.1.txt_mlp.w3.weight; {MMJIT_FIX}")


def test_unexpected_tensor(tmp_path):
    write_transformer(tmp_path, config_json=False,
                      edit=lambda w: w.update({"double_blocks.0.img_gate.weight": np.ones((4,), np.float32)}))
    assert error_of(load_mmjit, tmp_path) == (
        f"{tmp_path / WEIGHTS_FILE} does not match the MMJiT config (inferred from tensor shapes): "
        f"unexpected 1 tensor(s): double_blocks.0.img_gate.weight; {MMJIT_FIX}")


def test_wrong_shape(tmp_path):
    write_transformer(tmp_path, edit=lambda w: w.update({"mask_token": np.ones((1, 1, 32), np.float32)}))
    assert error_of(load_mmjit, tmp_path) == (
        f"{tmp_path / WEIGHTS_FILE} does not match the MMJiT config ({tmp_path / 'config.json'}): "
        f"wrong shape for 1 tensor(s): mask_token [1, 1, 32] (expected [1, 1, 64]); {MMJIT_FIX}")


def test_every_problem_is_listed_in_one_message(tmp_path):
    def break_it(w):
        for i in range(2):
            for part in ("w1", "w2", "w3"):
                w.pop(f"double_blocks.{i}.txt_mlp.{part}.weight")
        w["txt_embedder.weight"] = np.ones((64, 8), np.float32)

    write_transformer(tmp_path, edit=break_it)
    assert error_of(load_mmjit, tmp_path) == (
        f"{tmp_path / WEIGHTS_FILE} does not match the MMJiT config ({tmp_path / 'config.json'}): "
        "missing 6 tensor(s): double_blocks.0.txt_mlp.w1.weight, double_blocks.0.txt_mlp.w2.weight, "
        "double_blocks.0.txt_mlp.w3.weight, double_blocks.1.txt_mlp.w1.weight, double_blocks.1.txt_mlp.w2.weight, "
        "double_blocks.1.txt_mlp.w3.weight; "
        f"wrong shape for 1 tensor(s): txt_embedder.weight [64, 8] (expected [64, 64]); {MMJIT_FIX}")


@pytest.mark.parametrize("dtype", ["F64", "I64"])
def test_unsupported_dtype(tmp_path, dtype):
    weights = random_mmjit_weights(MMJIT_TINY, 0)
    write_raw(tmp_path / WEIGHTS_FILE, {"model.net." + k: v for k, v in weights.items()},
              dtypes={"model.net.final_layer.linear.bias": dtype})
    assert error_of(load_mmjit, tmp_path) == (
        f"{tmp_path / WEIGHTS_FILE} does not match the MMJiT config (inferred from tensor shapes): "
        f"unsupported dtype for 1 tensor(s): final_layer.linear.bias {dtype} (supported: F32, F16, BF16); "
        f"{MMJIT_FIX}")


def safetensors_complaint(path) -> str:
    """What the safetensors library itself says about a bad file (its wording varies by version)."""
    with pytest.raises(SafetensorError) as info:
        safe_open(str(path), framework="numpy")
    return str(info.value)


@pytest.mark.parametrize("content", ["truncated", "random", "text", "empty"])
def test_file_that_is_not_safetensors(tmp_path, content):
    write_transformer(tmp_path / "good")
    good = (tmp_path / "good" / WEIGHTS_FILE).read_bytes()
    data = {"truncated": good[: len(good) - 100], "random": np.random.default_rng(0).bytes(4096),
            "text": b"version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 1028\n", "empty": b""}[content]
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(data)
    assert error_of(load_mmjit, bad) == (
        f"{bad} is not a readable safetensors file ({safetensors_complaint(bad)}); re-download or re-convert it")


def test_transformer_loader_refuses_a_t5_file(tmp_path):
    write_t5(tmp_path, config_json=False)
    path = tmp_path / "model.safetensors"
    assert error_of(load_mmjit, path) == (
        f"{path}: not a MiniT2I transformer checkpoint: missing img_embedder.proj1.weight, "
        "img_embedder.proj2.weight, txt_embedder.weight, double_blocks.0.q_norm.weight, "
        "double_blocks.0.img_mlp.w1.weight; pass minit2i-b-16/transformer/diffusion_pytorch_model.safetensors "
        "(or its folder)")


def test_t5_loader_refuses_a_transformer_file(tmp_path):
    write_transformer(tmp_path, config_json=False)
    path = tmp_path / WEIGHTS_FILE
    assert error_of(load_t5, path) == (
        f"{path}: not a T5 encoder checkpoint: missing shared.weight, "
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight, "
        "encoder.block.0.layer.0.SelfAttention.q.weight, encoder.block.0.layer.1.DenseReluDense.wi_0.weight; "
        "pass google/flan-t5-large's model.safetensors (or its folder)")


def test_original_t5_with_relu_ffn_is_refused(tmp_path):
    weights = random_t5_weights(T5_TINY, 0)
    weights["encoder.block.0.layer.1.DenseReluDense.wi.weight"] = weights.pop(
        "encoder.block.0.layer.1.DenseReluDense.wi_0.weight")
    save_file(weights, str(tmp_path / "model.safetensors"))
    assert error_of(load_t5, tmp_path) == (
        f"{tmp_path / 'model.safetensors'}: this T5 has an ungated ReLU feed-forward (original T5); MiniT2I needs "
        "the T5 v1.1 gated-gelu encoder of google/flan-t5-large")


def test_tensors_outside_the_prefix(tmp_path):
    weights = {"model.net." + k: v for k, v in random_mmjit_weights(MMJIT_TINY, 0).items()}
    weights["text_encoder.shared.weight"] = np.ones((4, 4), np.float32)
    save_file(weights, str(tmp_path / "combined.safetensors"))
    assert error_of(load_mmjit, tmp_path / "combined.safetensors") == (
        f"{tmp_path / 'combined.safetensors'}: tensors outside the 'model.net.' prefix: text_encoder.shared.weight; "
        "pass the MiniT2I transformer file alone")


def test_nonexistent_path(tmp_path):
    missing = tmp_path / "nowhere" / "model.safetensors"
    assert error_of(load_mmjit, missing) == f"--model {missing}: no such file or folder; check the path"
    assert error_of(load_t5, missing) == f"--t5 {missing}: no such file or folder; check the path"


def test_empty_folder(tmp_path):
    assert error_of(load_mmjit, tmp_path) == (
        f"{tmp_path}: expected the MiniT2I transformer weights (diffusion_pytorch_model.safetensors), "
        "found no .safetensors file; check the path or download the weights into it")
    assert error_of(load_t5, tmp_path) == (
        f"{tmp_path}: expected the T5 encoder weights (model.safetensors), "
        "found no .safetensors file; check the path or download the weights into it")


def test_folder_with_two_safetensors_files(tmp_path):
    write_transformer(tmp_path / "a")
    for name in ("one.safetensors", "two.safetensors"):
        (tmp_path / name).write_bytes((tmp_path / "a" / WEIGHTS_FILE).read_bytes())
    (tmp_path / "a" / WEIGHTS_FILE).unlink()
    assert error_of(load_mmjit, tmp_path) == (
        f"{tmp_path}: expected the MiniT2I transformer weights (diffusion_pytorch_model.safetensors), "
        "found 2 .safetensors files; pass the file itself")


def test_folder_with_one_oddly_named_file_loads(tmp_path):
    weights = write_transformer(tmp_path / "src")
    (tmp_path / "minit2i_b16.safetensors").write_bytes((tmp_path / "src" / WEIGHTS_FILE).read_bytes())
    assert_same_tensors(load_mmjit(tmp_path).tensors, live(weights))


def test_wrong_t5_width(tmp_path):
    write_t5(tmp_path, dataclasses.replace(T5_TINY, d_model=128))
    assert error_of(load_t5, tmp_path, expected_d_model=64) == (
        f"{tmp_path / 'model.safetensors'} is the wrong T5 encoder: it has d_model 128 (looks like a T5 with "
        "d_model 128), but this MiniT2I model needs d_model 64 (a T5 v1.1 encoder of that width): expected "
        "shared.weight [512, 64], found [512, 128]; pass the T5 encoder this model was trained with")


def test_wrong_t5_names_flan_t5_xxl(tmp_path):
    # A T5 as wide as flan-t5-xxl (d_model 4096) but with 2 tokens, 1 head of 4, d_ff 2, 1 layer.
    xxl_shaped = T5Config(vocab_size=2, d_model=4096, d_kv=4, num_heads=1, d_ff=2, num_layers=1)
    write_t5(tmp_path, xxl_shaped, config_json=False)
    assert load_t5(tmp_path).config == xxl_shaped
    assert error_of(load_t5, tmp_path, expected_d_model=1024) == (
        f"{tmp_path / 'model.safetensors'} is the wrong T5 encoder: it has d_model 4096 (looks like flan-t5-xxl), "
        "but this MiniT2I model needs d_model 1024 (google/flan-t5-large): expected shared.weight [2, 1024], "
        "found [2, 4096]; pass google/flan-t5-large's model.safetensors")


def test_t5_missing_layer_tensor(tmp_path):
    weights = random_t5_weights(T5_TINY, 0)
    del weights["encoder.block.1.layer.1.layer_norm.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(to_json(T5_TINY))
    assert error_of(load_t5, tmp_path) == (
        f"{tmp_path / 'model.safetensors'} does not match the T5 config ({tmp_path / 'config.json'}): missing 1 "
        "tensor(s): encoder.block.1.layer.1.layer_norm.weight; pass an unmodified google/flan-t5-large "
        "model.safetensors (and its config.json)")


# ---------------------------------------------------------------------------------------------
# Memory: F32 is mapped, F16/BF16 are widened one tensor at a time

MEMORY_CONFIG = MMJiTConfig(image_size=64, txt_input_size=128, hidden_size=128, depth_double=3, num_heads=2,
                            head_dim=64, pca_channels=16, prompt_length=16, cond_vec_size=128)


def float32_bytes(cfg: MMJiTConfig) -> int:
    return 4 * sum(int(np.prod(s)) for s in mmjit_expected_shapes(cfg).values())


def traced_load(path):
    tracemalloc.start()
    try:
        loaded = load_mmjit(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return loaded, peak


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_half_precision_load_never_holds_two_float_copies(tmp_path, dtype):
    write_transformer(tmp_path, MEMORY_CONFIG, dtype=dtype, dead=False)
    loaded, peak = traced_load(tmp_path)
    size = float32_bytes(MEMORY_CONFIG)
    assert size > 4_000_000
    assert loaded.num_parameters * 4 == size
    # The float32 result itself is 1.0x; a half-precision staging copy would add 0.5x.
    assert peak < 1.3 * size, (peak, size)


def base_chain(array):
    while array is not None:
        yield array
        array = array.base


def test_float32_file_is_memory_mapped_not_copied(tmp_path):
    write_transformer(tmp_path, MEMORY_CONFIG, dead=False)
    loaded, peak = traced_load(tmp_path)
    assert peak < 0.05 * float32_bytes(MEMORY_CONFIG), peak
    for name, tensor in loaded.tensors.items():
        assert not tensor.flags.owndata and not tensor.flags.writeable, name
        assert any(isinstance(a, np.memmap) for a in base_chain(tensor)), name
