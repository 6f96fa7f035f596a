"""A deterministic, offline translation task whose answer depends on the order of the source.

Sentences are sequences of symbol tokens. `reverse` translates x_1..x_n to x_n..x_1; `rotate` translates
to x_{k+1}..x_n x_1..x_k with k = x_1 mod n. A decoder can count its own positions through causal
attention, but without positional encoding the encoder sees the source as a bag of tokens, so which
symbol goes where can only be learned from the source positions (the PE ablation of §3.5).

Token ids: 0 pad, 1 bos, 2 eos, 3 unk, then the symbols. Sources end with eos; targets are stored bare
(the collator adds bos/eos). Source and target share one vocabulary, so `tie=all` works.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from attnlab.data.tokenizer import SPECIAL_IDS
from attnlab.typed import check_fields, require, require_positive

if TYPE_CHECKING:
    from attnlab.data.datamodule import SyntheticDataModule

Example = tuple[list[int], list[int]]


@dataclass(frozen=True)
class SyntheticData:
    """Spec of the synthetic task and of its batching.

    Args:
        task: `reverse` or `rotate` (see module docstring).
        n_symbols: Number of distinct symbols.
        min_len: Shortest sentence (symbols, without eos).
        max_len: Longest sentence.
        n_train: Training examples.
        n_val: Validation examples.
        n_test: Test examples.
        seed: Seed of the generator; the same seed gives the same data.
        batch_size: Sentences per batch.
        num_workers: DataLoader worker processes.
    """

    task: Literal["reverse", "rotate"] = "reverse"
    n_symbols: int = 16
    min_len: int = 4
    max_len: int = 12
    n_train: int = 20000
    n_val: int = 500
    n_test: int = 500
    seed: int = 1234
    batch_size: int = 64
    num_workers: int = 0

    def __post_init__(self) -> None:
        check_fields(self)
        require_positive(self, "n_symbols", "min_len", "max_len", "n_train", "n_val", "n_test", "batch_size")
        require(self.min_len <= self.max_len, f"min_len={self.min_len} must be <= max_len={self.max_len}")
        require(self.num_workers >= 0, f"num_workers={self.num_workers} must be >= 0")

    @property
    def fixed_vocab_size(self) -> int:
        """Special tokens plus symbols (shared by source and target; known before any data is built)."""
        return len(SPECIAL_IDS) + self.n_symbols

    @property
    def max_positions_needed(self) -> int:
        """Longest source or decoder input in tokens (symbols plus eos or bos)."""
        return self.max_len + 1

    def translate(self, symbols: list[int]) -> list[int]:
        """The reference translation of a source sentence (symbol ids, no eos)."""
        if self.task == "reverse":
            return symbols[::-1]
        k = symbols[0] % len(symbols)
        return symbols[k:] + symbols[:k]

    def examples(self, split: Literal["train", "val", "test"]) -> list[Example]:
        """The (source ids with eos, target ids) pairs of `split`, identical for the same seed."""
        size = {"train": self.n_train, "val": self.n_val, "test": self.n_test}[split]
        # Each split has its own stream, so a changed split size leaves the other splits unchanged.
        rng = random.Random(f"attnlab.synthetic/{self.seed}/{split}")
        first = len(SPECIAL_IDS)
        out = []
        for _ in range(size):
            length = rng.randint(self.min_len, self.max_len)
            symbols = [rng.randrange(first, first + self.n_symbols) for _ in range(length)]
            out.append(([*symbols, SPECIAL_IDS["eos_id"]], self.translate(symbols)))
        return out

    def datamodule(self) -> SyntheticDataModule:
        """The LightningDataModule serving this task."""
        from attnlab.data.datamodule import SyntheticDataModule

        return SyntheticDataModule(self)
