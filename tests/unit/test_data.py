"""Data: the synthetic task, the collator and the `SyntheticDataModule` built on them."""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import os
import pickle
import random
import re
import signal
import subprocess
import time
from collections import Counter
from copy import deepcopy
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from attnlab.data.batching import Collator, pad, restore_order
from attnlab.data.datamodule import SyntheticDataModule
from attnlab.data.examples import Examples, end_with, worker_context
from attnlab.data.prepare import EncodedSplit
from attnlab.data.synthetic import SyntheticData
from attnlab.data.tokenizer import SPECIAL_IDS

PAD, BOS, EOS, UNK = 0, 1, 2, 3
FIRST_SYMBOL = 4
SPLITS = ("train", "val", "test")


def small(**overrides: Any) -> SyntheticData:
    return SyntheticData(**{"n_train": 200, "n_val": 50, "n_test": 50, **overrides})


def rotate(symbols: list[int]) -> list[int]:
    """x_{k+1}..x_n x_1..x_k with k = x_1 mod n (x_i the token ids)."""
    k = symbols[0] % len(symbols)
    return symbols[k:] + symbols[:k]


# ---------------------------------------------------------------------------------------------------------
# SyntheticData


def test_special_ids() -> None:
    assert SPECIAL_IDS == {"pad_id": PAD, "bos_id": BOS, "eos_id": EOS, "unk_id": UNK}
    assert small(n_symbols=16).fixed_vocab_size == 20
    assert small(max_len=9).max_positions_needed == 10


@pytest.mark.parametrize("split", SPLITS)
def test_same_seed_same_examples_other_seed_different(split: str) -> None:
    data = small(seed=7)
    assert data.examples(split) == small(seed=7).examples(split)
    assert data.examples(split) == data.examples(split)
    assert data.examples(split) != small(seed=8).examples(split)


def test_splits_differ_from_each_other() -> None:
    data = small(n_train=50, n_val=50, n_test=50)
    train, val, test = (data.examples(s) for s in SPLITS)
    assert train != val and train != test and val != test
    assert len({tuple(s) for s, _ in train} & {tuple(s) for s, _ in test}) < 10


def test_split_sizes_are_respected() -> None:
    data = small(n_train=37, n_val=5, n_test=11)
    assert [len(data.examples(s)) for s in SPLITS] == [37, 5, 11]


def test_changing_n_train_leaves_val_and_test_unchanged() -> None:
    a, b = small(n_train=30), small(n_train=300)
    assert a.examples("val") == b.examples("val")
    assert a.examples("test") == b.examples("test")
    assert len(a.examples("train")) == 30 and len(b.examples("train")) == 300


@pytest.mark.parametrize("task", ["reverse", "rotate"])
def test_lengths_ids_and_eos(task: str) -> None:
    data = small(task=task, n_symbols=5, min_len=3, max_len=6)
    lengths, drawn = set(), set()
    for split in SPLITS:
        for src, tgt in data.examples(split):
            assert src[-1] == EOS
            symbols = src[:-1]
            lengths.add(len(symbols))
            drawn.update(symbols)
            assert 3 <= len(symbols) <= 6
            assert all(FIRST_SYMBOL <= t < FIRST_SYMBOL + 5 for t in symbols + tgt)
            assert len(tgt) == len(symbols)
            assert sorted(tgt) == sorted(symbols)
    assert lengths == {3, 4, 5, 6}  # both ends of the range are drawn
    assert drawn == set(range(FIRST_SYMBOL, FIRST_SYMBOL + 5))  # every symbol of the vocabulary


def test_sentences_of_one_length_when_min_len_equals_max_len() -> None:
    examples = small(min_len=5, max_len=5, task="rotate").examples("val")
    assert {len(src) for src, _ in examples} == {6}


def test_reverse_targets() -> None:
    for src, tgt in small(task="reverse").examples("train"):
        assert tgt == src[:-1][::-1]


def test_rotate_targets() -> None:
    examples = small(task="rotate").examples("train")
    for src, tgt in examples:
        assert tgt == rotate(src[:-1])
    assert any(tgt != src[:-1] for src, tgt in examples)  # some rotations are non-trivial


def test_translate_closed_forms() -> None:
    assert SyntheticData(task="reverse").translate([4, 5, 6, 7]) == [7, 6, 5, 4]
    # k = 6 mod 4 = 2
    assert SyntheticData(task="rotate").translate([6, 5, 4, 7]) == [4, 7, 6, 5]
    # k = 8 mod 4 = 0
    assert SyntheticData(task="rotate").translate([8, 5, 4, 7]) == [8, 5, 4, 7]


def distinct_sources(n: int, length: int, n_symbols: int = 16, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [rng.sample(range(FIRST_SYMBOL, FIRST_SYMBOL + n_symbols), length) for _ in range(n)]


def test_reverse_target_changes_under_every_permutation() -> None:
    data = SyntheticData(task="reverse")
    for src in distinct_sources(20, 4):
        for perm in itertools.permutations(src):
            if list(perm) != src:
                assert data.translate(list(perm)) != data.translate(src)


@pytest.mark.parametrize("task", ["reverse", "rotate"])
def test_bag_of_source_tokens_does_not_determine_the_target(task: str) -> None:
    """For every random source, some reordering of the same tokens has another target."""
    data = SyntheticData(task=task)
    rng = random.Random(1)
    for length in (3, 4, 6, 8):
        for src in distinct_sources(20, length, seed=length):
            target = data.translate(src)
            shuffled = [rng.sample(src, len(src)) for _ in range(10)]
            changed = [p for p in shuffled if p != src and data.translate(p) != target]
            assert changed, f"no permutation of {src} changes its {task} target"
            assert Counter(changed[0]) == Counter(src)


BAD_DATA: list[tuple[dict[str, Any], str]] = [
    ({"min_len": 5, "max_len": 3}, "min_len=5"),
    ({"n_symbols": 0}, "n_symbols=0"),
    ({"min_len": 0}, "min_len=0"),
    ({"n_val": 0}, "n_val=0"),
    ({"n_test": -1}, "n_test=-1"),
    ({"batch_size": 0}, "batch_size=0"),
    ({"num_workers": -1}, "num_workers=-1"),
    ({"task": "sort"}, "task='sort'"),
    ({"n_train": "many"}, "n_train='many'"),
]


@pytest.mark.parametrize(("kwargs", "named"), BAD_DATA, ids=[n for _, n in BAD_DATA])
def test_synthetic_data_rejects_bad_values(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        SyntheticData(**kwargs)


# ---------------------------------------------------------------------------------------------------------
# Collator and pad


def test_pad_right_pads() -> None:
    out = pad([[5, 6, 7], [8], [9, 10]], pad_id=PAD)
    assert out.dtype == torch.long
    assert out.tolist() == [[5, 6, 7], [8, PAD, PAD], [9, 10, PAD]]
    assert pad([[4, 4]], pad_id=9).tolist() == [[4, 4]]
    assert pad([[4], []], pad_id=9).tolist() == [[4], [9]]


def test_collator_layout() -> None:
    pairs = [([5, 6, 7, EOS], [7, 6, 5]), ([8, EOS], [8]), ([9, 10, EOS], [10, 9])]
    batch = Collator(pad_id=PAD, bos_id=BOS, eos_id=EOS)(pairs)
    assert set(batch) == {"src", "tgt_in", "tgt_out"}
    assert batch["src"].tolist() == [[5, 6, 7, EOS], [8, EOS, PAD, PAD], [9, 10, EOS, PAD]]
    assert batch["tgt_in"].tolist() == [[BOS, 7, 6, 5], [BOS, 8, PAD, PAD], [BOS, 10, 9, PAD]]
    assert batch["tgt_out"].tolist() == [[7, 6, 5, EOS], [8, EOS, PAD, PAD], [10, 9, EOS, PAD]]
    assert all(t.dtype == torch.long for t in batch.values())


def check_batch(batch: dict[str, Tensor]) -> None:
    """Structural invariants of a collated batch."""
    src, tgt_in, tgt_out = batch["src"], batch["tgt_in"], batch["tgt_out"]
    assert tgt_in.shape == tgt_out.shape and src.size(0) == tgt_in.size(0)
    assert (tgt_in[:, 0] == BOS).all()
    real = tgt_out != PAD
    assert torch.equal(real, tgt_in != PAD)
    lengths = real.sum(1)
    rows = torch.arange(src.size(0))
    assert (tgt_out[rows, lengths - 1] == EOS).all()
    assert (src[rows, (src != PAD).sum(1) - 1] == EOS).all()
    # teacher forcing: the input at t+1 is the output at t
    shifted = real[:, 1:]
    assert torch.equal(tgt_in[:, 1:][shifted], tgt_out[:, :-1][shifted])
    for mask in (src != PAD, real):  # padding is a suffix
        assert torch.equal(mask, mask.cummin(dim=1).values)


def test_collator_invariants_on_synthetic_examples() -> None:
    data = small(min_len=1, max_len=9)
    collate = Collator(pad_id=PAD, bos_id=BOS, eos_id=EOS)
    examples = data.examples("train")
    batch = collate(examples[:32])
    check_batch(batch)
    assert batch["src"].shape == (32, max(len(s) for s, _ in examples[:32]))
    assert batch["tgt_in"].shape == (32, 1 + max(len(t) for _, t in examples[:32]))


# ---------------------------------------------------------------------------------------------------------
# SyntheticDataModule


def rows(loader: Any) -> list[tuple[int, ...]]:
    """The source rows (pad stripped) of every batch, in order."""
    out = []
    for batch in loader:
        check_batch(batch)
        assert batch["src"].size(0) <= 8
        out += [tuple(t for t in row if t != PAD) for row in batch["src"].tolist()]
    return out


def datamodule(seed: int = 1234) -> SyntheticDataModule:
    return SyntheticData(n_train=100, n_val=20, n_test=20, batch_size=8, seed=seed).datamodule()


def test_datamodule_attributes() -> None:
    dm = datamodule()
    assert dm.src_vocab_size == dm.tgt_vocab_size == 20
    assert (dm.pad_id, dm.bos_id, dm.eos_id, dm.unk_id) == (PAD, BOS, EOS, UNK)
    assert dm.batch_size == 8
    assert dm.seed == 1234


def test_train_loader_covers_every_example_once_per_epoch() -> None:
    dm = datamodule()
    expected = Counter(tuple(s) for s, _ in SyntheticData(n_train=100, n_val=20, n_test=20).examples("train"))
    loader = dm.train_dataloader()
    first = rows(loader)
    loader.batch_sampler.sampler.set_epoch(1)  # what Lightning calls at each epoch's start
    second = rows(loader)
    assert Counter(first) == expected
    assert Counter(second) == expected
    assert len(loader) == 13  # ceil(100 / 8)
    unshuffled = [tuple(s) for s, _, _ in dm.splits["train"]]
    assert first != unshuffled
    assert first != second  # a new order each epoch


def test_train_order_depends_only_on_the_seed() -> None:
    assert rows(datamodule().train_dataloader()) == rows(datamodule().train_dataloader())
    data = SyntheticData(n_train=100, n_val=20, n_test=20, batch_size=8)
    same_data = [data.datamodule(), data.datamodule()]
    same_data[1].seed = data.seed + 1  # the same examples, another shuffle seed
    a, b = (rows(dm.train_dataloader()) for dm in same_data)
    assert Counter(a) == Counter(b)
    assert a != b


def test_training_batches_mix_sentence_lengths() -> None:
    """The synthetic task's training batches are drawn without length bucketing (its docstring: batches of
    similar lengths were measured to slow its learning): sentences of 4 to 12 symbols, batches of 8 whose
    lengths spread about as widely as the whole set's, where buckets of sorted lengths span one or two."""
    spreads = []
    for batch in datamodule().train_dataloader():
        lengths = (batch["src"] != PAD).sum(dim=1)
        spreads.append(int(lengths.max() - lengths.min()))
    assert sum(spreads) / len(spreads) > 4, spreads


def test_loader_workers_start_from_the_fork_server_and_serve_the_batches_of_a_loader_without_them() -> None:
    """A run's process has threads when its loaders start workers (queue feeder threads, gloo's): a
    worker forked from it inherits any lock one of them held, and one was seen to hang that way. Workers
    are forked from the fork server instead, a process without those threads, so none is this process's
    child."""
    data = SyntheticData(n_train=100, n_val=20, n_test=20, batch_size=8)
    plain, with_worker = data.datamodule(), dataclasses.replace(data, num_workers=1).datamodule()
    assert plain.train_dataloader().multiprocessing_context is None
    for dm in (plain, with_worker):  # kept examples' indices go to the worker (`Examples.shared_rows`)
        dm.setup()
        dm.splits["train"].keep(np.arange(100) % 3 != 0)
    for make in ("train_dataloader", "val_dataloader"):
        loader = getattr(with_worker, make)()
        assert loader.multiprocessing_context.get_start_method() == "forkserver"
        batches = iter(loader)
        first = next(batches)
        workers = [p.pid for p in multiprocessing.active_children()]  # this loader's
        assert workers, "no worker process is running"
        for pid in workers:
            status = Path(f"/proc/{pid}/status").read_text()
            assert f"PPid:\t{os.getpid()}\n" not in status, f"worker {pid} was forked from this process"
        listed = [{k: v.tolist() for k, v in batch.items()} for batch in (first, *batches)]
        assert listed == [{k: v.tolist() for k, v in batch.items()} for batch in getattr(plain, make)()]
        assert rows(loader) == rows(getattr(plain, make)())  # a second epoch too (persistent workers)


def test_kept_examples_indices_reach_a_worker_through_shared_memory_not_as_a_copy() -> None:
    """`ForkingPickler`, which sends a dataset to its DataLoader workers, carries the served indices (4
    bytes an example) as a handle to shared memory: every worker maps one copy, which this process then
    reads too. A plain pickle or a deepcopy holds the values and moves nothing into shared memory, and a
    copy so made shares again safely."""
    split = EncodedSplit.from_pairs([([5, 2], [6])] * 200_000, vocab_size=10)
    examples = Examples(split, eos_id=EOS)
    examples.keep(np.arange(200_000) % 4 != 0)
    expected = examples[:50]
    plain = pickle.dumps(examples)
    assert examples._shared is None  # a plain pickle changed nothing
    forked = ForkingPickler.dumps(examples)
    assert examples.rows.nbytes == 600_000  # 150,000 int32 indices, which the handle replaces (< 1 KB)
    assert len(forked) < len(plain) - 600_000 + 1_000
    for data in (forked, plain):
        again = pickle.loads(data)
        assert len(again) == 150_000 and again[:50] == expected and again[-1] == examples[-1]
    assert examples[:50] == expected and examples._shared.is_shared()  # this process reads the shared copy
    for copy in (pickle.loads(plain), deepcopy(examples)):  # each shares its own indices when sent on
        ForkingPickler.dumps(copy)
        filler = [np.full(150_000, -7, dtype=np.int32) for _ in range(20)]  # reuses any freed memory
        assert copy[:50] == expected and copy[-1] == examples[-1] and len(filler) == 20


def test_examples_index_keep_and_cut_as_documented() -> None:
    """Indices as on a list; a second `keep` selects among the examples served (which keep their example
    indices), also in what a DataLoader worker gets; a second, looser `cut` leaves the first one's limits."""
    pairs = [([FIRST_SYMBOL + k] * (k % 5 + 1) + [EOS], [FIRST_SYMBOL + k] * (k % 4 + 1)) for k in range(20)]
    examples = Examples(EncodedSplit.from_pairs(pairs, vocab_size=30), eos_id=EOS)
    assert examples[-1] == examples[19] == (pairs[19][0], pairs[19][1], 19)
    for k in (20, -21):
        with pytest.raises(IndexError):
            examples[k]
    examples.keep(np.arange(20) % 2 == 0)
    ForkingPickler.dumps(examples)  # the served indices now in shared memory
    examples.keep(np.arange(10) < 5)
    expected = [(*pairs[i], i) for i in (0, 2, 4, 6, 8)]
    assert list(examples) == expected
    assert list(pickle.loads(ForkingPickler.dumps(examples))) == expected
    cut = Examples(EncodedSplit.from_pairs(pairs, vocab_size=30), eos_id=EOS)
    cut.cut(3, 2)
    assert not cut.cut(5, 4).any()
    for (src, tgt, i), (s, t, j) in zip(cut, Examples(cut.split, eos_id=EOS), strict=True):
        assert i == j and src == (s if len(s) <= 3 else [*s[:2], EOS]) and tgt == t[:2]


def _serve_until_ended(pid: int, pidfd: bool) -> None:
    if not pidfd:  # as on a platform without pidfds (macOS): `end_with` polls
        delattr(os, "pidfd_open")
    end_with(pid, 0)
    time.sleep(60)
    os._exit(3)


@pytest.mark.parametrize("pidfd", [True, False])
def test_a_dataloader_worker_ends_as_soon_as_the_process_it_serves_ends(pidfd: bool) -> None:
    """`end_with`: a worker whose run's process was killed (its parent, the fork server, may live on)."""
    served = subprocess.Popen(["sleep", "60"])
    fork = multiprocessing.get_context("fork")
    worker = fork.Process(target=_serve_until_ended, args=(served.pid, pidfd))
    worker.start()
    try:
        time.sleep(1.0)
        assert worker.is_alive()  # while the process it serves runs
        served.kill()
        served.wait()
        worker.join(20)
        assert worker.exitcode == 0
    finally:
        served.kill()
        served.wait()
        worker.kill()
        worker.join()


def test_a_process_forked_after_the_fork_server_started_spawns_its_workers() -> None:
    """The fork server belongs to the process that started it: a fork of that process (fork-based DDP after
    an earlier run in the same process) spawns its workers instead of failing."""
    assert worker_context().get_start_method() == "forkserver"  # started here, if it was not yet
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        try:
            os.write(write, worker_context().get_start_method().encode())
        finally:
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 60  # a fork of this threaded process could hang: never wait for good
    while os.waitpid(child, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            pytest.fail("the forked child did not end within 60 s")
        time.sleep(0.02)
    assert os.read(read, 100) == b"spawn"
    os.close(read)


def test_a_process_of_the_fork_server_ignores_ctrl_c_from_its_start() -> None:
    """A DataLoader worker forked from the fork server ignores SIGINT from its first instruction, not only
    once its `worker_init_fn` (`end_with`) runs: a Ctrl-C while it starts would end it and leave the run,
    which stops at the end of its step, without batches. This process still gets its KeyboardInterrupt."""
    before = signal.getsignal(signal.SIGINT)
    context = worker_context()
    assert context.get_start_method() == "forkserver"
    child = context.Process(target=signal.raise_signal, args=(signal.SIGINT,))  # its first instruction
    child.start()
    child.join(60)
    assert child.exitcode == 0  # (a KeyboardInterrupt: 1)
    assert signal.getsignal(signal.SIGINT) is before is signal.default_int_handler
    import importlib
    import warnings

    import attnlab.data.worker_server as server

    filters = list(warnings.filters)
    try:  # imported anywhere else (a tool walking the package), it changes nothing
        importlib.reload(server)
        assert signal.getsignal(signal.SIGINT) is before and warnings.filters == filters
    finally:
        signal.signal(signal.SIGINT, before)
        warnings.filters[:] = filters


RUNPY_WARNING = (
    "'attnlab.cli.train' found in sys.modules after import of package 'attnlab.cli', but prior to execution "
    "of 'attnlab.cli.train'; this may result in unpredictable behaviour"
)


def test_a_process_of_the_fork_server_silences_runpys_warning_about_the_preloaded_main_module() -> None:
    """A worker of a run started with `python -m attnlab.cli.train` runs the main module again, and runpy
    warns that the fork server preloaded it; the worker silences that warning alone: another RuntimeWarning
    is still shown (the child's exit status counts the warnings it would show)."""
    code = (
        "import sys, warnings\n"
        "with warnings.catch_warnings(record=True) as shown:\n"
        f"    warnings.warn({RUNPY_WARNING!r}, RuntimeWarning)\n"
        "    warnings.warn('overflow encountered in exp', RuntimeWarning)\n"
        "sys.exit(len(shown))\n"
    )
    child = worker_context().Process(target=exec, args=(code,))
    child.start()
    child.join(60)
    assert child.exitcode == 1  # (no filter: 2; every RuntimeWarning silenced: 0)


@pytest.mark.parametrize("split", ["val", "test"])
def test_eval_loaders_are_deterministic_and_restore_the_original_order(split: str) -> None:
    dm = datamodule()
    loader = dm.val_dataloader() if split == "val" else dm.test_dataloader()
    examples = SyntheticData(n_train=100, n_val=20, n_test=20).examples(split)
    assert rows(loader) == rows(loader)
    indices, pairs = [], []
    for batch in loader:
        indices += batch["index"].tolist()
        for src, tgt in zip(batch["src"].tolist(), batch["tgt_out"].tolist(), strict=True):
            pairs.append(([t for t in src if t != PAD], [t for t in tgt if t != PAD][:-1]))
    assert restore_order(indices, pairs) == examples


class _SigintHandler(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> bool:
        return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_dataloader_worker_ignores_ctrl_c_which_its_run_handles() -> None:
    """A terminal's Ctrl-C reaches the workers too; the run saves at the end of its step (`Preemption`),
    which a worker ended by its KeyboardInterrupt would leave without batches."""
    from functools import partial

    loader = torch.utils.data.DataLoader(_SigintHandler(), num_workers=1, batch_size=None,
                                         worker_init_fn=partial(end_with, os.getpid()))  # fmt: skip
    assert list(loader) == [True]
