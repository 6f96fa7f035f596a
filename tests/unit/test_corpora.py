"""Real corpora: reading aligned files, preparing (tokenize, filter, cache) and serving them as batches."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import itertools
import json
import lzma
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnlab.data import corpora
from attnlab.data import prepare as prepare_module
from attnlab.data.corpora import FilesData, HFData, iter_parallel, read_lines
from attnlab.data.datamodule import CorpusDataModule
from attnlab.data.download import DataError
from attnlab.data.prepare import EncodedSplit, Prepared, id_dtype, prepare, prepared_dir, sample_pairs
from attnlab.data.text import normalize
from attnlab.data.tokenizer import SPECIAL_TOKENS, HuggingFaceTokenizer, SubwordTokenizer
from attnlab.runs.manifest import data_identity
from helpers import subprocess_path

PAD, BOS, EOS, UNK = 0, 1, 2, 3
DE_WORDS = "der die das ein eine Haus Hund Katze läuft schnell über Straße Mädchen spielt im Garten Fußball"
EN_WORDS = "the a dog cat runs quickly over street girl plays in garden football green trees bridge house"
DE, EN = DE_WORDS.split(), EN_WORDS.split()
SIZES = {"train": 200, "valid": 20, "test": 15, "test2": 10}
ODD_REFERENCE = "the  girl plays football "  # double space and trailing space: kept verbatim as a reference


def sentences(rng: random.Random, words: list[str], n: int) -> list[str]:
    """`n` lines of 2..12 random `words`."""
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) for _ in range(n)]


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def write_pair(root: Path, prefix: str, src: list[str], tgt: list[str]) -> None:
    write_lines(root / f"{prefix}.de", src)
    write_lines(root / f"{prefix}.en", tgt)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """train/valid/test/test2 `.de`/`.en` files of random sentences; test.en line 3 is `ODD_REFERENCE`."""
    root = tmp_path / "corpus"
    root.mkdir()
    rng = random.Random(0)
    for prefix, n in SIZES.items():
        src, tgt = sentences(rng, DE, n), sentences(rng, EN, n)
        if prefix == "test":
            tgt[3] = ODD_REFERENCE
        write_pair(root, prefix, src, tgt)
    return root


def files_spec(root: Path, tmp_path: Path, **overrides: Any) -> FilesData:
    settings: dict[str, Any] = {
        "dir": str(root),
        "test": ("test", "test2"),
        "src_lang": "de",
        "tgt_lang": "en",
        "tokenizer": "bpe",
        "vocab_size": 200,
        "max_tokens": 256,
        "cache_dir": str(tmp_path / "cache"),
    }
    return FilesData(**{**settings, **overrides})


def setup_datamodule(spec: FilesData | HFData) -> CorpusDataModule:
    dm = spec.datamodule()
    dm.setup()
    return dm


def pairs(split: EncodedSplit) -> list[tuple[list[int], list[int]]]:
    """Every example of `split` as (source ids, target ids)."""
    return [split.pair(i) for i in range(len(split))]


def encoded(prepared: Prepared, src: list[str], tgt: list[str]) -> list[tuple[list[int], list[int]]]:
    """`src` and `tgt` lines encoded one by one with the prepared tokenizers: sources end in eos."""
    sources = [[*prepared.src_tokenizer.encode(line), EOS] for line in src]
    return list(zip(sources, [prepared.tgt_tokenizer.encode(line) for line in tgt], strict=True))


def leftovers(directory: Path) -> list[str]:
    """Temporary build directories left in `directory`."""
    return [p.name for p in directory.iterdir() if ".building-" in p.name] if directory.is_dir() else []


@pytest.fixture
def train_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Counts `SubwordTokenizer.train` calls (their keyword arguments), still training for real."""
    real = SubwordTokenizer.train
    calls: list[dict[str, Any]] = []

    def counting(texts: Any, **kwargs: Any) -> SubwordTokenizer:
        calls.append(kwargs)
        return real(texts, **kwargs)

    monkeypatch.setattr(SubwordTokenizer, "train", counting)
    return calls


# ---------------------------------------------------------------------------------------------------------
# read_lines / read_parallel


@pytest.mark.parametrize("block_bytes", [corpora.BLOCK_BYTES, 1, 3])
def test_read_lines_splits_on_newline_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    monkeypatch.setattr(corpora, "BLOCK_BYTES", block_bytes)  # 1, 3: lines span many blocks
    path = tmp_path / "lines.txt"
    path.write_bytes("a\x1cb\nc\u2028d\r\ne\u0085f\rg\n\nlast".encode())
    assert read_lines(path) == ["a\x1cb", "c\u2028d", "e\u0085f\rg", "", "last"]
    path.write_bytes(b"one\r\ntwo\r\n")
    assert read_lines(path) == ["one", "two"]
    path.write_bytes(b"")
    assert read_lines(path) == []
    path.write_bytes(b"\n")
    assert read_lines(path) == [""]
    path.write_bytes("\ufeffeins\r\nzwei\r".encode())  # a byte-order mark is not text
    assert read_lines(path) == ["eins", "zwei"]


@pytest.mark.parametrize("block_bytes", [corpora.BLOCK_BYTES, 2, 5])
@pytest.mark.parametrize(
    ("data", "line", "reason"),
    [
        (b"gut\nsch\xc3\xb6n\nkaputt \xff hier\nok\n", 3, "invalid start byte"),
        (b"gut\nsch\xc3\xb6n\nabgeschnitten \xc3\nok\n", 3, "invalid continuation byte"),
        (b"gut\nsch\xc3\xb6n\nam Ende \xc3", 3, "unexpected end of data"),
        # after a byte-order mark, a bad byte right after a line feed: the line after it (it said line 2)
        (b"\xef\xbb\xbfgut\nsch\xc3\xb6n\n\xff hier\nok\n", 3, "invalid start byte"),
    ],
)
def test_read_lines_names_the_file_and_line_of_invalid_utf8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int, data: bytes, line: int, reason: str
) -> None:
    monkeypatch.setattr(corpora, "BLOCK_BYTES", block_bytes)
    path = tmp_path / "bad.de"
    path.write_bytes(data)
    expected = f"{path}:{line}: invalid UTF-8 ({reason}); re-encode the file as UTF-8"
    with pytest.raises(DataError, match=re.escape(expected) + "$"):
        read_lines(path)


def test_a_line_of_many_blocks_is_read_in_linear_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line longer than a block (a file without line feeds, a damaged one) is joined once when its end
    comes: adding each block to the ones before copied them again (32 MiB in 4 KiB blocks: 100 s, against
    0.1 s for the same bytes in lines of 100). A complexity check, not a speed claim: reading it is compared
    with reading those 335,544 short lines in the same process (about 1x now; quadratic: hundreds of x)."""
    monkeypatch.setattr(corpora, "BLOCK_BYTES", 4096)
    one, many = tmp_path / "one-line.txt", tmp_path / "short-lines.txt"
    one.write_bytes(b"x" * (32 << 20) + b"\nlast")
    many.write_bytes((b"x" * 99 + b"\n") * ((32 << 20) // 100) + b"last")

    def seconds(path: Path) -> float:
        started = time.perf_counter()
        read_lines(path)
        return time.perf_counter() - started

    assert [len(line) for line in read_lines(one)] == [32 << 20, 4]
    assert min(seconds(one) for _ in range(2)) < 10 * min(seconds(many) for _ in range(2))


def test_streamed_reading_equals_reading_whole_files(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`readers()` (what preparing reads the training split with) gives the lines `load` and `read_lines`
    give, in chunks of at most `chunk_lines` pairs, whatever the block size of the file reads."""
    spec = files_spec(corpus, tmp_path)
    whole = spec.load()
    assert list(whole) == ["train", "val", "test", "test2"]
    for name, prefix in (("train", "train"), ("val", "valid"), ("test2", "test2")):
        assert whole[name] == (read_lines(corpus / f"{prefix}.de"), read_lines(corpus / f"{prefix}.en"))
    for block_bytes, chunk_lines in ((corpora.BLOCK_BYTES, 1000), (64, 7), (5, 1)):
        monkeypatch.setattr(corpora, "BLOCK_BYTES", block_bytes)
        for name, read in spec.readers().items():
            chunks = list(read(chunk_lines))
            assert all(0 < len(src) == len(tgt) <= chunk_lines for src, tgt in chunks)
            assert len(chunks) == -(-SIZES["valid" if name == "val" else name] // chunk_lines)
            src, tgt = (list(itertools.chain.from_iterable(side)) for side in zip(*chunks, strict=True))
            assert (src, tgt) == whole[name]


def test_read_lines_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "missing.de"))):
        read_lines(tmp_path / "missing.de")


@contextlib.contextmanager
def ending_readers(fifo: Path) -> Iterator[None]:
    """While inside, whoever opens the named pipe `fifo` to read gets an empty stream at once (a writer
    connects and leaves), so that code wrongly reading it ends instead of waiting for a writer forever."""
    stop = threading.Event()

    def connect() -> None:
        while not stop.wait(0.02):
            with contextlib.suppress(OSError):  # (ENXIO while nobody reads)
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize("kind", ["directory", "named pipe"])
def test_a_data_file_that_is_a_directory_or_a_pipe_is_named_when_a_set_is_loaded_or_prepared(
    corpus: Path, tmp_path: Path, kind: str
) -> None:
    """attnlab-eval loads its sets without preparing the corpus: a test file that was a directory ended
    it with IsADirectoryError's traceback; training called it "not found". A named pipe (`<(zcat ...)`)
    made both wait for a writer forever, and would be read once at most (preparing hashes, then reads)."""
    (corpus / "test.de").unlink()
    if kind == "directory":
        (corpus / "test.de").mkdir()
        why = "Is a directory"
    else:
        os.mkfifo(corpus / "test.de")
        why = "a pipe, socket or device, not a regular file"
    named = f"data file {corpus.resolve() / 'test.de'} cannot be read ({why}): give a UTF-8 text"
    with ending_readers(corpus / "test.de"), pytest.raises(DataError, match=re.escape(named)):
        files_spec(corpus, tmp_path).load(["test"])
    with ending_readers(corpus / "test.de"), pytest.raises(DataError, match=re.escape(named)):
        prepare(files_spec(corpus, tmp_path))  # training: checked before anything is read


# What a user without read permission sees hashing a training file for the cache key and reading it; run in a
# child process, as `nobody` when this one is root (root reads any file), in a directory it can enter.
UNREADABLE_PROBE = """
import os, sys
from attnlab.data.corpora import FilesData
from attnlab.data.download import DataError
from attnlab.data.prepare import prepared_dir
if os.geteuid() == 0:
    os.setgid(65534)
    os.setuid(65534)
spec = FilesData(dir=sys.argv[1], cache_dir=sys.argv[2], test=("test",))
for call in (lambda: prepared_dir(spec), lambda: spec.load(["train"])):
    try:
        call()
    except DataError as exc:
        print(exc)
"""


def test_a_data_file_without_read_permission_is_named_when_prepared_or_loaded(corpus: Path) -> None:
    """Hashing a training file its user may not read, for the cache key, ended in PermissionError's
    traceback (reading its lines named it)."""
    with tempfile.TemporaryDirectory() as shared:
        data, cache = shutil.copytree(corpus, Path(shared) / "corpus"), Path(shared) / "cache"
        cache.mkdir()
        os.chmod(shared, 0o755), os.chmod(data, 0o755), os.chmod(cache, 0o777), os.chmod(data / "train.de", 0)
        env = {**os.environ, "PYTHONPATH": subprocess_path()}
        run = [sys.executable, "-c", UNREADABLE_PROBE, str(data), str(cache)]
        done = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    named = f"data file {data / 'train.de'} cannot be read (Permission denied): give a UTF-8 text file, one"
    assert done.stdout.splitlines() == [named + " sentence a line"] * 2, done.stdout + done.stderr[-2000:]


def test_prepare_names_a_missing_file(corpus: Path, tmp_path: Path) -> None:
    (corpus / "valid.en").unlink()
    with pytest.raises(DataError, match=re.escape(str(corpus.resolve() / "valid.en"))):
        prepare(files_spec(corpus, tmp_path))


def test_mismatched_line_counts_name_both_files_and_counts(corpus: Path, tmp_path: Path) -> None:
    rng = random.Random(1)
    write_pair(corpus, "train", sentences(rng, DE, 7), sentences(rng, EN, 5))
    spec = files_spec(corpus, tmp_path)
    src, tgt = corpus.resolve() / "train.de", corpus.resolve() / "train.en"
    for load in (spec.load, lambda: prepare(spec)):
        with pytest.raises(DataError) as info:
            load()
        message = str(info.value)
        assert f"{src} has 7 lines" in message and f"{tgt} has 5" in message


@pytest.mark.parametrize(
    ("src_lines", "tgt_lines"), [(25, 23), (20, 30), (30, 20), (0, 3), (12, 45), (45, 12)]
)
def test_misaligned_files_are_counted_whole_when_read_as_a_stream(
    tmp_path: Path, src_lines: int, tgt_lines: int
) -> None:
    """The counts named are the files' whole line counts, the longer file's lines after the chunk where
    the shorter one ended included (12 and 45: found in the second chunk of 10, 25 lines later unread)."""
    write_lines(tmp_path / "a.de", [f"zeile {i}" for i in range(src_lines)])
    write_lines(tmp_path / "a.en", [f"line {i}" for i in range(tgt_lines)])
    expected = (
        f"{tmp_path / 'a.de'} has {src_lines} lines but {tmp_path / 'a.en'} has {tgt_lines}: parallel files "
        "must be aligned line by line"
    )
    read = iter_parallel(tmp_path / "a.de", tmp_path / "a.en", 10)
    full_chunks = min(src_lines, tgt_lines) // 10  # those before the shorter file ends
    assert [len(src) for src, _ in itertools.islice(read, full_chunks)] == [10] * full_chunks
    with pytest.raises(DataError, match=re.escape(expected) + "$"):
        next(read)


def test_a_misaligned_training_split_past_the_first_chunk_fails_preparing(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found while the tokenizer trainer reads the stream (the trainer would swallow the error)."""
    monkeypatch.setattr(prepare_module, "ENCODE_LINES", 16)
    write_lines(corpus / "train.en", read_lines(corpus / "train.en")[:-3])
    for tokenizer in ("bpe", "sentencepiece"):
        spec = files_spec(corpus, tmp_path, tokenizer=tokenizer)
        with pytest.raises(DataError, match=re.escape(f"has {SIZES['train']} lines but ")):
            prepare(spec)
        assert not prepared_dir(spec).exists()


# ---------------------------------------------------------------------------------------------------------
# Preparation: empty lines and filters


def test_empty_training_pairs_are_dropped_and_counted(corpus: Path, tmp_path: Path) -> None:
    src, tgt = read_lines(corpus / "train.de"), read_lines(corpus / "train.en")
    src[:4], tgt[:4] = ["", "der Hund", "", " \t"], ["the dog", "   ", "", "a cat"]
    write_pair(corpus, "train", src, tgt)
    prepared = prepare(files_spec(corpus, tmp_path))
    assert prepared.stats["train_lines"] == 200
    assert prepared.stats["dropped_empty"] == 4
    train = prepared.splits["train"]
    assert len(train) == prepared.stats["train_examples"] == 196
    assert pairs(train) == encoded(prepared, src[4:], tgt[4:])
    assert all(len(s) > 1 and s[-1] == EOS and t for s, t in pairs(train))


@pytest.mark.parametrize("blank", ["", " ", "\u3000", "\x1c\x1f", "\x85 \u2028", "\t\x0b\x0c"])
def test_a_blank_side_drops_the_pair_whatever_white_space_it_holds(
    corpus: Path, tmp_path: Path, blank: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk with no blank side skips the per-pair check: the pairs dropped are still exactly those a
    side of which `normalize` leaves empty."""
    monkeypatch.setattr(prepare_module, "ENCODE_LINES", 16)  # chunks with and without a blank line
    src, tgt = read_lines(corpus / "train.de"), read_lines(corpus / "train.en")
    src[40], tgt[77], src[150] = blank, blank + "x", "x" + blank + "y"  # only line 40 is blank
    write_pair(corpus, "train", src, tgt)
    prepared = prepare(files_spec(corpus, tmp_path))
    kept = [k for k in range(len(src)) if normalize(src[k]) and normalize(tgt[k])]
    assert kept == [k for k in range(len(src)) if k != 40]
    assert prepared.stats["dropped_empty"] == 1
    expected = encoded(prepared, [src[k] for k in kept], [tgt[k] for k in kept])
    assert pairs(prepared.splits["train"]) == expected


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_chunks_encoded_by_threads_are_written_in_corpus_order(
    corpus: Path, tmp_path: Path, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prepare_module, "ENCODE_LINES", 7)  # 29 chunks of the 200 training pairs
    monkeypatch.setattr(prepare_module, "ENCODE_THREADS", threads)
    prepared = prepare(files_spec(corpus, tmp_path))
    src, tgt = read_lines(corpus / "train.de"), read_lines(corpus / "train.en")
    assert pairs(prepared.splits["train"]) == encoded(prepared, src, tgt)


def test_invalid_utf8_found_while_encoding_leaves_nothing_prepared(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a tokenizer file the encoding pass is the first to read the split: its error, at a chunk
    other threads are encoding around, ends preparing with the file and line and leaves no directory."""
    monkeypatch.setattr(prepare_module, "ENCODE_LINES", 16)
    path = trained_tokenizer_file(corpus, tmp_path, "mine.json")
    lines = (corpus / "train.en").read_bytes().split(b"\n")
    lines[150] = b"caf\xe9"
    (corpus / "train.en").write_bytes(b"\n".join(lines))
    spec = files_spec(corpus, tmp_path, tokenizer_path=str(path))
    with pytest.raises(DataError, match=re.escape("train.en:151: invalid UTF-8")):
        prepare(spec)
    assert not prepared_dir(spec).exists() and not leftovers(prepared_dir(spec).parent)


def test_validation_and_test_sets_keep_every_line(corpus: Path, tmp_path: Path) -> None:
    """Empty lines and lines the length filters drop from training alike stay in evaluation sets."""
    src, tgt = read_lines(corpus / "test.de"), read_lines(corpus / "test.en")
    src[2], tgt[4] = "", ""
    write_pair(corpus, "test", src, tgt)
    val_src = read_lines(corpus / "valid.de")
    val_src[0] = "  \t "
    write_lines(corpus / "valid.de", val_src)
    prepared = prepare(files_spec(corpus, tmp_path, max_source_tokens=6, max_length_ratio=1.5))
    assert prepared.stats["dropped_filter"].keys() == {"source_too_long", "length_ratio"}  # (training pairs)
    test, val = prepared.splits["test"], prepared.splits["val"]
    assert len(test) == SIZES["test"] and len(val) == SIZES["valid"]
    assert test.pair(2)[0] == [EOS] and test.pair(4)[1] == [] and val.pair(0)[0] == [EOS]
    assert test.raw_src == src and test.raw_tgt == tgt and val.raw_src == val_src
    assert pairs(test) == encoded(prepared, src, tgt)
    assert all(s[-1] == EOS and EOS not in s[:-1] for s, _ in pairs(test))


@dataclasses.dataclass(frozen=True)
class EditedWhileRead(FilesData):
    """A corpus whose validation references are rewritten once the cache key was made from them, before
    they are read (a preprocessing script or `git checkout` writing the files while preparation runs)."""

    def readers(self) -> dict[str, corpora.Reader]:
        write_lines(Path(str(self.dir)) / "valid.en", ["rewritten"] * SIZES["valid"])
        return super().readers()


def test_a_corpus_changed_while_being_prepared_is_not_kept_under_its_old_content(
    corpus: Path, tmp_path: Path
) -> None:
    """What was read sat under the key of the content before the change, and was loaded as that content
    once it came back (stale references)."""
    before = (corpus / "valid.en").read_bytes()
    spec = files_spec(corpus, tmp_path)
    target = prepared_dir(spec)
    edited = EditedWhileRead(**dataclasses.asdict(spec))
    message = f"the corpus changed while it was being prepared (its files gave the key {target.name} before"
    with pytest.raises(DataError, match=re.escape(message)):
        prepare(edited)
    assert not target.exists() and not leftovers(target.parent)
    (corpus / "valid.en").write_bytes(before)
    assert prepare(spec).splits["val"].raw_tgt == read_lines(corpus / "valid.en")


def test_an_all_empty_training_corpus_is_an_error(corpus: Path, tmp_path: Path) -> None:
    """Naming the files and the settings that choose them (it said "the training split")."""
    write_pair(corpus, "train", ["", " ", "der Hund", ""], ["", "the dog", "\t", ""])
    spec = files_spec(corpus, tmp_path)
    named = f"the training split ({corpus / 'train.de'} and {corpus / 'train.en'}) has no non-empty sentence "
    with pytest.raises(DataError, match=re.escape(named) + r"pairs \(4 lines\).* data\.dir and data\.train"):
        prepare(spec)
    assert not prepared_dir(spec).exists()


def test_an_all_empty_hf_training_split_is_named(tmp_path: Path, hf_datasets: Any) -> None:
    splits = {name: hf_datasets.Dataset.from_dict(dict(zip(("de", "en"), hf_rows(name, n), strict=True)))
              for name, n in HF_SIZES.items()}  # fmt: skip
    splits["train"] = hf_datasets.Dataset.from_dict({"de": ["", "der Hund"], "en": ["the dog", " "]})
    hf_datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "hfds"))
    spec = hf_spec(str(tmp_path / "hfds"), tmp_path)
    named = f"the training split (split 'train' of {spec.name}) has no non-empty sentence pairs (2 lines)"
    with pytest.raises(DataError, match=re.escape(named) + r".*data\.name and data\.train_split\)$"):
        prepare(spec)


@pytest.mark.parametrize("tokenizer", ["bpe", "unigram", "sentencepiece"])
def test_a_vocab_size_below_the_alphabet_is_a_data_error_naming_the_setting(
    corpus: Path, tmp_path: Path, tokenizer: str
) -> None:
    """A data error (`attnlab-train` tells it without a traceback; a ValueError was shown as one), naming
    the data setting; nothing is prepared."""
    spec = files_spec(corpus, tmp_path, vocab_size=8, tokenizer=tokenizer)
    message = r"^data\.vocab_size=8 cannot hold the 4 special tokens plus the \d+ characters of the training "
    with pytest.raises(DataError, match=message + r"text \(.*\), \d+ in all: raise vocab_size$"):
        prepare(spec)
    assert not prepared_dir(spec).exists() and not leftovers(prepared_dir(spec).parent)


def test_a_training_line_with_a_huge_word_is_warned_of_once(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The `tokenizers` trainers take time growing with the square of a word's length (a damaged line of
    1M characters without a space: 283 s of BPE training, without a word said)."""
    src, tgt = read_lines(corpus / "train.de"), read_lines(corpus / "train.en")
    word = "x" * 10_001  # README, "Data": a run of more than 10,000 characters without white space
    tgt[6] = f"the {word} dog"
    write_pair(corpus, "train", src, tgt)
    expected = (
        f"line 7 of the training split ({corpus / 'train.de'} and {corpus / 'train.en'}) has a target with "
        f"{len(word)} characters without white space: a unigram tokenizer trains in time growing with the "
        "square of a word's length"
    )
    for tokenizer, warned in (("unigram", True), ("sentencepiece", False)):  # SentencePiece skips such lines
        caplog.clear()
        with caplog.at_level("WARNING"):
            prepare(files_spec(corpus, tmp_path, tokenizer=tokenizer, vocab_size=60))
        warnings = [r.getMessage() for r in caplog.records if "without white space" in r.getMessage()]
        assert len(warnings) == warned and all(w.startswith(expected) for w in warnings)
    tgt[6] = f"the {word[1:]} dog"  # not over the limit
    write_pair(corpus, "train", src, tgt)
    caplog.clear()
    with caplog.at_level("WARNING"):
        prepare(files_spec(corpus, tmp_path, tokenizer="bpe", vocab_size=60))
    assert "without white space" not in caplog.text


def lengths(prepared: Prepared, split: str, side: str) -> list[int]:
    """Ids per example as the filters count them: the line's subwords plus eos."""
    examples = pairs(prepared.splits[split])
    return [len(s) if side == "src" else len(t) + 1 for s, t in examples]


def same_tokenizers(one: Prepared, other: Prepared) -> bool:
    """Whether both were encoded alike (the filters do not change the tokenizers' training text)."""
    sides = ((one.src_tokenizer, other.src_tokenizer), (one.tgt_tokenizer, other.tgt_tokenizer))
    return all(a.to_json() == b.to_json() for a, b in sides)


@pytest.mark.parametrize(
    ("field", "side", "reason"),
    [("max_source_tokens", "src", "source_too_long"), ("max_target_tokens", "tgt", "target_too_long")],
)
def test_length_filter_drops_long_training_pairs_only(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, side: str, reason: str
) -> None:
    monkeypatch.setattr(prepare_module, "ENCODE_LINES", 16)  # filtered and counted chunk by chunk
    limit = 8
    unfiltered = prepare(files_spec(corpus, tmp_path))
    before = lengths(unfiltered, "train", side)
    expected = sum(n > limit for n in before)
    assert 0 < expected < len(before)

    prepared = prepare(files_spec(corpus, tmp_path, **{field: limit}))
    assert prepared.stats["dropped_filter"] == {reason: expected}
    assert prepared.stats["train_examples"] == len(before) - expected
    assert max(lengths(prepared, "train", side)) <= limit
    assert same_tokenizers(prepared, unfiltered)
    kept = [p for p, n in zip(pairs(unfiltered.splits["train"]), before, strict=True) if n <= limit]
    assert pairs(prepared.splits["train"]) == kept
    for split in ("val", "test", "test2"):
        assert len(prepared.splits[split]) == len(unfiltered.splits[split])
    assert max(lengths(prepared, "val", side)) > limit  # long validation pairs were kept


def test_length_ratio_filter_drops_unbalanced_training_pairs(corpus: Path, tmp_path: Path) -> None:
    ratio = 1.5
    unfiltered = prepare(files_spec(corpus, tmp_path))
    sizes = zip(lengths(unfiltered, "train", "src"), lengths(unfiltered, "train", "tgt"), strict=True)
    keep = [max(s, t) <= ratio * min(s, t) for s, t in sizes]
    assert 0 < keep.count(False) < len(keep)

    prepared = prepare(files_spec(corpus, tmp_path, max_length_ratio=ratio))
    assert prepared.stats["dropped_filter"] == {"length_ratio": keep.count(False)}
    assert same_tokenizers(prepared, unfiltered)
    kept = [p for p, ok in zip(pairs(unfiltered.splits["train"]), keep, strict=True) if ok]
    assert pairs(prepared.splits["train"]) == kept
    val = zip(lengths(prepared, "val", "src"), lengths(prepared, "val", "tgt"), strict=True)
    assert len(prepared.splits["val"]) == SIZES["valid"]
    assert any(max(s, t) > ratio * min(s, t) for s, t in val)  # unbalanced validation pairs were kept


def test_a_pair_failing_several_filters_is_counted_once_by_the_first(corpus: Path, tmp_path: Path) -> None:
    limit, ratio = 8, 1.5
    unfiltered = prepare(files_spec(corpus, tmp_path))
    sizes = list(zip(lengths(unfiltered, "train", "src"), lengths(unfiltered, "train", "tgt"), strict=True))
    too_long = [s > limit for s, _ in sizes]
    unbalanced = [max(s, t) > ratio * min(s, t) for s, t in sizes]
    assert any(a and b for a, b in zip(too_long, unbalanced, strict=True))  # pairs failing both

    prepared = prepare(files_spec(corpus, tmp_path, max_source_tokens=limit, max_length_ratio=ratio))
    counts = prepared.stats["dropped_filter"]
    assert counts == {
        "source_too_long": sum(too_long),
        "length_ratio": sum(b and not a for a, b in zip(too_long, unbalanced, strict=True)),
    }
    assert sum(counts.values()) == len(sizes) - prepared.stats["train_examples"]


# ---------------------------------------------------------------------------------------------------------
# The tokenizer's training text: every pair, a seeded sample, or a tokenizer file


@pytest.fixture
def train_texts(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The text of each `SubwordTokenizer.train` call, still training for real."""
    real = SubwordTokenizer.train
    texts: list[list[str]] = []

    def recording(text: Any, **kwargs: Any) -> SubwordTokenizer:
        texts.append(list(text))
        return real(text, **kwargs)

    monkeypatch.setattr(SubwordTokenizer, "train", recording)
    return texts


def nonempty_pairs(corpus: Path) -> tuple[list[str], list[str]]:
    src, tgt = read_lines(corpus / "train.de"), read_lines(corpus / "train.en")
    kept = [(s, t) for s, t in zip(src, tgt, strict=True) if normalize(s) and normalize(t)]
    return [s for s, _ in kept], [t for _, t in kept]


def chunked(src: list[str], tgt: list[str], size: int) -> Iterator[tuple[list[str], list[str]]]:
    for start in range(0, len(src), size):
        yield src[start : start + size], tgt[start : start + size]


def test_sample_pairs_is_a_seeded_subset_in_corpus_order_whatever_the_chunking() -> None:
    src, tgt = [f"s{i}" for i in range(500)], [f"t{i}" for i in range(500)]
    (sample_src, sample_tgt), seen = sample_pairs(chunked(src, tgt, 500), 60, seed=1)
    assert seen == 500 and len(sample_src) == 60 == len(set(sample_src))
    assert [s[1:] for s in sample_src] == [t[1:] for t in sample_tgt]  # pairs stay aligned
    assert sorted(sample_src, key=src.index) == sample_src and set(sample_src) <= set(src)
    for size in (1, 7, 59, 61, 1000):
        assert sample_pairs(chunked(src, tgt, size), 60, seed=1) == ((sample_src, sample_tgt), 500)
    assert sample_pairs(chunked(src, tgt, 7), 60, seed=2)[0][0] != sample_src
    assert sample_pairs(chunked(src, tgt, 7), 600, seed=2) == ((src, tgt), 500)  # fewer pairs than asked
    assert sample_pairs(iter([]), 5, seed=1) == (([], []), 0)


def test_sample_pairs_draws_every_pair_equally_often() -> None:
    n, size, draws = 20, 5, 4000
    src = [str(i) for i in range(n)]
    counts = Counter(s for seed in range(draws) for s in sample_pairs(chunked(src, src, 3), size, seed)[0][0])
    expected = draws * size / n  # 1000, standard deviation about 27
    assert all(abs(counts[s] - expected) < 110 for s in src), counts


def test_the_tokenizer_learns_from_every_nonempty_pair_by_default(
    corpus: Path, tmp_path: Path, train_texts: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prepare_module, "ENCODE_LINES", 16)  # streamed in chunks
    src, tgt = read_lines(corpus / "train.de"), read_lines(corpus / "train.en")
    src[5], tgt[9] = " ", ""
    write_pair(corpus, "train", src, tgt)
    prepared = prepare(files_spec(corpus, tmp_path))
    pairs_src, pairs_tgt = nonempty_pairs(corpus)
    assert train_texts == [pairs_src + pairs_tgt]  # sources, then targets: as from lists in memory
    assert prepared.stats["tokenizer_pairs"] == len(pairs_src) == 198
    train_texts.clear()
    prepare(files_spec(corpus, tmp_path, joint_vocab=False))
    assert train_texts == [pairs_src, pairs_tgt]


def test_tokenizer_sample_trains_on_a_seeded_sample_and_keys_the_cache(
    corpus: Path, tmp_path: Path, train_texts: list[list[str]]
) -> None:
    full = files_spec(corpus, tmp_path)
    sampled = files_spec(corpus, tmp_path, tokenizer_sample=50)
    prepared = prepare(sampled)
    (src, tgt), seen = sample_pairs([nonempty_pairs(corpus)], 50, seed=sampled.seed)
    assert seen == 200 and len(src) == 50
    assert train_texts == [src + tgt]
    assert prepared.stats["tokenizer_pairs"] == 50 and prepared.stats["train_examples"] == 200  # all encoded
    keys = {prepared_dir(spec) for spec in (full, sampled, files_spec(corpus, tmp_path, tokenizer_sample=60))}
    assert len(keys) == 3
    assert prepared_dir(files_spec(corpus, tmp_path, tokenizer_sample=50, seed=2)) != prepared_dir(sampled)
    assert prepared_dir(files_spec(corpus, tmp_path, seed=2)) == prepared_dir(full)  # unsampled: no seed
    train_texts.clear()
    prepare(files_spec(corpus, tmp_path, tokenizer_sample=50, seed=2, joint_vocab=False))
    (other_src, other_tgt), _ = sample_pairs([nonempty_pairs(corpus)], 50, seed=2)
    assert train_texts == [other_src, other_tgt] and other_src != src


def test_a_sample_of_every_pair_trains_the_same_tokenizer_as_no_sample(corpus: Path, tmp_path: Path) -> None:
    whole = prepare(files_spec(corpus, tmp_path))
    everything = prepare(files_spec(corpus, tmp_path, tokenizer_sample=10_000))
    assert everything.src_tokenizer.to_json() == whole.src_tokenizer.to_json()
    assert pairs(everything.splits["train"]) == pairs(whole.splits["train"])
    assert everything.key != whole.key


def test_an_all_empty_training_corpus_is_an_error_however_the_tokenizer_comes(
    corpus: Path, tmp_path: Path
) -> None:
    tokenizer = tmp_path / "tokenizer.json"
    prepare(files_spec(corpus, tmp_path)).src_tokenizer.save(tokenizer)
    write_pair(corpus, "train", ["", " ", "der Hund", ""], ["", "the dog", "\t", ""])
    cases = ({"tokenizer": "sentencepiece"}, {"tokenizer": "sentencepiece", "tokenizer_sample": 3},
             {"tokenizer_path": str(tokenizer)})  # fmt: skip
    for overrides in cases:
        spec = files_spec(corpus, tmp_path, **overrides)
        with pytest.raises(DataError, match=re.escape("no non-empty sentence pairs (4 lines)")):
            prepare(spec)
        assert not prepared_dir(spec).exists()


def trained_tokenizer_file(corpus: Path, tmp_path: Path, name: str, **settings: Any) -> Path:
    """A tokenizer trained on the corpus's training text, saved as `name` in `tmp_path`."""
    src, tgt = nonempty_pairs(corpus)
    path = tmp_path / name
    settings = {"model": "unigram", "vocab_size": 150, **settings}
    tokenizer = SubwordTokenizer.train(src + tgt, **settings)
    if settings["model"] == "sentencepiece":
        path.write_bytes(tokenizer.model)  # type: ignore[attr-defined]
    else:
        tokenizer.save(path)
    return path


def test_tokenizer_path_loads_a_tokenizer_instead_of_training_one(
    corpus: Path, tmp_path: Path, train_calls: list[dict[str, Any]]
) -> None:
    path = trained_tokenizer_file(corpus, tmp_path, "mine.json")
    train_calls.clear()
    spec = files_spec(corpus, tmp_path, tokenizer_path=str(path), vocab_size=5000)  # bpe, 5000: unused
    dm = setup_datamodule(spec)
    assert train_calls == []
    loaded = SubwordTokenizer.load(path)
    assert dm.src_tokenizer is dm.tgt_tokenizer and dm.src_tokenizer.to_json() == loaded.to_json()
    assert dm.src_vocab_size == dm.tgt_vocab_size == loaded.vocab_size <= 150  # the file's vocabulary
    src, tgt = read_lines(corpus / "test.de"), read_lines(corpus / "test.en")
    sources = [[*ids, EOS] for ids in loaded.encode_batch(src)]
    assert pairs(dm.prepared.splits["test"]) == list(zip(sources, loaded.encode_batch(tgt), strict=True))
    assert dm.prepared.stats["tokenizer_pairs"] is None

    # The cache key holds the file's content, not its path.
    moved = tmp_path / "elsewhere.json"
    shutil.copy(path, moved)
    assert prepared_dir(
        files_spec(corpus, tmp_path, tokenizer_path=str(moved), vocab_size=5000)
    ) == prepared_dir(spec)
    other = trained_tokenizer_file(corpus, tmp_path, "other.json", vocab_size=120)
    assert prepared_dir(
        files_spec(corpus, tmp_path, tokenizer_path=str(other), vocab_size=5000)
    ) != prepared_dir(spec)
    assert prepared_dir(files_spec(corpus, tmp_path, vocab_size=5000)) != prepared_dir(spec)


def test_a_tokenizer_file_made_for_other_text_is_warned_of_on_every_run(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tokenizer of another script encodes this corpus mostly as <unk>: the run was prepared and
    trained without a word. The corpus's own tokenizer gives no unknown ids, and no warning."""
    other = tmp_path / "greek"
    other.mkdir()
    write_pair(other, "train", *(sentences(random.Random(1), list("αβγδεζηθ"), 50) for _ in "de"))
    path = trained_tokenizer_file(other, tmp_path, "greek.json", vocab_size=30)
    for spec, warned in ((files_spec(corpus, tmp_path), False),
                         (files_spec(corpus, tmp_path, tokenizer_path=str(path)), True)):  # fmt: skip
        for _ in range(2):  # built, then loaded from the cache
            caplog.clear()
            with caplog.at_level("WARNING"):
                dm = setup_datamodule(spec)
            unknown = dm.stats["train_unknown_ids"]
            warnings = [r.getMessage() for r in caplog.records if "as the unknown id" in r.getMessage()]
            assert bool(warnings) == warned and (unknown["src"] > 0) == warned
            if warned:
                ids = len(dm.prepared.splits["train"].src_ids)
                share, count = f"{100 * unknown['src'] / ids:.1f}%", unknown["src"]
                assert warnings[0] == (
                    f"the tokenizer encodes {share} of the training source ids (de, {count} of {ids}) "
                    "as the unknown id: data.tokenizer_path (or src_/tgt_tokenizer_path) names a tokenizer "
                    "made for other text? Give one trained on this corpus, or null to train one"
                )
                assert len(warnings) == 2 and "training target ids (en" in warnings[1]


def test_the_unknown_id_warning_starts_above_one_percent_of_a_sides_ids(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """README, "Data": more than 1% of a side's training ids as <unk> is warned of. The corpus's own
    tokenizer, with a word of a letter it never saw added to `k` training sources (one <unk> each):
    60 of about 6,900 source ids (0.9%) pass without a word, 100 of about 6,950 (1.4%) are warned of."""
    path = trained_tokenizer_file(corpus, tmp_path, "own.json")
    src = read_lines(corpus / "train.de")
    for k, warned in ((60, False), (100, True)):
        changed = tmp_path / f"corpus{k}"
        shutil.copytree(corpus, changed)
        write_lines(changed / "train.de", [f"{line} жж" if i < k else line for i, line in enumerate(src)])
        caplog.clear()
        with caplog.at_level("WARNING"):
            dm = setup_datamodule(files_spec(changed, tmp_path, tokenizer_path=str(path)))
        share = dm.stats["train_unknown_ids"]["src"] / len(dm.prepared.splits["train"].src_ids)
        assert dm.stats["train_unknown_ids"] == {"src": k, "tgt": 0}
        assert (0.008 < share <= 0.01) if not warned else (0.01 < share < 0.02)
        warnings = [r.getMessage() for r in caplog.records if "as the unknown id" in r.getMessage()]
        assert len(warnings) == warned and all(f"training source ids (de, {k} of " in w for w in warnings)


def test_characters_only_outside_the_tokenizer_sample_are_warned_of_with_the_sample_as_the_fix(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A trained tokenizer (no tokenizer file) gives the unknown id to characters that only lines outside
    its training sample (`data.tokenizer_sample`) hold: here a letter added to every target line outside
    the sample, over 1% of the target ids. The warning counts the target side's ids and names the sample as
    the fix, and training the tokenizer on every pair (the fix) leaves no unknown id and no warning."""
    sampled = sample_pairs([([str(i) for i in range(200)], [""] * 200)], 50, seed=1)[0][0]
    tgt = read_lines(corpus / "train.en")
    outside = [i for i in range(200) if str(i) not in sampled]
    write_lines(corpus / "train.en", [f"{line} ж" if i in outside else line for i, line in enumerate(tgt)])
    for sample, unknown in ((50, len(outside)), (None, 0)):
        caplog.clear()
        with caplog.at_level("WARNING"):
            dm = setup_datamodule(files_spec(corpus, tmp_path, tokenizer_sample=sample))
        assert dm.stats["train_unknown_ids"] == {"src": 0, "tgt": unknown}
        warnings = [r.getMessage() for r in caplog.records if "as the unknown id" in r.getMessage()]
        if not unknown:
            assert warnings == []
            continue
        ids = len(dm.prepared.splits["train"].tgt_ids)
        assert len(dm.prepared.splits["train"].src_ids) != ids  # the target side's own count is named
        assert warnings == [
            f"the tokenizer encodes {100 * unknown / ids:.1f}% of the training target ids (en, {unknown} of "
            f"{ids}) as the unknown id: its characters are missing from the tokenizer's training text: raise "
            "data.tokenizer_sample (null: all pairs)"
        ]


def test_separate_tokenizer_files_and_a_sentencepiece_model(corpus: Path, tmp_path: Path) -> None:
    src_file = trained_tokenizer_file(corpus, tmp_path, "src.model", model="sentencepiece")
    tgt_file = trained_tokenizer_file(corpus, tmp_path, "tgt.model", model="sentencepiece", vocab_size=50)
    spec = files_spec(
        corpus, tmp_path, tokenizer="sentencepiece", joint_vocab=False,
        src_tokenizer_path=str(src_file), tgt_tokenizer_path=str(tgt_file),
    )  # fmt: skip
    prepared = prepare(spec)
    assert prepared.src_tokenizer.vocab_size > prepared.tgt_tokenizer.vocab_size == 50
    assert prepared.src_tokenizer.model == src_file.read_bytes()  # type: ignore[attr-defined]
    assert {"src.tokenizer.json", "tgt.tokenizer.json"} <= set(os.listdir(prepared_dir(spec)))
    again = prepare(spec)
    assert again.tgt_tokenizer.to_json() == prepared.tgt_tokenizer.to_json()
    assert again.tgt_tokenizer.model == tgt_file.read_bytes()  # type: ignore[attr-defined]
    other_tgt = trained_tokenizer_file(corpus, tmp_path, "other.model", model="sentencepiece", vocab_size=60)
    other = dataclasses.replace(spec, tgt_tokenizer_path=str(other_tgt))
    assert prepared_dir(other) != prepared_dir(spec)  # another target tokenizer: not the cached data
    assert prepare(other).tgt_tokenizer.vocab_size == 60


def test_a_tokenizer_file_breaking_the_contract_or_missing_fails_preparing_by_name(
    corpus: Path, tmp_path: Path
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    other = Tokenizer(models.BPE(unk_token="<unk>"))
    other.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=100, special_tokens=["<unk>", "<pad>"], show_progress=False)
    other.train_from_iterator(read_lines(corpus / "train.en"), trainer)
    path = tmp_path / "other.json"
    other.save(str(path))
    spec = files_spec(corpus, tmp_path, tokenizer_path=str(path))
    with pytest.raises(DataError, match=re.escape(f"{path}: tokenizer has '<pad>' at id 1, expected 0")):
        prepare(spec)
    assert not prepared_dir(spec).exists()
    missing = tmp_path / "missing.json"
    with pytest.raises(DataError, match=re.escape(f"tokenizer file {missing} cannot be read")):
        prepare(files_spec(corpus, tmp_path, tokenizer_path=str(missing)))


@pytest.mark.parametrize("joint_vocab", [True, False])
def test_sentencepiece_is_trained_prepared_and_loaded(
    corpus: Path, tmp_path: Path, joint_vocab: bool
) -> None:
    spec = files_spec(corpus, tmp_path, tokenizer="sentencepiece", joint_vocab=joint_vocab)
    built = prepare(spec)
    loaded = prepare(spec)
    for tokenizer, again in (
        (built.src_tokenizer, loaded.src_tokenizer),
        (built.tgt_tokenizer, loaded.tgt_tokenizer),
    ):
        assert json.loads(tokenizer.to_json())["attnlab_tokenizer"] == "sentencepiece"
        assert again.to_json() == tokenizer.to_json() and tokenizer.vocab_size <= 200
    assert (built.src_tokenizer is built.tgt_tokenizer) == joint_vocab
    src, tgt = read_lines(corpus / "train.de"), read_lines(corpus / "train.en")
    assert pairs(loaded.splits["train"]) == encoded(built, src, tgt)
    assert [built.src_tokenizer.decode(ids) for ids in built.src_tokenizer.encode_batch(src)] == [
        normalize(line) for line in src
    ]


# ---------------------------------------------------------------------------------------------------------
# FilesData validation


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"vocab_size": 4}, "vocab_size=4"),
        ({"src_lang": "en", "tgt_lang": "en"}, "src_lang='en'"),
        ({"max_tokens": None, "batch_size": None}, "max_tokens=null"),
        ({"test": []}, "test=[]"),
        ({"test": ("a/test", "b/test")}, "test=['a/test', 'b/test']"),
        ({"tokenizer": "wordpiece"}, "tokenizer='wordpiece'"),
        ({"max_source_tokens": 0}, "max_source_tokens=0"),
        ({"max_length_ratio": 0.0}, "max_length_ratio=0.0"),
        ({"max_length_ratio": 0.5}, "max_length_ratio=0.5 would drop every training pair"),
        ({"batch_size": 0}, "batch_size=0"),
        ({"tokenizer_sample": 0}, "tokenizer_sample=0 must be positive"),
        (
            {"joint_vocab": False, "tokenizer_path": "t.json"},
            "tokenizer_path=t.json is one tokenizer for both",
        ),
        ({"src_tokenizer_path": "s.json", "tgt_tokenizer_path": "t.json"}, "are for joint_vocab=false"),
        ({"joint_vocab": False, "src_tokenizer_path": "s.json"}, "tgt_tokenizer_path=None: set both"),
    ],
)
def test_files_data_rejects_bad_values(tmp_path: Path, overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        files_spec(tmp_path, tmp_path, **overrides)


def test_a_length_ratio_of_one_is_a_setting_not_refused(tmp_path: Path) -> None:
    """It keeps the pairs of equal length (the refusal says: at least 1)."""
    assert files_spec(tmp_path, tmp_path, max_length_ratio=1).max_length_ratio == 1


def test_load_reads_the_splits_asked_for_and_names_an_unknown_one(corpus: Path, tmp_path: Path) -> None:
    spec = files_spec(corpus, tmp_path)
    val = (read_lines(corpus / "valid.de"), read_lines(corpus / "valid.en"))
    assert spec.load(["val"]) == {"val": val}
    assert list(spec.load()) == ["train", "val", "test", "test2"]
    with pytest.raises(
        DataError, match="no split named 'valid' in this corpus: it has train, val, test, test2"
    ):
        spec.load(["valid"])


def test_files_data_maps_prefixes_to_language_files(tmp_path: Path) -> None:
    spec = files_spec(tmp_path, tmp_path, test=["test", "sub/test2"])
    root = tmp_path.resolve()
    assert spec.test == ("test", "sub/test2")
    assert spec.files() == {
        "train": (root / "train.de", root / "train.en"),
        "val": (root / "valid.de", root / "valid.en"),
        "test": (root / "test.de", root / "test.en"),
        "test2": (root / "sub" / "test2.de", root / "sub" / "test2.en"),
    }


@pytest.mark.parametrize("name", ["val", "train"])
def test_a_test_set_named_like_a_split_is_rejected(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match=rf"test=\['other/{name}'\] names a test set '{name}'"):
        files_spec(tmp_path, tmp_path, test=(f"other/{name}",))


# ---------------------------------------------------------------------------------------------------------
# The prepared-data cache


def test_a_second_prepare_loads_without_rebuilding(
    corpus: Path, tmp_path: Path, train_calls: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = files_spec(corpus, tmp_path)
    first = prepare(spec)
    assert train_calls == [{"model": "bpe", "vocab_size": 200}]

    def refuse(*args: Any, **kwargs: Any) -> SubwordTokenizer:
        raise AssertionError("the tokenizer was trained again although the prepared data is cached")

    monkeypatch.setattr("attnlab.data.tokenizer.SubwordTokenizer.train", refuse)
    again = files_spec(corpus, tmp_path)
    assert prepared_dir(again) == prepared_dir(spec)
    second = prepare(again)
    assert second.stats == first.stats
    assert second.src_tokenizer.tokenizer.get_vocab() == first.src_tokenizer.tokenizer.get_vocab()
    for name, split in first.splits.items():
        assert second.splits[name] == split


@pytest.mark.parametrize(
    "change",
    [
        {"vocab_size": 150},
        {"tokenizer": "unigram"},
        {"joint_vocab": False},
        {"max_source_tokens": 10},
        {"max_length_ratio": 2.0},
        {"src_lang": "en", "tgt_lang": "de"},
        "content",
        "PREPARE_VERSION",
    ],
)
def test_a_changed_setting_or_file_content_builds_anew(
    corpus: Path,
    tmp_path: Path,
    train_calls: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    change: dict[str, Any] | str,
) -> None:
    base = files_spec(corpus, tmp_path)
    prepare(base)
    old = prepared_dir(base)
    if change == "PREPARE_VERSION":  # bumped with a change of the prepared format: nothing older is read
        monkeypatch.setattr(prepare_module, "PREPARE_VERSION", prepare_module.PREPARE_VERSION + 1)
        spec = files_spec(corpus, tmp_path)
    elif change == "content":
        tgt = read_lines(corpus / "test2.en")
        write_lines(corpus / "test2.en", [tgt[0] + " green", *tgt[1:]])
        spec = files_spec(corpus, tmp_path)
    else:
        spec = files_spec(corpus, tmp_path, **change)
    assert prepared_dir(spec) != old
    train_calls.clear()
    prepared = prepare(spec)
    assert len(train_calls) >= 1
    assert prepared_dir(spec).is_dir() and old.is_dir()
    if change == "content":
        assert prepared.splits["test2"].raw_tgt[0].endswith(" green")


def test_a_test_set_of_the_same_text_under_another_name_is_prepared_under_that_name(
    corpus: Path, tmp_path: Path
) -> None:
    first = prepare(files_spec(corpus, tmp_path))
    for lang in ("de", "en"):
        shutil.copy(corpus / f"test2.{lang}", corpus / f"newstest.{lang}")
    renamed = prepare(files_spec(corpus, tmp_path, test=("test", "newstest")))
    assert list(renamed.splits) == ["train", "val", "test", "newstest"]
    assert renamed.splits["newstest"] == first.splits["test2"]


@pytest.mark.parametrize("change", [{"max_tokens": 64}, {"batch_size": 8}, {"seed": 7}, {"num_workers": 2}])
def test_batching_settings_share_the_prepared_data(
    corpus: Path, tmp_path: Path, change: dict[str, Any]
) -> None:
    assert prepared_dir(files_spec(corpus, tmp_path, **change)) == prepared_dir(files_spec(corpus, tmp_path))


def test_the_same_content_at_another_path_reuses_the_cache(
    corpus: Path, tmp_path: Path, train_calls: list[dict[str, Any]]
) -> None:
    first = prepare(files_spec(corpus, tmp_path))
    copy = shutil.copytree(corpus, tmp_path / "elsewhere" / "copy")
    by_dir = files_spec(copy, tmp_path)
    by_path = files_spec(
        copy,
        tmp_path,
        dir=None,
        train=str(copy / "train"),
        valid=str(copy / "valid"),
        test=(str(copy / "test"), str(copy / "test2")),
    )
    assert prepared_dir(by_dir) == prepared_dir(by_path) == prepared_dir(files_spec(corpus, tmp_path))
    train_calls.clear()
    assert prepare(by_path).splits == first.splits
    assert train_calls == []


def test_joint_vocab_writes_one_tokenizer_separate_vocabs_two(corpus: Path, tmp_path: Path) -> None:
    joint = prepare(files_spec(corpus, tmp_path))
    joint_files = set(os.listdir(prepared_dir(files_spec(corpus, tmp_path))))
    assert "tokenizer.json" in joint_files
    assert not {"src.tokenizer.json", "tgt.tokenizer.json"} & joint_files
    assert joint.src_tokenizer is joint.tgt_tokenizer

    spec = files_spec(corpus, tmp_path, joint_vocab=False)
    separate = prepare(spec)
    files = set(os.listdir(prepared_dir(spec)))
    assert {"src.tokenizer.json", "tgt.tokenizer.json"} <= files and "tokenizer.json" not in files
    src_vocab = separate.src_tokenizer.tokenizer.get_vocab()
    tgt_vocab = separate.tgt_tokenizer.tokenizer.get_vocab()
    assert src_vocab != tgt_vocab
    assert any("ß" in piece for piece in src_vocab) and not any("ß" in piece for piece in tgt_vocab)
    assert UNK not in separate.splits["train"].src_ids and UNK not in separate.splits["train"].tgt_ids


def test_building_leaves_no_temporary_directories(corpus: Path, tmp_path: Path) -> None:
    spec = files_spec(corpus, tmp_path)
    prepare(spec)
    target = prepared_dir(spec)
    assert sorted(os.listdir(target.parent)) == [target.name, target.name + ".lock"]


def test_a_failed_build_leaves_no_prepared_directory(corpus: Path, tmp_path: Path) -> None:
    write_lines(corpus / "test2.en", read_lines(corpus / "test2.en")[:-1])
    spec = files_spec(corpus, tmp_path)
    with pytest.raises(DataError, match=r"test2\.en has 9"):
        prepare(spec)
    target = prepared_dir(spec)
    assert not target.exists()
    assert leftovers(target.parent) == []
    write_lines(corpus / "test2.en", [*read_lines(corpus / "test2.en"), "the cat"])
    assert len(prepare(files_spec(corpus, tmp_path)).splits["test2"]) == SIZES["test2"]


# ---------------------------------------------------------------------------------------------------------
# The prepared format: flat, memory-mapped token arrays


@pytest.mark.parametrize("lines_per_chunk", [prepare_module.ENCODE_LINES, 7])
def test_every_split_is_stored_as_flat_arrays_of_its_encoding(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines_per_chunk: int
) -> None:
    monkeypatch.setattr(prepare_module, "ENCODE_LINES", lines_per_chunk)  # 7: many chunks a split
    spec = files_spec(corpus, tmp_path)
    prepared = prepare(spec)
    files = set(os.listdir(prepared_dir(spec)))
    for name, prefix in (("train", "train"), ("val", "valid"), ("test", "test"), ("test2", "test2")):
        src, tgt = read_lines(corpus / f"{prefix}.de"), read_lines(corpus / f"{prefix}.en")
        split = prepared.splits[name]
        assert pairs(split) == encoded(prepared, src, tgt)  # what the per-line encoding gives
        for side in ("src", "tgt"):
            ids = np.load(prepared_dir(spec) / f"{name}.{side}.ids.npy")
            offsets = np.load(prepared_dir(spec) / f"{name}.{side}.offsets.npy")
            assert ids.dtype == np.uint16 and offsets.dtype == np.int64 and len(offsets) == len(src) + 1
            rows = [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)]
            assert rows == [p[side == "tgt"] for p in pairs(split)]
        assert split.src_lengths.tolist() == [len(s) for s, _ in pairs(split)]
        assert split.tgt_lengths.tolist() == [len(t) for _, t in pairs(split)]
        if name == "train":  # training never reads raw text: none kept
            assert "train.raw.json" not in files and split.raw_src is None and split.raw_tgt is None
        else:
            assert f"{name}.raw.json" in files and (split.raw_src, split.raw_tgt) == (src, tgt)
    with pytest.raises(ValueError, match="raw text of split 'train' is not kept"):
        setup_datamodule(spec).raw_text("train")


def test_loaded_arrays_are_read_only_memory_maps_pickled_by_file_name(corpus: Path, tmp_path: Path) -> None:
    spec = files_spec(corpus, tmp_path)
    prepare(spec)  # built; the next one loads
    split = prepare(spec).splits["train"]
    arrays = (split.src_ids, split.src_offsets, split.tgt_ids, split.tgt_offsets)
    assert all(isinstance(a, np.memmap) and not a.flags.writeable for a in arrays)
    assert {Path(a.filename) for a in arrays} == {
        prepared_dir(spec) / f"train.{side}.{kind}.npy"
        for side in ("src", "tgt")
        for kind in ("ids", "offsets")
    }
    data = pickle.dumps(split)
    assert len(data) < 1000  # the file names, not the ids
    again = pickle.loads(data)
    assert all(
        isinstance(getattr(again, a), np.memmap) for a in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
    )
    assert again == split and pairs(again) == pairs(split)


def test_ids_take_the_narrowest_dtype_their_vocabulary_allows(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert [id_dtype(n) for n in (5, 65536, 65537, 10**6)] == [np.uint16, np.uint16, np.uint32, np.uint32]
    small = prepare(files_spec(corpus, tmp_path))
    assert {split.src_ids.dtype for split in small.splits.values()} == {np.dtype(np.uint16)}
    monkeypatch.setattr(HuggingFaceTokenizer, "vocab_size", property(lambda self: 70_000))  # as if that large
    large = prepare(files_spec(corpus, tmp_path / "large"))
    for name, split in large.splits.items():
        assert split.src_ids.dtype == split.tgt_ids.dtype == np.uint32
        assert pairs(split) == pairs(small.splits[name])


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int64])
@pytest.mark.parametrize("chunks", [[], [0], [3, 0, 5], [70_000]])
def test_arrays_written_chunk_by_chunk_are_what_np_save_writes(
    tmp_path: Path, dtype: type, chunks: list[int]
) -> None:
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 60_000, n).astype(dtype) for n in chunks]
    writer = prepare_module._ArrayWriter(tmp_path / "chunked.npy", np.dtype(dtype))
    for part in parts:
        writer.append(part)
    writer.close()
    np.save(tmp_path / "whole.npy", np.concatenate([np.zeros(0, dtype), *parts]))
    assert (tmp_path / "chunked.npy").read_bytes() == (tmp_path / "whole.npy").read_bytes()


def test_a_large_array_is_checked_by_size_header_and_both_ends_and_rebuilt(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(prepare_module, "FULL_HASH_BYTES", 1000)  # arrays over 1000 bytes count as large
    monkeypatch.setattr(prepare_module, "EDGE_BYTES", 64)
    spec = files_spec(corpus, tmp_path)
    first = pairs(prepare(spec).splits["train"])
    directory = prepared_dir(spec)
    recorded = json.loads((directory / "checksums.json").read_text())["files"]
    name = "train.src.ids.npy"
    path = directory / name
    size = path.stat().st_size
    assert size > 1000 + 2 * 64 and set(recorded[name]) == {"size", "head_sha256", "tail_sha256"}
    for other, entry in recorded.items():  # small arrays and all other files (read whole): hashed whole
        if not other.endswith(".npy") or entry["size"] <= 1000:
            assert set(entry) == {"size", "sha256"}, other
    assert recorded["tokenizer.json"]["size"] > 1000

    def flip(where: int) -> None:
        data = bytearray(path.read_bytes())
        data[where] ^= 0xFF
        path.unlink()  # a new file: the maps of earlier loads stay valid
        path.write_bytes(data)

    flip(size // 2)  # inside a large array: not seen (the price of a cheap check)
    assert pairs(prepare(spec).splits["train"]) != first
    for where in (size - 3, 20):  # in its last bytes; in its .npy header
        flip(where)
        reason = f"{name} differs from what was written (the SHA-256 of its first or last MiB)"
        assert_rebuilt(spec, reason, first, caplog)


def assert_rebuilt(spec: FilesData, reason: str, first: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    """Preparing `spec` again warns once that its prepared data is damaged (`reason`) and rebuilds the
    training pairs `first`."""
    caplog.clear()
    with caplog.at_level("WARNING"):
        again = prepare(spec)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"the prepared data in {prepared_dir(spec)} is damaged: {reason}; building it again"
    ]
    assert pairs(again.splits["train"]) == first


@pytest.mark.parametrize("kind", ["file", "dangling link", "link to a file"])
def test_a_non_directory_in_place_of_the_prepared_data_is_replaced(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """A file or a link where the prepared directory belongs is damage, rebuilt like any other (every run
    failed: a file was taken for prepared data that is never rebuilt, a dangling link failed the rename;
    a link's target is left alone)."""
    spec = files_spec(corpus, tmp_path)
    first = pairs(prepare(spec).splits["train"])
    target = prepared_dir(spec)
    shutil.rmtree(target)
    (tmp_path / "a-file").write_text("kept")
    if kind == "file":
        target.write_text("not a directory")
    else:
        target.symlink_to(tmp_path / ("a-file" if kind == "link to a file" else "gone"))
    reason = f"its checksums.json is unreadable (NotADirectoryError: [Errno 20] Not a directory: '{target}/"
    if kind == "dangling link":
        reason = "it has no checksums.json (built by an older attnlab, or damaged)"
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert pairs(prepare(spec).splits["train"]) == first
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"the prepared data in {target} is damaged: {reason}")
    assert target.is_dir() and not target.is_symlink() and not leftovers(target.parent)
    assert (tmp_path / "a-file").read_text() == "kept"


def test_prepared_data_copied_under_another_corpus_key_is_rebuilt_not_loaded(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A prepared directory copied (or renamed) to the key of another corpus passes every file check, yet
    holds the first corpus's text: its recorded key differs from its name, so it is rebuilt, with a
    warning, from the corpus the key names (it was loaded as that corpus)."""
    other = tmp_path / "other"
    shutil.copytree(corpus, other)
    write_lines(other / "valid.en", [f"another reference {i}" for i in range(SIZES["valid"])])
    source, spec = files_spec(corpus, tmp_path), files_spec(other, tmp_path)
    prepare(source)
    target = prepared_dir(spec)
    shutil.copytree(prepared_dir(source), target)
    caplog.clear()
    with caplog.at_level("WARNING"):
        loaded = prepare(spec)
    assert loaded.splits["val"].raw_tgt == read_lines(other / "valid.en")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        f"the prepared data in {target} is damaged: its checksums.json records the key "
        f"{prepared_dir(source).name}, not its name"
    )


def test_an_array_of_a_few_mib_is_hashed_whole_and_a_byte_changed_in_its_middle_rebuilds_it(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """README: every file up to 64 MiB is hashed in full (`FULL_HASH_BYTES`, not patched here), so a byte
    changed in the middle of a 2.8 MB array, beyond its first and last MiB, is found and the data rebuilt."""
    rng = np.random.default_rng(0)
    lines = 10_000
    for lang, words, length in (("de", DE, 140), ("en", EN, 3)):  # sources: 1.4M ids, 2.8 MB of uint16
        chosen = np.asarray(words)[rng.integers(len(words), size=(lines, length))]
        write_lines(corpus / f"train.{lang}", [" ".join(line) for line in chosen])
    spec = files_spec(corpus, tmp_path, max_source_tokens=1000, tokenizer_sample=500)
    first = pairs(prepare(spec).splits["train"])
    assert len(first) == lines
    name = "train.src.ids.npy"
    path = prepared_dir(spec) / name
    size = path.stat().st_size
    assert 2 * prepare_module.EDGE_BYTES + (512 << 10) < size <= 64 << 20

    data = bytearray(path.read_bytes())
    data[size // 2] ^= 0xFF  # an id 1.4 MB into the array: outside its first and last MiB
    path.unlink()  # a new file: the maps of the earlier load stay valid
    path.write_bytes(data)
    assert_rebuilt(spec, f"{name} differs from what was written (its SHA-256)", first, caplog)
    assert path.read_bytes() != data
    recorded = json.loads((prepared_dir(spec) / "checksums.json").read_text())["files"][name]
    assert set(recorded) == {"size", "sha256"}


@pytest.mark.parametrize(("side", "step"), [("src", 0), ("tgt", -1)])
def test_offsets_that_do_not_increase_deep_in_a_large_array_are_found_and_rebuilt(
    corpus: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    side: str,
    step: int,
) -> None:
    """Hashing reads only the ends of a large array; offsets are checked whole (a source holds eos, so its
    examples have one id at least; a target may be empty)."""
    monkeypatch.setattr(prepare_module, "FULL_HASH_BYTES", 1000)
    monkeypatch.setattr(prepare_module, "EDGE_BYTES", 64)
    spec = files_spec(corpus, tmp_path)
    first = pairs(prepare(spec).splits["train"])
    name = f"train.{side}.offsets.npy"
    path = prepared_dir(spec) / name
    offsets = np.load(path)
    assert path.stat().st_size > 1000 + 2 * 64
    middle = len(offsets) // 2
    offsets[middle] = offsets[middle - 1] + step  # an example of `step` ids: not seen by the hashes
    path.unlink()
    np.save(path, offsets)
    assert_rebuilt(spec, f"{name} gives an example {step} ids: its offsets do not increase", first, caplog)


def ids_cut_by_one(ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return ids[:-1], offsets


def ids_widened(ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return ids.astype(np.uint32), offsets


def offsets_from_one(ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return ids, np.concatenate([[1], offsets[1:]])


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (ids_cut_by_one, "train.src.offsets.npy does not span the {ids} ids of train.src.ids.npy in "),
        (ids_widened, "train.src.ids.npy holds a uint32 array of shape"),
        (offsets_from_one, "train.src.offsets.npy does not span the {ids} ids of train.src.ids.npy in "),
    ],
)
def test_arrays_that_disagree_under_matching_checksums_are_found_and_rebuilt(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Any, reason: str
) -> None:
    """The checksums vouch for each file's bytes; the arrays are also checked against each other and
    their vocabulary (what another writer, or a bug, could record consistently)."""
    spec = files_spec(corpus, tmp_path)
    first = pairs(prepare(spec).splits["train"])
    directory = prepared_dir(spec)
    paths = [directory / f"train.src.{kind}.npy" for kind in ("ids", "offsets")]
    arrays = damage(*(np.load(path) for path in paths))
    checksums = json.loads((directory / "checksums.json").read_text())
    for path, array in zip(paths, arrays, strict=True):
        path.unlink()  # a new file: the maps of the earlier load stay valid
        np.save(path, array)
        data = path.read_bytes()
        checksums["files"][path.name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (directory / "checksums.json").write_text(json.dumps(checksums))
    caplog.clear()
    with caplog.at_level("WARNING"):
        again = prepare(spec)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and reason.format(ids=len(arrays[0])) in warnings[0]
    assert pairs(again.splits["train"]) == first


# ---------------------------------------------------------------------------------------------------------
# CorpusDataModule


@pytest.mark.parametrize("joint_vocab", [True, False])
def test_datamodule_vocabularies_special_ids_and_test_sets(
    corpus: Path, tmp_path: Path, joint_vocab: bool
) -> None:
    dm = setup_datamodule(files_spec(corpus, tmp_path, joint_vocab=joint_vocab))
    assert dm.src_vocab_size == dm.src_tokenizer.vocab_size > len(SPECIAL_TOKENS)
    assert dm.tgt_vocab_size == dm.tgt_tokenizer.vocab_size > len(SPECIAL_TOKENS)
    assert (dm.src_vocab_size == dm.tgt_vocab_size) or not joint_vocab
    assert (dm.pad_id, dm.bos_id, dm.eos_id, dm.unk_id) == (PAD, BOS, EOS, UNK)
    for tokenizer in (dm.src_tokenizer, dm.tgt_tokenizer):
        assert [tokenizer.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD, BOS, EOS, UNK]
    assert dm.test_sets == ["test", "test2"]
    assert {name: len(examples) for name, examples in dm.splits.items()} == {
        "train": SIZES["train"],
        "val": SIZES["valid"],
        "test": SIZES["test"],
        "test2": SIZES["test2"],
    }
    # the teacher-forced test loss is the first test set's (README, "Choices where the paper is silent")
    served = sorted(index for batch in dm.test_dataloader() for index, _, _ in batch_rows(batch))
    assert served == list(range(SIZES["test"]))


def test_references_are_the_raw_target_lines_untouched(corpus: Path, tmp_path: Path) -> None:
    for _ in range(2):  # built, then loaded from the cache
        dm = setup_datamodule(files_spec(corpus, tmp_path))
        assert dm.references["test"][3] == ODD_REFERENCE
        assert dm.references["test"] == (corpus / "test.en").read_text(encoding="utf-8").split("\n")[:-1]
        assert dm.references["test2"] == read_lines(corpus / "test2.en")
        assert dm.references["val"] == read_lines(corpus / "valid.en")


def batch_rows(batch: dict[str, torch.Tensor]) -> Iterator[tuple[int, list[int], list[int]]]:
    """(example index, unpadded src, unpadded tgt_out) per row of `batch`."""
    for index, src, tgt_out in zip(batch["index"], batch["src"], batch["tgt_out"], strict=True):
        yield int(index), src[src != PAD].tolist(), tgt_out[tgt_out != PAD].tolist()


def test_training_batches_stay_within_the_token_budget_and_cover_each_example_once(
    corpus: Path, tmp_path: Path
) -> None:
    max_tokens = 64
    dm = setup_datamodule(files_spec(corpus, tmp_path, max_tokens=max_tokens))
    examples = {i: (s, t) for s, t, i in dm.splits["train"]}
    for epoch in range(2):
        loader = dm.train_dataloader()
        loader.batch_sampler.set_epoch(epoch)
        seen, sizes = [], []
        for batch in loader:
            assert set(batch) == {"src", "tgt_in", "tgt_out", "index"}
            size = len(batch["index"])
            sizes.append(size)
            assert batch["src"].numel() <= max_tokens or size == 1
            assert batch["tgt_in"].numel() <= max_tokens or size == 1
            assert batch["tgt_in"].shape == batch["tgt_out"].shape
            assert (batch["tgt_in"][:, 0] == BOS).all()
            for index, src, tgt_out in batch_rows(batch):
                assert (src, tgt_out) == (examples[index][0], [*examples[index][1], EOS])
                seen.append(index)
        assert sorted(seen) == sorted(examples)
        assert max(sizes) > 1 and len(sizes) > 1


@pytest.mark.parametrize("split", ["val", "test"])
def test_evaluation_loaders_cover_each_example_once(corpus: Path, tmp_path: Path, split: str) -> None:
    dm = setup_datamodule(files_spec(corpus, tmp_path, max_tokens=64))
    loader = dm.val_dataloader() if split == "val" else dm.test_dataloader()
    seen = []
    for batch in loader:
        for index, src, tgt_out in batch_rows(batch):
            assert src == dm.splits[split][index][0]
            assert tgt_out == [*dm.splits[split][index][1], EOS]
            seen.append(index)
    assert sorted(seen) == list(range(len(dm.splits[split])))


def test_limit_positions_drops_long_training_pairs_and_truncates_evaluation_sets(
    corpus: Path, tmp_path: Path
) -> None:
    n = 6
    dm = setup_datamodule(files_spec(corpus, tmp_path))
    before = {name: list(examples) for name, examples in dm.splits.items()}
    dm.limit_positions(n)

    fits = [e for e in before["train"] if len(e[0]) <= n and len(e[1]) + 1 <= n]
    assert 0 < len(fits) < len(before["train"])
    assert list(dm.splits["train"]) == fits
    assert dm.splits["train"].rows.dtype == np.int32  # 4 bytes per kept example in every process
    assert "train" not in dm.truncated
    for name in ("val", "test", "test2"):
        long = [len(s) > n or len(t) + 1 > n for s, t, _ in before[name]]
        assert dm.truncated[name] == sum(long) > 0
        assert len(dm.splits[name]) == len(before[name])
        for (s, t, i), (s2, t2, i2) in zip(before[name], dm.splits[name], strict=True):
            assert i2 == i and s2[-1] == EOS and len(s2) <= n and len(t2) + 1 <= n
            assert s2 == (s if len(s) <= n else [*s[: n - 1], EOS])
            assert t2 == t[: n - 1]
    seen = [i for batch in dm.test_dataloader() for i in batch["index"].tolist()]
    assert sorted(seen) == list(range(SIZES["test"]))


def test_truncated_counts_the_sentences_any_cut_shortened(corpus: Path, tmp_path: Path) -> None:
    """Evaluation sources cut to data.max_source_tokens when the data is set up, then to a learned
    position table (`limit_positions`, targets too): `truncated` counts each sentence either cut
    shortened once, not only those of the last cut."""
    uncut = setup_datamodule(files_spec(corpus, tmp_path)).splits
    limit, positions = 8, 12
    dm = setup_datamodule(files_spec(corpus, tmp_path, max_source_tokens=limit))
    dm.limit_positions(positions)
    for name in ("val", "test", "test2"):
        long_source = [len(s) > limit for s, _, _ in uncut[name]]
        long_target = [len(t) + 1 > positions for _, t, _ in uncut[name]]
        either = sum(a or b for a, b in zip(long_source, long_target, strict=True))
        assert dm.truncated[name] == either
    assert any(
        dm.truncated[name] > sum(len(s) > limit for s, _, _ in uncut[name]) for name in ("val", "test")
    )


def test_an_empty_test_set_beside_others_is_refused_before_training(corpus: Path, tmp_path: Path) -> None:
    """README: an empty test set with test=true is refused before training; the second of two too."""
    write_pair(corpus, "test2", [], [])
    dm = setup_datamodule(files_spec(corpus, tmp_path))
    with pytest.raises(
        DataError, match=rf"split 'test2' is empty \({re.escape(str(corpus / 'test2.de'))} and"
    ):
        dm.check_feeds(1)
    dm.check_feeds(1, test=False)  # a run with test=false never reads it


@pytest.mark.parametrize("sources", ["", "der Hund"])
def test_a_validation_set_of_empty_lines_is_refused_before_training(
    corpus: Path, tmp_path: Path, sources: str
) -> None:
    """A validation file of empty lines (or with empty references only) is as empty as one of no lines:
    nothing to score, and a run trained on it chose its best checkpoint by a BLEU of 0 every epoch."""
    write_pair(corpus, "valid", [sources] * 5, ["", " ", "", "\t", ""])
    dm = setup_datamodule(files_spec(corpus, tmp_path))
    files = f"({corpus / 'valid.de'} and {corpus / 'valid.en'})"
    with pytest.raises(
        DataError, match=re.escape(f"split 'val' has 5 lines, each empty on a side at least {files}")
    ):
        dm.check_feeds(1)


def test_batches_read_at_once_equal_batches_of_examples_read_one_by_one(corpus: Path, tmp_path: Path) -> None:
    """`Examples.__getitems__` (the DataLoader's path) + the collator give, for any indices, kept rows and
    cuts, the batch that collating `examples[k]` one by one gives; its tensors share one buffer."""
    dm = setup_datamodule(files_spec(corpus, tmp_path))
    dm.limit_positions(7)  # drops training pairs (kept rows), cuts evaluation sources (eos kept) and targets
    rng = random.Random(0)
    for name, examples in dm.splits.items():
        assert len(examples) > 8
        for size in (1, 2, 7, len(examples)):
            ks = rng.sample(range(len(examples)), size)
            expected = dm.collate([examples[k] for k in ks])
            batch = dm.collate(examples.__getitems__(ks))
            assert batch.keys() == expected.keys() == {"src", "tgt_in", "tgt_out", "index"}
            for key, value in expected.items():
                assert batch[key].dtype == torch.long and torch.equal(batch[key], value), (name, key)
            assert len({value.untyped_storage().data_ptr() for value in batch.values()}) == 1
        assert dm.truncated.get(name, 0) > 0 or name == "train"
    with pytest.raises(IndexError, match=r"examples 0\.\.99999 of"):
        dm.splits["val"].__getitems__([0, 99_999])
    with pytest.raises(IndexError, match="of a split of"):
        dm.splits["val"].split.gather(np.array([-1]))


# ---------------------------------------------------------------------------------------------------------
# HFData


@pytest.fixture
def hf_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The `datasets` module, its cache redirected into `tmp_path`."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    return datasets


HF_SIZES = {"train": 60, "validation": 8, "test": 6}


def hf_rows(split: str, n: int) -> tuple[list[str], list[str]]:
    rng = random.Random(split)
    return sentences(rng, DE, n), sentences(rng, EN, n)


def hf_spec(name: str, tmp_path: Path, **overrides: Any) -> HFData:
    return HFData(name=name, cache_dir=str(tmp_path / "cache"), vocab_size=200, max_tokens=256, **overrides)


def check_served(spec: HFData, sizes: dict[str, int]) -> None:
    dm = setup_datamodule(spec)
    assert dm.test_sets == ["test"]
    assert {name: len(examples) for name, examples in dm.splits.items()} == {
        "train": sizes["train"],
        "val": sizes["validation"],
        "test": sizes["test"],
    }
    assert dm.references["test"] == hf_rows("test", sizes["test"])[1]
    assert dm.src_tokenizer.decode(dm.splits["test"][0][0]) == hf_rows("test", sizes["test"])[0][0]


def test_hf_saved_dataset_dict_with_a_translation_column(tmp_path: Path, hf_datasets: Any) -> None:
    splits = {}
    for split, n in HF_SIZES.items():
        de, en = hf_rows(split, n)
        rows = [{"de": s, "en": t} for s, t in zip(de, en, strict=True)]
        splits[split] = hf_datasets.Dataset.from_dict({"translation": rows})
    hf_datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "hfds"))
    check_served(hf_spec(str(tmp_path / "hfds"), tmp_path), HF_SIZES)


def test_hf_plain_language_columns(tmp_path: Path, hf_datasets: Any) -> None:
    splits = {split: hf_datasets.Dataset.from_dict(dict(zip(("de", "en"), hf_rows(split, n), strict=True)))
              for split, n in HF_SIZES.items()}  # fmt: skip
    hf_datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "hfds"))
    check_served(hf_spec(str(tmp_path / "hfds"), tmp_path), HF_SIZES)
    with pytest.raises(DataError, match=r"no 'translation' or 'fr' column: columns are \['de', 'en'\]"):
        prepare(hf_spec(str(tmp_path / "hfds"), tmp_path, src_lang="fr"))


def test_hf_a_dataset_that_datasets_cannot_load_is_named(tmp_path: Path, hf_datasets: Any) -> None:
    """A missing directory, one without data files or a broken data file: a data error naming data.name
    and the cause (the datasets package's exceptions went out with their tracebacks)."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.json").write_text("{not json")
    cases = {
        str(tmp_path / "missing"): {},
        str(tmp_path / "empty"): {},
        "json": {"data_files": {"train": str(tmp_path / "broken.json")}},
    }
    fix = "Set data.name to a hub dataset, a directory saved with save_to_disk, or a builder"
    for name, overrides in cases.items():
        spec = hf_spec(name, tmp_path, **overrides)
        named = f"the datasets package cannot load data.name={name} "
        with pytest.raises(DataError, match=f"^{re.escape(named)}") as info:
            prepare(spec)
        assert fix in str(info.value)
    assert "from ArrowInvalid: JSON parse error" in str(info.value)  # the cause of datasets' own error


def test_hf_missing_split_lists_the_available_ones(tmp_path: Path, hf_datasets: Any) -> None:
    splits = {split: hf_datasets.Dataset.from_dict(dict(zip(("de", "en"), hf_rows(split, n), strict=True)))
              for split, n in HF_SIZES.items() if split != "test"}  # fmt: skip
    hf_datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "hfds"))
    spec = hf_spec(str(tmp_path / "hfds"), tmp_path)
    with pytest.raises(DataError, match=re.escape("no split 'test': available ['train', 'validation']")):
        prepare(spec)
    assert not prepared_dir(spec).exists()


def test_hf_json_builder_with_data_files(tmp_path: Path, hf_datasets: Any) -> None:
    data_files = {}
    for split, n in HF_SIZES.items():
        path = tmp_path / f"{split}.jsonl"
        de, en = hf_rows(split, n)
        path.write_text(
            "".join(
                json.dumps({"translation": {"de": s, "en": t}}) + "\n" for s, t in zip(de, en, strict=True)
            )
        )
        data_files[split] = str(path)
    check_served(hf_spec("json", tmp_path, data_files=data_files), HF_SIZES)


@pytest.mark.parametrize("layout", ["translation", "columns"])
def test_hf_splits_are_read_batch_by_batch_never_as_whole_columns(
    tmp_path: Path, hf_datasets: Any, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    splits = {}
    for split, n in HF_SIZES.items():
        de, en = hf_rows(split, n)
        rows = {"de": de, "en": en}
        if layout == "translation":
            rows = {"translation": [{"de": s, "en": t} for s, t in zip(de, en, strict=True)]}
        splits[split] = hf_datasets.Dataset.from_dict(rows)
    hf_datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "hfds"))
    real = hf_datasets.Dataset.__getitem__

    def no_columns(self: Any, key: Any) -> Any:
        if isinstance(key, str):
            raise AssertionError(f"column {key!r} read whole")
        return real(self, key)

    monkeypatch.setattr(hf_datasets.Dataset, "__getitem__", no_columns)
    spec = hf_spec(str(tmp_path / "hfds"), tmp_path)
    chunks = list(spec.readers()["train"](7))
    assert [len(src) for src, _ in chunks] == [7] * 8 + [4]
    assert tuple(list(itertools.chain.from_iterable(side)) for side in zip(*chunks, strict=True)) == hf_rows(
        "train", HF_SIZES["train"]
    )
    assert spec.load(["test"])["test"] == hf_rows("test", HF_SIZES["test"])
    check_served(spec, HF_SIZES)


@pytest.mark.parametrize(
    "overrides",
    [{"valid_split": "other"}, {"train_split": "other"}, {"test_splits": ("other",)}],
)
def test_hf_split_choice_is_part_of_the_cache_key(
    tmp_path: Path, hf_datasets: Any, overrides: dict[str, Any]
) -> None:
    splits = {split: hf_datasets.Dataset.from_dict(dict(zip(("de", "en"), hf_rows(split, n), strict=True)))
              for split, n in {**HF_SIZES, "other": 7}.items()}  # fmt: skip
    hf_datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "hfds"))
    default = hf_spec(str(tmp_path / "hfds"), tmp_path)
    chosen = hf_spec(str(tmp_path / "hfds"), tmp_path, **overrides)
    prepare(default)
    assert prepared_dir(chosen) != prepared_dir(default)
    served = prepare(chosen)
    name = "test" if "test_splits" not in overrides else "other"
    split = {"valid_split": "val", "train_split": "train", "test_splits": name}[next(iter(overrides))]
    assert split in served.splits and len(served.splits[split]) == 7


def test_a_tokenizer_file_with_ids_beyond_its_size_is_refused(corpus: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = {word: 65536 + k for k, word in enumerate(dict.fromkeys(DE + EN))}  # 65536 would wrap to <pad>
    vocab = {**{token: i for i, token in enumerate(SPECIAL_TOKENS)}, **{"▁" + w: i for w, i in words.items()}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tokenizer.save(str(tmp_path / "gaps.json"))
    spec = files_spec(corpus, tmp_path, tokenizer_path=str(tmp_path / "gaps.json"))
    with pytest.raises(DataError, match=r"gaps\.json: tokenizer has \d+ entries but ids up to \d+"):
        prepare(spec)
    assert not prepared_dir(spec).exists()


@pytest.mark.parametrize("split", ["train", "test"])
def test_hf_rows_without_text_are_named(tmp_path: Path, hf_datasets: Any, split: str) -> None:
    splits = {}
    for name, n in HF_SIZES.items():
        de, en = hf_rows(name, n)
        if name == split:
            en[3] = None
        splits[name] = hf_datasets.Dataset.from_dict({"de": de, "en": en})
    hf_datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "hfds"))
    spec = hf_spec(str(tmp_path / "hfds"), tmp_path)
    with pytest.raises(DataError, match=f"row 3 of split '{split}' of .* has en=None, not text"):
        prepare(spec)


def test_hf_rows_without_text_are_named_by_their_row_in_the_split_past_the_first_chunk(
    tmp_path: Path, hf_datasets: Any
) -> None:
    de, en = hf_rows("train", 6)
    en[5] = None
    train = hf_datasets.Dataset.from_dict({"de": de, "en": en})
    hf_datasets.DatasetDict({"train": train}).save_to_disk(str(tmp_path / "hfds"))
    reader = hf_spec(str(tmp_path / "hfds"), tmp_path).readers()["train"]
    with pytest.raises(DataError, match=r"^row 5 of split 'train' of .* has en=None, not text"):
        list(reader(2))  # chunks of rows 0-1, 2-3, 4-5


@pytest.mark.parametrize("value", ["ein Satz", ["ein Satz", "a sentence"]])
def test_hf_translation_values_that_are_no_mappings_are_named(
    tmp_path: Path, hf_datasets: Any, value: Any
) -> None:
    """A `translation` column of strings or lists (not {language: text}) raised an AttributeError."""
    splits = {}
    for name, n in HF_SIZES.items():
        rows: list[Any] = [{"de": s, "en": t} for s, t in zip(*hf_rows(name, n), strict=True)]
        splits[name] = hf_datasets.Dataset.from_dict({"translation": rows})
    splits["train"] = hf_datasets.Dataset.from_dict({"translation": [value] * 4})
    hf_datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "hfds"))
    spec = hf_spec(str(tmp_path / "hfds"), tmp_path)
    named = f"row 0 of split 'train' of {spec.name} has translation={value!r}, not a mapping of each "
    with pytest.raises(DataError, match=re.escape(named + "language to its text ({'de': ..., 'en': ...})")):
        prepare(spec)
    assert not prepared_dir(spec).exists()


@pytest.mark.parametrize("split", ["validation", "test"])
def test_hf_evaluation_text_with_a_line_break_is_named(tmp_path: Path, hf_datasets: Any, split: str) -> None:
    """A run saves an evaluation set's sources and references one sentence per line (`Evaluation.write`):
    a reference holding "\\n" made its file one line longer than the hypotheses, and attnlab-compare then
    refused the run as damaged. A training sentence may hold one (normalised to a space)."""

    def saved(name: str, broken: tuple[str, ...]) -> str:
        splits = {}
        for part, n in HF_SIZES.items():
            de, en = hf_rows(part, n)
            en[2] = "two\nlines" if part in broken else en[2]
            splits[part] = hf_datasets.Dataset.from_dict({"de": de, "en": en})
        hf_datasets.DatasetDict(splits).save_to_disk(str(tmp_path / name))
        return str(tmp_path / name)

    spec = hf_spec(saved("broken", ("train", split)), tmp_path)
    message = f"row 2 of split '{split}' of {spec.name} has en='two\\nlines', a line break inside one "
    with pytest.raises(DataError, match=re.escape(message) + ".*Replace the line breaks"):
        prepare(spec)
    assert not prepared_dir(spec).exists()
    assert len(prepare(hf_spec(saved("fixed", ("train",)), tmp_path)).splits["train"]) == HF_SIZES["train"]


def test_hf_evaluation_text_with_a_line_break_prepared_before_it_was_refused_is_named(
    tmp_path: Path, hf_datasets: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Data prepared before a line break inside an evaluation sentence was refused (its checksums all
    right) was loaded as it was, and the run's saved references came out longer than its hypotheses; now it
    is rebuilt, which refuses the text naming the row. Prepared by the checks of then: without the line
    break check (`HFData._check_texts` with `one_line` ignored)."""
    splits = {}
    for part, n in HF_SIZES.items():
        de, en = hf_rows(part, n)
        en[2] = "two\nlines" if part == "validation" else en[2]
        splits[part] = hf_datasets.Dataset.from_dict({"de": de, "en": en})
    hf_datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "hfds"))
    spec = hf_spec(str(tmp_path / "hfds"), tmp_path)
    checks = HFData._check_texts
    with monkeypatch.context() as old, prepare_module.building(prepared_dir(spec)) as tmp:
        lenient = staticmethod(lambda side, where, start, _: checks(side, where, start, False))
        old.setattr(HFData, "_check_texts", lenient)
        prepare_module._build(spec, spec.readers(), tmp, prepared_dir(spec).name)  # as `prepare` builds it
    assert "two\\nlines" in (prepared_dir(spec) / "val.raw.json").read_text()
    message = f"row 2 of split 'validation' of {spec.name} has en='two\\nlines', a line break inside one "
    with caplog.at_level("WARNING"), pytest.raises(DataError, match=re.escape(message)):
        prepare(spec)
    assert "val.raw.json holds a line break inside sentence 2" in caplog.text
    assert not prepared_dir(spec).exists()


def test_a_cache_dir_that_is_a_file_is_a_data_error_naming_it(corpus: Path, tmp_path: Path) -> None:
    """A NotADirectoryError's traceback before."""
    (tmp_path / "a-file").write_text("not a directory")
    spec = files_spec(corpus, tmp_path, cache_dir=str(tmp_path / "a-file"))
    named = f"cannot create the cache directory {tmp_path / 'a-file' / 'prepared'} (Not a directory): set "
    with pytest.raises(DataError, match=re.escape(named + "data.cache_dir (or $ATTNLAB_CACHE_DIR) to a")):
        prepare(spec)
    assert (tmp_path / "a-file").read_text() == "not a directory"


def test_a_full_disk_while_preparing_is_a_data_error_naming_the_cache(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(self: Any, values: np.ndarray) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prepare_module._ArrayWriter, "append", full)
    spec = files_spec(corpus, tmp_path)
    with pytest.raises(DataError, match=r"cannot write the prepared data into .*prepared \(No space left on "
                       r"device\).*data\.cache_dir"):  # fmt: skip
        prepare(spec)
    assert not prepared_dir(spec).exists() and not leftovers(prepared_dir(spec).parent)


def test_a_directory_in_place_of_the_prepared_datas_lock_is_a_data_error_naming_it(
    corpus: Path, tmp_path: Path
) -> None:
    """It ended in IsADirectoryError's traceback."""
    spec = files_spec(corpus, tmp_path)
    lock = prepared_dir(spec).with_suffix(".lock")
    lock.mkdir(parents=True)
    named = f"cannot use {lock} in the cache (Is a directory): something else is in its place; remove it"
    with pytest.raises(DataError, match=re.escape(named)):
        prepare(spec)
    assert lock.is_dir() and not prepared_dir(spec).exists()


@pytest.mark.parametrize("final_lf", [False, True])
@pytest.mark.parametrize("block_bytes", [corpora.BLOCK_BYTES, 3])
def test_a_file_with_cr_line_endings_is_refused_not_read_as_one_line(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int, final_lf: bool
) -> None:
    for lang in ("de", "en"):  # both sides of the test set saved with classic Mac line endings
        path = corpus / f"test.{lang}"  # (final_lf: and a final "\n" added by a tool)
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r") + (b"\n" if final_lf else b""))
    monkeypatch.setattr(corpora, "BLOCK_BYTES", block_bytes)
    with pytest.raises(
        DataError, match=r"test\.de has no line feed but 15 carriage returns: .*CR line endings"
    ):
        read_lines(corpus / "test.de")
    with pytest.raises(DataError, match="CR line endings"):
        prepare(files_spec(corpus, tmp_path))


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be", "utf-16"])
def test_a_file_in_utf16_or_utf32_without_a_byte_order_mark_is_refused(
    corpus: Path, tmp_path: Path, encoding: str
) -> None:
    """ASCII text in UTF-16/32 without a BOM decodes as UTF-8: it was read as lines of letters between
    NULs (and the little-endian file one line longer), a corpus of garbage that trained without a word.
    The refusal names the encoding to convert from: it said `iconv -f UTF-16LE` for every file, which
    turns a big-endian one into valid text of other letters (`䠀愀` for `Ha`) that trains as silently."""
    for lang in ("de", "en"):
        path = corpus / f"test.{lang}"
        path.write_bytes(path.read_text(encoding="utf-8").encode(encoding))
    named = {"utf-16": "UTF-16LE"}.get(encoding, encoding.upper().replace("-", "").replace("UTF", "UTF-"))
    with pytest.raises(
        DataError,
        match=rf"test\.de: \d+ of its first \d+ bytes are NUL: it is {named} text .*iconv -f {named} ",
    ):
        read_lines(corpus / "test.de")
    with pytest.raises(DataError, match="re-encode it as UTF-8"):
        prepare(files_spec(corpus, tmp_path))
    stray = tmp_path / "stray.de"  # a NUL or two in UTF-8 text is no encoding: read as it is
    stray.write_bytes(b"ein\x00Hund\nzwei Katzen\n")
    assert read_lines(stray) == ["ein\x00Hund", "zwei Katzen"]


@pytest.mark.parametrize(
    ("compress", "named"), [("gzip", "gzip-compressed.*gunzip"), ("xz", "xz-compressed.*unxz")]
)
@pytest.mark.parametrize("cut", [False, True])
def test_a_compressed_data_file_is_refused_naming_the_tool_that_unpacks_it(
    corpus: Path, tmp_path: Path, compress: str, named: str, cut: bool
) -> None:
    """A corpus file given as it was downloaded (`train.de` holding gzip or xz data, whole or cut short)
    was refused as invalid UTF-8 with re-encoding as the fix; it is named as compressed, with the tool."""
    path = corpus / "train.de"
    packed = {"gzip": gzip.compress, "xz": lzma.compress}[compress](path.read_bytes())
    path.write_bytes(packed[: len(packed) // 2] if cut else packed)
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))} is {named}\)$"):
        read_lines(path)
    with pytest.raises(DataError, match=named):
        prepare(files_spec(corpus, tmp_path))


def test_pairs_dropped_by_the_filters_are_reported_when_the_cache_is_loaded(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src, tgt = read_lines(corpus / "train.de"), read_lines(corpus / "train.en")
    src[:2] = ["", "der Hund"]
    tgt[:2] = ["the dog", " "]
    write_pair(corpus, "train", src, tgt)  # two pairs with an empty side: dropped as empty
    spec = files_spec(corpus, tmp_path, max_source_tokens=6)
    setup_datamodule(spec)  # builds
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnlab.data.datamodule"):
        dm = setup_datamodule(spec)  # loads the cached preparation
    dropped = dm.stats["dropped_filter"]["source_too_long"]
    assert dropped > 0
    assert f"the length filters dropped {dropped} of the 200 training lines" in caplog.text
    # and a run's manifest records them (`data_identity`, written as manifest.json's data)
    pairs = data_identity(dm)["training_pairs"]
    assert pairs == {
        "lines": 200,
        "dropped_empty": 2,
        "dropped_by_filter": {"source_too_long": dropped, **dm.stats["dropped_filter"]},
        "kept": len(dm.splits["train"]),
    }
    assert pairs["lines"] - pairs["dropped_empty"] - sum(pairs["dropped_by_filter"].values()) == pairs["kept"]


def test_the_batch_order_follows_data_seed_not_the_runs_seed(corpus: Path, tmp_path: Path) -> None:
    """A study's seeds (the run's `seed`, which seeds torch) leave the batches alone: `data.seed` alone
    orders them, so runs that differ in seed only see the same batches in the same order."""
    orders = []
    for run_seed, data_seed in ((1, 1), (2, 1), (1, 2)):
        torch.manual_seed(run_seed)
        random.seed(run_seed)
        np.random.seed(run_seed)
        datamodule = setup_datamodule(files_spec(corpus, tmp_path, seed=data_seed))
        orders.append(list(datamodule.train_dataloader().batch_sampler))
    assert orders[0] == orders[1] != orders[2]
