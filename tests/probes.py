"""Lightning callbacks that tests put into real runs through the config (`+callbacks.x._target_=probes.X`).

Kept apart from `helpers` so that importing the helpers does not import lightning.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from attnlab.data import SyntheticData


class SignalAt(L.Callback):
    """Send `signum` to this process at the end of training step `step` (global step, counted from 1),
    or with `stage="test"` at the end of test batch `step` (counted from 1), with `stage="sanity"` of the
    sanity validation's batch `step`, before training (`stage="validate"`: of any other validation), on
    every rank, or only on rank `rank` when given; `times` times in a row; with `group`, to every process
    of this process's group, as a terminal's Ctrl-C does (DataLoader workers too: run the run in a session
    of its own, as `runs.run_all` does)."""

    def __init__(
        self, step: int, signum: int, rank: int | None = None, times: int = 1, group: bool = False,
        stage: str = "train",
    ) -> None:  # fmt: skip
        self.step, self.signum, self.rank, self.times, self.group = step, signum, rank, times, group
        self.stage = stage

    def _send(self, trainer: L.Trainer, stage: str, step: int) -> None:
        if stage == self.stage and step == self.step and self.rank in (None, trainer.global_rank):
            for _ in range(self.times):  # (to this thread: its handler has run when the next is sent; two
                # sent to the process at once can reach another thread and be handled as one, late)
                os.killpg(os.getpgid(0), self.signum) if self.group else signal.raise_signal(self.signum)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any,
                                index: int, *args: Any) -> None:  # fmt: skip
        self._send(trainer, "sanity" if trainer.sanity_checking else "validate", index + 1)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._send(trainer, "train", trainer.global_step)

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, index: int,
                          *args: Any) -> None:  # fmt: skip
        self._send(trainer, "test", index + 1)


class SignalWhenBuilt(L.Callback):
    """Send `signum` to this process when the trainer's callbacks are built: after the data is prepared and
    the model built, before training is set up."""

    def __init__(self, signum: int) -> None:
        signal.raise_signal(signum)


class SleepAt(L.Callback):
    """Sleep `seconds` before the `batch`-th training batch of the run (counted from 1): time passes at a
    known place, as a slow batch would make it."""

    def __init__(self, batch: int, seconds: float) -> None:
        self.batch, self.seconds, self._seen = batch, seconds, 0

    def on_train_batch_start(self, *args: Any) -> None:
        self._seen += 1
        if self._seen == self.batch:
            time.sleep(self.seconds)


class RemoveDirectoryAt(L.Callback):
    """Remove directory `path` (a run's, with everything in it) at the end of training step `step` (global
    step, counted from 1), as a user's `rm -r` while the run runs."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            shutil.rmtree(self.path)


class SaveFinalWeights(L.Callback):
    """Save each rank's parameters at the end of fitting to `<dirpath>/final_weights_rank<r>.pt`."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        Path(self.dirpath).mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        torch.save(state, Path(self.dirpath) / f"final_weights_rank{trainer.global_rank}.pt")


class CountTokens(L.Callback):
    """Count the non-padding target tokens of the batches this rank trains on, and write them with the
    module's `tokens_seen` at the end of fitting to `<dirpath>/tokens_rank<r>.json`."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath, self.counted = dirpath, 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, index: int
    ) -> None:
        self.counted += int((batch["tgt_out"] != pl_module.model_config.pad_id).sum())

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        Path(self.dirpath).mkdir(parents=True, exist_ok=True)
        found = {"counted": self.counted, "tokens_seen": pl_module.tokens_seen}
        (Path(self.dirpath) / f"tokens_rank{trainer.global_rank}.json").write_text(json.dumps(found))


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


class RecordPid(L.Callback):
    """Write this process's id to `<dirpath>/pid_rank<r>` when fitting is set up (each DDP rank its own)."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        Path(self.dirpath).mkdir(parents=True, exist_ok=True)
        (Path(self.dirpath) / f"pid_rank{trainer.global_rank}").write_text(str(os.getpid()))


class RecordWorkers(L.Callback):
    """Write the ids of this process's DataLoader workers (its `multiprocessing` children) to
    `<dirpath>/workers` at the first training batch's end."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath, self.done = dirpath, False

    def on_train_batch_end(self, *args: Any) -> None:
        if not self.done:
            pids = [str(p.pid) for p in multiprocessing.active_children()]
            (Path(self.dirpath) / "workers").write_text(" ".join(pids))
            self.done = True


class RecordAutocast(L.Callback):
    """Record, for every training forward pass of the model, whether autocast was on for the training
    device, its dtype and the dtype of the last decoder layer's feed-forward output (a linear layer's:
    the model itself returns LayerNorm's float32 hidden states to the fused loss):
    `RecordAutocast.last.seen`, one `(enabled, autocast dtype, output dtype)` per pass."""

    last: RecordAutocast | None = None

    def __init__(self) -> None:
        self.seen: list[tuple[bool, torch.dtype, torch.dtype]] = []
        self.hook: Any = None
        RecordAutocast.last = self

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        device = trainer.strategy.root_device.type

        def record(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
            if module.training:
                autocast = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
                self.seen.append((*autocast, output.dtype))

        self.hook = pl_module.model.decoder.layers[-1].ffn.register_forward_hook(record)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.hook is not None:
            self.hook.remove()
            self.hook = None


class LearningRateFrom(L.Callback):
    """From epoch `epoch` (counted from 0) on, every optimizer step uses learning rate `lr` instead of the
    schedule's (set before each step; the schedule sets its own again after it): with a large `lr`,
    training diverges from a known epoch on."""

    def __init__(self, epoch: int, lr: float) -> None:
        self.epoch, self.lr = epoch, lr

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.current_epoch >= self.epoch:
            for optimizer in trainer.optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = self.lr


class InitWeights(L.Callback):
    """Start training from the weights of checkpoint `path` (read by attnlab's own reader) instead of a
    random initialisation. Loaded in `setup`, before Lightning restores a resumed run's checkpoint, so a
    resumption still continues from its own `last.ckpt`. The run must build the same model and
    vocabularies (same model settings, same training text and tokenizer settings)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from attnlab.runs.checkpoint import read_checkpoint

        if stage == "fit":  # not before the final test, which evaluates the trained weights
            pl_module.load_state_dict(read_checkpoint(Path(self.path))["state_dict"])


class RecordRankBatches(L.Callback):
    """Save the weights training starts from (`<dirpath>/initial_weights.pt`, rank 0) and, per rank, the
    example indices of each training batch (`<dirpath>/batches_rank<r>.jsonl`, one JSON list a line)."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.dirpath.mkdir(parents=True, exist_ok=True)
        if trainer.global_rank == 0:
            state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
            torch.save(state, self.dirpath / "initial_weights.pt")

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *args: Any
    ) -> None:
        import json

        with open(self.dirpath / f"batches_rank{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(batch["index"].tolist()) + "\n")


class KillInValidation(L.Callback):
    """SIGKILL this process at the start of the first validation batch of training epoch `epoch` (not the
    sanity check): a kill during an epoch's validation."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_validation_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if not trainer.sanity_checking and trainer.current_epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGKILL)


class RecordLossSums(L.Callback):
    """Write this rank's `[epoch, label-smoothed loss sum, target tokens]` of every training batch to
    `dirpath/loss_sums_rank<r>.json` at the end of training: what the epoch's `train/loss` sums."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath, self.rows = dirpath, []

    def on_train_batch_end(
        self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, *args: Any
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        tokens = int((batch["tgt_out"] != module.model_config.pad_id).sum())
        self.rows.append([trainer.current_epoch, float(loss), tokens])

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        path = Path(self.dirpath) / f"loss_sums_rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.rows))
