"""attnlab-eval's checks of what it is asked to score: the data's languages against the model's, and the
split names of `sets=` (`attnlab.cli.eval`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from attnlab.cli.eval import check_languages, split_names
from attnlab.typed import ConfigError

TRAINED = {"src_lang": "de", "tgt_lang": "en"}


@pytest.mark.parametrize(
    ("src", "tgt"),
    [("de", "en"), ("DE", "EN"), ("de_DE", "en-US"), ("src", "tgt"), ("source", "target"), ("de", None)],
)
def test_data_of_the_models_languages_or_without_language_codes_is_scored(src: str, tgt: str | None) -> None:
    check_languages(TRAINED, SimpleNamespace(src_lang=src, tgt_lang=tgt))
    columns = {"src_lang": "source", "tgt_lang": "target"}  # Hugging Face data trained on two columns
    check_languages(columns, SimpleNamespace(src_lang="de", tgt_lang="en"))
    check_languages(None, SimpleNamespace(src_lang="fr", tgt_lang="en"))  # a checkpoint without data settings


@pytest.mark.parametrize(("src", "tgt", "key"), [("en", "de", "src_lang"), ("de", "fr", "tgt_lang"),
                                                 ("fr_FR", "en", "src_lang")])  # fmt: skip
def test_data_in_other_languages_is_refused_naming_both(src: str, tgt: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"data\.{key}=.*trained to translate de -> en"):
        check_languages(TRAINED, SimpleNamespace(src_lang=src, tgt_lang=tgt))


def test_sets_names_one_split_a_list_or_the_datas_test_sets() -> None:
    spec = SimpleNamespace(test_split_names=lambda: ["test2016", "test2017"])
    assert split_names(None, spec) == ["test2016", "test2017"]
    assert split_names("val", spec) == ["val"]
    assert split_names(2016, spec) == ["2016"]  # sets=2016: Hydra reads a number
    assert split_names(OmegaConf.create(["val", "test2016"]), spec) == ["val", "test2016"]
    with pytest.raises(ConfigError, match=r"sets=\[\] scores nothing"):
        split_names(OmegaConf.create([]), spec)
