"""Continuing an interrupted run in its own directory (`attnlab-train ... resume=true`).

`resume` is `false` (a new run), `true` (continue the run in the output directory from its
`checkpoints/last.ckpt`; an error when there is none) or `auto` (continue when there is one, else start:
what a requeued cluster job wants). `ckpt_path=last` means `resume=true`; any other `ckpt_path` starts
the run from that checkpoint's state.

A resumed run must be the same experiment: its config may differ from the saved `config.yaml` only in
`RESUMABLE_CHANGES` (more epochs, decoding, logging, paths); anything else is an error that lists the
differences. The checkpoint carries everything the rest of the training depends on (weights, optimizer,
LR schedule, step and epoch counters, the data sampler's position inside the epoch, the random-number
generator states), so the resumed run reaches the same weights as one that was never interrupted.
Its CSV history keeps the rows logged before the checkpoint's step (the parameter counts included: a
resumed fit does not log them again), so it holds the rows of an uninterrupted run; its W&B
run is the same run (same id) continued. The interrupted epoch's training values (`train/*_epoch`) are
an uninterrupted run's: the checkpoint holds their running sums (`attnlab.training.epoch_metrics`).
"""

from __future__ import annotations

import logging
import math
import os
import random
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from attnlab.runs.layout import (
    BOOKKEEPING,
    RunDir,
    UnreadableRunFile,
    flatten,
    key_in,
    read_config_file,
)
from attnlab.typed import ConfigError

log = logging.getLogger(__name__)

# What a resumed run may change: the bookkeeping keys (`attnlab.runs.layout.BOOKKEEPING`: paths, logging,
# callbacks, ...; not `task_name`, which names where run directories live), and what does not change the
# training so far: decoding, scoring, the final evaluation, more epochs or steps, progress and logging
# intervals.
RESUMABLE_CHANGES = (
    *(key for key in BOOKKEEPING if key != "task_name"), "decode.", "metrics.", "test", "average_last",
    "trainer.max_epochs", "trainer.max_steps", "trainer.log_every_n_steps",
)  # fmt: skip


def continues_own_run(resume: Any, ckpt_path: Any) -> bool:
    """Whether a command asks to continue the run in its own directory: `resume=true|auto` or
    `ckpt_path=last` (`resume_path` finds the checkpoint, or none for `auto`)."""
    return ckpt_path == "last" or (ckpt_path is None and resume in (True, "auto"))


def resume_path(cfg: DictConfig, output_dir: Path) -> str | None:
    """The checkpoint to continue from (None: a new run), per `cfg.resume` and `cfg.ckpt_path`.

    Raises:
        ConfigError: A wrong `resume` value, a `ckpt_path` that is no path (a number, a list),
            `resume=true` with no checkpoint in `output_dir`, or a `checkpoints/last.ckpt` that is no file
            (a directory, a symbolic link to nothing).
    """
    mode = cfg.get("resume", False)
    ckpt_path = cfg.get("ckpt_path")
    if mode not in (True, False, "auto", None):
        raise ConfigError(f"resume={mode!r}: use true, false or auto")
    if ckpt_path == "last":
        mode, ckpt_path = True, None
    if ckpt_path is not None and not isinstance(ckpt_path, (str, os.PathLike)):
        raise ConfigError(
            f"ckpt_path={ckpt_path!r} must be the path of a .ckpt file written by attnlab-train, last, or "
            "null"
        )
    if ckpt_path is not None:
        if mode not in (False, None):
            raise ConfigError(f"resume={mode} and ckpt_path={ckpt_path}: give one of them")
        if not Path(ckpt_path).is_file():  # (a device such as /dev/zero would be read without end)
            what = "it is a directory or a device, not a checkpoint file" if Path(ckpt_path).exists() else (
                "no such checkpoint file")  # fmt: skip
            raise ConfigError(f"ckpt_path={ckpt_path}: {what}; give a .ckpt file written by attnlab-train")
        return str(ckpt_path)
    if not continues_own_run(mode, ckpt_path):
        return None
    last = RunDir(output_dir).last_checkpoint
    if last.is_file():
        return str(last)
    if last.exists() or last.is_symlink():  # `auto` would start afresh over the run, saving nowhere
        what = "a directory" if last.is_dir() else "no regular file"
        what = f"a symbolic link to {os.readlink(last)}, which is missing" if not last.exists() else what
        raise ConfigError(
            f"resume={str(mode).lower()}: {last} is {what}, not a checkpoint file: put the run's last "
            "checkpoint there to continue it, or move the run directory aside to start afresh"
        )
    if mode == "auto":
        return None
    raise ConfigError(
        f"resume=true but {last} does not exist: run with hydra.run.dir=<the run's directory> (for a "
        "sweep, the same hydra.sweep.dir and overrides), or resume=auto to start afresh when there is "
        "nothing to resume"
    )


def check_checkpoint_fits(path: str | Path, model: Any) -> None:
    """Refuse, before training, a checkpoint that cannot be loaded into this run's model.

    Args:
        path: The checkpoint to continue from.
        model: This run's `TransformerConfig`, vocabulary sizes set.

    Raises:
        ConfigError: The file is damaged or not from attnlab-train (`read_checkpoint`'s message), or it
            holds another architecture or vocabulary (each differing key named).
    """
    from attnlab.runs.checkpoint import CheckpointError, read_checkpoint

    try:
        saved = read_checkpoint(path, mmap=True)["hyper_parameters"].get("model", {})
    except CheckpointError as exc:
        raise ConfigError(f"ckpt_path: {exc}") from None
    ours = model.to_dict()
    differences = [f"model.{key}: {saved.get(key)!r} there, {value!r} here" for key, value in ours.items()
                   if key in saved and saved[key] != value]  # fmt: skip
    if differences:
        raise ConfigError(
            f"ckpt_path={path} holds another model ({'; '.join(differences[:6])}): continue it with the "
            "settings it was trained with (the vocabulary sizes come from the data and its tokenizer "
            "settings), or drop ckpt_path to start from scratch"
        )


# Parameter-group entries that are no training setting: the parameters' indices, the rates the schedule
# sets (`on_train_start` puts back the schedule's own), and the update's implementation (fused, foreach:
# the same update up to float rounding; a resumed run keeps the saved one, so its steps stay bitwise the
# same as an uninterrupted run's).
_NOT_SETTINGS = frozenset({"params", "lr", "initial_lr", "fused", "foreach"})


def check_training_state(path: str | Path, module: Any, precision: Any = "32-true") -> None:
    """Refuse, before training, a checkpoint whose optimizer or LR-schedule state is not what this run's
    settings build: torch would restore every saved parameter-group option (betas, eps, weight decay,
    `maximize`, AdamW's decoupling, ...) over the run's config, so the training would follow the file, not
    `config.yaml`; and moments of other shapes or types, not finite, missing or assigned to other
    parameters, or step counts that are not the run's, would fail, crash or silently change the steps.
    Also refused: a resumption state (random-number generator states, tokens seen) that is not what
    attnlab-train writes, which would fail at the first step, once the run has started.

    Args:
        path: The checkpoint to continue from (`resume` or `ckpt_path=`).
        module: This run's `TranslationModule` (its optimizer settings and parameters).
        precision: The run's `trainer.precision`: under fp16 mixed precision the gradient scaler skips
            optimizer steps, so Adam's step counts may be behind the schedule's (as with
            `optim.on_nonfinite=skip`).

    Raises:
        ConfigError: Naming the first entries that differ, and the fix: the settings the checkpoint was
            trained with, another checkpoint, or `init_from=` (its weights, a fresh optimizer); or weights
            that do not fit the run's model settings (`attnlab.runs.checkpoint.check_weights_fit`).
    """
    from attnlab.runs.checkpoint import (
        RESUME_KEY,
        CheckpointError,
        check_no_foreign_entries,
        check_weights_fit,
        read_checkpoint,
    )

    try:
        checkpoint = read_checkpoint(path, mmap=True)
        # Lightning would fail loading them after the run started (its run directory changed)
        check_weights_fit(module.model_config, checkpoint["state_dict"], path)
        check_no_foreign_entries(checkpoint["state_dict"], module.state_dict(), path, "this run's module")
    except CheckpointError as exc:
        raise ConfigError(f"ckpt_path: {exc}") from None
    problems = []
    for key in ("optimizer_states", "lr_schedulers"):
        if checkpoint.get(key) is None:
            problems.append(f"it holds no {key} (a weights-only checkpoint?)")
    if not problems:
        problems, position = _scheduler_problems(checkpoint["lr_schedulers"], checkpoint.get("global_step"))
        expected = module.build_optimizer().param_groups[0]
        # Steps Adam skips while the schedule goes on: fp16's gradient scaler skips steps with inf gradients,
        # and optim.on_nonfinite=skip leaves a bad batch's step without gradients (Adam's counts stay)
        skips = str(precision) in ("16", "16-mixed") or module.optim_config.on_nonfinite == "skip"
        problems += _optimizer_problems(checkpoint["optimizer_states"], expected, module, position, skips)
    if problems:
        raise ConfigError(
            f"{path}: its optimizer state is not what this run's settings build ({'; '.join(problems[:6])}): "
            "continue it with the optim settings it was trained with, or start from its weights with a "
            "fresh optimizer (init_from=<the checkpoint> instead of ckpt_path)"
        )
    problems = _resume_state_problems(checkpoint.get(RESUME_KEY))
    if problems:
        raise ConfigError(
            f"{path}: its resumption state ({RESUME_KEY}) is not what attnlab-train writes "
            f"({'; '.join(problems[:6])}): continue from another checkpoint, or start from its weights with "
            "a fresh optimizer (init_from=<the checkpoint> instead of ckpt_path)"
        )


def _resume_state_problems(state: Any) -> list[str]:
    """What in a checkpoint's resumption state (`RESUME_KEY`: random-number generator states, the count
    of tokens seen) the resumed run could not take up: checked before training, where a bad entry would
    otherwise fail at the first step, with the run started. (Its epoch sums are checked where they are
    read: unreadable ones only cost the epoch values, `TranslationModule.on_load_checkpoint`.)"""
    if state is None:  # a checkpoint from before exact resumption: weights and optimizer only
        return []
    if not isinstance(state, dict):
        return [f"{_shown(state)} is no dict"]
    problems = []
    tokens = state.get("tokens_seen")
    if type(tokens) is not int or tokens < 0:
        problems.append(f"tokens_seen: {_shown(tokens)} is no count")
    problems += _rng_problems(state.get("rng"), "rng")
    ranks = state.get("rng_ranks")
    if ranks is not None and not isinstance(ranks, list):
        problems.append(f"rng_ranks: {_shown(ranks)} is no list")
    for rank, states in enumerate(ranks if isinstance(ranks, list) else []):
        problems += _rng_problems(states, f"rng_ranks[{rank}]")
    return problems


def _rng_problems(states: Any, where: str) -> list[str]:
    """Whether `states` is what `attnlab.runs.checkpoint.rng_states` writes, tried on generators of
    their own (the process's are not touched)."""
    import torch

    if not isinstance(states, dict) or not {"torch", "python"} <= set(states):
        return [f"{where}: {_shown(states)} holds no torch and python generator states"]
    problems = []
    try:
        torch.Generator().set_state(states["torch"])
    except (TypeError, RuntimeError, ValueError) as exc:
        problems.append(f"{where}.torch: no CPU generator state ({str(exc).splitlines()[0][:80]})")
    python = states["python"]
    try:
        version, internal, gauss = python
        if type(version) is not int or not (gauss is None or type(gauss) is float):
            raise TypeError("a version and gauss_next of other types")
        random.Random().setstate((version, tuple(internal), gauss))
    except (TypeError, ValueError) as exc:
        problems.append(f"{where}.python: {_shown(python, 30)} is no Python generator state ({exc})")
    cuda = states.get("cuda")
    if cuda is not None and not (
        isinstance(cuda, list) and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda)
    ):
        problems.append(f"{where}.cuda: {_shown(cuda)} is no list of CUDA generator states")
    return problems


def _optimizer_problems(
    states: Any, expected: dict[str, Any], module: Any, position: int | None, skips: bool
) -> list[str]:
    if not isinstance(states, list) or len(states) != 1 or not isinstance(states[0], dict):
        return [f"optimizer_states holds {_count(states)}, this run has one Adam"]
    state, groups = states[0].get("state"), states[0].get("param_groups")
    if not isinstance(groups, list) or len(groups) != 1 or not isinstance(groups[0], dict):
        return [f"param_groups holds {_count(groups)}, this run has one group"]
    if not isinstance(state, dict):
        return ["its per-parameter state is no dict"]
    group, problems = groups[0], []
    # Every option this run's Adam has or the file holds: one the file lacks fails at the first step (or,
    # for AdamW's decoupling, is set by torch to Adam's); one this run lacks is no setting of it.
    for key in sorted((set(group) | set(expected)) - _NOT_SETTINGS, key=repr):
        saved = group.get(key, "(no such option)")
        ours = expected.get(key, "(no such option)")
        if not _same(saved, ours):
            problems.append(f"{key}: {_shown(saved)} there, {ours!r} here")
    lr = group.get("lr")
    if not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr < 0:
        problems.append(f"lr: {_shown(lr)} is not a learning rate")
    params = list(module.parameters())
    # torch gives state[k] to the parameter at k's place in `params` (and keeps entries of other keys
    # aside, unused): attnlab's checkpoints, like every single-group optimizer's, list 0..n-1 in order.
    if group.get("params") != list(range(len(params))) or not all(
        type(i) is int
        for i in group["params"]  # (not True for 1)
    ):
        problems.append(f"params: {_shown(group.get('params'))} there, the indices 0..{len(params) - 1} here")
    steps = _entry_problems(state, params, problems)
    covered = sum(1 for key in state if type(key) is int and 0 <= key < len(params))
    if (state and covered < len(params)) or (not state and position and not skips):
        # torch would start each missing parameter's moments afresh, silently
        problems.append(f"state: moments of {covered} of the {len(params)} parameters")
    if len(steps) > 1:
        problems.append(f"state: step counts {sorted(steps)[:4]} differ across parameters")
    elif steps and position is not None:
        (step,) = steps  # Adam steps with the schedule, but for the steps the gradient scaler skips
        if step > position or (not skips and step != position):
            problems.append(f"state: Adam's step count {step:g} is not the schedule's {position}")
    return problems


def _entry_problems(state: dict[Any, Any], params: list[Any], problems: list[str]) -> set[float]:
    """Append to `problems` what is wrong with each per-parameter Adam state entry; return the step counts."""
    import torch

    steps: set[float] = set()
    for key, entry in state.items():
        param = params[key] if type(key) is int and 0 <= key < len(params) else None
        if param is None or not isinstance(entry, dict):
            problems.append(f"state[{key!r}]: no parameter of this model")
            continue
        for name in sorted(set(entry) | {"step", "exp_avg", "exp_avg_sq"}, key=repr):
            value = entry.get(name)
            if name not in ("step", "exp_avg", "exp_avg_sq"):
                problems.append(f"state[{key!r}].{name}: no such Adam state")
            elif name not in entry:
                problems.append(f"state[{key!r}].{name}: missing")
            elif not (torch.is_tensor(value) and value.layout == torch.strided and not value.is_complex()):
                problems.append(f"state[{key!r}].{name}: {_shown(value)}, not a dense real tensor")
            elif name == "step":
                count = float(value) if value.numel() == 1 and value.dtype != torch.bool else -1.0
                if not (math.isfinite(count) and count >= 1 and count.is_integer()):
                    problems.append(f"state[{key!r}].step: {_shown(value)} is no count of steps")
                else:
                    steps.add(count)
            else:
                # torch casts the moments to the parameter's type: finite there, and >= 0 for exp_avg_sq
                cast = value.to(param.dtype) if value.is_floating_point() else None
                ok = cast is not None and value.shape == param.shape and bool(torch.isfinite(cast).all())
                ok = ok and (name == "exp_avg" or bool((cast >= 0).all()))
                if not ok:
                    shown = f"finite{' and >= 0' if name == 'exp_avg_sq' else ''}"
                    problems.append(
                        f"state[{key!r}].{name}: not {shown}, of shape {tuple(param.shape)}, floats"
                        f" (a {value.dtype} tensor of shape {tuple(value.shape)})"
                    )
    return steps


def _scheduler_problems(states: Any, global_step: Any) -> tuple[list[str], int | None]:
    """Problems of the LambdaLR state, and its position (None when it has none)."""
    import torch

    if not isinstance(states, list) or len(states) != 1 or not isinstance(states[0], dict):
        return [f"lr_schedulers holds {_count(states)}, this run has one schedule"], None
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    fresh = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0).state_dict()
    state, problems = states[0], []
    unknown = sorted(set(state) - set(fresh) - {"verbose"}, key=repr)  # (verbose: saved by torch before 2.7)
    if unknown:
        problems.append(f"lr_schedulers[0] has entries {unknown} that LambdaLR does not")
    if not _same(state.get("base_lrs"), [1.0]):
        problems.append(f"base_lrs: {_shown(state.get('base_lrs'))} there, [1.0] here")
    if not _same(state.get("lr_lambdas"), [None]):
        problems.append(f"lr_lambdas: {_shown(state.get('lr_lambdas'))} there, [None] here")
    step = state.get("last_epoch")
    if type(step) is not int or step < 0:
        problems.append(f"last_epoch: {_shown(step)} is no step count")
        step = None
    elif type(global_step) is int and step != global_step:  # the schedule steps with each optimizer step
        problems.append(f"last_epoch: {step} there, but the checkpoint's global_step is {global_step}")
    count = state.get("_step_count", 0)
    if type(count) is not int or count < 0:  # (torch adds 1 to it at each step)
        problems.append(f"_step_count: {_shown(count)} is no step count")
    return problems, step


def _same(saved: Any, ours: Any) -> bool:
    """Whether a saved option is this run's: plain Python values only (a tensor is never an attnlab
    option, and comparing one would fail or be elementwise), tuples and lists alike."""
    if isinstance(saved, (tuple, list)) and isinstance(ours, (tuple, list)):
        return len(saved) == len(ours) and all(_same(a, b) for a, b in zip(saved, ours, strict=True))
    plain = (bool, int, float, str, type(None))
    if not (isinstance(saved, plain) and isinstance(ours, plain)):
        return False
    return (isinstance(saved, bool) == isinstance(ours, bool)) and saved == ours  # (0 and 0.0 alike)


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({type(value).__name__})"


def _count(value: Any) -> str:
    return f"{len(value)} entries" if isinstance(value, (list, tuple, dict)) else f"a {type(value).__name__}"


def check_same_experiment(saved: Path, resolved: dict[str, Any]) -> None:
    """The resumed run's config (resolved) against the run's `config.yaml` (`saved`). Without the file
    (moved or deleted) only what the checkpoint records is compared (`check_resumption`: model, optim and
    data settings), with a warning naming the file.

    Raises:
        ConfigError: Listing each key whose value differs outside `RESUMABLE_CHANGES`, or naming the
            `config.yaml` that cannot be read.
    """
    if not saved.is_file():
        log.warning(
            "resuming %s without its config.yaml: only the model, optim and data settings its checkpoint "
            "records are compared with this command's; a changed trainer.*, seed or other value goes "
            "unnoticed. Put the file back to have every value compared",
            saved.parent,
        )
        return
    try:
        before = read_config_file(saved)
    except UnreadableRunFile as exc:
        raise ConfigError(f"resuming {saved.parent}: {exc}; start a new run") from None
    now = flatten(resolved)
    changed = sorted(
        key
        for key in set(before) | set(now)
        if before.get(key) != now.get(key) and not key_in(key, RESUMABLE_CHANGES)
    )
    if changed:
        listed = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed[:8])
        raise ConfigError(
            f"resuming {saved.parent} with a different experiment ({listed}): give the overrides the run "
            "was started with (its config.yaml), or start a new run"
        )


# Model settings the data sets (null in a config): its weights' shapes and the data position compare them.
_FROM_DATA = ("src_vocab_size", "tgt_vocab_size")


def check_resumption(path: str | Path, resolved: dict[str, Any]) -> int:
    """The global step the run's own checkpoint `path` was saved at, read once by `read_checkpoint`, after
    refusing to continue it with model or optim values (of `resolved`, the config) other than those it was
    trained with (its `hyper_parameters`): the run's `config.yaml`, which `check_same_experiment`
    compares, may be missing or edited.

    Raises:
        ConfigError: The file is damaged, not from attnlab-train or refused (`read_checkpoint`'s message),
            its global_step is no count, or values differ (listed).
    """
    from attnlab.runs.checkpoint import CheckpointError, read_checkpoint

    try:
        checkpoint = read_checkpoint(path, mmap=True)
    except CheckpointError as exc:
        raise ConfigError(f"resume: {exc}") from None
    step = checkpoint.get("global_step", 0)
    if type(step) is not int or step < 0:  # (not True for 1)
        raise ConfigError(f"resume: {path}: its global_step {_shown(step)} is no step count — the file is "
                          "damaged or not written by attnlab-train; use another checkpoint")  # fmt: skip
    changed = []
    for node in ("model", "optim"):
        theirs, ours = checkpoint["hyper_parameters"].get(node), resolved.get(node) or {}
        if not isinstance(theirs, dict):  # refused where the settings are read (`saved_settings`)
            continue
        changed += [f"{node}.{key}: {theirs[key]!r} -> {value!r}" for key, value in ours.items()
                    if key in theirs and key not in _FROM_DATA and not _same(theirs[key], value)]  # fmt: skip
    if changed:
        raise ConfigError(
            f"resuming from {path} with a different experiment than it was trained with "
            f"({', '.join(changed[:8])}): give the overrides the run was started with, or start a new run"
        )
    return step


def csv_history(output_dir: Path, before_step: int) -> list[dict[str, float]]:
    """The rows of the run's `csv/metrics.csv` logged before `before_step` (the resumed run logs the rest
    again; not the parameter counts, `TranslationModule.log_parameter_counts`): the resumed run's file
    then holds each row of an uninterrupted run's once (the validations before the checkpoint's step and
    the parameter counts included).

    Raises:
        ConfigError: The file cannot be read or holds a cell that is no number (`UnreadableRunFile`'s
            message), with the fix.
    """
    run = RunDir(output_dir)
    try:
        read = run.metrics_rows()
    except UnreadableRunFile as exc:
        raise ConfigError(
            f"resuming {output_dir}: {exc} — the run's CSV history would be lost: put back a readable copy, "
            f"or move the file aside to continue without the rows logged before step {before_step}"
        ) from None
    rows = []
    for values in read:
        if values.get("step", 0) < before_step:
            for key in ("step", "epoch"):
                if key in values:
                    values[key] = int(values[key])
            rows.append(values)
    return rows


def restore_csv_history(trainer: Any, rows: list[dict[str, float]]) -> None:
    """Put `rows` back into the CSV logger's file (Lightning's CSV logger starts a new file)."""
    from lightning.pytorch.loggers import CSVLogger

    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger) and rows and trainer.is_global_zero:
            writer = logger.experiment
            writer.metrics = [dict(r) for r in rows]
            writer.metrics_keys = sorted({k for r in rows for k in r})
            writer.save()
