"""Lightning callbacks that tests put into real runs through the config (`+callbacks.x._target_=probes.X`).

Kept apart from `helpers` so that importing the helpers does not import lightning.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch

from attnlab.data import SyntheticData


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


class KillDuringSave(L.Callback):
    """SIGKILL this process halfway through writing the `nth` save of `name` (bytes on disk, no rename)."""

    def __init__(self, nth: int, name: str = "last.ckpt") -> None:
        self.nth, self.name, self.seen = nth, name, 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        import io
        import signal

        checkpoint_io = trainer.strategy.checkpoint_io
        save, write = checkpoint_io.save_checkpoint, checkpoint_io.write
        target: list[str] = [""]

        def saving(checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            target[0] = Path(path).name
            save(checkpoint, path, storage_options)

        def writing(checkpoint: dict[str, Any], file: Any) -> None:
            if target[0] == self.name:
                self.seen += 1
                if self.seen == self.nth:
                    buffer = io.BytesIO()
                    torch.save(checkpoint, buffer)
                    file.write(buffer.getvalue()[: buffer.tell() // 2])
                    file.flush()
                    os.fsync(file.fileno())
                    os.kill(os.getpid(), signal.SIGKILL)
            write(checkpoint, file)

        checkpoint_io.save_checkpoint, checkpoint_io.write = saving, writing


class NonFiniteAt(L.Callback):
    """Make optimizer step `step`'s loss NaN (`what="loss"`) or a gradient infinite (`what="grad"`).

    Records, per instance (`NonFiniteAt.last`), the bytes of every checkpoint file when it strikes and
    whether the weights changed in that step.
    """

    last: NonFiniteAt | None = None

    def __init__(self, step: int, what: str) -> None:
        self.step, self.what = step, what
        self.saved: dict[str, bytes] = {}
        self.before: dict[str, torch.Tensor] = {}
        self.updated: bool | None = None
        NonFiniteAt.last = self

    def _strike(self, trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
        if trainer.global_step + 1 != self.step:
            return False
        directory = Path(trainer.default_root_dir) / "checkpoints"
        self.saved = {str(p): p.read_bytes() for p in sorted(directory.rglob("*.ckpt"))}
        self.before = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        return True

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.what == "loss" and self._strike(trainer, pl_module):
            model, forward = pl_module.model, pl_module.model.forward

            def poisoned(*a: Any, **kw: Any) -> torch.Tensor:
                del model.forward  # once
                return forward(*a, **kw) * float("nan")

            model.forward = poisoned

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        if self.what == "grad" and self._strike(trainer, pl_module):
            next(p for p in pl_module.parameters() if p.grad is not None).grad[0] = float("inf")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.before and self.updated is None:
            after = pl_module.state_dict()
            self.updated = any(not torch.equal(v, after[k]) for k, v in self.before.items())


class KillIfSeed(L.Callback):
    """SIGKILL this process at the end of training step `step` when the run's seed (`PL_GLOBAL_SEED`)
    equals the environment variable `PROBE_KILL_SEED`: one job of a sweep dies, as under the OOM killer."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        import signal

        seed = os.environ.get("PROBE_KILL_SEED")
        if seed is not None and seed == os.environ.get("PL_GLOBAL_SEED") and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class RecordBatches(L.Callback):
    """Append each training batch's example indices to `<dirpath>/batches.jsonl`, one JSON line per
    optimizer step: `{"epoch": current epoch, "step": global step before it, "index": [...]}`."""

    def __init__(self, dirpath: str) -> None:
        self.path = Path(dirpath) / "batches.jsonl"

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *args: Any
    ) -> None:
        import json

        row = {"epoch": trainer.current_epoch, "step": trainer.global_step, "index": batch["index"].tolist()}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


@dataclasses.dataclass(frozen=True)
class OwnSyntheticData(SyntheticData):
    """A user's own data spec class (a subclass of one of attnlab's): not in the closed list."""
