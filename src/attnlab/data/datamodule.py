"""LightningDataModules: `ParallelDataModule` batching, and its synthetic and real-corpus sources.

Batches come from `TokenBatchSampler`: length-bucketed token batches (or sentence batches) shuffled per
epoch with a seed, sharded across DDP ranks by the sampler itself (the trainer presets set
`use_distributed_sampler: false`), and evaluation sets seen exactly once across ranks. Each example
carries its index, so outputs can be put back into the original order (`batching.restore_order`).

A split is served by `Examples`, which reads each example from its `EncodedSplit` (memory-mapped flat
arrays for a real corpus) only when a batch asks for it: nothing is copied per example, and cutting or
dropping examples records limits and kept indices rather than new lists.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING, Any

import lightning as L
import numpy as np
from torch.utils.data import DataLoader

from attnlab.data.batching import Collator, TokenBatchSampler
from attnlab.data.download import DataError
from attnlab.data.examples import Examples, end_with, worker_context
from attnlab.data.prepare import EncodedSplit, Prepared, prepare
from attnlab.data.tokenizer import SPECIAL_IDS
from attnlab.typed import ConfigError

if TYPE_CHECKING:
    from attnlab.data.corpora import CorpusData
    from attnlab.data.synthetic import SyntheticData

log = logging.getLogger(__name__)


class ParallelDataModule(L.LightningDataModule):
    """Serves `train`, `val` and test splits of id pairs as padded batches.

    Subclasses fill `self.splits` (and the vocabulary sizes) in `setup`.

    Args:
        max_tokens: Tokens per padded batch (None: sentence batches of `batch_size`).
        batch_size: Sentences per batch (a cap when `max_tokens` is set).
        num_workers: DataLoader workers.
        seed: Seed of the training shuffle (the same seed gives the same batches).
        bucket: Batch training examples of similar length together (see `TokenBatchSampler`).
    """

    def __init__(
        self,
        *,
        max_tokens: int | None,
        batch_size: int | None,
        num_workers: int,
        seed: int,
        bucket: bool = True,
    ) -> None:
        super().__init__()
        self.max_tokens, self.batch_size, self.num_workers, self.seed = (
            max_tokens,
            batch_size,
            num_workers,
            seed,
        )
        self.bucket = bucket
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = (SPECIAL_IDS[k] for k in SPECIAL_IDS)
        self.collate = Collator(pad_id=self.pad_id, bos_id=self.bos_id, eos_id=self.eos_id)
        self.src_vocab_size = self.tgt_vocab_size = 0
        self.splits: dict[str, Examples] = {}
        self.test_sets: list[str] = ["test"]
        # The training sampler positioned by a loaded checkpoint (`load_state_dict`), for `train_dataloader`.
        self._restored: TokenBatchSampler | None = None
        self._train_sampler: TokenBatchSampler | None = None

    def _replicas(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def sampler(self, split: str, *, shuffle: bool, first: int | None = None) -> TokenBatchSampler:
        """The batch sampler of `split` for this process's rank (with `first`: of the split's first `first`
        examples only, indices 0 .. first - 1; all of them when the split is shorter)."""
        self.setup()
        replicas, rank = self._replicas()
        return TokenBatchSampler(
            self.splits[split].lengths()[:first], max_tokens=self.max_tokens, batch_size=self.batch_size,
            shuffle=shuffle, seed=self.seed, num_replicas=replicas, rank=rank, bucket=self.bucket,
        )  # fmt: skip

    def _loader(self, split: str, sampler: TokenBatchSampler) -> DataLoader:
        import torch

        return DataLoader(
            self.splits[split],
            batch_sampler=sampler,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            multiprocessing_context=worker_context() if self.num_workers > 0 else None,
            worker_init_fn=functools.partial(end_with, os.getpid()) if self.num_workers > 0 else None,
            # Worker seeds come from this generator, not the global one: starting an epoch's workers
            # never shifts the dropout stream, so a resumed run draws exactly what the original drew.
            generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self) -> DataLoader:
        # Overfitting (`trainer.overfit_batches`, debug=overfit) trains on the same first batches every
        # epoch: unshuffled, as Lightning does with a shuffled sampler there.
        fixed = self.trainer is not None and bool(self.trainer.overfit_batches)
        restored, self._restored = self._restored, None
        if restored is not None and not fixed:  # built and positioned when the checkpoint was loaded
            self._train_sampler = restored
        else:
            self._train_sampler = self.sampler("train", shuffle=not fixed)
            if restored is not None:
                self._train_sampler.load_state_dict(restored.state_dict())
        self._train_sampler.sampler = _TrainerEpoch(self, self._train_sampler)  # see _TrainerEpoch
        return self._loader("train", self._train_sampler)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.sampler("val", shuffle=False))

    def test_dataloader(self) -> DataLoader:
        """The first test set (`self.test_sets[0]`)."""
        return self._loader(self.test_sets[0], self.sampler(self.test_sets[0], shuffle=False))

    def check_feeds(self, processes: int, *, test: bool = True) -> None:
        """Refuse, before training starts, a run that its splits cannot feed.

        Every split a DataLoader serves (`train`, `val`, and with `test` the first test set) must give
        each of the run's `processes` (DDP ranks: devices x nodes) at least one batch: otherwise a run
        trains nothing (the training batches are cut to a multiple of the ranks), or a rank without a
        validation batch leaves the others waiting at the epoch's gather. With `test`, no test set may
        be empty either. So an empty split (for a corpus, one whose every line is empty on a side at least:
        no sentence pair to score), or one with fewer batches than ranks, is an error.

        Raises:
            DataError: naming the split, its sentence and batch counts, the processes and the fix.
        """
        self.setup()
        names = ["train", "val", *(self.test_sets if test else [])]
        for name in names:
            examples = self.splits[name]
            if not examples or not self._holds_pairs(name):
                raise DataError(self._empty_split_message(name))
            if name not in ("train", "val", self.test_sets[0]):
                continue  # decoded by one process only (no DataLoader)
            if processes == 1:
                continue  # a split that is not empty gives its one process a batch
            batches = len(self.sampler(name, shuffle=name == "train"))  # all ranks' (no trainer yet)
            if batches < processes:
                raise DataError(
                    f"split {name!r} has {len(examples)} sentence pairs in {batches} batches, fewer than the "
                    f"{processes} processes of this run (trainer.devices x trainer.num_nodes): every process "
                    "needs at least one batch of each split. Use fewer trainer.devices, more data in that "
                    "split, or smaller batches (data.max_tokens / data.batch_size)"
                )

    def _holds_pairs(self, name: str) -> bool:
        """Whether split `name` (not empty) holds a sentence pair to train on or score."""
        return True

    def _empty_split_message(self, name: str) -> str:
        return f"split {name!r} is empty: it needs at least one sentence pair"

    def state_dict(self) -> dict[str, Any]:
        """The training sampler's position (saved in checkpoints for mid-epoch resumption).

        The position is the number of batches the training loop has finished in this epoch, not the
        number the sampler has handed out: DataLoader workers fetch batches ahead of the loop. This holds
        for every checkpoint saved while fitting, those saved during a validation inside the epoch
        (`val_check_interval`) included. Once the epoch's last batch (`trainer.num_training_batches`,
        which `limit_train_batches` may cut) is done, it is the start of the next epoch, where Lightning
        continues. It is saved with the sampler's `fingerprint()` (`batching`), checked when it is loaded.
        """
        if self._train_sampler is None:
            return {}
        state = self._train_sampler.state_dict()
        trainer = self.trainer
        if trainer is not None and trainer.state.fn == "fit":  # training or validating inside fit
            done = int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
            state["yielded"] = min(done, len(self._train_sampler))
            if done >= trainer.num_training_batches:
                state["epoch"], state["yielded"] = state["epoch"] + 1, 0
        return {"train_sampler": {**state, "batching": self._train_sampler.fingerprint()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Takes up a `state_dict()` (when Lightning restores a checkpoint, before training starts).

        Raises:
            ConfigError: The saved position cannot be restored exactly: the training data or the
                batching (max_tokens, batch_size, processes) differ from the checkpoint's (named).
        """
        state = state_dict.get("train_sampler")
        if state is not None:
            try:
                self._restored = self.sampler("train", shuffle=True)
                self._restored.load_state_dict(state)
            except ValueError as exc:
                self._restored = None

                path = getattr(self.trainer, "ckpt_path", None) or "the checkpoint"
                reason = str(exc).removeprefix("TokenBatchSampler.load_state_dict: ")
                raise ConfigError(
                    f"cannot continue from {path} exactly: {reason}. Continue it with the training data "
                    "(the same files and preprocessing) and batching (data.max_tokens, data.batch_size, "
                    "trainer.devices x trainer.num_nodes) it was saved with, or start a new run"
                ) from None


class _TrainerEpoch:
    """Sets the training batch sampler's epoch to the trainer's `current_epoch` at each epoch's start.

    Lightning calls `set_epoch(n)` on `loader.batch_sampler.sampler` (never on a batch sampler itself),
    so the training `TokenBatchSampler` gets one of these as its `sampler`. Lightning's n counts the
    epochs processed, which after a resumption with `trainer.max_steps` from a checkpoint saved at an
    epoch's end runs one ahead of the epoch trained (Lightning replays that epoch's end): the epoch
    given is the trainer's own.
    """

    def __init__(self, datamodule: ParallelDataModule, sampler: TokenBatchSampler) -> None:
        self.datamodule, self.batch_sampler = datamodule, sampler

    def set_epoch(self, epoch: int) -> None:
        trainer = self.datamodule.trainer
        self.batch_sampler.set_epoch(trainer.current_epoch if trainer is not None else epoch)


class SyntheticDataModule(ParallelDataModule):
    """The synthetic task of `attnlab.data.synthetic`: shuffled sentence batches of mixed lengths (short
    sequences pad little, and length-homogeneous batches were measured to slow its learning)."""

    def __init__(self, spec: SyntheticData) -> None:
        super().__init__(
            max_tokens=None,
            batch_size=spec.batch_size,
            num_workers=spec.num_workers,
            seed=spec.seed,
            bucket=False,
        )
        self.spec = spec
        self.src_vocab_size = self.tgt_vocab_size = spec.fixed_vocab_size

    def setup(self, stage: str | None = None) -> None:
        if not self.splits:
            self.splits = {
                split: Examples(EncodedSplit.from_pairs(self.spec.examples(split), self.src_vocab_size),
                                self.eos_id)
                for split in ("train", "val", "test")
            }  # fmt: skip


UNKNOWN_SHARE = 0.01  # warn when more of a side's training ids than this are the unknown id


def _warn_unknown(spec: CorpusData, prepared: Prepared) -> None:
    """Warn (on every run, like the length filters) when the tokenizer gives more than `UNKNOWN_SHARE` of a
    side's training ids the unknown id: a tokenizer file made for other text (another corpus, language or
    script) encodes this one mostly as <unk>, and the run would learn nothing useful."""
    unknown = prepared.stats.get("train_unknown_ids") or {}
    train = prepared.splits["train"]
    for side, ids, lang in (("src", train.src_ids, spec.src_lang), ("tgt", train.tgt_ids, spec.tgt_lang)):
        share = unknown.get(side, 0) / max(len(ids), 1)
        if share > UNKNOWN_SHARE:
            fix = (
                "data.tokenizer_path (or src_/tgt_tokenizer_path) names a tokenizer made for other text? "
                "Give one trained on this corpus, or null to train one"
                if spec.tokenizer_files() is not None
                else "its characters are missing from the tokenizer's training text: raise "
                "data.tokenizer_sample (null: all pairs)"
            )
            log.warning(
                "the tokenizer encodes %.1f%% of the training %s ids (%s, %d of %d) as the unknown id: %s",
                100 * share, "source" if side == "src" else "target", lang, unknown[side], len(ids), fix,
            )  # fmt: skip


class CorpusDataModule(ParallelDataModule):
    """A real corpus: prepared (tokenized, cached) once, then served as token batches.

    After `setup`: `src_tokenizer`/`tgt_tokenizer`, vocabulary sizes, `test_sets` (names, the first used
    by `Trainer.test`), `references[split]` (raw target lines, untouched, for BLEU) and `stats` (what
    preparation dropped, timings).
    """

    def __init__(self, spec: CorpusData) -> None:
        super().__init__(
            max_tokens=spec.max_tokens,
            batch_size=spec.batch_size,
            num_workers=spec.num_workers,
            seed=spec.seed,
        )
        self.spec = spec
        # The spec's local paths made absolute here, where the run starts (its checkpoints save them, and
        # the working directory may be gone by then): `CorpusData.absolute_paths`.
        self.absolute_paths = spec.absolute_paths()
        self.prepared: Prepared | None = None
        self.truncated: dict[str, int] = {}
        self._cut: dict[str, np.ndarray] = {}  # per split: which of its examples were cut (`_cut_sources`)

    def prepare_data(self) -> None:
        if self.prepared is None:
            self.prepared = prepare(self.spec)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        if self.prepared is None:
            self.prepare_data()
        prepared = self.prepared
        self.src_tokenizer, self.tgt_tokenizer = prepared.src_tokenizer, prepared.tgt_tokenizer
        self.src_vocab_size, self.tgt_vocab_size = (
            self.src_tokenizer.vocab_size,
            self.tgt_tokenizer.vocab_size,
        )
        self.stats = prepared.stats
        dropped = self.stats.get("dropped_filter") or {}
        if dropped:  # said on every run, a cached preparation's too, not only when it was built
            log.warning(
                "the length filters dropped %d of the %d training lines (%s); %d training pairs are left",
                sum(dropped.values()), self.stats.get("train_lines", 0),
                ", ".join(f"{reason}: {n}" for reason, n in dropped.items()),
                self.stats.get("train_examples", 0),
            )  # fmt: skip
        _warn_unknown(self.spec, prepared)
        self.splits = {name: Examples(split, self.eos_id) for name, split in prepared.splits.items()}
        self.references = {name: split.raw_tgt for name, split in prepared.splits.items() if name != "train"}
        self.test_sets = [name for name in prepared.splits if name not in ("train", "val")]
        self._cut_sources(
            self.spec.max_source_tokens, "data.max_source_tokens={} (the training filter's limit)"
        )

    def _cut_sources(self, limit: int, why: str, target_limit: int | None = None) -> None:
        """Cut the sources of every split but `train` (never filtered) to `limit` ids with `cut_source`
        (keeping eos), and with `target_limit` their targets to that many ids, so one huge line cannot
        stall validation or testing; each split's count of cut sentences (over all cuts) goes to
        `self.truncated` and a warning naming `why` (formatted with `limit`)."""
        for name, examples in self.splits.items():
            if name == "train":
                continue
            cut = examples.cut(limit, target_limit)
            if not cut.any():
                continue
            self._cut[name] = cut | self._cut[name] if name in self._cut else cut
            self.truncated[name] = int(self._cut[name].sum())
            log.warning("%s: cut %d sentences to %s", name, int(cut.sum()), why.format(limit))

    def _empty_split_message(self, name: str) -> str:
        if name == "train":
            stats, spec = getattr(self, "stats", {}), self.spec
            dropped = stats.get("dropped_filter") or {}
            filters = (
                ("source_too_long", f"sources longer than data.max_source_tokens={spec.max_source_tokens}"),
                ("target_too_long", f"targets longer than data.max_target_tokens={spec.max_target_tokens}"),
                ("length_ratio", f"pairs beyond data.max_length_ratio={spec.max_length_ratio}"),
            )
            counts = ", ".join(f"{dropped.get(key, 0)} {what}" for key, what in filters)
            return (
                f"no training pairs are left: of the {stats.get('train_lines', '?')} lines of the training "
                f"split, {stats.get('dropped_empty', '?')} have an empty side and the length filters "
                f"dropped the rest ({counts}; lengths in subword tokens, eos included). Raise "
                "data.max_source_tokens, data.max_target_tokens or data.max_length_ratio (null: no ratio "
                "filter)"
            )
        try:
            where = " ({} and {})".format(*self.spec.files()[name])
        except (NotImplementedError, KeyError, DataError):
            where = ""
        fix = "set test=false to skip the final evaluation, or " if name in self.test_sets else ""
        lines = len(self.splits[name])
        empty = f"has {lines} lines, each empty on a side at least" if lines else "is empty"
        return (
            f"split {name!r} {empty}{where}: it needs at least one sentence pair. Add lines to it, "
            f"{fix}select another split (data=files: data.valid, data.test; data=hf: data.valid_split, "
            "data.test_splits)"
        )

    def _holds_pairs(self, name: str) -> bool:
        """Whether split `name` holds a line with text on both sides (training: every pair kept does); a
        validation or test set of empty lines (or of sources without references) has nothing to score."""
        if name == "train":
            return True
        return any(s.strip() and t.strip() for s, t in zip(*self.raw_text(name), strict=True))

    def raw_text(self, split: str) -> tuple[list[str], list[str]]:
        """The raw (untokenized) source and reference lines of `split`.

        Raises:
            ValueError: `split` is `train`, whose raw text preparation does not keep.
        """
        self.setup()
        prepared = self.prepared.splits[split]
        if prepared.raw_src is None or prepared.raw_tgt is None:
            raise ValueError(f"the raw text of split {split!r} is not kept (only that of evaluation sets)")
        return prepared.raw_src, prepared.raw_tgt

    def limit_positions(self, max_positions: int) -> None:
        """Fit every split to a model with a learned position table of `max_positions`.

        Training pairs that do not fit are dropped; in validation and test sets (never filtered) longer
        sources are truncated (keeping eos) and longer targets cut for the teacher-forced loss
        (`_cut_sources`). Counts go to `self.truncated` and a warning.
        """
        self.setup()
        examples = self.splits["train"]
        needed = examples.lengths()
        fits = needed <= max_positions
        if not fits.all():
            if not fits.any():
                shortest = int(needed.min())
                raise DataError(
                    f"no training pairs are left: all {len(examples)} are longer than the model's "
                    f"model.max_positions={max_positions} (pe=learned drops training pairs that do not "
                    f"fit; the shortest needs {shortest} positions). Set model.max_positions>={shortest} "
                    "or model.pe=sinusoidal"
                )
            examples.keep(fits)
            log.warning(
                "dropped %d training pairs longer than max_positions=%d", int((~fits).sum()), max_positions
            )
        self._cut_sources(max_positions, "the model's max_positions={} (pe=learned)", max_positions - 1)
