"""LightningDataModules: `ParallelDataModule` batching, and its synthetic and real-corpus sources.

Batches come from `TokenBatchSampler`: length-bucketed token batches (or sentence batches) shuffled per
epoch with a seed, sharded across DDP ranks by the sampler itself (the trainer presets set
`use_distributed_sampler: false`), and evaluation sets seen exactly once across ranks. Each example
carries its index, so outputs can be put back into the original order (`batching.restore_order`).
"""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING, Any

import lightning as L
from torch.utils.data import DataLoader

from attnlab.data.batching import Collator, TokenBatchSampler
from attnlab.data.tokenizer import SPECIAL_IDS

if TYPE_CHECKING:
    from attnlab.data.corpora import CorpusData
    from attnlab.data.prepare import Prepared
    from attnlab.data.synthetic import SyntheticData

log = logging.getLogger(__name__)

Example = tuple[list[int], list[int], int]  # (source ids ending in eos, bare target ids, example index)


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
        self.splits: dict[str, list[Example]] = {}
        self.test_sets: list[str] = ["test"]
        self._sampler_state: dict[str, int] | None = None
        self._train_sampler: TokenBatchSampler | None = None

    def _replicas(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def sampler(self, split: str, *, shuffle: bool) -> TokenBatchSampler:
        """The batch sampler of `split` for this process's rank."""
        self.setup()
        lengths = [max(len(src), len(tgt) + 1) for src, tgt, _ in self.splits[split]]
        replicas, rank = self._replicas()
        return TokenBatchSampler(
            lengths, max_tokens=self.max_tokens, batch_size=self.batch_size, shuffle=shuffle, seed=self.seed,
            num_replicas=replicas, rank=rank, bucket=self.bucket,
        )  # fmt: skip

    def _loader(self, split: str, sampler: TokenBatchSampler) -> DataLoader:
        import torch

        return DataLoader(
            self.splits[split],
            batch_sampler=sampler,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            # Worker seeds come from this generator, not the global one: starting an epoch's workers
            # never shifts the dropout stream, so a resumed run draws exactly what the original drew.
            generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self) -> DataLoader:
        self._train_sampler = self.sampler("train", shuffle=True)
        if self._sampler_state is not None:
            self._train_sampler.load_state_dict(self._sampler_state)
            self._sampler_state = None
        return self._loader("train", self._train_sampler)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.sampler("val", shuffle=False))

    def test_dataloader(self) -> DataLoader:
        """The first test set (`self.test_sets[0]`)."""
        return self._loader(self.test_sets[0], self.sampler(self.test_sets[0], shuffle=False))

    def state_dict(self) -> dict[str, Any]:
        """The training sampler's position (saved in checkpoints for mid-epoch resumption).

        The position is the number of batches the training loop has finished in this epoch, not the
        number the sampler has handed out: DataLoader workers fetch batches ahead of the loop.
        """
        if self._train_sampler is None:
            return {}
        state = self._train_sampler.state_dict()
        trainer = self.trainer
        if trainer is not None and trainer.training:
            progress = trainer.fit_loop.epoch_loop.batch_progress.current
            state["yielded"] = min(int(progress.processed), len(self._train_sampler))
        return {"train_sampler": state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._sampler_state = state_dict.get("train_sampler")


def _indexed(pairs: list[tuple[list[int], list[int]]]) -> list[Example]:
    return [(src, tgt, i) for i, (src, tgt) in enumerate(pairs)]


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
            self.splits = {split: _indexed(self.spec.examples(split)) for split in ("train", "val", "test")}


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
        self.prepared: Prepared | None = None
        self.truncated: dict[str, int] = {}

    def prepare_data(self) -> None:
        from attnlab.data.prepare import prepare

        if self.prepared is None:
            self.prepared = prepare(self.spec)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        # Building ~10^5 small lists triggers the cyclic GC over and over; none of them form cycles.
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._load_prepared()
        finally:
            if enabled:
                gc.enable()

    def _load_prepared(self) -> None:
        if self.prepared is None:
            self.prepare_data()
        prepared = self.prepared
        self.src_tokenizer, self.tgt_tokenizer = prepared.src_tokenizer, prepared.tgt_tokenizer
        self.src_vocab_size, self.tgt_vocab_size = (
            self.src_tokenizer.vocab_size,
            self.tgt_tokenizer.vocab_size,
        )
        self.stats = prepared.stats
        self.splits = {
            name: _indexed(list(zip(split.src, split.tgt, strict=True)))
            for name, split in prepared.splits.items()
        }
        self.references = {name: split.raw_tgt for name, split in prepared.splits.items()}
        self.test_sets = [name for name in prepared.splits if name not in ("train", "val")]

    def raw_text(self, split: str) -> tuple[list[str], list[str]]:
        """The raw (untokenized) source and reference lines of `split`."""
        self.setup()
        prepared = self.prepared.splits[split]
        return prepared.raw_src, prepared.raw_tgt

    def limit_positions(self, max_positions: int) -> None:
        """Fit every split to a model with a learned position table of `max_positions`.

        Training pairs that do not fit are dropped; in validation and test sets (never filtered) longer
        sources are truncated (keeping eos) and longer targets cut for the teacher-forced loss. Counts go
        to `self.truncated` and a warning.
        """
        self.setup()
        for name, examples in self.splits.items():
            fits = [len(s) <= max_positions and len(t) + 1 <= max_positions for s, t, _ in examples]
            if all(fits):
                continue
            if name == "train":
                self.splits[name] = [e for e, ok in zip(examples, fits, strict=True) if ok]
                log.warning(
                    "dropped %d training pairs longer than max_positions=%d", fits.count(False), max_positions
                )
                continue
            self.splits[name] = [
                (
                    s if len(s) <= max_positions else [*s[: max_positions - 1], self.eos_id],
                    t[: max_positions - 1],
                    i,
                )
                for s, t, i in examples
            ]
            self.truncated[name] = fits.count(False)
            log.warning(
                "%s: truncated %d sentences to the model's max_positions=%d (pe=learned)",
                name, self.truncated[name], max_positions,
            )  # fmt: skip
