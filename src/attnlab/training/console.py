"""What a training run prints (README "The console"): each message once, on one handler.

- `route_lightning_logging()`: Lightning attaches its own stream handler to the `lightning` logger when it
  is imported, so with Hydra's job logging (or any handler on the root logger) each Lightning message
  came out twice, once plain and once with a timestamp. With a root handler, Lightning's own handlers
  are removed and its records go to the root's (Hydra's console and `<run>/train.log`); without one
  (a script with no logging set up) Lightning's handler stays. Lightning's advertising "💡 Tip: ..." lines
  (litlogger, litmodels) are dropped (`AdvertisingFilter`), as is one deprecation warning Lightning's own
  code triggers in torch (`LIGHTNING_DEPRECATIONS`: nothing a user can change); every other warning shows.
- `ModelSummary`: Lightning's model summary without its FLOPs column and total, which Lightning measures
  on `example_input_array` only (a translation model has none: batches vary in shape), so they were
  always 0.
- `ProgressLines`: when the console is not a terminal (a log file, a batch job), one line every
  `progress.every_n_seconds` seconds and/or `progress.every_n_steps` optimizer steps instead of Lightning's
  progress bar, whose redraws a file does not show:
  `progress: step 120/313 (38%) | epoch 1/4 | loss 2.853 | 10234 tgt tok/s | elapsed 0:00:12 | ETA 0:00:20`.
- `console_callbacks(...)`: those two added to the trainer's callbacks unless the config has its own.
"""

from __future__ import annotations

import logging
import math
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import IO, Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelSummary as _LightningModelSummary
from lightning.pytorch.callbacks import ProgressBar

from attnlab.metrics import train_metric
from attnlab.training.experiment import check_progress

log = logging.getLogger(__name__)

# Lightning's loggers that may carry its own handlers (`lightning/__init__.py` always adds one to
# `lightning`; `lightning.pytorch` and `lightning.fabric` add one when the root logger has none).
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
# The logger of Lightning's `rank_zero_info`, which prints the advertising tips.
RANK_ZERO_LOGGER = "lightning.pytorch.utilities.rank_zero"
# (message regex, module regex) of deprecation warnings raised inside Lightning's own code by the torch it
# runs on: nothing in a user's config or code causes them or can avoid them.
LIGHTNING_DEPRECATIONS = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree"),
)


class AdvertisingFilter(logging.Filter):
    """Drops Lightning's "💡 Tip: try installing litlogger / litmodels" lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


def route_lightning_logging() -> None:
    """One line per Lightning message, no advertising (see the module docstring). Idempotent."""
    if logging.getLogger().hasHandlers():
        for name in LIGHTNING_LOGGERS:
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                if type(handler) is logging.StreamHandler:  # Lightning's own console handler
                    logger.removeHandler(handler)
            logger.propagate = True
    rank_zero = logging.getLogger(RANK_ZERO_LOGGER)
    if not any(isinstance(f, AdvertisingFilter) for f in rank_zero.filters):
        rank_zero.addFilter(AdvertisingFilter())
    for message, module in LIGHTNING_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, module=module)


def is_terminal(stream: IO[str] | None = None) -> bool:
    """Whether `stream` (standard output, where Hydra's console handler and the progress bar write) is
    an interactive terminal or a Jupyter kernel, where Lightning's progress bar redraws itself."""
    stream = sys.stdout if stream is None else stream
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):  # no isatty, or closed
        pass
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None  # type: ignore[attr-defined]
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def duration(seconds: float) -> str:
    """`3725.2` -> `1:02:05`."""
    seconds = max(round(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class ProgressLines(ProgressBar):
    """The progress "bar" of a console that is not a terminal: a log line at a fixed period.

    Each line: the optimizer step (of the run's estimated total), the epoch, the mean training loss of the
    batches since the previous line, target tokens per second of training since the previous line
    (validation time left out; summed over ranks), the time since training started in this process, and
    the estimated time left (the remaining steps at this process's average time per step so far, which
    includes validation). A last line follows the last step. Rank 0 only.

    Args:
        every_n_seconds: A line when at least this many seconds passed since the previous one (null: no
            time period).
        every_n_steps: A line every this many optimizer steps (null: no step period). With both null no
            line is written.
    """

    def __init__(self, every_n_seconds: float | None = 30.0, every_n_steps: int | None = None) -> None:
        super().__init__()
        check_progress(every_n_seconds, every_n_steps)
        self.every_n_seconds = every_n_seconds
        self.every_n_steps = every_n_steps
        self._enabled = True
        self._reset(0, None)
        self._validating_since: float | None = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled and (self.every_n_seconds is not None or self.every_n_steps is not None)

    def _reset(self, step: int, tokens: float | None) -> None:
        now = time.monotonic()
        self._started = self._last_time = now
        self._first_step = self._last_step = self._seen_step = step
        self._last_tokens = tokens
        self._paused = 0.0  # validation seconds since the previous line
        self._epoch = 0  # of the last training batch
        # Sum and count of the finite step losses since the last line, kept on the loss's device: read
        # (one host transfer) only when a line is written, never per batch.
        self._loss_sum: Any = 0.0
        self._loss_count: Any = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset(trainer.global_step, getattr(pl_module, "tokens_seen", None))

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validating_since = time.monotonic()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._validating_since is not None:
            self._paused += time.monotonic() - self._validating_since
            self._validating_since = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.is_enabled or not trainer.is_global_zero:
            return
        self._epoch = trainer.current_epoch
        loss = trainer.callback_metrics.get(train_metric("loss", "_step"))
        if loss is not None:
            finite = torch.isfinite(loss.detach())
            self._loss_sum = self._loss_sum + torch.where(finite, loss.detach(), 0.0)
            self._loss_count = self._loss_count + finite.long()
        step = trainer.global_step
        if step == self._seen_step:  # accumulating gradients: no optimizer step yet
            return
        self._seen_step = step
        now = time.monotonic()
        due = (self.every_n_steps is not None and step - self._last_step >= self.every_n_steps) or (
            self.every_n_seconds is not None and now - self._last_time >= self.every_n_seconds
        )
        if due:
            self._line(trainer, pl_module, now)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.is_enabled and trainer.is_global_zero and trainer.global_step > self._last_step:
            self._line(trainer, pl_module, time.monotonic())

    def _line(self, trainer: L.Trainer, pl_module: L.LightningModule, now: float) -> None:
        step = trainer.global_step
        total = trainer.estimated_stepping_batches
        parts = [f"step {step}"]
        if isinstance(total, (int, float)) and math.isfinite(total) and total > 0:
            parts[0] += f"/{int(total)} ({100 * step / total:.0f}%)"
        epochs = trainer.max_epochs
        parts.append(f"epoch {self._epoch + 1}" + (f"/{epochs}" if epochs and epochs > 0 else ""))
        count = int(self._loss_count)
        if count:
            parts.append(f"loss {float(self._loss_sum) / count:.4g}")
        tokens = getattr(pl_module, "tokens_seen", None)
        training = now - self._last_time - self._paused
        if tokens is not None and self._last_tokens is not None and training > 0:
            parts.append(f"{(tokens - self._last_tokens) / training:.0f} tgt tok/s")
        elapsed = now - self._started
        parts.append(f"elapsed {duration(elapsed)}")
        done = step - self._first_step
        if isinstance(total, (int, float)) and math.isfinite(total) and done > 0:
            parts.append(f"ETA {duration(max(total - step, 0) * elapsed / done)}")
        log.info("progress: %s", " | ".join(parts))
        self._last_time, self._last_step, self._last_tokens = now, step, tokens
        self._paused, self._loss_sum, self._loss_count = 0.0, 0.0, 0


class ModelSummary(_LightningModelSummary):
    """Lightning's model summary (one log message: the top modules, their parameters and mode, the
    totals), without the FLOPs column and total when nothing measured them (no `example_input_array`).

    Args:
        max_depth: How deep the table lists submodules (1: the module's children).
    """

    @staticmethod
    def summarize(
        summary_data: Sequence[tuple[str, Sequence[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: Mapping[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        from lightning.pytorch.utilities.model_summary.model_summary import (
            get_formatted_model_size,
            get_human_readable_count,
        )

        columns = [(name, [str(v) for v in values]) for name, values in summary_data
                   if not (name == "FLOPs" and not total_flops)]  # fmt: skip
        widths = [max([len(name), *(len(v) for v in values)]) for name, values in columns]
        rows = [" | ".join(name.ljust(w) for (name, _), w in zip(columns, widths, strict=True)).rstrip()]
        rule = "-" * max(len(rows[0]), 1)
        rows.append(rule)
        for i in range(len(columns[0][1]) if columns else 0):
            rows.append(" | ".join(values[i].ljust(w) for (_, values), w in zip(columns, widths, strict=True))
                        .rstrip())  # fmt: skip
        rows.append(rule)
        totals = [
            (get_human_readable_count(trainable_parameters), "trainable params"),
            (get_human_readable_count(total_parameters - trainable_parameters), "non-trainable params"),
            (get_human_readable_count(total_parameters), "total params"),
            (get_formatted_model_size(model_size), "estimated model params size (MB)"),
            (str(total_training_modes.get("train", 0)), "modules in train mode"),
            (str(total_training_modes.get("eval", 0)), "modules in eval mode"),
        ]
        if total_flops:
            totals.append((get_human_readable_count(total_flops), "FLOPs of a forward pass"))
        rows += [f"{value:<10} {what}" for value, what in totals]
        log.info("model summary:\n%s", "\n".join(rows))


def console_callbacks(
    callbacks: Sequence[Any], trainer: Mapping[str, Any], progress: Mapping[str, Any] | None
) -> tuple[list[Any], dict[str, Any]]:
    """The console's callbacks for a trainer with `callbacks` and the settings `trainer`
    (`cfg.trainer`), and the trainer arguments they need: `ModelSummary` (instead of Lightning's default
    one: `enable_model_summary=False`) unless `enable_model_summary` is false or one is configured, and
    `ProgressLines(**progress)` when the console is not a terminal, unless `enable_progress_bar` is false
    or a progress bar is configured (at a terminal, Lightning's own progress bar)."""
    added: list[Any] = []
    arguments: dict[str, Any] = {}
    if trainer.get("enable_model_summary", True) is not False and not any(
        isinstance(cb, _LightningModelSummary) for cb in callbacks
    ):
        added.append(ModelSummary())
        arguments["enable_model_summary"] = False  # Lightning's default summary would be added too
    if (
        trainer.get("enable_progress_bar", True) is not False
        and not any(isinstance(cb, ProgressBar) for cb in callbacks)
        and not is_terminal()
    ):
        added.append(ProgressLines(**dict(progress or {})))
    return added, arguments
