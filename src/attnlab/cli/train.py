"""`attnlab-train`: train and evaluate a Transformer from the Hydra config `conf/train.yaml`.

A multirun (`-m`) runs every job even when some fail (a failed job's manifest.json says why), then prints
how many finished and failed, and exits non-zero when any failed; with `hydra.sweep.dir` fixed,
`sweep.skip_done=true` skips the jobs that already finished (with `resume=auto`, it continues the
interrupted ones; without, it refuses to train them afresh over their checkpoints). A config or data
error (a missing or misaligned corpus file, invalid UTF-8, an empty corpus) ends a run with its message
and no traceback (with one when HYDRA_FULL_ERROR=1).

Examples:
    attnlab-train model=tiny trainer.max_epochs=3
    attnlab-train -m model.pe=sinusoidal,learned,none seed=1,2,3 hydra.sweep.dir=logs/sweeps/pe
    attnlab-train model.pe=learned model.n_heads=4 --cfg job
    attnlab-train --config-dir ./my_conf experiment=my_ablation
"""

from __future__ import annotations

import logging
import os
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from attnlab.cli.app import config_dir, continues_run, refusal_leaves_no_run_directory, register_resolvers
from attnlab.io import WriteError
from attnlab.runs.layout import (
    MANIFEST_FILE,
    RESULTS_FILE,
    RunDir,
    RunDirectoryInUse,
    UnreadableRunFile,
    json_type,
)
from attnlab.runs.manifest import Manifest
from attnlab.training.launchers import forget_jobs, multirun_summary, record_job
from attnlab.typed import ConfigError

log = logging.getLogger(__name__)
register_resolvers()


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="train")
def _main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    if multirun:
        check_launcher(cfg, HydraConfig.get().launcher.get("_target_", ""))
    submitit_ranks()
    run = RunDir(Path(cfg.paths.output_dir))
    metric = cfg.get("optimized_metric")
    from attnlab.training.experiment import sweep_skip_done  # torch-free

    try:
        skip_done = sweep_skip_done(cfg.get("sweep"))  # (a job's own swept value: the sweep's was checked)
    except ConfigError as exc:
        return _config_error(run, exc, multirun)
    continues = continues_run(run, cfg.get("resume"), cfg.get("ckpt_path"))
    if skip_done:
        skipped = _skip_done(run, multirun, continues)
        if skipped is _NOT_RUN:  # named as a failed job already: no metric to miss
            return None
        if skipped is not None:
            return _sweeper_value(skipped, metric, multirun)
    elif multirun and not continues and _held_run(run, skip_finished=False):
        return None
    from attnlab.training.pipeline import train  # imports lightning

    try:
        metrics = train(cfg)
    except ConfigError as exc:
        return _config_error(run, exc, multirun)
    except Exception as exc:
        # A told error's message says what happened, where and the fix: no traceback for it.
        told = told_message(exc) if os.environ.get("HYDRA_FULL_ERROR") != "1" else None
        if not multirun:
            if told is not None:
                raise SystemExit(f"attnlab-train: {told}") from None
            raise
        # The run's manifest.json already says failed, with the error; the other jobs go on.
        record_job("failed", run.manifest_file)
        if told is not None:
            log.error("job %s failed: %s", run.path.name, told)
        else:
            log.exception("job %s failed; the sweep goes on", run.path.name)
        return None
    if multirun:
        record_job("finished", run.manifest_file)
    summary = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k.startswith(("val/", "test/")))
    if summary:
        print(f"attnlab-train: {summary}")
    return _sweeper_value(metrics, metric, multirun)


def _config_error(run: RunDir, exc: ConfigError, multirun: bool) -> None:
    """End a run refused for a config error: with its message (no traceback), or, as a job of a multirun,
    recorded as failed (the other jobs go on)."""
    if not multirun:
        raise SystemExit(f"attnlab-train: config error: {exc}") from None
    # (a run that started there keeps its manifest: this error is in the log; another process's too)
    recorded = not isinstance(exc, RunDirectoryInUse) and Manifest.failed(run, f"ConfigError: {exc}")
    record_job("failed", run.manifest_file if recorded else run.path)
    log.error("job %s failed: config error: %s", run.path.name, exc)


def _sweeper_value(metrics: dict[str, Any], metric: str | None, multirun: bool) -> float | None:
    """What a job returns to the sweeper: its final value of `optimized_metric` (None without one). In a
    multirun, a metric the run does not have is logged as an error naming those it has (a single run's
    value goes nowhere)."""
    if multirun and metric and metric not in metrics:
        available = ", ".join(sorted(metrics)) or "none"
        log.error("optimized_metric=%s is not among this run's final metrics (%s): nothing to return to the "
                  "sweeper; set optimized_metric to one of them", metric, available)  # fmt: skip
        return None
    return metrics.get(metric) if metric else None


def told_message(exc: BaseException) -> str | None:
    """The one-line message of a training error whose message is the whole story (what, where, the fix),
    printed without a traceback (`HYDRA_FULL_ERROR=1` shows it); None for any other error. Data errors
    (missing or misaligned files, invalid UTF-8, an empty corpus), a full disk while saving a checkpoint or
    writing the final evaluation (`attnlab.io.WriteError`), a NaN/inf loss or gradient, a model whose
    scores are NaN when it decodes (`NonFiniteScores`: one that diverged under `optim.on_nonfinite=skip`,
    decoding validation or test sentences), as attnlab-eval reports it."""
    from attnlab.data.download import DataError
    from attnlab.decoding.search import NonFiniteScores

    if isinstance(exc, DataError):
        return f"data error: {exc}"
    from attnlab.training.module import NonFiniteError  # lightning is loaded once training ran

    return str(exc) if isinstance(exc, (WriteError, NonFiniteError, NonFiniteScores)) else None


def trainer_processes(cfg: DictConfig) -> int | None:
    """Processes one job's trainer runs: devices × nodes, the devices a number, a list of device ids
    (`[0,1]`, `"0,1"`) or, as Lightning takes them, every GPU of this machine (`-1`, `auto`; one device on
    the CPU); None: unknown (all devices, under a distributed strategy). Device ids or -1 on the CPU
    (`runs_on_cpu`) count as 1: the job's config check refuses them."""
    from attnlab.training.experiment import runs_on_cpu

    trainer = cfg.get("trainer") or {}
    strategy = str(trainer.get("strategy", "auto"))
    devices, nodes = trainer.get("devices", 1), int(trainer.get("num_nodes", 1) or 1)
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    elif isinstance(devices, str) and "," in devices:
        devices = [i for i in devices.split(",") if i.strip()]
    if isinstance(devices, int) and devices >= 0:
        return devices * nodes
    listed = isinstance(devices, Sequence) and not isinstance(devices, str)  # a list of device ids
    if (listed or devices == -1) and runs_on_cpu(trainer):
        return 1
    if listed:
        return len(devices) * nodes
    if "ddp" in strategy or "fsdp" in strategy:
        return None
    if devices not in (-1, "auto"):  # a value Lightning refuses (null, 2.5): the job's trainer names it
        return 1
    if runs_on_cpu(trainer):  # (auto: one device a node)
        return nodes
    import torch

    return max(torch.cuda.device_count(), 1) * nodes  # Lightning's default strategy: DDP over several


def check_launcher(cfg: DictConfig, launcher: str) -> None:
    """A multirun of jobs that each run several processes needs a launcher that gives every job its own
    processes: Hydra's basic launcher runs the jobs inside this process, where Lightning cannot start
    the other ranks (it would re-run this whole command line for them)."""
    processes = trainer_processes(cfg)  # (0 devices: refused by the job's own checks, naming the key)
    if launcher.endswith("BasicLauncher") and (processes is None or processes > 1):
        raise SystemExit(
            f"attnlab-train: each job of this sweep runs {processes or 'several'} processes "
            f"(trainer.strategy={cfg.trainer.get('strategy')}, trainer.devices={cfg.trainer.get('devices')}, "
            f"trainer.num_nodes={cfg.trainer.get('num_nodes')}), which Hydra's basic launcher cannot start: "
            "add hydra/launcher=local (this machine) or hydra/launcher=slurm (a cluster)"
        )


def submitit_ranks() -> None:
    """Under submitit's local executor with several tasks per job (hydra/launcher=local and a
    multi-process trainer), tell Lightning each task's rank through the environment variables it reads
    (`LOCAL_RANK`, `NODE_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), so the tasks become the DDP
    ranks instead of each starting its own. On SLURM, Lightning reads SLURM's variables itself."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "local" or "LOCAL_RANK" in os.environ:
        return
    import submitit

    env = submitit.JobEnvironment()
    if env.num_tasks <= 1:
        return
    port = 20000 + zlib.crc32(str(env.job_id).encode()) % 20000  # the same in every task of the job
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(env.num_tasks),
        RANK=str(env.global_rank), LOCAL_RANK=str(env.local_rank), NODE_RANK=str(env.node),
    )  # fmt: skip


_NOT_RUN: dict[str, Any] = {}  # what `_skip_done` gives for a job it records as failed without running it


def _skip_done(run: RunDir, multirun: bool, continues: bool) -> dict[str, Any] | None:
    """With `sweep.skip_done`: the final metrics of a job whose run finished (the job is skipped), else
    None (the job runs). A finished run whose results cannot be read is neither: outside a multirun the
    command stops naming the file; in one the job is recorded as failed, with `_NOT_RUN` (no metrics). So
    is a job of a multirun whose directory holds an unfinished run's checkpoints (an interrupted job) when
    the command does not continue it (`continues`: resume=auto or true): it would train afresh over them
    (a single run is refused so before Hydra starts: `attnlab.cli.app.RunDirectoryCheck`)."""
    try:
        done = finished_results(run)
    except UnreadableRunFile as exc:  # a finished job's results that attnlab-train did not write
        told = f"{exc}: restore it, or remove the run directory to run the job again"
        if not multirun:
            raise SystemExit(f"attnlab-train: {told}") from None
        log.error("job %s not skipped: %s", run.path.name, told)
        record_job("failed", run.results_file)
        return _NOT_RUN
    if done is None:
        return _NOT_RUN if multirun and not continues and _held_run(run, skip_finished=True) else None
    print(f"attnlab-train: {run.path} already finished (sweep.skip_done=true): skipped")
    if multirun:
        record_job("finished", run.manifest_file)
    return done.get("metrics", {})


def _held_run(run: RunDir, *, skip_finished: bool) -> bool:
    """Whether a multirun job that does not continue its run must not run: its directory holds a run's
    checkpoints, or a finished run (unless `skip_finished`: `sweep.skip_done` skips those), which a new run
    would train afresh over (`RunDir.check_no_run`; a single run is refused so before Hydra starts,
    `attnlab.cli.app.RunDirectoryCheck`). Such a job is recorded as failed, its files untouched, and the
    log names the fix: `sweep.skip_done=true` for a finished job, `resume=auto` for an unfinished one
    with a last.ckpt (one without has nothing to continue from)."""
    try:
        run.check_no_run(skip_finished=skip_finished)
    except ConfigError as exc:
        if run.saved_training()[1] == "finished":
            hint = (". Add sweep.skip_done=true to the sweep's command to skip its finished jobs, or give "
                    "the sweep another hydra.sweep.dir to train them again")  # fmt: skip
        elif run.last_checkpoint.is_file():
            hint = ". Add resume=auto to the sweep's command to continue its unfinished jobs"
        else:
            hint = ""
        log.error("job %s not run: %s%s", run.path.name, exc, hint)
        record_job("failed", run.manifest_file)
        return True
    return False


def finished_results(run: RunDir) -> dict[str, Any] | None:
    """The `results.json` of a run that finished (manifest status `finished`), else None.

    Raises:
        UnreadableRunFile: The run finished, but its `results.json` cannot be read, is no JSON object, or
            its `metrics` is no JSON object: neither what a skipped job can return nor a job to run again
            in that directory.
    """
    try:
        if run.read_json(MANIFEST_FILE).get("status") != "finished":
            return None
    except UnreadableRunFile:
        return None
    results = run.read_json(RESULTS_FILE)
    numbers = results.get("metrics", {})
    if not isinstance(numbers, dict):
        raise UnreadableRunFile(
            f"cannot read {run.results_file}: its 'metrics' is a JSON {json_type(numbers)}, not an object"
        )
    return results


def help_text(conf: Path | None = None) -> str:
    """`attnlab-train --help`: what the command does and the config groups with their options.

    Written from the config directory's files rather than by Hydra's own help, which composes every
    group's every option (seconds with the sweeper plugins installed); `--hydra-help` is Hydra's.
    """
    conf = conf or config_dir()
    lines = [
        (__doc__ or "").strip(),
        "",
        "Config groups (group=option; `+group=option` for those without a default):",
    ]
    for group in sorted(p for p in conf.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        name = group.relative_to(conf).as_posix()
        options = sorted(f.stem for f in group.glob("*.yaml"))
        if options and name != "hydra":
            lines.append(f"  {name}: {', '.join(options)}")
    lines += [
        "",
        "Any value can be overridden (model.pe=learned, trainer.max_epochs=3); see the composed config with",
        "`attnlab-train <overrides> --cfg job`, Hydra's own options with `attnlab-train --hydra-help`.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Console-script entry point."""
    if any(arg in ("--help", "-h") for arg in sys.argv[1:]):
        sys.stdout.write(help_text())
        return
    forget_jobs()  # (an earlier multirun's in this process: a notebook's)
    with refusal_leaves_no_run_directory("train"):
        _main()
    summary = multirun_summary()  # None unless this was a multirun
    if summary is not None:
        line, failed = summary
        if failed:
            raise SystemExit(f"attnlab-train: multirun: {line}")
        print(f"attnlab-train: multirun: {line}")


if __name__ == "__main__":
    main()
