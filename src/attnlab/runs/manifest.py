"""The run manifest (`manifest.json` in every run directory, `Manifest`): what produced the run, and how
it ended.

It records the code (git commit and dirty flag of the checkout attnlab runs from, when it is one), the
package versions, the hardware, the command line, the data and tokenizer hashes, the start and end
times and the final status (`running`, then `finished`, `interrupted` or `failed` with the error). It is
written when the run starts, rewritten with each fact the run adds and when it ends, so a killed run is
recognisable by `status: running`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from attnlab.runs.layout import MANIFEST_FILE, RunDir, UnreadableRunFile

PACKAGES = ("attnlab", "torch", "lightning", "hydra-core", "omegaconf", "sacrebleu", "tokenizers", "wandb")


def now() -> str:
    """The current UTC time, ISO 8601."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_state(path: Path | None = None) -> dict[str, Any]:
    """`{"commit", "dirty"}` of the git checkout holding `path` (attnlab's source by default);
    None values when it is not in one (an installed wheel) or git is missing."""
    path = path or Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()  # fmt: skip
        status = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(status.strip())}


def package_versions() -> dict[str, str | None]:
    """Versions of Python and the packages a run's results depend on (None: not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def hardware() -> dict[str, Any]:
    """The machine: OS, CPU, core count, torch threads, GPUs, and the library of CPU inference products
    (`attnlab.model.gemm`: its float rounding is that of decoding and validation on the CPU)."""
    import torch

    from attnlab.model.gemm import backend as inference_gemm

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "inference_gemm": inference_gemm(),
        "gpus": gpus,
        "hostname": platform.node(),
    }


def text_sha256(text: str) -> str:
    """SHA-256 of a string's UTF-8 bytes (for tokenizer JSON)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Manifest:
    """The manifest of one run directory, kept as one object: every change is written at once (atomically:
    a reader never sees half a file), so a run killed at any point leaves a manifest saying how far it got.

    `Manifest.start` begins a run's manifest, `update` adds facts as the run goes, `finish` records how it
    ended; `Manifest.failed` records a job that failed before its run started, `Manifest.read` an existing
    manifest (to mark it, e.g. a job whose process died).
    """

    def __init__(self, run: RunDir, fields: dict[str, Any]) -> None:
        self.run = run
        self._fields = dict(fields)

    @classmethod
    def start(cls, run: RunDir, resumed_from: str | None = None) -> Manifest:
        """The manifest of a run starting now, written to `run`.

        With `resumed_from` (the run continues from that checkpoint), the first start time, the W&B run
        id, the checkpoint a fine-tuning run started from (`init_from`), the end of its training so far
        (`training_end`: its step and final metrics) and the earlier resumptions are kept from the run's
        manifest (read here, once; a missing or unreadable one keeps nothing), and
        this resumption is added to `resumed` (time, checkpoint, command, and `previous_end`: the end time
        of the part before, None when that part was killed before it could record it), so the time the run
        trained is known without the pauses between its parts (`attnlab.reports.compare`).
        """
        fields: dict[str, Any] = {
            "status": "running",
            "start_time": now(),
            "end_time": None,
            "command": [sys.executable, *sys.argv],
            # This job's own overrides (under a multirun or a launcher, `command` is the sweep's or the
            # launcher's): `attnlab-train <overrides>` re-runs the job alone.
            "overrides": task_overrides(),
            "cwd": os.getcwd(),
            "git": git_state(),
            "packages": package_versions(),
            "hardware": hardware(),
        }
        if resumed_from is not None:
            try:
                before = run.read_json(MANIFEST_FILE)
            except UnreadableRunFile:
                before = {}
            for key in ("start_time", "wandb_run_id", "mlflow_run_id", "init_from", "training_end"):
                if before.get(key):
                    fields[key] = before[key]
            earlier = before.get("resumed")
            entry = {"time": now(), "checkpoint": str(resumed_from), "command": fields["command"],
                     "previous_end": before.get("end_time")}  # fmt: skip
            fields["resumed"] = [*(earlier if isinstance(earlier, list) else []), entry]
        manifest = cls(run, fields)
        manifest._write()
        return manifest

    @classmethod
    def read(cls, run: RunDir) -> Manifest:
        """The manifest `run` holds.

        Raises:
            UnreadableRunFile: There is none, or it cannot be read or is not a JSON object.
        """
        return cls(run, run.read_json(MANIFEST_FILE))

    @classmethod
    def failed(cls, run: RunDir, error: str) -> bool:
        """Write a manifest saying the job failed with `error` (its first line), for a failure before its
        run started (a config error). It holds the job's own overrides too, as a started run's does, so
        `attnlab-train <overrides>` re-runs the job alone. The manifest of a run that started there (one
        with a `start_time`: finished, interrupted, or another process's) is kept as it is: a refused
        command (a resumption with other settings) does not make a finished run `failed`, nor lose its
        record. Returns whether it was written."""
        try:
            if run.read_json(MANIFEST_FILE).get("start_time"):
                return False
        except UnreadableRunFile:  # none, or damaged: nothing to keep
            pass
        fields = {"status": "failed", "error": error.splitlines()[0], "end_time": now(),
                  "overrides": task_overrides()}  # fmt: skip
        cls(run, fields)._write()
        return True

    @property
    def fields(self) -> dict[str, Any]:
        """What the manifest holds (a copy)."""
        return dict(self._fields)

    def get(self, key: str, default: Any = None) -> Any:
        """The manifest's `key` (`default` when it has none)."""
        return self._fields.get(key, default)

    def update(self, **fields: Any) -> None:
        """Set `fields` and write the manifest."""
        self._fields.update(fields)
        self._write()

    def finish(self, status: str, error: str | None = None) -> None:
        """Record how the run ended (`finished`, `failed`, `interrupted`; with the error) and when."""
        ending: dict[str, Any] = {"status": status, "end_time": now()}
        if error is not None:
            ending["error"] = error
        self.update(**ending)

    def _write(self) -> None:
        text = json.dumps(self._fields, indent=2, sort_keys=True, default=str) + "\n"
        self.run.write_files({MANIFEST_FILE: text.encode("utf-8")})


def task_overrides() -> list[str]:
    """The command-line overrides of the current Hydra job ([] outside a Hydra app)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def data_identity(datamodule: Any) -> dict[str, Any]:
    """What identifies a run's data: the spec's class and settings, the prepared-data cache key (a hash
    of the raw files and the preprocessing), the SHA-256 of each tokenizer's JSON, and how many training
    pairs the run trained on (`training_pairs`: the lines read, those dropped as empty and by each length
    filter, and those kept; what the data module warns about on every run)."""
    spec = getattr(datamodule, "spec", None)
    identity: dict[str, Any] = {"spec": type(spec).__name__ if spec is not None else None}
    if dataclasses.is_dataclass(spec):
        identity["settings"] = dataclasses.asdict(spec)
    prepared = getattr(datamodule, "prepared", None)
    if prepared is not None:
        identity["prepared_key"] = prepared.key
    for side in ("src_tokenizer", "tgt_tokenizer"):
        tokenizer = getattr(datamodule, side, None)
        if tokenizer is not None:
            identity[f"{side}_sha256"] = text_sha256(tokenizer.to_json())
    stats = getattr(datamodule, "stats", None) or {}
    if "train_lines" in stats:
        identity["training_pairs"] = {
            "lines": stats["train_lines"],
            "dropped_empty": stats.get("dropped_empty", 0),
            "dropped_by_filter": dict(stats.get("dropped_filter") or {}),
            "kept": stats.get("train_examples"),
        }
    return identity
