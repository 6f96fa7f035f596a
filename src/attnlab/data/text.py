"""Text normalisation applied before tokenization (training and inference alike).

`normalize(line)` = Unicode NFC, then whitespace stripped at both ends and every run of whitespace
(spaces, tabs, ...) collapsed to one space. It changes nothing a BLEU scorer looks at beyond spacing,
and references are never normalised: evaluation scores detokenized hypotheses against the raw lines.

`one_line(text)` puts raw text on one line of a text file or a report (its line breaks as spaces).
"""

from __future__ import annotations

import unicodedata


def normalize(line: str) -> str:
    """NFC-normalise `line` and collapse its whitespace (see module docstring)."""
    return " ".join(unicodedata.normalize("NFC", line).split())


def one_line(text: str) -> str:
    """`text` with its line breaks as spaces: every break `str.splitlines` knows ("\\r", "\\x85",
    U+2028, U+2029, ... besides "\\n"), so that readers splitting on universal newlines or on Unicode line
    boundaries see one line. For raw text (a path, an error, a source line) written into a line-oriented
    file or report: a line break there would end a table row, a list item, a LaTeX comment or an n-best
    list's `S-i` line, and what follows it would be read as another line."""
    return " ".join(text.splitlines())
