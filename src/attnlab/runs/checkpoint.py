"""Self-contained checkpoints: reading them safely, finding a run's epoch checkpoints, averaging them.

Every checkpoint `attnlab-train` writes (best, last, per epoch) holds, besides Lightning's own entries,
the model, optimiser and decoding settings as plain dicts (`hyper_parameters`) and an `attnlab` entry
with the tokenizers as JSON and the data settings, so a checkpoint alone is enough to translate and
evaluate (`attnlab.inference.translator.Translator.from_checkpoints`). Checkpoints are read with
`torch.load(weights_only=True)`: loading one never runs code from the file.

Nothing in a checkpoint chooses what code runs: `read_checkpoint`, the one reader every command uses,
refuses a file holding pickled code or foreign globals, and one whose plain data names a class (a
`_target_` or Lightning's `_instantiator`/`_class_path`) other than the data spec classes of
`DATA_SPECS`. Objects are built from checkpoint content only by `data_spec` and `saved_settings`, each
with a class looked up in a closed dictionary, never by importing a name found in the file.
"""

from __future__ import annotations

import dataclasses
import pickle
import pickletools
import random
import re
import reprlib
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.data import DATA_SPECS
from attnlab.decoding import DecodeConfig
from attnlab.metrics import MetricsConfig
from attnlab.model.config import TransformerConfig
from attnlab.optim import OptimConfig
from attnlab.runs.layout import CHECKPOINTS_DIR
from attnlab.typed import ConfigError, build_from

BUNDLE_KEY = "attnlab"
BUNDLE_FORMAT = 1
# What an exact resumption needs beyond Lightning's own entries (random-number generator states, counters).
RESUME_KEY = "attnlab_resume"
KEPT_FILE = re.compile(r"^(epoch|step)(\d+)\.ckpt$")  # checkpoints kept for averaging
# `hyper_parameters` entry -> its class (the entries hold plain values only, no class name).
SETTINGS: dict[str, type] = {
    "model": TransformerConfig, "optim": OptimConfig, "decode": DecodeConfig, "metrics": MetricsConfig,
}  # fmt: skip
# Keys by which Hydra (`instantiate`) or Lightning (`load_from_checkpoint`) would import what they name.
CLASS_KEYS = ("_target_", "_instantiator", "_class_path")
# What torch's weights-only unpickler says when a file holds code or objects of foreign classes.
EXECUTABLE = re.compile(r"Unsupported global|unsupported GLOBAL|reduce for unrecognized function|"
                        r"Can only create new object|Can only build")  # fmt: skip


def rng_states() -> dict[str, Any]:
    """This process's random-number generator states (torch CPU, every CUDA device, Python's `random`),
    in types `torch.load(weights_only=True)` reads back. NumPy's global generator is not used by
    attnlab and not saved."""
    version, state, gauss = random.getstate()
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": [version, list(state), gauss]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what `rng_states` saved."""
    torch.set_rng_state(states["torch"])
    version, state, gauss = states["python"]
    random.setstate((version, tuple(state), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, unreadable, not from attnlab, or not matching others."""


def data_settings(datamodule: Any) -> dict[str, Any] | None:
    """A data module's data settings as a checkpoint holds them (`_target_` and the spec's fields, with
    its local paths absolute: the data module's `absolute_paths`, from `CorpusData.absolute_paths` when
    it was built); None for a data module without a spec."""
    spec = getattr(datamodule, "spec", None)
    if not dataclasses.is_dataclass(spec):
        return None
    paths = getattr(datamodule, "absolute_paths", None) or {}  # (resolved when the data module was built)
    target = f"{type(spec).__module__}.{type(spec).__qualname__}"
    return {"_target_": target, **dataclasses.asdict(spec), **paths}


def bundle(datamodule: Any) -> dict[str, Any]:
    """The `attnlab` checkpoint entry for a data module: its tokenizers as JSON and its data settings
    (`data_settings`)."""
    data = data_settings(datamodule)
    tokenizers = {}
    for side in ("src_tokenizer", "tgt_tokenizer"):
        tokenizer = getattr(datamodule, side, None)
        tokenizers[side] = tokenizer.to_json() if tokenizer is not None else None
    return {"format": BUNDLE_FORMAT, "data": data, **tokenizers}


def read_checkpoint(path: str | Path, map_location: Any = "cpu", *, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint written by `attnlab-train` (onto the CPU unless `map_location` says otherwise),
    checking what evaluation needs and that nothing in it chooses what code runs.

    With `mmap`, the tensors of a zip-format file (what torch.save writes) are mapped from it instead of
    read into memory: for the checks before a continued run, which read a few entries of a file holding the
    optimizer's moments too (twice the weights) and then let Lightning load it; other files are read.

    Raises:
        CheckpointError: The file is missing, damaged, lacks the model settings, weights or tokenizers,
            holds executable objects, names a class attnlab does not build, or nests its data deeper than
            `MAX_NESTING`; the message names the file and what to use instead. A refused file is not
            loaded: nothing in it ran.
    """
    path = Path(path)
    if path.is_dir():  # (a run directory stands for its best checkpoint only in the commands' ckpt_path=)
        raise CheckpointError(f"{path} is a directory, not a checkpoint file: give a .ckpt file")
    if not path.is_file():  # (a device such as /dev/zero would be read without end)
        if path.exists():
            raise CheckpointError(
                f"{path} is a device, a pipe or a socket, not a checkpoint file: give a .ckpt file"
            )
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        mapped = mmap and zipfile.is_zipfile(path)
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mapped)
    except Exception as exc:  # any failure to unpickle (the weights-only unpickler raises many kinds)
        raise _load_error(path, exc) from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path} holds a {type(checkpoint).__name__}, not a Lightning checkpoint")
    missing = [key for key in ("state_dict", "hyper_parameters", BUNDLE_KEY) if key not in checkpoint]
    if missing:
        raise CheckpointError(
            f"{path} lacks {', '.join(missing)}: it was not written by attnlab-train (which stores the "
            "model settings and tokenizers in every checkpoint)"
        )
    for key in ("hyper_parameters", BUNDLE_KEY):
        if not isinstance(checkpoint[key], dict):
            raise CheckpointError(
                f"{path} has a {type(checkpoint[key]).__name__} as {key}, not the dict attnlab-train "
                "writes: it was not written by attnlab-train"
            )
    bundle = checkpoint[BUNDLE_KEY]
    found = bundle.get("format")
    if found != BUNDLE_FORMAT:
        newer = type(found) is int and found > BUNDLE_FORMAT
        fix = "a newer attnlab wrote it: upgrade attnlab to read it" if newer else "use another checkpoint"
        raise CheckpointError(
            f"{path} has attnlab checkpoint format {_SHOWN.repr(found)}; this version reads format "
            f"{BUNDLE_FORMAT}: {fix}"
        )
    _refuse_data_class(bundle, path)
    _refuse_unsafe_data(checkpoint, path)
    return checkpoint


# How deep the plain data of a checkpoint may nest (attnlab-train's nests a few levels), and how many
# dicts, lists and tuples a walk through it may meet, counting one reached twice twice (attnlab-train's
# hold a few thousand): every reader walks it recursively, and data nested past Python's recursion limit
# would crash it with a RecursionError, while a list holding one list twice, that one another twice, and
# so on (the unpickler keeps the shared references) is 2^N containers to walk in a file of a few KB.
MAX_NESTING = 64
MAX_CONTAINERS = 1_000_000


def _refuse_unsafe_data(checkpoint: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint whose dicts, lists and tuples nest deeper than `MAX_NESTING` or that a walk
    through meets more than `MAX_CONTAINERS` times, or whose `hyper_parameters` or `attnlab` entry names a
    class (a `CLASS_KEYS` key, but `attnlab.data._target_`: `_refuse_data_class`). One walk, without
    recursion; a class is named only once the whole walk passed (its value is then safe to print)."""
    scoped = ("hyper_parameters", BUNDLE_KEY)  # the entries in which a key may name a class
    stack: list[tuple[Any, int, str | None]] = [(checkpoint, 0, None)]
    met, named = 0, None
    while stack:
        value, depth, where = stack.pop()
        met += 1
        if depth > MAX_NESTING or met > MAX_CONTAINERS:
            what = f"nested more than {MAX_NESTING} levels deep" if depth > MAX_NESTING else (
                f"of more than {MAX_CONTAINERS:,} dicts, lists and tuples (each counted as often as it is "
                "referenced)")  # fmt: skip
            raise CheckpointError(
                f"{path} holds data {what}, which no checkpoint written by attnlab-train holds: the file "
                "is damaged or not attnlab's; use another checkpoint"
            )
        mapping = isinstance(value, dict)
        for key, item in value.items() if mapping else enumerate(value):
            if where is None:  # outside hyper_parameters and the attnlab entry: no class key looked for
                at = key if depth == 0 and key in scoped else None
            else:
                at = f"{where}.{key}" if mapping else f"{where}[{key}]"
                if named is None and mapping and key in CLASS_KEYS and at != f"{BUNDLE_KEY}.data._target_":
                    named = (at, item)
            if isinstance(item, (dict, list, tuple)):
                stack.append((item, depth + 1, at))
    if named is not None:
        raise _refused_class(path, *named)


def _load_error(path: Path, exc: Exception) -> CheckpointError:
    """The `CheckpointError` for a file `torch.load(weights_only=True)` failed on: refused for holding
    executable objects, or damaged; never with torch's advice to load it with `weights_only=False`."""
    text = str(exc)
    executable = isinstance(exc, pickle.UnpicklingError) and EXECUTABLE.search(text) is not None
    named = re.search(r"GLOBAL (\S+)", text) if executable else None
    name = named.group(1) if named else None
    if not executable and isinstance(exc, pickle.UnpicklingError) and not zipfile.is_zipfile(path):
        name = _pickled_global(path)  # a plain pickle the unpickler stopped on before reaching its code
        executable = name is not None
    if executable:
        return CheckpointError(
            f"{path} refused: it contains executable objects{f' ({name})' if name else ''}, which no "
            "checkpoint written by attnlab-train holds; it was not loaded and nothing in it ran. Use a "
            "checkpoint written by attnlab-train, from a source you trust"
        )
    detail = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)  # without torch's advice around it
    first_line = detail.group(1) if detail else (text.splitlines()[0] if text else "")
    # (never naming the damaged file itself as the one to use instead)
    others = "checkpoints/best-*.ckpt" if path.name == "last.ckpt" else "checkpoints/last.ckpt"
    return CheckpointError(
        f"cannot read checkpoint {path}: {type(exc).__name__}: {first_line}"
        " — the file is damaged (an interrupted copy or save?) or not a PyTorch checkpoint; use another "
        f"checkpoint of the run ({others}, checkpoints/epochs/)"
    )


def _pickled_global(path: Path) -> str | None:
    """The first global (a class or function) the pickles in a non-zip file name, found by reading
    their opcodes only (`pickletools`: nothing is imported or run); None when there is none or the
    file is no pickle."""
    strings: list[str] = []
    try:
        with open(path, "rb") as file:
            while file.peek(1):  # a legacy torch file holds several pickles in a row
                for opcode, arg, _ in pickletools.genops(file):
                    if opcode.name in ("GLOBAL", "INST"):
                        return str(arg).replace(" ", ".")
                    if opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                        return ".".join(strings[-2:])
                    if isinstance(arg, str):
                        strings.append(arg)
    except Exception:  # not (or no longer) a pickle: what was read named no global
        return None
    return None


# How a value read from an untrusted file is shown in a message: its repr, cut to about 100 characters
# (a megabyte-long `_target_` made a megabyte-long error)
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 100


def _refused_class(path: str | Path, where: str, name: Any) -> CheckpointError:
    return CheckpointError(
        f"{path} names a class attnlab does not build ({where}={_SHOWN.repr(name)}) and was not loaded: "
        "from a checkpoint attnlab builds only its data specs and model, optim, decode and metrics settings, "
        "by their own names, never a class the file names. Use a checkpoint written by attnlab-train"
    )


def _refuse_data_class(bundle: dict[str, Any], path: str | Path) -> None:
    """Refuse an `attnlab.data` entry that is no dict, or names a class but a data spec of `DATA_SPECS`
    (as its `_target_`)."""
    data = bundle.get("data")
    if data is not None:
        if not isinstance(data, dict):
            raise CheckpointError(f"{path} has a {type(data).__name__} as attnlab.data, not the dict of "
                                  "data settings attnlab-train writes")  # fmt: skip
        _data_class(data, path)


def _data_class(data: dict[str, Any], path: str | Path) -> type:
    """The class in `DATA_SPECS` that a checkpoint's `attnlab.data._target_` names (refused otherwise)."""
    target = data.get("_target_")
    if not isinstance(target, str) or target not in DATA_SPECS:
        raise _refused_class(path, f"{BUNDLE_KEY}.data._target_", target)
    return DATA_SPECS[target]


# Data settings a checkpoint does not choose: which host a download contacts (Multi30k's files are
# checksummed, so any mirror gives the same data) is this machine's setting, never an untrusted file's.
NOT_FROM_CHECKPOINTS = ("base_url",)


def data_spec(data: dict[str, Any], path: str | Path) -> Any:
    """The data spec a checkpoint's `attnlab.data` entry describes, built by its class in `DATA_SPECS`,
    with the class's defaults for `NOT_FROM_CHECKPOINTS` (`data=multi30k data.base_url=<mirror>` sets one).

    Raises:
        CheckpointError: The entry names another class (see `read_checkpoint`).
        attnlab.typed.ConfigError: A value the data spec refuses (naming `data.<key>`).
    """
    values = {k: v for k, v in data.items() if k != "_target_" and k not in NOT_FROM_CHECKPOINTS}
    return build_from(_data_class(data, path), values, "data")


def saved_settings(checkpoint: dict[str, Any], key: str, path: str | Path) -> Any:
    """The `hyper_parameters[key]` (`model`, `optim`, `decode` or `metrics`) of a checkpoint, built by its
    class in `SETTINGS` (decoding and scoring defaults when a checkpoint has none).

    Raises:
        CheckpointError: The entry is missing or holds values its class refuses.
    """
    values = checkpoint["hyper_parameters"].get(key)
    if values is None and key in ("decode", "metrics"):  # (older checkpoints have no metrics settings)
        values = {}
    if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
        raise CheckpointError(
            f"{path} has no {key} settings (hyper_parameters.{key}) of attnlab-train: it was not written "
            "by attnlab-train"
        )
    try:
        return build_from(SETTINGS[key], values, key)
    except ConfigError as exc:
        raise CheckpointError(f"{path} holds {key} settings this version cannot use: {exc}") from None


LAYER_KEY = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.")


def check_weights_fit(
    config: TransformerConfig,
    state_dict: Any,
    path: str | Path,
    *,
    prefix: str = "model.",
    strict: bool = True,
) -> None:
    """Refuse, before any model is built, weights that do not fit the model settings `config`: a
    checkpoint's settings could otherwise make building its model allocate any amount of memory (say
    d_model=65536 and a vocabulary of a million), whatever its weights hold.

    The layer counts are compared with the layers the weights hold first (a count alone could make even
    a model without storage slow to build), then the model is built on the `meta` device (no memory)
    and every parameter and buffer shape compared with the weights' (`state_dict` keys under `prefix`),
    and their kind: dense tensors of finite floating-point values (`_value_problem`).
    With `strict=False` missing and extra weights are allowed (as `load_state_dict(strict=False)` does);
    layer counts and shapes must still match.

    Raises:
        CheckpointError: Naming the file and the first differing key.
    """
    from attnlab.model.transformer import Transformer

    refused = f"{path}: its model settings do not fit its weights"
    advice = ("; refused before the model was built — the file is damaged or not written by attnlab-train, "
              "use another checkpoint")  # fmt: skip
    if not isinstance(state_dict, dict) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in state_dict.items()
    ):
        raise CheckpointError(f"{path}: its state_dict is not a dict of named tensors{advice}")
    weights = model_weights(state_dict, prefix)
    for side in ("encoder", "decoder"):
        wanted = getattr(config, f"n_{side}_layers")
        held = {int(m.group(2)) for key in weights if (m := LAYER_KEY.match(key)) and m.group(1) == side}
        if len(held) != wanted or held != set(range(wanted)):  # the count first: never a set of `wanted`
            first = (
                min(set(range(len(held) + 1)) - held)
                if len(held) < wanted
                else min(i for i in held if i >= wanted)
            )
            raise CheckpointError(
                f"{refused} (first differing key: {prefix}{side}.layers.{first}.*): "
                f"model.n_{side}_layers={wanted} but the weights hold {len(held)} {side} layers{advice}"
            )
    with torch.device("meta"):  # shapes only: nothing is allocated
        expected = Transformer(config).state_dict()
    for key, tensor in expected.items():
        if key not in weights:
            if strict:
                raise CheckpointError(f"{refused} (first differing key: {prefix}{key}, missing){advice}")
            continue
        if tuple(weights[key].shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{refused} (first differing key: {prefix}{key}: the settings make it "
                f"{tuple(tensor.shape)}, the weights {tuple(weights[key].shape)}; d_model={config.d_model}, "
                f"vocabulary sizes {config.src_vocab_size}/{config.tgt_vocab_size}){advice}"
            )
    extra = [key for key in weights if key not in expected]
    if strict and extra:
        raise CheckpointError(f"{refused} (first differing key: {prefix}{extra[0]}, unexpected){advice}")
    for key, tensor in expected.items():
        problem = _value_problem(weights[key], tensor) if key in weights else None
        if problem:
            raise CheckpointError(f"{path}: its weight {prefix}{key} {problem}{advice}")


def check_no_foreign_entries(
    state_dict: dict[str, Any], ours: Iterable[str], path: str | Path, whose: str
) -> None:
    """Refuse a checkpoint whose `state_dict` holds an entry outside the module that loads it (`ours`, its
    keys; `check_weights_fit` checks those under `model.`): `load_state_dict` would fail with torch's
    "Unexpected key(s)".

    Raises:
        CheckpointError: Naming the file and the first such entry.
    """
    keys = set(ours)
    foreign = [key for key in state_dict if key not in keys]
    if foreign:
        raise CheckpointError(
            f"{path}: its state_dict holds {foreign[0]!r}, no entry of {whose}: the file is damaged or not "
            "written by attnlab-train; use another checkpoint"
        )


def _value_problem(saved: Tensor, expected: Tensor) -> str | None:
    """What makes a saved tensor (of the right shape) unusable for the model's parameter or buffer
    `expected` (on `meta`), or None: it must be a dense tensor of data (`load_state_dict` fails on a sparse
    or `meta` one, or casts, silently, a complex, integer or boolean one into the model's floats), of finite
    values (NaN or inf weights make every translation fail and every training step's loss NaN)."""
    kind = "floating-point" if expected.is_floating_point() else str(expected.dtype)
    if saved.layout != torch.strided or saved.is_meta:
        return f"is a {saved.layout} tensor on {saved.device}, not a dense tensor of {kind} values"
    if saved.is_complex() or saved.is_floating_point() != expected.is_floating_point():
        return f"holds {saved.dtype} values, not {kind} ones"
    if saved.is_floating_point() and not bool(torch.isfinite(saved).all()):  # decoding them fails
        return "holds NaN or infinite values (saved after the training diverged?)"
    return None


def kept_checkpoints(directory: str | Path) -> list[Path]:
    """The checkpoints a run keeps for averaging (`attnlab.training.callbacks.AveragingCheckpoints`),
    oldest first: `steps/stepNNNNNNNN.ckpt` when the run kept them by steps (`average_every_n_steps`),
    else `epochs/epochNNN.ckpt`.

    `directory` is a run directory, its `checkpoints/`, or its `checkpoints/steps/` or `checkpoints/epochs/`.
    """
    directory = Path(directory)
    for kind in ("steps", "epochs"):
        for candidate in (directory / CHECKPOINTS_DIR / kind, directory / kind, directory):
            found = [p for p in candidate.glob(f"{kind[:-1]}*.ckpt") if KEPT_FILE.match(p.name)]
            if found:
                return sorted(found, key=lambda p: int(KEPT_FILE.match(p.name).group(2)))
    return []


def last_kept_checkpoints(directory: str | Path, n: int) -> list[Path]:
    """The `n` latest checkpoints kept for averaging (see `kept_checkpoints`).

    Raises:
        CheckpointError: Fewer than `n` exist; the message says how many and where.
    """
    found = kept_checkpoints(directory)
    if len(found) < n:
        raise CheckpointError(
            f"averaging the last {n} checkpoints needs {n}, found {len(found)} under {directory} "
            f"(checkpoints/epochs/epochNNN.ckpt, or checkpoints/steps/ with average_every_n_steps; train "
            f"with average_last={n} to keep them, or lower it)"
        )
    return found[-n:]


def average_state_dicts(states: Sequence[dict[str, Tensor]], names: Sequence[str] = ()) -> dict[str, Tensor]:
    """The element-wise mean of floating-point tensors, as fairseq's `average_checkpoints` (accumulated
    in float64 here, in the weights' float32 there); other tensors (counters, ids) must be equal and are
    copied.

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

    The settings and tokenizers of every checkpoint must match the first one's, and the weights of each its
    settings (`check_weights_fit`: a file whose weights are not numbers, or hold NaN, is named).
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
        for path, checkpoint in zip(paths, checkpoints, strict=True):  # each file named by its own weights
            check_weights_fit(saved_settings(checkpoint, "model", path), checkpoint["state_dict"], path)
        names = [str(p) for p in paths]
        first = {**first, "state_dict": average_state_dicts([c["state_dict"] for c in checkpoints], names)}
    return first


def model_weights(state_dict: dict[str, Tensor], prefix: str = "model.") -> dict[str, Tensor]:
    """The `Transformer`'s weights out of a `TranslationModule` state dict (keys without `prefix`)."""
    return {key[len(prefix) :]: value for key, value in state_dict.items() if key.startswith(prefix)}
