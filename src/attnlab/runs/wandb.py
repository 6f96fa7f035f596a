"""W&B tracking: the logger, run grouping and naming, and what goes to W&B besides metrics.

- `config_group(cfg)`: a hash of the run's setting (`attnlab.runs.layout.setting`: the resolved config
  without the seed and the `BOOKKEEPING` keys), so the seeds of one setting share a W&B group;
  `attnlab-compare` groups runs by the same setting (`attnlab.reports.compare.varying_keys`).
- `run_name(overrides)`: the run's name from its command-line overrides (`pe=learned,n_heads=4,seed=2`),
  bookkeeping overrides left out.
- `wandb_names(node, resolved, overrides)`: those two for a W&B logger config whose `group` or `name` is
  null.
- `WandbLogger`: Lightning's `WandbLogger` that keeps W&B's directories inside the run directory
  (`WANDB_DIR`, `WANDB_DATA_DIR`, `WANDB_CACHE_DIR`, `WANDB_CONFIG_DIR`, unless the user set them),
  offline unless asked otherwise, and summarises validation scores by their best value (`SUMMARIES`:
  the maximum of `val/bleu` and `val/chrf`, the minimum of the validation losses), not the last.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger

from attnlab.metrics import SPLIT_NAMES, better, split_metric
from attnlab.runs.layout import RunDir, setting, setting_overrides
from attnlab.typed import ConfigError

__all__ = ["WandbLogger", "check_wandb_settings", "config_group", "finish_wandb", "log_results",
           "run_name", "wandb_names", "wandb_runs"]  # fmt: skip

# How W&B summarises a metric of the history (`define_metric(summary=...)`): its best value, not the last,
# for validation scores and losses; everything else keeps W&B's default, the last value.
SUMMARIES = {split_metric("val", name): better(name) for name in SPLIT_NAMES["val"]}
# The modes W&B runs in (`wandb.init(mode=...)`; `dryrun` and `run` are its old names of offline and online)
WANDB_MODES = ("offline", "online", "disabled", "shared", "dryrun", "run")
_SET_BY_US: dict[str, str] = {}  # W&B directory variables this process set (for the next run of a multirun)
WANDB_DIRS = {
    "WANDB_DIR": "",
    "WANDB_DATA_DIR": "data",
    "WANDB_CACHE_DIR": "cache",
    "WANDB_CONFIG_DIR": "config",
}


def config_group(config: dict[str, Any]) -> str:
    """A 10-hex-digit hash of a resolved config's setting (`attnlab.runs.layout.setting`): without its
    seed and bookkeeping keys (paths, Hydra, loggers, callbacks but early stopping's patience and
    min_delta, sweep and resume settings), and with values derived from the run directory, like
    checkpoint paths, counting as the same. (Runs with `callbacks=early_stopping` made before those two
    counted hash to another group than new runs of their setting: `logger.wandb.group=<old group>`
    continues one.)"""
    text = json.dumps(setting(config), sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]


def run_name(overrides: Sequence[str]) -> str | None:
    """`a.b.pe=learned model.n_heads=4 seed=2` -> `pe=learned,n_heads=4,seed=2` (None without overrides).

    Overrides of bookkeeping keys (`attnlab.runs.layout.setting_overrides`: paths, Hydra, loggers, callbacks
    but early stopping's patience and min_delta, ...) are left out; a config group choice keeps its name
    (`model=small`), a deletion its `~` (`~model.label_smoothing` -> `~label_smoothing`).
    """
    parts = []
    for override in setting_overrides(overrides):
        key, sep, value = override.lstrip("+~").partition("=")
        parts.append(f"{key.split('.')[-1]}={value}" if sep else f"~{key.split('.')[-1]}")  # (a deletion)
    return ",".join(parts) or None


def wandb_names(
    node: Mapping[str, Any], resolved: dict[str, Any], overrides: Sequence[str]
) -> dict[str, str]:
    """The values for the null `group` and `name` of the W&B logger config `node`: `config_group` of the
    resolved config and `run_name` of the job's overrides (a name only when there are overrides).
    Nothing is changed; the caller fills them in."""
    names: dict[str, str] = {}
    if node.get("group") is None:
        names["group"] = config_group(resolved)
    name = run_name(overrides) if node.get("name") is None else None
    if name is not None:
        names["name"] = name
    return names


class WandbLogger(_LightningWandbLogger):
    """Lightning's `WandbLogger` with W&B's files under `save_dir` and offline by default.

    Args:
        project: W&B project.
        entity: W&B entity (user or team; None: the default of the logged-in user).
        group: Run group (attnlab fills it with `config_group` when None).
        name: Run name (attnlab fills it with `run_name` of the overrides when None).
        tags: Run tags (None: none).
        mode: `offline` (the default: nothing leaves the machine until `wandb sync`), `online` or
            `disabled`. The `WANDB_MODE` environment variable, when set, wins.
        save_dir: Where W&B writes (`<save_dir>/wandb/`); its data, cache and config directories go
            to `<save_dir>/wandb/{data,cache,config}` unless their environment variables are set.
        job_type: W&B job type.
        **kwargs: Passed on to Lightning's `WandbLogger` and `wandb.init`.
    """

    def __init__(
        self,
        project: str = "attnlab",
        entity: str | None = None,
        group: str | None = None,
        name: str | None = None,
        tags: Sequence[str] | None = (),
        mode: str = "offline",
        save_dir: str = ".",
        job_type: str = "train",
        **kwargs: Any,
    ) -> None:
        root = Path(save_dir) / "wandb"
        for variable, sub in WANDB_DIRS.items():
            current = os.environ.get(variable)
            if current is None or _SET_BY_US.get(variable) == current:  # not the user's own setting
                (root / sub).mkdir(parents=True, exist_ok=True)
                os.environ[variable] = _SET_BY_US[variable] = str(root / sub)
        mode = effective_mode(mode)
        super().__init__(name=name, save_dir=save_dir, project=project, entity=entity, group=group,
                         tags=list(tags or ()), mode=mode, job_type=job_type, **kwargs)  # fmt: skip
        if self._wandb_init.get("anonymous") is None:  # Lightning passes anonymous=None, which W&B warns of
            self._wandb_init.pop("anonymous", None)

    @property
    def experiment(self) -> Any:
        """The W&B run (created on first use, rank 0 only), with the `SUMMARIES` of its metrics defined."""
        run = super().experiment
        if not getattr(self, "_summaries_defined", False) and hasattr(run, "define_metric"):
            tensorboard = self._wandb_init.get("sync_tensorboard")  # Lightning's own step metric, kept
            step = {"step_metric": "global_step"} if tensorboard else {"step_metric": "trainer/global_step",
                                                                       "step_sync": True}  # fmt: skip
            for metric, summary in SUMMARIES.items():
                run.define_metric(metric, summary=summary, **step)
            self._summaries_defined = True
        return run

    @classmethod
    def accepted_keys(cls) -> list[str]:
        """The keys this logger takes: its own parameters and those of what its `**kwargs` reach,
        Lightning's `WandbLogger` and `wandb.init` (imported here: only when a W&B logger is configured)."""
        import wandb

        keys: list[str] = []
        for function in (cls, _LightningWandbLogger, wandb.init):
            for name, parameter in inspect.signature(function).parameters.items():
                if parameter.kind is not inspect.Parameter.VAR_KEYWORD and name not in keys:
                    keys.append(name)
        return keys

    @classmethod
    def check_config(cls, key: str, node: Mapping[str, Any]) -> None:
        """Refuse, when the config is checked, what W&B refuses only once the run starts, after the data is
        prepared (a `mode`, or `WANDB_MODE`, it does not know; a value its settings refuse,
        `check_wandb_settings`), and what it takes the wrong way (`tags` as one text, which became one tag
        per character).

        Raises:
            ConfigError: Naming the key (or the environment variable) and the values it takes.
        """
        mode = effective_mode(node.get("mode", "offline"))
        if mode not in WANDB_MODES:
            where = "the environment variable WANDB_MODE" if "WANDB_MODE" in os.environ else f"{key}.mode"
            unset = " (or unset it)" if "WANDB_MODE" in os.environ else ""
            raise ConfigError(f"{where}={mode!r} is no W&B mode: use one of {', '.join(WANDB_MODES)}{unset}")
        tags = node.get("tags", ())
        if isinstance(tags, str) or not all(isinstance(tag, str) for tag in tags or ()):
            example = tags if isinstance(tags, str) else "a,b"
            raise ConfigError(f"{key}.tags={tags!r} must be a list of texts: {key}.tags=[{example}]")
        check_wandb_settings(key, node)


# The keys of a W&B logger config that W&B validates when the run starts, by the `wandb.Settings` field
WANDB_SETTINGS = {"project": "project", "entity": "entity", "group": "run_group", "name": "run_name",
                  "tags": "run_tags", "id": "run_id", "job_type": "run_job_type"}  # fmt: skip


def check_wandb_settings(key: str, node: Mapping[str, Any]) -> None:
    """Refuse a value of the W&B logger config `node` (at `key`) that W&B's own settings refuse (a project
    holding `/`, a tag longer than 64 characters): W&B refused it with a traceback when the run started,
    after the data was prepared.

    Raises:
        ConfigError: Naming the key and W&B's reason.
    """
    import wandb

    for name, field in WANDB_SETTINGS.items():
        value = node.get(name)
        if value is None:
            continue
        try:
            wandb.Settings(**{field: tuple(value) if name == "tags" else value})
        except (wandb.Error, ValueError) as exc:  # (pydantic's ValidationError is a ValueError)
            errors = getattr(exc, "errors", None)
            reason = str(errors()[0]["msg"]).removeprefix("Value error, ") if callable(errors) else str(exc)
            raise ConfigError(f"{key}.{name}: W&B refuses it ({reason}): set another {key}.{name}") from None


def effective_mode(mode: str) -> str:
    """The W&B mode a logger configured with `mode` runs in: the `WANDB_MODE` environment variable's when it
    is set (W&B reads it even when empty), else `mode`."""
    return os.environ.get("WANDB_MODE", mode)


def wandb_runs(trainer: Any) -> list[Any]:
    """The W&B runs of the trainer's `WandbLogger`s (rank 0 only; empty elsewhere or when disabled)."""
    if not trainer.is_global_zero:
        return []
    return [lg.experiment for lg in trainer.loggers if isinstance(lg, _LightningWandbLogger)]


def log_results(runs: list[Any], summary: dict[str, Any], results: dict[str, Any], output_dir: Path) -> None:
    """`summary` (`attnlab.runs.tracking.result_summary` of `results.json`) into each run's summary, and
    per test set its hypotheses as a W&B Table and all hypotheses files as one artifact."""
    import wandb

    run_dir = RunDir(output_dir)
    for run in runs:
        run.summary.update(summary)
        tables = {}
        for name, entry in results.get("sets", {}).items():
            lines = (run_dir.path / entry["hypotheses"]).read_text(encoding="utf-8").split("\n")[:-1]
            rows = [[i + 1, line] for i, line in enumerate(lines)]
            tables[f"test/{name}/hypotheses"] = wandb.Table(columns=["line", "hypothesis"], data=rows)
        if tables:
            run.log(tables)
            artifact = wandb.Artifact(f"hypotheses-{run.id}", type="hypotheses")
            artifact.add_dir(str(run_dir.hypotheses_dir))
            run.log_artifact(artifact)


def finish_wandb(exit_code: int) -> None:
    """End the active W&B run, if any, and shut W&B's service process down.

    `wandb.init` would otherwise hand the next job of a multirun the previous run; the shutdown waits
    until the run's files are completely written (`finish` alone may return before the offline run file
    is flushed), and lets the next job's W&B directories (`WANDB_DIR`, ...) take effect, which a running
    W&B session ignores."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=exit_code)
        wandb.teardown()
