"""Collation of (source, target) id pairs into padded batches.

A batch is a dict of LongTensors: `src` (B, S) source ids ending in eos; `tgt_in` (B, T) decoder input
= bos + target; `tgt_out` (B, T) decoder output = target + eos. Padding uses `pad_id`; masks are derived
from it by the model (True = real token).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def pad(sequences: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    """Right-pad id sequences into a (B, L) LongTensor."""
    out = torch.full((len(sequences), max(len(s) for s in sequences)), pad_id, dtype=torch.long)
    for i, seq in enumerate(sequences):
        out[i, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return out


class Collator:
    """Turns a list of (src ids, tgt ids) pairs into a padded batch (picklable for worker processes)."""

    def __init__(self, *, pad_id: int, bos_id: int, eos_id: int) -> None:
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id

    def __call__(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> dict[str, Tensor]:
        return {
            "src": pad([s for s, _ in pairs], self.pad_id),
            "tgt_in": pad([[self.bos_id, *t] for _, t in pairs], self.pad_id),
            "tgt_out": pad([[*t, self.eos_id] for _, t in pairs], self.pad_id),
        }
