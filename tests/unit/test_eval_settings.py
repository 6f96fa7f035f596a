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
    [
        ("de", "en"),
        ("DE", "EN"),
        ("de_DE", "en-US"),
        ("src", "tgt"),
        ("source", "target"),
        ("de", "text"),
        ("de", None),
    ],
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


@pytest.mark.parametrize(
    ("config", "keys"), [("eval.yaml", "DECODE_TIME_KEYS"), ("export.yaml", "EXPORT_KEYS")]
)
def test_the_decode_keys_a_command_takes_are_decode_configs_listed_in_one_place(
    config: str, keys: str
) -> None:
    """conf/eval.yaml's and conf/export.yaml's `decode` nodes (the overrides Hydra accepts) hold exactly the
    DecodeConfig fields `attnlab.decoding.settings` names for them, all null, so a new decoding setting
    cannot be left out of one command (attnlab-translate reads DECODE_TIME_KEYS itself)."""
    from pathlib import Path

    from attnlab.decoding import settings

    node = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / config).decode
    assert sorted(node) == sorted(getattr(settings, keys))
    assert all(value is None for value in node.values())
    fields = [f.name for f in settings.dataclasses.fields(settings.DecodeConfig)]
    assert set(settings.DECODE_TIME_KEYS) | set(settings.TRAINING_ONLY) == set(fields)


@pytest.mark.parametrize("value", [10**400, -(10**400)])
def test_an_integer_past_a_floats_range_is_refused_as_a_bad_value_not_an_overflow(value: int) -> None:
    """A float setting given an integer no float holds (a command line's 1 followed by 400 zeros) is the
    ValueError naming the setting, as any other bad value, not Python's OverflowError from float()."""
    from attnlab.decoding.settings import DecodeConfig
    from attnlab.inference.translator import decode_settings

    message = r"max_len_a=-?10+…0{8} \(40[12] characters\) is not valid: expected float"  # (elided)
    with pytest.raises(ValueError, match=message):
        DecodeConfig(max_len_a=value)
    with pytest.raises(ValueError, match=message):
        decode_settings({}, {"max_len_a": value})
