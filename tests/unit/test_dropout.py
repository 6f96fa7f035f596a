"""attnlab's CPU dropout: its masks keep each element with probability 1 - effective_p, independently,
scale the kept ones so the expectation is unchanged, follow torch's seed, and act in training only."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.model.dropout import Dropout, dropout, effective_p, keep_mask

N = 1 << 22  # 4M draws: the keep rate's standard error is below 2.5e-4


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_each_half_of_a_draw_drops_with_the_effective_probability(p: float) -> None:
    """Even elements read the low 16 bits of a draw, odd ones its high 15: both must drop at the same
    rate, and neighbours must be independent (a wrong threshold or shift shows up in one of the three)."""
    torch.manual_seed(0)
    mask = keep_mask(torch.empty(N), p).view(-1, 2).double()
    q = 1.0 - effective_p(p)
    sigma = math.sqrt(q * (1 - q) / (N // 2))
    for half in (mask[:, 0], mask[:, 1]):
        assert abs(half.mean().item() - q) < 5 * sigma
    both = (mask[:, 0] * mask[:, 1]).mean().item()
    assert abs(both - q * q) < 5 * sigma


def test_effective_p_is_p_rounded_to_a_multiple_of_2_to_the_minus_15() -> None:
    assert effective_p(0.1) == 3277 / 32768
    assert effective_p(0.5) == 0.5
    assert abs(effective_p(0.3) - 0.3) <= 2**-16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5), (2, 7, 9), (1,)])
def test_kept_values_are_scaled_and_the_gradient_uses_the_same_mask(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """Bit for bit: x times the scale in the input's dtype where `keep_mask` keeps, 0 elsewhere (a run's
    numbers must not change with how the mask is computed)."""
    x = torch.randn(*shape).to(dtype).requires_grad_()
    torch.manual_seed(3)
    out = dropout(x, 0.4)
    torch.manual_seed(3)
    mask = keep_mask(x, 0.4)
    scale = torch.tensor(1.0 / (1.0 - effective_p(0.4))).to(dtype)  # float32 first, as F.dropout rounds it
    assert torch.equal(out, torch.where(mask, x.detach() * scale, 0.0))
    out.sum().backward()
    assert torch.equal(x.grad, torch.where(mask, scale, 0.0).to(dtype))


def test_the_expectation_is_the_input() -> None:
    torch.manual_seed(0)
    out = dropout(torch.ones(N), 0.1)
    assert abs(out.mean().item() - 1.0) < 5 * math.sqrt(0.1 / 0.9 / N)


def test_masks_follow_the_seed_and_differ_between_calls() -> None:
    x = torch.ones(1000)
    torch.manual_seed(5)
    first, second = keep_mask(x, 0.5), keep_mask(x, 0.5)
    torch.manual_seed(5)
    assert torch.equal(keep_mask(x, 0.5), first)
    assert not torch.equal(first, second)


def test_the_module_is_the_identity_in_eval_and_at_p_zero() -> None:
    x = torch.randn(4, 8)
    module = Dropout(0.5).eval()
    assert module(x) is x
    assert Dropout(0.0).train()(x) is x
    dropped = Dropout(0.5).train()(x)
    assert bool((dropped == 0).any()) and torch.allclose(dropped[dropped != 0], 2 * x[dropped != 0])


def test_off_the_cpu_and_under_compile_it_is_torchs_dropout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor not on the CPU (here the meta device), or a traced graph, goes to F.dropout."""
    from attnlab.model import dropout as module  # the module whose names are patched

    def refuse(x: torch.Tensor, p: float) -> torch.Tensor:
        raise AssertionError("keep_mask drawn where F.dropout should be")

    monkeypatch.setattr(module, "keep_mask", refuse)
    assert dropout(torch.empty(4, 8, device="meta"), 0.5).shape == (4, 8)
    monkeypatch.setattr(module, "_compiling", lambda: True)
    x = torch.randn(64, 32)
    torch.manual_seed(2)
    ours = dropout(x, 0.5)
    torch.manual_seed(2)
    torch.testing.assert_close(ours, torch.nn.functional.dropout(x, 0.5))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_the_output_and_gradient_keep_the_input_dtype(dtype: torch.dtype) -> None:
    """bf16 activations (CPU autocast) stay bf16: the float32 scaled mask must not promote them."""
    x = torch.randn(6, 10, dtype=dtype, requires_grad=True)
    out = dropout(x, 0.1)
    out.sum().backward()
    assert out.dtype == dtype and x.grad is not None and x.grad.dtype == dtype


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_a_probability_outside_0_and_1_is_refused(p: float) -> None:
    """As F.dropout: int16 thresholds would otherwise wrap around (1.5 gave -2 for every element)."""
    with pytest.raises(ValueError, match="between 0 and 1"):
        dropout(torch.ones(4), p)
