"""The run-directory layer: one list of bookkeeping keys for W&B groups and names, attnlab-compare and
resumption; the one metrics-CSV reader; the manifest as one object; atomic checkpoint writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from attnlab.cli.app import job_dirname
from attnlab.io import atomic_writer
from attnlab.reports.compare import load_runs, varying_keys
from attnlab.runs.layout import (
    BOOKKEEPING,
    MANIFEST_FILE,
    RunDir,
    UnreadableRunFile,
    read_config_file,
    read_metrics_csv,
)
from attnlab.runs.manifest import Manifest, git_state
from attnlab.runs.wandb import config_group, run_name, wandb_names
from attnlab.training.resume import check_same_experiment, csv_history, resume_path
from attnlab.typed import ConfigError


def resolved(out: Path, **changes: Any) -> dict[str, Any]:
    """A resolved training config of a run in `out`, with top-level `changes`."""
    config = {
        "task_name": "train",
        "seed": 1,
        "model": {"pe": "sinusoidal", "d_model": 32},
        "data": {"cache": f"{out}/cache"},  # derived from the run directory, outside the bookkeeping keys
        "paths": {"output_dir": str(out), "log_dir": str(out.parent)},
        "logger": {"wandb": {"group": None, "name": None}},
        "callbacks": {"last": {"dirpath": f"{out}/checkpoints", "every_n_train_steps": None}},
        "sweep": {"skip_done": False},
        "ckpt_path": None,
        "resume": False,
        "optimized_metric": "val/loss",
    }
    return {**config, **changes}


def finished_run(out: Path, config: dict[str, Any]) -> None:
    run = RunDir(out)
    run.write_config(config)
    run.write_results({"sets": {"test": {"bleu": 30.0, "chrf": 50.0}}})
    run.write_files({MANIFEST_FILE: json.dumps({"status": "finished"}).encode()})


def compared_keys(tmp_path: Path, first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    finished_run(tmp_path / "a", first)
    finished_run(tmp_path / "b", second)
    return varying_keys(load_runs([tmp_path]))


def changed(config: dict[str, Any], entry: str) -> dict[str, Any]:
    """`config` with the `BOOKKEEPING` entry `entry` changed (a key added below a group)."""
    key = entry.rstrip(".")
    value = {**(config.get(key) or {}), "changed": 1} if entry.endswith(".") else "changed"
    return {**config, key: value}


@pytest.mark.parametrize("entry", BOOKKEEPING)
def test_a_bookkeeping_key_changes_no_group_no_compared_key_no_name_and_may_change_on_resume(
    entry: str, tmp_path: Path
) -> None:
    first, second = resolved(tmp_path / "a"), changed(resolved(tmp_path / "b"), entry)
    assert config_group(first) == config_group(second)
    assert compared_keys(tmp_path, first, second) == []
    override = f"{entry}x=1" if entry.endswith(".") else f"{entry}=1"
    assert run_name([override, "model.pe=none"]) == "pe=none"
    assert job_dirname([override, "model.pe=none"]) == job_dirname(["model.pe=none"])  # (its directory)
    if entry == "task_name":  # it names where the run directories live: a resumed run keeps it
        with pytest.raises(ConfigError, match="task_name: 'train' -> 'changed'"):
            check_same_experiment(RunDir(tmp_path / "a").config_file, changed(first, entry))
    else:
        check_same_experiment(RunDir(tmp_path / "a").config_file, changed(first, entry))


def test_the_bookkeeping_overrides_the_readme_names_leave_job_directories_and_run_names_as_they_are() -> None:
    """README ("Sweeps"): `logger=...`, `paths.`, `sweep.`, `resume` and `trainer.enable_progress_bar`
    are left out of a job directory's name, so a sweep re-run with them (`sweep.skip_done=true resume=auto`)
    finds its jobs; a sweep over `allocator` is refused as bookkeeping. The test above takes its cases from
    `BOOKKEEPING` itself, so an entry dropped there dropped its case and failed nothing."""
    own = ["model.pe=none", "seed=1"]
    for override in ("logger=tensorboard", "paths.log_dir=/x", "sweep.skip_done=true", "resume=auto",
                     "trainer.enable_progress_bar=false", "allocator=release", "ckpt_path=last"):  # fmt: skip
        assert job_dirname([*own, override]) == job_dirname(own), override
        assert run_name([*own, override]) == "pe=none,seed=1", override


def test_what_the_console_shows_is_bookkeeping_but_the_logging_interval_is_a_setting(tmp_path: Path) -> None:
    """`trainer.enable_progress_bar` and `trainer.enable_model_summary` change only the console (two runs
    differing in both wrote the same results.json and csv/metrics.csv, the speed aside), yet runs differing
    in them were different settings: other W&B groups, compared keys and job directories.
    `trainer.log_every_n_steps` decides which step rows the run logs: a setting still."""
    first = resolved(tmp_path / "a", trainer={"log_every_n_steps": 50, "enable_progress_bar": True})
    quiet = {"log_every_n_steps": 50, "enable_progress_bar": False, "enable_model_summary": False}
    second = resolved(tmp_path / "b", trainer=quiet)
    assert config_group(first) == config_group(second)
    assert compared_keys(tmp_path / "console", first, second) == []
    overrides = ["trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false"]
    assert job_dirname([*overrides, "model.pe=none"]) == job_dirname(["model.pe=none"])
    assert run_name([*overrides, "model.pe=none"]) == "pe=none"
    logging = resolved(tmp_path / "a", trainer={**first["trainer"], "log_every_n_steps": 10})
    assert config_group(first) != config_group(logging)
    assert compared_keys(tmp_path / "logging", first, logging) == ["trainer.log_every_n_steps"]
    check_same_experiment(RunDir(tmp_path / "logging" / "a").config_file, logging)  # (a resumption may)


def test_the_progress_settings_may_change_when_a_run_resumes(tmp_path: Path) -> None:
    """README, "The console": `progress.every_n_seconds` and `progress.every_n_steps` may change when a run
    resumes (lines every 30 s in the first part, every 500 steps in the second)."""
    first = resolved(tmp_path / "a", progress={"every_n_seconds": 30, "every_n_steps": None})
    finished_run(tmp_path / "a", first)
    check_same_experiment(
        RunDir(tmp_path / "a").config_file,
        {**first, "progress": {"every_n_seconds": None, "every_n_steps": 500}},
    )


def test_a_setting_changes_the_group_the_compared_keys_and_the_name_and_is_no_resumption(
    tmp_path: Path,
) -> None:
    first = resolved(tmp_path / "a")
    second = resolved(tmp_path / "b", model={"pe": "learned", "d_model": 32})
    assert config_group(first) != config_group(second)
    assert compared_keys(tmp_path, first, second) == ["model.pe"]
    assert run_name(["model.pe=learned", "paths.log_dir=/x"]) == "pe=learned"
    with pytest.raises(ConfigError, match=r"model\.pe: 'sinusoidal' -> 'learned'"):
        check_same_experiment(RunDir(tmp_path / "a").config_file, {**first, "model": second["model"]})


def test_a_deletion_override_is_a_setting_that_names_the_job_directory_and_the_run() -> None:
    """`~model.x` (no `=`) deletes a key: jobs with and without it are different settings, in different
    directories (the name Hydra's override_dirname gave it, hashed with the deletion), and the run's name
    shows it; a deleted bookkeeping key (`~logger`) names nothing."""
    import hashlib

    deleting = ["seed=1", "~model.label_smoothing"]
    digest = hashlib.sha256(b"seed=1,~model.label_smoothing").hexdigest()[:8]
    assert job_dirname(deleting) == f"seed=1-{digest}" != job_dirname(["seed=1"])
    assert run_name(deleting) == "seed=1,~label_smoothing"
    assert job_dirname(["seed=1", "~logger"]) == job_dirname(["seed=1"]) and run_name(["~logger"]) is None


def test_early_stoppings_patience_is_a_setting_that_a_resumption_may_change(tmp_path: Path) -> None:
    """Runs that stop after 3 or 10 epochs without improvement are different settings (attnlab-compare
    put them in one group, W&B too); like `trainer.max_epochs`, a resumed run may change it."""
    stopping = {"early_stopping": {"patience": 3, "min_delta": 0.0, "dirpath": "x"}}
    first = resolved(tmp_path / "a", callbacks=stopping)
    second = resolved(
        tmp_path / "b", callbacks={"early_stopping": {**stopping["early_stopping"], "patience": 10}}
    )
    assert config_group(first) != config_group(second)
    assert compared_keys(tmp_path, first, second) == ["callbacks.early_stopping.patience"]
    assert run_name(["callbacks.early_stopping.patience=10"]) == "patience=10"
    check_same_experiment(RunDir(tmp_path / "a").config_file, {**first, "callbacks": second["callbacks"]})


def test_the_seed_groups_runs_but_is_no_resumption(tmp_path: Path) -> None:
    first, second = resolved(tmp_path / "a"), resolved(tmp_path / "b", seed=2)
    assert config_group(first) == config_group(second)
    assert compared_keys(tmp_path, first, second) == []
    with pytest.raises(ConfigError, match="seed: 1 -> 2"):
        check_same_experiment(RunDir(tmp_path / "a").config_file, {**first, "seed": 2})


def test_wandb_names_fill_only_the_null_values_and_change_nothing(tmp_path: Path) -> None:
    config = resolved(tmp_path)
    node = config["logger"]["wandb"]
    names = wandb_names(node, config, ["model.pe=none", "seed=2"])
    assert names == {"group": config_group(config), "name": "pe=none,seed=2"}
    assert node == {"group": None, "name": None}
    assert wandb_names({"group": "mine", "name": None}, config, []) == {}


def test_the_metrics_csv_reader(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    assert read_metrics_csv(path) == []
    path.write_text("params/total,step,epoch,val/loss\n1234,0,,\n,10,0,4.5\n")
    assert read_metrics_csv(path) == [
        {"params/total": 1234.0, "step": 0.0},
        {"step": 10.0, "epoch": 0.0, "val/loss": 4.5},
    ]
    for content, reason in (
        (b"step,val/loss\n10,4.5\n20,x\n", "line 3: val/loss='x' is not a number"),
        (b"step,val/loss\n10,4\xff5\n", "invalid start byte"),
        (b"step\n10,4.5\n", "line 2 has more cells than its header"),
    ):
        path.write_bytes(content)
        with pytest.raises(UnreadableRunFile, match=f"cannot read {path}: .*{reason}"):
            read_metrics_csv(path)


def test_the_config_reader_parses_once_and_reads_no_string_document_as_yaml(tmp_path: Path) -> None:
    """A config.yaml whose document is a quoted string was parsed a second time by `OmegaConf.create`, as
    YAML: the aliases inside the string (which the alias check never saw) were expanded. The file is parsed
    once, with OmegaConf's own rules (floats, duplicate keys), and only a mapping is a config."""
    path = tmp_path / "config.yaml"
    path.write_text("model: {d_model: 1e3, pe: sinusoidal}\nseed: 1\n")
    assert read_config_file(path) == {"model.d_model": 1000.0, "model.pe": "sinusoidal", "seed": 1}
    path.write_text("")
    assert read_config_file(path) == {}
    inner = "a0: &a0 [1, 2]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]\n" for i in range(1, 4))
    for content, reason in (
        (json.dumps(inner), "it holds a YAML string, not a config"),
        (inner, "it holds YAML aliases"),
        ("- 1\n", "it holds a YAML list, not a config"),
        ("3\n", "it holds a YAML scalar, not a config"),
        # OmegaConf refuses duplicate keys: named, with the line, not PyYAML's "while constructing a mapping"
        (
            "m:\n  a: 1\n  a: 3\n",
            r"the key a is given twice in one mapping \(again on line 3\): remove one of them$",
        ),
        ("a: [1\n", r"expected ',' or ']', but got '<stream end>' \(line 2\)$"),  # the problem, not context
    ):
        path.write_text(content)
        with pytest.raises(UnreadableRunFile, match=f"cannot read {path}: .*{reason}"):
            read_config_file(path)


def test_the_resumed_csv_history_keeps_the_rows_before_the_step_parameter_counts_included(
    tmp_path: Path,
) -> None:
    """(A resumed fit does not log the parameter counts again: `TranslationModule.log_parameter_counts`.)"""
    run = RunDir(tmp_path)
    run.metrics_csv.parent.mkdir()
    # (step 20 is the checkpoint's own: the resumed run logs it again)
    run.metrics_csv.write_text(
        "params/total,step,epoch,val/loss\n1234,0,,\n,9,0,4.5\n,19,1,4.0\n,20,2,3.5\n,29,2,3.0\n"
    )
    history = csv_history(tmp_path, before_step=20)
    assert history == [{"params/total": 1234.0, "step": 0}, {"step": 9, "epoch": 0, "val/loss": 4.5},
                       {"step": 19, "epoch": 1, "val/loss": 4.0}]  # fmt: skip
    assert all(isinstance(row["step"], int) and isinstance(row.get("epoch", 0), int) for row in history)


def test_which_checkpoint_resume_and_ckpt_path_continue_from(tmp_path: Path) -> None:
    """`resume=true` and `ckpt_path=last` continue from the run's last.ckpt, `auto` too when there is one
    (else a new run), `false` never; a `ckpt_path` file starts from it, and with `resume` is refused."""
    from omegaconf import OmegaConf

    def chosen(**settings: Any) -> str | None:
        return resume_path(OmegaConf.create({"resume": False, "ckpt_path": None, **settings}), tmp_path)

    assert chosen(resume="auto") is None  # nothing to resume: a new run
    last = RunDir(tmp_path).last_checkpoint
    last.parent.mkdir()
    last.write_bytes(b"")
    other = tmp_path / "other.ckpt"
    other.write_bytes(b"")
    for settings in ({"resume": True}, {"resume": "auto"}, {"ckpt_path": "last"}):
        assert chosen(**settings) == str(last), settings
    assert chosen() is None
    assert chosen(ckpt_path=str(other)) == str(other)
    with pytest.raises(ConfigError, match=f"resume=True and ckpt_path={other}: give one of them"):
        chosen(resume=True, ckpt_path=str(other))


def test_hydra_records_a_command_except_over_the_record_of_a_run_it_continues_skips_or_refuses(
    tmp_path: Path,
) -> None:
    """`hydra.output_subdir`: a new run directory, or one whose failed run saved no checkpoint (started
    over), gets the command's `.hydra/` record; a resumption of the run there keeps the first command's
    record, and so does a command that the run's checkpoints or finished status skip or refuse."""
    from attnlab.cli.app import hydra_output_subdir

    run = RunDir(tmp_path / "run")
    assert hydra_output_subdir(run.path, True) == ".hydra"  # nothing recorded yet
    (run.path / ".hydra").mkdir(parents=True)
    (run.path / MANIFEST_FILE).write_text(json.dumps({"status": "failed"}))
    assert hydra_output_subdir(run.path) == ".hydra"  # a failed run started over
    for resume, ckpt_path in ((True, None), ("auto", None), (False, "last")):
        assert hydra_output_subdir(run.path, resume, ckpt_path) is None, (resume, ckpt_path)
    run.checkpoints_dir.mkdir()
    (run.checkpoints_dir / "epoch001.ckpt").write_bytes(b"")
    assert hydra_output_subdir(run.path) is None  # refused, or a sweep's job recorded as failed
    (run.checkpoints_dir / "epoch001.ckpt").unlink()
    (run.path / MANIFEST_FILE).write_text(json.dumps({"status": "finished"}))
    assert hydra_output_subdir(str(run.path), False, None) is None  # skipped by sweep.skip_done, or refused


def test_a_process_of_rank_above_0_leaves_hydras_record_to_rank_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under torchrun or SLURM tasks every rank runs the command: a rank > 0 records nowhere
    (`hydra.output_subdir` None), nor looks at the lock rank 0 claims (a look takes it for an instant, in
    which rank 0's claim would be refused as another command's)."""
    from attnlab.cli.app import hydra_output_subdir

    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    run = RunDir(tmp_path / "run")
    assert hydra_output_subdir(run.path) == ".hydra"  # (rank 0)
    monkeypatch.setenv("RANK", "1")
    assert hydra_output_subdir(run.path) is None


def test_the_manifest_is_one_object_written_on_every_change(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    manifest = Manifest.start(run)
    on_disk = json.loads(run.manifest_file.read_text())
    assert on_disk["status"] == "running" and on_disk == manifest.fields
    manifest.update(wandb_run_id="abc", data={"spec": "Synthetic"})
    assert json.loads(run.manifest_file.read_text())["wandb_run_id"] == "abc" == manifest.get("wandb_run_id")
    manifest.fields["status"] = "changed"  # a copy
    manifest.finish("interrupted", error="Preempted: SIGTERM")
    first = json.loads(run.manifest_file.read_text())
    assert first["status"] == "interrupted" and first["error"] == "Preempted: SIGTERM" and first["end_time"]

    resumed = Manifest.start(run, resumed_from=str(run.last_checkpoint))
    again = json.loads(run.manifest_file.read_text())
    assert again["status"] == "running" and "error" not in again and again["end_time"] is None
    assert again["start_time"] == first["start_time"] and again["wandb_run_id"] == "abc"
    assert [entry["checkpoint"] for entry in again["resumed"]] == [str(run.last_checkpoint)]
    assert again["resumed"][0]["command"] == [sys.executable, *sys.argv]  # the command of the resumption
    assert again["resumed"][0]["time"] >= first["end_time"]
    assert again["resumed"][0]["previous_end"] == first["end_time"]  # (the pause is not training time)
    resumed.finish("finished")
    assert Manifest.read(run).get("status") == "finished" and "error" not in Manifest.read(run).fields

    Manifest.failed(RunDir(tmp_path / "new"), "ConfigError: model.pe='x'\nmore")
    failed = json.loads((tmp_path / "new" / MANIFEST_FILE).read_text())
    assert failed["status"] == "failed" and failed["error"] == "ConfigError: model.pe='x'"
    assert failed["overrides"] == []  # none outside a Hydra app (a sweep's: tests/integration/test_sweep.py)
    run.manifest_file.write_text("[1]")
    with pytest.raises(UnreadableRunFile, match="it holds a JSON array, not an object"):
        Manifest.read(run)


def test_each_resumption_keeps_the_runs_record_and_a_refused_job_never_marks_a_started_run_failed(
    tmp_path: Path,
) -> None:
    """A run resumed twice keeps its start time, its tracker runs and the checkpoint it was fine-tuned
    from, and lists both resumptions (the second after a part killed before its end: no `previous_end`);
    a lost manifest starts a fresh record. `Manifest.failed` writes over nothing but a manifest of a run
    that never started; times are UTC."""
    from datetime import datetime, timedelta

    run = RunDir(tmp_path / "run")
    first = Manifest.start(run)
    kept = {"wandb_run_id": "w1", "mlflow_run_id": "m1", "init_from": {"path": "/base.ckpt", "step": 7}}
    first.update(**kept)
    first.fields["status"] = "changed"  # a copy: the manifest is unchanged
    assert first.get("status") == "running"
    first.finish("interrupted")
    Manifest.start(run, resumed_from="a.ckpt")  # killed before it could record its end
    third = Manifest.start(run, resumed_from="b.ckpt").fields
    assert {key: third[key] for key in kept} == kept and third["start_time"] == first.get("start_time")
    assert [(r["checkpoint"], r["previous_end"]) for r in third["resumed"]] == [
        ("a.ckpt", first.get("end_time")),
        ("b.ckpt", None),
    ]
    assert datetime.fromisoformat(third["start_time"]).utcoffset() == timedelta(0)

    lost = Manifest.start(RunDir(tmp_path / "lost"), resumed_from="c.ckpt").fields
    assert [r["checkpoint"] for r in lost["resumed"]] == ["c.ckpt"] and "wandb_run_id" not in lost

    assert Manifest.failed(run, "ConfigError: refused") is False
    assert Manifest.read(run).get("status") == "running" and "error" not in Manifest.read(run).fields
    damaged = RunDir(tmp_path / "damaged")
    damaged.write_files({MANIFEST_FILE: b"{not json"})
    assert Manifest.failed(damaged, "ConfigError: x") is True
    assert Manifest.read(damaged).get("status") == "failed"


def test_a_tagged_atomic_write_uses_one_temporary_per_process_and_removes_those_left(tmp_path: Path) -> None:
    target = tmp_path / "checkpoints" / "last.ckpt"
    target.parent.mkdir()
    target.write_bytes(b"old")
    left = target.with_name(".last.ckpt.partial-999999")
    left.write_bytes(b"half")
    with atomic_writer(target, tag="partial") as f:
        f.write(b"new")
        assert sorted(p.name for p in target.parent.iterdir()) == [
            f".last.ckpt.partial-{os.getpid()}",
            "last.ckpt",
        ]
    assert target.read_bytes() == b"new"
    with pytest.raises(RuntimeError), atomic_writer(target, tag="partial") as f:
        f.write(b"cut")
        raise RuntimeError("killed")
    assert target.read_bytes() == b"new" and [p.name for p in target.parent.iterdir()] == ["last.ckpt"]


def test_a_checkpoint_save_goes_through_the_tagged_atomic_writer(tmp_path: Path) -> None:
    from attnlab.training.checkpoint_io import AtomicCheckpointIO

    seen: list[list[str]] = []

    class Watched(AtomicCheckpointIO):
        def write(self, checkpoint: dict, file: Any) -> None:
            seen.append(sorted(p.name for p in target.parent.iterdir()))
            super().write(checkpoint, file)

    target = tmp_path / "checkpoints" / "last.ckpt"
    target.parent.mkdir()
    target.with_name(".last.ckpt.partial-999999").write_bytes(b"half")
    Watched().save_checkpoint({"global_step": 3}, target)
    assert seen == [[f".last.ckpt.partial-{os.getpid()}"]]  # the left one removed first
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]


def test_the_results_table_shows_ter_and_the_papers_bleu_beside_sacrebleu_when_there_are() -> None:
    from attnlab.runs.results import results_table

    entry = {"sentences": 2, "bleu": 31.234, "chrf": 55.0, "bleu_signature": "nrefs:1|tok:13a"}
    sets = {"test": {**entry, "ter": 48.25, "bleu_tok_compound": 33.456}, "val": entry}  # val: older results
    header, test, val = results_table({"sets": sets}).splitlines()
    assert header.split()[:6] == ["set", "sentences", "BLEU", "chrF", "TER", "BLEU"]
    assert "BLEU tok+compound (paper)" in header
    assert test.split()[:6] == ["test", "2", "31.23", "55.00", "48.25", "33.46"]
    assert val.split()[4:6] == ["-", "-"]
    column = header.index("signature")  # the columns line up under their headers
    assert test.index("nrefs:1|tok:13a") == val.index("nrefs:1|tok:13a") == column
    assert test.index("33.46") == header.index("BLEU tok+compound")


def test_the_decoding_summary_names_the_search_and_the_checkpoints_of_each_kind_of_results() -> None:
    """The line `attnlab-eval` prints under the table: greedy for beam 1, the sampling settings when
    sampling (whatever the beam), beam and length penalty otherwise (an older results file's `lenpen` as
    the GNMT alpha), then the checkpoint, the averaged ones counted, or "-" when none is recorded."""
    from attnlab.runs.results import decoding_summary

    beam = {"beam": 4, "length_penalty": "fairseq", "alpha": 1.2}
    sampled = {"sampling": True, "beam": 4, "topk": 10, "topp": 0.9, "temperature": 0.7, "seed": 5}
    cases = [
        ({"decode": {"beam": 1, "alpha": 0.6}, "checkpoints": ["/r/last.ckpt"]},
         "decoding: greedy; checkpoints: /r/last.ckpt"),
        ({"decode": beam, "checkpoints": ["/r/a.ckpt", "/r/b.ckpt"], "averaged": True},
         "decoding: beam 4, fairseq length penalty alpha 1.2; checkpoints: average of 2: /r/a.ckpt, "
         "/r/b.ckpt"),
        ({"decode": sampled, "checkpoints": ["/r/last.ckpt"], "averaged": False, "ensemble": None},
         "decoding: sampling (topk 10, topp 0.9, temperature 0.7, seed 5); checkpoints: /r/last.ckpt"),
        ({"decode": {"beam": 5, "lenpen": 0.8}},  # an older results file
         "decoding: beam 5, gnmt length penalty alpha 0.8; checkpoints: -"),
    ]  # fmt: skip
    for results, line in cases:
        assert decoding_summary(results) == line


def test_git_state_names_the_checkouts_commit_and_whether_a_tracked_file_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the manifest's `git` records: the commit of the checkout holding the code, dirty once a tracked
    file differs from it (an untracked file does not count), and nulls outside a checkout."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no checkout above tmp_path counts
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        command = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (repo / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-q", "-m", "first")
    assert git_state(repo) == {"commit": git("rev-parse", "HEAD"), "dirty": False}
    assert len(git_state(repo)["commit"]) == 40
    (repo / "notes.txt").write_text("untracked\n")
    assert git_state(repo)["dirty"] is False
    (repo / "code.py").write_text("x = 2\n")
    assert git_state(repo)["dirty"] is True
    (tmp_path / "elsewhere").mkdir()
    assert git_state(tmp_path / "elsewhere") == {"commit": None, "dirty": None}


def test_the_runs_records_readers_read_what_they_promise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading chosen columns of csv/metrics.csv reads no other cell (a damaged one elsewhere is no
    error); a manifest that cannot be read is a training run of status `unknown` (attnlab-eval there is
    refused); a process of another node (RANK=2, LOCAL_RANK=0) is no first process, which checks the run
    directory."""
    path = tmp_path / "metrics.csv"
    path.write_bytes(b"params/total,step,val/loss\n1234,0,x\n,10,4.5,9\n")
    assert read_metrics_csv(path, columns=("params/total",)) == [{"params/total": 1234.0}, {}]
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.manifest_file.write_text("{not json")
    assert run.saved_training() == ([], "unknown")
    with pytest.raises(ConfigError, match=r"holds a training run \(status unknown, no checkpoint\)"):
        run.check_no_training("attnlab-eval", "paths.output_dir", "its results.json")
    run.manifest_file.write_text(json.dumps({"status": "finished"}))
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    run.check_no_run()  # (the first process refuses it: test_run_guards.py)


def test_an_atomic_write_through_a_symbolic_link_replaces_its_target_and_keeps_the_link(
    tmp_path: Path,
) -> None:
    from attnlab.io import atomic_write_bytes, atomic_write_files

    for write in (atomic_write_bytes, lambda path, data: atomic_write_files({path: data})):
        target, link = tmp_path / "kept" / "results.json", tmp_path / "results.json"
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(b"old")
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        write(link, b"new")
        assert link.is_symlink() and target.read_bytes() == b"new"


def test_a_forked_child_does_not_keep_its_parents_lock(tmp_path: Path) -> None:
    """A lock is freed when its holder dies (here: closes its descriptor without unlocking), even while a
    child it forked (a DataLoader worker) still runs."""
    from attnlab.io import FileLock

    held = FileLock(tmp_path / ".lock")
    held.acquire()
    (told, tell), (ready, up) = os.pipe(), os.pipe()
    child = os.fork()
    if child == 0:  # the child (its fork handlers have run): says so, waits until told, then leaves
        os.write(up, b"x")
        os.read(told, 1)
        os._exit(0)
    try:
        os.read(ready, 1)
        os.close(held._fd)  # the holder "dies": its descriptor closed, never unlocked
        held._fd = None
        with FileLock(tmp_path / ".lock", timeout=0):
            pass
    finally:
        os.write(tell, b"x")
        os.waitpid(child, 0)
        for fd in (told, tell, ready, up):
            os.close(fd)
