"""The encoder-decoder Transformer (§3, Figure 1).

Notation: `B` batch, `S` source length, `T` target length, `D` d_model, `V` vocabulary size.
The model returns logits; softmax lives in the loss and in decoding.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.model.cache import KVCache
from attnlab.model.config import TransformerConfig
from attnlab.model.dropout import Dropout
from attnlab.model.layers import DecoderLayer, EncoderLayer
from attnlab.model.linear import Linear
from attnlab.model.positional import build_positional_encoding


class InputEmbedding(nn.Module):
    """Token embedding × sqrt(D) (§3.4) + positional encoding (§3.5), then dropout (§5.4)."""

    def __init__(self, token: nn.Embedding, config: TransformerConfig) -> None:
        super().__init__()
        self.token = token
        self.scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0
        self.positions = build_positional_encoding(
            config.pe, d_model=config.d_model, max_positions=config.max_positions, layout=config.pe_layout
        )
        self.dropout = Dropout(config.dropout)

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        """ids (B, L) -> (B, L, D); `offset` is the position of ids[:, 0] (for incremental decoding)."""
        x = self.token(ids) * self.scale
        if self.positions is not None:
            x = x + self.positions(ids.size(1), offset, ids.device).to(x.dtype)
        return self.dropout(x) if self.training else x


class Encoder(nn.Module):
    """N encoder layers over embedded source tokens."""

    def __init__(self, config: TransformerConfig, token: nn.Embedding) -> None:
        super().__init__()
        self.embed = InputEmbedding(token, config)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None

    def forward(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src (B, S) ids, src_mask (B, S) True at real tokens -> memory (B, S, D)."""
        x = self.embed(src)
        mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.layers:
            x = layer(x, mask=mask)
        return x if self.norm is None else self.norm(x)


class Decoder(nn.Module):
    """N decoder layers over embedded target tokens, attending to the encoder output."""

    def __init__(self, config: TransformerConfig, token: nn.Embedding) -> None:
        super().__init__()
        self.embed = InputEmbedding(token, config)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        *,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        """tgt (B, T) ids -> hidden states (B, T, D) and per-layer cross-attention weights (B, H, T, S).
        `src_mask` None: no source position is padding."""
        x = self.embed(tgt, offset=0 if cache is None else cache.length)
        memory_mask = None if src_mask is None else src_mask[:, None, None, :]  # (B, 1, 1, S)
        weights = []
        for i, layer in enumerate(self.layers):
            x, w = layer(
                x,
                memory,
                memory_mask=memory_mask,
                cache=None if cache is None else cache.layers[i],
                need_weights=need_weights,
            )
            if w is not None:
                weights.append(w)
        return (x if self.norm is None else self.norm(x)), weights


class Transformer(nn.Module):
    """Encoder-decoder Transformer with a final linear layer producing logits over the target vocabulary.

    Args:
        config: The architecture; its vocabulary sizes must be set (`TransformerConfig.with_vocab`).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        if config.src_vocab_size is None or config.tgt_vocab_size is None:
            raise ValueError(
                "TransformerConfig.src_vocab_size/tgt_vocab_size are unset: they come from the data; "
                "build the model from config.with_vocab(src_vocab_size, tgt_vocab_size)"
            )
        self.config = config
        src_token = nn.Embedding(config.src_vocab_size, config.d_model, padding_idx=config.pad_id)
        if config.tie == "all":
            tgt_token = src_token  # one matrix for both embeddings and the output (§3.4)
        else:
            tgt_token = nn.Embedding(config.tgt_vocab_size, config.d_model, padding_idx=config.pad_id)
        self.encoder = Encoder(config, src_token)
        self.decoder = Decoder(config, tgt_token)
        self.output = Linear(config.d_model, config.tgt_vocab_size, bias=config.output_bias)
        self.reset_parameters()
        if config.tie != "none":
            self.output.weight = tgt_token.weight

    def reset_parameters(self) -> None:
        """Xavier-uniform linear weights with zero biases; embeddings ~ N(0, D^-0.5) with a zero pad row.

        A tied output projection keeps the embedding's initialisation.
        """
        tied = self.config.tie != "none" and self.output.weight is self.decoder.embed.token.weight
        for module in self.modules():
            if isinstance(module, nn.Linear) and not (module is self.output and tied):
                nn.init.xavier_uniform_(module.weight)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding) and module.padding_idx is not None:
                nn.init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5)
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) ids -> memory (B, S, D) and the source mask (B, S), True at non-pad tokens."""
        src_mask = src != self.config.pad_id
        return self.encoder(src, src_mask), src_mask

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        *,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits (B, T, V) for decoder inputs `tgt` (B, T).

        With a `cache`, `tgt` holds only the new positions (usually one) and the cache is updated in
        place. With `need_weights`, also returns each layer's cross-attention weights (B, H, T, S).
        `src_mask` (B, S) is True at real source tokens; None says no source has padding (searches pass
        None for such batches, `decoder_mask`: cross-attention then runs without a mask, the same
        function, a little faster).
        """
        hidden, weights = self.decoder(tgt, memory, src_mask, cache=cache, need_weights=need_weights)
        logits = self.output(hidden)  # (B, T, V)
        return (logits, weights) if need_weights else logits

    def new_cache(self, beams: int = 1) -> KVCache:
        """An empty incremental-decoding cache, for `beams` decoder rows per sentence (see `KVCache`).

        With beams > 1, `decode` takes the un-repeated memory (B, S, D) and mask (B, S) of the B
        sentences, and B·K decoder rows, sentence-major.
        """
        return KVCache.empty(len(self.decoder.layers), beams)

    def forward(self, src: Tensor, tgt: Tensor, *, project: bool = True) -> Tensor:
        """Teacher-forced logits (B, T, V) for source ids (B, S) and decoder inputs (B, T).

        With `project=False`, the decoder's hidden states (B, T, D) before the output layer, for a loss
        that applies `self.output` itself (`attnlab.training.loss.output_layer_loss`).
        """
        memory, src_mask = self.encode(src)
        if project:
            return self.decode(tgt, memory, src_mask)
        return self.decoder(tgt, memory, src_mask)[0]

    def count_parameters(self) -> dict[str, int]:
        """Total, embedding (token and learned position tables) and non-embedding parameter counts."""
        total = sum(p.numel() for p in self.parameters())
        tables = {
            id(p): p.numel() for m in self.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
        }
        embedding = sum(tables.values())
        return {"total": total, "embedding": embedding, "non_embedding": total - embedding}
