"""Preparing a corpus: normalise, train the tokenizer(s), encode, filter, and cache it all on disk.

The prepared data lives in `<cache>/prepared/<key>/`, where the key hashes the raw files' content and
every preprocessing setting: a changed file or setting builds anew, an unchanged one is loaded without
rebuilding anything. The directory is built in a temporary place and renamed into position (nothing
half-written is ever visible), under a lock, so concurrent DDP ranks or sweep jobs build it once.

Format: each split's examples are flat token arrays, per side (`src`, `tgt`) two `.npy` files (the format
`np.save` writes): `{split}.{side}.ids.npy`, the ids of every example end to end in the narrowest unsigned
dtype the side's vocabulary allows (`id_dtype`: uint16 up to 65,536 ids, else uint32), and
`{split}.{side}.offsets.npy`, int64 (examples + 1,): example i is `ids[offsets[i]:offsets[i + 1]]`.
Sources end in eos, targets are bare. They are opened with `np.load(mmap_mode="r")`, so an example is read
from the page cache when it is asked for and every process (DDP ranks, DataLoader workers) shares those
pages: a WMT14-sized corpus (4.5M pairs, ~140M subwords a side) costs a process little memory of its own.
`{split}.raw.json` keeps the raw lines of every split but `train` (the references and sources that
scoring and decoding read); training never reads raw text, so the training split's is not kept.

Building holds no Python lists of the training split: it is read as a stream of aligned chunks
(`CorpusData.readers`: files block by block, a Hugging Face dataset batch by batch), encoded `ENCODE_LINES`
lines at a time (by `ENCODE_THREADS` threads, while the next chunk is read and the ones before written)
and appended to the arrays. The tokenizer trainer reads the stream once per language (a
`tokenizers` trainer keeps only word counts), or, with `tokenizer_sample`, a seeded uniform sample of
that many pairs drawn in one pass (`sample_pairs`), which is all that is held (SentencePiece keeps its
training sentences: sample at WMT scale). With a tokenizer file (`tokenizer_path`) nothing is trained.
The validation and test splits are read whole, first (their errors come before any training).

`checksums.json` records the key the directory was built under (its name, checked on each load: files that
check out under another name are another corpus's, copied or renamed there) and the size of every other file
of the directory when it is built and its SHA-256, except for an array over `FULL_HASH_BYTES` (64 MiB): of
that, the SHA-256 of its first and of its last MiB (`EDGE_BYTES`). Each load checks every file it opens
against it, each array's `.npy` header (1-D, the dtype its vocabulary gives, as many bytes as the header
announces) and that each offsets array spans its ids. Why not hash everything: SHA-256 runs at ~1.7 GB/s on a
core with SHA extensions (measured; several times slower without), so hashing the arrays of a 1.2 GB corpus
took 0.8-1.3 s with the files in the page cache and, uncached, takes as long as reading all of it from disk,
in every DDP rank, where training touches pages only as it needs them. Sizes, headers and both ends catch a
file cut short, extended or overwritten at either end and a broken header; a flipped bit deep inside a large
array is not caught. Opening a 1.2 GB prepared corpus (uint32 ids, 140M a side, 4.5M examples, so its 36 MB
offsets arrays are hashed whole) took 0.09 s. A directory with a file missing, cut short or changed, or
without a readable `checksums.json` (one built before checksums were recorded included), or one recording a
key other than its name (built before keys were recorded included), is rebuilt, with a warning naming it; so
is one whose arrays disagree, and one whose raw validation or test text holds a line break inside a sentence
(`data=hf` data prepared before such text was refused: its rebuild refuses it, naming the row).
"""

from __future__ import annotations

import collections
import errno
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from attnlab.data.cache import FILE_HASHES, building, file_sha256, fingerprint
from attnlab.data.corpora import CorpusData, Reader, Text, read_whole
from attnlab.data.download import DataError, make_cache_dir
from attnlab.data.tokenizer import UNK_ID, SubwordTokenizer, VocabSizeError, flat_ids, load_tokenizer_file

log = logging.getLogger(__name__)

PREPARE_VERSION = 3  # bump when the prepared format or the preprocessing changes
CHECKSUMS = "checksums.json"  # size and SHA-256 (of all, or of both ends) of every other file
FULL_HASH_BYTES = 64 << 20  # arrays up to this size are hashed whole on every load, larger ones at the ends
EDGE_BYTES = 1 << 20  # the bytes hashed at each end of a larger file
ENCODE_LINES = 10_000  # lines encoded at a time while building
ENCODE_THREADS = 2  # chunks encoded at once (500k pairs: encoding took 66 s in one thread, 53 s with two)
SIDES = ("src", "tgt")
FILTERS = ("source_too_long", "target_too_long", "length_ratio")  # why a training pair is dropped
# A training line with a run of more characters than this without white space is warned of when a bpe or
# unigram tokenizer is trained: the `tokenizers` trainers take time growing with the square of a word's
# length (BPE, measured: 10k characters 0.03 s, 100k 1.9 s, 1M 283 s), and such a run is damaged text.
LONG_WORD = 10_000


class DamagedPreparedData(DataError):
    """A prepared directory's file is missing or differs from what `checksums.json` recorded."""


def id_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype holding the ids `0 .. vocab_size - 1`: uint16 up to 65,536 ids."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths, dtype=np.int64)])


@dataclass(frozen=True, eq=False)
class EncodedSplit:
    """One split as flat arrays: example i's source ids (eos included) are
    `src_ids[src_offsets[i] : src_offsets[i + 1]]`, its target ids (bare) likewise in `tgt_ids`.

    Loaded from a prepared directory, the four arrays are read-only `np.memmap`s (see the module's
    docstring); pickled (to a spawned worker), such an array travels as its file name and is mapped
    again, never copied. `raw_src`/`raw_tgt` are the raw lines, None for `train` (not kept).
    """

    src_ids: np.ndarray  # (source tokens,)
    src_offsets: np.ndarray  # (examples + 1,) int64
    tgt_ids: np.ndarray  # (target tokens,)
    tgt_offsets: np.ndarray  # (examples + 1,) int64
    raw_src: list[str] | None = None
    raw_tgt: list[str] | None = None
    _views: tuple[np.ndarray, ...] = field(init=False, repr=False)  # see __post_init__

    def __post_init__(self) -> None:
        # Plain ndarray views of the same memory for `pair`: indexing an np.memmap costs ~4x more.
        views = tuple(np.asarray(a) for a in (self.src_offsets, self.src_ids, self.tgt_offsets, self.tgt_ids))
        object.__setattr__(self, "_views", views)

    @classmethod
    def from_pairs(
        cls, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], vocab_size: int
    ) -> EncodedSplit:
        """An in-memory split of (source ids, target ids) pairs, ids below `vocab_size`."""
        dtype = id_dtype(vocab_size)
        (src, src_lengths), (tgt, tgt_lengths) = (flat_ids([p[k] for p in pairs], dtype) for k in (0, 1))
        return cls(src, _offsets(src_lengths), tgt, _offsets(tgt_lengths))

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @property
    def src_lengths(self) -> np.ndarray:
        """Ids per source, eos included: (examples,) int64."""
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        """Ids per target: (examples,) int64."""
        return np.diff(self.tgt_offsets)

    def pair(self, i: int) -> tuple[list[int], list[int]]:
        """Example `i` (0 <= i < len(self)) as (source ids, target ids)."""
        if not 0 <= i < len(self):
            raise IndexError(f"example {i} of a split of {len(self)}")
        src_offsets, src_ids, tgt_offsets, tgt_ids = self._views
        (a, b), (c, d) = src_offsets[i : i + 2].tolist(), tgt_offsets[i : i + 2].tolist()
        return src_ids[a:b].tolist(), tgt_ids[c:d].tolist()

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Examples `rows` ((B,) ints, each 0 <= i < len(self)) at once: (sources (B, S), source lengths,
        targets (B, T), target lengths), the matrices int64 and holding each example's ids left-aligned
        and 0 beyond its length (S, T: the longest). Vectorised: no Python step per example."""
        src_offsets, src_ids, tgt_offsets, tgt_ids = self._views
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and not (rows.min() >= 0 and rows.max() < len(self)):
            raise IndexError(f"examples {rows.min()}..{rows.max()} of a split of {len(self)}")
        return (*_rows(src_ids, src_offsets, rows), *_rows(tgt_ids, tgt_offsets, rows))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EncodedSplit):
            return NotImplemented
        arrays = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
        return all(np.array_equal(getattr(self, a), getattr(other, a)) for a in arrays) and (
            (self.raw_src, self.raw_tgt) == (other.raw_src, other.raw_tgt)
        )

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict[str, Any]:
        state = ((k, v) for k, v in self.__dict__.items() if k != "_views")
        return {k: _Mapped(str(v.filename)) if isinstance(v, np.memmap) else v for k, v in state}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(
            {k: np.load(v.path, mmap_mode="r") if isinstance(v, _Mapped) else v for k, v in state.items()}
        )
        self.__post_init__()


def _rows(ids: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows `rows` of the flat (`ids`, `offsets`) examples as a (B, L) int64 matrix, 0 beyond each row's
    length, and the lengths (B,)."""
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    positions = np.arange(int(lengths.max()) if len(rows) else 0)
    inside = positions < lengths[:, None]  # (B, L)
    taken = ids[np.where(inside, starts[:, None] + positions, 0)] if len(ids) else np.zeros(inside.shape)
    return np.where(inside, taken, 0).astype(np.int64), lengths


@dataclass(frozen=True)
class _Mapped:
    """A memory-mapped array in a pickle: the file to map again."""

    path: str


@dataclass
class Prepared:
    """A prepared corpus: tokenizers, encoded splits and the statistics of building it."""

    src_tokenizer: SubwordTokenizer
    tgt_tokenizer: SubwordTokenizer
    splits: dict[str, EncodedSplit]
    stats: dict[str, Any] = field(default_factory=dict)
    key: str | None = None  # the cache key: a hash of the raw files and the preprocessing settings


def _training_filter(spec: CorpusData, src: np.ndarray, tgt: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Which training pairs the length filters keep, and how many each filter of `FILTERS` drops (a pair
    counted by the first it fails), from the source lengths (eos included) and bare target lengths."""
    tgt_out = tgt + 1
    fails = [src > spec.max_source_tokens, tgt_out > spec.max_target_tokens]
    if spec.max_length_ratio is not None:
        fails.append(np.maximum(src, tgt_out) > spec.max_length_ratio * np.minimum(src, tgt_out))
    keep, counts = np.ones(len(src), bool), [0] * len(FILTERS)
    for k, fail in enumerate(fails):
        counts[k] = int((fail & keep).sum())
        keep &= ~fail
    return keep, counts


class _ArrayWriter:
    """Writes a 1-D `.npy` file (byte for byte what `np.save` writes) chunk by chunk: the header is
    written first for no entries and rewritten with the final length by `close` (its length does not
    change: numpy pads it for that)."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype, self.count = path, np.dtype(dtype), 0
        self.file: IO[bytes] = open(path, "wb")  # noqa: SIM115 (closed by `close`)
        self.header = self._header()

    def _header(self) -> int:
        descr = np.lib.format.dtype_to_descr(self.dtype)
        np.lib.format.write_array_header_1_0(
            self.file, {"descr": descr, "fortran_order": False, "shape": (self.count,)}
        )
        return self.file.tell()

    def append(self, values: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(values, dtype=self.dtype).data)
        self.count += len(values)

    def close(self) -> None:
        self.file.seek(0)
        if self._header() != self.header:
            raise RuntimeError(f"the .npy header of {self.path} changed length")
        self.file.close()


class _SplitWriter:
    """The four arrays of one split being built (see the module's docstring), appended chunk by chunk."""

    def __init__(self, out: Path, name: str, dtypes: dict[str, np.dtype]) -> None:
        self.files = {
            side: (_ArrayWriter(out / f"{name}.{side}.ids.npy", dtypes[side]),
                   _ArrayWriter(out / f"{name}.{side}.offsets.npy", np.dtype(np.int64)))
            for side in SIDES
        }  # fmt: skip
        for _, offsets in self.files.values():
            offsets.append(np.zeros(1, np.int64))
        self.examples = 0
        self.unknown = dict.fromkeys(SIDES, 0)  # ids written that are the unknown id, per side

    def append_flat(self, side: str, flat: np.ndarray, lengths: np.ndarray) -> None:
        """Examples of `side` given end to end (`flat`) with their `lengths`."""
        ids, offsets = self.files[side]
        offsets.append(ids.count + np.cumsum(lengths))
        ids.append(flat)
        self.unknown[side] += int(np.count_nonzero(flat == UNK_ID))
        self.examples = offsets.count - 1

    def close(self) -> None:
        for ids, offsets in self.files.values():
            ids.close()
            offsets.close()

    def discard(self) -> None:
        """Close the files without finishing them (building failed: its directory is deleted)."""
        for writers in self.files.values():
            for writer in writers:
                writer.file.close()


def _chunks(src: Sequence[str], tgt: Sequence[str]) -> Iterator[tuple[Sequence[str], Sequence[str]]]:
    for start in range(0, len(src), ENCODE_LINES):
        yield src[start : start + ENCODE_LINES], tgt[start : start + ENCODE_LINES]


class _TrainingPairs:
    """The training split's pairs with both sides non-empty once normalised, streamed chunk by chunk
    anew on each iteration; `lines` and `pairs` count what the last complete pass read and kept."""

    def __init__(self, read: Reader, spec: CorpusData) -> None:
        self.read, self.spec, self.lines, self.pairs = read, spec, 0, 0
        self.watch_words = False  # warn (once) of a line with a word over `LONG_WORD` characters

    def __iter__(self) -> Iterator[Text]:
        lines = pairs = 0
        for src, tgt in self.read(ENCODE_LINES):
            if self.watch_words:
                self._check_words(lines, src, tgt)
            # `normalize(line)` is empty exactly when `line.strip()` is (NFC maps no other character to
            # or from white space; tests/unit/test_tokenizer.py checks every code point): no NFC here.
            # `line.strip()` is empty exactly when the line is or `line.isspace()` (the same definition
            # of white space): first one check over the chunk in C, a Python step per pair only if needed.
            if all(src) and all(tgt) and not any(map(str.isspace, src)) and not any(map(str.isspace, tgt)):
                kept = src, tgt
            else:
                keep = [bool(s.strip() and t.strip()) for s, t in zip(src, tgt, strict=True)]
                kept = list(itertools.compress(src, keep)), list(itertools.compress(tgt, keep))
            lines, pairs = lines + len(src), pairs + len(kept[0])
            yield kept
        self.lines, self.pairs = lines, pairs

    def require_some(self) -> None:
        """Raise unless the split holds a non-empty pair (reading it only until the first one)."""
        if not any(src for src, _ in self):
            raise self.no_pairs()

    def _where(self) -> str:
        try:
            return "{} and {}".format(*self.spec.files()["train"])
        except NotImplementedError:  # not read from files (data=hf)
            return f"split {getattr(self.spec, 'train_split', '')!r} of {getattr(self.spec, 'name', '')}"

    def _check_words(self, before: int, src: list[str], tgt: list[str]) -> None:
        """Warn of the first line (after `before` lines) with a word over `LONG_WORD` characters, once."""
        for side, texts in (("source", src), ("target", tgt)):
            if max(map(len, texts), default=0) <= LONG_WORD:  # (one pass in C: the usual case)
                continue
            for k, text in enumerate(texts):
                longest = max(map(len, text.split()), default=0) if len(text) > LONG_WORD else 0
                if longest > LONG_WORD:
                    self.watch_words = False
                    log.warning(
                        "line %d of the training split (%s) has a %s with %d characters without white space: "
                        "a %s tokenizer trains in time growing with the square of a word's length (BPE: 1M "
                        "characters take minutes), and such a line is usually damaged (lines run together, "
                        "binary data). Fix or drop it, or use data.tokenizer=sentencepiece (which skips "
                        "sentences over 4192 bytes) or a tokenizer file (data.tokenizer_path)",
                        before + k + 1, self._where(), side, longest, self.spec.tokenizer,
                    )  # fmt: skip
                    return

    def no_pairs(self) -> DataError:
        """The error for a split without a pair whose sides both hold text, naming where it was read."""
        where = self._where()
        return DataError(
            f"the training split ({where}) has no non-empty sentence pairs ({self.lines} lines): every "
            "line is empty or white space on one side at least. Give the training text (data=files: "
            "data.dir and data.train; data=hf: data.name and data.train_split)"
        )

    def sides(self, *sides: int) -> _Lines:
        """The lines of `sides` (0 source, 1 target), one after the other."""
        return _Lines(self, sides)


class _Lines:
    """Lines of some sides of `_TrainingPairs`, streamed anew on each iteration (a trainer may read its
    text twice)."""

    def __init__(self, pairs: _TrainingPairs, sides: tuple[int, ...]) -> None:
        self.pairs, self.sides = pairs, sides

    def __iter__(self) -> Iterator[str]:
        for side in self.sides:
            for chunk in self.pairs:
                yield from chunk[side]


def sample_pairs(chunks: Iterable[Text], size: int, seed: int) -> tuple[Text, int]:
    """A uniform sample of `size` pairs of `chunks` (all of them when there are no more), in their order,
    and the number of pairs: reservoir sampling (Algorithm R) in one pass, holding `size` pairs. The
    sample depends on the pairs, `size` and `seed` only, not on how they are chunked (the slot of each
    pair past the first `size` is drawn from one stream of doubles, one per pair)."""
    rng = np.random.default_rng(seed)
    src_kept: list[str] = []
    tgt_kept: list[str] = []
    replaced: dict[int, int] = {}  # slot -> the pair index it holds, for slots not holding their own
    seen = 0
    for src, tgt in chunks:
        fill = min(len(src), max(size - seen, 0))
        src_kept += src[:fill]
        tgt_kept += tgt[:fill]
        if fill < len(src):
            index = np.arange(seen + fill, seen + len(src))  # index i replaces slot j ~ U{0..i} if j < size
            slots = np.minimum((rng.random(len(index)) * (index + 1)).astype(np.int64), index)
            replacing = np.flatnonzero(slots < size)
            for k, slot in zip(replacing.tolist(), slots[replacing].tolist(), strict=True):
                src_kept[slot], tgt_kept[slot] = src[fill + k], tgt[fill + k]
                replaced[slot] = seen + fill + k  # (one by one: a slot drawn twice holds the later pair)
        seen += len(src)
    positions = np.arange(len(src_kept))  # slot i was filled with pair i
    positions[list(replaced)] = list(replaced.values())
    order = np.argsort(positions, kind="stable").tolist()
    return ([src_kept[k] for k in order], [tgt_kept[k] for k in order]), seen


def _encode_split(
    tokenizers: tuple[SubwordTokenizer, SubwordTokenizer],
    chunks: Iterable[tuple[Sequence[str], Sequence[str]]],
    writer: _SplitWriter,
    training: CorpusData | None = None,
) -> dict[str, int]:
    """Encode the aligned `chunks` into `writer` (sources with eos); with `training` (the spec) drop the
    pairs its length filters refuse. Returns the counts dropped, by filter."""
    try:
        dropped = _encode_chunks(tokenizers, chunks, writer, training)
    except BaseException:
        writer.discard()
        raise
    writer.close()
    return dropped


def _encode_chunks(
    tokenizers: tuple[SubwordTokenizer, SubwordTokenizer],
    chunks: Iterable[tuple[Sequence[str], Sequence[str]]],
    writer: _SplitWriter,
    training: CorpusData | None,
) -> dict[str, int]:
    """See `_encode_split`. Two threads encode chunks (`ENCODE_THREADS`) while this one reads the next
    and filters and writes the ones before: the `tokenizers` encoder releases the GIL, so one thread's
    normalising (Python) overlaps with another's encoding (Rust) and with the reading and writing here.
    Chunks are written in order, so the arrays are the same as encoding one chunk after another gives
    (4.5M-pair corpora: see docs/benchmarks.md)."""
    src_tok, tgt_tok = tokenizers
    dropped = dict.fromkeys(FILTERS, 0)

    def encode(src_lines: Sequence[str], tgt_lines: Sequence[str]) -> dict[str, tuple[np.ndarray, ...]]:
        return {"src": src_tok.encode_flat(src_lines, eos=True), "tgt": tgt_tok.encode_flat(tgt_lines)}

    def write(sides: dict[str, tuple[np.ndarray, ...]]) -> None:
        nonlocal dropped
        if training is not None:
            keep, counts = _training_filter(training, sides["src"][1], sides["tgt"][1])
            dropped = {reason: dropped[reason] + n for reason, n in zip(FILTERS, counts, strict=True)}
            sides = {
                side: (ids[np.repeat(keep, lengths)], lengths[keep]) for side, (ids, lengths) in sides.items()
            }
        for side, (ids, lengths) in sides.items():
            writer.append_flat(side, ids, lengths)

    with ThreadPoolExecutor(max_workers=ENCODE_THREADS, thread_name_prefix="attnlab-encode") as pool:
        pending: collections.deque[Future] = collections.deque()
        try:
            for src_lines, tgt_lines in chunks:
                pending.append(pool.submit(encode, src_lines, tgt_lines))
                if len(pending) > ENCODE_THREADS:  # every thread busy: write the oldest
                    write(pending.popleft().result())
            while pending:
                write(pending.popleft().result())
        finally:
            for future in pending:  # a failure: nothing more to encode
                future.cancel()
    return dropped


def _tokenizers(
    spec: CorpusData, train: _TrainingPairs, stats: dict[str, Any]
) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """The tokenizers: loaded from the spec's files, or trained on the training pairs (all, or a sample of
    `tokenizer_sample`). Records in `stats` how many pairs a sample held (`tokenizer_pairs`; None when
    loaded; left to `_build` to count when trained on all)."""
    files = spec.tokenizer_files()
    if files is not None:
        stats["tokenizer_pairs"] = None
        src_tok = load_tokenizer_file(files[0], spec.tokenizer)
        return src_tok, src_tok if spec.joint_vocab else load_tokenizer_file(files[1], spec.tokenizer)
    settings = {"model": spec.tokenizer, "vocab_size": spec.vocab_size}
    train.watch_words = spec.tokenizer != "sentencepiece"
    if spec.tokenizer_sample is not None:
        (src, tgt), seen = sample_pairs(train, spec.tokenizer_sample, spec.seed)
        if not seen:
            raise train.no_pairs()
        log.info("training the tokenizer on a sample of %d of %d training pairs", len(src), seen)
        texts: tuple[Iterable[str], ...] = (src + tgt,) if spec.joint_vocab else (src, tgt)
        stats["tokenizer_pairs"] = len(src)
    else:
        train.require_some()
        texts = (train.sides(0, 1),) if spec.joint_vocab else (train.sides(0), train.sides(1))
    try:
        trained = [SubwordTokenizer.train(text, **settings) for text in texts]
    except VocabSizeError as exc:  # a data error (told without a traceback), naming the setting
        raise DataError(f"data.{exc}") from None
    return trained[0], trained[-1]


def _save_tokenizers(tokenizers: tuple[SubwordTokenizer, SubwordTokenizer], out: Path) -> None:
    src_tok, tgt_tok = tokenizers
    if src_tok is tgt_tok:
        src_tok.save(out / "tokenizer.json")
    else:
        src_tok.save(out / "src.tokenizer.json")
        tgt_tok.save(out / "tgt.tokenizer.json")


def _build(spec: CorpusData, readers: dict[str, Reader], out: Path, key: str) -> None:
    """Build the prepared data of `spec` into `out` from its split `readers` (`CorpusData.readers`), for
    the directory named `key` (`prepared_dir`), which `checksums.json` records."""
    started = time.perf_counter()
    held = {name: read_whole(read) for name, read in readers.items() if name != "train"}
    train = _TrainingPairs(readers["train"], spec)
    stats: dict[str, Any] = {}
    tokenizers = _tokenizers(spec, train, stats)
    _save_tokenizers(tokenizers, out)
    stats["tokenizer_seconds"] = round(time.perf_counter() - started, 3)
    dtypes = {side: id_dtype(tok.vocab_size) for side, tok in zip(SIDES, tokenizers, strict=True)}
    for name in readers:
        writer = _SplitWriter(out, name, dtypes)
        if name == "train":
            dropped = _encode_split(tokenizers, train, writer, training=spec)
            if not train.pairs:  # (checked before training a tokenizer; not before loading one)
                raise train.no_pairs()
            stats.update(train_lines=train.lines, dropped_empty=train.lines - train.pairs)
            stats["dropped_filter"] = {reason: n for reason, n in dropped.items() if n}
            stats["train_unknown_ids"] = writer.unknown  # (a tokenizer made for other text: see setup)
        else:
            _encode_split(tokenizers, _chunks(*held[name]), writer)
            (out / f"{name}.raw.json").write_text(
                json.dumps(dict(zip(SIDES, held[name], strict=True)), ensure_ascii=False)
            )
        stats[f"{name}_examples"] = writer.examples
    stats.setdefault("tokenizer_pairs", train.pairs)  # trained on every pair
    stats["build_seconds"] = round(time.perf_counter() - started, 3)
    log.info(
        "training pairs: %d lines, %d dropped as empty, dropped by the length filters: %s; kept %d",
        stats["train_lines"], stats["dropped_empty"], stats["dropped_filter"] or "none",
        stats["train_examples"],
    )  # fmt: skip
    stats["splits"] = list(readers)
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    files = {p.name: _recorded(p) for p in sorted(out.iterdir())}
    (out / CHECKSUMS).write_text(json.dumps({"key": key, "files": files}, indent=2))


def _edges(path: Path, size: int) -> tuple[str, str]:
    """The SHA-256 of the first and of the last `EDGE_BYTES` of the file at `path` (of `size` bytes)."""
    with open(path, "rb") as f:
        head = f.read(EDGE_BYTES)
        f.seek(max(size - EDGE_BYTES, 0))
        tail = f.read(EDGE_BYTES)
    return hashlib.sha256(head).hexdigest(), hashlib.sha256(tail).hexdigest()


def _recorded(path: Path) -> dict[str, Any]:
    """What `checksums.json` records of the file at `path`: the SHA-256 of an array over `FULL_HASH_BYTES`
    at both ends, that of any other file (read whole when loaded anyway) of all of it."""
    size = path.stat().st_size
    if path.suffix != ".npy" or size <= FULL_HASH_BYTES:
        return {"size": size, "sha256": file_sha256(path)}
    head, tail = _edges(path, size)
    return {"size": size, "head_sha256": head, "tail_sha256": tail}


def _well_formed(entry: Any) -> bool:
    hashes = ("sha256",) if "sha256" in entry else ("head_sha256", "tail_sha256")
    return isinstance(entry.get("size"), int) and all(isinstance(entry.get(h), str) for h in hashes)


class _Checked:
    """Reads the files of a prepared directory, each checked against its `checksums.json`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        try:
            recorded = json.loads((directory / CHECKSUMS).read_text())
            self.files, self.key = recorded["files"], recorded.get("key")
            if not all(_well_formed(entry) for entry in self.files.values()):
                raise TypeError("an entry without size and hashes")
        except FileNotFoundError:
            raise self.damaged(f"it has no {CHECKSUMS} (built by an older attnlab, or damaged)") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise self.damaged(f"its {CHECKSUMS} is unreadable ({type(exc).__name__}: {exc})") from None

    def damaged(self, reason: str) -> DamagedPreparedData:
        return DamagedPreparedData(f"the prepared data in {self.directory} is damaged: {reason}")

    def has(self, name: str) -> bool:
        return name in self.files

    def _expected(self, name: str) -> dict[str, Any]:
        expected = self.files.get(name)
        if expected is None:
            raise self.damaged(f"{name} is not listed in its {CHECKSUMS}")
        return expected

    def _check_size(self, name: str, size: int) -> None:
        if size != self.files[name]["size"]:
            raise self.damaged(f"{name} has {size} bytes, {self.files[name]['size']} were written")

    def _unreadable(self, name: str, exc: OSError) -> DamagedPreparedData:
        return self.damaged(f"{name} cannot be read ({exc.strerror or exc})")

    def read(self, name: str) -> bytes:
        """The bytes of file `name` (one hashed whole), as they were written."""
        expected = self._expected(name)
        try:
            data = (self.directory / name).read_bytes()
        except OSError as exc:
            raise self._unreadable(name, exc) from None
        self._check_size(name, len(data))
        if hashlib.sha256(data).hexdigest() != expected.get("sha256"):
            raise self.damaged(f"{name} differs from what was written (its SHA-256)")
        return data

    def array(self, name: str, dtype: np.dtype) -> np.memmap:
        """The 1-D `.npy` array `name` of `dtype`, memory-mapped read-only, checked as recorded."""
        expected, path = self._expected(name), self.directory / name
        if "sha256" in expected:
            self.read(name)
        else:
            try:
                size = path.stat().st_size
                self._check_size(name, size)
                edges = _edges(path, size)
            except OSError as exc:
                raise self._unreadable(name, exc) from None
            if edges != (expected["head_sha256"], expected["tail_sha256"]):
                raise self.damaged(
                    f"{name} differs from what was written (the SHA-256 of its first or last MiB)"
                )
        try:
            array = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise self.damaged(f"{name} is not a readable .npy array ({exc})") from None
        if array.ndim != 1 or array.dtype != dtype or array.offset + array.nbytes != expected["size"]:
            raise self.damaged(
                f"{name} holds a {array.dtype} array of shape {array.shape} from byte {array.offset}, not "
                f"the 1-D {dtype} array of its {expected['size']} bytes"
            )
        return array

    def split(self, name: str, examples: int, dtypes: dict[str, np.dtype]) -> EncodedSplit:
        """Split `name` of `examples` examples, its arrays checked to agree."""
        arrays = {}
        for side in SIDES:
            ids = self.array(f"{name}.{side}.ids.npy", dtypes[side])
            offsets = self.array(f"{name}.{side}.offsets.npy", np.dtype(np.int64))
            if len(offsets) != examples + 1 or offsets[0] != 0 or offsets[-1] != len(ids):
                raise self.damaged(
                    f"{name}.{side}.offsets.npy does not span the {len(ids)} ids of {name}.{side}.ids.npy "
                    f"in {examples} examples"
                )
            shortest = int(np.diff(offsets).min(initial=1))  # (reads the whole array: 36 MB for WMT14)
            if shortest < (1 if side == "src" else 0):  # a source holds eos at least
                raise self.damaged(
                    f"{name}.{side}.offsets.npy gives an example {shortest} ids: its offsets do not increase"
                )
            arrays[f"{side}_ids"], arrays[f"{side}_offsets"] = ids, offsets
        if name != "train":
            raw = json.loads(self.read(f"{name}.raw.json"))
            arrays["raw_src"], arrays["raw_tgt"] = raw["src"], raw["tgt"]
            lines = (enumerate(raw["src"]), enumerate(raw["tgt"]))
            broken = next((i for side in lines for i, line in side if "\n" in line), None)
            if broken is not None:  # (built before data=hf refused them: rebuilt, that refusal names the row)
                raise self.damaged(
                    f"{name}.raw.json holds a line break inside sentence {broken}, which a run saving the "
                    "set one sentence per line cannot keep aligned"
                )
        return EncodedSplit(**arrays)


def _load(directory: Path) -> Prepared:
    checked = _Checked(directory)
    if checked.key != directory.name:  # its files check out, but they are another corpus's (or settings')
        raise checked.damaged(
            f"its {CHECKSUMS} records the key {checked.key}, not its name (copied or renamed from another "
            "prepared directory, or built by an older attnlab): it holds other data than its key names"
        )
    stats = json.loads(checked.read("stats.json"))
    if checked.has("tokenizer.json"):
        src_tok = tgt_tok = SubwordTokenizer.from_json(checked.read("tokenizer.json").decode("utf-8"))
    else:
        src_tok = SubwordTokenizer.from_json(checked.read("src.tokenizer.json").decode("utf-8"))
        tgt_tok = SubwordTokenizer.from_json(checked.read("tgt.tokenizer.json").decode("utf-8"))
    dtypes = {"src": id_dtype(src_tok.vocab_size), "tgt": id_dtype(tgt_tok.vocab_size)}
    splits = {name: checked.split(name, stats[f"{name}_examples"], dtypes) for name in stats["splits"]}
    return Prepared(src_tok, tgt_tok, splits, stats, key=directory.name)


def _damage(directory: Path) -> str | None:
    """Why the prepared `directory` cannot be used as it is, or None when every file checks out."""
    try:
        _load(directory)
    except DamagedPreparedData as exc:
        return str(exc)
    return None


def prepared_dir(spec: CorpusData) -> Path:
    """Where `spec`'s prepared data lives (its key hashes file contents and preprocessing settings)."""
    memo = spec.cache_root() / FILE_HASHES  # the corpus is hashed once, not at every start
    key = fingerprint(PREPARE_VERSION, spec.preprocessing(), spec.fingerprint_inputs(), memo=memo)
    return spec.cache_root() / "prepared" / key


def _timed_load(target: Path) -> Prepared:
    started = time.perf_counter()
    prepared = _load(target)
    log.info("loaded prepared data from %s in %.2fs", target, time.perf_counter() - started)
    return prepared


def _check_unchanged(spec: CorpusData, target: Path) -> None:
    """Raise when the input files changed while `target` was being built from them: what was read would be
    kept under the key of their content before, and loaded as that content once it came back."""
    now = prepared_dir(spec)
    if now != target:
        raise DataError(
            f"the corpus changed while it was being prepared (its files gave the key {target.name} before "
            f"and {now.name} after); nothing was kept. Prepare it again once its files stay unchanged"
        )


def prepare(spec: CorpusData) -> Prepared:
    """Build (once, atomically, under a lock) or load the prepared corpus of `spec`; a damaged one (see
    the module's docstring) is rebuilt, with a warning naming it.

    Raises:
        DataError: A corpus or tokenizer file is missing or unusable (from `spec.readers`), or changed
            while it was read, or the directory is damaged again right after being rebuilt
            (`DamagedPreparedData`: check the disk); the disk is full or read-only, or the lock or the
            temporary directory beside the prepared directory cannot be made (a directory or a file
            without permission in its place).
    """
    target = prepared_dir(spec)
    recheck = None  # a directory another process builds while this one waits is new: not checked twice
    if target.exists() or target.is_symlink():  # (a file or a dangling link there: damage, rebuilt too)
        try:
            return _timed_load(target)
        except DamagedPreparedData as exc:  # rebuilt below, unless another process already did
            log.debug("%s", exc)
            recheck = _damage
    make_cache_dir(target.parent)
    try:
        with building(target, damaged=recheck) as tmp:
            if tmp is not None:
                log.info("preparing %s into %s", type(spec).__name__, target)
                _build(spec, spec.readers(), tmp, target.name)
                _check_unchanged(spec, target)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise DataError(
                f"cannot write the prepared data into {target.parent} ({exc.strerror}); nothing was kept. "
                "Free space there, or set data.cache_dir to a writable directory with room for it"
            ) from exc
        if exc.filename and Path(exc.filename).parent == target.parent:  # its lock, its temporary directory
            raise DataError(
                f"cannot use {exc.filename} in the cache ({exc.strerror}): something else is in its place; "
                "remove it, or set data.cache_dir to another directory"
            ) from exc
        raise
    return _timed_load(target)
