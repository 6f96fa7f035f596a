"""Subword tokenization with Hugging Face `tokenizers`: BPE or unigram over Metaspace pieces.

Special tokens sit at fixed ids that `TransformerConfig` agrees with: 0 `<pad>`, 1 `<s>` (bos),
2 `</s>` (eos), 3 `<unk>`. Pieces carry a Metaspace marker (`▁`) for a preceding space, so decoding
gives back clean, detokenized text (normalised as in `attnlab.data.text.normalize`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from attnlab.data.text import normalize

TokenizerModel = Literal["bpe", "unigram"]
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
SPECIAL_IDS = {"pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID}


class SubwordTokenizer:
    """A trained subword vocabulary: normalised text <-> ids (without bos/eos)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        for expected, token in enumerate(SPECIAL_TOKENS):
            if tokenizer.token_to_id(token) != expected:
                raise ValueError(
                    f"tokenizer has {token!r} at id {tokenizer.token_to_id(token)}, expected {expected}"
                )
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], *, model: TokenizerModel, vocab_size: int) -> SubwordTokenizer:
        """Learn a vocabulary of at most `vocab_size` entries (specials included) from normalised `texts`."""
        if vocab_size <= len(SPECIAL_TOKENS):
            raise ValueError(f"vocab_size={vocab_size} must exceed the {len(SPECIAL_TOKENS)} special tokens")
        if model == "bpe":
            tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
            )
        else:
            tokenizer = Tokenizer(models.Unigram())
            trainer = trainers.UnigramTrainer(
                vocab_size=vocab_size,
                special_tokens=list(SPECIAL_TOKENS),
                unk_token="<unk>",
                show_progress=False,
            )
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        lines = [normalize(t) for t in texts]
        try:
            tokenizer.train_from_iterator(lines, trainer)
        except Exception as exc:  # the Rust trainer raises a bare Exception
            if "not large enough" in str(exc):
                raise _vocab_too_small(vocab_size, lines) from None
            raise
        if tokenizer.get_vocab_size() > vocab_size:  # BPE keeps every character whatever the budget
            raise _vocab_too_small(vocab_size, lines)
        return cls(tokenizer)

    @classmethod
    def load(cls, path: Path) -> SubwordTokenizer:
        """Load a tokenizer saved by `save`."""
        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: Path) -> None:
        """Write the tokenizer as one JSON file."""
        self.tokenizer.save(str(path))

    def to_json(self) -> str:
        """The tokenizer as a JSON string (what `save` writes; stored inside checkpoints)."""
        return self.tokenizer.to_str()

    @classmethod
    def from_json(cls, text: str) -> SubwordTokenizer:
        """The tokenizer of a `to_json` string."""
        return cls(Tokenizer.from_str(text))

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included."""
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Ids of normalised `text` (no bos/eos).

        Text that spells a special token ("<pad>", "<s>", "</s>") gets the unknown id, never pad, bos or
        eos. A literal "▁" (the Metaspace marker) in the text decodes as a space.

        A character absent from the training text (after normalisation: NFC, so "ﬁ" is not "fi") has no
        piece and is never dropped: BPE gives each such character the unknown id; unigram gives each run
        of such characters within a word one unknown id. `decode` renders every unknown id as the text
        "<unk>", so `decode(encode(x))` is `normalize(x)` with those characters (or runs) replaced by
        "<unk>". Empty and whitespace-only text gives no ids.
        """
        return _no_specials(self.tokenizer.encode(normalize(text)).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of many texts at once (parallel in the Rust library); see `encode`."""
        return [_no_specials(e.ids) for e in self.tokenizer.encode_batch([normalize(t) for t in texts])]

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenized text of `ids`, stopping at eos and skipping pad/bos."""
        kept = []
        for i in ids:
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                kept.append(int(i))
        return self.tokenizer.decode(kept, skip_special_tokens=False)

    def pieces(self, text: str) -> list[str]:
        """The subword pieces of `text` (for inspection)."""
        return self.tokenizer.encode(normalize(text)).tokens


def _vocab_too_small(vocab_size: int, lines: list[str]) -> ValueError:
    characters = len(set("".join(lines)) | {"▁"})
    return ValueError(
        f"vocab_size={vocab_size} cannot hold the special tokens plus the {characters} distinct characters "
        "of the training text: raise vocab_size"
    )


def _no_specials(ids: list[int]) -> list[int]:
    return [UNK_ID if i < UNK_ID else i for i in ids]
