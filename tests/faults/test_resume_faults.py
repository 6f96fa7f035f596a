"""Resumption from every checkpoint is exact, the default end-of-epoch last.ckpt included: a run killed
in its second epoch, one whose last.ckpt was written at the last step of an epoch, and a finished run
given more epochs all end with the weights, bitwise, and the step history of an uninterrupted run (on
the synthetic task and on token batches of a text corpus). A checkpoint whose position in the training
data cannot be restored exactly (other data, other batch sizes) is refused before training, naming the
difference.

Synthetic runs are `runs.RUN` (2 epochs of 10 steps, dropout, a DataLoader worker), compared with the
session's uninterrupted `resume_reference`; only the runs that are killed start a process.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import signal
from pathlib import Path

import pytest
import torch

from attnlab.data.batching import TokenBatchSampler
from attnlab.inference.translator import resolve_checkpoints
from attnlab.training.checkpoint_io import trusted_callback_states
from attnlab.training.module import TranslationModule
from attnlab.training.pipeline import train
from attnlab.typed import ConfigError
from helpers import compose_train, require_shared_data, write_corpus
from runs import IN_PROCESS, assert_same_training, attnlab_train, final, step_losses, weights

DEFAULT = "callbacks.last_checkpoint.every_n_train_steps=null"  # last.ckpt at the end of each epoch


def kill_at(step: int) -> list[str]:
    return ["+callbacks.kill._target_=probes.SignalAt", f"+callbacks.kill.step={step}",
            f"+callbacks.kill.signum={int(signal.SIGKILL)}"]  # fmt: skip


def saved_step(run_dir: Path) -> int:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]


def status(run_dir: Path) -> str:
    return json.loads((run_dir / "manifest.json").read_text())["status"]


def record(run_dir: Path) -> list[str]:
    return ["+callbacks.batches._target_=probes.RecordBatches", f"+callbacks.batches.dirpath={run_dir}"]


def recorded_epochs(run_dir: Path) -> list[list[list[int]]]:
    """The example indices of each trained batch (`probes.RecordBatches`), by epoch of 10 steps."""
    rows = [json.loads(line) for line in (run_dir / "batches.jsonl").read_text().splitlines()]
    batches = [row["index"] for row in sorted(rows, key=lambda row: row["step"])]
    assert [row["step"] for row in rows] == list(range(len(rows)))  # every step once
    return [batches[k : k + 10] for k in range(0, len(batches), 10)]


def resume(run_dir: Path, *extra: str) -> None:
    """Continue the run in `run_dir` in this process (`resume=true`), as `attnlab-train` would."""
    train(compose_train([*IN_PROCESS, *final(run_dir), *record(run_dir), *extra, "resume=true"], run_dir))
    assert status(run_dir) == "finished"


def assert_second_epoch_in_its_own_order(run_dir: Path) -> None:
    first, second = recorded_epochs(run_dir)
    assert sorted(i for b in second for i in b) == sorted(i for b in first for i in b) == list(range(160))
    assert second != first  # the epoch's own shuffle, not the first epoch's again


# ---------------------------------------------------------------------------------------------------------
# The sampler's saved position


def test_a_position_at_the_end_of_an_epoch_loads_as_the_start_of_the_next() -> None:
    lengths = [1 + i % 23 for i in range(300)]
    sampler = TokenBatchSampler(lengths, max_tokens=64, seed=3)
    sampler.set_epoch(4)
    finished = list(sampler)
    sampler.set_epoch(5)
    expected = list(sampler)
    assert expected != finished
    resumed = TokenBatchSampler(lengths, max_tokens=64, seed=3)
    resumed.load_state_dict({"epoch": 4, "seed": 3, "yielded": len(finished)})
    assert resumed.state_dict() == {"epoch": 5, "seed": 3, "yielded": 0}
    batches = iter(resumed)
    first = next(batches)  # a DataLoader worker draws ahead, before the epoch's set_epoch
    resumed.set_epoch(5)  # where Lightning continues after a checkpoint at epoch 4's end
    assert [first, *batches] == expected


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"lengths": [1 + i % 23 for i in range(299)]}, "training examples: 300 saved, 299 now"),
        ({"lengths": [1 + i % 22 for i in range(300)]}, "hash of the example lengths"),
        ({"max_tokens": 128}, "max_tokens: 64 saved, 128 now"),
        ({"batch_size": 8}, "batch_size: None saved, 8 now"),
        ({"num_replicas": 2}, "num_replicas: 1 saved, 2 now"),
        ({"bucket": False}, "bucket: True saved, False now"),
    ],
)
def test_a_position_saved_for_other_batches_is_refused(change: dict, named: str) -> None:
    settings = {"lengths": [1 + i % 23 for i in range(300)], "max_tokens": 64, "seed": 3}
    saved = TokenBatchSampler(**settings)
    state = {**saved.state_dict(), "yielded": 2, "batching": saved.fingerprint()}
    with pytest.raises(ValueError, match=re.escape(named)):
        TokenBatchSampler(**{**settings, **change}).load_state_dict(state)
    TokenBatchSampler(**settings).load_state_dict(state)  # the same batches: taken up


# ---------------------------------------------------------------------------------------------------------
# Synthetic task


def test_killed_in_the_second_epoch_with_default_checkpoints_resumes_exactly(
    resume_reference: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    killed = attnlab_train(run_dir, DEFAULT, *kill_at(14))
    assert killed.returncode == -signal.SIGKILL
    assert saved_step(run_dir) == 10  # the end of the first epoch
    resume(run_dir, DEFAULT)
    assert saved_step(run_dir) == 20  # the second epoch was trained, not skipped
    assert_same_training(run_dir, resume_reference)


def test_a_checkpoint_at_the_last_step_of_an_epoch_resumes_exactly(
    resume_reference: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    every_5 = "callbacks.last_checkpoint.every_n_train_steps=5"  # steps 5 and 10 of the 10-step epoch
    killed = attnlab_train(run_dir, every_5, *kill_at(13))
    assert killed.returncode == -signal.SIGKILL
    assert saved_step(run_dir) == 10  # written at the epoch's last step, before its validation
    resume(run_dir, every_5)
    assert saved_step(run_dir) == 20
    assert_same_training(run_dir, resume_reference)


def test_last_ckpt_every_n_minutes_is_written_at_an_optimizer_steps_end_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    """`every_n_minutes` (here 3 s) comes due inside an accumulation (3 batches a step, the epoch's 10th
    batch its own step: steps end after batches 3, 6, 9, 10): 3.5 s pass before batch 7, and last.ckpt is
    written after batch 9, at the end of step 3, not after batch 7 (whose gradient, not yet applied,
    a checkpoint cannot hold). Killed at step 4, the run resumes from step 3 mid-epoch and ends bitwise
    as an uninterrupted run."""
    minutes = [DEFAULT, "callbacks.last_checkpoint.every_n_minutes=0.05", "trainer.accumulate_grad_batches=3"]
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    train(compose_train([*IN_PROCESS, *final(reference), *minutes], reference))
    pause = ["+callbacks.pause._target_=probes.SleepAt", "+callbacks.pause.batch=7",
             "+callbacks.pause.seconds=3.5"]  # fmt: skip
    killed = attnlab_train(run_dir, *minutes, *pause, *kill_at(4))
    assert killed.returncode == -signal.SIGKILL
    assert saved_step(run_dir) == 3
    train(compose_train([*IN_PROCESS, *final(run_dir), *minutes, "resume=true"], run_dir))
    assert saved_step(run_dir) == 8  # 4 steps an epoch
    assert_same_training(run_dir, reference)


def test_last_ckpt_every_n_minutes_waits_for_its_interval_and_keeps_the_epoch_end_save(
    tmp_path: Path,
) -> None:
    """30 s (0.5 minutes, not seconds) do not pass in 14 steps of the tiny model: no time-based save."""
    run_dir = tmp_path / "run"
    killed = attnlab_train(run_dir, DEFAULT, "callbacks.last_checkpoint.every_n_minutes=0.5", *kill_at(14))
    assert killed.returncode == -signal.SIGKILL
    assert saved_step(run_dir) == 10  # the end of the first epoch


def test_a_time_based_save_at_an_epochs_last_step_is_written_again_after_its_validation(
    resume_reference: Path, tmp_path: Path
) -> None:
    """With an interval shorter than a step, last.ckpt is written at every step, the epoch's last one
    (10) too, before the epoch's validation: it is written again after it, holding the validation's
    outcome (the best checkpoint), and resuming from it equals the uninterrupted run."""
    run_dir = tmp_path / "run"
    every_step = [DEFAULT, "callbacks.last_checkpoint.every_n_minutes=1e-9"]
    killed = attnlab_train(run_dir, *every_step, *kill_at(11))
    assert killed.returncode == -signal.SIGKILL
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 10
    best = [state["best_model_path"] for key, state in saved["callbacks"].items() if "val/loss" in key]
    assert len(best) == 1 and Path(best[0]).name.startswith("best-epoch000"), saved["callbacks"].keys()
    resume(run_dir, *every_step)
    assert_same_training(run_dir, resume_reference)


@pytest.mark.parametrize(
    ("saves", "before"),
    [(["callbacks.last_checkpoint.every_n_train_steps=5"], 5),
     ([DEFAULT, "callbacks.last_checkpoint.every_n_minutes=1e-9"], 9)],
    ids=["every-5-steps", "every-step-by-time"],
)  # fmt: skip
def test_a_run_killed_while_validating_the_step_of_a_due_save_resumes_from_the_save_before(
    saves: list[str], before: int, resume_reference: Path, tmp_path: Path
) -> None:
    """A save due at step 10, the epoch's last (every 5 steps, or by time at every step), waits for the
    epoch's validation (a run resumed from a save at step 10 would count the epoch as done and never
    validate it: its validation and epoch rows lost). Killed during that validation, the run resumes
    from the save before, trains up to step 10 again, validates and logs every row of the uninterrupted
    run."""
    run_dir = tmp_path / "run"
    killed = attnlab_train(run_dir, *saves, "+callbacks.kill._target_=probes.KillInValidation",
                           "+callbacks.kill.epoch=0")  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    assert saved_step(run_dir) == before
    resume(run_dir, *saves)
    assert saved_step(run_dir) == 20
    assert_same_training(run_dir, resume_reference)


@pytest.mark.parametrize("value", [0, -1])
def test_a_non_positive_last_ckpt_interval_is_refused(value: int, tmp_path: Path) -> None:
    overrides = [*IN_PROCESS, DEFAULT, f"callbacks.last_checkpoint.every_n_minutes={value}"]
    with pytest.raises(
        ConfigError, match=rf"^callbacks\.last_checkpoint\.every_n_minutes={value} must be a number > 0"
    ):
        train(compose_train(overrides, tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # refused with the config, before the run started


def test_a_checkpoint_saved_by_a_validation_inside_the_epoch_resumes_exactly(tmp_path: Path) -> None:
    """last.ckpt written at the end of a validation inside the epoch (after its 9th of 10 steps, with a
    DataLoader worker): the resumed epoch trains its 10th batch next, neither skipping nor repeating one
    (the sampler's own count of the batches handed out is not the count trained)."""
    validating = [DEFAULT, "+trainer.val_check_interval=9"]  # validation (and last.ckpt) at steps 9, 19
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    train(compose_train([*IN_PROCESS, *final(reference), *validating], reference))
    killed = attnlab_train(run_dir, *validating, *kill_at(12))
    assert killed.returncode == -signal.SIGKILL
    assert saved_step(run_dir) == 9  # the checkpoint of the validation inside the first epoch
    train(compose_train([*IN_PROCESS, *final(run_dir), *validating, "resume=true"], run_dir))
    assert saved_step(run_dir) == 19
    assert_same_training(run_dir, reference)


def test_a_save_owed_by_a_validation_inside_an_accumulation_resumes_exactly(tmp_path: Path) -> None:
    """3 batches a step (steps end after batches 3, 6, 9 and 10 of each epoch), validations after batches
    4 and 8, inside steps 2 and 3: each validation writes last.ckpt at the end of its step. Killed at the
    end of step 3 (before its save), the run resumes from step 2 mid-epoch and ends bitwise as an
    uninterrupted run."""
    inside = [DEFAULT, "trainer.accumulate_grad_batches=3", "+trainer.val_check_interval=4"]
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    train(compose_train([*IN_PROCESS, *final(reference), *inside], reference))
    killed = attnlab_train(run_dir, *inside, *kill_at(3))
    assert killed.returncode == -signal.SIGKILL
    assert saved_step(run_dir) == 2
    train(compose_train([*IN_PROCESS, *final(run_dir), *inside, "resume=true"], run_dir))
    assert saved_step(run_dir) == 7  # the second epoch's validations: steps 6 and 7 (of 4 an epoch)
    assert_same_training(run_dir, reference)


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 1-epoch `runs.RUN` run with the default checkpoints (do not change it: copy it)."""
    run_dir = tmp_path_factory.mktemp("one_epoch") / "run"
    overrides = [*IN_PROCESS, *final(run_dir), *record(run_dir), DEFAULT, "trainer.max_epochs=1"]
    train(compose_train(overrides, run_dir))
    assert saved_step(run_dir) == 10
    return run_dir


def test_a_finished_run_given_another_epoch_equals_a_longer_run(
    one_epoch: Path, resume_reference: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    resume(run_dir, DEFAULT, "trainer.max_epochs=2")
    assert saved_step(run_dir) == 20
    assert_second_epoch_in_its_own_order(run_dir)
    assert_same_training(run_dir, resume_reference)


def test_resuming_without_the_runs_config_yaml_warns_that_only_the_checkpoints_settings_are_compared(
    one_epoch: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run whose config.yaml was moved away continued with a changed trainer.* or seed without a word:
    only the checkpoint's model, optim and data settings could be compared."""
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    (run_dir / "config.yaml").unlink()
    with caplog.at_level(logging.WARNING, logger="attnlab.training.resume"):
        resume(run_dir, DEFAULT, "trainer.max_epochs=2")
    assert saved_step(run_dir) == 20
    warned = [r.getMessage() for r in caplog.records if r.name == "attnlab.training.resume"]
    assert warned == [
        f"resuming {run_dir} without its config.yaml: only the model, optim and data settings its checkpoint "
        "records are compared with this command's; a changed trainer.*, seed or other value goes unnoticed. "
        "Put the file back to have every value compared"
    ]


def test_a_finished_run_continued_without_more_epochs_keeps_its_final_metrics(
    one_epoch: Path, tmp_path: Path
) -> None:
    """A finished run continued with nothing left to train (`resume=auto` on a re-run sweep without
    skip_done) trains and validates nothing: Lightning has no `train/*` or `val/*` metric, and its
    results.json lost them (what attnlab-compare and a sweeper's `optimized_metric=val/loss` read). They
    are kept from the run's earlier results; the test metrics are scored again, the same."""
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    before = json.loads((run_dir / "results.json").read_text())["metrics"]
    assert {"val/loss", "val/ppl", "train/loss_epoch"} <= set(before)
    resume(run_dir, DEFAULT, "trainer.max_epochs=1")
    assert saved_step(run_dir) == 10  # nothing trained
    after = json.loads((run_dir / "results.json").read_text())["metrics"]
    assert after == pytest.approx(before)


def _fit_once(module: TranslationModule, run_dir: Path) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One epoch of `trainer.fit` without ckpt_path (a new run) on the synthetic task: its epoch values
    and final weights."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from attnlab.data.synthetic import SyntheticData

    datamodule = SyntheticData(
        n_train=160, n_val=16, n_test=16, batch_size=16, num_workers=0, seed=7
    ).datamodule()
    L.seed_everything(1, verbose=False)
    quiet = {"enable_progress_bar": False, "enable_model_summary": False, "enable_checkpointing": False}
    trainer = L.Trainer(max_epochs=1, logger=CSVLogger(run_dir), limit_val_batches=0, **quiet)
    trainer.fit(module, datamodule=datamodule)
    # (tokens/s is a time; `tokens_seen` counts from 0 in a new run, as after init_from: it counted on from
    # the checkpoint's)
    kept = [k for k in trainer.callback_metrics if k.endswith("_epoch") and k != "train/tokens_per_sec_epoch"]
    values = {k: float(trainer.callback_metrics[k]) for k in kept}
    return values, {k: v.clone() for k, v in module.state_dict().items()}


def test_a_module_loaded_from_a_checkpoint_starts_a_new_run_when_fitted(
    one_epoch: Path, tmp_path: Path
) -> None:
    """`TranslationModule.load_from_checkpoint`, then `trainer.fit` without ckpt_path: a new run, which takes
    neither the saved run's random streams, epoch sums nor token count (only a fit from ckpt_path continues
    that run): it trains and logs as the same weights loaded with `load_state_dict`."""
    loaded = TranslationModule.load_from_checkpoint(one_epoch / "checkpoints" / "last.ckpt")
    fresh = TranslationModule(model=loaded.model_config, optim=loaded.optim_config)
    fresh.load_state_dict(loaded.state_dict())
    (values, weights), (fresh_values, fresh_weights) = (_fit_once(m, tmp_path / n) for m, n in
                                                        ((loaded, "loaded"), (fresh, "fresh")))  # fmt: skip
    assert values == fresh_values and {"train/lr_epoch", "train/tokens_seen_epoch"} <= set(values)
    assert all(torch.equal(weights[k], fresh_weights[k]) for k in weights)


def test_a_finished_run_given_more_steps_trains_them_exactly(
    one_epoch: Path, resume_reference: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    resume(run_dir, DEFAULT, "trainer.max_epochs=3", "+trainer.max_steps=20")
    assert saved_step(run_dir) == 20
    assert_second_epoch_in_its_own_order(run_dir)
    ours, theirs = weights(run_dir), weights(resume_reference)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    # the same losses in the same order; Lightning numbers the logged steps after a max_steps
    # resumption from an epoch's end one higher (it replays that epoch's end)
    assert list(step_losses(run_dir).values()) == list(step_losses(resume_reference).values())


def test_an_epoch_replayed_after_a_crash_between_its_best_and_last_saves_keeps_one_best_checkpoint(
    one_epoch: Path, resume_reference: Path, tmp_path: Path
) -> None:
    """A run directory copied elsewhere and resumed replaces its old best checkpoint with the next one
    (the checkpoint callback's state named the old directory and was dropped: both stayed). A run that
    died after its second epoch's best checkpoint was written but before that epoch's last.ckpt: resumed
    from the first epoch's last.ckpt, it replays the epoch and saves the same best checkpoint again. It
    replaces the file; Lightning's default added `-v1` beside it. A run directory with two best
    checkpoints cannot be evaluated."""
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    first_last = (run_dir / "checkpoints" / "last.ckpt").read_bytes()
    resume(run_dir, DEFAULT, "trainer.max_epochs=2")
    best = sorted(p.name for p in (run_dir / "checkpoints").glob("best-*.ckpt"))
    assert best == ["best-epoch001-step20.ckpt"]  # (the synthetic task's val loss falls in epoch 2)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(first_last)  # the second epoch's never came
    resume(run_dir, DEFAULT, "trainer.max_epochs=2")
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("best-*.ckpt")) == best
    assert resolve_checkpoints(run_dir) == [run_dir / "checkpoints" / best[0]]
    assert_same_training(run_dir, resume_reference)


def test_a_resumed_run_keeps_as_many_averaging_checkpoints_as_asked(tmp_path: Path) -> None:
    """`average_last=1` keeps one epoch's weights (`checkpoints/epochs/`). last.ckpt was written before
    the epoch's averaging checkpoint, so its record of them lacked that file, which a resumed run then
    never replaced: every resumption left one more. Here the run directory is also moved in between."""
    first, moved = tmp_path / "first", tmp_path / "moved"
    averaging = [*IN_PROCESS, DEFAULT, "average_last=1"]
    train(compose_train([*averaging, *final(first), "trainer.max_epochs=1"], first))
    shutil.move(first, moved)
    train(compose_train([*averaging, *final(moved), "trainer.max_epochs=2", "resume=true"], moved))
    assert [p.name for p in (moved / "checkpoints" / "epochs").iterdir()] == ["epoch001.ckpt"]
    assert len(list((moved / "checkpoints").glob("best-*.ckpt"))) == 1


def test_callback_states_follow_a_moved_run_directory_into_checkpoints_and_its_subdirectories(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The best-checkpoint state and the averaging one (`checkpoints/epochs/`) of a run directory moved
    since name files of the old place: each follows to the file of its name in the new place. A state
    naming a file the new place lacks, or one outside its own `dirpath`, is dropped with a warning."""
    old, new = tmp_path / "old" / "checkpoints", tmp_path / "new" / "checkpoints"
    for name in ("best-epoch001-step20.ckpt", "epochs/epoch000.ckpt", "epochs/epoch001.ckpt"):
        (new / name).parent.mkdir(parents=True, exist_ok=True)
        (new / name).write_bytes(b"")
    best = {"dirpath": str(old), "best_model_path": f"{old}/best-epoch001-step20.ckpt",
            "best_k_models": {f"{old}/best-epoch001-step20.ckpt": 1.0}, "kth_best_model_path": "",
            "last_model_path": ""}  # fmt: skip
    epochs = {"dirpath": f"{old}/epochs", "best_model_path": f"{old}/epochs/epoch001.ckpt",
              "best_k_models": {f"{old}/epochs/epoch000.ckpt": 0, f"{old}/epochs/epoch001.ckpt": 1},
              "kth_best_model_path": f"{old}/epochs/epoch000.ckpt", "last_model_path": ""}  # fmt: skip
    lacking = {**best, "best_model_path": f"{old}/best-epoch002-step30.ckpt"}
    foreign = {**best, "best_model_path": str(tmp_path / "other" / "best-epoch001-step20.ckpt")}
    checkpoint = {"callbacks": {"best": best, "epochs": epochs, "lacking": lacking, "foreign": foreign}}
    with caplog.at_level("WARNING", logger="attnlab.training.checkpoint_io"):
        trusted_callback_states(checkpoint, new / "last.ckpt", own_run=True)
    assert sorted(checkpoint["callbacks"]) == ["best", "epochs"]
    assert best["dirpath"] == str(new) and best["best_model_path"] == str(new / "best-epoch001-step20.ckpt")
    assert list(best["best_k_models"]) == [str(new / "best-epoch001-step20.ckpt")]
    assert epochs["dirpath"] == str(new / "epochs") and epochs["kth_best_model_path"] == str(
        new / "epochs" / "epoch000.ckpt"
    )
    assert list(epochs["best_k_models"]) == [str(new / "epochs" / f"epoch00{k}.ckpt") for k in (0, 1)]
    assert caplog.text.count("the callback starts afresh") == 2


def test_a_moved_state_naming_a_file_out_of_the_run_through_a_symlink_is_dropped(tmp_path: Path) -> None:
    """A hostile last.ckpt of a "moved" run names files of an old `dirpath` whose names, in the run's
    checkpoints/, are symbolic links out of it (a link to a directory, `evil/`, or to a file): following
    the move would let Lightning delete `evil/precious.txt` (a previous last.ckpt it replaces) or score
    another run's checkpoint as the best. Such a state is dropped, as one naming the file directly is."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("not the run's")
    (victim / "other.ckpt").write_bytes(b"")
    old, new = tmp_path / "old" / "checkpoints", tmp_path / "new" / "checkpoints"
    new.mkdir(parents=True)
    (new / "evil").symlink_to(victim, target_is_directory=True)
    (new / "best-epoch001-step20.ckpt").symlink_to(victim / "other.ckpt")
    last = {"dirpath": f"{old}/evil", "best_model_path": f"{old}/evil/precious.txt", "best_k_models": {},
            "kth_best_model_path": "", "last_model_path": ""}  # fmt: skip
    best = {"dirpath": str(old), "best_model_path": f"{old}/best-epoch001-step20.ckpt",
            "best_k_models": {f"{old}/best-epoch001-step20.ckpt": -1e9}, "kth_best_model_path": "",
            "last_model_path": ""}  # fmt: skip
    checkpoint = {"callbacks": {"last": last, "best": best}}
    trusted_callback_states(checkpoint, new / "last.ckpt", own_run=True)
    assert checkpoint["callbacks"] == {}


def test_a_moved_state_follows_although_a_file_it_replaced_since_is_gone(tmp_path: Path) -> None:
    """A last.ckpt written before the averaging callback's next save (mid-epoch, every_n_train_steps, or a
    crash) names a file that save then deleted: the state still follows the move, or the files it names
    that are there (step 6) are never deleted, and the run keeps more than `average_last`."""
    old, new = tmp_path / "old" / "checkpoints", tmp_path / "new" / "checkpoints"
    (new / "steps").mkdir(parents=True)
    for step in (6, 9):  # step 3 was replaced by step 9 after last.ckpt (step 8) was written
        (new / "steps" / f"step{step:08d}.ckpt").write_bytes(b"")
    steps = {"dirpath": f"{old}/steps", "best_model_path": f"{old}/steps/step00000006.ckpt",
             "best_k_models": {f"{old}/steps/step00000003.ckpt": 3, f"{old}/steps/step00000006.ckpt": 6},
             "kth_best_model_path": f"{old}/steps/step00000003.ckpt", "last_model_path": ""}  # fmt: skip
    checkpoint = {"callbacks": {"steps": steps}}
    trusted_callback_states(checkpoint, new / "last.ckpt", own_run=True)
    assert list(checkpoint["callbacks"]) == ["steps"]
    assert steps["dirpath"] == str(new / "steps")
    assert list(steps["best_k_models"]) == [str(new / "steps" / f"step0000000{k}.ckpt") for k in (3, 6)]


def test_a_state_whose_top_k_files_name_one_outside_the_run_is_dropped(tmp_path: Path) -> None:
    """Lightning deletes a top-k file that a better checkpoint replaces: a state whose best file is the
    run's but whose `best_k_models` names a file elsewhere is dropped, as one naming it as the best is."""
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    best = checkpoints / "best-epoch001-step20.ckpt"
    best.write_bytes(b"")
    precious = tmp_path / "precious.ckpt"
    precious.write_bytes(b"")
    state = {"dirpath": str(checkpoints), "best_model_path": str(best),
             "best_k_models": {str(best): 1.0, str(precious): 2.0}, "kth_best_model_path": "",
             "last_model_path": ""}  # fmt: skip
    checkpoint = {"callbacks": {"best": state}}
    trusted_callback_states(checkpoint, checkpoints / "last.ckpt", own_run=True)
    assert checkpoint["callbacks"] == {}


def test_a_last_ckpt_written_every_n_steps_holds_the_tokens_of_its_steps(tmp_path: Path) -> None:
    """last.ckpt of `every_n_train_steps` is written in the callbacks' `on_train_batch_end`, which
    Lightning runs before the module's: it held the tokens of one step fewer than it counts as done,
    and every resumption from it lost that step's tokens from `train/tokens_seen`."""
    from attnlab.runs.checkpoint import RESUME_KEY
    from runs import logged_rows

    run_dir = tmp_path / "run"
    train(compose_train([*IN_PROCESS, "trainer.max_epochs=1"], run_dir))  # last.ckpt at step 8
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    seen = [value for _, value in logged_rows(run_dir, "train/tokens_seen_step")]  # after steps 1, 2, ...
    assert checkpoint["global_step"] == 8
    assert checkpoint[RESUME_KEY]["tokens_seen"] == seen[7]


def test_without_a_best_checkpoint_the_final_evaluation_tests_the_final_weights(tmp_path: Path) -> None:
    """`callbacks.model_checkpoint=null`: no checkpoint callback monitors the metric, and the final
    evaluation tests the weights training ended with, not another callback's file (last.ckpt of step 8
    of 10 here; which one depended on the callbacks' order)."""
    run_dir = tmp_path / "run"
    overrides = [*IN_PROCESS, "~callbacks.model_checkpoint", "~callbacks.averaging_checkpoints",
                 "trainer.max_epochs=1", "test=true"]  # fmt: skip
    metrics = train(compose_train([*overrides, "callbacks.last_checkpoint.every_n_train_steps=4"], run_dir))
    assert saved_step(run_dir) == 8
    assert json.loads((run_dir / "results.json").read_text())["checkpoints"] == []
    assert "test/loss" in metrics


def test_an_epoch_cut_by_limit_train_batches_continues_with_the_next_epoch(tmp_path: Path) -> None:
    """An epoch ends before the sampler's last batch: with a DataLoader worker, the batches drawn ahead
    at the resumption must already be the next epoch's."""
    limited = [*IN_PROCESS, DEFAULT, "+trainer.limit_train_batches=5"]
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    train(compose_train([*limited, *final(reference)], reference))
    train(compose_train([*limited, *final(run_dir), "trainer.max_epochs=1"], run_dir))
    assert saved_step(run_dir) == 5
    train(compose_train([*limited, *final(run_dir), "resume=true"], run_dir))
    assert saved_step(run_dir) == 10
    assert_same_training(run_dir, reference)


def test_continuing_with_another_batch_size_is_refused(one_epoch: Path, tmp_path: Path) -> None:
    ckpt = one_epoch / "checkpoints" / "last.ckpt"
    before = ckpt.read_bytes()
    cfg = compose_train([*IN_PROCESS, "data.batch_size=8", f"ckpt_path={ckpt}"], tmp_path / "other")
    with pytest.raises(ConfigError) as refused:
        train(cfg)
    message = str(refused.value)
    assert f"cannot continue from {ckpt} exactly" in message
    assert "batch_size: 16 saved, 8 now" in message
    assert "data.batch_size" in message and "or start a new run" in message  # the fix
    assert ckpt.read_bytes() == before
    assert not (tmp_path / "other" / "checkpoints" / "last.ckpt").exists()  # nothing was trained


# ---------------------------------------------------------------------------------------------------------
# Token batches of a text corpus (a few hundred Multi30k lines)

SPLITS = (("train", "train", 300), ("valid", "val", 30), ("test", "test2016", 30))


def text_run(corpus: Path, cache: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        "data=files", f"data.dir={corpus}", "data.src_lang=de", "data.tgt_lang=en", "data.vocab_size=300",
        f"data.cache_dir={cache}", "data.max_tokens=500", "data.batch_size=null", "data.num_workers=0",
        "model=tiny", "model.dropout=0.1", "trainer.max_epochs=2", "logger=csv", "test=false",
        "decode.every_n_epochs=0", "trainer.log_every_n_steps=1", "seed=7", *final(run_dir), *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def text(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The corpus, an uninterrupted 2-epoch run on it and a finished 1-epoch run (copy it to change it)."""
    tmp = tmp_path_factory.mktemp("resume_text")
    corpus, cache = tmp / "corpus", tmp / "cache"
    write_corpus(require_shared_data(shared_data), corpus, SPLITS)
    reference, short = tmp / "reference", tmp / "one_epoch"
    train(compose_train(text_run(corpus, cache, reference), reference))
    train(compose_train(text_run(corpus, cache, short, "trainer.max_epochs=1"), short))
    return {"corpus": corpus, "cache": cache, "reference": reference, "one_epoch": short}


def test_token_batches_a_finished_run_given_another_epoch_equals_a_longer_run(
    text: dict[str, Path], tmp_path: Path
) -> None:
    steps = saved_step(text["one_epoch"])
    assert steps > 1 and saved_step(text["reference"]) == 2 * steps
    run_dir = tmp_path / "run"
    shutil.copytree(text["one_epoch"], run_dir)
    train(compose_train([*text_run(text["corpus"], text["cache"], run_dir), "resume=true"], run_dir))
    assert saved_step(run_dir) == 2 * steps
    assert_same_training(run_dir, text["reference"])


def test_token_batches_continuing_with_another_max_tokens_is_refused(
    text: dict[str, Path], tmp_path: Path
) -> None:
    ckpt = text["one_epoch"] / "checkpoints" / "last.ckpt"
    run_dir = tmp_path / "other"
    cfg = compose_train(
        [*text_run(text["corpus"], text["cache"], run_dir, "data.max_tokens=800"), f"ckpt_path={ckpt}"],
        run_dir,
    )
    with pytest.raises(ConfigError, match=r"max_tokens: 500 saved, 800 now"):
        train(cfg)
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()


def test_resuming_after_the_training_data_changed_is_refused(
    text: dict[str, Path], shared_data: Path, tmp_path: Path
) -> None:
    corpus, run_dir = tmp_path / "corpus", tmp_path / "run"
    write_corpus(require_shared_data(shared_data), corpus, SPLITS)
    overrides = text_run(corpus, text["cache"], run_dir, "trainer.max_epochs=1")
    train(compose_train(overrides, run_dir))
    for lang in ("de", "en"):  # one training pair fewer; the config stays the same
        path = corpus / f"train.{lang}"
        path.write_text("".join(path.read_text("utf-8").splitlines(keepends=True)[:-1]), "utf-8")
    ckpt, manifest = run_dir / "checkpoints" / "last.ckpt", run_dir / "manifest.json"
    before, manifest_before = ckpt.read_bytes(), manifest.read_bytes()
    records = {path: path.read_bytes() for path in (run_dir / "config.yaml", run_dir / "csv" / "metrics.csv")}
    with pytest.raises(ConfigError) as refused:
        train(compose_train([*overrides, "trainer.max_epochs=2", "resume=true"], run_dir))
    assert manifest.read_bytes() == manifest_before  # still `finished`: the refused resume trained nothing
    for path, content in records.items():  # its config (max_epochs=1) and history, as they were
        assert path.read_bytes() == content, f"{path} was rewritten by the refused resume"
    message = str(refused.value)
    counts = re.search(r"training examples: (\d+) saved, (\d+) now; hash of the example lengths", message)
    assert counts is not None, message
    assert int(counts[1]) == int(counts[2]) + 1
    assert "the same files and preprocessing" in message
    assert ckpt.read_bytes() == before  # the run's state is kept for a resume with the original data


def test_resuming_after_the_validation_set_was_emptied_is_refused_and_changes_nothing(
    text: dict[str, Path], shared_data: Path, tmp_path: Path
) -> None:
    """A continuation refused by a data check (here an empty validation set, a DataError) trained
    nothing: the run's manifest, config and history stay as they were."""
    from attnlab.data.download import DataError

    corpus, run_dir = tmp_path / "corpus", tmp_path / "run"
    write_corpus(require_shared_data(shared_data), corpus, SPLITS)
    overrides = text_run(corpus, text["cache"], run_dir, "trainer.max_epochs=1")
    train(compose_train(overrides, run_dir))
    for lang in ("de", "en"):
        (corpus / f"valid.{lang}").write_text("", "utf-8")
    files = [run_dir / "manifest.json", run_dir / "config.yaml", run_dir / "csv" / "metrics.csv"]
    records = {path: path.read_bytes() for path in files}
    with pytest.raises(DataError, match="valid"):
        train(compose_train([*overrides, "trainer.max_epochs=2", "resume=true"], run_dir))
    for path, content in records.items():
        assert path.read_bytes() == content, f"{path} was rewritten by the refused resume"
