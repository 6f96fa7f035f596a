"""Training throughput and model FLOPs utilisation (MFU) on one device, with and without torch.compile.

Usage:
    python scripts/bench_gpu_train.py --root ../shared/data/multi30k [--model base] [--steps 60]
        [--warmup 15] [--compile both|on|off] [--compile-backend inductor] [--precision bf16-mixed]
        [--device cuda] [--json FILE]
    python scripts/bench_gpu_train.py --quick   # CPU smoke test of the harness (tiny model, synthetic data)

Trains `model=<model>` on Multi30k batches for a fixed number of optimizer steps with Lightning (the same
TranslationModule and data module as attnlab-train), times the steps after `--warmup` (compilation
happens there), and reports non-padding target tokens per second and MFU: the model's matrix-multiply
FLOPs (`attnlab.model.flops.training_flops` of each padded batch) per second over the peak matmul rate of the
same device and precision, measured here with one large matmul. Prints one Markdown table (and with
`--json FILE` writes the same numbers, plus the compiled/eager tokens/s ratio, to FILE).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from attnlab.cli.app import config_dir, register_resolvers

    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(config_dir()), job_name="bench"):
        return hydra_compose("train", overrides=overrides)


def measure(
    overrides: list[str],
    steps: int,
    warmup: int,
    precision: str,
    device: str,
    compiled: bool,
    backend: str = "inductor",
) -> dict:
    """Train `steps` optimizer steps; tokens/s and FLOP/s over the steps after `warmup`."""
    import lightning as L
    import torch

    from attnlab.model.flops import training_flops
    from attnlab.training.experiment import validate
    from attnlab.training.module import TranslationModule
    from attnlab.training.pipeline import compile_model

    cfg = compose(overrides)
    experiment = validate(cfg)
    datamodule = experiment.data.datamodule()
    datamodule.setup("fit")
    model = experiment.model.with_vocab(datamodule.src_vocab_size, datamodule.tgt_vocab_size)
    module = TranslationModule(model=model, optim=experiment.optim, decode=experiment.decode)
    if compiled:
        compile_model(module.model, {"enabled": True, "backend": backend, "dynamic": True})

    class Timer(L.Callback):
        def __init__(self) -> None:
            self.tokens = self.flops = 0
            self.start: float | None = None
            self.losses: list[float] = []

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step == warmup:
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                self.start = time.perf_counter()
            if trainer.global_step >= warmup:
                self.tokens += int((batch["tgt_out"] != model.pad_id).sum())
                b, s = batch["src"].shape
                self.flops += training_flops(model, b, s, batch["tgt_in"].shape[1])

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
            self.losses.append(float(trainer.callback_metrics["train/loss_step"]))  # mean per token

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            self.seconds = time.perf_counter() - (self.start or time.perf_counter())

    timer = Timer()
    trainer = L.Trainer(
        accelerator="gpu" if device.startswith("cuda") else "cpu", devices=1, precision=precision,
        max_steps=steps, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, callbacks=[timer],
        use_distributed_sampler=False, gradient_clip_val=cfg.trainer.get("gradient_clip_val"),
    )  # fmt: skip
    trainer.fit(module, datamodule=datamodule)
    seconds = max(timer.seconds, 1e-9)
    return {"tokens_per_s": timer.tokens / seconds, "flops_per_s": timer.flops / seconds,
            "seconds": seconds, "final_loss": timer.losses[-1]}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="Multi30k directory (data.root)")
    parser.add_argument("--model", default="base")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--compile", choices=["both", "on", "off"], help="default: both (--quick: off)")
    parser.add_argument("--compile-backend", default="inductor", help="eager: tracing only")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--quick", action="store_true", help="CPU smoke test: tiny model, synthetic data")
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    import torch

    from attnlab.model.flops import matmul_rate

    if args.quick:
        overrides = ["data=synthetic", "model=tiny", "data.n_train=256", "data.batch_size=32", "seed=1"]
        args.steps, args.warmup, args.precision, args.device = 6, 2, "32-true", "cpu"
        args.compile = args.compile or "off"
    else:
        if not args.root:
            parser.error("--root is required (or --quick)")
        overrides = [f"data.root={args.root}", f"model={args.model}", f"data.max_tokens={args.max_tokens}",
                     "optim=linear", "optim.total_steps=100000", "seed=1"]  # fmt: skip
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(args.precision, torch.float32)
    peak = matmul_rate(args.device, dtype, size=1024 if args.quick else 8192, repeats=3 if args.quick else 20)
    modes = {"both": [False, True], "on": [True], "off": [False]}[args.compile or "both"]
    rows = []
    for compiled in modes:
        result = measure(
            overrides, args.steps, args.warmup, args.precision, args.device, compiled, args.compile_backend
        )
        rows.append((compiled, result))
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    model = "tiny" if args.quick else args.model
    print(f"\n{name}, {args.precision}, model={model}, {args.steps} steps ({args.warmup} warm-up), "
          f"peak {dtype} matmul {peak / 1e12:.1f} TFLOP/s")  # fmt: skip
    print("| compile | target tokens/s | model TFLOP/s | MFU | final loss |")
    print("|---|---|---|---|---|")
    for compiled, r in rows:
        mfu = r["flops_per_s"] / peak
        print(f"| {'on' if compiled else 'off'} | {r['tokens_per_s']:,.0f} | {r['flops_per_s'] / 1e12:.2f} | "
              f"{mfu:.1%} | {r['final_loss']:.3f} |")  # fmt: skip
    if args.json:
        runs = {("compiled" if c else "eager"): {**r, "mfu": r["flops_per_s"] / peak} for c, r in rows}
        if len(runs) == 2:
            runs["compile_speedup"] = runs["compiled"]["tokens_per_s"] / runs["eager"]["tokens_per_s"]
        record = {"device": name, "precision": args.precision, "model": model, "steps": args.steps,
                  "warmup": args.warmup, "compile_backend": args.compile_backend,
                  "peak_matmul_flops_per_s": peak, **runs}  # fmt: skip
        from attnlab.io import atomic_write_bytes

        atomic_write_bytes(Path(args.json), (json.dumps(record, indent=1) + "\n").encode("utf-8"))


if __name__ == "__main__":
    main()
