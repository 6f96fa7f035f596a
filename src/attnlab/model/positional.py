"""Positional encodings (§3.5): sinusoidal, learned, or none.

Notation: `T` sequence length, `D` d_model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.model.config import PositionalEncodingType, SinusoidLayout


def sinusoidal_table(length: int, d_model: int, layout: SinusoidLayout = "interleaved") -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)).

    Args:
        length: Number of positions T (positions 0..T-1).
        d_model: Width D (even).
        layout: `interleaved` puts sin in even and cos in odd dimensions (the paper); `split` puts the
            D/2 sines first and the D/2 cosines after them (MarianMT), with the same frequencies.

    Returns:
        A float32 table (T, D).
    """
    position = torch.arange(length, dtype=torch.float64).unsqueeze(1)  # (T, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    angles = position * inv_freq  # (T, D/2)
    table = torch.empty(length, d_model, dtype=torch.float64)
    if layout == "interleaved":
        table[:, 0::2], table[:, 1::2] = torch.sin(angles), torch.cos(angles)
    else:
        half = d_model // 2
        table[:, :half], table[:, half:] = torch.sin(angles), torch.cos(angles)
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoids, computed for any length (not bounded by a table size).

    The table is a cache, not a parameter or buffer: it stays out of checkpoints and out of DDP's
    buffer broadcast, is built per device on first use and grown when a longer input arrives.
    """

    def __init__(self, d_model: int, layout: SinusoidLayout = "interleaved") -> None:
        super().__init__()
        self.d_model = d_model
        self.layout = layout
        self._tables: dict[torch.device, Tensor] = {}

    def forward(self, length: int, offset: int = 0, device: torch.device | None = None) -> Tensor:
        """Float32 encodings of positions offset..offset+length-1, shape (T, D), on `device`."""
        device = torch.device("cpu") if device is None else device
        end = offset + length
        table = self._tables.get(device)
        if table is None or end > table.size(0):
            size = max(end, 256, 0 if table is None else 2 * table.size(0))
            table = self._tables[device] = sinusoidal_table(size, self.d_model, self.layout).to(device)
        return table[offset:end]


class LearnedPositionalEncoding(nn.Module):
    """A trained table of `max_positions` position vectors."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.embedding = nn.Embedding(max_positions, d_model)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, length: int, offset: int = 0, device: torch.device | None = None) -> Tensor:
        """Encodings of positions offset..offset+length-1, shape (T, D) (on the table's device)."""
        end = offset + length
        if end > self.max_positions:
            raise ValueError(
                f"input needs {end} positions but the learned positional encoding has max_positions="
                f"{self.max_positions}: truncate the input or train with a larger model.max_positions"
            )
        return self.embedding.weight[offset:end]


def build_positional_encoding(
    kind: PositionalEncodingType, *, d_model: int, max_positions: int, layout: SinusoidLayout
) -> nn.Module | None:
    """The encoding named by `kind`, or None for `none`."""
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, layout)
    if kind == "learned":
        return LearnedPositionalEncoding(d_model, max_positions)
    return None
