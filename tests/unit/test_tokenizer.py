"""Text normalisation and the subword tokenizers (BPE and unigram over Metaspace pieces, SentencePiece)."""

from __future__ import annotations

import base64
import itertools
import json
import random
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.data.corpora import read_lines
from attnlab.data.download import DataError
from attnlab.data.text import normalize
from attnlab.data.tokenizer import (
    SPECIAL_TOKENS,
    HuggingFaceTokenizer,
    SentencePieceTokenizer,
    SubwordTokenizer,
    VocabSizeError,
    load_tokenizer_file,
)

PAD, BOS, EOS, UNK = 0, 1, 2, 3
MODELS = ("bpe", "unigram", "sentencepiece")
VOCAB_SIZE = 120
MARKER = "\u2581"  # the Metaspace marker "▁"
# German/English-like words; no "x" and no "☃" anywhere, so those characters are unseen in training.
VOCABULARY = (
    "der die das ein eine Haus Hund Katze läuft schnell über Straße Mädchen spielt im Garten Fußball "
    "grüne Bäume Brücke schön the a dog cat runs quickly over street girl plays in garden football "
    "green trees bridge happy yellow boy jumps"
)
WORDS = VOCABULARY.split()
SEPARATORS = (" ", "  ", "\t", " \t ", "\u00a0")


def corpus(n: int = 300, seed: int = 0) -> list[str]:
    """`n` lines of 2..12 random words with mixed spacing (seeded)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 12))]
        lines.append(rng.choice(["", " "]) + " ".join(words) + rng.choice(["", " ", "\t"]))
    return lines


LINES = corpus()


@pytest.fixture(scope="module", params=MODELS)
def tokenizer(request: pytest.FixtureRequest) -> SubwordTokenizer:
    return SubwordTokenizer.train(LINES, model=request.param, vocab_size=VOCAB_SIZE)


@pytest.fixture(scope="module")
def bpe() -> SubwordTokenizer:
    return SubwordTokenizer.train(LINES, model="bpe", vocab_size=VOCAB_SIZE)


@pytest.fixture(scope="module")
def spm() -> SubwordTokenizer:
    return SubwordTokenizer.train(LINES, model="sentencepiece", vocab_size=VOCAB_SIZE)


def piece(tokenizer: SubwordTokenizer, i: int) -> str:
    """The piece of id `i`, asked of the wrapped library."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        return tokenizer.tokenizer.id_to_piece(i)
    return tokenizer.tokenizer.id_to_token(i)


# ---------------------------------------------------------------------------------------------------------
# normalize


def test_normalize_composes_to_nfc() -> None:
    decomposed = "Cafe\u0301 Mu\u0308ller"
    assert len(decomposed) == 13
    assert normalize(decomposed) == "Caf\u00e9 M\u00fcller"
    assert unicodedata.is_normalized("NFC", normalize(decomposed))


def test_normalize_keeps_compatibility_characters() -> None:
    """NFC, not NFKC: a ligature, a superscript and a full-width letter are characters of their own."""
    assert normalize("\ufb01le x\u00b2 \uff21") == "\ufb01le x\u00b2 \uff21"


def test_normalize_strips_and_collapses_whitespace() -> None:
    assert normalize("  der \t\tHund   läuft \n") == "der Hund läuft"
    assert normalize("a\u00a0\u00a0b") == "a b"
    assert normalize(" \t ") == ""


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_normalize_is_idempotent(text: str) -> None:
    once = normalize(text)
    assert normalize(once) == once
    assert "  " not in once and once == once.strip()


def test_normalized_text_is_empty_exactly_when_the_line_is_blank_for_every_code_point() -> None:
    """Preparation drops empty training pairs by `line.strip()`, not `normalize(line)` (one NFC less per
    line): NFC must map no character to or from white space."""
    for code in itertools.chain(range(0xD800), range(0xE000, sys.maxunicode + 1)):
        char = chr(code)
        assert bool(normalize(char)) == bool(char.strip()), hex(code)
        assert bool(normalize(f"{char}\u0301")) == bool(f"{char}\u0301".strip()), hex(code)


# ---------------------------------------------------------------------------------------------------------
# SubwordTokenizer


def test_special_tokens_sit_at_ids_0_to_3(tokenizer: SubwordTokenizer) -> None:
    assert SPECIAL_TOKENS == ("<pad>", "<s>", "</s>", "<unk>")
    assert [piece(tokenizer, i) for i in range(4)] == list(SPECIAL_TOKENS)
    expected = (
        SentencePieceTokenizer if isinstance(tokenizer, SentencePieceTokenizer) else HuggingFaceTokenizer
    )
    assert type(tokenizer) is expected


def test_vocab_size_is_at_most_the_requested_size(tokenizer: SubwordTokenizer) -> None:
    assert len(SPECIAL_TOKENS) < tokenizer.vocab_size <= VOCAB_SIZE
    ids = {i for line in LINES for i in tokenizer.encode(line)}
    assert max(ids) < tokenizer.vocab_size


def test_bpe_fills_the_requested_size_with_the_special_tokens_counted_in_it(bpe: SubwordTokenizer) -> None:
    """README, "Preprocessing": `data.vocab_size` is per tokenizer, the four special tokens included: BPE on
    text with merges to spare has exactly that many ids (the recipes' parameter counts are of them)."""
    assert bpe.vocab_size == VOCAB_SIZE
    assert len(bpe.tokenizer.get_vocab(with_added_tokens=True)) == VOCAB_SIZE


def test_training_lines_round_trip_to_their_normal_form(tokenizer: SubwordTokenizer) -> None:
    for line in LINES:
        ids = tokenizer.encode(line)
        assert UNK not in ids and PAD not in ids and EOS not in ids
        assert tokenizer.decode(ids) == normalize(line)
    assert tokenizer.encode_batch(LINES[:20]) == [tokenizer.encode(line) for line in LINES[:20]]


@st.composite
def spaced_words(draw: st.DrawFn) -> str:
    """Training words joined by random whitespace, with random whitespace at both ends."""
    words = draw(st.lists(st.sampled_from(WORDS), max_size=15))
    gaps = draw(st.lists(st.sampled_from(SEPARATORS), min_size=len(words) + 1, max_size=len(words) + 1))
    return gaps[0] + "".join(w + g for w, g in zip(words, gaps[1:], strict=True))


@settings(max_examples=50, deadline=None)
@given(spaced_words())
def test_bpe_and_sentencepiece_decode_inverts_encode_up_to_normalisation(
    bpe: SubwordTokenizer, spm: SubwordTokenizer, text: str
) -> None:
    for tokenizer in (bpe, spm):
        ids = tokenizer.encode(text)
        assert UNK not in ids
        assert tokenizer.decode(ids) == normalize(text)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(WORDS), min_size=1, max_size=15).map(" ".join))
def test_decoding_stops_at_eos_and_skips_pad_and_bos(bpe: SubwordTokenizer, text: str) -> None:
    ids = bpe.encode(text)
    other = bpe.encode("Katze")
    assert bpe.decode([BOS, *ids, EOS, *other]) == text
    assert bpe.decode([BOS, *ids, EOS, PAD, PAD]) == text
    assert bpe.decode([PAD, *ids[:1], PAD, BOS, *ids[1:]]) == text
    assert bpe.decode([EOS, *ids]) == ""


def test_save_and_load_give_identical_ids(tokenizer: SubwordTokenizer, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    tokenizer.save(path)
    loaded = SubwordTokenizer.load(path)
    assert type(loaded) is type(tokenizer)
    assert loaded.vocab_size == tokenizer.vocab_size
    assert [piece(loaded, i) for i in range(loaded.vocab_size)] == [
        piece(tokenizer, i) for i in range(tokenizer.vocab_size)
    ]
    texts = [*LINES[:50], "x ☃ y", "Cafe\u0301  schön"]
    assert loaded.encode_batch(texts) == tokenizer.encode_batch(texts)
    assert [loaded.decode(ids) for ids in loaded.encode_batch(texts)] == [
        tokenizer.decode(ids) for ids in tokenizer.encode_batch(texts)
    ]


def test_a_lone_surrogate_is_read_as_an_unseen_character(tokenizer: SubwordTokenizer) -> None:
    """A `str` holding half a surrogate pair (no Unicode text) made both libraries raise a TypeError (found
    by tests/faults/test_inputs.py's property test, now and then); it is read as U+FFFD, unseen here."""
    for text in ("Hund \ud800 Katze", "Hund \udfff\ud800 Katze"):
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == tokenizer.decode(
            tokenizer.encode(text.replace("\ud800", "\ufffd").replace("\udfff", "\ufffd"))
        )
        assert "<unk>" in tokenizer.decode(ids) and tokenizer.encode_batch(["Hund", text])[1] == ids


def test_unseen_characters_map_to_unk_and_decode_as_unk_text(tokenizer: SubwordTokenizer) -> None:
    ids = tokenizer.encode("x ☃ y")
    assert ids.count(UNK) == 2  # "x" and "☃" were never seen; "y" was
    # Documented behaviour: decode skips only pad/bos (and stops at eos), so unk ids render as "<unk>".
    assert tokenizer.decode(ids) == "<unk> <unk> y"
    assert tokenizer.decode(tokenizer.encode("Hund ☃ Katze")) == "Hund <unk> Katze"


@pytest.mark.parametrize("model", MODELS)
def test_an_error_while_reading_the_training_text_reaches_the_caller(model: str) -> None:
    """The trainers read the text from Rust or C++ and would swallow (`tokenizers`) or rewrap
    (SentencePiece) what the iterator raises."""

    class Unreadable(RuntimeError):
        pass

    def text() -> Iterator[str]:
        yield from LINES
        raise Unreadable("line 301 cannot be read")

    with pytest.raises(Unreadable, match="line 301 cannot be read"):
        SubwordTokenizer.train(text(), model=model, vocab_size=VOCAB_SIZE)  # type: ignore[arg-type]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("vocab_size", [0, 3, 4])
def test_vocab_size_without_room_beyond_specials_is_rejected(model: str, vocab_size: int) -> None:
    with pytest.raises(VocabSizeError, match=f"^vocab_size={vocab_size} must exceed the 4 special tokens$"):
        SubwordTokenizer.train(LINES, model=model, vocab_size=vocab_size)  # type: ignore[arg-type]


@pytest.mark.parametrize("model", MODELS)
def test_the_characters_a_too_small_vocab_size_is_told_fit_with_the_specials(model: str) -> None:
    """The error counts the characters a vocabulary of the text needs: its distinct ones but the space,
    and ▁ (a, b, c, ▁ here; the space and ▁ were both counted). One vocab_size fewer than the special tokens
    plus that many is refused; that many trains with BPE and SentencePiece, and the unigram trainer, which
    keeps a longer piece too, is told so."""
    texts = ["ab c", "ca b"]
    what = "characters of the training text (its distinct characters but the space, and ▁, which marks"
    with pytest.raises(VocabSizeError) as raised:
        SubwordTokenizer.train(texts, model=model, vocab_size=5)  # type: ignore[arg-type]
    assert str(raised.value).startswith(f"vocab_size=5 cannot hold the 4 special tokens plus the 4 {what}")
    assert str(raised.value).endswith(", 8 in all: raise vocab_size")
    with pytest.raises(VocabSizeError, match=r"^vocab_size=7 cannot hold the 4 special tokens plus the 4 "):
        SubwordTokenizer.train(texts, model=model, vocab_size=7)  # type: ignore[arg-type]
    if model == "unigram":
        with pytest.raises(VocabSizeError) as raised:
            SubwordTokenizer.train(texts, model=model, vocab_size=8)  # type: ignore[arg-type]
        assert str(raised.value).startswith(f"vocab_size=8 holds the 4 special tokens plus the 4 {what}")
        assert str(raised.value).endswith("8 in all, but leaves the trainer no room for the longer pieces it "
                                          "keeps besides: raise vocab_size")  # fmt: skip
    fits = 9 if model == "unigram" else 8
    trained = SubwordTokenizer.train(texts, model=model, vocab_size=fits)  # type: ignore[arg-type]
    assert trained.decode(trained.encode("cab")) == "cab"


@pytest.mark.parametrize("model", MODELS)
def test_a_vocab_size_below_the_alphabet_is_honoured_or_rejected_by_name(model: str) -> None:
    # BPE keeps every character of the training text (41 ids here) whatever the budget; the unigram
    # trainer fails. Either way the user must learn that vocab_size is too small, or get no more ids.
    try:
        tokenizer = SubwordTokenizer.train(LINES, model=model, vocab_size=10)  # type: ignore[arg-type]
    except ValueError as exc:
        assert "vocab_size=10" in str(exc)
    else:
        assert tokenizer.vocab_size <= 10


def test_pieces_hold_no_spaces_and_decoded_text_no_marker(tokenizer: SubwordTokenizer) -> None:
    texts = [*LINES, "x ☃ y", "  Mädchen\t spielt  "]
    for text in texts:
        pieces = tokenizer.pieces(text)
        assert pieces and not any(" " in p or "\t" in p for p in pieces)
        assert MARKER not in tokenizer.decode(tokenizer.encode(text))
    assert any(p.startswith(MARKER) for p in tokenizer.pieces("der Hund"))


def test_id_pieces_name_each_id_specials_included(tokenizer: SubwordTokenizer) -> None:
    text = "der Hund läuft über die Straße"
    assert tokenizer.id_pieces(tokenizer.encode(text)) == tokenizer.pieces(text)
    assert tokenizer.id_pieces([PAD, BOS, EOS, UNK, EOS]) == [*SPECIAL_TOKENS, "</s>"]


def test_special_token_strings_in_text_are_not_special_ids(tokenizer: SubwordTokenizer) -> None:
    ids = tokenizer.encode("der <pad> Hund <s> läuft </s> schnell")
    assert not {PAD, BOS, EOS} & set(ids)


def test_encode_flat_gives_encode_batch_end_to_end_with_eos_after_each_text(
    tokenizer: SubwordTokenizer,
) -> None:
    texts = ["der Hund", "", "der <pad> Hund <s> läuft </s>", "   ", "zwei Hunde laufen schnell", "ﬁ"]
    batch = [tokenizer.encode(text) for text in texts]
    flat, lengths = tokenizer.encode_flat(texts, eos=True)
    assert flat.dtype == lengths.dtype == np.int64
    assert lengths.tolist() == [len(ids) + 1 for ids in batch]
    assert flat.tolist() == [i for ids in batch for i in [*ids, EOS]]
    bare, bare_lengths = tokenizer.encode_flat(texts)
    assert bare.tolist() == [i for ids in batch for i in ids] and bare_lengths.tolist() == list(
        map(len, batch)
    )
    assert tokenizer.encode_batch(texts) == batch
    assert [a.tolist() for a in tokenizer.encode_flat([], eos=True)] == [[], []] and tokenizer.encode_batch(
        []
    ) == []


# ---------------------------------------------------------------------------------------------------------
# SentencePiece


def test_sentencepiece_round_trips_multi30k_lines_losslessly(shared_data: Path) -> None:
    """decode(encode(line)) == normalize(line) for every Multi30k training line (each character seen),
    and for every validation line whose characters all occur in the training text."""
    multi30k = shared_data / "multi30k"
    train = read_lines(multi30k / "train.de") + read_lines(multi30k / "train.en")
    tokenizer = SubwordTokenizer.train(train, model="sentencepiece", vocab_size=8000)
    assert isinstance(tokenizer, SentencePieceTokenizer) and tokenizer.vocab_size == 8000
    seen = set("".join(train))
    val = [
        line
        for line in read_lines(multi30k / "val.de") + read_lines(multi30k / "val.en")
        if set(line) <= seen
    ]
    assert len(val) > 1900
    for lines in (train, val):
        encoded = tokenizer.encode_batch(lines)
        assert [tokenizer.decode(ids) for ids in encoded] == [normalize(line) for line in lines]
        assert all(UNK not in ids and PAD not in ids and EOS not in ids for ids in encoded)
    assert sum(map(len, tokenizer.encode_batch(train))) < 0.5 * sum(
        map(len, train)
    )  # subwords, not characters


def test_sentencepiece_checkpoint_json_round_trips(spm: SubwordTokenizer) -> None:
    text = spm.to_json()
    document = json.loads(text)
    assert document["attnlab_tokenizer"] == "sentencepiece" and set(document) == {
        "attnlab_tokenizer",
        "model",
        "sha256",
    }
    again = SubwordTokenizer.from_json(text)
    assert isinstance(again, SentencePieceTokenizer) and again.to_json() == text
    texts = [*LINES[:50], "x ☃ y", "der <pad> Hund </s>"]
    assert again.encode_batch(texts) == spm.encode_batch(texts)
    assert [again.decode(ids) for ids in again.encode_batch(texts)] == [
        spm.decode(ids) for ids in spm.encode_batch(texts)
    ]
    assert again.pieces("der Hund") == spm.pieces("der Hund")


def damaged(document: dict[str, Any], how: str) -> str:
    model = base64.b64decode(document["model"])
    if how == "flipped byte":
        model = model[:100] + bytes([model[100] ^ 1]) + model[101:]
        return json.dumps({**document, "model": base64.b64encode(model).decode()})
    if how == "cut short":
        return json.dumps({**document, "model": base64.b64encode(model[: len(model) // 2]).decode()})
    if how == "not base64":
        return json.dumps({**document, "model": "%%% not base64 %%%"})
    if how == "no model":
        return json.dumps({k: v for k, v in document.items() if k != "model"})
    if how == "not a model, hash matching":
        junk = b"\xff\xfe not a model proto"
        import hashlib

        return json.dumps(
            {**document, "model": base64.b64encode(junk).decode(), "sha256": hashlib.sha256(junk).hexdigest()}
        )
    return json.dumps(document)[:-20]  # "JSON cut short"


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("flipped byte", "differs from what was written"),
        ("cut short", "differs from what was written"),
        ("not base64", "holds no base64 `model`"),
        ("no model", "holds no base64 `model`"),
        ("not a model, hash matching", "not a SentencePiece model"),
        ("JSON cut short", "line 1 column"),
    ],
)
def test_a_damaged_sentencepiece_json_is_refused(spm: SubwordTokenizer, how: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SubwordTokenizer.from_json(damaged(json.loads(spm.to_json()), how))


def test_sentencepiece_without_the_package_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, spm: SubwordTokenizer
) -> None:
    text = spm.to_json()
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import fails
    for call in (lambda: SubwordTokenizer.train(LINES, model="sentencepiece", vocab_size=100),
                 lambda: SubwordTokenizer.from_json(text)):  # fmt: skip
        with pytest.raises(DataError, match=r"pip install 'attnlab\[spm\]'"):
            call()


# ---------------------------------------------------------------------------------------------------------
# Tokenizer files trained elsewhere (data.tokenizer_path)


def test_a_tokenizers_json_file_loads_without_its_padding_truncation_or_template(
    tmp_path: Path, bpe: SubwordTokenizer
) -> None:
    from tokenizers import processors

    foreign = bpe.tokenizer.__class__.from_str(bpe.to_json())
    foreign.enable_padding(pad_id=PAD, pad_token="<pad>", length=64)
    foreign.enable_truncation(max_length=3)
    foreign.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", BOS), ("</s>", EOS)]
    )
    path = tmp_path / "foreign.json"
    foreign.save(str(path))
    loaded = load_tokenizer_file(path, "bpe")
    assert isinstance(loaded, HuggingFaceTokenizer) and loaded.vocab_size == bpe.vocab_size
    assert loaded.encode_batch(LINES[:20]) == bpe.encode_batch(LINES[:20])  # no pad, cut, bos or eos
    assert load_tokenizer_file(path, "unigram").encode_batch(LINES[:5]) == bpe.encode_batch(LINES[:5])


def test_a_sentencepiece_model_file_loads(tmp_path: Path, spm: SubwordTokenizer) -> None:
    assert isinstance(spm, SentencePieceTokenizer)
    path = tmp_path / "spm.model"
    path.write_bytes(spm.model)
    loaded = load_tokenizer_file(path, "sentencepiece")
    assert loaded.to_json() == spm.to_json()


def foreign_sentencepiece(tmp_path: Path, **ids: int) -> Path:
    """A SentencePiece model trained with the package's own settings plus `ids`, saved as a .model."""
    import io

    import sentencepiece

    written = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(LINES),
        model_writer=written,
        vocab_size=80,
        hard_vocab_limit=False,
        minloglevel=2,
        **ids,
    )
    path = tmp_path / "foreign.model"
    path.write_bytes(written.getvalue())
    return path


@pytest.mark.parametrize("kind", ["tokenizers JSON", "SentencePiece defaults", "SentencePiece without pad"])
def test_a_tokenizer_file_breaking_the_special_id_contract_is_refused_by_name(
    tmp_path: Path, kind: str
) -> None:
    if kind == "tokenizers JSON":
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        other = Tokenizer(models.BPE(unk_token="<unk>"))
        other.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=80, special_tokens=["<unk>", "<s>", "</s>", "<pad>"], show_progress=False
        )
        other.train_from_iterator(LINES, trainer)
        path, model, found = tmp_path / "other.json", "bpe", "'<pad>' at id 3, expected 0"
        other.save(str(path))
    elif kind == "SentencePiece defaults":  # unk 0, bos 1, eos 2, no pad
        path, model, found = (
            foreign_sentencepiece(tmp_path),
            "sentencepiece",
            "pad_id=-1, bos_id=1, eos_id=2, unk_id=0",
        )
    else:
        path = foreign_sentencepiece(tmp_path, pad_id=3, unk_id=0)
        model, found = "sentencepiece", "pad_id=3, bos_id=1, eos_id=2, unk_id=0"
    with pytest.raises(DataError) as raised:
        load_tokenizer_file(path, model)  # type: ignore[arg-type]
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and found in message, message
    assert "<pad>, <s>, </s>, <unk> at ids 0, 1, 2, 3" in message and "tokenizer path to null" in message


def test_a_tokenizer_file_of_another_kind_or_missing_is_refused_by_name(
    tmp_path: Path, spm: SubwordTokenizer
) -> None:
    assert isinstance(spm, SentencePieceTokenizer)
    model = tmp_path / "spm.model"
    model.write_bytes(spm.model)
    with pytest.raises(
        DataError, match=f"{model} is not a Hugging Face tokenizers JSON file .*data.tokenizer=sentencepiece"
    ):
        load_tokenizer_file(model, "bpe")
    text = tmp_path / "tokenizer.json"
    text.write_text(spm.to_json())
    with pytest.raises(DataError) as raised:
        load_tokenizer_file(text, "sentencepiece")
    assert str(raised.value) == (
        f"{text}: the bytes are not a SentencePiece model (its proto does not parse); for a Hugging Face "
        "tokenizers JSON file set data.tokenizer=bpe or unigram"
    )  # (not the special-id contract's fix, which a model of that kind breaking it gets)
    with pytest.raises(DataError, match=f"tokenizer file {tmp_path / 'missing.json'} cannot be read"):
        load_tokenizer_file(tmp_path / "missing.json", "bpe")


def test_a_tokenizer_is_trained_on_normalised_lines() -> None:
    """Lines are normalised (NFC, white space stripped and collapsed) before a tokenizer is trained on them:
    lines differing only in that train the same tokenizer (a tab or a run of spaces was no piece of it).
    BPE: a unigram trainer gives different vocabularies from the same lines."""
    lines = ["ein  Hund\tläuft ", " über die Straße", "das Ma\u0308dchen\u00a0spielt  im Garten"] * 5
    raw, normal = (
        SubwordTokenizer.train(text, model="bpe", vocab_size=60) for text in (lines, map(normalize, lines))
    )
    assert raw.to_json() == normal.to_json()
