"""Dropout (§5.4) with masks drawn from 16-bit random numbers on the CPU.

`nn.Dropout` on the CPU draws one Bernoulli number per element through MKL (`bernoulli_`, then a float
noise tensor divided by 1 - p), which took 5% of a `base` training step and more of a `small` one
(docs/benchmarks.md). `Dropout` here draws 32 random bits per *two* elements from torch's default
generator (`random_` on int32: 31 uniform bits, the low 16 and the high 15 read as two numbers) and
keeps an element when its number clears a threshold: the mask costs a third of `bernoulli_`'s time
(docs/benchmarks.md).

Choices, each visible in the numbers:
- The drop probability is rounded to a multiple of 2⁻¹⁵: `effective_p(p) = round(p · 32768) / 32768`
  (0.1 → 0.1000061, 0.3 → 0.2999878; at most 1.5·10⁻⁵ away). Kept values are scaled by
  1 / (1 - effective_p), so the expectation is the input's (in float32; in bfloat16 the scale is rounded
  to the input's precision first, as `F.dropout` does too: 1.109375 for 0.1).
- The masks come from torch's default CPU generator, like every other random number of a run: a seed
  gives the same masks, and exact resume restores them with the generator state. They are a different
  stream from `nn.Dropout`'s, so a run with dropout is not the same run as with `nn.Dropout` (the same
  distribution of runs, not the same numbers).
- Off the CPU (CUDA's fused dropout kernel is already fast) and under `torch.compile` (whose own random
  numbers are fused into the graph) this is `F.dropout`.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.model.linear import _compiling

_LEVELS = 1 << 15
# the column of a (pairs, 2) int16 view of int32 draws that holds each draw's low 16 bits
_LOW = 0 if sys.byteorder == "little" else 1


def _level(p: float) -> int:
    """p in units of 2⁻¹⁵, rounded: the drop probability is `_level(p) / 2¹⁵`."""
    return round(p * _LEVELS)


def effective_p(p: float) -> float:
    """The drop probability `Dropout(p)` applies on the CPU: p rounded to a multiple of 2⁻¹⁵."""
    return _level(p) / _LEVELS


def keep_mask(x: Tensor, p: float) -> Tensor:
    """A bool tensor shaped like `x`, each element True with probability 1 - effective_p(p), independently.

    Element 2i reads the low 16 bits of the i-th 31-bit draw as a signed number (uniform over
    [-32768, 32767]), element 2i + 1 its high 15 bits (uniform over [0, 32767]); each is kept when it is
    at least the point below which a share effective_p(p) of its range lies. (That is the little-endian
    layout; on a big-endian machine the int16 view puts the high bits first, and each column is compared
    with its own half's threshold all the same.)
    """
    return _draw(x, p, torch.bool)


def _draw(x: Tensor, p: float, dtype: torch.dtype) -> Tensor:
    """`keep_mask(x, p)` written as `dtype` (1 kept, 0 dropped): the same draws and comparisons whatever
    the dtype, so a seed gives the same mask as bool or as the input's dtype."""
    k = _level(p)
    n = x.numel()
    pairs = (n + 1) // 2
    halves = torch.empty(pairs, dtype=torch.int32, device=x.device).random_().view(torch.int16).view(-1, 2)
    # one comparison per half into the two columns of the mask: 2-4x faster than one comparison
    # broadcasting a (2,) threshold over the (pairs, 2) view, whose inner loop is 2 elements long
    mask = torch.empty(pairs, 2, dtype=dtype, device=x.device)
    torch.ge(halves[:, _LOW], 2 * k - _LEVELS, out=mask[:, _LOW])
    torch.ge(halves[:, 1 - _LOW], k, out=mask[:, 1 - _LOW])
    return mask.view(-1)[:n].view(x.shape)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """`F.dropout(x, p, training)` with `keep_mask`'s masks on the CPU (see the module docstring)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or _compiling():
        return F.dropout(x, p, training)
    k = _level(p)
    if k == _LEVELS:
        return x * 0.0
    # the comparisons written straight into the input's dtype and scaled in place: no bool mask converted
    # (in float32 and bfloat16 the same values as the bool mask times the float32 scale, converted; a
    # `small` training step 1.006-1.009x faster, docs/benchmarks.md)
    return x * _draw(x, p, x.dtype).mul_(_LEVELS / (_LEVELS - k))


class Dropout(nn.Dropout):
    """`nn.Dropout` (same arguments, no parameters, the identity in eval) drawing `keep_mask`'s masks;
    `inplace` is accepted and ignored (the output is always a new tensor)."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)
