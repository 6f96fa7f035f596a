"""The training metrics' running epoch sums (`attnlab.training.epoch_metrics`): what a checkpoint keeps of
them, and what it may not hold."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from attnlab.training.epoch_metrics import EpochMean, EpochState


def test_a_mean_sums_its_steps_in_float64_and_logs_each_steps_own_value() -> None:
    mean = EpochMean()
    step = torch.tensor(2.5)
    assert mean.step(5.0, 2.0, step) is mean and mean._forward_cache is step  # what Lightning logs per step
    mean.step(1e-9, 1.0, torch.tensor(0.0))  # lost in float32 beside 5, kept in float64
    assert mean.total.dtype == torch.float64 and mean.sums() == (5.0 + 1e-9, 3.0)
    assert float(mean.compute()) == (5.0 + 1e-9) / 3.0
    ppl = EpochMean(exp=True)
    ppl.step(6.0, 3.0, torch.tensor(0.0))
    assert float(ppl.compute()) == pytest.approx(math.exp(2.0), rel=1e-15)


def test_a_mean_keeps_float64_sums_in_a_module_cast_to_bfloat16() -> None:
    mean = EpochMean().to(torch.bfloat16)
    for _ in range(300):
        mean.update(1.0, 1.0)  # 257 is no bfloat16 number
    assert mean.sums() == (300.0, 300.0)


def test_a_saved_state_reads_back_as_written() -> None:
    state = EpochState(3, {"loss": (12.5, 40.0), "lr": (0.001, 2.0)}, skipped=1)
    assert EpochState.from_dict(state.to_dict()) == state
    assert EpochState.from_dict(EpochState(0).to_dict()) == EpochState(0)


@pytest.mark.parametrize(
    ("saved", "named"),
    [
        ("text", "expected a dict of epoch, sums and skipped"),
        ({"epoch": 0, "sums": {}}, "expected a dict of epoch, sums and skipped"),
        ({"epoch": 0, "sums": {}, "skipped": 0, "code": "x"}, "expected a dict of epoch, sums and skipped"),
        ({"epoch": -1, "sums": {}, "skipped": 0}, "must be counts"),
        ({"epoch": True, "sums": {}, "skipped": 0}, "must be counts"),
        ({"epoch": 0, "sums": {}, "skipped": 1.5}, "must be counts"),
        ({"epoch": 0, "sums": [], "skipped": 0}, "sums must be a dict"),
        ({"epoch": 0, "sums": {"accuracy": [1.0, 1.0]}, "skipped": 0}, "sums must be a dict with keys among"),
        ({"epoch": 0, "sums": {"loss": [1.0]}, "skipped": 0}, "sums['loss'] must be"),
        ({"epoch": 0, "sums": {"loss": ["1", 1.0]}, "skipped": 0}, "sums['loss'] must be"),
        ({"epoch": 0, "sums": {"loss": [float("inf"), 1.0]}, "skipped": 0}, "sums['loss'] must be"),
        ({"epoch": 0, "sums": {"loss": [1.0, -2.0]}, "skipped": 0}, "sums['loss'] must be"),
        ({"epoch": 0, "sums": {"lr": [True, 1.0]}, "skipped": 0}, "sums['lr'] must be"),
        ({"epoch": 0, "sums": {"lr": [10**400, 1]}, "skipped": 0}, "sums['lr'] must be"),
        ({"epoch": 0, "sums": {"loss": [1e300, 0.0]}, "skipped": 0}, "sums['loss'] must be"),
        ({"epoch": 0, "sums": {}, "skipped": 10**400}, "must be counts"),
        ({"epoch": 2**60, "sums": {}, "skipped": 0}, "must be counts"),
    ],
)
def test_a_state_not_as_written_is_refused_naming_the_entry(saved: Any, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("(", r"\(")):
        EpochState.from_dict(saved)


def test_the_modules_running_means_are_no_weights_and_only_ppl_is_exponentiated() -> None:
    from attnlab.model.config import TransformerConfig
    from attnlab.optim import OptimConfig
    from attnlab.training.module import TranslationModule

    module = TranslationModule(
        TransformerConfig(
            src_vocab_size=16,
            tgt_vocab_size=16,
            d_model=8,
            n_heads=2,
            d_ff=16,
            n_encoder_layers=1,
            n_decoder_layers=1,
        ),
        OptimConfig(),
    )
    assert [name for name, m in module.train_metrics.items() if m.exp] == ["ppl"]
    assert not any(key.startswith("train_metrics") for key in module.state_dict())  # not in the weights


def test_a_mean_over_ranks_divides_every_ranks_total_by_every_ranks_weight() -> None:
    """Under DDP the epoch value is Σ total / Σ weight over the ranks (tokens of both ranks), not a mean of
    the ranks' means: this rank's sums (6 over 2 tokens) and another rank's (30 over 4), as torchmetrics
    gathers them (`dist_sync_fn`, one gather per state in the order they were added)."""
    mean = EpochMean()
    mean.update(6.0, 2.0)
    other_rank = iter([torch.tensor(30.0, dtype=torch.float64), torch.tensor(4.0, dtype=torch.float64)])
    mean.sync(
        dist_sync_fn=lambda local, group=None: [local, next(other_rank)], distributed_available=lambda: True
    )
    assert mean.sums() == (36.0, 6.0)  # 36 / 6 = 6, where the ranks' means (3 and 7.5) average 5.25
