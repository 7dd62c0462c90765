"""PromptTokenizer: flan-t5 call conventions (model.md 5) on a tokenizer.json built in-process."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, models

from minit2i.core.errors import MiniT2IError
from minit2i.core.tokenizer import PromptTokenizer, make_t5_style_tokenizer

WORDS = ["a", "red", "cat", "sat", "on", "the", "mat", "big", "dog"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
# Ids: 0 <pad>, 1 </s>, 2 <unk>, then the pieces in this order.
PIECES = ([("\u2581" + w, -5.0) for w in WORDS] + [("\u2581", -8.0)]
          + [(c, -10.0) for c in LETTERS] + [(",", -10.0), (".", -10.0)])
ID = {w: 3 + i for i, w in enumerate(WORDS)}
PAD, EOS, UNK = 0, 1, 2
LENGTH = 12


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    make_t5_style_tokenizer(PIECES).save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenize(tokenizer_file):
    return PromptTokenizer.from_file(tokenizer_file, max_length=LENGTH)


def padded(ids: list[int]) -> list[int]:
    return ids + [PAD] * (LENGTH - len(ids))


def error_of(fn, *args) -> str:
    with pytest.raises(MiniT2IError) as info:
        fn(*args)
    return str(info.value)


def test_eos_is_appended_and_the_rest_is_right_padding(tokenize):
    ids, mask = tokenize(["a red cat"])
    assert ids.dtype == np.int64 and mask.dtype == np.float32
    assert ids.shape == mask.shape == (1, LENGTH)
    assert ids[0].tolist() == padded([ID["a"], ID["red"], ID["cat"], EOS])
    assert mask[0].tolist() == [1.0] * 4 + [0.0] * (LENGTH - 4)


def test_long_prompt_is_cut_to_max_length_minus_one_pieces_plus_eos(tokenize):
    words = ["the", "big", "dog", "sat", "on", "the", "red", "mat"] * 2
    ids, mask = tokenize([" ".join(words)])
    assert ids[0].tolist() == [ID[w] for w in words[: LENGTH - 1]] + [EOS]
    assert mask[0].tolist() == [1.0] * LENGTH
    assert tokenize.count_pieces(" ".join(words)) == 16


def test_prompt_of_exactly_max_length_minus_one_pieces_keeps_every_piece(tokenize):
    words = (["a", "cat"] * 6)[: LENGTH - 1]
    ids, mask = tokenize([" ".join(words)])
    assert ids[0].tolist() == [ID[w] for w in words] + [EOS]
    assert mask.sum() == LENGTH


def test_runs_of_spaces_are_collapsed(tokenize):
    ids, _ = tokenize(["a   red      cat", "a red cat"])
    assert ids[0].tolist() == ids[1].tolist() == padded([ID["a"], ID["red"], ID["cat"], EOS])
    assert tokenize.count_pieces("a   red      cat") == 3


def test_batch_of_two_prompts_pads_each_on_its_own(tokenize):
    ids, mask = tokenize(["the dog", "a big red cat sat"])
    assert ids.tolist() == [padded([ID["the"], ID["dog"], EOS]),
                            padded([ID["a"], ID["big"], ID["red"], ID["cat"], ID["sat"], EOS])]
    assert mask.sum(axis=1).tolist() == [3.0, 6.0]


def test_unknown_words_fall_back_to_letters_and_unknown_symbols_to_unk(tokenize):
    ids, _ = tokenize(["a cow \u732b"])
    letters = {c: 3 + len(WORDS) + 1 + LETTERS.index(c) for c in "cow"}
    marker = 3 + len(WORDS)
    assert ids[0].tolist() == padded([ID["a"], marker, letters["c"], letters["o"], letters["w"], marker, UNK, EOS])


def test_count_pieces_excludes_eos(tokenize):
    assert tokenize.count_pieces("a red cat") == 3
    assert tokenize.count_pieces("a cow") == 5


def test_defaults_follow_the_official_call(tokenizer_file):
    tokenize = PromptTokenizer.from_file(tokenizer_file)
    ids, mask = tokenize(["a cat"])
    assert tokenize.max_length == 256 and ids.shape == (1, 256)
    assert tokenize.vocab_size == 3 + len(PIECES)
    assert (tokenize.pad_id, tokenize.eos_id) == (PAD, EOS)
    assert mask.sum() == 3


def test_tokenizer_json_without_post_processor_still_appends_eos(tmp_path):
    raw = json.loads(make_t5_style_tokenizer(PIECES).to_str())
    raw["post_processor"] = None
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(raw))
    ids, _ = PromptTokenizer.from_file(path, max_length=LENGTH)(["a cat"])
    assert ids[0].tolist() == padded([ID["a"], ID["cat"], EOS])


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t "])
def test_empty_prompt_is_refused(tokenize, prompt):
    assert error_of(tokenize, [prompt]) == "the prompt is empty; pass some text with --prompt"
    assert error_of(tokenize, ["a cat", prompt]) == "the prompt is empty; pass some text with --prompt"


@pytest.mark.parametrize("content", ["{not json", '{"model": {"type": "Nonsense"}}', ""])
def test_invalid_tokenizer_json(tmp_path, content):
    path = tmp_path / "tokenizer.json"
    path.write_text(content)
    with pytest.raises(Exception) as library:  # the Rust side's own wording, which varies by version
        Tokenizer.from_file(str(path))
    assert error_of(PromptTokenizer.from_file, path) == (
        f"{path} is not a valid tokenizer.json ({library.value}); use google/flan-t5-large's tokenizer.json")


@pytest.mark.parametrize("specials, missing", [
    (["<unk>"], "<pad> or </s>"), (["<pad>", "<unk>"], "</s>"), (["</s>", "<unk>"], "<pad>")])
def test_tokenizer_without_pad_or_eos(tmp_path, specials, missing):
    vocab = [(s, 0.0) for s in specials] + PIECES
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=specials.index("<unk>"), byte_fallback=False))
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    assert error_of(PromptTokenizer.from_file, path) == (
        f"{path} has no {missing} token; use google/flan-t5-large's tokenizer.json")


PARITY_PROMPTS = [
    "a red cat", "a   red cat  sat on  the mat", "the big dog, sat on the mat.",
    " ".join(["the red cat sat on a mat"] * 4), "Caf\u00e9 na\u00efve \u732b dog", "a\u3000cat",
]


def test_ids_and_masks_match_transformers_t5_tokenizer(tokenizer_file, tokenize):
    transformers = pytest.importorskip("transformers", reason="needs the [crosscheck] extra (transformers)")
    hf = transformers.T5TokenizerFast(tokenizer_file=str(tokenizer_file))
    expected = hf(PARITY_PROMPTS, padding="max_length", truncation=True, max_length=LENGTH)
    ids, mask = tokenize(PARITY_PROMPTS)
    assert ids.tolist() == expected["input_ids"]
    assert mask.astype(int).tolist() == expected["attention_mask"]
    assert (mask.sum(axis=1) == LENGTH).sum() == 2  # the long prompts really were truncated
