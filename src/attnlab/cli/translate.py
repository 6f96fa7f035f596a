"""`attnlab-translate`: translate text with a trained checkpoint, streaming.

Reads one sentence per line from stdin (or `input=FILE`) and writes one translation per line to stdout
(or `output=FILE`) in input order: exactly one output line per input line, empty lines included. A line
ends at "\n" only (a "\r" just before it is dropped; a UTF-8 byte-order mark opening a file is ignored).
A source longer than a learned position table allows is cut to fit, with a warning. Lines are read
`chunk_lines` at a time, each chunk decoded in length-sorted batches, so memory stays bounded on inputs
of any length. Log messages go to stderr.

Usage (key=value arguments, like the other attnlab commands):
    attnlab-translate ckpt_path=<file.ckpt | run dir> [input=-] [output=-] [average_last=0]
                      [device=auto] [chunk_lines=2048] [decode.beam=5 decode.lenpen=0.6 ...]
Example:
    echo "Ein Mann fährt Fahrrad." | attnlab-translate ckpt_path=logs/train/runs/<run>
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

DEFAULTS: dict[str, Any] = {
    "ckpt_path": None,
    "input": "-",
    "output": "-",
    "average_last": 0,
    "device": "auto",
    "chunk_lines": 2048,
    "decode": {
        name: None
        for name in ("beam", "lenpen", "max_len_a", "max_len_b", "min_len", "batch_size", "max_tokens")
    },
}


def parse_args(argv: Sequence[str]) -> dict[str, Any]:
    """The settings of `key=value` arguments over `DEFAULTS`.

    Raises:
        SystemExit: An argument that is not `key=value` or names an unknown key.
    """
    for arg in argv:
        if "=" not in arg:
            raise SystemExit(f"attnlab-translate: {arg!r} is not key=value (try --help)")
    base = OmegaConf.create(DEFAULTS)
    OmegaConf.set_struct(base, True)
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(list(argv)))
    except OmegaConfBaseException as exc:
        raise SystemExit(f"attnlab-translate: {str(exc).splitlines()[0]} (known keys: see --help)") from None
    return OmegaConf.to_container(merged)


def utf8_lines(stream: IO[bytes] | IO[str], name: str) -> Iterator[str]:
    """The lines of a UTF-8 byte stream, split at "\n" only, as in attnlab's data files (`read_lines`): a
    lone "\r" inside a line does not split it. A byte-order mark opening the stream is no text.

    Raises:
        ValueError: A line is not valid UTF-8; the message names the input, the line and the fix.
    """
    for number, raw in enumerate(stream, start=1):
        if isinstance(raw, str):  # a text stream without a byte buffer: already decoded
            yield raw
            continue
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{name}, line {number}, byte {exc.start + 1}: not UTF-8 text ({exc.reason}); the lines "
                "before it were translated. Convert the input to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
            ) from None


def translate_stream(settings: dict[str, Any], source: Iterable[str], sink: IO[str]) -> int:
    """Translate every line of `source` into `sink` (flushed per chunk); returns the line count."""
    from attnlab.translate import Translator, decode_settings, resolve_checkpoints

    paths = resolve_checkpoints(settings["ckpt_path"], int(settings["average_last"] or 0))
    translator = Translator.from_checkpoints(paths, device=str(settings["device"]))
    translator.decode = decode_settings(translator.decode.to_dict(), settings["decode"])
    count = 0
    chunk = int(settings["chunk_lines"])
    for count, line in enumerate(translator.stream(source, chunk_lines=chunk), start=1):
        sink.write(line + "\n")
        if count % chunk == 0:
            sink.flush()
    sink.flush()
    if translator.truncated:
        logging.getLogger(__name__).warning(
            "%d sources were cut to the model's max_positions", translator.truncated
        )
    return count


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__)
        return
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    settings = parse_args(argv)
    if not settings["ckpt_path"]:
        raise SystemExit("attnlab-translate: ckpt_path=<checkpoint file or run directory> is required")
    from attnlab.checkpoint import CheckpointError

    try:
        with contextlib.ExitStack() as stack:
            sink, name = sys.stdout, settings["input"]
            if name == "-":
                source = utf8_lines(getattr(sys.stdin, "buffer", sys.stdin), "standard input")
            else:
                source = utf8_lines(stack.enter_context(open(name, "rb")), str(name))
            if settings["output"] != "-":
                sink = stack.enter_context(open(settings["output"], "w", encoding="utf-8"))
            translate_stream(settings, source, sink)
    except (CheckpointError, ValueError, OSError) as exc:
        raise SystemExit(f"attnlab-translate: {exc}") from None


if __name__ == "__main__":
    main()
