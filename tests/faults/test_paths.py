"""Relative paths mean the same files from any working directory: a relative `data.dir` is resolved
against the directory the command starts in, and gives the same data (same prepared-cache key and
tokenizers) as the absolute path; a relative checkpoint path finds the same checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
    return data_identity(datamodule)


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
