"""`TransformerConfig`: every architectural knob of the model, validated at construction (torch-free).

Notation used across `attnlab.model`: `B` batch, `S` source length, `T` target length, `D` d_model,
`H` heads, `Dh` = D / H (or `d_head`), `F` d_ff, `V` vocabulary size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from attnlab.typed import check_fields, require, require_positive, require_probability

PositionalEncodingType = Literal["sinusoidal", "learned", "none"]
SinusoidLayout = Literal["interleaved", "split"]
Activation = Literal["relu", "gelu", "silu"]
Tying = Literal["none", "decoder", "all"]


@dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of an encoder-decoder Transformer (Vaswani et al., 2017).

    Defaults are the paper's base model (Table 3): post-norm, sinusoidal PE, embeddings scaled by
    sqrt(d_model), all embeddings and the pre-softmax projection shared (§3.4). Every departure is a
    named switch.

    Args:
        src_vocab_size: Source vocabulary size. `None` until the data sets it (see `with_vocab`).
        tgt_vocab_size: Target vocabulary size. `None` until the data sets it.
        d_model: Width D of every sublayer output (§3.1).
        n_heads: Number of attention heads H (§3.2.2).
        d_head: Per-head width Dh; defaults to d_model / n_heads (Table 3 row B varies it).
        d_ff: Inner width F of the position-wise feed-forward network (§3.3).
        n_encoder_layers: Encoder stack depth N.
        n_decoder_layers: Decoder stack depth N.
        dropout: Residual dropout P_drop on each sublayer output and on embeddings + PE (§5.4).
        attention_dropout: Dropout on the attention weights.
        activation_dropout: Dropout between the two FFN linears (0 in the paper).
        activation: FFN nonlinearity (ReLU in the paper).
        pe: Positional encoding: `sinusoidal` (§3.5), `learned`, or `none` (ablation).
        pe_layout: Sinusoid layout: `interleaved` (even dims sin, odd cos; the paper) or `split`
            (first half sin, second half cos; MarianMT).
        max_positions: Size of the learned position table (ignored by sinusoidal and none; see
            `position_limit`).
        scale_embeddings: Multiply embeddings by sqrt(d_model) (§3.4).
        norm_first: Pre-norm (LayerNorm inside the residual branch, final LayerNorm on each stack)
            instead of the paper's post-norm.
        layer_norm_eps: LayerNorm epsilon.
        tie: Weight tying: `none`; `decoder` (target embedding = output projection); `all` (one
            matrix for source and target embeddings and the output projection; needs a joint vocabulary).
        output_bias: Add a bias to the output projection (MarianMT has one).
        pad_id: Padding token id (also the embedding's padding_idx).
        bos_id: Beginning-of-sentence id.
        eos_id: End-of-sentence id.
        decoder_start_id: First decoder input; defaults to `bos_id` (MarianMT starts with pad).
    """

    src_vocab_size: int | None = None
    tgt_vocab_size: int | None = None
    d_model: int = 512
    n_heads: int = 8
    d_head: int | None = None
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: Activation = "relu"
    pe: PositionalEncodingType = "sinusoidal"
    pe_layout: SinusoidLayout = "interleaved"
    max_positions: int = 1024
    scale_embeddings: bool = True
    norm_first: bool = False
    layer_norm_eps: float = 1e-5
    tie: Tying = "all"
    output_bias: bool = False
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    decoder_start_id: int | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        require_positive(self, "d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers")
        require_positive(self, "max_positions", "layer_norm_eps")
        require_probability(self, "dropout", "attention_dropout", "activation_dropout")
        if self.d_head is None:
            require(
                self.d_model % self.n_heads == 0,
                f"n_heads={self.n_heads} does not divide d_model={self.d_model}: choose n_heads that "
                "divides d_model, or set d_head explicitly",
            )
        else:
            require_positive(self, "d_head")
        if self.pe == "sinusoidal":
            require(self.d_model % 2 == 0, f"pe=sinusoidal needs an even d_model, got d_model={self.d_model}")
        for name in ("src_vocab_size", "tgt_vocab_size"):
            value = getattr(self, name)
            require(value is None or value > 0, f"{name}={value!r} must be positive")
        if self.tie == "all" and None not in (self.src_vocab_size, self.tgt_vocab_size):
            require(
                self.src_vocab_size == self.tgt_vocab_size,
                f"tie=all shares one embedding between source and target, but src_vocab_size="
                f"{self.src_vocab_size} != tgt_vocab_size={self.tgt_vocab_size}: use a joint vocabulary "
                "or set tie=decoder",
            )
        special = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        if self.decoder_start_id is not None:
            special["decoder_start_id"] = self.decoder_start_id
        for name, value in special.items():
            require(value >= 0, f"{name}={value} must be a non-negative token id")
            for vocab in ("src_vocab_size", "tgt_vocab_size"):
                size = getattr(self, vocab)
                require(size is None or value < size, f"{name}={value} is outside {vocab}={size}")
        require(
            len({self.pad_id, self.bos_id, self.eos_id}) == 3,
            f"pad_id={self.pad_id}, bos_id={self.bos_id} and eos_id={self.eos_id} must be distinct",
        )

    @property
    def head_dim(self) -> int:
        """Per-head width Dh."""
        return self.d_head if self.d_head is not None else self.d_model // self.n_heads

    @property
    def start_id(self) -> int:
        """Token fed to the decoder at step 0."""
        return self.bos_id if self.decoder_start_id is None else self.decoder_start_id

    @property
    def position_limit(self) -> int | None:
        """The longest sequence the model can encode, a source or a decoder input (an output of that
        many tokens, eos included, has one position per input): `max_positions` for a learned position
        table, `None` (unbounded) for sinusoidal positions or none."""
        return self.max_positions if self.pe == "learned" else None

    def length_limit(self, requested: int) -> int:
        """`requested`, a length limit, lowered to `position_limit` when that is smaller."""
        limit = self.position_limit
        return requested if limit is None else min(requested, limit)

    def with_vocab(self, src_vocab_size: int, tgt_vocab_size: int) -> TransformerConfig:
        """A copy with the vocabulary sizes the data provides (validated again)."""
        return dataclasses.replace(self, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size)

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (for checkpoints and loggers)."""
        return dataclasses.asdict(self)
