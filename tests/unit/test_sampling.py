"""Sampling (`decode.sampling`): seeded, per-sentence reproducible draws, top-k, nucleus, temperature."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from attnlab.decoding import DecodeConfig
from attnlab.decoding.search import Sampling, greedy_decode, translate
from attnlab.model.transformer import Transformer
from helpers import random_source, tiny_config

VOCAB = 40


def model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_config(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)).eval()


def sources(seed: int = 0) -> torch.Tensor:
    return random_source([3, 7, 5, 2, 6, 4], VOCAB, seed)


def sampled(m: Transformer, src: torch.Tensor, **kw: Any) -> list[list[int]]:
    return translate(m, src, DecodeConfig(beam=1, sampling=True, max_len_a=1.0, max_len_b=6, **kw))


def test_a_seed_reproduces_the_samples_and_other_seeds_differ() -> None:
    m, src = model(), sources()
    first = sampled(m, src, seed=3)
    assert sampled(m, src, seed=3) == first
    assert sampled(m, src, seed=4) != first
    assert sampled(m, src, seed=3) != translate(m, src, DecodeConfig(beam=1, max_len_a=1.0, max_len_b=6))
    assert sampled(m, src) == sampled(m, src, seed=0) != sampled(m, src, seed=1)  # the default seed is 0


def test_a_sentence_samples_the_same_alone_as_inside_a_batch_in_any_order() -> None:
    m, src = model(1), sources(1)
    together = sampled(m, src, seed=7, temperature=1.5)
    lengths = (src != m.config.pad_id).sum(dim=1).tolist()
    for i, n in enumerate(lengths):
        assert sampled(m, src[i : i + 1, :n], seed=7, temperature=1.5) == [together[i]]
    reverse = torch.arange(src.size(0) - 1, -1, -1)
    assert sampled(m, src[reverse], seed=7, temperature=1.5) == [together[i] for i in reverse.tolist()]


@pytest.mark.parametrize(
    "settings",
    [{"topk": 1}, {"topp": 1e-6}, {"temperature": 1e-4}, {"temperature": 1e-308}],  # 1e-308: no overflow
    ids=["topk=1", "topp=1e-6", "temperature=1e-4", "temperature=1e-308"],
)
def test_degenerate_sampling_is_greedy(settings: dict[str, Any]) -> None:
    for seed in (0, 2):
        m, src = model(seed), sources(seed)
        greedy = greedy_decode(m, src, max_len_a=1.0, max_len_b=6)
        drawn = greedy_decode(m, src, max_len_a=1.0, max_len_b=6, sample=Sampling(**settings, seed=seed))
        assert torch.equal(drawn, greedy)
        assert not torch.equal(greedy_decode(m, src, max_len_a=1.0, max_len_b=6, sample=Sampling(seed=seed)),
                               greedy)  # fmt: skip


def frequencies(sampling: Sampling, probs: list[float], draws: int = 4000) -> list[float]:
    scores = torch.tensor(probs).log()[None].expand(draws, -1)
    generators = [torch.Generator().manual_seed(i) for i in range(draws)]
    tokens = sampling.pick(scores, generators).squeeze(1)
    return (torch.bincount(tokens, minlength=len(probs)).float() / draws).tolist()


def test_pick_draws_from_the_filtered_distribution() -> None:
    """p = (.5, .3, .15, .05): all tokens at temperature 1; top-2 renormalises (.5, .3); the nucleus
    of .7 keeps the tokens whose preceding mass is < .7 (the first two), of .5 the first alone;
    temperature 2 flattens (p^(1/2), renormalised)."""
    probs = [0.5, 0.3, 0.15, 0.05]
    assert frequencies(Sampling(), probs) == pytest.approx(probs, abs=0.03)
    assert frequencies(Sampling(topk=2), probs) == pytest.approx([0.625, 0.375, 0, 0], abs=0.03)
    assert frequencies(Sampling(topp=0.7), probs) == pytest.approx([0.625, 0.375, 0, 0], abs=0.03)
    assert frequencies(Sampling(topp=0.5), probs) == [1.0, 0, 0, 0]
    flat = [math.sqrt(p) for p in probs]
    assert frequencies(Sampling(temperature=2.0), probs) == pytest.approx(
        [p / sum(flat) for p in flat], abs=0.03
    )
    masked = frequencies(Sampling(), [0.5, 0.0, 0.5, 0.0])  # -inf scores (never generated) are never drawn
    assert masked[1] == masked[3] == 0


def test_a_nucleus_whose_mass_is_exactly_p_keeps_no_further_token() -> None:
    """Four equally probable tokens (1/4 each, exact in binary): the nucleus of p = 0.5 is the first two
    (ties ranked in id order), whose probabilities sum to p; the third, whose preceding mass is exactly p,
    is not in it."""
    assert frequencies(Sampling(topp=0.5), [0.25] * 4) == pytest.approx([0.5, 0.5, 0, 0], abs=0.03)


def test_samples_never_hold_pad_or_bos_nor_eos_before_min_len() -> None:
    m, src = model(3), sources(3)
    cfg = m.config
    for seed in range(3):
        out = greedy_decode(m, src, max_len_a=1.0, max_len_b=6, min_len=3,
                            sample=Sampling(temperature=3.0, seed=seed))  # fmt: skip
        for row in out.tolist():
            assert cfg.bos_id not in row and cfg.start_id not in row
            ends = row.index(cfg.eos_id) + 1 if cfg.eos_id in row else len(row)  # (no eos: its length limit)
            while cfg.eos_id not in row and ends > 0 and row[ends - 1] == cfg.pad_id:
                ends -= 1
            body = row[:ends]
            assert cfg.pad_id not in body and len(body) >= 3
            assert all(t == cfg.pad_id for t in row[ends:])  # padded after eos


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"sampling": True}, "beam=5 but sampling=true draws one output per sentence: set decode.beam=1"),
        ({"sampling": True, "beam": 1, "val_beam": 2}, "val_beam=2 but sampling=true"),
        ({"sampling": True, "beam": 1, "topk": -1}, "topk=-1 must be >= 0"),
        ({"sampling": True, "beam": 1, "topp": 0.0}, r"topp=0.0 must be in \(0, 1\]"),
        ({"sampling": True, "beam": 1, "topp": 1.5}, r"topp=1.5 must be in \(0, 1\]"),
        ({"sampling": True, "beam": 1, "temperature": 0.0}, "temperature=0.0 must be > 0"),
        ({"sampling": True, "beam": 1, "temperature": math.inf}, "temperature=inf must be > 0 and finite"),
        ({"sampling": True, "beam": 1, "temperature": math.nan}, "temperature=nan must be > 0 and finite"),
        ({"alpha": math.inf}, "alpha=inf must be >= 0 and finite"),
        ({"alpha": math.nan}, "alpha=nan must be >= 0 and finite"),
        ({"topk": 5}, "topk=5 is a sampling setting: set decode.sampling=true"),
        ({"temperature": 0.5}, "temperature=0.5 is a sampling setting"),
        ({"topp": 0.9}, "topp=0.9 is a sampling setting: set decode.sampling=true"),
        ({"sampling": "yes", "beam": 1}, "sampling='yes' is not valid: expected bool"),
    ],
)
def test_invalid_sampling_settings_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DecodeConfig(**settings)


def test_an_infinite_temperature_is_refused_by_sampling_itself() -> None:
    """logits / inf turns the -inf of never-generated ids into nan: every draw would be pad."""
    with pytest.raises(ValueError, match="temperature=inf > 0 and finite"):
        Sampling(temperature=math.inf)


def test_sampling_does_not_combine_with_a_beam_given_to_translate() -> None:
    with pytest.raises(ValueError, match=r"beam=3 but decode\.sampling=true draws one output per sentence"):
        translate(model(), sources(), DecodeConfig(beam=1, sampling=True), beam=3)
