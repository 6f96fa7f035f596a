"""The examples of a split as a DataLoader serves them (`Examples`), how its workers start
(`worker_context`) and how they end with the process they serve (`end_with`).

Everything a DataLoader worker needs to read batches lives here, apart from the data modules (which
import Lightning): a worker process imports this module, torch and numpy, not Lightning.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import sys
import threading
import time
from multiprocessing import forkserver
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import torch
from torch.utils.data import Dataset

from attnlab.data.batching import Gathered, cut_source

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from attnlab.data.prepare import EncodedSplit

Example = tuple[list[int], list[int], int]  # (source ids ending in eos, bare target ids, example index)


class Examples(Dataset):
    """The examples of an `EncodedSplit` as (source ids, target ids, example index) triples for the
    `Collator`, each read from the split when asked for.

    `keep` drops examples (the rest keep their example indices) and `cut` shortens them, both
    without copying the split: kept indices and limits are recorded and applied in `__getitem__`.
    Integer indices and slices work as on a list (a slice gives a list of triples).

    Args:
        split: The encoded examples.
        eos_id: The id kept at the end of a cut source (`cut_source`).
    """

    def __init__(self, split: EncodedSplit, eos_id: int) -> None:
        self.split, self.eos_id = split, eos_id
        self.rows: np.ndarray | None = None  # the example indices served (None: all of them)
        self._shared: torch.Tensor | None = None  # `rows` in shared memory, once pickled (`__getstate__`)
        self.source_limit: int | None = None  # sources cut to this many ids, keeping eos
        self.target_limit: int | None = None  # targets cut to this many ids

    def __len__(self) -> int:
        return len(self.split) if self.rows is None else len(self.rows)

    @overload
    def __getitem__(self, k: int) -> Example: ...
    @overload
    def __getitem__(self, k: slice) -> list[Example]: ...
    def __getitem__(self, k: int | slice) -> Example | list[Example]:
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        if not -len(self) <= k < len(self):
            raise IndexError(f"example {k} of {len(self)}")
        k %= len(self)
        i = k if self.rows is None else int(self.rows[k])
        src, tgt = self.split.pair(i)
        if self.source_limit is not None:
            src = cut_source(src, self.source_limit, self.eos_id)
        return src, tgt if self.target_limit is None else tgt[: self.target_limit], i

    def __iter__(self) -> Iterator[Example]:
        return (self[k] for k in range(len(self)))

    def __getitems__(self, ks: Sequence[int]) -> Gathered:
        """Examples `ks` at once, as the `Collator` takes them (the DataLoader asks for a batch's
        examples this way): the same examples as `self[k]` for each k, read with array operations."""
        index = np.asarray(ks, dtype=np.int64)
        if len(index) and not (-len(self) <= index.min() and index.max() < len(self)):
            raise IndexError(f"examples {index.min()}..{index.max()} of {len(self)}")
        index %= max(len(self), 1)
        if self.rows is not None:
            index = self.rows[index]
        src, src_lengths, tgt, tgt_lengths = self.split.gather(index)
        if self.source_limit is not None:
            cut = src_lengths > self.source_limit
            if cut.any():  # `cut_source`: eos stays the last id
                src_lengths = np.minimum(src_lengths, self.source_limit)
                src[cut, self.source_limit - 1] = self.eos_id
        if self.target_limit is not None:
            tgt_lengths = np.minimum(tgt_lengths, self.target_limit)
        return Gathered(src, src_lengths, tgt, tgt_lengths, index)

    def _served(self, lengths: np.ndarray, limit: int | None) -> np.ndarray:
        lengths = lengths if self.rows is None else lengths[self.rows]
        return lengths if limit is None else np.minimum(lengths, limit)

    def source_lengths(self) -> np.ndarray:
        """Ids per served source (eos included), after any cut: (len(self),) int64."""
        return self._served(self.split.src_lengths, self.source_limit)

    def target_lengths(self) -> np.ndarray:
        """Ids per served target, after any cut: (len(self),) int64."""
        return self._served(self.split.tgt_lengths, self.target_limit)

    def lengths(self) -> np.ndarray:
        """Tokens per example as `TokenBatchSampler` counts them: max(source, target + 1)."""
        return np.maximum(self.source_lengths(), self.target_lengths() + 1)

    def keep(self, mask: np.ndarray) -> None:
        """Serve only the examples where `mask` ((len(self),) bool) is True.

        The served indices are int32 below 2^31 examples: 4 bytes per example in every rank (and once for
        all of a rank's DataLoader workers, `shared_rows`) instead of 8."""
        if self.rows is None:
            rows = np.flatnonzero(mask)
            self.rows = rows.astype(np.int32) if len(self.split) < 2**31 else rows
        else:
            self.rows = self.rows[mask]
        self._shared = None

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__, _shared=None)  # a plain pickle or deepcopy: the indices' values

    def shared_rows(self) -> torch.Tensor:
        """The served indices as a tensor in shared memory (made once, until `keep` changes them), which
        this process then reads too: what a DataLoader worker gets (`_reduce_for_worker`)."""
        if self._shared is None:
            self._shared = torch.from_numpy(self.rows).share_memory_()  # a copy: `rows` keeps its own memory
            self.rows = self._shared.numpy()
        return self._shared

    def cut(self, source_limit: int, target_limit: int | None = None) -> np.ndarray:
        """Cut sources to `source_limit` ids with `cut_source` (keeping eos) and with `target_limit`
        targets to that many ids; returns which examples ((len(self),) bool) this cut shortens."""
        cut = self.source_lengths() > source_limit
        self.source_limit = min(
            source_limit, source_limit if self.source_limit is None else self.source_limit
        )
        if target_limit is not None:
            cut |= self.target_lengths() > target_limit
            self.target_limit = min(
                target_limit, target_limit if self.target_limit is None else self.target_limit
            )
        return cut


def worker_context() -> multiprocessing.context.BaseContext | None:
    """How DataLoader workers start: forked from a fork server where the platform has one (Linux, macOS),
    the platform's default elsewhere (spawn on Windows). Called by each loader, in the process that
    iterates it; the server starts with the first.

    Not `fork` from the run's process: by the time a loader starts its workers that process has threads
    (the queue feeder thread of every loader already started: Lightning starts the training loader's
    workers when it counts the epoch's batches, before validation's; gloo's threads under DDP), and a
    forked copy inherits whatever lock one of them held at that instant. A DDP run's worker was seen to
    hang that way before its first batch. The fork server is a process of its own, started once per
    process from a fresh interpreter, which has none of the run's threads; it imports this module and
    the main module when that was run by name (`python -m`), so a worker forked from it starts without
    importing torch again (and `attnlab.data.worker_server`, which quiets runpy's warning about that).
    As with `spawn`, each worker then runs the main module's top level as `__mp_main__`: a script that
    starts a run with `num_workers > 0` needs the usual `if __name__ == "__main__":` guard. A process
    forked from one that started a fork server (fork-based DDP after an earlier run in the same process)
    cannot use that server: its workers are spawned.
    Memory-mapped splits travel to workers as file names (`EncodedSplit.__getstate__`) and kept indices
    through shared memory (`Examples.shared_rows`), so nothing large is copied."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    main = getattr(sys.modules["__main__"], "__spec__", None)
    preload = [__name__, "attnlab.data.worker_server", *([main.name] if main is not None else [])]
    forkserver.set_forkserver_preload(preload)
    try:
        forkserver.ensure_running()
    except ChildProcessError:  # the server is this process's parent's
        return multiprocessing.get_context("spawn")
    return multiprocessing.get_context("forkserver")


def end_with(pid: int, worker_id: int) -> None:
    """A DataLoader worker's `worker_init_fn` (`functools.partial(end_with, os.getpid())` in the process
    that iterates the loader): end this worker as soon as process `pid` has ended.

    torch's workers end when their parent process does, and a worker forked by the fork server
    (`worker_context`) has the server as its parent, which in turn waits for its workers: with the run's
    process killed (SIGKILL, the OOM killer) both lived on, holding the run's output pipes. A daemon thread
    waits for `pid` and ends the worker. On Linux 5.3+ it waits on a pidfd, which wakes when `pid` ends even
    before its parent reaps it. Elsewhere it polls every second, and there an ended but unreaped `pid` (a
    zombie) still counts as running: the worker ends once the run's parent has reaped it.

    The worker ignores SIGINT: a Ctrl-C at a terminal reaches every process of the foreground group, and a
    worker's KeyboardInterrupt would end it under a run that stops at the end of its step (`Preemption`).
    One forked from the fork server ignores it from its start (`attnlab.data.worker_server`); a spawned one
    from here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_after, args=(pid,), name=f"end-with-{pid}", daemon=True).start()


def _exit_after(pid: int) -> None:
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here, or `pid` has already ended
        while _running(pid):
            time.sleep(1.0)
    else:
        readable = select.poll()
        readable.register(handle, select.POLLIN)
        readable.poll()  # readable once `pid` has ended
    os._exit(0)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        pass
    return True


def _reduce_for_worker(examples: Examples) -> tuple[Any, tuple[dict[str, Any]]]:
    """How `ForkingPickler`, which sends a dataset to its DataLoader workers, pickles `Examples`: the
    kept indices as a tensor in shared memory, which torch's reduction sends as a handle, so that every
    worker maps one copy. Plain pickles and deepcopies hold the values (`Examples.__getstate__`)."""
    state = examples.__getstate__()
    if examples.rows is not None:
        state["rows"] = examples.shared_rows()
    return _rebuild, (state,)


def _rebuild(state: dict[str, Any]) -> Examples:
    examples = Examples.__new__(Examples)
    rows = state["rows"]
    if isinstance(rows, torch.Tensor):
        state = dict(state, rows=rows.numpy(), _shared=rows)
    examples.__dict__.update(state)
    return examples


ForkingPickler.register(Examples, _reduce_for_worker)
