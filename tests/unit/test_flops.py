"""The FLOP formula against PyTorch's own FLOP counter on real forward and backward passes."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from attnlab.model.flops import forward_flops, training_flops
from attnlab.model.transformer import Transformer
from helpers import tiny_config


@pytest.mark.parametrize(
    ("overrides", "shape"),
    [
        ({}, (3, 7, 5)),
        ({"d_head": 4, "n_heads": 2}, (2, 4, 9)),
        ({"n_decoder_layers": 3, "d_ff": 48}, (1, 6, 6)),
    ],
)
def test_formula_equals_the_flop_counter(overrides: dict, shape: tuple[int, int, int]) -> None:
    config = tiny_config(dropout=0.0, **overrides)
    model = Transformer(config)
    batch, src_len, tgt_len = shape
    src = torch.randint(4, config.src_vocab_size, (batch, src_len))
    tgt = torch.randint(4, config.tgt_vocab_size, (batch, tgt_len))
    # The math kernel of scaled_dot_product_attention runs the attention as matmuls the counter sees
    # (it has no formula for the fused CPU kernel).
    with sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as counter:
            model(src, tgt)
        assert forward_flops(config, batch, src_len, tgt_len) == counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            model(src, tgt).float().sum().backward()
        assert training_flops(config, batch, src_len, tgt_len) == counter.get_total_flops()
