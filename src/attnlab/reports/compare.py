"""Comparing runs across seeds: the API of `attnlab-compare` (`attnlab.cli.compare.report`).

Run directories are the source of truth (`attnlab.runs.layout.RunDir`): each holds `config.yaml`,
`manifest.json`, `results.json` and `csv/metrics.csv`. `load_runs` finds them (a run directory, a sweep
directory, or any directory above), `varying_keys` finds the config values that differ between runs
(the seed and the bookkeeping keys aside: the setting W&B groups by too), and `summarize` groups the runs
by those values and gives per group the seed count, mean ± std and a 95% Student-t interval over seeds of
each metric (`attnlab.reports.stats`), the difference of the means against a baseline group, and per
seed the p-value of sacreBLEU's paired bootstrap test against the baseline run of that seed. Test-set
scores scored unlike (BLEU with other tokenizers, any score on other references: `_unlike`) are not
compared: a group and the baseline get no Δ of them, and runs of one group are refused.
Runs that failed or never finished are listed, not dropped (a `running` run whose process is gone from
this host as `stopped`: `attnlab.io.FileLock.holder_died`); so is a run whose `config.yaml`,
`manifest.json`, `results.json` or `csv/metrics.csv` cannot be read (status `unreadable`, with the file
and why), and the others are compared without it; so is a finished run whose saved hypotheses, sources or
references of a test set are damaged (not UTF-8, line counts that differ, references missing, no lines).

`by_length` breaks each group's test BLEU down by sentence length (compare-mt's length buckets): the
sentences of a test set are bucketed by the number of words of their source (`sources/<set>.txt`; by
that of their reference for runs written before sources were saved), each bucket scored as a corpus
with sacreBLEU, and the scores summarised over seeds like the other metrics.
"""

from __future__ import annotations

import bisect
import csv
import hashlib
import io
import itertools
import logging
import math
import os
import re
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from attnlab.data.text import json_line, one_line, plural, shell_word
from attnlab.io import FileLock
from attnlab.metrics import SET_SCORES, set_metric, split_metric, train_metric
from attnlab.reports.stats import Stat, stat
from attnlab.runs.layout import (
    CONFIG_FILE,
    MANIFEST_FILE,
    RESULTS_FILE,
    RunDir,
    UnreadableRunFile,
    json_type,
    read_saved_lines,
    setting,
)
from attnlab.typed import did_you_mean, is_number

log = logging.getLogger(__name__)

UNREADABLE = "unreadable"  # the status of a run with a file that cannot be read
COUNTS = frozenset({"params"})  # metrics shown as whole numbers


@dataclass
class Run:
    """One run directory: its flattened config, status, and final numbers (of a finished run, with the BLEU
    tokenizer its results were scored with, `_bleu_tokenizer`, and the references each test-set score was
    scored against, `_scored_references`: together how it scored each, `scoring`)."""

    path: Path
    config: dict[str, Any]
    status: str
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    bleu_tokenize: str = "13a"
    references: dict[str, str | None] = field(default_factory=dict)

    @property
    def files(self) -> RunDir:
        """The run directory's files."""
        return RunDir(self.path)

    def scoring(self, metric: str) -> tuple[str | None, str | None]:
        """How the run scored `metric`, one of its test-set scores (`test/<set>/<score>`, a key of
        `references`): the BLEU tokenizer (of BLEU only) and the SHA-256 of the references it was scored
        against (None where the run saved none). Scores scored unlike are not compared (`_unlike`)."""
        return (self.bleu_tokenize if metric.endswith("/bleu") else None), self.references[metric]

    @property
    def seed(self) -> Any:
        """The seed runs are paired and counted by: the config's `seed`, a text holding a whole number read
        as that number, as Lightning's `seed_everything` seeds with `int(seed)` ('1' in one config.yaml
        and 1 in another are one seed, shown 1); None without one."""
        seed = self.config.get("seed")
        if isinstance(seed, str):
            with suppress(ValueError):
                return int(seed)
        return seed


def _params(run: RunDir) -> float | None:
    """The run's parameter count (`params/total` in `csv/metrics.csv`), None when it was not logged.

    Raises:
        UnreadableRunFile: The file cannot be read, is not UTF-8 CSV, or its count is not a number (other
            cells are not read: a damaged cell elsewhere does not make the run unreadable).
    """
    rows = run.metrics_rows(columns=("params/total",))
    return next((row["params/total"] for row in rows if "params/total" in row), None)


def _seconds(manifest: dict[str, Any], path: Path) -> float | None:
    """Seconds the run of a manifest ran: from `start_time` to `end_time`, less the pauses between its
    parts when it was resumed (each `resumed` entry's `time`, and the `previous_end` of the part before).
    None when a time is missing or no ISO time, a part was killed before it could record its end (how
    long it ran is not known; resumptions recorded before `previous_end` existed are such too), or a part
    ends before it starts (times edited or set by a clock that jumped: no duration to add).

    Raises:
        UnreadableRunFile: Some times have a timezone and others not (they cannot be subtracted).
    """
    resumed = manifest.get("resumed") or []
    if not isinstance(resumed, list) or not all(isinstance(entry, dict) for entry in resumed):
        return None
    starts = [manifest.get("start_time"), *(entry.get("time") for entry in resumed)]
    ends = [*(entry.get("previous_end") for entry in resumed), manifest.get("end_time")]
    try:
        parts = [(datetime.fromisoformat(start), datetime.fromisoformat(end))
                 for start, end in zip(starts, ends, strict=True)]  # fmt: skip
    except (TypeError, ValueError):
        return None
    try:
        durations = [(end - start).total_seconds() for start, end in parts]
    except TypeError:
        times = ", ".join(map(repr, [*starts, *ends]))
        raise UnreadableRunFile(
            f"cannot read {path}: its start, resumption and end times ({times}) cannot be compared (one has "
            "a timezone, the other not)"
        ) from None
    return sum(durations) if min(durations) >= 0 else None


def _number(path: Path, what: str, value: float) -> float:
    """`value` of results file `path` as a float (`what` names it in the error).

    Raises:
        UnreadableRunFile: An integer past float's range (JSON numbers have no limit).
    """
    try:
        return float(value)
    except OverflowError:
        raise UnreadableRunFile(f"cannot read {path}: its {what} is past float's range") from None


def _result_metrics(path: Path, results: dict[str, Any]) -> dict[str, float]:
    numbers = results.get("metrics", {})
    sets = results.get("sets", {})
    if not isinstance(numbers, dict) or not isinstance(sets, dict):
        raise UnreadableRunFile(f"cannot read {path}: its 'metrics' and 'sets' must be JSON objects")
    metrics = {k: _number(path, repr(k), v) for k, v in numbers.items() if is_number(v)}
    for name, entry in sets.items():
        scores = [entry.get(m) for m in ("bleu", "chrf")] if isinstance(entry, dict) else [None]
        if not all(map(is_number, scores)):
            raise UnreadableRunFile(f"cannot read {path}: test set {name!r} has no numeric 'bleu' and 'chrf'")
        try:
            names = {score: set_metric(name, score) for score in SET_SCORES}
        except ValueError:
            raise UnreadableRunFile(
                f"cannot read {path}: {name!r} is no test set name attnlab writes"
            ) from None
        for metric, value in zip(("bleu", "chrf"), scores, strict=True):
            metrics[names[metric]] = _number(path, f"{name!r} {metric}", value)
        ter = entry.get("ter")  # (results from before TER was scored have none)
        if is_number(ter):
            metrics[names["ter"]] = _number(path, f"{name!r} ter", ter)
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
    run = RunDir(run_dir)
    config = {}  # a job that failed validation has a manifest but no config.yaml
    if run.config_file.is_file():
        config = run.read_config()
    if isinstance(config.get("seed"), list):  # (a mapping is flattened: `seed.x`) no seed to pair runs by
        raise UnreadableRunFile(
            f"cannot read {run.config_file}: its seed {config['seed']!r} is a list, not a number;"
            " restore the file or leave the run out of the comparison"
        )
    manifest: dict[str, Any] = {}
    if run.manifest_file.is_file():
        manifest = run.read_json(MANIFEST_FILE)
    for key in ("status", "error"):
        if manifest.get(key) is not None and not isinstance(manifest[key], str):
            raise UnreadableRunFile(
                f"cannot read {run.manifest_file}: its {key!r} is a JSON "
                f"{json_type(manifest[key])} ({manifest[key]!r}), not text"
            )
    status = str(manifest.get("status", "unknown"))
    gone = FileLock(run.run_lock).holder_died() if status == "running" else None
    if gone is not None:  # its process died without writing how it ended
        then = "resume=true in its directory goes on" if run.last_checkpoint.is_file() else "no last.ckpt"
        error = f"its process (pid {gone}) is gone: killed or crashed; {then}"
        return Run(run_dir, config, "stopped", error=error)
    if status == "finished" and not config:  # its setting unknown: no group to put it in
        raise UnreadableRunFile(f"cannot read {run.config_file}: a finished run without its config")
    if status != "finished" or not run.results_file.is_file():
        status = status if status != "finished" else "unfinished"
        return Run(run_dir, config, status, error=manifest.get("error"))
    results = run.read_json(RESULTS_FILE)
    metrics, tokenize = _result_metrics(run.results_file, results), _bleu_tokenizer(run.results_file, results)
    references = _check_saved_lines(run)  # (a paired test or a length table reads them: checked here)
    params = _params(run)
    if params is not None:
        metrics["params"] = params
    seconds = _seconds(manifest, run.manifest_file)
    if seconds is not None:
        metrics["train_minutes"] = seconds / 60
    scored = _scored_references(results, references)
    return Run(run_dir, config, "finished", metrics, bleu_tokenize=tokenize, references=scored)


def _scored_references(results: dict[str, Any], references: dict[str, str]) -> dict[str, str | None]:
    """Per test-set score of `results` (`test/<set>/<score>`), the SHA-256 of the references it was scored
    against (`references`, per set; None where the run saved none)."""
    return {set_metric(name, score): references.get(name)
            for name in results.get("sets", {}) for score in SET_SCORES}  # fmt: skip


def _unlike(runs: Sequence[Run], metric: str) -> tuple[Run, Run] | None:
    """Two of `runs` that scored `metric` (a test set's score) unlike, with other BLEU tokenizers (other
    scales) or against other references (other sentences); None when all that have it scored it alike
    (references a run did not save count as the others')."""
    scored = [r for r in runs if metric in r.references]
    for a, b in itertools.combinations(scored, 2):
        (tokenize, digest), (other_tokenize, other_digest) = a.scoring(metric), b.scoring(metric)
        if tokenize != other_tokenize or (None not in (digest, other_digest) and digest != other_digest):
            return a, b
    return None


def _how(run: Run, metric: str) -> str:
    """How `run` scored `metric` (`Run.scoring`), for messages."""
    tokenize, digest = run.scoring(metric)
    scored = [f"BLEU tokenizer {tokenize}"] if tokenize else []
    scored.append(f"references sha256 {digest[:12]}" if digest else "references not saved")
    return f"{run.path}: {', '.join(scored)}"


def _is_run_dir(directory: Path) -> bool:
    """Whether `directory` is a run directory: one with `config.yaml` or `manifest.json` (not Hydra's
    record `.hydra/`, which holds a config.yaml too)."""
    held = any((directory / name).is_file() for name in (CONFIG_FILE, MANIFEST_FILE))
    return held and ".hydra" not in directory.parts


def _run_dirs_below(path: Path) -> list[Path]:
    """The run directories at or below `path`, sorted, symbolic links to directories followed (a folder of
    links to chosen runs; each real directory is visited once, in name order, so a link loop ends and a
    directory reached twice is found under its first path; a link to a directory holding it is not:
    `_link_up`); runs do not nest, so
    nothing below a run directory is looked into (nor into its checkpoints)."""
    found, seen = [], set()
    for directory, subdirs, _ in os.walk(path, followlinks=True):
        real = os.path.realpath(directory)
        if real in seen or _is_run_dir(Path(directory)):
            subdirs[:] = []  # visited, or a run: not looked into
            if real not in seen:
                found.append(Path(directory))
        seen.add(real)
        subdirs[:] = sorted(name for name in subdirs if name != ".hydra" and not _link_up(directory, name))
        # (in order: a run reached twice is kept under its first path, not the one listed first)
    return sorted(found)


def _link_up(directory: str, name: str) -> bool:
    """Whether `directory/name` is a symbolic link to `directory` or a directory above it (which would take
    in the runs beside those asked for: a link to `..` in a sweep, the runs of every other sweep); such a
    link is not followed, and a warning names it."""
    link = os.path.join(directory, name)
    if not os.path.islink(link):
        return False
    target = Path(os.path.realpath(link))
    if not Path(os.path.realpath(directory)).is_relative_to(target):
        return False
    log.warning("%s is a symbolic link to %s, which holds it: not followed (it would take in the runs "
                "beside those asked for)", link, target)  # fmt: skip
    return True


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Every run directory (`_is_run_dir`) at or below `paths` (`_run_dirs_below`: symbolic links
    followed): those of the first path sorted by path, then those of the next (so the first path's first
    group is the default baseline), each once however it is reached (the same directory given twice, or
    through a symbolic link, is one run, under the path it was first reached by)."""
    found: dict[Path, Path] = {}  # the directory resolved -> as first found
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"no such run or sweep directory: {path}")
        for run_dir in _run_dirs_below(path):
            found.setdefault(run_dir.resolve(), run_dir)
    return [read_run(p) for p in found.values()]


def run_dir_of(path: str | Path, paths: Sequence[str | Path]) -> Path | None:
    """The run directory `load_runs(paths)` reads (as it reaches it) that holds `path`, a file to write,
    symbolic links resolved; None when there is none. A file there may be one of the run's own (its
    `results.json`), which writing would replace."""
    target = Path(path).resolve()
    for root in map(Path, paths):
        for run_dir in _run_dirs_below(root) if root.exists() else []:
            if target.is_relative_to(run_dir.resolve()):
                return run_dir
    return None


def varying_keys(runs: Sequence[Run], seed_key: str = "seed") -> list[str]:
    """Config keys whose values differ between runs: those of their settings (`attnlab.runs.layout.setting`,
    which W&B groups by too: the seed and the bookkeeping keys left out, values derived from the run
    directory counting as the same). A key some runs lack (written by a version before the key existed, or
    after it was removed) varies only when the runs that have it differ in it: lacking it is no setting of
    its own (a run lacking a varying key shows `ABSENT` for it)."""
    return setting_keys(runs, seed_key)[0]


def setting_keys(runs: Sequence[Run], seed_key: str = "seed") -> tuple[list[str], list[str]]:
    """The `varying_keys` of `runs`, and the keys of their settings that some runs lack but that do not
    vary: runs are grouped as if those that lack one held the others' value."""
    settings = [setting(run.config, seed_key) for run in runs]
    keys = sorted({key for values in settings for key in values})
    values = {key: [values[key] for values in settings if key in values] for key in keys}
    varying = [key for key in keys if len(set(values[key])) > 1]
    partial = [key for key in keys if key not in varying and len(values[key]) < len(settings)]
    return varying, partial


ABSENT = "(absent)"  # how a group's name shows a varying key its runs' config.yaml lacks (`group_name`)


def yaml_value(value: Any) -> str:
    """A config value as YAML writes it (`config.yaml`, Hydra's command line), on one line: `true`,
    `null`, `0.1`, `1.0e-05`, `[1, a]`, `{a: 1}`; a text plain (`learned`), or quoted where YAML would
    read it as something else (`'true'`, `'1'`). A value YAML would write on several lines (a line break,
    U+2028 or U+0085 in a text, a list's or a mapping's too) is written as JSON, which YAML reads too, its
    breaks escaped (`attnlab.data.text.json_line`: `"two\\nlines"`). Group names are made of these
    (`group_name`), so `--baseline model.x=true` names the group of runs with `x: true`."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, allow_unicode=True)
    text = text.removesuffix("\n...\n").removesuffix("\n")
    return text if len(text.splitlines()) == 1 else json_line(value).removesuffix("\n")


def group_name(run: Run, keys: Sequence[str]) -> str:
    """`model.pe=learned,model.n_heads=4` for the values of `keys` (`yaml_value`; `ABSENT` for a key the run's
    config lacks; the text `(absent)` and a text holding a comma quoted, `'(absent)'`, `'a,b'`, as YAML
    reads them too; `all` with no keys)."""
    values = [_group_value(run.config[k]) if k in run.config else ABSENT for k in keys]
    return ",".join(f"{k}={v}" for k, v in zip(keys, values, strict=True)) or "all"


def _group_value(value: Any) -> str:
    """`yaml_value(value)`, but a plain text single-quoted as YAML quotes it where it would make two
    settings one name: `ABSENT` (the runs holding it and the runs lacking the key are two groups), and a
    text holding a comma, which separates a name's settings (a tag `a,model.pe=learned` would read as a
    second `model.pe`)."""
    text = yaml_value(value)
    if isinstance(value, str) and text == value and (text == ABSENT or "," in text):
        return "'{}'".format(text.replace("'", "''"))
    return text


@dataclass
class GroupSummary:
    """One group of runs (a setting) over its seeds."""

    name: str
    runs: list[Run]
    stats: dict[str, Stat]
    delta: dict[str, float] = field(default_factory=dict)
    p_values: dict[str, list[tuple[Any, float]]] = field(default_factory=dict)  # set -> [(seed, p)]


# The columns after the test scores: validation perplexity, tokens/s (`attnlab.metrics` names), and the two
# numbers `read_run` adds (`params` from csv/metrics.csv, `train_minutes` from manifest.json)
DEFAULT_METRICS = (
    split_metric("val", "ppl"),
    "params",
    train_metric("tokens_per_sec", "_epoch"),
    "train_minutes",
)


def summarize(runs: Sequence[Run], baseline: str | None = None) -> tuple[list[GroupSummary], list[Run]]:
    """Group the finished runs by the varying config values and summarize each group's metrics over
    seeds; returns (groups, runs that did not finish). `baseline` names a group (see `group_name`), the
    first one by default, and comes first in the returned groups; `delta` is each group's mean minus
    the baseline's (`_delta`: none of a test-set score the two scored unlike).

    Raises:
        ValueError: `baseline` names no group, or runs of one group scored a test set unlike
            (`_check_scored_alike`).
    """
    finished = [r for r in runs if r.status == "finished"]
    others = [r for r in runs if r.status != "finished"]
    keys, partial = setting_keys(finished)
    if partial:
        log.warning(
            "%s: in the config of some runs only (the others were written before the key existed, or after "
            "it was removed); each has one value in the runs that have it, so the runs are grouped as if "
            "it were the same in all", ", ".join(partial),
        )  # fmt: skip
    grouped: dict[str, list[Run]] = {}
    for run in finished:
        grouped.setdefault(group_name(run, keys), []).append(run)
    groups = []
    for name, members in grouped.items():
        _warn_repeated_seeds(name, members)
        metric_names = sorted({m for r in members for m in r.metrics})
        _check_scored_alike(name, members, metric_names)
        stats = {m: stat([r.metrics[m] for r in members if m in r.metrics]) for m in metric_names}
        groups.append(GroupSummary(name, members, stats))
    if groups:
        base = next((g for g in groups if g.name == baseline), None) if baseline else groups[0]
        if base is None:
            raise ValueError(_no_such_group(str(baseline), [g.name for g in groups]))
        for group in groups:
            group.delta = _delta(base, group)
            if group is not base:
                group.p_values = paired_tests(base.runs, group.runs)
                _warn_unpaired_seeds(base, group)
        groups = [base, *(g for g in groups if g is not base)]
    return groups, others


def _check_scored_alike(name: str, runs: Sequence[Run], metrics: Sequence[str]) -> None:
    """Raise ValueError when runs of group `name` scored one of `metrics` unlike (`_unlike`: BLEU with other
    tokenizers, a test set's scores on other sentences): a mean over them would mix scales or sentences."""
    for metric in metrics:
        pair = _unlike(runs, metric)
        if pair is not None:
            raise ValueError(
                f"the runs of group {name} scored {metric} unlike ({_how(pair[0], metric)}; "
                f"{_how(pair[1], metric)}): a mean over them means nothing. Compare runs scored with one "
                "BLEU tokenizer on the same references, giving the others in another command"
            )


def _delta(base: GroupSummary, group: GroupSummary) -> dict[str, float]:
    """Each metric's mean in `group` less that in `base`; none of a test-set score the two groups scored
    unlike (`_unlike`: BLEU of other tokenizers, scores on other sentences), which a warning names."""
    delta, unlike = {}, []
    for metric, s in group.stats.items():
        pair = _unlike([*base.runs, *group.runs], metric) if metric in base.stats else None
        if pair is not None:
            unlike.append(f"{metric} ({_how(pair[0], metric)}; {_how(pair[1], metric)})")
        elif metric in base.stats:
            delta[metric] = s.mean - base.stats[metric].mean
    if unlike:
        log.warning("no Δ of group %s against the baseline %s for %s: scored unlike, they are not "
                    "comparable", group.name, base.name, "; ".join(unlike))  # fmt: skip
    return delta


def _no_such_group(baseline: str, names: Sequence[str]) -> str:
    """The error for a baseline that names no group: the groups' names, each quoted as one word of a shell
    command (`shell_word`), with their config values as the runs' `config.yaml` holds them (what the
    baseline is matched against; the Markdown table shows `|`, `<` and `\\` escaped)."""
    quoted = [shell_word(name) for name in names]
    return (
        f"no group named {shell_word(baseline)}: {did_you_mean(shell_word(baseline), quoted)}give one of "
        f"{', '.join(quoted)} (its config values as in the runs' config.yaml, not as the Markdown table "
        "escapes them)"
    )


def _warn_unpaired_seeds(base: GroupSummary, group: GroupSummary) -> None:
    """Warn when runs of `group` that saved hypotheses have no baseline run of their seed: they get no
    paired test (with no seed in common, the table has no p column at all)."""
    base_seeds = {r.seed for r in base.runs}
    unpaired = {
        r.seed for r in group.runs if r.seed not in base_seeds and any(r.files.hypotheses_dir.glob("*.txt"))
    }
    alone = [str(seed) for seed in sorted(unpaired, key=_seed_order)]
    if alone:
        log.warning(
            "no paired test for seed %s of group %s: the baseline group %s has no run of %s; run the "
            "baseline with the same seeds to test them", ", ".join(alone), group.name, base.name,
            plural(len(alone), "that seed", "those seeds"),
        )  # fmt: skip


def _seed_order(seed: Any) -> tuple[bool, Any]:
    """Seeds in order for messages: numbers by value (2 before 10), then any other value by its text."""
    return (False, seed) if is_number(seed) else (True, str(seed))


def _warn_repeated_seeds(name: str, runs: Sequence[Run]) -> None:
    """Warn when runs of one group share a seed: the group's statistics count each run as a seed of its
    own, and a baseline seed with several runs has no paired test (`paired_tests`)."""
    by_seed: dict[Any, list[Run]] = {}
    for run in runs:
        by_seed.setdefault(run.seed, []).append(run)
    for seed, same in by_seed.items():
        if len(same) > 1:
            log.warning(
                "group %s has %d runs of seed %s (%s): its statistics count each as a seed of its own, and "
                "as a baseline it has no paired test for that seed; compare one run per seed (give the "
                "others' directories in another command)", name, len(same), seed,
                ", ".join(str(r.path) for r in same),
            )  # fmt: skip


def _same_count(files: Sequence[tuple[Path, list[str]]]) -> None:
    """Raise `UnreadableRunFile` naming the files when saved lines of one test set (hypotheses, references,
    sources, of one run or of the two a paired test compares) have different line counts: they are
    damaged."""
    counts = {len(lines) for _, lines in files}
    if len(counts) > 1:
        told = ", ".join(f"{path} has {len(lines)} lines" for path, lines in files)
        raise UnreadableRunFile(
            f"the lines of one test set do not match: {told}; restore the files (attnlab-eval on the run's "
            "checkpoint writes them again) or leave that run out of the comparison"
        )


def _check_saved_lines(run: RunDir) -> dict[str, str]:
    """Raise `UnreadableRunFile` naming the file when the lines `run` saved of a test set it decoded are
    damaged: its references missing, a file not UTF-8, hypotheses, references and sources of other line
    counts, or none of them holding a line (no run decodes a test set without sentences: emptied files).
    Returns per test set the SHA-256 of its references' lines."""
    digests = {}
    for hyp_file in sorted(run.hypotheses_dir.glob("*.txt")):
        files = [(hyp_file, read_saved_lines(hyp_file) or []),
                 (run.references_dir / hyp_file.name, _saved_references(run, hyp_file.name))]  # fmt: skip
        sources = read_saved_lines(run.sources_dir / hyp_file.name)
        if sources is not None:
            files.append((run.sources_dir / hyp_file.name, sources))
        _same_count(files)
        if not files[0][1]:
            raise UnreadableRunFile(
                f"{' and '.join(str(path) for path, _ in files)} hold no lines (a decoded test set has at "
                "least one sentence); restore the files (attnlab-eval on the run's checkpoint writes them "
                "again) or leave that run out of the comparison"
            )
        digests[hyp_file.stem] = hashlib.sha256("\n".join(files[1][1]).encode("utf-8")).hexdigest()
    return digests


def _saved_references(run: RunDir, name: str) -> list[str]:
    """The references of test set `name` (a file name, `test2016.txt`) that `run` saved beside its
    hypotheses of it.

    Raises:
        UnreadableRunFile: They are missing (or not UTF-8), naming the file and the fix.
    """
    path = run.references_dir / name
    saved = read_saved_lines(path)
    if saved is None:
        raise UnreadableRunFile(
            f"{path} is missing (the run has hypotheses of {Path(name).stem!r}): restore it (attnlab-eval on "
            "the run's checkpoint writes it again) or leave that run out of the comparison"
        )
    return saved


def paired_tests(baseline: Sequence[Run], runs: Sequence[Run], n_samples: int = 1000) -> dict[str, list]:
    """Per test set, `[(seed, p-value)]` of sacreBLEU's paired bootstrap of each run against the baseline
    run with the same seed, on the same sentences (hypotheses and references saved by the runs), with the
    BLEU tokenizer both runs scored with (none where they differ)."""
    from attnlab.metrics import paired_bootstrap

    by_seed: dict[Any, list[Run]] = {}
    for r in baseline:
        by_seed.setdefault(r.seed, []).append(r)
    out: dict[str, list[tuple[Any, float]]] = {}
    for run in runs:
        same = by_seed.get(run.seed, [])
        if len(same) != 1:  # none, or several (`_warn_repeated_seeds`): no one run to pair with
            continue
        base = same[0]
        tokenize, base_tokenize = run.bleu_tokenize, base.bleu_tokenize  # as each scored its BLEU
        if tokenize != base_tokenize:
            log.warning("no paired test of %s against %s: their BLEU was scored with the %s and %s "
                        "tokenizers", run.path, base.path, tokenize, base_tokenize)  # fmt: skip
            continue
        for hyp_file in sorted(run.files.hypotheses_dir.glob("*.txt")):
            name = hyp_file.name
            refs = _saved_references(run.files, name)
            base_hyps = read_saved_lines(base.files.hypotheses_dir / name)
            if base_hyps is None:  # the baseline did not decode the set: no paired test
                continue
            if refs != _saved_references(base.files, name):  # other sentences: no paired test, said
                log.warning("no paired test of %s against %s on %s: they saved different references (other "
                            "sentences)", run.path, base.path, hyp_file.stem)  # fmt: skip
                continue
            hyps = read_saved_lines(hyp_file) or []
            _same_count([(hyp_file, hyps), (run.files.references_dir / name, refs),
                         (base.files.hypotheses_dir / name, base_hyps)])  # fmt: skip
            result = paired_bootstrap(base_hyps, hyps, refs, n_samples=n_samples, tokenize=tokenize)
            out.setdefault(hyp_file.stem, []).append((run.seed, result.p_value))
    return out


LENGTH_EDGES = (10, 20, 30, 40)  # words: <10, 10-19, 20-29, 30-39, 40+ (`by_length`)


@dataclass
class LengthTable:
    """BLEU by sentence length on one test set (`by_length`).

    Attributes:
        test_set: The set's name.
        by: What a sentence's length counts: "source" words or, for runs without saved sources,
            "reference" words.
        labels: The buckets, e.g. "<10", "10-19", ..., "40+".
        sentences: Sentences per bucket.
        groups: Per group name, the BLEU of each bucket over its seeds (None for an empty bucket).
    """

    test_set: str
    by: str
    labels: list[str]
    sentences: list[int]
    groups: dict[str, list[Stat | None]]

    def rows(self) -> list[list[str]]:
        """Header plus one row per group: `mean ± std [±95% CI]` of each bucket's BLEU."""
        header = [
            "group",
            *(f"{label} (n={n})" for label, n in zip(self.labels, self.sentences, strict=True)),
        ]
        return [header, *([name, *(_cell(s) for s in stats)] for name, stats in self.groups.items())]


def length_labels(edges: Sequence[int]) -> list[str]:
    """`(10, 20)` -> `["<10", "10-19", "20+"]`."""
    inner = [f"{low}-{high - 1}" for low, high in itertools.pairwise(edges)]
    return [f"<{edges[0]}", *inner, f"{edges[-1]}+"]


def _bleu_tokenizer(path: Path, results: dict[str, Any]) -> str:
    """The BLEU tokenizer the results in file `path` were scored with (their `scoring`: a closed list of
    sacreBLEU's offline tokenizers, so a results file cannot name one that downloads or runs anything
    else; 13a for results from before it was recorded). Read with the run (`read_run`): damaged, it makes
    its run unreadable, not the comparison fail.

    Raises:
        UnreadableRunFile: `scoring` is no object of `MetricsConfig`'s settings, or names another tokenizer.
    """
    from attnlab.metrics import MetricsConfig

    scoring = results.get("scoring", {})
    try:
        if not isinstance(scoring, dict):
            raise TypeError(f'a JSON {json_type(scoring)}, not an object such as {{"bleu_tokenize": "13a"}}')
        return MetricsConfig(**scoring).bleu_tokenize
    except (TypeError, ValueError) as exc:
        raise UnreadableRunFile(f"cannot read {path}: its 'scoring' {scoring!r}: {exc}") from None


def by_length(groups: Sequence[GroupSummary], edges: Sequence[int] = LENGTH_EDGES) -> list[LengthTable]:
    """Per test set that every run of `groups` saved, each group's corpus BLEU (sacreBLEU, with the BLEU
    tokenizer each run scored with: `scoring` in its results, 13a for older runs) on the sentences of
    each length bucket (`edges`: word counts where a bucket starts), over its seeds.

    The sentences are bucketed once per set by the words of the first run's saved sources (all runs of a
    set must have the same references: the same sentences), or of its references when it saved none.

    Raises:
        ValueError: Runs scored different sentences under one set name.
    """
    from attnlab.metrics import corpus_bleu

    runs = [run for group in groups for run in group.runs]
    if not runs:
        return []
    names = set.intersection(*({p.stem for p in r.files.hypotheses_dir.glob("*.txt")} for r in runs))
    tables = []
    for name in sorted(names):
        references = _saved_references(runs[0].files, f"{name}.txt")
        if any(_saved_references(r.files, f"{name}.txt") != references for r in runs[1:]):
            raise ValueError(f"the runs scored different {name!r} sentences: compare runs of one test set")
        sources_file = runs[0].files.sources_dir / f"{name}.txt"
        sources = read_saved_lines(sources_file)
        if sources is not None:
            _same_count([(sources_file, sources), (runs[0].files.references_dir / f"{name}.txt", references)])
        by, counted = ("source", sources) if sources is not None else ("reference", references)
        bucket = [bisect.bisect_right(edges, len(line.split())) for line in counted]
        members = [[i for i, b in enumerate(bucket) if b == k] for k in range(len(edges) + 1)]
        stats: dict[str, list[Stat | None]] = {}
        for group in groups:
            scores: list[list[float]] = [[] for _ in members]
            for run in group.runs:
                tokenize = run.bleu_tokenize  # as the run scored its BLEU
                hyp_file = run.files.hypotheses_dir / f"{name}.txt"
                hypotheses = read_saved_lines(hyp_file) or []
                _same_count([(hyp_file, hypotheses), (run.files.references_dir / f"{name}.txt", references)])
                for k, rows in enumerate(members):
                    if rows:
                        subset = [hypotheses[i] for i in rows], [references[i] for i in rows]
                        scores[k].append(corpus_bleu(*subset, tokenize=tokenize).score)
            stats[group.name] = [stat(s) if s else None for s in scores]
        tables.append(LengthTable(name, by, length_labels(edges), [len(m) for m in members], stats))
    return tables


def _cell(s: Stat | None, digits: int = 2) -> str:
    if s is None:
        return ""
    if s.half_width is None:
        return f"{s.mean:.{digits}f}"
    return f"{s.mean:.{digits}f} ± {s.std:.{digits}f} [±{s.half_width:.{digits}f}]"


def table_rows(groups: Sequence[GroupSummary], metrics: Sequence[str]) -> list[list[str]]:
    """Header plus one row per group: group, seeds, then per metric `mean ± std [±95% CI]` (with `(k runs)`
    where only k of the group's runs have the metric) and its Δ."""
    header = ["group", "seeds"]
    for m in metrics:
        header += [m, f"Δ {m}"]
    tested = sorted({name for g in groups for name in g.p_values})
    header += [f"p {name} (paired bootstrap vs same-seed baseline)" for name in tested]
    rows = [header]
    for g in groups:
        row = [g.name, str(len(g.runs))]
        for m in metrics:
            digits, s = (0 if m in COUNTS else 2), g.stats.get(m)
            fewer = f" ({s.n} runs)" if s is not None and s.n < len(g.runs) else ""  # runs without the metric
            row += [_cell(s, digits) + fewer, f"{g.delta[m]:+.{digits}f}" if m in g.delta else ""]
        for name in tested:
            row.append(", ".join(f"seed {seed}: {p:.3f}" for seed, p in g.p_values.get(name, [])))
        rows.append(row)
    return rows


# LaTeX's special characters in text, and the table's symbols outside ASCII (which pdflatex does not take)
LATEX_ESCAPES = {
    "\\": "\\textbackslash{}", "_": "\\_", "%": "\\%", "&": "\\&", "#": "\\#", "$": "\\$", "{": "\\{",
    "}": "\\}", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}", "<": "\\textless{}",
    ">": "\\textgreater{}", "±": "$\\pm$", "Δ": "$\\Delta$",
}  # fmt: skip


# Markdown's characters that could end a table cell (`|`), start HTML or an autolink (`<`), or undo those
# escapes (`\\`), written escaped in the Markdown report; and the `](` of an inline link or image
# (`![x](https://host/pixel.png)`, an <img> fetched from that host when the report is shown), its `(` escaped
MARKDOWN_ESCAPES = {"\\": "\\\\", "|": "\\|", "<": "\\<"}


def markdown_text(text: str) -> str:
    """`text` (a run's path, error or config value) as one line of Markdown that shows it as text
    (`one_line`, `MARKDOWN_ESCAPES` escaped: `a|b` would split a table cell, `<script>` would be HTML,
    `![x](url)` an image)."""
    return "".join(MARKDOWN_ESCAPES.get(c, c) for c in one_line(text)).replace("](", "]\\(")


# How a cell starts that a spreadsheet opening a CSV file reads as a formula (`=HYPERLINK(...)`, `@SUM(...)`,
# `+`, `-`, and a tab or carriage return before one); and the signed numbers the tables write themselves
# (a Δ: `-10.00`, `+0`, `+inf`), which stay numbers
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
SIGNED_NUMBER = re.compile(r"[+-](\d+(\.\d+)?|inf|nan)")


def spreadsheet_text(text: str) -> str:
    """`text` (a cell of the CSV report: a group's name, made of a run's config keys and values) as a cell a
    spreadsheet shows as text: with a leading `'` when it starts like a formula (`FORMULA_STARTS`), unless
    it is a signed number (`SIGNED_NUMBER`)."""
    if text.startswith(FORMULA_STARTS) and not SIGNED_NUMBER.fullmatch(text):
        return f"'{text}"
    return text


def render(rows: list[list[str]], fmt: str = "md") -> str:
    """The rows as a Markdown table (`md`), CSV (`csv`) or LaTeX tabular (`latex`). Cells are text, whatever
    they hold (a config key or value from a run's `config.yaml`): escaped for Markdown (`markdown_text`) and
    LaTeX (`one_line`, `LATEX_ESCAPES`), quoted in CSV and no spreadsheet formula (`spreadsheet_text`)."""
    if fmt == "csv":
        buffer = io.StringIO()
        csv.writer(buffer).writerows([[spreadsheet_text(cell) for cell in row] for row in rows])
        return buffer.getvalue()
    if fmt == "latex":

        def esc(text: str) -> str:
            return "".join(LATEX_ESCAPES.get(c, c) for c in one_line(text))

        lines = ["\\begin{tabular}{" + "l" * len(rows[0]) + "}", "\\hline"]
        lines.append(" & ".join(esc(c) for c in rows[0]) + " \\\\ \\hline")
        lines += [" & ".join(esc(c) for c in row) + " \\\\" for row in rows[1:]]
        return "\n".join([*lines, "\\hline", "\\end{tabular}"]) + "\n"
    if fmt != "md":
        raise ValueError(f"format {fmt!r}: use md, csv or latex")
    lines = ["| " + " | ".join(map(markdown_text, rows[0])) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(map(markdown_text, row)) + " |" for row in rows[1:]]
    return "\n".join(lines) + "\n"


def main_metric(groups: Sequence[GroupSummary]) -> tuple[str | None, list[str]]:
    """The metric a comparison is about (the first test BLEU, else the first test metric, else the
    validation BLEU, else the validation loss) and the table's columns (test BLEU/chrF/TER or test
    metrics, then `DEFAULT_METRICS`). TER is an error rate: its Δ is better when negative."""
    tested = sorted({m for g in groups for m in g.stats if m.startswith("test/")})
    scores = ("/bleu", "/chrf", "/ter")
    scored = [m for m in tested if m.endswith(scores)] or tested  # BLEU/chrF/TER when translated
    columns = [*scored, *(m for m in DEFAULT_METRICS if any(m in g.stats for g in groups))]
    bleu = [m for m in scored if m.endswith("/bleu")]
    validation = [split_metric("val", m) for m in ("bleu", "loss")]
    validation = [m for m in validation if any(m in g.stats for g in groups)]
    main = (bleu or scored or validation or [None])[0]
    return main, columns
