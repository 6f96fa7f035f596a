"""Greedy decoding over the K/V cache against an uncached reference loop; `translate`'s shortest output."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import Tensor

from attnlab.decoding import DecodeConfig
from attnlab.decoding.search import MAX_OUTPUT_TOKENS, greedy_decode, max_output_lengths, translate
from attnlab.model.cache import KVCache
from attnlab.model.transformer import Transformer
from helpers import random_source, tiny_config

V, PAD, BOS, EOS = 50, 0, 1, 2


class EosAtSourceLength(Transformer):
    """A real Transformer whose eos logit is pushed up at target position |S_b| - 1 of each row b.

    Rows of one batch then finish at different steps (a random tiny model rarely emits eos by itself).
    With `push=-1e4` eos is never chosen. Records the decoder input of every `decode` call.
    """

    push = 1e4

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fed: list[Tensor] = []

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None, *, cache: KVCache | None = None, **kw: Any
    ):
        self.fed.append(tgt.clone())
        offset = 0 if cache is None else cache.length
        logits = super().decode(tgt, memory, src_mask, cache=cache, **kw).clone()  # (B, T, V)
        positions = offset + torch.arange(tgt.size(1))  # (T,)
        lengths = (
            memory.new_full((tgt.size(0), 1), memory.size(1))
            if src_mask is None
            else src_mask.sum(1, keepdim=True)
        )
        stop = lengths - 1  # (B, 1); no mask: no padding
        at_stop = positions[None, :] == stop if self.push > 0 else torch.ones_like(tgt, dtype=torch.bool)
        logits[..., EOS] += self.push * at_stop
        return logits


class StopsAtOnce(Transformer):
    """A real Transformer whose eos logit is pushed up at every position: it would stop at once."""

    def decode(self, *args: Any, **kw: Any):
        logits = super().decode(*args, **kw).clone()  # (B, T, V)
        logits[..., EOS] += 1e4
        return logits


class TiedBest(Transformer):
    """A real Transformer whose logits are replaced by a row where ids 9 and 7 tie for the best score (eos
    below them): greedy decoding must pick 7, the lower id, as `argmax` does."""

    def decode(self, *args: Any, **kw: Any):
        logits = super().decode(*args, **kw)
        tied = torch.zeros_like(logits)
        tied[..., [9, 7]] = 2.0
        tied[..., EOS] = 1.0
        return tied


def build(cls: type[Transformer] = Transformer, seed: int = 0, **overrides: Any) -> Transformer:
    torch.manual_seed(seed)
    return cls(tiny_config(**overrides)).eval()


def source(lengths: list[int], seed: int = 0) -> Tensor:
    return random_source(lengths, V, seed)


@torch.no_grad()
def reference_greedy(model: Transformer, src: Tensor, a: float, b: int, start: int) -> Tensor:
    """Greedy decoding that re-runs the full teacher-forced forward on the whole prefix at each step.

    Row i stops at eos or after max(1, int(a·|S_i| + b)) tokens.
    """
    limits = [max(1, int(a * n + b)) for n in (src != PAD).sum(dim=1).tolist()]
    prefix = torch.full((src.size(0), 1), start)
    finished = torch.zeros(src.size(0), dtype=torch.bool)
    steps = []
    for step in range(max(limits)):
        token = model(src, prefix)[:, -1].argmax(-1)  # (B,)
        token = torch.where(finished, torch.full_like(token, PAD), token)
        steps.append(token)
        prefix = torch.cat([prefix, token[:, None]], dim=1)
        finished |= (token == EOS) | torch.tensor([limit <= step + 1 for limit in limits])
        if finished.all():
            break
    return torch.stack(steps, dim=1) if steps else torch.empty(src.size(0), 0, dtype=torch.long)


def check_eos_then_pad(out: Tensor) -> None:
    for row in out.tolist():
        if EOS in row:
            after = row[row.index(EOS) + 1 :]
            assert after == [PAD] * len(after), row
        elif PAD in row:  # capped before eos: padding only after the cap
            after = row[row.index(PAD) :]
            assert after == [PAD] * len(after), row


# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [Transformer, EosAtSourceLength], ids=["plain", "eos"])
@pytest.mark.parametrize("overrides", [{}, {"norm_first": True, "pe": "learned", "tie": "none"}], ids=str)
def test_greedy_equals_uncached_reference(cls: type[Transformer], overrides: dict[str, Any]) -> None:
    model = build(cls, **overrides)
    src = source([7, 3, 5, 1])
    out = greedy_decode(model, src, max_len_a=1.0, max_len_b=4)
    expected = reference_greedy(model, src, 1.0, 4, start=BOS)
    assert torch.equal(out, expected)
    check_eos_then_pad(out)


def test_a_tie_for_the_best_token_goes_to_the_lowest_id() -> None:
    out = greedy_decode(build(TiedBest), source([4, 2]), max_len_a=0.0, max_len_b=3)
    assert out.tolist() == [[7, 7, 7], [7, 7, 7]]


def test_rows_stop_at_their_own_eos_and_pad_after() -> None:
    model = build(EosAtSourceLength)
    src = source([6, 2, 4])
    out = greedy_decode(model, src)
    assert out.shape == (3, 7)  # stops when the longest row has produced eos
    assert [row.index(EOS) for row in out.tolist()] == [6, 2, 4]
    check_eos_then_pad(out)


def test_batch_of_finished_rows_stops_early() -> None:
    model = build(EosAtSourceLength)
    out = greedy_decode(model, source([2, 2]), max_len_b=100)
    assert out.shape == (2, 3)
    assert (out[:, -1] == EOS).all()


def test_sentence_alone_equals_sentence_in_padded_batch() -> None:
    model = build(EosAtSourceLength)
    batch = source([3, 9, 5], seed=3)
    together = greedy_decode(model, batch)
    for i, n in enumerate([3, 9, 5]):
        alone = greedy_decode(model, batch[i : i + 1, : n + 1])
        width = alone.size(1)
        assert torch.equal(together[i, :width], alone[0])
        assert (together[i, width:] == PAD).all()


def test_sentence_alone_equals_sentence_in_padded_batch_when_capped_without_eos() -> None:
    model = build()
    batch = source([3, 9], seed=4)
    together = greedy_decode(model, batch, max_len_b=2)
    alone = greedy_decode(model, batch[:1, :4], max_len_b=2)
    assert alone.shape == (1, 4 + 2)  # its own cap, not the batch's longest source
    assert torch.equal(together[0, :6], alone[0])
    assert (together[0, 6:] == PAD).all()


@pytest.mark.parametrize(("a", "b"), [(1.0, 3), (0.5, 3), (2.0, 0), (1.2, 1), (0.0, 0), (0.0, 2)])
def test_output_length_is_capped_per_sentence_at_a_times_source_plus_b(a: float, b: int) -> None:
    never = build(EosAtSourceLength)
    never.push = -1e4
    src = source([4, 2])  # real sources: 4 symbols + eos = 5 tokens, 2 + eos = 3 tokens
    caps = [max(1, int(a * 5 + b)), max(1, int(a * 3 + b))]
    out = greedy_decode(never, src, max_len_a=a, max_len_b=b)
    assert out.shape == (2, max(caps))
    assert [int((row != PAD).sum()) for row in out] == caps
    assert not (out == EOS).any()
    stopping = build(EosAtSourceLength)
    assert greedy_decode(stopping, src, max_len_a=a, max_len_b=b).size(1) <= max(caps)


def test_the_length_limit_is_python_float_arithmetic_and_bounded() -> None:
    """a · |S| + b as Python (and the CTranslate2 export) computes it: in float32, 1.3 · 90 + 10 came out
    126. A huge a stops at the model's position limit, or at MAX_OUTPUT_TOKENS without one, instead of
    overflowing int64 (which made every limit 1 for a = inf, an allocation error for a = 1e18)."""
    src = torch.full((3, 91), 7)
    src[0, 90:] = PAD  # |S| = 90
    src[1, 3:] = PAD  # |S| = 3
    assert max_output_lengths(src, PAD, 1.3, 10).tolist() == [int(1.3 * 90 + 10), int(1.3 * 3 + 10), 128]
    assert max_output_lengths(src, PAD, 1e18, 10).tolist() == [MAX_OUTPUT_TOKENS] * 3
    assert max_output_lengths(src, PAD, 1e18, 10, limit=64).tolist() == [64] * 3
    out = greedy_decode(build(), source([3, 2]), max_len_a=1e18, max_len_b=0)
    assert 1 <= out.size(1) <= MAX_OUTPUT_TOKENS
    with pytest.raises(ValueError, match=r"max_len_a=inf must be >= 0 and finite"):
        DecodeConfig(max_len_a=float("inf"))


def test_a_min_len_no_output_may_reach_is_warned_about() -> None:
    """max_len_a=0 limits every output to max_len_b tokens: a longer min_len cannot end with eos. A warning,
    not an error: a checkpoint saved with it must still load for an override to fix it."""
    with pytest.warns(UserWarning, match=r"min_len=6 is longer than every output may be"):
        DecodeConfig(max_len_a=0.0, max_len_b=5, min_len=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DecodeConfig(max_len_a=0.0, max_len_b=5, min_len=5)
        DecodeConfig(max_len_a=0.1, max_len_b=5, min_len=6)  # a long source may reach it


@pytest.mark.parametrize("beam", [1, 3])
def test_translate_reports_the_outputs_that_ran_to_their_limit_without_eos(beam: int) -> None:
    src = source([4, 2, 3])
    with pytest.warns(UserWarning, match="min_len=9 is longer"):  # eos is never allowed: all run to b = 3
        settings = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=3, min_len=9)
    unfinished: list[int] = []
    outputs = translate(build(), src, settings, unfinished=unfinished)
    assert unfinished == [0, 1, 2] and [len(row) for row in outputs] == [3, 3, 3]
    unfinished = []
    translate(build(EosAtSourceLength), src, DecodeConfig(beam=1), unfinished=unfinished)  # all end with eos
    assert unfinished == []


def test_first_fed_token_is_decoder_start_id() -> None:
    model = build(EosAtSourceLength, decoder_start_id=PAD)
    assert model.config.start_id == PAD
    src = source([5, 3])
    out = greedy_decode(model, src)
    assert torch.equal(model.fed[0], torch.full((2, 1), PAD))
    rows = [t.size(0) for t in model.fed]  # one new position per cached step and unfinished sentence
    assert all(t.size(1) == 1 for t in model.fed)
    assert rows == sorted(rows, reverse=True) and rows[-1] == 1  # the shorter sentence left the batch
    assert torch.equal(torch.cat(model.fed[1 : rows.count(2)], dim=1), out[:, : rows.count(2) - 1])
    assert torch.equal(out, reference_greedy(model, src, 1.0, 10, start=PAD))


def test_default_start_is_bos() -> None:
    model = build(EosAtSourceLength)
    greedy_decode(model, source([4]))
    assert torch.equal(model.fed[0], torch.full((1, 1), BOS))


@pytest.mark.parametrize("training", [False, True])
def test_runs_under_inference_mode_and_keeps_the_mode(training: bool) -> None:
    model = build(dropout=0.0)
    model.train(training)
    out = greedy_decode(model, source([4, 2]))
    assert out.is_inference()
    assert not out.requires_grad
    assert model.training is training
    assert all(m.training is training for m in model.modules())


def test_a_cap_below_one_still_produces_one_token() -> None:
    out = greedy_decode(build(), source([3, 2]), max_len_a=0.0, max_len_b=0)
    assert out.shape == (2, 1)
    assert out.dtype == torch.long


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("min_len", [1, 2, 5])
def test_translate_honours_min_len_with_every_beam(beam: int, min_len: int) -> None:
    """A model that would stop at once produces eos exactly as its `min_len`-th token, greedy or not."""
    model = build(StopsAtOnce)
    src = source([4, 2, 6])
    outputs = translate(model, src, DecodeConfig(beam=beam, min_len=min_len))
    assert [len(row) for row in outputs] == [min_len - 1] * 3  # eos (removed) is the min_len-th token
    assert not {PAD, BOS, EOS} & {t for row in outputs for t in row}
    out = greedy_decode(model, src, min_len=min_len)
    assert out.shape == (3, min_len) and (out[:, -1] == EOS).all()
