"""`Translator` on a small random model with real tokenizers (no training): what it counts and reports
whatever the model outputs (sources cut to the limit, translations cut at the length limit, line ends)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from attnlab.data.tokenizer import SubwordTokenizer
from attnlab.decoding import DecodeConfig
from attnlab.inference.translator import Translator
from helpers import eos_biased_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GERMAN = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."]
ENGLISH = ["A man rides a bike.", "Two dogs play in the snow.", "A woman reads a book."]
LINES = [*GERMAN, "Hund", "Schnee im Buch", "Ein Buch."]


@pytest.fixture(scope="module")
def joint() -> SubwordTokenizer:
    return SubwordTokenizer.train((GERMAN + ENGLISH) * 3, model="bpe", vocab_size=80)


def random_translator(joint: SubwordTokenizer, eos_bias: float = 0.0, **decode: Any) -> Translator:
    """A random model whose output bias adds `eos_bias` to eos at every step (2: some hypotheses end
    before the length limit of 4 tokens, others run to it)."""
    settings = {"beam": 1, "alpha": 0.0, "max_len_a": 0.0, "max_len_b": 4, **decode}
    return Translator(eos_biased_model(joint.vocab_size, eos_bias), joint, joint, DecodeConfig(**settings))


def test_a_source_of_exactly_the_limit_is_neither_cut_nor_counted(joint: SubwordTokenizer) -> None:
    line = GERMAN[1]
    pieces = [*joint.id_pieces(joint.encode(line)), "</s>"]
    exact = random_translator(joint, max_source_tokens=len(pieces))
    assert exact.nbest([line])[0].source_tokens == pieces
    exact.translate([line])
    assert exact.truncated == 0
    over = random_translator(joint, max_source_tokens=len(pieces) - 1)
    assert over.nbest([line])[0].source_tokens == [*pieces[:-2], "</s>"]  # cut, keeping eos
    assert over.truncated == 1


def test_nbest_lists_count_their_first_hypotheses_that_ran_to_the_limit_as_translate_does(
    joint: SubwordTokenizer,
) -> None:
    searching = random_translator(joint, eos_bias=2.0, beam=4)
    searching.translate(LINES)
    listing = random_translator(joint, eos_bias=2.0, beam=4, nbest=4)
    lists = listing.nbest(LINES)
    ended = [h.ended for n in lists for h in n.hypotheses]
    assert True in ended and False in ended  # some hypotheses ran to the limit, others did not
    assert listing.unfinished == searching.unfinished == sum(not n.hypotheses[0].ended for n in lists)


def test_streamed_lines_lose_their_line_ends_crlf_included(joint: SubwordTokenizer) -> None:
    translator = random_translator(joint, nbest=2, beam=2)
    streamed = list(translator.stream_nbest([f"{line}\r\n" for line in LINES[:2]] + [LINES[2]], 2))
    assert [n.source for n in streamed] == LINES[:3]
    assert [n.index for n in streamed] == [0, 1, 2]
    assert list(translator.stream(["Hund\r\n", "\r\n"])) == [*translator.translate(["Hund"]), ""]


@pytest.mark.parametrize("method", ["translate", "nbest", "stream", "stream_nbest"])
def test_a_single_string_is_refused_at_the_call_naming_the_list_to_give(
    joint: SubwordTokenizer, method: str
) -> None:
    translator = random_translator(joint)
    for text in (GERMAN[0], GERMAN[0].encode()):
        with pytest.raises(TypeError, match=rf"^Translator\.{method} .* not a single {type(text).__name__} "
                           rf".*: use {method}\(\[text\]\)$"):  # fmt: skip
            getattr(translator, method)(text)  # refused before anything is read: no list() needed


@pytest.mark.parametrize("method", ["translate", "nbest", "stream", "stream_nbest"])
def test_a_line_that_is_no_str_is_named_by_index_and_type(joint: SubwordTokenizer, method: str) -> None:
    translator = random_translator(joint)
    for bad, kind in ((b"Hund", "bytes"), (None, "NoneType"), (3, "int")):
        refused = rf"^Translator\.{method}: line 2 \(from 0\) is a {kind}, not a str"
        with pytest.raises(TypeError, match=refused):
            list(getattr(translator, method)([*GERMAN[:2], bad]))


def test_streams_check_each_line_as_read_translating_those_before_it(joint: SubwordTokenizer) -> None:
    translator = random_translator(joint)
    read: list[int] = []

    def lines() -> Any:
        for index, line in enumerate([*LINES[:3], None, "never read"]):
            read.append(index)
            yield line

    streamed = translator.stream(lines(), chunk_lines=2)
    assert read == []  # nothing read before the first translation is asked for
    assert next(streamed) == translator.translate(LINES[:1])[0]
    assert read == [0, 1]
    rest: list[str] = []
    with pytest.raises(TypeError, match=r"^Translator\.stream: line 3 \(from 0\) is a NoneType"):
        rest.extend(streamed)
    assert rest == translator.translate(LINES[1:3])  # the lines before it, then the error
    assert read == [0, 1, 2, 3]


@pytest.mark.parametrize("method", ["stream", "stream_nbest"])
def test_chunk_lines_is_a_whole_number_of_lines_refused_at_the_call(
    joint: SubwordTokenizer, method: str
) -> None:
    translator = random_translator(joint)
    for chunk_lines, error in ((True, TypeError), (2.0, TypeError), ("2", TypeError), (0, ValueError)):
        refused = rf"^chunk_lines={chunk_lines!r} must be a whole number of lines >= 1 \(an int\)$"
        with pytest.raises(error, match=refused):
            getattr(translator, method)(LINES, chunk_lines)
    for whole in (4, np.int64(4)):  # correct calls (a NumPy integer is a whole number): every line, in order
        streamed = list(getattr(translator, method)(iter(LINES), whole))
        if method == "stream_nbest":  # scores may differ in the last bits between batchings: texts compared
            assert [n.index for n in streamed] == list(range(len(LINES)))
            streamed = [n.best for n in streamed]
        assert streamed == translator.translate(LINES)


def test_nbest_references_are_one_str_a_line_or_refused(joint: SubwordTokenizer) -> None:
    """`nbest(lines, references=...)` paired a single str's characters with the lines, and dropped
    references past the last line, silently (one too few was an IndexError): references are checked as
    lines are, and there is one a line."""
    translator = random_translator(joint)
    paired = translator.nbest(GERMAN[:2], references=ENGLISH[:2])
    assert [n.reference for n in paired] == ENGLISH[:2]
    with pytest.raises(TypeError, match=r"^Translator\.nbest takes references .* not a single str .*: use "
                       r"references=\[text\]$"):  # fmt: skip
        translator.nbest(GERMAN[:1], references=ENGLISH[0])
    refused = r"^Translator\.nbest: reference 1 \(from 0\) is a NoneType, not a str"
    with pytest.raises(TypeError, match=refused):
        translator.nbest(GERMAN[:2], references=[ENGLISH[0], None])
    for references in (ENGLISH[:1], ENGLISH):
        told = rf"^Translator\.nbest: {len(references)} references for 2 lines: give one reference a line"
        with pytest.raises(ValueError, match=told):
            translator.nbest(GERMAN[:2], references=references)
