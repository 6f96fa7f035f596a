"""Collation of (source, target) id pairs into padded batches, and token-budget batching.

A batch is a dict (a `Batch`) of LongTensors: `src` (B, S) source ids ending in eos; `tgt_in` (B, T)
decoder input = bos + target; `tgt_out` (B, T) decoder output = target + eos. Padding uses `pad_id`; masks
are derived from it by the model (True = real token). Items given as (src, tgt, index) triples add `index`
(B,), the example indices, so that `restore_order` can put per-example outputs back into dataset order.

`TokenBatchSampler` forms fairseq `--max-tokens`-style batches: examples of similar length go together,
and each batch holds at most `max_tokens` tokens counting padding. It works on a numpy array of lengths
(sorting, shuffling and packing vectorised; one Python step per batch, none per example) and keeps
only this rank's batches of an epoch, as one index array and the batches' boundaries (no Python object per
batch or example). Per process that is 2 + 4 / ranks bytes per training example: the lengths as uint16 and
this rank's share of the epoch's order as int32 (4.5M pairs on 2 ranks: 18 MB a rank).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Sampler

log = logging.getLogger(__name__)

T = TypeVar("T")
FINGERPRINT_CHUNK = 65536  # lengths hashed at a time by `TokenBatchSampler.fingerprint`


def pad(sequences: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    """Right-pad id sequences into a (B, L) LongTensor."""
    out = torch.full((len(sequences), max(len(s) for s in sequences)), pad_id, dtype=torch.long)
    for i, seq in enumerate(sequences):
        out[i, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return out


def cut_source(source: Sequence[int], limit: int, eos_id: int) -> list[int]:
    """`source` (ids ending in eos) cut to at most `limit` ids, keeping eos as the last one.

    The one rule for sources that are too long where nothing may be dropped: validation and test sets
    for a learned position table (`CorpusDataModule.limit_positions`) and inputs to translate
    (`Translator`, `decode.max_source_tokens`).
    """
    return list(source) if len(source) <= limit else [*source[: limit - 1], eos_id]


Pair = tuple[Sequence[int], Sequence[int]]
Triple = tuple[Sequence[int], Sequence[int], int]


@dataclass(frozen=True)
class Gathered:
    """The examples of one batch read at once (`Examples.__getitems__`), for the `Collator`: the same
    batch as their triples give, built with a few array operations instead of Python steps per example.

    `src` (B, S) and `tgt` (B, T) hold each example's source ids (eos included) and bare target ids
    left-aligned, anything beyond its length (`src_lengths`, `tgt_lengths`: (B,)); `index` (B,) the
    example indices.
    """

    src: np.ndarray
    src_lengths: np.ndarray
    tgt: np.ndarray
    tgt_lengths: np.ndarray
    index: np.ndarray

    def __len__(self) -> int:
        return len(self.index)


def _left_aligned(sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """`sequences` left-aligned in a (B, L) int64 matrix (0 beyond each one's length), and the lengths."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    matrix = np.zeros((len(sequences), int(lengths.max(initial=0))), dtype=np.int64)
    for row, seq in zip(matrix, sequences, strict=True):
        row[: len(seq)] = seq
    return matrix, lengths


def _rebuilt(buffer: np.ndarray, layout: tuple[tuple[str, tuple[int, ...]], ...]) -> Batch:
    """The `Batch` a pickled one stands for: its tensors are views of `buffer` (see `Batch.__reduce__`)."""
    return Batch.of(torch.from_numpy(buffer), layout)


class Batch(dict):
    """A collated batch: a dict of tensors that are consecutive views of one int64 buffer.

    Pickled (a DataLoader worker hands its batches to the training process this way), a batch travels as
    that buffer's bytes and the names and shapes of its views, copied through the worker's pipe. Tensors
    of their own would go through shared memory, a file descriptor passed over a socket per batch: on 2
    cores, 2 workers then served 450-670 WMT-like batches/s against 1,320-1,440 this way (the `open` stage
    of `scripts/bench_data.py` run alone; 1,081 in its whole run, docs/benchmarks.md). A batch whose
    entries were replaced, reordered or changed in shape or memory after collation pickles as a plain
    dict of its tensors. `torch.load(weights_only=True)` refuses this class: save `dict(batch)`.
    """

    _buffer: Tensor | None = None
    _views: tuple[tuple[str, Tensor, tuple[int, ...], int], ...] = ()  # name, view, shape, data pointer

    @classmethod
    def of(cls, buffer: Tensor, layout: Sequence[tuple[str, tuple[int, ...]]]) -> Batch:
        """The batch whose entries are views of the 1-D `buffer`, in `layout` order: (name, shape) each."""
        batch, start = cls(), 0
        for name, shape in layout:
            size = math.prod(shape)
            batch[name], start = buffer[start : start + size].view(shape), start + size
        if start != len(buffer):
            raise ValueError(f"Batch.of: the layout covers {start} of the buffer's {len(buffer)} elements")
        batch._buffer = buffer
        batch._views = tuple((name, view, tuple(view.shape), view.data_ptr()) for name, view in batch.items())
        return batch

    def _intact(self) -> bool:
        """Whether the entries are still the views `of` made, in order, over the same memory (an entry
        replaced, reordered, transposed or given other storage in place is not)."""
        if self._buffer is None or list(self) != [name for name, *_ in self._views]:
            return False
        return all(
            self[name] is view and tuple(view.shape) == shape and view.is_contiguous()
            and view.data_ptr() == pointer
            for name, view, shape, pointer in self._views
        )  # fmt: skip

    def __reduce__(self) -> tuple[Any, ...]:
        if self._intact():
            layout = tuple((name, shape) for name, _, shape, _ in self._views)
            return _rebuilt, (self._buffer.numpy(), layout)
        return Batch, (dict(self),)


class Collator:
    """Turns a list of (src ids, tgt ids) pairs into a padded batch (picklable for worker processes), or
    the same examples `Gathered` (the DataLoader's path over `Examples`) into the same batch.

    Items may also be (src ids, tgt ids, example index) triples; the batch then also holds `index`, a
    (B,) LongTensor of the example indices. All items of a batch must have the same form.
    """

    def __init__(self, *, pad_id: int, bos_id: int, eos_id: int) -> None:
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id

    def __call__(self, items: Sequence[Pair | Triple] | Gathered) -> Batch:
        if isinstance(items, Gathered):
            return self._batch(items.src, items.src_lengths, items.tgt, items.tgt_lengths, items.index)
        widths = {len(item) for item in items}
        if not widths <= {2, 3} or len(widths) > 1:
            raise ValueError(
                f"Collator: items have {sorted(widths)} elements; give every item of a batch as a "
                "(src, tgt) pair or every item as a (src, tgt, index) triple"
            )
        index = np.array([int(item[2]) for item in items], dtype=np.int64) if widths == {3} else None
        sources, targets = ([item[side] for item in items] for side in (0, 1))
        return self._batch(*_left_aligned(sources), *_left_aligned(targets), index)

    def _batch(
        self,
        src: np.ndarray,
        src_lengths: np.ndarray,
        tgt: np.ndarray,
        tgt_lengths: np.ndarray,
        index: np.ndarray | None,
    ) -> Batch:
        """The batch of `Gathered`-style arrays, its tensors views of one buffer (see `Batch`)."""
        batch = len(src_lengths)
        source, target = int(src_lengths.max(initial=0)), int(tgt_lengths.max(initial=0))  # S, T - 1
        shapes = {"src": (batch, source), "tgt_in": (batch, target + 1), "tgt_out": (batch, target + 1)}
        if index is not None:
            shapes["index"] = (batch,)
        size = sum(math.prod(shape) for shape in shapes.values())
        out = Batch.of(torch.full((size,), self.pad_id, dtype=torch.long), tuple(shapes.items()))
        views = {name: value.numpy() for name, value in out.items()}  # the same memory
        inside_src = np.arange(source) < src_lengths[:, None]  # (B, S)
        views["src"][inside_src] = src[:, :source][inside_src]
        inside_tgt = np.arange(target) < tgt_lengths[:, None]  # (B, T - 1)
        views["tgt_in"][:, 0] = self.bos_id
        targets = tgt[:, :target][inside_tgt]
        views["tgt_in"][:, 1:][inside_tgt] = views["tgt_out"][:, :-1][inside_tgt] = targets
        views["tgt_out"][np.arange(batch), tgt_lengths] = self.eos_id
        if index is not None:
            views["index"][:] = index
        return out


def _listed(values: Sequence[int], limit: int = 10) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def restore_order(indices: Sequence[int], items: Sequence[T], *, complete: bool = True) -> list[T]:
    """Puts per-example outputs back into dataset order.

    Args:
        indices: The example index of each item, e.g. the concatenated `batch["index"].tolist()` of an
            evaluation pass; each of `0 .. len(items) - 1` once, or with `complete=False` any distinct
            non-negative indices (a pass over part of the set: `limit_val_batches`, a subset).
        items: The per-example outputs, in the order the batches produced them.
        complete: Whether every example of the set must be there.

    Returns:
        The items sorted by their index (with `complete`: `out[indices[k]] = items[k]`).

    Raises:
        ValueError: Lengths differ, or an index is duplicated, missing (with `complete`) or out of range
            (named).
    """
    if len(indices) != len(items):
        raise ValueError(f"restore_order: {len(indices)} indices for {len(items)} items; give one per item")
    n = len(items)
    positions = [int(i) for i in indices]
    counts = Counter(positions)
    duplicates = sorted(i for i, count in counts.items() if count > 1)
    outside = sorted(i for i in counts if not (0 <= i < n if complete else i >= 0))
    missing = sorted(set(range(n)) - counts.keys()) if complete else []
    if duplicates or outside or missing:
        problems = [
            f"{name} indices {_listed(values)}"
            for name, values in (("duplicate", duplicates), ("out-of-range", outside), ("missing", missing))
            if values
        ]
        expected = f"each of 0..{n - 1} exactly once" if complete else "distinct non-negative indices"
        raise ValueError(
            f"restore_order: {'; '.join(problems)} (expected {expected}: did an evaluation sampler drop or "
            "repeat examples?)"
        )
    order = sorted(range(n), key=positions.__getitem__)
    return [items[k] for k in order]


def _positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"TokenBatchSampler: {name}={value!r}; give a positive integer or None")


def _narrow_copy(lengths: np.ndarray) -> np.ndarray:
    """A copy of the (N,) positive `lengths` in the narrowest unsigned type holding them (uint16 for
    sentences: 2 bytes per example instead of 8, in every rank)."""
    longest = int(lengths.max(initial=0))
    dtype = next(t for t in (np.uint16, np.uint32, np.uint64) if longest <= np.iinfo(t).max)
    return np.array(lengths, dtype=dtype)


def _index_dtype(count: int) -> torch.dtype:
    """The narrowest type for indices of `count` examples (int32 below 2**31: 4 bytes per example)."""
    return torch.int32 if count < 2**31 else torch.int64


def _generator(seed: int, epoch: int) -> torch.Generator:
    """A torch generator seeded by the pair (seed, epoch), identical across runs and platforms."""
    digest = hashlib.blake2b(f"{seed}/{epoch}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def _spans(bounds: np.ndarray, batches: np.ndarray) -> np.ndarray:
    """The positions `bounds[j]:bounds[j + 1]` of each batch j of `batches`, one after the other (int64)."""
    starts, sizes = bounds[batches], bounds[batches + 1] - bounds[batches]
    ends = np.cumsum(sizes)
    return np.repeat(starts - (ends - sizes), sizes) + np.arange(int(ends[-1]) if len(ends) else 0)


@dataclass(frozen=True)
class _RankEpoch:
    """One rank's batches of one (seed, epoch): its examples batch after batch in one index array
    (`order`), batch j being `order[bounds[j]:bounds[j + 1]]`."""

    key: tuple[int, int]
    order: np.ndarray  # (examples of this rank,) int32
    bounds: np.ndarray  # (batches + 1,) int64

    @classmethod
    def take(
        cls, key: tuple[int, int], order: np.ndarray, bounds: np.ndarray, batches: np.ndarray
    ) -> _RankEpoch:
        """Batches `batches` (indices into the epoch's `bounds`), in that order, of the epoch's `order`."""
        sizes = bounds[batches + 1] - bounds[batches]
        return cls(
            key, order[_spans(bounds, batches)], np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        )

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def batch(self, j: int) -> np.ndarray:
        return self.order[self.bounds[j] : self.bounds[j + 1]]


class TokenBatchSampler(Sampler[list[int]]):
    """Batches of example indices holding at most `max_tokens` tokens including padding.

    A batch's cost is `len(batch) * max(lengths in batch)`, the size of its padded (B, L) tensor, and is
    at most `max_tokens`; `batch_size` (if given) also caps the sentences per batch. An example longer
    than `max_tokens` gets a batch of its own (one warning is logged when the sampler is built).

    Order:
        - Training (`shuffle=True`): indices are sorted by length with ties broken at random, packed
          greedily into batches of consecutive indices, and the order of the batches is shuffled. Both
          random draws come from a generator seeded by (seed, epoch): the same seed and epoch give the
          same batches in every run, another epoch gives other batches.
        - Evaluation (`shuffle=False`): indices sorted by length (ties by index), packed greedily, batches
          in that order; every epoch is the same.

    Distribution: with `num_replicas > 1`, rank r yields `batches[r::num_replicas]` of the global list.
    In training the global list is first cut to a multiple of `num_replicas` by dropping its last
    batches (the shuffle makes these differ each epoch), so every rank yields as many batches and the
    ranks see disjoint examples; the dropped examples are not seen that epoch. In evaluation nothing is
    dropped or repeated: every example is seen exactly once across the ranks, which may differ by one
    batch (a collective op in a per-batch step would then hang: gather results at the epoch's end).

    Epochs: `set_epoch(e)` selects epoch e's batches; call it before each training epoch
    (`ParallelDataModule` has Lightning do it).

    Resumption: the sampler counts the batches it has yielded in the current epoch. `state_dict()`
    returns `{"epoch", "seed", "yielded"}`; after `load_state_dict` the next iteration that draws a
    batch skips the first `yielded` batches of that epoch and yields the rest. A state with every batch
    of its epoch yielded (saved at an epoch's end) is the start of the next epoch: it loads as
    `{"epoch": epoch + 1, "yielded": 0}`. A later iteration, or `set_epoch` to another epoch, starts
    from the first batch again. A state given a `"batching": fingerprint()` entry is refused when that
    differs from this sampler's (other examples or lengths, max_tokens, batch_size, bucket or
    num_replicas give other batches). With `num_workers > 0` a DataLoader draws batches
    ahead of the training loop, so `yielded` may exceed the batches trained on; for exact resumption
    there, store the trained batch count as `yielded` (`ParallelDataModule.state_dict` does).

    Args:
        lengths: `lengths[i]` is the size of example i in tokens (a list or a 1-D numpy array); pass
            max(source length, target length + 1), the longer of its `src` and `tgt_in` rows.
        max_tokens: Most tokens in a padded batch, or None for no token budget.
        batch_size: Most sentences in a batch, or None for no cap. At least one of the two is needed.
        shuffle: Training order (bucketed and shuffled) if True, evaluation order (sorted) if False.
        seed: Seed of the training order.
        num_replicas: Number of distributed ranks.
        rank: This process's rank, in `0 .. num_replicas - 1`.
        bucket: Group training examples of similar length (the default). False packs them in random
            order instead (more padding, batches of mixed lengths, as with a shuffled DataLoader).
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        *,
        max_tokens: int | None = None,
        batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        bucket: bool = True,
    ) -> None:
        if max_tokens is None and batch_size is None:
            raise ValueError("TokenBatchSampler: give max_tokens, batch_size or both (both are None)")
        _positive("max_tokens", max_tokens)
        _positive("batch_size", batch_size)
        _positive("num_replicas", num_replicas)
        if not 0 <= rank < num_replicas:
            raise ValueError(
                f"TokenBatchSampler: rank={rank!r}; give 0 <= rank < num_replicas={num_replicas}"
            )
        given = np.asarray(lengths).reshape(-1)
        short = np.flatnonzero(given < 1)
        if len(short):
            raise ValueError(
                f"TokenBatchSampler: lengths[{short[0]}]={given[short[0]]}; every example has at "
                "least one token (pass max(source length, target length + 1))"
            )
        self.lengths = _narrow_copy(given)  # (N,), a copy the caller cannot change
        self.max_tokens, self.batch_size, self.shuffle = max_tokens, batch_size, shuffle
        self.seed, self.num_replicas, self.rank, self.bucket = seed, num_replicas, rank, bucket
        self.epoch, self.yielded = 0, 0
        self._resume_pending = False
        self._starting_at: int | None = None  # an iterator was made and has drawn nothing yet
        self._cache: _RankEpoch | None = None
        self._fingerprint: dict[str, Any] | None = None
        oversize = self.lengths[self.lengths > max_tokens] if max_tokens is not None else self.lengths[:0]
        if len(oversize):
            log.warning(
                "%d of %d examples are longer than max_tokens=%d (longest: %d tokens); each gets a batch of "
                "its own. Raise max_tokens or filter long examples to stay within the budget.",
                len(oversize),
                len(self.lengths),
                max_tokens,
                oversize.max(),
            )

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch whose batches the next iteration yields.

        Resets the yielded-batch count unless a state loaded for this same epoch is pending.
        """
        if not (self._resume_pending and epoch == self.epoch):
            self.yielded, self._resume_pending, self._starting_at = 0, False, None
        self.epoch = epoch

    def _pack(self, order: np.ndarray) -> np.ndarray:
        """Greedily cuts `order` (example indices, (N,)) into batches of consecutive entries: returns
        their boundaries, (batches + 1,) int64 (batch j is `order[bounds[j]:bounds[j + 1]]`).

        A batch takes the next index while its count stays within `batch_size` and count x longest
        length within `max_tokens`; its first index always goes in (alone when over the budget). That
        cost never falls as a batch grows, so each batch's size is one search over a window of at
        most `max_tokens // (its first length)` entries (no batch can hold more).
        """
        count = len(order)
        cap = self.batch_size if self.batch_size is not None else max(count, 1)
        if self.max_tokens is None:
            return np.append(np.arange(0, count, cap, dtype=np.int64), count)
        lengths = self.lengths[order]  # (N,)
        bounds, start = [0], 0
        while start < count:
            window = lengths[start : start + min(cap, max(1, self.max_tokens // int(lengths[start])))]
            cost = np.maximum.accumulate(window) * np.arange(1, len(window) + 1)  # padded size per count
            start += max(1, int(np.searchsorted(cost, self.max_tokens, side="right")))
            bounds.append(start)
        return np.array(bounds, dtype=np.int64)

    def _epoch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This epoch's batches over all ranks: the epoch's order of examples (N,), the batches'
        boundaries in it (`_pack`) and the batches in the order they are dealt to the ranks (in
        training shuffled and cut to a multiple of `num_replicas`)."""
        if self.shuffle:
            generator = _generator(self.seed, self.epoch)
            # (N,) int32: `randperm` draws the same permutation, and leaves the generator in the same
            # state, whatever its integer type (tests/unit/test_batching.py checks both).
            count = len(self.lengths)
            order = torch.randperm(count, generator=generator, dtype=_index_dtype(count)).numpy()
            if self.bucket:
                order = order[np.argsort(self.lengths[order], kind="stable")]  # by length, random ties
            bounds = self._pack(order)
            batches = len(bounds) - 1
            dealt = torch.randperm(batches, generator=generator).numpy()
            return order, bounds, dealt[: batches - batches % self.num_replicas]
        order = np.argsort(self.lengths, kind="stable")
        order = order.astype(np.int32) if len(order) < 2**31 else order  # as `_index_dtype`
        bounds = self._pack(order)
        return order, bounds, np.arange(len(bounds) - 1)

    def _rank_batches(self) -> _RankEpoch:
        """This rank's batches of the epoch (`batches[rank::num_replicas]` of `_epoch`), kept until the
        seed or epoch changes."""
        key = (self.seed, self.epoch)
        if self._cache is None or self._cache.key != key:
            self._cache = None  # the old epoch's arrays go before the new ones are made
            order, bounds, dealt = self._epoch()
            self._cache = _RankEpoch.take(key, order, bounds, dealt[self.rank :: self.num_replicas])
        return self._cache

    def __iter__(self) -> Iterator[list[int]]:
        # A generator: the position is reset (or a loaded one taken up) when the first batch is drawn,
        # not when the iterator is made. A DataLoader with workers makes an iterator of its batch sampler
        # and replaces it with a second one before drawing anything; the loaded position must survive
        # the first. Until then `state_dict()` reports where the new pass will start.
        self._starting_at = self.yielded if self._resume_pending else 0
        return self._iterate()

    def _iterate(self) -> Iterator[list[int]]:
        skip = self.yielded if self._resume_pending else 0
        self._resume_pending, self._starting_at = False, None
        self.yielded = skip
        batches = self._rank_batches()
        for j in range(skip, len(batches)):
            self.yielded += 1
            yield batches.batch(j).tolist()

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch (the whole epoch, a resumed part included)."""
        return len(self._rank_batches())

    def fingerprint(self) -> dict[str, Any]:
        """What fixes the batches besides seed and epoch: `{"examples", "lengths" (a hash), "max_tokens",
        "batch_size", "bucket", "num_replicas"}`. Equal fingerprints give equal batches."""
        if self._fingerprint is None:
            # The hash of ",".join(lengths), fed in chunks: no list or string of all N lengths (4.5M
            # pairs: ~200 MB for a moment, kept by the allocator) in every rank.
            digest = hashlib.blake2b(digest_size=8)
            for start in range(0, len(self.lengths), FINGERPRINT_CHUNK):
                text = ",".join(map(str, self.lengths[start : start + FINGERPRINT_CHUNK].tolist()))
                digest.update((text if start == 0 else "," + text).encode())
            self._fingerprint = {
                "examples": len(self.lengths), "lengths": digest.hexdigest(), "max_tokens": self.max_tokens,
                "batch_size": self.batch_size, "bucket": self.bucket, "num_replicas": self.num_replicas,
            }  # fmt: skip
        return dict(self._fingerprint)

    def state_dict(self) -> dict[str, int]:
        """The position in the epoch: `{"epoch": e, "seed": s, "yielded": batches yielded so far}`."""
        yielded = self.yielded if self._starting_at is None else self._starting_at
        return {"epoch": self.epoch, "seed": self.seed, "yielded": yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a `state_dict()`; the next iteration resumes after its `yielded` batches (the next
        epoch from its first batch when all of the epoch's were yielded). With a `batching` entry (a
        `fingerprint()`), the state must come from a sampler making the same batches.

        Raises:
            ValueError: A key is missing; `batching` differs from this sampler's (each difference
                named); or `yielded` is negative or more than the epoch's batches.
        """
        missing = sorted({"epoch", "seed", "yielded"} - set(state))
        if missing:
            raise ValueError(f"TokenBatchSampler.load_state_dict: state lacks {missing}; pass a state_dict()")
        saved, ours = state.get("batching"), self.fingerprint()
        if saved is not None:
            names = {"examples": "training examples", "lengths": "hash of the example lengths"}
            differences = [
                f"{names.get(key, key)}: {saved.get(key)!r} saved, {value!r} now"
                for key, value in ours.items()
                if saved.get(key) != value
            ]
            if differences:
                raise ValueError(
                    f"TokenBatchSampler.load_state_dict: the position was saved for other training "
                    f"batches ({'; '.join(differences)})"
                )
        self.epoch, self.seed = int(state["epoch"]), int(state["seed"])
        yielded = int(state["yielded"])
        if not 0 <= yielded <= len(self):
            raise ValueError(
                f"TokenBatchSampler.load_state_dict: yielded={yielded} but epoch {self.epoch} has "
                f"{len(self)} batches on this rank; was the state saved with other lengths, max_tokens, "
                "batch_size or num_replicas?"
            )
        if yielded == len(self) and yielded > 0:  # saved at the epoch's end: the next epoch starts
            self.epoch, yielded = self.epoch + 1, 0
        self.yielded, self._resume_pending, self._starting_at = yielded, True, None

    def padding_ratio(self) -> float:
        """Padding tokens / tokens of the padded batches, summed over this epoch's batches of all ranks."""
        order, bounds, dealt = self._epoch()
        if not len(dealt):
            return 0.0
        lengths = self.lengths[order]
        counts = np.diff(bounds)[dealt]  # (batches,)
        longest = np.maximum.reduceat(lengths, bounds[:-1])[dealt]
        padded, total = int((counts * longest).sum()), int(lengths[_spans(bounds, dealt)].sum())
        return (padded - total) / padded
