"""Benchmark decoding: greedy and beam search, with and without the K/V cache, at several batch sizes.

Usage:
    python scripts/bench_decode.py --root ../shared/data/multi30k [--ckpt RUN_DIR_OR_CKPT]
        [--batch-sizes 1 16 64] [--sweep-sentences 200] [--threads 2] [--device cpu] [--marian]
        [--ctranslate2] [--sentences N] [--quick] [--allocator keep|system]

Without `--ckpt` the model is a randomly initialised `model=small` with the Multi30k tokenizer (its
outputs run to the length limit: a worst case); with a trained checkpoint the outputs have natural
lengths. Reports (Markdown tables, all measured in this process):
- the decoder step loop at output length 30 (64 sentences of test2016, eos ignored): cached vs uncached,
  their ratio (the cache's speed-up);
- sentences/s and output tokens/s of greedy and beam 5 on test2016 sources (Multi30k-sized inputs) at
  each batch size, cached and uncached, on the first `--sweep-sentences` sentences;
- the whole test2016 set (1000 sentences) with beam 5 at batch 64, cached: wall time and BLEU.

`--memory N [N ...]` (with `--ckpt`) instead runs `attnlab-translate` (greedy and beam 5, 256-line chunks)
in a fresh process on inputs of N sentences (test2016 repeated) and reports each one's peak resident
memory: flat in N when translation streams.

`--marian` instead compares attnlab's decoders with Hugging Face MarianMT's `generate()` on the same
weights (`attnlab.interop.marian.to_marian`, `[interop]` extra): greedy and beam 5 over the test2016
sources at batch 64 and one sentence at a time (latency), length penalty 0, the same fixed length limit
(60 tokens, no forced eos), reporting sentences/s (median of `--repeats` interleaved runs), the
speed-up (median and range of the per-run ratios), and how many outputs are identical;
for greedy, each difference's top-2 log-probability margin (attnlab's model) at the first differing step.
With `--quick` on the random model every output must be identical (exit status 1 naming the settings that
differ otherwise): the model is seeded and its greedy top-2 margins on those sentences are above 1e-3,
far above the float differences between the two implementations, so a difference is a conversion or
decoder error, not a near-tie.

`--ctranslate2` instead compares attnlab with CTranslate2 on the same weights (`attnlab-export
format=ctranslate2`'s conversion, `[export]` extra), float32 and int8 (CTranslate2's weight quantization;
attnlab stays float32): greedy and beam 5 over the first `--sentences` test2016 sources at batch 64 and
one sentence at a time (`--latency-sentences`), `--threads` threads on both sides, length penalty 0, the
same fixed length limit (60 tokens), reporting sentences/s (medians of `--repeats` interleaved runs), the
speed-up (median and range of the per-run ratios) and how many outputs are identical to attnlab's. With
`--quick` on the random model every float32 output must be identical (exit status 1 otherwise), as for
`--marian`. Each CTranslate2 model decodes in a process of its own (`CT2Process`: a CTranslate2 run slowed
later attnlab runs in the same process, a second model the first), on request, alternating with attnlab's
runs. It also prints the matrix-product backends CTranslate2 reports when it loads each model
(it takes oneDNN's SGEMM on non-Intel CPUs unless `CT2_USE_MKL=1`) and attnlab's (`attnlab.model.gemm`:
oneDNN's SGEMM for its linear layers where installed on a non-Intel CPU, else or with `ATTNLAB_GEMM=torch`
PyTorch's MKL; every
comparison prints which).
With `--profile` as well, then, for greedy and beam 5 at batch 64: where attnlab's time goes,
op by op (`torch.profiler`: self time of each aten op over one run, its share of the profiled run's wall
time, calls; oneDNN's products, which are no aten op, as `attnlab::onednn_sgemm`; "outside ops" is the wall
time no op accounts for: Python and dispatch), next to CTranslate2's float32 wall time on the same batches
(its Python wheel has no op profiler) and that time over attnlab's matrix products
(`attnlab.model.flops.MATMUL_OPS`: `mm`, `addmm`, `bmm`, `baddbmm`, and `attnlab::onednn_sgemm`) alone.

The C heap: `--allocator keep` (the default) sets glibc's malloc as `attnlab-translate` and `attnlab-eval`
do by default (`attnlab.training.allocator`: freed memory stays in the process instead of being faulted in
again at the next decoding step), in this process and in each CTranslate2 worker, so for every engine
compared alike (MarianMT runs in this process); `--allocator system` leaves glibc's own settings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from attnlab.data import Multi30kData
from attnlab.data.batching import TokenBatchSampler, pad
from attnlab.decoding import DecodeConfig
from attnlab.decoding.search import translate
from attnlab.inference.translator import Translator, pick_device, resolve_checkpoints
from attnlab.io import atomic_write_bytes
from attnlab.metrics import corpus_bleu
from attnlab.model import gemm
from attnlab.model.config import TransformerConfig
from attnlab.model.flops import MATMUL_OPS
from attnlab.model.transformer import Transformer
from attnlab.training.allocator import configure_allocator


def load(args: argparse.Namespace) -> Translator:
    if args.ckpt:
        return Translator.from_checkpoints(resolve_checkpoints(args.ckpt), device=args.device)
    datamodule = Multi30kData(root=str(args.root), vocab_size=8000).datamodule()  # model=small's recipe
    datamodule.setup()
    torch.manual_seed(0)
    config = TransformerConfig(d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3)
    model = Transformer(config.with_vocab(datamodule.src_vocab_size, datamodule.tgt_vocab_size))
    model.to(pick_device(args.device))
    return Translator(model, datamodule.src_tokenizer, datamodule.tgt_tokenizer, DecodeConfig())


@torch.inference_mode()
def step_loop(model: Transformer, src: torch.Tensor, steps: int, use_cache: bool) -> float:
    """Seconds for `steps` decoder steps (argmax fed back, eos ignored) over a batch."""
    synchronize(src.device)
    started = time.perf_counter()
    memory, mask = model.encode(src)
    cache = model.new_cache() if use_cache else None
    prefix = torch.full((src.size(0), 1), model.config.start_id, dtype=torch.long, device=src.device)
    for _ in range(steps):
        logits = model.decode(prefix[:, -1:] if use_cache else prefix, memory, mask, cache=cache)
        prefix = torch.cat([prefix, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    synchronize(src.device)
    return time.perf_counter() - started


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_all(translator: Translator, ids: list[list[int]], beam: int, batch_size: int, use_cache: bool):
    """(seconds, output ids in input order) for decoding `ids` in length-sorted batches."""
    cfg, model = translator.decode, translator.model
    sampler = TokenBatchSampler([len(r) for r in ids], batch_size=batch_size, shuffle=False)
    outputs: list[list[int]] = [[] for _ in ids]
    device = next(model.parameters()).device
    started = time.perf_counter()
    for batch in sampler:
        src = pad([ids[i] for i in batch], model.config.pad_id).to(device)
        rows = translate(model, src, cfg, beam, use_cache=use_cache)
        for i, row in zip(batch, rows, strict=True):
            outputs[i] = row
    return time.perf_counter() - started, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="directory with test2016.de, ...")
    parser.add_argument("--ckpt", help="a trained checkpoint or run directory (default: random model=small)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--sweep-sentences", type=int, default=200)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu", help="cpu, cuda, or auto")
    parser.add_argument("--marian", action="store_true", help="compare with MarianMT generate() instead")
    parser.add_argument(
        "--ctranslate2", action="store_true", help="compare with CTranslate2 (float32, int8) instead"
    )
    parser.add_argument("--profile", action="store_true", help="with --ctranslate2: attnlab's op profile too")
    parser.add_argument(
        "--quick", action="store_true", help="a few sentences, 2 repeats: the harness only (CI)"
    )
    parser.add_argument(
        "--sentences", type=int, default=1000, help="with --marian/--ctranslate2: how many test2016 sentences"
    )
    parser.add_argument("--latency-sentences", type=int, default=50, help="with --marian: for batch 1")
    parser.add_argument(
        "--repeats", type=int, default=3, help="with --marian: interleaved runs; medians, ratio range"
    )
    parser.add_argument(
        "--memory", type=int, nargs="+", metavar="N",
        help="instead: peak RSS of attnlab-translate streaming N sentences (test2016 repeated), per N",
    )  # fmt: skip
    parser.add_argument("--memory-child", nargs=2, metavar=("INPUT", "BEAM"), help=argparse.SUPPRESS)
    parser.add_argument("--ct2-worker", type=Path, metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the default mode's numbers to this JSON file")
    parser.add_argument(
        "--allocator", choices=["keep", "system"], default="keep",
        help="glibc's malloc settings of this process and each CTranslate2 worker, so for every engine "
        "alike: keep (what attnlab-translate and attnlab-eval set by default) or system (glibc's own)",
    )  # fmt: skip
    args = parser.parse_args()
    args.allocator_set = configure_allocator(args.allocator)  # whether glibc's options are in force
    if args.profile and not args.ctranslate2:
        parser.error("--profile profiles attnlab beside CTranslate2: give --ctranslate2 too")
    torch.set_num_threads(args.threads)
    if args.memory_child:
        translate_in_this_process(args)
        return
    if args.ct2_worker:
        serve_ctranslate2(args)
        return
    if args.memory:
        streaming_memory(args)
        return

    if args.quick:  # every table of the chosen mode, on a few sentences
        args.sentences, args.latency_sentences, args.repeats = 6, 2, 2
        args.sweep_sentences, args.batch_sizes = 6, [1, 4]
    translator = load(args)
    if args.marian:
        compare_with_marian(translator, args)
        print(heap_line(args))  # MarianMT runs in this process
        return
    if args.ctranslate2:
        compare_with_ctranslate2(translator, args)
        return
    model = translator.model.eval()
    n = 12 if args.quick else 1000
    sources = (args.root / "test2016.de").read_text(encoding="utf-8").split("\n")[:n]
    references = (args.root / "test2016.en").read_text(encoding="utf-8").split("\n")[:n]
    ids = [[*row, model.config.eos_id] for row in translator.src_tokenizer.encode_batch(sources)]
    name = f"checkpoint {args.ckpt}" if args.ckpt else "random model=small"
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {name}, {n_params:,} parameters, {args.threads} threads, device {args.device}\n")

    src = pad(ids[:64], model.config.pad_id).to(next(model.parameters()).device)
    steps = 5 if args.quick else 30
    step_loop(model, src, 5, True)  # warm-up
    cached = min(step_loop(model, src, steps, True) for _ in range(3))
    uncached = min(step_loop(model, src, steps, False) for _ in range(3))
    print(f"| decoder steps ({src.size(0)} sentences, output length {steps}) | seconds | speed-up |")
    print("|---|---|---|")
    print(f"| uncached | {uncached:.3f} | 1.00x |")
    print(f"| cached | {cached:.3f} | {uncached / cached:.2f}x |\n")

    loop = {"steps": steps, "cached_s": cached, "uncached_s": uncached}
    record = {"device": args.device, "threads": args.threads, "model": name, "parameters": n_params,
              "allocator": args.allocator, "allocator_set": args.allocator_set, "step_loop": loop,
              "sweep": []}  # fmt: skip
    subset = ids[: args.sweep_sentences]
    print(f"| search | batch | cache | sentences/s | tokens/s | ({len(subset)} sentences of test2016) |")
    print("|---|---|---|---|---|---|")
    for beam in (1, 5):
        for batch_size in args.batch_sizes:
            for use_cache in (True, False):
                seconds, outputs = decode_all(translator, subset, beam, batch_size, use_cache)
                tokens = sum(len(o) + 1 for o in outputs)  # eos included
                name = "greedy" if beam == 1 else f"beam {beam}"
                cache = "yes" if use_cache else "no"
                rate = len(subset) / seconds
                print(f"| {name} | {batch_size} | {cache} | {rate:.1f} | {tokens / seconds:.0f} | |")
                row = {"search": name, "batch": batch_size, "cache": use_cache, "sentences_per_s": rate}
                record["sweep"].append({**row, "tokens_per_s": tokens / seconds})

    seconds, outputs = decode_all(translator, ids, 5, 64, True)
    hypotheses = [translator.tgt_tokenizer.decode(o) for o in outputs]
    bleu = corpus_bleu(hypotheses, references)
    print(f"\ntest2016, {len(ids)} sentences, beam 5, batch 64, cached: {seconds:.1f} s "
          f"({len(ids) / seconds:.1f} sentences/s), BLEU {bleu.score:.2f}, "
          f"{translator.decode.length_penalty} alpha {translator.decode.alpha}")  # fmt: skip
    print(heap_line(args))
    record["test2016"] = {"sentences": len(ids), "beam": 5, "batch": 64, "seconds": seconds,
                          "sentences_per_s": len(ids) / seconds, "bleu": bleu.score}  # fmt: skip
    if args.json:
        atomic_write_bytes(args.json, (json.dumps(record, indent=1) + "\n").encode("utf-8"))


def heap_line(args: argparse.Namespace, workers: dict[str, bool] | None = None) -> str:
    """Which `--allocator` this run asked for and where glibc's options are in force: this process (and,
    given, each CTranslate2 worker by its weights)."""
    said = {True: "yes", False: "no"}
    where = [f"this process {said[args.allocator_set]}"]
    where += [f"{weights} worker {said[kept]}" for weights, kept in (workers or {}).items()]
    return f"C heap: --allocator {args.allocator}; glibc's malloc options in force: {', '.join(where)}"


def translate_in_this_process(args: argparse.Namespace) -> None:
    """(--memory child) Stream a file through attnlab-translate; print this process's peak RSS in MB."""
    import resource

    from attnlab.cli.translate import main as translate_main

    source, beam = args.memory_child
    translate_main([f"ckpt_path={args.ckpt}", f"input={source}", "output=/dev/null", f"decode.beam={beam}",
                    "chunk_lines=256", "device=cpu", f"allocator={args.allocator}"])  # fmt: skip
    print(f"peak_rss_mb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")


def streaming_memory(args: argparse.Namespace) -> None:
    """Peak resident memory of `attnlab-translate` (a fresh process each) over inputs of N sentences."""
    import subprocess
    import sys
    import tempfile

    sources = (args.root / "test2016.de").read_text(encoding="utf-8").split("\n")[:1000]
    print("| sentences | beam | seconds | peak RSS (MB) |\n|---|---|---|---|")
    for n in args.memory:
        for beam in (1, 5):
            with tempfile.NamedTemporaryFile("w", suffix=".de", encoding="utf-8") as f:
                f.write("\n".join(sources[i % len(sources)] for i in range(n)) + "\n")
                f.flush()
                started = time.perf_counter()
                command = [sys.executable, __file__, "--root", str(args.root), "--ckpt", args.ckpt,
                           "--threads", str(args.threads), "--allocator", args.allocator,
                           "--memory-child", f.name, str(beam)]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                seconds = time.perf_counter() - started
            peak = done.stdout.split("peak_rss_mb")[-1].strip()
            print(f"| {n} | {beam} | {seconds:.1f} | {peak} |")


LIMIT = 60  # output tokens, eos included, for both decoders


def marian_decode(marian, ids: list[list[int]], beam: int, batch_size: int, pad_id: int):
    """(seconds, output ids without start and eos) of MarianMT generate() in length-sorted batches."""
    sampler = TokenBatchSampler([len(r) for r in ids], batch_size=batch_size, shuffle=False)
    outputs: list[list[int]] = [[] for _ in ids]
    eos = marian.config.eos_token_id
    started = time.perf_counter()
    for batch in sampler:
        src = pad([ids[i] for i in batch], pad_id)
        with torch.inference_mode():
            generated = marian.generate(input_ids=src, attention_mask=src != pad_id, num_beams=beam,
                                        do_sample=False, length_penalty=0.0, max_new_tokens=LIMIT,
                                        min_new_tokens=1, num_return_sequences=1)  # fmt: skip
        for i, row in zip(batch, generated[:, 1:].tolist(), strict=True):
            outputs[i] = row[: row.index(eos)] if eos in row else [t for t in row if t != pad_id]
    return time.perf_counter() - started, outputs


def attnlab_decode(model: Transformer, ids: list[list[int]], beam: int, batch_size: int):
    """(seconds, output ids) of attnlab with the same settings as `marian_decode`."""
    sampler = TokenBatchSampler([len(r) for r in ids], batch_size=batch_size, shuffle=False)
    outputs: list[list[int]] = [[] for _ in ids]
    settings = DecodeConfig(beam=beam, alpha=0.0, max_len_a=0.0, max_len_b=LIMIT, min_len=1)
    started = time.perf_counter()
    for batch in sampler:
        src = pad([ids[i] for i in batch], model.config.pad_id)
        rows = translate(model, src, settings)
        for i, row in zip(batch, rows, strict=True):
            outputs[i] = row
    return time.perf_counter() - started, outputs


@torch.inference_mode()
def first_step_margin(model: Transformer, src: list[int], prefix: list[int]) -> float:
    """Top-2 log-probability margin of the next token after `prefix` (attnlab's model)."""
    tgt = torch.tensor([[model.config.start_id, *prefix]])
    logits = model(torch.tensor([src]), tgt)[0, -1].float().log_softmax(-1)
    top = logits.topk(2).values
    return float(top[0] - top[1])


def compare_with_marian(translator: Translator, args: argparse.Namespace) -> None:
    from attnlab.interop.marian import to_marian

    model = translator.model.eval().cpu()
    marian = to_marian(model)
    marian.generation_config.forced_eos_token_id = None  # the same length limit rule on both sides
    sources = (args.root / "test2016.de").read_text(encoding="utf-8").split("\n")[: args.sentences]
    ids = [[*row, model.config.eos_id] for row in translator.src_tokenizer.encode_batch(sources)]
    name = f"checkpoint {args.ckpt}" if args.ckpt else "random model=small"
    print(
        f"model: {name}, {len(ids)} test2016 sentences, {args.threads} threads, length penalty 0; "
        f"attnlab's linear layers multiply with {attnlab_products()}\n"
    )
    print(f"| search | batch | attnlab sentences/s | MarianMT sentences/s | speed-up (median [min, max] of "
          f"{args.repeats}) | identical outputs |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    differing: list[str] = []  # settings where some outputs differ, e.g. "greedy at batch 64: 5/6 identical"
    for beam in (1, 5):
        for batch_size, subset in ((64, ids), (1, ids[: args.latency_sentences])):
            marian_decode(marian, subset[:2], beam, batch_size, model.config.pad_id)  # warm-up
            attnlab_decode(model, subset[:2], beam, batch_size)
            times: dict[str, list[float]] = {"attnlab": [], "marian": []}
            for _ in range(args.repeats):  # interleaved, so that machine noise hits both alike
                ours_s, ours = attnlab_decode(model, subset, beam, batch_size)
                theirs_s, theirs = marian_decode(marian, subset, beam, batch_size, model.config.pad_id)
                times["attnlab"].append(ours_s)
                times["marian"].append(theirs_s)
            ratios = sorted(m / a for a, m in zip(times["attnlab"], times["marian"], strict=True))
            same = sum(a == b for a, b in zip(ours, theirs, strict=True))
            search = "greedy" if beam == 1 else f"beam {beam}"
            n = len(subset)
            ours_rate = n / statistics.median(times["attnlab"])
            theirs_rate = n / statistics.median(times["marian"])
            spread = f" [{ratios[0]:.2f}, {ratios[-1]:.2f}]" if len(ratios) > 1 else ""
            print(f"| {search} | {batch_size} | {ours_rate:.1f} | {theirs_rate:.1f} | "
                  f"{statistics.median(ratios):.2f}x{spread} | {same}/{n} ({same / n:.1%}) |")  # fmt: skip
            if same != n:
                differing.append(f"{search} at batch {batch_size}: {same}/{n} identical")
            if beam == 1 and batch_size == 64:
                margins = []
                for src, a, b in zip(subset, ours, theirs, strict=True):
                    if a != b:
                        pairs = enumerate(zip(a, b, strict=False))
                        k = next((j for j, (x, y) in pairs if x != y), min(len(a), len(b)))
                        margins.append(first_step_margin(model, src, a[:k]))
                greedy_differences = sorted(margins)
    print(
        f"\ngreedy differences: {len(greedy_differences)}; top-2 margins at the first differing step: "
        f"{[f'{m:.2e}' for m in greedy_differences]}"
    )
    if args.quick and not args.ckpt and differing:  # the seeded random model: see the module docstring
        raise SystemExit(
            f"bench_decode.py --marian --quick: attnlab's and MarianMT's outputs differ on the same weights "
            f"({'; '.join(differing)}): to_marian (attnlab.interop.marian) or one of the decoders is wrong"
        )


def ct2_gemm_backends(load: Callable[[], Any]) -> tuple[Any, str]:
    """(load(), the matrix-product backends CTranslate2 reports): `load` loads the process's first
    CTranslate2 model, when CTranslate2 logs its system configuration once (at info level, from C++ on
    file descriptor 2). That descriptor is captured around `load`; everything written to it is passed on
    afterwards, also when `load` raises, except the info lines turned on here (all of it when the level
    was info already, e.g. with CT2_VERBOSE=1). After an earlier load in
    the process CTranslate2 logs nothing more: "not reported". CTranslate2 picks its x86 SGEMM backend by
    CPU vendor (MKL on Intel, oneDNN elsewhere; CT2_USE_MKL overrides), so the comparison says which ran."""
    import logging
    import re
    import sys
    import tempfile

    import ctranslate2

    level = ctranslate2.get_log_level()
    with tempfile.TemporaryFile() as log:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        ctranslate2.set_log_level(logging.INFO)
        try:
            loaded = load()
        finally:
            ctranslate2.set_log_level(level)
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            lines = log.read().decode("utf-8", errors="replace").splitlines()
            info = [line for line in lines if "[ctranslate2]" in line and "[info]" in line]
            shown = lines if level <= logging.INFO else [line for line in lines if line not in info]
            sys.stderr.write("".join(f"{line}\n" for line in shown))
            sys.stderr.flush()
    found = [re.search(r"- (\w+) backend: (.+)$", line) for line in info]
    return loaded, "; ".join(f"{m.group(1)} {m.group(2)}" for m in found if m) or "not reported"


def ct2_decode(engine, ids: list[list[int]], beam: int, batch_size: int):
    """(seconds, output ids) of CTranslate2 on the same length-sorted batches and settings as
    `attnlab_decode`."""
    sampler = TokenBatchSampler([len(r) for r in ids], batch_size=batch_size, shuffle=False)
    outputs: list[list[int]] = [[] for _ in ids]
    started = time.perf_counter()
    for batch in sampler:
        rows = engine.translate_ids([ids[i] for i in batch], beam=beam, max_len_a=0.0, max_len_b=LIMIT,
                                    min_len=1, batch_size=batch_size)  # fmt: skip
        for i, row in zip(batch, rows, strict=True):
            outputs[i] = row
    return time.perf_counter() - started, outputs


def serve_ctranslate2(args: argparse.Namespace) -> None:
    """(--ct2-worker child) Load one CTranslate2 model, write its backends (and whether `--allocator keep`'s
    options are in force here) as a JSON line, then answer each
    JSON request line on stdin ({"ids", "beam", "batch_size"}) with a JSON line {"seconds", "outputs"} of
    `ct2_decode`, timed here."""
    import sys

    from attnlab.interop.ct2 import CT2Translator

    engine, backends = ct2_gemm_backends(lambda: CT2Translator(args.ct2_worker, intra_threads=args.threads))
    print(json.dumps({"backends": backends, "allocator_set": args.allocator_set}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        seconds, outputs = ct2_decode(engine, request["ids"], request["beam"], request["batch_size"])
        print(
            json.dumps({"seconds": seconds, "outputs": [list(map(int, row)) for row in outputs]}), flush=True
        )


class CT2Process:
    """One CTranslate2 model in a process of its own (`serve_ctranslate2`), decoding on request: a
    CTranslate2 run leaves the process it ran in slower for attnlab afterwards (greedy at batch 64: medians
    +2% to +18% in four runs of a throwaway script, +1-2% after an attnlab run instead), so the two engines
    do not share one; and a second CTranslate2 model loaded in a process slows the first (greedy at batch 64
    on a 2-core Xeon: 1,035-1,092 sentences/s alone, 292-326 with the int8 model loaded beside it, also
    after deleting it), so each model has its own. Requests alternate with attnlab's runs, never overlap
    them; the seconds are measured in the worker, around `ct2_decode` only."""

    def __init__(self, path: Path, threads: int, root: Path, allocator: str) -> None:
        import subprocess
        import sys

        command = [sys.executable, __file__, "--root", str(root), "--threads", str(threads),
                   "--allocator", allocator, "--ct2-worker", str(path)]  # fmt: skip
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            loaded = self._answer()
            self.backends, self.allocator_set = loaded["backends"], loaded["allocator_set"]
        except BaseException:
            self._end(failed=True)
            raise

    def _answer(self) -> dict[str, Any]:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(
                f"the CTranslate2 worker exited with status {self.process.wait()} (its errors above)"
            )
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise RuntimeError(f"the CTranslate2 worker wrote no answer but {line[:200]!r}") from None

    def decode(self, ids: list[list[int]], beam: int, batch_size: int):
        """(seconds, output ids) of `ct2_decode` on the worker's model."""
        request = {"ids": ids, "beam": beam, "batch_size": batch_size}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self._answer()
        return answer["seconds"], answer["outputs"]

    def __enter__(self) -> CT2Process:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        self._end(failed=kind is not None)

    def _end(self, failed: bool) -> None:
        """Close the worker's input, where it exits; killed when it has not within 60 s, or 5 s after a
        failure here (it may be blocked writing an answer no one reads)."""
        import subprocess

        self.process.stdin.close()
        try:
            self.process.wait(timeout=5 if failed else 60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        finally:
            self.process.stdout.close()


ONEDNN_OP = "attnlab::onednn_sgemm"  # oneDNN's products in the profile (a ctypes call, no aten op)


@contextlib.contextmanager
def onednn_products_profiled() -> Iterator[None]:
    """Within: each of `attnlab.model.gemm`'s products is a profiler range named `ONEDNN_OP` (its self time
    is the product's; the bias copy inside it stays an aten op of its own)."""
    real = gemm.linear

    def ranged(flat, weight, bias):
        with torch.profiler.record_function(ONEDNN_OP):
            return real(flat, weight, bias)

    gemm.linear = ranged
    try:
        yield
    finally:
        gemm.linear = real


def attnlab_products() -> str:
    """What attnlab's linear layers multiply with at inference (`attnlab.model.gemm`)."""
    if gemm.available():
        return gemm.backend()
    return "PyTorch's " + ("MKL" if torch.backends.mkl.is_available() else "BLAS")


def profile_against_ctranslate2(
    model: Transformer, ct2: CT2Process, ids: list[list[int]], beam: int, repeats: int
) -> None:
    """Print attnlab's op profile of one decode of `ids` at batch 64 and CTranslate2's wall time on them."""
    from torch.profiler import ProfilerActivity, profile

    plain = statistics.median(attnlab_decode(model, ids, beam, 64)[0] for _ in range(repeats))
    theirs = statistics.median(ct2.decode(ids, beam, 64)[0] for _ in range(repeats))
    with profile(activities=[ProfilerActivity.CPU]) as prof, onednn_products_profiled():
        wall = attnlab_decode(model, ids, beam, 64)[0]
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    inside = sum(e.self_cpu_time_total for e in ops) / 1e6
    matmuls = sum(e.self_cpu_time_total for e in ops if e.key in (*MATMUL_OPS, ONEDNN_OP)) / 1e6
    search = "greedy" if beam == 1 else f"beam {beam}"
    print(f"\n{search}, batch 64, {len(ids)} sentences: attnlab {plain:.3f} s (median of {repeats}; profiled "
          f"{wall:.3f} s), CTranslate2 float32 {theirs:.3f} s = {theirs / matmuls:.2f}x attnlab's matrix "
          f"products alone ({matmuls:.3f} s)\n")  # fmt: skip
    print("| op | self time | share of the profiled wall time | calls |")
    print("|---|---|---|---|")
    shown = [e for e in ops if e.self_cpu_time_total > 0.01 * wall * 1e6][:12]  # ops above 1%
    for e in shown:
        seconds = e.self_cpu_time_total / 1e6
        print(f"| {e.key} | {seconds * 1e3:.1f} ms | {seconds / wall:.1%} | {e.count} |")
    rest = inside - sum(e.self_cpu_time_total for e in shown) / 1e6
    outside = wall - inside
    print(f"| other ops | {rest * 1e3:.1f} ms | {rest / wall:.1%} | |")
    print(f"| outside ops (Python, dispatch) | {outside * 1e3:.1f} ms | {outside / wall:.1%} | |")


def ct2_table(
    model: Transformer, ct2: dict[str, CT2Process], ids: list[list[int]], args: argparse.Namespace
) -> list:
    """Print the comparison's rows (each search, batch size and CTranslate2 weights, `--repeats` runs
    interleaved; `ct2`: the process of each weights); return where float32 outputs differ."""
    differing: list[str] = []
    for beam in (1, 5):
        for batch_size, subset in ((64, ids), (1, ids[: args.latency_sentences])):
            for weights in ("float32", "int8"):
                ct2[weights].decode(subset[:2], beam, batch_size)  # warm-up
                attnlab_decode(model, subset[:2], beam, batch_size)
                times: dict[str, list[float]] = {"attnlab": [], "ct2": []}
                for _ in range(args.repeats):  # interleaved, so that machine noise hits both alike
                    ours_s, ours = attnlab_decode(model, subset, beam, batch_size)
                    theirs_s, theirs = ct2[weights].decode(subset, beam, batch_size)
                    times["attnlab"].append(ours_s)
                    times["ct2"].append(theirs_s)
                ratios = sorted(a / c for a, c in zip(times["attnlab"], times["ct2"], strict=True))
                same = sum(a == b for a, b in zip(ours, theirs, strict=True))
                search, n = ("greedy" if beam == 1 else f"beam {beam}"), len(subset)
                ours_rate = n / statistics.median(times["attnlab"])
                theirs_rate = n / statistics.median(times["ct2"])
                spread = f" [{ratios[0]:.2f}, {ratios[-1]:.2f}]" if len(ratios) > 1 else ""
                ratio = f"{statistics.median(ratios):.2f}x{spread}"
                print(f"| {search} | {batch_size} | {weights} | {ours_rate:.1f} | {theirs_rate:.1f} | "
                      f"{ratio} | {same}/{n} ({same / n:.1%}) |")  # fmt: skip
                if same != n and weights == "float32":
                    differing.append(f"{search} at batch {batch_size}: {same}/{n} identical")
    return differing


def compare_with_ctranslate2(translator: Translator, args: argparse.Namespace) -> None:
    import tempfile

    from attnlab.interop.export import export

    model = translator.model.eval().cpu()
    sources = (args.root / "test2016.de").read_text(encoding="utf-8").split("\n")[: args.sentences]
    ids = [[*row, model.config.eos_id] for row in translator.src_tokenizer.encode_batch(sources)]
    name = f"checkpoint {args.ckpt}" if args.ckpt else "random model=small"
    print(f"model: {name}, {len(ids)} test2016 sentences, {args.threads} threads, length penalty 0\n")
    print(f"| search | batch | CTranslate2 weights | attnlab sentences/s | CTranslate2 sentences/s | "
          f"speed-up (median [min, max] of {args.repeats}) | identical outputs |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        paths = {weights: export(translator, "ctranslate2", Path(tmp) / weights, quantization)
                 for weights, quantization in (("float32", "none"), ("int8", "int8"))}  # fmt: skip
        with contextlib.ExitStack() as stack:
            ct2 = {w: stack.enter_context(CT2Process(path, args.threads, args.root, args.allocator))
                   for w, path in paths.items()}  # fmt: skip
            differing = ct2_table(model, ct2, ids, args)
            print("\nspeed-up: attnlab's seconds / CTranslate2's (above 1: CTranslate2 is faster)")
            backends = "; ".join(f"{w}: {process.backends}" for w, process in ct2.items())
            print(f"CTranslate2's matrix products (its log): {backends}; attnlab's: {attnlab_products()} "
                  "(CTranslate2 takes MKL on Intel CPUs or with CT2_USE_MKL=1, else oneDNN)")  # fmt: skip
            print(heap_line(args, {w: process.allocator_set for w, process in ct2.items()}))
            if args.profile:
                for beam in (1, 5):
                    profile_against_ctranslate2(model, ct2["float32"], ids, beam, args.repeats)
    if args.quick and not args.ckpt and differing:  # the seeded random model: see the module docstring
        raise SystemExit(
            "bench_decode.py --ctranslate2 --quick: attnlab's and CTranslate2's float32 outputs differ on "
            f"the same weights ({'; '.join(differing)}): attnlab.interop.export or a decoder is wrong"
        )


if __name__ == "__main__":
    main()
