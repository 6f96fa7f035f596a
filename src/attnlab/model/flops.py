"""Exact matrix-multiply FLOP counts of the Transformer, for throughput and model FLOPs utilisation.

A multiply-add counts 2 FLOPs. For a batch of B sentences padded to S source and T target tokens, the
forward pass costs

- encoder: every weight matrix of the encoder (Q, K, V, O projections, two FFN linears) × B·S source
  tokens × 2, plus attention Q·Kᵀ and weights·V: 2 × 2 × B·S·S·H·Dh per layer;
- decoder: self-attention and FFN weights × B·T target tokens × 2, cross-attention Q and O × B·T, its K
  and V × B·S (they read the encoder output), plus attention 2 × 2 × B·T·(T + S)·H·Dh per layer;
- output projection: D × V × B·T × 2.

A training step (forward and backward) costs 3× the forward pass: the backward pass of a matrix
multiply is two multiplies of the same size. Element-wise work (softmax, LayerNorm, activations,
dropout, the loss) is not counted; neither is padding removed: the count is for the tensors computed.
`torch.utils.flop_counter.FlopCounterMode` gives the same numbers (tested).
"""

from __future__ import annotations

import time
from typing import Any

from attnlab.model.config import TransformerConfig


def forward_flops(config: TransformerConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """Matrix-multiply FLOPs of one teacher-forced forward pass over a padded (batch, src_len, tgt_len)."""
    d, inner, ff = config.d_model, config.n_heads * config.head_dim, config.d_ff
    if config.tgt_vocab_size is None:
        raise ValueError("forward_flops: the config has no tgt_vocab_size (use config.with_vocab)")
    src, tgt = batch * src_len, batch * tgt_len
    attention_weights = 4 * d * inner  # Q, K, V, O
    ffn_weights = 2 * d * ff
    encoder = config.n_encoder_layers * (
        2 * src * (attention_weights + ffn_weights) + 4 * batch * src_len * src_len * inner
    )
    decoder = config.n_decoder_layers * (
        2 * tgt * (attention_weights + 2 * d * inner + ffn_weights)  # self-attention, cross Q and O, FFN
        + 2 * src * 2 * d * inner  # cross-attention K and V over the encoder output
        + 4 * batch * tgt_len * (tgt_len + src_len) * inner  # self- and cross-attention matmuls
    )
    output = 2 * tgt * d * config.tgt_vocab_size
    return encoder + decoder + output


# the aten operators of the matrix products these counts are for (self time under `torch.profiler`; the
# in-place forms accumulate into an existing result, as the fused loss's weight gradient does)
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm"})


def training_flops(config: TransformerConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """Forward and backward: 3 × `forward_flops`."""
    return 3 * forward_flops(config, batch, src_len, tgt_len)


def matmul_rate(device: str = "cpu", dtype: Any = None, size: int = 2048, repeats: int = 10) -> float:
    """Measured FLOP/s of a (size × size) @ (size × size) matmul on `device` in `dtype` (default float32):
    the denominator of model FLOPs utilisation."""
    import torch

    a = torch.randn(size, size, device=device, dtype=dtype or torch.float32)
    b = torch.randn(size, size, device=device, dtype=dtype or torch.float32)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    for _ in range(2):
        a @ b
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2 * size**3 * repeats / (time.perf_counter() - start)
