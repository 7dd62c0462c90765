"""The NumPy T5 v1.1 encoder against transformers' T5EncoderModel, and the bucket table (model.md 6)."""

from __future__ import annotations

import numpy as np
import pytest

from minit2i.core.weights import nest
from minit2i.model_files import load_t5
from minit2i.reference.t5 import relative_position_buckets, t5_encode

LENGTH = 48  # > 8 exact buckets and > 16: the logarithmic buckets are used
VOCAB = 128

# |rel| ranges and their bucket for rel <= 0 (model.md 6.2); rel > 0 adds 16.
BUCKET_TABLE = [((0, 7), None), ((8, 11), 8), ((12, 15), 9), ((16, 22), 10), ((23, 31), 11), ((32, 45), 12),
                ((46, 63), 13), ((64, 90), 14), ((91, 10_000), 15)]


def closed_form_bucket(rel: int) -> int:
    distance = abs(rel)
    base = 16 if rel > 0 else 0
    for (low, high), bucket in BUCKET_TABLE:
        if low <= distance <= high:
            return base + (distance if bucket is None else bucket)
    raise AssertionError(rel)


@pytest.mark.parametrize("distance, bucket", [
    (0, 0), (1, 1), (7, 7), (8, 8), (11, 8), (12, 9), (15, 9), (16, 10), (22, 10), (23, 11), (31, 11),
    (32, 12), (45, 12), (46, 13), (63, 13), (64, 14), (90, 14), (91, 15), (127, 15), (128, 15), (255, 15)])
def test_bucket_table_boundaries_for_both_signs(distance, bucket):
    buckets = relative_position_buckets(256)
    # Row 255 looks back (rel = -distance); row 0 looks ahead (rel = +distance).
    assert buckets[255, 255 - distance] == bucket
    assert buckets[0, distance] == (bucket + 16 if distance > 0 else 0)


def test_bucket_matrix_is_the_closed_form_of_key_minus_query():
    buckets = relative_position_buckets(256)
    positions = np.arange(256)
    expected = np.vectorize(closed_form_bucket)(positions[None, :] - positions[:, None])
    np.testing.assert_array_equal(buckets, expected)
    assert buckets.dtype == np.int64 and buckets.shape == (256, 256)
    assert buckets.min() == 0 and buckets.max() == 31


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (16, 64), (64, 256)])
def test_buckets_match_transformers(num_buckets, max_distance):
    torch = pytest.importorskip("torch", reason="needs the [crosscheck] extra (torch, transformers)")
    modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5", reason="needs the [crosscheck] extra")
    length = 300
    positions = torch.arange(length)
    expected = modeling_t5.T5Attention._relative_position_bucket(
        positions[None, :] - positions[:, None], bidirectional=True, num_buckets=num_buckets,
        max_distance=max_distance)
    got = relative_position_buckets(length, num_buckets, max_distance)
    np.testing.assert_array_equal(got, expected.numpy())


# ---------------------------------------------------------------------------------------------
# Encoder parity


@pytest.fixture(scope="module")
def hf_t5(tmp_path_factory):
    """A random tiny T5 v1.1 encoder (non-unit norms) saved as safetensors, and the torch module."""
    torch = pytest.importorskip("torch", reason="needs the [crosscheck] extra (torch, transformers)")
    transformers = pytest.importorskip("transformers", reason="needs the [crosscheck] extra (torch, transformers)")
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, num_heads=4, d_ff=96, num_layers=3, feed_forward_proj="gated-gelu",
        relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.0,
        attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.T5EncoderModel(config).float().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            # HF initialises norms to 1: random ones catch a norm weight that is skipped or misplaced.
            if "layer_norm" in name:
                parameter.copy_(1.0 + 0.2 * torch.randn_like(parameter))
            if "relative_attention_bias" in name:
                parameter.copy_(torch.randn_like(parameter))
    folder = tmp_path_factory.mktemp("hf-t5")
    model.save_pretrained(folder, safe_serialization=True)
    return model, folder


def token_batch(lengths: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random ids ending in </s> (id 1) after `length` tokens, then <pad> (id 0) with mask 0."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, (len(lengths), LENGTH))
    mask = np.zeros((len(lengths), LENGTH), np.float32)
    for row, length in enumerate(lengths):
        ids[row, length - 1] = 1
        ids[row, length:] = 0
        mask[row, :length] = 1.0
    return ids, mask


def torch_encode(model, ids, mask) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long())
    return out.last_hidden_state.numpy()


@pytest.mark.parametrize("lengths", [[LENGTH], [29], [LENGTH, 17], [11, 40]],
                         ids=["unpadded", "padded", "batch-full-and-padded", "batch-two-paddings"])
def test_encoder_matches_transformers(hf_t5, lengths):
    model, folder = hf_t5
    weights = load_t5(folder)
    assert weights.config_source == str(folder / "config.json")
    ids, mask = token_batch(lengths)
    got = t5_encode(nest(weights.tensors), weights.config, ids, mask)
    expected = torch_encode(model, ids, mask)
    assert got.dtype == np.float32 and got.shape == (len(lengths), LENGTH, 64)
    assert np.abs(expected).max() > 0.5  # a real signal, not a collapsed output
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_padding_tokens_do_not_reach_real_positions(hf_t5):
    _, folder = hf_t5
    weights = load_t5(folder)
    params = nest(weights.tensors)
    ids, mask = token_batch([25])
    other_pads = ids.copy()
    other_pads[0, 25:] = 77
    first = t5_encode(params, weights.config, ids, mask)
    second = t5_encode(params, weights.config, other_pads, mask)
    np.testing.assert_array_equal(first[0, :25], second[0, :25])
    assert np.abs(first[0, 25:] - second[0, 25:]).max() > 1e-3


def test_batch_rows_equal_single_prompt_runs(hf_t5):
    _, folder = hf_t5
    weights = load_t5(folder)
    params = nest(weights.tensors)
    ids, mask = token_batch([11, 40])
    batch = t5_encode(params, weights.config, ids, mask)
    for row in range(2):
        single = t5_encode(params, weights.config, ids[row:row + 1], mask[row:row + 1])
        np.testing.assert_allclose(batch[row], single[0], rtol=0, atol=1e-6)
