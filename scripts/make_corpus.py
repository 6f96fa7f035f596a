"""Build a WMT-sized parallel corpus with WMT-like sentence lengths from real Multi30k sentence pairs.

Usage:
    python scripts/make_corpus.py --pairs 4500000 --out DIR [--seed 1] [--src de --tgt en]
        [--source ../shared/data/multi30k]

Writes into DIR `train.<src>` and `train.<tgt>` (`--pairs` lines each) and copies of Multi30k's
validation and 2016 test sets as `valid.*` and `test.*` (the names `data=files` reads by default). Each
training pair joins k Multi30k training pairs that are consecutive in a shuffled order of the pool
(reshuffled whenever it is used up): their source sentences joined with a space, their target sentences
joined the same way, in the same order, so the two sides stay translations of each other. k is drawn per
line: a source length goal is drawn from a log-normal distribution (median `MEDIAN_WORDS`, sigma
`SIGMA`) and pairs are added until the goal is reached, never beyond `MAX_WORDS` source words. Multi30k
sentences have about 11 words, so source lines have about 27 words on average (median 23, 99th
percentile about 90), the shape aimed at being WMT14 en-de's, with a tail up to 250 words (the length
cut of the usual WMT14 preparation). Lines are written as they are drawn: memory does not depend on
`--pairs` (4.5 million pairs, 1.5 GB: under a minute, in about 40 MB). The same seed gives the same
corpus. Words per line (mean and percentiles, both sides) are printed at the end.

The corpus is for measuring throughput and memory at WMT scale with realistic batch shapes, not for
BLEU: train on it with
    attnlab-train data=files data.dir=DIR data.src_lang=de data.tgt_lang=en
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from attnlab.data.corpora import read_parallel
from attnlab.io import atomic_write_bytes, atomic_writer

DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
MEDIAN_WORDS = 16.5  # median of the drawn source length goal (words)
SIGMA = 0.7  # its log-normal sigma: a right tail like WMT's
MAX_WORDS = 250  # no line is made longer than this (unless a single Multi30k sentence is)
COPIED = {"valid": "val", "test": "test2016"}  # output prefix (data=files defaults) -> Multi30k split
PERCENTILES = (50, 90, 99, 99.9)


def pair_groups(lengths: Sequence[int], pairs: int, seed: int) -> Iterator[list[int]]:
    """For each of `pairs` lines, the indices of the pool pairs it joins, in order.

    The pool (`lengths`: source words of each pool pair) is read in a shuffled order, reshuffled when
    used up; each line takes the next pairs of that order until its source length reaches a goal drawn
    from the log-normal (`MEDIAN_WORDS`, `SIGMA`), taking at least one pair and never going beyond
    `MAX_WORDS` words with a second one.
    """
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    position = len(order)  # the first line shuffles
    mu = math.log(MEDIAN_WORDS)
    for _ in range(pairs):
        goal = rng.lognormvariate(mu, SIGMA)
        group: list[int] = []
        words = 0
        while True:
            if position == len(order):
                rng.shuffle(order)
                position = 0
            index = order[position]
            if group and (words >= goal or words + lengths[index] > MAX_WORDS):
                break
            group.append(index)
            words += lengths[index]
            position += 1
        yield group


def percentile(histogram: Sequence[int], q: float) -> int:
    """The `q`-th percentile (nearest rank) of the values whose counts `histogram` holds by value."""
    total = sum(histogram)
    rank = max(1, math.ceil(q / 100 * total))
    seen = 0
    for value, count in enumerate(histogram):
        seen += count
        if seen >= rank:
            return value
    raise ValueError("empty histogram")


def describe(name: str, histogram: Sequence[int]) -> str:
    """One line: mean, percentiles and maximum of words per line."""
    lines = sum(histogram)
    mean = sum(value * count for value, count in enumerate(histogram)) / lines
    shown = " ".join(f"p{q:g}={percentile(histogram, q)}" for q in PERCENTILES)
    longest = max(value for value, count in enumerate(histogram) if count)
    return f"{name}: {lines} lines, words per line: mean {mean:.1f} {shown} max {longest}"


def make_corpus(
    pairs: int, out: Path, *, seed: int = 1, src: str = "de", tgt: str = "en", source: Path = DEFAULT_SOURCE
) -> dict[str, list[int]]:
    """Write the corpus into `out` (see the module docstring).

    Returns:
        Per side (`src`, `tgt`), the histogram of words per training line: `histogram[w]` lines of `w`
        words.

    Raises:
        attnlab.data.download.DataError: A Multi30k file is missing, not UTF-8, or its sides are not
            aligned.
        ValueError: `pairs` < 1, or the two languages are the same.
    """
    if pairs < 1:
        raise ValueError(f"--pairs={pairs} must be at least 1")
    if src == tgt:
        raise ValueError(f"--src={src} equals --tgt: pick two languages")
    pool_src, pool_tgt = read_parallel(source / f"train.{src}", source / f"train.{tgt}")
    lengths = [len(line.split()) for line in pool_src]
    histograms: dict[str, list[int]] = {src: [], tgt: []}
    out.mkdir(parents=True, exist_ok=True)
    with (
        atomic_writer(out / f"train.{src}", encoding="utf-8") as src_file,
        atomic_writer(out / f"train.{tgt}", encoding="utf-8") as tgt_file,
    ):
        for group in pair_groups(lengths, pairs, seed):
            for lang, pool, file in ((src, pool_src, src_file), (tgt, pool_tgt, tgt_file)):
                line = " ".join([pool[i] for i in group])
                file.write(line + "\n")
                words, histogram = len(line.split()), histograms[lang]
                if words >= len(histogram):
                    histogram.extend([0] * (words + 1 - len(histogram)))
                histogram[words] += 1
    for prefix, split in COPIED.items():
        read_parallel(source / f"{split}.{src}", source / f"{split}.{tgt}")  # checked: UTF-8, aligned
        for lang in (src, tgt):
            atomic_write_bytes(out / f"{prefix}.{lang}", (source / f"{split}.{lang}").read_bytes())
    return histograms


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, required=True, help="training pairs to write")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--src", default="de")
    parser.add_argument("--tgt", default="en")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the Multi30k directory")
    args = parser.parse_args(argv)
    from attnlab.data.download import DataError

    try:
        histograms = make_corpus(args.pairs, args.out, seed=args.seed, src=args.src, tgt=args.tgt,
                                 source=args.source)  # fmt: skip
    except (DataError, ValueError) as exc:
        raise SystemExit(f"make_corpus.py: {exc}") from None
    for lang, histogram in histograms.items():
        print(describe(f"train.{lang}", histogram))
    print(f"make_corpus.py: wrote {args.out}/{{train,valid,test}}.{{{args.src},{args.tgt}}}")


if __name__ == "__main__":
    main(sys.argv[1:])
