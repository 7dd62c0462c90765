"""Prompt tokenizer: the `tokenizers` library on a real T5 `tokenizer.json` (model.md 5).

flan-t5 conventions, as the official pipelines call it (`padding="max_length", truncation=True,
max_length=256`): `</s>` is appended, prompts longer than 255 pieces are cut to 255 + `</s>`,
right padding with `<pad>` (id 0), mask 1 on real tokens and on `</s>`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from .checks import JSON_LIMIT, check_prompt, read_limited
from .errors import MiniT2IError

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"


class PromptTokenizer:
    """Turns prompts into fixed-length T5 ids and a 0/1 mask."""

    def __init__(self, tokenizer: Tokenizer, max_length: int = 256, source: str = "<in memory>"):
        self.source = source
        self.max_length = max_length
        ids = {tok: tokenizer.token_to_id(tok) for tok in (PAD, EOS)}
        missing = [tok for tok, i in ids.items() if i is None]
        if missing:
            raise MiniT2IError(
                f"{source} has no {' or '.join(missing)} token; use google/flan-t5-large's tokenizer.json"
            )
        self.pad_id, self.eos_id = ids[PAD], ids[EOS]
        # Set the T5 post-processing ourselves so a tokenizer.json without a template still
        # appends </s> exactly like the official HF tokenizer call.
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {EOS}", special_tokens=[(EOS, self.eos_id)])
        # An unpadded, untruncated twin, to tell the user when a prompt gets cut.
        self._unbounded = Tokenizer.from_str(tokenizer.to_str())
        self._unbounded.no_padding()
        self._unbounded.no_truncation()
        tokenizer.enable_truncation(max_length=max_length)
        tokenizer.enable_padding(length=max_length, pad_id=self.pad_id, pad_token=PAD, direction="right")
        self.tokenizer = tokenizer

    @classmethod
    def from_file(cls, path: str | Path, max_length: int = 256) -> "PromptTokenizer":
        text = read_limited(path, "tokenizer", JSON_LIMIT).decode("utf-8", "replace")  # the parser judges it
        try:
            tokenizer = Tokenizer.from_str(text)
        except Exception as err:  # the Rust side raises plain Exception for every parse error
            raise MiniT2IError(
                f"{path} is not a valid tokenizer.json ({err}); use google/flan-t5-large's tokenizer.json"
            ) from None
        return cls(tokenizer, max_length, str(path))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def max_id(self) -> int:
        """The largest id the tokenizer can produce (ids need not be contiguous)."""
        return max(self.tokenizer.get_vocab(with_added_tokens=True).values())

    def __call__(self, prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """prompts (B strings) -> ids int64 [B, max_length], mask float32 [B, max_length]."""
        if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)):
            raise MiniT2IError(f"expected a list of prompts, found {type(prompts).__name__}; "
                               "pass [prompt] for one prompt")
        for prompt in prompts:
            check_prompt(prompt)
        encodings = self._encode(self.tokenizer.encode_batch, list(prompts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
        return ids, mask

    def word_positions(self, prompt: str) -> list[tuple[str, list[int]]]:
        """The prompt's words in order, each with the positions of its pieces in the ids that
        `self([prompt])` gives; a word cut off by the length limit is left out, and `</s>` and the
        padding belong to no word."""
        check_prompt(prompt)
        encoding = self._encode(self.tokenizer.encode, prompt)
        positions: dict[int, list[int]] = {}
        for position, word in enumerate(encoding.word_ids):
            if word is not None:
                positions.setdefault(word, []).append(position)
        return [(prompt[encoding.offsets[found[0]][0]:encoding.offsets[found[-1]][1]].strip(), found)
                for found in positions.values()]

    def unknown_words(self, prompt: str) -> list[str]:
        """The words of `prompt` that the vocabulary lacks (they become `<unk>`), in order, once each."""
        unk_id = self.tokenizer.token_to_id(UNK)
        encoding = self._encode(self._unbounded.encode, prompt, add_special_tokens=False)
        words = (prompt[start:end] for i, (start, end) in zip(encoding.ids, encoding.offsets) if i == unk_id)
        return list(dict.fromkeys(words))

    def known_words(self) -> list[str]:
        """The vocabulary in id order, without special tokens and the word marker of unigram pieces."""
        vocab = sorted(self.tokenizer.get_vocab().items(), key=lambda item: item[1])
        return [piece.lstrip("\u2581") for piece, _ in vocab if piece not in (PAD, EOS, UNK)]

    def count_pieces(self, prompt: str) -> int:
        """Pieces the prompt needs before truncation (without `</s>`), to warn about cutting."""
        return len(self._encode(self._unbounded.encode, prompt, add_special_tokens=False).ids)

    def _encode(self, encode, *args, **kwargs):
        """Run a `tokenizers` encode call; its errors (a tokenizer.json whose unknown-token
        setup is broken, say) come as plain Exception from the Rust side."""
        try:
            return encode(*args, **kwargs)
        except Exception as err:
            raise MiniT2IError(f"{self.source} cannot encode the prompt ({err}); use google/flan-t5-large's "
                               "tokenizer.json") from None


def make_t5_style_tokenizer(pieces: list[tuple[str, float]]) -> Tokenizer:
    """A SentencePiece-unigram tokenizer shaped like flan-t5's, from a scored piece list.

    Ids 0, 1, 2 are `<pad>`, `</s>`, `<unk>` as in T5; `pieces` follow. Used for the random-weight
    models of the tests and golden recipes (the real flan-t5 tokenizer.json cannot be downloaded here).
    NFKC stands in for T5's precompiled SentencePiece charsmap.
    """
    vocab = [(PAD, 0.0), (EOS, 0.0), (UNK, 0.0), *pieces]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, 1)])
    return tokenizer


def make_word_tokenizer(words: list[str]) -> Tokenizer:
    """A whole-word tokenizer for a small closed vocabulary (the demo model's captions).

    Ids 0, 1, 2 are `<pad>`, `</s>`, `<unk>` as in T5, then `words` in order. Prompts are
    lower-cased, punctuation is dropped and the rest is split at whitespace; any other word
    becomes `<unk>`.
    """
    vocab = {PAD: 0, EOS: 1, UNK: 2, **{w: i + 3 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Lowercase(), normalizers.Replace(Regex(r"[^\w\s]"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, 1)])
    return tokenizer
