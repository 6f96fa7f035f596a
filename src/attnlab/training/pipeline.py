"""`train(cfg)`: the training pipeline as a plain function returning its metrics.

Validation happens first and imports neither torch nor lightning, so a bad config fails in about a
second; the heavy imports happen inside `train` once the config is known to be good.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from attnlab.training.experiment import Experiment, check_constructor_keys, resolve_monitor, validate
from attnlab.typed import ConfigError

if TYPE_CHECKING:
    from attnlab.data.datamodule import ParallelDataModule
    from attnlab.model.config import TransformerConfig

log = logging.getLogger(__name__)


def resolved_config(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain containers with every interpolation resolved (Hydra's own node left out)."""
    return {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
            for k, v in cfg.items() if k != "hydra"}  # fmt: skip


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


def _instantiate_all(group: DictConfig | None) -> list[Any]:
    from hydra.utils import instantiate

    if not group:
        return []
    return [instantiate(node) for node in group.values() if node is not None and "_target_" in node]


def train(cfg: DictConfig) -> dict[str, float]:
    """Train and validate the configured model, then evaluate it on the test split.

    Args:
        cfg: A composed `train.yaml` config (from the CLI or `hydra.compose`); `paths.output_dir`
            is the run directory.

    Returns:
        The final metrics (`train/*`, `val/*`, `test/*`) as floats.

    Raises:
        ConfigError: before any heavy import, for a wrong config value.
    """
    experiment = validate(cfg)
    resolve_monitor(cfg, experiment)
    check_constructor_keys(cfg)  # imports lightning: after the torch-free checks, before any data work
    output_dir = Path(cfg.paths.output_dir)
    from attnlab.training.resume import LAST, check_same_experiment, checkpoint_step, resume_path

    resume_from = resume_path(cfg, output_dir)
    continuing = resume_from is not None and Path(resume_from) == output_dir / LAST
    resumed_step = None  # the step of the run's own last.ckpt, when the run goes on from it
    if continuing:  # the same run goes on: the same experiment, in its own directory
        check_same_experiment(output_dir / "config.yaml", resolved_config(cfg))
        resumed_step = checkpoint_step(str(resume_from))  # a damaged or refused last.ckpt: refused here
    _writable_run_directory(output_dir)
    with _run_lock(output_dir):  # a second process in this run directory is refused here
        if (cfg.get("logger") or {}).get("wandb") is not None:
            from attnlab.runs.wandb import name_and_group

            name_and_group(cfg, resolved_config(cfg))
        from attnlab.data.download import DataError
        from attnlab.io import atomic_write_bytes

        previous = _run_records(output_dir) if continuing else None  # before anything is rewritten
        config_yaml = OmegaConf.to_yaml(OmegaConf.create(resolved_config(cfg))).encode("utf-8")
        atomic_write_bytes(output_dir / "config.yaml", config_yaml)  # a full disk leaves the old one

        import lightning as L
        from lightning.pytorch.utilities import rank_zero_only

        from attnlab.runs.manifest import now, start_manifest, write_manifest
        from attnlab.training.callbacks import Preempted

        is_zero = rank_zero_only.rank == 0  # under DDP every rank runs this; one writes the manifest
        resumed_from = resume_from if continuing else None
        manifest = start_manifest(output_dir, resumed_from=resumed_from) if is_zero else {}
        try:
            if cfg.get("seed") is not None:
                L.seed_everything(cfg.seed, workers=True)
            metrics = _fit_and_evaluate(
                cfg, experiment, output_dir, manifest if is_zero else None, resume_from, resumed_step
            )
        except BaseException as exc:
            if is_zero and previous is not None and isinstance(exc, (ConfigError, DataError)):
                # A refused continuation (other training data, a split too small) trained nothing: the run
                # stays as it was.
                _restore_run_records(previous)
            elif is_zero:
                status = "interrupted" if isinstance(exc, Preempted) else "failed"
                error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                write_manifest(output_dir, {**manifest, "status": status, "error": error, "end_time": now()})
            _finish_tracking(exit_code=1)
            raise
        if is_zero:
            write_manifest(output_dir, {**manifest, "status": "finished", "end_time": now()})
        _finish_tracking(exit_code=0)
        return metrics


def _run_records(output_dir: Path) -> dict[Path, bytes | None]:
    """The run's bookkeeping files that a run rewrites before training (manifest, `config.yaml`, the CSV
    history) as they are on disk (None: absent), for `_restore_run_records` when a continuation is
    refused after they were rewritten."""
    from attnlab.runs.manifest import MANIFEST_FILE

    records: dict[Path, bytes | None] = {}
    for name in (MANIFEST_FILE, "config.yaml", "csv/metrics.csv"):
        try:
            records[output_dir / name] = (output_dir / name).read_bytes()
        except OSError:
            records[output_dir / name] = None
    return records


def _restore_run_records(records: dict[Path, bytes | None]) -> None:
    """Put each file of `_run_records` back as it was (removed when it did not exist)."""
    from attnlab.io import atomic_write_bytes

    for path, data in records.items():
        if data is not None:
            atomic_write_bytes(path, data)
        else:
            path.unlink(missing_ok=True)


RUN_LOCK = ".lock"  # in the run directory: `<pid> <host>` of the process running there


class RunDirectoryInUse(ConfigError):
    """Another live process runs in this run directory (its lock file names it)."""


def _launched_rank() -> int:
    """This process's global rank as the launchers set it (Lightning's DDP launcher, torchrun, SLURM,
    submitit; `attnlab.cli.train.submitit_ranks`): 0 unless a rank variable says otherwise. Read from
    the environment, before lightning is imported."""
    import os

    names = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")
    return max((int(os.environ[k]) for k in names if os.environ.get(k, "").isdigit()), default=0)


@contextmanager
def _run_lock(output_dir: Path) -> Iterator[None]:
    """Hold the run directory's lock for the whole run: a second process started in the same directory
    (which would mix checkpoints, logs and manifest) is refused at once, naming the directory and the
    process running there. The lock is `attnlab.io.FileLock` (``flock``): released when the run
    ends, however it ends — the kernel frees it when a killed process dies, so a dead run's stale lock
    is taken over (`resume=true` continues it). Under DDP only the first process (rank 0) takes it; the
    other ranks run in the same directory.

    Raises:
        RunDirectoryInUse: Another live process holds the lock.
    """
    if _launched_rank() != 0:
        yield
        return
    lock = _take_run_lock(output_dir, record_holder=True)
    try:
        yield
    finally:
        lock.release()


def _take_run_lock(output_dir: Path, *, record_holder: bool) -> Any:
    """The run directory's lock (`attnlab.io.FileLock`), taken without waiting.

    Raises:
        RunDirectoryInUse: Another live process holds it (named, when it recorded itself).
    """
    from attnlab.io import FileLock

    lock = FileLock(output_dir / RUN_LOCK, timeout=0, record_holder=record_holder)
    try:
        lock.acquire()
    except TimeoutError:
        raise RunDirectoryInUse(
            f"the run directory {output_dir} is in use: {lock.holder()} is running there "
            f"({output_dir / RUN_LOCK}). Two runs in one directory would mix their checkpoints and logs: "
            "wait for it to end (or stop it; resume=true then continues it), or set hydra.run.dir to "
            "another directory"
        ) from None
    return lock


def check_run_directory_free(output_dir: Path) -> None:
    """Refuse at once a run directory whose lock a live process holds (`_run_lock`), before anything
    writes there: Hydra writes `.hydra/` and the job log into the run directory before the task starts
    (`attnlab.cli.app.RunDirectoryCheck` calls this first). The lock itself is taken by `train`.

    Raises:
        RunDirectoryInUse: Another live process holds the lock.
    """
    if _launched_rank() != 0 or not (output_dir / RUN_LOCK).is_file():
        return
    _take_run_lock(output_dir, record_holder=False).release()


def _writable_run_directory(output_dir: Path) -> None:
    """Create the run directory and check that files can be written there, before anything is run."""
    import tempfile

    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output_dir):
            pass
    except OSError as exc:
        raise ConfigError(
            f"cannot create the run directory {output_dir} or write in it: {exc.strerror or exc} — set "
            "hydra.run.dir (hydra.sweep.dir for -m) to a writable directory, or fix its permissions"
        ) from None


def _finish_tracking(exit_code: int) -> None:
    import sys

    if "wandb" in sys.modules:  # imported only when a W&B logger was configured
        from attnlab.runs.wandb import finish_wandb

        finish_wandb(exit_code)


def _fit_and_evaluate(
    cfg: DictConfig,
    experiment: Experiment,
    output_dir: Path,
    manifest: dict[str, Any] | None,
    resume_from: str | None,
    resumed_step: int | None,
) -> dict[str, float]:
    import lightning as L
    from hydra.utils import instantiate

    from attnlab.runs.manifest import data_identity, write_manifest
    from attnlab.training.checkpoint_io import AtomicCheckpointIO
    from attnlab.training.module import TranslationModule

    continuing = resumed_step is not None  # the run goes on from its own last.ckpt

    datamodule = experiment.data.datamodule()
    datamodule.setup("fit")  # real corpora are prepared (or loaded from the cache) here
    if manifest is not None:
        manifest["data"] = data_identity(datamodule)
        write_manifest(output_dir, manifest)
    model = experiment.model
    if model.src_vocab_size is None:
        try:
            model = model.with_vocab(datamodule.src_vocab_size, datamodule.tgt_vocab_size)
        except ValueError as exc:
            raise ConfigError(f"model.{exc} (vocabulary sizes from the data's tokenizers)") from exc
    check_special_ids(model, datamodule)
    if resume_from is not None and not continuing:  # the run's own last.ckpt: its config.yaml was compared
        from attnlab.training.resume import check_checkpoint_fits

        check_checkpoint_fits(resume_from, model)
    if model.pe == "learned" and hasattr(datamodule, "limit_positions"):
        datamodule.limit_positions(model.max_positions)
    module = TranslationModule(model=model, optim=experiment.optim, decode=experiment.decode)
    compile_model(module.model, cfg.get("compile"))
    history: list[dict[str, float]] = []
    if continuing:
        from attnlab.training.resume import csv_history, previous_wandb_id

        history = csv_history(output_dir, resumed_step)
        wandb_node = (cfg.get("logger") or {}).get("wandb")
        if wandb_node is not None and wandb_node.get("id") is None:
            wandb_node.id = previous_wandb_id(output_dir)  # the same W&B run, continued
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        callbacks=_instantiate_all(cfg.get("callbacks")),
        logger=_instantiate_all(cfg.get("logger")) or False,
        default_root_dir=str(output_dir),
        plugins=[*cluster_plugins(), AtomicCheckpointIO(own_run=continuing)],
    )
    datamodule.check_feeds(trainer.world_size, test=bool(cfg.get("test", True)))  # before any training
    log.info("run directory: %s", output_dir)
    if history:
        from attnlab.training.resume import restore_csv_history

        restore_csv_history(trainer, history)
    effective = effective_batch(cfg, trainer)
    log.info("effective batch: %s", effective["formula"])
    runs = _tracked_runs(trainer)
    if manifest is not None:
        manifest["effective_batch"] = effective
        if runs:
            manifest["wandb_run_id"] = runs[0].id
        write_manifest(output_dir, manifest)
    for run in runs:  # the whole resolved config and the manifest, beside Lightning's hyperparameters
        run.config.update({"run": resolved_config(cfg), "manifest": manifest or {}}, allow_val_change=True)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    if manifest is not None and module.schedule_facts is not None:
        manifest["schedule"] = module.schedule_facts  # written with the run's final status
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    best = _best_score(cfg, trainer)
    if best is not None:  # what sweepers optimize: the monitor's value at the selected checkpoint
        metrics[f"best/{cfg.monitor.metric}"] = best
    if cfg.get("test", True):
        metrics.update(_final_evaluation(cfg, trainer, module, datamodule, output_dir))
        if runs and (output_dir / "results.json").is_file():
            from attnlab.runs.wandb import log_results

            log_results(runs, json.loads((output_dir / "results.json").read_text()), output_dir)
    for split, count in getattr(datamodule, "truncated", {}).items():
        metrics[f"data/truncated/{split}"] = float(count)
    results_file = output_dir / "results.json"
    if trainer.is_global_zero and results_file.is_file():  # every final metric, for sweeps and reports
        from attnlab.runs.results import write_results

        write_results(output_dir, {**json.loads(results_file.read_text()), "metrics": metrics})
    return metrics


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
    requeues the job itself (its SIGUSR1 handler runs after `attnlab.training.callbacks.Preemption` saved)."""
    import os

    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return []
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)]


def _tracked_runs(trainer: Any) -> list[Any]:
    from lightning.pytorch.loggers import WandbLogger

    if not any(isinstance(lg, WandbLogger) for lg in trainer.loggers):
        return []
    from attnlab.runs.wandb import wandb_runs

    return wandb_runs(trainer)


def _monitor_checkpoint(cfg: DictConfig, trainer: Any) -> Any:
    """The checkpoint callback of `cfg.monitor` (else the first one; None without any)."""
    metric = cfg.get("monitor", {}).get("metric")
    callbacks = [
        cb for cb in trainer.checkpoint_callbacks if cb.monitor == metric
    ] or trainer.checkpoint_callbacks
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


def _final_evaluation(
    cfg: DictConfig, trainer: Any, module: Any, datamodule: ParallelDataModule, output_dir: Path
) -> dict[str, float]:
    """Load the final weights (best checkpoint, or the average of the last `average_last` epochs),
    compute the test loss, and on rank 0 decode every test set with beam search into `results.json`."""
    from attnlab.inference.translator import Translator, evaluate
    from attnlab.runs.checkpoint import data_settings, last_epoch_checkpoints, read_averaged
    from attnlab.runs.results import write_results

    average_last = int(cfg.get("average_last") or 0)
    if average_last > 0:
        paths = [str(p) for p in last_epoch_checkpoints(output_dir, average_last)]
    else:
        best = _best_checkpoint(cfg, trainer)
        paths = [best] if best else []
    if paths:
        module.load_state_dict(read_averaged(paths)["state_dict"])
    tested = trainer.test(module, datamodule=datamodule, verbose=False)
    metrics = {k: float(v) for k, v in tested[0].items()}
    if not trainer.is_global_zero:  # one process decodes and scores the complete test sets
        return metrics
    tokenizer = getattr(datamodule, "tgt_tokenizer", None)
    extra = {"test_metrics": metrics}
    if tokenizer is None:  # no text to translate (synthetic data)
        checkpoints = [str(Path(p).resolve()) for p in paths]
        write_results(output_dir, {"checkpoints": checkpoints, "averaged": len(paths) > 1, **extra})
        return metrics
    module.to(trainer.strategy.root_device)  # decode on the training device, wherever testing left it
    data = data_settings(datamodule)  # as a checkpoint holds them (the source limit: max_source_tokens)
    translator = Translator(module.model, datamodule.src_tokenizer, tokenizer, module.decode_config, data)
    sets = {name: datamodule.raw_text(name) for name in datamodule.test_sets}
    results = evaluate(translator, sets, output_dir, checkpoints=paths, extra=extra)
    for name, entry in results["sets"].items():
        metrics[f"test/{name}/bleu"] = entry["bleu"]
        metrics[f"test/{name}/chrf"] = entry["chrf"]
    return metrics
