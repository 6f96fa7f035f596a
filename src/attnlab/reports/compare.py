"""Comparing runs across seeds: `attnlab-compare` and its API.

Run directories are the source of truth: each holds `config.yaml`, `manifest.json`, `results.json` and
`csv/metrics.csv`. `load_runs` finds them (a run directory, a sweep directory, or any directory above),
`varying_keys` finds the config values that differ between runs (the seed aside), `group_runs` groups
the runs by those values, and `summarize` gives per group the seed count, mean ± std and a 95%
Student-t interval over seeds of each metric, the difference of the means against a baseline group,
and per seed the p-value of sacreBLEU's paired bootstrap test against the baseline run of that seed.
Runs that failed or never finished are listed, not dropped; so is a run whose `config.yaml`,
`manifest.json` or `results.json` cannot be read (status `unreadable`, with the file and why), and the
others are compared without it.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from attnlab.reports.stats import Stat, stat
from attnlab.runs.layout import flatten

log = logging.getLogger(__name__)

UNREADABLE = "unreadable"  # the status of a run with a file that cannot be read

# Config keys that never define a setting (bookkeeping, or values derived from the run directory).
IGNORED_PREFIXES = ("paths.", "hydra.", "logger.", "callbacks.", "sweep.", "ckpt_path", "resume", "task_name")


@dataclass
class Run:
    """One run directory: its flattened config, status, and final numbers."""

    path: Path
    config: dict[str, Any]
    status: str
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def _params(run_dir: Path) -> float | None:
    """The run's parameter count (`params/total` in `csv/metrics.csv`), None when it was not logged.

    Raises:
        UnreadableRunFile: The file cannot be read, is not UTF-8 CSV, or its count is not a number.
    """
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        return None
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if row.get("params/total"):
                    return float(row["params/total"])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UnreadableRunFile(f"cannot read {path}: {exc}") from None
    except ValueError:
        raise UnreadableRunFile(
            f"cannot read {path}: params/total={row['params/total']!r} is not a number"
        ) from None
    return None


def _seconds(manifest: dict[str, Any], path: Path) -> float | None:
    """Seconds from `start_time` to `end_time` of a manifest (None when one is missing or no ISO time).

    Raises:
        UnreadableRunFile: One of them has a timezone and the other not (they cannot be subtracted).
    """
    try:
        start, end = (datetime.fromisoformat(manifest[k]) for k in ("start_time", "end_time"))
    except (KeyError, TypeError, ValueError):
        return None
    try:
        return (end - start).total_seconds()
    except TypeError:
        raise UnreadableRunFile(
            f"cannot read {path}: start_time {manifest['start_time']!r} and end_time "
            f"{manifest['end_time']!r} cannot be compared (one has a timezone, the other not)"
        ) from None


class UnreadableRunFile(ValueError):
    """A run's `config.yaml`, `manifest.json` or `results.json` is unreadable or not what attnlab writes."""


def _json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise UnreadableRunFile(f"cannot read {path}: {exc}") from None
    if not isinstance(value, dict):
        raise UnreadableRunFile(f"cannot read {path}: it holds a JSON {type(value).__name__}, not an object")
    return value


def _config(path: Path) -> dict[str, Any]:
    try:
        config = OmegaConf.load(path)
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnreadableRunFile(f"cannot read {path}: {reason}") from None
    if not isinstance(config, DictConfig):
        raise UnreadableRunFile(f"cannot read {path}: it holds a YAML list, not a config")
    return flatten(OmegaConf.to_container(config))


def _result_metrics(path: Path) -> dict[str, float]:
    results = _json_object(path)
    numbers = results.get("metrics", {})
    sets = results.get("sets", {})
    if not isinstance(numbers, dict) or not isinstance(sets, dict):
        raise UnreadableRunFile(f"cannot read {path}: its 'metrics' and 'sets' must be JSON objects")
    metrics = {k: float(v) for k, v in numbers.items() if isinstance(v, (int, float))}
    for name, entry in sets.items():
        scores = [entry.get(m) for m in ("bleu", "chrf")] if isinstance(entry, dict) else [None]
        if not all(isinstance(v, (int, float)) for v in scores):
            raise UnreadableRunFile(f"cannot read {path}: test set {name!r} has no numeric 'bleu' and 'chrf'")
        metrics[f"test/{name}/bleu"], metrics[f"test/{name}/chrf"] = map(float, scores)
    return metrics


def read_run(run_dir: Path) -> Run:
    """The `Run` of a run directory (config from `config.yaml`, status from `manifest.json`); a run with
    one of those or `results.json` unreadable gets status `unreadable`, the file and why as its error."""
    try:
        return _read_run(run_dir)
    except UnreadableRunFile as exc:
        log.warning("run %s is left out of the comparison: %s", run_dir, exc)
        return Run(run_dir, {}, UNREADABLE, error=str(exc))


def _read_run(run_dir: Path) -> Run:
    config = {}  # a job that failed validation has a manifest but no config.yaml
    if (run_dir / "config.yaml").is_file():
        config = _config(run_dir / "config.yaml")
    manifest: dict[str, Any] = {}
    if (run_dir / "manifest.json").is_file():
        manifest = _json_object(run_dir / "manifest.json")
    for key in ("status", "error"):
        if manifest.get(key) is not None and not isinstance(manifest[key], str):
            raise UnreadableRunFile(
                f"cannot read {run_dir / 'manifest.json'}: its {key!r} is a JSON "
                f"{type(manifest[key]).__name__} ({manifest[key]!r}), not text"
            )
    status = str(manifest.get("status", "unknown"))
    results_file = run_dir / "results.json"
    if status != "finished" or not results_file.is_file():
        status = status if status != "finished" else "unfinished"
        return Run(run_dir, config, status, error=manifest.get("error"))
    metrics = _result_metrics(results_file)
    params = _params(run_dir)
    if params is not None:
        metrics["params"] = params
    seconds = _seconds(manifest, run_dir / "manifest.json")
    if seconds is not None:
        metrics["train_minutes"] = seconds / 60
    return Run(run_dir, config, "finished", metrics)


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Every run directory (one with `config.yaml` or `manifest.json`) at or below `paths`, by path."""
    found: set[Path] = set()
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"no such run or sweep directory: {path}")
        for name in ("config.yaml", "manifest.json"):
            found.update(p.parent for p in path.rglob(name) if ".hydra" not in p.parts)
    return [read_run(p) for p in sorted(found)]


def varying_keys(runs: Sequence[Run], seed_key: str = "seed") -> list[str]:
    """Config keys whose values differ between runs (the seed and bookkeeping keys excluded)."""
    keys = sorted({k for run in runs for k in run.config})
    out = []
    for key in keys:
        if key == seed_key or key.startswith(IGNORED_PREFIXES):
            continue
        values = {json.dumps(run.config.get(key), sort_keys=True) for run in runs}
        if len(values) > 1:
            out.append(key)
    return out


def group_name(run: Run, keys: Sequence[str]) -> str:
    """`model.pe=learned,model.n_heads=4` for the values of `keys` (or `all` with no keys)."""
    return ",".join(f"{k}={run.config.get(k)}" for k in keys) or "all"


@dataclass
class GroupSummary:
    """One group of runs (a setting) over its seeds."""

    name: str
    runs: list[Run]
    stats: dict[str, Stat]
    delta: dict[str, float] = field(default_factory=dict)
    p_values: dict[str, list[tuple[Any, float]]] = field(default_factory=dict)  # set -> [(seed, p)]


DEFAULT_METRICS = ("val/ppl", "params", "train/tokens_per_sec_epoch", "train_minutes")


def summarize(runs: Sequence[Run], baseline: str | None = None) -> tuple[list[GroupSummary], list[Run]]:
    """Group the finished runs by the varying config values and summarize each group's metrics over
    seeds; returns (groups, runs that did not finish). `baseline` names a group (see `group_name`), the
    first one by default; `delta` is each group's mean minus the baseline's."""
    finished = [r for r in runs if r.status == "finished"]
    others = [r for r in runs if r.status != "finished"]
    keys = varying_keys(finished)
    grouped: dict[str, list[Run]] = {}
    for run in finished:
        grouped.setdefault(group_name(run, keys), []).append(run)
    groups = []
    for name, members in grouped.items():
        metric_names = sorted({m for r in members for m in r.metrics})
        stats = {m: stat([r.metrics[m] for r in members if m in r.metrics]) for m in metric_names}
        groups.append(GroupSummary(name, members, stats))
    if groups:
        base = next((g for g in groups if g.name == baseline), None) if baseline else groups[0]
        if base is None:
            raise ValueError(f"no group named {baseline!r}: groups are {', '.join(g.name for g in groups)}")
        for group in groups:
            group.delta = {m: s.mean - base.stats[m].mean for m, s in group.stats.items() if m in base.stats}
            if group is not base:
                group.p_values = paired_tests(base.runs, group.runs)
    return groups, others


def _lines(path: Path) -> list[str] | None:
    return path.read_text(encoding="utf-8").split("\n")[:-1] if path.is_file() else None


def paired_tests(baseline: Sequence[Run], runs: Sequence[Run], n_samples: int = 1000) -> dict[str, list]:
    """Per test set, `[(seed, p-value)]` of sacreBLEU's paired bootstrap of each run against the baseline
    run with the same seed, on the same sentences (hypotheses and references saved by the runs)."""
    from attnlab.metrics import paired_bootstrap

    by_seed = {r.config.get("seed"): r for r in baseline}
    out: dict[str, list[tuple[Any, float]]] = {}
    for run in runs:
        base = by_seed.get(run.config.get("seed"))
        if base is None:
            continue
        for hyp_file in sorted((run.path / "hypotheses").glob("*.txt")):
            name = hyp_file.stem
            refs = _lines(run.path / "references" / f"{name}.txt")
            base_hyps = _lines(base.path / "hypotheses" / f"{name}.txt")
            if refs is None or base_hyps is None or refs != _lines(base.path / "references" / f"{name}.txt"):
                continue  # not the same test sentences: no paired test
            result = paired_bootstrap(base_hyps, _lines(hyp_file), refs, n_samples=n_samples)
            out.setdefault(name, []).append((run.config.get("seed"), result.p_value))
    return out


def _cell(s: Stat | None, digits: int = 2) -> str:
    if s is None:
        return ""
    if s.half_width is None:
        return f"{s.mean:.{digits}f}"
    return f"{s.mean:.{digits}f} ± {s.std:.{digits}f} [±{s.half_width:.{digits}f}]"


def table_rows(groups: Sequence[GroupSummary], metrics: Sequence[str]) -> list[list[str]]:
    """Header plus one row per group: group, seeds, then per metric `mean ± std [±95% CI]` and its Δ."""
    header = ["group", "seeds"]
    for m in metrics:
        header += [m, f"Δ {m}"]
    tested = sorted({name for g in groups for name in g.p_values})
    header += [f"p {name} (paired bootstrap vs same-seed baseline)" for name in tested]
    rows = [header]
    for g in groups:
        row = [g.name, str(len(g.runs))]
        for m in metrics:
            row += [_cell(g.stats.get(m)), f"{g.delta[m]:+.2f}" if m in g.delta else ""]
        for name in tested:
            row.append(", ".join(f"seed {seed}: {p:.3f}" for seed, p in g.p_values.get(name, [])))
        rows.append(row)
    return rows


def render(rows: list[list[str]], fmt: str = "md") -> str:
    """The rows as a Markdown table (`md`), CSV (`csv`) or LaTeX tabular (`latex`)."""
    if fmt == "csv":
        import io

        buffer = io.StringIO()
        csv.writer(buffer).writerows(rows)
        return buffer.getvalue()
    if fmt == "latex":

        def esc(text: str) -> str:
            return (
                text.replace("\\", "\\textbackslash{}")
                .replace("_", "\\_")
                .replace("%", "\\%")
                .replace("&", "\\&")
            )

        lines = ["\\begin{tabular}{" + "l" * len(rows[0]) + "}", "\\hline"]
        lines.append(" & ".join(esc(c) for c in rows[0]) + " \\\\ \\hline")
        lines += [" & ".join(esc(c).replace("±", "$\\pm$") for c in row) + " \\\\" for row in rows[1:]]
        return "\n".join([*lines, "\\hline", "\\end{tabular}"]) + "\n"
    if fmt != "md":
        raise ValueError(f"format {fmt!r}: use md, csv or latex")
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines) + "\n"


def main_metric(groups: Sequence[GroupSummary]) -> tuple[str | None, list[str]]:
    """The metric a comparison is about (the first test BLEU, else the first test metric, else the
    validation loss) and the table's columns (test BLEU/chrF or test metrics, then `DEFAULT_METRICS`)."""
    tested = sorted({m for g in groups for m in g.stats if m.startswith("test/")})
    scored = [m for m in tested if m.endswith(("/bleu", "/chrf"))] or tested  # BLEU/chrF when translated
    columns = [*scored, *(m for m in DEFAULT_METRICS if any(m in g.stats for g in groups))]
    bleu = [m for m in scored if m.endswith("/bleu")]
    validation = [m for m in ("val/bleu", "val/loss") if any(m in g.stats for g in groups)]
    main = (bleu or scored or validation or [None])[0]
    return main, columns


def report(
    paths: Sequence[str | Path], baseline: str | None = None, fmt: str = "md", plots: str | Path | None = None
) -> str:
    """The comparison table of the runs under `paths`, then the runs that did not finish; with `plots`,
    the plots of `attnlab.reports.plots.plot_comparison` are written into that directory."""
    runs = load_runs(paths)
    if not runs:
        raise FileNotFoundError(
            f"no run directories (config.yaml, manifest.json) under {', '.join(map(str, paths))}"
        )
    groups, others = summarize(runs, baseline)
    metric, columns = main_metric(groups)
    text = render(table_rows(groups, columns), fmt) if groups else "no finished runs\n"
    unreadable = [r for r in others if r.status == UNREADABLE]
    others = [r for r in others if r.status != UNREADABLE]
    if others and fmt == "md":
        text += "\nNot finished:\n" + "".join(f"- {r.path} ({r.status}{': ' + r.error if r.error else ''})\n"
                                              for r in others)  # fmt: skip
    if unreadable and fmt == "md":  # other formats: the warnings of `read_run`
        text += "\nUnreadable, not compared:\n" + "".join(f"- {r.path} ({r.error})\n" for r in unreadable)
    if plots is not None and groups and metric is not None:
        from attnlab.reports.plots import plot_comparison

        files = plot_comparison(groups, metric, plots)
        if fmt == "md":
            text += "\nPlots:\n" + "".join(f"- {f}\n" for f in files)
    return text
