"""The Transformer of "Attention Is All You Need", one module per concept.

`TransformerConfig` is importable without torch (config validation runs before heavy imports); the
torch modules are loaded on first access.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from attnlab.model.config import TransformerConfig

_LAZY = {
    "MultiHeadAttention": "attnlab.model.attention",
    "scaled_dot_product_attention": "attnlab.model.attention",
    "attention_maps": "attnlab.model.attention",
    "KVCache": "attnlab.model.cache",
    "LayerKV": "attnlab.model.cache",
    "SinusoidalPositionalEncoding": "attnlab.model.positional",
    "LearnedPositionalEncoding": "attnlab.model.positional",
    "sinusoidal_table": "attnlab.model.positional",
    "FeedForward": "attnlab.model.layers",
    "Residual": "attnlab.model.layers",
    "EncoderLayer": "attnlab.model.layers",
    "DecoderLayer": "attnlab.model.layers",
    "Encoder": "attnlab.model.transformer",
    "Decoder": "attnlab.model.transformer",
    "Transformer": "attnlab.model.transformer",
}

__all__ = ["TransformerConfig", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnlab.model' has no attribute {name!r}")
