"""The training objective: label-smoothed cross-entropy (§5.4), from logits or fused with the output layer.

`label_smoothed_nll_loss` takes logits (B, T, V). `output_layer_loss` takes the decoder's hidden states
(B, T, D) and the output layer, and computes the same sums without ever holding the (B·T, V) logits: rows
go through the output layer, softmax and the loss in chunks of a few MB, and, when gradients are
wanted, each chunk's gradient with respect to the hidden states, the weight and the bias is computed
right there (softmax minus the smoothed target), while the chunk is still in cache. The backward pass
only scales them by the incoming gradient. Each chunk's softmax is written over its logits, and the loss
needs no log-probabilities: a row's logsumexp is its largest logit minus the log of its largest
probability. A chunk then takes a mean, a max, the softmax and a subtraction where it took log_softmax,
a mean, exp, a subtraction and a padding mask: 3.1 instead of 6.3 ms for 512 rows × vocabulary 8000 on
2 threads (docs/benchmarks.md). This is what training and validation use
(`TranslationModule`). The logits and their gradient (2 × 131 MB for 4096 target tokens × vocabulary
8000, 2 × 3.7 GB for 25k tokens × 37k) are never allocated, and the step is faster:
`scripts/bench_train.py` puts attnlab's `model=small` step at 1.10× MarianMT's with this loss and 1.02×
with `F.cross_entropy` on the logits (`--loss logits`), docs/benchmarks.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.model.linear import _compiling

# Elements of one chunk's logits: 4M (16 MB in float32) on the CPU, where a chunk should stay in the last
# level cache (chunks of 256-2048 rows timed at vocabulary 8000: 512 fastest for 4096 rows, 256 for 1024),
# 64M on accelerators.
CHUNK_ELEMENTS = {"cpu": 1 << 22}
DEFAULT_CHUNK_ELEMENTS = 1 << 26


def _drops_padding(device_type: str) -> bool:
    """Whether `output_layer_loss` drops padding rows before the output layer: on the CPU outside
    torch.compile (a graph cannot take a data-dependent row count); elsewhere the loss masks them."""
    return device_type == "cpu" and not _compiling()


def label_smoothed_nll_loss(
    logits: Tensor, target: Tensor, *, epsilon: float, ignore_index: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Summed label-smoothed cross-entropy and NLL over non-padding targets (§5.4).

    The smoothed target puts 1 - ε on the reference and spreads ε uniformly over all V classes
    (as `F.cross_entropy(label_smoothing=ε)` does).

    Args:
        logits: (N, V) or (B, T, V).
        target: (N,) or (B, T) ids.
        epsilon: ε_ls.
        ignore_index: Target id that contributes nothing (padding).

    Returns:
        (loss sum, nll sum, number of non-padding targets).
    """
    lprobs = F.log_softmax(logits.float(), dim=-1).flatten(0, -2)  # (N, V)
    target = target.flatten()
    keep = target != ignore_index
    nll = -lprobs.gather(-1, target.clamp(min=0)[:, None]).squeeze(-1)  # (N,)
    smooth = -lprobs.mean(dim=-1)  # (N,)
    nll_sum = (nll * keep).sum()  # masks instead of boolean indexing: no data-dependent shapes
    loss_sum = (1.0 - epsilon) * nll_sum + epsilon * (smooth * keep).sum()
    return loss_sum, nll_sum, keep.sum()


def output_layer_loss(
    hidden: Tensor,
    output: nn.Linear,
    target: Tensor,
    *,
    epsilon: float,
    ignore_index: int,
    chunk_rows: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """`label_smoothed_nll_loss(output(hidden), ...)` without materialising the logits (module docstring).

    The loss sum carries the gradient (to `hidden`, `output.weight` and `output.bias`); the NLL sum is
    for logging and carries none. Double backward is not supported. Under autocast the products run in
    the autocast dtype, the softmax and the sums in float32, as they would through `output` and
    `label_smoothed_nll_loss`.

    Args:
        hidden: Decoder output (B, T, D) or (N, D).
        output: The output layer (weight (V, D), optional bias (V,)).
        target: (B, T) or (N,) ids.
        epsilon: ε_ls.
        ignore_index: Target id that contributes nothing (padding).
        chunk_rows: Rows per chunk; default from `CHUNK_ELEMENTS` (by device) and V.

    Returns:
        (loss sum, nll sum, number of non-padding targets), as `label_smoothed_nll_loss`.
    """
    hidden = hidden.reshape(-1, hidden.size(-1))
    target = target.reshape(-1)
    if hidden.size(0) != target.size(0):
        raise ValueError(f"{hidden.size(0)} hidden rows but {target.size(0)} targets")
    if chunk_rows is None:
        elements = CHUNK_ELEMENTS.get(hidden.device.type, DEFAULT_CHUNK_ELEMENTS)
        chunk_rows = max(64, elements // output.weight.size(0))
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows={chunk_rows} must be >= 1")
    keep = target != ignore_index
    count = keep.sum()
    if _drops_padding(hidden.device.type) and int(count) < keep.numel():
        # Padding rows add nothing to the sums: on the CPU they skip the output layer (8% of Multi30k's
        # target positions in token batches, about 2% of a step: docs/benchmarks.md); their gradient is
        # zero through `index_select`'s backward. (Elsewhere the mask keeps shapes static.)
        rows = keep.nonzero().squeeze(1)
        hidden, target, keep = hidden.index_select(0, rows), target.index_select(0, rows), keep[rows]
    # the Function's forward runs without grad mode and its ctx.needs_input_grad ignores no_grad: pass it
    grads = torch.is_grad_enabled()
    loss_sum, nll_sum = _OutputLayerLoss.apply(
        hidden, output.weight, output.bias, target.clamp(min=0), keep, float(epsilon), int(chunk_rows), grads
    )
    return loss_sum, nll_sum, count


def _rows_loss(z: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """-log p_t, -mean(log p) and the softmax p, written over `z`, of float32 logits z (r, V) with targets
    (r, 1).

    -log p_t = lse - z_t and -mean(log p) = lse - mean(z), with lse the row's logsumexp, read off the
    softmax: the largest probability is exp(max z - lse), so lse = max z - log(max p), with max p >= 1/V
    (no underflow, where the target's own probability can underflow). Rounding is at the logits'
    magnitude: for rows shifted by 1e3, the smoothing term's error is about 1e-4 (4e-6 through
    log_softmax).
    """
    z_t = z.gather(1, target).squeeze(1)
    z_mean = z.mean(dim=-1)
    z_max = z.amax(dim=-1)
    probs = torch.ops.aten._softmax.out(z, -1, False, out=z)
    lse = z_max - probs.amax(dim=-1).log()
    return lse - z_t, lse - z_mean, probs


class _OutputLayerLoss(torch.autograd.Function):
    """Loss and NLL sums of the output layer over chunks of rows; gradients computed in the forward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        keep: Tensor,
        epsilon: float,
        chunk_rows: int,
        grads: bool,
    ) -> tuple[Tensor, Tensor]:
        device = hidden.device.type
        compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        wants = [grads and needed for needed in ctx.needs_input_grad[:3]]
        with torch.autocast(device, enabled=False):
            h_all = hidden.to(compute)
            w = weight.to(compute)
            b = None if bias is None else bias.to(compute)
            grad_h = torch.empty_like(h_all) if wants[0] else None
            grad_w = None  # (V, D) in float32: the first chunk's product, then the others added to it
            grad_b = None if b is None or not wants[2] else torch.zeros_like(bias, dtype=torch.float32)
            loss = hidden.new_zeros((), dtype=torch.float32)
            nll = hidden.new_zeros((), dtype=torch.float32)
            vocab = w.size(0)
            mask_rows = not _drops_padding(device)  # rows that may be padding
            for start in range(0, h_all.size(0), chunk_rows):
                z = probs = grad = grad_c = None  # the previous chunk's (r, V) buffers: freed here
                h = h_all[start : start + chunk_rows]  # (r, D)
                t = target[start : start + chunk_rows, None]  # (r, 1)
                kept = keep[start : start + chunk_rows].float()  # (r,)
                # (r, V) float32, this chunk's own buffer: under autocast the lower-precision product is a
                # temporary, freed once copied, so no two (r, V) logits buffers are alive at once
                z = (torch.mm(h, w.t()) if b is None else torch.addmm(b, h, w.t())).float()
                row_nll, row_smooth, probs = _rows_loss(z, t)
                nll = nll + (row_nll * kept).sum()
                loss = loss + (((1.0 - epsilon) * row_nll + epsilon * row_smooth) * kept).sum()
                if not any(wants):
                    continue
                # d loss_row / d logits = softmax - smoothed target, for kept rows (zero for padding; on the
                # CPU outside torch.compile `output_layer_loss` has dropped the padding rows already)
                grad = probs.sub_(epsilon / vocab)
                if mask_rows:
                    grad.mul_(kept[:, None])
                grad.scatter_add_(1, t, (kept * -(1.0 - epsilon))[:, None])
                grad_c = grad.to(compute)
                if grad_h is not None:
                    torch.mm(grad_c, w, out=grad_h[start : start + chunk_rows])
                if wants[1]:
                    if grad_w is None:  # no zero-filled (V, D) buffer to add the first product to
                        grad_w = torch.mm(grad_c.t(), h).to(torch.float32)
                    elif compute == torch.float32:
                        grad_w.addmm_(grad_c.t(), h)
                    else:
                        grad_w.add_(torch.mm(grad_c.t(), h))
                if grad_b is not None:
                    grad_b.add_(grad.sum(0))
        if wants[1] and grad_w is None:  # no rows
            grad_w = torch.zeros_like(weight, dtype=torch.float32)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_loss: Tensor, _grad_nll: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        # The saved gradients are this Function's own buffers, used once: scaled in place instead of into
        # fresh copies (the (V, D) output-layer gradient among them). A second backward through the same
        # graph (retain_graph=True) then fails autograd's check that saved tensors were not modified.
        saved = ctx.saved_tensors
        grads = tuple(
            None if g is None else g.mul_(grad_loss).to(dtype)
            for g, dtype in zip(saved, ctx.dtypes, strict=True)
        )
        return (*grads, None, None, None, None, None)
