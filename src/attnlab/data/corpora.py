"""Real parallel corpora: Multi30k, any aligned plain-text files, Hugging Face datasets (torch-free specs).

Each spec is a typed dataclass (a Hydra `data` node) holding where the text comes from plus the shared
preprocessing and batching settings of `CorpusData`; `spec.datamodule()` builds the LightningDataModule
(`attnlab.data.datamodule.CorpusDataModule`), which tokenizes and caches everything derived.

Splits are named `train`, `val` and one or more test sets (the first is the one `Trainer.test` uses).
A spec's `readers()` reads each split as a stream of aligned chunks (files line by line, a Hugging Face
dataset batch by batch), so the training split of a WMT-sized corpus is never held whole in memory;
`load()` gives whole splits as lists (the small validation and test sets).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from attnlab.data.cache import file_sha256
from attnlab.data.download import MULTI30K_BASE_URL, MULTI30K_LANGS, DataError
from attnlab.data.tokenizer import SPECIAL_TOKENS, TokenizerModel
from attnlab.io import without_bom
from attnlab.typed import check_fields, require, require_positive

if TYPE_CHECKING:
    from attnlab.data.datamodule import CorpusDataModule

Text = tuple[list[str], list[str]]  # aligned (source lines, target lines)
Reader = Callable[[int], Iterator[Text]]  # reader(chunk_lines): a split's aligned lines, chunk by chunk
BLOCK_BYTES = 1 << 20  # text files are read and decoded this many bytes (whole lines) at a time
READ_LINES = 1 << 16  # pairs a chunk when a split is read whole (`load`)


def iter_lines(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 text file, split on "\\n" only (one segment per line; a final newline ends
    the last line, and a trailing "\\r" is dropped), read `BLOCK_BYTES` at a time as they are asked for.

    Raises:
        DataError: the file is missing or cannot be opened (at once) or not valid UTF-8 (when the reading
            gets there, naming the file and line).
    """
    return itertools.chain.from_iterable(_line_blocks(path))


def _line_blocks(path: Path) -> Iterator[list[str]]:
    """`iter_lines(path)` a block at a time: the lists of the lines of each `BLOCK_BYTES` read (no Python
    step per line unless a line ends in "\\r"). A missing file, or one that cannot be opened (a directory, a
    pipe, no permission): `DataError` at once, naming it, not when iterated."""
    check_data_file(path)
    try:
        file = open(path, "rb")  # noqa: SIM115 (closed by `_decoded_blocks`)
    except FileNotFoundError:
        raise DataError(f"data file not found: {path}") from None
    except OSError as exc:
        raise unreadable(path, exc.strerror or str(exc)) from None
    return _decoded_blocks(file, path)


# The magic bytes opening compressed data, none of them a UTF-8 text's start: compressor, tool to unpack it.
COMPRESSED = {
    b"\x1f\x8b": ("gzip", "gunzip"),
    b"\xfd7zXZ\x00": ("xz", "unxz"),
    b"(\xb5/\xfd": ("zstd", "unzstd"),
}


def unreadable(path: Path, why: str) -> DataError:
    """The error for a data file that exists but cannot be read as one (`why`: a directory, no permission)."""
    return DataError(f"data file {path} cannot be read ({why}): give a UTF-8 text file, one sentence a line")


def check_data_file(path: Path) -> None:
    """Raise `DataError` naming `path` unless it is a regular file (or a link to one) that can be opened:
    missing (a link to nothing included), a directory, a named pipe, socket or device, or without read
    permission. A pipe (`<(zcat ...)`) would be read once at most (preparing reads a file twice: hashing
    it for the cache key, then its lines), and opening one waits for a writer: forever. Hashing a file
    without read permission ended in PermissionError's traceback."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise DataError(f"data file not found: {path}") from None
    except OSError as exc:
        raise unreadable(path, exc.strerror or str(exc)) from None
    if stat.S_ISDIR(mode):
        raise unreadable(path, "Is a directory")
    if not stat.S_ISREG(mode):
        raise unreadable(path, "a pipe, socket or device, not a regular file")
    try:
        open(path, "rb").close()
    except OSError as exc:
        raise unreadable(path, exc.strerror or str(exc)) from None


def _decoded_blocks(file: IO[bytes], path: Path) -> Iterator[list[str]]:
    with file:
        # The bytes after the last line feed read, block by block: a line longer than a block is joined
        # once, when its end comes (adding block to block would copy it again at each: quadratic time).
        rest: list[bytes] = []
        lines_before, first = 0, True
        while True:
            block = file.read(BLOCK_BYTES)
            cut = block.rfind(b"\n") + 1  # whole lines only
            if block and cut == 0:  # no newline yet: a line longer than a block
                rest.append(block)
                continue
            data, rest = b"".join([*rest, block[:cut]]), [block[cut:]]  # at the end: the last line, if any
            if not data:
                return
            if first:  # a byte-order mark is not part of line 1
                data, first = without_bom(data), False
                refuse_wide_text(data, path)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = lines_before + data[: exc.start].count(b"\n") + 1
                raise DataError(
                    f"{path}:{line}: invalid UTF-8 ({exc.reason}); re-encode the file as UTF-8"
                ) from None
            lines = text.split("\n")
            if lines[-1] == "":  # what follows the final newline of `data`
                lines.pop()
            # (one line with carriage returns inside: also when a tool added a final "\n" to such a file)
            if lines_before == 0 and len(lines) == 1 and "\r" in lines[0].rstrip("\r"):
                raise DataError(
                    f"{path} has no line feed but {text.count(chr(13))} carriage returns: "
                    "it uses CR line endings (classic Mac OS), which would make the whole file one line; "
                    "convert them to \"\\n\" (e.g. tr '\\r' '\\n')"
                )
            lines_before += len(lines)
            if "\r" in text:
                lines = [line[:-1] if line.endswith("\r") else line for line in lines]
            yield lines


def refuse_wide_text(data: bytes, path: Path | str) -> None:
    """Raise when the first lines read of `path` (a file or a stream's name: attnlab-translate checks its
    input's first line the same way) are mostly NUL bytes: UTF-16 or UTF-32 text without a
    byte-order mark (or binary data) is valid UTF-8 when its characters are ASCII, and would be read as
    lines of letters between NULs. The message names the encoding (`_wide_encoding`) for the fix: a
    big-endian file re-encoded as little-endian gives valid text of other letters (`䠀愀` for `Ha`). A few
    NULs in UTF-8 text are left to the tokenizer. Data opening with the magic bytes of a compressor in
    `COMPRESSED` (a corpus given as its `.gz` download) is refused too, naming the tool that unpacks it
    (it was called invalid UTF-8, with re-encoding as the fix); no UTF-8 text opens with those bytes."""
    for magic, (name, tool) in COMPRESSED.items():
        if data.startswith(magic):
            raise DataError(f"{path} is {name}-compressed, not UTF-8 text: decompress it first ({tool})")
    nuls = data.count(0)
    if nuls * 4 > len(data):
        encoding = _wide_encoding(data)
        name, source = (encoding, encoding) if encoding else ("UTF-16 or UTF-32", "<its encoding>")
        raise DataError(
            f"{path}: {nuls} of its first {len(data)} bytes are NUL: it is {name} text (or binary data), not "
            f"UTF-8; re-encode it as UTF-8 (iconv -f {source} -t UTF-8)"
        )


def _wide_encoding(data: bytes) -> str | None:
    """The encoding of mostly-ASCII text `data` (from a file's start) by where its NULs are: UTF-16LE
    (`H\0a\0`), UTF-16BE (`\0H\0a`), UTF-32LE (`H\0\0\0`), UTF-32BE (`\0\0\0H`); None for another pattern."""

    def nul_share(part: bytes) -> float:
        return part.count(0) / max(1, len(part))

    odd, even = nul_share(data[1::2]), nul_share(data[0::2])
    if odd > 0.5 >= even:  # little-endian: the ASCII byte first
        return "UTF-32LE" if nul_share(data[2::4]) > 0.5 else "UTF-16LE"
    if even > 0.5 >= odd:  # big-endian: the ASCII byte last
        return "UTF-32BE" if nul_share(data[1::4]) > 0.5 else "UTF-16BE"
    return None


def read_lines(path: Path) -> list[str]:
    """All lines of a UTF-8 text file (`iter_lines`)."""
    return list(iter_lines(path))


class _Chunker:
    """The lines of a file's blocks (`_line_blocks`) cut into lists of a given length, by list slices."""

    def __init__(self, path: Path) -> None:
        self.blocks, self.buffer, self.start = _line_blocks(path), [], 0

    def take(self, count: int) -> list[str]:
        """The next `count` lines (fewer at the end of the file)."""
        parts, wanted = [], count
        while wanted > 0:
            if self.start == len(self.buffer):
                self.buffer, self.start = next(self.blocks, None), 0
                if self.buffer is None:
                    self.buffer = []
                    break
                continue
            part = self.buffer[self.start : self.start + wanted]
            self.start += len(part)
            wanted -= len(part)
            parts.append(part)
        return parts[0] if len(parts) == 1 else list(itertools.chain.from_iterable(parts))

    def rest(self) -> int:
        """How many lines are left (reading them all)."""
        return len(self.buffer) - self.start + sum(map(len, self.blocks))


def iter_parallel(src_path: Path, tgt_path: Path, chunk_lines: int) -> Iterator[Text]:
    """Aligned source and target lines, `chunk_lines` pairs at a time, both files read together block by
    block (`iter_lines`); line counts must agree.

    Raises:
        DataError: A file is missing or not UTF-8 (`iter_lines`), or the line counts differ (when the
            shorter file ends, naming both files and counts).
    """
    src_lines, tgt_lines = _Chunker(src_path), _Chunker(tgt_path)
    read = 0
    while True:
        src, tgt = src_lines.take(chunk_lines), tgt_lines.take(chunk_lines)
        if len(src) != len(tgt):
            src_count = read + len(src) + src_lines.rest()
            tgt_count = read + len(tgt) + tgt_lines.rest()
            raise DataError(
                f"{src_path} has {src_count} lines but {tgt_path} has {tgt_count}: parallel files must be "
                "aligned line by line"
            )
        if not src:
            return
        read += len(src)
        yield src, tgt


def read_whole(reader: Reader) -> Text:
    """Every aligned line `reader` gives, as two lists."""
    src: list[str] = []
    tgt: list[str] = []
    for src_chunk, tgt_chunk in reader(READ_LINES):
        src += src_chunk
        tgt += tgt_chunk
    return src, tgt


def read_parallel(src_path: Path, tgt_path: Path) -> Text:
    """Aligned source and target lines of two whole files (`iter_parallel`)."""
    return read_whole(functools.partial(iter_parallel, src_path, tgt_path))


def _tokenizer_sha256(path: Path) -> str:
    try:
        return file_sha256(path)
    except OSError as exc:
        raise DataError(
            f"tokenizer file {path} cannot be read ({exc.strerror or exc}): set the tokenizer path to a "
            "tokenizers JSON file (tokenizer=bpe|unigram) or a SentencePiece .model "
            "(tokenizer=sentencepiece), or to null to train one"
        ) from None


def _check_splits(splits: Sequence[str] | None, available: list[str]) -> list[str]:
    if splits is None:
        return available
    unknown = [name for name in splits if name not in available]
    if unknown:
        raise DataError(f"no split named {', '.join(map(repr, unknown))} in this corpus: it has "
                        f"{', '.join(available)}")  # fmt: skip
    return list(splits)


def _absolute(value: str | None) -> str | None:
    """A path setting made absolute against the working directory (`~` expanded, symlinks kept, so a
    prefix keeps its file name); None stays None. `..` is kept, not folded: the OS resolves `link/..` to
    the parent of the link's target, which is what reading the setting (`Path.resolve`) finds."""
    if value is None:
        return None
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else Path.cwd() / path)


def _remote(value: str) -> bool:
    """A URL-like data file (`https://...`, `hf://...`, `s3://...`): never relative to a directory."""
    return "://" in value


def _hf_builders() -> frozenset[str]:
    """The packaged `datasets` builders (`json`, `csv`, ...), which `load_dataset` picks before a local
    directory of the same name."""
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except ImportError:  # no datasets: nothing can read the data either
        return frozenset({"json", "csv", "parquet", "text", "arrow", "pandas"})
    return frozenset(_PACKAGED_DATASETS_MODULES)


def _first_lines(exc: BaseException) -> str:
    """`exc` and the exception it was raised from (its cause), each as its type and first line."""
    told = []
    while exc is not None and len(told) < 2:
        text = str(exc).strip().splitlines()[0][:300].rstrip(".") if str(exc).strip() else ""
        told.append(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
        exc = exc.__cause__
    return ", from ".join(told)


def _require_directory(name: str, value: str | None, holding: str) -> None:
    """A directory setting, when set, must exist (relative paths: from the working directory)."""
    if value is not None:
        require(Path(value).expanduser().is_dir(), f"{name}={value} does not exist or is not a directory: "
                f"set {name} to the directory holding {holding}")  # fmt: skip


@dataclass(frozen=True)
class CorpusData:
    """Preprocessing and batching settings shared by every real corpus.

    Args:
        src_lang: Source language (file suffix / dataset key).
        tgt_lang: Target language.
        tokenizer: Subword model, `bpe` or `unigram` (Hugging Face `tokenizers`, Metaspace pieces), or
            `sentencepiece` (a SentencePiece unigram model; needs the `[spm]` extra).
        vocab_size: Vocabulary size per tokenizer, the 4 special tokens included (at most: a small corpus
            may give fewer). Unused with a tokenizer file: the file's vocabulary counts.
        joint_vocab: One vocabulary for both languages (required by `model.tie=all`).
        tokenizer_sample: Train the tokenizer(s) on a uniform sample of this many training pairs (the
            non-empty ones), drawn by reservoir sampling seeded by `seed`; null: on every training pair.
        tokenizer_path: With `joint_vocab`, a trained tokenizer to use instead of training one: a Hugging
            Face `tokenizers` JSON file (`tokenizer=bpe|unigram`, whatever model it holds) or a
            SentencePiece `.model` (`tokenizer=sentencepiece`). It must hold `<pad>`, `<s>`, `</s>`,
            `<unk>` at ids 0-3. The cache key holds its content's SHA-256, not its path.
        src_tokenizer_path: Without `joint_vocab`, the source language's tokenizer file (as
            `tokenizer_path`); `tgt_tokenizer_path` the target's. Both or neither.
        max_source_tokens: Training pairs with a longer source (in subwords, eos included) are dropped.
        max_target_tokens: Training pairs with a longer target (eos included) are dropped.
        max_length_ratio: Training pairs whose longer side exceeds this multiple of the shorter are
            dropped (null: no ratio filter). Validation and test sets are never filtered. A run whose
            filters drop every training pair is refused before training, with the counts
            (`ParallelDataModule.check_feeds`).
        max_tokens: Tokens per batch including padding (fairseq `--max-tokens`); null for sentence batches.
        batch_size: Sentences per batch (a cap when `max_tokens` is set too).
        num_workers: DataLoader worker processes.
        seed: Seed of the batch shuffle and of the tokenizer sample.
        cache_dir: Where downloads and prepared data go (null: `$ATTNLAB_CACHE_DIR` or `~/.cache/attnlab`).
    """

    src_lang: str = "de"
    tgt_lang: str = "en"
    tokenizer: TokenizerModel = "bpe"
    vocab_size: int = 8000
    joint_vocab: bool = True
    tokenizer_sample: int | None = None
    tokenizer_path: str | None = None
    src_tokenizer_path: str | None = None
    tgt_tokenizer_path: str | None = None
    max_source_tokens: int = 256
    max_target_tokens: int = 256
    max_length_ratio: float | None = None
    max_tokens: int | None = 4096
    batch_size: int | None = None
    num_workers: int = 0
    seed: int = 1
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        require(
            self.src_lang != self.tgt_lang, f"src_lang={self.src_lang!r} equals tgt_lang: pick two languages"
        )
        require(
            self.vocab_size > len(SPECIAL_TOKENS),
            f"vocab_size={self.vocab_size} must exceed the {len(SPECIAL_TOKENS)} special tokens "
            f"({', '.join(SPECIAL_TOKENS)})",
        )
        require_positive(self, "max_source_tokens", "max_target_tokens")
        require(
            self.max_tokens is not None or self.batch_size is not None,
            "max_tokens=null and batch_size=null: set max_tokens (tokens per batch) or batch_size "
            "(sentences per batch)",
        )
        for name in ("max_tokens", "batch_size", "max_length_ratio", "tokenizer_sample"):
            value = getattr(self, name)
            require(value is None or value > 0, f"{name}={value} must be positive (or null)")
        ratio = self.max_length_ratio
        require(ratio is None or ratio >= 1, f"max_length_ratio={ratio} would drop every training pair: it "
                "bounds a pair's longer side over its shorter, at least 1; set it >= 1, or null")  # fmt: skip
        require(self.num_workers >= 0, f"num_workers={self.num_workers} must be >= 0")
        self._check_tokenizer_paths()

    def _check_tokenizer_paths(self) -> None:
        src, tgt = self.src_tokenizer_path, self.tgt_tokenizer_path
        if self.joint_vocab:
            require(src is None and tgt is None, "src_tokenizer_path/tgt_tokenizer_path are for "
                    "joint_vocab=false: with one vocabulary set tokenizer_path")  # fmt: skip
            return
        joint = self.tokenizer_path
        require(joint is None, f"tokenizer_path={joint} is one tokenizer for both languages: set "
                "joint_vocab=true, or src_tokenizer_path and tgt_tokenizer_path")  # fmt: skip
        require((src is None) == (tgt is None), f"src_tokenizer_path={src} and tgt_tokenizer_path={tgt}: "
                "set both (or neither)")  # fmt: skip

    def cache_root(self) -> Path:
        """The cache directory (downloads and prepared data)."""
        from attnlab.data.cache import default_cache_dir

        return Path(self.cache_dir).expanduser().resolve() if self.cache_dir else default_cache_dir()

    def absolute_paths(self) -> dict[str, Any]:
        """The settings naming local files or directories, made absolute against the working directory
        (which is what reading them resolves relative ones against). A checkpoint holds its data
        settings with these (`attnlab.runs.checkpoint.data_settings`), so `attnlab-eval` reads the files
        the model was trained and tested on from any working directory."""
        names = ("cache_dir", "tokenizer_path", "src_tokenizer_path", "tgt_tokenizer_path")
        return {name: _absolute(getattr(self, name)) for name in names}

    def tokenizer_files(self) -> tuple[Path, Path] | None:
        """The (source, target) tokenizer files to load instead of training tokenizers (one file twice
        with `joint_vocab`), or None (relative paths: from the working directory)."""
        paths = (
            (self.tokenizer_path,) * 2
            if self.joint_vocab
            else (self.src_tokenizer_path, self.tgt_tokenizer_path)
        )
        if paths[0] is None:
            return None
        return Path(paths[0]).expanduser().resolve(), Path(paths[1]).expanduser().resolve()

    def preprocessing(self) -> dict[str, Any]:
        """The settings that determine the prepared data (part of its cache key): with tokenizer files,
        the SHA-256 of their content; with `tokenizer_sample`, the seed that draws it.

        Raises:
            DataError: A tokenizer file cannot be read.
        """
        keys = ("src_lang", "tgt_lang", "tokenizer", "vocab_size", "joint_vocab", "tokenizer_sample",
                "max_source_tokens", "max_target_tokens", "max_length_ratio")  # fmt: skip
        settings = {k: getattr(self, k) for k in keys}
        files = self.tokenizer_files()
        if files is not None:
            settings["tokenizer_sha256"] = [_tokenizer_sha256(path) for path in files]
        elif self.tokenizer_sample is not None:
            settings["tokenizer_sample_seed"] = self.seed
        return settings

    def files(self) -> dict[str, tuple[Path, Path]]:
        """Split name -> (source file, target file): `train`, `val`, then the test sets."""
        raise NotImplementedError(f"{type(self).__name__} reads no files; it overrides `readers`")

    def readers(self) -> dict[str, Reader]:
        """Split name -> its reader: `reader(chunk_lines)` iterates the split's aligned raw lines,
        `chunk_lines` pairs at a time, reading them as they are asked for (every call reads anew)."""
        return {name: functools.partial(iter_parallel, *pair) for name, pair in self.files().items()}

    def load(self, splits: Sequence[str] | None = None) -> dict[str, Text]:
        """Split name -> aligned raw lines, for `splits` (None: every split), each read whole."""
        readers = self.readers()
        return {name: read_whole(readers[name]) for name in _check_splits(splits, list(readers))}

    def test_split_names(self) -> list[str]:
        """The test sets' names (every split except `train` and `val`)."""
        return [name for name in self.files() if name not in ("train", "val")]

    def fingerprint_inputs(self) -> list[Any]:
        """What identifies the raw text (file contents are hashed, not paths)."""
        files = self.files()
        for path in (p for pair in files.values() for p in pair):
            check_data_file(path)
        return [(name, src, tgt) for name, (src, tgt) in files.items()]

    def datamodule(self) -> CorpusDataModule:
        """The LightningDataModule serving this corpus."""
        from attnlab.data.datamodule import CorpusDataModule

        return CorpusDataModule(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Multi30kData(CorpusData):
    """Multi30k (WMT16 multimodal task 1), de/en/fr, downloaded and checksummed on first use.

    Its defaults are those of `conf/data/multi30k.yaml` (the default recipe, `experiment=multi30k_fast`):
    a joint BPE vocabulary of 5000 and batches of at most 1024 tokens.

    Args:
        root: A directory holding `train.de`, `val.de`, `test2016.de`, ... (gunzipped official files);
            when set, nothing touches the network.
        base_url: Where the gzipped files are fetched from (a mirror of the pinned upstream commit).
    """

    vocab_size: int = 5000
    max_tokens: int | None = 1024
    root: str | None = None
    base_url: str = MULTI30K_BASE_URL

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("src_lang", "tgt_lang"):
            value = getattr(self, name)
            require(value in MULTI30K_LANGS, f"{name}={value!r} is not a Multi30k language: use one of "
                    f"{', '.join(MULTI30K_LANGS)}")  # fmt: skip
        _require_directory("root", self.root, "the gunzipped Multi30k files (train.de, val.de, test2016.de, "
                           "...), or set root=null to download them")  # fmt: skip

    def absolute_paths(self) -> dict[str, Any]:
        return {**super().absolute_paths(), "root": _absolute(self.root)}

    def files(self) -> dict[str, tuple[Path, Path]]:
        from attnlab.data.download import multi30k_paths

        root = Path(self.root).expanduser().resolve() if self.root else None
        paths = multi30k_paths(
            (self.src_lang, self.tgt_lang), root=root, cache_dir=self.cache_root(), base_url=self.base_url
        )
        return {
            split: (paths[f"{split}.{self.src_lang}"], paths[f"{split}.{self.tgt_lang}"])
            for split in ("train", "val", "test2016")
        }


@dataclass(frozen=True)
class FilesData(CorpusData):
    """Any aligned plain-text corpus, one segment per line, files named `<prefix>.<lang>` (fairseq style).

    With `dir` set, prefixes are relative to it (`dir/train.de`); otherwise they are paths themselves
    (`/data/wmt/train` -> `/data/wmt/train.de`). For files not named by language (`train.src`,
    `train.tgt`), set `src_lang=src tgt_lang=tgt`.

    Args:
        dir: Directory holding the files (null: prefixes are paths).
        train: Training prefix.
        valid: Validation prefix.
        test: Test prefixes; each is a test set named by its prefix's file name.
    """

    dir: str | None = None
    train: str = "train"
    valid: str = "valid"
    test: tuple[str, ...] = ("test",)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require_directory("dir", self.dir, "the <prefix>.<src_lang> and <prefix>.<tgt_lang> files (e.g. "
                           "train.de, train.en, valid.de, ...)")  # fmt: skip
        require(len(self.test) > 0, "test=[] needs at least one test prefix")
        names = [Path(p).name for p in self.test]
        require(len(set(names)) == len(names), f"test={list(self.test)} has two test sets with one name")
        for name in names:
            require(name not in ("train", "val"), f"test={list(self.test)} names a test set {name!r}, "
                    "like a training or validation split: rename the files")  # fmt: skip

    def absolute_paths(self) -> dict[str, Any]:
        if self.dir is not None:  # prefixes are relative to it
            return {**super().absolute_paths(), "dir": _absolute(self.dir)}
        prefixes = {"train": _absolute(self.train), "valid": _absolute(self.valid)}
        return {**super().absolute_paths(), **prefixes, "test": tuple(_absolute(p) for p in self.test)}

    def _pair(self, prefix: str) -> tuple[Path, Path]:
        base = Path(self.dir) / prefix if self.dir else Path(prefix)
        base = base.expanduser().resolve()
        return base.with_name(f"{base.name}.{self.src_lang}"), base.with_name(f"{base.name}.{self.tgt_lang}")

    def files(self) -> dict[str, tuple[Path, Path]]:
        out = {"train": self._pair(self.train), "val": self._pair(self.valid)}
        for prefix in self.test:
            out[Path(prefix).name] = self._pair(prefix)
        return out


@dataclass(frozen=True)
class HFData(CorpusData):
    """A Hugging Face `datasets` translation dataset (needs the `[hf]` extra).

    Rows are `{"translation": {src_lang: ..., tgt_lang: ...}}` (the hub's translation format) or have
    `src_lang`/`tgt_lang` columns directly.

    Args:
        name: A hub name (`bentrevett/multi30k`), a local dataset directory saved with
            `Dataset(Dict).save_to_disk`, or a local data-file builder (`json`, `csv`, `parquet`, ...)
            with `data_files`.
        config: Dataset configuration name (e.g. `de-en`), or null.
        data_files: For builders like `json`: split name -> file.
        train_split: Split used for training.
        valid_split: Split used for validation.
        test_splits: Test splits (the first is the one `Trainer.test` uses).
    """

    name: str = ""
    config: str | None = None
    data_files: dict[str, str] | None = None
    train_split: str = "train"
    valid_split: str = "validation"
    test_splits: tuple[str, ...] = ("test",)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.name), "name='' must name a dataset (hub name, saved directory or builder)")
        require(len(self.test_splits) > 0, "test_splits=[] needs at least one test split")
        for name in self.test_splits:
            require(name not in ("train", "val"), f"test_splits={list(self.test_splits)} names a test "
                    f"split {name!r}, which clashes with the training/validation split names")  # fmt: skip

    def absolute_paths(self) -> dict[str, Any]:
        """As `CorpusData.absolute_paths`, with `name` when it is a local directory `datasets` reads (not a
        packaged builder's name such as `json`, which `load_dataset` picks before a directory of that name)
        and, for a packaged builder, each `data_files` entry but remote ones (globs too). A directory's and
        a hub repository's data files are relative to it and stay as they are, as do hub names."""
        local = Path(self.name).expanduser()
        saved = local.is_dir() and (local / "dataset_dict.json").is_file()  # `_dataset`: load_from_disk
        builder = not saved and self.name in _hf_builders()  # picked before a directory of its name
        paths = {**super().absolute_paths()}
        if local.is_dir() and not builder:
            paths["name"] = _absolute(self.name)
        if self.data_files is not None and builder:  # a builder's: relative to the working directory
            paths["data_files"] = {  # (a directory's or hub repository's: relative to it, kept)
                split: file if _remote(file) else _absolute(file) for split, file in self.data_files.items()
            }
        return paths

    def _dataset(self) -> Any:
        try:
            import datasets
        except ImportError:
            raise DataError("data=hf needs the `datasets` package: pip install 'attnlab[hf]'") from None
        local = Path(self.name).expanduser()
        try:
            if local.is_dir() and (local / "dataset_dict.json").is_file():
                return datasets.load_from_disk(str(local))
            return datasets.load_dataset(self.name, self.config, data_files=self.data_files)
        except Exception as exc:  # datasets' own errors, FileNotFoundError, ConnectionError, ValueError, ...
            raise DataError(
                f"the datasets package cannot load data.name={self.name} (data.config={self.config}, "
                f"data.data_files={self.data_files}): {_first_lines(exc)}. Set data.name to a hub dataset, "
                "a directory saved with save_to_disk, or a builder (json, csv, parquet, ...) with "
                "data.data_files"
            ) from exc

    def _check_column(self, rows: Any, lang: str, split: str) -> None:
        if "translation" not in rows.column_names and lang not in rows.column_names:
            raise DataError(f"split {split!r} of {self.name} has no 'translation' or {lang!r} column: "
                            f"columns are {rows.column_names}")  # fmt: skip

    def _read(self, dataset: Any, split: str, chunk_lines: int, *, one_line: bool = False) -> Iterator[Text]:
        """Split `split` of `dataset`, `chunk_lines` rows at a time from its Arrow table; with `one_line` (an
        evaluation set, whose raw text a run saves one sentence per line) no text may hold a line feed."""
        if split not in dataset:
            raise DataError(f"{self.name} has no split {split!r}: available {sorted(dataset)}")
        rows = dataset[split]
        for lang in (self.src_lang, self.tgt_lang):
            self._check_column(rows, lang, split)
        translation, where = "translation" in rows.column_names, f"of split {split!r} of {self.name}"
        start = 0
        for batch in rows.iter(batch_size=chunk_lines):
            if translation:
                pairs = batch["translation"]
                self._check_mappings(pairs, where, start)
                src = [pair.get(self.src_lang) if pair else None for pair in pairs]
                tgt = [pair.get(self.tgt_lang) if pair else None for pair in pairs]
            else:
                src, tgt = list(batch[self.src_lang]), list(batch[self.tgt_lang])
            for lang, side in ((self.src_lang, src), (self.tgt_lang, tgt)):
                self._check_texts(side, f"{where} has {lang}", start, one_line)
            start += len(src)
            yield src, tgt

    def _check_mappings(self, pairs: list[Any], where: str, start: int) -> None:
        """Every value of a `translation` column (rows `start`...) is a mapping (or null, refused later)."""
        bad = next((k for k, pair in enumerate(pairs) if not isinstance(pair, dict | None)), None)
        if bad is not None:
            src, tgt = self.src_lang, self.tgt_lang
            raise DataError(
                f"row {start + bad} {where} has translation={pairs[bad]!r}, not a mapping of each language "
                f"to its text ({{{src!r}: ..., {tgt!r}: ...}}): store the pairs so, or as {src!r} and "
                f"{tgt!r} columns without a 'translation' column, and save the dataset again"
            )

    @staticmethod
    def _check_texts(side: list[Any], where: str, start: int, one_line: bool) -> None:
        """Every value of `side` (rows `start`...) is text, and with `one_line` without a line feed."""
        bad = next((k for k, text in enumerate(side) if not isinstance(text, str)), None)
        if bad is not None:
            raise DataError(f"row {start + bad} {where}={side[bad]!r}, not text: drop or fill such rows "
                            "(Dataset.filter) and save the dataset again")  # fmt: skip
        bad = next((k for k, text in enumerate(side) if "\n" in text), None) if one_line else None
        if bad is not None:
            raise DataError(
                f"row {start + bad} {where}={side[bad]!r}, a line break inside one sentence: a run saves an "
                "evaluation set's sources, references and hypotheses one sentence per line, and these files "
                "would not line up. Replace the line breaks (Dataset.map) and save the dataset again"
            )

    def readers(self) -> dict[str, Reader]:
        dataset = self._dataset()
        return {
            name: functools.partial(self._read, dataset, split, one_line=name != "train")
            for name, split in self._wanted().items()
        }

    def test_split_names(self) -> list[str]:
        return list(self.test_splits)

    def _wanted(self) -> dict[str, str]:
        """Split name here -> the dataset's split it is read from."""
        return {"train": self.train_split, "val": self.valid_split, **{s: s for s in self.test_splits}}

    def fingerprint_inputs(self) -> list[Any]:
        dataset = self._dataset()
        fingerprints = {s: d._fingerprint for s, d in dataset.items()}
        # Which dataset split serves which of ours is part of the key: `valid_split=test` reads other text.
        return [self.name, self.config, self.data_files, fingerprints, self._wanted()]
