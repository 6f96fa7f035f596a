"""`attnlab.io`'s message helpers: `without_bom` (the one place a UTF-8 byte-order mark is cut off),
`write_fix` and `error_reason`."""

from __future__ import annotations

import errno
import os

import pytest

from attnlab.io import error_reason, without_bom, write_fix

MARK = "\ufeff".encode()  # EF BB BF


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (MARK + b"eins\nzwei\n", b"eins\nzwei\n"),  # an editor's mark before the first line
        (MARK, b""),  # a file of the mark alone holds no text
        (MARK + MARK + b"x", MARK + b"x"),  # one mark: a second is the text's own U+FEFF
        (b"eins\n" + MARK + b"zwei\n", b"eins\n" + MARK + b"zwei\n"),  # inside (files joined with cat): text
        (b"x" + MARK, b"x" + MARK),
        (MARK[:2] + b"x", MARK[:2] + b"x"),  # part of a mark is no mark (invalid UTF-8, refused later)
        ("\ufeff".encode("utf-16") + b"x", "\ufeff".encode("utf-16") + b"x"),  # UTF-16's mark: not UTF-8
        (b"", b""),
        ("\ufeffeins\n\ufeffzwei", "eins\n\ufeffzwei"),  # text already decoded: the mark's character
        ("eins\ufeff", "eins\ufeff"),
    ],
)
def test_only_a_utf8_byte_order_mark_at_the_very_start_is_cut_off(
    data: str | bytes, text: str | bytes
) -> None:
    assert without_bom(data) == text


@pytest.mark.parametrize(
    ("number", "fix"),
    [
        (errno.ENOSPC, "Free disk space"),
        (errno.EDQUOT, "Free disk space"),
        (errno.EFBIG, "Write to a file system that holds files this large"),
        (errno.EROFS, "Make it writable"),
        (errno.EACCES, "Make it writable"),
    ],
)
def test_a_failed_write_names_the_fix_of_its_cause(number: int, fix: str) -> None:
    assert write_fix(OSError(number, os.strerror(number))) == fix


def test_an_errors_reason_is_its_first_line_or_its_type() -> None:
    assert error_reason(ValueError("  bad value\n  at line 3\n")) == "bad value"
    assert error_reason(KeyError()) == "KeyError"
