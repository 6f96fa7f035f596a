"""Encoder and decoder layers (§3.1) built from shared parts: attention, FFN, residual + LayerNorm.

Notation: `B` batch, `S` source length, `T` target length, `D` d_model, `F` d_ff.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from attnlab.model.attention import MultiHeadAttention
from attnlab.model.cache import LayerKV
from attnlab.model.config import TransformerConfig
from attnlab.model.dropout import Dropout
from attnlab.model.linear import Linear

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


class FeedForward(nn.Module):
    """FFN(x) = W_2 act(W_1 x + b_1) + b_2, applied to each position separately (§3.3)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.w_1 = Linear(config.d_model, config.d_ff)
        self.activation = ACTIVATIONS[config.activation]()
        self.dropout = Dropout(config.activation_dropout)
        self.w_2 = Linear(config.d_ff, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        h = self.activation(self.w_1(x))  # (B, T, F)
        return self.w_2(self.dropout(h) if self.training else h)  # (B, T, D); no call at all in eval


class Residual(nn.Module):
    """A sublayer wrapped in dropout, a residual connection and LayerNorm (§3.1, §5.4).

    Post-norm (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-norm (`norm_first`): x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.dropout)
        self.norm_first = config.norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            h = sublayer(self.norm(x))
            return x + (self.dropout(h) if self.training else h)
        h = sublayer(x)
        return self.norm(x + (self.dropout(h) if self.training else h))


def _attention(config: TransformerConfig) -> MultiHeadAttention:
    return MultiHeadAttention(
        d_model=config.d_model, n_heads=config.n_heads, d_head=config.d_head, dropout=config.attention_dropout
    )


class EncoderLayer(nn.Module):
    """Self-attention, then the position-wise FFN, each in a residual block."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = _attention(config)
        self.ffn = FeedForward(config)
        self.attn_block = Residual(config)
        self.ffn_block = Residual(config)

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """x (B, S, D), mask (B, 1, 1, S) True at real source tokens."""
        x = self.attn_block(x, lambda h: self.self_attn(h, mask=mask)[0])
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, then the FFN (§3.1)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = _attention(config)
        self.cross_attn = _attention(config)
        self.ffn = FeedForward(config)
        self.self_attn_block = Residual(config)
        self.cross_attn_block = Residual(config)
        self.ffn_block = Residual(config)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        memory_mask: Tensor | None = None,
        cache: LayerKV | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D), memory (B, S, D), memory_mask (B, 1, 1, S).

        Returns the output (B, T, D) and, when asked, the cross-attention weights (B, H, T, S).
        """
        x = self.self_attn_block(x, lambda h: self.self_attn(h, is_causal=True, cache=cache)[0])
        weights = None

        def cross(h: Tensor) -> Tensor:
            nonlocal weights
            out, weights = self.cross_attn(
                h, memory, mask=memory_mask, cache=cache, need_weights=need_weights
            )
            return out

        x = self.cross_attn_block(x, cross)
        return self.ffn_block(x, self.ffn), weights
