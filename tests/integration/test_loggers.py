"""TensorBoard and MLflow for real, beside W&B (`logger=many`): one short run from the session's translating
model, then each logger's files read back with its own reader (TensorBoard's EventAccumulator, MLflow's
client on the run's local SQLite store, W&B's offline records)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from attnlab.training.pipeline import train
from attnlab.typed import ConfigError
from helpers import compose_train, init_from
from wandb_records import find_run_file, read_wandb_run


@pytest.fixture(scope="module")
def many_run(translating_run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One epoch with every logger (`logger=many`, W&B offline) from the translating model, so the test
    scores are real ones; the CSV history (every column), results.json and the run's last step (last.ckpt's
    `global_step`) are what the loggers are compared with."""
    from attnlab.runs.checkpoint import read_checkpoint

    run_dir = tmp_path_factory.mktemp("loggers") / "run"
    start = translating_run["dir"] / "checkpoints" / "last.ckpt"
    overrides = [*translating_run["data"], *init_from(start), "optim=inverse_sqrt", "optim.peak_lr=1e-4",
                 "optim.warmup_steps=5", "trainer.max_epochs=2", "decode.beam=2", "logger=many",
                 "trainer.log_every_n_steps=2", "logger.mlflow.run_name=loggers-test"]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        for variable in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            patch.delenv(variable, raising=False)
        metrics = train(compose_train(overrides, run_dir))
    with open(run_dir / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    columns = sorted({key for r in rows for key, value in r.items() if value} - {"step", "epoch"})
    assert {"val/bleu", "train/loss_epoch", "train/tokens_per_sec_step", "params/total"} <= set(columns)
    history = {key: [(int(r["step"]), float(r[key])) for r in rows if r.get(key)] for key in columns}
    results = json.loads((run_dir / "results.json").read_text())
    step = read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"]
    assert step > 0 and step == max(s for logged in history.values() for s, _ in logged)
    return {"dir": run_dir, "metrics": metrics, "history": history, "results": results, "step": step}


def _tensorboard(run_dir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def _mlflow(run_dir: Path) -> tuple[Any, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{run_dir / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("attnlab")
    (run,) = client.search_runs([experiment.experiment_id])
    return client, run


def test_tensorboard_holds_the_metrics_history_hyperparameters_and_results(many_run: dict[str, Any]) -> None:
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = _tensorboard(many_run["dir"])
    for key, logged in many_run["history"].items():  # every step of the CSV log, the same values
        assert logged, key
        assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events.Scalars(key)] == logged, key
    results, last = many_run["results"], many_run["step"]  # the final results: at the run's last step
    for name in ("test", "test2"):
        (bleu,) = events.Scalars(f"results/{name}/bleu")
        assert bleu.value == pytest.approx(results["sets"][name]["bleu"], rel=1e-6) and bleu.value >= 60
        (ter,) = events.Scalars(f"results/{name}/ter")
        assert ter.value == pytest.approx(results["sets"][name]["ter"], rel=1e-6)
        assert bleu.step == ter.step == last
    (loss,) = events.Scalars("results/test/loss")
    assert loss.value == pytest.approx(results["test_metrics"]["test/loss"], rel=1e-6) and loss.step == last
    (text,) = events.Tensors("results/test/bleu_signature/text_summary")
    assert text.tensor_proto.string_val[0].decode() == results["sets"]["test"]["bleu_signature"]
    assert text.step == last
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["model/d_model"].number_value == 128  # the module's hyperparameters
    assert hparams["run/seed"].number_value == 1  # the resolved config
    assert hparams["run/logger/tensorboard/name"].string_value == "tensorboard"


def test_mlflow_holds_the_metrics_history_params_and_results(many_run: dict[str, Any]) -> None:
    client, run = _mlflow(many_run["dir"])
    assert run.info.run_name == "loggers-test" and run.info.status == "FINISHED"
    for key, logged in many_run["history"].items():
        history = client.get_metric_history(run.info.run_id, key)
        assert [(m.step, pytest.approx(m.value, rel=1e-6)) for m in history] == logged, key
    params = run.data.params
    assert params["model/d_model"] == "128" and params["optim/peak_lr"] == "0.0001"  # the module's
    assert params["run/seed"] == "1" and params["run/trainer/max_epochs"] == "2"  # the resolved config
    results = many_run["results"]
    for name in ("test", "test2"):
        assert run.data.metrics[f"results/{name}/bleu"] == pytest.approx(results["sets"][name]["bleu"])
        assert run.data.metrics[f"results/{name}/chrf"] == pytest.approx(results["sets"][name]["chrf"])
        assert run.data.tags[f"results/{name}/bleu_signature"] == results["sets"][name]["bleu_signature"]
    assert run.data.metrics["results/test/loss"] == pytest.approx(results["test_metrics"]["test/loss"])
    for key in ("results/test/bleu", "results/test2/ter", "results/test/loss"):  # at the run's last step
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [many_run["step"]], key
    files = sorted(a.path for a in client.list_artifacts(run.info.run_id, "hypotheses"))
    assert files == ["hypotheses/test.txt", "hypotheses/test2.txt"]
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert artifacts.is_relative_to(many_run["dir"] / "mlruns" / "artifacts")  # inside the run directory
    logged = (artifacts / "hypotheses" / "test.txt").read_text(encoding="utf-8")
    assert logged == (many_run["dir"] / "hypotheses" / "test.txt").read_text(encoding="utf-8")


def test_every_logger_gets_the_same_final_results(many_run: dict[str, Any]) -> None:
    record = read_wandb_run(find_run_file(many_run["dir"]))
    events = _tensorboard(many_run["dir"])
    _, run = _mlflow(many_run["dir"])
    numbers = [k for k, v in record.summary.items() if k.startswith("results/") and isinstance(v, float)]
    assert {"results/test/bleu", "results/test2/chrf", "results/test/loss"} <= set(numbers)
    for key in numbers:
        (scalar,) = events.Scalars(key)
        assert scalar.value == pytest.approx(record.summary[key], rel=1e-6) == run.data.metrics[key], key
    for key, logged in many_run["history"].items():  # W&B's history: every metric of the CSV log too
        rows = [(row["trainer/global_step"], row[key]) for row in record.history if key in row]
        assert [step for step, _ in rows] == [step for step, _ in logged], key
        assert [value for _, value in rows] == pytest.approx([value for _, value in logged], rel=1e-6), key


def test_final_results_reach_tensorboard_and_mlflow_at_the_given_step_texts_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`log_results` without a run: results.json's numbers (`RESULT_KEYS` of each set, the test metrics)
    as TensorBoard scalars (and the HParams dashboard's metrics) and MLflow metrics at the step it is
    given, its signatures as TensorBoard text and MLflow tags, the hypotheses files as MLflow artifacts; the
    set entries' other keys (files, timings, details) go to neither."""
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.plugins.hparams import plugin_data_pb2

    from attnlab.runs.tracking import MLflowLogger, log_results

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    entry = {"bleu": 31.5, "chrf": 55.25, "ter": 50.0, "bleu_signature": "nrefs:1|tok:13a", "sentences": 3,
             "bleu_details": {"bp": 1.0}, "hypotheses": "hypotheses/test.txt", "decode_seconds": 0.5,
             "unfinished": 0}  # fmt: skip
    results = {"sets": {"test": entry}, "test_metrics": {"test/loss": 1.5}}
    (tmp_path / "hypotheses").mkdir()
    (tmp_path / "hypotheses" / "test.txt").write_text("a b\n", encoding="utf-8")
    tensorboard = TensorBoardLogger(str(tmp_path), name="tensorboard", version="", default_hp_metric=False)
    tensorboard.log_hyperparams({"seed": 1})
    mlflow = MLflowLogger(save_dir=str(tmp_path))
    log_results([tensorboard, mlflow], results, tmp_path, step=7)

    numbers = {"results/test/bleu": 31.5, "results/test/chrf": 55.25, "results/test/ter": 50.0,
               "results/test/sentences": 3.0, "results/test/loss": 1.5}  # fmt: skip
    events = _tensorboard(tmp_path)
    assert {key: [(e.step, e.value) for e in events.Scalars(key)] for key in numbers} == {
        key: [(7, value)] for key, value in numbers.items()
    }
    assert {tag for tag in events.Tags()["scalars"] if tag.startswith("results/")} == set(numbers)
    (text,) = events.Tensors("results/test/bleu_signature/text_summary")
    assert (text.step, text.tensor_proto.string_val[0].decode()) == (7, "nrefs:1|tok:13a")
    hparams = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/experiment"]
    )
    assert {m.name.tag for m in hparams.experiment.metric_infos} == set(numbers)  # the HParams dashboard's
    client, run = _mlflow(tmp_path)
    assert {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
            for key in run.data.metrics} == {key: [(7, value)] for key, value in numbers.items()}  # fmt: skip
    assert {k: v for k, v in run.data.tags.items() if k.startswith("results/")} == {
        "results/test/bleu_signature": "nrefs:1|tok:13a"
    }
    files = [a.path for a in client.list_artifacts(run.info.run_id, "hypotheses")]
    assert files == ["hypotheses/test.txt"]


@pytest.mark.parametrize(
    ("logger", "module"), [("tensorboard", "tensorboard"), ("mlflow", "mlflow"), ("many", "sqlalchemy")]
)
def test_a_missing_logger_package_is_refused_before_training(
    tmp_path: Path, logger: str, module: str
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, module, None)  # as if it were not installed
        with pytest.raises(ConfigError, match=rf"needs {module}.*pip install \"attnlab\[loggers\]\""):
            train(compose_train(["data=synthetic", "model=tiny", f"logger={logger}"], tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # nothing written, no data prepared


def test_mlflow_defaults_a_local_store_and_a_name_from_the_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hydra.core.hydra_config import HydraConfig

    from attnlab.runs.tracking import MLflowLogger
    from attnlab.training.pipeline import plan_run

    cfg = compose_train(["data=synthetic", "model=tiny", "logger=mlflow", "seed=3"], tmp_path / "run",
                        hydra_node=True)  # fmt: skip
    HydraConfig.instance().set_config(cfg)
    try:
        plan = plan_run(cfg)
    finally:
        HydraConfig.instance().cfg = None
    name = plan.resolved["logger"]["mlflow"]["run_name"]
    assert name == "data=synthetic,model=tiny,seed=3"  # logger=, trainer.enable_progress_bar=: bookkeeping
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    local = MLflowLogger(save_dir=str(tmp_path / "run"))
    assert local._tracking_uri == f"sqlite:///{tmp_path / 'run' / 'mlruns' / 'mlflow.db'}"
    shared = f"sqlite:///{tmp_path / 'shared.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", shared)
    assert MLflowLogger(save_dir=str(tmp_path / "other"))._tracking_uri == shared
    assert not (tmp_path / "other").exists()  # nothing made in the run directory for another store


def test_a_resumed_run_continues_the_same_mlflow_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`resume=true` logs into the MLflow run the first part started (its id kept in manifest.json as
    `mlflow_run_id`): one run in the store, holding every epoch's validation loss and ending FINISHED."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "run"
    overrides = ["data=synthetic", "model=tiny", "data.n_train=64", "data.n_val=16", "data.n_test=16",
                 "data.batch_size=16", "logger=mlflow", "test=false",
                 "trainer.log_every_n_steps=1"]  # fmt: skip
    train(compose_train([*overrides, "trainer.max_epochs=1"], run_dir))
    first = json.loads((run_dir / "manifest.json").read_text())["mlflow_run_id"]
    train(compose_train([*overrides, "trainer.max_epochs=2", "resume=true"], run_dir))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["mlflow_run_id"] == first and len(manifest["resumed"]) == 1
    client, run = _mlflow(run_dir)  # exactly one run
    assert run.info.run_id == first and run.info.status == "FINISHED"
    assert run.data.params["run/trainer/max_epochs"] == "1"  # params keep the first part's values
    with open(run_dir / "csv" / "metrics.csv") as f:
        logged = [(int(r["step"]), float(r["val/loss"])) for r in csv.DictReader(f) if r.get("val/loss")]
    history = client.get_metric_history(first, "val/loss")
    assert len(logged) == 2 and [(m.step, pytest.approx(m.value, rel=1e-6)) for m in history] == logged
    assert [m.step for m in client.get_metric_history(first, "params/total")] == [0]  # logged once, by part 1


def test_a_continued_run_logs_to_its_saved_tracker_runs_unless_the_config_names_others(
    many_run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`build_trainer` given a continued run's saved W&B and MLflow run ids (manifest.json's `wandb_run_id`,
    `mlflow_run_id`): its loggers continue those runs; an id the config gives (`logger.wandb.id`,
    `+logger.mlflow.run_id`) wins over the saved one. (A copy of `many_run`'s MLflow store holds both runs:
    a new store's tables take long to create.)"""
    import shutil

    from attnlab.runs.tracking import MLflowLogger
    from attnlab.runs.wandb import WandbLogger
    from attnlab.training.pipeline import build_data, build_trainer, plan_run

    shutil.copy(many_run["dir"] / "mlruns" / "mlflow.db", tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for variable in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.delenv(variable, raising=False)
    saved = _mlflow(many_run["dir"])[1].info.run_id
    given = MLflowLogger(save_dir=str(tmp_path)).run_id  # a second run in the store
    cases = {
        (): ("w-saved", saved),
        ("logger.wandb.id=w-own", f"+logger.mlflow.run_id={given}"): ("w-own", given),
    }
    for own, (wandb_id, mlflow_id) in cases.items():
        overrides = ["data=synthetic", "model=tiny", "data.n_train=32", "logger=many", *own]
        plan = plan_run(compose_train(overrides, tmp_path / f"run{len(own)}"))
        loggers = build_trainer(plan, build_data(plan), wandb_id="w-saved", mlflow_id=saved).loggers
        assert [lg.version for lg in loggers if isinstance(lg, WandbLogger)] == [wandb_id], own
        assert [lg.run_id for lg in loggers if isinstance(lg, MLflowLogger)] == [mlflow_id], own


def test_resuming_when_the_mlflow_store_lost_the_run_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resumed run whose MLflow run is not in the store it logs to (here another store, as after a
    changed MLFLOW_TRACKING_URI or a deleted mlruns/) is refused before training, naming manifest.json's
    mlflow_run_id and the fixes; its checkpoint is untouched, and the fix (logger=csv) resumes it."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "run"
    overrides = ["data=synthetic", "model=tiny", "data.n_train=64", "data.n_val=16", "data.n_test=16",
                 "data.batch_size=16", "test=false"]  # fmt: skip
    train(compose_train([*overrides, "logger=mlflow", "trainer.max_epochs=1"], run_dir))
    run_id = json.loads((run_dir / "manifest.json").read_text())["mlflow_run_id"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")  # an empty store
    last = run_dir / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    with pytest.raises(ConfigError, match=f"MLflow run {run_id} .*manifest.json's mlflow_run_id.*logger=csv"):
        train(compose_train([*overrides, "logger=mlflow", "trainer.max_epochs=2", "resume=true"], run_dir))
    assert last.read_bytes() == before
    train(compose_train([*overrides, "logger=csv", "trainer.max_epochs=2", "resume=true"], run_dir))
    assert json.loads((run_dir / "manifest.json").read_text())["resumed"]


def test_continuing_an_mlflow_run_from_a_run_directory_without_its_store_is_refused(tmp_path: Path) -> None:
    """A run directory whose mlruns/ is gone (a fresh store made there) holds no run of the kept id."""
    from attnlab.runs.tracking import MLflowLogger

    missing = r"MLflow run 0{32} this run continues .* not in the MLflow store sqlite"
    with pytest.raises(ConfigError, match=missing):
        MLflowLogger(save_dir=str(tmp_path), run_id="0" * 32).check_continued_run()
    MLflowLogger(save_dir=str(tmp_path)).check_continued_run()  # a new run: nothing to check


def test_a_continued_mlflow_run_logs_params_on_rank_zero_only(tmp_path: Path) -> None:
    """Under DDP the other ranks' loggers hold no MLflow client: their params call is a no-op (reading a
    continued run's logged params there would fail)."""
    from lightning.pytorch.utilities import rank_zero_only

    from attnlab.runs.tracking import MLflowLogger

    logger = MLflowLogger(save_dir=str(tmp_path), run_id="0" * 32)
    rank = rank_zero_only.rank
    rank_zero_only.rank = 1
    try:
        logger.log_hyperparams({"a": 1})  # rank 1: nothing to read or write
    finally:
        rank_zero_only.rank = rank
