"""The encoder-decoder Transformer: shapes, causality, padding, cached decoding, tying, parameter count."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from attnlab.model.config import TransformerConfig
from attnlab.model.dropout import keep_mask
from attnlab.model.layers import FeedForward
from attnlab.model.transformer import Transformer
from helpers import tiny_config

V, D, H, PAD = 50, 32, 4, 0


def build(seed: int = 0, **overrides: Any) -> Transformer:
    """A tiny model in eval mode."""
    torch.manual_seed(seed)
    return Transformer(tiny_config(**overrides)).eval()


def ids(batch: int, length: int, seed: int = 0, vocab: int = V) -> Tensor:
    """Random token ids that avoid pad/bos/eos (3..vocab-1)."""
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def pad_to(rows: list[Tensor], length: int) -> Tensor:
    """Stack 1-D id tensors right-padded with PAD to `length`."""
    return torch.stack([torch.cat([row, torch.full((length - row.numel(),), PAD)]) for row in rows])


def padded_source() -> Tensor:
    """(3, 7) source batch with real lengths 7, 4, 2."""
    return pad_to([ids(1, n, seed=10 + n)[0] for n in (7, 4, 2)], 7)


# ---------------------------------------------------------------------------------------------------------
# Shapes


def test_forward_and_encode_shapes() -> None:
    model = build(tie="decoder", tgt_vocab_size=60)
    src, tgt = padded_source(), ids(3, 5, seed=1, vocab=60)
    with torch.no_grad():
        logits = model(src, tgt)
        memory, src_mask = model.encode(src)
    assert logits.shape == (3, 5, 60)
    assert memory.shape == (3, 7, D)
    assert src_mask.shape == (3, 7)
    assert src_mask.dtype == torch.bool
    assert torch.equal(src_mask, src != PAD)
    assert src_mask.sum(1).tolist() == [7, 4, 2]
    with torch.no_grad():
        torch.testing.assert_close(model.decode(tgt, memory, src_mask), logits)


def test_model_needs_vocabulary_sizes() -> None:
    with pytest.raises(ValueError, match="with_vocab"):
        Transformer(TransformerConfig(d_model=D, n_heads=H))


def test_non_dividing_heads_with_d_head_build_and_run() -> None:
    model = build(n_heads=3, d_head=16)
    attn = model.decoder.layers[0].cross_attn
    assert attn.w_q.weight.shape == (48, D)
    with torch.no_grad():
        assert model(ids(2, 6), ids(2, 4, seed=1)).shape == (2, 4, V)


def test_pad_embedding_row_is_zero() -> None:
    model = build(tie="none")
    for embedding in (model.encoder.embed.token, model.decoder.embed.token):
        assert torch.equal(embedding.weight[PAD], torch.zeros(D))
        assert embedding.padding_idx == PAD


# ---------------------------------------------------------------------------------------------------------
# Causality and padding


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_is_causal(norm_first: bool, need_weights: bool) -> None:
    model = build(norm_first=norm_first)
    src, tgt = padded_source(), ids(3, 6, seed=2)
    with torch.no_grad():
        memory, src_mask = model.encode(src)

        def logits(target: Tensor) -> Tensor:
            out = model.decode(target, memory, src_mask, need_weights=need_weights)
            return out[0] if need_weights else out

        reference = logits(tgt)
        for t in (0, 2, 4):
            changed = tgt.clone()
            changed[:, t + 1 :] = ids(3, 5 - t, seed=100 + t)
            assert not torch.equal(changed, tgt)
            out = logits(changed)
            assert torch.equal(out[:, : t + 1], reference[:, : t + 1]), f"position <= {t} saw the future"
            assert not torch.allclose(out[:, t + 1 :], reference[:, t + 1 :])


@pytest.mark.parametrize("norm_first", [False, True])
def test_padding_does_not_change_real_positions(norm_first: bool) -> None:
    model = build(norm_first=norm_first)
    short, long = ids(1, 5, seed=3)[0], ids(1, 8, seed=4)[0]
    tgt = ids(2, 4, seed=5)
    with torch.no_grad():
        memory_alone, mask_alone = model.encode(short[None])
        memory_batch, mask_batch = model.encode(pad_to([short, long], 8))
        logits_alone = model.decode(tgt[:1], memory_alone, mask_alone)
        logits_batch = model.decode(tgt, memory_batch, mask_batch)
    assert mask_batch[0].tolist() == [True] * 5 + [False] * 3
    torch.testing.assert_close(memory_batch[0, :5], memory_alone[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits_batch[0], logits_alone[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_both_stacks_end_in_a_layer_norm(norm_first: bool) -> None:
    """The encoder output and the decoder's hidden states are layer-normalised at every position: by the
    last sublayer's LayerNorm in post-norm, by each stack's final LayerNorm in pre-norm (`norm_first`).
    With the initial LayerNorm weights (1) and biases (0): mean 0 and variance 1 over the model width."""
    model = build(norm_first=norm_first)
    with torch.no_grad():
        memory, _ = model.encode(padded_source())
        hidden = model(padded_source(), ids(3, 6, seed=2), project=False)
    for states in (memory, hidden):
        positions = states.shape[:-1]
        torch.testing.assert_close(states.mean(-1), torch.zeros(positions), rtol=0, atol=1e-5)
        torch.testing.assert_close(states.var(-1, correction=0), torch.ones(positions), rtol=0, atol=1e-3)


def test_padding_matters_when_unmasked() -> None:
    """Sanity check of the test above: the pad embedding is not neutral, so the mask does the work."""
    model = build()
    short = ids(1, 5, seed=3)
    with torch.no_grad():
        alone, _ = model.encode(short)
        padded = torch.cat([short, torch.full((1, 3), PAD)], dim=1)
        unmasked = model.encoder(padded, torch.ones_like(padded, dtype=torch.bool))
    assert not torch.allclose(unmasked[0, :5], alone[0], atol=1e-3)


# ---------------------------------------------------------------------------------------------------------
# Incremental decoding


def cached_logits(
    model: Transformer, tgt: Tensor, memory: Tensor, src_mask: Tensor | None, chunks: list[int]
) -> Tensor:
    """Decode `tgt` through a fresh cache, `chunks[i]` positions per call; (B, T, V)."""
    cache, outputs, start = model.new_cache(), [], 0
    for size in chunks:
        assert cache.length == start
        outputs.append(model.decode(tgt[:, start : start + size], memory, src_mask, cache=cache))
        start += size
    assert start == tgt.size(1) == cache.length
    return torch.cat(outputs, dim=1)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("pe", ["sinusoidal", "learned", "none"])
def test_cached_decoding_equals_full_decode(pe: str, norm_first: bool) -> None:
    model = build(pe=pe, norm_first=norm_first)
    src, tgt = padded_source(), ids(3, 6, seed=6)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        full = model.decode(tgt, memory, src_mask)
        stepwise = cached_logits(model, tgt, memory, src_mask, [1] * 6)
    torch.testing.assert_close(stepwise, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
def test_no_source_mask_is_an_unpadded_batch(need_weights: bool) -> None:
    """`decode(..., src_mask=None)`, which searches pass for batches without padding (`decoder_mask`),
    equals decoding with the all-True mask, cached one step at a time and in one pass; a padded batch keeps
    its mask."""
    from attnlab.decoding.search import decoder_mask

    model = build()
    src, tgt = ids(2, 5, seed=3), ids(2, 4, seed=4)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        assert bool(src_mask.all()) and decoder_mask(src_mask) is None
        masked = model.decode(tgt, memory, src_mask, need_weights=need_weights)
        unmasked = model.decode(tgt, memory, None, need_weights=need_weights)
        torch.testing.assert_close(unmasked, masked, rtol=1e-6, atol=1e-6)
        stepwise = cached_logits(model, tgt, memory, None, [1] * 4)
    torch.testing.assert_close(stepwise, masked[0] if need_weights else masked, rtol=1e-5, atol=1e-5)
    padded_mask = model.encode(padded_source())[1]
    assert decoder_mask(padded_mask) is padded_mask


@pytest.mark.parametrize("chunks", [[2, 1, 1, 1, 1], [1, 2, 3], [3, 3]])
def test_cached_decoding_in_chunks_equals_full_decode(chunks: list[int]) -> None:
    model = build(pe="learned")
    src, tgt = padded_source(), ids(3, 6, seed=7)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        full = model.decode(tgt, memory, src_mask)
        chunked = cached_logits(model, tgt, memory, src_mask, chunks)
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)


def test_cross_attention_keys_are_computed_once() -> None:
    model = build()
    src, tgt = padded_source(), ids(3, 3, seed=8)
    cache = model.new_cache()
    assert len(cache.layers) == 2
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        model.decode(tgt[:, :1], memory, src_mask, cache=cache)
        first = [(layer.cross_k, layer.cross_v) for layer in cache.layers]
        assert all(k is not None and k.shape == (3, H, 7, D // H) for k, _ in first)
        model.decode(tgt[:, 1:2], memory, src_mask, cache=cache)
    for layer, (k, v) in zip(cache.layers, first, strict=True):
        assert layer.cross_k is k
        assert layer.cross_v is v
        assert layer.self_k.shape == (3, H, 2, D // H)


def test_cache_reorder_selects_batch_rows() -> None:
    model = build()
    src, tgt = padded_source(), ids(3, 4, seed=9)
    index = torch.tensor([2, 0, 0, 1])
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_cache()
        cached_steps = [model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache) for t in range(3)]
        names = ("self_k", "self_v", "cross_k", "cross_v")
        before = [{name: getattr(layer, name) for name in names} for layer in cache.layers]
        cache.reorder(index, index)
        for layer, old in zip(cache.layers, before, strict=True):
            for name in names:
                assert torch.equal(getattr(layer, name), old[name][index]), name
        # Decoding on from the reordered cache equals decoding the reordered batch from scratch.
        last = model.decode(tgt[index, 3:4], memory[index], src_mask[index], cache=cache)
        full = model.decode(tgt[index], memory[index], src_mask[index])
    assert cache.length == 4
    assert len(cached_steps) == 3
    torch.testing.assert_close(last[:, 0], full[:, 3], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# Weight tying and parameter count


def shares(a: Tensor, b: Tensor) -> bool:
    return a.data_ptr() == b.data_ptr()


def test_tie_all_shares_one_matrix() -> None:
    model = build(tie="all")
    src_emb, tgt_emb = model.encoder.embed.token.weight, model.decoder.embed.token.weight
    assert shares(src_emb, tgt_emb)
    assert shares(tgt_emb, model.output.weight)
    assert model.output.weight is tgt_emb


def test_tie_all_needs_one_vocabulary() -> None:
    with pytest.raises(ValueError, match="tie"):
        tiny_config(tie="all", tgt_vocab_size=V + 10)


def test_tie_decoder_shares_target_embedding_and_output() -> None:
    model = build(tie="decoder", tgt_vocab_size=60)
    src_emb, tgt_emb = model.encoder.embed.token.weight, model.decoder.embed.token.weight
    assert shares(tgt_emb, model.output.weight)
    assert not shares(src_emb, tgt_emb)
    assert src_emb.shape == (V, D)
    assert tgt_emb.shape == (60, D)


def test_tie_none_shares_nothing() -> None:
    model = build(tie="none")
    weights = [model.encoder.embed.token.weight, model.decoder.embed.token.weight, model.output.weight]
    assert len({w.data_ptr() for w in weights}) == 3


@pytest.mark.parametrize(("tie", "expected"), [("all", 1), ("decoder", 2), ("none", 3)])
def test_tying_changes_the_parameter_count(tie: str, expected: int) -> None:
    untied = sum(p.numel() for p in build(tie="none").parameters())
    tied = sum(p.numel() for p in build(tie=tie).parameters())
    assert untied - tied == (3 - expected) * V * D


def test_base_model_has_the_paper_parameter_count() -> None:
    config = TransformerConfig(src_vocab_size=37000, tgt_vocab_size=37000)
    assert (config.tie, config.output_bias, config.norm_first) == ("all", False, False)
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = Transformer(config)
    assert sum(p.numel() for p in model.parameters()) == 63_082_496
    counts = model.count_parameters()
    assert counts == {
        "total": 63_082_496,
        "embedding": 37000 * 512,
        "non_embedding": 63_082_496 - 37000 * 512,
    }


@pytest.mark.parametrize(
    ("overrides", "embedding"),
    [
        ({"tie": "none"}, 2 * V * D),  # source and target tables; the untied output is not a table
        ({"tie": "decoder"}, 2 * V * D),
        ({"tie": "all", "pe": "learned", "max_positions": 16}, V * D + 2 * 16 * D),  # + two position tables
    ],
)
def test_count_parameters_splits_embeddings(overrides: dict[str, Any], embedding: int) -> None:
    model = build(**overrides)
    counts = model.count_parameters()
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["embedding"] == embedding
    assert counts["non_embedding"] == counts["total"] - embedding


# ---------------------------------------------------------------------------------------------------------
# Switches


@pytest.mark.parametrize(
    ("activation", "function"),
    [("relu", torch.relu), ("gelu", nn.functional.gelu), ("silu", nn.functional.silu)],
)
def test_activation_options_build_and_run(activation: str, function: Any) -> None:
    model = build(activation=activation)
    ffn = model.encoder.layers[0].ffn
    assert isinstance(ffn, FeedForward)
    x = torch.randn(2, 3, D)
    with torch.no_grad():
        torch.testing.assert_close(ffn(x), ffn.w_2(function(ffn.w_1(x))))
        logits = model(ids(2, 5), ids(2, 4, seed=1))
    assert logits.shape == (2, 4, V)
    assert bool(torch.isfinite(logits).all())


def test_output_bias() -> None:
    assert build().output.bias is None
    model = build(output_bias=True)
    assert model.output.bias is not None
    assert model.output.bias.shape == (V,)
    src, tgt = ids(2, 5), ids(2, 4, seed=1)
    with torch.no_grad():
        before = model(src, tgt)
        model.output.bias.copy_(torch.arange(V, dtype=torch.float32))
        after = model(src, tgt)
    torch.testing.assert_close(after - before, torch.arange(V, dtype=torch.float32).expand(2, 4, V))


@pytest.mark.parametrize("scale", [True, False])
def test_scale_embeddings(scale: bool) -> None:
    model = build(scale_embeddings=scale, pe="none")
    tokens = ids(2, 5)
    embed = model.decoder.embed
    factor = math.sqrt(D) if scale else 1.0
    with torch.no_grad():
        torch.testing.assert_close(embed(tokens), embed.token(tokens) * factor)


def test_scale_embeddings_changes_the_model_output() -> None:
    src, tgt = ids(2, 5), ids(2, 4, seed=1)
    with torch.no_grad():
        scaled, unscaled = build(scale_embeddings=True)(src, tgt), build(scale_embeddings=False)(src, tgt)
    assert not torch.allclose(scaled, unscaled, atol=1e-3)


def test_decoder_start_id_defaults_to_bos() -> None:
    model = build()
    assert model.config.start_id == model.config.bos_id == 1
    assert build(decoder_start_id=PAD).config.start_id == PAD


def test_dropout_only_in_training() -> None:
    model = build(dropout=0.3)
    src, tgt = ids(2, 5), ids(2, 4, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), model(src, tgt))
        reference = model(src, tgt)
        model.train()
        assert not torch.allclose(model(src, tgt), reference)


def test_embedding_and_activation_dropout_act_in_training_only() -> None:
    """Each dropout on its own: the embedding's (`dropout`) and the FFN's (`activation_dropout`) zero
    and rescale in training, and are the identity in eval."""
    model = build(dropout=0.5, activation_dropout=0.5)
    tokens, x = ids(2, 5), torch.randn(2, 5, model.config.d_model)
    embed, ffn = model.encoder.embed, model.encoder.layers[0].ffn
    with torch.no_grad():
        plain = embed.token(tokens) * embed.scale + embed.positions(5, 0, tokens.device)
        hidden = ffn.activation(ffn.w_1(x))
        torch.testing.assert_close(embed(tokens), plain)
        torch.testing.assert_close(ffn(x), ffn.w_2(hidden))
        model.train()
        dropped = embed(tokens)
        assert bool((dropped == 0).any()) and torch.allclose(dropped[dropped != 0], 2 * plain[dropped != 0])
        assert not torch.allclose(ffn(x), ffn.w_2(hidden))
        torch.manual_seed(1)
        mask = keep_mask(hidden, 0.5)  # what attnlab's Dropout draws with this seed
        torch.manual_seed(1)
        torch.testing.assert_close(ffn(x), ffn.w_2(hidden * mask * 2))


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_dropout_is_on_each_sublayer_output_before_the_residual_add(norm_first: bool) -> None:
    """§5.4: `model.dropout` drops each sublayer's output before it is added to the sublayer input: post-norm
    (the paper, §3.1) LayerNorm(x + Dropout(Sublayer(x))), pre-norm x + Dropout(Sublayer(LayerNorm(x)))."""
    model = build(norm_first=norm_first, dropout=0.5)
    layer = model.decoder.layers[0]
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        sublayer = layer.ffn(layer.ffn_block.norm(x) if norm_first else x)  # eval: no dropout inside it
        model.train()
        torch.manual_seed(1)
        mask = keep_mask(sublayer, 0.5)  # what attnlab's Dropout draws with this seed
        torch.manual_seed(1)
        out = layer.ffn_block(x, layer.ffn)
    dropped = sublayer * mask * 2
    torch.testing.assert_close(out, x + dropped if norm_first else layer.ffn_block.norm(x + dropped))


# ---------------------------------------------------------------------------------------------------------
# Cross-attention weights through the model


@pytest.mark.parametrize("norm_first", [False, True])
def test_need_weights_returns_cross_attention_per_layer(norm_first: bool) -> None:
    model = build(norm_first=norm_first)
    src, tgt = padded_source(), ids(3, 4, seed=11)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        plain = model.decode(tgt, memory, src_mask)
        logits, weights = model.decode(tgt, memory, src_mask, need_weights=True)
    torch.testing.assert_close(logits, plain)
    assert isinstance(weights, list)
    assert len(weights) == model.config.n_decoder_layers
    pad = ~src_mask[:, None, None, :].expand(3, H, 4, 7)
    for w in weights:
        assert w.shape == (3, H, 4, 7)
        torch.testing.assert_close(w.sum(-1), torch.ones(3, H, 4))
        assert torch.equal(w[pad], torch.zeros_like(w[pad]))


def test_need_weights_with_cache() -> None:
    model = build()
    src, tgt = padded_source(), ids(3, 3, seed=12)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        _, full = model.decode(tgt, memory, src_mask, need_weights=True)
        cache = model.new_cache()
        steps = [
            model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache, need_weights=True)
            for t in range(3)
        ]
    for layer in range(2):
        stacked = torch.cat([weights[layer] for _, weights in steps], dim=2)  # (B, H, T, S)
        torch.testing.assert_close(stacked, full[layer], rtol=1e-5, atol=1e-5)


def test_beams_share_their_sentence_memory_in_the_cache() -> None:
    """A cache for K beams per sentence takes the un-repeated memory; equal to repeating it K times,
    also after reordering beams within sentences and after a sentence leaves the batch."""
    model, beams = build(), 2
    src, tgt = padded_source(), ids(6, 4, seed=11)  # 3 sentences × 2 beams, sentence-major rows
    parents = torch.tensor([1, 1, 2, 3, 5, 4])  # beams move within their sentence only
    with torch.inference_mode():
        memory, src_mask = model.encode(src)
        repeated = memory.repeat_interleave(beams, 0), src_mask.repeat_interleave(beams, 0)
        shared, plain = model.new_cache(beams), model.new_cache()
        for t in range(2):
            got = model.decode(tgt[:, t : t + 1], memory, src_mask, cache=shared)
            want = model.decode(tgt[:, t : t + 1], *repeated, cache=plain)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        shared.reorder(parents)
        plain.reorder(parents, parents)
        assert shared.layers[0].cross_k.size(0) == 3  # one per sentence
        got = model.decode(tgt[:, 2:3], memory, src_mask, cache=shared)
        want = model.decode(tgt[:, 2:3], *repeated, cache=plain)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        keep, rows = torch.tensor([0, 2]), torch.tensor([0, 1, 4, 5])  # sentence 1 is done
        shared.reorder(rows, keep)
        plain.reorder(rows, rows)
        got = model.decode(tgt[rows, 3:4], memory[keep], src_mask[keep], cache=shared)
        want = model.decode(tgt[rows, 3:4], repeated[0][rows], repeated[1][rows], cache=plain)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_explicit_attention_for_many_decoding_rows_equals_the_fused_kernel() -> None:
    model = build()
    src, tgt = padded_source().repeat(12, 1), ids(36, 10, seed=12)  # 36 rows, one query each: explicit
    with torch.inference_mode():
        memory, src_mask = model.encode(src)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], memory, src_mask, cache=cache) for t in range(3)]
        full = model.decode(tgt, memory, src_mask)  # 10 queries per row: the fused kernel
    torch.testing.assert_close(torch.cat(steps, 1), full[:, :3], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tie", ["all", "none"])
@pytest.mark.parametrize("again", [False, True], ids=["built", "reset"])
def test_initialisation_is_xavier_uniform_with_zero_biases_and_normal_embeddings(
    tie: str, again: bool
) -> None:
    """Every linear weight uniform in ±sqrt(6 / (fan_in + fan_out)) with Xavier's variance and a zero bias;
    embeddings N(0, D^-0.5) with a zero pad row; a tied output projection is the embedding itself and
    keeps its initialisation, also when `reset_parameters` re-initialises a built model (`again`)."""
    torch.manual_seed(0)
    config = TransformerConfig(d_model=128, n_heads=4, d_ff=256, n_encoder_layers=2, n_decoder_layers=2,
                               tie=tie, output_bias=True).with_vocab(2000, 2000)  # fmt: skip
    model = Transformer(config)
    if again:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(5.0)
        model.reset_parameters()
    embeddings = [module for module in model.modules() if isinstance(module, nn.Embedding)]
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    for embedding in embeddings:
        rows = torch.cat([embedding.weight[:PAD], embedding.weight[PAD + 1 :]])
        assert torch.all(embedding.weight[PAD] == 0)
        assert abs(rows.mean().item()) < 0.01 and rows.std().item() == pytest.approx(128**-0.5, rel=0.02)
    for linear in linears:
        assert linear.bias is None or torch.all(linear.bias == 0)
        if tie == "all" and linear is model.output:
            assert linear.weight is embeddings[0].weight
            continue
        fan_out, fan_in = linear.weight.shape
        bound = math.sqrt(6 / (fan_in + fan_out))
        assert linear.weight.abs().max().item() <= bound
        assert linear.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
