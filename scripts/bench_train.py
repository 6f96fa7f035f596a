"""One training step (forward, backward, AdamW) of attnlab, MarianMT, fairseq and torch.nn.Transformer.

Usage:
    python scripts/bench_train.py [--sizes small base] [--repeats 7] [--threads 2] [--out docs/bench_train.md]
    python scripts/bench_train.py --quick        # tiny shapes: checks the harness (CI), times mean nothing
    python scripts/bench_train.py --frameworks attnlab marian fairseq torch   # fairseq's own venv's python

`--frameworks` names the models compared (attnlab always among them: every ratio is attnlab's). The default
is attnlab, MarianMT (`marian`, the `[interop]` extra) and `torch`; fairseq is timed only when named, so a
run compares the same models wherever it runs, whatever happens to be installed. fairseq is no dependency of
attnlab (a source build with C++ extensions that pins hydra-core and omegaconf and pulls torchaudio): run
the script with the python of a virtual environment built for it (docs/benchmarks.md, "fairseq anchor").
A named framework that cannot be imported stops the script before anything is built, saying so.

The models do the same arithmetic, asserted before timing: the same trainable parameter count,
ReLU feed-forward, post-norm, dropout 0.1, embeddings shared by encoder, decoder and output layer, no
output bias, the same fixed batch of B sentences of S source and T target tokens (no padding), label-
smoothed cross-entropy (0.1) and fused AdamW (the default of attnlab's training and of Hugging Face's
`Trainer`). attnlab's loss is the one its training uses, `output_layer_loss` (the output layer and the
loss fused in chunks, without the logits; `--loss logits` gives it `F.cross_entropy` on the logits too,
comparing the models alone); the others' is `F.cross_entropy(label_smoothing=0.1)` on the logits, the
fastest PyTorch form (for fairseq in place of its `label_smoothed_cross_entropy` criterion, which spreads
the 0.1 over the V-1 other tokens instead of all V: a slightly different number). MarianMT is built from a
`MarianConfig` of the same sizes (random initialisation). fairseq's model is
`fairseq.models.transformer.TransformerModel` as `fairseq-train --arch transformer --share-all-embeddings`
builds it, with these sizes and a `Dictionary` of exactly the vocabulary's size (<pad> 0, <s> 1, </s> 2
as for the others), called as its training calls it (`src_tokens, src_lengths, prev_output_tokens`). The
`nn.Transformer` model has the same embeddings, sinusoidal positions and output layer around
`torch.nn.Transformer` (its final stack LayerNorms removed, as post-norm has none).

Timing: after warm-up steps, `--repeats` rounds each time one step of every model, in an order rotated per
round; per model the median step time. Ratios (attnlab's tokens/s over the other's) come with a 95%
bootstrap interval over the rounds (pairs from the same round). Model FLOPs utilisation = the step's
matrix-multiply FLOPs (`attnlab.model.flops.training_flops`: encoder weights × source tokens, decoder and
output weights × target tokens, plus attention, ×3 for forward and backward) per second over the float32
matmul rate measured in this process (a 2048² matmul, timed after every round; the median). Peak memory: each
model's maximum resident set size over 5 steps in a fresh process (`--memory-of`), and in that process the
page faults of a step (the mean of steps 4 and 5, once the heap has grown to what the steps need): pages
the C heap gave back to the system and the next step maps and zeroes again (see `--allocator`).

`--profile`: after the timed rounds, where each model's step time goes (`torch.profiler`, `--profile-rounds`
interleaved rounds of one step per model; self time of each aten op, per step) in groups: the matrix
products (`attnlab.model.flops.MATMUL_OPS`), the fused attention kernels and the fused AdamW, which attnlab,
MarianMT and fairseq run alike on the same shapes (`nn.Transformer`'s attention takes PyTorch's unfused
path: its products count as matrix products, its softmax as other ops); dropout's random numbers; every
other op; and outside any op (Python, autograd, dispatch, the profiler's own overhead and the self time of
Python-level ranges such as the optimizer's step). With it the ceiling: attnlab's speed-up over each other
model if attnlab spent no time at all outside those three shared groups, the most any saving outside the
shared kernels can give: the other model's median step over attnlab's median step times the shared
groups' share of attnlab's profiled steps (the timed medians, not the few profiled steps, whose times vary
more from one step to the next than the models differ).

`--products`: the profiler's split is not to be trusted for memory-bound ops on every machine (on a 2-core
Xeon it put 27 ms on zeroing 16 MB that takes 2 ms alone). Without it: each model's step runs once with its
matrix products (`attnlab.model.flops.MATMUL_OPS`) recorded, operands copied, and in every timed round,
right after the steps, each model's recorded products run alone, in the step's order (the median over the
rounds): steps and products are timed under the same load, which drifts on a shared machine. The copies
are held from before the timed rounds (314 MB for attnlab's `small` step, 773 MB for `base`; the
memory columns come from processes of their own, without them). A step's
products alone are the part of it that no change outside the products can save, "the rest" (step minus
products) all the others' work together: attention kernels, optimizer, dropout, normalisation, Python and
autograd. attnlab's ceiling against another model is that model's median step over attnlab's products alone.

The C heap: `--allocator keep` (the default) sets glibc's malloc as `attnlab-train` does by default
(`attnlab.training.allocator`: freed memory stays in the process instead of being faulted in again every
step), once for the whole process and so for every model alike, and for the memory processes too;
`--allocator system` leaves glibc's own settings.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SIZES = {  # d_model, heads, d_ff, layers per stack, vocabulary, (batch, source length, target length)
    "tiny": (64, 4, 128, 2, 500, (8, 12, 12)),
    "small": (256, 4, 1024, 3, 8000, (32, 32, 32)),
    "base": (512, 8, 2048, 6, 8000, (16, 32, 32)),
}
PAD, EOS, START = 0, 2, 1
FRAMEWORKS = ("attnlab", "marian", "fairseq", "torch")  # every one known, in the table's order
DEFAULT_FRAMEWORKS = ("attnlab", "marian", "torch")
NAMES = {"attnlab": "attnlab", "marian": "MarianMT", "fairseq": "fairseq", "torch": "nn.Transformer"}
MODULES = {  # the package each framework needs, and how to get it
    "marian": ("transformers", "install attnlab's [interop] extra"),
    "fairseq": ("fairseq", "fairseq is no dependency of attnlab: run this script with the python of "
                "fairseq's own virtual environment (docs/benchmarks.md, 'fairseq anchor')"),
}  # fmt: skip


def attnlab_model(size: str) -> Any:
    from attnlab.model.config import TransformerConfig
    from attnlab.model.transformer import Transformer

    d, h, ff, layers, vocab, _ = SIZES[size]
    config = TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, n_heads=h, d_ff=ff, n_encoder_layers=layers,
        n_decoder_layers=layers, dropout=0.1, activation="relu", tie="all", output_bias=False, pad_id=PAD,
        bos_id=START, eos_id=EOS,
    )  # fmt: skip
    return Transformer(config)


def marian_model(size: str) -> Any:
    from transformers import MarianConfig, MarianMTModel

    d, h, ff, layers, vocab, _ = SIZES[size]
    config = MarianConfig(vocab_size=vocab, d_model=d, encoder_layers=layers, decoder_layers=layers,
                          encoder_attention_heads=h, decoder_attention_heads=h, encoder_ffn_dim=ff,
                          decoder_ffn_dim=ff, dropout=0.1, activation_function="relu", scale_embedding=True,
                          pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
                          max_position_embeddings=256)  # fmt: skip
    return MarianMTModel(config)


def fairseq_model(size: str) -> Any:
    """fairseq's `transformer` architecture (`TransformerModel.build_model`, as `fairseq-train --arch
    transformer` builds it) with the other models' sizes and settings."""
    import argparse
    import logging
    import types

    import torch.nn.functional as F

    logging.getLogger("fairseq").setLevel(logging.WARNING)  # its import logs missing optional packages
    from fairseq.data import Dictionary
    from fairseq.models.transformer import TransformerModel

    d, h, ff, layers, vocab, _ = SIZES[size]
    # fairseq's default specials are <s> 0, <pad> 1, </s> 2, <unk> 3: added here in the others' order
    dictionary = Dictionary(add_special_symbols=False)
    dictionary.pad_index = dictionary.add_symbol("<pad>")
    dictionary.bos_index = dictionary.add_symbol("<s>")
    dictionary.eos_index = dictionary.add_symbol("</s>")
    dictionary.unk_index = dictionary.add_symbol("<unk>")
    dictionary.nspecial = len(dictionary)
    for i in range(len(dictionary), vocab):
        dictionary.add_symbol(f"w{i}")
    if (len(dictionary), dictionary.pad(), dictionary.bos(), dictionary.eos()) != (vocab, PAD, START, EOS):
        raise AssertionError(f"fairseq dictionary of {len(dictionary)} symbols, pad {dictionary.pad()}")
    args = argparse.Namespace(
        encoder_embed_dim=d, encoder_attention_heads=h, encoder_ffn_embed_dim=ff, encoder_layers=layers,
        decoder_embed_dim=d, decoder_attention_heads=h, decoder_ffn_embed_dim=ff, decoder_layers=layers,
        encoder_normalize_before=False, decoder_normalize_before=False, activation_fn="relu", dropout=0.1,
        attention_dropout=0.0, activation_dropout=0.0, share_all_embeddings=True, encoder_learned_pos=False,
        decoder_learned_pos=False, layernorm_embedding=False, no_scale_embedding=False,
    )  # fmt: skip
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    model = TransformerModel.build_model(args, task)  # the rest: base_architecture's defaults
    # what the parameter count does not show, as fairseq built it
    stack = [*model.encoder.layers, *model.decoder.layers]
    settings = {
        "ReLU": all(layer.activation_fn is F.relu for layer in stack),
        "post-norm": not any(layer.normalize_before for layer in stack),
        "dropout 0.1": model.encoder.dropout_module.p == model.decoder.dropout_module.p == 0.1,
        "no attention or activation dropout": all(
            layer.self_attn.dropout_module.p == layer.activation_dropout_module.p == 0 for layer in stack
        ),
        "embeddings times sqrt(d_model)": model.encoder.embed_scale == model.decoder.embed_scale == d**0.5,
        "no output bias": model.decoder.output_projection.bias is None,
    }
    if not all(settings.values()):
        raise AssertionError(f"fairseq's model is not the others' arithmetic: {settings}")
    return model


def torch_model(size: str) -> Any:
    import torch
    from torch import nn

    from attnlab.model.positional import sinusoidal_table

    d, h, ff, layers, vocab, _ = SIZES[size]

    class TorchTransformer(nn.Module):
        """Embeddings (shared), sinusoidal positions and a tied output layer around nn.Transformer."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d, padding_idx=PAD)
            self.register_buffer("pe", sinusoidal_table(512, d), persistent=False)
            self.dropout = nn.Dropout(0.1)
            self.core = nn.Transformer(
                d, h, layers, layers, ff, dropout=0.1, activation="relu", batch_first=True
            )
            self.core.encoder.norm = None  # post-norm stacks have no final LayerNorm
            self.core.decoder.norm = None

        def _embed(self, ids: torch.Tensor) -> torch.Tensor:
            return self.dropout(self.embed(ids) * math.sqrt(d) + self.pe[: ids.size(1)])

        def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
            causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), dtype=torch.float32)
            pad = src == PAD
            hidden = self.core(self._embed(src), self._embed(tgt), tgt_mask=causal, tgt_is_causal=True,
                               src_key_padding_mask=pad, memory_key_padding_mask=pad)  # fmt: skip
            return hidden @ self.embed.weight.t()

    return TorchTransformer()


def build(framework: str, size: str) -> Any:
    return {"attnlab": attnlab_model, "marian": marian_model, "fairseq": fairseq_model,
            "torch": torch_model}[framework](size)  # fmt: skip


def trainable(model: Any) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


def make_step(framework: str, model: Any, size: str, loss_of: str = "framework") -> Any:
    """A function running one optimizer step on the fixed batch; `loss_of`: see `--loss`."""
    import torch
    import torch.nn.functional as F

    _, _, _, _, vocab, (batch, src_len, tgt_len) = SIZES[size]
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(3, vocab, (batch, src_len), generator=generator)
    tgt = torch.randint(3, vocab, (batch, tgt_len + 1), generator=generator)
    tgt[:, 0] = START
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    src_lengths = torch.full((batch,), src_len)  # fairseq's encoder takes them (no padding here)
    # fused AdamW for every model: attnlab's training and Hugging Face's Trainer (optim=adamw_torch_fused)
    # both default to it
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    model.train()

    def forward() -> torch.Tensor:
        if framework == "marian":
            return model(input_ids=src, decoder_input_ids=tgt_in).logits
        if framework == "fairseq":  # (logits, extra), as fairseq's criterion gets it
            return model(src, src_lengths, tgt_in)[0]
        return model(src, tgt_in)

    from attnlab.training.loss import output_layer_loss  # imported here, not in the timed step

    def framework_loss() -> torch.Tensor:
        if framework == "attnlab" and loss_of == "framework":  # as TranslationModule computes it
            hidden = model(src, tgt_in, project=False)
            loss_sum, _, n = output_layer_loss(hidden, model.output, tgt_out, epsilon=0.1, ignore_index=PAD)
            return loss_sum / n
        logits = forward()
        return F.cross_entropy(
            logits.reshape(-1, vocab), tgt_out.reshape(-1), label_smoothing=0.1, ignore_index=PAD
        )

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = framework_loss()
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step


# the profile's groups (`--profile`), by aten operator; the first three attnlab, MarianMT and fairseq run
# alike
SHARED = ("matrix products", "attention kernels", "optimizer")
GROUPS = (*SHARED, "dropout randomness", "other ops", "outside ops")


def op_group(name: str) -> str:
    """The profile group of one aten operator (one of `GROUPS` but "outside ops")."""
    from attnlab.model.flops import MATMUL_OPS

    if name in MATMUL_OPS:
        return "matrix products"
    if "scaled_dot_product" in name:  # the fused kernels, forward and backward
        return "attention kernels"
    if name.startswith("aten::_fused_adam"):
        return "optimizer"
    if name in ("aten::bernoulli_", "aten::random_", "aten::uniform_", "aten::native_dropout"):
        return "dropout randomness"
    return "other ops"


def profile_steps(steps: dict[str, Any], rounds: int) -> dict[str, dict[str, float]]:
    """Per model, seconds a step in each of `GROUPS` and in all ("step"), over `rounds` interleaved rounds
    of one profiled step per model."""
    from torch.profiler import ProfilerActivity, profile

    names = list(steps)
    totals = {f: dict.fromkeys(("step", *GROUPS), 0.0) for f in names}
    for r in range(rounds):
        for f in names[r % len(names) :] + names[: r % len(names)]:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                steps[f]()
                wall = time.perf_counter() - start
            totals[f]["step"] += wall
            inside = 0.0
            for event in prof.key_averages():
                if event.key.startswith("aten::"):  # not Python-level ranges (optimizer.step, autograd nodes)
                    seconds = event.self_cpu_time_total / 1e6
                    totals[f][op_group(event.key)] += seconds
                    inside += seconds
            totals[f]["outside ops"] += wall - inside
    return {f: {k: v / rounds for k, v in group.items()} for f, group in totals.items()}


def shared_share(groups: dict[str, float]) -> float:
    """The share of a profiled step spent in the shared kernels (`SHARED`)."""
    return sum(groups[g] for g in SHARED) / groups["step"]


def profile_table(results: list[dict[str, Any]]) -> str:
    """The `--profile` table: each group's share of each model's profiled step, and attnlab's ceiling."""
    lines = [
        "| size | model | profiled step | " + " | ".join(GROUPS) + " | attnlab's ceiling |",
        "|---|---|---|" + "---|" * len(GROUPS) + "---|",
    ]
    for r in results:
        shares = r.get("profile")
        if not shares:
            continue
        # attnlab's step time in the shared kernels: its median step (the timed rounds) × their share of
        # its profiled steps (single profiled steps vary too much to be compared with each other's)
        shared = r["models"]["attnlab"]["median_s"] * shared_share(shares["attnlab"])
        for f, group in shares.items():
            cells = [f"{group[g] * 1000:.0f} ms ({group[g] / group['step']:.1%})" for g in GROUPS]
            ceiling = "" if f == "attnlab" else f"{r['models'][f]['median_s'] / shared:.3f}×"
            step = f"{group['step'] * 1000:.0f} ms"
            lines.append(f"| {r['size']} | {NAMES[f]} | {step} | {' | '.join(cells)} | {ceiling} |")
    return "\n".join(lines) + "\n"


def recorded_products(step: Any) -> list[tuple[Any, list[Any], dict[str, Any]]]:
    """The matrix products (`attnlab.model.flops.MATMUL_OPS`) one call of `step` runs, in order, each with
    copies of its operands (same shapes and strides; operands of one address, shape and strides share a
    copy)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from attnlab.model.flops import MATMUL_OPS

    products: list[tuple[Any, list[Any], dict[str, Any]]] = []
    copies: dict[tuple, Any] = {}

    def copy(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        key = (value.data_ptr(), value.storage_offset(), value.shape, value.stride())
        if key not in copies:
            copies[key] = value.detach().clone()
        return copies[key]

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func._schema.name in MATMUL_OPS:
                products.append((func, [copy(a) for a in args], {k: copy(v) for k, v in kwargs.items()}))
            return func(*args, **kwargs)

    with Recorder():
        step()
    return products


def replay_products(products: list[tuple[Any, list[Any], dict[str, Any]]]) -> float:
    """Seconds `recorded_products`' products take run alone, one after the other as the step ran them."""
    start = time.perf_counter()
    for func, args, kwargs in products:
        func(*args, **kwargs)
    return time.perf_counter() - start


def products_table(results: list[dict[str, Any]]) -> str:
    """The `--products` table: each model's step, its matrix products alone and the rest, and attnlab's
    ceiling against each other model: its step over attnlab's products alone."""
    lines = ["| size | model | step (median) | matrix products alone | the rest | attnlab's ceiling |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        alone = r.get("products")
        if not alone:
            continue
        for f, products in alone.items():
            step = r["models"][f]["median_s"]
            ceiling = "" if f == "attnlab" else f"{step / alone['attnlab']:.3f}×"
            lines.append(f"| {r['size']} | {NAMES[f]} | {step * 1000:.0f} ms | {products * 1000:.0f} ms | "
                         f"{(step - products) * 1000:.0f} ms | {ceiling} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def peak_memory(
    framework: str, size: str, threads: int, loss_of: str, allocator: str
) -> tuple[float, float, float]:
    """(peak resident set, its growth during the steps) in MB of a fresh process that builds the model
    and runs 5 training steps, and the page faults (minor: pages the kernel maps and zeroes) of each of
    the last two steps, on average: memory the C heap handed back and the next step touched again."""
    command = [sys.executable, __file__, "--memory-of", framework, "--sizes", size, "--threads", str(threads),
               "--loss", loss_of, "--allocator", allocator]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    peak, growth, faults = map(float, out.stdout.strip().splitlines()[-1].split())
    return peak, growth, faults


def _status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status, in MB (VmHWM: the peak resident set of
    this process image; ru_maxrss would carry the parent's peak over fork and exec)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":")) / 1024


def interval(pairs: list[tuple[float, float]], seed: int = 0) -> tuple[float, float, float]:
    """Ratio of medians (a/b of step times inverted: b/a is a's speed-up) and its 95% bootstrap interval."""
    rng = random.Random(seed)

    def ratio(sample: list[tuple[float, float]]) -> float:
        return statistics.median(b for _, b in sample) / statistics.median(a for a, _ in sample)

    draws = sorted(ratio([rng.choice(pairs) for _ in pairs]) for _ in range(2000))
    return ratio(pairs), draws[49], draws[1949]


def bench(
    size: str, repeats: int, warmup: int, threads: int, memory: bool, loss_of: str,
    frameworks: tuple[str, ...] = DEFAULT_FRAMEWORKS, allocator: str = "keep", profile_rounds: int = 0,
    products: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """One size's rounds; `allocator` is passed to the memory processes (this one is set by `main`)."""
    import torch

    from attnlab.model.flops import matmul_rate, training_flops

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    models = {f: build(f, size) for f in frameworks}
    counts = {f: trainable(m) for f, m in models.items()}
    if len(set(counts.values())) != 1:
        raise AssertionError(f"different trainable parameter counts, not the same arithmetic: {counts}")
    steps = {f: make_step(f, models[f], size, loss_of) for f in frameworks}
    for f in frameworks:
        for _ in range(warmup):
            steps[f]()
    times: dict[str, list[float]] = {f: [] for f in frameworks}
    # --products: each step's products recorded once, then replayed alone in every round right after the
    # steps, under the load the steps ran under (replayed after all the rounds, they ran under another:
    # two runs on one machine put attnlab's `small` rest at 147 and 41 ms, docs/benchmarks.md)
    recorded = {f: recorded_products(steps[f]) for f in frameworks} if products else {}
    alone: dict[str, list[float]] = {f: [] for f in recorded}
    rates = []  # the matmul rate, measured in every round too: it drifts with the machine's load and clock
    for r in range(repeats):
        order = frameworks[r % len(frameworks) :] + frameworks[: r % len(frameworks)]
        for f in order:
            start = time.perf_counter()
            steps[f]()
            times[f].append(time.perf_counter() - start)
        for f in order if recorded else ():
            alone[f].append(replay_products(recorded[f]))
        rates.append(matmul_rate(repeats=3))
    _, _, _, _, _, (batch, src_len, tgt_len) = SIZES[size]
    flops = training_flops(models["attnlab"].config, batch, src_len, tgt_len)
    peak = statistics.median(rates)
    tokens = batch * tgt_len
    result: dict[str, Any] = {"size": size, "params": counts["attnlab"], "batch": [batch, src_len, tgt_len],
                              "matmul_gflops": peak / 1e9, "step_flops": flops, "models": {}}  # fmt: skip
    for f in frameworks:
        median = statistics.median(times[f])
        result["models"][f] = {
            "median_s": median, "tokens_per_s": tokens / median, "mfu": flops / median / peak,
            "peak_rss_mb": None,
        }  # fmt: skip
        if memory:
            rss, growth, faults = peak_memory(f, size, threads, loss_of, allocator)
            result["models"][f].update(peak_rss_mb=[rss, growth], page_faults_per_step=faults)
    for other in frameworks[1:]:
        result[f"speedup_vs_{other}"] = interval(list(zip(times["attnlab"], times[other], strict=True)))
    if profile_rounds:
        result["profile"] = profile_steps(steps, profile_rounds)
    if recorded:
        result["products"] = {f: statistics.median(t) for f, t in alone.items()}
    return result


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| size | model | params | step (median) | target tokens/s | MFU | peak RSS (+ in the steps) "
        "| attnlab speed-up [95% CI] | page faults a step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for f, m in r["models"].items():
            rss = (
                ""
                if m["peak_rss_mb"] is None
                else f"{m['peak_rss_mb'][0]:.0f} MB (+{m['peak_rss_mb'][1]:.0f} MB)"
            )
            speedup = ""
            if f != "attnlab":
                ratio, low, high = r[f"speedup_vs_{f}"]
                speedup = f"{ratio:.3f}× [{low:.3f}, {high:.3f}]"
            faults = "" if m.get("page_faults_per_step") is None else f"{m['page_faults_per_step']:,.0f}"
            name = NAMES[f]
            step = f"{m['median_s'] * 1000:.0f} ms"
            lines.append(f"| {r['size']} | {name} | {r['params'] / 1e6:.1f}M | {step} | "
                         f"{m['tokens_per_s']:,.0f} | {m['mfu']:.1%} | {rss} | {speedup} | "
                         f"{faults} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def frameworks_of(parser: argparse.ArgumentParser, names: list[str], compared: bool) -> tuple[str, ...]:
    """`--frameworks` checked, in the table's order: each once, each importable here and, when `compared`
    (not one model's memory process), attnlab among them."""
    import importlib.util

    if len(set(names)) != len(names):
        parser.error(f"--frameworks {' '.join(names)}: each framework once")
    if compared and "attnlab" not in names:
        parser.error(f"--frameworks {' '.join(names)}: add attnlab (every speed-up is attnlab's)")
    for f in names:
        if f in MODULES and importlib.util.find_spec(MODULES[f][0]) is None:
            module, fix = MODULES[f]
            parser.error(f"--frameworks {f}: {module} cannot be imported by {sys.executable}. {fix}, "
                         f"or leave {f} out")  # fmt: skip
    return tuple(f for f in FRAMEWORKS if f in names)


def arguments() -> argparse.ArgumentParser:
    """The command line's options (the module docstring says what each measures)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["small", "base"], choices=list(SIZES))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="also write the table (and the raw numbers as JSON beside it)")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-model memory processes")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 2 repeats: checks the harness")
    parser.add_argument(
        "--loss",
        choices=["framework", "logits"],
        default="framework",
        help="framework: attnlab's loss fused with its output layer, as its training runs "
        "it; "
        "logits: F.cross_entropy on the logits for attnlab too (the models alone compared)",
    )
    parser.add_argument(
        "--frameworks",
        nargs="+",
        choices=FRAMEWORKS,
        default=list(DEFAULT_FRAMEWORKS),
        help="the models compared, attnlab among them (default: attnlab marian torch; fairseq when named)",
    )
    parser.add_argument(
        "--allocator",
        choices=["keep", "system"],
        default="keep",
        help="glibc's malloc settings for the whole process, so for every model of the run: keep (what "
        "attnlab-train sets by default: freed memory stays for the next step) or system (glibc's own)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also where each step's time goes, by op group, and attnlab's ceiling (module docstring)",
    )
    parser.add_argument("--profile-rounds", type=int, default=5, help="profiled rounds with --profile")
    parser.add_argument(
        "--products",
        action="store_true",
        help="also each step's matrix products timed alone, and attnlab's ceiling (module docstring)",
    )
    parser.add_argument("--memory-of", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = arguments()
    args = parser.parse_args(argv)
    from attnlab.training.allocator import configure_allocator  # torch-free

    configure_allocator(args.allocator)
    frameworks = frameworks_of(parser, [args.memory_of] if args.memory_of else args.frameworks,
                               compared=not args.memory_of)  # fmt: skip
    if args.memory_of:
        import torch

        torch.set_num_threads(args.threads)
        step = make_step(args.memory_of, build(args.memory_of, args.sizes[0]), args.sizes[0], args.loss)
        import resource

        before = _status_mb("VmRSS")  # imports, model, optimizer and batch in place
        for _ in range(3):  # the heap grows to what the steps need
            step()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(2):
            step()
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 2
        print(_status_mb("VmHWM"), _status_mb("VmHWM") - before, faults)
        return
    if args.quick:
        args.sizes, args.repeats, args.warmup = ["tiny"], 2, 1
    memory = not args.no_memory
    if args.profile_rounds < 1:
        parser.error(f"--profile-rounds {args.profile_rounds}: give at least 1")
    profile_rounds = args.profile_rounds if args.profile else 0
    results = [bench(size, args.repeats, args.warmup, args.threads, memory, args.loss, frameworks,
                     args.allocator, profile_rounds, args.products)
               for size in args.sizes]  # fmt: skip
    text = table(results)
    if args.profile:
        text += "\n" + profile_table(results)
    if args.products:
        text += "\n" + products_table(results)
    rates = ", ".join(f"{r['size']} {r['matmul_gflops']:.1f}" for r in results)
    print(
        f"float32 matmul rate measured here (median over the rounds): {rates} GFLOP/s, {args.threads} threads"
    )
    print(text)
    if args.out:  # the table and its raw numbers together: an interrupted write leaves both as they were
        from attnlab.io import atomic_write_files

        atomic_write_files({
            Path(args.out): text.encode("utf-8"),
            Path(args.out + ".json"): json.dumps(results, indent=1).encode("utf-8"),
        })  # fmt: skip


if __name__ == "__main__":
    main()
