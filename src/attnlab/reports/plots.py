"""Plots of a comparison (`attnlab-compare --plots DIR`), as PNG files drawn with matplotlib's Agg backend.

- `<metric>_by_group.png`: each group's mean of the main metric (test BLEU when the runs translated) with
  its 95% t-interval over seeds, and every seed's value as a dot;
- `validation_curves.png`: per group, the mean over seeds of a validation metric (`val/bleu` when it
  was logged, else `val/loss`) at each epoch, with the range over seeds shaded;
- `<metric>_vs_params.png`: the main metric against the parameter count, one point per group;
- with `attnlab-compare --by-length`, `bleu_by_length_<set>.png` per test set (`plot_comparison`'s
  `tables`): each group's BLEU per length bucket, mean over seeds with its 95% t-interval.
"""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from attnlab.io import atomic_write_files
from attnlab.metrics import split_metric
from attnlab.reports.compare import GroupSummary, LengthTable, Run
from attnlab.runs.layout import UnreadableRunFile


def validation_curve(run: Run, metric: str) -> dict[int, float]:
    """`{epoch: value}` of `metric` from the run's `csv/metrics.csv` (empty when it was not logged).

    Raises:
        attnlab.runs.layout.UnreadableRunFile: The file cannot be read or holds a cell that is no number.
    """
    curve = {}
    for row in run.files.metrics_rows():
        if metric in row and "epoch" in row:
            epoch = row["epoch"]
            if not (math.isfinite(epoch) and epoch == int(epoch) and epoch >= 0):
                raise UnreadableRunFile(
                    f"cannot read {run.files.metrics_csv}: epoch {epoch} is no epoch number (a whole number "
                    "from 0); leave the run out of the comparison or restore the file"
                )
            curve[int(epoch)] = row[metric]
    return curve


def _slug(metric: str) -> str:
    return metric.replace("/", "_")


def plot_comparison(
    groups: Sequence[GroupSummary], metric: str, out_dir: str | Path, tables: Sequence[LengthTable] = ()
) -> list[Path]:
    """Write the comparison plots of `groups` (from `attnlab.reports.compare.summarize`) for `metric` into
    `out_dir` (made if missing), and with `tables` (`attnlab.reports.compare.by_length`) their
    `bleu_by_length_<set>.png` (all together once every plot is drawn: a failed write leaves every file
    there before unchanged); returns the files written. Labels are drawn as the text they are (a group
    name holding `$`, from a config value, is no mathtext formula, which could fail to parse)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file there (or above it), no permission
        raise OSError(
            f"cannot make the plot directory {out}: {exc.strerror or exc}; choose another --plots directory"
        ) from None
    with matplotlib.rc_context({"text.parse_math": False}):  # group names are text: `$x$` is no formula
        written = {
            out / f"{_slug(metric)}_by_group.png": _png(_by_group(groups, metric)),
            out / "validation_curves.png": _png(_validation_curves(groups)),
            out / f"{_slug(metric)}_vs_params.png": _png(_vs_params(groups, metric)),
            **_length_plots(tables, out),
        }
    return _write(written, out)


def _length_plots(tables: Sequence[LengthTable], out: Path) -> dict[Path, bytes]:
    return {out / f"bleu_by_length_{table.test_set}.png": _png(_length_figure(table)) for table in tables}


def _write(written: dict[Path, bytes], out: Path) -> list[Path]:
    """Write the plots `written` (path -> PNG bytes) into `out` together; returns their paths."""
    try:
        atomic_write_files(written)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write plot {exc.filename or out}: {exc.strerror or exc}; the files "
                      f"in {out} before are unchanged. Free disk space or choose another --plots directory"
                      ) from None  # fmt: skip
    return list(written)


def _length_figure(table: LengthTable) -> object:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    x = range(len(table.labels))
    for name, stats in table.groups.items():
        points = [(i, s) for i, s in zip(x, stats, strict=True) if s is not None]
        ax.errorbar([i for i, _ in points], [s.mean for _, s in points],
                    yerr=[s.half_width or 0.0 for _, s in points], marker="o", capsize=3,
                    label=name)  # fmt: skip
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"{label}\n(n={n})" for label, n in zip(table.labels, table.sentences, strict=True)])
    ax.set_xlabel(f"{table.by} length (words)")
    ax.set_ylabel(f"BLEU on {table.test_set}")
    ax.set_title(f"BLEU by {table.by} length: mean over seeds, 95% interval")
    _legend(ax)
    fig.tight_layout()
    return fig


def _by_group(groups: Sequence[GroupSummary], metric: str) -> object:
    """Each group's mean of `metric` with its 95% t-interval, and the seeds' values as dots."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups)), 4.5))
    for i, g in enumerate(groups):
        s = g.stats.get(metric)
        if s is None:
            continue
        ax.errorbar([i], [s.mean], yerr=[[s.half_width or 0.0]], fmt="o", capsize=6, color="C0")
        seeds = [r.metrics[metric] for r in g.runs if metric in r.metrics]
        ax.scatter([i + 0.12] * len(seeds), seeds, s=12, color="C1", zorder=3)
    ax.set_xticks(range(len(groups)), [g.name for g in groups], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric}: mean, 95% t-interval; dots: seeds", fontsize=10)
    fig.tight_layout()
    return fig


def _validation_curves(groups: Sequence[GroupSummary]) -> object:
    """Per group, the mean over seeds of `val/bleu` (else `val/loss`) per epoch, the range shaded."""
    import matplotlib.pyplot as plt

    bleu, loss = split_metric("val", "bleu"), split_metric("val", "loss")
    curve_metric = bleu if any(validation_curve(r, bleu) for g in groups for r in g.runs) else loss
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, g in enumerate(groups):
        curves = [c for c in (validation_curve(r, curve_metric) for r in g.runs) if c]
        epochs = sorted(set().union(*curves)) if curves else []
        if not epochs:
            continue
        values = [[c[e] for c in curves if e in c] for e in epochs]
        x, color = [e + 1 for e in epochs], f"C{i % 10}"
        ax.plot(x, [statistics.fmean(v) for v in values], marker="o", color=color, label=g.name)
        ax.fill_between(x, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.2)
    ax.set_xlabel("epoch")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel(curve_metric)
    ax.set_title(f"{curve_metric} per epoch: mean over seeds, range shaded", fontsize=10)
    _legend(ax)
    fig.tight_layout()
    return fig


def _vs_params(groups: Sequence[GroupSummary], metric: str) -> object:
    """`metric` against the parameter count, one point (with its 95% t-interval) per group."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, g in enumerate(groups):
        s, p = g.stats.get(metric), g.stats.get("params")
        if s is None or p is None or not math.isfinite(p.mean):
            continue
        ax.errorbar([p.mean], [s.mean], yerr=[[s.half_width or 0.0]], fmt="o", capsize=4, color=f"C{i % 10}",
                    label=g.name)  # fmt: skip
    ax.set_xlabel("parameters")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs parameter count", fontsize=10)
    _legend(ax)
    fig.tight_layout()
    return fig


def _legend(ax: object) -> None:
    if ax.get_legend_handles_labels()[0]:  # type: ignore[attr-defined]
        ax.legend(fontsize=7)  # type: ignore[attr-defined]


def _png(fig: object) -> bytes:
    """`fig` as PNG bytes (the figure is closed)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=100)  # type: ignore[attr-defined]
    finally:
        plt.close(fig)  # type: ignore[arg-type]
    return buffer.getvalue()
