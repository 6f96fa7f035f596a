"""Writing checkpoints so that a crash, a kill or a full disk during a save never costs a saved one.

`AtomicCheckpointIO` (Lightning's checkpoint-IO plugin for every run of `attnlab-train`) writes each
checkpoint with `attnlab.io.atomic_writer`: to a hidden temporary file beside its destination
(`.<name>.partial-<pid>`), flushed to disk (`fsync`) and only then renamed over the destination
(`os.replace`, atomic on POSIX file systems): a reader sees the previous checkpoint or the new one,
never a part of one. A failed write removes its temporary file and raises `CheckpointWriteError` naming
the file and the fix; temporary files left by a killed process are removed by the next save to the same
path.

It also reads the checkpoint a run continues from, by attnlab's one safe reader, and lets only the
callback states that may steer the run in (`trusted_callback_states`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from attnlab.io import WriteError, atomic_writer, write_fix

log = logging.getLogger(__name__)


class CheckpointWriteError(WriteError):
    """A checkpoint could not be written; what was saved before is unchanged."""


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


# The entries of Lightning's `ModelCheckpoint` state naming files: the final evaluation reads the best one,
# and Lightning deletes the ones a new checkpoint replaces.
CHECKPOINT_PATHS = ("best_model_path", "kth_best_model_path", "last_model_path")


def _named_files(state: dict[str, Any]) -> list[Any]:
    """The files a `ModelCheckpoint` state names (its path entries and the keys of `best_k_models`)."""
    best_k = state.get("best_k_models")
    return [state.get(key) for key in CHECKPOINT_PATHS] + list(best_k if isinstance(best_k, dict) else [])


def trusted_callback_states(checkpoint: dict[str, Any], path: Path, own_run: bool) -> None:
    """Keep (in place) only the callback states of `checkpoint` that may steer this run.

    A checkpoint of another run (`ckpt_path=`, `own_run=False`) starts a new run: none of its callback
    states is loaded, so its `ModelCheckpoint` state (best score, best and top-k files) cannot choose
    which file the final evaluation scores or which file Lightning deletes, nor its `EarlyStopping`
    state stop this run. The run's own `last.ckpt` keeps them. A `ModelCheckpoint` state of a run
    directory moved since names files in its old `checkpoints/` (its `dirpath`): where their names lie
    inside the directory the checkpoint now lies in and its best file is there, the state follows the
    move (`_relocated`), so the best score
    and the files Lightning replaces stay the run's (dropped, its old best checkpoint stayed beside the
    next one, and a run directory with two cannot be evaluated). A state naming any other file outside
    that directory is dropped, with a warning, and the callback starts afresh.
    """
    states = checkpoint.get("callbacks")
    if not isinstance(states, dict) or not states:
        return
    if not own_run:
        checkpoint["callbacks"] = {}
        return
    directory = path.parent.resolve()
    for key, state in list(states.items()):
        if not isinstance(state, dict) or "best_model_path" not in state:
            continue  # not a ModelCheckpoint state
        outside = [f for f in _named_files(state) if f != "" and f is not None and not _inside(f, directory)]
        if outside and _relocated(state, outside, directory):
            log.info("%s: the checkpoint callback state %s follows its run directory from %s", path, key,
                     Path(outside[0]).parent)  # fmt: skip
        elif outside:
            log.warning(
                "%s: the checkpoint callback state %s names %r, outside %s; it was not loaded (the "
                "callback starts afresh: best checkpoint and scores from the epochs trained from here)",
                path, key, outside[0], directory,
            )  # fmt: skip
            del states[key]


def _relocated(state: dict[str, Any], outside: list[Any], directory: Path) -> bool:
    """Move (in place) the files of a `ModelCheckpoint` state to `directory`, or to its subdirectory of the
    name of the state's own `dirpath` (`epochs/`, `steps/`: `AveragingCheckpoints`), when every file it
    names outside `directory` is a file of that `dirpath` whose name is in it (symbolic links resolved) and
    its best file is there (a run directory moved or copied since); returns whether it did."""
    old = state.get("dirpath")
    if not isinstance(old, str) or not old:
        return False
    below = Path(old).name
    for new in [directory, *([directory / below] if below not in ("", ".", "..") else [])]:
        moved = _mover(Path(old), new)
        # Each a file of the run's, symbolic links resolved (a link in checkpoints/ could name any file).
        # The best file must be there; the others may be gone: files the callback replaced after last.ckpt
        # was written (a crashed or mid-epoch last.ckpt), which it would delete, and Lightning skips.
        best = state.get("best_model_path")
        present = (
            [Path(moved(best)).is_file()]
            if isinstance(best, str) and best
            else [Path(moved(file)).is_file() for file in outside]
        )
        if any(present) and all(moved(file) != file and _inside(moved(file), directory) for file in outside):
            for key in CHECKPOINT_PATHS:
                if key in state:
                    state[key] = moved(state[key])
            best_k = state.get("best_k_models")
            if isinstance(best_k, dict):
                state["best_k_models"] = {moved(file): score for file, score in best_k.items()}
            state["dirpath"] = str(new)
            return True
    return False


def _mover(old: Path, new: Path) -> Callable[[Any], Any]:
    """file -> the file of its name in `new` for a file of `old` (anything else unchanged)."""
    return lambda file: (
        str(new / Path(file).name) if isinstance(file, str) and Path(file).parent == old else file
    )


def _inside(file: Any, directory: Path) -> bool:
    """Whether `file` is a path in `directory` (or below it), symbolic links and `..` resolved."""
    try:
        return isinstance(file, str) and directory in Path(file).resolve().parents
    except (OSError, ValueError):  # a name no file can have (a NUL byte, a link loop)
        return False


class AtomicCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` whose saves are atomic (temporary file, fsync, rename).

    Args:
        own_run: Whether the checkpoint a run continues from is the run's own (`checkpoints/last.ckpt`):
            only then do its callback states steer the run (see `trusted_callback_states`).
    """

    def __init__(self, own_run: bool = False) -> None:
        super().__init__()
        self.own_run = own_run

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        path = Path(path)
        try:
            with atomic_writer(path, tag="partial") as file:  # `.<name>.partial-<pid>`, stale ones removed
                self.write(checkpoint, file)
        except BaseException as exc:
            failure = _write_failure(exc)
            if failure is None:
                raise
            reason = failure.strerror or str(failure)
            kept = "the previous checkpoint there is unchanged" if path.exists() else "nothing was written"
            raise CheckpointWriteError(
                failure.errno,
                f"cannot write checkpoint {path}: {reason}; {kept}. {write_fix(failure)} (or run in another "
                "directory: hydra.run.dir=...), then continue the run with resume=auto",
            ) from failure

    def write(self, checkpoint: dict[str, Any], file: IO[bytes]) -> None:
        """Serialize `checkpoint` into the open temporary file."""
        torch.save(checkpoint, file)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict:
        """The checkpoint a run continues from (`trainer.fit(ckpt_path=...)`), read by attnlab's one safe
        reader, `attnlab.runs.checkpoint.read_checkpoint` (weights only, whatever `weights_only` says; a file
        naming a class attnlab does not build is refused), with only the callback states that may steer
        this run (`trusted_callback_states`)."""
        from attnlab.runs.checkpoint import read_checkpoint

        # On the CPU unless asked (Lightning's own default): the strategy moves what it loads.
        checkpoint = read_checkpoint(path, map_location="cpu" if map_location is None else map_location)
        trusted_callback_states(checkpoint, Path(path), self.own_run)
        return checkpoint
