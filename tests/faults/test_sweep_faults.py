"""Sweeps under failure with a per-process launcher: a job killed outright (SIGKILL, as the out-of-memory
killer does) does not stop the others, is reported failed by attnlab-compare, and is run again — from its
last checkpoint — by re-running the sweep with `sweep.skip_done=true resume=auto`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli.compare import report
from attnlab.typed import ConfigError
from helpers import command_here, subprocess_path


def local_sweep(
    tmp_path: Path, *extra: str, kill_seed: int | None = None
) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "attnlab.cli.train", "-m", "hydra/launcher=local", "data=synthetic",
        "model=tiny", "data.n_train=48", "data.n_val=16", "data.n_test=16", "data.batch_size=8",
        "trainer.max_epochs=1", "logger=csv", "callbacks.last_checkpoint.every_n_train_steps=1",
        "+callbacks.kill._target_=probes.KillIfSeed", "+callbacks.kill.step=3",
        "seed=1,2,3", f"hydra.sweep.dir={tmp_path / 'sweep'}", "trainer.enable_progress_bar=false", *extra,
    ]  # fmt: skip
    env = {**os.environ, "ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "PYTHONPATH": subprocess_path()}
    env.pop("PROBE_KILL_SEED", None)
    if kill_seed is not None:
        env["PROBE_KILL_SEED"] = str(kill_seed)
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)


def manifests(sweep_dir: Path) -> dict[str, dict]:
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    return {job.name: json.loads((job / "manifest.json").read_text()) for job in jobs}


def test_a_killed_job_does_not_stop_the_others_is_reported_failed_and_rerun(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the [sweep] extra")
    sweep_dir = tmp_path / "sweep"
    first = local_sweep(tmp_path, kill_seed=2)
    assert first.returncode == 1, first.stderr[-3000:]  # every job ran; one failed, so the sweep did
    jobs = manifests(sweep_dir)
    assert len(jobs) == 3
    status = {next(o for o in m["overrides"] if o.startswith("seed=")): m["status"] for m in jobs.values()}
    assert status == {"seed=1": "finished", "seed=2": "failed", "seed=3": "finished"}
    killed = next(m for m in jobs.values() if m["status"] == "failed")
    killed_dir = next(n for n, m in jobs.items() if m["status"] == "failed")
    summary = f"multirun: 2 finished, 1 failed (see {sweep_dir / killed_dir / 'manifest.json'})"
    assert first.stderr.strip().splitlines()[-1] == f"attnlab-train: {summary}"
    assert "the job's process ended without finishing (killed by the out-of-memory killer" in killed["error"]
    assert all("submitit" in " ".join(m["command"]) for m in jobs.values())  # each run by submitit's worker
    assert all("hydra/launcher=local" not in m["overrides"] for m in jobs.values())  # Hydra's, not the job's
    assert all(
        (sweep_dir / n / "results.json").is_file() for n, m in jobs.items() if m["status"] == "finished"
    )
    logs = sorted((sweep_dir / ".submitit").glob("*/*_log.out"))
    assert len({log.parent.name for log in logs}) == 3  # one process per job
    text = report([sweep_dir])
    assert text.count("(failed: the job's process ended without finishing") == 1

    finished = {
        n: (sweep_dir / n / "results.json").stat().st_mtime_ns
        for n, m in jobs.items()
        if m["status"] == "finished"
    }
    second = local_sweep(tmp_path, "sweep.skip_done=true", "resume=auto")
    assert second.returncode == 0, second.stderr[-3000:]
    again = manifests(sweep_dir)
    assert set(again) == set(jobs) and all(m["status"] == "finished" for m in again.values())
    assert {n: (sweep_dir / n / "results.json").stat().st_mtime_ns for n in finished} == finished  # skipped
    rerun = next(m for n, m in again.items() if n not in finished)
    assert len(rerun["resumed"]) == 1 and rerun["resumed"][0]["checkpoint"].endswith("last.ckpt")
    assert "failed" not in report([sweep_dir])


@pytest.mark.parametrize(
    ("results", "told"),
    [(b'{"sets": {}, "metrics": nul', "Expecting value"), (b"[1]", "it holds a JSON array, not an object"),
     (b'{"metrics": null}', "its 'metrics' is a JSON null, not an object")],
)  # fmt: skip
def test_skip_done_neither_skips_nor_reruns_a_finished_run_with_unreadable_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, results: bytes, told: str
) -> None:
    """A truncated results.json of a finished run made `sweep.skip_done` train the job again in that
    directory (over the finished run's files); it is refused naming the file, before training."""
    from hydra.core.global_hydra import GlobalHydra

    from attnlab.cli.train import _main

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"status": "finished"}))
    (run / "results.json").write_bytes(results)
    argv = ["attnlab-train", "data=synthetic", "model=tiny", "sweep.skip_done=true", f"hydra.run.dir={run}",
            "hydra/job_logging=none", "hydra/hydra_logging=none"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    GlobalHydra.instance().clear()
    try:
        with pytest.raises(SystemExit, match=rf"cannot read {run}/results.json: .*{told}.*: restore it"):
            _main()
    finally:
        GlobalHydra.instance().clear()
    assert (run / "results.json").read_bytes() == results
    assert not (run / "checkpoints").exists()


def test_a_dead_jobs_running_manifest_alone_is_marked_failed_and_counted_so(tmp_path: Path) -> None:
    """A job whose process died left its manifest `running`: the launcher finds it among the sweep's job
    directories by the job's overrides and marks it `failed` with the reason. A finished run of the same
    job (an earlier sweep's, as `sweep.skip_done` leaves it), another job's running manifest and an
    unreadable one are left as they are; the summary counts only a `finished` manifest as finished."""
    from attnlab.runs.layout import RunDir
    from attnlab.training.launchers import _job_status, mark_failed

    sweep_dir = tmp_path / "sweep"
    jobs = {  # sorted as they are searched: each decoy comes before the job's own directory
        "a-finished": json.dumps({"status": "finished", "overrides": ["seed=1"]}),
        "b-other": json.dumps({"status": "running", "overrides": ["seed=2"]}),
        "c-damaged": '{"status": "running", "overrides": ["seed=1"]',
        "d-dead": json.dumps({"status": "running", "overrides": ["seed=1"]}),
    }
    for name, text in jobs.items():
        (sweep_dir / name).mkdir(parents=True)
        (sweep_dir / name / "manifest.json").write_text(text)

    assert mark_failed(sweep_dir, ["seed=3"], "killed") is None  # no such job: nothing marked
    assert mark_failed(sweep_dir, ["seed=1"], "its process ended without finishing") == sweep_dir / "d-dead"
    dead = json.loads((sweep_dir / "d-dead" / "manifest.json").read_text())
    assert dead["status"] == "failed" and dead["error"] == "its process ended without finishing"
    assert dead["end_time"] and dead["overrides"] == ["seed=1"]
    for name in ("a-finished", "b-other", "c-damaged"):
        assert (sweep_dir / name / "manifest.json").read_text() == jobs[name]
    assert mark_failed(sweep_dir, ["seed=1"], "again") is None  # no longer running: marked once
    counted = {name: _job_status(RunDir(sweep_dir / name)) for name in jobs}
    assert counted == {"a-finished": "finished"} | dict.fromkeys(["b-other", "c-damaged", "d-dead"], "failed")


@pytest.mark.parametrize(
    ("swept", "full_error"), [("experiment=nosuch,synthetic_pe", False), ("model=smal,tiny", True)]
)
def test_a_sweep_hydra_cannot_compose_leaves_no_sweep_directory(
    swept: str, full_error: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An option that does not exist (`experiment=nosuch`): Hydra finds it when it composes the first job,
    after it made the sweep directory and wrote `multirun.yaml` there. The multirun is refused in one line
    naming the job's override, the group's options and the closest (exit status 1; with
    `HYDRA_FULL_ERROR=1` a `ConfigError` raised from Hydra's error). That directory, holding nothing else,
    was left behind; it is removed, with the parents made for it."""
    from hydra.errors import MissingConfigException

    if not full_error:
        monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    sweep_dir = tmp_path / "sweeps" / "s"
    with pytest.raises(ConfigError if full_error else SystemExit) as refused:
        command_here(monkeypatch, "train", "-m", swept, "data=synthetic", f"hydra.sweep.dir={sweep_dir}")
    if full_error:
        assert str(refused.value) == (
            "model=smal: no option 'smal' in group model (did you mean small?); options: base, big, mini, "
            "small, tiny"
        )
        assert isinstance(refused.value.__cause__, MissingConfigException)
    else:
        assert str(refused.value.code).startswith(
            "attnlab-train: config error: experiment=nosuch: no option 'nosuch' in group experiment; "
            "options: multi30k_base, "
        )
    assert list(tmp_path.iterdir()) == []


def files_under(directory: Path) -> dict[str, bytes]:
    """Every file below `directory` (its path relative to it) and its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@pytest.mark.parametrize("earlier", [b"# the earlier sweep's record\nhydra: {}\n", None])
def test_a_sweep_refused_before_its_first_job_leaves_an_earlier_sweep_directory_as_it_was(
    earlier: bytes | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep into the directory of an earlier one, refused when Hydra composes its first job (an option
    that does not exist): Hydra had written its `multirun.yaml` over the earlier sweep's, which was lost
    (or left one where there was none). The directory is as it was; the earlier jobs are untouched."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    sweep_dir = tmp_path / "sweep"
    (sweep_dir / "seed=1-0123abcd").mkdir(parents=True)
    (sweep_dir / "seed=1-0123abcd" / "manifest.json").write_text('{"status": "finished"}')
    if earlier is not None:
        (sweep_dir / "multirun.yaml").write_bytes(earlier)
    before = files_under(sweep_dir)
    with pytest.raises(SystemExit):
        command_here(monkeypatch, "train", "-m", "experiment=nosuch,synthetic_pe", "seed=1,2",
                     "data=synthetic", f"hydra.sweep.dir={sweep_dir}")  # fmt: skip
    assert files_under(sweep_dir) == before


# Where `attnlab-train -m` is killed (SIGKILL): right after Hydra's basic sweeper wrote the sweep's
# multirun.yaml, as it goes on to check that the first jobs compose (on `Sweeper`, its base class: Hydra
# loads its plugin modules afresh, so a change to `BasicSweeper` made before would not be seen); or as the
# first job starts, in the task function
KILLS = {
    "after_hydras_record": "import hydra.plugins.sweeper as at\nat.Sweeper.validate_batch_is_legal = kill",
    "as_a_job_starts": "import attnlab.cli.train as at\nat.check_launcher = kill",
}


def killed_sweep(tmp_path: Path, sweep_dir: Path, where: str) -> None:
    """`attnlab-train -m seed=1,2 data=synthetic hydra.sweep.dir=<sweep_dir>`, killed at `where` (`KILLS`)."""
    code = f"import os, signal\nkill = lambda *args: os.kill(os.getpid(), signal.SIGKILL)\n{KILLS[where]}\n"
    code += "from attnlab.cli.train import main\nmain()\n"
    command = [sys.executable, "-c", code, "-m", "seed=1,2", "data=synthetic", f"hydra.sweep.dir={sweep_dir}",
               "hydra/job_logging=none", "hydra/hydra_logging=none"]  # fmt: skip
    env = {**os.environ, "ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "PYTHONPATH": subprocess_path()}
    killed = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert killed.returncode == -9, killed.stderr
    assert "seed=1,2" in (sweep_dir / "multirun.yaml").read_text()  # (the killed sweep's record)


def earlier_sweep(sweep_dir: Path, record: bytes | None) -> dict[str, bytes]:
    """An earlier sweep's directory: a finished job, `record` as its multirun.yaml (None: none); its files."""
    (sweep_dir / "seed=1-0123abcd").mkdir(parents=True)
    (sweep_dir / "seed=1-0123abcd" / "manifest.json").write_text('{"status": "finished"}')
    if record is not None:
        (sweep_dir / "multirun.yaml").write_bytes(record)
    return files_under(sweep_dir)


def refused_sweep(monkeypatch: pytest.MonkeyPatch, sweep_dir: Path) -> None:
    """A multirun into `sweep_dir` refused as Hydra composes its first job (an option that does not exist)."""
    with pytest.raises(SystemExit):
        command_here(monkeypatch, "train", "-m", "experiment=nosuch,synthetic_pe", "data=synthetic",
                     f"hydra.sweep.dir={sweep_dir}")  # fmt: skip


@pytest.mark.parametrize("earlier", [b"# the earlier sweep's record\nhydra: {}\n", None])
def test_a_sweep_killed_before_its_first_job_has_the_earlier_multirun_yaml_put_back_by_the_next(
    earlier: bytes | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep into the directory of an earlier one killed between Hydra's write of its `multirun.yaml` (over
    the earlier sweep's) and the command's end, before any job: its copy of the earlier record is left on
    disk, and the next multirun there (refused here, so that nothing writes over the record again) puts it
    back; the directory is then as it was before the killed sweep."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    sweep_dir = tmp_path / "sweep"
    before = earlier_sweep(sweep_dir, earlier)
    killed_sweep(tmp_path, sweep_dir, "after_hydras_record")
    refused_sweep(monkeypatch, sweep_dir)
    assert files_under(sweep_dir) == before


def test_a_sweep_killed_once_a_job_started_keeps_its_own_multirun_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep into the directory of an earlier one killed as its first job starts: Hydra's `multirun.yaml`
    describes the job directory the sweep made, so the earlier sweep's record is not put back (its copy went
    when the job started), by the next multirun there either."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    sweep_dir = tmp_path / "sweep"
    earlier_sweep(sweep_dir, b"# the earlier sweep's record\n")
    killed_sweep(tmp_path, sweep_dir, "as_a_job_starts")
    assert not list(sweep_dir.glob(".multirun.yaml.*"))
    refused_sweep(monkeypatch, sweep_dir)
    assert "seed=1,2" in (sweep_dir / "multirun.yaml").read_text()


def test_a_kept_sweep_record_of_a_live_process_or_another_host_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The next multirun into a sweep directory leaves a copy of an earlier `multirun.yaml` kept by a
    process that lives (a sweep starting there now), and one kept on another host, whose process cannot be
    seen: it names that one in a warning, with the command that puts the record back."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / "multirun.yaml").write_text("# the record of a sweep starting now\n")
    live = sweep_dir / f".multirun.yaml.kept-{os.getppid()}-{socket.gethostname()}"
    elsewhere = sweep_dir / ".multirun.yaml.kept-12-elsewhere"
    for kept in (live, elsewhere):
        kept.write_text("# the earlier sweep's record\n")
    before = files_under(sweep_dir)
    refused_sweep(monkeypatch, sweep_dir)
    assert files_under(sweep_dir) == before
    assert f"`mv {elsewhere} {sweep_dir / 'multirun.yaml'}` puts the record back" in caplog.text


def test_a_sweep_refused_after_a_job_ran_keeps_its_own_multirun_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep of batches of one job (`hydra.sweeper.max_batch_size=1`) refused at its second job's
    composition, after its first job ran (here skipped as finished, `sweep.skip_done=true`): its
    `multirun.yaml` describes the job it ran, so the earlier sweep's is not put back."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    sweep_dir, job = tmp_path / "sweep", tmp_path / "sweep" / "earlier-job"
    job.mkdir(parents=True)
    manifest = {"status": "finished", "overrides": ["experiment=synthetic_pe", "data=synthetic"]}
    (job / "manifest.json").write_text(json.dumps(manifest))
    (job / "results.json").write_text('{"metrics": {}}')
    (sweep_dir / "multirun.yaml").write_text("# the earlier sweep's record\n")
    with pytest.raises(SystemExit):
        command_here(monkeypatch, "train", "-m", "experiment=synthetic_pe,nosuch", "data=synthetic",
                     "sweep.skip_done=true", "hydra.sweeper.max_batch_size=1",
                     f"hydra.sweep.dir={sweep_dir}")  # fmt: skip
    assert "experiment=synthetic_pe,nosuch" in (sweep_dir / "multirun.yaml").read_text()


@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
def test_a_sweep_whose_first_job_is_refused_as_it_starts_leaves_no_sweep_directory(
    existing: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep of two-process jobs under Hydra's basic launcher is refused by its first job, after Hydra
    made that job's directory and wrote its `.hydra/` record there: the sweep directory was left holding
    `multirun.yaml` and that record. It is removed; an existing sweep directory is left as it was (its
    earlier job and multirun.yaml), without the refused job's directory."""
    sweep_dir = tmp_path / "sweeps" / "s"
    earlier = {}
    if existing:
        earlier = {"multirun.yaml": "# earlier\n", "earlier/manifest.json": '{"status": "finished"}\n'}
        for name, text in earlier.items():
            (sweep_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (sweep_dir / name).write_text(text)
    with pytest.raises(SystemExit, match="Hydra's basic launcher cannot start: add hydra/launcher=local"):
        command_here(monkeypatch, "train", "-m", "trainer=ddp_cpu", "seed=1,2", "data=synthetic",
                     f"hydra.sweep.dir={sweep_dir}")  # fmt: skip
    if not existing:
        assert list(tmp_path.iterdir()) == []
        return
    files = {str(p.relative_to(sweep_dir)): p.read_text() for p in sweep_dir.rglob("*") if p.is_file()}
    assert files == earlier and sorted(p.name for p in sweep_dir.iterdir()) == ["earlier", "multirun.yaml"]
