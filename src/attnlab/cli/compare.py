"""`attnlab-compare`: compare runs across seeds (mean ± std, 95% intervals, Δ and paired-bootstrap p-values
against a baseline group, plots).

`report` here; the API: `attnlab.reports.compare`, the plots: `attnlab.reports.plots`.

Usage:
    attnlab-compare logs/sweeps/pe [more run or sweep directories] [--baseline 'model.pe=sinusoidal']
                    [--format md|csv|latex] [--out table.md] [--plots plots/] [--by-length]
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from attnlab.data.text import one_line
from attnlab.io import atomic_write_bytes
from attnlab.reports.compare import (
    UNREADABLE,
    by_length,
    load_runs,
    main_metric,
    markdown_text,
    render,
    run_dir_of,
    summarize,
    table_rows,
)
from attnlab.reports.plots import plot_comparison
from attnlab.runs.layout import CONFIG_FILE, MANIFEST_FILE

log = logging.getLogger(__name__)


def report(
    paths: Sequence[str | Path],
    baseline: str | None = None,
    fmt: str = "md",
    plots: str | Path | None = None,
    lengths: bool = False,
) -> str:
    """The comparison table of the runs under `paths`, then the runs that did not finish; with `plots`,
    the plots of `attnlab.reports.plots.plot_comparison` are written into that directory. With `lengths`,
    a table of BLEU by sentence length per test set follows the main table (`by_length`; with `plots`,
    its plots too)."""
    runs = load_runs(paths)
    if not runs:
        raise FileNotFoundError(
            f"no run directories ({CONFIG_FILE}, {MANIFEST_FILE}) under {', '.join(map(str, paths))}"
        )
    groups, others = summarize(runs, baseline)
    unreadable = [r for r in others if r.status == UNREADABLE]
    others = [r for r in others if r.status != UNREADABLE]
    if not groups and fmt != "md":  # no table to write as CSV or LaTeX
        listed = "; ".join(f"{r.path} ({r.status})" for r in [*others, *unreadable])
        raise ValueError(f"no finished runs to tabulate under {', '.join(map(str, paths))}: {listed}")
    metric, columns = main_metric(groups)
    text = render(table_rows(groups, columns), fmt) if groups else "no finished runs\n"
    tables = by_length(groups) if lengths and groups else []
    for table in tables:
        title = one_line(f"BLEU on {table.test_set} by {table.by} length (words)")  # (a file's name)
        titled = {"md": f"\n{markdown_text(title)}:\n\n", "csv": f"\n{title}\n", "latex": f"\n% {title}\n"}
        text += titled[fmt]
        text += render(table.rows(), fmt)
    if others and fmt == "md":  # (paths and errors as text: `markdown_text`)
        text += "\nNot finished:\n" + "".join(
            f"- {markdown_text(f'{r.path} ({r.status}' + (f': {r.error}' if r.error else '') + ')')}\n"
            for r in others
        )
    if unreadable and fmt == "md":  # other formats: the warnings of `read_run`
        text += "\nUnreadable, not compared:\n" + "".join(
            f"- {markdown_text(f'{r.path} ({r.error})')}\n" for r in unreadable
        )
    for r in others if fmt != "md" else ():  # CSV and LaTeX hold the table alone: the others on stderr
        told = f"{r.path} ({r.status}" + (f": {r.error}" if r.error else "") + ")"
        log.warning("not finished, not in the table: %s", one_line(told))  # (an error cannot forge a line)
    if plots is not None and groups and metric is not None:
        files = plot_comparison(groups, metric, plots, tables)
        if fmt == "md":
            text += "\nPlots:\n" + "".join(f"- {markdown_text(str(f))}\n" for f in files)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    summary = " ".join(__doc__.split("\n\n")[0].split())  # the docstring's first paragraph
    parser = argparse.ArgumentParser(prog="attnlab-compare", description=summary)
    parser.add_argument(
        "paths", nargs="+", help="run directories, sweep directories, or directories above them"
    )
    parser.add_argument("--baseline", help="the group the others are compared with (default: the first), "
                        "its config values as the runs' config.yaml writes them (true, null; not as the "
                        "Markdown table escapes them): 'model.pe=sinusoidal'")  # fmt: skip
    parser.add_argument("--format", choices=["md", "csv", "latex"], default="md")
    parser.add_argument("--out", help="write the table to this file instead of stdout")
    parser.add_argument("--plots", help="also save PNG plots (BLEU per group, validation curves, BLEU vs "
                        "parameters) into this directory")  # fmt: skip
    parser.add_argument("--by-length", action="store_true", help="also BLEU per sentence-length bucket "
                        "(source words: <10, 10-19, 20-29, 30-39, 40+) per group and test set")  # fmt: skip
    args = parser.parse_args(argv)
    if args.out and Path(args.out).is_dir():  # refused before the runs are read and the plots written
        example = Path(args.out) / f"table.{args.format}"
        raise SystemExit(f"attnlab-compare: --out {args.out} is a directory: name the file to write the "
                         f"table to (e.g. --out {example})")  # fmt: skip
    inside = run_dir_of(args.out, args.paths) if args.out else None
    if inside is not None:  # the table would replace a run's results.json, manifest.json, ...
        raise SystemExit(
            f"attnlab-compare: --out {args.out} is inside the run directory {inside}, which this comparison "
            "reads: writing the table there could replace one of the run's files. Write it outside the run "
            "directories (e.g. into the sweep directory)"
        )
    try:
        text = report(args.paths, baseline=args.baseline, fmt=args.format, plots=args.plots,
                      lengths=args.by_length)  # fmt: skip
    except (OSError, ValueError) as exc:  # no runs there, a bad --baseline, a plot that cannot be written
        raise SystemExit(f"attnlab-compare: {exc}") from None
    if args.out:
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
