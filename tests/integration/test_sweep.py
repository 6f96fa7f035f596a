"""Hydra multiruns through the CLI: collision-free job directories, failures isolated, resumable sweeps."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from attnlab.cli.app import job_dirname
from attnlab.cli.compare import report


def sweep(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "attnlab.cli.train", "-m", "data=synthetic", "model=tiny", "data.n_train=64",
        "data.n_val=16", "data.n_test=16", "trainer.max_epochs=1", "logger=csv", "model.n_heads=4,3",
        "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}", "trainer.enable_progress_bar=false", *extra,
    ]  # fmt: skip
    env = {**os.environ, "ATTNLAB_LOG_DIR": str(tmp_path / "logs")}
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)


def test_a_sweep_runs_every_job_records_failures_and_resumes_without_redoing_finished_jobs(
    tmp_path: Path,
) -> None:
    first = sweep(tmp_path)
    assert first.returncode == 1, first.stderr[-3000:]  # every job ran; two failed, so the sweep did
    assert "attnlab-train: multirun: 2 finished, 2 failed (see " in first.stderr.strip().splitlines()[-1]
    jobs = {p.name: p for p in (tmp_path / "sweep").iterdir() if p.is_dir()}
    assert len(jobs) == 4  # 2 heads x 2 seeds, one directory each
    manifests = {name: json.loads((p / "manifest.json").read_text()) for name, p in jobs.items()}
    failed = sorted(n for n, m in manifests.items() if m["status"] == "failed")
    finished = sorted(n for n, m in manifests.items() if m["status"] == "finished")
    assert len(failed) == 2 and len(finished) == 2
    assert all("n_heads=3" in n for n in failed) and all("n_heads=4" in n for n in finished)
    assert all("n_heads=3 does not divide" in manifests[n]["error"] for n in failed)
    for name, manifest in manifests.items():  # each job's own overrides, failed or not, to re-run it alone
        heads, seed = ("3" if name in failed else "4"), name.split("seed=")[1].split(",")[0]
        own = {"data=synthetic", f"model.n_heads={heads}", f"seed={seed}"}
        assert own <= set(manifest["overrides"]), name
    assert all((jobs[n] / "results.json").is_file() for n in finished)
    stamps = {n: (jobs[n] / "results.json").stat().st_mtime_ns for n in finished}

    damaged = jobs[finished[0]] / "results.json"  # a finished job whose results hold no metrics object
    kept = damaged.read_bytes()
    damaged.write_text(json.dumps({**json.loads(kept), "metrics": [1.0]}))
    stamps[finished[0]] = damaged.stat().st_mtime_ns

    second = sweep(tmp_path, "sweep.skip_done=true")
    assert second.returncode == 1, second.stderr[-3000:]  # the n_heads=3 jobs fail again
    assert second.stdout.count("already finished (sweep.skip_done=true): skipped") == 1
    told = (
        f"job {finished[0]} not skipped: cannot read {damaged}: its 'metrics' is a JSON array, not an object"
    )
    assert told in second.stdout + second.stderr  # (Hydra's job log: standard output)
    assert "multirun: 1 finished, 3 failed" in second.stderr  # neither skipped nor run again: the others ran
    assert {p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()} == set(jobs)  # the same directories
    assert {n: (jobs[n] / "results.json").stat().st_mtime_ns for n in finished} == stamps
    damaged.write_bytes(kept)

    # attnlab-compare reads the sweep back: the two seeds as one group, the failed jobs listed.
    text = report([tmp_path / "sweep"])
    assert "| all | 2 |" in text and text.count("(failed: ConfigError: model.n_heads=3") == 2


def test_job_directory_names_are_readable_safe_and_unique() -> None:
    name = job_dirname(["model.pe=learned", "seed=2"])
    assert name == "pe=learned,seed=2-" + hashlib.sha256(b"model.pe=learned,seed=2").hexdigest()[:8]
    assert job_dirname(["seed=2", "model.pe=learned"]) == name  # (as Hydra's override_dirname named it)
    assert job_dirname(["model.pe=learned", "seed=3"]) != name
    assert "/" not in job_dirname(["data.root=/data/x y", "seed=1"])
    long = job_dirname(["x=" + "a" * 300])
    assert len(long) <= 169 and job_dirname(["x=" + "a" * 301]) != long


def test_a_sweep_rerun_with_another_logger_finds_its_jobs_directories_named_before_or_now(
    tmp_path: Path,
) -> None:
    """Job directories were named with the bookkeeping overrides too (`logger=csv`): the same sweep re-run
    with another logger found none of them, so `sweep.skip_done` skipped nothing and every job trained
    again. They are named without them now; a directory named the old way is found by the overrides its
    manifest.json records (a finished one first), so no earlier sweep is orphaned. A sweep over a
    bookkeeping key, whose jobs would share a directory, is refused."""
    from omegaconf import DictConfig, OmegaConf

    from attnlab.cli.app import check_no_swept_bookkeeping
    from attnlab.typed import ConfigError
    from helpers import compose_train

    sweep_dir = tmp_path / "sweep"
    own = ["model.pe=learned", "seed=2"]

    def job_dir(*overrides: str) -> str:  # as Hydra names the job of these overrides (conf/hydra)
        cfg = compose_train([*own, *overrides, f"hydra.sweep.dir={sweep_dir}"], tmp_path, hydra_node=True)
        return str(OmegaConf.select(cfg, "hydra.sweep.subdir"))

    new = job_dir("logger=csv")
    assert "logger" not in new and job_dir("logger=tensorboard", "sweep.skip_done=true") == new
    old = "enable_progress_bar=false,logger=csv,pe=learned,seed=2-0123abcd"  # as a sweep made before named it
    task = ["trainer.enable_progress_bar=false", *own, "logger=csv", "sweep.skip_done=true"]
    for name, status in ((old, "finished"), ("logger=mlflow-4567cdef", "failed")):
        (sweep_dir / name).mkdir(parents=True)
        (sweep_dir / name / "manifest.json").write_text(json.dumps({"status": status, "overrides": task}))
    assert job_dir("logger=tensorboard") == old  # sweep.skip_done skips it, resume=auto continues it
    assert job_dir("logger=csv", "model.n_heads=4") != old  # another job
    (sweep_dir / new).mkdir()
    assert job_dir("logger=csv") == new  # a directory of the name itself comes first

    def task(*overrides: str) -> DictConfig:  # a multirun's config, its command line alone
        return OmegaConf.create({"hydra": {"overrides": {"task": list(overrides)}}})

    check_no_swept_bookkeeping(task("model.pe=learned,none", "seed=1,2", "logger=csv"))
    with pytest.raises(ConfigError, match=r"allocator=keep,release \(in the command line\) sweeps a bookk"):
        check_no_swept_bookkeeping(task("allocator=keep,release", "seed=1,2"))


def test_a_job_directory_with_an_unreadable_manifest_hides_no_other_job_of_the_sweep(tmp_path: Path) -> None:
    """A re-run sweep looks through its job directories' manifest.json files for the one a job of the same
    setting wrote: a directory whose manifest cannot be read (cut short, no JSON object) is passed over,
    the job named the old way is still found, and a new job is named as without them."""
    sweep_dir = tmp_path / "sweep"
    old = "logger=csv,pe=learned,seed=2-0123abcd"  # as a sweep made before named it
    task = ["model.pe=learned", "seed=2", "logger=csv"]
    for name, text in (("a-cut-short", '{"status": "finished", "overr'), ("b-no-object", "[1]"),
                       (old, json.dumps({"status": "finished", "overrides": task}))):  # fmt: skip
        (sweep_dir / name).mkdir(parents=True)
        (sweep_dir / name / "manifest.json").write_text(text)
    assert job_dirname(["model.pe=learned", "seed=2", "logger=tensorboard"], str(sweep_dir)) == old
    assert job_dirname(["model.pe=none", "seed=2"], str(sweep_dir)) == job_dirname(
        ["model.pe=none", "seed=2"]
    )


def test_a_sweep_an_experiment_file_declares_over_a_bookkeeping_key_is_refused(tmp_path: Path) -> None:
    """An experiment file (or `hparams_search`) declares its sweep in `hydra.sweeper.params`, which both
    Hydra's basic sweeper and Optuna's read (or Optuna's deprecated `search_space`): a bookkeeping key
    swept there was not refused (only the command line's overrides were checked), and its jobs shared one
    directory."""
    from attnlab.cli.app import check_no_swept_bookkeeping
    from attnlab.typed import ConfigError
    from helpers import compose_train

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    declared = {"seed": "1,2", "model.pe": "learned,none"}
    for name, params in (("ok", declared), ("bad", {**declared, "allocator": "keep,release"})):
        text = "".join(f"      {key}: {value}\n" for key, value in params.items())
        (tmp_path / "conf" / "experiment" / f"{name}.yaml").write_text(
            f"# @package _global_\nhydra:\n  sweeper:\n    params:\n{text}"
        )
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    check_no_swept_bookkeeping(compose_train([search, "experiment=ok"], tmp_path, hydra_node=True))
    told = r"allocator=keep,release \(in hydra.sweeper.params\) sweeps a bookkeeping key"
    with pytest.raises(ConfigError, match=told):
        check_no_swept_bookkeeping(compose_train([search, "experiment=bad"], tmp_path, hydra_node=True))
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="needs the [sweep] extra")
    check_no_swept_bookkeeping(compose_train(["hparams_search=optuna"], tmp_path, hydra_node=True))
    optuna = ["hparams_search=optuna", "+hydra.sweeper.params.logger='choice(csv, tensorboard)'"]
    with pytest.raises(ConfigError, match=r"logger=choice\(csv, tensorboard\) \(in hydra.sweeper.params"):
        check_no_swept_bookkeeping(compose_train(optuna, tmp_path, hydra_node=True))
    # Optuna's deprecated search_space, which its sweeper reads when params is null: checked the same way
    for name, key in (("space_ok", "model.dropout"), ("space_bad", "allocator")):
        (tmp_path / "conf" / "experiment" / f"{name}.yaml").write_text(
            "# @package _global_\nhydra:\n  sweeper:\n    search_space:\n"
            f"      {key}:\n        type: categorical\n        choices: [a, b]\n"
        )
    space = ["hparams_search=optuna", search, "hydra.sweeper.params=null"]
    check_no_swept_bookkeeping(compose_train([*space, "experiment=space_ok"], tmp_path, hydra_node=True))
    told = r"allocator={type: categorical, choices: \[a, b\]} \(in hydra.sweeper.search_space\) sweeps a"
    with pytest.raises(ConfigError, match=told):
        check_no_swept_bookkeeping(compose_train([*space, "experiment=space_bad"], tmp_path, hydra_node=True))


def test_an_optuna_search_space_entry_of_one_value_over_a_bookkeeping_key_is_no_sweep() -> None:
    """Every entry of Optuna's `search_space` counted as sweeping: one over a bookkeeping key was refused
    though it can take one value only (a categorical of one choice, a range with low == high or a step
    beyond high), and its jobs would not differ. An entry of several values is still refused."""
    from omegaconf import DictConfig, OmegaConf

    from attnlab.cli.app import check_no_swept_bookkeeping
    from attnlab.typed import ConfigError

    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="needs the [sweep] extra")

    def space(**entries: dict) -> DictConfig:  # a multirun's config: the search space alone
        sweeper = {"params": None, "search_space": entries}
        return OmegaConf.create({"hydra": {"sweeper": sweeper, "overrides": {"task": []}}})

    def dist(kind: str, low: float, high: float, **more: object) -> dict:
        return {"type": kind, "low": low, "high": high, **more}

    single = {
        "allocator": {"type": "categorical", "choices": ["keep"]},
        "progress.every_n_steps": dist("int", 50, 50),
        "callbacks.last_checkpoint.every_n_train_steps": dist("int", 100, 150, step=100),
        "callbacks.last_checkpoint.every_n_minutes": dist("float", 30.0, 30.0, log=True),
    }
    check_no_swept_bookkeeping(space(**single, **{"model.dropout": dist("float", 0.0, 0.3)}))
    told = r"progress.every_n_steps={type: int, low: 50, high: 60} \(in hydra.sweeper.search_space\) sweeps"
    with pytest.raises(ConfigError, match=told):
        check_no_swept_bookkeeping(space(**{**single, "progress.every_n_steps": dist("int", 50, 60)}))


def test_a_one_value_sweep_of_a_bookkeeping_key_is_no_sweep_wherever_it_is_given() -> None:
    """`attnlab-train -m allocator=choice(keep)` was refused as sweeping a bookkeeping key, while Optuna's
    `search_space` entry of one choice of the same key was accepted: both give every job that one value,
    as `allocator=keep` does, so no two jobs share a directory for it (README, Sweeps: one value sweeps
    nothing). Both are accepted, on the command line and in `hydra.sweeper.params`, as are a list, range or
    interval of one value; two values are refused on either path, and so is a glob of config options."""
    from omegaconf import DictConfig, OmegaConf

    from attnlab.cli.app import check_no_swept_bookkeeping
    from attnlab.typed import ConfigError

    def sweep(*task: str, params: dict | None = None, space: dict | None = None) -> DictConfig:
        sweeper = {"params": params, "search_space": space}
        return OmegaConf.create({"hydra": {"sweeper": sweeper, "overrides": {"task": ["seed=1,2", *task]}}})

    one = ["allocator=choice(keep)", "allocator=keep,keep", "progress.every_n_steps=range(50,51)",
           "progress.every_n_steps=interval(50,50)"]  # fmt: skip
    for line in one:
        check_no_swept_bookkeeping(sweep(line))
        key, _, value = line.partition("=")
        check_no_swept_bookkeeping(sweep(params={key: value}))
    for line in ("allocator=choice(keep,release)", "progress.every_n_steps=range(50,52)",
                 "progress.every_n_steps=interval(50,60)", "logger=glob(*)"):  # fmt: skip
        with pytest.raises(ConfigError, match=rf"{re.escape(line)} \(in the command line\) sweeps a"):
            check_no_swept_bookkeeping(sweep(line))
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="needs the [sweep] extra")
    check_no_swept_bookkeeping(sweep(space={"allocator": {"type": "categorical", "choices": ["keep"]}}))
    with pytest.raises(ConfigError, match=r"\(in hydra.sweeper.search_space\) sweeps a bookkeeping key"):
        check_no_swept_bookkeeping(sweep(space={"allocator": {"type": "categorical", "choices": ["a", "b"]}}))


def test_a_sweep_of_a_range_or_interval_its_sweeper_cannot_run_is_refused_before_any_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range of step 0, an interval under Hydra's basic sweeper, a descending range or interval under
    Optuna's, or `hydra.sweeper.n_trials=0` failed with a traceback once the sweep had started (the step
    of 0 also switched off the other up-front checks: Hydra turns a callback's error into a warning); an
    empty range (`seed=range(5,1)`) ran no job and said nothing. Each is refused naming the fix."""
    from omegaconf import OmegaConf

    from attnlab.cli.app import check_sweep_values
    from attnlab.typed import ConfigError
    from helpers import command_here

    def check(sweeper: str, *task: str, params: dict | None = None, n_trials: int = 20) -> None:
        node = {
            "_target_": f"hydra_plugins.attnlab_launchers.{sweeper}",
            "params": params,
            "n_trials": n_trials,
        }
        check_sweep_values(OmegaConf.create({"hydra": {"sweeper": node, "overrides": {"task": list(task)}}}))

    for sweeper, line, told in (
        ("BasicSweeper", "seed=range(1,5,0)", "has a step of 0"),
        ("OptunaSweeper", "seed=range(1,5,0)", "has a step of 0"),
        ("BasicSweeper", "model.dropout=interval(0.1,0.3)", "is an interval, which Hydra's basic sweeper"),
        ("OptunaSweeper", "model.dropout=interval(0.3,0.1)", r"starts above its end: give interval\(0.1,0.3"),
        ("OptunaSweeper", "seed=range(3,1,-1)", r"counts down, .*: give range\(1,3\)"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=rf"^{re.escape(line)} \(in the command line\) {told}"):
            check(sweeper, "model.pe=learned,none", line)
        key, _, value = line.partition("=")
        with pytest.raises(ConfigError, match=r"\(in hydra.sweeper.params\)"):
            check(sweeper, params={key: value})
    check("BasicSweeper", "seed=range(3,1,-1)", "model.d_ff=shuffle(range(1,3))", "model.pe=learned,none")
    check(
        "OptunaSweeper",
        "model.dropout=interval(0.1,0.1)",
        "model.d_ff=shuffle(range(3,1,-1))",
        "seed=range(1,3)",
    )
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.n_trials=0 runs no trial: give 1 or more$"):
        check("OptunaSweeper", n_trials=0)
    sweep_dir = tmp_path / "sweep"
    with pytest.raises(SystemExit, match=r"config error: seed=range\(5,1\) \(in the command line\) gives no"):
        command_here(
            monkeypatch, "train", "-m", "data=synthetic", "seed=range(5,1)", f"hydra.sweep.dir={sweep_dir}"
        )
    assert not sweep_dir.exists()


def test_swept_values_dropped_a_batch_of_no_job_or_an_empty_sweep_directory_are_refused_before_any_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`seed=1,2 seed=3` swept seed 3 alone (both sweepers take a key's last override), dropping the swept
    values unsaid; `hydra.sweeper.max_batch_size=0` ended with Hydra's AssertionError; an empty
    `hydra.sweep.dir` (or `hydra.run.dir`) wrote the jobs (the run) into the current directory. Each is
    refused naming the fix; a single value given again is overridden, as in a single run."""
    from omegaconf import OmegaConf

    from attnlab.cli.app import check_sweep_values
    from attnlab.typed import ConfigError
    from helpers import command_here

    def check(*task: str, batch: int | None = None) -> None:
        node = {
            "_target_": "hydra_plugins.attnlab_launchers.BasicSweeper",
            "params": None,
            "max_batch_size": batch,
        }
        check_sweep_values(OmegaConf.create({"hydra": {"sweeper": node, "overrides": {"task": list(task)}}}))

    told = (
        r"^seed is given twice on the command line \(seed=1,2, \+seed=3\): the sweeper takes the last alone"
    )
    with pytest.raises(ConfigError, match=told):
        check("seed=1,2", "model.pe=learned,none", "+seed=3")
    check("seed=1", "model.pe=learned,none", "seed=2", "data.n_train=16", "data.n_train=8", batch=1)
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.max_batch_size=0 launches no job: give 1 or more"):
        check("seed=1,2", batch=0)
    monkeypatch.chdir(tmp_path)
    told = r"^attnlab-train: config error: {} is empty, which is the current directory"
    for task, key in (
        ("-m", "hydra.sweep.dir"),
        ("data.n_val=8", "hydra.run.dir"),
    ):  # (n_train=0: no job runs)
        with pytest.raises(SystemExit, match=told.format(key)):
            command_here(
                monkeypatch,
                "train",
                task,
                "data=synthetic",
                "data.n_train=0",
                "seed=1,2" if task == "-m" else "seed=1",
                f"{key}=",
            )
    assert list(tmp_path.iterdir()) == []


def test_a_declared_sweep_entry_hydra_cannot_read_is_refused_naming_it_before_any_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry of `hydra.sweeper.params` that Hydra's override grammar cannot read (`model.pe: learned,`,
    a mapping, an unclosed quote) raised Hydra's parse error inside the up-front checks, which Hydra turns
    into a warning: the checks after it were skipped, and the sweeper then failed with the grammar's error,
    not naming the entry. It is refused in one line naming the entry, where it is given, why (for a
    character the grammar does not allow, which one) and the forms a sweep takes."""
    from attnlab.cli.app import check_no_swept_bookkeeping
    from attnlab.typed import ConfigError
    from helpers import command_here, compose_train

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    for name, entry in (("comma", "learned,"), ("mapping", "{a: 1}"), ("quote", "learned'")):
        (tmp_path / "conf" / "experiment" / f"{name}.yaml").write_text(
            f"# @package _global_\nhydra:\n  sweeper:\n    params:\n      model.pe: {entry}\n"
        )
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    told = (
        r"model.pe={} \(in hydra.sweeper.params\) is not an override Hydra's sweeper can read: .*: give its"
    )
    with pytest.raises(ConfigError, match="^" + told.format(re.escape("{'a': 1}"))):
        check_no_swept_bookkeeping(compose_train([search, "experiment=mapping"], tmp_path, hydra_node=True))
    stopped = told.format("learned'").replace(".*", '"\'" at character 17 is not allowed there')
    with pytest.raises(ConfigError, match="^" + stopped):  # (where the grammar's lexer stopped)
        check_no_swept_bookkeeping(compose_train([search, "experiment=quote"], tmp_path, hydra_node=True))
    sweep_dir = tmp_path / "sweep"
    with pytest.raises(SystemExit, match="^attnlab-train: config error: " + told.format("learned,")):
        command_here(monkeypatch, "train", "-m", search, "experiment=comma", "data=synthetic",
                     f"hydra.sweep.dir={sweep_dir}")  # fmt: skip
    assert not sweep_dir.exists()


def test_a_declared_sweep_over_a_bookkeeping_key_fixed_on_the_command_line_is_not_refused(
    tmp_path: Path,
) -> None:
    """The refusal's advice, one sweep per value (`allocator=keep` on the command line over an experiment
    file's `allocator: keep,release`), works: both sweepers take the command line's value of a key the
    config also declares, so its jobs sweep it no more. It was refused as the declared sweep."""
    from attnlab.cli.app import check_no_swept_bookkeeping
    from attnlab.typed import ConfigError
    from helpers import compose_train

    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "bad.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      allocator: keep,release\n"
    )
    bad = [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "experiment=bad"]
    fixed = compose_train([*bad, "allocator=keep"], tmp_path, hydra_node=True)
    check_no_swept_bookkeeping(fixed)
    fixed.hydra.overrides.task[-1] = "allocator=release,keep"  # (the command line sweeps it again)
    with pytest.raises(ConfigError, match=r"allocator=release,keep \(in the command line\) sweeps a"):
        check_no_swept_bookkeeping(fixed)


def test_a_job_listed_twice_runs_once_and_the_repeat_is_named(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Hydra's basic sweeper launches a value listed twice (`seed=1,1`) as two jobs of one job directory:
    the second was refused there as holding the first one's finished run, failing the sweep (or, under
    hydra/launcher=local, raced it). It is not launched, a log line naming it, and gets the first's result.
    The summary counts this multirun's jobs alone."""
    from hydra.core.global_hydra import GlobalHydra

    from attnlab.cli.train import main
    from attnlab.training import launchers

    # An earlier multirun of this process (a notebook's): its jobs are not this one's to count.
    monkeypatch.setattr(launchers, "JOBS", [("failed", tmp_path / "earlier")])
    monkeypatch.setattr(sys, "argv", [
        "attnlab-train", "-m", "data=synthetic", "model=tiny", "data.n_train=32", "data.n_val=8",
        "data.n_test=8", "trainer.max_epochs=1", "logger=csv", "trainer.enable_progress_bar=false",
        "seed=1,1", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra/job_logging=none",
        "hydra/hydra_logging=none",
    ])  # fmt: skip
    GlobalHydra.instance().clear()
    try:
        with caplog.at_level("INFO", logger="attnlab.training.launchers"):
            main()
    finally:
        GlobalHydra.instance().clear()
    out = capsys.readouterr().out
    assert out.count("attnlab-train: test/") == 1 and "attnlab-train: multirun: 1 finished, 0 failed" in out
    told = "seed=1 repeats an earlier job of this sweep (the same setting and seed): not run again"
    assert caplog.text.count(told) == 1
    assert len([p for p in (tmp_path / "sweep").iterdir() if p.is_dir()]) == 1


def test_a_single_run_prints_no_multirun_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary line is a multirun's: a single run (here one skipped as finished) prints none, even
    after a multirun of this process (a notebook's) whose jobs it would otherwise count."""
    from attnlab.training import launchers
    from helpers import command_here

    monkeypatch.setattr(launchers, "JOBS", [("finished", tmp_path / "earlier")])
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"status": "finished"}))
    (run / "results.json").write_text(json.dumps({"sets": {}, "metrics": {"val/loss": 1.5}}))
    command_here(
        monkeypatch, "train", "data=synthetic", "model=tiny", "sweep.skip_done=true", f"hydra.run.dir={run}"
    )
    out = capsys.readouterr().out
    assert out == f"attnlab-train: {run} already finished (sweep.skip_done=true): skipped\n"


def test_skip_done_trains_nothing_over_a_finished_run_and_gives_its_recorded_metric(
    resume_reference: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`attnlab-train sweep.skip_done=true` in the directory of a finished run (a copy of a real one) trains
    nothing: every file of the run stays as it was (checkpoints, results, manifest, no new Hydra record),
    and the command gives its recorded `optimized_metric` (what a sweep's job returns to the sweeper)."""
    from attnlab.cli.train import _main
    from helpers import command_here, compose_train
    from runs import IN_PROCESS, RUN

    run = tmp_path / "run"
    shutil.copytree(resume_reference, run)
    kept = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    recorded = json.loads((run / "results.json").read_text())["metrics"]["val/loss"]
    command_here(monkeypatch, "train", *RUN, "sweep.skip_done=true", f"hydra.run.dir={run}")
    skipped = f"attnlab-train: {run} already finished (sweep.skip_done=true): skipped\n"
    assert capsys.readouterr().out == skipped
    assert _main(compose_train([*IN_PROCESS, "sweep.skip_done=true"], run)) == recorded  # the task's return
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == kept


def test_a_skipped_finished_job_gives_the_sweeper_its_saved_metric_and_a_missing_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`sweep.skip_done`: a finished job's results.json metrics are what it gives the sweeper, recorded as
    finished; a metric a job lacks gives None, and in a multirun an error naming the metrics it has (or
    none); a single run's value goes nowhere, said nothing of."""
    from attnlab.cli.train import _skip_done, _sweeper_value
    from attnlab.runs.layout import RunDir
    from attnlab.training import launchers

    monkeypatch.setattr(launchers, "JOBS", [])
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.manifest_file.write_text(json.dumps({"status": "finished"}))
    metrics = {"val/loss": 1.5, "best/val/loss": 1.25}
    run.results_file.write_text(json.dumps({"sets": {}, "metrics": metrics}))
    skipped = _skip_done(run, multirun=True, continues=False)
    recorded = launchers.JOBS
    assert skipped == metrics and recorded == [("finished", run.manifest_file)]
    assert _sweeper_value(skipped, "best/val/loss", True) == 1.25
    with caplog.at_level("ERROR", logger="attnlab.cli.train"):
        assert _sweeper_value(skipped, "val/bleu", False) is None  # a single run: no sweeper to tell
        assert caplog.messages == []
        assert _sweeper_value(skipped, "val/bleu", True) is None
        assert _sweeper_value({}, "val/bleu", True) is None
    missing = ("optimized_metric=val/bleu is not among this run's final metrics ({}): nothing to return to "
               "the sweeper; set optimized_metric to one of them")  # fmt: skip
    assert caplog.messages == [missing.format("best/val/loss, val/loss"), missing.format("none")]


def test_a_job_not_run_over_a_held_run_names_the_fix_for_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A multirun job whose directory holds a run is recorded as failed, its log line naming the fix:
    `sweep.skip_done=true` for a finished run, `resume=auto` for an unfinished one with a last.ckpt, nothing
    more for one without (nothing to continue); a free directory runs."""
    from attnlab.cli.train import _held_run
    from attnlab.runs.layout import RunDir
    from attnlab.training import launchers

    monkeypatch.setattr(launchers, "JOBS", [])
    held = {"finished": ("finished", []), "unfinished": ("interrupted", ["last.ckpt", "epoch001.ckpt"]),
            "without_last": ("interrupted", ["epoch001.ckpt"])}  # fmt: skip
    runs = {name: RunDir(tmp_path / name) for name in [*held, "free"]}
    for name, (status, checkpoints) in held.items():
        runs[name].checkpoints_dir.mkdir(parents=True)
        runs[name].manifest_file.write_text(json.dumps({"status": status}))
        for checkpoint in checkpoints:
            (runs[name].checkpoints_dir / checkpoint).write_bytes(b"")
    runs["free"].path.mkdir()
    with caplog.at_level("ERROR", logger="attnlab.cli.train"):
        assert [_held_run(run, skip_finished=False) for run in runs.values()] == [True, True, True, False]
    recorded = launchers.JOBS
    assert recorded == [("failed", runs[name].manifest_file) for name in held]
    ends = [message.rsplit("remove this one first", 1)[1] for message in caplog.messages]
    assert ends == [
        ". Add sweep.skip_done=true to the sweep's command to skip its finished jobs, or give the sweep "
        "another hydra.sweep.dir to train them again",
        ". Add resume=auto to the sweep's command to continue its unfinished jobs",
        "",
    ]
    assert all(
        m.startswith(f"job {name} not run: the run directory ")
        for m, name in zip(caplog.messages, held, strict=True)
    )


def test_the_tasks_of_a_local_submitit_job_agree_on_its_master_port_and_other_jobs_get_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under submitit's local executor, each task of a job is told its rank and the job's master port, the
    same in every task (they rendezvous there), another for the next job (two jobs running at once must
    not share one), an unprivileged port."""
    from attnlab.cli.train import submitit_ranks

    told = {}
    ranks = ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    for job, rank in (("4100", 0), ("4100", 1), ("4101", 0), ("4101", 1)):  # (a local job's id: a pid)
        task = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": job, "SUBMITIT_LOCAL_NTASKS": "2",
                "SUBMITIT_LOCAL_GLOBALID": str(rank), "SUBMITIT_LOCAL_LOCALID": str(rank),
                "SUBMITIT_LOCAL_NODEID": "0"}  # fmt: skip
        with monkeypatch.context() as patch:
            for variable in ranks:  # unset now; what submitit_ranks sets is undone after
                patch.setenv(variable, "")
                patch.delenv(variable)
            for variable, value in task.items():
                patch.setenv(variable, value)
            submitit_ranks()
            told[job, rank] = {variable: os.environ[variable] for variable in ranks}
    tasks = [["0", "0", "0", "2", "127.0.0.1"], ["1", "1", "0", "2", "127.0.0.1"]]  # rank, local, node, ...
    assert [[t[v] for v in ranks[:5]] for t in told.values()] == tasks * 2
    ports = {key: int(t["MASTER_PORT"]) for key, t in told.items()}
    assert ports["4100", 0] == ports["4100", 1] != ports["4101", 0] == ports["4101", 1]
    assert all(1024 <= port < 65536 for port in ports.values())


def test_the_wandb_sweep_file_passes_valid_overrides(tmp_path: Path) -> None:
    import itertools

    import yaml

    from attnlab.training.experiment import validate
    from helpers import compose_train

    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "scripts" / "wandb_sweep.yaml").read_text())
    assert spec["command"] == ["${env}", "attnlab-train", "${args_no_hyphens}"]
    keys = list(spec["parameters"])
    choices = [p["values"] if "values" in p else [p["value"]] for p in spec["parameters"].values()]
    combos = list(itertools.product(*choices))
    assert len(combos) == 9
    for combo in combos:  # what an agent would run: every override composes and validates
        validate(compose_train([f"{k}={v}" for k, v in zip(keys, combo, strict=True)], tmp_path))


def test_a_sweep_of_ddp_jobs_runs_each_job_as_its_own_process_group(tmp_path: Path) -> None:
    """hydra/launcher=local with trainer=ddp_cpu: two jobs, each two ranks; and the basic launcher refuses."""
    import pytest

    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the [sweep] extra")
    common = [
        sys.executable, "-m", "attnlab.cli.train", "-m", "trainer=ddp_cpu", "data=synthetic", "model=tiny",
        "data.batch_size=8", "data.n_train=64", "data.n_val=16", "data.n_test=16", "trainer.max_epochs=1",
        "logger=csv",
        "seed=1,2", "trainer.enable_progress_bar=false",
    ]  # fmt: skip
    env = {**os.environ, "ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "OMP_NUM_THREADS": "1"}
    refused = subprocess.run([*common, f"hydra.sweep.dir={tmp_path / 'basic'}"], capture_output=True,
                             text=True, timeout=600, env=env, cwd=tmp_path)  # fmt: skip
    assert refused.returncode != 0
    assert "which Hydra's basic launcher cannot start: add hydra/launcher=local" in refused.stderr
    assert not list((tmp_path / "basic").glob("*/manifest.json"))  # stopped before any job trained

    done = subprocess.run([*common, "hydra/launcher=local", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = sorted(p for p in (tmp_path / "sweep").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(jobs) == 2
    for job in jobs:
        manifest = json.loads((job / "manifest.json").read_text())
        assert manifest["status"] == "finished"
        assert manifest["effective_batch"]["devices"] == 2  # one job = one process group of two ranks
        assert (job / "results.json").is_file()
        assert sorted(p.name for p in (job / "checkpoints").glob("*.ckpt"))[-1] == "last.ckpt"
    logs = sorted((tmp_path / "sweep" / ".submitit").glob("*/*_log.err"))
    assert len(logs) == 4  # two tasks per job
    # Lightning's messages go to the job's logging (Hydra's console handler, standard output).
    told = [p.read_text() + p.with_name(p.name.replace("_log.err", "_log.out")).read_text() for p in logs]
    assert sum("GLOBAL_RANK: 1, MEMBER: 2/2" in text for text in told) == 2  # rank 1 of each job


@pytest.mark.parametrize(
    ("trainer", "refused"),
    [({}, None), ({"devices": 1, "num_nodes": 1}, None),
     ({"strategy": "ddp", "devices": 2}, "runs 2 processes"),
     ({"strategy": "ddp", "devices": 1, "num_nodes": 2}, "runs 2 processes"),
     ({"strategy": "ddp", "devices": 2, "num_nodes": 3}, "runs 6 processes"),
     ({"strategy": "ddp", "devices": -1}, "runs several processes"),
     ({"strategy": {"_target_": "attnlab.training.strategies.fsdp"}, "devices": "auto"}, "runs several"),
     ({"devices": [0, 1]}, "runs 2 processes"), ({"devices": "0,1"}, "runs 2 processes"),
     ({"devices": [1]}, None), ({"devices": "2", "num_nodes": 2}, "runs 4 processes"),
     ({"accelerator": "cpu", "devices": "auto"}, None), ({"devices": "0,"}, None),
     ({"devices": None}, None), ({"devices": 2.5}, None), ({"devices": 0}, None), ({"devices": "0"}, None),
     ({"accelerator": "cpu", "devices": [0, 1]}, None), ({"accelerator": "cpu", "devices": "0,1"}, None)],
)  # fmt: skip
def test_a_sweep_of_multi_process_jobs_under_the_basic_launcher_is_refused_counting_every_node(
    trainer: dict[str, Any], refused: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hydra's basic launcher runs each job inside this process, where Lightning cannot start its other
    ranks: a job of devices x nodes processes (or an unknown number, under a distributed strategy) is
    refused naming the launcher to use; a launcher that starts each job's processes takes them all. A
    value Lightning refuses (`null`, `2.5`, `0`, device ids on the CPU) is left to the job, whose checks name
    it (another launcher, which the refusal would name, fails it the same). (On a machine with a GPU.)"""
    import torch
    from omegaconf import OmegaConf

    from attnlab.cli.train import check_launcher

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = OmegaConf.create({"trainer": trainer})
    basic = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
    check_launcher(cfg, "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher")
    if refused is None:
        check_launcher(cfg, basic)
        return
    with pytest.raises(SystemExit, match=f"each job of this sweep {refused} .*add hydra/launcher=local"):
        check_launcher(cfg, basic)


@pytest.mark.parametrize(
    "trainer", [{"devices": [0, 1]}, {"devices": "0,1"}, {"devices": -1}, {"devices": -1, "strategy": "ddp"}]
)
def test_device_ids_or_every_gpu_on_a_machine_without_one_are_left_to_the_jobs_check(
    trainer: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trainer.accelerator=auto` (the default) where torch finds no GPU runs on the CPU, as `cpu` does:
    device ids or -1 there (which the job's config check refuses) are no several processes that the basic
    launcher would refuse, advising another launcher, on any number of nodes."""
    import torch
    from omegaconf import OmegaConf

    from attnlab.cli.train import check_launcher

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    basic = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
    check_launcher(OmegaConf.create({"trainer": {**trainer, "num_nodes": 2}}), basic)


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_a_sweep_of_jobs_on_every_gpu_is_refused_under_the_basic_launcher_where_there_are_several(
    gpus: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trainer.devices=-1` (or auto) with Lightning's default strategy: every GPU of the machine, DDP
    over them where there are several (the machine's GPUs as torch counts them); `null` is none of them."""
    import torch
    from omegaconf import OmegaConf

    from attnlab.cli.train import check_launcher

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    basic = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
    for devices in (-1, "auto", "-1"):
        cfg = OmegaConf.create({"trainer": {"accelerator": "gpu", "devices": devices}})
        if gpus < 2:
            check_launcher(cfg, basic)
        else:
            with pytest.raises(SystemExit, match="each job of this sweep runs 2 processes"):
                check_launcher(cfg, basic)
    check_launcher(OmegaConf.create({"trainer": {"accelerator": "gpu", "devices": None}}), basic)


def test_a_run_without_test_sets_writes_its_final_metrics_for_sweeps_and_reports(tmp_path: Path) -> None:
    """A `test=false` run (a search scored on validation) wrote no results.json: `sweep.skip_done` failed
    its finished job as unreadable, and attnlab-compare listed it as unfinished."""
    from attnlab.cli.train import finished_results
    from attnlab.runs.layout import RunDir
    from attnlab.training.pipeline import train
    from helpers import compose_train

    run_dir = tmp_path / "run"
    overrides = ["data=synthetic", "model=tiny", "data.n_train=32", "data.n_val=8", "data.n_test=8",
                 "trainer.max_epochs=1", "logger=csv", "test=false"]  # fmt: skip
    metrics = train(compose_train(overrides, run_dir))
    results = json.loads((run_dir / "results.json").read_text())
    assert results["sets"] == {} and results["metrics"] == metrics and "val/loss" in metrics
    done = finished_results(RunDir(run_dir))
    assert done is not None and done["metrics"]["val/loss"] == metrics["val/loss"]  # skip_done skips it
    text = report([run_dir])
    assert "| all | 1 |" in text and "Not finished" not in text


def test_skip_done_skips_a_run_its_manifest_says_finished_not_one_holding_an_earlier_results_json(
    tmp_path: Path,
) -> None:
    """A finished run resumed for more epochs and stopped keeps the results.json of its first end: only a
    `finished` manifest makes `sweep.skip_done` skip a job, so that one is run (continued with
    resume=auto), not skipped with its earlier results."""
    from attnlab.cli.train import finished_results
    from attnlab.runs.layout import MANIFEST_FILE, RunDir

    run = RunDir(tmp_path / "run")
    run.write_results({"sets": {}, "metrics": {"val/loss": 1.0}})
    for status in ("running", "interrupted", "failed"):
        run.write_files({MANIFEST_FILE: json.dumps({"status": status}).encode()})
        assert finished_results(run) is None, status
    run.write_files({MANIFEST_FILE: json.dumps({"status": "finished"}).encode()})
    done = finished_results(run)
    assert done is not None and done["metrics"] == {"val/loss": 1.0}


def test_a_skip_done_that_is_no_boolean_or_a_misspelt_sweep_key_is_refused_before_any_job(
    tmp_path: Path,
) -> None:
    """`sweep.skip_done=no` (text, so true) skipped the finished jobs of a sweep told not to, and a misspelt
    `+sweep.skip_dne=true` was read as skip_done false: the re-run sweep trained its finished jobs again
    over their results. Both are refused before any job runs, for a sweep and a single run alike."""
    for extra, told in (
        ("sweep.skip_done=no", "sweep.skip_done='no' must be true or false"),
        ("+sweep.skip_dne=true", "sweep.skip_dne is not a sweep setting: did you mean sweep.skip_done?"),
    ):
        done = sweep(tmp_path, extra)
        assert done.returncode == 1, done.stderr[-3000:]
        assert f"attnlab-train: config error: {told}" in done.stderr and "Traceback" not in done.stderr
        assert not (tmp_path / "sweep").exists()
        single = [sys.executable, "-m", "attnlab.cli.train", "data=synthetic", "model=tiny", extra,
                  f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
        done = subprocess.run(single, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 1 and f"attnlab-train: config error: {told}" in done.stderr, done.stderr
        assert not (tmp_path / "run").exists()  # (made by Hydra, then removed with the refusal)


def test_a_sweep_over_a_bookkeeping_key_is_refused_before_any_job(tmp_path: Path) -> None:
    """Job directories are named without bookkeeping overrides: jobs differing only in one would share a
    directory (and count as one setting in W&B and attnlab-compare)."""
    done = sweep(tmp_path, "allocator=keep,release")
    assert done.returncode == 1, done.stderr[-3000:]
    told = (
        "attnlab-train: config error: allocator=keep,release (in the command line) sweeps a bookkeeping key"
    )
    assert told in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "sweep").exists()


def test_skip_done_does_not_train_an_interrupted_job_afresh_over_its_checkpoints(tmp_path: Path) -> None:
    """Re-running an interrupted sweep with `sweep.skip_done=true`, as the README says, skipped the
    finished jobs and trained the interrupted one from scratch in its directory, over its checkpoints
    (hours of a long job's training). That job is recorded as failed, its files untouched, naming
    resume=auto, which then continues it from its last.ckpt. Without `sweep.skip_done`, the re-run trained
    the finished job again too, over its results: it is held as well, naming sweep.skip_done=true."""
    command = [
        sys.executable, "-m", "attnlab.cli.train", "-m", "data=synthetic", "model=tiny", "data.n_train=32",
        "data.n_val=8", "data.n_test=8", "trainer.max_epochs=1", "logger=csv", "seed=1,2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}", "trainer.enable_progress_bar=false", "sweep.skip_done=true",
    ]  # fmt: skip
    env = {**os.environ, "ATTNLAB_LOG_DIR": str(tmp_path / "logs")}
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    job = next(p for p in (tmp_path / "sweep").iterdir() if "seed=2" in p.name)
    manifest = json.loads((job / "manifest.json").read_text())
    (job / "manifest.json").write_text(json.dumps({**manifest, "status": "interrupted"}))  # (as SIGTERM)
    (job / "results.json").unlink()
    logs = {"train.log", "multirun.yaml"}  # the job's log and the sweep's record: every command writes them
    files = [p for p in (tmp_path / "sweep").rglob("*") if p.is_file() and not logs & set(p.parts)]
    kept = {p: p.read_bytes() for p in files}  # the jobs' .hydra/ records too: neither job runs
    assert any(".hydra" in p.parts for p in kept)
    plain = [x for x in command if x != "sweep.skip_done=true"]  # without it, the finished job is held too
    again = subprocess.run(plain, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert again.returncode == 1 and "multirun: 0 finished, 2 failed" in again.stderr, again.stderr[-3000:]
    done = next(p for p in (tmp_path / "sweep").iterdir() if "seed=1" in p.name)
    told = f"job {done.name} not run: the run directory {done} holds a run already (status finished"
    assert told in again.stdout and "Add sweep.skip_done=true to the sweep's command" in again.stdout
    assert {p: p.read_bytes() for p in kept} == kept  # results, checkpoints, manifests: both jobs'
    again = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert again.returncode == 1 and "multirun: 1 finished, 1 failed" in again.stderr, again.stderr[-3000:]
    told = f"job {job.name} not run: the run directory {job} holds a run already (status interrupted"
    assert told in again.stdout + again.stderr and "Add resume=auto to the sweep's command" in again.stdout
    assert {p: p.read_bytes() for p in kept} == kept  # its checkpoints, manifest, metrics (not Hydra's log)
    resumed = subprocess.run([*command, "resume=auto"], capture_output=True, text=True, timeout=600, env=env,
                             cwd=tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["status"] == "finished" and len(manifest["resumed"]) == 1


def test_a_job_refused_for_its_config_keeps_the_manifest_of_the_run_it_holds(tmp_path: Path) -> None:
    """A sweep re-run with resume=auto whose job is refused (its settings are no longer the run's) replaced
    that finished run's manifest.json with a `failed` stub: its record (times, versions, data, W&B id)
    was gone, and attnlab-compare listed the finished run as failed, out of the table. The manifest is
    kept; the refusal is in the sweep's log and summary."""
    command = [
        sys.executable, "-m", "attnlab.cli.train", "-m", "data=synthetic", "model=tiny", "data.n_train=32",
        "data.n_val=8", "data.n_test=8", "trainer.max_epochs=1", "logger=csv", "seed=1,2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}", "trainer.enable_progress_bar=false",
    ]  # fmt: skip
    env = {**os.environ, "ATTNLAB_LOG_DIR": str(tmp_path / "logs")}
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    job = next(p for p in (tmp_path / "sweep").iterdir() if "seed=2" in p.name)
    config = job / "config.yaml"  # as if the experiment's file had changed since the job ran
    config.write_text(config.read_text().replace("dropout: 0.1", "dropout: 0.3", 1))
    kept = (job / "manifest.json").read_bytes()
    again = subprocess.run([*command, "resume=auto"], capture_output=True, text=True, timeout=600, env=env,
                           cwd=tmp_path)  # fmt: skip
    assert again.returncode == 1 and "multirun: 1 finished, 1 failed" in again.stderr, again.stderr[-3000:]
    assert f"job {job.name} failed: config error: resuming {job} with a different experiment" in again.stdout
    assert (job / "manifest.json").read_bytes() == kept  # still the finished run's
    text = report([tmp_path / "sweep"])  # both runs in the table (the edited one as its own setting)
    assert "| model.dropout=0.3 | 1 |" in text and "Not finished" not in text


def test_an_interrupted_job_without_a_last_ckpt_is_not_told_to_add_resume_auto(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job holding an interrupted run's epoch checkpoints but no last.ckpt was told to add resume=auto,
    which continues only from a last.ckpt (and which the command may already have): the refusal says
    there is no last.ckpt to continue from, with no such advice."""
    from attnlab.cli.train import _NOT_RUN, _skip_done
    from attnlab.runs.layout import RunDir

    run = RunDir(tmp_path / "job")
    (run.checkpoints_dir / "epochs").mkdir(parents=True)
    (run.checkpoints_dir / "best-epoch000-step10.ckpt").write_bytes(b"weights")
    run.manifest_file.write_text(json.dumps({"status": "interrupted", "start_time": "2026-12-06T10:00:00"}))
    with caplog.at_level("ERROR", logger="attnlab.cli.train"):
        assert _skip_done(run, multirun=True, continues=False) is _NOT_RUN
    assert "it has no checkpoints/last.ckpt to continue from" in caplog.text
    assert "Add resume=auto" not in caplog.text
    (run.checkpoints_dir / "last.ckpt").write_bytes(b"state")
    caplog.clear()
    with caplog.at_level("ERROR", logger="attnlab.cli.train"):
        assert _skip_done(run, multirun=True, continues=False) is _NOT_RUN
    assert "Add resume=auto to the sweep's command" in caplog.text


@pytest.mark.parametrize(
    ("status", "checkpoints", "continues", "runs"),
    [("failed", [], False, True), ("failed", ["last.ckpt"], False, False),
     ("failed", ["last.ckpt"], True, True), ("interrupted", ["last.ckpt"], True, True),
     ("interrupted", ["last.ckpt"], False, False)],
)  # fmt: skip
def test_skip_done_runs_an_unfinished_job_it_would_not_train_over(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    status: str,
    checkpoints: list[str],
    continues: bool,
    runs: bool,
) -> None:
    """With `sweep.skip_done`, a multirun job whose run did not finish runs (None, nothing recorded) when
    its run failed before saving a checkpoint (it starts over) or the command continues it (resume=auto
    with its last.ckpt); one holding checkpoints that the command does not continue is recorded as failed
    and not run (`_NOT_RUN`), its files untouched."""
    from attnlab.cli.train import _NOT_RUN, _skip_done
    from attnlab.runs.layout import RunDir
    from attnlab.training import launchers
    from helpers import saved_run

    monkeypatch.setattr(launchers, "JOBS", [])
    run = RunDir(tmp_path / "job")
    kept = saved_run(run.path, status, checkpoints)
    skipped = _skip_done(run, multirun=True, continues=continues)
    recorded = launchers.JOBS
    assert (skipped, recorded) == ((None, []) if runs else (_NOT_RUN, [("failed", run.manifest_file)]))
    assert {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file()} == kept


def test_skip_done_with_resume_auto_continues_an_interrupted_job_and_fails_an_unreadable_finished_one(
    resume_reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A sweep re-run with `sweep.skip_done=true resume=auto` (in this process) continues its interrupted
    job from its last.ckpt (a finished run resumed for more epochs and stopped: its earlier results.json
    gives the metrics of what is left to train, here nothing), and records as failed, its files untouched,
    a finished job whose results.json cannot be read: one error line naming the file, none about a metric
    that job has no results for."""
    from helpers import command_here
    from runs import IN_PROCESS

    sweep_dir = tmp_path / "sweep"
    # (the overrides as Hydra's sweeper gives them to a job, which names its directory: `test=False`)
    task = [o.replace("test=false", "test=False") for o in IN_PROCESS if not o.startswith("seed=")]
    job = {seed: sweep_dir / job_dirname([*task, f"seed={seed}"]) for seed in (7, 8)}
    shutil.copytree(resume_reference, job[7])  # (seed=7: the reference run's)
    manifest = json.loads((job[7] / "manifest.json").read_text())
    (job[7] / "manifest.json").write_text(json.dumps({**manifest, "status": "interrupted"}))  # (as SIGTERM)
    shutil.copytree(resume_reference, job[8])
    (job[8] / "results.json").write_text("[1]")  # (seed=8: a finished run whose results.json was replaced)
    kept = {p: p.read_bytes() for p in job[8].rglob("*") if p.is_file()}
    with caplog.at_level("ERROR", logger="attnlab.cli.train"), pytest.raises(SystemExit) as ended:
        command_here(monkeypatch, "train", "-m", *task, "seed=7,8", f"hydra.sweep.dir={sweep_dir}",
                     "sweep.skip_done=true", "resume=auto")  # fmt: skip
    summary = f"attnlab-train: multirun: 1 finished, 1 failed (see {job[8] / 'results.json'})"
    assert str(ended.value) == summary
    assert [m.split(": cannot read ")[0] for m in caplog.messages] == [f"job {job[8].name} not skipped"]
    assert {p: p.read_bytes() for p in job[8].rglob("*") if p.is_file()} == kept
    manifest = json.loads((job[7] / "manifest.json").read_text())
    assert manifest["status"] == "finished" and len(manifest["resumed"]) == 1


def test_a_job_whose_directory_another_process_has_claimed_fails_writing_nothing_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A job whose directory another live process has claimed (the same sweep started twice, the other
    still before its manifest) is counted as failed, naming that process, and writes no `failed`
    manifest.json of a job that never ran, nor Hydra's record of its command, into the directory of a run
    that is starting."""
    from attnlab.runs.layout import RUN_LOCK
    from helpers import command_here

    job = tmp_path / "sweep" / "job"
    job.mkdir(parents=True)
    hold = (
        "import fcntl, os, socket, sys, time\nf = open(sys.argv[1], 'w')\nfcntl.flock(f, fcntl.LOCK_EX)\n"
        "f.write(f'{os.getpid()} {socket.gethostname()}\\n'); f.flush()\nprint(flush=True)\ntime.sleep(120)"
    )
    other = subprocess.Popen([sys.executable, "-c", hold, str(job / RUN_LOCK)], stdout=subprocess.PIPE)
    try:
        other.stdout.readline()  # (it holds the lock)
        with pytest.raises(SystemExit) as failed, caplog.at_level("ERROR", logger="attnlab.cli.train"):
            command_here(monkeypatch, "train", "-m", "data=synthetic", "model=tiny", "data.n_train=32",
                         "data.n_val=8", "data.n_test=8", "trainer.max_epochs=1", "logger=csv", "seed=1",
                         f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweep.subdir=job")  # fmt: skip
    finally:
        other.kill()
        other.wait()
    assert str(failed.value) == f"attnlab-train: multirun: 0 finished, 1 failed (see {job})"
    told = f"job job failed: config error: the run directory {job} is in use: pid {other.pid} on host"
    assert told in caplog.text
    assert not (job / "manifest.json").exists()
    assert [p.name for p in job.iterdir()] == [RUN_LOCK]  # nor Hydra's record (.hydra/) of its command
