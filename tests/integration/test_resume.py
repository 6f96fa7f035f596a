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
from pathlib import Path

import pytest
import torch

from runs import RUN, assert_same_training, attnlab_train, final


def test_a_run_killed_with_sigkill_resumes_to_the_same_weights(
    resume_reference: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    killed = attnlab_train(run_dir, "+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=6",
                           f"+callbacks.kill.signum={int(signal.SIGKILL)}")  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "running"  # it never knew
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    resumed = attnlab_train(run_dir, "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_training(run_dir, resume_reference)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished" and len(manifest["resumed"]) == 1
    assert manifest["resumed"][0]["checkpoint"] == str(run_dir / "checkpoints" / "last.ckpt")


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
    resumed = attnlab_train(run_dir, "ckpt_path=last", "logger=wandb", env=wandb)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_training(run_dir, resume_reference)
    from attnlab.wandb_records import read_wandb_run

    records = [read_wandb_run(p) for p in sorted(run_dir.rglob("run-*.wandb"))]
    assert len(records) == 2 and records[0].run["id"] == records[1].run["id"] == manifest["wandb_run_id"]
    assert [r.exit_code for r in records] == [1, 0]  # the interrupted part, then the finished one


def test_sigusr1_under_slurm_saves_requeues_and_resumes(resume_reference: Path, tmp_path: Path) -> None:
    """Lightning's SLURM auto-requeue path, with a stand-in `scontrol` on PATH that records its call."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol_calls.txt"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    slurm = {
        "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NAME": "attnlab",
        "SLURM_NODELIST": "localhost", "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }  # fmt: skip
    run_dir = tmp_path / "run"
    stopped = attnlab_train(run_dir, "+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=5",
                            f"+callbacks.kill.signum={int(signal.SIGUSR1)}", env=slurm)  # fmt: skip
    assert stopped.returncode == 128 + signal.SIGUSR1, stopped.stderr[-3000:]
    assert calls.read_text().split() == ["requeue", "4242"]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    assert (run_dir / "hpc_ckpt_1.ckpt").is_file()  # Lightning's own, saved by its requeue handler
    resumed = attnlab_train(run_dir, "resume=auto")  # what the requeued job runs
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_training(run_dir, resume_reference)


def test_two_runs_with_one_seed_have_identical_histories(resume_reference: Path, tmp_path: Path) -> None:
    from attnlab.train import train
    from helpers import compose_train

    run_dir = tmp_path / "again"
    overrides = [o for o in RUN if not o.startswith("trainer.enable_progress_bar")] + final(run_dir)
    train(compose_train(overrides, run_dir))
    assert_same_training(run_dir, resume_reference)


def test_resume_errors_name_the_fix(tmp_path: Path, resume_reference: Path) -> None:
    from attnlab.config import ConfigError
    from attnlab.train import train
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
