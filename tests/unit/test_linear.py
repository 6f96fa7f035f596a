"""Linear layers: the CPU inference path (layouts, fused groups, cached weights) equals F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.model.linear import Linear, forget_packed, project


def layers(*shapes: tuple[int, int], bias: bool = True) -> list[Linear]:
    torch.manual_seed(0)
    return [Linear(n_in, n_out, bias=bias) for n_in, n_out in shapes]


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 64])  # each operand layout `project` picks
@pytest.mark.parametrize("bias", [True, False])
def test_inference_path_equals_f_linear(rows: int, bias: bool) -> None:
    group = layers((24, 8), (24, 16), (24, 8), bias=bias)
    x = torch.randn(rows, 3, 24)
    expected = [F.linear(x, layer.weight, layer.bias) for layer in group]
    with torch.inference_mode():
        outs = project(x, *group)
        single = group[1](x)
    assert [o.shape for o in outs] == [(rows, 3, 8), (rows, 3, 16), (rows, 3, 8)]
    for out, want in zip(outs, expected, strict=True):
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(single, expected[1], rtol=1e-5, atol=1e-5)


def test_training_path_is_f_linear_with_gradients() -> None:
    (layer,) = layers((6, 4))
    x = torch.randn(5, 6, requires_grad=True)
    out = layer(x)
    assert torch.equal(out, F.linear(x, layer.weight, layer.bias))
    out.sum().backward()
    assert layer.weight.grad is not None and x.grad is not None


def assert_products_follow(x: torch.Tensor, group: list[Linear]) -> None:
    """The inference products of `group` equal each layer's F.linear with its weights as they are now."""
    with torch.no_grad():
        got = project(x, *group)
    for out, layer in zip(got, group, strict=True):
        torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))


def test_cached_weights_follow_every_change_of_the_weights() -> None:
    group = layers((8, 4), (8, 4))
    x = torch.randn(1, 8)  # one row: the cached (in, out) copy

    def check() -> None:
        assert_products_follow(x, group)

    check()
    with torch.no_grad():
        group[1].bias.add_(1.0)  # an in-place update (as the optimizer makes) of one bias only
    check()
    group[0].load_state_dict({"weight": torch.randn(4, 8), "bias": torch.zeros(4)})
    check()
    group[1].weight = torch.nn.Parameter(torch.randn(4, 8))  # a new tensor
    check()


@pytest.mark.parametrize("options", [{"fused": True}, {"foreach": True}, {"foreach": False}], ids=str)
def test_cached_weights_follow_an_optimizer_step(options: dict[str, bool]) -> None:
    """torch's fused Adam updates parameters in place without bumping their version counters."""
    group = layers((8, 4), (8, 4))
    x = torch.randn(1, 8)
    optimizer = torch.optim.Adam([p for layer in group for p in layer.parameters()], lr=0.5, **options)
    for _ in range(2):
        with torch.no_grad():
            project(x, *group)  # caches the concatenated copy
        sum(layer(x).sum() for layer in group).backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            got = project(x, *group)
        for out, layer in zip(got, group, strict=True):
            torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))


def test_weights_computed_by_pruning_or_a_parametrization_are_not_cached() -> None:
    """Pruning makes `weight` an attribute recomputed from `weight_orig` and a mask, a parametrization a
    property: the cache, keyed on the registered parameters, kept the weight of the first product."""
    from torch.nn.utils import parametrize, prune

    class Negated(torch.nn.Module):
        def forward(self, weight: torch.Tensor) -> torch.Tensor:
            return -weight

    group = layers((8, 4), (8, 4))
    x = torch.randn(1, 8)

    def check() -> None:
        assert_products_follow(x, group)

    check()
    prune.l1_unstructured(group[0], "weight", amount=0.5)
    check()
    parametrize.register_parametrization(group[1], "weight", Negated())
    check()
    with torch.no_grad():
        group[1].parametrizations.weight.original.mul_(3.0)
    check()


def test_parameters_made_under_inference_mode_multiply_without_the_cache() -> None:
    """Inference tensors have no version counter for the cache to key on: they run F.linear."""
    with torch.inference_mode():
        group = layers((8, 4), (8, 4))
        x = torch.randn(1, 8)
        got = project(x, *group)
        group[0].weight.mul_(2.0)  # allowed in inference mode, and seen
        again = project(x, *group)
    torch.testing.assert_close(got[1], F.linear(x, group[1].weight, group[1].bias))
    torch.testing.assert_close(again[0], F.linear(x, group[0].weight, group[0].bias))


def test_writes_through_data_are_seen_after_forget_packed() -> None:
    """`.data` writes bypass the version counter (the module docstring): `forget_packed` drops the copies."""
    group = layers((8, 4), (8, 4))
    x = torch.randn(1, 8)
    with torch.no_grad():
        project(x, *group)
        group[0].weight.data.copy_(torch.randn(4, 8))
        forget_packed()
        got = project(x, *group)
    torch.testing.assert_close(got[0], F.linear(x, group[0].weight, group[0].bias))


def test_a_bias_made_under_inference_mode_multiplies_without_the_cache() -> None:
    group = layers((8, 4), (8, 4))
    with torch.inference_mode():
        group[1].bias = torch.nn.Parameter(torch.randn(4))
    assert_products_follow(torch.randn(1, 8), group)
