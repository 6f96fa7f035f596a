"""`hparams_search=optuna` for real, in this process: three tiny trials through attnlab-train's Hydra main.

Each trial must get its own parameters, job directory and W&B run (offline), and the value Optuna's
study is told must be the one the trial's results.json holds.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import pytest
import yaml

from wandb_records import find_run_file, read_wandb_run

optuna = pytest.importorskip("optuna", reason='needs the [sweep] extra: pip install -e ".[sweep]"')
PARAMS = ("optim.peak_lr", "optim.warmup_steps", "model.dropout", "optim.label_smoothing")


def lookup(config: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        config = config[part]
    return config


def run_sweep(sweep_dir: Any, *extra: str) -> list[tuple[dict[str, Any], list[float] | None]]:
    """Three tiny trials through attnlab-train's Hydra main; what Optuna's study was told of each."""
    from hydra.core.global_hydra import GlobalHydra

    from attnlab.cli.train import _main

    told: list[tuple[dict[str, Any], list[float] | None]] = []
    original_tell = optuna.study.Study.tell

    def recording_tell(self: Any, trial: Any, values: Any = None, state: Any = None, **kwargs: Any) -> Any:
        told.append((dict(trial.params), None if values is None else [float(v) for v in values]))
        return original_tell(self, trial, values=values, state=state, **kwargs)

    argv = [
        "attnlab-train", "hparams_search=optuna", "data=synthetic", "model=tiny", "optim=linear",
        "optim.total_steps=5000", "data.n_train=48", "data.n_val=16", "data.n_test=16",
        "trainer.max_epochs=1",
        "logger=wandb", "optimized_metric=best/val/loss", "hydra.sweeper.direction=minimize",
        "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={sweep_dir}", "trainer.enable_progress_bar=false",
        "hydra/job_logging=none", "hydra/hydra_logging=none", *extra,
    ]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(optuna.study.Study, "tell", recording_tell)
        patch.setattr(sys, "argv", argv)
        patch.setenv("WANDB_MODE", "offline")
        GlobalHydra.instance().clear()
        try:
            _main()
        finally:
            GlobalHydra.instance().clear()
    return told


@pytest.fixture(scope="module")
def optuna_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    sweep_dir = tmp_path_factory.mktemp("optuna") / "sweep"
    return {"dir": sweep_dir, "told": run_sweep(sweep_dir)}


def test_trials_get_distinct_parameters_and_the_sweeper_receives_their_results(
    optuna_sweep: dict[str, Any],
) -> None:
    told, sweep_dir = optuna_sweep["told"], optuna_sweep["dir"]
    assert len(told) == 3 and all(values is not None for _, values in told)
    settings = [tuple(params[p] for p in PARAMS) for params, _ in told]
    assert len(set(settings)) == 3  # each trial a different point of the search space
    jobs = sorted(p for p in sweep_dir.iterdir() if (p / "results.json").is_file())
    assert len(jobs) == 3
    for params, values in told:
        matches = []
        for job in jobs:
            config = yaml.safe_load((job / "config.yaml").read_text())
            if all(math.isclose(float(lookup(config, p)), float(params[p]), rel_tol=1e-12) for p in PARAMS):
                matches.append(job)
        (job,) = matches
        results = json.loads((job / "results.json").read_text())
        assert values == [results["metrics"]["best/val/loss"]]
        assert 1e-12 < results["metrics"]["best/val/loss"] <= results["metrics"]["val/loss"] + 1e-6
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_value"] == min(values[0] for _, values in told)


def test_every_trial_is_its_own_wandb_run(optuna_sweep: dict[str, Any]) -> None:
    jobs = sorted(p for p in optuna_sweep["dir"].iterdir() if (p / "results.json").is_file())
    records = [read_wandb_run(find_run_file(job)) for job in jobs]
    assert len({r.run["id"] for r in records}) == 3
    assert all(r.exit_code == 0 for r in records)
    for job, record in zip(jobs, records, strict=True):
        config = yaml.safe_load((job / "config.yaml").read_text())
        assert record.config["run"]["optim"]["peak_lr"] == config["optim"]["peak_lr"]
        assert f"peak_lr={config['optim']['peak_lr']}" in record.run["name"]
        history = [row["val/loss"] for row in record.history if "val/loss" in row]
        final = json.loads((job / "results.json").read_text())["metrics"]["val/loss"]
        assert history == pytest.approx([final])


def test_a_rerun_with_skip_done_tells_the_sweeper_the_finished_trials_results(
    optuna_sweep: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The same seeded study again with `sweep.skip_done=true`: every trial's job has finished, so none
    trains, and each returns the metric its results.json holds, as the first run told the study."""
    again = run_sweep(optuna_sweep["dir"], "sweep.skip_done=true")
    assert capsys.readouterr().out.count("already finished (sweep.skip_done=true): skipped") == 3
    assert again == optuna_sweep["told"]


def test_a_skipped_trial_without_the_optimized_metric_is_named_not_returned_silently(
    optuna_sweep: dict[str, Any], tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A finished trial whose results.json lacks `optimized_metric`: skipped, it gave the sweeper None
    without a word (a trained job's missing metric was named); both are named now."""
    import shutil

    sweep_dir = tmp_path / "sweep"
    shutil.copytree(optuna_sweep["dir"], sweep_dir, symlinks=True)
    job = min(p for p in sweep_dir.iterdir() if (p / "results.json").is_file())
    results = json.loads((job / "results.json").read_text())
    del results["metrics"]["best/val/loss"]
    (job / "results.json").write_text(json.dumps(results))
    with caplog.at_level("ERROR"):
        again = run_sweep(sweep_dir, "sweep.skip_done=true")
    assert sorted(values is None for _, values in again) == [False, False, True]  # a failed trial
    assert "optimized_metric=best/val/loss is not among this run's final metrics (" in caplog.text
    assert "val/loss" in caplog.text.split("final metrics (")[1]  # those it has are listed


def test_a_skipped_trial_with_unreadable_results_is_not_said_to_lack_the_optimized_metric(
    optuna_sweep: dict[str, Any], tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A finished trial whose results.json cannot be read is named as a failed job; it was also said to
    lack `optimized_metric` among its final metrics "(none)", with the advice to change optimized_metric."""
    import shutil

    sweep_dir = tmp_path / "sweep"
    shutil.copytree(optuna_sweep["dir"], sweep_dir, symlinks=True)
    job = min(p for p in sweep_dir.iterdir() if (p / "results.json").is_file())
    (job / "results.json").unlink()
    with caplog.at_level("ERROR"):
        again = run_sweep(sweep_dir, "sweep.skip_done=true")
    assert sorted(values is None for _, values in again) == [False, False, True]  # a failed trial
    assert f"job {job.name} not skipped: cannot read {job / 'results.json'}" in caplog.text
    assert "is not among this run's final metrics" not in caplog.text


def test_a_sweeper_going_the_wrong_way_for_the_optimized_metric_is_refused_before_any_trial(
    tmp_path: Any,
) -> None:
    """`optimized_metric=best/val/loss` with Optuna maximizing (the `hparams_search=optuna` default, made for
    BLEU) searched for the worst settings and wrote the worst run as the best trial: refused before any
    trial trains, naming the direction to give."""
    sweep_dir = tmp_path / "sweep"
    wrong = r"optimized_metric=best/val/loss is better lower, but hydra.sweeper.direction=maximize: the"
    with pytest.raises(SystemExit, match=wrong + r".*Add hydra.sweeper.direction=minimize"):
        run_sweep(sweep_dir, "hydra.sweeper.direction=maximize")
    with pytest.raises(SystemExit, match=r"optimized_metric=\['best/val/loss'\] must be the name of a final"):
        run_sweep(sweep_dir, "optimized_metric=[best/val/loss]")
    with pytest.raises(SystemExit, match=r"optimized_metric=test/test2016/ter is better lower"):
        run_sweep(sweep_dir, "optimized_metric=test/test2016/ter", "hydra.sweeper.direction=maximize")
    with pytest.raises(SystemExit, match=r"optimized_metric=train/loss_epoch is better lower"):
        run_sweep(sweep_dir, "optimized_metric=train/loss_epoch", "hydra.sweeper.direction=maximize")
    with pytest.raises(SystemExit, match=wrong):  # one objective as a list, as Optuna's sweeper takes it
        run_sweep(sweep_dir, "hydra.sweeper.direction=[maximize]")
    with pytest.raises(SystemExit, match=r"optimized_metric=best/val/blue is no final metric of a training"):
        run_sweep(sweep_dir, "optimized_metric=best/val/blue")  # was reported once each trial had trained
    assert not sweep_dir.exists()  # no trial ran


def test_a_trial_repeating_an_earlier_trials_parameters_reuses_its_result_without_training_again(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Optuna's sampler may propose the same parameters twice (here certainly: three trials of two
    choices). Such a trial names the job directory of the earlier one: it trained again there, over that
    run's checkpoints and results. It is now given the earlier trial's result, and nothing trains twice."""
    fixed = ["optim.peak_lr=0.001", "optim.warmup_steps=1", "optim.label_smoothing=0.1", "logger=csv"]
    with caplog.at_level("INFO", logger="attnlab.training.launchers"):
        told = run_sweep(tmp_path / "sweep", *fixed, "model.dropout=choice(0.1,0.2)")
    assert len(told) == 3 and all(values is not None for _, values in told)
    by_dropout: dict[float, list[list[float] | None]] = {}
    for params, values in told:
        by_dropout.setdefault(params["model.dropout"], []).append(values)
    assert sorted(map(len, by_dropout.values())) == [1, 2]
    assert all(len({tuple(v or ()) for v in values}) == 1 for values in by_dropout.values())
    jobs = sorted(p for p in (tmp_path / "sweep").iterdir() if (p / "results.json").is_file())
    assert len(jobs) == 2
    assert capsys.readouterr().out.count("attnlab-train: test/") == 2  # two trainings, not three
    assert caplog.text.count("not run again, it gets that job's result") == 1


def test_a_study_none_of_whose_trials_returned_a_value_ends_with_its_summary_not_a_traceback(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every trial failing (here refused for its config, before training) left Optuna without a best
    trial: once all had run, the sweep ended with Optuna's traceback ("No trials are completed yet") and
    no summary of its jobs. One error line says there is no best trial; the summary names the failures."""
    from helpers import command_here

    sweep_dir = tmp_path / "sweep"
    with caplog.at_level("ERROR"), pytest.raises(SystemExit) as ended:
        command_here(monkeypatch, "train", "hparams_search=optuna", "data=synthetic", "model=tiny",
                     "model.n_heads=3", "logger=csv", "hydra.sweeper.n_trials=2",
                     f"hydra.sweep.dir={sweep_dir}")  # fmt: skip
    assert str(ended.value).startswith("attnlab-train: multirun: 0 finished, 2 failed (see ")
    told = ("no trial of this study returned optimized_metric=best/val/bleu (each failed or lacks it: see "
            "the errors above): there is no best trial, so no optimization_results.yaml")  # fmt: skip
    assert caplog.messages.count(told) == 1 and not (sweep_dir / "optimization_results.yaml").exists()
    assert str(ended.value).endswith(
        "; no trial returned optimized_metric=best/val/bleu: the study has no best trial"
    )


def test_a_study_whose_finished_trials_lack_the_metric_fails(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A trial that finished without `optimized_metric` among its final metrics (here `best/val/bleu` of
    data without text) returns nothing to Optuna: a study of such trials has no best trial, and the
    multirun fails (exit status 1) though its jobs finished. (It exited 0.)"""
    from helpers import command_here

    sweep_dir = tmp_path / "sweep"
    with caplog.at_level("ERROR"), pytest.raises(SystemExit) as ended:
        command_here(monkeypatch, "train", "hparams_search=optuna", "data=synthetic", "model=tiny",
                     "data.n_train=32", "data.n_val=8", "data.n_test=8", "trainer.max_epochs=1",
                     "logger=csv", "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={sweep_dir}")  # fmt: skip
    assert str(ended.value) == (
        "attnlab-train: multirun: 1 finished, 0 failed; no trial returned optimized_metric=best/val/bleu: "
        "the study has no best trial"
    )
    assert not (sweep_dir / "optimization_results.yaml").exists()
