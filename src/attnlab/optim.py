"""The training objective and optimiser settings (torch-free): `OptimConfig` and the LR schedules."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from attnlab.typed import check_fields, require, require_positive, require_probability

Schedule = Literal["noam", "inverse_sqrt", "linear"]
NonFinite = Literal["stop", "skip"]


@dataclass(frozen=True)
class OptimConfig:
    """Adam with a warm-up schedule and a label-smoothed loss (§5.3, §5.4).

    Args:
        schedule: `noam`: lr = lr_scale · D^-0.5 · min(step^-0.5, step · warmup^-1.5) (§5.3, eq. 3);
            `inverse_sqrt`: lr = peak_lr · min(step / warmup, sqrt(warmup / step)), i.e. linear warm-up
            to `peak_lr`, then decay ∝ step^-0.5 (fairseq's inverse_sqrt);
            `linear`: linear warm-up to `peak_lr`, then linear decay to 0 at `total_steps` — a schedule
            fitted to a fixed budget, which ends training at a small learning rate.
        lr_scale: Multiplier of the `noam` schedule (1.0 in the paper).
        peak_lr: Peak learning rate of `inverse_sqrt` and `linear`.
        warmup_steps: Warm-up length in optimizer steps (4000 in the paper).
        betas: Adam β1, β2 (0.9, 0.98 in the paper).
        eps: Adam ε (1e-9 in the paper).
        weight_decay: Decoupled weight decay (AdamW) when > 0; plain Adam when 0.
        label_smoothing: ε_ls of the label-smoothed cross-entropy (0.1 in the paper); padding is ignored.
        total_steps: Length of the `linear` schedule in optimizer steps; None: all the optimizer steps
            of the run (`trainer.max_epochs` or `trainer.max_steps`, as Lightning estimates them).
        on_nonfinite: What a NaN or infinite training loss or gradient does: `stop` the run with an
            error naming the step (the checkpoints saved before stay as they were; the weights are never
            updated from it), or `skip` that batch (its optimizer step updates no parameter; the step still
            counts for the schedule; the epoch's count is logged as `train/skipped_steps`).
    """

    schedule: Schedule = "noam"
    lr_scale: float = 1.0
    peak_lr: float = 5e-4
    warmup_steps: int = 4000
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    total_steps: int | None = None
    on_nonfinite: NonFinite = "stop"

    def __post_init__(self) -> None:
        check_fields(self)
        require_positive(self, "lr_scale", "peak_lr", "warmup_steps", "eps")
        require_probability(self, "label_smoothing")
        require(all(0.0 <= b < 1.0 for b in self.betas), f"betas={list(self.betas)} must each be in [0, 1)")
        require(self.weight_decay >= 0.0, f"weight_decay={self.weight_decay} must be >= 0")
        if self.total_steps is not None:
            require(
                self.total_steps > self.warmup_steps,
                f"total_steps={self.total_steps} must be more than warmup_steps={self.warmup_steps}",
            )

    def lr_at(self, step: int, d_model: int, total_steps: int | None = None) -> float:
        """Learning rate at optimizer step `step` (counted from 1).

        `total_steps` is the length of a `linear` schedule when `self.total_steps` is None. A linear run
        no longer than its warm-up never reaches the peak nor decays (`warmup_facts` warns of it).
        """
        step = max(step, 1)
        if self.schedule == "noam":
            return self.lr_scale * d_model**-0.5 * min(step**-0.5, step * self.warmup_steps**-1.5)
        if self.schedule == "inverse_sqrt":
            return self.peak_lr * min(step / self.warmup_steps, math.sqrt(self.warmup_steps / step))
        total = self.total_steps or total_steps
        if total is None:
            raise ValueError(
                "the linear schedule needs the run's length: set optim.total_steps, or trainer.max_epochs "
                "or trainer.max_steps"
            )
        if total <= self.warmup_steps:  # a run shorter than its warm-up (a smoke test, debug=fast_dev_run)
            return self.peak_lr * step / self.warmup_steps  # is all warm-up, as with noam; it warns at start
        decay = max(0.0, (total - step) / (total - self.warmup_steps))
        return self.peak_lr * min(step / self.warmup_steps, decay)

    def warmup_facts(self, total_steps: int) -> dict[str, Any]:
        """The warm-up against the run's length (`total_steps` optimizer steps): where the learning rate
        peaks (step `warmup_steps` for every schedule), whether the run gets there, and `warning`, a
        message naming the numbers and the fixes when the warm-up covers half the run or more (None
        otherwise). A warm-up that long leaves little training at a useful learning rate: the paper's
        4000 steps fit 100k-step runs, not a few epochs of a small corpus."""
        total = max(int(total_steps), 1)
        fraction = self.warmup_steps / total
        reached = total >= self.warmup_steps
        warning = None
        if 2 * self.warmup_steps >= total:
            run = f"this run's {total} optimizer steps"
            covers = f"covers {fraction:.0%} of {run}" if reached else (
                f"is longer than {run}, so the learning rate never reaches its peak"
            )  # fmt: skip
            fixes = f"lower optim.warmup_steps (e.g. {max(1, total // 10)}), "
            if self.schedule == "linear":
                fixes += "or train longer (trainer.max_epochs or trainer.max_steps)"
            else:
                fixes += (
                    "train longer (trainer.max_epochs or trainer.max_steps), or use optim=linear "
                    "(warm-up, then decay to 0 at the run's last step)"
                )
            warning = f"optim.warmup_steps={self.warmup_steps} {covers}: {fixes}"
        return {
            "schedule": self.schedule, "warmup_steps": self.warmup_steps, "optimizer_steps": total,
            "warmup_fraction": round(fraction, 4), "peak_reached": reached, "warning": warning,
        }  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (for checkpoints and loggers)."""
        return {**dataclasses.asdict(self), "betas": list(self.betas)}
