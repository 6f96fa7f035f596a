"""The CPU decoding step (`attnlab.decoding.step.StepDecoder`) computes `Transformer.decode` over a
`KVCache`: the same logits step by step, through reordered beams, dropped sentences and grown buffers,
for every architecture choice it reads; the searches use it where it applies and nowhere else."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnlab.decoding.search import beam_search, greedy_decode
from attnlab.decoding.step import StepDecoder
from attnlab.model.transformer import Transformer
from helpers import count_steps, random_source, tiny_config

VARIANTS = [
    {},
    {"norm_first": True, "pe": "learned", "tie": "none"},
    {"activation": "gelu", "output_bias": True, "d_head": 12, "scale_embeddings": False},
    {"activation": "silu", "pe": "none", "n_decoder_layers": 3, "layer_norm_eps": 0.1},
]


def build(seed: int = 0, **overrides: Any) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_config(**overrides)).eval()


@torch.inference_mode()
def both_paths(model: Transformer, src: torch.Tensor, beams: int, capacity: int, padded: bool) -> None:
    """Decode 6 steps of random tokens both ways, reordering rows after step 2 (beams follow parents,
    one repeated) and dropping the first sentence after step 4; every step's logits must agree."""
    memory, src_mask = model.encode(src)
    src_mask = src_mask if padded else None
    batch = src.size(0)
    steps = StepDecoder(model, memory, src_mask, beams=beams, capacity=capacity)
    cache = model.new_cache(beams=beams)
    gen = torch.Generator().manual_seed(1)
    rows = batch * beams
    for step in range(6):
        tokens = torch.randint(3, model.config.tgt_vocab_size, (rows, 1), generator=gen)
        want = model.decode(tokens, memory, src_mask, cache=cache)  # (N, 1, V)
        got = steps(tokens)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"step {step}")
        if step == 2:  # beams follow parents within their sentence, one parent twice
            parents = torch.arange(rows).view(-1, beams)
            parents[:, -1] = parents[:, 0]
            flat = parents.flip(1).reshape(-1)
            cache.reorder(flat)
            steps.reorder(flat)
        if step == 4 and memory.size(0) > 1:  # the first sentence leaves
            sentences = torch.arange(1, memory.size(0))
            flat = (sentences[:, None] * beams + torch.arange(beams)).view(-1)
            cache.reorder(flat, sentences)
            steps.reorder(flat, sentences)
            memory = memory[sentences]
            src_mask = None if src_mask is None else src_mask[sentences]
            rows = flat.numel()
    assert steps.length == cache.length == 6


@pytest.mark.parametrize("overrides", VARIANTS, ids=str)
@pytest.mark.parametrize("beams", [1, 3])
def test_step_logits_equal_the_modules(overrides: dict[str, Any], beams: int) -> None:
    model = build(**overrides)
    both_paths(model, random_source([7, 3, 5]), beams, capacity=8, padded=True)


@pytest.mark.parametrize("batch", [1, 20])  # 1 row (x @ W), 20 rows and 60 rows of beams: each layout
def test_without_padding_and_with_grown_buffers(batch: int) -> None:
    model = build()
    src = random_source([6] * batch)
    both_paths(model, src, beams=1, capacity=2, padded=False)  # 6 steps in buffers of 2: grown twice
    both_paths(model, src, beams=3, capacity=1, padded=False)


def test_a_padded_source_position_gets_no_attention() -> None:
    model = build()
    src = random_source([5, 2])
    with torch.inference_mode():
        memory, mask = model.encode(src)
        base = StepDecoder(model, memory, mask)(torch.tensor([[1], [1]]))
        memory[1, 4] += 100.0  # a pad position of sentence 1 (its length is 2 + eos)
        changed = StepDecoder(model, memory, mask)(torch.tensor([[1], [1]]))
        memory[0, 4] += 100.0  # a real position of sentence 0
        moved = StepDecoder(model, memory, mask)(torch.tensor([[1], [1]]))
    torch.testing.assert_close(changed, base)
    assert not torch.allclose(moved[0], base[0])


class Shifted(Transformer):
    """A subclass whose decode differs from Transformer.decode: searches must go through it."""

    def decode(self, *args: Any, **kwargs: Any):
        return super().decode(*args, **kwargs) + 0.0


class Wrapped(torch.nn.Module):
    """A wrapper forwarding attribute reads to the model, as `torch.compile`'s module does: its class has
    no `decode`. Searches decode it through the wrapped model's `decode`, on the module path."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.model, name)


def test_applies_only_to_cpu_inference_of_the_plain_decode() -> None:
    model = build()
    memory = torch.zeros(1, 2, model.config.d_model)
    with torch.inference_mode():
        assert StepDecoder.applies(model, memory)
        assert not StepDecoder.applies(model, memory, need_weights=True)
        assert not StepDecoder.applies(model.train(), memory)
        model.eval()
        model.encoder.train()  # the step does not run the encoder
        assert StepDecoder.applies(model, memory)
        model.eval()
        torch.manual_seed(0)
        assert not StepDecoder.applies(Shifted(tiny_config()).eval(), memory)
        assert not StepDecoder.applies(Wrapped(model).eval(), memory)
    with torch.no_grad():
        assert StepDecoder.applies(model, memory)
    assert not StepDecoder.applies(model, memory)  # autograd on


def test_a_decoder_layer_in_training_mode_keeps_its_dropout_on_the_module_path() -> None:
    """The model in eval mode, one decoder layer in training mode: its dropout runs (two seeds, two
    results), which the step does not have, so the searches take the modules."""
    model = build(dropout=0.3).eval()
    model.decoder.layers[-1].train()
    src = random_source([5, 3], seed=1)
    with torch.inference_mode():
        memory, mask = model.encode(src)
        assert not StepDecoder.applies(model, memory)
        prefix = torch.tensor([[1, 7], [1, 9]])
        torch.manual_seed(1)
        first = model.decode(prefix, memory, mask)
        torch.manual_seed(2)
        assert not torch.equal(first, model.decode(prefix, memory, mask))
        model.decoder.layers[-1].eval()
        assert StepDecoder.applies(model, memory)


class OldStyle(Transformer):
    """A model of its own kind as greedy search has always called it: `decode` without `need_weights`,
    `new_cache` without `beams` (beam search passes both)."""

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: Any, *, cache: Any = None) -> Any:
        return super().decode(tgt, memory, src_mask, cache=cache)

    def new_cache(self) -> Any:  # type: ignore[override]
        return super().new_cache()


def test_the_module_path_calls_a_model_as_before() -> None:
    torch.manual_seed(0)
    model = OldStyle(tiny_config()).eval()
    plain = Transformer(tiny_config()).eval()
    plain.load_state_dict(model.state_dict())
    src = random_source([6, 2, 4], seed=2)
    with torch.inference_mode():
        got = greedy_decode(model, src, max_len_a=1.0, max_len_b=4)
        assert torch.equal(got, greedy_decode(plain, src, max_len_a=1.0, max_len_b=4, use_cache=False))


def test_searches_decode_through_it_and_match_the_module_path(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build(seed=3)
    src = random_source([7, 3, 5, 1], seed=4)
    calls = count_steps(monkeypatch)
    greedy = greedy_decode(model, src, max_len_a=1.0, max_len_b=4)
    beams = beam_search(model, src, beam=3, alpha=0.6, max_len_a=1.0, max_len_b=4, n_best=3)
    assert calls[0] > 0
    searched = calls[0]
    beam_search(model, src, beam=3, need_attention=True)  # the modules give the weights
    greedy_decode(model, src, use_cache=False)
    greedy_decode(model.train(), src)  # dropout lives in the modules
    model.eval()
    assert calls[0] == searched
    monkeypatch.setattr(StepDecoder, "applies", staticmethod(lambda *args, **kwargs: False))
    assert torch.equal(greedy_decode(model, src, max_len_a=1.0, max_len_b=4), greedy)
    by_modules = beam_search(model, src, beam=3, alpha=0.6, max_len_a=1.0, max_len_b=4, n_best=3)
    for ours, theirs in zip(beams, by_modules, strict=True):
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-4)


@pytest.mark.parametrize(
    ("vocab", "limits", "first_rows", "second_rows"),
    [
        (None, {}, 3, 12),
        (7, {}, 12, 12),  # 7 ids < 2K = 8 candidates: K rows from the start
        (8, {"min_len": 2}, 3, 12),  # exactly 2K ids, eos barred: candidates at -inf kept too
        (None, {"max_len_a": 0.5, "max_len_b": -1}, 3, 4),  # two sentences end at step 0 (limit 1)
    ],
)
def test_beam_search_decodes_its_first_step_on_one_row_per_sentence(
    vocab: int | None,
    limits: dict[str, Any],
    first_rows: int,
    second_rows: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At step 0 only a sentence's first beam is live: the step decodes that row alone and the first
    reorder makes the K beams (`StepDecoder.narrow_start`), with the outputs and scores of the modules,
    which decode all K rows, n-best lists and token scores included; also where a sentence ends at step
    0. A vocabulary smaller than the 2K candidates a step keeps decodes all K rows from the start."""
    model = build(seed=5) if vocab is None else build(seed=5, src_vocab_size=vocab, tgt_vocab_size=vocab)
    src = random_source([6, 2, 4], vocab=model.config.src_vocab_size, seed=6)
    rows: list[int] = []
    call = StepDecoder.__call__

    def counted(self: StepDecoder, tokens: torch.Tensor) -> torch.Tensor:
        rows.append(tokens.size(0))
        return call(self, tokens)

    monkeypatch.setattr(StepDecoder, "__call__", counted)
    settings = {
        "beam": 4,
        "alpha": 0.6,
        "max_len_a": 1.0,
        "max_len_b": 5,
        "n_best": 4,
        "need_token_scores": True,
    }
    settings.update(limits)
    ours = beam_search(model, src, **settings)
    assert rows[:2] == [first_rows, second_rows]  # one row per sentence (or K), then K per live sentence
    monkeypatch.setattr(StepDecoder, "applies", staticmethod(lambda *args, **kwargs: False))
    theirs = beam_search(model, src, **settings)
    for a, b in zip(ours, theirs, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
        assert [h.token_scores for h in a] == [pytest.approx(h.token_scores, abs=1e-4) for h in b]


def test_only_a_first_step_takes_one_row_per_sentence() -> None:
    """Fewer rows than sentences × beams anywhere else is an error naming the counts, not logits read
    from other sentences' rows."""
    model = build(seed=2)
    with torch.inference_mode():
        memory, _ = model.encode(random_source([3, 4], seed=1))
        step = StepDecoder(model, memory, None, beams=3)
        step(torch.full((6, 1), 5))
        with pytest.raises(ValueError, match=r"2 decoder rows at step 1 for 2 sentences × 3 beams: give 6"):
            step(torch.full((2, 1), 5))
        with pytest.raises(ValueError, match=r"4 decoder rows at step 0 for 2 sentences × 3 beams"):
            StepDecoder(model, memory, None, beams=3)(torch.full((4, 1), 5))


def test_a_learned_position_table_is_decoded_to_its_last_position(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs forced to the table's 20 positions: the buffers grow past 16 and the positions stop at 20."""
    model = build(pe="learned", max_positions=20)
    src = random_source([5, 3])
    greedy = greedy_decode(model, src, max_len_b=100, min_len=100)
    beams = beam_search(model, src, beam=2, max_len_b=100, min_len=100)
    assert greedy.size(1) == 20 and all(len(hyps[0].tokens) == 20 for hyps in beams)
    monkeypatch.setattr(StepDecoder, "applies", staticmethod(lambda *args, **kwargs: False))
    assert torch.equal(greedy_decode(model, src, max_len_b=100, min_len=100), greedy)
    by_modules = beam_search(model, src, beam=2, max_len_b=100, min_len=100)
    assert [h[0].tokens for h in beams] == [h[0].tokens for h in by_modules]


def test_a_source_of_padding_only_gets_the_modules_finite_logits() -> None:
    model = build()
    src = random_source([4, 2])
    src[1] = 0  # no real token, not even eos
    with torch.inference_mode():
        memory, mask = model.encode(src)
        tokens = torch.tensor([[1], [1]])
        got = StepDecoder(model, memory, mask)(tokens)
        want = model.decode(tokens, memory, mask, cache=model.new_cache())
    assert got.isfinite().all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_sampling_draws_the_same_tokens_through_either_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnlab.decoding.search import Sampling

    model = build(seed=5)
    src = random_source([6, 4, 2], seed=6)
    sample = Sampling(topk=5, topp=0.9, temperature=1.5, seed=7)
    drawn = greedy_decode(model, src, sample=sample)
    monkeypatch.setattr(StepDecoder, "applies", staticmethod(lambda *args, **kwargs: False))
    assert torch.equal(greedy_decode(model, src, sample=sample), drawn)


def test_a_source_of_padding_only_in_a_large_batch_decodes_without_harming_the_others() -> None:
    """40 sentences (the modules' explicit attention path from 32 rows on) with one of padding only:
    finite encoder output, and the other sentences decode as they do without it."""
    from attnlab.decoding import DecodeConfig
    from attnlab.decoding.search import translate

    model = build()
    src = random_source([5, 3, 4, 2] * 10)
    src[1] = 0
    with torch.inference_mode():
        assert model.encode(src)[0].isfinite().all()
    for beam in (1, 2):
        settings = DecodeConfig(beam=beam, max_len_b=6)
        rows = translate(model, src, settings)
        others = translate(model, torch.cat([src[:1], src[2:]]), settings)
        assert rows[:1] + rows[2:] == others


def test_a_decoder_with_hooks_or_computed_weights_is_decoded_through_its_modules() -> None:
    """The step reads weights and calls no module: after pruning the output layer (a forward pre-hook
    recomputes its weight) a model decoded before decoded with its unpruned weight. Such models, and
    those with any forward hook or a parametrization, decode through their modules, which run them."""
    from torch.nn.utils import parametrize, prune

    src = random_source([7, 4, 9], seed=3)
    warm, cold = build(), build()
    with torch.inference_mode():
        assert StepDecoder.applies(warm, warm.encode(src)[0])
        greedy_decode(warm, src)
    for model in (warm, cold):
        prune.l1_unstructured(model.output, "weight", amount=0.7)
    with torch.inference_mode():
        assert not StepDecoder.applies(warm, warm.encode(src)[0])
        assert torch.equal(greedy_decode(warm, src), greedy_decode(cold, src))
        assert torch.equal(greedy_decode(warm, src), greedy_decode(cold, src, use_cache=False))
    seen = []
    hooked = build()
    handle = hooked.decoder.layers[0].register_forward_hook(lambda *args: seen.append(1))
    with torch.inference_mode():
        assert not StepDecoder.applies(hooked, hooked.encode(src)[0])
        greedy_decode(hooked, src)
    assert seen  # the user's hook ran
    handle.remove()
    parametrize.register_parametrization(hooked.decoder.layers[1].ffn.w_1, "weight", torch.nn.Identity())
    with torch.inference_mode():
        assert not StepDecoder.applies(hooked, hooked.encode(src)[0])


def test_a_linear_layer_of_a_users_class_is_decoded_through_its_modules() -> None:
    """A LoRA-style subclass adds to its product in `forward`, which the step, reading `weight`, would
    skip: a decoder holding modules of classes from outside attnlab and torch.nn keeps its modules."""
    from attnlab.model.linear import Linear

    class WithDelta(Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) + 0.5

    model, src = build(), random_source([7, 4, 9], seed=3)
    old = model.decoder.layers[0].ffn.w_1
    model.decoder.layers[0].ffn.w_1 = WithDelta(old.in_features, old.out_features)
    model.decoder.layers[0].ffn.w_1.load_state_dict(old.state_dict())
    with torch.inference_mode():
        assert not StepDecoder.applies(model, model.encode(src)[0])
        assert torch.equal(greedy_decode(model, src), greedy_decode(model, src, use_cache=False))
