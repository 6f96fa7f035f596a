"""Hostile checkpoints: nothing in a checkpoint chooses what code runs.

Each hostile file is made from a real checkpoint of a tiny run on Multi30k text: a `_target_` naming a
callable that would create a marker file (`logging.FileHandler(filename=...)` creates its file when
built), placed in each plain-data entry a reader uses, or pickled code (a foreign global). Every reader
(`read_checkpoint`, averaging, `Translator.from_checkpoints`, `attnlab-eval`, `attnlab-translate`,
training from `ckpt_path=`, resuming, `TranslationModule.load_from_checkpoint`) refuses it with the same
message; the marker is never created and the file is left byte for byte as it was. A damaged
`last.ckpt` on `resume` is refused like any damaged checkpoint, before the run directory changes.

Nor does checkpoint content steer a run: callback states claiming another file as the best checkpoint
(from another run's checkpoint, or naming files outside the run), model settings that would allocate far
more than the weights hold, the FSDP strategy's own reader, and optimizer or schedule states that the
run's settings do not build (refused naming the entry), or a saved learning rate (replaced by the
schedule's). Generator states and counts of the resumption state that attnlab-train does not write are
refused before the run changes; epoch sums that are not numbers are left out with a warning.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from attnlab.cli.app import config_dir
from attnlab.cli.eval import evaluate_checkpoint
from attnlab.cli.translate import main as translate_main
from attnlab.inference.translator import Translator, resolve_checkpoints
from attnlab.runs.checkpoint import BUNDLE_KEY, CheckpointError, read_averaged, read_checkpoint
from attnlab.training.module import TranslationModule
from attnlab.training.pipeline import train
from attnlab.typed import ConfigError
from helpers import compose_eval, compose_train, write_corpus

SPLITS = (("train", "train", 200), ("valid", "val", 16), ("test", "test2016", 16))
HOSTILE_CLASS = "logging.FileHandler"  # builds a file handler: creates the file named `filename`


@pytest.fixture(scope="module")
def trained(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One epoch of the tiny model on 200 Multi30k lines (files data: tokenizers and data settings in
    the checkpoint); its overrides, run directory and checkpoint as plain data."""
    tmp = tmp_path_factory.mktemp("hostile")
    corpus = tmp / "corpus"
    write_corpus(shared_data, corpus, SPLITS)
    overrides = [
        "data=files", f"data.dir={corpus}", "data.src_lang=de", "data.tgt_lang=en", "data.vocab_size=200",
        f"data.cache_dir={tmp / 'cache'}", "model=tiny", "trainer.max_epochs=1", "logger=csv",
        "test=false", "decode.every_n_epochs=0",
    ]  # fmt: skip
    run = tmp / "run"
    train(compose_train(overrides, run))
    last = run / "checkpoints" / "last.ckpt"
    assert read_checkpoint(last)[BUNDLE_KEY]["data"]["_target_"] == "attnlab.data.corpora.FilesData"
    return {"overrides": overrides, "run": run, "last": last, "plain": torch.load(last, weights_only=True)}


class Touch:
    """Pickles as a call of `os.mkdir(marker)`: unpickling it would create the marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return (os.mkdir, (str(self.marker),))


def with_target(values: dict[str, Any], marker: Path) -> dict[str, Any]:
    return {**values, "_target_": HOSTILE_CLASS, "filename": str(marker)}


def hostile_data(c: dict[str, Any], m: Path) -> None:
    c[BUNDLE_KEY]["data"] = {"_target_": HOSTILE_CLASS, "filename": str(m)}


def hostile_nested_data(c: dict[str, Any], m: Path) -> None:
    c[BUNDLE_KEY]["data"]["test"] = [{"_target_": HOSTILE_CLASS, "filename": str(m)}]


def hostile_hparams(key: str) -> Callable[[dict[str, Any], Path], None]:
    def edit(c: dict[str, Any], m: Path) -> None:
        c["hyper_parameters"][key] = with_target(c["hyper_parameters"][key], m)

    return edit


def lightning_instantiator(c: dict[str, Any], m: Path) -> None:
    c["hyper_parameters"]["_instantiator"] = HOSTILE_CLASS


# kind -> (how the plain checkpoint is changed, where the class is named)
CLASS_CASES: dict[str, tuple[Callable[[dict[str, Any], Path], None], str]] = {
    "data entry": (hostile_data, "attnlab.data._target_"),
    "nested in data": (hostile_nested_data, "attnlab.data.test[0]._target_"),
    "hparams model": (hostile_hparams("model"), "hyper_parameters.model._target_"),
    "hparams optim": (hostile_hparams("optim"), "hyper_parameters.optim._target_"),
    "hparams decode": (hostile_hparams("decode"), "hyper_parameters.decode._target_"),
    "hparams metrics": (hostile_hparams("metrics"), "hyper_parameters.metrics._target_"),
    "lightning instantiator": (lightning_instantiator, "hyper_parameters._instantiator"),
}
EXECUTABLE = r"refused: it contains executable objects \({name}\).*it was not loaded and nothing in it ran"
CODE_CASES = {
    "foreign global": EXECUTABLE.format(name=r"posix\.mkdir"),  # torch.save: a zip checkpoint
    "plain pickle": EXECUTABLE.format(name=r"posix\.mkdir"),  # pickle.dumps: not even a zip
}
CASES = [*CLASS_CASES, *CODE_CASES]


def write_hostile(kind: str, plain: dict[str, Any], path: Path, marker: Path) -> str:
    """Write the hostile checkpoint `kind` to `path`; returns the message every reader must give."""
    if kind in CLASS_CASES:
        edit, where = CLASS_CASES[kind]
        checkpoint = copy.deepcopy(plain)
        edit(checkpoint, marker)
        torch.save(checkpoint, path)
        return re.escape(
            f"names a class attnlab does not build ({where}='{HOSTILE_CLASS}') and was not loaded"
        )
    if kind == "foreign global":
        torch.save({**plain, "state_dict": {"weight": Touch(marker)}}, path)
    else:
        path.write_bytes(pickle.dumps({"epoch": 0, "state_dict": Touch(marker)}))
    return CODE_CASES[kind]


def assert_refused(exc: BaseException, message: str, path: Path) -> None:
    text = str(exc.code if isinstance(exc, SystemExit) else exc)
    assert re.search(message, text), text
    assert str(path) in text
    assert "weights_only=False" not in text and "damaged" not in text


@pytest.mark.parametrize("kind", CASES)
def test_a_hostile_checkpoint_is_refused_by_every_reader(
    kind: str, trained: dict[str, Any], tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / "hostile.ckpt"
    message = write_hostile(kind, trained["plain"], path, marker)
    before = path.read_bytes()
    readers: dict[str, Callable[[], Any]] = {
        "attnlab-eval": lambda: evaluate_checkpoint(compose_eval([f"ckpt_path={path}"], tmp_path / "eval")),
        "read_checkpoint": lambda: read_checkpoint(path),
        "read_averaged": lambda: read_averaged([trained["last"], path]),
        "Translator": lambda: Translator.from_checkpoints(resolve_checkpoints(str(path))),
        "load_from_checkpoint": lambda: TranslationModule.load_from_checkpoint(path),
        "train ckpt_path=": lambda: train(
            compose_train([*trained["overrides"], f"ckpt_path={path}"], tmp_path / "new_run")
        ),
        "train init_from=": lambda: train(
            compose_train([*trained["overrides"], f"init_from={path}"], tmp_path / "fine_tuned")
        ),
    }
    for name, reader in readers.items():
        try:
            reader()
        except Exception as exc:
            refusal: Exception | None = exc
        else:
            refusal = None
        assert not marker.exists(), f"{name} ran code named by the checkpoint"
        assert isinstance(refusal, (CheckpointError, ConfigError)), f"{name}: {refusal!r}"
        assert_refused(refusal, message, path)
    source = tmp_path / "in.de"
    source.write_text("Ein Mann fährt Fahrrad.\n")
    with pytest.raises(SystemExit) as caught:
        translate_main([f"ckpt_path={path}", f"input={source}", f"output={tmp_path / 'out.en'}"])
    assert_refused(caught.value, message, path)
    assert not marker.exists()
    assert path.read_bytes() == before


def copy_run(trained: dict[str, Any], tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    return run


def run_with_edited_last(
    trained: dict[str, Any], tmp_path: Path, edit: Callable[[dict[str, Any]], None]
) -> tuple[Path, Path]:
    """A copy of the trained run whose last.ckpt is `edit`ed (in place, the loaded checkpoint), saved again:
    the run directory and its last.ckpt."""
    run = copy_run(trained, tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    edit(checkpoint)
    torch.save(checkpoint, last)
    return run, last


def files_of(run: Path) -> dict[Path, bytes]:
    """Every file of a run directory with its content, to check that a refused command changed nothing."""
    return {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}


@pytest.mark.parametrize("kind", ["data entry", "hparams model", "foreign global"])
@pytest.mark.parametrize("resume", ["true", "auto"])
def test_a_hostile_last_ckpt_is_refused_on_resume(
    kind: str, resume: str, trained: dict[str, Any], tmp_path: Path
) -> None:
    run = copy_run(trained, tmp_path)
    marker = tmp_path / "marker"
    message = write_hostile(kind, trained["plain"], run / "checkpoints" / "last.ckpt", marker)
    last = run / "checkpoints" / "last.ckpt"
    kept = {p: p.read_bytes() for p in (run / "manifest.json", run / "config.yaml", last)}
    with pytest.raises(ConfigError) as caught:
        train(compose_train([*trained["overrides"], f"resume={resume}"], run))
    assert_refused(caught.value, message, last)
    assert not marker.exists()
    assert {p: p.read_bytes() for p in kept} == kept


WEIGHT = "model.encoder.layers.0.ffn.w_1.weight"
# How a checkpoint's weights are changed so that they no longer fit its model settings -> the message
UNFITTING_WEIGHTS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "another shape": (lambda sd: sd.update({WEIGHT: sd[WEIGHT][:, :16].clone()}),
                      rf"{WEIGHT}: the settings make it \(64, 32\), the weights \(64, 16\)"),
    "missing": (lambda sd: sd.pop(WEIGHT), rf"first differing key: {WEIGHT}, missing"),
    "unexpected": (lambda sd: sd.update({"model.extra.weight": torch.zeros(3)}),
                   r"first differing key: model\.extra\.weight, unexpected"),
    "outside the model": (lambda sd: sd.update({"extra.weight": torch.zeros(3)}),
                          r"its state_dict holds 'extra\.weight', no entry of this run's module"),
}  # fmt: skip


@pytest.mark.parametrize("kind", UNFITTING_WEIGHTS)
def test_weights_that_do_not_fit_the_settings_are_refused_on_resume_before_the_run_changes(
    kind: str, trained: dict[str, Any], tmp_path: Path
) -> None:
    """A last.ckpt (or `ckpt_path=`) whose weights do not fit its model settings: refused naming the key
    before training (Lightning's own load would fail after the run started), nothing of the run changed."""
    edit, message = UNFITTING_WEIGHTS[kind]
    run, last = run_with_edited_last(trained, tmp_path, lambda c: edit(c["state_dict"]))
    kept = files_of(run)
    with pytest.raises(ConfigError, match=rf"ckpt_path: {re.escape(str(last))}: .*{message}"):
        train(compose_train([*two_epochs_tested(trained), "resume=true"], run))
    assert files_of(run) == kept
    assert json.loads((run / "manifest.json").read_text())["status"] == "finished"
    with pytest.raises(ConfigError, match=message):
        train(compose_train([*trained["overrides"], f"ckpt_path={last}"], tmp_path / "new_run"))
    assert not list((tmp_path / "new_run").rglob("*.ckpt"))  # nothing trained
    assert files_of(run) == kept


@pytest.mark.parametrize("config", ["missing", "edited"])
def test_resuming_with_other_settings_than_the_checkpoint_was_trained_with_is_refused(
    config: str, trained: dict[str, Any], tmp_path: Path
) -> None:
    """A resumed run's config is compared with its config.yaml; without one (lost), or with one edited to
    the new values, the checkpoint's own model and optim settings are: other values (here ones that
    change no weight's shape) are refused before the run changes, each named."""
    run = copy_run(trained, tmp_path)
    changes = {"model.activation": "gelu", "optim.warmup_steps": 7}
    if config == "missing":
        (run / "config.yaml").unlink()
    else:
        edited = OmegaConf.load(run / "config.yaml")
        for key, value in changes.items():
            OmegaConf.update(edited, key, value)
        OmegaConf.save(edited, run / "config.yaml")
    kept = files_of(run)
    overrides = [*two_epochs_tested(trained), "resume=true", *(f"{k}={v}" for k, v in changes.items())]
    with pytest.raises(ConfigError) as caught:
        train(compose_train(overrides, run))
    text = str(caught.value)
    assert f"resuming from {run / 'checkpoints' / 'last.ckpt'} with a different experiment" in text, text
    assert "model.activation: 'relu' -> 'gelu'" in text and "optim.warmup_steps: " in text, text
    assert files_of(run) == kept


# A weight of the right shape that is no dense tensor of finite floats -> the message naming it
UNUSABLE_WEIGHTS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "sparse": (lambda t: t.to_sparse(), r"is a torch\.sparse_coo tensor on cpu, not a dense tensor"),
    "meta": (lambda t: torch.empty_like(t, device="meta"), r"is a torch\.strided tensor on meta, not a"),
    "complex": (lambda t: t.to(torch.complex64), r"holds torch\.complex64 values, not floating-point ones"),
    "integers": (lambda t: t.long(), r"holds torch\.int64 values, not floating-point ones"),
    "booleans": (lambda t: t > 0, r"holds torch\.bool values, not floating-point ones"),
    "NaN": (lambda t: t.index_fill(0, torch.tensor([3]), float("nan")), r"holds NaN or infinite values"),
    "inf": (lambda t: t.index_fill(1, torch.tensor([0]), -float("inf")), r"holds NaN or infinite values"),
}  # fmt: skip


def test_an_entry_outside_the_model_is_named_by_load_from_checkpoint(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """An entry of the state_dict outside `model.` failed `load_from_checkpoint` with torch's raw
    "Unexpected key(s)": named as resuming names it; `strict=False` loads the weights without it."""
    _, last = run_with_edited_last(trained, tmp_path, lambda c: c["state_dict"].update(extra=torch.zeros(3)))
    message = rf"{re.escape(str(last))}: its state_dict holds 'extra', no entry of a module.*use another"
    with pytest.raises(CheckpointError, match=message):
        TranslationModule.load_from_checkpoint(last)
    loaded = TranslationModule.load_from_checkpoint(last, strict=False)
    saved = torch.load(trained["last"], weights_only=True)["state_dict"][WEIGHT]
    assert torch.equal(loaded.state_dict()[WEIGHT], saved)


@pytest.mark.parametrize("kind", UNUSABLE_WEIGHTS)
def test_a_weight_that_is_no_dense_tensor_of_floats_is_refused_by_every_reader(
    kind: str, trained: dict[str, Any], tmp_path: Path
) -> None:
    """`load_state_dict` fails on a sparse or meta tensor with a raw RuntimeError (mid-run on resume), and
    casts complex, integer or boolean values into the model's floats without a word; NaN or infinite
    weights made decoding fail with an IndexError and a resumed run stop at its first step with a NaN loss:
    each is refused before the model is built, naming the weight, and a resumed run's directory is left
    as it was."""
    change, problem = UNUSABLE_WEIGHTS[kind]

    def unusable(checkpoint: dict[str, Any]) -> None:
        checkpoint["state_dict"][WEIGHT] = change(checkpoint["state_dict"][WEIGHT])

    run, last = run_with_edited_last(trained, tmp_path, unusable)
    kept = files_of(run)
    message = rf"{re.escape(str(last))}: its weight {re.escape(WEIGHT)} {problem}.*use another checkpoint"
    new = tmp_path / "new"
    readers: dict[str, Callable[[], Any]] = {
        "Translator": lambda: Translator.from_checkpoints([last]),
        "load_from_checkpoint": lambda: TranslationModule.load_from_checkpoint(last),
        "resume": lambda: train(compose_train([*two_epochs_tested(trained), "resume=true"], run)),
        "init_from": lambda: train(compose_train([*trained["overrides"], f"init_from={last}"], new)),
    }
    for name, reader in readers.items():
        with pytest.raises((CheckpointError, ConfigError)) as caught:
            reader()
        assert re.search(message, str(caught.value)), f"{name}: {caught.value}"
    assert files_of(run) == kept
    assert not list(new.rglob("*.ckpt"))  # nothing trained


@pytest.mark.parametrize("side", ["src", "tgt"])
def test_a_tokenizer_larger_than_its_models_vocabulary_is_refused(
    side: str, trained: dict[str, Any], shared_data: Path, tmp_path: Path
) -> None:
    """A checkpoint whose tokenizer has more subwords than its model's vocabulary (another run's): decoding
    failed with an IndexError (source ids past the embedding), or decoded the target ids into another
    vocabulary's subwords; it is refused when read, naming the side."""
    from attnlab.data.tokenizer import SubwordTokenizer

    lines = (shared_data / "multi30k" / "train.de").read_text(encoding="utf-8").splitlines()[:2000]
    larger = SubwordTokenizer.train(lines, model="bpe", vocab_size=400)
    checkpoint = copy.deepcopy(trained["plain"])
    size = checkpoint["hyper_parameters"]["model"][f"{side}_vocab_size"]
    assert larger.vocab_size > size
    checkpoint[BUNDLE_KEY][f"{side}_tokenizer"] = larger.to_json()
    path = tmp_path / "other_tokenizer.ckpt"
    torch.save(checkpoint, path)
    named = "source" if side == "src" else "target"
    message = re.escape(f"{path}: its {named} tokenizer has {larger.vocab_size} subwords, more than the "
                        f"model's {named} vocabulary of {size}")  # fmt: skip
    with pytest.raises(CheckpointError, match=message):
        Translator.from_checkpoints([path])
    with pytest.raises(ConfigError, match=message):
        evaluate_checkpoint(compose_eval([f"ckpt_path={path}"], tmp_path / "eval"))


@pytest.mark.parametrize("step", ["x", None, 1.5, True], ids=["text", "none", "fraction", "bool"])
def test_a_global_step_that_is_no_count_is_refused_on_resume(
    step: Any, trained: dict[str, Any], tmp_path: Path
) -> None:
    """A last.ckpt whose global_step is text or null failed with int()'s ValueError or TypeError, and one of
    1.5 or True resumed; each is refused naming the file and the entry, and nothing of the run changes."""
    run, last = run_with_edited_last(trained, tmp_path, lambda c: c.update(global_step=step))
    kept = files_of(run)
    message = re.escape(f"resume: {last}: its global_step {step!r} is no step count")
    with pytest.raises(ConfigError, match=message):
        train(compose_train([*two_epochs_tested(trained), "resume=true"], run))
    assert files_of(run) == kept


def test_an_unreadable_csv_history_is_refused_on_resume_before_the_run_changes(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """A damaged `csv/metrics.csv` was read after the run's config.yaml and manifest were rewritten: the
    run failed with an UnreadableRunFile and was marked failed. Now it is refused first, naming the file
    and the fix, and nothing of the run changes."""
    run = copy_run(trained, tmp_path)
    (run / "csv" / "metrics.csv").write_bytes(b"step,val/loss\n0,4\xff5\n")
    kept = files_of(run)
    with pytest.raises(ConfigError) as caught:
        train(compose_train([*two_epochs_tested(trained), "resume=true"], run))
    text = str(caught.value)
    assert f"resuming {run}: cannot read {run / 'csv' / 'metrics.csv'}: " in text, text
    assert "put back a readable copy, or move the file aside to continue without the rows logged" in text
    assert files_of(run) == kept


@pytest.mark.parametrize("resume", ["true", "auto"])
@pytest.mark.parametrize("kind", ["a directory", "a symbolic link to nothing"])
def test_a_last_ckpt_that_is_no_file_is_refused_before_the_run_changes(
    kind: str, resume: str, trained: dict[str, Any], tmp_path: Path
) -> None:
    """A last.ckpt that is a directory (or a link to a checkpoint on a disk not mounted): `auto` started
    the run afresh over the run's own files and saved nowhere, `true` said no last.ckpt existed; both are
    refused naming what is there, and nothing of the run changes."""
    run = copy_run(trained, tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    last.unlink()
    if kind == "a directory":
        last.mkdir()
        named = "a directory"
    else:
        last.symlink_to(tmp_path / "unmounted" / "last.ckpt")
        named = f"a symbolic link to {tmp_path / 'unmounted' / 'last.ckpt'}, which is missing"
    kept = files_of(run)
    paths = sorted(run.rglob("*"))
    with pytest.raises(ConfigError) as caught:
        train(compose_train([*two_epochs_tested(trained), f"resume={resume}"], run))
    assert str(caught.value) == (
        f"resume={resume}: {last} is {named}, not a checkpoint file: put the run's last checkpoint there to "
        "continue it, or move the run directory aside to start afresh"
    )
    assert files_of(run) == kept
    assert sorted(run.rglob("*")) == paths  # nothing added or removed


@pytest.mark.parametrize("resume", ["true", "auto"])
def test_a_damaged_last_ckpt_on_resume_is_refused_before_the_run_changes(
    resume: str, trained: dict[str, Any], tmp_path: Path
) -> None:
    run = copy_run(trained, tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # an interrupted copy
    with pytest.raises(CheckpointError) as damaged:
        read_checkpoint(last)
    kept = files_of(run)  # every checkpoint, manifest, config
    with pytest.raises(ConfigError) as caught:
        train(compose_train([*trained["overrides"], f"resume={resume}"], run))
    assert str(caught.value) == f"resume: {damaged.value}"  # the message of any damaged checkpoint
    assert re.search(r"cannot read checkpoint .*last\.ckpt: .*damaged", str(caught.value))
    assert str(caught.value).endswith(
        "another checkpoint of the run (checkpoints/best-*.ckpt, checkpoints/epochs/)"
    )
    assert files_of(run) == kept
    assert json.loads((run / "manifest.json").read_text())["status"] == "finished"


def test_attnlab_eval_refuses_a_checkpoint_naming_a_class(trained: dict[str, Any], tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / "hostile.ckpt"
    message = write_hostile("data entry", trained["plain"], path, marker)
    done = subprocess.run(
        [sys.executable, "-m", "attnlab.cli.eval", f"ckpt_path={path}", f"hydra.run.dir={tmp_path / 'eval'}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert not marker.exists()
    assert done.returncode == 1, done.stderr
    assert re.search("attnlab-eval: .*" + message, done.stderr), done.stderr
    assert "Traceback" not in done.stderr


def test_data_specs_are_built_by_their_name_only(trained: dict[str, Any], tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from attnlab.runs.checkpoint import DATA_SPECS, data_spec

    for config in sorted((config_dir() / "data").glob("*.yaml")):  # what the configs name is readable
        assert OmegaConf.load(config)["_target_"] in DATA_SPECS, config.name
    saved = trained["plain"][BUNDLE_KEY]["data"]
    assert type(data_spec(saved, "last.ckpt")) is DATA_SPECS[saved["_target_"]]
    marker = tmp_path / "marker"
    refused = r"names a class attnlab does not build \(attnlab\.data\._target_='logging\.FileHandler'\)"
    with pytest.raises(CheckpointError, match=refused):
        data_spec({"_target_": HOSTILE_CLASS, "filename": str(marker)}, "last.ckpt")
    assert not marker.exists()


def test_a_checkpoint_does_not_choose_the_host_data_is_downloaded_from() -> None:
    """attnlab-eval without `data=` rebuilds the data from the checkpoint's settings: Multi30k's
    `base_url` is the default's, not the checkpoint's (an untrusted file choosing which host is contacted)."""
    from attnlab.data.download import MULTI30K_BASE_URL
    from attnlab.runs.checkpoint import data_spec

    saved = {"_target_": "attnlab.data.corpora.Multi30kData", "src_lang": "de", "tgt_lang": "en",
             "base_url": "http://203.0.113.9/multi30k", "max_tokens": 512}  # fmt: skip
    spec = data_spec(saved, "last.ckpt")
    assert spec.base_url == MULTI30K_BASE_URL and spec.max_tokens == 512  # the rest as saved


def test_a_training_config_with_another_data_class_is_refused_before_training(tmp_path: Path) -> None:
    """Its checkpoints could not be read back (the closed list): refused at validation, not after
    hours of training when the final evaluation reads the best checkpoint."""
    from attnlab.training.experiment import validate

    cfg = compose_train(["data=synthetic", "model=tiny", "data._target_=probes.OwnSyntheticData"], tmp_path)
    with pytest.raises(ConfigError, match=r"data\._target_=probes\.OwnSyntheticData is not one of "
                       r"attnlab's data specs .*use data=files"):  # fmt: skip
        validate(cfg)
    assert not (tmp_path / "config.yaml").exists()
    validate(compose_train(["data=synthetic", "model=tiny"], tmp_path))  # attnlab's own: accepted


# ---------------------------------------------------------------------------------------------------------
# Checkpoint content that would steer a run: callback states, model settings, the FSDP strategy's reader

STEERED = "val/loss"  # the monitor of `trained` (no validation decodes): lower is better


def steering_callbacks(plain: dict[str, Any], checkpoints: Path, other: Path) -> dict[str, Any]:
    """`plain` whose best-checkpoint state claims an unbeatable score for `other` (a real checkpoint
    outside the run), with `dirpath` set to `checkpoints` so that Lightning loads the whole state."""
    checkpoint = copy.deepcopy(plain)
    states = [
        s for s in checkpoint["callbacks"].values() if isinstance(s, dict) and s.get("monitor") == STEERED
    ]
    assert states, checkpoint["callbacks"].keys()  # the model_checkpoint callback's state
    score = torch.tensor(-1e9)
    for state in states:
        state.update(
            dirpath=os.path.realpath(checkpoints), best_model_score=score, best_model_path=str(other),
            best_k_models={str(other): score}, kth_best_model_path=str(other), kth_value=score,
        )  # fmt: skip
    return checkpoint


def two_epochs_tested(trained: dict[str, Any]) -> list[str]:
    """`trained`'s overrides for one more epoch (the checkpoint ends the first) and the final evaluation."""
    kept = [o for o in trained["overrides"] if not o.startswith(("test=", "trainer.max_epochs="))]
    return [*kept, "test=true", "trainer.max_epochs=2"]


def outside_files(*paths: Path) -> dict[Path, tuple[bytes, int]]:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in paths}


def copy_elsewhere(trained: dict[str, Any], tmp_path: Path) -> Path:
    """A real checkpoint outside the run directory (what a steered callback state points at)."""
    other = tmp_path / "elsewhere" / "other.ckpt"
    other.parent.mkdir()
    shutil.copyfile(trained["last"], other)
    return other


def assert_own_best(metrics: dict[str, float], run: Path) -> None:
    """The final evaluation scored this run's own best checkpoint, and the best score is this run's."""
    results = json.loads((run / "results.json").read_text())
    assert len(results["checkpoints"]) == 1, results["checkpoints"]
    used = Path(results["checkpoints"][0])
    assert used.parent == (run / "checkpoints").resolve() and used.name.startswith("best-"), used
    assert used.is_file()
    best = metrics[f"best/{STEERED}"]
    assert best != -1e9 and best == pytest.approx(metrics[STEERED])  # one validation: the best is it


def test_callback_states_of_another_runs_checkpoint_do_not_choose_the_evaluated_file(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    other = copy_elsewhere(trained, tmp_path)
    run = tmp_path / "new_run"
    evil = tmp_path / "evil.ckpt"
    torch.save(steering_callbacks(trained["plain"], run / "checkpoints", other), evil)
    kept = outside_files(other, evil, trained["last"])
    metrics = train(compose_train([*two_epochs_tested(trained), f"ckpt_path={evil}"], run))
    assert_own_best(metrics, run)
    assert outside_files(*kept) == kept


def test_paths_outside_the_run_in_its_own_last_ckpt_are_not_used(
    trained: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = copy_elsewhere(trained, tmp_path)
    run = copy_run(trained, tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    torch.save(steering_callbacks(torch.load(last, weights_only=True), run / "checkpoints", other), last)
    kept = outside_files(other)
    with caplog.at_level(logging.WARNING, logger="attnlab.training.checkpoint_io"):
        metrics = train(compose_train([*two_epochs_tested(trained), "resume=true"], run))
    assert_own_best(metrics, run)
    assert outside_files(*kept) == kept
    warned = [r.getMessage() for r in caplog.records if "(the callback starts afresh" in r.getMessage()]
    assert any(str(other) in message for message in warned), "no warning named the dropped state"


def test_model_settings_that_do_not_fit_the_weights_are_refused_before_anything_is_built(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """A model of d_model=65536 and a vocabulary of a million (hundreds of GB of embeddings), or with
    10^12 layers, is refused by its weights' shapes at once, without allocating it."""
    import resource
    import time

    checkpoint = copy.deepcopy(trained["plain"])
    checkpoint["hyper_parameters"]["model"].update(d_model=65536, src_vocab_size=10**6, tgt_vocab_size=10**6)
    path = tmp_path / "huge.ckpt"
    torch.save(checkpoint, path)
    before = path.read_bytes()
    message = re.escape(
        f"{path}: its model settings do not fit its weights (first differing key: model.encoder.embed.token."
        "weight: the settings make it (1000000, 65536), the weights ("
    )
    readers: dict[str, Callable[[], Any]] = {
        "Translator": lambda: Translator.from_checkpoints([path]),
        "load_from_checkpoint": lambda: TranslationModule.load_from_checkpoint(path),
        "attnlab-eval": lambda: evaluate_checkpoint(compose_eval([f"ckpt_path={path}"], tmp_path / "eval")),
    }
    for name, reader in readers.items():
        peak, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
        with pytest.raises((CheckpointError, ConfigError)) as caught:
            reader()
        assert re.search(message, str(caught.value)), f"{name}: {caught.value}"
        assert "refused before the model was built" in str(caught.value)
        assert time.monotonic() - start < 30, name
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 500_000, name  # KiB: < 0.5 GB
    assert path.read_bytes() == before
    layers = copy.deepcopy(trained["plain"])
    layers["hyper_parameters"]["model"]["n_encoder_layers"] = 10**12
    torch.save(layers, path)
    peak, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    with pytest.raises(CheckpointError, match=r"n_encoder_layers=1000000000000 but the weights hold 2 "):
        Translator.from_checkpoints([path])
    assert time.monotonic() - start < 30
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 500_000  # KiB: < 0.5 GB


@pytest.mark.parametrize("kind", ["foreign global", "hparams model"])
def test_the_fsdp_strategy_reads_a_checkpoint_by_attnlabs_reader(
    kind: str, trained: dict[str, Any], tmp_path: Path
) -> None:
    """`trainer=fsdp` with `ckpt_path=`: Lightning's FSDPStrategy would read the file with its own
    unpickler. FSDP needs a process group on GPUs; the strategy's `load_checkpoint` is called here as
    Lightning calls it, on one process without a process group (its broadcast is then the identity)."""
    from attnlab.training.strategies import fsdp

    marker = tmp_path / "marker"
    path = tmp_path / "hostile.ckpt"
    message = write_hostile(kind, trained["plain"], path, marker)
    before = path.read_bytes()
    strategy = fsdp(sharding_strategy="FULL_SHARD", state_dict_type="full")
    module = TranslationModule.load_from_checkpoint(trained["last"])
    strategy.connect(module)
    try:
        strategy.load_checkpoint(path)
    except Exception as exc:
        refusal: Exception | None = exc
    else:
        refusal = None
    assert not marker.exists(), "the strategy ran code named by the checkpoint"
    assert isinstance(refusal, CheckpointError), repr(refusal)
    assert_refused(refusal, message, path)
    assert path.read_bytes() == before
    with pytest.raises(CheckpointError, match=r"is not a checkpoint file: .*full checkpoints only"):
        strategy.load_checkpoint(tmp_path)  # a directory of shards: its metadata would be unpickled
    weights = tmp_path / "weights.ckpt"  # a real checkpoint loads (without optimizer states: no trainer here)
    torch.save({k: v for k, v in trained["plain"].items() if k != "optimizer_states"}, weights)
    fresh = TranslationModule(**{k: trained["plain"]["hyper_parameters"][k] for k in ("model", "optim")})
    strategy.connect(fresh)
    loaded = strategy.load_checkpoint(weights)
    assert all(torch.equal(v, trained["plain"]["state_dict"][k]) for k, v in fresh.state_dict().items())
    assert loaded["callbacks"] == {}  # another run's callback states: not loaded


def test_the_fsdp_strategy_loads_every_weight_and_optimizer_states_only_to_fit(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """`trainer=fsdp` with `ckpt_path=` loads as every other strategy does: the weights, and the optimizer
    states for `trainer.fit` only (`validate` and `test` read the weights alone); a checkpoint holding
    another number of optimizers than the run has is refused naming both counts, and one lacking one of
    the model's weights is refused naming it (strict loading), not taken for a complete model."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.trainer.states import TrainerFn

    from attnlab.training.strategies import fsdp

    plain = trained["plain"]
    module = TranslationModule(**{k: plain["hyper_parameters"][k] for k in ("model", "optim")})
    module.trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    strategy = fsdp(sharding_strategy="FULL_SHARD", state_dict_type="full")
    strategy.connect(module)
    assert plain["optimizer_states"] and not strategy.optimizers  # a run without its optimizer yet
    module.trainer.state.fn = TrainerFn.VALIDATING
    strategy.load_checkpoint(trained["last"])
    assert all(torch.equal(v, plain["state_dict"][k]) for k, v in module.state_dict().items())
    module.trainer.state.fn = TrainerFn.FITTING
    told = r"You have configured 0 optimizers but the checkpoint contains 1 optimizers to load"
    with pytest.raises(RuntimeError, match=told):
        strategy.load_checkpoint(trained["last"])
    dropped = sorted(plain["state_dict"])[-1]
    lacking = tmp_path / "lacking.ckpt"
    weights = {k: v for k, v in plain["state_dict"].items() if k != dropped}
    rest = {k: v for k, v in plain.items() if k not in ("state_dict", "optimizer_states")}
    torch.save({**rest, "state_dict": weights}, lacking)
    with pytest.raises(RuntimeError, match=rf'Missing key\(s\) in state_dict: "{re.escape(dropped)}"'):
        strategy.load_checkpoint(lacking)


# ---------------------------------------------------------------------------------------------------------
# Optimizer and schedule state: torch restores every saved parameter-group option over the run's settings


def set_group(**options: Any) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        c["optimizer_states"][0]["param_groups"][0].update(options)

    return edit


def edit_state(name: str, value: Callable[[torch.Tensor], Any]) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        entry = c["optimizer_states"][0]["state"][0]
        entry[name] = value(entry[name])

    return edit


def set_schedule(**entries: Any) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        c["lr_schedulers"][0].update(entries)

    return edit


def swap_same_shaped_params(c: dict[str, Any]) -> None:
    """Swap two same-shaped parameters' places in the group's list: torch gives each one the other's
    moments (a swap of two of other shapes makes the fused update write past a tensor's end)."""
    group, state = c["optimizer_states"][0]["param_groups"][0], c["optimizer_states"][0]["state"]
    shapes = [tuple(state[i]["exp_avg"].shape) for i in group["params"]]
    a = next(i for i, shape in enumerate(shapes) if shapes.count(shape) > 1)
    b = next(i for i, shape in enumerate(shapes) if shape == shapes[a] and i != a)
    group["params"][a], group["params"][b] = group["params"][b], group["params"][a]


def key_state_by_name(c: dict[str, Any]) -> None:
    """State keyed by a parameter's name: torch keeps it aside, the parameter's moments start afresh."""
    state = c["optimizer_states"][0]["state"]
    state[next(iter(c["state_dict"]))] = state.pop(0)


def set_steps(value: float) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        for entry in c["optimizer_states"][0]["state"].values():
            entry["step"] = torch.tensor(value)

    return edit


# kind -> (how the checkpoint is changed, a regex of what the refusal names)
OPTIMIZER_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "maximize": (set_group(maximize=True), re.escape("maximize: True there, False here")),
    "betas": (set_group(betas=(0.5, 0.5)), re.escape("betas: (0.5, 0.5) there, (0.9, 0.98) here")),
    "eps": (set_group(eps=1.0), re.escape("eps: 1.0 there, 1e-09 here")),
    "decoupled weight decay": (
        set_group(decoupled_weight_decay=True),
        re.escape("decoupled_weight_decay: True there"),
    ),
    "unknown option": (set_group(momentum=0.9), re.escape("momentum: 0.9 there, '(no such option)' here")),
    "nan lr": (set_group(lr=float("nan")), re.escape("lr: nan is not a learning rate")),
    "two groups": (
        lambda c: c["optimizer_states"][0]["param_groups"].append({"params": []}),
        re.escape("param_groups holds 2 entries, this run has one group"),
    ),
    "moment shape": (
        edit_state("exp_avg", lambda t: t.flatten()[:3]),
        r"state\[0\]\.exp_avg: not finite, of shape",
    ),
    "negative second moment": (
        edit_state("exp_avg_sq", lambda t: -t - 1),
        r"exp_avg_sq: not finite and >= 0",
    ),
    "infinite moment": (edit_state("exp_avg", lambda t: t + float("inf")), r"exp_avg: not finite"),
    "schedule base": (set_schedule(base_lrs=[100.0]), r"base_lrs: \[100\.0\] there, \[1\.0\] here"),
    "schedule attribute": (set_schedule(optimizer={}), r"lr_schedulers\[0\] has entries \['optimizer'\]"),
    "schedule position": (set_schedule(last_epoch=-5), re.escape("last_epoch: -5 is no step count")),
    "foreign state": (
        lambda c: c["optimizer_states"][0]["state"].__setitem__(10**6, {}),
        r"state\[1000000\]: no parameter of this model",
    ),
    # Entries the checks above missed: silent changes, or a traceback (in the check or the first step)
    "params swapped": (swap_same_shaped_params, r"params: \[0, .*\(list\) there, the indices 0\.\.\d+ here"),
    "params no list": (set_group(params=None), re.escape("params: None there, the indices 0..")),
    "state keyed by name": (key_state_by_name, r"state\['model\..*'\]: no parameter of this model"),
    "moments missing": (
        lambda c: c["optimizer_states"][0]["state"].pop(0),
        r"state: moments of (\d+) of the (?!\1)\d+ parameters",
    ),
    "moment missing": (
        lambda c: c["optimizer_states"][0]["state"][0].pop("exp_avg"),
        r"state\[0\]\.exp_avg: missing",
    ),
    "float64 moment": (
        edit_state("exp_avg", lambda t: torch.full(t.shape, 1e300, dtype=torch.float64)),
        r"state\[0\]\.exp_avg: not finite, of shape .*torch\.float64",
    ),
    "complex moment": (
        edit_state("exp_avg_sq", lambda t: t.to(torch.complex64)),
        r"state\[0\]\.exp_avg_sq: .*not a dense real tensor",
    ),
    "fractional step": (set_steps(2.5), re.escape("state[0].step: tensor(2.5000) is no count of steps")),
    "step not the schedule's": (set_steps(1e9), r"Adam's step count 1e\+09 is not the schedule's \d+"),
    "schedule behind": (set_schedule(last_epoch=0), r"last_epoch: 0 there, but the checkpoint's global_step"),
    "option missing": (lambda c: c["optimizer_states"][0]["param_groups"][0].pop("eps"), r"eps: '\(no such"),
    "tensor option": (set_group(eps=torch.tensor([1e-9, 1e-9])), r"eps: tensor\(\[.*\]\) there, 1e-09 here"),
    "option of no name": (
        lambda c: c["optimizer_states"][0]["param_groups"][0].__setitem__(1, "x"),
        r"1: 'x' there, '\(no such option\)' here",
    ),
    "schedule step count": (set_schedule(_step_count="x"), r"_step_count: 'x' is no step count"),
    "tensor schedule base": (set_schedule(base_lrs=[torch.ones(2)]), r"base_lrs: \[tensor\(\[1\., 1\.\]\)\]"),
    "no optimizer state": (lambda c: c.pop("optimizer_states"), r"it holds no optimizer_states"),
    "no schedule state": (lambda c: c.__setitem__("lr_schedulers", None), r"it holds no lr_schedulers"),
}


@pytest.mark.parametrize("kind", OPTIMIZER_CASES)
def test_an_optimizer_state_the_settings_do_not_build_is_refused_before_training(
    kind: str, trained: dict[str, Any], tmp_path: Path
) -> None:
    """A checkpoint whose saved Adam options (gradient ascent, other betas, AdamW's decoupling), moments or
    schedule differ from what the run's settings build: refused naming the entry, on `ckpt_path=` and on
    resume, before training, the run directory as it was."""
    edit, message = OPTIMIZER_CASES[kind]
    checkpoint = copy.deepcopy(trained["plain"])
    edit(checkpoint)
    path = tmp_path / "edited.ckpt"
    torch.save(checkpoint, path)
    before = path.read_bytes()
    with pytest.raises(ConfigError) as caught:
        train(compose_train([*trained["overrides"], f"ckpt_path={path}"], tmp_path / "new_run"))
    text = str(caught.value)
    assert re.search(
        re.escape(str(path)) + ": its optimizer state is not what this run's settings build", text
    )
    assert re.search(message, text), text
    assert "init_from=" in text
    assert path.read_bytes() == before
    assert not list((tmp_path / "new_run").rglob("*.ckpt"))  # nothing trained
    run = copy_run(trained, tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    torch.save(checkpoint, last)
    kept = files_of(run)
    with pytest.raises(ConfigError, match="its optimizer state is not what this run's settings build"):
        train(compose_train([*two_epochs_tested(trained), "resume=true"], run))
    assert files_of(run) == kept


def test_adam_step_counts_behind_the_schedule_are_taken_only_where_steps_are_skipped(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """Under fp16 mixed precision the gradient scaler skips optimizer steps, so Adam's step counts may be
    behind the schedule's, never ahead; otherwise they are the schedule's. Moments of no parameter at a
    schedule position past 0 are refused too (torch would start them afresh, silently)."""
    from attnlab.training.resume import check_training_state

    module = TranslationModule(**{k: trained["plain"]["hyper_parameters"][k] for k in ("model", "optim")})
    position = trained["plain"]["global_step"]
    assert position > 1

    def saved(name: str, edit: Callable[[dict[str, Any]], None]) -> Path:
        checkpoint = copy.deepcopy(trained["plain"])
        edit(checkpoint)
        torch.save(checkpoint, tmp_path / name)
        return tmp_path / name

    behind = saved("behind.ckpt", set_steps(position - 1))
    ahead = saved("ahead.ckpt", set_steps(position + 1))
    check_training_state(behind, module, "16-mixed")
    for path, step, precision in ((behind, position - 1, "32-true"), (ahead, position + 1, "16-mixed")):
        with pytest.raises(ConfigError, match=f"Adam's step count {step} is not the schedule's {position}"):
            check_training_state(path, module, precision)
    empty = saved("empty.ckpt", lambda c: c["optimizer_states"][0]["state"].clear())
    with pytest.raises(ConfigError, match=r"state: moments of 0 of the \d+ parameters"):
        check_training_state(empty, module, "32-true")


def test_other_optim_settings_than_the_checkpoints_are_refused_naming_init_from(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """`ckpt_path=` continues a checkpoint's optimizer: with another eps the run would silently train with
    the saved one; `init_from=` (a fresh optimizer) takes the new settings."""
    other = [*trained["overrides"], "optim.eps=1e-6"]
    with pytest.raises(ConfigError, match=r"eps: 1e-09 there, 1e-06 here.*init_from="):
        train(compose_train([*other, f"ckpt_path={trained['last']}"], tmp_path / "continued"))
    train(compose_train([*other, f"init_from={trained['last']}"], tmp_path / "fine_tuned"))
    saved = read_checkpoint(tmp_path / "fine_tuned" / "checkpoints" / "last.ckpt")
    assert saved["optimizer_states"][0]["param_groups"][0]["eps"] == 1e-6


def test_a_saved_learning_rate_does_not_steer_the_resumed_steps(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """The rate of the first resumed step is the schedule's, not the `lr` a checkpoint holds: a run
    resumed from a last.ckpt whose rate says 1000 ends with the weights of one resumed from the real one."""
    finals = []
    for name, lr in (("real", None), ("steered", 1000.0)):
        run = copy_run(trained, tmp_path / name)
        if lr is not None:
            last = run / "checkpoints" / "last.ckpt"
            checkpoint = torch.load(last, weights_only=True)
            checkpoint["optimizer_states"][0]["param_groups"][0]["lr"] = lr
            torch.save(checkpoint, last)
        train(compose_train([*two_epochs_tested(trained), "test=false", "resume=true"], run))
        finals.append(read_checkpoint(run / "checkpoints" / "last.ckpt")["state_dict"])
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


@pytest.mark.parametrize(
    "entries",
    [{"epoch": {"epoch": 0, "sums": {"loss": ["1.5", 10]}, "skipped": 0}},
     {"epoch": {"epoch": True, "sums": {}, "skipped": 0}},
     {"epoch": {"epoch": 0, "sums": {"loss": [float("nan"), 1.0]}, "skipped": 0}}, {"epoch": "not a dict"},
     {"skipped": "many"}],
)  # fmt: skip
def test_unreadable_epoch_sums_are_left_out_with_a_warning_and_steer_nothing(
    entries: dict[str, Any], trained: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The running epoch sums a checkpoint holds (for `train/*_epoch` after a resumption inside an epoch)
    and its count of skipped batches are plain numbers; sums that are not are named in a warning and left
    out, a count that is not is taken as 0, and the run resumes as from the real checkpoint."""
    finals = []
    for name, changed in (("real", {}), ("odd", entries)):
        run = copy_run(trained, tmp_path / name)
        if changed:
            last = run / "checkpoints" / "last.ckpt"
            checkpoint = torch.load(last, weights_only=True)
            checkpoint["attnlab_resume"].update(changed)
            torch.save(checkpoint, last)
        with caplog.at_level(logging.WARNING, logger="attnlab.training.module"):
            train(compose_train([*two_epochs_tested(trained), "test=false", "resume=true"], run))
        finals.append(read_checkpoint(run / "checkpoints" / "last.ckpt")["state_dict"])
        warned = "the checkpoint's running epoch sums are not readable" in caplog.text
        assert warned == ("epoch" in changed), caplog.text
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


def _python_state(state: dict[str, Any]) -> None:
    state["rng"]["python"] = [3, [1, 2, 3], None]  # Python's generator has 625 words


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda state: state.update(tokens_seen="many"), "tokens_seen: 'many' is no count"),
        (lambda state: state.update(tokens_seen=-1), "tokens_seen: -1 is no count"),
        (
            lambda state: state.update(rng="seeded"),
            "rng: 'seeded' holds no torch and python generator states",
        ),
        (lambda state: state["rng"].update(torch=torch.zeros(3, dtype=torch.uint8)), r"rng\.torch: no CPU"),
        (_python_state, r"rng\.python: \[3, \[1, 2, 3\], None\] is no Python generator state"),
        (lambda state: state["rng"].update(cuda="all"), r"rng\.cuda: 'all' is no list of CUDA generator"),
        (lambda state: state.update(rng_ranks=[{"torch": 1}]), r"rng_ranks\[0\]: \{'torch': 1\} holds no"),
    ],
    ids=["tokens_seen", "negative tokens_seen", "rng", "torch", "python", "cuda", "rng_ranks"],
)
def test_a_resumption_state_not_as_written_is_refused_before_the_run_changes(
    change: Callable[[dict[str, Any]], None], named: str, trained: dict[str, Any], tmp_path: Path
) -> None:
    """Generator states and counts that `attnlab-train` does not write would fail at the first step, with
    the run started; they are refused before, naming the entry and the fix, and nothing of the run changes."""
    run, _ = run_with_edited_last(trained, tmp_path, lambda c: change(c["attnlab_resume"]))
    kept = files_of(run)
    with pytest.raises(ConfigError, match=named) as caught:
        train(compose_train([*two_epochs_tested(trained), "resume=true"], run))
    assert "its resumption state (attnlab_resume) is not what attnlab-train writes" in str(caught.value)
    assert "init_from=" in str(caught.value)
    assert files_of(run) == kept


def test_loading_a_module_for_inference_takes_an_odd_resumption_state_without_failing(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """`TranslationModule.load_from_checkpoint` needs the weights only: counts and generator states that
    are not attnlab-train's (refused before a resumption, above) do not stop it."""
    checkpoint = torch.load(trained["last"], weights_only=True)
    checkpoint["attnlab_resume"] = {"tokens_seen": "many", "skipped": [1], "rng_ranks": "x", "epoch": 5}
    path = tmp_path / "odd.ckpt"
    torch.save(checkpoint, path)
    module = TranslationModule.load_from_checkpoint(path)
    real = TranslationModule.load_from_checkpoint(trained["last"])
    assert module.tokens_seen == real.tokens_seen == 0  # (a loaded module's fit is a new run)
    ours, theirs = module.state_dict(), real.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_a_huge_class_name_or_format_is_shown_cut_in_the_message(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """The value a refusal names comes from the untrusted file: a megabyte-long `_target_` (or format)
    made a megabyte-long error line; it is shown cut to about 100 characters."""
    for edit in ("data", "format"):
        checkpoint = copy.deepcopy(trained["plain"])
        if edit == "data":
            checkpoint[BUNDLE_KEY]["data"] = {"_target_": "attnlab." + "x" * 1_000_000}
        else:
            checkpoint[BUNDLE_KEY]["format"] = "9" * 1_000_000
        path = tmp_path / f"{edit}.ckpt"
        torch.save(checkpoint, path)
        with pytest.raises(CheckpointError) as refused:
            read_checkpoint(path)
        assert len(str(refused.value)) < 1000 and "xxx" * (edit == "data") in str(refused.value)
