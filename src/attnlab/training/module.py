"""`TranslationModule`: the Transformer trained with label-smoothed cross-entropy and Adam (§5)."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import SumMetric

from attnlab.data.batching import restore_order
from attnlab.decoding import DecodeConfig
from attnlab.decoding.search import beam_search, greedy_decode, translate
from attnlab.metrics import VAL_SCORES, MetricsConfig, score_all, split_metric, train_metric
from attnlab.model.config import TransformerConfig
from attnlab.model.transformer import Transformer
from attnlab.optim import OptimConfig
from attnlab.runs.checkpoint import BUNDLE_KEY, RESUME_KEY, bundle, rng_states, set_rng_states
from attnlab.training.epoch_metrics import AVERAGED, EpochMean, EpochState
from attnlab.training.loss import output_layer_loss

log = logging.getLogger(__name__)

FUSED_ADAM_DEVICES = frozenset({"cpu", "cuda"})  # devices whose parameters get torch's fused Adam


class NonFiniteError(FloatingPointError):
    """A training loss or gradient is NaN or infinite (`optim.on_nonfinite=stop`)."""


class TranslationModule(L.LightningModule):
    """Trains a `Transformer` on batches from the data modules (`src`, `tgt_in`, `tgt_out`).

    Logs per step and epoch `train/loss` (label-smoothed), `train/nll`, `train/ppl`, `train/grad_norm`,
    `train/lr`, `train/tokens_per_sec` (non-padding target tokens over the whole step: forward, backward,
    optimizer; under DDP this rank's tokens x ranks), `train/tokens_seen` (summed over ranks; epoch values:
    `attnlab.training.epoch_metrics`, kept in checkpoints); per epoch with skipped batches
    `train/skipped_steps`; per validation epoch `val/loss`, `val/nll`, `val/ppl`, and every
    `decode.every_n_epochs` epochs `val/bleu` and `val/chrf` (detokenized sacreBLEU on decoded validation
    sentences, corpora with a tokenizer only); on test `test/loss`, `test/nll`, `test/ppl` and
    `test/exact_match` (greedy decoding). Parameter counts go to the loggers at the start of fitting.

    Args:
        model: The architecture (a `TransformerConfig` or its dict form, with vocabulary sizes set).
        optim: The objective and optimiser (an `OptimConfig` or its dict form).
        decode: Decoding settings (a `DecodeConfig` or its dict form; defaults when omitted).
    """

    def __init__(
        self,
        model: TransformerConfig | dict[str, Any],
        optim: OptimConfig | dict[str, Any],
        decode: DecodeConfig | dict[str, Any] | None = None,
        metrics: MetricsConfig | dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.model_config = model if isinstance(model, TransformerConfig) else TransformerConfig(**model)
        self.optim_config = optim if isinstance(optim, OptimConfig) else OptimConfig(**optim)
        self.decode_config = decode if isinstance(decode, DecodeConfig) else DecodeConfig(**(decode or {}))
        self.metrics_config = (
            metrics if isinstance(metrics, MetricsConfig) else MetricsConfig(**(metrics or {}))
        )
        # Plain containers only, so checkpoints load with torch.load(weights_only=True).
        self.save_hyperparameters(
            {
                "model": self.model_config.to_dict(),
                "optim": self.optim_config.to_dict(),
                "decode": self.decode_config.to_dict(),
                "metrics": self.metrics_config.to_dict(),
            }
        )
        self._val_hypotheses: list[tuple[int, list[int]]] | None = None
        # Whether fitting logs the parameter counts (`params/*`, step 0) to the loggers: not when the fit
        # continues a run whose loggers hold them already (attnlab-train's resumptions).
        self.log_parameter_counts = True
        self.model = Transformer(self.model_config)
        # Validation and test sums; a NaN loss is kept (torchmetrics drops NaNs by default, with a warning:
        # a diverged model's val/loss was 0.0 and its perplexity 1.0, the best of any run)
        self.sums = torch.nn.ModuleDict(
            {
                name: SumMetric(nan_strategy="disable")
                for name in ("loss", "nll", "tokens", "exact", "sentences")
            }
        )
        # the averaged training metrics' running epoch sums (`attnlab.training.epoch_metrics`)
        self.train_metrics = torch.nn.ModuleDict({name: EpochMean(exp=name == "ppl") for name in AVERAGED})
        self._epoch_to_restore: EpochState | None = None  # a checkpoint's, until the first resumed batch
        self._tokens_seen = 0
        self._skipped = 0  # batches skipped for a non-finite loss or gradient (optim.on_nonfinite=skip)
        self._epoch_skipped = 0  # ... in this epoch
        self._batch_open = False  # between the module's on_train_batch_start and on_train_batch_end
        self._batch_ended = False  # this batch's lr and tokens/s added to the epoch's sums
        self._step_tokens = 0
        self._window_tokens = 0  # this optimizer step's target tokens on this rank, over its micro-batches
        self._step_started = 0.0
        self._rng_to_restore: dict[str, Any] | None = None
        # The warm-up against the run's length (`OptimConfig.warmup_facts`), once the optimizer is built.
        self.schedule_facts: dict[str, Any] | None = None

    @property
    def tokens_seen(self) -> int:
        """Non-padding target tokens trained on so far in this run (summed over ranks; not those of batches
        skipped for a non-finite loss or gradient; kept across a resumption; 0 in a module from
        `load_from_checkpoint`, whose fit is a new run)."""
        return self._tokens_seen

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in)

    def _loss(self, batch: dict[str, Tensor], epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
        hidden = self.model(batch["src"], batch["tgt_in"], project=False)  # (B, T, D)
        target, pad = batch["tgt_out"], self.model_config.pad_id
        return output_layer_loss(hidden, self.model.output, target, epsilon=epsilon, ignore_index=pad)

    # -- training -----------------------------------------------------------------------------------

    def on_fit_start(self) -> None:
        counts = {f"params/{k}": float(v) for k, v in self.model.count_parameters().items()}
        log.info("parameters: %s", {k: int(v) for k, v in counts.items()})
        if not self.log_parameter_counts:  # a resumed run's loggers have them from its first part
            return
        for logger in self.loggers:
            logger.log_metrics(counts, step=0)

    def on_train_start(self) -> None:
        # The rate of the next step is the schedule's at its position (the same number for a run continued
        # with its own settings), not one a checkpoint holds: torch restores each group's saved `lr`.
        for config in self.trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            rates = [
                base * fn(scheduler.last_epoch)
                for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
            ]
            for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
                group["lr"] = rate
            scheduler._last_lr = rates

    def on_train_epoch_start(self) -> None:
        for metric in self.train_metrics.values():
            metric.reset()
        self._epoch_skipped = 0

    def on_train_batch_start(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        if self._rng_to_restore is not None:  # resumed: the random streams continue where they were saved
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None
        saved, self._epoch_to_restore = self._epoch_to_restore, None
        if saved is not None and saved.epoch == self.current_epoch:  # resumed inside the saved epoch
            for name, (total, weight) in saved.sums.items():
                self.train_metrics[name].reset()
                self.train_metrics[name].update(total, weight)  # 0.0 + total: the sums as saved
            self._epoch_skipped = saved.skipped
        self._batch_open, self._batch_ended = True, False
        self._step_started = time.perf_counter()

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor | None:
        loss_sum, nll_sum, n_tokens = self._loss(batch, self.optim_config.label_smoothing)
        n = n_tokens.clamp(min=1)
        loss, nll = loss_sum / n, nll_sum / n
        sums = torch.stack([n_tokens.double(), loss_sum.detach().double(), nll_sum.detach().double()])
        local_tokens, value, nll_value = sums.tolist()  # one sync
        local_tokens = int(local_tokens)
        if not self._all_ranks(math.isfinite(value)):
            self._step_tokens = 0
            return self._nonfinite(f"training loss is {value}", batch_idx)
        self._step_tokens = local_tokens * self.trainer.world_size
        self._window_tokens += local_tokens  # added to `tokens_seen` by the optimizer step, over all ranks
        # per step the batch's values; per epoch sums over all its tokens (on every rank) divided by their
        # number: train/ppl_epoch is exp of the epoch's NLL, not the mean of the steps' perplexities
        steps = {"loss": (value, loss), "nll": (nll_value, nll), "ppl": (nll_value, torch.exp(nll.detach()))}
        for name, (total, step) in steps.items():
            metric = self.train_metrics[name].step(total, local_tokens, step.detach())
            self.log(train_metric(name), metric, on_step=True, on_epoch=True, prog_bar=True)
        # The sum, not the mean: the gradient is divided by the optimizer step's tokens over every rank
        # and micro-batch in `on_before_optimizer_step` (token-level normalisation, as fairseq does).
        return loss_sum

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        """Normalise the gradient by the step's target tokens, then check it is finite and log its norm.

        Each micro-batch's backward pass adds the gradient of its summed loss; DDP averages over ranks
        and Lightning divides by `accumulate_grad_batches`. Multiplying by ranks x accumulation / tokens
        gives the gradient of the loss summed over every target token of the optimizer step divided by
        their number: two ranks or two accumulated micro-batches take the step one process would take on
        one batch holding them all, whatever each one's share of tokens.
        """
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        local_tokens, self._window_tokens = self._window_tokens, 0
        if not grads:
            return
        sharded = self._sharded()
        norm = self._local_norm(grads)
        # One all-reduce: the step's tokens, the ranks with a non-finite gradient and (sharded) the norm².
        exact = torch.float32 if norm.device.type == "mps" else torch.float64  # token sums past 2**24
        stats = torch.stack([
            torch.tensor(float(local_tokens), device=norm.device, dtype=exact),
            (~torch.isfinite(norm)).to(exact),
            norm.square().to(exact) if sharded else torch.zeros((), device=norm.device, dtype=exact),
        ])  # fmt: skip
        if self.trainer.world_size > 1:
            stats = self.trainer.strategy.reduce(stats, reduce_op="sum")
        tokens, nonfinite, norm_sq = stats.tolist()
        factor = self.trainer.world_size * self.trainer.accumulate_grad_batches / max(tokens, 1.0)
        torch._foreach_mul_(grads, factor)
        norm_value = (math.sqrt(norm_sq) if sharded else float(norm)) * factor
        if nonfinite and self.trainer.precision != "16-mixed":
            # (float16's gradient scaler skips overflowing steps itself)
            self._nonfinite(f"gradient norm is {norm_value}", None)
            optimizer.zero_grad(set_to_none=True)  # skip: parameters without gradients are not updated
            return  # not trained on: its tokens stay out of `tokens_seen`
        # The step's tokens, summed over ranks, counted before the step ends: the callbacks' checkpoints at
        # its end (last.ckpt every N steps or minutes, preemption; Lightning runs their `on_train_batch_end`
        # before the module's) hold them.
        self._tokens_seen += int(tokens)
        if math.isfinite(norm_value):
            self._log_mean("grad_norm", norm_value)

    def configure_gradient_clipping(
        self,
        optimizer: Any,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Lightning's clipping (`trainer.gradient_clip_val`, by norm unless
        `trainer.gradient_clip_algorithm=value`), then `train/grad_norm_clipped`: the norm of the
        gradient the optimizer uses, measured after clipping (`train/grad_norm` is the norm before)."""
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        if not gradient_clip_val:
            return
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if not grads:
            return
        norm = self._local_norm(grads)
        if self._sharded():
            norm = self.trainer.strategy.reduce(norm.square(), reduce_op="sum").sqrt()
        if bool(torch.isfinite(norm)):
            self._log_mean("grad_norm_clipped", float(norm))

    def _log_mean(self, name: str, value: float) -> None:
        """Log `train/<name>` per step, and per epoch as the mean of the epoch's values."""
        metric = self.train_metrics[name].step(value, 1.0, torch.tensor(value))
        self.log(train_metric(name), metric, on_step=True, on_epoch=True)

    @staticmethod
    def _local_norm(grads: list[Tensor]) -> Tensor:
        """The 2-norm of this process's gradients (its shards only, under a sharded strategy)."""
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)).float())

    def _sharded(self) -> bool:
        """Whether each rank holds only a shard of the gradients (FSDP): norms are then summed over ranks."""
        from lightning.pytorch.strategies import FSDPStrategy

        return self.trainer.world_size > 1 and isinstance(self.trainer.strategy, FSDPStrategy)

    def _all_ranks(self, finite: bool) -> bool:
        """True when the value is finite on every rank (under DDP one rank's NaN must stop them all)."""
        if self.trainer.world_size > 1:
            return bool(self.trainer.strategy.reduce_boolean_decision(finite, all=True))
        return finite

    def _nonfinite(self, what: str, batch_idx: int | None) -> None:
        """Stop (`optim.on_nonfinite=stop`) or count a skipped step (`skip`)."""
        step = self.trainer.global_step + 1  # the optimizer step this batch was for, counted from 1
        where = f"optimizer step {step} (epoch {self.current_epoch}"
        where += f", batch {batch_idx})" if batch_idx is not None else ")"
        if self.optim_config.on_nonfinite == "stop":
            raise NonFiniteError(
                f"{what} at {where}: training stopped before updating the weights with it; the checkpoints "
                "saved so far are unchanged (continue from the last with resume=auto). Lower optim.peak_lr "
                "or lengthen optim.warmup_steps, check the data, or set optim.on_nonfinite=skip to skip "
                "such batches"
            )
        self._skipped += 1
        self._epoch_skipped += 1
        log.warning("%s at %s: batch skipped (%d so far)", what, where, self._skipped)

    def _end_batch(self) -> None:
        """Time the batch (forward, backward, optimizer step) and add its learning rate and tokens/s to the
        epoch's sums, once: at the module's `on_train_batch_end`, or before, when a callback saves a
        checkpoint at the end of the batch (Lightning runs the callbacks' hook first), so that the
        checkpoint's sums hold the batch, as a resumed run, which starts after it, needs."""
        if self._batch_ended:
            return
        elapsed = max(time.perf_counter() - self._step_started, 1e-9)
        lr = self.optimizers().param_groups[0]["lr"]  # the schedule's rate for the next step
        self.train_metrics["lr"].step(lr, 1.0, torch.tensor(lr))
        tokens_per_sec = self._step_tokens / elapsed
        self.train_metrics["tokens_per_sec"].step(tokens_per_sec, 1.0, torch.tensor(tokens_per_sec))
        self._batch_ended = True

    def on_train_batch_end(self, outputs: Any, batch: dict[str, Tensor], batch_idx: int) -> None:
        # Runs after backward and the optimizer step: the whole step is timed.
        self._end_batch()
        for name in ("lr", "tokens_per_sec"):
            self.log(train_metric(name), self.train_metrics[name], on_step=True, on_epoch=True)
        seen = float(self._tokens_seen)
        self.log(train_metric("tokens_seen"), seen, on_step=True, on_epoch=True, reduce_fx="max")
        self._batch_open = False

    def on_train_epoch_end(self) -> None:
        if self._epoch_skipped:
            self.log(train_metric("skipped_steps"), float(self._epoch_skipped), on_step=False, on_epoch=True)

    # -- evaluation -----------------------------------------------------------------------------------

    def _accumulate(self, batch: dict[str, Tensor]) -> None:
        loss_sum, nll_sum, n_tokens = self._loss(batch, self.optim_config.label_smoothing)
        self.sums["loss"].update(loss_sum)
        self.sums["nll"].update(nll_sum)
        self.sums["tokens"].update(n_tokens)

    def _log_epoch(self, split: str) -> None:
        tokens = self.sums["tokens"].compute().clamp(min=1)
        nll = self.sums["nll"].compute() / tokens
        values = {"loss": self.sums["loss"].compute() / tokens, "nll": nll, "ppl": torch.exp(nll)}
        if self.sums["sentences"].update_called:
            values["exact_match"] = self.sums["exact"].compute() / self.sums["sentences"].compute()
        self.log_dict({split_metric(split, k): v for k, v in values.items()}, prog_bar=True, sync_dist=False)
        for metric in self.sums.values():
            metric.reset()

    def _decodes_this_epoch(self) -> bool:
        every = self.decode_config.every_n_epochs
        datamodule = getattr(self.trainer, "datamodule", None)
        return (
            every > 0
            and (self.current_epoch + 1) % every == 0
            and not self.trainer.sanity_checking
            and getattr(datamodule, "tgt_tokenizer", None) is not None
        )

    def translate(self, src: Tensor, beam: int | None = None) -> list[list[int]]:
        """Output ids (eos and padding removed) for source ids (B, S), decoded with `decode` (its `beam`
        unless `beam` is given; `attnlab.decoding.search.translate`)."""
        return translate(self.model, src, self.decode_config, beam)

    def on_validation_epoch_start(self) -> None:
        self._val_hypotheses = [] if self._decodes_this_epoch() else None

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._accumulate(batch)
        if self._val_hypotheses is not None and self.decode_config.val_subset is None:
            self._decode(batch["src"], batch["index"])

    def _decode(self, src: Tensor, index: Tensor) -> None:
        """Decode sources (B, S) of validation sentences `index` (B,) for `val/bleu` and `val/chrf`."""
        outputs = self.translate(src.to(self.device), self.decode_config.val_beam)
        self._val_hypotheses.extend(zip(index.tolist(), outputs, strict=True))  # type: ignore[union-attr]

    def _decode_subset(self) -> None:
        """Decode this rank's share of the first `decode.val_subset` validation sentences, chosen by index
        rather than taken from the validation batches: `trainer.limit_val_batches` (or fast_dev_run) may
        stop validation before the batches that hold them (sorted by length), and `val/bleu` still scores
        exactly these sentences. The ranks' shares are their batches of the subset (`TokenBatchSampler`):
        every sentence once over the ranks, a rank with none still gathering in `_score_validation`.
        They run at the precision of the validation steps (`trainer.precision`, e.g. autocast)."""
        datamodule = self.trainer.datamodule
        examples = datamodule.splits["val"]
        for ids in datamodule.sampler("val", shuffle=False, first=self.decode_config.val_subset):
            batch = datamodule.collate(examples.__getitems__(ids))
            with self.trainer.precision_plugin.val_step_context():
                self._decode(batch["src"], batch["index"])

    def _score_validation(self) -> dict[str, float]:
        """BLEU and chrF of the gathered validation decodes against the raw references."""
        pairs = self._val_hypotheses
        if self.trainer.world_size > 1:
            gathered: list[Any] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(gathered, pairs)
            pairs = [pair for shard in gathered for pair in shard]
        # Original order; a limited validation (fast_dev_run, limit_val_batches) of the whole set scores
        # what it decoded.
        indices = [i for i, _ in pairs]
        outputs = restore_order(indices, [ids for _, ids in pairs], complete=False)
        indices.sort()
        datamodule = self.trainer.datamodule
        hypotheses = [datamodule.tgt_tokenizer.decode(ids) for ids in outputs]
        references = [datamodule.references["val"][i] for i in indices]
        scores = score_all(hypotheses, references, self.metrics_config, ter=False)
        log.info("val BLEU %.2f (%s)", scores["bleu"].score, scores["bleu"].signature)
        return {split_metric("val", name): scores[name].score for name in VAL_SCORES}

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")
        if self._val_hypotheses is not None:
            if self.decode_config.val_subset is not None:
                self._decode_subset()
            self.log_dict(self._score_validation(), prog_bar=True, sync_dist=False)
            self._val_hypotheses = None
            self._log_attention()

    def _log_attention(self) -> None:
        """Cross-attention heatmaps of the first `decode.probe_sentences` validation sentences, to the
        W&B loggers (rank 0) as `val/attention/<i>` (sentence i, one image per validation decode; W&B
        shows one key's images side by side only when they have one size): rows are output tokens,
        columns source tokens, white = weight 1."""
        from lightning.pytorch.loggers import WandbLogger

        loggers = [lg for lg in self.loggers if isinstance(lg, WandbLogger)]
        count = self.decode_config.probe_sentences
        if not loggers or count == 0 or not self.trainer.is_global_zero:
            return
        datamodule = self.trainer.datamodule
        for index, (src_ids, _, _) in enumerate(datamodule.splits["val"][:count]):
            src = torch.tensor([src_ids], device=self.device)
            cfg = self.decode_config
            (hyp,) = beam_search(self.model, src, beam=1, max_len_a=cfg.max_len_a, max_len_b=cfg.max_len_b,
                                 min_len=cfg.min_len, need_attention=True)[0]  # fmt: skip
            weights = hyp.attention.float().clamp(0, 1).cpu()  # (T, S)
            pixels = (weights * 255).round().to(torch.uint8).repeat_interleave(8, 0).repeat_interleave(8, 1)
            source = datamodule.src_tokenizer.decode(src_ids)
            caption = f"{source} -> {datamodule.tgt_tokenizer.decode(hyp.tokens)}"
            for logger in loggers:  # one key per sentence: its images differ in size from the others'
                logger.log_image(key=f"val/attention/{index}", images=[pixels.numpy()], caption=[caption],
                                 step=self.global_step)  # fmt: skip

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._accumulate(batch)
        hyp = greedy_decode(self.model, batch["src"])
        self.sums["exact"].update(exact_matches(hyp, batch["tgt_out"], self.model_config.pad_id))
        self.sums["sentences"].update(batch["src"].size(0))

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    # -- checkpoints ----------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store what inference needs besides the weights (tokenizers as JSON, data settings), and what
        an exact resumption needs besides Lightning's state: every rank's random-number generator states
        and running epoch sums of the training metrics (`attnlab.training.epoch_metrics`), the count of
        target tokens seen and of batches skipped."""
        checkpoint[BUNDLE_KEY] = bundle(getattr(self.trainer, "datamodule", None))
        states = rng_states()
        if self._batch_open:  # saved by a callback at the end of a batch: the sums hold the whole batch
            self._end_batch()
        epoch = self._epoch_state().to_dict()
        resume: dict[str, Any] = {"rng": states, "epoch": epoch, "tokens_seen": self._tokens_seen,
                                  "skipped": self._skipped}  # fmt: skip
        if self.trainer.world_size > 1:  # rank 0 writes the file: it keeps every rank's own streams and sums
            ranks: list[Any] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(ranks, (states, epoch))  # (this hook runs on every rank)
            resume["rng_ranks"] = [rank[0] for rank in ranks]
            resume["epoch_ranks"] = [rank[1] for rank in ranks]
        checkpoint[RESUME_KEY] = resume

    def _epoch_state(self) -> EpochState:
        """This rank's running sums of the current training epoch."""
        sums = {name: metric.sums() for name, metric in self.train_metrics.items() if metric.update_count}
        return EpochState(self.current_epoch, sums, self._epoch_skipped)

    @classmethod
    def load_from_checkpoint(  # type: ignore[override]
        cls,
        checkpoint_path: str | Path,
        map_location: str | torch.device | None = None,
        hparams_file: Any = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        **settings: Any,
    ) -> TranslationModule:
        """The module of a checkpoint written by `attnlab-train`, read by
        `attnlab.runs.checkpoint.read_checkpoint` (weights only; its model, optim and decode settings built
        by their own classes, never by a class the file names) instead of Lightning's generic loader.

        Args:
            checkpoint_path: The checkpoint file.
            map_location: The device to put the module on (default: the CPU).
            hparams_file: Not supported: the settings come from the checkpoint (replace them by `settings`).
            strict: Whether the weights must match the module's parameters exactly (default: True).
            weights_only: Only True (or None): attnlab checkpoints hold no code and are never read otherwise.
            settings: `model`, `optim` or `decode` to use instead of the saved ones.

        Raises:
            attnlab.runs.checkpoint.CheckpointError: The file is missing, damaged, not from attnlab-train or
                refused (see `read_checkpoint`).
        """
        from attnlab.runs.checkpoint import (
            CheckpointError,
            check_no_foreign_entries,
            check_weights_fit,
            read_checkpoint,
            saved_settings,
        )

        if hparams_file is not None:
            raise TypeError(
                "TranslationModule.load_from_checkpoint takes no hparams_file: the settings come from the "
                "checkpoint; pass model=..., optim=..., decode=... or metrics=... to replace them"
            )
        if weights_only is False:
            raise CheckpointError(
                f"{checkpoint_path}: attnlab checkpoints hold plain data and tensors only and are always "
                "read with weights_only=True"
            )
        unknown = sorted(set(settings) - {"model", "optim", "decode", "metrics"})
        if unknown:
            raise TypeError(
                f"TranslationModule.load_from_checkpoint got unknown settings {unknown}: use model, optim, "
                "decode or metrics"
            )
        checkpoint = read_checkpoint(checkpoint_path)
        for key in ("model", "optim", "decode", "metrics"):
            if key not in settings:
                settings[key] = saved_settings(checkpoint, key, checkpoint_path)
        model = settings["model"]
        model = model if isinstance(model, TransformerConfig) else TransformerConfig(**model)
        # Before anything is allocated: settings that do not fit the weights could ask for any amount.
        check_weights_fit(model, checkpoint["state_dict"], checkpoint_path, strict=strict is not False)
        module = cls(**{**settings, "model": model})
        # A loaded module's fit is a new run, as `init_from=`'s: its counts (`tokens_seen`, skipped batches),
        # random streams and epoch sums start afresh. The saved run's are put back only by
        # `trainer.fit(ckpt_path=...)`, which continues that run (and calls `on_load_checkpoint` itself).
        strict = module.strict_loading if strict is None else strict
        if strict:
            check_no_foreign_entries(
                checkpoint["state_dict"], module.state_dict(), checkpoint_path, "a module"
            )
        module.load_state_dict(checkpoint["state_dict"], strict=strict)
        return module.to(map_location) if map_location is not None else module

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get(RESUME_KEY)
        if state is None:  # a checkpoint from before exact resumption: weights and optimizer only
            return
        # A resumption's state is checked before training (`attnlab.training.resume.check_training_state`);
        # a `trainer.fit(ckpt_path=...)` of your own takes its counts leniently.
        tokens, skipped = state.get("tokens_seen", 0), state.get("skipped", 0)
        self._tokens_seen = tokens if type(tokens) is int else 0
        self._skipped = skipped if type(skipped) is int else 0  # (the count log messages report)
        # Applied at the first training step, after everything that runs between loading and training;
        # under DDP each rank continues its own streams (dropout masks differ across ranks) and sums.
        rank = self._trainer.global_rank if self._trainer is not None else 0
        self._rng_to_restore = _own_entry(state, "rng", rank)
        epoch = _own_entry(state, "epoch", rank)
        self._epoch_to_restore = None
        if epoch is not None:  # (checkpoints written before the epoch sums were saved have none)
            try:
                self._epoch_to_restore = EpochState.from_dict(epoch)
            except ValueError as exc:
                log.warning(
                    "the checkpoint's running epoch sums are not readable (%s): the epoch values "
                    "(train/*_epoch) of the epoch it continues will cover the steps after the resumption "
                    "only", exc,
                )  # fmt: skip

    # -- optimisation ---------------------------------------------------------------------------------

    def build_optimizer(self) -> torch.optim.Optimizer:
        """The run's Adam (AdamW when `optim.weight_decay` > 0) over the module's parameters, one group, its
        base learning rate 1.0 (the schedule's `LambdaLR` sets the rate of each step)."""
        cfg = self.optim_config
        optimizer_cls = torch.optim.AdamW if cfg.weight_decay > 0 else torch.optim.Adam
        params = list(self.parameters())
        # Adam's fused kernel, one pass per parameter, where torch has it: on the CPU 3-5x faster than the
        # default multi-tensor update (model=small 6 vs 18 ms a step, base 35 vs 170 ms; the same update up
        # to float rounding). A run continued from a checkpoint keeps the implementation it was saved with
        # (torch restores each parameter group's options), so its resumed steps stay bitwise the same.
        # Not under mixed precision: Lightning refuses gradient clipping with an optimizer that unscales
        # gradients itself, as fused ones do.
        precision = str(getattr(self._trainer, "precision", "32-true"))
        fused = not precision.endswith("-mixed") and all(
            p.is_floating_point() and p.device.type in FUSED_ADAM_DEVICES for p in params
        )
        return optimizer_cls(
            params, lr=1.0, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, fused=fused or None
        )

    def configure_optimizers(self) -> dict[str, Any]:
        cfg = self.optim_config
        optimizer = self.build_optimizer()
        d_model = self.model_config.d_model
        trainer = self._trainer  # None when optimizers are built outside a Trainer
        steps = getattr(trainer, "estimated_stepping_batches", math.inf)  # inf: no max_epochs, max_steps
        if math.isfinite(steps):  # a warm-up too long for the run is said at its start
            self.schedule_facts = cfg.warmup_facts(int(steps))  # the run's optimizer steps
            if self.schedule_facts["warning"] and getattr(trainer, "is_global_zero", True):
                log.warning("%s", self.schedule_facts["warning"])
        total = None
        if cfg.schedule == "linear" and cfg.total_steps is None:
            total = int(steps) if math.isfinite(steps) else None
            cfg.lr_at(1, d_model, total)  # fails now, naming the fix, when the run is too short
        # LambdaLR multiplies the base lr (1.0) by lr_at(step); it counts optimizer steps from 0.
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: cfg.lr_at(step + 1, d_model, total)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _own_entry(state: dict[str, Any], key: str, rank: int) -> Any:
    """A resumption state's entry for `rank`: its own from `<key>_ranks` (written under DDP), else `key`."""
    ranks = state.get(f"{key}_ranks")
    return ranks[rank] if isinstance(ranks, list) and rank < len(ranks) else state.get(key)


def exact_matches(hyp: Tensor, ref: Tensor, pad_id: int) -> Tensor:
    """Number of rows where hypothesis ids (B, T1) equal reference ids (B, T2), padding ignored."""
    length = max(hyp.size(1), ref.size(1))
    hyp = F.pad(hyp, (0, length - hyp.size(1)), value=pad_id)
    ref = F.pad(ref, (0, length - ref.size(1)), value=pad_id)
    return (hyp == ref).all(dim=1).sum()
