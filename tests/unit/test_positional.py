"""Positional encodings: the closed form of §3.5, growth past the initial table, learned-table limits."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from attnlab.decoding import DecodeConfig
from attnlab.decoding.search import translate
from attnlab.model.positional import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    build_positional_encoding,
    sinusoidal_table,
)
from attnlab.model.transformer import Transformer
from helpers import tiny_config

D = 32


def closed_form(length: int, d_model: int, layout: str) -> Tensor:
    """PE from the paper's formula with Python `math`, float64 (T, D).

    interleaved: PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)).
    split: column i is sin(pos / 10000^(2i/D)) and column D/2 + i its cos, for i in 0..D/2-1.
    """
    half = d_model // 2
    rows = []
    for pos in range(length):
        angles = [pos / 10000 ** (2 * i / d_model) for i in range(half)]
        sines, cosines = [math.sin(a) for a in angles], [math.cos(a) for a in angles]
        if layout == "interleaved":
            rows.append([value for pair in zip(sines, cosines, strict=True) for value in pair])
        else:
            rows.append(sines + cosines)
    return torch.tensor(rows, dtype=torch.float64)


def assert_matches_closed_form(table: Tensor, expected: Tensor) -> None:
    assert table.dtype == torch.float32
    torch.testing.assert_close(table.double(), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("layout", ["interleaved", "split"])
def test_table_equals_closed_form(layout: str) -> None:
    table = sinusoidal_table(64, D, layout)  # type: ignore[arg-type]
    assert table.shape == (64, D)
    assert_matches_closed_form(table, closed_form(64, D, layout))


def test_layouts_hold_the_same_values_in_a_different_order() -> None:
    interleaved, split = sinusoidal_table(10, D, "interleaved"), sinusoidal_table(10, D, "split")
    assert not torch.equal(interleaved, split)
    torch.testing.assert_close(split[:, : D // 2], interleaved[:, 0::2])
    torch.testing.assert_close(split[:, D // 2 :], interleaved[:, 1::2])


def test_position_zero_is_sin0_cos0() -> None:
    expected = torch.tensor([0.0, 1.0] * (D // 2))
    torch.testing.assert_close(sinusoidal_table(1, D)[0], expected)


def cached_length(pe: SinusoidalPositionalEncoding) -> int:
    return pe._tables[torch.device("cpu")].size(0)


@pytest.mark.parametrize("layout", ["interleaved", "split"])
def test_module_grows_past_its_cached_table(layout: str) -> None:
    pe = SinusoidalPositionalEncoding(D, layout)  # type: ignore[arg-type]
    first = cached_length(pe) if pe(16) is not None else 0
    expected = closed_form(first + 1005, D, layout)
    long = pe(first + 1000)
    assert long.shape == (first + 1000, D)
    assert_matches_closed_form(long, expected[: first + 1000])
    assert cached_length(pe) >= first + 1000
    assert_matches_closed_form(pe(10, offset=first + 995), expected[first + 995 :])


def test_module_offset_before_growth_matches_table() -> None:
    pe = SinusoidalPositionalEncoding(D)
    torch.testing.assert_close(pe(5, offset=7), sinusoidal_table(12, D)[7:12])
    size = cached_length(pe)
    torch.testing.assert_close(pe(1, offset=40), sinusoidal_table(41, D)[40:41])
    assert cached_length(pe) == size  # no growth needed


def test_offset_past_the_table_grows_it() -> None:
    pe = SinusoidalPositionalEncoding(D)
    assert_matches_closed_form(pe(3, offset=3000), closed_form(3003, D, "interleaved")[3000:])


def test_model_in_another_dtype_keeps_its_dtype_past_the_table() -> None:
    model = Transformer(tiny_config(pe="sinusoidal")).eval().double()
    src = torch.randint(4, 50, (1, 600))
    assert model(src, src[:, :300]).dtype == torch.float64


def test_sinusoidal_table_is_not_in_state_dict_or_buffers() -> None:
    pe = SinusoidalPositionalEncoding(D)
    pe(100)
    assert dict(pe.state_dict()) == {}
    assert list(pe.parameters()) == [] and list(pe.buffers()) == []
    model = Transformer(tiny_config(pe="sinusoidal"))
    assert not [name for name in model.state_dict() if "table" in name or "positions" in name]


def test_learned_returns_its_rows() -> None:
    torch.manual_seed(0)
    pe = LearnedPositionalEncoding(D, max_positions=8)
    assert pe.embedding.weight.shape == (8, D)
    torch.testing.assert_close(pe(3, offset=2), pe.embedding.weight[2:5])
    torch.testing.assert_close(pe(8), pe.embedding.weight)
    assert "embedding.weight" in pe.state_dict()


@pytest.mark.parametrize(("length", "offset"), [(9, 0), (1, 8), (5, 6)])
def test_learned_raises_past_max_positions(length: int, offset: int) -> None:
    pe = LearnedPositionalEncoding(D, max_positions=8)
    with pytest.raises(ValueError) as excinfo:
        pe(length, offset)
    message = str(excinfo.value)
    assert f"needs {length + offset} positions" in message
    assert "max_positions=8" in message


def test_build_positional_encoding_kinds() -> None:
    kwargs = {"d_model": D, "max_positions": 8, "layout": "split"}
    sinusoidal = build_positional_encoding("sinusoidal", **kwargs)  # type: ignore[arg-type]
    learned = build_positional_encoding("learned", **kwargs)  # type: ignore[arg-type]
    assert isinstance(sinusoidal, SinusoidalPositionalEncoding)
    assert sinusoidal.layout == "split"
    assert isinstance(learned, LearnedPositionalEncoding)
    assert learned.max_positions == 8
    assert build_positional_encoding("none", **kwargs) is None  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# Through the model


def ids(batch: int, length: int, seed: int = 0) -> Tensor:
    """Token ids in 3..49 (no pad/bos/eos)."""
    return torch.randint(3, 50, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_learned_model_rejects_a_source_longer_than_max_positions() -> None:
    torch.manual_seed(0)
    model = Transformer(tiny_config(pe="learned", max_positions=8)).eval()
    assert model(ids(2, 8), ids(2, 8)).shape == (2, 8, 50)
    with pytest.raises(ValueError, match=r"needs 9 positions.*max_positions=8"):
        model(ids(2, 9), ids(2, 3))
    with pytest.raises(ValueError, match=r"needs 9 positions.*max_positions=8"):
        model(ids(2, 3), ids(2, 9))


def test_sinusoidal_model_ignores_max_positions() -> None:
    torch.manual_seed(0)
    model = Transformer(tiny_config(pe="sinusoidal", max_positions=8)).eval()
    with torch.no_grad():
        logits = model(ids(2, 50), ids(2, 50, seed=1))
    assert logits.shape == (2, 50, 50)
    assert bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("layout", ["interleaved", "split"])
def test_model_embedding_adds_the_configured_table(layout: str) -> None:
    torch.manual_seed(0)
    model = Transformer(tiny_config(pe_layout=layout)).eval()
    tokens = ids(1, 6)
    embed = model.encoder.embed
    expected = embed.token(tokens) * math.sqrt(D) + closed_form(6, D, layout).float()
    torch.testing.assert_close(embed(tokens), expected)


@pytest.mark.parametrize("beam", [1, 3])
def test_decoding_a_learned_model_stops_at_its_position_limit(beam: int) -> None:
    """Outputs allowed 1.0 · 6 + 100 tokens, eos forbidden before 50: cut at max_positions=8 (one
    decoder input position per output token), where the position table would otherwise raise."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(pe="learned", max_positions=8)).eval()
    src = torch.cat([ids(2, 5), torch.full((2, 1), 2)], dim=1)  # 5 ids + eos
    settings = DecodeConfig(beam=beam, max_len_a=1.0, max_len_b=100, min_len=50)
    assert [len(row) for row in translate(model, src, settings)] == [8, 8]
