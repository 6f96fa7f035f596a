"""Text normalisation applied before tokenization (training and inference alike).

`normalize(line)` = Unicode NFC, then whitespace stripped at both ends and every run of whitespace
(spaces, tabs, ...) collapsed to one space. It changes nothing a BLEU scorer looks at beyond spacing,
and references are never normalised: evaluation scores detokenized hypotheses against the raw lines.

`one_line(text)` puts raw text on one line of a text file or a report, as one field of a tab-separated line
(its line breaks and tabs as spaces);
`json_line(value)` is a JSON Lines record that stays one line, its text kept;
`shell_word(text)` is one word of a shell command, and `override_word(key, value)` one that Hydra reads as
the override `key=value` (a command to copy, naming a path);
`plural(count, singular)` is the form of a word (or phrase) that agrees with a count in a message.
(A byte-order mark before UTF-8 text is cut off by `attnlab.io.without_bom`, in the base layer.)
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

# The line breaks `str.splitlines` (and JavaScript's line terminators, U+2028 and U+2029) know that JSON
# leaves raw in a string (it escapes the control characters below U+0020 itself), with their escapes
_JSON_RAW_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
# A value the shell and Hydra's override grammar both read as it is: a path of letters, digits, `_`, `.`
# and `-` (a `=` or `,`, as a multirun job's directory holds, is another override or a sweep to Hydra)
_PLAIN_PATH = re.compile(r"[\w.-]*/[\w./-]*", re.ASCII)


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


def shell_word(text: str) -> str:
    """`text` as one word of a shell command, to copy into one (`--baseline`): in single quotes, a quote
    inside as `'\\''`; text holding a line break or another unprintable character as bash's `$'...'`, each as
    `\\U` and its code point (a line break: `\\U0000000a`), so the word stays on one line."""
    if text.isprintable():
        return "'" + text.replace("'", "'\\''") + "'"
    escaped = "".join(
        c if c.isprintable() and c not in "\\'" else "\\" + c if c in "\\'" else f"\\U{ord(c):08x}"
        for c in text
    )
    return f"$'{escaped}'"


def override_word(key: str, value: str) -> str:
    """The Hydra override `key=value` as one word of a shell command (a command to copy, naming a path),
    which Hydra reads back as the text `value`: plain for a path of letters, digits, `_`, `.`, `-` and `/`;
    otherwise `value` in Hydra's double quotes (a `"`, and the backslashes before one or at its end,
    escaped) and the whole a `shell_word`. Unquoted, a multirun job's directory (`pe=learned,seed=2-...`)
    is no override Hydra parses, and a space splits the word in two."""
    if _PLAIN_PATH.fullmatch(value):
        return f"{key}={value}"
    quoted = re.sub(r'(\\+)("|\Z)', lambda m: 2 * m.group(1) + m.group(2), value).replace('"', '\\"')
    return shell_word(f'{key}="{quoted}"')


def plural(count: int, singular: str, many: str | None = None) -> str:
    """`singular` for a `count` of 1, else `many` (`singular` + "s" unless given): the words after a
    count in a message, so that it reads `1 source was cut` and `2 sources were cut`
    (`plural(n, "source was", "sources were")`), never `1 sources were cut`."""
    return singular if count == 1 else singular + "s" if many is None else many
