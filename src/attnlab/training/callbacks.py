"""Lightning callbacks of attnlab.

`EarlyStopping` checks its metric only on the epochs that compute it. Lightning keeps the last logged
value of every metric in `trainer.callback_metrics`, so on an epoch without a validation decode
(`decode.every_n_epochs > 1`) Lightning's own `EarlyStopping` would see the previous decode's `val/bleu`
again and count it as an epoch without improvement. Checkpointing avoids the same trap with
`ModelCheckpoint(every_n_epochs=...)` (see `conf/callbacks/default.yaml`).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping as _LightningEarlyStopping
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

from attnlab.typed import ConfigError, is_number, whole_count

log = logging.getLogger(__name__)


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


class AveragingCheckpoints(ModelCheckpoint):
    """The weights `average_last=N` averages: of the last `keep` epochs, or of every `every_n_steps`-th
    optimizer step (the last `keep` kept) for corpora where an epoch takes hours (the paper averages
    the last 5 / 20 checkpoints written every 10 minutes).

    Files: `<dirpath>/epochs/epochNNN.ckpt` or `<dirpath>/steps/stepNNNNNNNN.ckpt`, weights only
    (`attnlab.runs.checkpoint.averaging_checkpoints` finds them). `keep=0` keeps none.

    Args:
        dirpath: The run's `checkpoints/` directory.
        keep: How many to keep (`average_last`).
        every_n_steps: null: one per epoch; N: one every N optimizer steps.
    """

    def __init__(self, dirpath: str, keep: int = 0, every_n_steps: int | None = None) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps} must be >= 1 (or null: one per epoch)")
        by_steps = every_n_steps is not None
        super().__init__(
            dirpath=f"{dirpath}/{'steps' if by_steps else 'epochs'}",
            filename="step{step:08d}" if by_steps else "epoch{epoch:03d}",
            monitor="step" if by_steps else "epoch",
            mode="max",
            save_top_k=keep,
            save_weights_only=True,
            every_n_train_steps=every_n_steps,
            every_n_epochs=None if by_steps else 1,
            # An epoch's file holds the weights at its end, also when validating inside epochs
            # (`trainer.val_check_interval`), where Lightning would save at each validation instead.
            save_on_train_epoch_end=None if by_steps else True,
            auto_insert_metric_name=False,
            enable_version_counter=False,  # an epoch replayed after a crash writes over its file
        )


def follow_every_batchs_validation(trainer: L.Trainer) -> None:
    """With `trainer.val_check_interval=1` (the int: validate after every training batch), make the
    trainer's checkpoint and early-stopping callbacks that leave it to Lightning save and check after each
    validation, as they do for any other number of batches: Lightning takes that 1 for 1.0 (once an epoch)
    and saves and checks at epoch ends only. Called on a built trainer, before it fits."""
    interval = trainer.val_check_interval
    if type(interval) is not int or interval != 1 or not trainer.limit_val_batches:
        return
    for checkpoint in trainer.checkpoint_callbacks:
        if checkpoint._save_on_train_epoch_end is None:
            checkpoint._save_on_train_epoch_end = False
    for stopping in trainer.early_stopping_callbacks:
        if stopping._check_on_train_epoch_end is None:
            stopping._check_on_train_epoch_end = False


class _StepEnds(L.Callback):
    """Tells whether the training batch just ended completed an optimizer step (`_ended_a_step`): with
    gradient accumulation most batches do not, and their accumulated gradients are in no checkpoint, so
    a save there would not resume exactly."""

    _step_at_batch_start = -1

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_at_batch_start = trainer.global_step

    def _ended_a_step(self, trainer: L.Trainer) -> bool:
        """In `on_train_batch_end`: whether this batch ended with an optimizer step."""
        return trainer.global_step != self._step_at_batch_start


class LastCheckpoint(_StepEnds, ModelCheckpoint):
    """`last.ckpt`: the latest training state, which `resume=true` continues from.

    Written at the end of every validation (by default once per epoch, `trainer.check_val_every_n_epoch`; also
    inside epochs with `trainer.val_check_interval`), or every `every_n_train_steps` optimizer steps instead;
    with `every_n_minutes`, also whenever that much time has passed since training (re)started or since the
    last save, at the end of the first optimizer step after it — for corpora whose epochs take hours, an
    interrupted run then loses at most about that much work, whatever a step costs. No save falls inside a
    gradient accumulation (its gradients are not in a checkpoint), so every last.ckpt resumes exactly: a
    validation inside one (`val_check_interval` not a multiple of `accumulate_grad_batches`) owes its save to
    the end of that accumulation's optimizer step, where it is written, holding the validation's outcome. A
    save due at a step that is then validated (by steps or by time) is written after the validation instead:
    it holds the validation's outcome (best checkpoint, early-stopping counts), and a run killed during the
    validation resumes from the save before, so that it validates that step (a run resumed from a save at the
    step would count it as done and skip its validation). Under DDP, rank 0's clock decides and all ranks save
    together.

    Args:
        dirpath: The run's `checkpoints/` directory.
        filename: The file's name without `.ckpt`.
        every_n_train_steps: null: at the end of validations; N: every N optimizer steps instead (a whole
            float, YAML's `1e3`, is taken as the int).
        every_n_minutes: null: no time-based saves; M (> 0): also every M minutes of training.
    """

    def __init__(
        self,
        dirpath: str,
        filename: str = "last",
        every_n_train_steps: int | None = None,
        every_n_minutes: float | None = None,
    ) -> None:
        settings = {"every_n_train_steps": every_n_train_steps, "every_n_minutes": every_n_minutes}
        self.check_config("callbacks.last_checkpoint", settings)
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            save_top_k=1,
            enable_version_counter=False,
            every_n_train_steps=whole_count(every_n_train_steps),  # 100.0 (YAML's 1e2) as 100
        )
        self.every_n_minutes = every_n_minutes
        self._since: float | None = None  # when training (re)started or last.ckpt was last written
        self._stepped = True  # whether the last training batch ended with an optimizer step
        self._after_validation = False  # a save due at the last batch, delayed to the validation's end
        self._owed = False  # a validation inside an accumulation: saved at the end of its optimizer step

    @classmethod
    def check_config(cls, key: str, node: Mapping[str, Any]) -> None:
        """Refuse, when the config is checked (`attnlab.training.experiment.check_constructor_keys`), the
        periods the callback cannot save by (they failed when it was built, once the run had started).

        Raises:
            ConfigError: Naming the key and the values it takes.
        """
        steps, minutes = node.get("every_n_train_steps"), node.get("every_n_minutes")
        if steps is not None and whole_count(steps) is None:
            raise ConfigError(
                f"{key}.every_n_train_steps={steps!r} must be an integer >= 1 (or null: at the end of every "
                "epoch)"
            )
        if minutes is not None and not (is_number(minutes) and 0 < minutes < math.inf):
            raise ConfigError(
                f"{key}.every_n_minutes={minutes!r} must be a number > 0 (or null: no time-based saves)"
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._since = time.monotonic()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._stepped = self._ended_a_step(trainer)
        if not self._stepped:  # inside an accumulation: nothing a checkpoint could resume exactly
            return
        if self._validates_next(trainer):
            # A save due now waits for the validation: written here, it would be what a kill during the
            # validation leaves, and a run resumed from it would start after this step without validating
            # it (Lightning counts the step as done), its validation and epoch rows lost.
            self._after_validation = self._due_by_steps(trainer) or self._due_by_time(trainer)
            self._owed = False  # the validation writes last.ckpt itself
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # every N steps
        if self._owed and not self._saved_now(trainer):  # the save of a validation inside this step
            self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))
            self._saved_now(trainer)
        self._owed = False
        if not self._saved_now(trainer) and self._due_by_time(trainer):
            saved_before = self._last_global_step_saved
            self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))
            self._last_global_step_saved = saved_before  # an unforeseen validation of this step saves again
            self._since = time.monotonic()

    def _due_by_steps(self, trainer: L.Trainer) -> bool:
        every = self._every_n_train_steps
        due = every >= 1 and trainer.global_step % every == 0
        return due and not self._should_skip_saving_checkpoint(trainer)

    def _due_by_time(self, trainer: L.Trainer) -> bool:
        if self.every_n_minutes is None or self._since is None:
            return False
        due = trainer.strategy.broadcast(time.monotonic() - self._since >= 60 * self.every_n_minutes)
        return bool(due) and not self._should_skip_saving_checkpoint(trainer)

    @staticmethod
    def _validates_next(trainer: L.Trainer) -> bool:
        """Whether Lightning validates right after this training batch (it decides after the batch's
        hooks, with `_should_check_val_fx`; a Lightning without it: False, and the save is not delayed)."""
        loop = trainer.fit_loop
        try:
            epoch_loop = loop.epoch_loop
            return bool(epoch_loop._should_check_val_fx(loop._data_fetcher)) and not epoch_loop._skip_next_val
        except AttributeError:
            return False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._stepped:  # a validation inside an accumulation (val_check_interval): saved at its step
            self._owed = self._owed or self._saves_at_validations(trainer)
            return
        super().on_validation_end(trainer, pl_module)  # a validation inside the epoch: written here
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_delayed(trainer)
        self._saved_now(trainer)

    def _saves_at_validations(self, trainer: L.Trainer) -> bool:
        """Whether a validation writes last.ckpt (`ModelCheckpoint.on_validation_end`'s condition: saves by
        validation, not every N steps, and not at the epoch's end instead)."""
        return self._every_n_epochs >= 1 and not self._should_save_on_train_epoch_end(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)  # the epoch's validation: written here, after it
        self._save_delayed(trainer)
        self._saved_now(trainer)

    def _save_delayed(self, trainer: L.Trainer) -> None:
        """Write the save that waited for this step's validation, unless written since."""
        if self._after_validation and not self._saved_now(trainer) and not trainer.sanity_checking:
            self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))
        self._after_validation = False

    def _saved_now(self, trainer: L.Trainer) -> bool:
        """Whether last.ckpt was just written at this step (then the clock of `every_n_minutes` restarts)."""
        saved = self._last_global_step_saved == trainer.global_step
        if saved:
            self._since = time.monotonic()
        return saved


class Stopped(SystemExit):
    """The run stopped on a signal (`Preempted`, `EvaluationStopped`, `SetupStopped`): a `SystemExit` (like
    Lightning's `SIGTERMException`) that ends the process with `code` 128 + the signal number, as a process
    killed by that signal would report; its text says what happened and how to go on.

    `requeue`: for SIGUSR1, the handler the stop replaced (submitit's, which requeues the job, or
    Lightning's SLURM auto-requeue; None: none), which `attnlab.training.pipeline` runs with `run_requeue`
    once the manifest says the run was interrupted and the stop is printed, so that a handler that raises,
    exits or has the process killed as it requeues leaves the run recorded `interrupted`.
    """

    def __init__(self, signum: int, message: str, requeue: Callable[[int, Any], Any] | None = None) -> None:
        super().__init__(128 + signum)
        self.signum, self.message, self.requeue = signum, message, requeue

    def __str__(self) -> str:
        return self.message


class Preempted(Stopped):
    """Training stopped on a signal after saving a checkpoint; `attnlab-train resume=true` continues it.
    `training_ended`: the stop came after the last step, which the checkpoint saved (a signal in the last
    validation), so the run continued from it trains nothing more."""

    def __init__(
        self,
        signum: int,
        step: int,
        path: str | None,
        requeue: Callable[[int, Any], Any] | None = None,
        training_ended: bool = False,
    ) -> None:
        self.step, self.path, self.training_ended = step, path, training_ended
        name = signal.Signals(signum).name
        message = (
            f"stopped by {name} at step {step} after saving {path}; continue with resume=true (same run "
            "directory)"
            if path is not None
            else f"stopped by {name} at step {step}, where training had stopped early inside a gradient "
            "accumulation, which no checkpoint can hold: nothing saved; resume=true (same run directory) "
            "continues from the run's last.ckpt and stops at the same step"
        )
        super().__init__(signum, message, requeue)


class EvaluationStopped(Stopped):
    """A signal stopped the final evaluation, after training; the message ends with `fix`, the command that
    evaluates again (`attnlab.training.pipeline.evaluate_again`). For SIGUSR1, `requeue` is the handler it
    had before the evaluation, or Lightning's while testing."""

    def __init__(self, signum: int, fix: str, requeue: Callable[[int, Any], Any] | None = None) -> None:
        self.fix = fix
        message = (
            f"stopped by {signal.Signals(signum).name} in the final evaluation, after training (the "
            f"checkpoints are kept); {fix}"
        )
        super().__init__(signum, message, requeue)


class SetupStopped(Stopped):
    """SIGTERM stopped the run before training (`HeldSignal`): while the data was prepared or the model or
    trainer built, with nothing to save."""

    def __init__(self, signum: int) -> None:
        super().__init__(
            signum,
            f"stopped by {signal.Signals(signum).name} before training (while the data was prepared or the "
            "model or trainer built), with nothing to save; run the command again: a new run starts over, a "
            "run continued with resume=true or resume=auto goes on from its last.ckpt",
        )


def agreed_signal(trainer: L.Trainer, received: int | None) -> int:
    """The signal that reached this rank (`received`) or any other (0: none), at a point every rank
    reaches. The ranks agree on which (the highest number where they got different ones): the one the run
    names and acts on (SIGUSR1's requeue on rank 0) when another rank alone got it. A single process asks
    no collective: a tensor on the GPU read back every step would make the CPU wait for the step's
    kernels."""
    if trainer.world_size == 1:
        return int(received or 0)
    import torch

    signum = torch.tensor(received or 0, device=trainer.strategy.root_device)
    return int(trainer.strategy.reduce(signum, reduce_op="max"))


class _HoldsSignals:
    """A callback whose handlers hold signals for a while, with the handlers they replaced (`_previous`,
    `signum -> handler`), given back by `release`."""

    _previous: dict[int, Any]

    def release(self) -> None:
        """Give every signal held back to the handler it had."""
        restore_signal_handlers(self._previous)
        self._previous = {}

    def lend_sigusr1(self, register: Callable[[], None]) -> None:
        """Run `register` (Lightning's registration of its handlers, or its giving them back, in
        `SignalConnector`) with SIGUSR1 given back to the handler this callback replaced: the one there
        afterwards (SLURM's auto-requeue, which Lightning installs, or the one before) is what runs after
        this callback acted on the signal, and what `release` gives SIGUSR1 back to."""
        if signal.SIGUSR1 not in self._previous:  # (not taken: not the main thread)
            register()
            return
        previous = self._previous[signal.SIGUSR1]
        held = signal.signal(signal.SIGUSR1, previous if previous is not None else signal.SIG_DFL)
        try:
            register()
        finally:
            self._previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, held)


class EvaluationStop(_HoldsSignals, L.Callback):
    """SIGTERM, SIGINT and SIGUSR1 in the final evaluation (its handler `on_signal`, held with `hold`, and
    this callback in the trainer, for its length: `attnlab.training.pipeline.stopping_evaluation`) stop it
    with `EvaluationStopped`: at once in a single process, and on rank 0 once testing has ended (it decodes
    the test sets alone); under DDP while testing, at the end of testing, where the ranks agree on it (their
    test batches may differ by one: no earlier point is common to all), so that every rank stops and rank
    0's manifest says so. (Raised at once on one rank, it ended that rank and the others with gloo's
    `Connection closed by peer`: the manifest said `failed`.) The SIGUSR1 handler there before (submitit's)
    or, while testing, the one Lightning installs (SLURM's auto-requeue) is the stop's `requeue`."""

    def __init__(self, fix: str, world_size: int) -> None:
        self.fix, self._received, self._testing = fix, None, world_size > 1
        self._previous = {}

    def hold(self) -> None:
        """SIGTERM, SIGINT and SIGUSR1 to `on_signal` until `release` (main thread only)."""
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            self._previous[signum] = signal.signal(signum, self.on_signal)

    def on_signal(self, signum: int, frame: Any) -> None:
        if not self._testing:
            raise self._stopped(signum)
        self._received = signum

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._testing = False
        signum = agreed_signal(trainer, self._received)
        if signum:
            raise self._stopped(signum)

    def _stopped(self, signum: int) -> EvaluationStopped:
        handler = self._previous.get(signal.SIGUSR1) if signum == signal.SIGUSR1 else None
        return EvaluationStopped(signum, self.fix, handler if callable(handler) else None)


_CTRL_C = (
    "\nCtrl-C: saving last.ckpt at the end of this training step, then stopping (continue with resume=true); "
    "Ctrl-C again stops now, without saving\n"
)


def run_requeue(handler: Callable[[int, Any], Any], signum: int) -> None:
    """Run `handler`, the SIGUSR1 handler a stop replaced (`Stopped.requeue`: submitit's requeue, Lightning's
    SLURM auto-requeue), once the stop is saved and recorded. A handler that ends the process (submitit's
    `sys.exit(-1)` once the job is requeued) lets the stop go on: the run exits with the stop's status,
    128 + SIGUSR1; so does one that fails, logged as an error naming it (the job may not be requeued)."""
    try:
        handler(signum, None)
    except SystemExit:
        pass
    except Exception:
        log.exception(
            "the SIGUSR1 handler that requeues the job (%s) failed: the run is recorded interrupted, but the "
            "job may not be requeued: run it again with resume=auto to continue it",
            _handler_name(handler),
        )


def _handler_name(handler: Callable[[int, Any], Any]) -> str:
    """`handler`'s qualified name; for Lightning's `_HandlersCompose` (which Lightning installs its SLURM
    auto-requeue as), those of the handlers it runs (`_SignalConnector._slurm_sigusr_handler_fn`)."""
    inner = getattr(handler, "signal_handlers", None)
    handlers = [h for h in inner if callable(h)] if isinstance(inner, list) and inner else [handler]
    return ", ".join(getattr(h, "__qualname__", type(h).__qualname__) for h in handlers)


def restore_signal_handlers(previous: dict[int, Any]) -> None:
    """Put back the handlers `signal.signal` returned when they were replaced (`signum -> handler`); None,
    a handler installed outside Python, as the default action."""
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


class HeldSignal:
    """A signal's handler before training (`attnlab.training.pipeline.holding_signals`), in place of the
    handler it replaced (`previous`) until training is set up, where `Preemption` (or, without it,
    `SignalConnector`) takes the signal over with that handler. It remembers the signal (`received`) for
    `Preemption`, which acts on it at the end of the first training step; with `at_once` it stops the run
    at once instead (`SetupStopped`): there is nothing to save before training."""

    def __init__(self, previous: Any, at_once: bool = False) -> None:
        self.previous, self.at_once, self.received = previous, at_once, None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.at_once:
            raise SetupStopped(signum)
        self.received = signum


class SignalConnector(_SignalConnector):
    """Lightning's signal connector (`trainer._signal_connector`, set in every trainer attnlab builds) less
    its SIGTERM handler where attnlab's own handlers own SIGTERM and SIGINT: `Preemption` from the setup of
    training on and `attnlab.training.pipeline.stopping_evaluation` (`EvaluationStop`) in the final
    evaluation, each while it is in the trainer. Lightning's handler, installed for every `fit` and `test`
    before it runs the loops, forwards the signal to the other local ranks and starts a collective inside
    the handler (a broadcast from rank 0): a DDP run where one rank alone got SIGTERM before training (in
    the sanity validation) or while testing hung there until the process group's timeout (30 minutes).
    Without those callbacks (`callbacks.preemption=null`, training) Lightning's handler stays: SIGTERM
    stops training at the end of the step, without a save. Its SIGUSR1 handler (SLURM's auto-requeue)
    stays, the `requeue` of `Preemption`'s stop where that callback is in the trainer. Relies on Lightning
    2.6's `_SignalConnector`, which registers and gives back every handler with `_register_signal` and
    installs its SIGUSR1 handler only where SIGUSR1 has none (compare with Lightning's when upgrading it).

    Before training, SIGTERM's `HeldSignal` (stop at once) gives way here to Lightning's handler, where no
    `Preemption` took SIGTERM over. SIGUSR1, which `Preemption` and `EvaluationStop` hold, is given back to
    its handler while Lightning installs its own (`lend_sigusr1`): the one they run after acting on it
    (SLURM's auto-requeue, or the handler before); so is the handler Lightning gives SIGUSR1 back to when
    `test` ends, where `EvaluationStop` still holds it (for the decoding of the test sets that follows)."""

    def _register_signal(self, signum: Any, handlers: Any) -> None:  # (a static method in Lightning's)
        owned = any(isinstance(callback, (Preemption, EvaluationStop)) for callback in self.trainer.callbacks)
        if not owned or signum not in (signal.SIGTERM, signal.SIGINT):  # (theirs to give back)
            _SignalConnector._register_signal(signum, handlers)

    def _holder(self) -> _HoldsSignals | None:
        """The callback holding SIGUSR1 now (`Preemption` while training, `EvaluationStop` while testing)."""
        holders = (c for c in self.trainer.callbacks if isinstance(c, _HoldsSignals))
        return next((c for c in holders if signal.SIGUSR1 in c._previous), None)

    def register_signal_handlers(self) -> None:
        """Lightning's handlers, with the SIGUSR1 handler it installs (SLURM's auto-requeue) given to the
        callback holding SIGUSR1 to run after it acted on the signal."""
        before = signal.getsignal(signal.SIGTERM)
        if isinstance(before, HeldSignal):  # (no Preemption took it over)
            signal.signal(signal.SIGTERM, before.previous if before.previous is not None else signal.SIG_DFL)
        holder = self._holder()
        if holder is None:
            super().register_signal_handlers()
        else:
            holder.lend_sigusr1(super().register_signal_handlers)

    def teardown(self) -> None:
        """Lightning gives back the handlers it replaced; SIGUSR1's to the callback still holding it."""
        holder = self._holder()
        if holder is None:
            super().teardown()
        else:
            holder.lend_sigusr1(super().teardown)


class Preemption(_StepEnds, _HoldsSignals):
    """On SIGTERM, SIGUSR1 or a first Ctrl-C (SIGINT), save a checkpoint at the end of the current training
    step (after the last one: when training ends, before the final evaluation) and stop.

    Clusters announce the end of a job with a signal: SLURM sends SIGTERM before killing a job (and
    SIGUSR1 some time before its time limit when asked to, as submitit and `--signal` do). The signal
    only sets a flag; the checkpoint is written at the end of the training step, where Lightning's own
    step checkpoints are written and where model, optimizer, schedule, data position and random states
    are consistent, to `dirpath/filename.ckpt` (the run's last.ckpt); `resume=true` continues from it
    exactly. With gradient accumulation, that is the end of the batch that completes the optimizer step:
    a signal inside an accumulation waits for the rest of it, whose gradients a checkpoint does not hold
    (as `LastCheckpoint` never saves inside one). Training then stops with `Preempted` (exit status 128 +
    the signal number). Under DDP the ranks agree on stopping (a signal that reached any rank stops all)
    and all take part in the save.

    Ctrl-C is the same stop, asked for at a terminal: the first says on stderr that the run saves and stops
    at the end of the step (after a validation that is running) and gives SIGINT back to its handler before
    training (Python's KeyboardInterrupt), so a second Ctrl-C stops at once, without the save. A terminal's
    Ctrl-C reaches every rank of a DDP run started there: rank 0 alone says so, once a run.

    This callback's handlers hold SIGTERM, SIGINT and SIGUSR1 from the setup of training on, replacing
    whatever handled them (a signal in the sanity validation, on any rank, stops the run at the end of the
    first step; Lightning's own SIGTERM handler is left out of attnlab's trainers, `SignalConnector`); a
    SIGUSR1 that a `HeldSignal` remembered before (while the data was prepared or the model built) does the
    same. They give the signals back when training ends, before Lightning gives back the handlers it
    replaced. A SIGUSR1 handler that was installed before (submitit's, which requeues the job) or that
    Lightning installs (its SLURM auto-requeue, which saves its own checkpoint and calls `scontrol
    requeue`) is the stop's `requeue`, run once the run's manifest says `interrupted`.

    Args:
        dirpath: Directory of the checkpoint.
        filename: Its name without `.ckpt`.
    """

    def __init__(self, dirpath: str, filename: str = "last") -> None:
        super().__init__()
        self.dirpath, self.filename = dirpath, filename
        self._received: int | None = None
        self._previous: dict[int, Any] = {}
        self._rank = 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._received = signum
        if signum == signal.SIGINT:  # a second Ctrl-C goes to the handler before: it stops at once
            previous = self._previous.pop(signal.SIGINT)
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
            if self._rank == 0:  # (the other ranks of a terminal's run got the same Ctrl-C)
                os.write(2, _CTRL_C.encode())

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """SIGTERM and SIGINT from here on (before the sanity validation): a signal before training is acted
        on at the end of the first step, where the ranks agree on it."""
        if stage == "fit":
            self._rank = trainer.global_rank
            self._take(signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

    def _take(self, *signums: int) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach only the main thread
        for signum in signums:
            previous = signal.getsignal(signum)
            if isinstance(previous, HeldSignal):  # a signal before training: acted on at the first step
                self._received = self._received or previous.received
                previous = previous.previous
            self._previous[signum] = previous
            signal.signal(signum, self._on_signal)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._ended_a_step(trainer):  # inside an accumulation: save after its step
            return
        signum = agreed_signal(trainer, self._received)
        if not signum:
            return
        path = self._save(trainer)
        # The module's own end of the batch (what it logs there: attnlab's lr and tokens seen), which
        # Lightning would run after this hook, runs before training stops here: the step's row holds them.
        pl_module.on_train_batch_end(outputs, batch, batch_idx)
        self._log_this_step(trainer)
        self._stop(trainer, path, signum)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A signal after the last training step (in the last validation) ends no step: the run saves and
        stops here, before the final evaluation, as it said it would. Where training stopped early inside
        a gradient accumulation (early stopping at a validation there), nothing is saved: a checkpoint
        there would resume after batches whose gradients it lacks, and train on past the stop; one
        resumed from the last.ckpt before replays the steps up to that validation and stops there."""
        signum = agreed_signal(trainer, self._received)
        if signum:
            saved = self._ended_a_step(trainer)
            self._stop(trainer, self._save(trainer) if saved else None, signum, training_ended=saved)
        self.release()  # before Lightning puts back the handlers it replaced (after this hook)

    def _save(self, trainer: L.Trainer) -> str:
        path = f"{self.dirpath}/{self.filename}.ckpt"
        trainer.save_checkpoint(path, weights_only=False)  # all of it, to resume (Lightning logs its default)
        return path

    def _stop(self, trainer: L.Trainer, path: str | None, signum: int, training_ended: bool = False) -> None:
        previous = self._previous.get(signal.SIGUSR1)
        self._received = None
        self.release()
        requeue = previous if signum == signal.SIGUSR1 and callable(previous) else None
        raise Preempted(signum, trainer.global_step, path, requeue, training_ended)  # (requeue: run later)

    @staticmethod
    def _log_this_step(trainer: L.Trainer) -> None:
        """Log this step's metrics, which Lightning logs only after `on_train_batch_end` (a resumed run
        starts after this step, so its history would otherwise lack it). Uses Lightning internals; on a
        Lightning without them, the step's log row is the only loss."""
        connector = getattr(trainer, "_logger_connector", None)
        try:
            connector.on_batch_end()  # type: ignore[union-attr]
            connector.update_train_step_metrics()  # type: ignore[union-attr]
        except AttributeError:
            return
        for logger in trainer.loggers:
            logger.save()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self.release()  # (as at the end of training)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.release()
