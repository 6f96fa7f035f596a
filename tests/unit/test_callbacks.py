"""When attnlab's checkpoint callbacks write their files, in a Lightning trainer of a one-layer model (a
fit takes milliseconds): `LastCheckpoint` (at validations, every N steps, every M minutes, never inside a
gradient accumulation, a save due at a validated step after its validation) and `AveragingCheckpoints`
(the weights of the last `keep` epochs or of every K-th step); and which handlers hold the stop signals in
attnlab's trainers (`SignalConnector`) while training and testing."""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from attnlab.runs.checkpoint import kept_checkpoints
from attnlab.training.callbacks import (
    AveragingCheckpoints,
    EarlyStopping,
    EvaluationStop,
    EvaluationStopped,
    HeldSignal,
    LastCheckpoint,
    Preempted,
    Preemption,
    SignalConnector,
    agreed_signal,
    follow_every_batchs_validation,
)
from attnlab.typed import ConfigError
from helpers import SLURM_ENV
from probes import SignalAt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BATCHES = 10  # training batches an epoch


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
        return self.layer(batch).sum()

    def validation_step(self, batch: torch.Tensor, index: int) -> None:
        pass

    test_step = validation_step

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.randn(BATCHES, 2), batch_size=1)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.randn(2, 2), batch_size=1)

    test_dataloader = val_dataloader


class Saves(L.Callback):
    """Every checkpoint the trainer writes, as (optimizer step, training batches ended, validations ended)
    when it is written; `sleep` seconds before the given training batches (counted from 1)."""

    def __init__(self, sleep: dict[int, float] | None = None) -> None:
        self.seen: list[tuple[int, int, int]] = []
        self.batches = self.validations = 0
        self.sleep = sleep or {}

    def on_train_batch_start(self, *args: Any) -> None:
        time.sleep(self.sleep.get(self.batches + 1, 0))

    def on_train_batch_end(self, *args: Any) -> None:
        self.batches += 1

    def on_validation_end(self, *args: Any) -> None:
        self.validations += 1

    def on_save_checkpoint(self, trainer: L.Trainer, *args: Any) -> None:
        self.seen.append((trainer.global_step, self.batches, self.validations))


def trainer(*callbacks: L.Callback, epochs: int = 2, **settings: Any) -> L.Trainer:
    """A quiet CPU trainer with `callbacks`, and no checkpoint callback of Lightning's (in the working
    directory) beside them."""
    return L.Trainer(
        max_epochs=epochs, callbacks=list(callbacks), logger=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu",
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        **{"num_sanity_val_steps": 0, **settings},
    )  # fmt: skip


def fit(
    callback: L.Callback, epochs: int = 2, sleep: dict[int, float] | None = None, **settings: Any
) -> Saves:
    saves = Saves(sleep)
    trainer(callback, saves, epochs=epochs, **settings).fit(Tiny())
    return saves


def test_last_ckpt_is_written_after_each_epochs_validation_with_the_state_to_resume(tmp_path: Path) -> None:
    saves = fit(LastCheckpoint(str(tmp_path)))
    assert saves.seen == [(10, 10, 1), (20, 20, 2)]
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 20 and saved["optimizer_states"]  # all of it, to resume
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_last_ckpt_every_n_steps_waits_at_a_validated_step_for_its_validation(tmp_path: Path) -> None:
    saves = fit(LastCheckpoint(str(tmp_path), every_n_train_steps=4))
    assert saves.seen == [(4, 4, 0), (8, 8, 0), (12, 12, 1), (16, 16, 1), (20, 20, 2)]  # 20: validated


def test_last_ckpt_by_time_is_written_only_where_an_optimizer_step_ends(tmp_path: Path) -> None:
    """Due at every batch (1e-9 minutes), with 3 batches a step: written after batches 3, 6, 9 and the
    epoch's last (its own step), that one after the epoch's validation."""
    saves = fit(LastCheckpoint(str(tmp_path), every_n_minutes=1e-9), epochs=1, accumulate_grad_batches=3)
    assert saves.seen == [(1, 3, 0), (2, 6, 0), (3, 9, 0), (4, 10, 1)]


def test_a_save_by_time_at_a_validated_step_between_step_saves_is_written_after_the_validation(
    tmp_path: Path,
) -> None:
    """Every 4 steps and at every step by time: step 10, the epoch's last, is saved after its validation
    (the steps alone would not save it)."""
    saves = fit(LastCheckpoint(str(tmp_path), every_n_train_steps=4, every_n_minutes=1e-9), epochs=1)
    assert saves.seen == [*((step, step, 0) for step in range(1, 10)), (10, 10, 1)]


def test_last_ckpt_by_time_counts_its_minutes_from_the_last_save(tmp_path: Path) -> None:
    """Every 2 s (1/30 minute, not seconds): 0.2 s before batch 2 writes nothing; 2.5 s before batch 4,
    written after it; the clock then starts again, and the quick batches after it write nothing until the
    epoch's end."""
    saves = fit(LastCheckpoint(str(tmp_path), every_n_minutes=1 / 30), epochs=1, sleep={2: 0.2, 4: 2.5})
    assert saves.seen == [(4, 4, 0), (10, 10, 1)]


def test_a_save_by_steps_restarts_the_clock_of_the_saves_by_time(tmp_path: Path) -> None:
    """Every 4 steps and every 2 s: 2.5 s before batch 4, whose step-save is due too: written once there,
    and the clock restarts (nothing after batch 5)."""
    last = LastCheckpoint(str(tmp_path), every_n_train_steps=4, every_n_minutes=1 / 30)
    saves = fit(last, epochs=1, sleep={4: 2.5})
    assert saves.seen == [(4, 4, 0), (8, 8, 0)]


@pytest.mark.parametrize("minutes", [0, -1, math.inf, math.nan, "10"])
def test_last_ckpt_refuses_a_time_interval_that_is_not_a_positive_number(minutes: Any) -> None:
    with pytest.raises(ConfigError, match=r"^k\.every_n_minutes=.* must be a number > 0 \(or null: no time"):
        LastCheckpoint.check_config("k", {"every_n_minutes": minutes})


class StopsAt5(Tiny):
    """Stops training at the end of step 5, in its own `on_train_batch_end` (after the callbacks')."""

    def on_train_batch_end(self, outputs: Any, batch: Any, index: int) -> None:
        if self.trainer.global_step == 5:
            self.trainer.should_stop = True


def test_a_save_by_time_before_a_validation_it_could_not_foresee_is_written_again_after_it(
    tmp_path: Path,
) -> None:
    """Training stopped by the module after step 5's time-based save: Lightning validates that step, and
    last.ckpt is written again, holding the validation's outcome."""
    saves = Saves()
    trainer(LastCheckpoint(str(tmp_path), every_n_minutes=1e-9), saves).fit(StopsAt5())
    assert saves.seen == [(1, 1, 0), (2, 2, 0), (3, 3, 0), (4, 4, 0), (5, 5, 0), (5, 5, 1)]


def test_a_validation_inside_a_gradient_accumulation_saves_at_the_end_of_its_step(tmp_path: Path) -> None:
    """2 batches a step, validations after batches 3, 6 and 9 of each epoch: those after 6 (of 10) and 16
    end a step and save there; the others fall inside a step (a save there would hold none of its
    gradients) and save at its end, after batches 4, 10, 14 and 20."""
    saves = fit(LastCheckpoint(str(tmp_path)), accumulate_grad_batches=2, val_check_interval=3)
    assert saves.seen == [(2, 4, 1), (3, 6, 2), (5, 10, 3), (7, 14, 4), (8, 16, 5), (10, 20, 6)]


def test_with_no_validation_at_a_step_end_last_ckpt_is_still_written(tmp_path: Path) -> None:
    """3 batches a step, validations after batches 4 and 8 of 10: no validation ends a step (steps end
    after 3, 6, 9 and the epoch's last batch), and each validation's save is written at its step's end."""
    saves = fit(LastCheckpoint(str(tmp_path)), epochs=1, accumulate_grad_batches=3, val_check_interval=4)
    assert saves.seen == [(2, 6, 1), (3, 9, 2)]


def test_saving_every_n_steps_a_validation_inside_an_accumulation_owes_no_save(tmp_path: Path) -> None:
    """Every 4 steps, 2 batches a step, validations after batches 3, 6 and 9: validations do not save in
    this mode, those inside a step neither (only step 4, after batch 8, is written)."""
    last = LastCheckpoint(str(tmp_path), every_n_train_steps=4)
    saves = fit(last, epochs=1, accumulate_grad_batches=2, val_check_interval=3)
    assert saves.seen == [(4, 8, 2)]


def test_a_save_owed_to_a_validated_step_is_written_once_after_its_validation(tmp_path: Path) -> None:
    """4 batches a step, validations after every second batch: those after batches 2 and 6 owe their
    saves to the steps ending at 4 and 8, which are validated themselves: each written once, after that
    validation (holding its outcome)."""
    saves = fit(LastCheckpoint(str(tmp_path)), epochs=1, accumulate_grad_batches=4, val_check_interval=2)
    assert saves.seen == [(1, 4, 2), (2, 8, 4), (3, 10, 5)]


def test_a_save_owed_to_a_validated_step_is_not_owed_again_by_the_next_step(tmp_path: Path) -> None:
    """4 batches a step, a validation every 3 batches counted across epochs (check_val_every_n_epoch=null):
    the one after batch 15 owes its save to step 5, ending at batch 18, which is validated and saved once
    there; step 6 (batches 19 and 20), with no validation inside, writes nothing."""
    last = LastCheckpoint(str(tmp_path))
    saves = fit(last, accumulate_grad_batches=4, val_check_interval=3, check_val_every_n_epoch=None)
    assert saves.seen == [(1, 4, 1), (2, 8, 2), (3, 10, 3), (4, 14, 4), (5, 18, 6)]


def test_averaging_checkpoints_keep_the_weights_of_the_last_epochs(tmp_path: Path) -> None:
    fit(AveragingCheckpoints(str(tmp_path), keep=2), epochs=3)
    kept = kept_checkpoints(tmp_path)
    assert [p.relative_to(tmp_path) for p in kept] == [
        Path("epochs/epoch001.ckpt"),
        Path("epochs/epoch002.ckpt"),
    ]
    saved = torch.load(kept[-1], weights_only=True)
    assert saved["global_step"] == 30 and "optimizer_states" not in saved  # weights only


def test_averaging_checkpoints_every_n_steps_keep_the_last_ones(tmp_path: Path) -> None:
    fit(AveragingCheckpoints(str(tmp_path), keep=2, every_n_steps=3), epochs=1)
    kept = kept_checkpoints(tmp_path)
    assert [p.relative_to(tmp_path) for p in kept] == [Path(f"steps/step0000000{k}.ckpt") for k in (6, 9)]
    assert "optimizer_states" not in torch.load(kept[-1], weights_only=True)
    assert not (tmp_path / "epochs").exists()


def test_averaging_checkpoints_keep_none_by_default(tmp_path: Path) -> None:
    fit(AveragingCheckpoints(str(tmp_path)), epochs=2)
    assert kept_checkpoints(tmp_path) == []


def test_an_epoch_trained_again_writes_over_its_averaging_checkpoint(tmp_path: Path) -> None:
    """A run resumed from a last.ckpt before a crash trains an epoch again: its file is replaced, not kept
    beside a second one (`epoch000-v1.ckpt`, which averaging would not count)."""
    for _ in range(2):
        fit(AveragingCheckpoints(str(tmp_path), keep=2), epochs=1)
    assert [p.name for p in (tmp_path / "epochs").iterdir()] == ["epoch000.ckpt"]


@pytest.mark.parametrize("interval", [4, 1])
def test_an_epochs_averaging_checkpoint_holds_its_end_when_validating_inside_epochs(
    interval: int, tmp_path: Path
) -> None:
    """Validations after every 4th batch (or every batch) of 10: each epoch's file holds the weights at the
    epoch's end, not those of its last validation (after batch 8 of 10)."""
    averaging = AveragingCheckpoints(str(tmp_path), keep=2)
    trainer_following(averaging, val_check_interval=interval).fit(Tiny())
    saved = [torch.load(path, weights_only=True)["global_step"] for path in kept_checkpoints(tmp_path)]
    assert saved == [BATCHES, 2 * BATCHES]


def trainer_following(*callbacks: L.Callback, **settings: Any) -> L.Trainer:
    """`trainer`, readied by `follow_every_batchs_validation` as attnlab's `build_trainer` readies its own."""
    built = trainer(*callbacks, **settings)
    follow_every_batchs_validation(built)
    return built


@pytest.mark.parametrize("kind", ["last", "best"])
def test_validating_after_every_batch_saves_after_every_validation(kind: str, tmp_path: Path) -> None:
    """`val_check_interval=1` (the int: validate after every batch), which Lightning takes for 1.0 (once an
    epoch): last.ckpt and the best checkpoint are written after each validation, as for any other number
    of batches, not at the epoch's end alone."""
    if kind == "last":
        checkpoint: ModelCheckpoint = LastCheckpoint(str(tmp_path))
    else:
        checkpoint = ModelCheckpoint(str(tmp_path), monitor="step", mode="max", enable_version_counter=False)
    saves = Saves()
    trainer_following(checkpoint, saves, epochs=1, val_check_interval=1).fit(Tiny())
    assert saves.seen == [(k, k, k) for k in range(1, BATCHES + 1)]


def test_validating_after_every_batch_with_no_validation_batches_saves_at_epoch_ends(tmp_path: Path) -> None:
    """`val_check_interval=1` with `limit_val_batches=0`: no validation ever ends, so last.ckpt is written at
    each epoch's end, as without the interval (saving after each validation would save never)."""
    saves, last = Saves(), LastCheckpoint(str(tmp_path))
    trainer_following(last, saves, val_check_interval=1, limit_val_batches=0).fit(Tiny())
    assert saves.seen == [(BATCHES, BATCHES, 0), (2 * BATCHES, 2 * BATCHES, 0)]


class Flat(Tiny):
    """Validation logs the same `val/x` every time: no check ever sees it improve."""

    def validation_step(self, batch: torch.Tensor, index: int) -> None:
        self.log("val/x", 1.0)


def test_validating_after_every_batch_checks_early_stopping_after_every_validation() -> None:
    """`val_check_interval=1` with patience 1: the second validation (after batch 2) stops training, not the
    epoch's end."""
    stopping = EarlyStopping(monitor="val/x", mode="min", patience=1)
    fitted = trainer_following(stopping, epochs=1, val_check_interval=1)
    fitted.fit(Flat())
    assert fitted.global_step == 2


def test_every_batchs_validation_leaves_other_intervals_and_explicit_choices_to_lightning(
    tmp_path: Path,
) -> None:
    """Only the int 1 is changed: 1.0 (once an epoch) and other numbers of batches are Lightning's, and a
    callback's own `save_on_train_epoch_end` is kept."""
    own = ModelCheckpoint(str(tmp_path), save_on_train_epoch_end=True)
    assert trainer_following(own, val_check_interval=1).checkpoint_callbacks[0]._save_on_train_epoch_end
    for interval in (1.0, 2):
        free = trainer_following(ModelCheckpoint(str(tmp_path)), val_check_interval=interval)
        assert free.checkpoint_callbacks[0]._save_on_train_epoch_end is None


@pytest.mark.parametrize("steps", [0, -1])
def test_averaging_checkpoints_refuse_a_step_interval_below_one(steps: int, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=rf"^every_n_steps={steps} must be >= 1 \(or null: one per epoch\)"):
        AveragingCheckpoints(str(tmp_path), keep=2, every_n_steps=steps)


SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# What `attnlab.training.pipeline.stopping_evaluation` is given (`evaluate_again`'s text for a run in `run`)
FIX = "run the same command with resume=auto hydra.run.dir=run: it trains nothing more and evaluates again"


class Handlers(L.Callback):
    """The handlers of `SIGNALS` at the first training (or test) batch's end."""

    def __init__(self) -> None:
        self.seen: dict[int, Any] = {}

    def on_train_batch_end(self, *args: Any) -> None:
        self.seen = self.seen or {signum: signal.getsignal(signum) for signum in SIGNALS}

    on_test_batch_end = on_train_batch_end


def test_preemption_holds_the_stop_signals_while_training_and_gives_back_the_handlers_it_found(
    tmp_path: Path,
) -> None:
    """In attnlab's trainers (`SignalConnector`) SIGTERM, SIGINT and SIGUSR1 reach `Preemption` alone while
    training runs, not Lightning's SIGTERM handler; after fitting, every handler is the one before."""
    preemption, handlers = Preemption(str(tmp_path)), Handlers()
    fitting = trainer(preemption, handlers, epochs=1)
    fitting._signal_connector = SignalConnector(fitting)
    before = {signum: signal.getsignal(signum) for signum in SIGNALS}
    fitting.fit(Tiny())
    assert handlers.seen == dict.fromkeys(SIGNALS, preemption._on_signal)
    assert {signum: signal.getsignal(signum) for signum in SIGNALS} == before


def test_without_preemption_lightnings_sigterm_handler_stays(tmp_path: Path) -> None:
    handlers = Handlers()
    fitting = trainer(handlers, epochs=1)
    fitting._signal_connector = SignalConnector(fitting)
    before = signal.getsignal(signal.SIGTERM)
    fitting.fit(Tiny())
    assert handlers.seen[signal.SIGTERM] not in (before, signal.SIG_DFL)  # Lightning's: stops at a step end
    assert signal.getsignal(signal.SIGTERM) == before


def test_in_the_final_evaluation_sigterm_and_sigint_reach_its_stop_alone() -> None:
    """Without `Preemption` in the trainer (`callbacks.preemption=null`), `stopping_evaluation`'s handlers
    hold SIGTERM and SIGINT while testing, not Lightning's SIGTERM handler (its collective hung DDP runs)."""
    from attnlab.training.pipeline import stopping_evaluation

    handlers = Handlers()
    testing = trainer(handlers)
    testing._signal_connector = SignalConnector(testing)
    with stopping_evaluation(FIX, testing):
        stop = testing.callbacks[-1]
        testing.test(Tiny(), verbose=False)
    assert handlers.seen[signal.SIGTERM] == handlers.seen[signal.SIGINT] == stop.on_signal


def test_a_single_process_agrees_on_the_signal_it_received() -> None:
    single = trainer()
    assert agreed_signal(single, None) == 0
    assert agreed_signal(single, int(signal.SIGUSR1)) == signal.SIGUSR1


def preempted(
    tmp_path: Path, *callbacks: L.Callback, epochs: int = 1, **settings: Any
) -> tuple[Preempted, Saves]:
    """Fit with `Preemption` (last.ckpt in `tmp_path`) and `callbacks` in a trainer of attnlab's
    (`SignalConnector`), which must stop with `Preempted`; the handlers of `SIGNALS` are those before."""
    saves = Saves()
    fitting = trainer(saves, Preemption(str(tmp_path)), *callbacks, epochs=epochs, **settings)
    fitting._signal_connector = SignalConnector(fitting)
    before = {signum: signal.getsignal(signum) for signum in SIGNALS}
    with pytest.raises(Preempted) as stopped:
        fitting.fit(Tiny())
    assert {signum: signal.getsignal(signum) for signum in SIGNALS} == before
    return stopped.value, saves


@pytest.fixture
def sigterm_caught() -> Any:
    """SIGTERM handled in Python while the test runs (its default would end the test process)."""
    before = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    yield
    signal.signal(signal.SIGTERM, before)


class FailsAtStep2(Tiny):
    def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
        if self.trainer.global_step == 2:
            raise RuntimeError("diverged")
        return super().training_step(batch, index)


def test_a_training_error_gives_back_the_handlers_preemption_replaced(tmp_path: Path) -> None:
    """Lightning runs no `teardown` hook of a callback when training fails: `on_exception` puts back the
    handlers of SIGTERM, SIGINT and SIGUSR1 there."""
    fitting = trainer(Preemption(str(tmp_path)), epochs=1)
    fitting._signal_connector = SignalConnector(fitting)
    before = {signum: signal.getsignal(signum) for signum in SIGNALS}
    with pytest.raises(RuntimeError, match="diverged"):
        fitting.fit(FailsAtStep2())
    assert {signum: signal.getsignal(signum) for signum in SIGNALS} == before


@pytest.mark.usefixtures("sigterm_caught")
def test_a_sigterm_saves_last_ckpt_at_the_end_of_the_next_step_and_stops_with_128_plus_the_signal(
    tmp_path: Path,
) -> None:
    """SIGTERM after step 3 (`SignalAt` runs after `Preemption` in the batch's end): last.ckpt, with the
    state to resume, written at the end of step 4, then `Preempted` with exit status 143."""
    stopped, saves = preempted(tmp_path, SignalAt(step=3, signum=signal.SIGTERM))
    assert saves.seen == [(4, 4, 0)]
    assert (stopped.code, stopped.signum, stopped.step) == (128 + signal.SIGTERM, signal.SIGTERM, 4)
    assert str(stopped) == (
        f"stopped by SIGTERM at step 4 after saving {tmp_path}/last.ckpt; continue with resume=true "
        "(same run directory)"
    )
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 4 and saved["optimizer_states"]


@pytest.mark.usefixtures("sigterm_caught")
def test_a_signal_inside_a_gradient_accumulation_saves_at_the_end_of_its_optimizer_step(
    tmp_path: Path,
) -> None:
    """3 batches a step, SIGTERM at the end of batches 3, 4 and 5 (global step 1): batches 4 and 5 end no
    step, so the save waits for batch 6, which ends step 2."""
    stopped, saves = preempted(tmp_path, SignalAt(step=1, signum=signal.SIGTERM), accumulate_grad_batches=3)
    assert saves.seen == [(2, 6, 0)] and stopped.step == 2


class SignalInValidation(L.Callback):
    """SIGTERM at the end of the validation of epoch `epoch`."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_validation_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.current_epoch == self.epoch:
            signal.raise_signal(signal.SIGTERM)


@pytest.mark.usefixtures("sigterm_caught")
def test_a_signal_in_the_last_validation_saves_and_stops_when_training_ends(tmp_path: Path) -> None:
    """No training step follows the last epoch's validation: the run saves and stops where training ends,
    before the final evaluation would start."""
    stopped, saves = preempted(tmp_path, SignalInValidation(epoch=1), epochs=2)
    assert saves.seen == [(20, 20, 2)] and stopped.step == 20


class StopsInValidationAt3(Tiny):
    """Stops training (as early stopping does) in the validation after training batch 3."""

    def on_validation_end(self) -> None:
        if self.trainer.global_step == 1 and not self.trainer.sanity_checking:
            self.trainer.should_stop = True
            signal.raise_signal(signal.SIGTERM)


@pytest.mark.usefixtures("sigterm_caught")
def test_a_signal_when_training_stopped_early_inside_an_accumulation_saves_nothing(tmp_path: Path) -> None:
    """2 batches a step, a validation after batch 3 (inside step 2) stops training early, and SIGTERM
    comes in it: no checkpoint is written (it would lack batch 3's gradients and resume past the stop);
    the stop says so."""
    saves = Saves()
    fitting = trainer(saves, Preemption(str(tmp_path)), epochs=1, accumulate_grad_batches=2,
                      val_check_interval=3)  # fmt: skip
    fitting._signal_connector = SignalConnector(fitting)
    with pytest.raises(Preempted) as stopped:
        fitting.fit(StopsInValidationAt3())
    assert saves.seen == [] and not (tmp_path / "last.ckpt").exists()
    assert (stopped.value.code, stopped.value.step, stopped.value.path) == (128 + signal.SIGTERM, 1, None)
    assert "inside a gradient accumulation, which no checkpoint can hold: nothing saved" in str(stopped.value)


@pytest.mark.usefixtures("sigterm_caught")
@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_sigusr1_stops_with_the_handler_it_replaced_as_the_requeue(signum: int, tmp_path: Path) -> None:
    """SLURM's auto-requeue or submitit's SIGUSR1 handler (here a recorder) is the `requeue` of a stop by
    SIGUSR1 alone, left to run once the run's manifest says so (`attnlab.training.pipeline`): training
    does not run it. A SIGTERM stop does not requeue the job."""
    calls: list[tuple[int, bool]] = []
    handler = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append((signum, last.exists())))
    last = tmp_path / "last.ckpt"
    try:
        stopped, saves = preempted(tmp_path, SignalAt(step=2, signum=signum))
        requeue = signal.getsignal(signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, handler)
    assert stopped.code == 128 + signum and saves.seen == [(3, 3, 0)] and calls == []
    assert stopped.requeue is (requeue if signum == signal.SIGUSR1 else None)


@pytest.mark.parametrize("when", ["sanity validation", "held before fitting"])
def test_a_sigusr1_before_training_saves_and_stops_at_the_end_of_the_first_step(
    when: str, tmp_path: Path
) -> None:
    """SIGUSR1 in the sanity validation, or while the data was prepared and the model built (a `HeldSignal`
    remembers it): last.ckpt at step 1, then training stops, the handler before (submitit's) its requeue.
    Before, SIGUSR1 reached `Preemption` only from the start of training: the handler before got it at once
    (without one, its default action ended the process) and training went on."""
    calls: list[tuple[int, bool]] = []
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append((signum, last.exists())))
    last = tmp_path / "last.ckpt"
    try:
        if when == "sanity validation":
            sanity = SignalAt(step=1, signum=signal.SIGUSR1, stage="sanity")
            stopped, saves = preempted(tmp_path, sanity, num_sanity_val_steps=1)
        else:
            recorder = signal.signal(signal.SIGUSR1, HeldSignal(signal.getsignal(signal.SIGUSR1)))
            signal.raise_signal(signal.SIGUSR1)
            saves = Saves()
            fitting = trainer(saves, Preemption(str(tmp_path)), epochs=1)
            fitting._signal_connector = SignalConnector(fitting)
            with pytest.raises(Preempted) as caught:
                fitting.fit(Tiny())
            stopped = caught.value
            assert signal.getsignal(signal.SIGUSR1) is recorder  # (not the HeldSignal: its work is done)
        requeue = signal.getsignal(signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert calls == [] and stopped.requeue is requeue and callable(requeue)
    stopped.requeue(signal.SIGUSR1, None)
    assert calls == [(signal.SIGUSR1, True)]
    assert stopped.code == 128 + signal.SIGUSR1 and [seen[:2] for seen in saves.seen] == [(1, 1)]


def test_under_slurm_a_sigusr1_in_the_sanity_validation_requeues_after_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning's SLURM auto-requeue, which it installs only where SIGUSR1 has no handler, is the `requeue`
    of `Preemption`'s stop, though `Preemption` holds SIGUSR1 from before Lightning installs its handlers;
    run after training stopped (as the pipeline runs it, once the manifest says so), it requeues the job (a
    stand-in `scontrol` records the requeue)."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    calls = tmp_path / "scontrol_calls"
    (tmp_path / "scontrol").write_text(
        f'#!/bin/sh\n[ -f {tmp_path / "last.ckpt"} ] && echo "$@" >> {calls}\n'
    )
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for name, value in SLURM_ENV.items():
        monkeypatch.setenv(name, value)
    sanity = SignalAt(step=1, signum=signal.SIGUSR1, stage="sanity")
    stopped, _ = preempted(
        tmp_path, sanity, num_sanity_val_steps=1, plugins=[SLURMEnvironment()], default_root_dir=tmp_path
    )
    assert stopped.code == 128 + signal.SIGUSR1 and stopped.requeue is not None and not calls.exists()
    stopped.requeue(signal.SIGUSR1, None)
    assert calls.read_text().split() == ["requeue", "4242"]


def test_a_failing_lightning_requeue_is_logged_by_the_name_of_the_handler_lightning_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Lightning installs its SLURM auto-requeue inside a `_HandlersCompose`: the error of a requeue that
    failed names the handler that failed, not the wrapper."""
    from lightning.pytorch.trainer.connectors.signal_connector import _HandlersCompose

    from attnlab.training.callbacks import run_requeue

    def slurm_requeue(signum: int, frame: Any) -> None:
        raise RuntimeError("scontrol: command not found")

    with caplog.at_level("ERROR", "attnlab.training.callbacks"):
        run_requeue(_HandlersCompose([slurm_requeue]), signal.SIGUSR1)
    assert [r.getMessage() for r in caplog.records] == [
        f"the SIGUSR1 handler that requeues the job ({slurm_requeue.__qualname__}) failed: the run is "
        "recorded interrupted, but the job may not be requeued: run it again with resume=auto to continue it"
    ]


class SigintHandler(L.Callback):
    """The SIGINT handler at the start of each training batch."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_train_batch_start(self, *args: Any) -> None:
        self.seen.append(signal.getsignal(signal.SIGINT))


def test_a_first_ctrl_c_says_so_on_stderr_and_gives_ctrl_c_back_to_its_handler(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C after step 2: the run says once that it saves at the end of the step and that a second
    Ctrl-C stops at once, and Python's KeyboardInterrupt holds SIGINT for the rest of the step."""
    handlers = SigintHandler()
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job's is SIG_IGN)
    try:
        stopped, saves = preempted(tmp_path, SignalAt(step=2, signum=signal.SIGINT), handlers)
    finally:
        signal.signal(signal.SIGINT, before)
    assert stopped.code == 128 + signal.SIGINT and saves.seen == [(3, 3, 0)]
    assert handlers.seen[1] is not signal.default_int_handler  # (Preemption's)
    assert handlers.seen[2] is signal.default_int_handler
    err = capfd.readouterr().err
    assert err.count("Ctrl-C: saving last.ckpt at the end of this training step, then stopping") == 1, err
    assert "Ctrl-C again stops now, without saving" in err


class EndedTestBatches(L.Callback):
    def __init__(self) -> None:
        self.ended = 0

    def on_test_batch_end(self, *args: Any) -> None:
        self.ended += 1


@pytest.mark.usefixtures("sigterm_caught")
def test_a_sigterm_in_a_single_process_final_evaluation_stops_it_at_once() -> None:
    """SIGTERM at the first of the 2 test batches: `EvaluationStopped` (exit status 143, its message ending
    with the fix it was given: the command that evaluates again) before the second runs."""
    from attnlab.training.pipeline import stopping_evaluation

    batches = EndedTestBatches()
    testing = trainer(batches, SignalAt(step=1, signum=signal.SIGTERM, stage="test"))
    testing._signal_connector = SignalConnector(testing)
    with (
        pytest.raises(EvaluationStopped) as stopped,
        stopping_evaluation(FIX, testing),
    ):
        testing.test(Tiny(), verbose=False)
    assert batches.ended == 1 and stopped.value.code == 128 + signal.SIGTERM
    assert str(stopped.value).endswith(f"(the checkpoints are kept); {FIX}")


def test_under_slurm_a_sigusr1_in_the_final_evaluation_stops_it_and_keeps_the_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGUSR1 at the first test batch under SLURM: `EvaluationStopped` (exit status 138) carries Lightning's
    auto-requeue, which Lightning installs for testing only where SIGUSR1 has no handler (a stand-in
    `scontrol` records the requeue when it runs); SIGUSR1 after testing, while the test sets would be
    decoded, stops at once too, with the handler before (here the default action), to which Lightning gave
    SIGUSR1 back when testing ended (before, that ended the process). SIGUSR1's handler is the one before
    afterwards."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from attnlab.training.pipeline import stopping_evaluation

    calls = tmp_path / "scontrol_calls"
    (tmp_path / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for name, value in SLURM_ENV.items():
        monkeypatch.setenv(name, value)
    before = signal.getsignal(signal.SIGUSR1)
    sigusr1 = SignalAt(step=1, signum=signal.SIGUSR1, stage="test")
    testing = trainer(sigusr1, plugins=[SLURMEnvironment()], default_root_dir=tmp_path)
    testing._signal_connector = SignalConnector(testing)
    with pytest.raises(EvaluationStopped) as stopped, stopping_evaluation(FIX, testing):
        testing.test(Tiny(), verbose=False)
    assert stopped.value.code == 128 + signal.SIGUSR1 and stopped.value.requeue is not None
    assert not calls.exists()  # (run once the manifest says interrupted)
    stopped.value.requeue(signal.SIGUSR1, None)
    assert calls.read_text().split() == ["requeue", "4242"]
    assert signal.getsignal(signal.SIGUSR1) == before
    sigusr1.step = 0  # (no more)
    with pytest.raises(EvaluationStopped) as after, stopping_evaluation(FIX, testing):
        testing.test(Tiny(), verbose=False)
        signal.raise_signal(signal.SIGUSR1)
    assert after.value.code == 128 + signal.SIGUSR1 and after.value.requeue is None
    assert signal.getsignal(signal.SIGUSR1) == before


def test_under_ddp_a_signal_while_testing_stops_at_its_end_and_one_after_testing_at_once() -> None:
    """The ranks of a DDP run (here one process standing for them, with `world_size=2`) note a signal while
    testing and stop at the end of testing, where they agree on it; after testing (rank 0 decodes the test
    sets alone) a signal stops at once. Without a signal, testing ends as usual."""
    quiet = EvaluationStop(FIX, world_size=2)
    quiet.on_test_end(trainer(), Tiny())
    stop = EvaluationStop(FIX, world_size=2)
    stop.on_signal(signal.SIGINT, None)
    with pytest.raises(EvaluationStopped) as at_end:
        stop.on_test_end(trainer(), Tiny())
    assert at_end.value.code == 128 + signal.SIGINT and "stopped by SIGINT in the final evaluation" in str(
        at_end.value
    )
    with pytest.raises(EvaluationStopped) as at_once:
        stop.on_signal(signal.SIGTERM, None)
    assert at_once.value.code == 128 + signal.SIGTERM
