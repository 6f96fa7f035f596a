"""Benchmark the real-data pipeline: preparation, cache load, batching speed, padding; Multi30k or WMT scale.

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

At WMT scale (no `--root`):
    python scripts/bench_data.py --pairs 4500000 [--work DIR] [--tokenizer-sample 1000000]
        [--vocab-size 37000] [--max-tokens 3200] [--loader-batches 20000] [--ddp-pairs 500000]
        [--skip hf,ddp]

writes a corpus of `--pairs` pairs with WMT-like lengths (`scripts/make_corpus.py`, seed 1; kept in
`--work` and reused) and measures, each stage in its own process (memory read from /proc every 0.2 s:
the peak RSS and PSS summed over the stage's processes, PSS counting pages shared between processes
once; `--work` holds the caches, so a stage never reuses another's work unless said):
- `prepare`: attnlab's preparation (`data=files`, joint BPE of `--vocab-size` trained on a seeded
  `--tokenizer-sample` of pairs, encoding, length filters) from an empty cache: wall time, peak memory,
  size on disk;
- `hf`: the same corpus through a Hugging Face pipeline (`datasets` text loading, the same BPE
  settings trained with `tokenizers` on a seeded sample of the same size, `map(batched=True,
  num_proc=2)` encoding both sides and a `filter(num_proc=2)` with the same length limits): wall time
  and peak memory, side by side;
- `open`: a process that has imported what training imports opens the prepared corpus (the second
  open of `prepare`'s cache): seconds and the RSS it adds; one training epoch's batches from the
  sampler (seconds); the DataLoader with 2 workers (the first batch apart, which starts the workers)
  over `--loader-batches` batches: batches/s and target tokens/s (eos included, padding not);
- `ddp`: `attnlab-train` with `trainer=ddp_cpu` (2 ranks, gloo), 2 DataLoader workers per rank,
  `model=small`, 50 optimizer steps, no validation, on this corpus and on one of `--ddp-pairs` pairs
  (prepared first, not timed): the peak RSS and PSS of all its processes, and the PSS split into anonymous
  pages (the processes' own memory, which must not grow with the corpus) and file-backed ones (each part
  its own peak): pages of the memory-mapped token arrays in the page cache that a process has touched,
  which the kernel maps around each page read (fault-around), shares between processes and can drop at any
  time; they grow with the corpus up to its size on disk.
The table goes to stdout and `--work`/bench_data.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from attnlab.data import CorpusData, FilesData, Multi30kData
from attnlab.data.corpora import read_lines

QUICK_LINES = {"train": 1000, "val": 100, "test2016": 100}  # --quick: the first lines of each split
STAGES = ("prepare", "hf", "open", "ddp")  # at WMT scale: each in its own process
RESULT = "bench_data.py result: "  # a stage process's last line: this, then its numbers as JSON
LANGS = ("de", "en")  # the corpus scripts/make_corpus.py writes by default
DDP_STEPS = 50
MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
MB = 1 << 20


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


# ---------------------------------------------------------------------------------------------------------
# WMT scale: stages in processes of their own, their memory read from /proc


def _children() -> dict[int, list[int]]:
    """Every process's children, by parent pid."""
    children = defaultdict(list)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # gone
                continue
            children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry.name))
    return children


MEMORY = {"Rss": "rss", "Pss": "pss", "Pss_Anon": "pss_anon", "Pss_File": "pss_file"}  # smaps_rollup keys


def tree_memory(pid: int) -> dict[str, int]:
    """RSS, PSS and PSS split into anonymous and file-backed pages (bytes: `MEMORY`'s values), summed over
    process `pid` and all its descendants, and how many they are (`processes`)."""
    children, todo, memory = _children(), [pid], dict.fromkeys(MEMORY.values(), 0)
    memory["processes"] = 0
    while todo:
        process = todo.pop()
        todo += children.get(process, [])
        try:
            rollup = Path(f"/proc/{process}/smaps_rollup").read_text()
        except OSError:
            continue
        memory["processes"] += 1
        for line in rollup.splitlines():
            key, _, value = line.partition(":")
            if key in MEMORY:
                memory[MEMORY[key]] += int(value.split()[0]) * 1024
    return memory


def monitored(command: list[str], log: Path) -> dict[str, Any]:
    """Run `command` (its output into `log`), reading its processes' memory every 0.2 s: wall seconds,
    the peak of each summed measure of `tree_memory` (`peak_rss`, `peak_pss`, ...), the median of the
    summed anonymous PSS over the readings taken while the most processes ran (`steady_pss_anon`: for a
    training run, its steps with every DataLoader worker up; the peak also holds the allocator's
    moment-to-moment swings of the training steps), and what it printed after `RESULT`."""
    started = time.perf_counter()
    peaks = dict.fromkeys(MEMORY.values(), 0)
    readings: list[tuple[int, int]] = []  # (processes, summed anonymous PSS)
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        while process.poll() is None:
            memory = tree_memory(process.pid)
            for key, value in memory.items():
                if key != "processes":
                    peaks[key] = max(peaks[key], value)
            readings.append((memory["processes"], memory["pss_anon"]))
            time.sleep(0.2)
    most = max((count for count, _ in readings), default=0)
    steady = statistics.median([anon for count, anon in readings if count == most] or [0])
    seconds = time.perf_counter() - started
    lines = log.read_text(errors="replace").splitlines()
    if process.returncode:
        tail = "\n".join(lines[-25:])
        raise SystemExit(f"bench_data.py: {' '.join(command)} failed ({process.returncode}):\n{tail}")
    results = [json.loads(line[len(RESULT) :]) for line in lines if line.startswith(RESULT)]
    return {
        "seconds": seconds,
        **{f"peak_{key}": value for key, value in peaks.items()},
        "steady_pss_anon": steady,
        "steady_processes": most,
        **(results[-1] if results else {}),
    }


def corpus_spec(args: argparse.Namespace, corpus: Path) -> FilesData:
    """The `data=files` spec of a corpus `scripts/make_corpus.py` wrote, cached in `args.work`."""
    return FilesData(
        dir=str(corpus), src_lang=LANGS[0], tgt_lang=LANGS[1], cache_dir=str(args.work / "cache"),
        vocab_size=args.vocab_size, tokenizer_sample=args.tokenizer_sample, max_tokens=args.max_tokens,
        num_workers=2,
    )  # fmt: skip


def report(**numbers: Any) -> None:
    print(RESULT + json.dumps(numbers), flush=True)


def stage_prepare(args: argparse.Namespace) -> None:
    from attnlab.data.prepare import prepare, prepared_dir

    spec = corpus_spec(args, args.corpus)
    shutil.rmtree(prepared_dir(spec), ignore_errors=True)  # built from scratch
    prepared = prepare(spec)
    disk = sum(path.stat().st_size for path in prepared_dir(spec).iterdir())
    report(stats=prepared.stats, examples=len(prepared.splits["train"]), disk_bytes=disk)


def stage_hf(args: argparse.Namespace) -> None:
    """The Hugging Face way: `datasets` text loading, `tokenizers` BPE with attnlab's settings trained on a
    seeded sample, `map(batched=True, num_proc=2)` encoding, `filter(num_proc=2)` by the same limits."""
    import datasets
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from attnlab.data.tokenizer import EOS_ID, SPECIAL_TOKENS

    datasets.disable_progress_bars()
    cache = args.work / "hf-cache"
    shutil.rmtree(cache, ignore_errors=True)  # nothing loaded or mapped before
    sides = [
        datasets.load_dataset("text", data_files=str(args.corpus / f"train.{lang}"), split="train",
                              cache_dir=str(cache)).rename_column("text", lang)
        for lang in LANGS
    ]  # fmt: skip
    pairs = datasets.concatenate_datasets(sides, axis=1)
    started = time.perf_counter()
    sample = pairs.shuffle(seed=1).select(range(min(args.tokenizer_sample, len(pairs))))
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer, tokenizer.decoder = normalizers.NFC(), decoders.Metaspace()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  show_progress=False)  # fmt: skip

    def lines() -> Any:
        for batch in sample.iter(batch_size=10_000):
            yield from batch[LANGS[0]]
            yield from batch[LANGS[1]]

    tokenizer.train_from_iterator(lines(), trainer, length=2 * len(sample))
    tokenizer_seconds = time.perf_counter() - started

    def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        src, tgt = (tokenizer.encode_batch(batch[lang], add_special_tokens=False) for lang in LANGS)
        return {"src": [[*e.ids, EOS_ID] for e in src], "tgt": [e.ids for e in tgt]}

    def fits(batch: dict[str, list[list[int]]]) -> list[bool]:
        return [
            1 < len(s) <= 256 and 0 < len(t) < 256 for s, t in zip(batch["src"], batch["tgt"], strict=True)
        ]

    encoded = pairs.map(encode, batched=True, num_proc=2, remove_columns=list(LANGS))
    kept = encoded.filter(fits, batched=True, num_proc=2)
    report(examples=len(kept), tokenizer_seconds=round(tokenizer_seconds, 1))


def own_rss() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) * 1024


def stage_open(args: argparse.Namespace) -> None:
    import lightning  # noqa: F401  (what a training process has imported)
    import torch  # noqa: F401

    import attnlab.training.module  # noqa: F401

    spec = corpus_spec(args, args.corpus)
    before, started = own_rss(), time.perf_counter()
    datamodule = spec.datamodule()
    datamodule.setup()
    opened, added = time.perf_counter() - started, own_rss() - before
    started = time.perf_counter()
    batches = len(list(datamodule.sampler("train", shuffle=True)))
    epoch = time.perf_counter() - started
    started = time.perf_counter()
    loader = iter(datamodule.train_dataloader())
    next(loader)  # starts the workers
    first = time.perf_counter() - started
    served = tokens = 0
    started = time.perf_counter()
    for batch in loader:
        served, tokens = served + 1, tokens + int(batch["tgt_out"].ne(datamodule.pad_id).sum())
        if served == args.loader_batches:
            break
    seconds = time.perf_counter() - started
    report(open_seconds=opened, open_added_rss=added, examples=len(datamodule.splits["train"]),
           epoch_seconds=epoch, epoch_batches=batches, first_batch_seconds=first, loader_batches=served,
           loader_seconds=seconds, loader_tokens=tokens)  # fmt: skip


def stage(args: argparse.Namespace, name: str, corpus: Path, tag: str) -> dict[str, Any]:
    """Run stage `name` on `corpus` in a process of its own (see `monitored`)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--stage", name, "--corpus", str(corpus),
               "--work", str(args.work), "--vocab-size", str(args.vocab_size), "--max-tokens",
               str(args.max_tokens), "--tokenizer-sample", str(args.tokenizer_sample), "--loader-batches",
               str(args.loader_batches)]  # fmt: skip
    return monitored(command, args.work / f"{name}-{tag}.log")


def ddp_run(args: argparse.Namespace, corpus: Path, tag: str) -> dict[str, Any]:
    """`attnlab-train` on 2 DDP ranks with 2 workers each for `DDP_STEPS` steps, no validation."""
    spec = corpus_spec(args, corpus)
    command = [
        sys.executable, "-m", "attnlab.cli.train", "trainer=ddp_cpu", "model=small", "logger=csv",
        "data=files", f"data.dir={corpus}", f"data.src_lang={spec.src_lang}",
        f"data.tgt_lang={spec.tgt_lang}",
        f"data.cache_dir={spec.cache_dir}", f"data.vocab_size={spec.vocab_size}",
        f"data.tokenizer_sample={spec.tokenizer_sample}", f"data.max_tokens={spec.max_tokens}",
        "data.num_workers=2", f"+trainer.max_steps={DDP_STEPS}", "trainer.max_epochs=-1",
        "+trainer.limit_val_batches=0", "+trainer.num_sanity_val_steps=0",
        "trainer.enable_progress_bar=false",
        "test=false", f"hydra.run.dir={args.work / f'ddp-{tag}'}",
    ]  # fmt: skip
    os.environ.setdefault("WANDB_MODE", "disabled")
    return monitored(command, args.work / f"ddp-{tag}.log")


def _size(count: float) -> str:
    return f"{count / 1e6:g}M" if count >= 1e6 else f"{count / 1e3:g}k"


def scale(args: argparse.Namespace) -> dict[str, Any]:
    """Every stage on `args.pairs` pairs (and the DDP run on `args.ddp_pairs` too); the measurements."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from make_corpus import make_corpus

    args.work.mkdir(parents=True, exist_ok=True)
    corpora = {}
    for pairs in {args.pairs, args.ddp_pairs} if "ddp" in args.stages else {args.pairs}:
        corpora[pairs] = args.work / f"corpus-{pairs}"
        if not (corpora[pairs] / "test.en").is_file():
            make_corpus(pairs, corpora[pairs], seed=1, src=LANGS[0], tgt=LANGS[1], source=args.source)
    big = corpora[args.pairs]
    results: dict[str, Any] = {"pairs": args.pairs, "settings": {k: str(v) for k, v in vars(args).items()}}
    if "prepare" in args.stages or "open" in args.stages:
        results["prepare"] = stage(args, "prepare", big, str(args.pairs))
    if "hf" in args.stages:
        results["hf"] = stage(args, "hf", big, str(args.pairs))
    if "open" in args.stages:
        results["open"] = stage(args, "open", big, str(args.pairs))
    if "ddp" in args.stages:
        for pairs in sorted(corpora):
            if pairs != args.pairs:
                results[f"prepare-{pairs}"] = stage(args, "prepare", corpora[pairs], str(pairs))
            results[f"ddp-{pairs}"] = ddp_run(args, corpora[pairs], str(pairs))
    (args.work / "bench_data.json").write_text(json.dumps(results, indent=2))
    return results


def scale_table(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The Markdown rows (measure, value, target) of `scale`'s results."""
    pairs, rows = results["pairs"], []
    sample = results["settings"]["tokenizer_sample"]

    def memory(r: dict[str, Any]) -> str:
        return (f"peak RSS {r['peak_rss'] / MB:,.0f} MB, PSS {r['peak_pss'] / MB:,.0f} MB "
                f"(anonymous {r['peak_pss_anon'] / MB:,.0f} MB, "
                f"file-backed {r['peak_pss_file'] / MB:,.0f} MB)")  # fmt: skip

    if "prepare" in results and results["prepare"].get("stats"):
        prep = results["prepare"]
        rows.append((f"preparation, {_size(pairs)} pairs (BPE trained on a {_size(int(sample))}-pair sample)",
                     f"{prep['seconds']:.0f} s ({prep['stats']['tokenizer_seconds']:.0f} s tokenizer), "
                     f"{memory(prep)}", "≤ 1200 s, ≤ 4096 MB"))  # fmt: skip
        rows.append(("prepared size on disk", f"{prep['disk_bytes'] / MB:,.0f} MB "
                     f"({prep['examples']:,} training examples)", ""))  # fmt: skip
    if "hf" in results:
        hf = results["hf"]
        rows.append(("the same through `datasets` + `tokenizers` (map, filter: num_proc=2)",
                     f"{hf['seconds']:.0f} s ({hf['tokenizer_seconds']:.0f} s tokenizer), {memory(hf)} "
                     f"({hf['examples']:,} examples)", "baseline"))  # fmt: skip
        if "prepare" in results and results["prepare"].get("stats"):
            prep = results["prepare"]
            rows.append(("attnlab vs `datasets`: speed, peak PSS",
                         f"{hf['seconds'] / prep['seconds']:.2f}x, {prep['peak_pss'] / hf['peak_pss']:.2f}x",
                         "≥ 1.0x, ≤ 1.0x"))  # fmt: skip
    if "open" in results:
        op = results["open"]
        rows += [
            ("open the prepared corpus (training imports loaded)",
             f"{op['open_seconds']:.2f} s, +{op['open_added_rss'] / MB:.0f} MB RSS", "< 2 s, < 300 MB"),
            ("sampler: one epoch's batches", f"{op['epoch_seconds']:.2f} s ({op['epoch_batches']:,} batches)",
             "< 15 s"),
            ("DataLoader, 2 workers (after the first batch)",
             f"{op['loader_batches'] / op['loader_seconds']:,.0f} batches/s, "
             f"{op['loader_tokens'] / op['loader_seconds'] / 1e6:.2f}M target tokens/s "
             f"({op['loader_batches']:,} batches; first {op['first_batch_seconds']:.1f} s)", "≥ 2M tokens/s"),
        ]  # fmt: skip
    runs = sorted((k for k in results if k.startswith("ddp-")), key=lambda k: int(k[4:]))
    for key in runs:
        run = results[key]
        rows.append((f"`ddp_cpu` 2 ranks x 2 workers, {DDP_STEPS} steps, {_size(int(key[4:]))} pairs",
                     f"{run['seconds']:.0f} s, {memory(run)}; during the steps ({run['steady_processes']} "
                     f"processes) anonymous {run['steady_pss_anon'] / MB:,.0f} MB (median)",
                     "anonymous PSS flat in corpus size"))  # fmt: skip
    if len(runs) > 1 and all("steady_pss_anon" in results[key] for key in runs):
        (small, large), (fewer, more) = (
            (results[runs[0]], results[runs[-1]]),
            (int(runs[0][4:]), int(runs[-1][4:])),
        )
        grown = large["steady_pss_anon"] - small["steady_pss_anon"]
        rows.append((f"anonymous PSS during the steps, {_size(fewer)} to {_size(more)} pairs",
                     f"{grown / MB:+,.0f} MB ({grown / small['steady_pss_anon']:+.1%}; "
                     f"{grown / (more - fewer) / 2:+.1f} bytes per added pair per rank)",
                     "flat"))  # fmt: skip
    return rows


def print_table(rows: list[tuple[str, str, str]]) -> None:
    print("| measure | value | target |\n| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


STAGE_FUNCTIONS = {"prepare": stage_prepare, "hf": stage_hf, "open": stage_open}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="Multi30k: the directory with train.de, train.en, ...")
    parser.add_argument("--max-tokens", type=int, help="default 4096 (Multi30k), 3200 (--pairs)")
    parser.add_argument("--vocab-size", type=int, help="default 8000 (Multi30k), 37000 (--pairs)")
    parser.add_argument("--tokenizer", choices=["bpe", "unigram"], default="bpe")
    parser.add_argument(
        "--quick", action="store_true", help="the first lines of each split: the harness only"
    )
    parser.add_argument("--pairs", type=int, help="WMT scale: training pairs of the corpus to measure")
    parser.add_argument("--work", type=Path, default=Path("bench-data"), help="corpora, caches, logs")
    parser.add_argument("--tokenizer-sample", type=int, default=1_000_000)
    parser.add_argument("--loader-batches", type=int, default=20_000)
    parser.add_argument("--ddp-pairs", type=int, default=500_000)
    parser.add_argument(
        "--skip", default="", help="stages to leave out, comma-separated: " + ",".join(STAGES)
    )
    parser.add_argument("--source", type=Path, default=MULTI30K, help="the Multi30k the corpus is made from")
    parser.add_argument("--stage", choices=list(STAGE_FUNCTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage:
        STAGE_FUNCTIONS[args.stage](args)
        return
    if (args.root is None) == (args.pairs is None):
        parser.error("give --root (Multi30k) or --pairs (WMT scale)")
    if args.pairs is not None:
        args.vocab_size, args.max_tokens = args.vocab_size or 37000, args.max_tokens or 3200
        unknown = set(filter(None, args.skip.split(","))) - set(STAGES)
        if unknown:
            parser.error(f"--skip: unknown stages {sorted(unknown)}; choose from {', '.join(STAGES)}")
        args.stages = [name for name in STAGES if name not in args.skip.split(",")]
        args.work = args.work.resolve()
        results = scale(args)
        print(f"{_size(args.pairs)} pairs with WMT-like lengths (scripts/make_corpus.py), joint BPE "
              f"{args.vocab_size}, max_tokens={args.max_tokens}\n")  # fmt: skip
        print_table(scale_table(results))
        return
    args.vocab_size, args.max_tokens = args.vocab_size or 8000, args.max_tokens or 4096
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
    print_table(rows)


if __name__ == "__main__":
    main()
