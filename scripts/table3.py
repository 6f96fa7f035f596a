"""Run rows of Table 3 (Vaswani et al., 2017), scaled to the Multi30k CPU recipe, over several seeds.

Usage:
    python scripts/table3.py --rows A E --seeds 3 [--base experiment=multi30k_small]
        [--sweep-dir logs/sweeps/table3] [--dry-run] [-- extra overrides ...]

Each row is a set of variants in `conf/experiment/table3/` (A: heads at constant compute, B: smaller
key size, C: layers / d_model / d_ff, D: dropout and label smoothing, E: positional encoding); the
baseline (`base`, the recipe unchanged) always runs too. This builds and runs one Hydra multirun,
    attnlab-train -m <base> +experiment/table3=base,A1,...  seed=1,...,N hydra.sweep.dir=<dir>
with `sweep.skip_done=true resume=auto`, so running it again resumes an interrupted sweep: finished jobs
are skipped, interrupted ones continued from their last.ckpt (without `resume=auto` they were recorded as
failed). `--dry-run` prints the command instead of running it. For a quick look on the synthetic task:
`--base experiment=synthetic_pe`.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

VARIANTS = Path(__file__).resolve().parents[1] / "conf" / "experiment" / "table3"
ROWS = "ABCDE"


def variants(rows: list[str]) -> list[str]:
    """`base` plus every variant file of `rows`, in order (`A1, A2, ...`)."""
    names = ["base"]
    for row in rows:
        found = sorted(p.stem for p in VARIANTS.glob(f"{row}[0-9]*.yaml"))
        if not found:
            raise SystemExit(f"table3.py: no variants for row {row!r} in {VARIANTS}")
        names += found
    return names


def command(rows: list[str], seeds: int, base: str, sweep_dir: str, extra: list[str]) -> list[str]:
    """The `attnlab-train -m ...` command line of a Table 3 sweep: run again, it skips the finished jobs
    and continues the interrupted ones from their last.ckpt."""
    seed_list = ",".join(str(s) for s in range(1, seeds + 1))
    chosen = ",".join(variants(rows))
    return ["attnlab-train", "-m", base, f"+experiment/table3={chosen}", f"seed={seed_list}",
            f"hydra.sweep.dir={sweep_dir}", "sweep.skip_done=true", "resume=auto", *extra]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--base", default="experiment=multi30k_small")
    parser.add_argument("--sweep-dir", default="logs/sweeps/table3")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("extra", nargs="*", help="more Hydra overrides (after --)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        raise SystemExit(f"table3.py: --seeds={args.seeds} must be >= 1")
    line = command(args.rows, args.seeds, args.base, args.sweep_dir, args.extra)
    if args.dry_run:
        print(shlex.join(line))
        return
    sys.exit(subprocess.run(line, check=False).returncode)


if __name__ == "__main__":
    main()
