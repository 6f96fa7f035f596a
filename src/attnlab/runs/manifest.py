"""The run manifest (`manifest.json` in every run directory): what produced the run, and how it ended.

It records the code (git commit and dirty flag of the checkout attnlab runs from, when it is one), the
package versions, the hardware, the command line, the data and tokenizer hashes, the start and end
times and the final status (`running`, `finished` or `failed` with the error). It is written when the
run starts and rewritten when it ends, so an interrupted run is recognisable by `status: running`.
"""

from __future__ import annotations

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

from attnlab.io import atomic_write_bytes

MANIFEST_FILE = "manifest.json"
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
    """The machine: OS, CPU, core count, torch threads and GPUs."""
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpus": gpus,
        "hostname": platform.node(),
    }


def text_sha256(text: str) -> str:
    """SHA-256 of a string's UTF-8 bytes (for tokenizer JSON)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_manifest(output_dir: str | Path, manifest: dict[str, Any]) -> Path:
    """Write `manifest.json` atomically (a reader never sees half a file)."""
    path = Path(output_dir) / MANIFEST_FILE
    atomic_write_bytes(
        path, (json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8")
    )
    return path


def start_manifest(output_dir: str | Path, resumed_from: str | None = None) -> dict[str, Any]:
    """The manifest of a run starting now (written to `output_dir`); add to it and `write_manifest`.

    With `resumed_from` (the run continues from that checkpoint), the first start time, the W&B run id
    and the earlier resumptions are kept from the run's manifest, and this resumption is added to
    `resumed` (time, checkpoint, command).
    """
    manifest: dict[str, Any] = {
        "status": "running",
        "start_time": now(),
        "end_time": None,
        "command": [sys.executable, *sys.argv],
        # This job's own overrides (under a multirun or a launcher, `command` is the sweep's or the
        # launcher's): `attnlab-train <overrides>` re-runs the job alone.
        "overrides": _job_overrides(),
        "cwd": os.getcwd(),
        "git": git_state(),
        "packages": package_versions(),
        "hardware": hardware(),
    }
    if resumed_from is not None:
        try:
            before = json.loads((Path(output_dir) / "manifest.json").read_text())
        except (OSError, ValueError):
            before = {}
        for key in ("start_time", "wandb_run_id"):
            if before.get(key):
                manifest[key] = before[key]
        entry = {"time": now(), "checkpoint": str(resumed_from), "command": manifest["command"]}
        manifest["resumed"] = [*before.get("resumed", []), entry]
    write_manifest(output_dir, manifest)
    return manifest


def _job_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def data_identity(datamodule: Any) -> dict[str, Any]:
    """What identifies a run's data: the spec's class and settings, the prepared-data cache key (a hash
    of the raw files and the preprocessing) and the SHA-256 of each tokenizer's JSON."""
    import dataclasses

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
    return identity
