"""Incremental-decoding cache: per decoder layer, self-attention K/V grown step by step and
cross-attention K/V computed once from the encoder output.

Notation: `B` batch (sentences × beams), `H` heads, `T` decoded steps so far, `S` source length,
`Dh` head width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LayerKV:
    """Keys and values one decoder layer keeps between decoding steps."""

    self_k: Tensor | None = None  # (B, H, T, Dh)
    self_v: Tensor | None = None  # (B, H, T, Dh)
    cross_k: Tensor | None = None  # (B, H, S, Dh)
    cross_v: Tensor | None = None  # (B, H, S, Dh)

    def append_self(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's self-attention keys/values; return all of them so far."""
        if self.self_k is None:
            self.self_k, self.self_v = k, v
        else:
            self.self_k = torch.cat([self.self_k, k], dim=2)
            self.self_v = torch.cat([self.self_v, v], dim=2)
        return self.self_k, self.self_v

    def reorder(self, index: Tensor) -> None:
        """Select batch rows `index` (B',) of every cached tensor."""
        for name in ("self_k", "self_v", "cross_k", "cross_v"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, index))


@dataclass
class KVCache:
    """The decoder's cache: one `LayerKV` per decoder layer."""

    layers: list[LayerKV] = field(default_factory=list)

    @classmethod
    def empty(cls, n_layers: int) -> KVCache:
        """A cache with nothing decoded yet."""
        return cls([LayerKV() for _ in range(n_layers)])

    @property
    def length(self) -> int:
        """Number of target positions already cached."""
        first = self.layers[0].self_k if self.layers else None
        return 0 if first is None else first.shape[2]

    def reorder(self, index: Tensor) -> None:
        """Reorder (or expand) the batch dimension, e.g. to follow the surviving beams."""
        for layer in self.layers:
            layer.reorder(index)
