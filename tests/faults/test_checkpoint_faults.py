"""Bad checkpoint files: damaged, foreign, hostile, from another model or without tokenizers. Each is
refused with a message naming the file and the problem, and the file is left as it was."""

from __future__ import annotations

import pickle
import re
import shutil
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.inference.translator import Translator, resolve_checkpoints
from attnlab.runs.checkpoint import (
    BUNDLE_KEY,
    CheckpointError,
    average_state_dicts,
    read_averaged,
    read_checkpoint,
)
from attnlab.training.pipeline import train
from attnlab.typed import ConfigError
from helpers import compose_train

RUN = ["data=synthetic", "model=tiny", "data.n_train=64", "data.n_val=16", "data.n_test=16",
       "trainer.max_epochs=1", "logger=csv", "test=false", "trainer.enable_progress_bar=false"]  # fmt: skip


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint of a tiny synthetic-data run."""
    run_dir = tmp_path_factory.mktemp("good")
    train(compose_train(RUN, run_dir))
    return run_dir / "checkpoints" / "last.ckpt"


class Hostile:
    """Unpickling this would run code: weights_only loading must refuse it."""

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return (print, ("code from a checkpoint ran",))


def write_deeply_nested(good: Path, path: Path, depth: int = 100_000) -> None:
    """`good` with `hyper_parameters.deep` a list nested `depth` levels deep: torch's weights-only unpickler
    builds it without recursion (as here, its opcodes written by hand), but walking it recursively fails."""
    checkpoint = torch.load(good, weights_only=True)
    checkpoint["hyper_parameters"]["deep"] = "PLACEHOLDER"
    torch.save(checkpoint, path)
    with zipfile.ZipFile(path) as saved:
        entries = {name: saved.read(name) for name in saved.namelist()}
    name = next(name for name in entries if name.endswith("/data.pkl"))
    data = entries[name]
    at = data.index(b"PLACEHOLDER")
    assert data[at - 5 : at] == b"X" + struct.pack("<I", len("PLACEHOLDER"))  # BINUNICODE
    nested = b"]" * depth + b"a" * (depth - 1)  # EMPTY_LIST each level, then APPEND each into the one below
    entries[name] = data[: at - 5] + nested + data[at + len("PLACEHOLDER") :]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as crafted:
        for entry, content in entries.items():
            crafted.writestr(entry, content)


def write_shared_references(good: Path, path: Path, levels: int = 40) -> None:
    """`good` with a list holding one list twice, that one another twice, `levels` deep: a few KB on disk
    (the unpickler keeps shared references), 2^levels lists for a walk through it."""
    checkpoint = torch.load(good, weights_only=True)
    node: list[Any] = []
    for _ in range(levels):
        node = [node, node]
    checkpoint["hyper_parameters"]["shared"] = node
    torch.save(checkpoint, path)


def write_damaged(kind: str, good: Path, path: Path) -> None:
    data = good.read_bytes()
    writers: dict[str, Callable[[], None]] = {
        "empty": lambda: path.write_bytes(b""),
        "truncated": lambda: path.write_bytes(data[: len(data) // 2]),
        "random bytes": lambda: path.write_bytes(bytes(range(256)) * 64),
        "text": lambda: path.write_text("this is not a checkpoint\n"),
        "hostile pickle": lambda: path.write_bytes(pickle.dumps({"state_dict": Hostile()})),
        "a list": lambda: torch.save([1, 2, 3], path),
        "bare state dict": lambda: torch.save({"state_dict": {}}, path),
        "newer format": lambda: torch.save(
            {**torch.load(good, weights_only=True), BUNDLE_KEY: {"format": 99}}, path
        ),
        "other format": lambda: torch.save(
            {**torch.load(good, weights_only=True), BUNDLE_KEY: {"format": "x"}}, path
        ),
        "data no dict": lambda: torch.save(
            {**torch.load(good, weights_only=True), BUNDLE_KEY: {"format": 1, "data": ["synthetic"]}}, path
        ),
        "deeply nested": lambda: write_deeply_nested(good, path),
        "shared references": lambda: write_shared_references(good, path),
    }
    writers[kind]()


DAMAGED = [
    (
        "empty",
        r"cannot read checkpoint .*bad\.ckpt: .*damaged .* another checkpoint of the run \(checkpoints/last",
    ),
    ("truncated", r"cannot read checkpoint .*bad\.ckpt: .*damaged"),
    ("random bytes", r"cannot read checkpoint .*bad\.ckpt: .*not a PyTorch checkpoint"),
    ("text", r"cannot read checkpoint .*bad\.ckpt"),
    ("hostile pickle", r"bad\.ckpt refused: it contains executable objects \(builtins\.print\)"),
    ("a list", r"bad\.ckpt holds a list, not a Lightning checkpoint"),
    ("bare state dict", r"bad\.ckpt lacks hyper_parameters, attnlab: it was not written by attnlab-train"),
    ("newer format", r"bad\.ckpt has .* format 99; this version reads format 1: a newer attnlab wrote it"),
    ("other format", r"bad\.ckpt has .* format 'x'; this version reads format 1: use another checkpoint"),
    ("data no dict", r"bad\.ckpt has a list as attnlab\.data, not the dict of data settings attnlab-train"),
    ("deeply nested", r"bad\.ckpt holds data nested more than 64 levels deep, .*use another checkpoint"),
    (
        "shared references",
        r"bad\.ckpt holds data of more than 1,000,000 dicts, lists and tuples \(each "
        r"counted as often as it is referenced\), .*use another checkpoint",
    ),
]


@pytest.mark.parametrize(("kind", "message"), DAMAGED, ids=[kind for kind, _ in DAMAGED])
def test_a_bad_file_is_named_by_every_reader(
    kind: str, message: str, good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.ckpt"
    write_damaged(kind, good, path)
    before = path.read_bytes()
    for mmap in (False, True):  # the checks before a continued run map the file
        with pytest.raises(CheckpointError, match=message):
            read_checkpoint(path, mmap=mmap)
    with pytest.raises(CheckpointError, match=message):
        Translator.from_checkpoints([path])
    with pytest.raises(ConfigError, match="ckpt_path: .*" + message):  # continuing training from it
        train(compose_train([*RUN, f"ckpt_path={path}"], tmp_path / "run"))
    assert path.read_bytes() == before
    assert "code from a checkpoint ran" not in capsys.readouterr().out


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads the process's mappings (Linux)")
def test_a_mapped_read_maps_the_tensors_from_the_file(good: Path) -> None:
    """`read_checkpoint(mmap=True)` gives the same entries as a read, its tensors mapped from the file (it
    is in the process's mappings while they live) instead of copied into memory."""
    read, mapped = read_checkpoint(good), read_checkpoint(good, mmap=True)
    assert read.keys() == mapped.keys() and read["global_step"] == mapped["global_step"]
    assert all(torch.equal(read["state_dict"][k], v) for k, v in mapped["state_dict"].items())
    assert str(good.resolve()) in Path("/proc/self/maps").read_text()
    del mapped
    import gc

    gc.collect()
    assert str(good.resolve()) not in Path("/proc/self/maps").read_text()


@pytest.mark.parametrize(("override", "key"), [
    ("model.d_model=64", r"model\.d_model: 32 there, 64 here"),
    ("model.n_decoder_layers=3", r"model\.n_decoder_layers: 2 there, 3 here"),
    ("data.n_symbols=20", r"model\.src_vocab_size: 20 there, 24 here"),
])  # fmt: skip
def test_a_checkpoint_of_another_model_is_refused_before_training(
    override: str, key: str, good: Path, tmp_path: Path
) -> None:
    before = good.read_bytes()
    with pytest.raises(ConfigError, match=rf"ckpt_path=.*last\.ckpt holds another model \(.*{key}"):
        train(compose_train([*RUN, override, f"ckpt_path={good}"], tmp_path))
    assert good.read_bytes() == before
    assert not (tmp_path / "checkpoints").exists()  # nothing trained


def test_a_checkpoint_without_tokenizers_cannot_translate(good: Path) -> None:
    with pytest.raises(CheckpointError, match=r"last\.ckpt.*tokenizer"):
        Translator.from_checkpoints([good])


def test_checkpoints_of_two_models_are_not_averaged(good: Path, tmp_path: Path) -> None:
    other_dir = tmp_path / "other"
    train(compose_train([*RUN, "model.d_ff=48"], other_dir))
    states = [read_checkpoint(p)["state_dict"] for p in (good, other_dir / "checkpoints" / "last.ckpt")]
    with pytest.raises(CheckpointError, match=r"ffn\.w_1\.weight is \(48, 32\) in other but \(.*\) in good"):
        average_state_dicts(states, ["good", "other"])


def test_checkpoints_of_other_settings_or_tokenizers_are_not_averaged(good: Path, tmp_path: Path) -> None:
    """Averaging takes checkpoints of one model: the same model settings (also those that leave the weights'
    shapes as they are, such as dropout) and the same tokenizers; others are refused, naming the file."""
    from attnlab.data.tokenizer import SubwordTokenizer

    tokenizer = SubwordTokenizer.train(["a small corpus", "of two lines"], model="bpe", vocab_size=40)
    edits = {
        "model config": lambda c: c["hyper_parameters"]["model"].update(dropout=0.5),
        "tokenizer": lambda c: c[BUNDLE_KEY].update(tgt_tokenizer=tokenizer.to_json()),
    }
    for name, edit in edits.items():
        checkpoint = torch.load(good, weights_only=True)
        edit(checkpoint)
        other = tmp_path / f"{name.replace(' ', '_')}.ckpt"
        torch.save(checkpoint, other)
        with pytest.raises(CheckpointError, match=rf"^{re.escape(str(other))} has another {name} than "):
            read_averaged([good, other])


WEIGHT = "model.encoder.layers.0.ffn.w_1.weight"
AVERAGED_BADLY = {
    "a number": (lambda t: 3, r"its state_dict is not a dict of named tensors"),
    "NaN": (lambda t: torch.full_like(t, float("nan")), rf"its weight {re.escape(WEIGHT)} holds NaN"),
    "sparse": (lambda t: t.to_sparse(), rf"its weight {re.escape(WEIGHT)} is a torch\.sparse_coo"),
}  # fmt: skip


@pytest.mark.parametrize("kind", AVERAGED_BADLY)
def test_an_averaged_checkpoint_whose_weights_are_unusable_is_named(
    kind: str, good: Path, tmp_path: Path
) -> None:
    """A weight that is no tensor made averaging fail with an AttributeError, NaN in any file was named
    as the first file's, and a sparse one failed or was averaged silently by its place: the file holding
    it is named, wherever it is in the list."""
    change, message = AVERAGED_BADLY[kind]
    checkpoint = torch.load(good, weights_only=True)
    checkpoint["state_dict"][WEIGHT] = change(checkpoint["state_dict"][WEIGHT])
    bad = tmp_path / "bad.ckpt"
    torch.save(checkpoint, bad)
    for paths in ([good, bad], [bad, good], [good, good, bad]):
        with pytest.raises(CheckpointError, match=rf"^{re.escape(str(bad))}: {message}"):
            read_averaged(paths)


def test_an_epoch_checkpoint_that_is_a_directory_is_named_as_one(good: Path, tmp_path: Path) -> None:
    """A directory where averaging takes an epoch checkpoint was reported as a checkpoint not found."""
    epochs = tmp_path / "run" / "checkpoints" / "epochs"
    epochs.mkdir(parents=True)
    shutil.copyfile(good, epochs / "epoch000.ckpt")
    (epochs / "epoch001.ckpt").mkdir()
    paths = resolve_checkpoints(tmp_path / "run", average_last=2)
    with pytest.raises(
        CheckpointError, match=rf"^{re.escape(str(epochs / 'epoch001.ckpt'))} is a directory, not a"
    ):
        read_averaged(paths)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_checkpoint_that_is_a_device_is_named_as_one(tmp_path: Path) -> None:
    """A link to /dev/zero given as a checkpoint was reported as "checkpoint not found", by the commands as
    a run directory without a best checkpoint, and by training as no such file; it is named as a device
    (never read: it would not end)."""
    from attnlab.training.resume import resume_path

    path = tmp_path / "zero.ckpt"
    path.symlink_to("/dev/zero")
    named = rf"^{re.escape(str(path))} is a device, a pipe or a socket, not a checkpoint file: give a \.ckpt"
    with pytest.raises(CheckpointError, match=named):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match=named):  # attnlab-eval, -translate, -export's ckpt_path=
        Translator.from_checkpoints(resolve_checkpoints(str(path)))
    cfg = compose_train([*RUN, f"ckpt_path={path}"], tmp_path / "run")
    with pytest.raises(
        ConfigError, match=r"it is a directory or a device, not a checkpoint file; give a \.ckpt"
    ):
        resume_path(cfg, tmp_path / "run")
