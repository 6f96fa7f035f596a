"""Small builders shared by the tests (importable as `helpers`; see `pythonpath` in pyproject.toml)."""

from __future__ import annotations

from typing import Any

from attnlab.model.config import TransformerConfig

TINY = {
    "src_vocab_size": 50,
    "tgt_vocab_size": 50,
    "d_model": 32,
    "n_heads": 4,
    "d_ff": 64,
    "n_encoder_layers": 2,
    "n_decoder_layers": 2,
}


def tiny_config(**overrides: Any) -> TransformerConfig:
    """The tiny test model (D=32, H=4, 2+2 layers, V=50) with `overrides` applied."""
    return TransformerConfig(**{**TINY, **overrides})
