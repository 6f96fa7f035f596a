"""What one optimizer step is: the loss normalised by the step's target tokens over every rank and
micro-batch (two DDP ranks = two accumulated micro-batches = one batch holding both), and gradient
clipping applied to the gradient the optimizer uses."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from attnlab.data.batching import Collator
from attnlab.optim import OptimConfig
from attnlab.runs.checkpoint import read_checkpoint
from attnlab.training.experiment import validate
from attnlab.training.module import TranslationModule
from attnlab.training.pipeline import effective_batch, train
from helpers import TEXT_SPLITS, compose_train, lines, subprocess_path, tiny_config, write_corpus
from runs import run_all


def micro_batches(seed: int = 0) -> list[list[tuple[list[int], list[int]]]]:
    """Seven micro-batches of (source, target) id pairs with very different token counts: 2 to 8
    sentences of 3 to 24 tokens, so a mean per micro-batch weights their tokens unequally."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for sentences, length in ((2, 24), (8, 3), (3, 18), (6, 5), (4, 12), (7, 4), (5, 9)):
        batches.append([
            ([*torch.randint(4, 50, (length,), generator=gen).tolist(), 2],
             torch.randint(4, 50, (length + int(i % 3),), generator=gen).tolist())
            for i in range(sentences)
        ])  # fmt: skip
    return batches


def assert_same_weights(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    """Equal to float tolerance. Key projection biases are left out: they get no gradient in exact
    arithmetic (a bias added to every key shifts all of a query's scores equally, which the softmax
    ignores), so theirs is rounding noise, which Adam scales up to the learning rate."""
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        if not name.endswith("w_k.bias"):
            torch.testing.assert_close(ours[name], value, rtol=1e-5, atol=1e-6, msg=name)


def seeded_module() -> TranslationModule:
    """The tiny model (no dropout) with the same initial weights each time."""
    torch.manual_seed(0)
    optim = OptimConfig(schedule="inverse_sqrt", peak_lr=3e-3, warmup_steps=2, label_smoothing=0.1)
    return TranslationModule(model=tiny_config(dropout=0.0), optim=optim)


class GradNorms(L.Callback):
    """The logged `train/grad_norm` of each optimizer step (the normalised gradient's norm)."""

    def __init__(self) -> None:
        self.norms: list[float] = []
        self.step = 0

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step != self.step:  # this micro-batch ended an optimizer step
            self.step = trainer.global_step
            self.norms.append(float(trainer.callback_metrics["train/grad_norm_step"]))


def fit(
    module: TranslationModule, batches: list[dict[str, torch.Tensor]], accumulate: int
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The weights of `module` after fitting it on `batches`, in order, and each step's gradient norm."""
    norms = GradNorms()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, accumulate_grad_batches=accumulate, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, callbacks=[norms],
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    assert trainer.global_step == len(norms.norms) == -(-len(batches) // accumulate)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}, norms.norms


def test_two_accumulated_micro_batches_take_the_step_of_one_batch_holding_both() -> None:
    """Seven micro-batches, two per step: three full steps and a last one of a single micro-batch
    (an epoch's end). Weights and gradient norms equal those of one batch per step holding them."""
    collate = Collator(pad_id=0, bos_id=1, eos_id=2)
    pairs = micro_batches()
    accumulated, accumulated_norms = fit(seeded_module(), [collate(b) for b in pairs], accumulate=2)
    joined = [collate([p for b in pairs[i : i + 2] for p in b]) for i in range(0, len(pairs), 2)]
    joined, joined_norms = fit(seeded_module(), joined, accumulate=1)
    start = seeded_module().state_dict()
    assert any(not torch.equal(start[k], v) for k, v in joined.items())  # four steps were taken
    assert_same_weights(accumulated, joined)
    # Adam ignores a constant factor on the gradient; its norm (what clipping sees) does not
    assert accumulated_norms == pytest.approx(joined_norms, rel=1e-5) and len(joined_norms) == 4


class Millions(L.Callback):
    """Adds `extra` target tokens to every optimizer step's count (where `training_step` adds a batch's),
    as a step over that many more tokens would (on one process, or summed over ranks)."""

    def __init__(self, extra: int) -> None:
        self.extra = extra

    def on_before_optimizer_step(self, trainer: L.Trainer, module: Any, optimizer: Any) -> None:
        module._window_tokens += self.extra


def test_tokens_seen_stays_exact_for_steps_of_more_tokens_than_float32_counts() -> None:
    """Steps of over 2**25 target tokens each (float32 holds whole numbers exactly only up to 2**24):
    `tokens_seen` is every step's tokens, to the token."""
    collate = Collator(pad_id=0, bos_id=1, eos_id=2)
    batches = [collate(b) for b in micro_batches()]
    extra, module = 2**25 + 1, seeded_module()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[Millions(extra)],
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    tokens = sum(int((b["tgt_out"] != 0).sum()) for b in batches)
    assert module.tokens_seen == tokens + len(batches) * extra


class StepStarts(L.Callback):
    """The weights at the start of each optimizer step (before its first micro-batch)."""

    def __init__(self, accumulate: int) -> None:
        self.accumulate, self.weights = accumulate, []

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, i: int) -> None:
        if i % self.accumulate == 0:
            self.weights.append({k: v.detach().clone() for k, v in module.state_dict().items()})


def test_each_steps_gradient_is_that_of_the_mean_loss_over_its_own_target_tokens() -> None:
    """README, "The loss is normalised by tokens per optimizer step": `train/grad_norm` of every step is
    the norm of the gradient of the NLL summed over that step's target tokens (its micro-batches only, not
    the steps before) divided by their number, computed here with plain cross-entropy."""
    collate = Collator(pad_id=0, bos_id=1, eos_id=2)
    batches = [collate(b) for b in micro_batches(seed=1)]
    torch.manual_seed(0)
    optim = OptimConfig(schedule="inverse_sqrt", peak_lr=3e-3, warmup_steps=2, label_smoothing=0.0)
    module = TranslationModule(model=tiny_config(dropout=0.0), optim=optim)
    starts = StepStarts(accumulate=2)
    norms = GradNorms()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, callbacks=[starts, norms],
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    expected = []
    for step, weights in enumerate(starts.weights):
        reference = TranslationModule(model=tiny_config(dropout=0.0), optim=optim)
        reference.load_state_dict(weights)
        step_batches = batches[2 * step : 2 * step + 2]
        total = sum(
            F.cross_entropy(reference(b["src"], b["tgt_in"]).flatten(0, 1), b["tgt_out"].flatten(),
                            ignore_index=0, reduction="sum")
            for b in step_batches
        )  # fmt: skip
        (total / sum(int((b["tgt_out"] != 0).sum()) for b in step_batches)).backward()
        grads = [p.grad.norm() for p in reference.parameters() if p.grad is not None]
        expected.append(float(torch.linalg.vector_norm(torch.stack(grads))))
    assert len(expected) == len(norms.norms) == 4
    assert norms.norms == pytest.approx(expected, rel=1e-4)


@pytest.mark.ddp
def test_two_ddp_ranks_take_the_step_of_one_process_whose_batch_holds_both_ranks_batches(
    shared_data: Path, tmp_path: Path
) -> None:
    """Two ranks with `data.max_tokens=300` each (batches of different token counts) end with the weights
    one process reaches on batches that each join the two ranks' batches of that step, from the same
    initial weights: what token-level normalisation promises and a mean per rank would break."""
    corpus = write_corpus(shared_data, tmp_path / "corpus", TEXT_SPLITS)
    run = tmp_path / "ddp"
    overrides = [
        "data=files", f"data.dir={corpus}", "data.src_lang=de", "data.tgt_lang=en", "data.vocab_size=1000",
        f"data.cache_dir={tmp_path / 'cache'}", "data.max_tokens=300", "model=tiny", "model.dropout=0.0",
        "optim=inverse_sqrt", "optim.peak_lr=3e-3", "optim.warmup_steps=2", "+trainer.max_steps=4",
        "test=false", "decode.every_n_epochs=0", "logger=csv", "seed=3", "trainer=ddp_cpu",
        "trainer.log_every_n_steps=1", "trainer.gradient_clip_val=null",  # the reference below: no clipping
        "+callbacks.final._target_=probes.SaveFinalWeights", f"+callbacks.final.dirpath={run}",
        "+callbacks.batches._target_=probes.RecordRankBatches", f"+callbacks.batches.dirpath={run}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": subprocess_path()}
    command = [sys.executable, "-m", "attnlab.cli.train", *overrides, f"hydra.run.dir={run}",
               "trainer.enable_progress_bar=false"]  # fmt: skip
    done = run_all(command, env=env, cwd=tmp_path)  # every rank killed at the timeout
    assert done.returncode == 0, done.stderr[-4000:]

    # The same steps in one process: each batch joins what the two ranks trained on in that step.
    ranks = [[json.loads(row) for row in lines(run / f"batches_rank{r}.jsonl")] for r in (0, 1)]
    seen = [{i for batch in rank for i in batch} for rank in ranks]
    assert len(ranks[0]) == len(ranks[1]) == 4 and not seen[0] & seen[1]  # 4 steps, disjoint shares
    datamodule = validate(compose_train(overrides, tmp_path / "unused")).data.datamodule()
    datamodule.setup()
    examples = datamodule.splits["train"]
    collate = Collator(pad_id=0, bos_id=1, eos_id=2)
    joined = [collate([examples[i] for i in first + second]) for first, second in zip(*ranks, strict=True)]
    tokens = [[int((collate([examples[i] for i in b])["tgt_out"] != 0).sum()) for b in r] for r in ranks]
    assert tokens[0] != tokens[1]  # the ranks' shares of each step differ: normalisation matters
    saved = read_checkpoint(run / "checkpoints" / "last.ckpt")
    assert saved["optimizer_states"][0]["param_groups"][0]["fused"] is True  # both ranks: fused Adam
    hparams = saved["hyper_parameters"]
    module = TranslationModule(model=hparams["model"], optim=hparams["optim"])
    module.load_state_dict(torch.load(run / "initial_weights.pt", weights_only=True))
    one, norms = fit(module, joined, accumulate=1)
    assert_same_weights(torch.load(run / "final_weights_rank0.pt", weights_only=True), one)
    with open(run / "csv" / "metrics.csv") as f:
        logged = [
            float(r["train/grad_norm_step"]) for r in csv.DictReader(f) if r.get("train/grad_norm_step")
        ]
    assert logged == pytest.approx(norms, rel=1e-4)  # the gradient clipping would see


def test_gradient_clipping_is_applied_and_logged(tmp_path: Path) -> None:
    """With a huge learning rate the gradient norm exceeds `trainer.gradient_clip_val`; the gradient the
    optimizer uses has been clipped to it (`train/grad_norm_clipped`, measured after clipping)."""
    overrides = [
        "data=synthetic", "model=tiny", "data.n_train=64", "data.n_val=8", "data.n_test=8",
        "data.batch_size=16",
        "optim=inverse_sqrt", "optim.peak_lr=1.0", "optim.warmup_steps=1", "optim.on_nonfinite=skip",
        "trainer.max_epochs=2", "trainer.gradient_clip_val=0.25", "trainer.log_every_n_steps=1",
        "logger=csv", "test=false",
    ]  # fmt: skip
    train(compose_train(overrides, tmp_path / "run"))
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/grad_norm_step")]
    before = [float(r["train/grad_norm_step"]) for r in rows]
    after = [float(r["train/grad_norm_clipped_step"]) for r in rows]
    assert len(rows) == 8 and min(before) > 0.25  # every step's gradient was larger than the limit
    assert after == pytest.approx([0.25] * len(rows), rel=1e-4)


def test_the_effective_batch_counts_devices_nodes_and_accumulated_micro_batches() -> None:
    """What the manifest and the start-up log say a step trains on: per-device batch × devices × nodes ×
    accumulation (the schedules count optimizer steps)."""
    trainer = SimpleNamespace(num_devices=2, num_nodes=3, accumulate_grad_batches=4)
    tokens = effective_batch(OmegaConf.create({"data": {"max_tokens": 300}}), trainer)
    assert tokens["per_optimizer_step"] == 300 * 2 * 3 * 4 and tokens["unit"] == "tokens"
    assert tokens["formula"] == (
        "300 tokens per device batch x 2 devices x 3 nodes x 4 accumulated = 7200 tokens per optimizer step"
    )
    sentences = effective_batch(OmegaConf.create({"data": {"max_tokens": None, "batch_size": 64}}), trainer)
    assert (sentences["per_optimizer_step"], sentences["unit"]) == (64 * 24, "sentences")
