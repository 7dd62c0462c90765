"""T5 once per distinct prompt (`pipeline.encode_distinct`): a request of n images a prompt, or a
batch group holding one prompt's several seeds, encodes each prompt once and gathers the rows.

Tiny seeded models (conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from minit2i.pipeline import encode_distinct, load_model, make_runner

PROMPTS = ["a dog", "a red cat on a mat", "a dog", "a dog"]  # prompt 0 three times, as a group of seeds


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return load_model(*tiny_model)


class CountingRunner:
    """A runner's encode, recording the rows each call encodes."""

    def __init__(self, runner):
        self.runner, self.calls = runner, []

    def encode(self, ids, mask):
        self.calls.append(ids.copy())
        return self.runner.encode(ids, mask)


def test_a_prompt_repeated_in_a_request_is_encoded_once_in_order_of_first_appearance(tiny):
    ids, mask = tiny.tokenizer(PROMPTS)
    spy = CountingRunner(make_runner(tiny, "numpy"))
    encode_distinct(spy, ids, mask)
    assert len(spy.calls) == 1
    assert np.array_equal(spy.calls[0], ids[[0, 1]])


def test_on_numpy_the_distinct_encoding_is_every_rows_encoding_byte_for_byte(tiny):
    """NumPy's matmul runs a stack one matrix at a time, so a prompt's encoding does not depend on
    the rows encoded beside it: gathering the distinct rows changes no bit."""
    ids, mask = tiny.tokenizer(PROMPTS)
    runner = make_runner(tiny, "numpy")
    assert np.array_equal(encode_distinct(runner, ids, mask), runner.encode(ids, mask))


def test_on_the_twin_a_group_of_one_prompts_seeds_is_encoded_as_the_prompt_alone(tiny):
    """On the twin a GEMM's bits depend on its row count (cudasim's OpenBLAS as cuBLAS), so the four
    rows of one prompt are the bits `minit2i generate -p PROMPT` encodes only if T5 runs on that
    one prompt: exact equality."""
    ids, mask = tiny.tokenizer([PROMPTS[0]] * 4)
    runner = make_runner(tiny, "cudasim")
    alone = runner.to_host(runner.encode(ids[:1], mask[:1]))
    grouped = runner.to_host(encode_distinct(runner, ids, mask))
    assert grouped.shape == (4, *alone.shape[1:])
    assert all(np.array_equal(row, alone[0]) for row in grouped)
