"""Text normalisation applied before tokenization (training and inference alike).

`normalize(line)` = Unicode NFC, then whitespace stripped at both ends and every run of whitespace
(spaces, tabs, ...) collapsed to one space. It changes nothing a BLEU scorer looks at beyond spacing,
and references are never normalised: evaluation scores detokenized hypotheses against the raw lines.
"""

from __future__ import annotations

import unicodedata


def normalize(line: str) -> str:
    """NFC-normalise `line` and collapse its whitespace (see module docstring)."""
    return " ".join(unicodedata.normalize("NFC", line).split())
