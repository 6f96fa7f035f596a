"""The objective and the optimiser: label-smoothed loss, LR schedules, `OptimConfig`, `TranslationModule`."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.optim import OptimConfig
from attnlab.training.loss import label_smoothed_nll_loss, output_layer_loss
from attnlab.training.module import TranslationModule, exact_matches
from helpers import tiny_config

V, PAD = 50, 0


def logits_and_targets(shape: tuple[int, ...], seed: int = 0) -> tuple[Tensor, Tensor]:
    """Random logits `shape + (V,)` and targets `shape` with roughly a third of them padding."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, V, generator=gen) * 3.0
    target = torch.randint(1, V, shape, generator=gen)
    target = target.masked_fill(torch.rand(shape, generator=gen) < 0.3, PAD)
    assert (target == PAD).any() and (target != PAD).any()
    return logits, target


# ---------------------------------------------------------------------------------------------------------
# label_smoothed_nll_loss


@pytest.mark.parametrize("shape", [(4, 7), (28,)], ids=["BTV", "NV"])
@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_loss_equals_torch_cross_entropy(shape: tuple[int, ...], epsilon: float) -> None:
    logits, target = logits_and_targets(shape)
    loss_sum, nll_sum, n_tokens = label_smoothed_nll_loss(logits, target, epsilon=epsilon, ignore_index=PAD)
    flat_logits, flat_target = logits.reshape(-1, V), target.reshape(-1)
    expected = F.cross_entropy(
        flat_logits, flat_target, ignore_index=PAD, label_smoothing=epsilon, reduction="sum"
    )
    expected_nll = F.cross_entropy(flat_logits, flat_target, ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(loss_sum, expected)
    torch.testing.assert_close(nll_sum, expected_nll)
    assert int(n_tokens) == int((target != PAD).sum())


def test_loss_with_zero_epsilon_is_the_nll() -> None:
    logits, target = logits_and_targets((3, 5), seed=1)
    loss_sum, nll_sum, _ = label_smoothed_nll_loss(logits, target, epsilon=0.0, ignore_index=PAD)
    torch.testing.assert_close(loss_sum, nll_sum)


def test_padding_positions_contribute_nothing() -> None:
    logits, target = logits_and_targets((4, 6), seed=2)
    before = label_smoothed_nll_loss(logits, target, epsilon=0.1, ignore_index=PAD)
    scrambled = logits.clone()
    scrambled[target == PAD] = torch.randn_like(scrambled[target == PAD]) * 100.0
    after = label_smoothed_nll_loss(scrambled, target, epsilon=0.1, ignore_index=PAD)
    for a, b in zip(before, after, strict=True):
        torch.testing.assert_close(a, b)
    # The nll is the sum of -log p(target) over the non-pad positions only.
    lprobs = F.log_softmax(logits, dim=-1)
    keep = target != PAD
    manual = -lprobs.gather(-1, target[..., None]).squeeze(-1)[keep].sum()
    torch.testing.assert_close(before[1], manual)
    assert int(before[2]) == int(keep.sum())


def test_all_padding_batch_gives_zeros() -> None:
    logits = torch.randn(2, 3, V)
    target = torch.full((2, 3), PAD)
    loss_sum, nll_sum, n_tokens = label_smoothed_nll_loss(logits, target, epsilon=0.1, ignore_index=PAD)
    assert int(n_tokens) == 0
    assert float(loss_sum) == 0.0
    assert float(nll_sum) == 0.0
    assert torch.isfinite(loss_sum) and torch.isfinite(nll_sum)


def test_loss_is_larger_with_smoothing_for_a_confident_correct_model() -> None:
    target = torch.tensor([3, 4, 5])
    logits = F.one_hot(target, V).float() * 20.0
    smoothed, nll, _ = label_smoothed_nll_loss(logits, target, epsilon=0.1, ignore_index=PAD)
    assert float(smoothed) > float(nll)


# ---------------------------------------------------------------------------------------------------------
# output_layer_loss: the same sums and gradients as the output layer followed by label_smoothed_nll_loss


def output_layer_case(bias: bool, seed: int = 0) -> tuple[Tensor, torch.nn.Linear, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 7, 16, generator=gen)
    output = torch.nn.Linear(16, V, bias=bias)
    with torch.no_grad():
        output.weight.copy_(torch.randn(V, 16, generator=gen))
        if bias:
            output.bias.copy_(torch.randn(V, generator=gen))
    target = torch.randint(1, V, (3, 7), generator=gen).masked_fill(
        torch.rand(3, 7, generator=gen) < 0.3, PAD
    )
    assert (target == PAD).any()
    return hidden, output, target


def loss_and_grads(fused: bool, bias: bool, chunk_rows: int | None, scale: float) -> list[Tensor]:
    hidden, output, target = output_layer_case(bias)
    hidden.requires_grad_()
    if fused:
        loss, nll, n = output_layer_loss(
            hidden, output, target, epsilon=0.1, ignore_index=PAD, chunk_rows=chunk_rows
        )
    else:
        loss, nll, n = label_smoothed_nll_loss(output(hidden), target, epsilon=0.1, ignore_index=PAD)
    (loss * scale).backward()  # a scaled loss, as a mean over tokens or a gradient scaler gives
    grads = [hidden.grad, output.weight.grad] + ([output.bias.grad] if bias else [])
    return [loss.detach(), nll.detach(), n.float(), *grads]


@pytest.mark.parametrize("chunk_rows", [None, 1, 5, 64], ids=["default", "1", "5", "64"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_output_layer_loss_equals_the_logits_path(chunk_rows: int | None, bias: bool) -> None:
    expected = loss_and_grads(False, bias, None, scale=0.37)
    fused = loss_and_grads(True, bias, chunk_rows, scale=0.37)
    for got, want in zip(fused, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert fused[3].abs().sum() > 0 and fused[4].abs().sum() > 0


@pytest.mark.parametrize("scale", [30.0, 300.0])
def test_output_layer_loss_is_exact_where_the_targets_probability_underflows(scale: float) -> None:
    """Large logits: targets with log-probabilities far below float32's smallest probability (about
    -104), and confident rows. The loss reads logsumexp off the largest probability (at least 1/V), so it
    stays finite and equal to the log_softmax path; one read off the target's own probability would give
    inf here."""
    hidden, output, target = output_layer_case(bias=True)
    hidden = hidden * scale
    logits = output(hidden).detach().flatten(0, 1)
    lprobs = logits.log_softmax(-1).gather(1, target.flatten()[:, None])
    assert lprobs.min() < -200 if scale > 100 else lprobs.min() < -110  # underflows as a probability
    expected = loss_and_grads_of(hidden, output, target, fused=False)
    got = loss_and_grads_of(hidden, output, target, fused=True, chunk_rows=5)
    assert all(bool(torch.isfinite(g).all()) for g in got)
    for g, want in zip(got, expected, strict=True):  # (sums of terms near 30 in other orders: 2e-5 apart)
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-4)


def test_output_layer_loss_compiles_as_one_graph() -> None:
    """Under torch.compile(fullgraph=True) the loss traces whole (no question about the data, such as
    whether a chunk has padding) and gives the eager loss and gradients."""
    torch._dynamo.reset()
    hidden, output, target = output_layer_case(bias=True)
    expected = loss_and_grads_of(hidden, output, target, fused=True, chunk_rows=5)

    def loss_of(h: Tensor) -> Tensor:
        return output_layer_loss(h, output, target, epsilon=0.1, ignore_index=PAD, chunk_rows=5)[0]

    compiled = torch.compile(loss_of, backend="aot_eager", fullgraph=True)
    output.zero_grad(set_to_none=True)
    h = hidden.detach().requires_grad_()
    loss = compiled(h)
    loss.backward()
    for got, want in zip((loss.detach(), h.grad, output.weight.grad, output.bias.grad),
                         (expected[0], *expected[2:]), strict=True):  # fmt: skip
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def loss_and_grads_of(
    hidden: Tensor, output: torch.nn.Linear, target: Tensor, *, fused: bool, chunk_rows: int | None = None
) -> list[Tensor]:
    output.zero_grad(set_to_none=True)
    hidden = hidden.detach().requires_grad_()
    if fused:
        loss, nll, _ = output_layer_loss(
            hidden, output, target, epsilon=0.1, ignore_index=PAD, chunk_rows=chunk_rows
        )
    else:
        loss, nll, _ = label_smoothed_nll_loss(output(hidden), target, epsilon=0.1, ignore_index=PAD)
    loss.backward()
    return [loss.detach(), nll.detach(), hidden.grad, output.weight.grad, output.bias.grad]


def test_padding_rows_never_reach_the_output_layer_on_the_cpu() -> None:
    """Padding rows skip the output layer (they only added zeros): with NaN in their hidden states the
    sums and gradients are those of the other rows, finite, and the padding rows' gradient is zero."""
    hidden, output, target = output_layer_case(bias=True)
    pad = target == PAD
    expected = loss_and_grads_of(hidden, output, target, fused=True, chunk_rows=5)
    got = loss_and_grads_of(hidden.masked_fill(pad[..., None], float("nan")), output, target, fused=True,
                            chunk_rows=5)  # fmt: skip
    for g, want in zip(got, expected, strict=True):
        torch.testing.assert_close(g, want)
    assert bool((got[2][pad] == 0).all())


def test_output_layer_loss_refuses_mismatched_rows_and_empty_chunks() -> None:
    hidden, output, target = output_layer_case(bias=False)
    with pytest.raises(ValueError, match="21 hidden rows but 20 targets"):
        output_layer_loss(hidden, output, target.flatten()[:20], epsilon=0.1, ignore_index=PAD)
    with pytest.raises(ValueError, match="chunk_rows=0 must be >= 1"):
        output_layer_loss(hidden, output, target, epsilon=0.1, ignore_index=PAD, chunk_rows=0)


def test_output_layer_loss_ignores_padding_rows_and_gives_them_no_gradient() -> None:
    hidden, output, target = output_layer_case(bias=True)
    hidden.requires_grad_()
    loss, _, _ = output_layer_loss(hidden, output, target, epsilon=0.1, ignore_index=PAD, chunk_rows=4)
    loss.backward()
    pad = target == PAD
    assert hidden.grad[pad].abs().max() == 0 and hidden.grad[~pad].abs().min() > 0
    scrambled = hidden.detach().clone()
    scrambled[pad] = torch.randn_like(scrambled[pad]) * 100
    again, _, _ = output_layer_loss(scrambled, output, target, epsilon=0.1, ignore_index=PAD, chunk_rows=4)
    torch.testing.assert_close(again, loss.detach())


def test_output_layer_loss_of_no_rows_gives_zero_gradients() -> None:
    """An empty batch of rows (no chunk runs): loss 0 and zero gradients of the output layer's shape."""
    hidden, output, target = output_layer_case(bias=True)
    hidden = hidden.reshape(-1, hidden.size(-1))[:0].detach().requires_grad_()
    loss, nll, n = output_layer_loss(hidden, output, target.flatten()[:0], epsilon=0.1, ignore_index=PAD)
    loss.backward()
    assert float(loss.detach()) == 0.0 and float(nll) == 0.0 and int(n) == 0
    assert output.weight.grad.shape == output.weight.shape and not output.weight.grad.any()
    assert output.bias.grad is not None and not output.bias.grad.any()


def test_output_layer_loss_refuses_a_second_backward_instead_of_doubling_its_scale() -> None:
    """backward scales the saved gradients in place: a retained graph's second backward must fail
    (autograd's check on modified saved tensors), never return gradients scaled twice."""
    hidden, output, target = output_layer_case(bias=False)
    hidden.requires_grad_()
    loss, _, _ = output_layer_loss(hidden, output, target, epsilon=0.1, ignore_index=PAD)
    (loss * 0.5).backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (loss * 0.5).backward()


def test_output_layer_loss_without_grad_mode_keeps_no_gradient_state() -> None:
    hidden, output, target = output_layer_case(bias=False)
    expected = label_smoothed_nll_loss(output(hidden), target, epsilon=0.1, ignore_index=PAD)
    with torch.no_grad():
        loss, nll, n = output_layer_loss(hidden, output, target, epsilon=0.1, ignore_index=PAD)
    assert not loss.requires_grad and loss.grad_fn is None
    for got, want in zip((loss, nll, n), expected, strict=True):
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
    hidden.requires_grad_()
    loss, nll, _ = output_layer_loss(hidden, output, target, epsilon=0.1, ignore_index=PAD)
    assert loss.requires_grad and not nll.requires_grad  # the NLL is for logging only


def test_output_layer_loss_under_bf16_autocast_matches_the_logits_path() -> None:
    hidden, output, target = output_layer_case(bias=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = label_smoothed_nll_loss(output(hidden), target, epsilon=0.1, ignore_index=PAD)[0]
        hidden.requires_grad_()
        loss, _, _ = output_layer_loss(hidden, output, target, epsilon=0.1, ignore_index=PAD, chunk_rows=4)
    loss.backward()
    assert loss.dtype == torch.float32 and output.weight.grad.dtype == torch.float32
    assert hidden.grad.dtype == hidden.dtype
    torch.testing.assert_close(loss, expected.detach(), rtol=2e-2, atol=0.0)


def test_under_autocast_a_chunks_lower_precision_logits_are_freed_before_its_softmax(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only one (r, V) logits buffer at a time: the bf16 product is copied to float32 and dropped, not kept
    alive beside the float32 softmax (on an accelerator's 64M-element chunks 128 MB more), and the previous
    chunk's float32 buffer is gone before the next chunk's product (256 MB more)."""
    import weakref

    from attnlab.training import loss as loss_module

    products: list[weakref.ref] = []
    chunks: list[weakref.ref] = []  # each chunk's float32 logits, overwritten by its softmax and gradient
    alive_at_softmax: list[bool] = []
    previous_alive_at_product: list[bool] = []
    real_addmm, real_rows_loss = torch.addmm, loss_module._rows_loss

    def addmm(*args: Any, **kwargs: Any) -> Tensor:
        if chunks:
            previous_alive_at_product.append(chunks[-1]() is not None)
        out = real_addmm(*args, **kwargs)
        products.append(weakref.ref(out))
        return out

    def rows_loss(z: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        alive_at_softmax.append(products[-1]() is not None)
        chunks.append(weakref.ref(z))
        return real_rows_loss(z, target)

    monkeypatch.setattr(torch, "addmm", addmm)
    monkeypatch.setattr(loss_module, "_rows_loss", rows_loss)
    hidden, output, target = output_layer_case(bias=True)  # with a bias: the logits come from addmm
    hidden.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output_layer_loss(hidden, output, target, epsilon=0.1, ignore_index=PAD, chunk_rows=4)
    assert alive_at_softmax and not any(alive_at_softmax)
    # nor is the previous chunk's float32 buffer alive while the next chunk's product is made
    assert len(previous_alive_at_product) == len(chunks) - 1 > 0 and not any(previous_alive_at_product)


def test_training_module_loss_equals_the_logits_path() -> None:
    config = tiny_config()
    module = TranslationModule(config, OptimConfig()).eval()  # no dropout: both paths see the same model
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(3, config.src_vocab_size, (3, 6), generator=gen)
    tgt = torch.randint(3, config.tgt_vocab_size, (3, 6), generator=gen)
    tgt[0, 4:] = config.pad_id
    batch = {"src": src, "tgt_in": tgt, "tgt_out": tgt.roll(-1, 1)}
    expected = label_smoothed_nll_loss(module.model(src, tgt), batch["tgt_out"], epsilon=0.1, ignore_index=0)
    got = module._loss(batch, 0.1)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# OptimConfig.lr_at


def noam(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("d_model", [32, 512])
@pytest.mark.parametrize("step", [1, 2, 7, 99, 100, 101, 250, 4000, 10_000])
def test_noam_matches_closed_form(step: int, d_model: int) -> None:
    cfg = OptimConfig(schedule="noam", warmup_steps=100, lr_scale=2.0)
    assert cfg.lr_at(step, d_model) == pytest.approx(noam(step, d_model, 100, scale=2.0), rel=1e-12)


def test_noam_shape_linear_warmup_peak_then_inverse_sqrt() -> None:
    warmup, d = 100, 64
    cfg = OptimConfig(schedule="noam", warmup_steps=warmup)
    lrs = {s: cfg.lr_at(s, d) for s in range(1, 4 * warmup)}
    assert max(lrs, key=lrs.__getitem__) == warmup
    assert lrs[warmup] == pytest.approx(d**-0.5 * warmup**-0.5)
    for s in (1, 10, 50):  # linear before the peak
        assert lrs[s] == pytest.approx(lrs[1] * s)
    for s in (150, 200, 399):  # ∝ step^-0.5 after it
        assert lrs[s] == pytest.approx(lrs[warmup] * math.sqrt(warmup / s))
    increasing = [lrs[s] for s in range(1, warmup + 1)]
    assert increasing == sorted(increasing)
    decreasing = [lrs[s] for s in range(warmup, 4 * warmup)]
    assert decreasing == sorted(decreasing, reverse=True)


def test_inverse_sqrt_schedule() -> None:
    warmup, peak = 40, 1e-3
    cfg = OptimConfig(schedule="inverse_sqrt", warmup_steps=warmup, peak_lr=peak)
    d = 32  # ignored by this schedule
    assert cfg.lr_at(warmup, d) == peak
    assert cfg.lr_at(warmup, 512) == peak
    for s in (1, 5, 20, 39):
        assert cfg.lr_at(s, d) == pytest.approx(peak * s / warmup)
    for s in (41, 100, 160, 10_000):
        assert cfg.lr_at(s, d) == pytest.approx(peak * math.sqrt(warmup / s))
    assert cfg.lr_at(160, d) == pytest.approx(peak / 2)


def test_linear_schedule_warms_up_then_decays_to_zero_at_total_steps() -> None:
    warmup, total, peak = 10, 50, 1e-3
    cfg = OptimConfig(schedule="linear", warmup_steps=warmup, peak_lr=peak, total_steps=total)
    assert cfg.lr_at(5, 32) == pytest.approx(peak / 2)
    assert cfg.lr_at(warmup, 32) == pytest.approx(peak)
    assert cfg.lr_at(30, 32) == pytest.approx(peak / 2)
    assert cfg.lr_at(total, 32) == 0.0
    assert cfg.lr_at(total + 7, 32) == 0.0
    # Without total_steps, the caller passes the run's length (the trainer's optimizer steps).
    fitted = OptimConfig(schedule="linear", warmup_steps=warmup, peak_lr=peak)
    assert fitted.lr_at(30, 32, total_steps=total) == cfg.lr_at(30, 32)
    # A run no longer than the warm-up (a smoke test) is all warm-up: it never peaks, nor decays.
    assert [fitted.lr_at(s, 32, total_steps=8) for s in (1, 8)] == [
        pytest.approx(peak / 10),
        pytest.approx(peak * 0.8),
    ]
    with pytest.raises(ValueError, match=r"the run's length: set optim\.total_steps, or trainer\.max_epochs"):
        fitted.lr_at(3, 32)


def test_a_linear_schedules_own_total_steps_outranks_the_runs_length() -> None:
    """`total_steps` given to `lr_at` (the run's length) is used only when `optim.total_steps` is null."""
    peak = 1e-3
    cfg = OptimConfig(schedule="linear", warmup_steps=10, peak_lr=peak, total_steps=50)
    assert cfg.lr_at(30, 32, total_steps=1000) == pytest.approx(peak / 2)  # halfway from 10 to 50
    assert cfg.lr_at(50, 32, total_steps=1000) == 0.0


def test_a_linear_run_as_long_as_its_warmup_ends_at_the_peak() -> None:
    """A run of exactly `warmup_steps` steps is all warm-up: its last step reaches the peak."""
    peak, warmup = 1e-3, 8
    cfg = OptimConfig(schedule="linear", warmup_steps=warmup, peak_lr=peak)
    lrs = [cfg.lr_at(s, 32, total_steps=warmup) for s in range(1, warmup + 1)]
    assert lrs == pytest.approx([peak * s / warmup for s in range(1, warmup + 1)])


@pytest.mark.parametrize("schedule", ["noam", "inverse_sqrt", "linear"])
@pytest.mark.parametrize("total", [7, 8, 9])
def test_warmup_facts_say_whether_the_runs_rates_reach_the_peak(schedule: str, total: int) -> None:
    """`peak_reached` is whether some step of a `total`-step run gets the schedule's peak rate, the rate
    of step `warmup_steps` (8 here): a run of exactly 8 steps does, at its last step."""
    cfg = OptimConfig(schedule=schedule, warmup_steps=8)
    rates = [cfg.lr_at(s, 32, total_steps=total) for s in range(1, total + 1)]
    peak = cfg.lr_at(8, 32, total_steps=max(total, 9))  # a linear run that decays after step 8
    assert cfg.warmup_facts(total)["peak_reached"] is (max(rates) == pytest.approx(peak))


def test_linear_schedule_spans_the_trainers_optimizer_steps() -> None:
    module = build_module(schedule="linear", peak_lr=1e-3)  # 10 warm-up steps
    module.trainer = SimpleNamespace(estimated_stepping_batches=20)
    scheduler = module.configure_optimizers()["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(20):
        lrs.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    assert lrs[9] == pytest.approx(1e-3)  # step 10: the end of warm-up
    assert lrs[-1] == 0.0  # step 20: the last optimizer step of the run


@pytest.mark.parametrize("schedule", ["noam", "inverse_sqrt", "linear"])
def test_step_zero_is_step_one(schedule: str) -> None:
    cfg = OptimConfig(schedule=schedule, warmup_steps=10, total_steps=100 if schedule == "linear" else None)
    assert cfg.lr_at(0, 32) == cfg.lr_at(1, 32)
    assert cfg.lr_at(0, 32) > 0.0
    assert cfg.lr_at(2, 32) > cfg.lr_at(1, 32)


# ---------------------------------------------------------------------------------------------------------
# OptimConfig validation and plain form


BAD_OPTIM: list[tuple[dict[str, Any], str]] = [
    ({"warmup_steps": 0}, "warmup_steps=0"),
    ({"warmup_steps": -5}, "warmup_steps=-5"),
    ({"label_smoothing": 1.0}, "label_smoothing=1.0"),
    ({"label_smoothing": -0.1}, "label_smoothing=-0.1"),
    ({"betas": [0.9, 1.0]}, "betas=[0.9, 1.0]"),
    ({"betas": [0.9]}, "betas=[0.9]"),
    ({"eps": 0}, "eps=0"),
    ({"schedule": "cosine"}, "schedule='cosine'"),
    ({"weight_decay": -1}, "weight_decay=-1"),
    ({"schedule": "linear", "warmup_steps": 10, "total_steps": 10}, "total_steps=10"),
    ({"lr_scale": "big"}, "lr_scale='big'"),
]


@pytest.mark.parametrize(("kwargs", "named"), BAD_OPTIM, ids=[n for _, n in BAD_OPTIM])
def test_optim_config_rejects_bad_values(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        OptimConfig(**kwargs)


def test_optim_config_defaults_are_the_paper() -> None:
    cfg = OptimConfig()
    assert cfg.schedule == "noam"
    assert cfg.warmup_steps == 4000
    assert cfg.betas == (0.9, 0.98)
    assert cfg.eps == 1e-9
    assert cfg.label_smoothing == 0.1
    assert cfg.weight_decay == 0.0


def test_betas_list_is_coerced_to_tuple() -> None:
    cfg = OptimConfig(betas=[0.8, 0.99])
    assert cfg.betas == (0.8, 0.99)
    assert isinstance(cfg.betas, tuple)
    assert hash(cfg) == hash(OptimConfig(betas=(0.8, 0.99)))


def _is_plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_is_plain(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


def test_optim_to_dict_is_plain_and_round_trips() -> None:
    cfg = OptimConfig(schedule="inverse_sqrt", warmup_steps=7, betas=(0.85, 0.95), weight_decay=0.01)
    plain = cfg.to_dict()
    assert type(plain) is dict
    assert _is_plain(plain)
    assert plain["betas"] == [0.85, 0.95]
    assert plain["schedule"] == "inverse_sqrt"
    assert OptimConfig(**plain) == cfg


# ---------------------------------------------------------------------------------------------------------
# TranslationModule: optimiser, scheduler, hyperparameters


def build_module(**optim: Any) -> TranslationModule:
    torch.manual_seed(0)
    return TranslationModule(tiny_config(), OptimConfig(warmup_steps=10, **optim))


def test_configure_optimizers_is_paper_adam_with_stepwise_schedule() -> None:
    module = build_module()
    conf = module.configure_optimizers()
    optimizer, sched = conf["optimizer"], conf["lr_scheduler"]
    assert type(optimizer) is torch.optim.Adam
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98)
    assert group["eps"] == 1e-9
    assert group["weight_decay"] == 0.0
    assert sched["interval"] == "step"
    n_params = sum(len(g["params"]) for g in optimizer.param_groups)
    assert n_params == len(list(module.parameters()))
    scheduler, cfg, d = sched["scheduler"], module.optim_config, module.model_config.d_model
    for k in range(25):
        assert group["lr"] == pytest.approx(cfg.lr_at(k + 1, d), rel=1e-12), f"after {k} scheduler steps"
        optimizer.step()
        scheduler.step()
    assert group["lr"] == pytest.approx(cfg.lr_at(26, d), rel=1e-12)


def test_optimizer_uses_the_fused_adam_and_a_resumed_state_keeps_its_own() -> None:
    module = build_module()
    optimizer = module.configure_optimizers()["optimizer"]
    assert optimizer.param_groups[0]["fused"] is True  # torch's fused kernel on the CPU
    for p in module.parameters():
        p.grad = torch.full_like(p, 0.01)
    lr = optimizer.param_groups[0]["lr"]  # the schedule's first step
    reference = torch.optim.Adam([p.detach().clone() for p in module.parameters()], lr=lr, betas=(0.9, 0.98),
                                 eps=1e-9, foreach=True)  # fmt: skip
    for p, q in zip(reference.param_groups[0]["params"], module.parameters(), strict=True):
        p.grad = q.grad.clone()
    optimizer.step()
    reference.step()
    for p, q in zip(reference.param_groups[0]["params"], module.parameters(), strict=True):
        torch.testing.assert_close(q.detach(), p, rtol=1e-6, atol=1e-7)  # the same update up to rounding
    # a checkpoint written by the multi-tensor implementation resumes with it (bitwise continuation)
    fresh = build_module().configure_optimizers()["optimizer"]
    fresh.load_state_dict(reference.state_dict())
    assert fresh.param_groups[0]["fused"] is None and fresh.param_groups[0]["foreach"] is True


def test_weight_decay_selects_adamw() -> None:
    optimizer = build_module(weight_decay=0.01).configure_optimizers()["optimizer"]
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.param_groups[0]["weight_decay"] == 0.01


def test_hparams_are_plain_and_rebuild_the_module(tmp_path: Path) -> None:
    module = build_module(schedule="inverse_sqrt")
    hparams = {k: dict(v) for k, v in dict(module.hparams).items()}
    assert set(hparams) == {"model", "optim", "decode", "metrics"}
    assert _is_plain(hparams)
    rebuilt = TranslationModule(**module.hparams)
    assert rebuilt.model_config == module.model_config
    assert rebuilt.optim_config == module.optim_config
    assert rebuilt.decode_config == module.decode_config
    assert rebuilt.metrics_config == module.metrics_config
    assert [(n, p.shape) for n, p in rebuilt.named_parameters()] == [
        (n, p.shape) for n, p in module.named_parameters()
    ]
    path = tmp_path / "hparams.pt"
    torch.save({"hyper_parameters": dict(module.hparams)}, path)
    loaded = torch.load(path, weights_only=True)["hyper_parameters"]
    assert loaded == hparams
    assert TranslationModule(**loaded).model_config == module.model_config


# ---------------------------------------------------------------------------------------------------------
# exact_matches


def test_exact_matches_ignore_padding_and_width() -> None:
    hyp = torch.tensor(
        [
            [5, 6, 2, PAD, PAD],  # equals ref row 0
            [7, 2, PAD, PAD, PAD],  # equals ref row 1
            [5, 6, 7, 2, PAD],  # longer than ref row 2
            [9, 2, PAD, PAD, PAD],  # differs in a token
            [5, 6, 2, 9, PAD],  # ref row 4 followed by an extra token
        ]
    )
    ref = torch.tensor([[5, 6, 2], [7, 2, PAD], [5, 6, 2], [8, 2, PAD], [5, 6, 2]])
    assert int(exact_matches(hyp, ref, PAD)) == 2
    assert int(exact_matches(ref, hyp, PAD)) == 2
    assert int(exact_matches(hyp[4:], ref[4:], PAD)) == 0
    assert int(exact_matches(hyp[:2, :3], ref[:2], PAD)) == 2
    assert int(exact_matches(hyp[2:3, :3], ref[2:3], PAD)) == 0  # truncated hypothesis
    assert int(exact_matches(ref, ref, PAD)) == 5
