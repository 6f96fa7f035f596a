"""`ParallelDataModule`: the LightningDataModule over encoded (source, target) pairs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import lightning as L
import torch
from torch.utils.data import DataLoader

from attnlab.data.batching import Collator

Split = Literal["train", "val", "test"]
Example = tuple[list[int], list[int]]


class ParallelDataModule(L.LightningDataModule):
    """Serves train/val/test splits of id pairs as padded batches.

    Args:
        load: Returns the examples of a split (called once per split, in `setup`).
        src_vocab_size: Source vocabulary size.
        tgt_vocab_size: Target vocabulary size.
        pad_id: Padding id.
        bos_id: Beginning-of-sentence id (decoder start).
        eos_id: End-of-sentence id.
        unk_id: Unknown-token id.
        batch_size: Sentences per batch.
        num_workers: DataLoader workers.
        seed: Seed of the training shuffle (the same seed gives the same batches).
    """

    def __init__(
        self,
        *,
        load: Callable[[Split], list[Example]],
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        unk_id: int,
        batch_size: int,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.load = load
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = pad_id, bos_id, eos_id, unk_id
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.collate = Collator(pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)
        self.splits: dict[Split, list[Example]] = {}

    def setup(self, stage: str | None = None) -> None:
        wanted: tuple[Split, ...] = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}.get(
            stage or "", ("train", "val", "test")
        )
        for split in wanted:
            if split not in self.splits:
                self.splits[split] = self.load(split)

    def _loader(self, split: Split, shuffle: bool) -> DataLoader:
        self.setup({"train": "fit", "val": "validate", "test": "test"}[split])
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size,
            shuffle=shuffle,
            generator=torch.Generator().manual_seed(self.seed) if shuffle else None,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
