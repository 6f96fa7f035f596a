"""Beam search over the K/V cache: greedy parity, exhaustive search, teacher-forced scores, invariants."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from attnlab.decoding import DecodeConfig
from attnlab.decoding.search import (
    Hypothesis,
    NonFiniteScores,
    Sampling,
    available_memory,
    beam_search,
    check_beam_memory,
    greedy_decode,
    length_penalty,
    translate,
)
from attnlab.model.cache import KVCache
from attnlab.model.transformer import Transformer
from attnlab.typed import ConfigError
from helpers import random_source, tiny_config

PAD, BOS, EOS = 0, 1, 2
TRACES = {"need_token_scores": True, "need_attention": True}  # each hypothesis' token scores and attention


class Steered(Transformer):
    """A real Transformer with pad/bos suppressed (greedy may not pick them, beam search never does),
    `eos_bias` added to the eos logit, and optionally eos pushed up at target position |S_b| - 1."""

    eos_bias = 0.0
    eos_at_source_length = False

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, *, cache: KVCache | None = None, **kw: Any
    ):
        offset = 0 if cache is None else cache.length
        out = super().decode(tgt, memory, src_mask, cache=cache, **kw)
        logits = (out[0] if isinstance(out, tuple) else out).clone()  # (B, T, V)
        logits[..., [PAD, BOS]] = -1e4
        logits[..., EOS] += self.eos_bias
        if self.eos_at_source_length:
            positions = offset + torch.arange(tgt.size(1))  # (T,)
            beams = logits.size(0) // src_mask.size(0)  # decoder rows per sentence (cached beams share)
            lengths = src_mask.sum(1, keepdim=True).repeat_interleave(beams, dim=0)  # (B·K, 1)
            logits[..., EOS] += 1e4 * (positions[None, :] == lengths - 1)
        return (logits, out[1]) if isinstance(out, tuple) else logits


def build(
    seed: int = 0, vocab: int = 50, eos_bias: float = 0.0, at_length: bool = False, **kw: Any
) -> Steered:
    torch.manual_seed(seed)
    model = Steered(tiny_config(src_vocab_size=vocab, tgt_vocab_size=vocab, **kw)).eval()
    model.eos_bias, model.eos_at_source_length = eos_bias, at_length
    return model


def source(lengths: list[int], vocab: int = 50, seed: int = 0) -> Tensor:
    return random_source(lengths, vocab, seed)


@torch.no_grad()
def teacher_forced_scores(model: Transformer, src: Tensor, seqs: list[list[int]]) -> Tensor:
    """Sum of log p(y_t | y_<t, x) of each output sequence (all of one length) for one source (1, S)."""
    ys = torch.tensor(seqs)  # (N, T)
    start = torch.full((len(seqs), 1), model.config.start_id)
    inputs = torch.cat([start, ys[:, :-1]], dim=1)  # (N, T)
    lprobs = model(src.expand(len(seqs), -1), inputs).log_softmax(dim=-1)  # (N, T, V)
    return lprobs.gather(2, ys[..., None]).squeeze(2).sum(dim=1)  # (N,)


@torch.no_grad()
def check_traces(model: Transformer, src: Tensor, hyps: list[Hypothesis]) -> None:
    """Each hypothesis' token scores and attention (need_token_scores, need_attention) are its own tokens'
    teacher-forced log-probabilities and last-layer cross-attention averaged over heads, for one
    unpadded source (1, S)."""
    for h in hyps:
        ys = torch.tensor([h.tokens])  # (1, T)
        inputs = torch.cat([torch.full((1, 1), model.config.start_id), ys[:, :-1]], dim=1)
        memory, mask = model.encode(src)
        logits, weights = model.decode(inputs, memory, mask, need_weights=True)
        token_lp = logits.log_softmax(-1).gather(2, ys[..., None]).squeeze(2)[0]  # (T,)
        torch.testing.assert_close(torch.tensor(h.token_scores), token_lp, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(h.attention, weights[-1].mean(dim=1)[0], rtol=1e-4, atol=1e-4)


def check_invariants(hyps: list[Hypothesis], min_len: int = 1) -> None:
    for h in hyps:
        assert len(h.tokens) >= min_len
        assert EOS not in h.tokens[:-1]
        assert PAD not in h.tokens and BOS not in h.tokens
    assert [h.normalized for h in hyps] == sorted((h.normalized for h in hyps), reverse=True)
    assert len({tuple(h.tokens) for h in hyps}) == len(hyps)


# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("at_length", [False, True], ids=["plain", "eos-at-source-length"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_one_equals_greedy(at_length: bool, seed: int) -> None:
    model = build(seed, eos_bias=2.0 if not at_length else 0.0, at_length=at_length)
    src = source([7, 3, 5, 1], seed=seed)
    greedy = greedy_decode(model, src, max_len_a=1.0, max_len_b=4)
    result = beam_search(model, src, beam=1, alpha=0.0, max_len_a=1.0, max_len_b=4)
    for row, (hyp,) in zip(greedy.tolist(), result, strict=True):
        expected = row[: row.index(EOS) + 1] if EOS in row else [t for t in row if t != PAD]
        assert hyp.tokens == expected


@pytest.mark.parametrize(
    ("vocab", "max_len", "beam", "seed", "eos_bias", "min_len"),
    [(10, 3, 64, 5, 1.0, 1), (8, 4, 128, 4, 0.0, 2)],
)
def test_large_beam_finds_the_exhaustive_n_best(
    vocab: int, max_len: int, beam: int, seed: int, eos_bias: float, min_len: int
) -> None:
    """With a beam wider than the number of live prefixes, beam search is exhaustive (alpha = 0)."""
    model = build(seed=seed, vocab=vocab, eos_bias=eos_bias)
    src = source([4], vocab=vocab, seed=seed)
    symbols = [t for t in range(vocab) if t not in (PAD, BOS)]
    every: list[tuple[float, list[int]]] = []
    for n in range(min_len, max_len + 1):  # sequences ending at eos, or at the length limit without it
        seqs = [
            [*prefix, last]
            for prefix in itertools.product([t for t in symbols if t != EOS], repeat=n - 1)
            for last in symbols
            if last == EOS or n == max_len
        ]
        every += zip(teacher_forced_scores(model, src, seqs).tolist(), seqs, strict=True)
    every.sort(key=lambda pair: -pair[0])
    hyps = beam_search(
        model, src, beam=beam, alpha=0.0, max_len_a=0.0, max_len_b=max_len, min_len=min_len, n_best=5
    )[0]
    assert [h.tokens for h in hyps] == [seq for _, seq in every[:5]]
    assert len({len(h.tokens) for h in hyps}) > 1  # finished hypotheses of different lengths compete
    torch.testing.assert_close(
        [h.score for h in hyps], [score for score, _ in every[:5]], rtol=1e-4, atol=1e-4
    )
    assert all(h.normalized == h.score for h in hyps)


@pytest.mark.parametrize(("penalty", "alpha"), [("gnmt", 0.0), ("gnmt", 0.6), ("fairseq", 1.0)])
def test_scores_equal_teacher_forced_log_probs(penalty: str, alpha: float) -> None:
    model = build(seed=4, eos_bias=1.0, norm_first=True, pe="learned", tie="none")
    src = source([5, 2, 6], seed=4)
    results = beam_search(
        model, src, beam=4, alpha=alpha, penalty=penalty, n_best=4, max_len_a=1.0, max_len_b=2
    )
    traced = beam_search(
        model, src, beam=4, alpha=alpha, penalty=penalty, n_best=4, max_len_a=1.0, max_len_b=2, **TRACES
    )
    for i, hyps in enumerate(results):
        assert len(hyps) == 4
        check_invariants(hyps)
        real = src[i : i + 1, : int((src[i] != PAD).sum())]
        assert [h.tokens for h in traced[i]] == [h.tokens for h in hyps]
        check_traces(model, real, traced[i])  # hypotheses ended by eos, and some at the length limit
        for h in hyps:
            expected = float(teacher_forced_scores(model, real, [h.tokens])[0])
            torch.testing.assert_close(h.score, expected, rtol=1e-4, atol=1e-4)
            assert h.normalized == pytest.approx(h.score / length_penalty(len(h.tokens), alpha, penalty))


def test_sentence_alone_equals_sentence_in_padded_batch() -> None:
    model = build(seed=5, eos_bias=1.0)
    lengths = [3, 9, 5]
    batch = source(lengths, seed=5)
    together = beam_search(model, batch, beam=3, n_best=3, max_len_b=3)
    for i, n in enumerate(lengths):
        alone = beam_search(model, batch[i : i + 1, : n + 1], beam=3, n_best=3, max_len_b=3)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        torch.testing.assert_close(
            [h.score for h in alone], [h.score for h in together[i]], rtol=1e-5, atol=1e-5
        )


class Table(Transformer):
    """Next-token probabilities looked up from the last decoder input alone (the real decoder still runs
    to keep its cache): start -> eos .4, A .6; A -> eos .6, B .4; anything else -> eos.

    Raw log-probability prefers [eos] (-0.92) over [A, eos] (-1.02) and [A, B, eos] (-1.43); with
    the GNMT penalty and α = 1 the normalized scores are -0.92, -0.88 and -1.07, so [A, eos] wins; with
    fairseq's |Y|^α and α = 1 (the mean log-probability per token) they are -0.92, -0.51 and -0.48, so
    [A, B, eos] wins.
    """

    A, B = 4, 5

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, *, cache: KVCache | None = None, **kw: Any
    ):
        out = super().decode(tgt, memory, src_mask, cache=cache, **kw)
        logits = out[0] if isinstance(out, tuple) else out
        table = torch.full((logits.size(-1), logits.size(-1)), -1e4)  # (V, V): row = last input
        table[:, EOS] = 0.0
        table[self.config.start_id, [EOS, self.A]] = torch.tensor([0.4, 0.6]).log()
        table[self.A, [EOS, self.B]] = torch.tensor([0.6, 0.4]).log()
        fixed = table[tgt].log_softmax(dim=-1)  # (B, T, V)
        return (fixed, out[1]) if isinstance(out, tuple) else fixed


def test_length_penalty_changes_the_choice() -> None:
    torch.manual_seed(0)
    model = Table(tiny_config(src_vocab_size=12, tgt_vocab_size=12)).eval()
    src = source([3], vocab=12)
    raw = beam_search(model, src, beam=3, alpha=0.0, n_best=3)[0]
    assert [h.tokens for h in raw] == [[EOS], [Table.A, EOS], [Table.A, Table.B, EOS]]
    torch.testing.assert_close(raw[0].score, math.log(0.4))
    normalized = beam_search(model, src, beam=3, alpha=1.0, n_best=3)[0]
    assert [h.tokens for h in normalized] == [[Table.A, EOS], [EOS], [Table.A, Table.B, EOS]]
    torch.testing.assert_close(normalized[0].normalized, math.log(0.36) / (7 / 6))
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(7, 1.0) == pytest.approx(2.0)
    fairseq = beam_search(model, src, beam=3, alpha=1.0, penalty="fairseq", n_best=3)[0]
    assert [h.tokens for h in fairseq] == [[Table.A, Table.B, EOS], [Table.A, EOS], [EOS]]
    torch.testing.assert_close(fairseq[0].normalized, math.log(0.6 * 0.4) / 3)
    torch.testing.assert_close(fairseq[1].normalized, math.log(0.36) / 2)


def test_the_two_length_penalties_by_hand() -> None:
    """GNMT ((5 + |Y|) / 6)^α and fairseq |Y|^α, |Y| counting eos; α = 0 turns both off."""
    assert length_penalty(1, 0.6) == pytest.approx(1.0)  # (5 + 1) / 6 = 1
    assert length_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert length_penalty(3, 2.0, "gnmt") == pytest.approx((8 / 6) ** 2)
    assert length_penalty(3, 2.0, "fairseq") == pytest.approx(9.0)
    assert length_penalty(4, 0.5, "fairseq") == pytest.approx(2.0)
    assert length_penalty(4, 1.0, "fairseq") == 4.0
    assert length_penalty(9, 0.0, "fairseq") == length_penalty(9, 0.0, "gnmt") == 1.0
    with pytest.raises(ValueError, match="length_penalty='wu' is not a length penalty: use gnmt or fairseq"):
        length_penalty(3, 1.0, "wu")


def test_translate_decodes_with_the_length_penalty_and_beam_of_its_config() -> None:
    """Beam 3 picks [eos] without a length penalty, [A, eos] with GNMT α 1 and [A, B, eos] with fairseq
    α 1; greedy picks A (.6), then eos (.6), whatever the penalty. A beam given to `translate` overrides
    the config's."""
    torch.manual_seed(0)
    model = Table(tiny_config(src_vocab_size=12, tgt_vocab_size=12)).eval()
    src = source([3], vocab=12)
    assert translate(model, src, DecodeConfig(beam=3, alpha=0.0)) == [[]]
    assert translate(model, src, DecodeConfig(beam=3, alpha=1.0)) == [[Table.A]]
    assert translate(model, src, DecodeConfig(beam=3, alpha=1.0, length_penalty="fairseq")) == [
        [Table.A, Table.B]
    ]
    assert translate(model, src, DecodeConfig(beam=3, length_penalty="fairseq")) == [
        [Table.A, Table.B]
    ]  # α 1
    assert translate(model, src, DecodeConfig(beam=1, length_penalty="fairseq")) == [[Table.A]]
    assert translate(model, src, DecodeConfig(beam=1, alpha=0.0)) == [[Table.A]]
    assert translate(model, src, DecodeConfig(beam=1, alpha=0.0), beam=3) == [[]]
    assert translate(model, src, DecodeConfig(beam=3, alpha=0.0), beam=1) == [[Table.A]]


@pytest.mark.parametrize("min_len", [1, 3, 6])
def test_min_len_and_generated_ids(min_len: int) -> None:
    model = build(seed=6, eos_bias=3.0)
    results = beam_search(model, source([4, 6], seed=6), beam=4, n_best=4, min_len=min_len, max_len_b=4)
    for hyps in results:
        assert len(hyps) == 4
        check_invariants(hyps, min_len=min_len)
    if min_len == 1:  # with a strong eos bias short outputs appear when allowed
        assert any(len(h.tokens) < 3 for hyps in results for h in hyps)


@pytest.mark.parametrize(
    ("lengths", "a", "b", "caps"),
    [([2, 5], 1.0, 1, [4, 7]), ([2, 5, 3], 0.0, 4, [4, 4, 4])],
    ids=["one-by-one", "together"],
)
def test_forced_finish_at_the_length_limit_without_eos(
    lengths: list[int], a: float, b: int, caps: list[int]
) -> None:
    """Live beams finished at the length limit keep their own scores, token scores and attention, also
    where several sentences reach it at the same step."""
    model = build(seed=7, eos_bias=-1e4)  # eos never wins
    src = source(lengths, seed=7)
    results = beam_search(model, src, beam=3, n_best=3, max_len_a=a, max_len_b=b)
    traced = beam_search(model, src, beam=3, n_best=3, max_len_a=a, max_len_b=b, **TRACES)
    for i, (hyps, cap) in enumerate(zip(results, caps, strict=True)):
        assert [len(h.tokens) for h in hyps] == [cap] * 3
        assert all(EOS not in h.tokens for h in hyps)
        real = src[i : i + 1, : int((src[i] != PAD).sum())]
        expected = teacher_forced_scores(model, real, [h.tokens for h in hyps]).tolist()
        torch.testing.assert_close([h.score for h in hyps], expected, rtol=1e-4, atol=1e-4)
        assert [h.tokens for h in traced[i]] == [h.tokens for h in hyps]
        check_traces(model, real, traced[i])


def test_candidates_scored_minus_infinity_are_never_returned() -> None:
    """With a beam near the vocabulary's size, some of a step's top candidates score -inf (pad, bos and
    start are never generated); they are dropped, not returned as hypotheses."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=5, tgt_vocab_size=5)).eval()
    (hyps,) = beam_search(model, random_source([3], 5, 0), beam=4, n_best=4, max_len_a=0.0, max_len_b=1)
    assert hyps and all(math.isfinite(h.score) for h in hyps)
    assert len(hyps) == 3  # the 5 ids less pad and bos (start is bos): 3 one-token outputs


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("where", ["one logit", "every weight"])
def test_scores_that_are_nan_are_named_not_an_index_error(beam: int, where: str) -> None:
    """A model whose weights hold NaN scores every candidate NaN, so beam search kept no hypothesis:
    `translate` failed with an IndexError, n-best lists came back empty. Both name the cause. Greedy
    decoding (`translate` with beam 1, sampled or not) took the NaN's id as the best token without a
    word: empty outputs (eos) or a wrong token; it names the cause too."""
    model = Transformer(tiny_config()).eval()
    with torch.no_grad():
        for weight in [model.output.weight[5]] if where == "one logit" else list(model.parameters()):
            weight.fill_(float("nan"))  # one logit NaN: the log-softmax is NaN everywhere
    src = random_source([3, 5], 50, 0)
    told = r"no hypothesis for 2 of 2 sentences \(the first: 0\): the model's scores are NaN"
    with pytest.raises(NonFiniteScores, match=told):
        beam_search(model, src, beam=beam)
    with pytest.raises(NonFiniteScores, match=told):
        translate(model, src, DecodeConfig(beam=beam))
    if beam == 1:
        with pytest.raises(NonFiniteScores, match=rf"^greedy decoding found {told}"):
            greedy_decode(model, src, sample=Sampling(topk=5))


def test_a_beam_whose_first_step_cannot_fit_in_memory_is_refused_before_it_allocates() -> None:
    """A legal but huge beam (2^31-1) is a ConfigError naming the beam, the memory its first step needs at
    least (every row's scores over the target vocabulary and its keys and values for the first positions
    in every decoder layer) and the fix, raised before anything is encoded or allocated; a beam that fits
    decodes."""
    if available_memory() is None:
        pytest.skip("the memory available is known on Linux only (/proc/meminfo)")
    torch.manual_seed(3)
    cfg = tiny_config(src_vocab_size=50, tgt_vocab_size=70, tie="decoder")
    model = Transformer(cfg).eval()
    src = random_source([3, 4], 50, 3)  # length limits 1.2·|S| + 10: 14 and 16, so 16 buffered positions
    row = 70 + 2 * cfg.n_decoder_layers * cfg.n_heads * cfg.head_dim * 16
    gib = f"{4 * 2 * (2**31 - 1) * row / 2**30:,.1f}"
    calls = []
    model.encode = lambda *a: calls.append(a)  # type: ignore[method-assign]
    with pytest.raises(ConfigError) as refused:
        beam_search(model, src, beam=2**31 - 1)
    assert calls == []
    assert str(refused.value).startswith(
        f"beam=2147483647 for 2 sentences needs at least {gib} GiB at its first step (2 × 2147483647 rows "
        f"of {row} float32 numbers: the scores over the target vocabulary, and keys and values for 16 "
        "positions)"
    )
    assert str(refused.value).endswith(
        "lower the beam (decode.beam; decode.val_beam for validation in training), or decode fewer sentences "
        "at once (decode.batch_size, decode.max_tokens)"
    )
    with pytest.raises(ConfigError, match=r"beam=2147483647 for 1 sentence .*in training\)$"):
        translate(model, src[:1], DecodeConfig(beam=2**31 - 1))  # through translate's settings; one sentence
    del model.encode
    assert len(beam_search(model, src, beam=2, max_len_b=2)) == 2


def test_a_beam_whose_growing_keys_and_values_cannot_fit_is_refused_before_they_grow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CPU search's keys and values buffers double as the output grows (from 16 positions): each
    doubling is checked before it allocates, naming the step and what it needs more, not only the first
    step. The process is told it can take 100 kB (`available_memory` patched: a real limit as small makes
    torch's own allocations fail first); 2 × 4 rows of the tiny model need 67,776 bytes at the first step
    (scores and 16 positions), 65,536 more at step 17 (16 more positions: 2 layers × keys and values ×
    32 numbers × 16 × 8 rows × 4 bytes), then 131,072 more at step 33: refused there."""
    import attnlab.decoding.search as search
    from helpers import count_steps

    monkeypatch.setattr(search, "_SURELY_FITS", 0)
    monkeypatch.setattr(search, "available_memory", lambda: 100_000)
    torch.manual_seed(3)
    model = Transformer(tiny_config(src_vocab_size=50, tgt_vocab_size=70, tie="decoder")).eval()
    src = random_source([3, 4], 50, 3)
    steps = count_steps(monkeypatch)
    assert len(beam_search(model, src, beam=4, max_len_a=0, max_len_b=32, min_len=32)) == 2  # 32 positions
    assert steps[0] == 32
    steps[0] = 0
    with pytest.raises(ConfigError) as refused:
        beam_search(model, src, beam=4, max_len_a=0, max_len_b=40, min_len=40)
    assert steps[0] == 33  # the 33rd step, refused before its buffers grow
    assert str(refused.value).startswith(
        "beam=4 for 2 sentences needs at least 0.0 GiB more at step 33 (2 × 4 rows of 4096 float32 "
        "numbers: keys and values for as many more positions as the search held, in every decoder layer), "
        "more than the 0.0 GiB of memory this process can take: lower the beam (decode.beam;"
    )


def test_a_beam_keeping_attention_is_refused_before_its_cache_and_attention_grow_past_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Beam search with alignments (`need_attention`, `decode.print_alignment`) decodes through the
    modules' cache (`ModuleStep`) and keeps each output's cross-attention: it was checked at its first
    step only, then grew until the out-of-memory killer ended it. It is checked as the CPU step's buffers
    are, before each doubling, its attention rows counted. 100 kB available (as above), 2 × 4 rows over a
    source of 5 positions: 70,336 bytes at the first step (scores, 16 positions of keys and values and of
    attention), 68,096 more at step 17, then 136,192 more at step 33 (32 × 4,256 float32 numbers: 16 more
    positions of 2 layers' keys and values, 2 × 32 × 16 × 2, and of attention, 5 × 32): refused there."""
    import attnlab.decoding.search as search
    from helpers import count_steps

    monkeypatch.setattr(search, "_SURELY_FITS", 0)
    monkeypatch.setattr(search, "available_memory", lambda: 100_000)
    torch.manual_seed(3)
    model = Transformer(tiny_config(src_vocab_size=50, tgt_vocab_size=70, tie="decoder")).eval()
    src = random_source([3, 4], 50, 3)
    steps = count_steps(monkeypatch, modules=True)
    kept = beam_search(model, src, beam=4, max_len_a=0, max_len_b=32, min_len=32, need_attention=True)
    assert [hyps[0].attention.shape for hyps in kept] == [(32, 4), (32, 5)]
    assert steps[0] == 32
    steps[0] = 0
    with pytest.raises(ConfigError) as refused:
        beam_search(model, src, beam=4, max_len_a=0, max_len_b=40, min_len=40, need_attention=True)
    assert steps[0] == 33  # the 33rd step, refused before its cache grows
    assert str(refused.value).startswith(
        "beam=4 for 2 sentences needs at least 0.0 GiB more at step 33 (2 × 4 rows of 4256 float32 "
        "numbers: keys and values for as many more positions as the search held, in every decoder layer, and "
        "their cross-attention over 5 source positions), more than the 0.0 GiB of memory this process can "
        "take: lower the beam (decode.beam;"
    )
    monkeypatch.setattr(search, "available_memory", lambda: 70_000)  # below the first step with attention
    with pytest.raises(ConfigError, match=r"at its first step \(2 × 4 rows of 2198 float32 numbers: .* "
                       r"16 positions and their cross-attention over 5 source positions\)"):  # fmt: skip
        beam_search(model, src, beam=4, max_len_a=0, max_len_b=16, need_attention=True)
    assert len(beam_search(model, src, beam=4, max_len_a=0, max_len_b=16)) == 2  # 67,776 bytes without


class _OwnCache:
    """A cache of a model's own kind: a `KVCache` inside, no `layers` of its own."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        self.inner.reorder(rows, sentences)


class _OwnCacheModel(Transformer):
    """A model whose `new_cache` is of its own kind, which its `decode` reads."""

    def new_cache(self, beams: int = 1) -> Any:  # type: ignore[override]
        return _OwnCache(super().new_cache(beams))

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None, *, cache: Any = None,
               need_weights: bool = False) -> Any:  # fmt: skip
        inner = cache.inner if cache is not None else None
        return super().decode(tgt, memory, src_mask, cache=inner, need_weights=need_weights)


def test_a_model_with_a_cache_of_its_own_kind_is_decoded_past_the_first_memory_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`ModuleStep`'s memory check at step 16 read a `KVCache`'s layers from any cache: a model of its own
    kind whose cache has none (a subclass, as `ModuleStep` promises to decode) failed there with an
    AttributeError. Its cache is not counted; the search's outputs are the plain model's."""
    import attnlab.decoding.search as search

    monkeypatch.setattr(search, "_SURELY_FITS", 0)  # every check runs (memory: this machine's)
    torch.manual_seed(3)
    config = tiny_config(src_vocab_size=50, tgt_vocab_size=70, tie="decoder")
    own, plain = _OwnCacheModel(config).eval(), Transformer(config).eval()
    plain.load_state_dict(own.state_dict())
    src = random_source([3, 4], 50, 3)
    for beam in (1, 3):
        ours = beam_search(own, src, beam=beam, max_len_a=0, max_len_b=40, min_len=40, need_attention=True)
        theirs = beam_search(
            plain, src, beam=beam, max_len_a=0, max_len_b=40, min_len=40, need_attention=True
        )
        assert [h[0].tokens for h in ours] == [h[0].tokens for h in theirs]
        assert all(len(h[0].tokens) >= 40 for h in ours)  # past the checks at steps 16 and 32


def test_greedy_decoding_checks_its_memory_as_beam_search_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy decoding on the CPU allocated without a check: a model that never ends an output (an
    untrained one) with a long length limit over a large batch doubled its keys and values buffers until
    the out-of-memory killer ended the process. Its first step and each doubling are checked as beam
    search's are, naming greedy decoding and its fixes. The process is told it can take 40 kB
    (`available_memory` patched, as above); 2 sentences need 16,944 bytes at the first step (scores and 16
    positions), 16,384 more at step 17, 32,768 at step 33, then 65,536 at step 65: refused there."""
    import attnlab.decoding.search as search
    from helpers import count_steps

    monkeypatch.setattr(search, "_SURELY_FITS", 0)
    monkeypatch.setattr(search, "available_memory", lambda: 40_000)
    torch.manual_seed(3)
    model = Transformer(tiny_config(src_vocab_size=50, tgt_vocab_size=70, tie="decoder")).eval()
    src = random_source([3, 4], 50, 3)
    steps = count_steps(monkeypatch)
    assert greedy_decode(model, src, max_len_a=0, max_len_b=64, min_len=64).shape == (2, 64)
    assert steps[0] == 64
    steps[0] = 0
    with pytest.raises(ConfigError) as refused:
        greedy_decode(model, src, max_len_a=0, max_len_b=80, min_len=80)
    assert steps[0] == 65  # the 65th step, refused before its buffers grow
    assert str(refused.value) == (
        "greedy decoding for 2 sentences needs at least 0.0 GiB more at step 65 (2 × 1 rows of 8192 "
        "float32 numbers: keys and values for as many more positions as the search held, in every decoder "
        "layer), more than the 0.0 GiB of memory this process can take: decode fewer sentences at once "
        "(decode.batch_size, decode.max_tokens), or lower the length limit (decode.max_len_a, "
        "decode.max_len_b)"
    )
    monkeypatch.setattr(search, "available_memory", lambda: 4_000)  # below one sentence's first step
    model.encode = lambda *a: pytest.fail("encoded before the memory check")  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match=r"^greedy decoding for 1 sentence .* at its first step .*"
                       r": lower the length limit \(decode.max_len_a, decode.max_len_b\)$"):  # fmt: skip
        translate(model, src[:1], DecodeConfig(beam=1))


def test_the_memory_check_refuses_just_past_what_is_available_and_not_before() -> None:
    available = available_memory()
    if available is None:
        pytest.skip("the memory available is known on Linux only")
    fits, too_much = int(available * 0.8) // 4, int(available * 1.2) // 4  # float32 numbers
    check_beam_memory(1, fits, 1, "test rows", "fix it")
    with pytest.raises(ConfigError, match=r"beam=\d+ for 1 sentence .*: test rows\), more .*: fix it$"):
        check_beam_memory(1, too_much, 1, "test rows", "fix it")


def test_available_memory_is_the_least_of_the_kernels_the_cgroups_and_ulimits() -> None:
    if not Path("/proc/meminfo").exists():
        pytest.skip("Linux only")
    import resource

    fields = dict(line.split(":") for line in Path("/proc/meminfo").read_text().splitlines())
    reported = int(fields["MemAvailable"].split()[0]) * 1024  # in bytes, as the file's kB say
    from attnlab.decoding.search import _meminfo_available

    assert abs(_meminfo_available() - reported) < 1 << 28  # read a moment apart
    available = available_memory()
    assert available is not None and 0 < available <= reported + (1 << 28)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    size = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), hard))  # `ulimit -v`: 1 GiB more than now
    try:
        limited = available_memory()
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert limited is not None and (1 << 30) - (1 << 26) < limited <= 1 << 30


@pytest.mark.parametrize(
    ("membership", "files", "headroom"),
    [
        ("0::/job\n", {"job/memory.max": "1000000", "job/memory.current": "700000"}, 400_000),
        ("0::/job\n", {"job/memory.max": "max", "job/memory.current": "700000"}, None),
        (
            "4:memory:/box\n1:cpu:/\n0::/\n",
            {"memory/box/memory.limit_in_bytes": "1000000", "memory/box/memory.usage_in_bytes": "900000"},
            200_000,
        ),
        (
            "4:memory:/box\n0::/\n",
            {
                "memory/box/memory.limit_in_bytes": "9223372036854771712",
                "memory/box/memory.usage_in_bytes": "1",
            },
            None,
        ),
        ("1:cpu:/\n", {}, None),  # no memory controller
    ],
    ids=["v2", "v2-no-limit", "v1", "v1-no-limit", "none"],
)
def test_a_cgroups_headroom_is_its_limit_less_its_usage_but_inactive_file_cache(
    tmp_path: Path, membership: str, files: dict[str, str], headroom: int | None
) -> None:
    """A container's or a scheduler's memory limit, from a cgroup tree laid out as the kernel does
    (v2 `memory.max`/`memory.current`, v1 `memory.limit_in_bytes`/`memory.usage_in_bytes`): 100,000
    bytes of inactive file cache in `memory.stat` count as free."""
    from attnlab.decoding.search import _cgroup_headroom

    (tmp_path / "cgroup").write_text(membership)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
        key = "total_inactive_file" if "memory/" in name else "inactive_file"
        (tmp_path / "fs" / name).with_name("memory.stat").write_text(f"{key} 100000\nactive_file 5\n")
    assert _cgroup_headroom(tmp_path / "cgroup", tmp_path / "fs") == headroom


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beam": 0}, "beam=0"),
        ({"beam": 2, "n_best": 3}, "n_best=3"),
        ({"n_best": 0}, "n_best=0"),
        ({"min_len": 0}, "min_len=0"),
        ({"alpha": -0.5}, "alpha=-0.5"),
        ({"penalty": "wu"}, "length_penalty='wu'"),
    ],
)
def test_argument_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        beam_search(build(), source([3]), **kwargs)


def test_attention_per_hypothesis() -> None:
    model = build(seed=8, eos_bias=1.0)
    lengths = [3, 6]
    results = beam_search(model, source(lengths, seed=8), beam=3, n_best=2, need_attention=True)
    for hyps, n in zip(results, lengths, strict=True):
        for h in hyps:
            assert h.attention is not None
            assert h.attention.shape == (len(h.tokens), n + 1)  # real source: symbols + eos
            torch.testing.assert_close(h.attention.sum(dim=-1), torch.ones(len(h.tokens)))
    plain = beam_search(model, source(lengths, seed=8), beam=3, n_best=2)
    assert [[h.tokens for h in hs] for hs in plain] == [[h.tokens for h in hs] for hs in results]
    assert all(h.attention is None for hs in plain for h in hs)


@pytest.mark.parametrize("training", [False, True])
def test_runs_under_inference_mode_and_keeps_the_mode(training: bool) -> None:
    model = build(dropout=0.0)
    model.train(training)
    (hyps,) = beam_search(model, source([4]), beam=2, n_best=2, need_attention=True)
    assert all(h.attention is not None and not h.attention.requires_grad for h in hyps)
    assert all(h.attention.is_inference() for h in hyps if h.attention is not None)
    assert model.training is training
    assert all(m.training is training for m in model.modules())


@pytest.mark.parametrize(
    ("penalty", "alpha"), [("gnmt", 0.0), ("gnmt", 0.6), ("fairseq", 1.0), ("fairseq", 2.0)]
)
def test_stops_once_no_live_beam_can_beat_the_finished_ones(penalty: str, alpha: float) -> None:
    model = build(seed=9, at_length=True)  # every beam's eos gets +1e4 at output length |S|
    calls = []
    decode = model.decode
    model.decode = lambda *args, **kw: calls.append(1) or decode(*args, **kw)  # type: ignore[method-assign]
    results = beam_search(
        model, source([2, 4], seed=9), beam=2, n_best=2, alpha=alpha, penalty=penalty, max_len_b=10
    )
    assert len(calls) == 5  # the longest real source (4 symbols + eos), not its length cap 1.2·5 + 10
    assert [max(len(h.tokens) for h in hyps) for hyps in results] == [3, 5]  # none outlives the eos push
    assert all(h.tokens[-1] == EOS for hyps in results for h in hyps)


@pytest.mark.parametrize("seed", [0, 3])
def test_uncached_decoding_equals_cached_decoding(seed: int) -> None:
    model = build(seed=seed, eos_bias=0.5)
    src = source([2, 7, 4], seed=seed)
    cached = beam_search(model, src, beam=4, n_best=3, need_attention=True)
    uncached = beam_search(model, src, beam=4, n_best=3, need_attention=True, use_cache=False)
    for hyps, others in zip(cached, uncached, strict=True):
        assert [h.tokens for h in hyps] == [h.tokens for h in others]
        for h, other in zip(hyps, others, strict=True):
            assert h.score == pytest.approx(other.score, abs=1e-4)
            torch.testing.assert_close(h.attention, other.attention, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(greedy_decode(model, src), greedy_decode(model, src, use_cache=False))


def test_uncached_decoding_equals_cached_decoding_as_sentences_leave_one_by_one() -> None:
    """eos at each source's length: the three sentences finish at steps 3, 5 and 8, and the uncached
    decoder's per-beam memory rows must follow the ones that stay."""
    model = build(seed=1, at_length=True)
    src = source([2, 7, 4], seed=1)
    cached = beam_search(model, src, beam=3, n_best=3, need_token_scores=True)
    uncached = beam_search(model, src, beam=3, n_best=3, need_token_scores=True, use_cache=False)
    assert [len(hyps[0].tokens) for hyps in cached] == [3, 8, 5]
    for hyps, others in zip(cached, uncached, strict=True):
        assert [h.tokens for h in hyps] == [h.tokens for h in others]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in others], abs=1e-4)
    steered = build(seed=1, eos_bias=-1e4)  # no eos: every sentence runs to its own length limit
    assert torch.equal(greedy_decode(steered, src), greedy_decode(steered, src, use_cache=False))


def test_a_sentence_is_done_once_no_live_beam_can_beat_its_n_best() -> None:
    """`_Kept.is_done` with hand-made hypotheses: done once the `needed`-th best finished hypothesis
    outranks the best a live beam can still reach (its score now; with α > 0 over lp(max_len)), however
    many of the K are finished; never with fewer than `needed`."""
    from attnlab.decoding.search import _Kept

    kept = _Kept(beam=4, alpha=0.0, penalty="gnmt", needed=2)
    kept.add([5, EOS], -1.0, None, [])
    assert not kept.is_done(-100.0, 10)  # one of the two needed
    for score in (-5.0, -2.0):
        kept.add([5, 6, EOS], score, None, [])
    assert [h.normalized for h in kept.hyps] == [-1.0, -2.0, -5.0]
    assert kept.is_done(-3.0, 10)  # three of K=4 finished, but the best two are final
    assert not kept.is_done(-2.0, 10) and not kept.is_done(-1.5, 10)
    fairseq = _Kept(beam=4, alpha=1.0, penalty="fairseq", needed=2)
    for score in (-2.0, -4.0):
        fairseq.add([5, EOS], score, None, [])  # normalized -1 and -2 (score / length)
    assert not fairseq.is_done(-7.0, 4)  # a live beam could still reach -7 / 4 = -1.75 > -2
    assert fairseq.is_done(-8.0, 4) and fairseq.is_done(-9.0, 4)  # -2 (a tie ranks after) and -2.25


@pytest.mark.parametrize("n_best", [1, 2, 3])
@pytest.mark.parametrize(
    ("penalty", "alpha"), [("gnmt", 0.0), ("gnmt", 0.6), ("gnmt", 2.0), ("fairseq", 1.0), ("fairseq", 2.0)]
)
def test_the_early_stop_never_changes_the_outputs(
    penalty: str, alpha: float, n_best: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_Kept.is_done`'s bound is safe for both penalties and any n_best: stopping a sentence once its
    n_best best finished hypotheses cannot be beaten gives the n-best a search to its length limit gives
    (the same tokens; the scores up to float rounding, since sentences leave the batch at other steps)."""
    from attnlab.decoding import search

    cases = [(build(seed=seed, eos_bias=bias), source([3, 6, 2], seed=seed)) for seed in (0, 4)
             for bias in (-1.0, 1.5)]  # fmt: skip

    def run() -> list[list[Hypothesis]]:
        found = [beam_search(m, s, beam=3, n_best=n_best, alpha=alpha, penalty=penalty) for m, s in cases]
        return [hs for r in found for hs in r]

    early = run()
    monkeypatch.setattr(search._Kept, "is_done", lambda self, best, max_len: False)
    full = run()
    assert [[h.tokens for h in hs] for hs in early] == [[h.tokens for h in hs] for hs in full]
    assert [h.score for hs in early for h in hs] == pytest.approx([h.score for hs in full for h in hs])


@pytest.mark.parametrize(("penalty", "alpha"), [("gnmt", 0.0), ("gnmt", 0.6), ("fairseq", 1.0)])
def test_fewer_hypotheses_than_beams_stop_sooner_with_the_same_best(penalty: str, alpha: float) -> None:
    """With n_best < K a sentence ends once its n_best best finished hypotheses are final, not once K
    are finished: the search takes fewer decoder steps and returns the hypotheses a search for all K
    (n_best=K) ranks first."""
    cases = [(build(seed=seed, eos_bias=bias), source([3, 6, 2, 5], seed=seed)) for seed in (0, 4)
             for bias in (0.5, 1.5)]  # fmt: skip
    steps = {1: 0, 4: 0}
    for model, src in cases:
        found = {}
        for n_best in (1, 4):
            decode = model.decode

            def counted(*args: Any, _decode=decode, _n=n_best, **kw: Any) -> Any:
                steps[_n] += 1
                return _decode(*args, **kw)

            model.decode = counted  # an instance attribute: the searches call model.decode
            found[n_best] = beam_search(model, src, beam=4, n_best=n_best, alpha=alpha, penalty=penalty)
            del model.decode
        for few, every in zip(found[1], found[4], strict=True):
            assert [h.tokens for h in few] == [h.tokens for h in every[:1]]
            assert few[0].score == pytest.approx(every[0].score)
    assert steps[1] < steps[4]


def test_an_ensemble_of_models_of_different_sizes_decodes_the_same_with_and_without_the_cache() -> None:
    """Members of other widths, depths and position kinds each read their own part of the joint memory
    and their own slice of the one cache: the cached search equals the one re-running every prefix, and
    the combined step is the log of the members' mean probability."""
    from attnlab.decoding.ensemble import Ensemble

    torch.manual_seed(0)
    other = tiny_config(d_model=48, n_decoder_layers=3, pe="learned", max_positions=64)
    members = [Transformer(tiny_config()).eval(), Transformer(other).eval()]
    ensemble = Ensemble(members)
    src = random_source([5, 3, 7], seed=3)
    for beam in (1, 3):
        cached = translate(ensemble, src, DecodeConfig(beam=beam, max_len_b=8))
        assert cached == translate(ensemble, src, DecodeConfig(beam=beam, max_len_b=8), use_cache=False)
        assert any(cached)  # (a random model may end a sentence at once)
    with torch.inference_mode():
        memory, mask = ensemble.encode(src)
        start = torch.full((3, 1), members[0].config.start_id)
        combined = ensemble.decode(start, memory, mask)[:, -1]
        each = [m.decode(start, *m.encode(src))[:, -1].log_softmax(-1) for m in members]
        expected = (each[0].exp() + each[1].exp()).div(2).log()
    torch.testing.assert_close(combined, expected, atol=1e-5, rtol=1e-5)


def test_an_ensembles_attention_map_is_its_members_last_layer_maps_averaged_over_heads_and_models() -> None:
    """What alignments are read from (`decode.print_alignment`): one map (B, 1, T, S) per step."""
    from attnlab.decoding.ensemble import Ensemble

    torch.manual_seed(0)
    members = [Transformer(tiny_config()).eval(), Transformer(tiny_config(n_decoder_layers=3)).eval()]
    ensemble = Ensemble(members)
    src = random_source([5, 3, 7], seed=3)
    tgt = torch.tensor([[1, 7, 9], [1, 4, 4], [1, 8, 5]])
    with torch.inference_mode():
        _, maps = ensemble.decode(tgt, *ensemble.encode(src), need_weights=True)
        each = [m.decode(tgt, *m.encode(src), need_weights=True)[1][-1] for m in members]  # (B, H, T, S)
    assert len(maps) == 1 and maps[0].shape == (3, 1, 3, src.size(1))
    torch.testing.assert_close(maps[0], (each[0].mean(1, keepdim=True) + each[1].mean(1, keepdim=True)) / 2)


@pytest.mark.parametrize("beam", [1, 3])
def test_an_ensemble_decodes_within_the_smallest_position_limit_of_its_members(beam: int) -> None:
    """Members with learned position tables of 16 and 8 beside an unlimited one (sinusoidal, first): the
    outputs are cut at 8 (one decoder input position per token), where the small table would raise."""
    from attnlab.decoding.ensemble import Ensemble

    torch.manual_seed(0)
    limits = [tiny_config(pe="learned", max_positions=n) for n in (16, 8)]
    ensemble = Ensemble([Transformer(config).eval() for config in (tiny_config(), *limits)])
    src = random_source([5, 3], seed=1)
    settings = DecodeConfig(beam=beam, max_len_a=1.0, max_len_b=100, min_len=50)
    assert [len(row) for row in translate(ensemble, src, settings)] == [8, 8]


def test_an_ensemble_needs_a_model_and_every_member_sharing_the_vocabularies() -> None:
    from attnlab.decoding.ensemble import Ensemble

    with pytest.raises(ValueError, match="an ensemble needs at least one model"):
        Ensemble([])
    same, other = Transformer(tiny_config()), Transformer(tiny_config(src_vocab_size=60, tgt_vocab_size=60))
    for members, which in (([same, other, same], 1), ([same, same, other], 2)):
        with pytest.raises(
            ValueError, match=f"model {which} of the ensemble has tgt_vocab_size=60 but model 0"
        ):
            Ensemble(members)


class _KeepsItsLogits(Transformer):
    """A model whose `decode` keeps what it returns, with a copy taken at the time (searches run its
    `decode` through the modules, not the CPU step)."""

    def decode(self, *args: Any, **kwargs: Any) -> Any:
        out = super().decode(*args, **kwargs)
        logits = out[0] if isinstance(out, tuple) else out
        self.returned.append((logits, logits.clone()))
        return out


@pytest.mark.parametrize("need_token_scores", [False, True])
def test_beam_search_writes_only_into_logits_of_its_own_step(need_token_scores: bool) -> None:
    """The CPU step's logits become the log-probs and candidate scores in place; a model's own logits
    are left as it returned them, and both give the same search."""
    torch.manual_seed(0)
    model = _KeepsItsLogits(tiny_config()).eval()
    model.returned = []
    src = random_source([5, 3, 4])
    plain = Transformer(tiny_config()).eval()
    plain.load_state_dict(model.state_dict())
    options = {"beam": 3, "need_token_scores": need_token_scores}
    with torch.inference_mode():
        kept = beam_search(model, src, **options)
        stepped = beam_search(plain, src, **options)  # the CPU step
    assert model.returned and all(torch.equal(logits, copy) for logits, copy in model.returned)
    for ours, theirs in zip(kept, stepped, strict=True):
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-5)


def _candidate_scores(rows: int, width: int, seed: int) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=generator).mul_(3).log_softmax(dim=1)  # distinct values


@pytest.mark.parametrize(
    ("case", "rows", "width"),
    [("random", 64, 25_000), ("random", 1, 5 * 5003), ("one chunk", 8, 12_800), ("tail", 8, 12_837),
     ("few finite", 4, 9_000), ("narrow", 16, 600)],
)  # fmt: skip
def test_top_candidates_are_topks_best_scores_and_columns(case: str, rows: int, width: int) -> None:
    """Beam search's candidate selection: the same values and columns as `topk` (the scores have no exact
    ties), with the row's best scores all in one chunk, in the columns past the last whole chunk, behind
    -inf everywhere else, and in rows too narrow for chunks."""
    from attnlab.decoding.search import _CHUNK, top_candidates

    scores = _candidate_scores(rows, width, seed=width)
    if case == "one chunk":  # every row's 10 best in the 5th chunk
        scores[:, 5 * _CHUNK : 5 * _CHUNK + 10] += 100
    if case == "tail":  # the best scores past the last whole chunk (width not a multiple of the chunk)
        assert width % _CHUNK
        scores[:, -(width % _CHUNK) :] += 100
    if case == "few finite":  # 3 finite scores a row, fewer than the 10 asked for
        finite = scores[:, [7, 4_000, 8_999]]
        scores.fill_(-math.inf)
        scores[:, [7, 4_000, 8_999]] = finite
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[int] = []  # the width of every row topk ranks

    class Widths(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func is torch.ops.aten.topk.default:
                seen.append(args[0].size(-1))
            return func(*args, **(kwargs or {}))

    with Widths():
        values, columns = top_candidates(scores, 10)
    # wide rows: topk over the chunks' maxima and the candidates in the best chunks, never the whole row
    assert max(seen) == (width if case == "narrow" else 10 * _CHUNK + width % _CHUNK)
    expected = scores.topk(10, dim=1)
    assert torch.equal(values, expected.values)
    finite = values > -math.inf  # (which of several -inf columns comes first is topk's own order)
    assert torch.equal(columns[finite], expected.indices[finite])
    assert torch.equal(scores.gather(1, columns), values)
