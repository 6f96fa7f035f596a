"""What every logger gets besides Lightning's metrics, whichever kind it is (W&B, TensorBoard, MLflow).

Lightning sends the metrics history and the module's hyperparameters (`model`, `optim`, `decode`,
`metrics`) to every configured logger. This module adds the rest, the same for each kind:

- `log_run_config(loggers, resolved, manifest)`: the whole resolved config (`run`; W&B also gets the
  manifest) at the start;
- `log_results(loggers, results, output_dir)`: the final results of `results.json`
  (`result_summary`: `results/<set>/bleu`, `chrf`, `ter`, signatures, sentence counts, the test loss) at
  the end — a W&B summary (plus hypotheses tables and an artifact, `attnlab.runs.wandb.log_results`),
  TensorBoard scalars, text and the HParams dashboard's metrics, MLflow metrics, tags and the
  hypotheses files as artifacts;
- `missing_packages(cls)` / `check_logger_packages(key, cls)`: the optional packages a logger class needs
  (the `loggers` extra), checked when the config is, before any data or training;
- `check_logger_directories(loggers)`: the directories the loggers write into, created and checked
  writable before the run starts;
- `MLflowLogger`: Lightning's `MLFlowLogger` with a local SQLite store in the run directory by default,
  continuing a resumed run's MLflow run (its id is kept in manifest.json as `mlflow_run_id`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger as _LightningMLFlowLogger
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from attnlab.io import make_writable_directory
from attnlab.runs.layout import RunDir
from attnlab.typed import ConfigError, is_number

__all__ = ["LOGGER_PACKAGES", "MLflowLogger", "check_logger_directories", "check_logger_packages",
           "log_results", "log_run_config", "logger_directories", "missing_packages",
           "result_summary"]  # fmt: skip

# The importable modules each logger class needs beyond attnlab's own dependencies (the `loggers` extra).
# MLflow's SQLite store needs SQLAlchemy and Alembic, which mlflow-skinny leaves out.
LOGGER_PACKAGES: dict[type, tuple[str, ...]] = {
    TensorBoardLogger: ("tensorboard",),
    _LightningMLFlowLogger: ("mlflow", "sqlalchemy", "alembic"),
}
INSTALL_HINT = 'pip install "attnlab[loggers]"'
# The keys of a test set's results.json entry that go to the loggers.
RESULT_KEYS = ("bleu", "chrf", "ter", "bleu_signature", "chrf_signature", "ter_signature", "sentences",
               "bleu_tok_compound")  # fmt: skip
# The schemes of the tracking URIs MLflow keeps runs at (its tracking store registry): a local path has
# none (nor has `databricks`, `databricks-uc` or `uc` alone), a database's may name its driver
# (`postgresql+psycopg2:`); a plugin package adds its own (entry points of MLFLOW_STORE_PLUGINS).
MLFLOW_SCHEMES = ("file", "http", "https", "databricks", "databricks-uc", "uc", "sqlite", "postgresql",
                  "mysql", "mssql")  # fmt: skip
MLFLOW_STORE_PLUGINS = "mlflow.tracking_store"
# The schemes of the locations MLflow keeps an experiment's artifacts at (its artifact repository registry,
# less `runs:` and `models:`, which name logged artifacts, not a place); a plugin package adds its own.
MLFLOW_ARTIFACT_SCHEMES = ("file", "s3", "r2", "b2", "gs", "wasbs", "abfss", "ftp", "sftp", "dbfs", "hdfs",
                           "viewfs", "http", "https", "mlflow-artifacts")  # fmt: skip
MLFLOW_ARTIFACT_PLUGINS = "mlflow.artifact_repository"


def missing_packages(cls: type) -> list[str]:
    """The modules `cls` (a logger class) needs that cannot be imported here."""
    needed = [m for base, modules in LOGGER_PACKAGES.items() if issubclass(cls, base) for m in modules]
    return [module for module in needed if importlib.util.find_spec(module) is None]


def check_logger_packages(key: str, cls: type) -> None:
    """Refuse the logger config `key` of class `cls` when a package it needs is missing.

    Raises:
        ConfigError: naming the missing packages and the extra that installs them.
    """
    missing = missing_packages(cls)
    if missing:
        raise ConfigError(
            f"{key} ({cls.__name__}) needs {', '.join(missing)}, not installed: {INSTALL_HINT} "
            f"(or choose another logger, e.g. logger=csv)"
        )


class MLflowLogger(_LightningMLFlowLogger):
    """Lightning's `MLFlowLogger` storing locally in the run directory unless told otherwise.

    Args:
        experiment_name: MLflow experiment.
        run_name: Run name (attnlab fills it from the command-line overrides when None).
        tracking_uri: Where runs go; None: `MLFLOW_TRACKING_URI` when set, else the local SQLite store
            `<save_dir>/mlruns/mlflow.db` (MLflow 3's default backend; its file store is in maintenance
            mode) with the artifacts under `<save_dir>/mlruns/artifacts/`.
        tags: Run tags.
        save_dir: The run directory.
        artifact_location: Where a new experiment keeps its artifacts (None: see `tracking_uri`).
        run_id: Continue this MLflow run instead of starting one.
        log_model: Lightning's checkpoint upload (`False`, `True` or `"all"`).
        prefix: Put before every metric key.
        synchronous: MLflow's blocking logging (None: MLflow's default).
    """

    def __init__(
        self,
        experiment_name: str = "attnlab",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: Mapping[str, Any] | None = None,
        save_dir: str = ".",
        artifact_location: str | None = None,
        run_id: str | None = None,
        log_model: bool | str = False,
        prefix: str = "",
        synchronous: bool | None = None,
    ) -> None:
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not tracking_uri:
            store = Path(save_dir).resolve() / "mlruns"
            store.mkdir(parents=True, exist_ok=True)
            tracking_uri = f"sqlite:///{store / 'mlflow.db'}"
            artifact_location = artifact_location or (store / "artifacts").as_uri()
        super().__init__(
            experiment_name=experiment_name, run_name=run_name, tracking_uri=tracking_uri,
            tags=dict(tags or {}), save_dir=save_dir, log_model=log_model, prefix=prefix,  # type: ignore[arg-type]
            artifact_location=artifact_location, run_id=run_id, synchronous=synchronous,
        )  # fmt: skip
        self._continued = run_id is not None

    @classmethod
    def check_config(cls, key: str, node: Mapping[str, Any]) -> None:
        """Refuse, when the config is checked, `tags` that are no mapping (`logger.mlflow.tags=foo` failed
        with a bare ValueError from `dict("foo")` once the data was prepared), an `experiment_name` that
        is no text or that MLflow refuses (blank, too long), a `tracking_uri` (or `MLFLOW_TRACKING_URI`)
        MLflow keeps no runs at (`check_tracking_uri`) and an `artifact_location` it stores no artifacts at
        (`check_artifact_location`) (`attnlab.training.experiment.check_constructor_keys` calls this).

        Raises:
            ConfigError: Naming the key and the form it takes.
        """
        tags = node.get("tags")
        if tags is not None and not isinstance(tags, Mapping):
            raise ConfigError(f"{key}.tags={tags!r} must map tag names to values, e.g. +{key}.tags.a=b")
        name = node.get("experiment_name", "attnlab")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{key}.experiment_name={name!r} must be a name (text), e.g. attnlab")
        from mlflow.exceptions import MlflowException  # optional: the `loggers` extra, checked before this

        try:  # (MLflow's own check, private: a version without it leaves the name to the run's start)
            from mlflow.utils.validation import _validate_experiment_name  # optional, as above
        except ImportError:
            _validate_experiment_name = str
        try:
            _validate_experiment_name(name)  # (blank, over 500 characters: failed once the data was prepared)
        except MlflowException as exc:
            reason = exc.message
            raise ConfigError(f"{key}.experiment_name: MLflow refuses it ({reason}): set another") from None
        uri = node.get("tracking_uri")
        if uri:
            check_tracking_uri(f"{key}.tracking_uri", str(uri))
        elif os.environ.get("MLFLOW_TRACKING_URI"):  # what the logger uses then
            check_tracking_uri("MLFLOW_TRACKING_URI", os.environ["MLFLOW_TRACKING_URI"])
        if node.get("artifact_location"):
            check_artifact_location(f"{key}.artifact_location", str(node["artifact_location"]))

    @rank_zero_only
    def check_continued_run(self) -> None:
        """For a continued run (`run_id`), that the MLflow store holds it (rank 0; before training).

        Raises:
            ConfigError: The store has no run of that id (its `mlruns/` deleted or moved, or another
                `tracking_uri` or `MLFLOW_TRACKING_URI`), naming manifest.json's `mlflow_run_id`, the
                store, and the fixes.
        """
        if not self._continued:
            return
        from mlflow.exceptions import MlflowException  # optional: the `loggers` extra
        from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode  # optional, as above

        try:
            self.experiment  # noqa: B018 (Lightning's property reads the run)
        except MlflowException as exc:
            if exc.error_code != ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
                raise
            raise ConfigError(
                f"the MLflow run {self._run_id} this run continues (manifest.json's mlflow_run_id) is not in "
                f"the MLflow store {self._tracking_uri}: was the run directory's mlruns/ deleted or moved, "
                "or logger.mlflow.tracking_uri or MLFLOW_TRACKING_URI changed? Point tracking_uri at the "
                "store that holds it, or continue without MLflow (e.g. logger=csv); the checkpoints and "
                "metrics.csv are unchanged"
            ) from None

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        """Lightning's (rank 0 only), but in a continued run (`run_id`: a resumed attnlab run) the params
        already logged keep their first values: MLflow refuses to change a param, and a resumed run may
        change a few settings (more epochs, `resume`, decoding); the new values are in the run's
        config.yaml and its manifest.json lists each resumption's command."""
        if self._continued:
            from lightning.fabric.utilities.logger import _convert_params, _flatten_dict

            flat = _flatten_dict(_convert_params(params))
            logged = self.experiment.get_run(self.run_id).data.params
            params = {k: v for k, v in flat.items() if k not in logged or logged[k] == str(v)[:250]}
        super().log_hyperparams(params)


def _check_scheme(key: str, uri: str, schemes: tuple[str, ...], plugin_group: str, refusal: str) -> str:
    """Refuse `uri` when MLflow has nothing for its scheme (neither in `schemes` nor an installed plugin's,
    the entry points of `plugin_group`), with `refusal` (holding `{scheme}`) and the plugins' schemes;
    a local path (no scheme, or a Windows drive's `C:`) passes. A scheme naming its driver
    (`postgresql+psycopg2`) counts as its first part. The URI itself, which may hold a password, is not
    shown. Returns the scheme ("" for a local path).

    Raises:
        ConfigError: Naming `key`, the scheme and the forms MLflow accepts.
    """
    scheme = urllib.parse.urlparse(uri).scheme.lower()
    scheme = "" if len(scheme) == 1 else scheme.split("+", 1)[0]  # (`C:\\...`: a Windows drive's path)
    plugins = sorted(entry.name for entry in importlib.metadata.entry_points(group=plugin_group))
    if scheme and scheme not in (*schemes, *plugins):
        also = f", or an installed plugin's ({', '.join(plugins)}:)" if plugins else ""
        raise ConfigError(f"{key}: {refusal.format(scheme=scheme)}{also}")
    return scheme


def check_tracking_uri(key: str, uri: str) -> None:
    """Refuse an MLflow tracking URI whose scheme MLflow has no store for (`MLFLOW_SCHEMES`, and the
    schemes of installed plugins): a typo (`htp://`, `fiel:`) or a host without one (`localhost:5000`)
    failed only when training began, after the data was prepared (`_check_scheme`); and, unless
    `MLFLOW_ALLOW_FILE_STORE` is true, a file store (a local path or `file:`), which MLflow 3 refuses there
    as in maintenance mode."""
    scheme = _check_scheme(key, uri, MLFLOW_SCHEMES, MLFLOW_STORE_PLUGINS,
                           "MLflow keeps no runs at a {scheme}: URI. Use sqlite:////abs/path/mlflow.db (or "
                           "postgresql://, mysql://, mssql://), http://host:5000 or https://... (a tracking "
                           "server), databricks, or a local path or file:///abs/path with "
                           "MLFLOW_ALLOW_FILE_STORE=true")  # fmt: skip
    file_store = scheme == "file" or (not scheme and uri not in ("databricks", "databricks-uc", "uc"))
    if file_store and not _file_store_allowed():
        raise ConfigError(
            f"{key}={uri}: MLflow 3 refuses a file store (a local path or file:) unless "
            "MLFLOW_ALLOW_FILE_STORE=true: use a database, e.g. sqlite:////abs/path/mlflow.db, or set "
            "MLFLOW_ALLOW_FILE_STORE=true"
        )


def _file_store_allowed() -> bool:
    """Whether this MLflow opens a file store: `MLFLOW_ALLOW_FILE_STORE` (MLflow's own reading of it), or
    an MLflow without that variable (before it refused file stores).

    Raises:
        ConfigError: `MLFLOW_ALLOW_FILE_STORE` is no boolean.
    """
    from mlflow import environment_variables  # optional: the `loggers` extra, checked before this

    allow = getattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE", None)
    try:
        return allow is None or bool(allow.get())
    except ValueError:
        value = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
        raise ConfigError(
            f"MLFLOW_ALLOW_FILE_STORE={value!r} is no boolean: set it to true or false"
        ) from None


def check_artifact_location(key: str, uri: str) -> None:
    """Refuse an MLflow artifact location whose scheme MLflow has no artifact store for
    (`MLFLOW_ARTIFACT_SCHEMES`, and the schemes of installed plugins): a typo (`s4://`) trained the whole
    run and failed when its hypotheses files were uploaded, at the end (`_check_scheme`)."""
    _check_scheme(key, uri, MLFLOW_ARTIFACT_SCHEMES, MLFLOW_ARTIFACT_PLUGINS,
                  "MLflow stores no artifacts at a {scheme}: URI. Use a local path or file:///abs/path, "
                  "s3://bucket/path (or r2://, b2://), gs://, wasbs://, abfss://, dbfs:/, hdfs://, "
                  "viewfs://, ftp://, sftp://, http(s)://host/path or mlflow-artifacts:/ (a tracking "
                  "server's)")  # fmt: skip


def result_summary(results: Mapping[str, Any]) -> dict[str, Any]:
    """`results.json`'s scores as flat keys: `results/<set>/<key>` for `RESULT_KEYS` of each test set and
    `results/<metric>` for its test metrics (`results/test/loss`, ...)."""
    summary: dict[str, Any] = {}
    for name, entry in results.get("sets", {}).items():
        for key in RESULT_KEYS:
            if key in entry:
                summary[f"results/{name}/{key}"] = entry[key]
    for key, value in results.get("test_metrics", {}).items():
        summary[f"results/{key}"] = value
    return summary


def _numbers(summary: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in summary.items() if is_number(v)}


# The keys of a logger's config that name a directory it writes into (W&B's `dir` too)
LOGGER_DIRECTORY_KEYS = ("save_dir", "dir")


def logger_directories(loggers: Mapping[str, Any]) -> dict[str, Path]:
    """The directories the loggers write into, by key (`logger.<name>.<key>` for `LOGGER_DIRECTORY_KEYS`
    of each node of the resolved `logger` config)."""
    return {f"logger.{name}.{key}": Path(node[key]) for name, node in loggers.items()
            for key in (LOGGER_DIRECTORY_KEYS if isinstance(node, Mapping) else ())
            if isinstance(node.get(key), str) and node[key]}  # fmt: skip


def check_logger_directories(loggers: Mapping[str, Any]) -> None:
    """Create the directories the loggers write into (`logger_directories`) and check that they can be
    written, before the run starts: Lightning creates them only when training begins, after the data is
    prepared, and failed there with a traceback.

    Raises:
        ConfigError: Naming the key, the directory, why, and the fix.
    """
    for key, directory in logger_directories(loggers).items():
        try:
            make_writable_directory(directory)
        except OSError as exc:
            raise ConfigError(
                f"{key}={directory}: cannot create it or write in it ({exc.strerror or exc}): set it to a "
                "writable directory (by default the run directory, ${paths.output_dir}), or fix its "
                "permissions"
            ) from None


def log_run_config(loggers: list[Any], resolved: dict[str, Any], manifest: dict[str, Any]) -> None:
    """The resolved config (`run`) to every logger beside the module's hyperparameters Lightning logs:
    W&B's config (with the `manifest`), MLflow's params, TensorBoard's hparams (written with the final
    results by `log_results`)."""
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            run = logger.experiment
            if hasattr(run, "config"):  # rank 0 (elsewhere a dummy)
                run.config.update({"run": resolved, "manifest": manifest}, allow_val_change=True)
        elif isinstance(logger, (TensorBoardLogger, _LightningMLFlowLogger)):
            logger.log_hyperparams({"run": resolved})


def log_results(loggers: list[Any], results: dict[str, Any], output_dir: Path, step: int) -> None:
    """The final results (`result_summary` of `results.json`) to every logger, rank 0 only: W&B's
    summary, tables and artifact (`attnlab.runs.wandb.log_results`); TensorBoard scalars at `step`, the
    signatures as text and the HParams dashboard (hyperparameters with the numeric results); MLflow
    metrics at `step`, the signatures as tags and the hypotheses files as artifacts (`hypotheses/`)."""
    summary = result_summary(results)
    numbers = _numbers(summary)
    texts = {k: str(v) for k, v in summary.items() if k not in numbers}
    wandb_runs = [lg.experiment for lg in loggers if isinstance(lg, WandbLogger)]
    if wandb_runs:
        from attnlab.runs.wandb import log_results as log_wandb_results

        log_wandb_results(wandb_runs, summary, results, output_dir)
    run_dir = RunDir(output_dir)
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            writer = logger.experiment
            for key, text in texts.items():
                writer.add_text(key, text, global_step=step)
            logger.log_hyperparams(logger.hparams, metrics=numbers, step=step)  # scalars and HParams
            logger.finalize("success")  # flush (testing closed the writer: this closes the reopened one)
        elif isinstance(logger, _LightningMLFlowLogger):
            client, run_id = logger.experiment, logger.run_id
            logger.log_metrics(numbers, step=step)
            for key, text in texts.items():
                client.set_tag(run_id, key, text)
            if run_dir.hypotheses_dir.is_dir():
                client.log_artifacts(run_id, str(run_dir.hypotheses_dir), artifact_path="hypotheses")
