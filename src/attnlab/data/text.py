"""Text normalisation applied before tokenization (training and inference alike).

`normalize(line)` = Unicode NFC, then whitespace stripped at both ends and every run of whitespace
(spaces, tabs, ...) collapsed to one space. It changes nothing a BLEU scorer looks at beyond spacing,
and references are never normalised: evaluation scores detokenized hypotheses against the raw lines.

`one_line(text)` puts raw text on one line of a text file or a report, as one field of a tab-separated line
(its line breaks and tabs as spaces);
`json_line(value)` is a JSON Lines record that stays one line, its text kept.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

# The line breaks `str.splitlines` (and JavaScript's line terminators, U+2028 and U+2029) know that JSON
# leaves raw in a string (it escapes the control characters below U+0020 itself), with their escapes
_JSON_RAW_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def normalize(line: str) -> str:
    """NFC-normalise `line` and collapse its whitespace (see module docstring)."""
    return " ".join(unicodedata.normalize("NFC", line).split())


def one_line(text: str) -> str:
    """`text` with its line breaks and tabs as spaces: every break `str.splitlines` knows ("\\r",
    "\\x85", U+2028, U+2029, ... besides "\\n"), so that readers splitting on universal newlines or on
    Unicode line boundaries see one line, and every tab, so that readers splitting a line on tabs see one
    field. For raw text (a path, an error, a source line) written into a line-oriented file or report: a
    line break there would end a table row, a list item, a LaTeX comment or an n-best list's `S-i` line,
    and what follows it would be read as another line; a tab in a tab-separated line (fairseq's `S-i`,
    `D-i`) would cut the field there (fairseq's own readers take `line.split("\\t")[1]`)."""
    return " ".join(text.splitlines()).replace("\t", " ")


def json_line(value: Any) -> str:
    """The JSON Lines record of `value`: its JSON text on one line, newline-terminated, UTF-8 text left
    as it is but for the line breaks JSON leaves raw (U+0085, U+2028, U+2029), written as `\\u0085`,
    `\\u2028`, `\\u2029`: valid JSON either way, but `str.splitlines` (and JavaScript's line readers) split
    a record at them. Every JSON Lines file attnlab writes is made of these."""
    text = json.dumps(value, ensure_ascii=False)
    for char, escape in _JSON_RAW_BREAKS.items():
        text = text.replace(char, escape)
    return text + "\n"
