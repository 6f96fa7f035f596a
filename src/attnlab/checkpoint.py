"""Self-contained checkpoints: reading them safely, finding a run's epoch checkpoints, averaging them.

Every checkpoint `attnlab-train` writes (best, last, per epoch) holds, besides Lightning's own entries,
the model, optimiser and decoding settings as plain dicts (`hyper_parameters`) and an `attnlab` entry
with the tokenizers as JSON and the data settings, so a checkpoint alone is enough to translate and
evaluate (`attnlab.translate.Translator.from_checkpoints`). Checkpoints are read with
`torch.load(weights_only=True)`: loading one never runs code from the file.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

BUNDLE_KEY = "attnlab"
BUNDLE_FORMAT = 1
# What an exact resumption needs beyond Lightning's own entries (random-number generator states, counters).
RESUME_KEY = "attnlab_resume"
EPOCH_FILE = re.compile(r"^epoch(\d+)\.ckpt$")


def rng_states() -> dict[str, Any]:
    """This process's random-number generator states (torch CPU, every CUDA device, Python's `random`),
    in types `torch.load(weights_only=True)` reads back. NumPy's global generator is not used by
    attnlab and not saved."""
    import random

    version, state, gauss = random.getstate()
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": [version, list(state), gauss]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what `rng_states` saved."""
    import random

    torch.set_rng_state(states["torch"])
    version, state, gauss = states["python"]
    random.setstate((version, tuple(state), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, unreadable, not from attnlab, or not matching others."""


def bundle(datamodule: Any) -> dict[str, Any]:
    """The `attnlab` checkpoint entry for a data module: its tokenizers as JSON and its data settings
    (None for data without tokenizers, e.g. `data=synthetic`)."""
    spec = getattr(datamodule, "spec", None)
    data = None
    if dataclasses.is_dataclass(spec):
        data = {"_target_": f"{type(spec).__module__}.{type(spec).__qualname__}", **dataclasses.asdict(spec)}
    tokenizers = {}
    for side in ("src_tokenizer", "tgt_tokenizer"):
        tokenizer = getattr(datamodule, side, None)
        tokenizers[side] = tokenizer.to_json() if tokenizer is not None else None
    return {"format": BUNDLE_FORMAT, "data": data, **tokenizers}


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint written by `attnlab-train` onto the CPU, checking what evaluation needs.

    Raises:
        CheckpointError: The file is missing, damaged, or lacks the model settings, weights or
            tokenizers; the message names the file and what to use instead.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any failure to unpickle (the weights-only unpickler raises many kinds)
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        raise CheckpointError(
            f"cannot read checkpoint {path}: {type(exc).__name__}: {first_line}"
            " — the file is damaged (an interrupted copy or save?) or not a PyTorch checkpoint; use another "
            "checkpoint of the run (checkpoints/last.ckpt, checkpoints/epochs/)"
        ) from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path} holds a {type(checkpoint).__name__}, not a Lightning checkpoint")
    missing = [key for key in ("state_dict", "hyper_parameters", BUNDLE_KEY) if key not in checkpoint]
    if missing:
        raise CheckpointError(
            f"{path} lacks {', '.join(missing)}: it was not written by attnlab-train (which stores the "
            "model settings and tokenizers in every checkpoint)"
        )
    bundle = checkpoint[BUNDLE_KEY]
    if bundle.get("format") != BUNDLE_FORMAT:
        raise CheckpointError(
            f"{path} has attnlab checkpoint format {bundle.get('format')!r}; this version reads "
            f"format {BUNDLE_FORMAT}"
        )
    return checkpoint


def epoch_checkpoints(directory: str | Path) -> list[Path]:
    """The per-epoch checkpoints `epochNNN.ckpt` of a run, oldest first.

    `directory` is a run directory, its `checkpoints/` or its `checkpoints/epochs/`.
    """
    directory = Path(directory)
    for candidate in (directory / "checkpoints" / "epochs", directory / "epochs", directory):
        found = [p for p in candidate.glob("epoch*.ckpt") if EPOCH_FILE.match(p.name)]
        if found:
            return sorted(found, key=lambda p: int(EPOCH_FILE.match(p.name).group(1)))
    return []


def last_epoch_checkpoints(directory: str | Path, n: int) -> list[Path]:
    """The `n` latest per-epoch checkpoints of a run (see `epoch_checkpoints`).

    Raises:
        CheckpointError: Fewer than `n` exist; the message says how many and where.
    """
    found = epoch_checkpoints(directory)
    if len(found) < n:
        raise CheckpointError(
            f"averaging the last {n} epoch checkpoints needs {n}, found {len(found)} under {directory} "
            "(checkpoints/epochs/epochNNN.ckpt; train with average_last={n} to keep them, or lower it)"
        )
    return found[-n:]


def average_state_dicts(states: Sequence[dict[str, Tensor]], names: Sequence[str] = ()) -> dict[str, Tensor]:
    """The element-wise mean of floating-point tensors (accumulated in float64, as fairseq's
    `average_checkpoints`); other tensors (counters, ids) must be equal and are copied.

    Raises:
        CheckpointError: The state dicts differ in keys or shapes (not the same architecture).
    """
    if not states:
        raise CheckpointError("no checkpoints to average")
    names = list(names) or [f"checkpoint {i}" for i in range(len(states))]
    first = states[0]
    for name, state in zip(names[1:], states[1:], strict=True):
        if state.keys() != first.keys():
            diff = sorted(set(state) ^ set(first))
            raise CheckpointError(
                f"{name} has other parameters than {names[0]} ({', '.join(diff[:5])}): "
                "only checkpoints of one model can be averaged"
            )
        for key, value in state.items():
            if value.shape != first[key].shape:
                raise CheckpointError(
                    f"{key} is {tuple(value.shape)} in {name} but {tuple(first[key].shape)} in {names[0]}: "
                    "only checkpoints of one model can be averaged"
                )
    averaged = {}
    for key, value in first.items():
        if value.is_floating_point():
            total = torch.zeros_like(value, dtype=torch.float64)
            for state in states:
                total += state[key].to(torch.float64)
            averaged[key] = (total / len(states)).to(value.dtype)
        else:
            for name, state in zip(names, states, strict=True):
                if not torch.equal(state[key], value):
                    raise CheckpointError(
                        f"{key} differs between {names[0]} and {name} and cannot be averaged"
                    )
            averaged[key] = value.clone()
    return averaged


def read_averaged(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The first checkpoint of `paths` with its `state_dict` replaced by the average over all of them.

    The settings and tokenizers of every checkpoint must match the first one's.
    """
    if not paths:
        raise CheckpointError("no checkpoint paths given")
    checkpoints = [read_checkpoint(p) for p in paths]
    first = checkpoints[0]
    for path, checkpoint in zip(paths[1:], checkpoints[1:], strict=True):
        if checkpoint["hyper_parameters"].get("model") != first["hyper_parameters"].get("model"):
            raise CheckpointError(f"{path} has another model config than {paths[0]}: cannot average them")
        for key in ("src_tokenizer", "tgt_tokenizer"):
            if checkpoint[BUNDLE_KEY].get(key) != first[BUNDLE_KEY].get(key):
                raise CheckpointError(f"{path} has another tokenizer than {paths[0]}: cannot average them")
    if len(checkpoints) > 1:
        names = [str(p) for p in paths]
        first = {**first, "state_dict": average_state_dicts([c["state_dict"] for c in checkpoints], names)}
    return first


def model_weights(state_dict: dict[str, Tensor], prefix: str = "model.") -> dict[str, Tensor]:
    """The `Transformer`'s weights out of a `TranslationModule` state dict (keys without `prefix`)."""
    return {key[len(prefix) :]: value for key, value in state_dict.items() if key.startswith(prefix)}
