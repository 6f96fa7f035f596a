"""`attnlab-compare`: compare runs across seeds (see `attnlab.reports.compare`).

Usage:
    attnlab-compare logs/sweeps/pe [more run or sweep directories] [--baseline 'model.pe=sinusoidal']
                    [--format md|csv|latex] [--out table.md] [--plots plots/]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    parser = argparse.ArgumentParser(prog="attnlab-compare", description=__doc__.splitlines()[0])
    parser.add_argument(
        "paths", nargs="+", help="run directories, sweep directories, or directories above them"
    )
    parser.add_argument("--baseline", help="the group the others are compared with (default: the first)")
    parser.add_argument("--format", choices=["md", "csv", "latex"], default="md")
    parser.add_argument("--out", help="write the table to this file instead of stdout")
    parser.add_argument("--plots", help="also save PNG plots (BLEU per group, validation curves, BLEU vs "
                        "parameters) into this directory")  # fmt: skip
    args = parser.parse_args(argv)
    from attnlab.reports.compare import report

    try:
        text = report(args.paths, baseline=args.baseline, fmt=args.format, plots=args.plots)
    except (OSError, ValueError) as exc:  # no runs there, a bad --baseline, a plot that cannot be written
        raise SystemExit(f"attnlab-compare: {exc}") from None
    if args.out:
        from attnlab.io import atomic_write_bytes

        try:  # a temporary file renamed over --out once complete: a failed write leaves the old file
            atomic_write_bytes(Path(args.out), text.encode("utf-8"))
        except OSError as exc:
            raise SystemExit(
                f"attnlab-compare: cannot write --out {args.out}: {exc.strerror or exc}; a file there before "
                "is unchanged. Free disk space or choose another --out"
            ) from None
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
