r"""`attnlab-translate`: translate text with a trained checkpoint, streaming.

Reads one sentence per line from stdin (or `input=FILE`) and writes one translation per line to stdout (or
`output=FILE`) in input order: exactly one output line per input line. An empty or whitespace-only line (no
source tokens) translates to an empty line. A line ends at "\n" only (a "\r" just before it is dropped; a
UTF-8 byte-order mark opening a file is ignored). Input that is not UTF-8 is refused naming the line, or, for
UTF-16 or UTF-32 text (a first line mostly NUL bytes), the encoding. Invisible formatting characters inside
the input, a byte-order mark (files joined with `cat`) or U+200B-U+200D, U+2060 (zero-width space, non-joiner,
joiner, word joiner), are removed where the model's source tokenizer has no piece for them (it would read each
as <unk>, and translate the words around it wrongly), with a warning naming the lines; a tokenizer trained on
text that holds them (a zero-width non-joiner in Persian) keeps them. Only here: tokenizers, training data and
`Translator` read text as it is. A source longer than `decode.max_source_tokens` (default: the training
filter's `data.max_source_tokens`) or than a learned position table allows is cut to fit, keeping eos, with a
warning counting them; a line longer than 1 MiB is cut there first (at a whole character), the rest of it
read and dropped with a warning naming the line. Lines are read `chunk_lines` at a time, each chunk decoded
in length-sorted batches, so memory stays bounded on inputs of any length. Typed at a terminal (standard
input a TTY, `chunk_lines` not given), each line is translated as soon as it is entered (`chunk_lines=1`); a
pipe or file keeps the chunks. Log messages go to stderr.

`output=FILE` is written only when everything has succeeded: the checkpoint, the decoding settings, the
input and the output's directory are checked first (an output that is the input file, or a checkpoint
translating, is refused), the translations go to a hidden temporary file beside FILE, renamed over it
once complete. On any error FILE is left as it was and no temporary file remains. Standard output
streams chunk by chunk instead; when its reader stops early (`| head`), the command ends quietly with
status 1, as a filter does.

With `decode.nbest=N` (1 <= N <= decode.beam) or `decode.print_alignment=hard|soft`, the output holds
each line's N best hypotheses (1 when only alignments are asked for) with their scores, and alignments,
instead of plain lines (only when given here: a checkpoint's saved `nbest` and `print_alignment` are not
kept): one JSON object per input line (`decode.nbest_format=jsonl`, the default) or
fairseq-generate's `S-i`/`H-i`/`D-i`/`P-i`/`A-i` lines (`decode.nbest_format=fairseq`); see
`attnlab.inference.nbest`.

Usage (key=value arguments, like the other attnlab commands):
    attnlab-translate ckpt_path=<file.ckpt | run dir | [a,b,...] with ensemble=true> [input=-] [output=-]
                      [average_last=0] [ensemble=false]
                      [device=auto] [chunk_lines=2048 (1 at a terminal)] [allocator=keep|system]
                      [decode.beam=5 decode.alpha=0.6 ...]
                      [decode.max_source_tokens=N] [decode.sampling=true decode.beam=1 decode.topk=K
                      decode.topp=P decode.temperature=T decode.seed=S]
                      [decode.nbest=N] [decode.nbest_format=jsonl|fairseq] [decode.print_alignment=hard|soft]
`allocator=keep` (the default, as for `attnlab-train`) sets glibc's malloc to keep freed memory in the
process: a decoding step frees and reallocates its logits, candidates and cache buffers, which glibc's own
settings may hand back to the system and fault in again, page by page (docs/benchmarks.md, "Decoding:
attnlab vs CTranslate2"); `allocator=system` leaves glibc's settings (`attnlab.training.allocator`).

Example:
    echo "Ein Mann fährt Fahrrad." | attnlab-translate ckpt_path=logs/train/runs/<run>
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from attnlab.data.text import plural
from attnlab.decoding.settings import DECODE_TIME_KEYS
from attnlab.io import atomic_writer, without_bom, written_in_place
from attnlab.training.allocator import configure_allocator
from attnlab.typed import check_chunk_lines

if TYPE_CHECKING:
    from attnlab.data.tokenizer import SubwordTokenizer
    from attnlab.inference.translator import Translator

DEFAULTS: dict[str, Any] = {
    "ckpt_path": None,
    "input": "-",
    "output": "-",
    "average_last": 0,
    "ensemble": False,  # ckpt_path=[a,b,...]: their models combined at every step
    "device": "auto",
    "chunk_lines": None,  # null: CHUNK_LINES, or 1 when standard input is a terminal
    "allocator": "keep",  # glibc's malloc: keep freed memory for the next step (attnlab.training.allocator)
    "decode": dict.fromkeys(DECODE_TIME_KEYS),
}


CHUNK_LINES = 2048  # lines read and decoded at a time from a file or a pipe
# Invisible formatting characters (Unicode category Cf) that text carries unseen: a byte-order mark inside
# the input (files joined with `cat`), zero-width space, non-joiner and joiner, word joiner
INVISIBLE = {"\ufeff": "byte-order mark", "\u200b": "zero-width space", "\u200c": "zero-width non-joiner",
             "\u200d": "zero-width joiner", "\u2060": "word joiner"}  # fmt: skip
SHOWN_LINES = 10  # line numbers a warning names
# The most of one input line read (1 MiB): many times the text of any source limit in tokens; the rest of a
# longer line (an endless one: `tr -d "\\n" < big.txt`) is dropped, so memory stays bounded
LINE_BYTES = 1 << 20
VERBATIM = ("ckpt_path", "input", "output")  # keys whose values are file names, never parsed


def parse_args(argv: Sequence[str]) -> dict[str, Any]:
    """The settings of `key=value` arguments over `DEFAULTS`; `ckpt_path=[a,b,...]` is a list of the
    comma-separated names (for `ensemble=true`).

    Raises:
        SystemExit: An argument that is not `key=value` or names an unknown key.
    """
    for arg in argv:
        if "=" not in arg:
            raise SystemExit(f"attnlab-translate: {arg!r} is not key=value (try --help)")
    # File names are taken as typed: YAML would read `-` as a list and `2024` as a number.
    paths = {key: value for key, _, value in (arg.partition("=") for arg in argv) if key in VERBATIM}
    base = OmegaConf.create(DEFAULTS)
    OmegaConf.set_struct(base, True)
    try:
        merged = OmegaConf.merge(
            base, OmegaConf.from_dotlist([a for a in argv if a.partition("=")[0] not in paths])
        )
    except OmegaConfBaseException as exc:
        raise SystemExit(f"attnlab-translate: {str(exc).splitlines()[0]} (known keys: see --help)") from None
    listed = paths.get("ckpt_path", "")
    if listed.startswith("[") and listed.endswith("]"):  # ckpt_path=[a,b,...] (with ensemble=true)
        paths["ckpt_path"] = [name.strip() for name in listed[1:-1].split(",") if name.strip()]
    return {**OmegaConf.to_container(merged), **paths}


def utf8_lines(stream: IO[bytes] | IO[str], name: str) -> Iterator[str]:
    """The lines of a UTF-8 byte stream, split at "\n" only, as in attnlab's data files (`read_lines`): a
    lone "\r" inside a line does not split it. A byte-order mark opening the stream is no text. A line
    longer than `LINE_BYTES` is cut to its first `LINE_BYTES` (at a character's start), the rest of it read
    and dropped with a warning naming the line, so that memory stays bounded on a line of any length.

    Raises:
        ValueError: A line is not valid UTF-8, or the first line is mostly NUL bytes (UTF-16 or UTF-32
            text, which is valid UTF-8 when ASCII but split at its "\n" bytes into lines of letters between
            NULs, as `attnlab.data.corpora.refuse_wide_text` refuses data files, which also refuses gzip,
            xz or zstd data); the message names the input, the line or the encoding, and the fix.
    """
    for number, raw in enumerate(iter(lambda: stream.readline(LINE_BYTES), stream.read(0)), start=1):
        cut = len(raw) == LINE_BYTES and raw[-1:] not in (b"\n", "\n")
        if number == 1:
            raw = without_bom(raw)
        if isinstance(raw, bytes):  # (a text stream without a byte buffer gives lines already decoded)
            raw = _decoded(raw, name, number, cut)
        if cut:  # after the checks: an endless line of NULs or of bytes that are no text is not read on
            _drop_rest_of_line(stream, name, number)
        yield raw


def _decoded(raw: bytes, name: str, number: int, cut: bool) -> str:
    """Line `number` of input `name` decoded (`utf8_lines`); a `cut` line ends with its last whole
    character."""
    from attnlab.data.corpora import refuse_wide_text
    from attnlab.data.download import DataError

    if number == 1:
        try:
            refuse_wide_text(raw, name)
        except DataError as exc:
            raise ValueError(str(exc)) from None
    try:
        return codecs.getincrementaldecoder("utf-8")().decode(raw, final=not cut)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{name}, line {number}, byte {exc.start + 1}: not UTF-8 text ({exc.reason}). Convert the "
            "input to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None


def _drop_rest_of_line(stream: IO[bytes] | IO[str], name: str, number: int) -> None:
    """Read and drop the rest of line `number` of `stream` past its first `LINE_BYTES`, with a warning."""
    logging.getLogger(__name__).warning(
        "%s, line %d is longer than %d bytes: only its first %d are translated (one sentence a line)",
        name, number, LINE_BYTES, LINE_BYTES,
    )  # fmt: skip
    while True:
        piece = stream.readline(LINE_BYTES)
        if not piece or piece[-1:] in (b"\n", "\n"):
            return


class InvisibleFilter:
    """Removes `INVISIBLE` characters that `tokenizer` has no piece for (it encodes them as <unk>) from
    the lines passed through it (`__call__`), and records how many lines they were removed from (`count`),
    the numbers of the first `SHOWN_LINES` of them (`lines`, from 1: a stream may be endless) and which
    characters they were (`found`); `warning` says so."""

    def __init__(self, tokenizer: SubwordTokenizer) -> None:
        from attnlab.data.tokenizer import UNK_ID

        unknown = "".join(c for c in INVISIBLE if UNK_ID in tokenizer.encode(c))
        self.pattern = re.compile(f"[{unknown}]") if unknown else None
        self.lines: list[int] = []
        self.count = 0
        self.found: set[str] = set()

    def __call__(self, lines: Iterable[str]) -> Iterator[str]:
        if self.pattern is None:
            yield from lines
            return
        for number, line in enumerate(lines, start=1):
            found = self.pattern.findall(line)
            if found:
                self.count += 1
                if len(self.lines) < SHOWN_LINES:
                    self.lines.append(number)
                self.found.update(found)
                line = self.pattern.sub("", line)
            yield line

    def warning(self) -> str | None:
        """What was removed, on which lines (the first `SHOWN_LINES`); None when nothing was."""
        if not self.count:
            return None
        names = ", ".join(f"U+{ord(c):04X} {INVISIBLE[c]}" for c in sorted(self.found))
        lines = plural(self.count, "line")
        shown = ", ".join(map(str, self.lines))
        more = f" and {self.count - len(self.lines)} more" if self.count > len(self.lines) else ""
        return (
            f"removed invisible formatting characters the model's tokenizer does not know ({names}) from "
            f"{self.count} input {lines}, {lines} {shown}{more}: they would have been read as <unk>"
        )


def chunk_size(settings: dict[str, Any]) -> int:
    """The lines read at a time: `chunk_lines` when given, else 1 for input typed at a terminal (standard
    input a TTY: each line is translated as it is entered) and `CHUNK_LINES` for a file or a pipe.

    Raises:
        SystemExit: `chunk_lines` is no whole number of lines >= 1 (`attnlab.typed.check_chunk_lines`, the
            check of `Translator.stream`'s too), in one line naming it.
    """
    given = settings["chunk_lines"]
    if given is not None:
        try:
            return check_chunk_lines(given)
        except (TypeError, ValueError) as exc:
            raise SystemExit(f"attnlab-translate: {exc}") from None
    try:
        typed = str(settings["input"]) == "-" and os.isatty(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):  # no real stdin (closed, replaced by an object)
        typed = False
    return 1 if typed else CHUNK_LINES


def load_translator(settings: dict[str, Any]) -> tuple[Translator, list[Path]]:
    """The translator of `settings["ckpt_path"]` with the `decode.*` overrides applied, and the checkpoint
    files it was read from.

    Raises:
        attnlab.runs.checkpoint.CheckpointError: No usable checkpoint there.
        ValueError: A bad decoding setting.
    """
    from attnlab.inference.translator import Translator, resolve_checkpoints

    paths = resolve_checkpoints(settings["ckpt_path"], settings["average_last"], settings["ensemble"])
    ensemble = bool(settings["ensemble"])  # checked: true, false or null
    device = str(settings["device"])
    decode = settings["decode"] or {}  # applied before the saved ones are checked (decode=null: none)
    translator = Translator.from_checkpoints(paths, device=device, ensemble=ensemble, decode_overrides=decode)
    return translator, paths


def translate_stream(translator: Translator, source: Iterable[str], sink: IO[str], chunk_lines: int) -> int:
    """Translate every line of `source` into `sink` (flushed per chunk): a line each, or with
    `decode.nbest` / `decode.print_alignment` each line's n-best list in `decode.nbest_format`; returns
    the line count. Invisible characters the source tokenizer does not know are removed first
    (`InvisibleFilter`, with a warning)."""
    from attnlab.inference.nbest import nbest_text

    decode, invisible = translator.decode, InvisibleFilter(translator.src_tokenizer)
    source = invisible(source)
    if decode.writes_nbest:
        records = (nbest_text(n, decode.nbest_format) for n in translator.stream_nbest(source, chunk_lines))
    else:
        records = (line + "\n" for line in translator.stream(source, chunk_lines=chunk_lines))
    count = 0
    for count, record in enumerate(records, start=1):
        sink.write(record)
        if count % chunk_lines == 0:
            sink.flush()
    sink.flush()
    if invisible.warning():
        logging.getLogger(__name__).warning("%s", invisible.warning())
    if translator.truncated:
        logging.getLogger(__name__).warning(
            "%d %s cut to %s", translator.truncated,
            plural(translator.truncated, "source was", "sources were"), translator.source_limit()[1],
        )  # fmt: skip
    if translator.unfinished:
        logging.getLogger(__name__).warning(
            "%d of %d %s ran to their length limit without eos (decode.max_len_a=%s, max_len_b=%s, "
            "min_len=%s)", translator.unfinished, count, plural(count, "translation"), decode.max_len_a,
            decode.max_len_b, decode.min_len,
        )  # fmt: skip
    return count


class _Written:
    """Standard output, counting the records `translate_stream` writes to it (one a source line)."""

    def __init__(self, sink: IO[str]) -> None:
        self.sink, self.records = sink, 0

    def write(self, record: str) -> None:
        self.sink.write(record)
        self.records += 1

    def flush(self) -> None:
        self.sink.flush()


def open_input(name: str) -> IO[bytes]:
    """The file `input=` names, opened for reading.

    Raises:
        ValueError: It cannot be opened (missing, a directory, no permission), naming it and the fix.
    """
    try:
        return open(name, "rb")  # (closed by the caller's ExitStack)
    except OSError as exc:
        raise ValueError(
            f"input={name}: {exc.strerror or exc}: give a text file, one sentence per line, or input=- "
            "(standard input)"
        ) from None


def output_file(output: str, source: IO[Any], checkpoints: Sequence[Path] = ()) -> Path:
    """The file `output=` names (a symbolic link: its target; a device or a pipe: as named, written in
    place by `attnlab.io.atomic_writer`), checked before anything is written.

    Raises:
        ValueError: It is a directory or a read-only file, its directory is missing or not writable, or
            it is the input (the same file as the `source` stream: same device and inode) or one of the
            `checkpoints` translating (replaced by the translations: the model would be lost).
    """
    path = Path(os.path.realpath(output))
    if written_in_place(output):  # a device or a pipe (/dev/null, /dev/stdout): written to, never replaced
        path = Path(output)
    elif path.is_dir():
        raise ValueError(f"output={output} is a directory: name a file to write the translations to")
    elif not path.parent.is_dir():
        raise ValueError(
            f"output={output}: its directory {path.parent} does not exist or is not a directory; create it "
            "or choose another output"
        )
    elif not os.access(path.parent, os.W_OK | os.X_OK):
        raise ValueError(
            f"output={output}: the directory {path.parent} is not writable; choose another output"
        )
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"output={output} is a read-only file: make it writable or choose another output")
    try:
        existing = os.stat(path)
    except (OSError, ValueError):  # no output file yet
        return path
    if (existing.st_dev, existing.st_ino) in {(s.st_dev, s.st_ino) for s in map(os.stat, checkpoints)}:
        raise ValueError(
            f"output={output} is the checkpoint being translated with: writing the translations there would "
            "replace the trained model; choose another output file"
        )
    try:
        read = os.fstat(source.fileno())
    except (OSError, ValueError, AttributeError):  # an input without a file
        return path
    if (read.st_dev, read.st_ino) == (existing.st_dev, existing.st_ino):
        raise ValueError(
            f"output={output} is the input file: writing the translations there would replace the text "
            "being translated; choose another output file"
        )
    return path


def _reader_gone() -> NoReturn:
    """End quietly with status 1, as a filter does, once the reader of standard output has stopped (`| head`):
    standard output is pointed at /dev/null, since what is still buffered for the reader that is gone would
    raise BrokenPipeError again when Python flushes it at exit (the way the Python docs give, `signal`
    module)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no file descriptor (a StringIO)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    raise SystemExit(1) from None


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(arg in ("-h", "--help") for arg in argv):
        try:
            print(__doc__, flush=True)
        except BrokenPipeError:  # `attnlab-translate --help | head`
            _reader_gone()
        return
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    settings = parse_args(argv)
    if not settings["ckpt_path"]:
        raise SystemExit("attnlab-translate: ckpt_path=<checkpoint file or run directory> is required")
    chunk_lines, output = chunk_size(settings), str(settings["output"])
    from attnlab.runs.checkpoint import CheckpointError

    streaming: _Written | None = None
    try:
        configure_allocator(settings["allocator"])  # ValueError for an unknown value, before any loading
        translator, checkpoints = load_translator(settings)  # the checkpoint first: nothing opened before
        with contextlib.ExitStack() as stack:
            name = str(settings["input"])
            if name == "-":
                stream, name = getattr(sys.stdin, "buffer", sys.stdin), "standard input"
            else:
                stream = stack.enter_context(open_input(name))
            source = utf8_lines(stream, name)
            if output == "-":
                streaming = _Written(sys.stdout)
                translate_stream(translator, source, streaming, chunk_lines)
            else:
                path = output_file(output, stream, checkpoints)
                with atomic_writer(path, encoding="utf-8") as sink:
                    translate_stream(translator, source, sink, chunk_lines)
    except BrokenPipeError:  # the reader of the output stopped (`| head`)
        _reader_gone()
    except (CheckpointError, ValueError, OSError) as exc:
        if output != "-":
            after = f"; nothing was written to {output} (a file there before is unchanged)"
        elif streaming is not None and isinstance(exc, ValueError):
            done = streaming.records
            lines = plural(done, "the line before it was", f"the {done} lines before it were")
            after = f"; {lines} translated to standard output" if done else "; nothing was translated"
        else:
            after = ""
        raise SystemExit(f"attnlab-translate: {exc}{after}") from None


if __name__ == "__main__":
    main()
