"""What attnlab's Hydra launchers (`hydra/launcher=local` and `hydra/launcher=slurm`, the classes in
`hydra_plugins.attnlab_launchers`) add to hydra-submitit-launcher's, which run every job in a process of
its own: tolerance of jobs whose process dies.

A job that raises is already recorded by the job itself (its manifest says `failed` and why, and it
returns no value). A job whose process is killed outright — the out-of-memory killer, SIGKILL, a lost
node — cannot: the plugin's launcher then raises at the first such job and the sweep stops collecting
the others. These launchers instead mark that job's manifest `failed` ("its process ended without
finishing"), log it, and return no value for it, so the other jobs' results are collected, sweepers
count it as a failed trial, and `sweep.skip_done=true` (with `resume=auto`, from its last checkpoint)
runs it again.

Every multirun, whichever launcher, ends with a one-line summary from `attnlab-train` (jobs finished,
jobs failed and their manifest.json files) and a non-zero exit status when any job failed: each job's
outcome is recorded with `record_job`, by the job itself under Hydra's basic launcher (which runs the
jobs in this process) or by these launchers from the jobs' manifests.

`hparams_search=optuna`'s sweeper (`hydra_plugins.attnlab_launchers.OptunaSweeper`) launches through
`OncePerSweep`: a trial proposing the parameters of an earlier trial of the sweep (a sampler may) would
train again in that trial's job directory, over its run; it is given the earlier trial's result instead.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.errors import HydraException
from omegaconf import OmegaConf, grammar_parser, open_dict
from omegaconf.errors import OmegaConfBaseException

from attnlab.io import error_reason, too_long_path
from attnlab.runs.layout import (
    JOB_DIRNAME_BYTES,
    MANIFEST_FILE,
    RunDir,
    UnreadableRunFile,
    check_path_length,
    drop_kept_sweep_records,
    job_setting,
)
from attnlab.runs.manifest import Manifest
from attnlab.typed import ConfigError

log = logging.getLogger(__name__)

# How each job of this process's multirun ended: (status `finished` or `failed`, where to look: its
# manifest.json, or the launcher's log of a job that died before writing one).
JOBS: list[tuple[str, Path]] = []
# The `optimized_metric` of a study of this multirun that ended with no best trial (no trial returned it:
# `hydra_plugins.attnlab_launchers.OptunaSweeper`), which fails the multirun even where every job finished
NO_BEST_TRIAL: list[str] = []


def record_job(status: str, where: Path) -> None:
    """Record how a job of this process's multirun ended (`finished` or `failed`) and where to look."""
    JOBS.append((status, Path(where)))


def forget_jobs() -> None:
    """Forget the jobs recorded so far: those of an earlier multirun in this process (a notebook's, run
    through `attnlab.cli.train.main` again), which its summary would count."""
    JOBS.clear()
    NO_BEST_TRIAL.clear()


def multirun_summary() -> tuple[str, bool] | None:
    """The summary line of this process's multirun and whether it failed (a job failed, or its study found
    no best trial: `NO_BEST_TRIAL`); None when no job ran."""
    if not JOBS:
        return None
    failed = [where for status, where in JOBS if status != "finished"]
    line = f"{len(JOBS) - len(failed)} finished, {len(failed)} failed"
    if failed:
        line += f" (see {', '.join(map(str, failed))})"
    if NO_BEST_TRIAL:
        line += f"; no trial returned optimized_metric={NO_BEST_TRIAL[0]}: the study has no best trial"
    return line, bool(failed or NO_BEST_TRIAL)


def _job_status(run: RunDir) -> str:
    """`finished` when the job's manifest says so, else `failed` (failed, interrupted, never finished)."""
    try:
        status = Manifest.read(run).get("status")
    except UnreadableRunFile:  # no manifest, not JSON, not an object
        return "failed"
    return "finished" if status == "finished" else "failed"


class TolerantLaunch:
    """`launch` of hydra-submitit-launcher's launchers (mixed into a subclass of theirs), collecting every
    job's result even when some jobs' processes died."""

    config: Any
    params: dict[str, Any]
    _EXECUTOR: str

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

        assert self.config is not None and len(job_overrides) > 0
        drop_kept_sweep_records()  # (its jobs start now, each in a process of its own)
        params = dict(self.params)
        folder = params.pop("submitit_folder")
        init = {}
        if "max_num_timeout" in params:
            init[f"{self._EXECUTOR}_max_num_timeout"] = params.pop("max_num_timeout")
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=folder, **init)
        queue_keys = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{key if key in queue_keys else f"{self._EXECUTOR}_{key}": v for key, v in params.items()}
        )
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info("submitit '%s' sweep output dir: %s", self._EXECUTOR, sweep_dir)
        arguments = []
        for offset, overrides in enumerate(job_overrides):
            idx = initial_job_idx + offset
            log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
            arguments.append(
                (list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state())
            )
        jobs = executor.map_array(self, *zip(*arguments, strict=True))
        results = []
        for job, overrides in zip(jobs, job_overrides, strict=True):
            result, run_dir = _result(job, list(overrides), sweep_dir)
            if run_dir is None:  # died before writing its manifest
                record_job("failed", Path(job.paths.folder))
            else:
                run = RunDir(run_dir)
                failed = result.status == JobStatus.FAILED
                record_job("failed" if failed else _job_status(run), run.manifest_file)
            results.append(result)
        return results


def _result(job: Any, overrides: list[str], sweep_dir: Path) -> tuple[JobReturn, Path | None]:
    """The job's own return, or, when its process died without one, a value-less return (after marking
    its manifest failed); and the job's run directory (None when it is not known)."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    try:
        result = job.results()[0]
        hydra_cfg = result.hydra_cfg
        return result, None if hydra_cfg is None else Path(str(hydra_cfg.hydra.runtime.output_dir))
    except (FailedJobError, UncompletedJobError) as exc:
        reason = error_reason(exc)
        error = (
            f"the job's process ended without finishing (killed by the out-of-memory killer or a signal, or "
            f"its node was lost): {reason} — see its submitit log in {job.paths.folder}"
        )
        marked = mark_failed(sweep_dir, overrides, error)
        log.error("job %s failed: %s%s", " ".join(overrides), error, "" if marked else " (no manifest found)")
        return JobReturn(overrides=overrides, status=JobStatus.COMPLETED, _return_value=None), marked


def mark_failed(sweep_dir: Path, overrides: list[str], error: str) -> Path | None:
    """Mark `failed` the still-`running` manifest of the job with these overrides; returns the job's run
    directory, None if there is no such manifest."""
    for path in sorted(sweep_dir.glob(f"*/{MANIFEST_FILE}")):
        try:
            manifest = Manifest.read(RunDir(path.parent))
        except UnreadableRunFile:
            continue
        if manifest.get("status") == "running" and manifest.get("overrides") == overrides:
            manifest.finish("failed", error=error)
            return path.parent
    return None


def check_job_directories(launcher: Any, job_overrides: Sequence[Sequence[str]], first_idx: int) -> None:
    """End the multirun with one line (`attnlab.runs.layout.check_path_length`) before `launcher` launches
    `job_overrides` when the directory of one of them (`hydra.sweep.dir`/`hydra.sweep.subdir`, composed and
    numbered from `first_idx` as Hydra's launchers do) is too long for the file system: Hydra made the job
    directories first, with `OSError`'s `File name too long` traceback. The default subdir
    (`attnlab.cli.app.job_dirname`) is short; one the user sets, or a long sweep directory, need not be. A
    job whose config cannot be composed or resolved is left to the launcher, which reports it. With the
    default subdir and room for its longest name, no job's config is composed (`_default_job_names_fit`)."""
    if _default_job_names_fit(launcher.config):
        return
    for idx, overrides in enumerate(job_overrides, start=first_idx):
        job_dir = _job_directory(launcher, overrides, idx)
        if job_dir is None:
            continue
        key = f"the job directory of #{idx} ({' '.join(filter_overrides(overrides))})"
        try:
            check_path_length(key, job_dir, "set a shorter hydra.sweep.subdir (or hydra.sweep.dir)")
        except ConfigError as exc:
            task = launcher.config.get("task_name", "train")
            raise SystemExit(f"attnlab-{task}: config error: {exc}") from None


def _default_job_names_fit(config: Any) -> bool:
    """Whether the sweep's `hydra.sweep.subdir` is the default one (`${attnlab.job_dir:...}` alone, names
    of at most `JOB_DIRNAME_BYTES`; not one adding to it, `${attnlab.job_dir:...}_<more>`) and
    `hydra.sweep.dir` has room for such a name: then composing each job's config to find its directory (a
    few tenths of a second a job) would find none too long."""
    try:
        sweep = config.hydra.sweep
        if not _job_dir_alone(sweep._get_node("subdir")._value()):
            return False
        return too_long_path(Path(str(sweep.dir), "j" * JOB_DIRNAME_BYTES)) is None
    except (HydraException, OmegaConfBaseException, AttributeError):
        return False


def _job_dir_alone(subdir: Any) -> bool:
    """Whether `subdir`, a `hydra.sweep.subdir` as written, is one `${attnlab.job_dir:...}` interpolation and
    nothing else (OmegaConf's grammar: text around it, or a second interpolation after it, is more)."""
    if not (isinstance(subdir, str) and subdir.startswith("${attnlab.job_dir:")):
        return False
    parts = list(grammar_parser.parse(subdir).text().getChildren())
    interpolation = grammar_parser.OmegaConfGrammarParser.InterpolationContext
    return len(parts) == 1 and isinstance(parts[0], interpolation)


def _job_directory(launcher: Any, overrides: Sequence[str], idx: int) -> Path | None:
    """The directory Hydra's launchers make for job `idx` of `overrides` (`hydra.sweep.dir`/
    `hydra.sweep.subdir` of its config, resolved as `hydra.core.utils.run_job` does: with the job's config
    as `HydraConfig`, for `${hydra:...}`), or None where its config cannot be composed or resolved."""
    hydra_config = HydraConfig.instance()
    before = hydra_config.cfg
    try:
        config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
        with open_dict(config):
            config.hydra.job.id = config.hydra.job.num = idx
        hydra_config.set_config(config)
        return Path(str(config.hydra.sweep.dir), str(config.hydra.sweep.subdir))
    except (HydraException, OmegaConfBaseException):
        return None
    finally:
        hydra_config.cfg = before


class OncePerSweep:
    """A sweeper's launcher that runs each job once a sweep: a job whose overrides are those of a job
    launched before in the sweep (`attnlab.runs.layout.job_setting`: the same setting and seed, so the
    same job directory), in an earlier batch or the same one, is not launched; a log line names it before
    the batch is launched, and it gets that job's return (its result, or its failure). Without this, an
    Optuna trial repeating an earlier trial's parameters, or a job listed twice on the command line
    (`seed=1,1`), trained again in that job's directory, over its checkpoints and results. A batch with a
    job directory too long for the file system is not launched (`check_job_directories`)."""

    def __init__(self, launcher: Any) -> None:
        self.launcher = launcher
        self.returns: dict[str, JobReturn] = {}  # `job_setting` -> its job's return

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        keys = [job_setting(overrides) for overrides in job_overrides]
        first: dict[str, int] = {}  # each new job's first place in this batch
        for i, key in enumerate(keys):
            if key not in self.returns:
                first.setdefault(key, i)
        new = sorted(first.values())
        for i, overrides in enumerate(job_overrides):
            if i not in new:
                shown = " ".join(filter_overrides(overrides))
                log.info("job %s repeats an earlier job of this sweep (the same setting and seed): not run "
                         "again, it gets that job's result", shown)  # fmt: skip
        if new:
            check_job_directories(self.launcher, [job_overrides[i] for i in new], initial_job_idx)
            launched = self.launcher.launch([job_overrides[i] for i in new], initial_job_idx)
            self.returns.update({keys[i]: ret for i, ret in zip(new, launched, strict=True)})
        return [dataclasses.replace(self.returns[key], overrides=list(overrides))
                for overrides, key in zip(job_overrides, keys, strict=True)]  # fmt: skip
