"""`callbacks=early_stopping` for real: a run whose validation loss gets worse stops after `patience`
checks without improvement, and its test metrics are those of the best checkpoint, not of the last."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from attnlab.training.experiment import validate
from attnlab.training.module import TranslationModule
from attnlab.training.pipeline import train
from helpers import compose_train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# 4 steps per epoch; from the third epoch (2) on, a learning rate of 1 makes the validation loss worse.
DIVERGING = [
    "data=synthetic", "model=tiny", "data.n_train=128", "data.n_val=64", "data.n_test=64",
    "data.batch_size=32", "optim=inverse_sqrt", "optim.peak_lr=3e-3", "optim.warmup_steps=4", "trainer=cpu",
    "trainer.max_epochs=6", "trainer.log_every_n_steps=4", "logger=csv", "seed=3",
    "callbacks=early_stopping", "callbacks.early_stopping.patience=1",
    "+callbacks.diverge._target_=probes.LearningRateFrom", "+callbacks.diverge.epoch=2",
    "+callbacks.diverge.lr=1.0",
]  # fmt: skip


def _test_metrics(checkpoint: Path, cfg: object) -> dict[str, float]:
    """`test/*` of `checkpoint`'s weights on the run's test split, in a trainer of its own."""
    module = TranslationModule.load_from_checkpoint(checkpoint)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    (tested,) = trainer.test(module, datamodule=validate(cfg).data.datamodule(), verbose=False)
    return {k: float(v) for k, v in tested.items()}


def test_early_stopping_stops_at_patience_and_tests_the_best_checkpoint(tmp_path: Path) -> None:
    cfg = compose_train(DIVERGING, tmp_path)
    metrics = train(cfg)
    saved = OmegaConf.load(tmp_path / "config.yaml")  # the run's resolved config (the caller's is unchanged)
    assert saved.callbacks.early_stopping.monitor == saved.monitor.metric == "val/loss"  # no decodes
    assert cfg.monitor.metric == "auto"

    with open(tmp_path / "csv" / "metrics.csv", newline="") as f:
        val = {int(r["epoch"]): float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")}
    assert sorted(val) == [0, 1, 2]  # stopped after epoch 2 of 6: the first check without improvement
    assert val[1] < val[0] < val[2]  # improved once, then (learning rate 1) got worse
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (2, 12)
    (state,) = [v for k, v in last["callbacks"].items() if k.startswith("EarlyStopping")]
    assert (state["stopped_epoch"], state["wait_count"], state["patience"]) == (2, 1, 1)
    assert metrics["best/val/loss"] == pytest.approx(val[1])

    best = tmp_path / "checkpoints" / "best-epoch001-step8.ckpt"
    assert json.loads((tmp_path / "results.json").read_text())["checkpoints"] == [str(best.resolve())]
    tested = {k: v for k, v in metrics.items() if k.startswith("test/")}
    assert tested and tested == _test_metrics(best, cfg)  # the reported test metrics: the best weights'
    last_tested = _test_metrics(tmp_path / "checkpoints" / "last.ckpt", cfg)
    assert last_tested["test/loss"] > tested["test/loss"]  # not the last (diverged) weights'


@pytest.mark.parametrize(
    "validation", [[], ["trainer.val_check_interval=4"]], ids=["epoch_end", "by_batches"]
)
def test_early_stopping_checks_only_every_n_epochs_and_counts_patience_in_checks(
    validation: list[str], tmp_path: Path
) -> None:
    """`monitor.every_n_epochs=2`: checked at the end of epochs 2, 4, ... (counted from 1), patience counted
    in checks. The loss improves until epoch 2 and gets worse from epoch 3 (index 2) on: the check after
    epoch 4 is the first without improvement, so the run stops there (index 3), not after epoch 3. The
    same with validations by batches (Lightning then checks at the validation's end, not the epoch's)."""
    cfg = compose_train([*DIVERGING, "monitor.every_n_epochs=2", "test=false", *validation], tmp_path)
    train(cfg)
    with open(tmp_path / "csv" / "metrics.csv", newline="") as f:
        val = {int(r["epoch"]): float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")}
    assert sorted(val) == [0, 1, 2, 3] and val[1] < val[3]  # the check after epoch 4 saw no improvement
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    (state,) = [v for k, v in last["callbacks"].items() if k.startswith("EarlyStopping")]
    assert (state["stopped_epoch"], state["wait_count"], state["best_score"].item()) == (3, 1, val[1])
