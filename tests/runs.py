"""Real `attnlab-train` subprocess runs shared by the resumption and fault tests (`train_here`: the same
run in this process).

Kept apart from `helpers` so that importing the helpers does not import torch's checkpoint loading.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from helpers import subprocess_path

RUN = [
    "data=synthetic",
    "model=tiny",
    "model.dropout=0.1",
    "data.n_train=160",
    "data.n_val=16",
    "data.n_test=16",
    "data.batch_size=16",
    "data.num_workers=1",
    "trainer.max_epochs=2",
    "logger=csv",
    "test=false",
    "trainer.log_every_n_steps=1",
    "callbacks.last_checkpoint.every_n_train_steps=4",
    "seed=7",
    "trainer.enable_progress_bar=false",
]  # 10 steps per epoch: checkpoints at steps 4, 8, 12, 16, 20


IN_PROCESS = [o for o in RUN if not o.startswith("trainer.enable_progress_bar")]  # compose_train sets it


def final(run_dir: Path) -> list[str]:
    return ["+callbacks.final._target_=probes.SaveFinalWeights", f"+callbacks.final.dirpath={run_dir}"]


def train_here(run_dir: Path, *extra: str) -> dict[str, float]:
    """`attnlab_train(run_dir, *extra)` in this process (`train(cfg)`: no new process's 10 s of imports),
    for the runs of a test that is not about processes or the command line; raises where that one fails."""
    from attnlab.training.pipeline import train
    from helpers import compose_train

    return train(compose_train([*IN_PROCESS, *final(run_dir), *extra], run_dir))


def attnlab_train(
    run_dir: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "attnlab.cli.train",
        *RUN,
        f"hydra.run.dir={run_dir}",
        *final(run_dir),
        *extra,
    ]
    environment = {**os.environ, "PYTHONPATH": subprocess_path(), **(env or {})}
    return run_all(command, timeout=timeout, env=environment)


def srun_ranks(
    run_dir: Path, *extra: str, env: dict[str, str], tasks: int = 2, timeout: float = 180
) -> list[subprocess.CompletedProcess]:
    """`attnlab_train(run_dir, *extra)` as `srun --ntasks-per-node=tasks` starts it on one node: `tasks`
    processes at once, each given its rank in SLURM's variables (`env`: the job's, SLURM_JOB_ID among them)
    and the same free port, so that Lightning's SLURM environment (auto-requeue included) makes them one
    DDP run; each process's result, by rank. Each is killed after `timeout` seconds: a run that hangs
    fails."""
    from concurrent.futures import ThreadPoolExecutor

    from lightning.fabric.plugins.environments.lightning import find_free_network_port

    job = {**env, "SLURM_NTASKS": str(tasks), "SLURM_NTASKS_PER_NODE": str(tasks), "SLURM_NODEID": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(find_free_network_port())}  # fmt: skip
    ranks = [{**job, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)} for rank in range(tasks)]
    with ThreadPoolExecutor(tasks) as pool:
        started = [pool.submit(attnlab_train, run_dir, *extra, env=rank, timeout=timeout) for rank in ranks]
        return [future.result() for future in started]


def run_all(command: list[str], timeout: float = 600, **kwargs: Any) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True)`, in a process group of its own: past
    `timeout` (or on an exception here, such as Ctrl-C) every process of the run is killed (a DDP run's
    other ranks, DataLoader workers and their fork server too), not only the first, and none is left
    holding the output pipes."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            raise subprocess.TimeoutExpired(command, timeout, stdout, stderr) from None
        except BaseException:  # Ctrl-C included: its own session keeps the terminal's SIGINT from the run
            os.killpg(process.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "final_weights_rank0.pt", weights_only=True)


def step_losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        return {
            int(r["step"]): float(r["train/loss_step"]) for r in csv.DictReader(f) if r.get("train/loss_step")
        }


def logged_rows(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    """Every `(step, value)` row of `metric` in `csv/metrics.csv` (repeated rows kept), by step."""
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        return sorted((int(r["step"]), float(r[metric])) for r in csv.DictReader(f) if r.get(metric))


def assert_same_training(run_dir: Path, reference: Path) -> None:
    ours, theirs = weights(run_dir), weights(reference)
    assert ours.keys() == theirs.keys()
    different = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert not different, f"weights differ from the uninterrupted run: {different[:5]}"
    assert step_losses(run_dir) == step_losses(reference)  # the history, before and after the resumption
    for metric in ("val/loss", "params/total"):  # each validation and the parameter count, logged once
        rows = logged_rows(reference, metric)
        assert rows and logged_rows(run_dir, metric) == rows, (metric, rows, logged_rows(run_dir, metric))
    # each step's and epoch's values, the interrupted epoch's included: its sums were saved
    for metric in (*STEP_VALUES, *EPOCH_VALUES):
        rows = logged_rows(reference, metric)
        assert rows and logged_rows(run_dir, metric) == rows, (metric, rows, logged_rows(run_dir, metric))


# The values a resumed run logs as an uninterrupted one does (not train/tokens_per_sec, a time)
EPOCH_VALUES = [f"train/{name}_epoch" for name in ("loss", "nll", "ppl", "grad_norm", "lr", "tokens_seen")]
STEP_VALUES = [f"train/{name}_step" for name in ("nll", "ppl", "grad_norm", "lr", "tokens_seen")]


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (dead, waiting to be reaped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status
