"""The layout of a run directory: the name of every file a run writes, the readers and writers of them
(`RunDir`), and which config keys define a run's setting (`BOOKKEEPING`, `setting`).

A run directory holds::

    config.yaml          the resolved config (CONFIG_FILE)
    manifest.json        what produced the run and how it ended (MANIFEST_FILE, `attnlab.runs.manifest`)
    results.json         the final scores and metrics (RESULTS_FILE, `attnlab.runs.results`)
    hypotheses/<set>.txt the translations of each test set (HYPOTHESES_DIR)
    references/<set>.txt their references, for paired tests later (REFERENCES_DIR)
    sources/<set>.txt    their sources, for reports by source length (SOURCES_DIR)
    nbest/<set>.jsonl    with `decode.nbest` or `decode.print_alignment`: the n-best hypotheses with
                         scores and alignments (NBEST_DIR, `nbest_file`; `.txt` in fairseq's format)
    csv/metrics.csv      the metrics Lightning's CSV logger wrote (METRICS_CSV)
    checkpoints/         the checkpoints (CHECKPOINTS_DIR); `last.ckpt` the latest state (LAST_CHECKPOINT)
    .lock                the lock of the process running there (RUN_LOCK)
"""

from __future__ import annotations

import csv
import errno
import io
import json
import logging
import os
import re
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf._utils import get_yaml_loader
from omegaconf.errors import OmegaConfBaseException

from attnlab.io import (
    FileLock,
    atomic_write_bytes,
    atomic_write_files,
    error_reason,
    held_here,
    make_writable_directory,
    process_gone,
    too_long_path,
    without_bom,
)
from attnlab.runs.results import results_bytes
from attnlab.typed import ConfigError

CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
RESULTS_FILE = "results.json"
HYPOTHESES_DIR = "hypotheses"
REFERENCES_DIR = "references"
SOURCES_DIR = "sources"
NBEST_DIR = "nbest"
METRICS_CSV = "csv/metrics.csv"
CHECKPOINTS_DIR = "checkpoints"
LAST_CHECKPOINT = f"{CHECKPOINTS_DIR}/last.ckpt"
# The longest multirun job directory name the default hydra.sweep.subdir gives (`attnlab.cli.app.job_dirname`:
# its readable part, a dash and an 8-digit hash, ASCII only).
JOB_DIRNAME_BYTES = 169
RUN_LOCK = ".lock"  # `<pid> <host>` of the process running in the run directory
SWEEP_RECORD = "multirun.yaml"  # Hydra's record of a multirun, in its sweep directory

# The config keys that never define a run's setting: where the run writes (`paths.`, `hydra.`, the
# `callbacks.`, which hold run-directory paths such as the checkpoint directory, and with them their other
# settings), how it is tracked, named and shown (`logger.`, `task_name`, `progress.`), how it is started or
# continued (`ckpt_path`, `resume`, `sweep.`), what a sweeper reads from it (`optimized_metric`), how
# the C heap hands memory back (`allocator`: speed only, the same numbers; runs made before the key existed
# have none) and what the console shows (`trainer.enable_progress_bar`, `trainer.enable_model_summary`:
# the same results.json and csv/metrics.csv but for the speed; `trainer.log_every_n_steps` is a setting,
# since it decides which step rows csv/metrics.csv and the loggers get). An
# entry ending in `.` names a config group (every key below it, and its choice); any other one a key (and
# every key it starts). The seed is no bookkeeping: the runs of one setting differ in it, and W&B groups and
# `attnlab-compare` group over it. W&B groups (`attnlab.runs.wandb.config_group`) and run names
# (`run_name`), `attnlab.reports.compare.varying_keys` and the changes a resumed run may make
# (`attnlab.training.resume.RESUMABLE_CHANGES`) all leave these keys out.
BOOKKEEPING = (
    "paths.", "hydra.", "logger.", "callbacks.", "sweep.", "progress.",
    "ckpt_path", "resume", "task_name", "optimized_metric", "allocator", "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
)  # fmt: skip
# Keys below a `BOOKKEEPING` group that do define a run's setting: early stopping's patience and minimum
# improvement decide when training stops, and with it the run's results (the metric it watches is
# `monitor.*`, a setting already). A resumed run may still change them, as it may `trainer.max_epochs`.
SETTINGS_IN_BOOKKEEPING = ("callbacks.early_stopping.patience", "callbacks.early_stopping.min_delta")


def nbest_file(name: str, nbest_format: str) -> str:
    """The n-best file of test set `name` in the run directory: `nbest/<name>.jsonl` for
    `decode.nbest_format=jsonl`, `nbest/<name>.txt` for `fairseq`."""
    return f"{NBEST_DIR}/{name}.{'jsonl' if nbest_format == 'jsonl' else 'txt'}"


class UnreadableRunFile(ValueError):
    """A file of a run directory (`config.yaml`, `manifest.json`, `results.json`, `csv/metrics.csv`) cannot
    be read or is not what attnlab writes; the message names the file and why."""


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}` (lists kept as values)."""
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}{key}."))
    return out


def key_in(key: str, entries: Sequence[str]) -> bool:
    """Whether the dotted config key `key` (`paths.output_dir`, or a group choice such as `logger`) is one
    of `entries` or below one (`BOOKKEEPING`'s convention: `paths.` names a group, `resume` a key)."""
    return f"{key}.".startswith(tuple(entries))


def is_bookkeeping(key: str) -> bool:
    """Whether the dotted config key `key` never defines a run's setting (`BOOKKEEPING`, but for
    `SETTINGS_IN_BOOKKEEPING`)."""
    return key_in(key, BOOKKEEPING) and not key_in(key, SETTINGS_IN_BOOKKEEPING)


def setting_overrides(overrides: Sequence[str]) -> list[str]:
    """The command-line overrides (`model.pe=learned`, `+x=1`, `~model.x`, `logger=csv`,
    `hydra/launcher=local`) that are no bookkeeping (`is_bookkeeping` of the key, a config group's `/` read
    as `.`), in order: what names a run (`attnlab.runs.wandb.run_name`) and a multirun job's directory
    (`attnlab.cli.app.job_dirname`). A deletion (`~model.x`, no `=`) changes the setting as a value does."""
    kept = []
    for override in overrides:
        key, sep, _ = override.lstrip("+~").partition("=")
        if (sep or override.startswith("~")) and not is_bookkeeping(key.split("@")[0].replace("/", ".")):
            kept.append(override)
    return kept


def job_setting(overrides: Sequence[str]) -> str:
    """What tells a multirun's jobs apart: their `setting_overrides`, sorted and comma-joined (the same
    for the same job in any order, whatever its bookkeeping overrides). A job's directory is named from
    it (`attnlab.cli.app.job_dirname`); a sweep runs each once (`attnlab.training.launchers.OncePerSweep`)."""
    return ",".join(sorted(setting_overrides([str(item) for item in overrides])))


# What must not be in a run's config, which a run writes into config.yaml, manifest.json (its command),
# Hydra's .hydra/ and every logger (W&B uploads it with `wandb sync`): a value of a key named like a
# credential (its last part, any case), a URL with a password (`https://user:password@host`) and one whose
# user name is a token (`https://ghp_...@host`: `token_like`)
CREDENTIAL_KEYS = frozenset({
    "api_key", "apikey", "api_token", "access_token", "auth_token", "hf_token", "token", "password",
    "passwd", "secret", "secret_key",
})  # fmt: skip
# ... and a key whose last word (`_`, `-` or camelCase apart) is one of these, or ends in `api key`,
# `access key` or `private key` (WANDB_API_KEY, github_token, client_secret, db-password, apiKey); a
# tokenizer's special tokens (pad_token) are no credentials
CREDENTIAL_WORDS = frozenset({"password", "passwd", "secret", "apikey", "token"})
CREDENTIAL_PAIRS = (("api", "key"), ("access", "key"), ("private", "key"))
SPECIAL_TOKENS = frozenset({
    "pad", "bos", "eos", "unk", "sep", "cls", "mask", "sos", "start", "end", "special",
})  # fmt: skip
URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@")
URL_USER = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([^/\s:@]+)@")  # a user name alone (`https://me@host`)
# How tokens begin (GitHub, GitLab, Hugging Face, Slack, PyPI, npm, OpenAI's and Anthropic's project keys);
# other tokens are long random runs of letters and digits (`token_like`)
TOKEN_PREFIXES = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "hf_", "xoxb-", "xoxp-",
                  "xoxa-", "xoxr-", "pypi-", "npm_", "sk-proj-", "sk-ant-")  # fmt: skip
# 32 or more letters and digits, both (a W&B key: 40 hex digits), or 20 or more holding upper and lower case
# letters and digits (random keys); a user name of 20-31 in one case with digits (`johnsmith1985account`)
# is none
LONG_RANDOM_RUN = re.compile(
    r"(?=[A-Za-z0-9]*[0-9])(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{32,}"
    r"|(?=[A-Za-z0-9]*[0-9])(?=[A-Za-z0-9]*[a-z])(?=[A-Za-z0-9]*[A-Z])[A-Za-z0-9]{20,}"
)
# An interpolation as written (`${oc.env:DB_PASSWORD}`): no secret itself (Hydra's .hydra/ records it so)
INTERPOLATION = re.compile(r"\$\{[^${}]*\}")


def credential_key(key: str) -> bool:
    """Whether the last part of dotted config key `key` is named like a credential (`CREDENTIAL_KEYS`,
    `CREDENTIAL_WORDS`, `CREDENTIAL_PAIRS`), in any case or spelling."""
    name = key.rsplit(".", 1)[-1]
    words = re.findall(r"[a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower())
    if name.lower() in CREDENTIAL_KEYS or tuple(words[-2:]) in CREDENTIAL_PAIRS:
        return True
    special = words[-1:] == ["token"] and len(words) > 1 and words[-2] in SPECIAL_TOKENS
    return bool(words) and words[-1] in CREDENTIAL_WORDS and not special


def token_like(name: str) -> bool:
    """Whether a URL's user name `name` is a token: it begins as one (`TOKEN_PREFIXES`) or holds a
    long random-looking run of letters and digits (`LONG_RANDOM_RUN`: a W&B key); a user name (`alice`,
    `john.doe`, `service-account-12345`, `christopherjohnson1985`) is not."""
    return name.startswith(TOKEN_PREFIXES) or LONG_RANDOM_RUN.search(name) is not None


def holds_credential_url(value: Any, *, recorded_as_written: bool = False) -> bool:
    """Whether `value` (as JSON text) holds a URL with a password, or a user name that is a token
    (`token_like`). When the value is `recorded_as_written` (Hydra's own node, which .hydra/ records
    unresolved), an interpolation (`user:${oc.env:PASSWORD}@`) is no secret; elsewhere the run records it
    resolved."""
    text = json.dumps(value, default=str)
    text = INTERPOLATION.sub("", text) if recorded_as_written else text
    return URL_WITH_PASSWORD.search(text) is not None or any(
        token_like(user) for user in URL_USER.findall(text)
    )


def _leaves(tree: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """The plain values of `tree` with their dotted keys, through mappings and lists alike (the items of a
    list under its own key: `{"x": [{"token": 1}]}` -> `("x.token", 1)`)."""
    if isinstance(tree, Mapping):
        for name, value in tree.items():
            yield from _leaves(value, f"{key}.{name}" if key else str(name))
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _leaves(value, key)
    else:
        yield key, tree


def check_no_credentials(config: Mapping[str, Any]) -> None:
    """Refuse a config (nested or flattened plain values, lists looked into; interpolations as written or
    resolved) that holds a credential: a key named like one (`credential_key`), or a URL with a password
    or a token for its user name (`holds_credential_url`). Its keys are named, never its values (the
    message is printed and logged). Hydra's own node is recorded as written: there a URL's password may be
    an interpolation (`hydra.sweeper.storage='postgresql://me:${oc.env:DB_PASSWORD}@host/db'`), which the
    message names when a key under `hydra.` is refused.

    Raises:
        ConfigError: Naming the keys and the environment variables to give credentials through instead.
    """
    keys = list(dict.fromkeys(
        key for key, value in _leaves(dict(config))
        if (credential_key(key) and value not in (None, ""))
        or holds_credential_url(value, recorded_as_written=key.startswith("hydra."))
    ))  # fmt: skip
    hydra = (
        "; in Hydra's own settings, which .hydra/ records as written, give a URL's secret as ${oc.env:VAR}: "
        "hydra.sweeper.storage='postgresql://user:${oc.env:OPTUNA_DB_PASSWORD}@host/db' (an Optuna storage)"
    )
    if keys:
        raise ConfigError(
            f"{', '.join(keys)} would put a credential (a key, token or password) into the run's files: its "
            "config goes into config.yaml, manifest.json, .hydra/ and every logger (W&B uploads it). Remove "
            "it and give credentials through the environment, which no run file records: WANDB_API_KEY "
            "(W&B), MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN (an "
            "MLflow server, its tracking_uri without user:password@), HF_TOKEN (the Hugging Face hub)"
            f"{hydra if any(key.startswith('hydra.') for key in keys) else ''}"
        )


def setting(config: Mapping[str, Any], seed_key: str = "seed") -> dict[str, str]:
    """What defines a run's setting: every dotted key of `config` (nested or flattened) but the seed and
    the `BOOKKEEPING` keys, with its value as JSON text in which the run's own directories
    (`paths.output_dir`, `paths.log_dir`) read `<output_dir>` and `<log_dir>`, so that values derived from
    them (a checkpoint directory) are the same in every run. Two runs of one setting and different seeds
    give the same dict."""
    flat = flatten(dict(config))
    own = [(flat.get(f"paths.{name}"), f"<{name}>") for name in ("output_dir", "log_dir")]
    replacements = [(json.dumps(path)[1:-1], mark) for path, mark in own if isinstance(path, str) and path]
    out: dict[str, str] = {}
    for key, value in flat.items():
        if key == seed_key or is_bookkeeping(key):
            continue
        text = json.dumps(value, sort_keys=True, default=str)
        for path, mark in replacements:
            text = text.replace(path, mark)
        out[key] = text
    return out


def json_type(value: Any) -> str:
    """The JSON name of a parsed JSON value's type, for messages (`[1]` -> array, `null` -> null)."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


# Why a file nested past Python's recursion limit cannot be read (no file attnlab writes nests so deep)
NESTED = "it is nested too deeply (past Python's recursion limit) to be a file attnlab wrote"
# A YAML alias (`*a`) repeats the node its anchor (`&a`) names: a few lines of aliases of aliases expand into
# billions of values (reading a 500-byte config.yaml took minutes). attnlab's config.yaml holds none.
ALIASED = "it holds YAML aliases (*name), which no config.yaml attnlab writes holds"


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in the file at `path` (UTF-8, a byte-order mark that an editor saved first ignored).

    Raises:
        UnreadableRunFile: The file is missing or unreadable, not UTF-8, not JSON (or nested too deeply to
            parse), or not an object.
    """
    try:
        value = json.loads(without_bom(Path(path).read_bytes()).decode("utf-8"))
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise UnreadableRunFile(f"cannot read {path}: {exc}") from None
    except RecursionError:  # arrays or objects nested past Python's recursion limit
        raise UnreadableRunFile(f"cannot read {path}: {NESTED}") from None
    if not isinstance(value, dict):
        raise UnreadableRunFile(f"cannot read {path}: it holds a JSON {json_type(value)}, not an object")
    return value


def read_saved_lines(path: Path) -> list[str] | None:
    """The lines of a run's saved hypotheses, references or sources (`RunDir.hypotheses_dir`, ...), split
    at "\\n" only, as they were written (a lone "\\r" inside a line, kept from the data, is no line end:
    `read_text` would split there); a last line without its "\\n" is a line too. None when there is no
    such file. A UTF-8 byte-order mark at its start (an editor saved it) is no part of the first line, as
    `read_json_object` and `RunDir.metrics_rows` read past one too.

    Raises:
        UnreadableRunFile: The file is not UTF-8 text (the byte named counts from the file's start).
    """
    if not path.is_file():
        return None
    data = path.read_bytes()
    body = without_bom(data)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = exc.start + len(data) - len(body)
        raise UnreadableRunFile(
            f"cannot read {path}: not UTF-8 text ({exc.reason} at byte {at}); restore the file "
            "(attnlab-eval on the run's checkpoint writes it again) or leave that run out of the comparison"
        ) from None
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") or not text else lines


class _Aliased(Exception):
    """A YAML alias met while composing a document (`_load_yaml`)."""


def _load_yaml(path: Path) -> Any:
    """The YAML document at `path` as Python values, parsed once with the loader `OmegaConf.load` uses
    (its float and duplicate-key rules), which raises `_Aliased` at the first alias, before any is
    expanded (composing is linear in the file)."""

    class Loader(get_yaml_loader()):  # type: ignore[misc]
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise _Aliased
            return super().compose_node(parent, index)

    with open(path, encoding="utf-8") as stream:
        return yaml.load(stream, Loader=Loader)


def read_config_file(path: Path) -> dict[str, Any]:
    """The config in the YAML file at `path` (a run's `config.yaml`), flattened (`flatten`); an empty file
    is an empty config. The file is parsed once; a document that is a string is not parsed again as YAML
    (as `OmegaConf.create` would: the aliases inside it would expand).

    Raises:
        UnreadableRunFile: The file is missing or unreadable, not YAML (or nested too deeply to parse),
            holds YAML aliases (`ALIASED`), or holds no mapping.
    """
    try:
        value = _load_yaml(path)
        if value is None or isinstance(value, dict):
            return flatten(OmegaConf.to_container(OmegaConf.create(value or {})))
    except _Aliased:
        raise UnreadableRunFile(f"cannot read {path}: {ALIASED}") from None
    except yaml.MarkedYAMLError as exc:
        raise UnreadableRunFile(f"cannot read {path}: {yaml_problem(exc)}") from None
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as exc:
        reason = error_reason(exc)
        raise UnreadableRunFile(f"cannot read {path}: {reason}") from None
    except RecursionError:  # lists or mappings nested past Python's recursion limit
        raise UnreadableRunFile(f"cannot read {path}: {NESTED}") from None
    kind = {list: "list", str: "string"}.get(type(value), "scalar")
    raise UnreadableRunFile(f"cannot read {path}: it holds a YAML {kind}, not a config")


def yaml_problem(exc: yaml.MarkedYAMLError) -> str:
    """PyYAML's error on one line: its problem and the line it is on (`mapping values are not allowed here
    (line 3)`), not the first line of its text, which is often only its context (`while constructing a
    mapping`); a problem that ends the context's sentence keeps it (a second document in the file:
    `expected a single document in the stream, but found another document (line 4)`, the line of its
    `---`); a key given twice in one mapping (which OmegaConf's loader refuses) is named with the fix."""
    problem = (exc.problem or exc.context or type(exc).__name__).strip()
    if exc.problem and exc.context and problem.startswith("but "):
        problem = f"{exc.context.strip()}, {problem}"
    mark = exc.problem_mark or exc.context_mark
    line = f"line {mark.line + 1}" if mark is not None else "somewhere"
    duplicate = re.fullmatch(r"found duplicate key (.*)", problem)
    if duplicate:
        key = duplicate.group(1)
        return f"the key {key} is given twice in one mapping (again on {line}): remove one of them"
    return f"{problem} ({line})"


def read_metrics_csv(path: Path, columns: Sequence[str] | None = None) -> list[dict[str, float]]:
    """The rows of a metrics CSV file (Lightning's `CSVLogger`: a run's `csv/metrics.csv`), in order, each
    as `{column: value}` of its non-empty cells (only those of `columns`, when given: the other cells are
    not read, so damage elsewhere in a row does not matter); [] when there is no such file. A byte-order
    mark that an editor (a spreadsheet) saved first is no part of the first column's name.

    Raises:
        UnreadableRunFile: The file cannot be read, is not UTF-8 CSV, or holds a cell that is not a number
            (among `columns`; a row with more cells than the header only when all columns are read).
    """
    path = Path(path)
    if not path.is_file():
        return []
    rows: list[dict[str, float]] = []
    try:
        with io.StringIO(without_bom(path.read_bytes()).decode("utf-8"), newline="") as f:
            reader = csv.DictReader(f)
            for row in reader:
                values: dict[str, float] = {}
                for key, cell in row.items():
                    if columns is not None and key not in columns:
                        continue
                    if key is None:  # the cells beyond the header's columns
                        raise UnreadableRunFile(
                            f"cannot read {path}: line {reader.line_num} has more cells than its header"
                        )
                    if cell in ("", None):
                        continue
                    try:
                        values[key] = float(cell)
                    except ValueError:
                        raise UnreadableRunFile(
                            f"cannot read {path}: line {reader.line_num}: {key}={cell!r} is not a number"
                        ) from None
                rows.append(values)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UnreadableRunFile(f"cannot read {path}: {exc}") from None
    return rows


def check_path_length(key: str, path: str | Path, fix: str | None = None) -> None:
    """Refuse `path`, the directory `key` gives (`hydra.run.dir`, a multirun job's directory), when the file
    system would refuse it as too long (`attnlab.io.too_long_path`). Called before anything is created, so
    the refusal leaves no directory; `OSError`'s `File name too long` said it otherwise, once some of its
    parents were made.

    Raises:
        ConfigError: Naming `key`, the name on it that is too long, its length in bytes and the limit, and
            the fix (`fix`, else a shorter `key`).
    """
    problem = too_long_path(path)
    if problem is not None:
        fix = fix or f"set a shorter {key}"
        raise ConfigError(f"{key} is too long for the file system: {problem}; {fix}")


class RunDirectoryInUse(ConfigError):
    """Another live process runs in this run directory (its lock file names it)."""


def launched_rank() -> int:
    """This process's global rank as the launchers set it (Lightning's DDP launcher, torchrun, SLURM,
    submitit; `attnlab.cli.train.submitit_ranks`): 0 unless a rank variable says otherwise. Read from
    the environment, before lightning is imported."""
    names = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")
    return max((int(os.environ[k]) for k in names if os.environ.get(k, "").isdigit()), default=0)


@dataclass(frozen=True)
class RunDir:
    """A run directory: where each of its files is, and their one reader and writer.

    Readers raise `UnreadableRunFile` naming the file and why; writers are atomic (`attnlab.io`): a reader
    sees the old file or the whole new one, and a failed write leaves the old one.
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config_file(self) -> Path:
        """`config.yaml`: the resolved config."""
        return self.path / CONFIG_FILE

    @property
    def manifest_file(self) -> Path:
        """`manifest.json` (`attnlab.runs.manifest.Manifest`)."""
        return self.path / MANIFEST_FILE

    @property
    def results_file(self) -> Path:
        """`results.json`: the final scores and metrics."""
        return self.path / RESULTS_FILE

    @property
    def hypotheses_dir(self) -> Path:
        """`hypotheses/`: `<set>.txt`, the translations of each test set."""
        return self.path / HYPOTHESES_DIR

    @property
    def nbest_dir(self) -> Path:
        """`nbest/`: the n-best lists of each test set (`nbest_file`), when asked for."""
        return self.path / NBEST_DIR

    @property
    def references_dir(self) -> Path:
        """`references/`: `<set>.txt`, the references of each test set."""
        return self.path / REFERENCES_DIR

    @property
    def sources_dir(self) -> Path:
        """`sources/`: `<set>.txt`, the raw source lines of each test set (runs since December 2026)."""
        return self.path / SOURCES_DIR

    @property
    def metrics_csv(self) -> Path:
        """`csv/metrics.csv`: what Lightning's CSV logger wrote."""
        return self.path / METRICS_CSV

    @property
    def checkpoints_dir(self) -> Path:
        """`checkpoints/`."""
        return self.path / CHECKPOINTS_DIR

    @property
    def last_checkpoint(self) -> Path:
        """`checkpoints/last.ckpt`: the latest state, which `resume=true` continues from."""
        return self.path / LAST_CHECKPOINT

    @property
    def run_lock(self) -> Path:
        """`.lock`: held by the process running in the directory."""
        return self.path / RUN_LOCK

    def read_json(self, name: str) -> dict[str, Any]:
        """The JSON object in the file `name` (`MANIFEST_FILE`, `RESULTS_FILE`) of the run directory.

        Raises:
            UnreadableRunFile: The file is missing or unreadable, not UTF-8, not JSON, or not an object.
        """
        return read_json_object(self.path / name)

    def read_config(self) -> dict[str, Any]:
        """The run's `config.yaml`, flattened (`flatten`).

        Raises:
            UnreadableRunFile: It is missing or unreadable, not YAML, or holds no mapping.
        """
        return read_config_file(self.config_file)

    def metrics_rows(self, columns: Sequence[str] | None = None) -> list[dict[str, float]]:
        """The rows of the run's `csv/metrics.csv` (`read_metrics_csv`; [] without one)."""
        return read_metrics_csv(self.metrics_csv, columns)

    def write_config(self, resolved: dict[str, Any]) -> None:
        """Write `config.yaml`: the resolved config (plain values) as YAML."""
        atomic_write_bytes(self.config_file, OmegaConf.to_yaml(OmegaConf.create(resolved)).encode("utf-8"))

    def write_results(self, results: dict[str, Any]) -> None:
        """Write `results.json` (`attnlab.runs.results.results_bytes`)."""
        atomic_write_bytes(self.results_file, results_bytes(results))

    def write_files(self, files: Mapping[Path | str, bytes]) -> None:
        """Write files of the run directory (names relative to it) so that they change together
        (`attnlab.io.atomic_write_files`: a failed write leaves every one as it was)."""
        atomic_write_files({self.path / name: data for name, data in files.items()})

    def check_writable(self) -> None:
        """Create the run directory and check that files can be written there, before anything is run.

        Raises:
            ConfigError: It cannot be created or written (or is too long for the file system, whose real
                limit can be below the one `attnlab.io.too_long_path` reads: eCryptfs, some FUSE), or a
                directory stands where the run writes its config.yaml, manifest.json or csv/metrics.csv
                (that write would fail once the others had changed) or its lock (`.lock`: `claim` would
                fail), naming it and the fix.
        """
        try:
            make_writable_directory(self.path)
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                raise ConfigError(
                    f"cannot create the run directory {self.path}: the file system refuses it as too long "
                    f"({exc.strerror}), below the limits it reports — set a shorter hydra.run.dir "
                    "(hydra.sweep.dir for -m)"
                ) from None
            raise ConfigError(
                f"cannot create the run directory {self.path} or write in it: {exc.strerror or exc} — set "
                "hydra.run.dir (hydra.sweep.dir for -m) to a writable directory, or fix its permissions"
            ) from None
        for file in (self.config_file, self.manifest_file, self.metrics_csv, self.run_lock):
            if file.is_dir():
                raise ConfigError(f"{file} is a directory where the run writes its {file.name}: move it "
                                  "aside, or run in another directory (hydra.run.dir=...)")  # fmt: skip

    def saved_training(self) -> tuple[list[str], str | None]:
        """What a training run saved here: the names of its checkpoints (`checkpoints/*.ckpt`, sorted), and
        its manifest's status (None without a manifest, "unknown" when it cannot be read)."""
        checkpoints = sorted(p.name for p in self.checkpoints_dir.glob("*.ckpt"))
        status = None
        if self.manifest_file.is_file():
            status = "unknown"
            with suppress(UnreadableRunFile):
                status = str(self.read_json(MANIFEST_FILE).get("status") or "unknown")
        return checkpoints, status

    def check_no_training(self, command: str, key: str, replaced: str) -> None:
        """Refuse a directory holding a training run (`saved_training`: checkpoints or a manifest) as where
        `command` (attnlab-eval, attnlab-export), given it as `key`, writes its own files, which would
        replace the run's (`replaced`, for the message).

        Raises:
            ConfigError: Naming the directory, what is there, and the fix.
        """
        checkpoints, status = self.saved_training()
        if checkpoints or status is not None:
            held = f"checkpoints {', '.join(checkpoints[:3])}" if checkpoints else "no checkpoint"
            task = command.removeprefix("attnlab-")
            raise ConfigError(
                f"{key}={self.path} holds a training run (status {status or 'unknown'}, {held}): {command} "
                f"would replace {replaced} with its own; leave {key} out (a new directory under "
                f"logs/{task}/runs/) or name another directory"
            )

    def check_no_run(self, *, skip_finished: bool = False) -> None:
        """Refuse starting a new run in a directory that holds a run's training already: its checkpoints,
        or a manifest saying it finished (a new run would overwrite them). A directory with neither (new,
        or a run that failed before it saved anything) is free, and so is a finished run with
        `skip_finished` (`sweep.skip_done=true`: the command skips it, training nothing); so is any for the
        other processes of a DDP run (rank > 0), which start in the directory of the first.

        Raises:
            ConfigError: Naming what is there and the fixes.
        """
        if launched_rank() != 0:
            return
        checkpoints, status = self.saved_training()
        if (not checkpoints and status != "finished") or (skip_finished and status == "finished"):
            return
        held = f"checkpoints {', '.join(checkpoints[:3])}" if checkpoints else "no checkpoint"
        go_on = (  # (without last.ckpt, resume=true is refused and resume=auto starts afresh over the run)
            "resume=true continues it (resume=auto: if it can); "
            if "last.ckpt" in checkpoints
            else "it has no checkpoints/last.ckpt to continue from; "
        )
        raise ConfigError(
            f"the run directory {self.path} holds a run already (status {status or 'unknown'}, {held}): a "
            f"new run there would overwrite it. {go_on}for a new run, set hydra.run.dir to another "
            "directory, or remove this one first"
        )

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the run directory's lock for the whole run: a second process started in the same directory
        (which would mix checkpoints, logs and manifest) is refused at once, naming the directory and the
        process running there. The lock is `attnlab.io.FileLock` (``flock``): released when the run ends,
        however it ends — the kernel frees it when a killed process dies, so a dead run's stale lock is
        taken over (`resume=true` continues it). Under DDP only the first process (rank 0) takes it; the
        other ranks run in the same directory. A command that claimed the directory already (`claim`,
        before Hydra wrote into it) runs under its claim.

        Raises:
            RunDirectoryInUse: Another live process holds the lock.
        """
        if launched_rank() != 0 or held_here(self.run_lock) is not None:
            yield
            return
        lock = self.claim()
        try:
            yield
        finally:
            lock.release()

    def claim(self) -> FileLock:
        """Take the run directory's lock without waiting, this process recorded in it (`<pid> <host>`);
        the caller releases it. `attnlab.cli.app.RunDirectoryCheck` claims a command's run directory before
        Hydra writes `.hydra/` and the command's log into it, so two commands started at once on one new
        directory cannot both write there: the second is refused with nothing written.

        Raises:
            RunDirectoryInUse: Another live process holds it (named, when it recorded itself).
        """
        lock = FileLock(self.run_lock, timeout=0, record_holder=True)
        try:
            lock.acquire()
        except TimeoutError:
            raise RunDirectoryInUse(
                f"the run directory {self.path} is in use: {lock.holder()} is running there "
                f"({self.run_lock}). Two commands in one directory would mix their checkpoints, logs and "
                "results: wait for it to end (a training run stopped early continues with resume=true), "
                "or set hydra.run.dir to another directory"
            ) from None
        return lock


log = logging.getLogger(__name__)
# A copy of the `multirun.yaml` of an existing sweep directory, kept while a multirun there starts
# (`keep_sweep_record`): `.multirun.yaml.kept-<pid>-<host>`, or `.multirun.yaml.none-...` where there was none
_KEPT_RECORD = re.compile(r"\.multirun\.yaml\.(kept|none)-(\d+)-(.+)")
_kept_records: list[Path] = []  # the copies this process kept


def keep_sweep_record(directory: Path, data: bytes | None) -> None:
    """Write `data`, the `multirun.yaml` that the existing sweep directory `directory` holds as a multirun
    starts (None: it holds none), into a hidden copy there before Hydra writes over it: atomically, as
    `.multirun.yaml.kept-<pid>-<host>` (an empty `.multirun.yaml.none-<pid>-<host>` for None). The command
    removes it (`drop_kept_sweep_records`) once a job of it starts or it ends, having put the record back if
    it was refused before a job ran (`attnlab.cli.app.refusal_leaves_no_run_directory`); one killed first
    leaves it to the next multirun there (`recover_kept_sweep_records`)."""
    kind = "none" if data is None else "kept"
    kept = directory / f".{SWEEP_RECORD}.{kind}-{os.getpid()}-{socket.gethostname()}"
    atomic_write_bytes(kept, data or b"")
    _kept_records.append(kept)


def drop_kept_sweep_records() -> None:
    """Remove the copies of sweep records this process kept (`keep_sweep_record`): a job of its multirun
    starts (Hydra's `multirun.yaml` then describes the jobs the directory holds), or the command ends."""
    while _kept_records:
        _kept_records.pop().unlink(missing_ok=True)


def put_back_sweep_record(directory: Path, data: bytes | None) -> None:
    """Make the `multirun.yaml` of `directory` hold `data` again (atomically; None: remove it)."""
    record = directory / SWEEP_RECORD
    if data is None:
        record.unlink(missing_ok=True)
    elif not record.is_file() or record.read_bytes() != data:
        atomic_write_bytes(record, data)


def recover_kept_sweep_records(directory: Path) -> None:
    """Put back the `multirun.yaml` that a multirun into `directory` kept a copy of (`keep_sweep_record`) and
    was killed before it put it back, nor started a job: a copy whose process, of this host, is gone. The
    copy's bytes go over the record Hydra wrote (which is removed where the copy says there was none), the
    copy is removed, and a warning says so. A copy of a live process (a sweep starting now) is left; so is
    one of another host, whose process cannot be seen, with a warning naming it and the fix."""
    for kept in sorted(directory.iterdir()):
        found = _KEPT_RECORD.fullmatch(kept.name)
        if found is None or not kept.is_file():
            continue
        record, pid, host = directory / SWEEP_RECORD, int(found[2]), found[3]
        if host != socket.gethostname():
            fix = f"mv {kept} {record}" if found[1] == "kept" else f"rm {record} {kept}"
            log.warning("%s: the multirun.yaml a multirun on host %s (pid %d) wrote over; if that multirun "
                        "is not running, it was stopped before its first job: `%s` puts the record back",
                        kept, host, pid, fix)  # fmt: skip
        elif process_gone(pid, host):
            put_back_sweep_record(directory, kept.read_bytes() if found[1] == "kept" else None)
            kept.unlink()
            log.warning("put back %s as it was before a multirun (pid %d), stopped before its first job, "
                        "wrote over it", record, pid)  # fmt: skip
