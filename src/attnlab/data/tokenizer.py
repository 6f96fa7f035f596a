"""Subword tokenization: BPE or unigram over Metaspace pieces (Hugging Face `tokenizers`), or a
SentencePiece unigram model (the `sentencepiece` package, the `[spm]` extra), behind one interface.

Special tokens sit at fixed ids that `TransformerConfig` agrees with: 0 `<pad>`, 1 `<s>` (bos),
2 `</s>` (eos), 3 `<unk>`. Pieces carry a marker (`▁`) for a preceding space, so decoding gives back
clean, detokenized text (normalised as in `attnlab.data.text.normalize`).

`SubwordTokenizer.train` learns a vocabulary, `load_tokenizer_file` reads one trained by another tool (a
`tokenizers` JSON file or a SentencePiece `.model`), both held to the special-id contract. Either kind
travels as one JSON string (`to_json`/`from_json`: prepared data and checkpoints): a `tokenizers` JSON
document, or for SentencePiece `{"attnlab_tokenizer": "sentencepiece", "model": <base64 of the model
proto>, "sha256": <its SHA-256>}`, refused when the model's bytes do not match their hash.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import itertools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from attnlab.data.download import DataError
from attnlab.data.text import normalize

TokenizerModel = Literal["bpe", "unigram", "sentencepiece"]
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
SPECIAL_IDS = {"pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID}
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
SENTENCEPIECE = "sentencepiece"  # the `attnlab_tokenizer` tag of a SentencePiece tokenizer's JSON
# SentencePiece's EM sums per-thread shards, so the model depends on the thread count: a fixed count
# trains the same model on every machine.
SPM_THREADS = 8
_CONTRACT_FIX = (
    "attnlab needs <pad>, <s>, </s>, <unk> at ids 0, 1, 2, 3: train it with special_tokens=['<pad>', "
    "'<s>', '</s>', '<unk>'] in this order (SentencePiece: pad_id=0 bos_id=1 eos_id=2 unk_id=3), or set "
    "the tokenizer path to null to let attnlab train one"
)


def flat_ids(seqs: Sequence[Sequence[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """`seqs` end to end as one array of `dtype`, and their lengths (int64)."""
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    return np.fromiter(itertools.chain.from_iterable(seqs), dtype=dtype, count=int(lengths.sum())), lengths


class SubwordTokenizer:
    """A trained subword vocabulary: normalised text <-> ids (without bos/eos).

    Subclasses wrap one library: `HuggingFaceTokenizer` (`bpe`, `unigram`) and `SentencePieceTokenizer`
    (`sentencepiece`); `train`, `load` and `from_json` give the right one. `tokenizer` is the wrapped
    library object (a `tokenizers.Tokenizer` or a `sentencepiece.SentencePieceProcessor`).
    """

    tokenizer: Any

    @classmethod
    def train(cls, texts: Iterable[str], *, model: TokenizerModel, vocab_size: int) -> SubwordTokenizer:
        """Learn a vocabulary of at most `vocab_size` entries (specials included) from normalised `texts`.

        `texts` is read once, line by line (nothing holds all of it but the trainer's own statistics;
        SentencePiece keeps its training sentences), and once more to count its characters when
        `vocab_size` turns out too small: pass a list or an object whose iteration starts over.

        Raises:
            VocabSizeError: `vocab_size` leaves no room beyond the specials or below the text's characters.
            Whatever iterating `texts` raised (a trainer would swallow or rewrap it).
            DataError: `model=sentencepiece` without the `sentencepiece` package.
        """
        if vocab_size <= len(SPECIAL_TOKENS):
            raise VocabSizeError(
                f"vocab_size={vocab_size} must exceed the {len(SPECIAL_TOKENS)} special tokens"
            )
        learner = SentencePieceTokenizer if model == SENTENCEPIECE else HuggingFaceTokenizer
        lines = _Guarded(normalize(t) for t in texts)
        try:
            tokenizer = learner._learn(lines, model, vocab_size)
        except _TooSmall:
            lines.reraise()
            raise _vocab_too_small(vocab_size, texts) from None
        lines.reraise()
        return tokenizer

    @classmethod
    def _learn(cls, lines: Iterable[str], model: TokenizerModel, vocab_size: int) -> SubwordTokenizer:
        """Train on normalised `lines` (raising `_TooSmall` when `vocab_size` cannot hold the alphabet)."""
        raise NotImplementedError

    @classmethod
    def load(cls, path: Path) -> SubwordTokenizer:
        """Load a tokenizer saved by `save`."""
        return cls.from_json(Path(path).read_text(encoding="utf-8"))

    def save(self, path: Path) -> None:
        """Write the tokenizer as one JSON file (`to_json`)."""
        Path(path).write_text(self.to_json(), encoding="utf-8")

    def to_json(self) -> str:
        """The tokenizer as a JSON string (what `save` writes; stored inside checkpoints)."""
        raise NotImplementedError

    @classmethod
    def from_json(cls, text: str) -> SubwordTokenizer:
        """The tokenizer of a `to_json` string.

        Raises:
            ValueError: The JSON is no tokenizer, a damaged one, or breaks the special-id contract.
            DataError: A SentencePiece tokenizer without the `sentencepiece` package.
        """
        document = json.loads(text)
        if isinstance(document, dict) and document.get("attnlab_tokenizer") == SENTENCEPIECE:
            return SentencePieceTokenizer.from_document(document)
        return HuggingFaceTokenizer(Tokenizer.from_str(text))

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included."""
        raise NotImplementedError

    def _encode(self, texts: list[str]) -> list[list[int]]:
        """Ids of normalised `texts`, as the library gives them."""
        raise NotImplementedError

    def _decode(self, ids: list[int]) -> str:
        """Text of `ids` (no pad, bos or eos among them)."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """Ids of normalised `text` (no bos/eos).

        Text that spells a special token ("<pad>", "<s>", "</s>") never gets pad, bos or eos: the
        `tokenizers` models give it the unknown id, SentencePiece spells it out in pieces. A literal "▁"
        (the space marker) in the text decodes as a space.

        A character absent from the training text (after normalisation: NFC, so "ﬁ" is not "fi") has no
        piece and is never dropped: BPE gives each such character the unknown id; unigram and
        SentencePiece give each run of such characters within a word one unknown id. `decode` renders
        every unknown id as the text "<unk>", so `decode(encode(x))` is `normalize(x)` with those
        characters (or runs) replaced by "<unk>". Empty and whitespace-only text gives no ids. A lone
        surrogate (a `str` that is no Unicode text: files are decoded strictly, so only a caller of the
        Python API can pass one) is read as U+FFFD, the replacement character.
        """
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of many texts at once (in parallel in the library); see `encode`."""
        flat, lengths = self.encode_flat(texts)
        return [ids.tolist() for ids in np.split(flat, np.cumsum(lengths)[:-1])] if len(texts) else []

    def encode_flat(self, texts: Sequence[str], *, eos: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """`encode_batch` without a Python list per text, for corpora: the ids of all `texts` end to end
        ((total,) int64) and each text's count ((len(texts),) int64); with `eos`, each text's ids end in
        eos (counted)."""
        normal = [normalize(t) for t in texts]
        try:
            encoded = self._encode(normal)
        except TypeError:  # a lone surrogate, which neither library takes: read as U+FFFD (see `encode`)
            encoded = self._encode([_LONE_SURROGATE.sub("\ufffd", t) for t in normal])
        flat, lengths = flat_ids(encoded, np.dtype(np.int64))
        flat[flat < UNK_ID] = UNK_ID  # text spelling a special token never gets pad, bos or eos
        if eos:
            flat, lengths = np.insert(flat, np.cumsum(lengths), EOS_ID), lengths + 1
        return flat, lengths

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenized text of `ids`, stopping at eos and skipping pad/bos."""
        kept = []
        for i in ids:
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                kept.append(int(i))
        return self._decode(kept)

    def pieces(self, text: str) -> list[str]:
        """The subword pieces of `text` (for inspection)."""
        raise NotImplementedError

    def id_pieces(self, ids: Iterable[int]) -> list[str]:
        """The piece of each id (specials included: eos is "</s>"), e.g. to show n-best tokens."""
        raise NotImplementedError


class HuggingFaceTokenizer(SubwordTokenizer):
    """BPE or unigram over Metaspace pieces, with Hugging Face `tokenizers` (or any `tokenizers` JSON
    file holding the four special tokens at ids 0-3)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        for expected, token in enumerate(SPECIAL_TOKENS):
            if tokenizer.token_to_id(token) != expected:
                raise ValueError(
                    f"tokenizer has {token!r} at id {tokenizer.token_to_id(token)}, expected {expected}"
                )
        # Ids are stored, embedded and sized by `vocab_size`: they must be exactly 0 .. vocab_size - 1.
        size, top = tokenizer.get_vocab_size(), max(tokenizer.get_vocab(with_added_tokens=True).values())
        if top != size - 1:
            raise ValueError(
                f"tokenizer has {size} entries but ids up to {top}: its ids must run 0 .. {size - 1} "
                "without gaps (renumber its vocabulary)"
            )
        self.tokenizer = tokenizer

    @classmethod
    def _learn(cls, lines: Iterable[str], model: TokenizerModel, vocab_size: int) -> SubwordTokenizer:
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
        try:
            tokenizer.train_from_iterator(lines, trainer)
        except Exception as exc:  # the Rust trainer raises a bare Exception
            if "not large enough" in str(exc):
                raise _TooSmall from None
            raise
        if tokenizer.get_vocab_size() > vocab_size:  # BPE keeps every character whatever the budget
            raise _TooSmall
        return cls(tokenizer)

    def save(self, path: Path) -> None:
        self.tokenizer.save(str(path))  # indented JSON (`to_json` is compact): the same tokenizer

    def to_json(self) -> str:
        return self.tokenizer.to_str()

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def _encode(self, texts: list[str]) -> list[list[int]]:
        # No post-processor template: bos/eos are attnlab's to add.
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def pieces(self, text: str) -> list[str]:
        return self.tokenizer.encode(normalize(text), add_special_tokens=False).tokens

    def id_pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.tokenizer.id_to_token(int(i)) for i in ids]


class NotASentencePieceModel(ValueError):
    """`SentencePieceTokenizer`: the bytes given are no serialized SentencePiece model."""


class SentencePieceTokenizer(SubwordTokenizer):
    """A SentencePiece model (unigram when trained here) whose serialized proto is `model`."""

    def __init__(self, model: bytes) -> None:
        processor = _sentencepiece().SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(model)
        except RuntimeError:
            raise NotASentencePieceModel(
                "the bytes are not a SentencePiece model (its proto does not parse)"
            ) from None
        found = (processor.pad_id(), processor.bos_id(), processor.eos_id(), processor.unk_id())
        if found != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
            names = ", ".join(f"{k}={v}" for k, v in zip(SPECIAL_IDS, found, strict=True))
            raise ValueError(f"the SentencePiece model has {names} (-1: none), expected 0, 1, 2, 3")
        self.tokenizer, self.model = processor, model

    @classmethod
    def _learn(cls, lines: Iterable[str], model: TokenizerModel, vocab_size: int) -> SubwordTokenizer:
        written = io.BytesIO()
        try:
            _sentencepiece().SentencePieceTrainer.train(
                sentence_iterator=iter(lines),
                model_writer=written,
                model_type="unigram",
                vocab_size=vocab_size,
                hard_vocab_limit=False,  # at most vocab_size pieces, as a small corpus allows
                character_coverage=1.0,  # every character of the text gets a piece
                normalization_rule_name="identity",  # the text is normalised already (NFC)
                pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
                pad_piece=SPECIAL_TOKENS[PAD_ID], bos_piece=SPECIAL_TOKENS[BOS_ID],
                eos_piece=SPECIAL_TOKENS[EOS_ID], unk_piece=SPECIAL_TOKENS[UNK_ID],
                unk_surface=SPECIAL_TOKENS[UNK_ID],  # decoded as "<unk>", like the other models
                num_threads=SPM_THREADS,
                minloglevel=2,  # errors only
            )  # fmt: skip
        except RuntimeError as exc:
            if "Vocabulary size is smaller than required_chars" in str(exc):
                raise _TooSmall from None
            raise
        return cls(written.getvalue())

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> SentencePieceTokenizer:
        """The tokenizer of a parsed `to_json` document, its model checked against its hash."""
        try:
            model = base64.b64decode(document["model"], validate=True)
        except (KeyError, TypeError, binascii.Error):
            raise ValueError("the SentencePiece tokenizer JSON holds no base64 `model`") from None
        if hashlib.sha256(model).hexdigest() != document.get("sha256"):
            raise ValueError("the SentencePiece model differs from what was written (its SHA-256)")
        return cls(model)

    def to_json(self) -> str:
        encoded = base64.b64encode(self.model).decode("ascii")
        sha256 = hashlib.sha256(self.model).hexdigest()
        return json.dumps({"attnlab_tokenizer": SENTENCEPIECE, "model": encoded, "sha256": sha256})

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_piece_size()

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer.encode(texts, out_type=int)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def pieces(self, text: str) -> list[str]:
        return self.tokenizer.encode(normalize(text), out_type=str)

    def id_pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.tokenizer.id_to_piece(int(i)) for i in ids]


def load_tokenizer_file(path: Path, model: TokenizerModel) -> SubwordTokenizer:
    """A tokenizer trained elsewhere: a SentencePiece `.model` file (`model=sentencepiece`) or a Hugging
    Face `tokenizers` JSON file (`bpe`/`unigram`: whichever model the file holds). Its vocabulary is the
    file's; padding and truncation settings in a JSON file are dropped (batching is attnlab's).

    Raises:
        DataError: The file is missing, not of that kind, or breaks the special-id contract (naming the
            file and the fix).
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DataError(f"tokenizer file {path} cannot be read ({exc.strerror or exc})") from None
    try:
        if model == SENTENCEPIECE:
            try:
                return SentencePieceTokenizer(data)
            except NotASentencePieceModel as exc:  # (another kind of file: the contract is not the fix)
                raise DataError(
                    f"{path}: {exc}; for a Hugging Face tokenizers JSON file set data.tokenizer=bpe or "
                    "unigram"
                ) from None
        try:
            tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # UnicodeDecodeError, or the bare Exception of the Rust parser
            raise DataError(
                f"{path} is not a Hugging Face tokenizers JSON file ({str(exc).splitlines()[0][:200]}); "
                "for a SentencePiece .model set data.tokenizer=sentencepiece"
            ) from None
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return HuggingFaceTokenizer(tokenizer)
    except ValueError as exc:
        raise DataError(f"{path}: {exc}. {_CONTRACT_FIX}") from None


def _sentencepiece() -> Any:
    try:
        import sentencepiece  # optional (the [spm] extra): imported when a SentencePiece model is used
    except ImportError:
        raise DataError("tokenizer=sentencepiece needs the `sentencepiece` package: "
                        "pip install 'attnlab[spm]'") from None  # fmt: skip
    return sentencepiece


class VocabSizeError(ValueError):
    """`SubwordTokenizer.train`: `vocab_size` cannot hold the special tokens (plus the text's alphabet)."""


class _TooSmall(Exception):
    """A trainer found `vocab_size` below the special tokens plus the alphabet of the text."""


class _Guarded:
    """Iterates `lines` for a trainer in Rust or C++, which swallows (`tokenizers`) or rewraps
    (SentencePiece) what the iterator raises: the first exception ends the iteration and `reraise`
    raises it once the trainer returned."""

    def __init__(self, lines: Iterable[str]) -> None:
        self.lines, self.error = lines, None

    def __iter__(self) -> Iterator[str]:
        try:
            yield from self.lines
        except Exception as exc:
            self.error = exc

    def reraise(self) -> None:
        if self.error is not None:
            raise self.error


def _vocab_too_small(vocab_size: int, texts: Iterable[str]) -> VocabSizeError:
    """The error for too small a `vocab_size`, counting the characters a vocabulary of `texts` holds unless
    it was a one-time iterator (read up already): each distinct character of the normalised text but the
    space, which every model reads as ▁ (the mark of a word's start), and ▁. The special tokens plus that
    many is the smallest `vocab_size` BPE and SentencePiece take; the unigram trainer of `tokenizers` may
    keep a longer piece besides and so need more, which the error then says."""
    specials = f"the {len(SPECIAL_TOKENS)} special tokens"
    what = (
        "characters of the training text (its distinct characters but the space, and ▁, which marks where a "
        "word starts)"
    )
    if iter(texts) is texts:
        return VocabSizeError(
            f"vocab_size={vocab_size} cannot hold {specials} plus the {what}: raise vocab_size"
        )
    characters = {"▁"}
    for text in texts:
        characters.update(normalize(text))
    characters.discard(" ")
    needed = len(SPECIAL_TOKENS) + len(characters)
    if vocab_size < needed:
        return VocabSizeError(
            f"vocab_size={vocab_size} cannot hold {specials} plus the {len(characters)} {what}, {needed} in "
            "all: raise vocab_size"
        )
    return VocabSizeError(
        f"vocab_size={vocab_size} holds {specials} plus the {len(characters)} {what}, {needed} in all, but "
        "leaves the trainer no room for the longer pieces it keeps besides: raise vocab_size"
    )
