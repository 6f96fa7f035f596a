"""Relative paths mean the same files from any working directory: a relative `data.dir` is resolved
against the directory the command starts in, and gives the same data (same prepared-cache key and
tokenizers) as the absolute path; a relative checkpoint path finds the same checkpoint. A checkpoint
holds its data paths absolute, so evaluating it reads the files it was trained on from any directory."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from attnlab.data import FilesData, HFData, Multi30kData
from attnlab.runs.checkpoint import bundle, data_spec
from attnlab.runs.manifest import data_identity
from attnlab.training.experiment import validate
from attnlab.typed import ConfigError
from helpers import compose_train, write_corpus

SPLITS = (("train", "train", 120), ("valid", "val", 10), ("test", "test2016", 10))


def identity(data_dir: str, out: Path) -> dict:
    overrides = ["data=files", f"data.dir={data_dir}", "data.src_lang=de", "data.tgt_lang=en"]
    cfg = compose_train([*overrides, "data.vocab_size=200", "model=tiny"], out)
    datamodule = validate(cfg).data.datamodule()
    datamodule.setup()
    found = data_identity(datamodule)
    for side in ("src_tokenizer", "tgt_tokenizer"):  # the SHA-256 of each tokenizer's JSON
        json_bytes = getattr(datamodule, side).to_json().encode("utf-8")
        assert found[f"{side}_sha256"] == hashlib.sha256(json_bytes).hexdigest(), side
    return found


def test_a_relative_data_dir_gives_the_same_data_from_any_working_directory(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = write_corpus(shared_data, tmp_path / "project" / "corpus", SPLITS)
    (tmp_path / "elsewhere" / "deeper").mkdir(parents=True)
    absolute = identity(str(corpus), tmp_path / "run0")
    monkeypatch.chdir(tmp_path / "project")
    from_project = identity("corpus", tmp_path / "run1")
    monkeypatch.chdir(tmp_path / "elsewhere" / "deeper")
    from_elsewhere = identity(os.path.join("..", "..", "project", "corpus"), tmp_path / "run2")
    for key in ("prepared_key", "src_tokenizer_sha256", "tgt_tokenizer_sha256"):
        assert absolute[key] == from_project[key] == from_elsewhere[key], key
    with pytest.raises(ConfigError, match=r"data\.dir=corpus does not exist or is not a directory"):
        validate(compose_train(["data=files", "data.dir=corpus", "model=tiny"], tmp_path / "run3"))


def saved_data(spec: Any) -> dict:
    """The data settings a checkpoint of a run with `spec` holds (as `on_save_checkpoint` writes them)."""
    return bundle(spec.datamodule())["data"]


def test_checkpoints_save_the_paths_of_where_the_run_started_even_once_it_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The paths are resolved when the data module is built: a checkpoint saved after the directory the
    run started in was removed still holds them (resolving them then failed the save)."""
    (tmp_path / "start" / "corpus").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "start")
    datamodule = FilesData(dir="corpus").datamodule()
    (tmp_path / "start" / "corpus").rmdir()
    (tmp_path / "start").rmdir()
    assert bundle(datamodule)["data"]["dir"] == str(tmp_path / "start" / "corpus")


def test_a_checkpoint_reads_the_data_it_was_trained_on_from_any_working_directory(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """attnlab-eval builds the data from the checkpoint: relative paths saved as given would name other
    files (or none) from another directory, and the scores would be of other references."""
    corpus = write_corpus(shared_data, tmp_path / "project" / "corpus", SPLITS)
    (tmp_path / "elsewhere" / "corpus").mkdir(parents=True)  # a same-named directory, not the data
    monkeypatch.chdir(tmp_path / "project")
    overrides = ["data=files", "data.dir=corpus", "data.cache_dir=cache", "data.src_lang=de", "model=tiny"]
    spec = validate(compose_train([*overrides, "data.tgt_lang=en"], tmp_path / "run")).data
    trained_on, test_text = spec.files(), spec.load(["test"])
    saved = saved_data(spec)
    assert Path(saved["dir"]) == corpus and Path(saved["cache_dir"]) == tmp_path / "project" / "cache"
    monkeypatch.chdir(tmp_path / "elsewhere")
    rebuilt = data_spec(saved, "run.ckpt")
    assert rebuilt.files() == trained_on
    assert rebuilt.load(["test"]) == test_text


def test_prefixes_and_dataset_paths_are_saved_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`data=files` without `dir` (the prefixes are paths), Multi30k's `root`, a local Hugging Face
    dataset and its local data files; hub names and remote files stay as they are."""
    (tmp_path / "c").mkdir()
    (tmp_path / "ds").mkdir()
    (tmp_path / "train.json").write_text("{}\n", "utf-8")
    monkeypatch.chdir(tmp_path)
    prefixes = FilesData(train="c/train", valid="./c/valid", test=("c/x/../test",), tokenizer_path="t")
    files = saved_data(prefixes)
    assert (files["train"], files["valid"]) == (str(tmp_path / "c" / "train"), str(tmp_path / "c" / "valid"))
    assert files["test"] == (str(tmp_path / "c" / "x" / ".." / "test"),)  # `..` left to the OS (symlinks)
    assert files["tokenizer_path"] == str(tmp_path / "t")
    assert files["dir"] is None and files["cache_dir"] is None
    assert saved_data(Multi30kData(root="c"))["root"] == str(tmp_path / "c")
    remote = "https://example.org/test.json"
    data_files = {"train": "train.json", "valid": "v/*.json", "test": remote}
    hf = saved_data(HFData(name="json", data_files=data_files))  # a packaged builder: from the working dir
    assert hf["name"] == "json"
    glob = str(tmp_path / "v" / "*.json")
    assert hf["data_files"] == {"train": str(tmp_path / "train.json"), "valid": glob, "test": remote}
    hf = saved_data(HFData(name="ds", data_files={"train": "train.json", "test": remote}))
    assert hf["name"] == str(tmp_path / "ds")  # a directory's data files are relative to it: kept
    assert hf["data_files"] == {"train": "train.json", "test": remote}
    assert saved_data(HFData(name="bentrevett/multi30k"))["name"] == "bentrevett/multi30k"
    monkeypatch.chdir(tmp_path / "c")
    assert data_spec(files, "run.ckpt").test_split_names() == ["test"]


def test_a_path_through_a_symlink_and_dotdot_is_saved_as_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`link/..` is the parent of the link's target for the OS (and `Path.resolve`, which reading uses),
    not the directory holding the link: folding `..` away would save other files (here: decoys)."""
    for tag, corpus in (("real", tmp_path / "real" / "corpus"), ("decoy", tmp_path / "project" / "corpus")):
        corpus.mkdir(parents=True)
        for name in ("train", "valid", "test"):
            for lang in ("de", "en"):
                (corpus / f"{name}.{lang}").write_text(f"{tag} {name}\n", "utf-8")
    (tmp_path / "real" / "sub").mkdir()
    (tmp_path / "project" / "link").symlink_to(tmp_path / "real" / "sub")
    monkeypatch.chdir(tmp_path / "project")
    specs = [FilesData(dir="link/../corpus"), FilesData(train="link/../corpus/train",
             valid="link/../corpus/valid", test=("link/../corpus/test",))]  # fmt: skip
    for spec in specs:
        assert spec.load(["test"])["test"] == (["real test"], ["real test"])
        saved = saved_data(spec)
        monkeypatch.chdir(tmp_path)
        assert data_spec(saved, "run.ckpt").load(["test"]) == {"test": (["real test"], ["real test"])}
        monkeypatch.chdir(tmp_path / "project")


def test_a_builder_named_like_a_directory_keeps_reading_its_data_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load_dataset("json", data_files=...)` uses the packaged json builder even where a directory
    `json` exists, reading the files from the working directory; a dataset directory's relative data files
    are its own, not same-named files of the working directory."""
    pytest.importorskip("datasets", reason='needs the [hf] extra: pip install -e ".[hf]"')
    import json

    def rows(path: Path, tag: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"translation": {"de": f"{tag} de", "en": f"{tag} en"}}) + "\n", "utf-8")

    for split in ("train", "validation", "test"):
        rows(tmp_path / "data" / f"{split}.jsonl", "builder")
        rows(tmp_path / "ds" / f"{split}.jsonl", "directory")
        rows(tmp_path / f"{split}.jsonl", "decoy")
    (tmp_path / "json").mkdir()  # notes beside the data, no dataset
    monkeypatch.chdir(tmp_path)
    globbed = {split: f"data/{split}*.jsonl" for split in ("train", "validation", "test")}
    own = {split: f"{split}.jsonl" for split in ("train", "validation", "test")}
    specs = {
        "builder": HFData(name="json", data_files=globbed),
        "directory": HFData(name="ds", data_files=own),
    }
    for tag, spec in specs.items():
        text = ([f"{tag} de"], [f"{tag} en"])
        assert spec.load(["test"])["test"] == text
        assert data_spec(saved_data(spec), "run.ckpt").load(["test"]) == {"test": text}
