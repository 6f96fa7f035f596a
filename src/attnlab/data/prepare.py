"""Preparing a corpus: normalise, train the tokenizer(s), encode, filter, and cache it all on disk.

The prepared data lives in `<cache>/prepared/<key>/`, where the key hashes the raw files' content and
every preprocessing setting: a changed file or setting builds anew, an unchanged one is loaded without
rebuilding anything. The directory is built in a temporary place and renamed into position (nothing
half-written is ever visible), under a lock, so concurrent DDP ranks or sweep jobs build it once.

`checksums.json` records the size and SHA-256 of every other file of the directory when it is built;
each load checks the bytes it reads against it (hashing what is read anyway: no second read). A
directory with a file missing, cut short or changed, or without a readable `checksums.json` (one built
before checksums were recorded included), is rebuilt, with a warning naming it.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.data.cache import building, file_sha256, fingerprint
from attnlab.data.corpora import CorpusData, Text
from attnlab.data.download import DataError
from attnlab.data.text import normalize
from attnlab.data.tokenizer import EOS_ID, SubwordTokenizer

log = logging.getLogger(__name__)

PREPARE_VERSION = 1  # bump when the prepared format or the preprocessing changes
CHECKSUMS = "checksums.json"  # size and SHA-256 of every other file of a prepared directory


class DamagedPreparedData(DataError):
    """A prepared directory's file is missing or differs from what `checksums.json` recorded."""


@dataclass
class EncodedSplit:
    """One split: per example, source ids (eos included), target ids (bare) and the raw text."""

    src: list[list[int]]
    tgt: list[list[int]]
    raw_src: list[str]
    raw_tgt: list[str]

    def __len__(self) -> int:
        return len(self.src)


@dataclass
class Prepared:
    """A prepared corpus: tokenizers, encoded splits and the statistics of building it."""

    src_tokenizer: SubwordTokenizer
    tgt_tokenizer: SubwordTokenizer
    splits: dict[str, EncodedSplit]
    stats: dict[str, Any] = field(default_factory=dict)
    key: str | None = None  # the cache key: a hash of the raw files and the preprocessing settings


def _flat(seqs: list[list[int]]) -> tuple[Tensor, Tensor]:
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    offsets = torch.zeros(len(seqs) + 1, dtype=torch.long)
    offsets[1:] = lengths.cumsum(0)
    flat = torch.tensor([i for s in seqs for i in s], dtype=torch.int32)
    return flat, offsets


def _unflat(flat: Tensor, offsets: Tensor) -> list[list[int]]:
    values, bounds = flat.tolist(), offsets.tolist()
    return [values[a:b] for a, b in itertools.pairwise(bounds)]


def _keep_for_training(spec: CorpusData, src: list[int], tgt: list[int]) -> str | None:
    """Why a training pair is dropped, or None to keep it."""
    if len(src) > spec.max_source_tokens:
        return "source_too_long"
    if len(tgt) + 1 > spec.max_target_tokens:
        return "target_too_long"
    if spec.max_length_ratio is not None:
        short, long = sorted((len(src), len(tgt) + 1))
        if long > spec.max_length_ratio * short:
            return "length_ratio"
    return None


def _build(spec: CorpusData, raw: dict[str, Text], out: Path) -> None:
    started = time.perf_counter()
    src_train, tgt_train = raw["train"]
    pairs = [(s, t) for s, t in zip(src_train, tgt_train, strict=True) if normalize(s) and normalize(t)]
    stats: dict[str, Any] = {"train_lines": len(src_train), "dropped_empty": len(src_train) - len(pairs)}
    if not pairs:
        raise DataError(f"the training split has no non-empty sentence pairs ({len(src_train)} lines)")
    src_texts, tgt_texts = [s for s, _ in pairs], [t for _, t in pairs]
    settings = {"model": spec.tokenizer, "vocab_size": spec.vocab_size}
    if spec.joint_vocab:
        src_tok = tgt_tok = SubwordTokenizer.train(src_texts + tgt_texts, **settings)
        src_tok.save(out / "tokenizer.json")
    else:
        src_tok, tgt_tok = (
            SubwordTokenizer.train(src_texts, **settings),
            SubwordTokenizer.train(tgt_texts, **settings),
        )
        src_tok.save(out / "src.tokenizer.json")
        tgt_tok.save(out / "tgt.tokenizer.json")
    stats["tokenizer_seconds"] = round(time.perf_counter() - started, 3)
    for name, (src_lines, tgt_lines) in raw.items():
        if name == "train":
            src_lines, tgt_lines = src_texts, tgt_texts
        src_ids = [[*ids, EOS_ID] for ids in src_tok.encode_batch(src_lines)]
        tgt_ids = tgt_tok.encode_batch(tgt_lines)
        if name == "train":
            keep, dropped = [], {}
            for i, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
                reason = _keep_for_training(spec, s, t)
                if reason is None:
                    keep.append(i)
                else:
                    dropped[reason] = dropped.get(reason, 0) + 1
            stats["dropped_filter"] = dropped
            src_ids, tgt_ids = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
            src_lines, tgt_lines = [src_lines[i] for i in keep], [tgt_lines[i] for i in keep]
        src_flat, src_off = _flat(src_ids)
        tgt_flat, tgt_off = _flat(tgt_ids)
        torch.save(
            {"src": src_flat, "src_offsets": src_off, "tgt": tgt_flat, "tgt_offsets": tgt_off},
            out / f"{name}.pt",
        )
        (out / f"{name}.raw.json").write_text(
            json.dumps({"src": src_lines, "tgt": tgt_lines}, ensure_ascii=False)
        )
        stats[f"{name}_examples"] = len(src_ids)
    stats["build_seconds"] = round(time.perf_counter() - started, 3)
    log.info(
        "training pairs: %d lines, %d dropped as empty, dropped by the length filters: %s; kept %d",
        stats["train_lines"], stats["dropped_empty"], stats["dropped_filter"] or "none",
        stats["train_examples"],
    )  # fmt: skip
    stats["splits"] = list(raw)
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    files = {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in sorted(out.iterdir())}
    (out / CHECKSUMS).write_text(json.dumps({"files": files}, indent=2))


class _Checked:
    """Reads the files of a prepared directory, each checked against its `checksums.json`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        try:
            self.files = json.loads((directory / CHECKSUMS).read_text())["files"]
            if not all(isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str)
                       for v in self.files.values()):  # fmt: skip
                raise TypeError("an entry without size and sha256")
        except FileNotFoundError:
            raise self.damaged(f"it has no {CHECKSUMS} (built by an older attnlab, or damaged)") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise self.damaged(f"its {CHECKSUMS} is unreadable ({type(exc).__name__}: {exc})") from None

    def damaged(self, reason: str) -> DamagedPreparedData:
        return DamagedPreparedData(f"the prepared data in {self.directory} is damaged: {reason}")

    def has(self, name: str) -> bool:
        return name in self.files

    def read(self, name: str) -> bytes:
        """The bytes of file `name`, as they were written."""
        expected = self.files.get(name)
        if expected is None:
            raise self.damaged(f"{name} is not listed in its {CHECKSUMS}")
        try:
            data = (self.directory / name).read_bytes()
        except OSError as exc:
            raise self.damaged(f"{name} cannot be read ({exc.strerror or exc})") from None
        if len(data) != expected["size"]:
            raise self.damaged(f"{name} has {len(data)} bytes, {expected['size']} were written")
        if hashlib.sha256(data).hexdigest() != expected["sha256"]:
            raise self.damaged(f"{name} differs from what was written (its SHA-256)")
        return data

    def check_all(self) -> None:
        for name in self.files:
            self.read(name)


def _damage(directory: Path) -> str | None:
    """Why the prepared `directory` cannot be used as it is, or None when every file checks out."""
    try:
        _Checked(directory).check_all()
    except DamagedPreparedData as exc:
        return str(exc)
    return None


def _load(directory: Path) -> Prepared:
    checked = _Checked(directory)
    stats = json.loads(checked.read("stats.json"))
    if checked.has("tokenizer.json"):
        src_tok = tgt_tok = SubwordTokenizer.from_json(checked.read("tokenizer.json").decode("utf-8"))
    else:
        src_tok = SubwordTokenizer.from_json(checked.read("src.tokenizer.json").decode("utf-8"))
        tgt_tok = SubwordTokenizer.from_json(checked.read("tgt.tokenizer.json").decode("utf-8"))
    splits = {}
    for name in stats["splits"]:
        tensors = torch.load(io.BytesIO(checked.read(f"{name}.pt")), weights_only=True)
        raw = json.loads(checked.read(f"{name}.raw.json"))
        splits[name] = EncodedSplit(
            src=_unflat(tensors["src"], tensors["src_offsets"]),
            tgt=_unflat(tensors["tgt"], tensors["tgt_offsets"]),
            raw_src=raw["src"],
            raw_tgt=raw["tgt"],
        )
    return Prepared(src_tok, tgt_tok, splits, stats, key=directory.name)


def prepared_dir(spec: CorpusData) -> Path:
    """Where `spec`'s prepared data lives (its key hashes file contents and preprocessing settings)."""
    key = fingerprint(PREPARE_VERSION, spec.preprocessing(), spec.fingerprint_inputs())
    return spec.cache_root() / "prepared" / key


def _timed_load(target: Path) -> Prepared:
    started = time.perf_counter()
    prepared = _load(target)
    log.info("loaded prepared data from %s in %.2fs", target, time.perf_counter() - started)
    return prepared


def prepare(spec: CorpusData) -> Prepared:
    """Build (once, atomically, under a lock) or load the prepared corpus of `spec`; a damaged one (see
    the module's docstring) is rebuilt, with a warning naming it.

    Raises:
        DataError: A corpus file is missing or unusable (from `spec.load`), or the directory is damaged
            again right after being rebuilt (`DamagedPreparedData`: check the disk).
    """
    target = prepared_dir(spec)
    recheck = None  # a directory another process builds while this one waits is new: not checked twice
    if target.is_dir():
        try:
            return _timed_load(target)
        except DamagedPreparedData as exc:  # rebuilt below, unless another process already did
            log.debug("%s", exc)
            recheck = _damage
    with building(target, damaged=recheck) as tmp:
        if tmp is not None:
            log.info("preparing %s into %s", type(spec).__name__, target)
            _build(spec, spec.load(), tmp)
    return _timed_load(target)
