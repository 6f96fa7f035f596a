"""`attnlab.data.text`'s words for commands to copy, read back by bash and by Hydra's override parser."""

from __future__ import annotations

import subprocess

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from attnlab.data.text import override_word, shell_word


def bash_words(line: str) -> list[str]:
    """The words bash splits `line` into (after its quote removal)."""
    done = subprocess.run(["bash", "-c", f"printf '%s\\0' {line}"], capture_output=True, check=True)
    return done.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize(
    "value",
    [
        "/runs/plain-1.2/last.ckpt",
        "/runs/pe=learned,seed=2-1b2c/checkpoints/best.ckpt",  # a multirun job's directory
        "/runs/it's a run/last.ckpt",
        '/runs/say "hi"/last.ckpt',
        "/runs/back\\slash\\/last.ckpt",
        '/runs/ends in a backslash\\" quote\\',
        "/runs/two\nlines/last.ckpt",
    ],
)
def test_an_override_word_is_one_shell_word_that_hydra_reads_back_as_the_value(value: str) -> None:
    word = override_word("ckpt_path", value)
    assert "\n" not in word
    (read,) = bash_words(word)
    (override,) = OverridesParser.create().parse_overrides([read])
    assert (override.key_or_group, override.value()) == ("ckpt_path", value)


def test_a_shell_word_is_the_text_to_bash() -> None:
    for text in ("plain", "it's", "a\\'b", "tab\tand\nbreak", "it's\nback\\slash", "\\"):
        assert bash_words(shell_word(text)) == [text]
