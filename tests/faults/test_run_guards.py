"""A run that would train nothing, or could not finish, says so before doing the work.

Each test runs the real pipeline (`train(cfg)` in-process, or the CLI where its exit code and message are
what is tested) on a tiny corpus written into `tmp_path`, and checks that the run is refused before
training with a message naming the keys, their values and the counts, and that nothing claims success.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import pytest
from hydra.experimental.callback import Callback

from attnlab.data.download import DataError
from attnlab.io import FileLock
from attnlab.runs.layout import RUN_LOCK, RunDir
from attnlab.training.pipeline import train
from attnlab.typed import ConfigError
from helpers import command_here, compose_app, compose_train, saved_run, subprocess_path
from runs import RUN, running

WORDS = ["ein", "mann", "frau", "hund", "katze", "spielt", "läuft", "im", "park", "mit", "ball", "und"]


def write_corpus(corpus: Path, sizes: dict[str, int], seed: int = 0) -> Path:
    """`<corpus>/<split>.de|en` with `sizes[split]` lines of 3-8 words (an empty file for 0)."""
    rng = random.Random(seed)
    corpus.mkdir(parents=True, exist_ok=True)
    for split, n in sizes.items():
        lines = [" ".join(rng.choices(WORDS, k=rng.randint(3, 8))) for _ in range(n)]
        for lang in ("de", "en"):
            (corpus / f"{split}.{lang}").write_text("".join(f"{line}\n" for line in lines))
    return corpus


def corpus_run(tmp_path: Path, sizes: dict[str, int] | None = None) -> list[str]:
    corpus = write_corpus(tmp_path / "corpus", sizes or {"train": 40, "valid": 4, "test": 4})
    return [
        "data=files", f"data.dir={corpus}", "data.src_lang=de", "data.tgt_lang=en", "data.vocab_size=60",
        f"data.cache_dir={tmp_path / 'cache'}", "model=tiny", "trainer.max_epochs=1", "logger=csv",
        "decode.beam=1",
    ]  # fmt: skip


def assert_refused_before_training(run_dir: Path) -> None:
    """Nothing was trained or scored, and the run is not recorded as finished."""
    assert not (run_dir / "checkpoints").exists()
    assert not (run_dir / "results.json").exists()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed"


def test_every_training_pair_filtered_out_is_an_error_naming_the_filters(tmp_path: Path) -> None:
    overrides = [*corpus_run(tmp_path), "data.max_source_tokens=2", "data.max_length_ratio=1.5"]
    with pytest.raises(DataError) as caught:
        train(compose_train(overrides, tmp_path / "run"))
    message = str(caught.value)
    assert "no training pairs are left" in message and "of the 40 lines" in message
    assert "40 sources longer than data.max_source_tokens=2" in message
    assert "0 targets longer than data.max_target_tokens=256" in message
    assert "pairs beyond data.max_length_ratio=1.5" in message
    assert_refused_before_training(tmp_path / "run")


def test_learned_positions_that_fit_no_training_pair_are_an_error(tmp_path: Path) -> None:
    overrides = [*corpus_run(tmp_path), "model.pe=learned", "model.max_positions=3"]
    with pytest.raises(
        DataError, match=r"all 40 are longer than the model's model\.max_positions=3"
    ) as caught:
        train(compose_train(overrides, tmp_path / "run"))
    assert "Set model.max_positions>=" in str(caught.value) and "model.pe=sinusoidal" in str(caught.value)
    assert_refused_before_training(tmp_path / "run")


@pytest.mark.parametrize("split", ["valid", "test"])
def test_an_empty_validation_or_test_split_is_refused_before_training(split: str, tmp_path: Path) -> None:
    sizes = {"train": 40, "valid": 4, "test": 4, split: 0}
    with pytest.raises(DataError) as caught:
        train(compose_train(corpus_run(tmp_path, sizes), tmp_path / "run"))
    name = "val" if split == "valid" else "test"
    assert f"split {name!r} is empty" in str(caught.value)
    assert str(tmp_path / "corpus" / f"{split}.de") in str(caught.value)
    assert_refused_before_training(tmp_path / "run")


def test_an_empty_test_split_is_refused_only_when_the_run_tests(tmp_path: Path) -> None:
    """README: an empty test set is refused before training with `test=true`; with `test=false` the run
    never reads it, so it trains."""
    sizes = {"train": 40, "valid": 4, "test": 0}
    with pytest.raises(DataError) as caught:
        train(compose_train([*corpus_run(tmp_path, sizes), "test=true"], tmp_path / "tested"))
    assert f"split 'test' is empty ({tmp_path / 'corpus' / 'test.de'} and" in str(caught.value)
    assert "set test=false to skip the final evaluation" in str(caught.value)
    assert_refused_before_training(tmp_path / "tested")

    run_dir = tmp_path / "untested"
    train(compose_train([*corpus_run(tmp_path, sizes), "test=false", *while_running(run_dir)], run_dir))
    assert "lock" in WhileRunning.seen  # fitting started
    assert list((run_dir / "checkpoints").glob("*.ckpt"))
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "finished"


@pytest.mark.parametrize(("override", "message"), [
    ("+trainer.max_epoch=3", "trainer.max_epoch is not a parameter of "
     "lightning.pytorch.trainer.trainer.Trainer; did you mean trainer.max_epochs?"),
    ("+callbacks.last_checkpoint.every_n_train_step=4", "callbacks.last_checkpoint.every_n_train_step is "
     "not a parameter of attnlab.training.callbacks.LastCheckpoint; did you mean "
     "callbacks.last_checkpoint.every_n_train_steps?"),
    ("+logger.csv.flush_logs_every=10", "logger.csv.flush_logs_every is not a parameter of "
     "lightning.pytorch.loggers.csv_logs.CSVLogger; did you mean logger.csv.flush_logs_every_n_steps?"),
    ("+callbacks.model_checkpont.monitor=val/loss", "callbacks.model_checkpont names no class (_target_), so "
     "nothing would build it: did you mean callbacks.model_checkpoint?"),
    # attnlab's WandbLogger takes **kwargs: checked against what they reach (Lightning's logger, wandb.init)
    ("logger=wandb +logger.wandb.notez=x", "logger.wandb.notez is not a parameter of "
     "attnlab.runs.wandb.WandbLogger; did you mean logger.wandb.notes?"),
    ("logger=wandb +logger.wandb.log_models=true", "logger.wandb.log_models is not a parameter of "
     "attnlab.runs.wandb.WandbLogger; did you mean logger.wandb.log_model?"),
])  # fmt: skip
def test_a_key_no_constructor_takes_is_rejected_before_data_preparation(
    override: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as caught:
        train(compose_train([*corpus_run(tmp_path), *override.split()], tmp_path / "run"))
    assert message in str(caught.value)
    assert not (tmp_path / "cache").exists()  # no data was prepared
    assert not (tmp_path / "run").exists()  # refused before the run started, like other config errors


def test_a_wandb_mode_or_tags_wandb_would_refuse_or_misread_are_rejected_before_data_preparation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A W&B mode W&B does not know (in the config or WANDB_MODE, which wins; empty too) failed with
    pydantic's traceback when W&B started, after the data was prepared, as did a project or tag W&B's own
    settings refuse (a `/` in the project, a tag over 64 characters); `logger.wandb.tags=foo` became the
    tags f, o, o. All are refused when the config is checked, naming the key and the fix."""
    cases = [  # (WANDB_MODE, override, message)
        (None, "logger.wandb.mode=bogus", "logger.wandb.mode='bogus' is no W&B mode: use one of offline,"),
        (
            None,
            "logger.wandb.tags=foo",
            "logger.wandb.tags='foo' must be a list of texts: logger.wandb.tags=[foo]",
        ),
        (None, "logger.wandb.tags=[1,2]", "logger.wandb.tags=[1, 2] must be a list of texts"),
        (None, "logger.wandb.project=a/b", "logger.wandb.project: W&B refuses it (Invalid project name"),
        (None, f"logger.wandb.tags=[{'t' * 65}]", "logger.wandb.tags: W&B refuses it (Tag 'tttt"),
        ("nope", "logger.wandb.mode=offline", "the environment variable WANDB_MODE='nope' is no W&B mode"),
        ("", "logger.wandb.mode=offline", "the environment variable WANDB_MODE='' is no W&B mode: use"),
    ]
    for env, override, message in cases:
        monkeypatch.delenv("WANDB_MODE", raising=False)
        if env is not None:
            monkeypatch.setenv("WANDB_MODE", env)
        with pytest.raises(ConfigError) as caught:
            train(compose_train([*corpus_run(tmp_path), "logger=wandb", override], tmp_path / "run"))
        assert str(caught.value).startswith(message), str(caught.value)
        assert str(caught.value).endswith("(or unset it)") == (env is not None)  # the fix for WANDB_MODE
        assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_null_wandb_tags_are_no_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`logger.wandb.tags=null` passed the config check and then failed the run once it had started, with
    Hydra's `TypeError("'NoneType' object is not iterable")` for logger.wandb: null is no tags, as it is
    for `logger.mlflow.tags`."""
    from attnlab.runs.wandb import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "disabled")
    for variable in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.setenv(variable, "")  # (recorded: the logger's own values are undone after the test)
        monkeypatch.delenv(variable)
    cfg = compose_train(["data=synthetic", "logger=wandb", "logger.wandb.tags=null"], tmp_path)
    WandbLogger.check_config("logger.wandb", cfg.logger.wandb)
    logger = WandbLogger(save_dir=str(tmp_path), tags=cfg.logger.wandb.tags)
    assert logger._wandb_init["tags"] == []


def test_mlflow_tags_or_experiment_name_of_the_wrong_kind_are_rejected_before_data_preparation(
    tmp_path: Path,
) -> None:
    """`logger.mlflow.tags=foo` failed as `ValueError('dictionary update sequence element #0 ...')` with
    Hydra's "full_key: logger.mlflow" once the data was prepared, and a null experiment name failed in
    MLflow: both are refused when the config is checked, naming the key and the form it takes."""
    pytest.importorskip("mlflow", reason='needs the [loggers] extra: pip install -e ".[loggers]"')
    for override, message in (
        ("logger.mlflow.tags=foo", "logger.mlflow.tags='foo' must map tag names to values, e.g. "
         "+logger.mlflow.tags.a=b"),
        ("logger.mlflow.experiment_name=null", "logger.mlflow.experiment_name=None must be a name (text)"),
        ("logger.mlflow.experiment_name=''", "logger.mlflow.experiment_name='' must be a name (text)"),
        (f"logger.mlflow.experiment_name={'x' * 501}", "logger.mlflow.experiment_name: MLflow refuses it "
         "('name' exceeds the maximum length of 500 characters): set another"),
        ("logger.mlflow.experiment_name=' '", "logger.mlflow.experiment_name: MLflow refuses it (Invalid "
         "experiment name: ' ')"),
    ):  # fmt: skip
        with pytest.raises(ConfigError) as caught:
            train(compose_train([*corpus_run(tmp_path), "logger=mlflow", override], tmp_path / "run"))
        assert str(caught.value).startswith(message), str(caught.value)
        assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("uri", ["htp://localhost:5000", "fiel:/tmp/mlruns", "localhost:5000", "s3://b/x"])
def test_an_mlflow_tracking_uri_of_a_scheme_mlflow_has_no_store_for_is_refused_before_data_preparation(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in `logger.mlflow.tracking_uri` (or `MLFLOW_TRACKING_URI`, which it falls back on) failed
    with MLflow's UnsupportedModelRegistryStoreURIException once the data was prepared: refused when the
    config is checked, naming the key, the scheme and the accepted forms (not the URI: it may hold a
    password), leaving nothing behind."""
    pytest.importorskip("mlflow", reason='needs the [loggers] extra: pip install -e ".[loggers]"')
    accepted = (
        "Use sqlite:////abs/path/mlflow.db (or postgresql://, mysql://, mssql://), http://host:5000 or "
        "https://... (a tracking server), databricks, or a local path or file:///abs/path with "
        "MLFLOW_ALLOW_FILE_STORE=true"
    )
    scheme = uri.split(":")[0]
    for override, key in ((f"logger.mlflow.tracking_uri={uri}", "logger.mlflow.tracking_uri"),
                          ("logger.mlflow.tracking_uri=null", "MLFLOW_TRACKING_URI")):  # fmt: skip
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        with pytest.raises(ConfigError) as caught:
            train(compose_train([*corpus_run(tmp_path), "logger=mlflow", override], tmp_path / "run"))
        assert str(caught.value) == f"{key}: MLflow keeps no runs at a {scheme}: URI. {accepted}"
        assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_an_mlflow_artifact_location_of_a_scheme_mlflow_has_no_store_for_is_refused_before_data_preparation(
    tmp_path: Path,
) -> None:
    """A typo in `logger.mlflow.artifact_location` (`s4://`) created the experiment, trained the whole run
    and failed when the hypotheses files were uploaded at its end: refused when the config is checked,
    naming the key, the scheme and the accepted forms, leaving nothing behind. Every form MLflow's registry
    of artifact stores takes passes."""
    pytest.importorskip("mlflow", reason='needs the [loggers] extra: pip install -e ".[loggers]"')
    from attnlab.runs.tracking import check_artifact_location

    override = "+logger.mlflow.artifact_location=s4://bucket/artifacts"
    with pytest.raises(ConfigError) as caught:
        train(compose_train([*corpus_run(tmp_path), "logger=mlflow", override], tmp_path / "run"))
    assert str(caught.value).startswith(
        "logger.mlflow.artifact_location: MLflow stores no artifacts at a s4: URI. Use a local path or "
        "file:///abs/path, s3://bucket/path"
    ), str(caught.value)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()
    for uri in ("runs:/abc/artifacts", "sqlite:////tmp/a.db", "localhost:5000"):  # no place for artifacts
        with pytest.raises(ConfigError, match="MLflow stores no artifacts at a"):
            check_artifact_location("logger.mlflow.artifact_location", uri)
    for uri in ("artifacts", str(tmp_path), "C:\\artifacts", "file:///tmp/a", "s3://b/p", "gs://b/p",
                "wasbs://c@a.blob.core.windows.net/p", "abfss://c@a.dfs.core.windows.net/p", "dbfs:/p",
                "hdfs://host/p", "sftp://user@host/p", "https://host/p", "mlflow-artifacts:/p", "r2://b/p",
                "b2://b/p", "viewfs://c/p", "ftp://host/p", "http://host/p"):  # fmt: skip
        check_artifact_location("logger.mlflow.artifact_location", uri)


def test_every_tracking_uri_form_mlflow_accepts_passes_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server, Databricks and the databases (with a driver too) pass, as MLflow's own registry of stores
    takes them; a file store (a local path: relative, absolute, a Windows drive's; or file:), which MLflow 3
    refuses once the run has started unless MLFLOW_ALLOW_FILE_STORE=true, only with that variable."""
    pytest.importorskip("mlflow", reason='needs the [loggers] extra: pip install -e ".[loggers]"')
    from attnlab.runs.tracking import check_tracking_uri

    for uri in ("http://localhost:5000", "HTTPS://mlflow.example.org", "databricks", "databricks://profile",
                "databricks-uc", "uc", "sqlite:////tmp/mlflow.db", "postgresql+psycopg2://user@host/db",
                "mysql://host/db", "mssql+pyodbc://host/db"):  # fmt: skip
        check_tracking_uri("logger.mlflow.tracking_uri", uri)
    file_stores = ("mlruns", str(tmp_path), "C:\\mlruns", "file:///tmp/mlruns")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    for uri in file_stores:
        with pytest.raises(ConfigError) as caught:
            check_tracking_uri("logger.mlflow.tracking_uri", uri)
        assert str(caught.value) == (
            f"logger.mlflow.tracking_uri={uri}: MLflow 3 refuses a file store (a local path or file:) unless "
            "MLFLOW_ALLOW_FILE_STORE=true: use a database, e.g. sqlite:////abs/path/mlflow.db, or set "
            "MLFLOW_ALLOW_FILE_STORE=true"
        )
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "yes")
    with pytest.raises(ConfigError, match=r"^MLFLOW_ALLOW_FILE_STORE='yes' is no boolean: set it to true or"):
        check_tracking_uri("logger.mlflow.tracking_uri", "mlruns")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for uri in file_stores:
        check_tracking_uri("logger.mlflow.tracking_uri", uri)


def test_an_installed_mlflow_plugins_schemes_pass_the_checks_and_are_named_in_a_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package registering an MLflow tracking store or artifact repository (entry points of
    `mlflow.tracking_store`, `mlflow.artifact_repository`) adds its scheme to the accepted ones, and the
    refusal of an unknown scheme names it (README, Tracking: installed plugins' schemes)."""
    from attnlab.runs.tracking import check_artifact_location, check_tracking_uri

    info = tmp_path / "attnlab_scheme_plugin-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: attnlab-scheme-plugin\nVersion: 0\n")
    entry_points = "[mlflow.tracking_store]\nrunstore = p:S\n\n[mlflow.artifact_repository]\nartstore = p:R\n"
    (info / "entry_points.txt").write_text(entry_points)
    monkeypatch.syspath_prepend(str(tmp_path))
    check_tracking_uri("logger.mlflow.tracking_uri", "runstore://host/db")
    check_artifact_location("logger.mlflow.artifact_location", "artstore://bucket/p")
    refusal = r"at a artstore: URI\. .*, or an installed plugin's \(runstore:\)$"
    with pytest.raises(ConfigError, match=refusal):
        check_tracking_uri("logger.mlflow.tracking_uri", "artstore://host/db")


def cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m <module> <args>` as a user runs it (without HYDRA_FULL_ERROR, which the tests set)."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["ATTNLAB_LOG_DIR"] = str(cwd / "logs")
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=cwd)  # fmt: skip


@pytest.mark.parametrize(("command", "args", "told"), [
    ("eval", [], "attnlab-eval: ckpt_path=<checkpoint file or run directory> is required"),
    ("export", ["ckpt_path=a.ckpt"], "attnlab-export: format= is required"),
    ("train", ["model.n_heads=3"], "attnlab-train: config error: model.n_heads=3 does not divide"),
])  # fmt: skip
def test_a_refused_command_leaves_no_run_directory_and_keeps_one_that_existed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, args: list[str], told: str
) -> None:
    """Each mistyped command left a run directory holding only Hydra's record of it (`.hydra/`): removed
    with the parents Hydra made for it, those of the path as written too (`made/../new` makes `made`). A
    run directory that existed before the command is kept, and so are the directories above it that
    existed."""
    (tmp_path / "kept").mkdir()
    runs = [
        (tmp_path / "kept/new/run", ["kept"]),
        (tmp_path / "made/../new", ["kept"]),
        (tmp_path / "kept", ["kept"]),
    ]
    for run_dir, left in runs:
        with pytest.raises(SystemExit, match=f"^{re.escape(told)}"):
            command_here(monkeypatch, command, *args, f"hydra.run.dir={run_dir}")
        assert sorted(p.name for p in tmp_path.iterdir()) == left
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == [".hydra"]  # as Hydra left it


def test_a_run_directory_under_a_file_is_refused_naming_hydra_run_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory\n")
    done = cli("attnlab.cli.train", "data=synthetic", "model=tiny", f"hydra.run.dir={blocker / 'run'}",
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr + done.stdout
    assert f"cannot create the run directory {blocker / 'run'}" in done.stderr
    assert "set hydra.run.dir" in done.stderr
    assert blocker.read_text() == "not a directory\n"


def test_a_logger_directory_that_cannot_be_written_is_refused_before_data_preparation(tmp_path: Path) -> None:
    """`logger.*.save_dir` under a file (or anywhere not writable) failed with Lightning's traceback when
    training began, after the data was prepared and the model built: refused before, naming the key. The
    refused run leaves none of the directories it made (the run directory and its parents, the other
    loggers'), and keeps the one that existed before, empty as it is."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory\n")
    (tmp_path / "kept").mkdir()
    overrides = [*corpus_run(tmp_path), "logger=tensorboard", f"logger.csv.save_dir={tmp_path / 'kept/a/b'}",
                 f"logger.tensorboard.save_dir={blocker / 'logs'}"]  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        train(compose_train(overrides, tmp_path / "new" / "run"))
    assert str(caught.value) == (
        f"logger.tensorboard.save_dir={blocker / 'logs'}: cannot create it or write in it (Not a directory): "
        "set it to a writable directory (by default the run directory, ${paths.output_dir}), or fix its "
        "permissions"
    )
    assert not (tmp_path / "cache").exists()  # no data was prepared
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "corpus", "kept"]  # no "new"
    assert list((tmp_path / "kept").iterdir()) == [] and blocker.read_text() == "not a directory\n"


def test_a_wandb_dir_that_cannot_be_written_is_refused_as_a_save_dir_is(tmp_path: Path) -> None:
    """W&B writes into `logger.wandb.dir` when it is set (its `save_dir` otherwise): checked the same way."""
    from attnlab.runs.tracking import check_logger_directories

    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory\n")
    loggers = {"wandb": {"save_dir": str(tmp_path / "run"), "dir": str(blocker / "wandb")}}
    with pytest.raises(
        ConfigError, match=re.escape(f"logger.wandb.dir={blocker / 'wandb'}: cannot create it")
    ):
        check_logger_directories(loggers)


@pytest.mark.parametrize("name", ["config.yaml", "manifest.json", "csv/metrics.csv"])
def test_a_directory_where_the_run_writes_a_record_is_refused_before_anything_changes(
    name: str, tmp_path: Path
) -> None:
    """A directory at config.yaml failed the run with an IsADirectoryError, at manifest.json after
    config.yaml was written, at csv/metrics.csv inside `trainer.fit`, when the CSV logger saved: refused
    before anything is written, naming it and the fix."""
    run_dir = tmp_path / "run"
    (run_dir / name).mkdir(parents=True)
    with pytest.raises(ConfigError) as caught:
        train(compose_train([*RUN, "trainer.max_epochs=1", "test=false"], run_dir))
    assert str(caught.value) == (
        f"{run_dir / name} is a directory where the run writes its {Path(name).name}: move it aside, or run "
        "in another directory (hydra.run.dir=...)"
    )
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == [
        Path(part) for part in ([name] if "/" not in name else ["csv", name])
    ]


def test_a_new_run_in_a_directory_holding_a_saved_run_is_refused_before_anything_changes(
    tmp_path: Path,
) -> None:
    """`attnlab-train hydra.run.dir=<a finished run>` (resume=false) trained over it: its checkpoints,
    config, manifest and metrics overwritten. Refused, naming what is there and the fixes."""
    run_dir = tmp_path / "run"
    before = saved_run(run_dir, "finished", ["best-epoch003.ckpt", "last.ckpt"])
    done = cli("attnlab.cli.train", "data=synthetic", "model=tiny", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (
        f"attnlab-train: config error: the run directory {run_dir} holds a run already (status finished, "
        "checkpoints best-epoch003.ckpt, last.ckpt): a new run there would overwrite it. resume=true "
        "continues it"
    ) in done.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # no .hydra/ either


@pytest.mark.parametrize("checkpoints", [[], ["best-epoch003.ckpt"]])
def test_a_saved_run_without_last_ckpt_is_not_said_to_continue_with_resume(
    tmp_path: Path, checkpoints: list[str]
) -> None:
    """Without checkpoints/last.ckpt, resume=true is refused ("last.ckpt does not exist") and resume=auto
    starts afresh over the run: the refusal does not offer them."""
    run_dir = tmp_path / "run"
    saved_run(run_dir, "finished", checkpoints)
    with pytest.raises(ConfigError) as caught:
        RunDir(run_dir).check_no_run()
    assert "resume=" not in str(caught.value)
    assert "it has no checkpoints/last.ckpt to continue from; for a new run, set hydra.run.dir" in str(
        caught.value
    )


@pytest.mark.parametrize(
    ("status", "checkpoints", "overrides", "refused"),
    [("failed", [], {}, False), ("running", ["last.ckpt"], {}, True), ("finished", [], {}, True),
     ("running", ["last.ckpt"], {"resume": "auto"}, False), ("finished", [], {"resume": "auto"}, True),
     ("failed", [], {"resume": "auto"}, False),
     ("running", ["last.ckpt"], {"resume": True}, False),
     ("running", ["last.ckpt"], {"ckpt_path": "last"}, False),
     ("running", ["last.ckpt"], {"ckpt_path": "/elsewhere/last.ckpt"}, True),
     ("finished", ["last.ckpt"], {"ckpt_path": "<run>/checkpoints/last.ckpt"}, False),
     ("finished", ["best.ckpt", "last.ckpt"], {"ckpt_path": "<run>/checkpoints/best.ckpt"}, True),
     ("finished", ["last.ckpt"], {"sweep": {"skip_done": True}}, False),
     ("running", ["last.ckpt"], {"sweep": {"skip_done": True}}, True)],
)  # fmt: skip
def test_which_saved_runs_a_new_run_may_start_over(
    tmp_path: Path, status: str, checkpoints: list[str], overrides: dict[str, Any], refused: bool
) -> None:
    """A failed run with no checkpoint is started over (a sweep's failed job runs again in its directory);
    one with checkpoints, or finished, is not, unless the command continues it."""
    from omegaconf import OmegaConf

    from attnlab.cli.app import RunDirectoryCheck

    run_dir = tmp_path / "run"
    saved_run(run_dir, status, checkpoints)
    if "ckpt_path" in overrides:  # the run's own last.ckpt by its path continues the run (`plan_run`)
        overrides = {**overrides, "ckpt_path": overrides["ckpt_path"].replace("<run>", str(run_dir))}
    config = OmegaConf.create({"hydra": {"run": {"dir": str(run_dir)}}, "task_name": "train", "resume": False,
                               "ckpt_path": None, **overrides})  # fmt: skip
    if refused:
        with pytest.raises(SystemExit, match=f"the run directory {run_dir} holds a run already"):
            RunDirectoryCheck().on_run_start(config)
    else:
        RunDirectoryCheck().on_run_start(config)


@pytest.mark.parametrize(("command", "status", "checkpoints"),
                         [("eval", "finished", ["best-epoch003.ckpt", "last.ckpt"]), ("eval", "failed", []),
                          ("export", "running", ["last.ckpt"])])  # fmt: skip
def test_eval_or_export_in_a_directory_holding_a_training_run_is_refused_before_anything_changes(
    tmp_path: Path, command: str, status: str, checkpoints: list[str]
) -> None:
    """`attnlab-eval hydra.run.dir=<a training run>` (or `paths.output_dir=`) replaced the run's
    results.json (its final scores and metrics), hypotheses and references, and Hydra its .hydra/ record
    of the training command, with the evaluation's; attnlab-export the record. Refused before anything is
    written, naming the fix; a directory of an earlier evaluation is written again."""
    run_dir = tmp_path / "run"
    before = saved_run(run_dir, status, checkpoints)
    (run_dir / "results.json").write_text('{"sets": {}}')
    before[run_dir / "results.json"] = b'{"sets": {}}'
    exported = ["format=hf", f"out={tmp_path / 'out'}"] if command == "export" else []
    done = cli(f"attnlab.cli.{command}", f"ckpt_path={run_dir}", *exported, f"hydra.run.dir={run_dir}",
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    held = f"checkpoints {', '.join(checkpoints)}" if checkpoints else "no checkpoint"
    assert done.stderr.startswith(
        f"attnlab-{command}: config error: hydra.run.dir={run_dir} holds a training run (status {status}, "
        f"{held}): attnlab-{command} would replace its "
    ), done.stderr
    assert f"leave hydra.run.dir out (a new directory under logs/{command}/runs/)" in done.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # no .hydra/ either
    if command == "eval":  # the directory given as paths.output_dir (Hydra's record goes elsewhere)
        from attnlab.cli.eval import evaluate_checkpoint

        told = (rf"^paths.output_dir={run_dir} holds a training run .*replace its results\.json, hypotheses "
                r"and references with its own; leave paths.output_dir")  # fmt: skip
        with pytest.raises(ConfigError, match=told):
            evaluate_checkpoint(compose_app("eval", [f"paths.output_dir={run_dir}", f"ckpt_path={run_dir}"]))
        assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    earlier = tmp_path / "earlier_eval"  # what attnlab-eval leaves: results, hypotheses, its record
    (earlier / "hypotheses").mkdir(parents=True)
    (earlier / "results.json").write_text('{"sets": {}}')
    from omegaconf import OmegaConf

    from attnlab.cli.app import RunDirectoryCheck

    RunDirectoryCheck().on_run_start(OmegaConf.create({"hydra": {"run": {"dir": str(earlier)}},
                                                      "task_name": command}))  # fmt: skip


def test_the_other_processes_of_a_ddp_run_start_in_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 takes the run directory; the others (`LOCAL_RANK`/`RANK` > 0) start in it, whatever it holds."""
    from attnlab.runs.layout import RunDir

    saved_run(tmp_path / "run", "finished", ["last.ckpt"])
    monkeypatch.setenv("LOCAL_RANK", "1")
    RunDir(tmp_path / "run").check_no_run()
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ConfigError, match="holds a run already"):
        RunDir(tmp_path / "run").check_no_run()


def test_attnlab_eval_without_ckpt_path_says_what_is_required(tmp_path: Path) -> None:
    done = cli("attnlab.cli.eval", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "attnlab-eval: ckpt_path=<checkpoint file or run directory> is required (ensembles: "
        "ckpt_path=[a,b] ensemble=true)"
    )


def test_attnlab_export_of_a_list_of_checkpoints_says_it_exports_one_model(tmp_path: Path) -> None:
    from attnlab.cli.export import export_checkpoint

    files = [tmp_path / "a.ckpt", tmp_path / "b.ckpt"]
    for file in files:
        file.write_bytes(b"never read")
    listed = f"ckpt_path=[{files[0]},{files[1]}]"
    cfg = compose_app(
        "export", [f"paths.output_dir={tmp_path}", listed, "format=ctranslate2", f"out={tmp_path / 'out'}"]
    )
    with pytest.raises(ConfigError) as caught:
        export_checkpoint(cfg)
    assert "ckpt_path is a list of 2 checkpoints, but attnlab-export writes one model" in str(caught.value)
    assert "ensemble=true" not in str(caught.value)  # attnlab-export has no such key
    assert not (tmp_path / "out").exists()


SYNTHETIC = [*RUN, "data.num_workers=0", "data.n_train=48", "trainer.max_epochs=1",
             "callbacks.last_checkpoint.every_n_train_steps=1"]  # fmt: skip
# (runs.RUN, shortened: 3 optimizer steps, last.ckpt after each)


class WhileRunning(L.Callback):
    """At the start of fitting, records the run directory's lock file and, with `second`, runs a second
    `attnlab-train` in the same run directory (`SYNTHETIC`), recording how it ended."""

    seen: ClassVar[dict[str, Any]] = {}

    def __init__(self, run_dir: str, second: bool = False) -> None:
        self.run_dir, self.second = Path(run_dir), second

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        WhileRunning.seen["lock"] = (self.run_dir / RUN_LOCK).read_text()
        if self.second:
            second = [*SYNTHETIC, f"hydra.run.dir={self.run_dir}"]
            WhileRunning.seen["second"] = cli("attnlab.cli.train", *second, cwd=self.run_dir.parent)


def while_running(run_dir: Path, second: bool = False) -> list[str]:
    WhileRunning.seen.clear()
    return [f"+callbacks.probe._target_={__name__}.WhileRunning", f"+callbacks.probe.run_dir={run_dir}",
            f"+callbacks.probe.second={second}"]  # fmt: skip


def test_a_second_process_in_a_running_run_directory_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(compose_train([*SYNTHETIC, *while_running(run_dir, second=True)], run_dir))
    me = f"{os.getpid()} {socket.gethostname()}"
    assert WhileRunning.seen["lock"] == me + "\n"  # the first process holds the lock, named in it
    second = WhileRunning.seen["second"]
    assert second.returncode == 1 and "Traceback" not in second.stderr
    assert f"the run directory {run_dir} is in use: pid {os.getpid()} on host {socket.gethostname()}" in (
        second.stderr
    )
    assert "set hydra.run.dir to another directory" in second.stderr
    assert not (run_dir / ".hydra").exists()  # refused before Hydra wrote its files into the first's run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "finished" and "error" not in manifest  # the first run's, untouched
    assert (run_dir / RUN_LOCK).read_text() == ""  # released when the run ended
    with FileLock(run_dir / RUN_LOCK, timeout=0):
        pass


class ClaimSeen(Callback):
    """A Hydra callback after attnlab's `RunDirectoryCheck` (`+hydra.callbacks.seen._target_=`): records,
    before Hydra writes anything into the run directory, whether the command holds its lock."""

    seen: ClassVar[dict[str, Any]] = {}

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        run_dir = Path(config.hydra.run.dir)
        ClaimSeen.seen["record"] = (run_dir / ".hydra").exists()
        try:
            with FileLock(run_dir / RUN_LOCK, timeout=0):  # (another open file: refused as another process)
                ClaimSeen.seen["free"] = True
        except TimeoutError:
            ClaimSeen.seen["free"] = False
            ClaimSeen.seen["holder"] = (run_dir / RUN_LOCK).read_text()


def test_a_command_claims_its_run_directory_before_hydra_writes_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two commands started at once on one new run directory both passed the check for a live process
    there (no lock yet), both wrote `.hydra/`, and the one refused first removed the other's record (a
    directory holding only Hydra's files is a refused command's own). The command now holds the run's lock
    from before Hydra writes anything, and a refused command still leaves no directory, lock file included."""
    ClaimSeen.seen.clear()
    run_dir = tmp_path / "new" / "run"
    with pytest.raises(SystemExit, match=r"model.n_heads=5 does not divide d_model=32"):
        seen = f"+hydra.callbacks.seen._target_={__name__}.ClaimSeen"  # (after attnlab's own callback)
        command_here(monkeypatch, "train", "data=synthetic", "model=tiny", "model.n_heads=5", seen,
                     f"hydra.run.dir={run_dir}")  # fmt: skip
    me = f"{os.getpid()} {socket.gethostname()}\n"
    assert ClaimSeen.seen == {"record": False, "free": False, "holder": me}
    assert list(tmp_path.iterdir()) == []  # refused: the run directory and its parent are gone, .lock too


def test_a_refused_command_keeps_what_its_run_directory_held_or_it_wrote_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused command removes only a new run directory holding nothing but Hydra's record of it. One it
    made and started a run in (manifest.json) keeps the record beside the run's files; one that existed
    keeps its files, the lock file of the run before included."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # (a data error's message, no traceback)
    made = tmp_path / "new" / "run"
    empty_valid = corpus_run(tmp_path, {"train": 40, "valid": 0, "test": 4})
    with pytest.raises(SystemExit, match=r"^attnlab-train: data error: .*split 'val' is empty"):
        command_here(monkeypatch, "train", *empty_valid, f"hydra.run.dir={made}")
    assert_refused_before_training(made)
    assert (made / ".hydra" / "overrides.yaml").is_file()

    earlier = tmp_path / "earlier"  # a run that failed before its first checkpoint: started over
    saved_run(earlier, "failed", [])
    (earlier / RUN_LOCK).write_text("")
    with pytest.raises(SystemExit, match=r"model\.n_heads=3 does not divide"):
        command_here(monkeypatch, "train", "data=synthetic", "model=tiny", "model.n_heads=3",
                     f"hydra.run.dir={earlier}")  # fmt: skip
    assert (earlier / RUN_LOCK).is_file() and (earlier / "manifest.json").is_file()


class CrashingCheck(L.Callback):
    """A callback whose own check of its settings (`check_config`, run before the run starts) fails with an
    unexpected error: a command that crashes, with a traceback, after Hydra wrote its record."""

    @classmethod
    def check_config(cls, key: str, node: Any) -> None:
        raise RuntimeError(f"{key}: the check itself is broken")


def test_a_command_that_crashes_keeps_its_run_directory_and_hydra_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a refusal (a one-line message) removes the run directory Hydra made: a command that crashed
    with a traceback (exit status 1) keeps its record (`.hydra/`), what was run, to debug it with."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # (Hydra prints the traceback, exits with 1)
    run_dir = tmp_path / "new" / "run"
    with pytest.raises(SystemExit) as crashed:
        command_here(monkeypatch, "train", "data=synthetic", "model=tiny", f"hydra.run.dir={run_dir}",
                     f"+callbacks.crash._target_={__name__}.CrashingCheck")  # fmt: skip
    assert crashed.value.code == 1
    assert (run_dir / ".hydra" / "overrides.yaml").is_file() and not (run_dir / "manifest.json").exists()


@pytest.mark.parametrize("task", ["eval", "export"])
def test_eval_and_export_are_refused_in_a_directory_another_command_holds(
    task: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """attnlab-eval and attnlab-export write their results and record into their run directory: one
    another live command holds (its `.lock`) is refused at once, naming that process, with nothing
    written (the checkpoint named here does not exist: it is not even looked for)."""
    run_dir = tmp_path / "run"
    extra = ["format=hf", f"out={tmp_path / 'out'}"] if task == "export" else []
    with FileLock(run_dir / RUN_LOCK, record_holder=True), pytest.raises(SystemExit) as refused:
        command_here(
            monkeypatch, task, f"ckpt_path={tmp_path / 'none.ckpt'}", *extra, f"hydra.run.dir={run_dir}"
        )
    me = f"pid {os.getpid()} on host {socket.gethostname()}"
    assert f"attnlab-{task}: config error: the run directory {run_dir} is in use: {me}" in str(refused.value)
    assert [p.name for p in run_dir.iterdir()] == [RUN_LOCK]


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_more_processes_than_batches_of_a_split_is_refused_before_training(
    split: str, tmp_path: Path
) -> None:
    # Two DDP ranks and a 1-sentence split: one rank would have no batch of it (no training batch, or
    # none to validate or test while the other waits at the gather). The refusal comes before
    # `Trainer.fit` starts the second process, so this runs in-process.
    run_dir = tmp_path / "run"
    with pytest.raises(DataError) as caught:
        # the other splits big enough for two processes (batches of 8), and the test set checked (test=true)
        sizes = {"data.batch_size": 8, "data.n_val": 16, "data.n_test": 16, f"data.n_{split}": 1}
        overrides = [*SYNTHETIC, "test=true", *(f"{key}={value}" for key, value in sizes.items())]
        train(compose_train([*overrides, "trainer=ddp_cpu"], run_dir))
    expected = f"split '{split}' has 1 sentence pairs in 1 batches, fewer than the 2 processes of this run"
    assert expected in str(caught.value)
    assert "Use fewer trainer.devices" in str(caught.value)
    assert_refused_before_training(run_dir)


def test_a_failed_run_releases_its_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(DataError, match="split 'test' is empty"):
        train(compose_train(corpus_run(tmp_path, {"train": 40, "valid": 4, "test": 0}), run_dir))
    assert (run_dir / RUN_LOCK).read_text() == ""
    train(compose_train([*SYNTHETIC, *while_running(run_dir)], run_dir))  # the next run takes it
    assert WhileRunning.seen["lock"] == f"{os.getpid()} {socket.gethostname()}\n"


def processes_of(run_dir: Path) -> list[int]:
    """The live processes (not this one) whose environment names `run_dir` in `RUN_OF`: a run started
    with it and every process it started (DataLoader workers come from a fork server, whose command line
    is not the run's, but which inherits the run's environment)."""
    found, entry = [], f"RUN_OF={run_dir}".encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if entry in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def open_files(pid: int) -> set[str]:
    """The files process `pid` has open (empty once it is gone)."""
    try:
        return {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
    except OSError:
        return set()


def test_resuming_a_killed_run_takes_over_its_stale_lock_and_its_worker_processes_end(tmp_path: Path) -> None:
    """Killed (SIGKILL) while its DataLoader worker runs: the worker, the fork server it came from and the
    server's resource tracker end by themselves, none of them holds the run's lock file (a flock is held as
    long as any process has its descriptor), and resume=true right after the kill takes the lock over."""
    run_dir = tmp_path / "run"
    worker = [*SYNTHETIC, "data.num_workers=1"]
    kill = ["+callbacks.kill._target_=probes.SignalAt", "+callbacks.kill.step=2", "+callbacks.kill.signum=9",
            "+callbacks.workers._target_=probes.RecordWorkers",
            f"+callbacks.workers.dirpath={tmp_path}"]  # fmt: skip
    command = [sys.executable, "-m", "attnlab.cli.train", *worker, f"hydra.run.dir={run_dir}", *kill]
    env = {**os.environ, "PYTHONPATH": subprocess_path(), "RUN_OF": str(run_dir)}  # `processes_of` finds them
    with open(tmp_path / "killed.log", "w") as log:  # not a pipe, which the worker would hold open
        killed = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=300, env=env)
    assert killed.returncode == -9  # returns as soon as the main process died
    lock = str((run_dir / RUN_LOCK).resolve())
    assert not [pid for pid in processes_of(run_dir) if lock in open_files(pid)], "a process holds the lock"
    deadline = time.monotonic() + 30  # `attnlab.data.examples.end_with`: at once; torch's own watch: 5 s
    while (left := processes_of(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], f"processes of the killed run still running: {left}"
    workers = [int(pid) for pid in (tmp_path / "workers").read_text().split()]
    assert len(workers) == 2 and not [pid for pid in workers if running(pid)]  # train's and val's
    pid, host = (run_dir / RUN_LOCK).read_text().split()  # left behind by the dead process
    assert (int(pid), host) != (os.getpid(), socket.gethostname())
    train(compose_train([*worker, "resume=true", *while_running(run_dir)], run_dir))
    assert WhileRunning.seen["lock"] == f"{os.getpid()} {socket.gethostname()}\n"
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "finished"
