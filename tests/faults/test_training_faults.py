"""Faults during training: NaN/inf losses and gradients, a kill in the middle of a checkpoint save, a full
disk, an unwritable run directory. Each ends with a message naming the problem and the fix, and the
checkpoints saved before are unchanged."""

from __future__ import annotations

import csv
import errno
import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from attnlab.runs.checkpoint import RESUME_KEY, read_checkpoint
from attnlab.training.pipeline import train
from attnlab.typed import ConfigError
from helpers import command_here, compose_train
from runs import assert_same_training, attnlab_train, final, logged_rows, train_here

RUN = [
    "data=synthetic",
    "model=tiny",
    "data.n_train=160",
    "data.n_val=16",
    "data.n_test=16",
    "data.batch_size=16",
    "trainer.max_epochs=1",
    "logger=csv",
    "test=false",
    "trainer.log_every_n_steps=1",
    "callbacks.last_checkpoint.every_n_train_steps=2",
    "trainer.enable_progress_bar=false",
    "seed=3",
]  # 10 optimizer steps; last.ckpt at steps 2, 4, 6, 8, 10


def nonfinite_at(step: int, what: str) -> list[str]:
    return [
        "+callbacks.nan._target_=probes.NonFiniteAt",
        f"+callbacks.nan.step={step}",
        f"+callbacks.nan.what={what}",
    ]


def finite_weights(checkpoint: Path) -> bool:
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    return all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())


@pytest.mark.parametrize(("what", "message"), [
    ("loss", r"training loss is nan at optimizer step 5 \(epoch 0, batch 4\)"),
    ("grad", r"gradient norm is inf at optimizer step 5 \(epoch 0\)"),
])  # fmt: skip
def test_a_nonfinite_step_stops_the_run_and_keeps_the_saved_checkpoints(
    what: str, message: str, tmp_path: Path
) -> None:
    from attnlab.training.module import NonFiniteError
    from probes import NonFiniteAt

    with pytest.raises(NonFiniteError, match=message + r".*optim\.on_nonfinite=skip"):
        train(compose_train([*RUN, *nonfinite_at(5, what)], tmp_path))
    probe = NonFiniteAt.last
    assert probe is not None and probe.saved  # checkpoints existed when it struck
    now = {str(p): p.read_bytes() for p in sorted((tmp_path / "checkpoints").rglob("*.ckpt"))}
    assert now == probe.saved  # nothing saved after, nothing changed
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 4 and finite_weights(last)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "NonFiniteError" in manifest["error"]


@pytest.mark.parametrize("what", ["loss", "grad"])
def test_skip_leaves_the_weights_untouched_by_the_bad_batch_and_trains_on(what: str, tmp_path: Path) -> None:
    from probes import NonFiniteAt

    train(compose_train([*RUN, *nonfinite_at(5, what), "optim.on_nonfinite=skip"], tmp_path))
    assert NonFiniteAt.last is not None and NonFiniteAt.last.updated is False
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert finite_weights(last)
    with open(tmp_path / "csv" / "metrics.csv", newline="") as f:
        skipped = [float(r["train/skipped_steps"]) for r in csv.DictReader(f) if r.get("train/skipped_steps")]
    assert skipped == [1.0]  # the epoch's count
    assert torch.load(last, weights_only=True)["global_step"] == 10  # the step counts; it updated nothing
    # train/tokens_seen counts the tokens trained on: not the skipped batch's (step 5's)
    seen = [value for _, value in logged_rows(tmp_path, "train/tokens_seen_step")]
    assert len(seen) == 10 and seen[4] == seen[3] < seen[5]
    assert read_checkpoint(last)[RESUME_KEY]["skipped"] == 1  # the run's count, kept across a resumption
    # Adam's step counts are then one behind the schedule's: the run still resumes (here for one epoch more)
    saved = torch.load(last, weights_only=True)
    assert {float(s["step"]) for s in saved["optimizer_states"][0]["state"].values()} == {9.0}
    overrides = [o for o in RUN if not o.startswith("trainer.max_epochs=")]
    more = [*overrides, "trainer.max_epochs=2", "optim.on_nonfinite=skip", "resume=true"]
    train(compose_train(more, tmp_path))
    assert torch.load(last, weights_only=True)["global_step"] == 20
    assert read_checkpoint(last)[RESUME_KEY]["skipped"] == 1


def test_skipped_steps_are_counted_per_epoch(tmp_path: Path) -> None:
    """`train/skipped_steps` is each epoch's count of skipped batches, not the run's so far."""
    second = [
        "+callbacks.nan2._target_=probes.NonFiniteAt",
        "+callbacks.nan2.step=15",
        "+callbacks.nan2.what=loss",
    ]
    overrides = [o for o in RUN if not o.startswith("trainer.max_epochs=")]
    skips = [*nonfinite_at(5, "loss"), *second, "optim.on_nonfinite=skip"]
    train(compose_train([*overrides, "trainer.max_epochs=2", *skips], tmp_path))
    assert logged_rows(tmp_path, "train/skipped_steps") == [(9, 1.0), (19, 1.0)]


def test_a_diverged_model_s_validation_loss_is_nan_not_zero(tmp_path: Path) -> None:
    """With `optim.on_nonfinite=skip` a run whose weights overflowed after its first step trained on,
    skipping every batch, and validated as val/loss 0.0 and val/ppl 1.0 (torchmetrics' sums dropped the
    NaN losses): the best score of any run, which a sweep minimizing best/val/loss took for its best
    trial. Its validation metrics are NaN, its checkpoints are never the best: its best val/loss is inf
    (not the last, NaN, val/loss), worse than any finite one."""
    import math

    overrides = [o for o in RUN if not o.startswith("trainer.max_epochs=")]
    diverging = ["optim=linear", "optim.peak_lr=1e6", "optim.warmup_steps=1", "optim.on_nonfinite=skip"]
    metrics = train(compose_train([*overrides, "trainer.max_epochs=2", *diverging], tmp_path))
    assert all(math.isnan(metrics[f"val/{name}"]) for name in ("loss", "nll", "ppl")), metrics
    assert metrics["best/val/loss"] == math.inf, metrics


def test_a_diverged_model_failing_its_test_decoding_ends_the_run_in_one_line(tmp_path: Path) -> None:
    """Decoding the test sentences with a model whose scores are NaN (it diverged under
    `optim.on_nonfinite=skip`) raises NonFiniteScores: attnlab-train printed it as a traceback, where
    attnlab-eval says it in one line. It is one line too, exit status 1, the run recorded as failed."""
    import subprocess
    import sys

    overrides = [o for o in RUN if not o.startswith("test=")]
    diverging = ["optim=linear", "optim.peak_lr=1e6", "optim.warmup_steps=1", "optim.on_nonfinite=skip"]
    command = [sys.executable, "-m", "attnlab.cli.train", *overrides, *diverging, f"hydra.run.dir={tmp_path}"]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "Error executing job" not in done.stderr, done.stderr[-2000:]
    assert "attnlab-train: greedy decoding found no hypothesis for 16 of 16 sentences" in done.stderr
    assert json.loads((tmp_path / "manifest.json").read_text())["status"] == "failed"


def test_a_run_preempted_inside_an_epoch_logs_that_epochs_values_as_an_uninterrupted_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGUSR1 at the end of step 6 of 10 (`Preemption` saves last.ckpt at the next step's end, 7, and
    stops, saying so on stderr); resumed, the run
    logs the epoch's values (`runs.EPOCH_VALUES`) and its skipped batch (step 3, before the stop) as the
    uninterrupted run does: the sums before the stop come from the checkpoint."""
    skip = ["optim.on_nonfinite=skip", "model.dropout=0.1"]
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    train(compose_train([*RUN, *skip, *nonfinite_at(3, "loss"), *final(reference)], reference))
    stop = ["+callbacks.stop._target_=probes.SignalAt", "+callbacks.stop.step=6",
            f"+callbacks.stop.signum={int(signal.SIGUSR1)}"]  # fmt: skip
    with pytest.raises(SystemExit):
        train(compose_train([*RUN, *skip, *nonfinite_at(3, "loss"), *stop, *final(run_dir)], run_dir))
    assert read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 7  # inside the epoch
    told = (
        f"attnlab-train: stopped by SIGUSR1 at step 7 after saving {run_dir / 'checkpoints' / 'last.ckpt'}; "
    )
    assert told in capsys.readouterr().err
    train(compose_train([*RUN, *skip, *final(run_dir), "resume=true"], run_dir))
    assert_same_training(run_dir, reference)
    assert (
        logged_rows(run_dir, "train/skipped_steps")
        == logged_rows(reference, "train/skipped_steps")
        == [(9, 1.0)]
    )


def test_a_kill_in_the_middle_of_a_checkpoint_save_keeps_the_previous_one(
    resume_reference: Path, tmp_path: Path
) -> None:
    """SIGKILL while last.ckpt's second save (step 8) is half written: last.ckpt is still step 4's and
    loads; the partial file is hidden and removed by the next save; the run resumes to the same weights."""
    run_dir = tmp_path / "run"
    killed = attnlab_train(run_dir, "+callbacks.kill._target_=probes.KillDuringSave", "+callbacks.kill.nth=2")
    assert killed.returncode == -signal.SIGKILL
    checkpoints = run_dir / "checkpoints"
    partial = list(checkpoints.glob(".last.ckpt.partial-*"))
    assert len(partial) == 1 and partial[0].stat().st_size > 0  # the kill came mid-write
    assert read_checkpoint(checkpoints / "last.ckpt")["global_step"] == 4
    train_here(run_dir, "resume=auto")
    assert_same_training(run_dir, resume_reference)
    assert not list(checkpoints.glob(".*partial*"))


def test_a_full_disk_during_a_save_names_the_file_and_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnlab.training.checkpoint_io import AtomicCheckpointIO, CheckpointWriteError

    write, calls = AtomicCheckpointIO.write, []

    class FillingDisk:  # the file on a disk that fills up after 1000 bytes, as torch.save sees it
        def __init__(self, file) -> None:
            self.file, self.room = file, 1000

        def write(self, data) -> int:
            if len(data) > self.room:
                self.file.write(bytes(data[: self.room]))
                self.room = 0
                raise OSError(errno.ENOSPC, "No space left on device")
            self.room -= len(data)
            return self.file.write(data)

        def flush(self) -> None:
            self.file.flush()

    def filling(self: AtomicCheckpointIO, checkpoint: dict, file) -> None:  # the third save: disk full
        calls.append(file.name)
        write(self, checkpoint, FillingDisk(file) if len(calls) == 3 else file)  # torch raises RuntimeError

    monkeypatch.setattr(AtomicCheckpointIO, "write", filling)
    last = tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(CheckpointWriteError) as raised:
        train(compose_train(RUN, tmp_path))
    message = str(raised.value)
    assert f"cannot write checkpoint {last}: No space left on device" in message
    assert (
        "the previous checkpoint there is unchanged. Free disk space" in message and "resume=auto" in message
    )
    assert read_checkpoint(last)["global_step"] == 4  # the second save's, intact
    assert not list(last.parent.glob(".*partial*"))


def test_a_first_save_that_fails_says_nothing_was_written_and_a_full_quota_is_a_full_disk(
    tmp_path: Path,
) -> None:
    """A save that fails where no checkpoint was before leaves no file and says so; a disk quota reached
    (EDQUOT) gets the advice of a full disk."""
    from attnlab.training.checkpoint_io import AtomicCheckpointIO, CheckpointWriteError

    class OverQuota(AtomicCheckpointIO):  # the quota reached after torch wrote the first bytes
        def write(self, checkpoint: dict, file) -> None:
            file.write(b"PK")
            raise OSError(errno.EDQUOT, "Disk quota exceeded")

    last = tmp_path / "last.ckpt"
    with pytest.raises(CheckpointWriteError) as raised:
        OverQuota().save_checkpoint({"step": 1}, last)
    assert (
        f"cannot write checkpoint {last}: Disk quota exceeded; nothing was written. Free disk space"
        in str(raised.value)
    )
    assert list(tmp_path.iterdir()) == []  # neither the checkpoint nor its temporary file


def test_an_unwritable_run_directory_fails_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(
        ConfigError,
        match=r"run directory .*a_file/run or write in it: Not a directory — set hydra\.run\.dir",
    ):
        train(compose_train(RUN, blocker / "run"))
    assert blocker.read_text() == "not a directory"


def test_a_run_gives_back_the_signal_handlers_it_found(tmp_path: Path) -> None:
    """Lightning's SIGTERM handler (which `Preemption` replaces while training runs) stayed installed after
    a run: a SIGTERM later in the process (decoding the test sets, another run) was logged and ignored."""
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    before = {signum: signal.getsignal(signum) for signum in signals}
    train(compose_train(RUN, tmp_path))
    assert {signum: signal.getsignal(signum) for signum in signals} == before


@pytest.mark.parametrize("ends", ["returns", "exits", "raises"])
def test_a_sigusr1_before_training_stops_the_run_at_the_end_of_the_first_step(
    ends: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """SIGUSR1 while the trainer is built (the data prepared, the model built): the run saves last.ckpt at
    step 1 and stops, interrupted, saying so; then the handler before (submitit's; here a recorder) runs,
    once the manifest says `interrupted` (it ran before the manifest was written: a requeue that killed the
    process left it `running`). Its default action ended the process at once, saving nothing, the manifest
    left at `running`. A handler that ends the process as submitit's does (`sys.exit(-1)` once it requeued
    the job), or that fails (logged, naming it), leaves the run recorded `interrupted` with status
    128 + SIGUSR1 (it was `failed`, "SystemExit: -1" or the handler's error)."""
    signalled = [
        "+callbacks.early._target_=probes.SignalWhenBuilt",
        f"+callbacks.early.signum={int(signal.SIGUSR1)}",
    ]
    seen: list[tuple[bool, str]] = []
    last = tmp_path / "checkpoints" / "last.ckpt"

    def requeue(signum: int, frame: object) -> None:
        seen.append((last.is_file(), json.loads((tmp_path / "manifest.json").read_text())["status"]))
        if ends == "exits":
            sys.exit(-1)
        if ends == "raises":
            raise RuntimeError("scontrol: command not found")

    before = signal.signal(signal.SIGUSR1, requeue)
    try:
        with pytest.raises(SystemExit) as stopped, caplog.at_level("ERROR", "attnlab.training.callbacks"):
            train(compose_train([*RUN, *signalled], tmp_path))
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert stopped.value.code == 128 + signal.SIGUSR1 and seen == [(True, "interrupted")]
    assert read_checkpoint(last)["global_step"] == 1
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and "SIGUSR1 at step 1" in manifest["error"], manifest
    assert f"attnlab-train: stopped by SIGUSR1 at step 1 after saving {last}" in capsys.readouterr().err
    failed = [r.getMessage() for r in caplog.records if r.name == "attnlab.training.callbacks"]
    assert failed == ([] if ends != "raises" else [
        f"the SIGUSR1 handler that requeues the job ({requeue.__qualname__}) failed: the run is recorded "
        "interrupted, but the job may not be requeued: run it again with resume=auto to continue it"
    ])  # fmt: skip


@pytest.mark.parametrize("preemption", [True, False])
def test_sigusr1_is_held_before_training_only_for_preemption(preemption: bool, tmp_path: Path) -> None:
    """With `callbacks.preemption=null` nothing would act on a held SIGUSR1 (and Lightning would not add
    its SLURM handler beside one): the handler before stays. SIGTERM is held (to stop at once) either way."""
    from attnlab.training.callbacks import HeldSignal
    from attnlab.training.pipeline import holding_signals

    cfg = compose_train([*RUN, *([] if preemption else ["callbacks.preemption=null"])], tmp_path)
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        holding_signals(cfg.callbacks)
        assert isinstance(signal.getsignal(signal.SIGUSR1), HeldSignal) == preemption
        assert isinstance(signal.getsignal(signal.SIGTERM), HeldSignal)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize("preemption", [True, False])
def test_a_sigterm_before_training_stops_the_run_at_once_and_the_manifest_says_so(
    preemption: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM once the data is prepared and the model built, before training is set up: the run stops at
    once (exit status 128 + SIGTERM), its manifest and a line on stderr say it was interrupted with nothing
    saved, and SIGTERM's handler is back afterwards. (SIGTERM's default action, here a handler of the
    caller's standing in for it, ended the process and left the manifest `running`.)"""
    early = [
        "+callbacks.early._target_=probes.SignalWhenBuilt",
        f"+callbacks.early.signum={int(signal.SIGTERM)}",
    ]
    early += [] if preemption else ["callbacks.preemption=null"]
    seen: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with pytest.raises(SystemExit) as stopped:
            train(compose_train([*RUN, *early], tmp_path))
        assert signal.getsignal(signal.SIGTERM) is not None and not seen
        signal.raise_signal(signal.SIGTERM)
        assert seen == [signal.SIGTERM]  # (the caller's handler is back)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert stopped.value.code == 128 + signal.SIGTERM and not (tmp_path / "checkpoints").exists()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", manifest
    assert manifest["error"] == (
        "SetupStopped: stopped by SIGTERM before training (while the data was prepared or the model or "
        "trainer built), with nothing to save; run the command again: a new run starts over, a run continued "
        "with resume=true or resume=auto goes on from its last.ckpt"
    )
    assert f"attnlab-train: {manifest['error'].removeprefix('SetupStopped: ')}\n" in capsys.readouterr().err


def test_without_preemption_a_sigterm_stops_training_at_the_step_end_and_the_manifest_says_so(
    tmp_path: Path,
) -> None:
    """`callbacks.preemption=null`: Lightning's own SIGTERM handler stays in the trainer (attnlab's trainers
    leave it out only where attnlab's handlers hold SIGTERM) and stops training at the end of the step,
    without a save; the run ends interrupted, naming the last.ckpt saved before, with status 128 + SIGTERM
    (Lightning's `SIGTERMException` exits with 0). A handler of the caller's stands in for SIGTERM's
    default, which would end this test's process: without Lightning's it would be all that ran."""
    kill = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=3",
            f"+callbacks.kill.signum={int(signal.SIGTERM)}", "callbacks.preemption=null"]  # fmt: skip
    seen: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with pytest.raises(SystemExit) as stopped:
            train(compose_train([*RUN, *kill], tmp_path))
    finally:
        signal.signal(signal.SIGTERM, before)
    assert stopped.value.code == 128 + signal.SIGTERM and seen == [signal.SIGTERM]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", manifest
    assert manifest["error"] == (
        "SIGTERMException: stopped by SIGTERM without saving (callbacks.preemption=null); resume=true "
        "continues from the last.ckpt saved before"
    )
    assert read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 2  # none at step 3


def test_a_sigterm_in_the_final_evaluation_stops_it_and_names_the_command_that_evaluates_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM at the first test batch, after training: the run stops at once (exit status 128 + SIGTERM),
    keeps its checkpoints, and its manifest reads interrupted with the fix: the same command with
    resume=auto and the run's directory; SIGTERM's own handler is back afterwards. (Lightning's handler, in
    place while testing, set a flag that its last test batch does not read: the run went on; while
    decoding, SIGTERM ended the process and left the manifest `running`.)"""
    kill = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.stage=test",
            "+callbacks.kill.step=1", f"+callbacks.kill.signum={int(signal.SIGTERM)}"]  # fmt: skip
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        train(compose_train([*RUN, "test=true", *kill], tmp_path))
    assert stopped.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before
    assert read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 10  # training ended
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", manifest
    assert manifest["error"] == (
        "EvaluationStopped: stopped by SIGTERM in the final evaluation, after training (the checkpoints are "
        f"kept); run the same command with resume=auto hydra.run.dir={tmp_path}: it trains nothing more and "
        "evaluates again"
    )
    assert (
        f"attnlab-train: {manifest['error'].removeprefix('EvaluationStopped: ')}\n" in capsys.readouterr().err
    )
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("stage", ["test", "validate"])
def test_a_run_stopped_in_its_final_evaluation_continues_to_the_metrics_of_an_uninterrupted_run(
    stage: str, tmp_path: Path
) -> None:
    """A run stopped by SIGTERM in its final evaluation (after its last checkpoint, before results.json),
    or in its last validation (saved and stopped once it ends, after the last step), continued with
    `resume=auto` (as a requeued job or a sweep re-run with `sweep.skip_done=true` does), trains nothing
    and evaluates: it ends with the training's final `train/*` and `val/*` metrics, read from what the
    stopped run recorded when training ended (the validation is not run again), and the test scores, all
    in results.json. (It ended without `train/*` and `val/*`: a sweep optimizing `val/loss` got nothing
    for the job.)"""
    kill = ["+callbacks.kill._target_=probes.SignalAt", f"+callbacks.kill.stage={stage}",
            "+callbacks.kill.step=1", f"+callbacks.kill.signum={int(signal.SIGTERM)}"]  # fmt: skip
    with pytest.raises(SystemExit):
        train(compose_train([*RUN, "test=true", *kill], tmp_path))
    metrics = train(compose_train([*RUN, "test=true", "resume=auto"], tmp_path))
    assert metrics["val/loss"] == logged_rows(tmp_path, "val/loss")[-1][1]  # the last validation's
    assert metrics["train/loss_epoch"] == logged_rows(tmp_path, "train/loss_epoch")[-1][1]
    assert metrics["best/val/loss"] == min(value for _, value in logged_rows(tmp_path, "val/loss"))
    assert "test/loss" in metrics and (tmp_path / "checkpoints" / "last.ckpt").is_file()
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["metrics"] == pytest.approx(metrics)
    assert json.loads((tmp_path / "manifest.json").read_text())["status"] == "finished"


@pytest.mark.parametrize("exits", [False, True], ids=["returns", "exits"])
def test_a_sigusr1_in_the_final_evaluation_stops_it_and_then_runs_the_requeue_handler(
    exits: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGUSR1 at the first test batch, where a SIGUSR1 handler was installed before (submitit's requeue, here
    a recorder): the run stops at once (exit status 128 + SIGUSR1), its manifest and stderr name the command
    that evaluates again (resume=auto), and the handler runs once, after the manifest says interrupted, so the
    job is still requeued. (Without a handler, SIGUSR1's default ended the process and left the manifest
    `running`; with one, the evaluation went on and the handler ran alone.) A handler that ends the process as
    submitit's does (`sys.exit(-1)`) leaves the stop's status."""
    kill = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.stage=test",
            "+callbacks.kill.step=1", f"+callbacks.kill.signum={int(signal.SIGUSR1)}"]  # fmt: skip
    status: list[str] = []

    def requeue(signum: int, frame: object) -> None:
        status.append(json.loads((tmp_path / "manifest.json").read_text())["status"])
        if exits:
            sys.exit(-1)

    before = signal.signal(signal.SIGUSR1, requeue)
    try:
        with pytest.raises(SystemExit) as stopped:
            train(compose_train([*RUN, "test=true", *kill], tmp_path))
        assert signal.getsignal(signal.SIGUSR1) is requeue
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert stopped.value.code == 128 + signal.SIGUSR1 and status == ["interrupted"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["error"].startswith(
        "EvaluationStopped: stopped by SIGUSR1 in the final evaluation, after training (the checkpoints are "
        "kept); run the same command with resume=auto hydra.run.dir="
    ), manifest
    err = capsys.readouterr().err
    assert f"attnlab-train: {manifest['error'].removeprefix('EvaluationStopped: ')}\n" in err
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("multirun", [False, True], ids=["run", "multirun"])
def test_the_command_a_run_stopped_in_its_final_evaluation_names_evaluates_it_again(
    multirun: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM in the final evaluation of `attnlab-train` on data without text, in the directory named by the
    time that the command makes, under a log directory named as a multirun job's (`=`, `,`) with a space
    and a quote: the command the manifest names (the same command, with the words after "run the same
    command with" as the shell splits them) trains nothing more (its checkpoints unchanged) and evaluates
    again into that directory, which ends finished with its test scores in results.json. (It named an
    attnlab-eval command, which refuses a checkpoint of data without text: it holds no tokenizers.) A
    multirun's job (`-m`, which ignores `hydra.run.dir`) is named the same multirun with its sweep
    directory, which finds the job again."""
    import shlex

    logs = tmp_path / "pe=learned,seed=2-1b2c3d4e it's"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNLAB_LOG_DIR", logs.name)  # (relative: the fix is run from another directory)
    kill = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.stage=test",
            "+callbacks.kill.step=1", f"+callbacks.kill.signum={int(signal.SIGTERM)}"]  # fmt: skip
    command = ["-m"] if multirun else []
    with pytest.raises(SystemExit) as stopped:
        command_here(monkeypatch, "train", *command, *RUN, "test=true", *kill)
    assert stopped.value.code == 128 + signal.SIGTERM
    (manifest_file,) = logs.glob("train/*/*/manifest.json" if not multirun else "train/*/*/*/manifest.json")
    run_dir = manifest_file.parent
    error = json.loads(manifest_file.read_text())["error"]
    told = "run the same multirun again with " if multirun else "run the same command with "
    fix = error.partition(told)[2].partition(": ")[0]
    saved = {path: path.read_bytes() for path in (run_dir / "checkpoints").glob("*.ckpt")}
    monkeypatch.chdir((tmp_path / "elsewhere").mkdir() or tmp_path / "elsewhere")
    command_here(monkeypatch, "train", *command, *RUN, "test=true", *shlex.split(fix))
    assert [p.parent for p in logs.rglob("manifest.json")] == [run_dir], fix  # no new run
    assert read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 10
    now = (run_dir / "checkpoints").glob("*.ckpt")
    assert not [path.name for path in now if saved.get(path) != path.read_bytes()]  # nothing trained
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "finished"
    results = json.loads((run_dir / "results.json").read_text())
    assert "test/loss" in results["metrics"] and "val/loss" in results["metrics"], results


def test_a_second_ctrl_c_before_any_save_reads_interrupted_without_naming_resume(tmp_path: Path) -> None:
    """Two Ctrl-C at step 1 (last.ckpt is saved every 2 steps): the run stops at once with nothing saved,
    so the manifest does not send the user to resume=true, which would be refused for lack of last.ckpt;
    Ctrl-C is handled afterwards as before the run (`keeping_signal_handlers`)."""
    ctrl_c = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=1", "+callbacks.kill.times=2",
              f"+callbacks.kill.signum={int(signal.SIGINT)}"]  # fmt: skip
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as stopped:
        train(compose_train([*RUN, *ctrl_c], tmp_path))
    assert signal.getsignal(signal.SIGINT) is before  # (Lightning left it ignored)
    assert stopped.value.code == 128 + signal.SIGINT and not (tmp_path / "checkpoints" / "last.ckpt").exists()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and "resume=true" not in manifest["error"], manifest
    assert manifest["error"].endswith("before any checkpoint was saved; run the command again")
