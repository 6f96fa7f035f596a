"""The checks that need a CUDA GPU, in one run that ends with one JSON summary and one Markdown table.

Usage (from anywhere; `scripts/gpu_check.sh` is the same command):

    python scripts/gpu_check.py [--device cuda|cpu] [--data DIR] [--wheels DIR] [--out DIR]
        [--skip tests,train,ddp,decode]

    --device cpu  the dry run: every check on the CPU with small stand-ins (a tiny model on synthetic data,
                  float32, torch.compile with the `eager` backend, two gloo processes for DDP, the decoding
                  harness on a few sentences), so that everything up to the first CUDA call has run before
                  a GPU is spent on it (tests/integration/test_gpu_check.py runs it)
    --data DIR    the Multi30k files (default: ../shared/data/multi30k beside the repository)
    --wheels DIR  install the missing Python packages (hydra-core, omegaconf, wandb, ...) and what they
                  require from the wheels in DIR, without an index; the project itself is imported from
                  this checkout's `src/`, never installed
    --out DIR     where the logs, `summary.json` and `summary.md` go (default: $OUT, else
                  /tmp/attnlab-gpu-check)

    python scripts/gpu_check.py --download-wheels DIR [--python-version 3.12] [DIST ...]

    on a machine with an index, fetches for the GPU machine's Python the wheels of DIST (default: what a
    GPU image holding torch, lightning, torchmetrics, sacrebleu and tokenizers lacks: hydra-core, omegaconf,
    wandb, sacremoses) and of everything they require (about 30 MB)

Before any check it fails fast (exit status 2, one line saying what is missing and how to get it) when a
Python package is missing, when `--device cuda` finds no CUDA device or one without bf16, or when the data
directory lacks a Multi30k file. Then, each check in its own process with its own time limit (the whole
run stays under 8 minutes on one H100/H200-class GPU):

1. `tests`: the tests marked `gpu` (on the CPU: they are collected, and skipped);
2. `train`: `model=base` trained 60 optimizer steps on Multi30k in bf16-mixed, without and with
   torch.compile (`scripts/bench_gpu_train.py`): target tokens/s, model FLOPs utilisation against a bf16
   matmul rate measured on the same GPU, the compile speed-up;
3. `ddp`: with more than one device, a 1-device run with gradient accumulation over N and a DDP run over N
   devices, whose mean training loss over the last 10 steps must agree within 5% (skipped on one GPU;
   on the CPU: 2 gloo processes against 1 process with accumulation 2);
4. `decode`: greedy and beam-5 sentences/s at batch 64 (`scripts/bench_decode.py`).

Exit status: 0 when every check passed or was skipped, 1 when one failed, 2 when a precondition failed.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# module -> distribution: what the project imports at run time that a bare GPU image may lack.
REQUIRED = {
    "torch": "torch",
    "lightning": "lightning",
    "torchmetrics": "torchmetrics",
    "hydra": "hydra-core",
    "omegaconf": "omegaconf",
    "sacrebleu": "sacrebleu",
    "sacremoses": "sacremoses",
    "tokenizers": "tokenizers",
    "wandb": "wandb",
    "numpy": "numpy",
    "PIL": "pillow",
    "matplotlib": "matplotlib",
    "pytest": "pytest",
}
# What a GPU image with torch, lightning, torchmetrics, sacrebleu and tokenizers lacks (--download-wheels).
GPU_IMAGE_LACKS = ["hydra-core==1.3.2", "omegaconf==2.3.0", "wandb", "sacremoses"]
ANTLR = "antlr4-python3-runtime==4.9.3"  # omegaconf 2.3's parser runtime
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
]
MULTI30K = ("train.de", "train.en", "val.de", "val.en", "test2016.de", "test2016.en")
# Each check's own time limit: together 8 minutes, the whole run's budget on one GPU.
LIMITS_S = {"tests": 90, "train": 210, "ddp": 90, "decode": 90}


def limit_s(check: str, device: str) -> int:
    """A check's time limit: its share of the 8 minutes on a GPU; four times that for the CPU dry run
    (2 CPU cores run the stand-ins slower than a GPU runs the real checks)."""
    return LIMITS_S[check] * (4 if device == "cpu" else 1)


class Precondition(Exception):
    """Something the checks cannot run without; its message says what and how to get it."""


@dataclass
class Check:
    name: str
    status: str = "skipped"  # passed, failed or skipped
    seconds: float = 0.0
    detail: str = ""
    values: dict[str, Any] = field(default_factory=dict)


def missing_modules(modules: dict[str, str]) -> list[str]:
    """The distributions of `modules` (module -> distribution) that cannot be imported here."""
    return [dist for module, dist in modules.items() if importlib.util.find_spec(module) is None]


def ensure_packages(wheels: Path | None, modules: dict[str, str] = REQUIRED) -> None:
    """Install what is missing from `wheels` (no index), or raise `Precondition` naming it."""
    missing = missing_modules(modules)
    if missing and wheels is not None:
        if not wheels.is_dir():
            raise Precondition(f"--wheels {wheels}: no such directory")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                        "--find-links", str(wheels), *missing], check=False)  # fmt: skip
        importlib.invalidate_caches()
        missing = missing_modules(modules)
    if missing:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        where = f"the wheels in {wheels}" if wheels else "this Python"
        raise Precondition(
            f"missing Python packages in {where}: {', '.join(missing)}. On a machine with an index: "
            f"python scripts/gpu_check.py --download-wheels WHEELS --python-version {version} "
            f"{' '.join(missing)}, then pass --wheels WHEELS here"
        )


def download_wheels(dest: Path, python_version: str, dists: list[str]) -> None:
    """Fetch `dists` and everything they require as wheels for CPython `python_version` on x86-64 Linux
    into `dest` (run where an index is reachable). antlr4-python3-runtime, which omegaconf pins, is only
    published as source: it is built into a wheel here first (pure Python, any platform)."""
    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "-w", str(dest), ANTLR], check=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([*pip, "download", "--quiet", "--only-binary=:all:", "--python-version", python_version,
                    "--implementation", "cp", *platforms, "--find-links", str(dest), "-d", str(dest),
                    *dists], check=True)  # fmt: skip


def check_device(device: str) -> dict[str, Any]:
    """The device's description; `Precondition` when `--device cuda` cannot run bf16 on CUDA."""
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "device": device}
    if device == "cpu":
        info.update(name=f"CPU ({os.cpu_count()} cores)", count=2)  # 2 gloo processes stand in for GPUs
        return info
    if not torch.cuda.is_available():
        raise Precondition(
            f"CUDA is not available to torch {torch.__version__} (built for CUDA {torch.version.cuda}): "
            "check nvidia-smi and that a CUDA build of torch is installed (the dry run: --device cpu)"
        )
    if not torch.cuda.is_bf16_supported():
        raise Precondition(f"{torch.cuda.get_device_name()} does not support bf16, which the checks measure")
    info.update(name=torch.cuda.get_device_name(), count=torch.cuda.device_count(), cuda=torch.version.cuda)
    return info


def check_data(data: Path) -> None:
    missing = [name for name in MULTI30K if not (data / name).is_file()]
    if missing:
        raise Precondition(
            f"--data {data}: missing {', '.join(missing)} (a Multi30k directory, see README Data)"
        )


def run(command: list[str], log: Path, limit_s: int, env: dict[str, str]) -> tuple[bool, str]:
    """Run `command` into `log`; (succeeded, the log's last line or why it stopped)."""
    with open(log, "w") as out:
        try:
            proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=limit_s)
        except subprocess.TimeoutExpired:
            return False, f"stopped at its {limit_s} s limit (see {log.name})"
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    return proc.returncode == 0, last if proc.returncode == 0 else f"exit {proc.returncode}: {last[:200]}"


def timed(check: Check, body) -> Check:
    started = time.perf_counter()
    try:
        body(check)
    except Exception as error:  # one check's failure must not cost the others
        check.status, check.detail = "failed", f"{type(error).__name__}: {error}"
    check.seconds = round(time.perf_counter() - started, 1)
    return check


def pytest_counts(summary: str) -> dict[str, int]:
    """pytest's last line ("1 passed, 2 skipped, 9 deselected in 3.1s") as counts by outcome."""
    found = re.findall(r"(\d+) (passed|failed|skipped|deselected|error)s?\b", summary)
    return {kind: int(n) for n, kind in found}


def gpu_tests(check: Check, out: Path, env: dict[str, str], device: str) -> None:
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-p", "no:nbmake",
               "-o", "addopts=", str(REPO / "tests")]  # fmt: skip
    ok, last = run(command, out / "gpu_tests.txt", limit_s("tests", device), env)
    check.values = counts = pytest_counts(last)
    if device == "cpu":  # collected and skipped without CUDA: the dry run checks that they are there
        ok = ok and counts.get("skipped", 0) > 0 and not (counts.get("failed") or counts.get("error"))
    else:
        ok = ok and counts.get("passed", 0) > 0 and not (counts.keys() & {"skipped", "failed", "error"})
    check.status, check.detail = ("passed" if ok else "failed"), last


def train_bench(check: Check, out: Path, env: dict[str, str], device: str, data: Path) -> None:
    record = out / "train.json"
    if device == "cpu":
        args = ["--quick", "--compile", "both", "--compile-backend", "eager"]
    else:
        args = ["--root", str(data), "--model", "base", "--steps", "60", "--warmup", "15",
                "--compile", "both", "--precision", "bf16-mixed", "--device", "cuda"]  # fmt: skip
    command = [sys.executable, str(REPO / "scripts" / "bench_gpu_train.py"), *args, "--json", str(record)]
    ok, last = run(command, out / "train.txt", limit_s("train", device), env)
    if not ok:
        check.status, check.detail = "failed", last
        return
    result = json.loads(record.read_text())
    eager, compiled = result["eager"], result["compiled"]
    check.values = {
        "precision": result["precision"], "model": result["model"],
        "peak_matmul_tflops": result["peak_matmul_flops_per_s"] / 1e12,
        "tokens_per_s": eager["tokens_per_s"], "mfu": eager["mfu"],
        "compiled_tokens_per_s": compiled["tokens_per_s"], "compiled_mfu": compiled["mfu"],
        "compile_speedup": result["compile_speedup"],
        "final_loss": eager["final_loss"], "compiled_final_loss": compiled["final_loss"],
    }  # fmt: skip
    check.status = "passed"


def mean_last_losses(run_dir: Path, n: int = 10) -> float:
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        losses = [float(r["train/loss_step"]) for r in csv.DictReader(f) if r.get("train/loss_step")]
    if len(losses) < n:
        raise ValueError(f"{run_dir}: {len(losses)} logged training losses, fewer than {n}")
    return sum(losses[-n:]) / n


def losses_agree(one: float, many: float, tolerance: float = 0.05) -> bool:
    """The 1-device and the DDP run's mean losses are within `tolerance` of each other (relative)."""
    return abs(one - many) / one < tolerance


def ddp_runs(device: str, devices: int, data: Path) -> tuple[int, dict[str, list[str]]]:
    """The number of ranks and the `attnlab-train` overrides of the 1-device run ("one", accumulating as
    many batches as there are ranks) and of the DDP run ("ddp")."""
    if device == "cpu":
        common = ["data=synthetic", "model=tiny", "data.n_train=512", "data.batch_size=16",
                  "+trainer.max_steps=30"]  # fmt: skip
        single, multi, n = ["trainer=cpu"], ["trainer=ddp_cpu", "trainer.devices=2"], 2
    else:
        common = [f"data.root={data}", "model=base", "+trainer.max_steps=40"]
        single, multi, n = ["trainer=gpu"], ["trainer=ddp", f"trainer.devices={devices}"], devices
    common += ["trainer.max_epochs=-1", "optim=linear", "optim.total_steps=1000",
               "trainer.log_every_n_steps=1", "test=false", "logger=csv", "seed=1",
               "trainer.enable_progress_bar=false", "+trainer.limit_val_batches=0"]  # fmt: skip
    return n, {"one": [*common, *single, f"trainer.accumulate_grad_batches={n}"], "ddp": [*common, *multi]}


def ddp_check(check: Check, out: Path, env: dict[str, str], device: str, devices: int, data: Path) -> None:
    if device != "cpu" and devices < 2:
        check.detail = "one GPU"
        return
    n, runs = ddp_runs(device, devices, data)
    for name, overrides in runs.items():
        command = [sys.executable, "-m", "attnlab.cli.train", *overrides, f"hydra.run.dir={out / name}"]
        ok, last = run(command, out / f"{name}.txt", limit_s("ddp", device) // 2, env)
        if not ok:
            check.status, check.detail = "failed", f"{name}: {last}"
            return
    one, many = mean_last_losses(out / "one"), mean_last_losses(out / "ddp")
    agree = losses_agree(one, many)
    check.values = {"devices": n, "one_device_loss": one, "ddp_loss": many, "agree": agree}
    check.status = "passed" if agree else "failed"
    check.detail = f"1 device × accumulation {n}: {one:.3f}, DDP over {n}: {many:.3f}"


def decode_bench(check: Check, out: Path, env: dict[str, str], device: str, data: Path) -> None:
    record = out / "decode.json"
    args = ["--quick"] if device == "cpu" else ["--batch-sizes", "64", "--sweep-sentences", "200"]
    command = [sys.executable, str(REPO / "scripts" / "bench_decode.py"), "--root", str(data),
               "--device", device, *args, "--json", str(record)]  # fmt: skip
    ok, last = run(command, out / "decode.txt", limit_s("decode", device), env)
    if not ok:
        check.status, check.detail = "failed", last
        return
    result = json.loads(record.read_text())
    batch = max(row["batch"] for row in result["sweep"])
    for row in result["sweep"]:
        if row["batch"] == batch and row["cache"]:
            check.values[f"{row['search'].replace(' ', '')}_sentences_per_s"] = row["sentences_per_s"]
    check.values.update(batch=batch, test2016_beam5_sentences_per_s=result["test2016"]["sentences_per_s"])
    check.status = "passed"


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file renamed over it: never a half-written summary
    (this script imports nothing of attnlab before its checks, so not `attnlab.io`)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def table(device: dict[str, Any], checks: list[Check], seconds: float) -> str:
    lines = [f"## attnlab GPU check: {device['name']}, torch {device['torch']}, {seconds:.0f} s", "",
             "| check | status | result | seconds |", "|---|---|---|---|"]  # fmt: skip
    for c in checks:
        shown = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in c.values.items())
        text = "; ".join(part for part in (shown, c.detail) if part).replace("|", "/")
        lines.append(f"| {c.name} | {c.status} | {text[:300]} | {c.seconds:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--wheels", type=Path)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp/attnlab-gpu-check"))
    parser.add_argument(
        "--skip", default="", help="comma-separated checks not to run: tests,train,ddp,decode"
    )
    parser.add_argument(
        "--download-wheels",
        type=Path,
        metavar="DIR",
        help="instead: fetch the wheels the GPU machine lacks into DIR",
    )
    parser.add_argument("--python-version", default="3.12", help="with --download-wheels: the GPU's Python")
    parser.add_argument("dists", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.download_wheels:
        download_wheels(args.download_wheels, args.python_version, args.dists or GPU_IMAGE_LACKS)
        where = args.download_wheels
        print(f"gpu_check: wheels in {where}; on the GPU machine: scripts/gpu_check.py --wheels {where}")
        return 0
    if args.dists:
        parser.error(f"unexpected arguments {' '.join(args.dists)} (package names go with --download-wheels)")
    skip = {s for s in args.skip.split(",") if s}
    unknown = skip - set(LIMITS_S)
    if unknown:
        parser.error(f"--skip {','.join(sorted(unknown))}: unknown (the checks are {', '.join(LIMITS_S)})")
    started = time.perf_counter()
    try:
        ensure_packages(args.wheels)
        device = check_device(args.device)
        check_data(args.data)
    except Precondition as error:
        print(f"gpu_check: {error}", file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    paths = [str(REPO / "src"), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]  # this checkout's code
    env = {**os.environ, "WANDB_MODE": "disabled", "ATTNLAB_LOG_DIR": str(out / "logs"),
           "ATTNLAB_CACHE_DIR": str(out / "cache"), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(paths)}  # fmt: skip
    bodies = {
        "tests": lambda c: gpu_tests(c, out, env, args.device),
        "train": lambda c: train_bench(c, out, env, args.device, args.data),
        "ddp": lambda c: ddp_check(c, out, env, args.device, device["count"], args.data),
        "decode": lambda c: decode_bench(c, out, env, args.device, args.data),
    }
    checks = []
    for name, body in bodies.items():
        check = Check(name, detail="--skip") if name in skip else timed(Check(name), body)
        print(f"gpu_check: {name} {check.status} ({check.seconds:.0f} s) {check.detail[:200]}", flush=True)
        checks.append(check)
    seconds = time.perf_counter() - started
    summary = {"device": device, "seconds": round(seconds, 1), "checks": [asdict(c) for c in checks]}
    write_whole(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    markdown = table(device, checks, seconds)
    write_whole(out / "summary.md", markdown)
    print("\n" + markdown)
    return 1 if any(c.status == "failed" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
