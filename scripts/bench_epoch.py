"""Whole-pipeline training throughput on Multi30k: attnlab's token batches vs a Hugging Face-style loop.

Usage:
    python scripts/bench_epoch.py --root ../shared/data/multi30k [--max-tokens 2048] [--batches 12]
        [--rounds 3] [--threads 2]
    python scripts/bench_epoch.py --root ../shared/data/multi30k --quick   # the harness only (CI)

Both pipelines train the same attnlab `model=small` (d 256, 3+3 layers, one initialisation) on the same
prepared Multi30k de→en training pairs (the project's BPE, joint vocabulary 8000), with the same step
(label-smoothed cross-entropy 0.1 over the non-padding targets, backward, AdamW), each through a
`torch.utils.data.DataLoader` with collation. Only the batching differs:
- attnlab: the data module's training loader (`TokenBatchSampler`: shuffled batches of similar-length
  pairs filled up to `max_tokens` tokens including padding);
- Hugging Face-style: shuffled batches of a fixed number of sentences, padded to the longest source and
  target (what `DataCollatorForSeq2Seq` does), that number chosen so that an epoch has as many batches as
  attnlab's — the same average non-padding target tokens per batch.

Timing: `--rounds` rounds; in each, `--batches` consecutive batches of one pipeline, then of the other
(the order alternating per round), each pipeline continuing through its own epoch; a round is timed from
asking for its first batch to the end of its last optimizer step. Reports non-padding target tokens per
second (median over rounds), the padding share of the target tokens, and the ratio attnlab / HF-style per
round (median and range).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from attnlab.data import Multi30kData
from attnlab.data.batching import Collator
from attnlab.model.config import TransformerConfig
from attnlab.model.transformer import Transformer
from attnlab.training.loss import label_smoothed_nll_loss


def endless(loader: DataLoader) -> Iterator[dict[str, torch.Tensor]]:
    """The loader's batches, epoch after epoch."""
    epoch = 0
    while True:
        sampler = getattr(loader, "batch_sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


class Trainer:
    """One model and optimizer, trained one batch at a time."""

    def __init__(self, config: TransformerConfig, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = Transformer(config).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4, betas=(0.9, 0.98), eps=1e-9)
        self.pad_id = config.pad_id

    def step(self, batch: dict[str, torch.Tensor]) -> tuple[int, int]:
        """One optimizer step; returns (non-padding target tokens, target tokens including padding)."""
        logits = self.model(batch["src"], batch["tgt_in"])
        loss_sum, _, n_tokens = label_smoothed_nll_loss(
            logits, batch["tgt_out"], epsilon=0.1, ignore_index=self.pad_id
        )
        (loss_sum / n_tokens.clamp(min=1)).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return int(n_tokens), batch["tgt_out"].numel()


def timed_round(
    trainer: Trainer, batches: Iterator[dict[str, torch.Tensor]], n: int
) -> tuple[float, int, int]:
    """(seconds, non-padding target tokens, padded target tokens) of `n` batches, loading included."""
    real = padded = 0
    started = time.perf_counter()
    for _ in range(n):
        r, p = trainer.step(next(batches))
        real += r
        padded += p
    return time.perf_counter() - started, real, padded


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="directory with train.de, train.en, ...")
    parser.add_argument("--max-tokens", type=int, default=2048, help="attnlab's batch size in tokens")
    parser.add_argument("--batches", type=int, default=12, help="batches per pipeline and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--cache-dir", help="where the prepared data goes (default: attnlab's cache)")
    parser.add_argument("--quick", action="store_true", help="a tiny model and 2 batches: the harness only")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.batches, args.rounds = 2, 2

    datamodule = Multi30kData(root=str(args.root), vocab_size=8000, max_tokens=args.max_tokens,
                              cache_dir=args.cache_dir, seed=1).datamodule()  # fmt: skip
    datamodule.setup()
    ours = datamodule.train_dataloader()
    examples = datamodule.splits["train"]
    sentences = round(len(examples) / len(ours.batch_sampler))  # equal batches per epoch
    collate = Collator(pad_id=datamodule.pad_id, bos_id=datamodule.bos_id, eos_id=datamodule.eos_id)
    theirs = DataLoader(examples, batch_size=sentences, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(1))  # fmt: skip

    small = dict(d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3)  # model=small
    tiny = dict(d_model=64, n_heads=4, d_ff=128, n_encoder_layers=1, n_decoder_layers=1)
    sizes = tiny if args.quick else small
    config = TransformerConfig(**sizes).with_vocab(datamodule.src_vocab_size, datamodule.tgt_vocab_size)
    pipelines = {"attnlab": (Trainer(config, 0), endless(ours)), "hf": (Trainer(config, 0), endless(theirs))}
    for trainer, batches in pipelines.values():  # warm-up: one step each
        trainer.step(next(batches))
    results: dict[str, list[tuple[float, int, int]]] = {name: [] for name in pipelines}
    for r in range(args.rounds):
        order = list(pipelines) if r % 2 == 0 else list(reversed(pipelines))
        for name in order:
            trainer, batches = pipelines[name]
            results[name].append(timed_round(trainer, batches, args.batches))

    def rate(name: str) -> float:
        return statistics.median(real / seconds for seconds, real, _ in results[name])

    def padding(name: str) -> float:
        return 1 - sum(real for _, real, _ in results[name]) / sum(p for _, _, p in results[name])

    ratios = sorted(
        (a[1] / a[0]) / (h[1] / h[0]) for a, h in zip(results["attnlab"], results["hf"], strict=True)
    )
    n_params = sum(p.numel() for p in pipelines["attnlab"][0].model.parameters())
    print(f"Multi30k de->en training, {len(examples)} pairs, model {n_params:,} parameters, {args.threads} "
          f"threads; {args.rounds} rounds × {args.batches} batches per pipeline\n")  # fmt: skip
    print("| pipeline | batches | batches/epoch | target tokens/s (non-padding) | target padding |")
    print("|---|---|---|---|---|")
    print(f"| attnlab | up to {args.max_tokens} tokens | {len(ours.batch_sampler)} | {rate('attnlab'):.0f} "
          f"| {padding('attnlab'):.1%} |")  # fmt: skip
    print(f"| Hugging Face-style | {sentences} sentences | {len(theirs)} "
          f"| {rate('hf'):.0f} | {padding('hf'):.1%} |")  # fmt: skip
    median = statistics.median(ratios)
    print(f"\nattnlab / HF-style: {median:.2f}x (per-round range {ratios[0]:.2f}-{ratios[-1]:.2f})")


if __name__ == "__main__":
    main()
