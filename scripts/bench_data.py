"""Benchmark the real-data pipeline on Multi30k: preparation, cache load, batching speed, padding.

Usage:
    python scripts/bench_data.py --root ../shared/data/multi30k [--max-tokens 4096] [--vocab-size 8000]

Reports (as a Markdown table):
- tokenizer training + encoding from scratch (a fresh cache directory);
- loading the prepared data from the cache;
- DataLoader batches per second over one training epoch (collation included);
- padding ratio of token-based batches, against shuffled fixed-size sentence batches with the same
  average number of sentences per batch (the Hugging Face-style baseline), measured in the same process.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from attnlab.data import Multi30kData
from attnlab.data.batching import TokenBatchSampler


def padding_ratio(batches: list[list[int]], lengths: list[int]) -> float:
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    real = sum(lengths[i] for b in batches for i in b)
    return 1.0 - real / padded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="directory with train.de, train.en, ...")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--tokenizer", choices=["bpe", "unigram"], default="bpe")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="attnlab-bench-") as cache:
        spec = Multi30kData(root=str(args.root), cache_dir=cache, vocab_size=args.vocab_size,
                            tokenizer=args.tokenizer, max_tokens=args.max_tokens)  # fmt: skip
        started = time.perf_counter()
        fresh = spec.datamodule()
        fresh.setup()
        build = time.perf_counter() - started
        loads = []
        for _ in range(3):
            started = time.perf_counter()
            spec.datamodule().setup()
            loads.append(time.perf_counter() - started)

        loader = fresh.train_dataloader()
        started = time.perf_counter()
        n_batches = sum(1 for _ in loader)
        per_sec = n_batches / (time.perf_counter() - started)

        examples = fresh.splits["train"]
        lengths = [max(len(s), len(t) + 1) for s, t, _ in examples]
        sampler = TokenBatchSampler(lengths, max_tokens=args.max_tokens, shuffle=True, seed=1)
        token_batches = list(sampler)
        mean_sentences = round(len(examples) / len(token_batches))
        order = list(range(len(examples)))
        random.Random(1).shuffle(order)
        sentence_batches = [order[i : i + mean_sentences] for i in range(0, len(order), mean_sentences)]

    rows = [
        ("tokenizer training + encoding (from scratch)", f"{build:.2f} s", "< 30 s"),
        ("load from cache (median of 3)", f"{statistics.median(loads):.3f} s", "< 1 s"),
        ("DataLoader batches/s (train, collation included)", f"{per_sec:.0f} ({n_batches} batches)", ""),
        (f"padding, token batches (max_tokens={args.max_tokens})",
         f"{padding_ratio(token_batches, lengths):.1%}", "< 10%"),
        (f"padding, shuffled batches of {mean_sentences} sentences",
         f"{padding_ratio(sentence_batches, lengths):.1%}", "baseline"),
    ]  # fmt: skip
    print(f"Multi30k {spec.src_lang}->{spec.tgt_lang}, {args.tokenizer} vocab {args.vocab_size}, "
          f"{len(examples)} training pairs\n")  # fmt: skip
    print("| measure | value | target |\n| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
