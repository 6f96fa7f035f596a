"""Reading an offline W&B run back from its `run-<id>.wandb` file.

wandb 0.31 writes an offline run only as this binary transaction log (no summary or config JSON). The
file is a LevelDB-style log: a 7-byte header (ident `:W&B`, magic 0xBEE1, version), then 32 KiB blocks of
records, each with a 7-byte header (CRC-32 of type and data, little-endian uint16 length, uint8 type:
FULL, FIRST, MIDDLE or LAST) and a chunk of a serialized `wandb_internal_pb2.Record` protobuf.
`read_wandb_run` reassembles the records and folds them into the run's settings, config, metrics
history and summary — what the W&B server would show.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER = struct.Struct("<4sHB")
IDENT, MAGIC = b":W&B", 0xBEE1
BLOCK = 32768
RECORD_HEADER = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class WandbFileError(ValueError):
    """A `.wandb` file that is not a W&B transaction log or is damaged."""


@dataclass
class WandbRun:
    """What an offline run holds: `run` (id, project, group, name, tags), `config`, `history` (one dict per
    logged step), `summary`, the names of the files it saved, its logged artifacts and its metric
    definitions (`define_metric`: name -> step metric, step_sync and summaries; a glob as its glob)."""

    run: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    exit_code: int | None = None


def _payloads(data: bytes, path: Path) -> list[bytes]:
    if len(data) < HEADER.size:
        raise WandbFileError(f"{path} is too short to be a W&B run file")
    ident, magic, _version = HEADER.unpack_from(data)
    if ident != IDENT or magic != MAGIC:
        raise WandbFileError(f"{path} is not a W&B run file (header {data[:7]!r})")
    records, pending, offset = [], b"", HEADER.size
    while offset + RECORD_HEADER.size <= len(data):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < RECORD_HEADER.size:  # a block trailer: zero padding
            offset += left_in_block
            continue
        checksum, length, kind = RECORD_HEADER.unpack_from(data, offset)
        if length == 0 and kind == 0:  # zero padding up to the end of the block
            offset += left_in_block
            continue
        chunk = data[offset + RECORD_HEADER.size : offset + RECORD_HEADER.size + length]
        if len(chunk) < length:
            break  # a record cut short by an interrupted write: keep what is complete
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != checksum:
            raise WandbFileError(f"{path}: checksum mismatch at byte {offset}: the file is damaged")
        offset += RECORD_HEADER.size + length
        if kind == FULL:
            records.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            records.append(pending + chunk)
            pending = b""
        else:
            raise WandbFileError(f"{path}: unknown record type {kind} at byte {offset}")
    return records


def _assign(target: dict[str, Any], item: Any) -> None:
    """Set `item`'s JSON value in `target`; a nested key (`["t/hypotheses", "nrows"]`) nests dicts."""
    value = json.loads(item.value_json)
    if not item.nested_key:
        target[item.key] = value
        return
    *parents, last = item.nested_key
    for name in parents:
        target = target.setdefault(name, {})
    target[last] = value


def read_wandb_run(path: str | Path) -> WandbRun:
    """Parse an offline run's `run-<id>.wandb` file (see the module docstring).

    Raises:
        WandbFileError: The file is not a W&B run file or fails its checksums.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(path)
    out = WandbRun()
    for payload in _payloads(path.read_bytes(), path):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            out.run = {
                "id": run.run_id, "project": run.project, "entity": run.entity, "group": run.run_group,
                "name": run.display_name, "tags": list(run.tags), "job_type": run.job_type,
            }  # fmt: skip
            for item in run.config.update:
                _assign(out.config, item)
        elif kind == "config":
            for item in record.config.update:
                _assign(out.config, item)
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in record.history.item:
                _assign(row, item)
            out.history.append(row)
        elif kind == "summary":
            for item in record.summary.update:
                _assign(out.summary, item)
        elif kind == "files":
            out.files.extend(f.path for f in record.files.files)
        elif kind == "artifact":
            art = record.artifact
            out.artifacts.append(
                {"name": art.name, "type": art.type, "files": [e.path for e in art.manifest.contents]}
            )
        elif kind == "metric":
            metric = record.metric
            summary = [f.name for f, value in metric.summary.ListFields() if value is True]
            out.metrics[metric.name or metric.glob_name] = {
                "step_metric": metric.step_metric, "step_sync": metric.options.step_sync, "summary": summary,
            }  # fmt: skip
        elif kind == "exit":
            out.exit_code = record.exit.exit_code
    return out


def find_run_file(directory: str | Path) -> Path:
    """The single `run-*.wandb` file under `directory` (a run's W&B directory, searched recursively)."""
    found = sorted(Path(directory).rglob("run-*.wandb"))
    if len(found) != 1:
        raise WandbFileError(f"expected one run-*.wandb file under {directory}, found {len(found)}")
    return found[0]
