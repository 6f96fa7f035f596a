"""Scaled dot-product and multi-head attention: parity with torch, explicit vs fast path, masks, caching."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.model.attention import MultiHeadAttention, scaled_dot_product_attention
from attnlab.model.cache import LayerKV

B, T, S, D, H = 3, 5, 7, 32, 4


def make_attention(*, seed: int = 0, d_head: int | None = None, dropout: float = 0.0) -> MultiHeadAttention:
    """A tiny attention module in eval mode with non-zero biases."""
    torch.manual_seed(seed)
    attn = MultiHeadAttention(d_model=D, n_heads=H, d_head=d_head, dropout=dropout)
    with torch.no_grad():
        for linear in (attn.w_q, attn.w_k, attn.w_v, attn.w_o):
            linear.bias.normal_(std=0.1)
    return attn.eval()


def torch_reference(attn: MultiHeadAttention) -> nn.MultiheadAttention:
    """`nn.MultiheadAttention` with the weights of `attn` (in_proj rows = w_q, w_k, w_v; out_proj = w_o)."""
    ref = nn.MultiheadAttention(D, H, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([attn.w_q.weight, attn.w_k.weight, attn.w_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([attn.w_q.bias, attn.w_k.bias, attn.w_v.bias]))
        ref.out_proj.weight.copy_(attn.w_o.weight)
        ref.out_proj.bias.copy_(attn.w_o.bias)
    return ref.eval()


def inputs(seed: int = 1) -> tuple[Tensor, Tensor]:
    """Query-side input x (B, T, D) and memory (B, S, D)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, D, generator=gen), torch.randn(B, S, D, generator=gen)


def key_padding(batch: int, length: int, lengths: list[int]) -> Tensor:
    """Bool (batch, length), True at the first `lengths[b]` positions of row b (True = may attend)."""
    assert len(lengths) == batch
    return torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]


def causal(t: int) -> Tensor:
    """Bool (t, t), True on and below the diagonal."""
    return torch.ones(t, t, dtype=torch.bool).tril()


# ---------------------------------------------------------------------------------------------------------
# Parity with torch.nn.MultiheadAttention


def test_self_attention_matches_torch() -> None:
    attn = make_attention()
    x, _ = inputs()
    with torch.no_grad():
        ours, _ = attn(x)
        ref, _ = torch_reference(attn)(x, x, x, need_weights=False)
    assert ours.shape == (B, T, D)
    torch.testing.assert_close(ours, ref)


def test_cross_attention_matches_torch() -> None:
    attn = make_attention()
    x, memory = inputs()
    with torch.no_grad():
        ours, _ = attn(x, memory)
        ref, _ = torch_reference(attn)(x, memory, memory, need_weights=False)
    assert ours.shape == (B, T, D)
    torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("need_weights", [False, True])
def test_cross_attention_with_key_padding_matches_torch(need_weights: bool) -> None:
    attn = make_attention()
    x, memory = inputs()
    keep = key_padding(B, S, [S, 4, 1])  # (B, S) True = may attend
    with torch.no_grad():
        ours, _ = attn(x, memory, mask=keep[:, None, None, :], need_weights=need_weights)
        ref, _ = torch_reference(attn)(x, memory, memory, key_padding_mask=~keep, need_weights=False)
    torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("need_weights", [False, True])
def test_self_attention_with_key_padding_matches_torch(need_weights: bool) -> None:
    attn = make_attention()
    x, _ = inputs()
    keep = key_padding(B, T, [T, 3, 2])
    with torch.no_grad():
        ours, _ = attn(x, mask=keep[:, None, None, :], need_weights=need_weights)
        ref, _ = torch_reference(attn)(x, x, x, key_padding_mask=~keep, need_weights=False)
    torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("how", ["is_causal", "mask", "is_causal+need_weights"])
def test_causal_self_attention_matches_torch(how: str) -> None:
    attn = make_attention()
    x, _ = inputs()
    kwargs = {
        "is_causal": {"is_causal": True},
        "mask": {"mask": causal(T)},
        "is_causal+need_weights": {"is_causal": True, "need_weights": True},
    }[how]
    with torch.no_grad():
        ours, _ = attn(x, **kwargs)
        ref, _ = torch_reference(attn)(x, x, x, attn_mask=~causal(T), need_weights=False)
    torch.testing.assert_close(ours, ref)


def test_causal_with_key_padding_matches_torch() -> None:
    attn = make_attention()
    x, _ = inputs()
    keep = key_padding(B, T, [T, 4, 3])
    with torch.no_grad():
        ours, _ = attn(x, mask=keep[:, None, None, :], is_causal=True)
        ref, _ = torch_reference(attn)(
            x, x, x, key_padding_mask=~keep, attn_mask=~causal(T), need_weights=False
        )
    torch.testing.assert_close(ours, ref)


def test_attention_weights_match_torch_head_weights() -> None:
    attn = make_attention()
    x, memory = inputs()
    keep = key_padding(B, S, [S, 4, 2])
    with torch.no_grad():
        _, weights = attn(x, memory, mask=keep[:, None, None, :], need_weights=True)
        _, ref = torch_reference(attn)(
            x, memory, memory, key_padding_mask=~keep, need_weights=True, average_attn_weights=False
        )
    torch.testing.assert_close(weights, ref)


# ---------------------------------------------------------------------------------------------------------
# Explicit path (need_weights=True) vs fast path (F.scaled_dot_product_attention)

CASES = ["self", "cross", "self-padding", "cross-padding", "causal", "causal-padding", "causal-mask"]


def case(name: str) -> tuple[dict, Tensor]:
    """Call arguments for `name` and the bool mask (B, 1, T, S) of keys each query may attend to."""
    x, memory = inputs()
    cross = name.startswith("cross")
    length = S if cross else T
    keep = torch.ones(B, 1, T, length, dtype=torch.bool)
    kwargs: dict = {"x": x, "memory": memory if cross else None}
    if "padding" in name:
        pad = key_padding(B, length, [length, length - 2, 1])[:, None, None, :]  # (B, 1, 1, S)
        kwargs["mask"] = pad
        keep = keep & pad
    if name.startswith("causal"):
        keep = keep & causal(T)
        if name == "causal-mask":
            kwargs["mask"] = causal(T)
        else:
            kwargs["is_causal"] = True
    return kwargs, keep


@pytest.mark.parametrize("name", CASES)
def test_explicit_path_equals_fast_path(name: str) -> None:
    attn = make_attention()
    kwargs, _ = case(name)
    with torch.no_grad():
        fast, none = attn(**kwargs)
        explicit, weights = attn(**kwargs, need_weights=True)
    assert none is None
    assert weights is not None
    torch.testing.assert_close(explicit, fast)


@pytest.mark.parametrize("name", CASES)
def test_weights_are_distributions_with_masked_keys_zero(name: str) -> None:
    attn = make_attention()
    kwargs, keep = case(name)
    with torch.no_grad():
        _, weights = attn(**kwargs, need_weights=True)
    length = keep.size(-1)
    assert weights.shape == (B, H, T, length)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T))
    keep = keep.expand_as(weights)
    assert torch.equal(weights[~keep], torch.zeros_like(weights[~keep]))
    assert bool((weights[keep] > 0).all())


def test_a_query_that_may_attend_nowhere_gets_zeros_as_from_torch() -> None:
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, H, 3, D // H, generator=gen) for _ in range(3))
    mask = torch.tensor([[True, True, False], [False] * 3])[:, None, None, :]  # source 1: padding only
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert out.isfinite().all() and torch.equal(weights[1], torch.zeros_like(weights[1]))


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal", "full-bool"])
def test_sdpa_function_matches_torch(mask_kind: str) -> None:
    gen = torch.Generator().manual_seed(3)
    dh = D // H
    q = torch.randn(B, H, T, dh, generator=gen)
    k = torch.randn(B, H, T, dh, generator=gen)
    v = torch.randn(B, H, T, dh, generator=gen)
    mask = {
        "none": None,
        "padding": key_padding(B, T, [T, 3, 1])[:, None, None, :],
        "causal": causal(T),
        "full-bool": torch.rand(B, H, T, T, generator=gen) > 0.3,
    }[mask_kind]
    if mask is not None:
        mask = mask | torch.eye(T, dtype=torch.bool)  # every query keeps at least one key
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected)
    assert weights.shape == (B, H, T, T)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T))
    if mask is not None:
        hidden = ~mask.expand_as(weights)
        assert torch.equal(weights[hidden], torch.zeros_like(weights[hidden]))


def test_sdpa_function_is_equation_one() -> None:
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 1, 2, 4, generator=gen) for _ in range(3))
    out, weights = scaled_dot_product_attention(q, k, v)
    expected_weights = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)  # sqrt(d_k) = sqrt(4) = 2
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(out, expected_weights @ v)


# ---------------------------------------------------------------------------------------------------------
# Shapes, head width, dropout


def manual_attention(attn: MultiHeadAttention, x: Tensor, memory: Tensor) -> Tensor:
    """MultiHead(Q, K, V) with per-head width attn.d_head written out with einsum (no masks)."""
    h, dh = attn.n_heads, attn.d_head
    q = attn.w_q(x).unflatten(-1, (h, dh))  # (B, T, H, Dh)
    k = attn.w_k(memory).unflatten(-1, (h, dh))  # (B, S, H, Dh)
    v = attn.w_v(memory).unflatten(-1, (h, dh))  # (B, S, H, Dh)
    weights = torch.einsum("bthd,bshd->bhts", q, k).div(math.sqrt(dh)).softmax(-1)  # (B, H, T, S)
    heads = torch.einsum("bhts,bshd->bthd", weights, v).flatten(2)  # (B, T, H·Dh)
    return attn.w_o(heads)


def test_explicit_d_head_sets_inner_width() -> None:
    attn = make_attention(d_head=16)
    assert attn.d_head == 16
    for linear in (attn.w_q, attn.w_k, attn.w_v):
        assert linear.weight.shape == (64, D)
    assert attn.w_o.weight.shape == (D, 64)
    x, memory = inputs()
    with torch.no_grad():
        out, _ = attn(x, memory)
        explicit, weights = attn(x, memory, need_weights=True)
        expected = manual_attention(attn, x, memory)
    assert out.shape == (B, T, D)
    assert weights.shape == (B, H, T, S)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(explicit, expected)


def test_default_head_width_matches_torch_via_manual_reference() -> None:
    attn = make_attention()
    x, memory = inputs()
    with torch.no_grad():
        torch.testing.assert_close(attn(x, memory)[0], manual_attention(attn, x, memory))


def test_non_dividing_heads_need_d_head() -> None:
    with pytest.raises(ValueError, match=r"n_heads=5.*d_model=32"):
        MultiHeadAttention(d_model=D, n_heads=5)
    attn = MultiHeadAttention(d_model=D, n_heads=5, d_head=8)
    assert attn.w_q.weight.shape == (40, D)
    assert attn(torch.randn(2, 3, D))[0].shape == (2, 3, D)


def test_attention_dropout_only_in_training() -> None:
    attn = make_attention(dropout=0.5)
    plain = make_attention(dropout=0.0)
    x, memory = inputs()
    with torch.no_grad():
        torch.testing.assert_close(attn(x, memory)[0], plain(x, memory)[0])
        attn.train()
        torch.manual_seed(0)
        dropped, _ = attn(x, memory)
        torch.manual_seed(0)
        _, weights = attn(x, memory, need_weights=True)
    assert not torch.allclose(dropped, plain(x, memory)[0])
    assert bool((weights == 0).any())  # dropped attention weights


# ---------------------------------------------------------------------------------------------------------
# Incremental self-attention through a LayerKV


@pytest.mark.parametrize("chunks", [[1, 1, 1, 1, 1], [2, 1, 1, 1], [1, 2, 2], [3, 2]])
@pytest.mark.parametrize("need_weights", [False, True])
def test_cached_causal_self_attention_equals_full(chunks: list[int], need_weights: bool) -> None:
    attn = make_attention()
    x, _ = inputs()
    with torch.no_grad():
        full, _ = attn(x, is_causal=True)
        cache, outputs, start = LayerKV(), [], 0
        for size in chunks:
            out, _ = attn(x[:, start : start + size], is_causal=True, cache=cache, need_weights=need_weights)
            outputs.append(out)
            start += size
    assert start == T
    assert cache.self_k.shape == (B, H, T, D // H)
    torch.testing.assert_close(torch.cat(outputs, dim=1), full)


def test_cross_attention_keys_are_computed_once() -> None:
    attn = make_attention()
    x, memory = inputs()
    cache = LayerKV()
    with torch.no_grad():
        first, _ = attn(x[:, :1], memory, cache=cache)
        torch.testing.assert_close(first, attn(x[:, :1], memory)[0])
        k, v = cache.cross_k, cache.cross_v
        assert k.shape == (B, H, S, D // H)
        second, _ = attn(x[:, 1:2], torch.zeros_like(memory), cache=cache)  # memory ignored once cached
        expected, _ = attn(x[:, 1:2], memory)
    assert cache.cross_k is k and cache.cross_v is v
    assert cache.self_k is None
    torch.testing.assert_close(second, expected)


def test_attention_maps_records_every_layer_without_changing_the_outputs() -> None:
    from attnlab.model.attention import attention_maps
    from attnlab.model.transformer import Transformer
    from helpers import tiny_config

    torch.manual_seed(0)
    model = Transformer(tiny_config(dropout=0.1)).train()
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    tgt = torch.tensor([[1, 11, 12], [1, 13, 0]])
    with torch.no_grad():
        expected = model.eval()(src, tgt)
    model.train()
    maps = attention_maps(model, src, tgt)
    assert model.training  # mode restored
    assert "forward" not in vars(model.encoder.layers[0].self_attn)  # the class's forward again
    layers = model.config.n_encoder_layers
    assert len(maps) == layers + 2 * model.config.n_decoder_layers
    names = ("encoder.layers.0.self_attn", "decoder.layers.0.self_attn", "decoder.layers.0.cross_attn")
    enc, dec, cross = (maps[name] for name in names)
    heads = model.config.n_heads
    assert enc.shape == (2, heads, 5, 5) and dec.shape == (2, heads, 3, 3) and cross.shape == (2, heads, 3, 5)
    for weights in (enc, dec, cross):
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert dec.triu(1).abs().max() == 0  # no look-ahead
    assert cross[1, :, :, 3:].abs().max() == 0 and enc[1, :, :, 3:].abs().max() == 0  # padding ignored
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(src, tgt), expected)
