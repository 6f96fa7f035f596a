"""Exact resumption and preemption, for real: runs killed by SIGKILL, stopped by SIGTERM, or requeued on
SIGUSR1 under (a stand-in) SLURM, then resumed in their own directory, end with the same weights,
bitwise, as an uninterrupted run with the same seed and checkpoint schedule.

The runs have dropout, a shuffled training order and a DataLoader worker; checkpoints are written every
4 steps and the interruptions come at steps that are not checkpoint steps, in the middle of an epoch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import SLURM_ENV, subprocess_path
from runs import (
    EPOCH_VALUES,
    RUN,
    assert_same_training,
    attnlab_train,
    final,
    logged_rows,
    running,
    srun_ranks,
    train_here,
)


def test_a_run_killed_with_sigkill_resumes_to_the_same_weights(
    resume_reference: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    killed = attnlab_train(run_dir, "+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=6",
                           f"+callbacks.kill.signum={int(signal.SIGKILL)}")  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "running"  # it never knew
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    record = {p: p.read_bytes() for p in (run_dir / ".hydra").iterdir()}  # Hydra's record of the command
    assert b"callbacks.kill.step=6" in record[run_dir / ".hydra" / "overrides.yaml"]
    resumed = attnlab_train(run_dir, "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_training(run_dir, resume_reference)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished" and len(manifest["resumed"]) == 1
    assert manifest["resumed"][0]["checkpoint"] == str(run_dir / "checkpoints" / "last.ckpt")
    assert "resume=true" in manifest["resumed"][0]["command"]  # the resumption's command is here ...
    assert {p: p.read_bytes() for p in (run_dir / ".hydra").iterdir()} == record  # ... the first one there
    # a refused resumption (a damaged last.ckpt) changes no file of the run, .hydra/ included
    last = run_dir / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    refused = attnlab_train(run_dir, "resume=true", "trainer.max_epochs=3")
    assert refused.returncode == 1 and "cannot read checkpoint" in refused.stderr, refused.stderr[-3000:]
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == files


def test_a_run_stopped_by_sigterm_saves_and_resumes_to_the_same_weights(
    resume_reference: Path, tmp_path: Path
) -> None:
    run_dir, wandb = tmp_path / "run", {"WANDB_MODE": "offline"}  # and W&B for real: the same run goes on
    kill = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=6",
            f"+callbacks.kill.signum={int(signal.SIGTERM)}"]  # fmt: skip
    stopped = attnlab_train(run_dir, *kill, "logger=wandb", env=wandb)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    # the signal came after this step's check: saved at the end of the next step, 7 (not a checkpoint step)
    assert manifest["status"] == "interrupted" and "SIGTERM at step 7" in manifest["error"]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 7
    # no "`weights_only` was not set, defaulting to `False`" from Lightning: the save asks for all the state
    assert "weights_only" not in (run_dir / "train.log").read_text() + stopped.stdout + stopped.stderr
    record = {p: p.read_bytes() for p in (run_dir / ".hydra").iterdir()}
    resumed = attnlab_train(run_dir, "ckpt_path=last", "logger=wandb", env=wandb)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert {p: p.read_bytes() for p in (run_dir / ".hydra").iterdir()} == record  # ckpt_path=last resumes too
    assert_same_training(run_dir, resume_reference)
    from wandb_records import read_wandb_run

    records = [read_wandb_run(p) for p in sorted(run_dir.rglob("run-*.wandb"))]  # by start time
    assert len(records) == 2 and records[0].run["id"] == records[1].run["id"] == manifest["wandb_run_id"]
    assert records[0].run == records[1].run  # one W&B run: the same id, project, group and name
    assert [r.exit_code for r in records] == [1, 0]  # the interrupted part, then the finished one
    # What `wandb sync` uploads (README, Tracking with W&B): together the two parts hold every row of the
    # uninterrupted run's history once, the second continuing the trainer's step where the first stopped
    for metric in ("train/loss_step", "val/loss", "params/total", *EPOCH_VALUES):
        parts = [[(row["trainer/global_step"], row[metric]) for row in r.history if metric in row]
                 for r in records]  # fmt: skip
        joined, reference = parts[0] + parts[1], logged_rows(resume_reference, metric)
        assert [step for step, _ in joined] == [step for step, _ in reference], metric
        # (pytest >= 9.2's approx takes no nested sequences: the values are compared apart from the steps)
        assert [value for _, value in joined] == pytest.approx([value for _, value in reference]), metric
        if metric == "train/loss_step":  # logged every step (validation: only after the resumption)
            assert parts[0] and parts[1] and max(parts[0])[0] < min(parts[1])[0]
    # W&B's own row counter cannot continue offline: the second part's `_step` starts at 0 again
    assert [row["_step"] for row in records[1].history][:2] == [0, 1]
    best = min(value for _, value in logged_rows(resume_reference, "val/loss"))
    assert records[1].summary["val/loss"] == {"min": pytest.approx(best)}  # the end of the run


def test_ctrl_c_saves_at_the_end_of_the_step_and_resumes_to_the_same_weights(
    resume_reference: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"  # SIGINT to the run's process group, its DataLoader worker too: a terminal's
    kill = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=6",
            "+callbacks.kill.group=true", f"+callbacks.kill.signum={int(signal.SIGINT)}"]  # fmt: skip
    stopped = attnlab_train(run_dir, *kill)
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr[-3000:]
    assert "Ctrl-C: saving last.ckpt at the end of this training step" in stopped.stderr
    assert "RuntimeWarning" not in stopped.stderr  # (runpy's, in each DataLoader worker of `python -m`)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and "SIGINT at step 7" in manifest["error"]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 7
    train_here(run_dir, "resume=true")
    assert_same_training(run_dir, resume_reference)


def test_a_signal_after_the_last_step_saves_and_stops_before_the_final_evaluation(
    resume_reference: Path, tmp_path: Path
) -> None:
    """No training step ends after a signal in the last step's validation: training ends, and the run
    saved nothing and went on to its final evaluation (under SLURM, killed in the middle of it)."""
    run_dir = tmp_path / "run"
    kill = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=20",  # the last step
            f"+callbacks.kill.signum={int(signal.SIGTERM)}"]  # fmt: skip
    stopped = attnlab_train(run_dir, *kill)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and "SIGTERM at step 20" in manifest["error"], manifest
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 20
    train_here(run_dir, "resume=true")
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "finished"
    assert_same_training(run_dir, resume_reference)


def test_a_second_ctrl_c_stops_at_once_and_the_run_reads_interrupted(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    kill = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=6", "+callbacks.kill.times=2",
            f"+callbacks.kill.signum={int(signal.SIGINT)}"]  # fmt: skip
    stopped = attnlab_train(run_dir, *kill)
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr[-3000:]  # not Lightning's exit 1
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", manifest
    assert manifest["error"].startswith("KeyboardInterrupt: stopped by Ctrl-C without saving"), manifest
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4


def test_a_signal_inside_a_gradient_accumulation_saves_after_its_optimizer_step(tmp_path: Path) -> None:
    """With 2 batches a step, the signal sent at the end of step 2 is seen at the end of the next batch,
    inside step 3's accumulation, whose first batch's gradients no checkpoint holds: the save waits for
    the end of step 3, and the resumed run ends as the uninterrupted one, bitwise."""
    accumulate = ["trainer.accumulate_grad_batches=2"]  # 5 steps an epoch: checkpoints at steps 4 and 8
    reference = tmp_path / "reference"
    train_here(reference, *accumulate)
    run_dir = tmp_path / "run"
    kill = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=2",
            f"+callbacks.kill.signum={int(signal.SIGTERM)}"]  # fmt: skip
    stopped = attnlab_train(run_dir, *accumulate, *kill)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "SIGTERM at step 3" in json.loads((run_dir / "manifest.json").read_text())["error"]
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 3
    assert saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["processed"] == 6  # 3 steps × 2
    train_here(run_dir, *accumulate, "resume=true")
    assert_same_training(run_dir, reference)


@pytest.fixture
def slurm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """SLURM's variables for a one-task job (`helpers.SLURM_ENV`) with a stand-in `scontrol` first on PATH,
    which appends each call's arguments to the file returned with them."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol_calls.txt"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    return {**SLURM_ENV, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls


def test_sigusr1_under_slurm_saves_requeues_and_resumes(
    resume_reference: Path, tmp_path: Path, slurm: tuple[dict[str, str], Path]
) -> None:
    """Lightning's SLURM auto-requeue path, with a stand-in `scontrol` on PATH that records its call."""
    env, calls = slurm
    run_dir = tmp_path / "run"
    stopped = attnlab_train(run_dir, "+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=5",
                            f"+callbacks.kill.signum={int(signal.SIGUSR1)}", env=env)  # fmt: skip
    assert stopped.returncode == 128 + signal.SIGUSR1, stopped.stderr[-3000:]
    assert calls.read_text().split() == ["requeue", "4242"]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    assert (run_dir / "hpc_ckpt_1.ckpt").is_file()  # Lightning's own, saved by its requeue handler
    train_here(run_dir, "resume=auto")  # what the requeued job runs
    assert_same_training(run_dir, resume_reference)


def test_two_runs_with_one_seed_have_identical_histories(resume_reference: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "again"
    train_here(run_dir)
    assert_same_training(run_dir, resume_reference)


def test_resume_errors_name_the_fix(tmp_path: Path, resume_reference: Path) -> None:
    from attnlab.training.pipeline import train
    from attnlab.typed import ConfigError
    from helpers import compose_train

    with pytest.raises(
        ConfigError, match=r"resume=true but .*last\.ckpt does not exist: run with hydra\.run\.dir"
    ):
        train(compose_train([*RUN, "resume=true"], tmp_path / "empty"))
    with pytest.raises(ConfigError, match=r"resume='yes': use true, false or auto"):
        train(compose_train([*RUN, "resume=yes"], tmp_path / "empty"))
    before = (resume_reference / "config.yaml").read_bytes()
    with pytest.raises(ConfigError, match=r"different experiment \(model.d_model: 32 -> 64"):
        train(compose_train([*RUN, "resume=true", "model.d_model=64"], resume_reference))
    assert (resume_reference / "config.yaml").read_bytes() == before  # nothing of the run was touched


@pytest.fixture(scope="module")
def ddp_resumption(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two-process runs (`trainer=ddp_cpu`, gloo) of `runs.RUN`: an uninterrupted one, and one whose rank 0
    is SIGKILLed at step 6 (each rank recording its process id; rank 1 must then end by itself), then
    continued with `resume=auto`."""
    ddp, env = ("trainer=ddp_cpu", "data.n_val=32"), {"OMP_NUM_THREADS": "1"}  # a validation batch per rank
    reference = tmp_path_factory.mktemp("ddp_reference") / "run"
    sums = ["+callbacks.sums._target_=probes.RecordLossSums", f"+callbacks.sums.dirpath={reference}"]
    done = attnlab_train(reference, *ddp, *sums, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in done.stderr + done.stdout  # two processes really ran
    run_dir = tmp_path_factory.mktemp("ddp_killed") / "run"
    kill = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=6", "+callbacks.kill.rank=0",
            f"+callbacks.kill.signum={int(signal.SIGKILL)}", "+callbacks.pid._target_=probes.RecordPid",
            f"+callbacks.pid.dirpath={run_dir}"]  # fmt: skip
    killed = attnlab_train(run_dir, *ddp, *kill, env=env)
    pids = [int((run_dir / f"pid_rank{rank}").read_text()) for rank in (0, 1)]
    deadline = time.monotonic() + 60
    while (alive := [pid for pid in pids if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    resumed = attnlab_train(run_dir, *ddp, "resume=auto", env=env)
    return {"reference": reference, "run": run_dir, "killed": killed, "pids": pids, "running": alive,
            "killed_manifest": manifest, "saved_step": saved, "resumed": resumed}  # fmt: skip


@pytest.mark.ddp
def test_a_ddp_run_killed_with_sigkill_leaves_no_rank_running_and_resumes(
    ddp_resumption: dict[str, Any],
) -> None:
    killed, run_dir = ddp_resumption["killed"], ddp_resumption["run"]
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert len(set(ddp_resumption["pids"])) == 2  # rank 1 ran in a process of its own (rank 0's child)
    assert ddp_resumption["running"] == []  # and did not outlive rank 0
    assert ddp_resumption["killed_manifest"]["status"] == "running"  # it never knew
    assert ddp_resumption["saved_step"] == 4  # resumed from the middle of the first epoch (5 steps)
    resumed = ddp_resumption["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in resumed.stderr + resumed.stdout
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished" and len(manifest.get("resumed", [])) == 1
    assert manifest["resumed"][0]["checkpoint"] == str(run_dir / "checkpoints" / "last.ckpt")


@pytest.mark.ddp
def test_a_ddp_run_resumed_after_sigkill_ends_with_the_weights_of_an_uninterrupted_run(
    ddp_resumption: dict[str, Any],
) -> None:
    run_dir, reference = ddp_resumption["run"], ddp_resumption["reference"]
    assert ddp_resumption["resumed"].returncode == 0
    assert len(json.loads((run_dir / "manifest.json").read_text()).get("resumed", [])) == 1  # it continued
    assert_same_training(run_dir, reference)  # rank 0's weights, the logged losses and validations
    ours, theirs = (torch.load(d / "final_weights_rank1.pt", weights_only=True) for d in (run_dir, reference))
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []  # and rank 1's weights


@pytest.mark.ddp
def test_a_ddp_runs_epoch_loss_is_over_every_ranks_tokens(ddp_resumption: dict[str, Any]) -> None:
    """`train/loss_epoch` under DDP: the label-smoothed loss summed over the epoch's target tokens on
    both ranks, divided by their number (`probes.RecordLossSums` records each rank's batches), not rank 0's
    own mean."""
    reference = ddp_resumption["reference"]
    ranks = [json.loads(p.read_text()) for p in sorted(reference.glob("loss_sums_rank*.json"))]
    assert len(ranks) == 2
    logged = logged_rows(reference, "train/loss_epoch")
    assert len(logged) == 2
    for epoch, (_, value) in enumerate(logged):
        every = [(loss, tokens) for rows in ranks for e, loss, tokens in rows if e == epoch]
        own = [(loss, tokens) for e, loss, tokens in ranks[0] if e == epoch]
        assert value == pytest.approx(sum(s for s, _ in every) / sum(t for _, t in every), rel=1e-6)
        assert value != pytest.approx(sum(s for s, _ in own) / sum(t for _, t in own), rel=1e-6)


DDP_SIGNAL_RUN = ("trainer=ddp_cpu", "data.n_val=32")  # a validation batch per rank


def signal_at(
    signum: int, rank: int | None, group: bool = False, stage: str = "train", step: int = 3
) -> list[str]:
    """The overrides of a run that rank `rank` (None: every rank) sends `signum` at the end of step `step`
    (with `group`, to the whole process group, as a terminal's Ctrl-C reaches every rank; `stage`: another
    point, `probes.SignalAt`'s)."""
    ranked = [] if rank is None else [f"+callbacks.kill.rank={rank}"]
    return ["+callbacks.kill._target_=probes.SignalAt", f"+callbacks.kill.step={step}", *ranked,
            f"+callbacks.kill.signum={signum}", f"+callbacks.kill.group={str(group).lower()}",
            f"+callbacks.kill.stage={stage}"]  # fmt: skip


def ddp_signalled(
    run_dir: Path,
    signum: int,
    rank: int,
    *extra: str,
    group: bool = False,
    stage: str = "train",
    step: int = 3,
) -> subprocess.CompletedProcess:
    """A two-process run of `runs.RUN` (and the overrides `extra`) that rank `rank` sends `signum` at the
    end of step 3 (`signal_at`'s `group`, `stage` and `step`: another way or point). Stopped after 3 minutes
    (a run takes under one): a run that hangs fails."""
    kill = signal_at(signum, rank, group, stage, step)
    return attnlab_train(run_dir, *DDP_SIGNAL_RUN, *kill, *extra, env={"OMP_NUM_THREADS": "1"}, timeout=180)


@pytest.mark.ddp
def test_a_ddp_runs_ctrl_c_is_told_once_and_every_rank_saves_and_stops(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    stopped = ddp_signalled(run_dir, int(signal.SIGINT), rank=0, group=True)  # both ranks get it
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr[-3000:]
    assert stopped.stderr.count("Ctrl-C: saving last.ckpt at the end of this training step") == 1
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and "SIGINT at step 4" in manifest["error"], manifest
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4


@pytest.mark.ddp
def test_a_signal_that_reached_one_rank_alone_is_the_one_the_ddp_run_names(tmp_path: Path) -> None:
    """Rank 1 alone gets SIGINT: both ranks save and stop at the end of the next step, and rank 0's manifest
    and exit status name SIGINT (rank 0 had no signal of its own to name)."""
    run_dir = tmp_path / "run"
    stopped = ddp_signalled(run_dir, int(signal.SIGINT), rank=1)
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and "SIGINT at step 4" in manifest["error"], manifest


@pytest.mark.ddp
def test_a_signal_to_one_rank_before_training_stops_every_rank_at_the_end_of_the_first_step(
    tmp_path: Path,
) -> None:
    """Rank 1 alone gets SIGTERM in the sanity validation, before training: both ranks save and stop at the
    end of step 1. Lightning's own SIGTERM handler (left out of attnlab's trainers) started a broadcast
    inside the handler on rank 1 alone, and the run hung until gloo's 30-minute timeout."""
    run_dir = tmp_path / "run"
    stopped = ddp_signalled(run_dir, int(signal.SIGTERM), rank=1, stage="sanity", step=1)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and "SIGTERM at step 1" in manifest["error"], manifest
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 1


@pytest.mark.ddp
def test_a_signal_to_one_rank_in_the_final_evaluation_stops_every_rank_and_names_the_fix(
    tmp_path: Path,
) -> None:
    """Rank 1 alone gets SIGTERM at its first test batch, after training: every rank stops at the end of
    testing, with exit status 128 + SIGTERM and a manifest that reads interrupted and names the fix, the same
    command with resume=auto in the run's directory. (Raised at once on rank 1, it ended rank 0 with gloo's
    `Connection closed by peer`: failed.)"""
    run_dir = tmp_path / "run"
    evaluated = ("test=true", "data.n_test=32", "trainer.max_epochs=1")  # a test batch per rank
    stopped = ddp_signalled(run_dir, int(signal.SIGTERM), 1, *evaluated, stage="test", step=1)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", manifest
    assert manifest["error"].startswith("EvaluationStopped: stopped by SIGTERM in the final evaluation"), (
        manifest
    )
    assert f"run the same command with resume=auto hydra.run.dir={run_dir}:" in manifest["error"], manifest
    assert not (run_dir / "results.json").exists()


@pytest.mark.ddp
@pytest.mark.parametrize("stage", ["train", "test"])
def test_sigusr1_to_a_ddp_slurm_job_saves_and_requeues_it_once_after_every_rank_stopped(
    tmp_path: Path, slurm: tuple[dict[str, str], Path], stage: str
) -> None:
    """Two ranks started as `srun` starts them, both sent SIGUSR1 (as SLURM's `--signal` does) at step 3 or
    at the first test batch: every rank stops (exit status 128 + SIGUSR1) and then runs Lightning's SLURM
    auto-requeue after `trainer.fit` or `test` ended, the manifest saying interrupted. Its
    `trainer.save_checkpoint` is collective (a barrier): run on rank 0 alone it fails with gloo's
    `Connection closed by peer` once rank 1 has exited, and the job is not requeued; run on every rank it
    writes the hpc checkpoint, and rank 0 alone calls `scontrol requeue`."""
    env, calls = slurm
    run_dir = tmp_path / "run"
    kill = signal_at(int(signal.SIGUSR1), None, stage=stage, step=3 if stage == "train" else 1)
    tested = ("test=true", "data.n_test=32", "trainer.max_epochs=1") if stage == "test" else ()
    ranks = srun_ranks(run_dir, *DDP_SIGNAL_RUN, *kill, *tested, env={**env, "OMP_NUM_THREADS": "1"})
    assert [r.returncode for r in ranks] == [128 + signal.SIGUSR1] * 2, ranks[0].stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in ranks[1].stderr + ranks[1].stdout  # one run of two processes
    assert calls.read_text().split() == ["requeue", "4242"]  # once, by rank 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", manifest
    stop = "Preempted: stopped by SIGUSR1 at step 4" if stage == "train" else "EvaluationStopped: stopped by"
    assert manifest["error"].startswith(stop), manifest
    saved = torch.load(run_dir / "hpc_ckpt_1.ckpt", weights_only=True)  # Lightning's, by its requeue handler
    assert saved["global_step"] == (4 if stage == "train" else 5)  # (the test: after 1 epoch of 5 steps)


def callback_states(checkpoint: Path) -> dict[str, Any]:
    """The callbacks' saved states in `checkpoint`, with the run's own directory written as `<run>`.
    Lightning's ModelCheckpoint does not restore its `current_score` (the score of the last save, which
    it only reads while saving), so that is left out."""
    run = str(checkpoint.parents[1])
    text = json.dumps(torch.load(checkpoint, weights_only=True)["callbacks"], default=float, sort_keys=True)
    states = json.loads(text.replace(run, "<run>"))
    for state in states.values():
        state.pop("current_score", None)
    return states


def test_a_text_run_monitored_by_bleu_keeps_its_best_checkpoint_and_early_stopping_count_across_a_kill(
    translating_run: dict[str, Any], tmp_path: Path
) -> None:
    """Three epochs from the session's translating model at a tiny learning rate (val/bleu decoded every
    epoch, monitored with early stopping), killed in the second epoch, between two decoding epochs, and
    resumed: the best-checkpoint tracker and the early-stopping count go on as in an uninterrupted run."""
    from attnlab.metrics import corpus_bleu
    from attnlab.training.pipeline import train
    from helpers import compose_train, init_from, lines

    overrides = [
        *translating_run["data"], *init_from(translating_run["dir"] / "checkpoints" / "last.ckpt"),
        "optim=inverse_sqrt", "optim.peak_lr=1e-5", "optim.warmup_steps=2", "trainer.max_epochs=3",
        "decode.every_n_epochs=1", "callbacks=early_stopping", "callbacks.early_stopping.patience=5",
        "decode.beam=2", "logger=csv", "trainer.log_every_n_steps=1",
    ]  # fmt: skip
    reference = tmp_path / "reference"
    train(compose_train([*overrides, *final(reference)], reference))
    run_dir = tmp_path / "run"
    kill = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=12",
            f"+callbacks.kill.signum={int(signal.SIGKILL)}", "trainer.enable_progress_bar=false"]  # fmt: skip
    command = [sys.executable, "-m", "attnlab.cli.train", *overrides, *final(run_dir), *kill,
               f"hydra.run.dir={run_dir}"]  # fmt: skip
    threads = str(torch.get_num_threads())  # this process's: float sums are split by thread count
    env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONPATH": subprocess_path()}
    killed = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 8  # the end of the first epoch (8 steps)
    at_kill = callback_states(last)
    early = next(v for k, v in at_kill.items() if k.startswith("EarlyStopping"))
    assert early["best_score"] >= 60  # the first decoding epoch's BLEU, kept

    train(compose_train([*overrides, *final(run_dir), "resume=auto"], run_dir))
    assert_same_training(run_dir, reference)  # weights, losses and validations (val/bleu below)
    assert logged_rows(run_dir, "val/bleu") == logged_rows(reference, "val/bleu")
    ours, theirs = callback_states(last), callback_states(reference / "checkpoints" / "last.ckpt")
    assert ours == theirs  # the best checkpoint (path and score) and early stopping's count and best
    early = next(v for k, v in theirs.items() if k.startswith("EarlyStopping"))
    assert early["wait_count"] >= 1  # epochs without improvement were counted across the kill
    results = json.loads((run_dir / "results.json").read_text())
    for name in ("test", "test2"):
        hypotheses = lines(run_dir / results["sets"][name]["hypotheses"])
        assert all(hypotheses) and len(set(hypotheses)) == len(hypotheses)
        score = corpus_bleu(hypotheses, lines(translating_run["corpus"] / f"{name}.en")).score
        assert results["sets"][name]["bleu"] == score >= 60
        assert lines(reference / results["sets"][name]["hypotheses"]) == hypotheses
