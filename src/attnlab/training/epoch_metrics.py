"""The training metrics' epoch values (`train/*_epoch`), kept so that a run resumed inside an epoch logs
the values an uninterrupted run logs.

Lightning averages a value logged with `on_epoch=True` itself, but its running averages are in no
checkpoint: a run resumed in the middle of an epoch would log, for that epoch, averages over the steps
after the resumption only. `TranslationModule` therefore logs its averaged training metrics as
`EpochMean`s, whose running sums it saves in every checkpoint (`EpochState`, each rank's) and puts back
when the resumed run continues the same epoch. The sums are float64 and added in the same order either
way, so the epoch values are bit for bit an uninterrupted run's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from attnlab.metrics import TRAIN_AVERAGED as AVERAGED
from attnlab.typed import shown

# AVERAGED: the averaged training metrics, by short name (`train/<name>` per step and `train/<name>_epoch`
# per epoch, `attnlab.metrics`). loss, nll, ppl: sums over the epoch's target tokens divided by their
# number (ppl = exp(nll)); the rest: the mean over the epoch's steps (grad_norm, grad_norm_clipped:
# optimizer steps; lr, tokens_per_sec: training batches).


class EpochMean(Metric):
    """Σ total / Σ weight over an epoch's steps and every rank (exp of it with `exp=True`), with each step's
    own value for Lightning to log per step.

    `step(total, weight, value)` adds a step's total and weight to the sums and makes `value` the step's
    logged value (what `Metric.forward` leaves in `_forward_cache`, which Lightning logs for `on_step`),
    without computing a batch value a second time. The sums are float64 whatever the module's dtype.
    """

    full_state_update = False

    def __init__(self, exp: bool = False) -> None:
        super().__init__()
        self.exp = exp
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, total: float, weight: float = 1.0) -> None:
        self.total = self.total.double() + total
        self.weight = self.weight.double() + weight

    def compute(self) -> Tensor:
        mean = self.total / self.weight.clamp(min=1e-300)
        return torch.exp(mean) if self.exp else mean

    def step(self, total: float, weight: float, value: Tensor) -> EpochMean:
        """Add a step to the sums; `value` (a tensor) is the step's own value. Returns the metric, to log."""
        self.update(total, weight)
        self._forward_cache = value
        return self

    def sums(self) -> tuple[float, float]:
        return float(self.total), float(self.weight)


@dataclass
class EpochState:
    """One rank's running epoch sums, as a checkpoint keeps them (plain numbers).

    Attributes:
        epoch: The epoch they belong to (put back only into a resumed run continuing that epoch).
        sums: `{name in AVERAGED: (total, weight)}` of the metrics updated so far in the epoch.
        skipped: Batches skipped in the epoch for a non-finite loss or gradient (`train/skipped_steps`).
    """

    epoch: int
    sums: dict[str, tuple[float, float]] = field(default_factory=dict)
    skipped: int = 0

    def to_dict(self) -> dict[str, Any]:
        sums = {name: list(pair) for name, pair in self.sums.items()}
        return {"epoch": self.epoch, "sums": sums, "skipped": self.skipped}

    @classmethod
    def from_dict(cls, saved: Any) -> EpochState:
        """The state `to_dict` wrote, checked (a checkpoint is untrusted).

        Raises:
            ValueError: Naming what is not as `to_dict` writes it.
        """
        if not isinstance(saved, dict) or set(saved) != {"epoch", "sums", "skipped"}:
            raise ValueError(f"expected a dict of epoch, sums and skipped, got {shown(saved)}")
        epoch, sums, skipped = saved["epoch"], saved["sums"], saved["skipped"]
        if not _is_count(epoch) or not _is_count(skipped):
            raise ValueError(f"epoch {shown(epoch)} and skipped {shown(skipped)} must be counts")
        if not isinstance(sums, dict) or not set(sums) <= set(AVERAGED):
            raise ValueError(f"sums must be a dict with keys among {AVERAGED}, got {shown(sums)}")
        checked = {}
        for name, pair in sums.items():
            ok = isinstance(pair, list | tuple) and len(pair) == 2 and all(map(_finite, pair))
            if not ok or pair[1] < 0 or (pair[1] == 0 and pair[0] != 0):
                raise ValueError(
                    f"sums[{name!r}] must be a finite total and a weight > 0 (or both 0), got {shown(pair)}"
                )
            checked[name] = (float(pair[0]), float(pair[1]))
        return cls(int(epoch), checked, int(skipped))


def _finite(value: Any) -> bool:
    """A float, or an int a float holds (not 10**400), that is finite."""
    if isinstance(value, bool) or not isinstance(value, float | int):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53
