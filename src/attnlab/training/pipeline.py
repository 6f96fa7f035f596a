"""`train(cfg)`: the training pipeline, one stage after the other.

    plan_run           validate the config (torch-free: a wrong value fails in about a second) and resolve
                       it into a `RunPlan` (monitor, W&B names, the checkpoint a resumed run goes on from);
                       the config is read-only from here on
    (run lock)         take the run directory: a second process there is refused
    build_data         set the data module up (corpora prepared or read from the cache)
    fit_model_to_data  complete the model config with the vocabulary sizes, check the special ids
    build_module       the LightningModule (compiled when `compile.enabled`); with `init_from`, the weights
                       of that checkpoint (`init_weights`), unless the run continues from its own
    build_trainer      the Lightning trainer with callbacks, loggers and checkpoint IO
    fit                train (from the run's last checkpoint when it continues)
    final_evaluation   test the final weights (best checkpoint or average) and, on rank 0, decode and score
                       every test set: the results, as a value
    write              `results.json` (with every final metric), hypotheses and references written once,
                       together; the W&B summary; the manifest's final status

The manifest (`attnlab.runs.manifest.Manifest`) records each stage's facts as the run goes, so a killed
run's manifest says how far it got. torch and lightning are imported inside the stages that need them,
so that `plan_run` rejects a bad config before they load.
"""

from __future__ import annotations

import copy
import errno
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from attnlab.data.text import override_word
from attnlab.io import WriteError, atomic_write_bytes, removing_new_directories
from attnlab.metrics import SET_SCORES, best_metric, set_metric, truncated_metric
from attnlab.runs.layout import MANIFEST_FILE, RESULTS_FILE, RunDir, UnreadableRunFile, check_no_credentials
from attnlab.runs.manifest import Manifest, data_identity, task_overrides
from attnlab.training.allocator import configure_allocator
from attnlab.training.experiment import (
    Experiment,
    check_constructor_keys,
    interpolations_refused,
    resolve_monitor,
    validate,
)
from attnlab.training.resume import (
    check_checkpoint_fits,
    check_resumption,
    check_same_experiment,
    check_training_state,
    csv_history,
    restore_csv_history,
    resume_path,
)
from attnlab.typed import ConfigError

if TYPE_CHECKING:
    from attnlab.data.datamodule import ParallelDataModule
    from attnlab.model.config import TransformerConfig
    from attnlab.training.module import TranslationModule

log = logging.getLogger(__name__)


def resolved_config(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain containers with every interpolation resolved (Hydra's own node left out)."""
    return {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
            for k, v in cfg.items() if k != "hydra"}  # fmt: skip


@dataclass(frozen=True)
class RunPlan:
    """What `plan_run` made of a composed config; every later stage reads only this.

    Attributes:
        cfg: The composed config with the `auto` monitor values filled in, read-only.
        experiment: Its validated, torch-free parts (model, optim, data, decode settings).
        resolved: `cfg` as plain values (for `config.yaml` and the loggers), the loggers' names filled in.
        run: The run directory.
        resume_from: The checkpoint training starts from (None: from scratch).
        resumed_step: The step of the run's own `last.ckpt` when the run continues from it, else None.
        history: The rows of its `csv/metrics.csv` logged before that step (`csv_history`), put back into
            the continued run's file.
        names: Values for the loggers' null names, by logger: `wandb` (`group`, `name`), `mlflow`
            (`run_name`); none for a logger that is not configured.
    """

    cfg: DictConfig
    experiment: Experiment
    resolved: dict[str, Any]
    run: RunDir
    resume_from: str | None = None
    resumed_step: int | None = None
    names: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)

    @property
    def continuing(self) -> bool:
        """Whether the run goes on from its own `last.ckpt` (the same run, resumed)."""
        return self.resumed_step is not None


def plan_run(cfg: DictConfig) -> RunPlan:
    """Validate a composed training config and resolve what the run will do; nothing is written.

    Raises:
        ConfigError: For a wrong config value, a credential in the config (`check_no_credentials`), a
            resumption that is not the same experiment or has no checkpoint, a damaged `last.ckpt` or CSV
            history; before torch is imported when the value alone is wrong.
    """
    experiment = validate(cfg)
    resolved_cfg = resolve_monitor(cfg, experiment)
    cfg = resolved_cfg if resolved_cfg is not cfg else copy.deepcopy(cfg)  # the caller's stays writable
    check_constructor_keys(cfg)  # imports lightning: after the torch-free checks, before any data work
    OmegaConf.set_readonly(cfg, True)

    run = RunDir(Path(cfg.paths.output_dir))
    with interpolations_refused(cfg):  # (`${monitor.metric}` of monitor=null)
        resolved = resolved_config(cfg)
    check_no_credentials(resolved)  # (config.yaml, the manifest and the loggers get it)
    resume_from = resume_path(cfg, run.path)
    resumed_step, history = None, []
    if resume_from is not None and Path(resume_from) == run.last_checkpoint:  # the same run goes on
        check_same_experiment(run.config_file, resolved)
        resumed_step = check_resumption(resume_from, resolved)  # a damaged, refused or other last.ckpt
        history = csv_history(run.path, resumed_step)  # read before the run changes
    names: dict[str, dict[str, Any]] = {}
    loggers = resolved.get("logger") or {}
    if loggers.get("wandb") is not None:
        from attnlab.runs.wandb import wandb_names  # imports lightning

        names["wandb"] = wandb_names(loggers["wandb"], resolved, task_overrides())
    if loggers.get("mlflow") is not None and loggers["mlflow"].get("run_name") is None:
        from attnlab.runs.wandb import run_name

        name = run_name(task_overrides())
        names["mlflow"] = {"run_name": name} if name is not None else {}
    for logger, values in names.items():
        loggers[logger].update(values)
    return RunPlan(cfg, experiment, resolved, run, resume_from, resumed_step, names, history)


def train(cfg: DictConfig) -> dict[str, float]:
    """Train and validate the configured model, then evaluate it on the test split.

    Args:
        cfg: A composed `train.yaml` config (from the CLI or `hydra.compose`); `paths.output_dir`
            is the run directory. It is not changed.

    Returns:
        The final metrics (`train/*`, `val/*`, `test/*`) as floats.

    Raises:
        ConfigError: before any heavy import, for a wrong config value.
    """
    plan = plan_run(cfg)
    from attnlab.runs.tracking import check_logger_directories, logger_directories  # (lightning: loaded)

    loggers = plan.resolved.get("logger") or {}
    with removing_new_directories([plan.run.path, *logger_directories(loggers).values()]):
        plan.run.check_writable()  # a refusal leaves none of the directories these two made
        check_logger_directories(loggers)
    with plan.run.lock(), keeping_signal_handlers():  # a second process in this run directory: refused here
        return _run(plan)


@contextmanager
def keeping_signal_handlers() -> Iterator[None]:
    """Put back the handlers of SIGINT, SIGTERM and SIGUSR1 the run found, however it ends: Lightning
    ignores SIGINT once a Ctrl-C's KeyboardInterrupt stops training (for its own shutdown) and gives back
    only the handlers it replaced, so a notebook or a program training in its own process ignored Ctrl-C
    from then on."""
    if threading.current_thread() is not threading.main_thread():  # signals reach only the main thread
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    previous = {signum: signal.getsignal(signum) for signum in signals}
    try:
        yield
    finally:
        from attnlab.training.callbacks import restore_signal_handlers  # (lightning: loaded by then)

        restore_signal_handlers(previous)


def _run(plan: RunPlan) -> dict[str, float]:
    """The stages of `train` after the run directory is taken, with the manifest's status kept."""
    from lightning.pytorch.utilities import rank_zero_only

    from attnlab.data.download import DataError
    from attnlab.training.callbacks import Stopped, run_requeue
    from attnlab.training.console import route_lightning_logging

    route_lightning_logging()  # each Lightning message once, on the handlers set up (Hydra's)
    run, is_zero = plan.run, rank_zero_only.rank == 0  # under DDP every rank runs this; rank 0 writes
    previous = _run_records(run) if plan.continuing else None  # before anything is rewritten
    run.write_config(plan.resolved)  # a full disk leaves the old one
    resumed_from = plan.resume_from if plan.continuing else None
    manifest = Manifest.start(run, resumed_from=resumed_from) if is_zero else None
    try:
        metrics = _train_and_evaluate(plan, manifest)
    except BaseException as exc:
        if not run.path.is_dir():  # removed while the run ran (a Lightning logger's write failed first)
            _finish_tracking(exit_code=1)
            raise WriteError(
                errno.ENOENT,
                f"the run directory {run.path} was removed while the run was running, with its checkpoints "
                "and records: nothing is left to continue; start the run again",
            ) from exc
        ctrl_c = _ctrl_c(exc, run)
        unsaved = ctrl_c or _unsaved_sigterm(exc, run)  # stopped at once by a signal, without a save
        if manifest is not None and previous is not None and isinstance(exc, (ConfigError, DataError)):
            # A refused continuation (other training data, a split too small) trained nothing: the run
            # stays as it was.
            _restore_run_records(previous)
        elif manifest is not None:
            stopped = isinstance(exc, Stopped)
            status = "interrupted" if stopped or unsaved else "failed"
            _finish_manifest(manifest, status, unsaved or f"{type(exc).__name__}: {exc}".splitlines()[0])
            if stopped:  # where it saved and how to go on: a batch job's log shows it, not only the manifest
                print(f"attnlab-train: {exc}", file=sys.stderr, flush=True)
        _finish_tracking(exit_code=1)
        if isinstance(exc, Stopped) and exc.requeue is not None:  # (on every rank)
            run_requeue(exc.requeue, exc.signum)  # submitit's or SLURM's, once the manifest says interrupted
        if unsaved:  # Lightning exits with 1 after Ctrl-C, 0 after SIGTERM: a shell expects 128 + N
            raise SystemExit(128 + (signal.SIGINT if ctrl_c else signal.SIGTERM)) from None
        raise
    if manifest is not None:
        manifest.finish("finished")
    _finish_tracking(exit_code=0)
    return metrics


def _finish_manifest(manifest: Manifest, status: str, error: str) -> None:
    """Record in `manifest` how a run that raised `error` ended, unless the disk, full or failing, refuses
    that write too: then logged, and the run's own error goes on (it says what happened and the fix)."""
    try:
        manifest.finish(status, error=error)
    except OSError as exc:
        log.error(
            "cannot record the run's end (%s) in %s: %s; it still says running", status,
            manifest.run.path / MANIFEST_FILE, exc.strerror or exc,
        )  # fmt: skip


def holding_signals(callbacks: DictConfig | None) -> None:
    """From here until training is set up (the data prepared, the model built, the trainer built), SIGTERM
    stops the run at once (`SetupStopped`: nothing to save yet), and where `callbacks` has attnlab's
    `Preemption`, SIGUSR1 is remembered and `Preemption` saves and stops at the end of the first step, as
    for a SIGUSR1 in the sanity validation (`HeldSignal`, each). The default actions ended the process at
    once, leaving the manifest at `running`. (`keeping_signal_handlers` puts back the handlers they
    replace.)"""
    from attnlab.training.callbacks import HeldSignal, Preemption

    if threading.current_thread() is not threading.main_thread():  # signals reach only the main thread
        return
    signal.signal(signal.SIGTERM, HeldSignal(signal.getsignal(signal.SIGTERM), at_once=True))
    target = f"{Preemption.__module__}.{Preemption.__qualname__}"
    nodes = (callbacks or {}).values()
    if any(isinstance(node, DictConfig) and node.get("_target_") == target for node in nodes):
        signal.signal(signal.SIGUSR1, HeldSignal(signal.getsignal(signal.SIGUSR1)))


def _ctrl_c(exc: BaseException, run: RunDir) -> str:
    """What the manifest says of a run in `run` stopped at once by Ctrl-C (a KeyboardInterrupt, which
    Lightning turns into `sys.exit(1)` inside fit), or "" for any other end. `resume=true` is named only
    where it can continue: from a last.ckpt saved before (a Ctrl-C while the data was prepared, or before
    the first save, leaves none, and `resume=true` would be refused)."""
    if not isinstance(exc, KeyboardInterrupt) and not (
        isinstance(exc, SystemExit) and isinstance(exc.__context__, KeyboardInterrupt)
    ):
        return ""
    if not run.last_checkpoint.is_file():
        return "KeyboardInterrupt: stopped by Ctrl-C before any checkpoint was saved; run the command again"
    return (
        "KeyboardInterrupt: stopped by Ctrl-C without saving; resume=true continues from the last.ckpt "
        "saved before"
    )


def _unsaved_sigterm(exc: BaseException, run: RunDir) -> str:
    """What the manifest says of a run in `run` that Lightning's own SIGTERM handler stopped at the end of a
    training step, without a save (`callbacks.preemption=null`: Lightning raises its `SIGTERMException`, a
    `SystemExit` of status 0), or "" for any other end."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    if not isinstance(exc, SIGTERMException):
        return ""
    saved = "resume=true continues from the last.ckpt saved before" if run.last_checkpoint.is_file() else (
        "no checkpoint was saved: run the command again")  # fmt: skip
    return f"SIGTERMException: stopped by SIGTERM without saving (callbacks.preemption=null); {saved}"


def _train_and_evaluate(plan: RunPlan, manifest: Manifest | None) -> dict[str, float]:
    """build_data -> fit_model_to_data -> build_module -> build_trainer -> fit -> final_evaluation ->
    write_results."""
    import lightning as L

    holding_signals(plan.cfg.get("callbacks"))
    mode = plan.cfg.get("allocator", "keep")
    _record(manifest, allocator={"mode": mode, "glibc_options_set": configure_allocator(mode)})
    if plan.cfg.get("seed") is not None:
        # Not `workers=True`: a DataLoader worker draws no random numbers (the sampler forms batches in this
        # process; a worker reads and pads them), and its `worker_init_fn` is `attnlab.data.examples.end_with`
        # (Lightning's seeding function in its place would make every worker import Lightning).
        L.seed_everything(plan.cfg.seed, workers=False)
    datamodule = build_data(plan)
    _record(manifest, data=data_identity(datamodule))  # before the checks: a refused run names its data
    module = build_module(plan, fit_model_to_data(plan, datamodule))
    if plan.resume_from is not None:  # its optimizer and schedule state must be what the settings build
        check_training_state(plan.resume_from, module, plan.cfg.trainer.get("precision", "32-true"))
    if plan.cfg.get("init_from") is not None and not plan.continuing:
        _record(manifest, init_from=init_weights(module, datamodule, plan.cfg.init_from))
    ids = manifest.fields if manifest is not None and plan.continuing else {}  # the tracked runs go on
    trainer = build_trainer(
        plan, datamodule, wandb_id=ids.get("wandb_run_id"), mlflow_id=ids.get("mlflow_run_id")
    )
    effective = effective_batch(plan.cfg, trainer)
    log.info("effective batch: %s", effective["formula"])
    _record(manifest, effective_batch=effective, **_tracking_ids(trainer))
    if trainer.is_global_zero:  # the whole resolved config, beside Lightning's hyperparameters
        from attnlab.runs.tracking import log_run_config

        log_run_config(trainer.loggers, plan.resolved, manifest.fields if manifest is not None else {})
    fit(plan, trainer, module, datamodule, manifest)
    if module.schedule_facts is not None:
        _record(manifest, schedule=module.schedule_facts)
    metrics = _training_end(plan, trainer, manifest)
    if plan.cfg.get("test", True):
        with stopping_evaluation(evaluate_again(plan.run), trainer):
            test_metrics, evaluation = final_evaluation(plan, trainer, module, datamodule)
        metrics.update(test_metrics)
    else:  # no test sets: results.json holds the final metrics alone (what sweeps and reports read)
        from attnlab.inference.translator import Evaluation

        evaluation = Evaluation({"sets": {}})
    for split, count in getattr(datamodule, "truncated", {}).items():
        metrics[truncated_metric(split)] = float(count)
    if evaluation is not None and trainer.is_global_zero:  # every final metric, for sweeps and reports
        write_results(plan.run, evaluation, metrics, trainer)
    return metrics


def _training_end(plan: RunPlan, trainer: Any, manifest: Manifest | None) -> dict[str, float]:
    """The final metrics of training (the last `train/*` and `val/*`, and the monitor's best), recorded in
    the manifest as `training_end` with the step, before the final evaluation: a run stopped after it
    (in its final evaluation, or in its last validation: `fit`) continues to them (`_earlier_metrics`)."""
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    step = int(trainer.global_step)
    if plan.continuing and step == plan.resumed_step:  # its training had ended: nothing trained
        metrics = {**_earlier_metrics(plan.run, step), **metrics}  # they stand (Lightning's: none)
    best = _best_score(plan.cfg, trainer)
    if best is not None:  # what sweepers optimize: the monitor's value at the selected checkpoint
        metrics[best_metric(plan.cfg.monitor.metric)] = best
    _record(manifest, training_end={"step": step, "metrics": metrics})
    return metrics


def _earlier_metrics(run: RunDir, step: int) -> dict[str, float]:
    """The final metrics of the run's training, which ended at `step`, as an earlier part saved them ({}
    without a record): a run continued once its training had ended (stopped or killed in its final
    evaluation, or finished and continued without more epochs or steps) trains and validates nothing, so
    Lightning has no `train/*` or `val/*` metric for it, and its results (and what a sweep reads) would
    lose them. They are read, not validated again (that would cost a validation, with its decoding, and
    give no `train/*`): the manifest's `training_end`, recorded when training ended, before the final
    evaluation, at `step`; else the `results.json` of a run that finished before attnlab recorded it."""
    try:
        record = run.read_json(MANIFEST_FILE).get("training_end")
    except UnreadableRunFile:
        record = None
    if isinstance(record, dict) and type(record.get("step")) is int and record["step"] == step:
        numbers = record.get("metrics")
    else:
        try:
            numbers = run.read_json(RESULTS_FILE).get("metrics")
        except UnreadableRunFile:
            return {}
    numbers = numbers if isinstance(numbers, dict) else {}
    kept = {k: v for k, v in numbers.items() if type(v) in (int, float)}  # (not true or false)
    return {k: float(v) for k, v in kept.items() if abs(v) < 1e300 or type(v) is float}  # (float's range)


def _record(manifest: Manifest | None, **fields: Any) -> None:
    """Add `fields` to the manifest (rank 0 holds it; the other ranks record nothing)."""
    if manifest is not None:
        manifest.update(**fields)


def build_data(plan: RunPlan) -> ParallelDataModule:
    """The data module, set up for training (real corpora prepared or read from the cache)."""
    datamodule = plan.experiment.data.datamodule()
    datamodule.setup("fit")
    return datamodule


def fit_model_to_data(plan: RunPlan, datamodule: ParallelDataModule) -> TransformerConfig:
    """The model config completed with the data's vocabulary sizes and checked against its special ids
    (and against the checkpoint training starts from, when it is another run's); a learned position
    table limits the sources of the evaluation splits."""
    model = plan.experiment.model
    if model.src_vocab_size is None:
        try:
            model = model.with_vocab(datamodule.src_vocab_size, datamodule.tgt_vocab_size)
        except ValueError as exc:
            raise ConfigError(f"model.{exc} (vocabulary sizes from the data's tokenizers)") from exc
    check_special_ids(model, datamodule)
    if plan.resume_from is not None and not plan.continuing:  # the run's own: its config.yaml was compared
        check_checkpoint_fits(plan.resume_from, model)
    if model.position_limit is not None and hasattr(datamodule, "limit_positions"):
        datamodule.limit_positions(model.position_limit)
    return model


def build_module(plan: RunPlan, model: TransformerConfig) -> TranslationModule:
    """The LightningModule of the model, optimiser and decoding settings (compiled when asked)."""
    from attnlab.training.module import TranslationModule

    experiment = plan.experiment
    module = TranslationModule(
        model=model, optim=experiment.optim, decode=experiment.decode, metrics=experiment.metrics
    )
    module.log_parameter_counts = not plan.continuing  # the run's loggers have them from its first part
    compile_model(module.model, plan.cfg.get("compile"))
    return module


# Model settings a fine-tuning run may change: they regularise training and leave the weights' meaning.
FREE_WHEN_FINE_TUNING = frozenset({"dropout", "attention_dropout", "activation_dropout"})


def init_weights(module: TranslationModule, datamodule: ParallelDataModule, path: str) -> dict[str, Any]:
    """Load the model weights of the checkpoint `path` into `module` (fine-tuning: the optimizer, schedule
    and counters stay fresh); returns what the manifest records of it (`init_from`).

    The checkpoint is read by attnlab's one safe reader (nothing in it runs); its tokenizers must be the
    data's (weights trained on other ids would load and train without an error and mean nothing) and its
    model settings this run's, the dropout rates aside (`FREE_WHEN_FINE_TUNING`), and its weights are
    compared with them before they are loaded.

    Raises:
        ConfigError: The file is refused or damaged, its weights do not fit this run's model settings, or
            its tokenizers differ from the data's.
    """
    from attnlab.runs.checkpoint import (
        BUNDLE_KEY,
        CheckpointError,
        check_weights_fit,
        model_weights,
        read_checkpoint,
        saved_settings,
    )

    file = Path(path).expanduser()
    try:
        checkpoint = read_checkpoint(file)
        saved = saved_settings(checkpoint, "model", file).to_dict()
    except CheckpointError as exc:
        raise ConfigError(f"init_from: {exc}") from None
    bundle = checkpoint[BUNDLE_KEY]
    for side in ("src", "tgt"):
        ours = getattr(datamodule, f"{side}_tokenizer", None)
        if (None if ours is None else ours.to_json()) != bundle.get(f"{side}_tokenizer"):
            raise ConfigError(
                f"init_from={path}: its {side} tokenizer is not this run's — its weights belong to other "
                "token ids. Fine-tune with the checkpoint's tokenizer: data.tokenizer_path=<file> (write it "
                "with Translator.from_checkpoints([ckpt]).src_tokenizer.save('tokenizer.json'); "
                "data.src_tokenizer_path / tgt_tokenizer_path without a joint vocabulary), or the same "
                "data and tokenizer settings as the run that wrote it"
            )
    mine = module.model_config.to_dict()
    differences = [f"{key}: {saved.get(key)!r} there, {value!r} here" for key, value in mine.items()
                   if key not in FREE_WHEN_FINE_TUNING and saved.get(key) != value]  # fmt: skip
    if differences:
        raise ConfigError(
            f"init_from={path}: its model settings are not this run's ({'; '.join(differences)}): "
            "fine-tuning keeps the architecture — use the model settings it was trained with (the "
            f"dropout rates, {', '.join(sorted(FREE_WHEN_FINE_TUNING))}, may differ)"
        )
    try:
        check_weights_fit(module.model_config, checkpoint["state_dict"], file)
    except CheckpointError as exc:
        raise ConfigError(f"init_from: {exc}") from None
    module.model.load_state_dict(model_weights(checkpoint["state_dict"]))
    step = checkpoint.get("global_step")
    log.info("init_from: the weights of %s (step %s); optimizer, schedule and step counter start fresh",
             file, step)  # fmt: skip
    return {"path": str(file.resolve()), "step": step}


def build_trainer(
    plan: RunPlan, datamodule: ParallelDataModule, wandb_id: str | None = None, mlflow_id: str | None = None
) -> Any:
    """The Lightning trainer of `cfg.trainer` with the configured callbacks and loggers (their null names
    filled in: W&B group and name, MLflow run name; for a continued run the W&B and MLflow run ids), the
    console's model summary and, when the console is not a terminal, progress lines
    (`attnlab.training.console`), attnlab's atomic checkpoint IO and, on a cluster, its environment plugin.
    The data is checked to feed every rank first, and a continued run's CSV history is put back."""
    from hydra.utils import instantiate

    from attnlab.runs.tracking import MLflowLogger
    from attnlab.training.callbacks import SignalConnector, follow_every_batchs_validation
    from attnlab.training.checkpoint_io import AtomicCheckpointIO
    from attnlab.training.console import console_callbacks

    cfg = plan.cfg
    names = {logger: dict(values) for logger, values in plan.names.items()}
    wandb_node = (cfg.get("logger") or {}).get("wandb")
    if wandb_id is not None and wandb_node is not None and wandb_node.get("id") is None:
        names["wandb"]["id"] = wandb_id  # the same W&B run, continued
    mlflow_node = (cfg.get("logger") or {}).get("mlflow")
    if mlflow_id is not None and mlflow_node is not None and mlflow_node.get("run_id") is None:
        names.setdefault("mlflow", {})["run_id"] = mlflow_id  # the same MLflow run, continued
    callbacks = _instantiate_all(cfg.get("callbacks"))
    console, arguments = console_callbacks(callbacks, cfg.trainer, cfg.get("progress"))
    trainer = instantiate(
        cfg.trainer,
        callbacks=callbacks + console,
        **arguments,
        logger=_instantiate_all(cfg.get("logger"), names) or False,
        default_root_dir=str(plan.run.path),
        plugins=[*cluster_plugins(), AtomicCheckpointIO(own_run=plan.continuing)],
    )
    trainer._signal_connector = SignalConnector(trainer)  # SIGTERM: attnlab's handlers, not Lightning's
    follow_every_batchs_validation(trainer)
    datamodule.check_feeds(trainer.world_size, test=bool(cfg.get("test", True)))  # before any training
    for logger in trainer.loggers:
        if isinstance(logger, MLflowLogger):
            logger.check_continued_run()  # a continued MLflow run must still be in its store
    log.info("run directory: %s", plan.run.path)
    if plan.history:
        restore_csv_history(trainer, plan.history)
    return trainer


def fit(
    plan: RunPlan,
    trainer: Any,
    module: TranslationModule,
    datamodule: ParallelDataModule,
    manifest: Manifest | None = None,
) -> None:
    """Train (continuing from `plan.resume_from` when set). A stop after the last step, with its checkpoint
    saved (a signal in the last validation: `Preempted.training_ended`), records the end of training in
    `manifest` first, as a run going on to its final evaluation does: the run continued from that
    checkpoint trains nothing and ends with those metrics (`_training_end`)."""
    from attnlab.training.callbacks import Preempted  # (lightning: loaded by then)

    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=plan.resume_from)
    except Preempted as stop:
        if stop.training_ended:
            _training_end(plan, trainer, manifest)
        raise


def _instantiate_all(group: DictConfig | None, kwargs: dict[str, dict[str, Any]] | None = None) -> list[Any]:
    """Every node of a config group that names a class, built (`kwargs[name]`: values for node `name`)."""
    from hydra.utils import instantiate

    if not group:
        return []
    kwargs = kwargs or {}
    return [instantiate(node, **kwargs.get(name, {})) for name, node in group.items()
            if node is not None and "_target_" in node]  # fmt: skip


def check_special_ids(model: TransformerConfig, datamodule: ParallelDataModule) -> None:
    """The model's special-token ids must be the ones the data's vocabulary uses."""
    for name in ("pad_id", "bos_id", "eos_id"):
        ours, theirs = getattr(model, name), getattr(datamodule, name)
        if ours != theirs:
            raise ConfigError(
                f"model.{name}={ours} but the data's vocabulary uses {theirs}: set model.{name}={theirs}"
            )
    if model.start_id != datamodule.bos_id:
        raise ConfigError(
            f"model.decoder_start_id={model.decoder_start_id} but the data starts targets with bos "
            f"id {datamodule.bos_id}: set model.decoder_start_id=null"
        )


def _run_records(run: RunDir) -> dict[Path, bytes | None]:
    """The run's bookkeeping files that a run rewrites before training (manifest, `config.yaml`, the CSV
    history) as they are on disk (None: absent), for `_restore_run_records` when a continuation is
    refused after they were rewritten."""
    records: dict[Path, bytes | None] = {}
    for path in (run.manifest_file, run.config_file, run.metrics_csv):
        try:
            records[path] = path.read_bytes()
        except OSError:
            records[path] = None
    return records


def _restore_run_records(records: dict[Path, bytes | None]) -> None:
    """Put each file of `_run_records` back as it was (removed when it did not exist)."""
    for path, data in records.items():
        if data is not None:
            atomic_write_bytes(path, data)
        else:
            path.unlink(missing_ok=True)


def _finish_tracking(exit_code: int) -> None:
    if "wandb" in sys.modules:  # imported only when a W&B logger was configured
        from attnlab.runs.wandb import finish_wandb

        finish_wandb(exit_code)


def effective_batch(cfg: DictConfig, trainer: Any) -> dict[str, Any]:
    """Tokens (or sentences) per optimizer step: per-device batch × devices × nodes × accumulation.

    The LR schedules count optimizer steps, so 2 devices with accumulate 1 and 1 device with accumulate
    2 see the same batches per step and the same schedule."""
    data = cfg.data
    per_device = data.get("max_tokens") or data.get("batch_size")
    unit = "tokens" if data.get("max_tokens") else "sentences"
    devices = int(getattr(trainer, "num_devices", 1))
    nodes = int(getattr(trainer, "num_nodes", 1))
    accumulate = int(trainer.accumulate_grad_batches)
    total = per_device * devices * nodes * accumulate if per_device else None
    formula = (
        f"{per_device} {unit} per device batch x {devices} devices x {nodes} nodes x {accumulate} "
        f"accumulated = {total} {unit} per optimizer step"
    )
    return {
        "per_device": per_device, "unit": unit, "devices": devices, "nodes": nodes,
        "accumulate_grad_batches": accumulate, "per_optimizer_step": total, "formula": formula,
    }  # fmt: skip


def compile_model(model: Any, options: DictConfig | None) -> None:
    """`model.compile(...)` in place (its state_dict keys stay the same) when `options.enabled`.

    Raises:
        ConfigError: An unknown `compile.backend`.
    """
    if not options or not options.get("enabled"):
        return
    import torch._dynamo

    backend = options.get("backend", "inductor")
    known = torch._dynamo.list_backends(exclude_tags=())
    if backend not in known:
        raise ConfigError(f"compile.backend={backend!r} is unknown to torch.compile: use one of {known}")
    model.compile(backend=backend, mode=options.get("mode"), dynamic=options.get("dynamic"))
    log.info("model compiled for training (backend %s, mode %s)", backend, options.get("mode"))


def cluster_plugins() -> list[Any]:
    """Under submitit on SLURM, Lightning's SLURM environment without its auto-requeue: submitit
    requeues the job itself (its SIGUSR1 handler runs once `attnlab.training.callbacks.Preemption` saved and
    the manifest says the run was interrupted)."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return []
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)]


def _tracking_ids(trainer: Any) -> dict[str, str]:
    """The manifest's `wandb_run_id` and `mlflow_run_id` of the trainer's loggers (rank 0), with which a
    resumed run continues the same tracked runs."""
    from lightning.pytorch.loggers import MLFlowLogger

    runs = _tracked_runs(trainer)
    ids = {"wandb_run_id": runs[0].id} if runs else {}
    mlflow = [lg for lg in trainer.loggers if isinstance(lg, MLFlowLogger)]
    if mlflow and trainer.is_global_zero:
        ids["mlflow_run_id"] = mlflow[0].run_id
    return ids


def _tracked_runs(trainer: Any) -> list[Any]:
    """The W&B runs of the trainer's loggers (rank 0; none without a W&B logger)."""
    from lightning.pytorch.loggers import WandbLogger

    if not any(isinstance(lg, WandbLogger) for lg in trainer.loggers):
        return []
    from attnlab.runs.wandb import wandb_runs

    return wandb_runs(trainer)


def _monitor_checkpoint(cfg: DictConfig, trainer: Any) -> Any:
    """The checkpoint callback of `cfg.monitor`; None without one (`callbacks.model_checkpoint=null`): the
    final evaluation then tests the weights training ended with, not whichever checkpoint another
    callback last wrote (last.ckpt every N steps can be older)."""
    metric = cfg.get("monitor", {}).get("metric")
    callbacks = [cb for cb in trainer.checkpoint_callbacks if cb.monitor == metric]
    return callbacks[0] if callbacks else None


def _best_checkpoint(cfg: DictConfig, trainer: Any) -> str:
    """The best checkpoint by `cfg.monitor` ('' when none was saved)."""
    callback = _monitor_checkpoint(cfg, trainer)
    return callback.best_model_path if callback is not None else ""


def _best_score(cfg: DictConfig, trainer: Any) -> float | None:
    """The monitor's value at the best checkpoint (None when no callback tracks the monitor)."""
    callback = _monitor_checkpoint(cfg, trainer)
    metric = cfg.get("monitor", {}).get("metric")
    if callback is None or callback.monitor != metric or callback.best_model_score is None:
        return None
    return float(callback.best_model_score)


def evaluate_again(run: RunDir) -> str:
    """The fix for a run whose final evaluation did not end (stopped by a signal, or its results not
    written): the same command with `resume=auto` and the run's directory, which trains nothing more and
    evaluates again into that directory, for every run (one on data without text too, which attnlab-eval
    cannot translate; a run in a directory named by the time, which the command alone would not find). A
    multirun's job (`-m`, which takes no `hydra.run.dir`) is found again by its sweep directory: the fix is
    the sweep again with `resume=auto sweep.skip_done=true` and that `hydra.sweep.dir`, the job continued
    that way and the finished jobs skipped. The directory is written with `override_word`, so that the shell
    and Hydra read it back (a multirun job's holds `=` and `,`)."""
    sweep_dir = _sweep_dir()
    if sweep_dir is not None:
        where = override_word("hydra.sweep.dir", sweep_dir)
        return (f"run the same multirun again with resume=auto sweep.skip_done=true {where}: this job trains "
                "nothing more and evaluates again, finished jobs are skipped")  # fmt: skip
    where = override_word("hydra.run.dir", str(run.path))
    return f"run the same command with resume=auto {where}: it trains nothing more and evaluates again"


def _sweep_dir() -> str | None:
    """The sweep directory of the multirun this process runs a job of (Hydra's config), else None; absolute
    (Hydra reads a relative one from the command's working directory), so a command in another directory
    finds it too."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra = HydraConfig.get()
    return os.path.join(str(hydra.runtime.cwd), str(hydra.sweep.dir))


@contextmanager
def stopping_evaluation(fix: str, trainer: Any) -> Iterator[None]:
    """While the final evaluation runs, SIGTERM, SIGINT (Ctrl-C) and SIGUSR1 stop it with `EvaluationStopped`,
    whose message ends with `fix` (`evaluate_again`), at once or, under DDP while testing, at the end of
    testing on every rank (`attnlab.training.callbacks.EvaluationStop`): SIGTERM's and SIGUSR1's defaults
    would end the process before the manifest says so, and decoding the test sets can take minutes. There is
    nothing to save: training has ended and its checkpoints are on disk. A SIGUSR1 handler installed before
    (submitit's) or by Lightning for testing (SLURM's auto-requeue) runs once the manifest says the run was
    interrupted (`_run`), so the job is still requeued."""
    if threading.current_thread() is not threading.main_thread():  # signals reach only the main thread
        yield
        return

    from attnlab.training.callbacks import EvaluationStop  # (lightning: loaded)

    stop = EvaluationStop(fix, trainer.world_size)
    stop.hold()
    trainer.callbacks.append(stop)
    try:
        yield
    finally:
        trainer.callbacks = [callback for callback in trainer.callbacks if callback is not stop]
        stop.release()


def final_evaluation(
    plan: RunPlan, trainer: Any, module: TranslationModule, datamodule: ParallelDataModule
) -> tuple[dict[str, float], Any]:
    """Load the final weights (best checkpoint, or the average of the last `average_last` epochs) and
    compute the test loss; on rank 0 also decode every test set with beam search and score it.

    Returns:
        The test metrics, and on rank 0 the `attnlab.inference.translator.Evaluation` (None on the other
        ranks): for data without text, the checkpoints and test loss alone.
    """
    from attnlab.inference.translator import Evaluation, Translator, score_sets
    from attnlab.runs.checkpoint import data_settings, last_kept_checkpoints, read_averaged

    average_last = int(plan.cfg.get("average_last") or 0)
    if average_last > 0:
        paths = [str(p) for p in last_kept_checkpoints(plan.run.path, average_last)]
    else:
        best = _best_checkpoint(plan.cfg, trainer)
        paths = [best] if best else []
    if paths:
        module.load_state_dict(read_averaged(paths)["state_dict"])
    tested = trainer.test(module, datamodule=datamodule, verbose=False)
    metrics = {k: float(v) for k, v in tested[0].items()}
    if not trainer.is_global_zero:  # one process decodes and scores the complete test sets
        return metrics, None
    tokenizer = getattr(datamodule, "tgt_tokenizer", None)
    extra = {"test_metrics": dict(metrics)}  # the test loss; the scores are added below
    if tokenizer is None:  # no text to translate (synthetic data)
        checkpoints = [str(Path(p).resolve()) for p in paths]
        return metrics, Evaluation({"checkpoints": checkpoints, "averaged": len(paths) > 1, **extra})
    module.to(trainer.strategy.root_device)  # decode on the training device, wherever testing left it
    data = data_settings(datamodule)  # as a checkpoint holds them (the source limit: max_source_tokens)
    translator = Translator(
        module.model, datamodule.src_tokenizer, tokenizer, module.decode_config, data, module.metrics_config
    )
    sets = {name: datamodule.raw_text(name) for name in datamodule.test_sets}
    evaluation = score_sets(translator, sets, checkpoints=paths, extra=extra)
    for name, entry in evaluation.results["sets"].items():
        metrics.update({set_metric(name, score): entry[score] for score in SET_SCORES})
    return metrics, evaluation


def write_results(run: RunDir, evaluation: Any, metrics: dict[str, float], trainer: Any) -> None:
    """Write the evaluation with every final metric (`results.json`, hypotheses, references: once,
    together) and give its results to every logger of `trainer` (`attnlab.runs.tracking.log_results`).

    Raises:
        WriteError: A file cannot be written (a full disk): every file there is unchanged, and the
            message ends with the fix, `evaluate_again`: the run continued with `resume=auto`.
    """
    evaluation = evaluation.with_results(metrics=metrics)
    try:
        evaluation.write(run)
    except WriteError as exc:
        raise WriteError(exc.errno, f"{exc}, then {evaluate_again(run)}") from exc
    if trainer.loggers:
        from attnlab.runs.tracking import log_results

        log_results(trainer.loggers, evaluation.results, run.path, step=int(trainer.global_step))
