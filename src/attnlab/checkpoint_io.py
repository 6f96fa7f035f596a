"""Writing checkpoints so that a crash, a kill or a full disk during a save never costs a saved one.

`AtomicCheckpointIO` (Lightning's checkpoint-IO plugin for every run of `attnlab-train`) writes each
checkpoint to a hidden temporary file beside its destination (`.<name>.partial-<pid>`), flushes it to
disk (`fsync`) and only then renames it over the destination (`os.replace`, atomic on POSIX file
systems): a reader sees the previous checkpoint or the new one, never a part of one. A failed write
removes its temporary file and raises `CheckpointWriteError` naming the file and the fix; temporary
files left by a killed process are removed by the next save to the same path.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import IO, Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; what was saved before is unchanged."""


def _fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# What torch's zip writer raises (a RuntimeError, not an OSError) when writing the file fails.
_TORCH_WRITE_FAILED = ("PytorchStreamWriter failed", "unexpected pos", "file write failed")


def _write_failure(exc: BaseException) -> OSError | None:
    """The write error behind `exc`, or None when `exc` is not one (then it propagates unchanged).

    An `OSError` (opening, flushing, fsync, rename) is one. `torch.save` reports a failed write of the
    file object (a full disk: ENOSPC) as a RuntimeError ("PytorchStreamWriter failed writing file ...",
    "unexpected pos ...") raised while handling the file's OSError, which is then its `__context__`;
    without one, torch's own message stands in for the reason.
    """
    if isinstance(exc, OSError):
        return exc
    if not isinstance(exc, RuntimeError):
        return None
    cause = exc.__cause__ or exc.__context__
    while cause is not None:
        if isinstance(cause, OSError):
            return cause
        cause = cause.__cause__ or cause.__context__
    message = str(exc)
    if any(marker in message for marker in _TORCH_WRITE_FAILED):
        return OSError(None, f"torch could not write the file ({message.strip().splitlines()[0]})")
    return None


class AtomicCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` whose saves are atomic (temporary file, fsync, rename)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        path = Path(path)
        partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            for stale in path.parent.glob(f".{path.name}.partial-*"):  # left by a killed process
                stale.unlink(missing_ok=True)
            with open(partial, "wb") as file:
                self.write(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(partial, path)
        except BaseException as exc:
            partial.unlink(missing_ok=True)
            failure = _write_failure(exc)
            if failure is None:
                raise
            reason = failure.strerror or str(failure)
            hint = "Free disk space" if failure.errno in (errno.ENOSPC, errno.EDQUOT) else "Make it writable"
            kept = "the previous checkpoint there is unchanged" if path.exists() else "nothing was written"
            raise CheckpointWriteError(
                failure.errno,
                f"cannot write checkpoint {path}: {reason}; {kept}. {hint} (or run in another directory: "
                "hydra.run.dir=...), then continue the run with resume=auto",
            ) from failure
        _fsync_directory(path.parent)

    def write(self, checkpoint: dict[str, Any], file: IO[bytes]) -> None:
        """Serialize `checkpoint` into the open temporary file."""
        torch.save(checkpoint, file)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict:
        """The checkpoint a run continues from (`trainer.fit(ckpt_path=...)`), read by attnlab's one safe
        reader, `attnlab.checkpoint.read_checkpoint` (weights only, whatever `weights_only` says; a file
        naming a class attnlab does not build is refused)."""
        from attnlab.checkpoint import read_checkpoint

        return read_checkpoint(path, map_location=map_location)
