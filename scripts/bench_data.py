"""Benchmark the real-data pipeline on Multi30k: preparation, cache load, batching speed, padding.

Usage:
    python scripts/bench_data.py --root ../shared/data/multi30k [--max-tokens 4096] [--vocab-size 8000]
        [--tokenizer bpe|unigram] [--quick]

Reports (as a Markdown table):
- tokenizer training + encoding from scratch (a fresh cache directory);
- loading the prepared data from the cache;
- DataLoader batches per second over one training epoch (collation included);
- padding ratio of the training token batches (the data module's own, epoch 0), against shuffled
  fixed-size sentence batches with the same average number of sentences per batch (the Hugging Face-style
  baseline), measured in the same process.
Batch rows give their batch and sentence-pair counts: every training pair is in one batch of each kind.

`--quick` runs the same pipeline (`data=files`) on the first lines of each split (`QUICK_LINES`) with a
1000-token vocabulary and max_tokens=512, in seconds: the harness only (CI).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from attnlab.data import CorpusData, FilesData, Multi30kData
from attnlab.data.corpora import read_lines

QUICK_LINES = {"train": 1000, "val": 100, "test2016": 100}  # --quick: the first lines of each split


def padding_ratio(batches: list[list[int]], lengths: list[int]) -> float:
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    real = sum(lengths[i] for b in batches for i in b)
    return 1.0 - real / padded


def quick_corpus(root: Path, directory: Path, langs: tuple[str, str]) -> None:
    """The first `QUICK_LINES` lines of each Multi30k split under `root`, written into `directory`."""
    for split, n in QUICK_LINES.items():
        for lang in langs:
            lines = read_lines(root / f"{split}.{lang}")[:n]
            (directory / f"{split}.{lang}").write_text(
                "".join(f"{line}\n" for line in lines), encoding="utf-8"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="directory with train.de, train.en, ...")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--tokenizer", choices=["bpe", "unigram"], default="bpe")
    parser.add_argument(
        "--quick", action="store_true", help="the first lines of each split: the harness only"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.vocab_size, args.max_tokens = 1000, 512

    with tempfile.TemporaryDirectory(prefix="attnlab-bench-") as cache:
        settings = dict(cache_dir=cache, vocab_size=args.vocab_size, tokenizer=args.tokenizer,
                        max_tokens=args.max_tokens)  # fmt: skip
        spec: CorpusData
        if args.quick:
            quick_corpus(args.root, Path(cache), ("de", "en"))
            spec = FilesData(dir=cache, train="train", valid="val", test=("test2016",), **settings)
        else:
            spec = Multi30kData(root=str(args.root), **settings)
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
        loader_sizes = [batch["src"].size(0) for batch in loader]
        per_sec = len(loader_sizes) / (time.perf_counter() - started)

        examples = fresh.splits["train"]
        lengths = examples.lengths().tolist()  # max(source, target + 1) per example
        token_batches = list(fresh.sampler("train", shuffle=True))
        mean_sentences = round(len(examples) / len(token_batches))
        order = list(range(len(examples)))
        random.Random(1).shuffle(order)
        sentence_batches = [order[i : i + mean_sentences] for i in range(0, len(order), mean_sentences)]

    def counts(sizes: list[int]) -> str:
        return f"{len(sizes)} batches, {sum(sizes)} pairs"

    rows = [
        ("tokenizer training + encoding (from scratch)", f"{build:.2f} s", "< 30 s"),
        ("load from cache (median of 3)", f"{statistics.median(loads):.3f} s", "< 1 s"),
        ("DataLoader batches/s (train, collation included)", f"{per_sec:.0f} ({counts(loader_sizes)})", ""),
        (f"padding, token batches (max_tokens={args.max_tokens})",
         f"{padding_ratio(token_batches, lengths):.1%} ({counts([len(b) for b in token_batches])})", "< 10%"),
        (f"padding, shuffled batches of {mean_sentences} sentences",
         f"{padding_ratio(sentence_batches, lengths):.1%} ({counts([len(b) for b in sentence_batches])})",
         "baseline"),
    ]  # fmt: skip
    corpus = f"the first {QUICK_LINES['train']} lines of " if args.quick else ""
    print(f"{corpus}Multi30k {spec.src_lang}->{spec.tgt_lang}, {args.tokenizer} vocab {args.vocab_size}, "
          f"{len(examples)} training pairs\n")  # fmt: skip
    print("| measure | value | target |\n| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
