"""Lightning callbacks that tests put into real runs through the config (`+callbacks.x._target_=probes.X`).

Kept apart from `helpers` so that importing the helpers does not import lightning.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
import torch


class SignalAt(L.Callback):
    """Send `signum` to this process at the end of training step `step` (global step, counted from 1)."""

    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class SaveFinalWeights(L.Callback):
    """Save each rank's parameters at the end of fitting to `<dirpath>/final_weights_rank<r>.pt`."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        Path(self.dirpath).mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        torch.save(state, Path(self.dirpath) / f"final_weights_rank{trainer.global_rank}.pt")
