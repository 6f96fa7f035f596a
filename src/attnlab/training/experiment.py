"""Turning a composed Hydra config into validated objects, before torch or lightning is imported.

`validate(cfg)` checks the top-level keys, instantiates the torch-free nodes (`model`, `optim`, `data`,
`decode`, `metrics`; their constructors check their own values, e.g. that a data directory exists), checks the
trainer's simple values and the fit between data and model, and raises `ConfigError` naming the key and
the fix.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from attnlab.decoding import DecodeConfig
from attnlab.metrics import VAL_SCORES, MetricsConfig, better, check_metric_name, split_metric
from attnlab.model.config import TransformerConfig
from attnlab.optim import OptimConfig
from attnlab.training.allocator import check_mode
from attnlab.typed import (
    RESERVED_KEYS,
    ConfigError,
    build_from,
    did_you_mean,
    is_int,
    is_number,
    reject_unknown_keys,
    whole_count,
)

# Trainer counts that must be positive integers (True: null is allowed too).
POSITIVE_TRAINER_COUNTS = {
    "accumulate_grad_batches": False,
    "num_nodes": False,
    "check_val_every_n_epoch": True,
}
ACCELERATORS = {"auto", "cpu", "gpu", "cuda", "mps", "tpu"}
MAX_SEED = 2**32 - 1  # Lightning's `seed_everything` (NumPy's seeds) takes 0 to this
PRECISIONS = {
    "32",
    "32-true",
    "16-mixed",
    "bf16-mixed",
    "bf16-true",
    "16-true",
    "64",
    "64-true",
    "transformer-engine",
}


@dataclass(frozen=True)
class Experiment:
    """The validated, torch-free parts of a training config."""

    model: TransformerConfig
    optim: OptimConfig
    data: Any
    decode: DecodeConfig
    metrics: MetricsConfig = field(default_factory=MetricsConfig)


def _target_class(node: DictConfig, key: str) -> type:
    from hydra.utils import get_class

    target = node.get("_target_")
    if target is None:
        raise ConfigError(f"{key} has no _target_: pick a config from the `{key}` group (e.g. {key}=<name>)")
    try:
        return get_class(target)
    except Exception as exc:  # hydra wraps import errors in its own types
        raise ConfigError(f"{key}._target_={target} cannot be imported: {exc}") from exc


def check_constructor_keys(cfg: DictConfig) -> None:
    """The nodes that reach a constructor when training starts (`trainer`, every `callbacks.*` and
    `logger.*`) hold only parameters of the class they name, and every such node names one.

    A logger whose optional packages are missing (`attnlab.runs.tracking.LOGGER_PACKAGES`) is refused,
    naming `pip install "attnlab[loggers]"`.

    Run after `validate`, before any data is prepared: it imports those classes (lightning among them)
    to read their signatures, so a mistyped `+trainer.max_epoch=3` fails at once, with a did-you-mean,
    rather than as a TypeError after data preparation. A class taking `**kwargs` accepts any key,
    unless it names the keys it passes them on to (a classmethod `accepted_keys`, as
    `attnlab.runs.wandb.WandbLogger` does). A class with a classmethod `check_config(key, node)` checks
    its values there too (`WandbLogger`: its mode and tags).

    Raises:
        ConfigError: naming the key, the class and the fix.
    """
    nodes = [("trainer", cfg.trainer)]
    for group in ("callbacks", "logger"):
        entries = cfg.get(group) or {}
        named = [name for name, node in entries.items() if OmegaConf.is_dict(node) and "_target_" in node]
        for name, node in entries.items():
            if node is None:  # switched off (callbacks.<name>=null)
                continue
            if not OmegaConf.is_dict(node) or "_target_" not in node:
                raise ConfigError(
                    f"{group}.{name} names no class (_target_), so nothing would build it: "
                    f"{did_you_mean(name, named, f'{group}.')}remove the +{group}.{name}... override or "
                    f"fix its name; the {group} are {', '.join(named) or 'none'}"
                )
            nodes.append((f"{group}.{name}", node))
    for key, node in nodes:
        cls = _target_class(node, key)
        if key.startswith("logger."):  # an optional package missing: refused now, not when training starts
            from attnlab.runs.tracking import check_logger_packages

            check_logger_packages(key, cls)
        check = getattr(cls, "check_config", None)  # a class checking its values itself (a W&B mode)
        if callable(check):
            check(key, node)
        accepted = getattr(cls, "accepted_keys", None)  # a class passing **kwargs on names what it takes
        if callable(accepted):
            reject_unknown_keys(key, cls, node.keys(), list(accepted()))
            continue
        parameters = inspect.signature(cls).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            continue
        reject_unknown_keys(key, cls, node.keys(), list(parameters))


def build_node(node: DictConfig, key: str) -> Any:
    """Instantiate a torch-free config node, turning any problem into a `ConfigError` naming `key`."""
    cls = _target_class(node, key)
    missing = [k for k in node if OmegaConf.is_missing(node, k)]
    if missing:
        raise ConfigError(
            f"{key}.{missing[0]} is required (??? in the config): set {key}.{missing[0]}=<value>"
        )
    values = OmegaConf.to_container(node, resolve=True)
    return build_from(cls, {k: v for k, v in values.items() if k not in RESERVED_KEYS}, key)


def _added_keys(cfg: DictConfig) -> list[str]:
    """Top-level keys that exist only because a `+key=value` override added them (no config file defines
    them, so nothing reads them: a typo). Found from Hydra's task overrides; none without Hydra's node."""
    if "hydra" in cfg:
        hydra = cfg.hydra
    else:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return []
        hydra = HydraConfig.get()
    groups = set(hydra.runtime.choices)
    task = hydra.overrides.task  # the overrides as typed (`+k=${oc.env:X}` not resolved: X may be unset)
    typed = OmegaConf.to_container(task, resolve=False) if isinstance(task, ListConfig) else list(task)
    added = {o[1:].split("=", 1)[0] for o in typed if o.startswith("+") and o[1:2] != "+"}
    return sorted(k for k in added if k in cfg and k not in groups and not set(k) & set("./@"))


def _check_top_level(cfg: DictConfig) -> None:
    unknown = _added_keys(cfg)
    if unknown:
        key = unknown[0]
        known = sorted(set(cfg) - set(unknown) - {"hydra"})
        raise ConfigError(
            f"{key} is not a key of the training config (conf/train.yaml): {did_you_mean(key, known)}"
            f"remove the +{key}=... override or fix its name; known keys: {', '.join(known)}"
        )
    seed = cfg.get("seed")
    if seed is not None and (not is_int(seed) or not 0 <= seed <= MAX_SEED):
        raise ConfigError(f"seed={seed!r} must be an integer from 0 to {MAX_SEED} (or null)")
    average_last = cfg.get("average_last", 0)
    if not is_int(average_last) or average_last < 0:
        raise ConfigError(
            f"average_last={average_last!r} must be an integer >= 0 (the last N epochs to average; 0: the "
            "best checkpoint)"
        )
    every = cfg.get("average_every_n_steps")
    if every is not None and (not is_int(every) or every < 1):
        raise ConfigError(
            f"average_every_n_steps={every!r} must be a positive integer (keep a checkpoint for averaging "
            "every N optimizer steps) or null (one per epoch)"
        )
    sweep_skip_done(cfg.get("sweep"))
    check_optimized_metric(cfg.get("optimized_metric"))
    test = cfg.get("test", True)
    if not isinstance(test, bool):
        raise ConfigError(f"test={test!r} must be true or false")
    try:
        check_mode(cfg.get("allocator", "keep"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _check_init_from(cfg)


def _check_init_from(cfg: DictConfig) -> None:
    init_from = cfg.get("init_from")
    if init_from is None:
        return
    if not isinstance(init_from, str) or not Path(init_from).expanduser().is_file():
        raise ConfigError(
            f"init_from={init_from!r} is not a checkpoint file: give a .ckpt file written by attnlab-train "
            "(e.g. <run>/checkpoints/last.ckpt) or null"
        )
    if cfg.get("ckpt_path") not in (None, "last"):
        raise ConfigError(
            f"init_from={init_from} and ckpt_path={cfg.ckpt_path}: give one of them — ckpt_path continues "
            "from a checkpoint's whole state (optimizer, schedule, step), init_from takes its weights only"
        )


SWEEP_KEYS = ("skip_done",)


def sweep_skip_done(node: Any) -> bool:
    """`sweep.skip_done` of the `sweep` config node (false without one, and for `null`: Hydra's way to
    unset a key, `sweep.skip_done=null`, reads as its default).

    Raises:
        ConfigError: skip_done is not true, false or null (the text `no` or `false` read as true: the sweep
            skipped its finished jobs), or the node holds another key (a misspelt `skip_done`, read as
            false: the sweep trained its finished jobs again, over their results).
    """
    if node is None:
        return False
    _check_node_keys(node, "sweep", SWEEP_KEYS)
    skip = node.get("skip_done", False)
    if skip is None:
        return False
    if not isinstance(skip, bool):
        raise ConfigError(f"sweep.skip_done={skip!r} must be true or false (null: false)")
    return skip


# The config groups' nodes of a training config, each with whether it may be null (no loggers, no
# callbacks), and its other nodes of settings (null: the defaults); each a mapping.
GROUP_NODES = {
    "model": False, "optim": False, "data": False, "decode": False, "trainer": False, "paths": False,
    "logger": True, "callbacks": True,
}  # fmt: skip
SETTING_NODES = ("metrics", "monitor", "compile")
COMPILE_KEYS = ("enabled", "backend", "mode", "dynamic")


def _check_nodes(cfg: DictConfig) -> None:
    """The config's nodes are mappings of settings (`GROUP_NODES`, `SETTING_NODES`), and `compile` holds
    only `COMPILE_KEYS`, its `enabled` true or false. An experiment file's `model: small` (for `override
    /model: small`) or `logger: csv` failed with an AttributeError; `compile: true` or a misspelt
    `compile.enable: true` were read as no compilation, and `compile.enabled: yes` failed only once the
    data was prepared."""
    for key, nullable in GROUP_NODES.items():
        node = cfg.get(key)
        if node is None and not nullable:
            raise ConfigError(f"the config has no `{key}` node: select one, e.g. `{key}=<name>`")
        if node is not None and not OmegaConf.is_dict(node):
            raise ConfigError(
                f"{key}={node!r} is not a config node: select an option of the group with {key}=<name> (in "
                f"an experiment file, `override /{key}: <name>` under defaults) or set its keys ({key}.<key>)"
            )
    for key in SETTING_NODES:
        node = cfg.get(key)
        if node is not None and not OmegaConf.is_dict(node):
            raise ConfigError(f"{key}={node!r} must be a node of {key} settings (or null)")
    compile_node = cfg.get("compile")
    if compile_node is not None:
        _check_node_keys(compile_node, "compile", COMPILE_KEYS)
        if not isinstance(compile_node.get("enabled", False), bool):
            raise ConfigError(f"compile.enabled={compile_node.enabled!r} must be true or false")


PROGRESS_KEYS = ("every_n_seconds", "every_n_steps")


def check_progress(every_n_seconds: Any = None, every_n_steps: Any = None) -> None:
    """The `progress` settings (`attnlab.training.console.ProgressLines`): a period in seconds > 0 and one
    in optimizer steps >= 1, each or both null."""
    if every_n_seconds is not None and (not is_number(every_n_seconds) or every_n_seconds <= 0):
        raise ConfigError(
            f"progress.every_n_seconds={every_n_seconds!r} must be a number of seconds > 0, or null for no "
            "time period"
        )  # fmt: skip
    if every_n_steps is not None and (not is_int(every_n_steps) or every_n_steps < 1):
        raise ConfigError(
            f"progress.every_n_steps={every_n_steps!r} must be an integer >= 1, or null for no step period"
        )


def _check_progress(node: Any) -> None:
    if node is None:
        return
    _check_node_keys(node, "progress", PROGRESS_KEYS)
    check_progress(**node)


def _check_node_keys(node: Any, name: str, keys: tuple[str, ...]) -> None:
    """Refuse a `name` config node that is no mapping, or that holds a key outside `keys` (with a
    did-you-mean: a misspelt key would be read as its default)."""
    if not OmegaConf.is_dict(node) and not isinstance(node, dict):
        raise ConfigError(f"{name}={node!r} must be a node with {' and '.join(keys)}")
    unknown = sorted(set(node) - set(keys))
    if unknown:
        raise ConfigError(
            f"{name}.{unknown[0]} is not a {name} setting: "
            f"{did_you_mean(unknown[0], list(keys), f'{name}.')}known keys: {', '.join(keys)}"
        )


def _check_trainer(trainer: DictConfig) -> None:
    max_epochs = trainer.get("max_epochs")
    if max_epochs is not None and (not is_int(max_epochs) or max_epochs < -1 or max_epochs == 0):
        raise ConfigError(
            f"trainer.max_epochs={max_epochs!r} must be a positive integer (or -1 for no limit)"
        )
    for key, nullable in POSITIVE_TRAINER_COUNTS.items():
        value = trainer.get(key, 1)
        if not (value is None and nullable) and (not is_int(value) or value < 1):
            raise ConfigError(
                f"trainer.{key}={value!r} must be a positive integer{' (or null)' if nullable else ''}"
            )
    accelerator = trainer.get("accelerator")
    if isinstance(accelerator, str) and accelerator not in ACCELERATORS:
        raise ConfigError(
            f"trainer.accelerator={accelerator!r} is unknown: use one of {sorted(ACCELERATORS)}"
        )
    precision = trainer.get("precision")
    if precision is not None and str(precision) not in PRECISIONS:
        raise ConfigError(f"trainer.precision={precision!r} is unknown: use one of {sorted(PRECISIONS)}")
    clip = trainer.get("gradient_clip_val")
    if clip is not None and (not isinstance(clip, (int, float)) or clip < 0):
        raise ConfigError(f"trainer.gradient_clip_val={clip!r} must be a number >= 0 (or null)")
    _check_devices(trainer)
    # A number: 0 failed with a ZeroDivisionError after the first step. (A text or a mapping is a time,
    # `"00:00:30:00"` or `{minutes: 30}`, which Lightning checks when it builds the trainer.) A whole
    # float above 1 (`5000.0`, YAML's `5e3`) is a number of batches, as Lightning takes it.
    interval = trainer.get("val_check_interval")
    fraction = isinstance(interval, float) and 0 < interval <= 1
    if is_number(interval) and not fraction and whole_count(interval) is None:
        raise ConfigError(
            f"trainer.val_check_interval={interval!r} must be a number of training batches >= 1, a fraction "
            'of an epoch in (0, 1], a time ("DD:HH:MM:SS"), or null (at each epoch\'s end)'
        )


def _check_devices(trainer: DictConfig) -> None:
    """`trainer.devices`: a count, -1 (every GPU) or `auto`; a list of device ids (`[0,1]`, `"0,1"`) or -1
    only off the CPU (`runs_on_cpu`: `trainer.accelerator=cpu`, or `auto` on a machine without a GPU),
    where Lightning takes a number of processes alone (it failed with a TypeError once the run had
    started). A mapping (`+trainer.devices.0=1`) is refused too (Lightning's TypeError, the run started)."""
    devices = trainer.get("devices")
    if isinstance(devices, DictConfig):
        shown = OmegaConf.to_container(devices)
        raise ConfigError(
            f"trainer.devices={shown!r} must be a positive count, -1 (all), 'auto' or a list of device ids "
            "([0,1])"
        )
    if isinstance(devices, int) and (devices == 0 or devices < -1):
        raise ConfigError(f"trainer.devices={devices} must be a positive count, -1 (all) or 'auto'")
    listed = isinstance(devices, ListConfig) or (isinstance(devices, str) and "," in devices)
    if (listed or str(devices).strip() == "-1") and runs_on_cpu(trainer):
        cpu = "cpu" if trainer.get("accelerator") == "cpu" else "auto finds no GPU here, and the CPU"
        raise ConfigError(
            f"trainer.devices={devices!r} {'lists device ids' if listed else 'counts GPUs'}, but "
            f"trainer.accelerator={cpu} runs a number of processes: give that number (trainer.devices=2), or "
            "'auto' for one"
        )


def runs_on_cpu(trainer: Any) -> bool:
    """Whether Lightning runs the trainer config `trainer` on the CPU: `trainer.accelerator=cpu`, or `auto`
    (the default) on a machine where torch finds no GPU (CUDA or Apple's MPS) and no TPU's `torch_xla`
    is installed. Imports torch for `auto` alone."""
    accelerator = str(trainer.get("accelerator", "auto"))
    if accelerator != "auto":
        return accelerator == "cpu"
    import torch

    return (
        torch.cuda.device_count() == 0
        and not torch.backends.mps.is_available()
        and importlib.util.find_spec("torch_xla") is None
    )


def _check_run_length(trainer: DictConfig, optim: OptimConfig) -> None:
    """A linear schedule decays to 0 at the run's last step: it needs a run of known length (it failed
    when the optimizer was built, once the run had started). Lightning sets no epoch limit for
    max_epochs=-1, and for max_epochs=null with a time limit (`max_time`); 1000 epochs for null alone."""
    bounded = optim.total_steps is not None or trainer.get("max_steps", -1) not in (-1, None)
    if optim.schedule != "linear" or bounded:
        return
    max_epochs = trainer.get("max_epochs")
    if max_epochs == -1 or (max_epochs is None and trainer.get("max_time") is not None):
        given = "-1" if max_epochs == -1 else "null with trainer.max_time"
        raise ConfigError(
            f"trainer.max_epochs={given} (no epoch limit) with the linear schedule, which decays to 0 at the "
            "run's last step: set trainer.max_steps or optim.total_steps, or use optim=inverse_sqrt or "
            "optim=noam"
        )


def _check_fit(model: TransformerConfig, data: Any) -> TransformerConfig:
    if model.tie == "all" and getattr(data, "joint_vocab", True) is False:
        raise ConfigError(
            "model.tie=all shares one embedding between source and target, but data.joint_vocab=false: "
            "set data.joint_vocab=true or model.tie=decoder"
        )
    if model.src_vocab_size is not None or model.tgt_vocab_size is not None:
        raise ConfigError(
            "model.src_vocab_size/model.tgt_vocab_size are set by the data: remove them from the model config"
        )
    vocab = getattr(data, "fixed_vocab_size", None)
    if vocab is not None:
        try:
            model = model.with_vocab(vocab, vocab)
        except ValueError as exc:
            raise ConfigError(f"model.{exc} (vocabulary from data: {vocab})") from exc
    needed = getattr(data, "max_positions_needed", None)
    if needed is not None and model.length_limit(needed) < needed:
        raise ConfigError(
            f"model.max_positions={model.max_positions} is smaller than the {needed} positions the data "
            f"needs with pe=learned: set model.max_positions>={needed} or use model.pe=sinusoidal"
        )
    return model


def _check_data_spec(data: Any) -> None:
    """Every checkpoint holds its run's data settings, read back only for attnlab's own data specs
    (`attnlab.data.DATA_SPECS`, a closed list: a checkpoint never chooses what code runs). A run with
    another class would train for hours and then fail to read its own checkpoints: refuse it now."""
    from attnlab.data import DATA_SPECS  # torch-free

    if type(data) not in set(DATA_SPECS.values()):
        known = sorted({f"attnlab.data.{cls.__qualname__}" for cls in DATA_SPECS.values()})
        raise ConfigError(
            f"data._target_={type(data).__module__}.{type(data).__qualname__} is not one of attnlab's data "
            f"specs ({', '.join(known)}): checkpoints are read back only with those; for your own parallel "
            "text use data=files (or data=hf)"
        )


def validate(cfg: DictConfig) -> Experiment:
    """Validate a composed training config without importing torch.

    Raises:
        ConfigError: naming the offending key, its value and the fix (an interpolation that cannot be
            resolved, such as `${oc.env:VAR}` of an unset variable, included).
    """
    with interpolations_refused(cfg):
        return _validate(cfg)


@contextmanager
def interpolations_refused(cfg: DictConfig) -> Iterator[None]:
    """Turn an interpolation of `cfg` that cannot be resolved (`${oc.env:VAR}` of an unset variable, a
    `${monitor.metric}` of `monitor=null`), raised inside, into a `ConfigError` naming the key and the fix."""
    try:
        yield
    except InterpolationResolutionError as exc:
        reason = str(exc).splitlines()[0]
        key = exc.full_key or _unresolvable_key(cfg) or "a value"
        raise ConfigError(
            f"{key}: {reason}: set what it refers to (an environment variable: export it) or give the key a "
            "value"
        ) from None


def _unresolvable_key(node: DictConfig, prefix: str = "") -> str | None:
    """The first key under `node` whose interpolation cannot be resolved (Hydra's own node left out)."""
    for key in node:
        path = f"{prefix}{key}"
        if path == "hydra":
            continue
        try:
            value = node[key]
        except InterpolationResolutionError:
            return path
        found = _unresolvable_key(value, f"{path}.") if isinstance(value, DictConfig) else None
        if found:
            return found
    return None


def _validate(cfg: DictConfig) -> Experiment:
    _check_nodes(cfg)
    _check_top_level(cfg)
    model = build_node(cfg.model, "model")
    optim = build_node(cfg.optim, "optim")
    data = build_node(cfg.data, "data")
    _check_data_spec(data)
    decode = build_node(cfg.decode, "decode")
    metrics = build_node(cfg.metrics, "metrics") if cfg.get("metrics") is not None else MetricsConfig()
    try:
        metrics.check_available()  # before hours of training whose every validation would fail
    except ValueError as exc:
        raise ConfigError(f"metrics.{exc}") from None
    _check_trainer(cfg.trainer)
    _check_run_length(cfg.trainer, optim)
    _check_progress(cfg.get("progress"))
    return Experiment(model=_check_fit(model, data), optim=optim, data=data, decode=decode, metrics=metrics)


SCORED_METRICS = tuple(split_metric("val", name) for name in VAL_SCORES)


def check_optimized_metric(optimized_metric: Any) -> None:
    """`optimized_metric` names a final metric (text) or is null.

    Raises:
        ConfigError: It is anything else (a list failed as a TypeError once the run had trained).
    """
    if optimized_metric is not None and not isinstance(optimized_metric, str):
        raise ConfigError(
            f"optimized_metric={optimized_metric!r} must be the name of a final metric (best/val/bleu, "
            "val/loss, ...) or null"
        )


def check_sweep_objective(optimized_metric: Any, direction: Any) -> None:
    """What a sweep optimizes, checked before any job trains: `optimized_metric` must be a final metric some
    training run writes (`attnlab.metrics.check_metric_name`; a test set's `test/<set>/bleu` whatever the
    set), and a sweeper that optimises in a direction (Optuna's `hydra.sweeper.direction`) must go the way
    it improves (`attnlab.metrics.better`): maximizing a loss searches for the worst settings, and the
    study's best trial is then the worst run. A metric of neither kind, a sweeper without a direction
    (Hydra's basic sweeper) or several directions (several objectives) are not checked for the direction;
    one direction in a list (`[maximize]`: one objective) is.

    Raises:
        ConfigError: `optimized_metric` is no text, no run writes it (naming the closest name and the
            valid ones), or the direction is the other one, naming both fixes.
    """
    check_optimized_metric(optimized_metric)
    if optimized_metric is not None:  # (else every job's value was missing, reported once it had trained)
        check_metric_name(optimized_metric, "optimized_metric")
    if isinstance(direction, Sequence) and not isinstance(direction, str) and len(direction) == 1:
        direction = direction[0]  # one objective given as a list (`[maximize]`), as Optuna's sweeper takes it
    direction = getattr(direction, "name", direction)  # Optuna's Direction enum, or its name
    want = {"max": "maximize", "min": "minimize"}.get(better(optimized_metric or "") or "")
    if want is None or not isinstance(direction, str) or direction.lower() == want:
        return
    kind = "higher" if want == "maximize" else "lower"
    raise ConfigError(
        f"optimized_metric={optimized_metric} is better {kind}, but hydra.sweeper.direction={direction}: the "
        f"search would look for the worst settings. Add hydra.sweeper.direction={want}, or optimize another "
        "metric"
    )


def resolve_monitor(cfg: DictConfig, experiment: Experiment) -> DictConfig:
    """`cfg` with the `auto` values of `cfg.monitor` filled in (see `conf/train.yaml`): a new config, so
    that the interpolations reading them (`${monitor.metric}` in the checkpoint callback) see the values;
    `cfg` itself is not changed.

    Raises:
        ConfigError: A metric fitting does not log (`attnlab.metrics.fit_metrics`: a misspelt `val/blue`,
            or `test/loss`, computed after fitting), a BLEU/chrF monitor without validation decodes, or
            an unknown mode.
    """
    node = cfg.get("monitor")
    if node is None:
        return cfg
    from attnlab.data.corpora import CorpusData  # torch-free, like everything validate() builds

    has_text = isinstance(experiment.data, CorpusData)
    decodes = has_text and experiment.decode.every_n_epochs > 0
    metric = node.get("metric", "auto")
    if metric == "auto":
        metric = split_metric("val", "bleu" if decodes else "loss")
    check_metric_name(metric, "monitor.metric", fitting=True)  # not after the first validation, in Lightning
    if metric in SCORED_METRICS and not decodes:
        why = "the data has no text to score" if not has_text else "decode.every_n_epochs=0 turns them off"
        raise ConfigError(
            f"monitor.metric={metric} needs validation decodes, but {why}: use monitor.metric=val/loss "
            "(or auto)"
        )
    mode = node.get("mode", "auto")
    if mode == "auto":
        mode = better(metric) or "min"
    if mode not in ("min", "max"):
        raise ConfigError(f"monitor.mode={mode!r} must be min, max or auto")
    every = node.get("every_n_epochs", "auto")
    if every == "auto":
        every = experiment.decode.every_n_epochs if metric in SCORED_METRICS else 1
    if not is_int(every) or every < 1:
        raise ConfigError(f"monitor.every_n_epochs={every!r} must be a positive integer or auto")
    return OmegaConf.merge(cfg, {"monitor": {"metric": metric, "mode": mode, "every_n_epochs": every}})
