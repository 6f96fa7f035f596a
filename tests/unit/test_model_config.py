"""`TransformerConfig`: validation messages, derived properties, and a torch-free import."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from attnlab.model.config import TransformerConfig

VOCAB = 50


def tiny(**overrides: Any) -> TransformerConfig:
    """A small valid config with `overrides` applied."""
    fields: dict[str, Any] = {
        "src_vocab_size": VOCAB,
        "tgt_vocab_size": VOCAB,
        "d_model": 32,
        "n_heads": 4,
        "d_ff": 64,
        "n_encoder_layers": 2,
        "n_decoder_layers": 2,
    }
    fields.update(overrides)
    return TransformerConfig(**fields)


def test_tiny_config_is_valid() -> None:
    config = tiny()
    assert config.head_dim == 8
    assert config.d_model == 32


def test_defaults_are_the_paper_base_model() -> None:
    config = TransformerConfig()
    assert (config.d_model, config.n_heads, config.d_ff) == (512, 8, 2048)
    assert (config.n_encoder_layers, config.n_decoder_layers) == (6, 6)
    assert config.dropout == 0.1
    # README, "Choices where the paper is silent": no dropout inside the FFN or on attention weights
    assert (config.activation_dropout, config.attention_dropout, config.activation) == (0.0, 0.0, "relu")
    assert config.pe == "sinusoidal"
    assert config.pe_layout == "interleaved"
    assert config.norm_first is False
    assert config.scale_embeddings is True
    assert config.tie == "all"
    assert config.output_bias is False
    assert config.head_dim == 64


# (overrides, substrings the message must contain: the field and the bad value)
BAD_VALUES = [
    pytest.param({"n_heads": 5}, ["n_heads=5", "d_model=32"], id="n_heads-not-dividing"),
    pytest.param({"d_model": -32}, ["d_model=-32"], id="negative-d_model"),
    pytest.param({"d_model": 0}, ["d_model=0"], id="zero-d_model"),
    pytest.param({"d_ff": 0}, ["d_ff=0"], id="zero-d_ff"),
    pytest.param({"d_ff": -1}, ["d_ff=-1"], id="negative-d_ff"),
    pytest.param({"n_encoder_layers": 0}, ["n_encoder_layers=0"], id="zero-encoder-layers"),
    pytest.param({"n_decoder_layers": -2}, ["n_decoder_layers=-2"], id="negative-decoder-layers"),
    pytest.param({"dropout": 1.5}, ["dropout=1.5"], id="dropout-above-one"),
    pytest.param({"attention_dropout": -0.1}, ["attention_dropout=-0.1"], id="negative-attention-dropout"),
    pytest.param({"pe": "rotary"}, ["pe=", "rotary"], id="unknown-pe"),
    pytest.param({"pe_layout": "blocked"}, ["pe_layout=", "blocked"], id="unknown-pe-layout"),
    pytest.param({"activation": "tanh"}, ["activation=", "tanh"], id="unknown-activation"),
    pytest.param({"tie": "encoder"}, ["tie=", "encoder"], id="unknown-tie"),
    pytest.param({"d_model": "512"}, ["d_model=", "512"], id="string-d_model"),
    pytest.param({"n_heads": True}, ["n_heads=True"], id="bool-for-int"),
    pytest.param({"dropout": "0.1"}, ["dropout=", "0.1"], id="string-dropout"),
    pytest.param({"norm_first": 1}, ["norm_first=1"], id="int-for-bool"),
    pytest.param({"layer_norm_eps": True}, ["layer_norm_eps=True"], id="bool-for-float"),
    pytest.param({"pad_id": 2}, ["pad_id=2", "eos_id=2"], id="pad-equals-eos"),
    pytest.param({"pad_id": VOCAB}, ["pad_id=50", "src_vocab_size=50"], id="pad-outside-vocab"),
    pytest.param({"pad_id": -1}, ["pad_id=-1"], id="negative-pad"),
    pytest.param({"eos_id": 99}, ["eos_id=99"], id="eos-outside-vocab"),
    pytest.param({"decoder_start_id": 77}, ["decoder_start_id=77"], id="start-outside-vocab"),
    pytest.param({"d_model": 33, "n_heads": 3}, ["d_model=33", "sinusoidal"], id="odd-d_model-sinusoidal"),
    pytest.param({"d_head": 0}, ["d_head=0"], id="zero-d_head"),
    pytest.param({"max_positions": 0}, ["max_positions=0"], id="zero-max-positions"),
    pytest.param({"src_vocab_size": 0}, ["src_vocab_size=0"], id="zero-src-vocab"),
    pytest.param(
        {"tgt_vocab_size": 60}, ["tie", "src_vocab_size=50", "tgt_vocab_size=60"], id="tie-all-vocab"
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD_VALUES)
def test_bad_value_raises_naming_field_and_value(overrides: dict[str, Any], expected: list[str]) -> None:
    with pytest.raises(ValueError) as excinfo:
        tiny(**overrides)
    message = str(excinfo.value)
    for text in expected:
        assert text in message, f"{text!r} not in {message!r}"


def test_unknown_choice_message_lists_the_accepted_values() -> None:
    with pytest.raises(ValueError, match="rotary") as excinfo:
        tiny(pe="rotary")
    for choice in ("sinusoidal", "learned", "none"):
        assert choice in str(excinfo.value)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"n_heads": 3, "d_head": 16}, id="d_head-makes-non-dividing-heads-valid"),
        pytest.param({"d_model": 33, "n_heads": 3, "pe": "learned"}, id="odd-d_model-learned"),
        pytest.param({"d_model": 33, "n_heads": 3, "pe": "none"}, id="odd-d_model-none"),
        pytest.param({"tgt_vocab_size": 60, "tie": "decoder"}, id="tie-decoder-separate-vocab"),
        pytest.param({"tgt_vocab_size": 60, "tie": "none"}, id="tie-none-separate-vocab"),
        pytest.param({"src_vocab_size": None, "tgt_vocab_size": None}, id="vocab-unset"),
        pytest.param({"decoder_start_id": 0}, id="start-with-pad"),
        pytest.param({"dropout": 0}, id="int-dropout"),
        pytest.param({"pe_layout": "split"}, id="split-layout"),
    ],
)
def test_valid_variants_are_accepted(overrides: dict[str, Any]) -> None:
    config = tiny(**overrides)
    for name, value in overrides.items():
        assert getattr(config, name) == value


def test_d_head_sets_head_dim() -> None:
    assert tiny(n_heads=3, d_head=16).head_dim == 16
    assert tiny(n_heads=4).head_dim == 8


def test_int_dropout_is_coerced_to_float() -> None:
    config = tiny(dropout=0)
    assert isinstance(config.dropout, float)


def test_start_id_defaults_to_bos_id() -> None:
    assert tiny().decoder_start_id is None
    assert tiny().start_id == tiny().bos_id == 1
    assert tiny(bos_id=7).start_id == 7
    assert tiny(decoder_start_id=0).start_id == 0


def test_with_vocab_sets_and_revalidates() -> None:
    base = TransformerConfig(d_model=32, n_heads=4)
    config = base.with_vocab(40, 40)
    assert (config.src_vocab_size, config.tgt_vocab_size) == (40, 40)
    assert base.src_vocab_size is None
    with pytest.raises(ValueError, match="tie"):
        base.with_vocab(40, 41)


def test_to_dict_round_trips() -> None:
    config = tiny(pe="learned", norm_first=True)
    assert TransformerConfig(**config.to_dict()) == config


def test_config_is_frozen() -> None:
    config = tiny()
    with pytest.raises(AttributeError):
        config.d_model = 64  # type: ignore[misc]


@pytest.mark.parametrize("module", ["attnlab.model.config", "attnlab.model"])
def test_config_import_and_construction_do_not_import_torch(module: str) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from {module} import TransformerConfig
        config = TransformerConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=32, n_heads=4)
        assert config.head_dim == 8
        try:
            TransformerConfig(pe="rotary")
        except ValueError:
            pass
        else:
            raise SystemExit("no ValueError")
        loaded = sorted(name for name in sys.modules if name == "torch" or name.startswith("torch."))
        assert not loaded, loaded
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_position_limit_is_the_learned_table_only() -> None:
    learned = tiny(pe="learned", max_positions=8)
    assert learned.position_limit == 8
    assert [learned.length_limit(n) for n in (5, 8, 20)] == [5, 8, 8]
    for pe in ("sinusoidal", "none"):
        unbounded = tiny(pe=pe, max_positions=8)
        assert unbounded.position_limit is None and unbounded.length_limit(20) == 20
