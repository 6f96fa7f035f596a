"""Incremental-decoding cache: per decoder layer, self-attention K/V grown step by step and
cross-attention K/V computed once from the encoder output.

Notation: `B` sentences, `K` beams per sentence, `H` heads, `T` decoded steps so far, `S` source length,
`Dh` head width. The decoder's rows are sentence-major: row b·K + j is beam j of sentence b.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LayerKV:
    """Keys and values one decoder layer keeps between decoding steps.

    Cross-attention keys/values are kept once per sentence: the K beams of a sentence attend to the same
    source, so cross-attention takes them as K queries of one sentence (`beams`).
    """

    self_k: Tensor | None = None  # (B·K, H, T, Dh)
    self_v: Tensor | None = None  # (B·K, H, T, Dh)
    cross_k: Tensor | None = None  # (B, H, S, Dh)
    cross_v: Tensor | None = None  # (B, H, S, Dh)
    beams: int = 1

    def append_self(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's self-attention keys/values; return all of them so far."""
        if self.self_k is None:
            self.self_k, self.self_v = k, v
        else:
            self.self_k = torch.cat([self.self_k, k], dim=2)
            self.self_v = torch.cat([self.self_v, v], dim=2)
        return self.self_k, self.self_v

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep decoder rows `rows` (B'·K,) and, when given, sentences `sentences` (B',)."""
        for name in ("self_k", "self_v"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, rows))
        for name in ("cross_k", "cross_v"):
            value = getattr(self, name)
            if value is not None and sentences is not None:
                setattr(self, name, value.index_select(0, sentences))


@dataclass
class KVCache:
    """The decoder's cache: one `LayerKV` per decoder layer."""

    layers: list[LayerKV] = field(default_factory=list)

    @classmethod
    def empty(cls, n_layers: int, beams: int = 1) -> KVCache:
        """A cache with nothing decoded yet, for decoder rows holding `beams` beams per sentence."""
        return cls([LayerKV(beams=beams) for _ in range(n_layers)])

    @property
    def length(self) -> int:
        """Number of target positions already cached."""
        first = self.layers[0].self_k if self.layers else None
        return 0 if first is None else first.shape[2]

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Follow the surviving beams: keep decoder rows `rows` (each beam's parent row, b·K + j).

        Beams only move within their sentence, so cross-attention keys/values stay, unless `sentences`
        (B',) says which sentences remain (finished ones leave the batch); `rows` then holds the kept
        sentences' rows only.
        """
        for layer in self.layers:
            layer.reorder(rows, sentences)
