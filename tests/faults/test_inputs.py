"""Hostile and edge inputs: the subword tokenizer on arbitrary Unicode, `TokenBatchSampler` invariants
for random lengths, and `attnlab-translate` on empty, blank, over-long, mixed-script and odd-whitespace
lines (exactly one output line per input line, in order)."""

from __future__ import annotations

import gzip
import io
import logging
import lzma
import random
import re
import unicodedata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from attnlab.cli import translate as translate_cli
from attnlab.cli.translate import main as translate_main
from attnlab.cli.translate import parse_args, utf8_lines
from attnlab.data.batching import TokenBatchSampler
from attnlab.data.text import normalize
from attnlab.data.tokenizer import SPECIAL_TOKENS, UNK_ID, SubwordTokenizer
from attnlab.decoding import DecodeConfig
from attnlab.inference.translator import Translator
from attnlab.model.config import TransformerConfig
from attnlab.model.transformer import Transformer
from attnlab.runs.checkpoint import BUNDLE_KEY, bundle
from helpers import cuts

# No deadline: each example takes milliseconds, but a shared machine stalls at times, and timing is not
# what these tests check.
PROPERTY = settings(deadline=None)

# German/English words without "x" or "é", so those characters are unseen in training.
VOCABULARY = (
    "der die das ein eine Haus Hund Katze läuft schnell über Straße Mädchen spielt im Garten Fußball grüne "
    "Bäume Brücke schön the a dog cat runs quickly over street girl plays in garden football green trees "
    "bridge happy yellow boy jumps"
)
WORDS = VOCABULARY.split()
WHITESPACE = (" ", "  ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1f", "\x85", "\xa0", "\u2028", "\u3000")


def training_lines(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))) for _ in range(n)]


LINES = training_lines()
SEEN = sorted(set("".join(LINES)) - {" "})  # the training alphabet (already in NFC)


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def tokenizer(request: pytest.FixtureRequest) -> SubwordTokenizer:
    return SubwordTokenizer.train(LINES, model=request.param, vocab_size=120)


def with_unknowns(text: str, model: str) -> str:
    """What the tokenizer docstring promises `decode(encode(text))` is: `normalize(text)` with each
    unseen character (BPE) or each run of unseen characters within a word (unigram) as "<unk>"."""
    unseen = f"[^{re.escape(''.join(SEEN))} ]" + ("+" if model == "unigram" else "")
    return re.sub(unseen, "<unk>", normalize(text))


def model_of(tokenizer: SubwordTokenizer) -> str:
    return "unigram" if "Unigram" in type(tokenizer.tokenizer.model).__name__ else "bpe"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------------------------------------
# Tokenizer


@st.composite
def seen_text(draw: st.DrawFn) -> str:
    """Training characters and words in any order, any whitespace between; sometimes decomposed (NFD),
    which normalisation composes back into the same training characters ("a\\u0308" -> "ä")."""
    parts = draw(
        st.lists(st.one_of(st.sampled_from(WORDS), st.sampled_from(SEEN), st.sampled_from(WHITESPACE)))
    )
    text = "".join(parts)
    return unicodedata.normalize("NFD", text) if draw(st.booleans()) else text


EDGE_CHARACTERS = (
    "x", "é", "e\u0301", "ﬁ", "☃", "😀", "👩\u200d👩\u200d👧", "Ж", "Привет", "中文", "你好", "שלום", "مرحبا",
    "\u200f", "\u202e", "\u200b", "\ufeff", "\x00", "\x07", "\x1b", "\u0308", "𝔘", "Ⅻ", "<", ">", "/",
)  # fmt: skip

any_text = st.one_of(
    st.text(),
    st.lists(
        st.one_of(
            st.sampled_from(WORDS),
            st.sampled_from(WHITESPACE),
            st.sampled_from(EDGE_CHARACTERS),
            st.characters(),
        ),
        max_size=30,
    ).map("".join),
)


@settings(PROPERTY, max_examples=150)
@given(text=seen_text())
def test_text_of_training_characters_round_trips_to_its_normal_form(
    tokenizer: SubwordTokenizer, text: str
) -> None:
    ids = tokenizer.encode(text)
    assert UNK_ID not in ids
    assert tokenizer.decode(ids) == normalize(text)
    assert all(len(SPECIAL_TOKENS) <= i < tokenizer.vocab_size for i in ids)


@settings(PROPERTY, max_examples=200)
@given(text=any_text)
def test_any_text_encodes_and_decodes_with_unseen_characters_as_unk(
    tokenizer: SubwordTokenizer, text: str
) -> None:
    normal = normalize(text)
    assume("\u2581" not in normal and not any(token in normal for token in SPECIAL_TOKENS))
    ids = tokenizer.encode(text)
    assert all(UNK_ID <= i < tokenizer.vocab_size for i in ids)  # never pad, bos or eos
    expected = with_unknowns(text, model_of(tokenizer))
    assert tokenizer.decode(ids) == expected
    assert ids.count(UNK_ID) == expected.count("<unk>")
    assert tokenizer.encode_batch([text, text]) == [ids, ids]


@pytest.mark.parametrize(
    ("text", "bpe", "unigram"),
    [
        ("", "", ""),
        (" \t\r\n\u3000\u2028 ", "", ""),
        ("Hund 😀 Katze", "Hund <unk> Katze", "Hund <unk> Katze"),
        ("Hund\u200bKatze", "Hund<unk>Katze", "Hund<unk>Katze"),
        ("Привет Hund", "<unk><unk><unk><unk><unk><unk> Hund", "<unk> Hund"),
        ("der\x00\x07Hund", "der<unk><unk>Hund", "der<unk>Hund"),
        ("Hause\u0301 schön", "Haus<unk> schön", "Haus<unk> schön"),  # NFC: e + U+0301 is "é", unseen
        ("scho\u0308n\tHund", "schön Hund", "schön Hund"),  # NFC: o + U+0308 is "ö", seen
        ("ﬁ", "<unk>", "<unk>"),  # NFC, not NFKC: the ligature stays one unseen character
    ],
    ids=[
        "empty",
        "whitespace",
        "emoji",
        "zero-width",
        "cyrillic",
        "controls",
        "unseen-nfc",
        "seen-nfc",
        "nfkc",
    ],
)
def test_documented_results_for_edge_texts(
    tokenizer: SubwordTokenizer, text: str, bpe: str, unigram: str
) -> None:
    expected = {"bpe": bpe, "unigram": unigram}[model_of(tokenizer)]
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == expected
    assert ids.count(UNK_ID) == expected.count("<unk>")
    assert (ids == []) == (expected == "")


# ---------------------------------------------------------------------------------------------------------
# TokenBatchSampler


def epoch_batches(sampler: TokenBatchSampler, epoch: int) -> list[list[int]]:
    sampler.set_epoch(epoch)
    batches = list(sampler)
    assert len(sampler) == len(batches)
    return batches


sampler_args = st.fixed_dictionaries(
    {
        "lengths": st.lists(st.integers(1, 120), max_size=150),
        "max_tokens": st.one_of(st.none(), st.integers(1, 400)),
        "batch_size": st.one_of(st.none(), st.integers(1, 32)),
        "shuffle": st.booleans(),
        "bucket": st.booleans(),
        "seed": st.integers(0, 2**63 - 1),
    }
).filter(lambda kw: kw["max_tokens"] is not None or kw["batch_size"] is not None)


@settings(PROPERTY, max_examples=120)
@given(kwargs=sampler_args, epoch=st.integers(0, 1000))
def test_every_example_once_per_epoch_and_within_the_token_budget(kwargs: dict[str, Any], epoch: int) -> None:
    lengths, max_tokens, batch_size = kwargs["lengths"], kwargs["max_tokens"], kwargs["batch_size"]
    batches = epoch_batches(TokenBatchSampler(**kwargs), epoch)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[i] for i in batch)
        if max_tokens is not None and len(batch) * longest > max_tokens:  # only an oversize example, alone
            assert len(batch) == 1 and longest > max_tokens, (batch, [lengths[i] for i in batch])
        assert batch_size is None or len(batch) <= batch_size
    if not kwargs["shuffle"]:  # evaluation order: by length, ties by index
        assert [i for batch in batches for i in batch] == sorted(
            range(len(lengths)), key=lambda i: lengths[i]
        )


@settings(PROPERTY, max_examples=60)
@given(kwargs=sampler_args, epoch=st.integers(0, 1000), other=st.integers(0, 1000))
def test_the_same_seed_and_epoch_give_the_same_batches(
    kwargs: dict[str, Any], epoch: int, other: int
) -> None:
    first = epoch_batches(TokenBatchSampler(**kwargs), epoch)
    sampler = TokenBatchSampler(**kwargs)
    epoch_batches(sampler, other)  # another epoch first: no state may leak into the next
    assert epoch_batches(sampler, epoch) == first
    assert epoch_batches(sampler, epoch) == first  # and iterating twice gives the same


@settings(PROPERTY, max_examples=60)
@given(kwargs=sampler_args, start=st.integers(0, 1000))
def test_training_reshuffles_across_epochs_and_evaluation_does_not(
    kwargs: dict[str, Any], start: int
) -> None:
    sampler = TokenBatchSampler(**kwargs)
    orders = [epoch_batches(sampler, start + k) for k in range(8)]
    if not kwargs["shuffle"]:
        assert all(order == orders[0] for order in orders)
    else:
        # With >= 3 batches, 8 epochs drawing the same batch order has probability <= (1/6)^7.
        assume(len(orders[0]) >= 3)
        assert len({tuple(map(tuple, order)) for order in orders}) > 1


# ---------------------------------------------------------------------------------------------------------
# attnlab-translate

MAX_POSITIONS = 16
EDGE_LINES = {
    "empty": "",
    "spaces": "   ",
    "tabs": "\t \t",
    "tab-separated": "der\tHund\tläuft",
    "carriage-return": "die\rKatze\rläuft\rschnell",  # a lone "\r" inside a line does not end it
    "crlf": "Hund\r",  # the line of a file with Windows line endings
    "mixed-scripts": "Hund Ж😀中ש Katze",  # Latin, Cyrillic, emoji, CJK, Hebrew (RTL)
    "bidi-controls": "\u202eder Hund\u202c \u200fläuft\u200e",
    "other-separators": "Katze\x0bder\x0cHund\x1c\x85die\u2028das",  # no line breaks for attnlab
    "long": " ".join(["Hund", "läuft"] * 100),  # 401 source tokens, far more than MAX_POSITIONS
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A hand-made checkpoint (no training) of a tiny learned-PE model that echoes source length: its
    output layer ignores the decoder state and always prefers one word, never eos, so every translation
    is that word repeated up to the length limit a·|S| + b (a=1, b=0). Outputs thus differ between lines
    of different source lengths, and a lost, merged or reordered line shows.

    Returns the checkpoint path, the tokenizer, the word, and `expected`: each edge line's translation
    made alone (a batch of one), which it must get whatever its neighbours, batches and chunks."""
    tokenizer = SubwordTokenizer.train(LINES, model="bpe", vocab_size=120)
    (word,) = tokenizer.encode("der")
    config = TransformerConfig(
        src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4,
        d_ff=64, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, pe="learned",
        max_positions=MAX_POSITIONS, tie="none", output_bias=True,
    )  # fmt: skip
    torch.manual_seed(0)
    weights = Transformer(config).state_dict()
    weights["output.weight"].zero_()
    weights["output.bias"].fill_(-30.0)
    weights["output.bias"][word] = 30.0
    decode = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=0, batch_size=4, max_tokens=40)
    path = tmp_path_factory.mktemp("checkpoint") / "echo.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{key}": value for key, value in weights.items()},
            "hyper_parameters": {"model": config.to_dict(), "decode": decode.to_dict()},
            BUNDLE_KEY: bundle(SimpleNamespace(src_tokenizer=tokenizer, tgt_tokenizer=tokenizer)),
        },
        path,
    )
    translator = Translator.from_checkpoints([path])
    expected = [translator.translate([line])[0] for line in EDGE_LINES.values()]
    return {"path": path, "tokenizer": tokenizer, "word": tokenizer.decode([word]), "expected": expected}


def test_the_echo_model_tells_lines_of_other_lengths_apart(checkpoint: dict[str, Any]) -> None:
    tokenizer, word, expected = checkpoint["tokenizer"], checkpoint["word"], checkpoint["expected"]
    sources = [min(len(tokenizer.encode(line)) + 1, MAX_POSITIONS) for line in EDGE_LINES.values()]
    blank = {"empty", "spaces", "tabs"}  # no source tokens: an empty translation, nothing decoded
    assert all(
        out == "" if name in blank else set(out.split(" ")) == {word}
        for name, out in zip(EDGE_LINES, expected, strict=True)
    ), expected
    words = [len(out.split(" ")) for out in expected]
    assert len(set(sources)) == 8  # all lines but the three blank ones differ in source length
    assert all(
        (s1 < s2) == (w1 < w2)
        for s1, w1 in zip(sources, words, strict=True)
        for s2, w2 in zip(sources, words, strict=True)
    )
    assert expected[list(EDGE_LINES).index("long")] == " ".join([word] * MAX_POSITIONS)  # cut to fit


def test_translator_keeps_one_output_per_line_in_order(checkpoint: dict[str, Any]) -> None:
    lines = list(EDGE_LINES.values())
    translator = Translator.from_checkpoints([checkpoint["path"]])
    assert translator.translate(lines) == checkpoint["expected"]
    assert translator.truncated == 1  # only the long line was cut to the position table
    streamed = translator.stream((line + "\n" for line in lines), chunk_lines=3)
    assert list(streamed) == checkpoint["expected"]


def input_bytes(lines: list[str], final_newline: bool = True) -> bytes:
    return ("\n".join(lines) + ("\n" if final_newline else "")).encode("utf-8")


@pytest.mark.parametrize("final_newline", [True, False], ids=["final-newline", "no-final-newline"])
def test_attnlab_translate_file_gives_one_line_per_input_line(
    checkpoint: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture, final_newline: bool
) -> None:
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_bytes(input_bytes(list(EDGE_LINES.values()), final_newline))
    with caplog.at_level(logging.WARNING, logger="attnlab.cli.translate"):
        translate_main([f"ckpt_path={checkpoint['path']}", f"input={source}", f"output={target}",
                        "chunk_lines=3", "device=cpu"])  # fmt: skip
    assert target.read_bytes().decode("utf-8") == "".join(f"{out}\n" for out in checkpoint["expected"])
    messages = [r.getMessage() for r in caplog.records if r.name == "attnlab.cli.translate"]
    assert cuts(messages) == ["1 source was cut to the model's max_positions"]


def test_attnlab_translate_ignores_a_byte_order_mark(
    checkpoint: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The mark opening a file is no text: dropped without the warning of an invisible character inside
    the input (which the same bytes later in the file get)."""
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_bytes(b"\xef\xbb\xbf" + input_bytes(list(EDGE_LINES.values())))
    with caplog.at_level(logging.WARNING, logger="attnlab.cli.translate"):
        translate_main(
            [f"ckpt_path={checkpoint['path']}", f"input={source}", f"output={target}", "device=cpu"]
        )
    assert target.read_text(encoding="utf-8") == "".join(f"{out}\n" for out in checkpoint["expected"])
    assert not [r for r in caplog.records if "invisible" in r.getMessage()]
    text = io.StringIO("\ufeffeins\n\ufeffzwei\n")  # a text stream, without a byte buffer
    for stream in (io.BytesIO(b"\xef\xbb\xbfeins\n\xef\xbb\xbfzwei\n"), text):
        assert list(utf8_lines(stream, "x")) == ["eins\n", "\ufeffzwei\n"]


def test_a_list_of_checkpoints_is_split_at_commas_and_stripped() -> None:
    """`ckpt_path=[a.ckpt, b.ckpt]` (as Hydra's lists are written, a space after each comma) names the two
    files, not one with a leading space; a trailing comma names no empty file."""
    assert parse_args(["ckpt_path=[a.ckpt, b.ckpt,]", "ensemble=true"])["ckpt_path"] == ["a.ckpt", "b.ckpt"]


def test_attnlab_translate_stdin_gives_one_line_per_input_line(
    checkpoint: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # CPython's stdin on POSIX splits lines at "\n" only and leaves "\r" in place (newline="\n").
    stdin = io.TextIOWrapper(
        io.BytesIO(input_bytes(list(EDGE_LINES.values()))), encoding="utf-8", newline="\n"
    )
    monkeypatch.setattr("sys.stdin", stdin)
    translate_main([f"ckpt_path={checkpoint['path']}", "decode.beam=2", "chunk_lines=4", "device=cpu"])
    # Beam search finds the greedy output here: each step has one token of probability ~1.
    assert capsys.readouterr().out == "".join(f"{out}\n" for out in checkpoint["expected"])


def test_attnlab_translate_names_the_line_that_is_not_utf8(
    checkpoint: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_bytes(b"ein Hund\nzwei Hunde\n" + b"drei Hunde und ein Stra\xdfe\nvier\n")
    with pytest.raises(SystemExit) as exited:
        translate_main(
            [f"ckpt_path={checkpoint['path']}", f"input={source}", f"output={target}", "device=cpu"]
        )  # fmt: skip: the default chunk holds the bad line and the ones before it
    message = str(exited.value)
    assert f"{source}, line 3, byte 24: not UTF-8 text (invalid continuation byte)" in message
    assert "Convert the input to UTF-8" in message
    assert f"nothing was written to {target}" in message
    assert sorted(tmp_path.iterdir()) == [source]  # an output file is written only when complete
    # To standard output, which streams, the lines before it are translated.
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(source.read_bytes()), newline="\n"))
    with pytest.raises(SystemExit, match=r"line 3, byte 24.*; the 2 lines before it were translated to stan"):
        translate_main([f"ckpt_path={checkpoint['path']}", "device=cpu"])
    assert len(capsys.readouterr().out.splitlines()) == 2
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"Stra\xdfe\n"), newline="\n"))
    with pytest.raises(
        SystemExit, match=r"line 1, byte 5.*\(invalid continuation byte\)[^;]*; nothing was tr"
    ):
        translate_main([f"ckpt_path={checkpoint['path']}", "device=cpu"])  # (no line before it)
    assert capsys.readouterr().out == ""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"ein Hund\nStra\xdfe\n"), newline="\n"))
    with pytest.raises(
        SystemExit, match=r"line 2, .*; the line before it was translated to standard output$"
    ):
        translate_main([f"ckpt_path={checkpoint['path']}", "device=cpu"])
    assert len(capsys.readouterr().out.splitlines()) == 1


WIDE = [  # Python's codec, and the encoding the message names for iconv
    ("utf-16-le", "UTF-16LE"),
    ("utf-16", "UTF-16LE"),
    ("utf-16-be", "UTF-16BE"),
    ("utf-32-le", "UTF-32LE"),
]


@pytest.mark.parametrize(("encoding", "named"), WIDE)
def test_attnlab_translate_refuses_utf16_and_utf32_input_naming_the_encoding(
    checkpoint: dict[str, Any], tmp_path: Path, encoding: str, named: str
) -> None:
    """UTF-16 text of ASCII letters, without a byte-order mark, is valid UTF-8: it was translated as lines
    of letters between NULs, split at each "\\n" byte (3 translations of 2 lines); as data files are, it is
    refused naming the encoding for iconv. A few NULs inside UTF-8 text are the tokenizer's."""
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_bytes("ein Hund\nzwei Hunde\n".encode(encoding))
    message = rf"{re.escape(str(source))}: \d+ of its first \d+ bytes are NUL: it is {named} text .*"
    with pytest.raises(SystemExit, match=message + rf"\(iconv -f {named} -t UTF-8\); nothing was written"):
        translate_main(
            [f"ckpt_path={checkpoint['path']}", f"input={source}", f"output={target}", "device=cpu"]
        )
    assert sorted(tmp_path.iterdir()) == [source]
    assert list(utf8_lines(io.BytesIO(b"ein\0Hund\n\0\0\0\n"), "x")) == ["ein\0Hund\n", "\0\0\0\n"]


class Endless:
    """A byte stream of one line that never ends: `byte` repeated (`/dev/zero` is b"\\0")."""

    def __init__(self, byte: bytes) -> None:
        self.byte = byte

    def readline(self, size: int = -1) -> bytes:
        return self.byte * size

    def read(self, size: int = -1) -> bytes:
        return self.byte * size


def test_a_line_past_the_read_limit_is_cut_and_an_endless_one_does_not_fill_memory(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A line was read whole before it was cut to the source limit: `input=/dev/zero` took 20 GB before it
    was killed. Now a line is read `LINE_BYTES` at a time, cut after them (at a whole character) with a
    warning, and the first piece is checked: NULs or bytes that are no text are refused at once."""
    monkeypatch.setattr(translate_cli, "LINE_BYTES", 5)
    data = "kurz\nStraße Straße\nnoch\n".encode()
    with caplog.at_level(logging.WARNING, logger="attnlab.cli.translate"):
        assert list(utf8_lines(io.BytesIO(data), "x")) == ["kurz\n", "Stra", "noch\n"]  # ß cut: left out
    assert [r.getMessage() for r in caplog.records] == [
        "x, line 2 is longer than 5 bytes: only its first 5 are translated (one sentence a line)"
    ]
    with pytest.raises(ValueError, match=r"^x: 5 of its first 5 bytes are NUL"):
        next(utf8_lines(Endless(b"\0"), "x"))
    with pytest.raises(ValueError, match=r"^x, line 1, byte 1: not UTF-8 text"):
        next(utf8_lines(Endless(b"\xff"), "x"))


@pytest.mark.parametrize(("compress", "tool"), [(gzip.compress, "gunzip"), (lzma.compress, "unxz")])
def test_attnlab_translate_refuses_compressed_input_naming_the_tool_that_unpacks_it(
    checkpoint: dict[str, Any], tmp_path: Path, compress: Any, tool: str
) -> None:
    """A `.gz` or `.xz` file given as input (or piped in) is refused naming the tool that unpacks it, as data
    files are, not called invalid UTF-8 with re-encoding as the fix; nothing is written."""
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_bytes(compress(b"ein Hund\nzwei Hunde\n"))
    message = rf"{re.escape(str(source))} is \w+-compressed, not UTF-8 text: decompress it first \({tool}\)"
    with pytest.raises(SystemExit, match=message + "; nothing was written"):
        translate_main(
            [f"ckpt_path={checkpoint['path']}", f"input={source}", f"output={target}", "device=cpu"]
        )
    assert sorted(tmp_path.iterdir()) == [source]


@pytest.mark.parametrize("value", ["abc", "2.7", "true", "[4]", "0", "-1"])
def test_chunk_lines_that_is_no_whole_number_is_refused(value: str, tmp_path: Path) -> None:
    """`chunk_lines=abc` failed with a traceback and `chunk_lines=2.7` read 2 lines at a time; checked before
    the checkpoint is read."""
    refused = r"^attnlab-translate: chunk_lines=.* must be a whole number of lines >= 1"
    with pytest.raises(SystemExit, match=refused):
        translate_main([f"ckpt_path={tmp_path / 'none.ckpt'}", f"chunk_lines={value}"])
