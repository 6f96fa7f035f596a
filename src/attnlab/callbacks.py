"""Lightning callbacks of attnlab.

`EarlyStopping` checks its metric only on the epochs that compute it. Lightning keeps the last logged
value of every metric in `trainer.callback_metrics`, so on an epoch without a validation decode
(`decode.every_n_epochs > 1`) Lightning's own `EarlyStopping` would see the previous decode's `val/bleu`
again and count it as an epoch without improvement. Checkpointing avoids the same trap with
`ModelCheckpoint(every_n_epochs=...)` (see `conf/callbacks/default.yaml`).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping as _LightningEarlyStopping


class EarlyStopping(_LightningEarlyStopping):
    """Lightning's `EarlyStopping`, checked only at the end of every `every_n_epochs`-th epoch.

    Args:
        every_n_epochs: Check on epochs e (counted from 1) with e % every_n_epochs == 0 — the epochs
            whose validation computes the monitored metric. Patience counts checks, not epochs.
        **kwargs: Lightning's `EarlyStopping` arguments (`monitor`, `mode`, `patience`, `min_delta`, ...).
    """

    def __init__(self, *, every_n_epochs: int = 1, **kwargs: Any) -> None:
        if every_n_epochs < 1:
            raise ValueError(f"EarlyStopping: every_n_epochs={every_n_epochs} must be >= 1")
        super().__init__(**kwargs)
        self.every_n_epochs = every_n_epochs

    def _checks_this_epoch(self, trainer: L.Trainer) -> bool:
        return (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._checks_this_epoch(trainer):
            super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._checks_this_epoch(trainer):
            super().on_validation_end(trainer, pl_module)
