"""The Hydra application shared by the commands: where the configs live, the resolvers they use, the
callback that checks run directories before Hydra writes into them, and the refusal of a config file
Hydra cannot load (`unloadable_config_refused`) and of an override naming an option or key the config does
not have, or that Hydra cannot apply or parse (`composition_errors_refused`)."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import secrets
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from attnlab.io import (
    FileLock,
    error_reason,
    held_elsewhere,
    missing_directories,
    path_exists,
    remove_empty_directories,
)
from attnlab.runs.layout import (
    JOB_DIRNAME_BYTES,
    MANIFEST_FILE,
    RUN_LOCK,
    SWEEP_RECORD,
    RunDir,
    UnreadableRunFile,
    check_no_credentials,
    check_path_length,
    drop_kept_sweep_records,
    job_setting,
    keep_sweep_record,
    launched_rank,
    put_back_sweep_record,
    recover_kept_sweep_records,
    setting_overrides,
    yaml_problem,
)
from attnlab.runs.manifest import Manifest
from attnlab.training.resume import continues_own_run
from attnlab.typed import ConfigError, did_you_mean


def config_dir() -> Path:
    """The packaged configs (a wheel install) or the repository's `conf/` (an editable install)."""
    package = Path(__file__).resolve().parents[1]  # src/attnlab, or site-packages/attnlab
    packaged = package / "conf"
    return packaged if packaged.is_dir() else package.parents[1] / "conf"


def job_dirname(overrides: Sequence[str], sweep_dir: str | None = None) -> str:
    """A multirun job's directory name from its overrides (Hydra's `hydra.overrides.task`), bookkeeping
    ones left out (`attnlab.runs.layout.setting_overrides`: `logger=...`, `paths.`, `sweep.`, `resume`),
    sorted: readable (keys shortened to their last part), filesystem-safe, and ending in a hash of those
    overrides, so two jobs never share a directory and the same job of a re-run sweep finds its directory
    again, whatever logger the re-run uses: `model.pe=learned seed=2 logger=csv` ->
    `pe=learned,seed=2-1b2c3d4e`. Under `sweep_dir`, a directory a job of the same setting overrides wrote
    before (`earlier_job_dir`: named with its bookkeeping overrides, as sweeps made before were) is that
    name when none has it yet, so `sweep.skip_done` and `resume=auto` find those jobs too."""
    kept = job_setting(overrides)
    digest = hashlib.sha256(kept.encode("utf-8")).hexdigest()[:8]
    short = [f"{key.rsplit('.', 1)[-1]}={value}" for key, _, value in (item.partition("=") for item in
             kept.split(",") if "=" in item)]  # fmt: skip
    readable = re.sub(r"[^A-Za-z0-9=,._+-]", "_", ",".join(short))[: JOB_DIRNAME_BYTES - 9]
    name = f"{readable}-{digest}" if readable else digest
    if sweep_dir is None or path_exists(Path(sweep_dir) / name):
        return name
    return earlier_job_dir(Path(sweep_dir), kept) or name


def earlier_job_dir(sweep_dir: Path, kept: str) -> str | None:
    """The name of a directory of `sweep_dir` whose `manifest.json` records a job with the setting
    overrides `kept` (`job_setting`), a finished one first; None if none does."""
    found = []
    for manifest_file in sorted(sweep_dir.glob(f"*/{MANIFEST_FILE}")):
        try:
            manifest = Manifest.read(RunDir(manifest_file.parent))
        except UnreadableRunFile:
            continue
        overrides = manifest.get("overrides")
        if isinstance(overrides, list) and job_setting(overrides) == kept:
            found.append((manifest.get("status") != "finished", manifest_file.parent.name))
    return min(found)[1] if found else None


def sweep_overrides(config: DictConfig) -> list[tuple[str, str, bool]]:
    """What a multirun's sweeper sweeps by, each with where it is given and whether it sweeps (a list of
    values, a range, a distribution; one that can take a single value does not sweep): the `key=value` of
    every entry of `hydra.sweeper.params` (as Hydra's basic and Optuna's sweepers read it; an experiment
    file can declare its sweep there), or, when that is null, of Optuna's deprecated
    `hydra.sweeper.search_space` (`key={type: categorical, choices: [...]}`, each a distribution: its
    sweeper reads it only then; `_takes_several_values`), then the command line's overrides
    (`hydra.overrides.task`; like `hydra.sweeper.params`, `_override_takes_several_values`). A key given
    again on the command line is the command line's alone (`allocator=keep` over a declared
    `allocator: keep,release`): both sweepers take that one.

    Raises:
        ConfigError: An entry of `hydra.sweeper.params` is no override Hydra's grammar reads (`learned,`,
            `choice(a`), which its sweeper fails on; naming the entry and the forms it takes.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()

    def parsed(line: str, where: str = "the command line") -> tuple[str, bool]:  # its key, whether it sweeps
        try:  # (the key keeps its `+` and `@package`)
            (override,) = parser.parse_overrides([line])
        except OverrideParseException as exc:  # (the command line's were parsed by Hydra already)
            raise ConfigError(
                f"{line} (in {where}) is not an override Hydra's sweeper can read: "
                f"{_unparsable_reason(exc)}: give its values as a,b,c, choice(a,b), range(start,stop,step) "
                "or interval(low,high), quoting a value that holds a comma, bracket or brace"
            ) from None
        return override.get_key_element(), _override_takes_several_values(override)

    declared, where = OmegaConf.select(config, "hydra.sweeper.params"), "hydra.sweeper.params"
    if declared is None:
        declared, where = OmegaConf.select(config, "hydra.sweeper.search_space"), "hydra.sweeper.search_space"
    entries = OmegaConf.to_container(declared, resolve=False) if isinstance(declared, DictConfig) else {}
    found: dict[str, tuple[str, str, bool]] = {}  # each key's last entry
    for key, value in entries.items():
        if where == "hydra.sweeper.params":
            name, swept = parsed(f"{key}={value}", where)
            found[name] = (f"{key}={value}", where, swept)
        else:
            flow = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6).strip()
            found[str(key)] = (f"{key}={flow}", where, _takes_several_values(value))
    for item in (str(item) for item in OmegaConf.select(config, "hydra.overrides.task") or []):
        key, swept = parsed(item)
        found.pop(key, None)
        found[key] = (item, "the command line", swept)
    return list(found.values())


def _override_takes_several_values(override: Any) -> bool:
    """Whether a parsed Hydra override (of the command line, or of `hydra.sweeper.params`) sweeps: it gives
    its key more than one value (`allocator=keep,release`), as a list, `choice`, `range` or `interval`.
    One of a single value (`choice(keep)`, `keep,keep`, `range(1,2)`, `interval(1,1)`) gives every job
    that value, as `allocator=keep` does, in both sweepers (Optuna's `single()` distribution, as for a
    `search_space` entry: `_takes_several_values`). A `glob` of config options, which only Hydra's config
    loader lists, counts as sweeping."""
    from hydra.errors import HydraException

    if not override.is_sweep_override():
        return False
    if override.is_interval_sweep():
        return bool(override.value().start != override.value().end)
    try:
        values = override.sweep_string_iterator()
    except (HydraException, ValueError):  # (a glob; a range of step 0: `check_sweep_values` refuses it)
        return True
    first = next(values, None)
    return any(value != first for value in values)


def _takes_several_values(entry: Any) -> bool:
    """Whether an Optuna `search_space` entry sweeps: the distribution its sweeper builds from it can take
    more than one value (not a categorical of one choice, nor a range of one value, `low == high` or a
    `step` beyond `high`: Optuna's `single()`). One the sweeper cannot build counts as sweeping (it is
    refused when the sweep starts)."""
    try:
        from hydra_plugins.hydra_optuna_sweeper._impl import create_optuna_distribution_from_config

        with warnings.catch_warnings():  # (Optuna's warning of a step that does not divide the range)
            warnings.simplefilter("ignore")
            return not create_optuna_distribution_from_config(entry).single()
    except (ImportError, AssertionError, AttributeError, KeyError, TypeError, ValueError):
        return True


def check_sweep_values(config: DictConfig) -> None:
    """Refuse, before any job, a swept override (on the command line or in `hydra.sweeper.params`) that its
    sweeper cannot run, which failed with a traceback once the sweep had started, or, a range of no value
    under Hydra's basic sweeper, ran no job and said nothing: a `range` with a step of 0 or of no value
    (`range(5,1)`: it counts up to its stop, a negative step down), under Optuna's sweeper one counting
    down, an `interval` that starts above its end, an `interval` under Hydra's basic sweeper (only Optuna's
    samples one), Optuna's `hydra.sweeper.n_trials` or the basic sweeper's `max_batch_size` below 1 (no
    trial, no job), and a key swept on the command line then given again (`seed=1,2 seed=3`: both
    sweepers take the last alone, the swept values silently dropped; a value given again, `seed=1 seed=2`,
    is overridden, as in a single run).

    Raises:
        ConfigError: Naming the override, where it is given, and the fix.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweeper = str(OmegaConf.select(config, "hydra.sweeper._target_") or "")
    optuna, parser = sweeper.endswith("OptunaSweeper"), OverridesParser.create()
    trials = OmegaConf.select(config, "hydra.sweeper.n_trials") if optuna else None
    if isinstance(trials, int) and trials < 1:
        raise ConfigError(f"hydra.sweeper.n_trials={trials} runs no trial: give 1 or more")
    batch = (
        OmegaConf.select(config, "hydra.sweeper.max_batch_size") if sweeper.endswith("BasicSweeper") else None
    )
    if isinstance(batch, int) and batch < 1:
        raise ConfigError(
            f"hydra.sweeper.max_batch_size={batch} launches no job: give 1 or more, or null (all)"
        )
    given: dict[str, str] = {}
    for line in (str(item) for item in OmegaConf.select(config, "hydra.overrides.task") or []):
        (override,) = parser.parse_overrides([line])
        key = override.get_key_element().lstrip("+~")
        if key in given:
            raise ConfigError(
                f"{key} is given twice on the command line ({given[key]}, {line}): the sweeper takes the "
                "last alone, not the values swept before; give it once, with every value to sweep"
            )
        if _override_takes_several_values(override):
            given[key] = line
    for line, where, _ in sweep_overrides(config):
        if where != "hydra.sweeper.search_space":
            (override,) = parser.parse_overrides([line])
            problem = _unsweepable(override, optuna, sweeper.endswith("BasicSweeper"))
            if problem:
                raise ConfigError(f"{line} (in {where}) {problem}")


def _unsweepable(override: Any, optuna: bool, basic: bool) -> str | None:
    """Why the sweeper (Optuna's, Hydra's basic one, or another) cannot sweep this parsed override, with the
    fix; None if it can (or does not sweep)."""
    value = override.value() if override.is_sweep_override() else None
    if override.is_interval_sweep():
        if basic:
            return ("is an interval, which Hydra's basic sweeper cannot sweep: list its values (a,b,c or "
                    "range(start,stop,step)), or search it with hparams_search=optuna")  # fmt: skip
        if value.start > value.end:
            return f"starts above its end: give interval({value.end},{value.start})"
    if not override.is_range_sweep():
        return None
    if value.step == 0:
        return "has a step of 0, which never reaches its stop: give a step other than 0"
    if optuna and not value.shuffle and (value.step < 0 or value.start > value.stop):
        return f"counts down, which Optuna's sweeper cannot sample: give range({value.stop},{value.start})"
    if next(iter(override.sweep_string_iterator()), None) is None:
        return ("gives no value: range(start,stop,step) counts from start up to stop (stop left out), a "
                "negative step down")  # fmt: skip
    return None


def check_no_swept_bookkeeping(config: DictConfig) -> None:
    """Refuse a multirun that sweeps a bookkeeping key (`attnlab.runs.layout.setting_overrides`), on the
    command line (`allocator=keep,release`) or in what the sweeper reads from the config
    (`hydra.sweeper.params`, Optuna's `hydra.sweeper.search_space`: `sweep_overrides`): its jobs would
    differ in nothing that names their directory (`job_dirname`), nor in their setting (W&B groups and
    attnlab-compare would take them for runs of one setting). A "sweep" of one value, wherever it is given
    (`allocator=choice(keep)`, a categorical of one choice), sweeps nothing and is not refused.

    Raises:
        ConfigError: Naming the override, where it is given, and the fix.
    """
    for line, where, swept in sweep_overrides(config):
        if swept and not setting_overrides([line]):
            raise ConfigError(
                f"{line} (in {where}) sweeps a bookkeeping key (attnlab.runs.layout.BOOKKEEPING): its jobs "
                "would share one job directory and count as one setting; run one sweep per value, each "
                "with its own hydra.sweep.dir"
            )


# The run directory of this process's command (`hydra.run.dir`, resolved; a multirun's `hydra.sweep.dir`) ->
# it and its parents that were missing when the command started (`RunDirectoryCheck.on_run_start`,
# `on_multirun_start`): Hydra makes them
_made_for_this_run: dict[Path, set[Path]] = {}
# The run directory's lock, claimed by `RunDirectoryCheck.on_run_start` for the whole command, and whether
# the claim made its file
_claimed_for_this_run: list[tuple[FileLock, bool]] = []
# A multirun's existing sweep directory -> the bytes of its `multirun.yaml` when the command started (None:
# there was none), which Hydra writes over before it composes the first job (a copy kept on disk too until a
# job starts: `keep_sweep_record`), and the names it held then (`RunDirectoryCheck.on_multirun_start`)
_sweep_records_before: dict[Path, tuple[bytes | None, frozenset[str]]] = {}


@contextmanager
def refusal_leaves_no_run_directory(task: str) -> Iterator[None]:
    """Run the command `attnlab-<task>` (`train`, `eval`, `export`); when it is refused with its one-line
    message (a `SystemExit` with text: a config error, a missing file), remove the run directory Hydra made
    for it (a multirun's sweep directory) if it holds nothing but Hydra's record (`.hydra/`, a sweep's
    `multirun.yaml`) and log (`<task>.log`), with the parents made along with it: a mistyped command
    leaves no empty run behind (nor a sweep refused before its first job ran). A directory that existed
    before the command, or that holds anything the command wrote (a manifest, a checkpoint), is kept; a
    sweep directory that existed gets back the `multirun.yaml` it held (or none) when the sweep is refused
    before any job of it ran (`_restore_sweep_records`), from a copy kept on disk until a job starts: a
    command killed before it put the record back leaves the copy, and the next multirun there puts it
    back (`attnlab.runs.layout.recover_kept_sweep_records`). The run directory's lock the command claimed
    (`RunDirectoryCheck`) is held until then; a refused command deletes its file if the claim made it.
    Refused (`_refused`) are also a config file Hydra cannot load while composing (not YAML, not a mapping:
    `unloadable_config_refused`), an option or key of an override that does not exist (also found as Hydra
    composes a sweep's jobs: `composition_errors_refused`) and Hydra's other composition errors, with or
    without `HYDRA_FULL_ERROR=1`, and a config group set to null on the command line
    (`null_group_refused`)."""
    try:
        null_group_refused(task, sys.argv[1:])
        with unloadable_config_refused(task), composition_errors_refused(task):
            yield
    except BaseException as exc:
        refused = _refused(exc)
        claims = {lock.path.resolve(): (lock, made) for lock, made in _claimed_for_this_run}
        for run_dir, missing in _made_for_this_run.items():
            lock, made = claims.get(run_dir / RUN_LOCK, (None, False))
            removed = refused and run_dir in missing and _remove_hydra_record(run_dir, lock is not None)
            if lock is not None:  # its file last, while still held (`FileLock.release`)
                lock.release(delete=refused and made)
            if removed:
                remove_empty_directories(missing)
        if refused:
            _restore_sweep_records()
        raise
    finally:
        _made_for_this_run.clear()
        drop_kept_sweep_records()
        _sweep_records_before.clear()
        while _claimed_for_this_run:
            _claimed_for_this_run.pop()[0].release()


def _refused(exc: BaseException) -> bool:
    """Whether `exc` ending a command refuses it for its config: a `SystemExit` with text (its one-line
    message), or Hydra's composition error (`ConfigCompositionException`) or attnlab's `ConfigError` (a
    config file Hydra cannot load, a config option or key that does not exist), raised
    (`HYDRA_FULL_ERROR=1`) or reported by Hydra, which then exits with status 1 (a `SystemExit` raised while
    handling it)."""
    from hydra.errors import ConfigCompositionException

    if isinstance(exc, SystemExit):
        if isinstance(exc.code, str):
            return True
        exc = exc.__context__  # (what Hydra reported, if it did)
    return isinstance(exc, (ConfigCompositionException, ConfigError))


def _restore_sweep_records() -> None:
    """Put back the `multirun.yaml` each existing sweep directory held when the command started (remove
    the one Hydra wrote where there was none), and remove the job directories this multirun made there
    that hold nothing but Hydra's record and log (a job refused as it starts: `_remove_refused_jobs`),
    unless a job of this multirun ran (`multirun_summary`): then Hydra's describes the jobs the directory
    holds now."""
    from attnlab.training.launchers import multirun_summary

    if multirun_summary() is not None:
        return
    for directory, (data, names) in _sweep_records_before.items():
        _remove_refused_jobs(directory, names)
        put_back_sweep_record(directory, data)


def _remove_refused_jobs(sweep_dir: Path, kept: frozenset[str] = frozenset()) -> None:
    """Remove the job directories of `sweep_dir` (but those named in `kept`, there before the command) that
    hold nothing but their own Hydra record and log: what a job refused as it starts leaves
    (`attnlab.cli.train.check_launcher`)."""
    for job in sweep_dir.iterdir():
        if job.name in kept or job.name == ".hydra" or not job.is_dir() or job.is_symlink():
            continue
        if _remove_hydra_record(job, False):
            job.rmdir()


def _remove_hydra_record(run_dir: Path, claimed: bool) -> bool:
    """Remove `run_dir`'s `.hydra/`, top-level `*.log` files and `multirun.yaml` (a sweep's record) if it
    holds nothing else (but the lock file, when this command `claimed` the directory; in a sweep's, the
    job directories holding nothing but their own record and log, as a job refused as it starts leaves
    them, `attnlab.cli.train.check_launcher`: removed first); whether it did. A `run_dir` that does not
    exist, or cannot (`attnlab.io.path_exists`: a name too long for the file system), holds nothing."""
    if not path_exists(run_dir):
        return True
    record, sweep = run_dir / ".hydra", run_dir / "multirun.yaml"
    if sweep.is_file():
        _remove_refused_jobs(run_dir)
    found = [p for p in run_dir.rglob("*") if not (claimed and p == run_dir / RUN_LOCK)]
    hydras = [p for p in found if p == record or (p.parent == record and p.is_file() and not p.is_symlink())]
    logs = [p for p in found if p.parent == run_dir and p.is_file() and (p.suffix == ".log" or p == sweep)]
    if len(hydras) + len(logs) != len(found):
        return False
    for path in [*logs, *hydras[::-1]]:
        (path.rmdir if path == record else path.unlink)()
    return True


def null_group_refused(task: str, arguments: Sequence[str]) -> None:
    """End `attnlab-<task>` with one line when a command-line argument sets a config group of the packaged
    configs to null (`model=null`, `experiment=null`): Hydra refuses it with a `ValueError` traceback
    ("Config group override must be a string or a list"). The line names the group's options and `~group`,
    which leaves an optional group out."""
    for argument in arguments:
        found = re.fullmatch(r"\+{0,2}([\w./-]+)=(?:null|None)?", argument)
        group = config_dir() / found[1].replace(".", "/") if found else None
        if group is None or not group.is_dir():
            continue
        options = sorted(path.stem for path in group.glob("*.yaml"))
        _refuse(task, f"{argument}: a config group takes one of its options by name ({found[1]}=<name>: "
                f"{', '.join(options)}); ~{found[1]} leaves it out", None)  # fmt: skip


@contextmanager
def unloadable_config_refused(task: str) -> Iterator[None]:
    """While it runs, a config file that Hydra cannot load as it composes the config (from a file or package
    config source: `--config-dir`, `hydra.searchpath`, the packaged configs) ends the command with one line,
    `attnlab-<task>: config error: <file> ...` naming the file, the line, the problem and the fix
    (`config_file_problem`), instead of PyYAML's traceback: a file that is not YAML (a syntax error, a tab
    indenting), gives a key twice in one mapping, holds a second YAML document (after a `---` line), is not
    UTF-8 text or cannot be read, or holds a list or a scalar instead of a mapping of keys to values. With
    `HYDRA_FULL_ERROR=1` the message is a `ConfigError` raised from the loading error, with its traceback."""
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.plugins import Plugins

    Plugins.instance()  # (registers the config sources: the classes Hydra uses, from its scan of plugins)
    sources = [SourcesRegistry.instance().resolve(scheme) for scheme in ("file", "pkg")]
    loads = {source: source.__dict__["load_config"] for source in sources}
    for source, load in loads.items():
        source.load_config = _refusing_unloadable(load, task)
    try:
        yield
    finally:
        for source, load in loads.items():
            source.load_config = load


def _refusing_unloadable(load: Callable[[Any, str], Any], task: str) -> Callable[[Any, str], Any]:
    """A config source's `load_config`, a file it cannot load as a config refusing `attnlab-<task>`."""
    from hydra.errors import HydraException

    @functools.wraps(load)
    def checked(source: Any, config_path: str) -> Any:
        try:
            result = load(source, config_path)
        except HydraException:  # (not found: Hydra's own message)
            raise
        except (yaml.YAMLError, UnicodeDecodeError, OSError, OmegaConfBaseException) as exc:
            _refuse(task, config_file_problem(source, config_path, exc), exc)
        problem = _not_a_mapping(source, config_path, result.config)
        if problem is not None:
            _refuse(task, problem, None)
        return result

    return checked


@contextmanager
def composition_errors_refused(task: str) -> Iterator[None]:
    """While it runs, a command-line override Hydra refuses as it composes the config (the command's own
    config, or a multirun job's) ends the command with one line, `attnlab-<task>: config error: ...`
    (`composition_problem`), instead of Hydra's message of several lines (the options one a line, the
    config search path, a hint of `HYDRA_FULL_ERROR=1`): an option a config group does not have
    (`model=smal`, or in a config file's defaults list, named by the line), a key the config does not have
    (`trainer.max_epoc=3`, `~trainer.max_epoc`), a key or group appended that it has (`+seed=3`,
    `+model=small`), an override that is not Hydra's grammar (`model.d_model=[`). Other composition errors
    keep Hydra's message. With `HYDRA_FULL_ERROR=1` the line is a `ConfigError` raised from Hydra's error,
    with its traceback."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    load = ConfigLoaderImpl.__dict__["load_configuration"]
    ConfigLoaderImpl.load_configuration = _refusing_composition_errors(load, task)
    try:
        yield
    finally:
        ConfigLoaderImpl.load_configuration = load


def _refusing_composition_errors(load: Callable[..., Any], task: str) -> Callable[..., Any]:
    """Hydra's config loader's `load_configuration`, a composition error `composition_problem` words (an
    override naming no option or key, ...) refusing `attnlab-<task>`."""
    from hydra.errors import ConfigCompositionException, OverrideParseException

    @functools.wraps(load)
    def checked(loader: Any, config_name: str | None, overrides: list[str], *args: Any, **kwargs: Any) -> Any:
        try:
            return load(loader, config_name, overrides, *args, **kwargs)
        except (ConfigCompositionException, OverrideParseException) as exc:
            problem = composition_problem(exc, overrides)
            if problem is None:
                raise
            _refuse(task, problem, exc)

    return checked


def composition_problem(exc: Exception, overrides: Sequence[str]) -> str | None:
    """The one line for Hydra's composition error `exc` caused by one of `overrides` (as typed) or by a
    config file's defaults list, naming the problem, the closest names (`difflib`) and the fix; None for any
    other error (Hydra's message stays): an option a group does not have, chosen on the command line
    (`model=smal: no option 'smal' in group model (did you mean small?); options: base, big, mini, small,
    tiny`) or in a config file (`my_conf/experiment/mine.yaml: no option 'smal' in group model, which its
    defaults list chooses (did you mean small?); ...`, `_option_problem`); a key the config does not have
    (`trainer.max_epoc: no such key in trainer (did you mean trainer.max_epochs?); add a new key with
    +trainer.max_epoc=...`), also to delete (`~trainer.max_epoc`, `_deletion_problem`); a key or group
    appended with `+` that the config already has (`_append_problem`); an override that is not Hydra's
    grammar (`_grammar_problem`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(exc, OverrideParseException):
        return _grammar_problem(exc)
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException:
        return None
    if isinstance(exc, MissingConfigException):
        return _option_problem(exc, parsed) if exc.options else None
    return _key_problem(exc, parsed) or _deletion_problem(exc, parsed) or _append_problem(exc, parsed)


def _option_problem(exc: Any, parsed: Sequence[Any]) -> str | None:
    """The line for Hydra's `MissingConfigException` `exc` of an option its group does not have, chosen by
    one of the `parsed` overrides or, failing that, by the defaults list of a config file (an `override
    /group: name` there, or a plain entry), which the line names; None when neither is found."""
    from hydra._internal.config_repository import IConfigRepository
    from hydra._internal.defaults_list import Overrides
    from hydra.core.default_element import DefaultsTreeNode

    group, _, name = str(exc.missing_cfg_file).rpartition("/")
    close = f"{_close_match(name, exc.options)}; options: {', '.join(exc.options)}"
    for override in parsed:
        if f"{override.key_or_group}/{override.value()}" == exc.missing_cfg_file:
            return f"{override.input_line}: no option '{name}' in group {group}{close}"
    chosen = _hydra_local(exc, "overrides", Overrides)
    tree = _hydra_local(exc, "tree", DefaultsTreeNode)
    overridden = chosen.override_metadata if chosen is not None else {}
    metas = [meta for key, meta in overridden.items() if key.split("@")[0] == group]
    containing = None
    if metas:  # (the option an override chose: the file it is in; None for the command line's)
        containing = metas[0].containing_config_path
    elif tree is not None and tree.parent is not None:  # (the file whose defaults list names it)
        containing = tree.parent.node.get_config_path()
    repo = _hydra_local(exc, "repo", IConfigRepository)
    found = repo.get_sources() if containing and repo is not None else []
    sources = [source for source in found if source.is_config(containing)]
    if not sources:
        return None
    file = _config_file(sources[0], containing)[0]
    return f"{file}: no option '{name}' in group {group}, which its defaults list chooses{close}"


def _key_problem(exc: Exception, parsed: Sequence[Any]) -> str | None:
    """The line for Hydra's error `exc` of a key one of the `parsed` overrides sets that the config does
    not have (OmegaConf's `ConfigKeyError` or `ConfigAttributeError` its cause); None for another error."""
    cause = exc.__cause__
    if not isinstance(cause, (ConfigKeyError, ConfigAttributeError)) or not cause.full_key:
        return None
    parent, _, name = str(cause.full_key).rpartition(".")
    known = [str(key) for key in cause.parent_node] if isinstance(cause.parent_node, DictConfig) else []
    for override in parsed:
        key = override.key_or_group
        if override.package is None and (key == cause.full_key or key.startswith(f"{cause.full_key}.")):
            close = _close_match(name, known, f"{parent}." if parent else "", key[len(cause.full_key) :])
            return f"{key}: no such key in {parent or 'the config'}{close}; add a new key with +{key}=..."
    return None


def _deletion_problem(exc: Exception, parsed: Sequence[Any]) -> str | None:
    """The line for Hydra's error `exc` of a key one of the `parsed` overrides deletes (`~key`) that the
    config does not have, with the closest key of the config Hydra composed; or that it has with the value
    null, which Hydra takes for no key. None for another error."""
    found = re.fullmatch(r"Could not delete from config\. '(.+)' does not exist\.", str(exc))
    config = _hydra_local(exc, "cfg", DictConfig)
    deleted = [o for o in parsed if found and o.is_delete() and o.key_or_group == found[1] and not o.package]
    if not deleted or config is None:
        return None
    parts, node = found[1].split("."), config
    for depth, part in enumerate(parts):
        known = [str(key) for key in node] if isinstance(node, DictConfig) else []
        if part not in known:
            parent, rest = ".".join(parts[:depth]), "".join(f".{p}" for p in parts[depth + 1 :])
            close = _close_match(part, known, f"~{parent}." if parent else "~", rest)
            return f"{deleted[0].input_line}: no such key in {parent or 'the config'} to delete{close}"
        node = node._get_node(part)
    return (f"{deleted[0].input_line}: {found[1]} is null, which Hydra cannot delete (it takes a null value "
            f"for no key): leave it null, or set it with {found[1]}=<value>")  # fmt: skip


def _append_problem(exc: Exception, parsed: Sequence[Any]) -> str | None:
    """The line for Hydra's error `exc` of a key or config group one of the `parsed` overrides appends with
    `+` that the config already has: set or choose it without the `+`. None for another error."""
    key = re.match(r"Could not append to config\. An item is already at '(.+)'\.", str(exc))
    group = re.match(r"Multiple values for ([^\s@]+)[@.]", str(exc))
    for override in parsed:
        if not override.is_add():
            continue
        plain = override.input_line[1:]
        if key and override.key_or_group == key[1]:
            return (f"{override.input_line}: {key[1]} is already in the config: set it with {plain} "
                    f"(++{plain} sets it whether or not it is there)")  # fmt: skip
        if group and override.key_or_group == group[1]:
            return f"{override.input_line}: group {group[1]} already has an option: choose it with {plain}"
    return None


def _grammar_problem(exc: Any) -> str:
    """The line for Hydra's `OverrideParseException` `exc`: the override that is not Hydra's grammar, why
    (`_unparsable_reason`) and where the grammar is described."""
    guide = str(exc).splitlines()[-1].removeprefix("See ").removesuffix(" for details")
    return f"{exc.override}: not an override Hydra can parse ({_unparsable_reason(exc)}); see {guide}"


def _unparsable_reason(exc: Any) -> str:
    """Why Hydra's override parser refused an override (its `OverrideParseException` `exc`), on one line:
    the character its lexer stopped at, or its parser's message (`no viable alternative at input '['`)."""
    lines = str(exc).splitlines()
    lexer = "LexerNoViableAltException: "
    if lines[0].startswith(lexer) and len(lines) > 2:
        at = len(lines[1]) - len(lexer) - 1  # (the column of Hydra's `^` under the override)
        return f"{exc.override[at : at + 1]!r} at character {at + 1} is not allowed there"
    said = [line.strip() for line in lines[:-1] if not line.startswith("Error parsing override")]
    return "; ".join(line for line in said if line)


def _hydra_local(exc: BaseException, name: str, kind: type) -> Any:
    """The value of the variable `name` (an instance of `kind`) in the innermost frame of `exc`'s traceback
    that has one (Hydra's, where it raised `exc`), or None: Hydra's error carries neither the config it
    composed nor the config file an option came from."""
    found, frames = None, exc.__traceback__
    while frames is not None:
        value = frames.tb_frame.f_locals.get(name)
        found = value if isinstance(value, kind) else found
        frames = frames.tb_next
    return found


def _close_match(name: str, known: Sequence[str], prefix: str = "", suffix: str = "") -> str:
    """` (did you mean <prefix><the known name closest to name><suffix>?)`, or "" when none is close."""
    hint = did_you_mean(name, list(known), prefix, suffix).strip()
    return f" ({hint})" if hint else ""


def _refuse(task: str, problem: str, cause: Exception | None) -> NoReturn:
    """End `attnlab-<task>` with the config error `problem` on one line; with `HYDRA_FULL_ERROR=1`, raise it
    as a `ConfigError` from `cause`, with its traceback."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise ConfigError(problem) from cause
    raise SystemExit(f"attnlab-{task}: config error: {problem}") from None


def _config_file(source: Any, config_path: str) -> tuple[str, Any]:
    """The name of the file `config_path` of a Hydra config source, as a user finds it (a path; `pkg://...`
    in a package), and the file (its `read_bytes()`)."""
    normalized = source._normalize_file_name(config_path)
    if source.scheme() == "file":
        return str(Path(source.path) / normalized), Path(source.path) / normalized
    return f"{source.scheme()}://{source.path}/{normalized}", resources.files(source.path).joinpath(
        normalized
    )


def config_file_problem(source: Any, config_path: str, exc: Exception) -> str:
    """What stopped a Hydra config source from loading its config file `config_path` (`exc`), with the fix,
    on one line naming the file and the line: YAML's error (`yaml_problem`; a second document named by the
    line of its `---`), text that is not UTF-8 or holds a character YAML does not allow, a scalar at the
    top level (`_not_a_mapping`), a file that cannot be read."""
    name, file = _config_file(source, config_path)
    if isinstance(exc, yaml.MarkedYAMLError):
        problem = yaml_problem(exc)
        if (exc.problem or "").startswith("found duplicate key"):
            return f"{name}: {problem}"
        if (exc.problem or "").startswith("but found another document"):  # (after a `---` line)
            return (
                f"{name} holds more than one YAML document: {problem}: a config file is one document; join "
                "them (remove that --- line) or move the second to a file of its own"
            )
        fix = (
            "indent with spaces, YAML allows no tabs there"
            if "'\\t'" in problem
            else "correct the YAML there"
        )
        return f"{name} is not valid YAML: {problem}: {fix}"
    try:
        data = file.read_bytes()
    except OSError as unreadable:
        return f"{name} cannot be read: {unreadable.strerror or unreadable}: make it a readable file"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as bad:
        line = data[: bad.start].count(b"\n") + 1
        return f"{name} is not UTF-8 text (byte 0x{data[bad.start]:02x} on line {line}): save it as UTF-8"
    if isinstance(exc, yaml.reader.ReaderError) and isinstance(exc.character, int):
        line = text[: exc.position].count("\n") + 1
        return f"{name} holds U+{exc.character:04X} on line {line}, which YAML does not allow: remove it"
    top = _top_level(text)
    if top is not None and not isinstance(top, yaml.MappingNode):
        return _not_a_mapping_message(name, top)
    reason = error_reason(exc)
    return f"{name} cannot be loaded as a config: {reason}: correct the file"


def _top_level(text: str) -> yaml.Node | None:
    """The top-level node of the YAML document `text` (None for an empty one, or one that is not YAML)."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None


def _not_a_mapping(source: Any, config_path: str, config: Any) -> str | None:
    """Why the config a Hydra config source loaded from `config_path` is not one, with the fix: its file
    holds a list or a scalar (a string, which OmegaConf would take as a key without a value) instead of a
    mapping of keys to values; None when it is a mapping (or empty)."""
    plain = OmegaConf.to_container(config, resolve=False) if isinstance(config, DictConfig) else None
    if isinstance(plain, dict) and not (len(plain) == 1 and next(iter(plain.values())) is None):
        return None
    name, file = _config_file(source, config_path)
    try:
        top = _top_level(file.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError):  # (it was read a moment ago: as loaded, then)
        top = None
    if top is None or isinstance(top, yaml.MappingNode):
        return None
    return _not_a_mapping_message(name, top)


def _not_a_mapping_message(name: str, top: yaml.Node) -> str:
    """`name` holds `top`, a YAML list or scalar, not a mapping: the message, with the fix."""
    kind = "list" if isinstance(top, yaml.SequenceNode) else "scalar"
    return (
        f"{name} holds a YAML {kind} (line {top.start_mark.line + 1}), not a mapping of keys to values: a "
        "config file is `key: value` lines (or empty)"
    )


def hydra_output_subdir(output_dir: Any, resume: Any = False, ckpt_path: Any = None) -> str | None:
    """Where Hydra records a command (`hydra.output_subdir`): `.hydra`, but nowhere (None) when the run in
    `output_dir` has its record already and the command continues it (`resume=true|auto`,
    `ckpt_path=last`) or the run holds checkpoints or finished (a multirun job that `sweep.skip_done`
    skips, or that is refused, `attnlab.cli.train._held_run`), or another live process holds the directory
    (a multirun job there is refused, `RunDir.lock`, after Hydra wrote its record: a single run claims its
    directory before, `RunDirectoryCheck`). A resumption keeps the record of the run's first command (each
    resumption's command is in `manifest.json`), and a skipped or refused one leaves the run directory as
    it was. A process of rank > 0 (`launched_rank`: torchrun, SLURM tasks) records nowhere, as Lightning's
    own launcher has its ranks do: rank 0 records the command."""
    if launched_rank() != 0:
        return None
    run = RunDir(Path(str(output_dir)))
    if held_elsewhere(run.run_lock):
        return None
    if not (run.path / ".hydra").is_dir():
        return ".hydra"
    checkpoints, status = run.saved_training()
    return None if continues_own_run(resume, ckpt_path) or checkpoints or status == "finished" else ".hydra"


def register_resolvers() -> None:
    """`${attnlab.run_id:}`: a fresh id per composed config (pid + random), so run dirs never collide;
    `${attnlab.job_dir:<overrides>,<sweep dir>}`: `job_dirname`;
    `${attnlab.output_subdir:<dir>,<resume>,<ckpt_path>}`: `hydra_output_subdir`;
    `${attnlab.env:<VAR>,<default>}`: the environment variable, or `default` where it is unset or empty (an
    empty `ATTNLAB_LOG_DIR` put runs under the filesystem's root, `/train/runs/`)."""
    if not OmegaConf.has_resolver("attnlab.env"):
        OmegaConf.register_new_resolver("attnlab.env", lambda name, default: os.environ.get(name) or default)
    if not OmegaConf.has_resolver("attnlab.output_subdir"):
        OmegaConf.register_new_resolver("attnlab.output_subdir", hydra_output_subdir)
    if not OmegaConf.has_resolver("attnlab.run_id"):
        OmegaConf.register_new_resolver(
            "attnlab.run_id", lambda: f"{os.getpid():x}-{secrets.token_hex(3)}", use_cache=True
        )
    if not OmegaConf.has_resolver("attnlab.job_dir"):
        OmegaConf.register_new_resolver(
            "attnlab.job_dir",
            lambda overrides=(), sweep_dir=None: job_dirname(list(overrides or ()), sweep_dir),
        )


def continues_run(run: RunDir, resume: Any, ckpt_path: Any) -> bool:
    """Whether a training command continues the run in `run`: `continues_own_run`, or a `ckpt_path` naming
    the run's own `checkpoints/last.ckpt` (which `attnlab.training.pipeline.plan_run` continues as the same
    run). `resume=auto` without a last.ckpt starts a new run, so it does not."""
    if continues_own_run(resume, ckpt_path):
        return not (resume == "auto" and ckpt_path is None and not run.last_checkpoint.is_file())
    return ckpt_path is not None and Path(str(ckpt_path)).absolute() == run.last_checkpoint.absolute()


def _refusing_unchecked(checked: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A `RunDirectoryCheck` hook whose unexpected error (not its refusal, a `SystemExit`) refuses the
    command: Hydra turns a callback's exception into a warning and goes on, so an error in one check (an
    `OSError` of a path the file system refuses, a bug) would skip the checks after it and run the command
    unchecked. It ends instead with one line naming what could not be checked (`checked`) and the error;
    `HYDRA_FULL_ERROR=1` prints the error's traceback first. The refusal leaves no run directory
    (`refusal_leaves_no_run_directory`)."""

    def wrap(hook: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(hook)
        def refusing(self: Any, config: DictConfig, **kwargs: Any) -> None:
            try:
                hook(self, config, **kwargs)
            except Exception as exc:
                if os.environ.get("HYDRA_FULL_ERROR") == "1":
                    traceback.print_exception(exc)
                named = isinstance(exc, OSError) and exc.strerror
                reason = f"{exc.filename}: {exc.strerror}" if named else error_reason(exc)
                raise SystemExit(
                    f"attnlab-{config.get('task_name', 'train')}: cannot check {checked} before it starts "
                    f"({type(exc).__name__}: {reason}), so nothing ran: correct what it names "
                    "(HYDRA_FULL_ERROR=1 shows the traceback)"
                ) from None

        return refusing

    return wrap


class RunDirectoryCheck(Callback):
    """Refuses a run (`hydra.run.dir`) or sweep (`hydra.sweep.dir`) directory that cannot be created or
    written, or is too long for the file system (`check_path_length`), before Hydra creates it
    (`conf/hydra/default.yaml` registers this callback): the command exits with one line naming the key and
    the fix instead of Hydra's traceback. It claims the run directory
    (`RunDir.claim`) for the whole command before Hydra writes `.hydra/` into it: a directory in which another
    live command runs is refused, and so is a training run directory holding a saved run
    (`RunDir.check_no_run`) for a command that does not continue it (`resume=false`), and a training sweep
    whose `optimized_metric` no run writes or whose sweeper would optimise it the wrong way
    (`check_sweep_objective`), or that sweeps a value its sweeper cannot run (`check_sweep_values`). So is
    a config holding a credential (`check_no_credentials`), which Hydra would write into `.hydra/`, its own
    node included (`hydra.job.env_set.HF_TOKEN=...`).
    attnlab-eval and attnlab-export refuse a directory holding a training run (`RunDir.check_no_training`):
    they would replace its results and Hydra record with their own. A check that fails unexpectedly (an
    error other than its refusal) refuses the command too, naming what could not be checked
    (`_refusing_unchecked`): Hydra would only warn and run it unchecked."""

    @_refusing_unchecked("the run directory (hydra.run.dir) and the config")
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check_not_empty(config, "hydra.run.dir")
        self._check_length(config, "hydra.run.dir")
        run_dir = Path(config.hydra.run.dir).resolve()  # what Hydra is about to make: removed if refused
        _made_for_this_run.clear()
        _made_for_this_run[run_dir] = missing_directories([Path(config.hydra.run.dir)])  # (`a/../b`: `a`)
        self._check(config, Path(config.hydra.run.dir))
        run, task = RunDir(Path(config.hydra.run.dir)), config.get("task_name", "train")
        try:  # held until the command ends (`refusal_leaves_no_run_directory`): no other command writes here
            if launched_rank() == 0:
                made = not run.run_lock.exists()
                _claimed_for_this_run.append((run.claim(), made))
        except ConfigError as exc:
            raise SystemExit(f"attnlab-{task}: config error: {exc}") from None
        if task == "train":  # a saved run there: refused before Hydra writes
            from attnlab.training.experiment import sweep_skip_done

            try:
                skip_finished = sweep_skip_done(config.get("sweep"))
                if not continues_run(run, config.get("resume"), config.get("ckpt_path")):
                    run.check_no_run(skip_finished=skip_finished)
            except ConfigError as exc:
                raise SystemExit(f"attnlab-train: config error: {exc}") from None
            return
        replaced = "its results.json, hypotheses, references and .hydra/ record" if task == "eval" else (
            "its .hydra/ record")  # fmt: skip
        try:  # attnlab-eval, attnlab-export: their record (and results) would replace the run's
            run.check_no_training(f"attnlab-{task}", "hydra.run.dir", replaced)
        except ConfigError as exc:
            raise SystemExit(f"attnlab-{task}: config error: {exc}") from None

    @_refusing_unchecked("the sweep directory (hydra.sweep.dir), the sweep and the config")
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check_not_empty(config, "hydra.sweep.dir")
        self._check_length(config, "hydra.sweep.dir")
        sweep_dir = Path(config.hydra.sweep.dir)  # what Hydra is about to make: removed if refused
        _made_for_this_run.clear()
        _made_for_this_run[sweep_dir.resolve()] = missing_directories([sweep_dir])
        _sweep_records_before.clear()  # what Hydra writes over: put back if refused before a job ran
        if os.path.isdir(sweep_dir):  # (False for one that cannot exist: a name too long, `path_exists`)
            directory = sweep_dir.resolve()
            record = directory / SWEEP_RECORD
            with suppress(OSError):  # (one that cannot be read or written: Hydra's write fails too)
                recover_kept_sweep_records(directory)
                names = frozenset(path.name for path in directory.iterdir())
                data = record.read_bytes() if record.exists() else None
                _sweep_records_before[directory] = (data, names)
                keep_sweep_record(directory, data)
        if config.get("task_name") == "train":  # a sweep optimizing nothing or the wrong way: refused now
            from attnlab.training.experiment import check_sweep_objective, sweep_skip_done  # (sacreBLEU)

            try:
                check_sweep_values(config)
                check_no_swept_bookkeeping(config)
                sweep_skip_done(config.get("sweep"))
                check_sweep_objective(config.get("optimized_metric"), config.hydra.sweeper.get("direction"))
            except ConfigError as exc:
                raise SystemExit(f"attnlab-train: config error: {exc}") from None
        self._check(config, Path(config.hydra.sweep.dir))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        drop_kept_sweep_records()  # (a multirun's job, run in this process: see `keep_sweep_record`)

    @staticmethod
    def _check_not_empty(config: DictConfig, key: str) -> None:
        """Refuse an empty run or sweep directory `key`: the current directory, where the command would
        write its run or jobs among whatever is there."""
        if not str(OmegaConf.select(config, key)).strip():
            raise SystemExit(
                f"attnlab-{config.get('task_name', 'train')}: config error: {key} is empty, which is the "
                f"current directory: give the directory to write into ({key}=logs/...), or leave it out "
                "for a new one under logs/"
            )

    @staticmethod
    def _check_length(config: DictConfig, key: str) -> None:
        """Refuse a run or sweep directory `key` too long for the file system (`check_path_length`), before
        anything is made."""
        try:
            check_path_length(key, str(OmegaConf.select(config, key)))
        except ConfigError as exc:
            raise SystemExit(f"attnlab-{config.get('task_name', 'train')}: config error: {exc}") from None

    @staticmethod
    def _check(config: DictConfig, directory: Path) -> None:
        plain = OmegaConf.to_container(config, resolve=False)  # (Hydra's node resolves only in a job)
        # Hydra's node but what restates the rest (the overrides, and override_dirname made of them)
        hydra = {k: v for k, v in plain.get("hydra", {}).items() if k != "overrides"}
        hydra["job"] = {k: v for k, v in hydra.get("job", {}).items() if k != "override_dirname"}
        try:  # a credential in the config, Hydra's own (hydra.job.env_set) too: .hydra/ would record it
            check_no_credentials({**plain, "hydra": hydra})
            RunDir(directory).check_writable()
        except ConfigError as exc:
            raise SystemExit(f"attnlab-{config.get('task_name', 'train')}: config error: {exc}") from None
