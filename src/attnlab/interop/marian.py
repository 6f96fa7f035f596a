"""attnlab ⇄ Hugging Face MarianMT (`pip install "attnlab[interop]"`).

MarianMT is the same architecture as attnlab's Transformer with a few options set: post-norm, scaled
embeddings, sinusoidal positions in the `split` layout (all sines, then all cosines), SiLU ("swish") in
the feed-forward network, an output bias (`final_logits_bias`), embeddings shared between encoder,
decoder and output (`tie=all`; `tie=decoder` when the encoder's are separate; `tie=none`, an output layer
of its own, as `tie_word_embeddings=False` with separate embeddings), decoding started from
the pad token. `config_from_marian`/`from_marian` build the attnlab model with the same weights, and
`to_marian` goes back; logits are equal to float precision (tested). Marian has no beginning-of-sentence
token: attnlab's `bos_id` is set to the smallest id that is neither pad nor eos, and is never fed
(`decoder_start_id` = pad).

Using a public opus-mt checkpoint (downloaded where a network is available):

    from transformers import MarianMTModel, MarianTokenizer
    from attnlab.interop.marian import from_marian
    hf = MarianMTModel.from_pretrained("Helsinki-NLP/opus-mt-de-en")
    model = from_marian(hf)                      # an attnlab Transformer, eval mode
    tok = MarianTokenizer.from_pretrained("Helsinki-NLP/opus-mt-de-en")
    src = tok(["Ein Mann fährt Fahrrad."], return_tensors="pt").input_ids
    from attnlab.decoding import DecodeConfig
    from attnlab.decoding.search import translate
    ids = translate(model, src, DecodeConfig(beam=5, alpha=0.0, max_len_a=1.2, max_len_b=10))
    print(tok.batch_decode(ids, skip_special_tokens=True))

Fine-tuning it with attnlab's trainer needs its SentencePiece vocabulary in the data pipeline, which
attnlab's data modules do not read: convert, train with your own loop or module, and `to_marian` back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnlab.model.config import TransformerConfig

if TYPE_CHECKING:
    from attnlab.model.transformer import Transformer

ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}
# (attnlab sublayer, Marian sublayer) per layer kind; each has .weight and .bias
ENCODER = [("self_attn.w_q", "self_attn.q_proj"), ("self_attn.w_k", "self_attn.k_proj"),
           ("self_attn.w_v", "self_attn.v_proj"), ("self_attn.w_o", "self_attn.out_proj"),
           ("attn_block.norm", "self_attn_layer_norm"), ("ffn.w_1", "fc1"), ("ffn.w_2", "fc2"),
           ("ffn_block.norm", "final_layer_norm")]  # fmt: skip
DECODER = [("self_attn.w_q", "self_attn.q_proj"), ("self_attn.w_k", "self_attn.k_proj"),
           ("self_attn.w_v", "self_attn.v_proj"), ("self_attn.w_o", "self_attn.out_proj"),
           ("self_attn_block.norm", "self_attn_layer_norm"),
           ("cross_attn.w_q", "encoder_attn.q_proj"), ("cross_attn.w_k", "encoder_attn.k_proj"),
           ("cross_attn.w_v", "encoder_attn.v_proj"), ("cross_attn.w_o", "encoder_attn.out_proj"),
           ("cross_attn_block.norm", "encoder_attn_layer_norm"), ("ffn.w_1", "fc1"), ("ffn.w_2", "fc2"),
           ("ffn_block.norm", "final_layer_norm")]  # fmt: skip


def _key_pairs(config: TransformerConfig) -> list[tuple[str, str]]:
    """(attnlab state_dict key, MarianMTModel state_dict key) for every weight but the output layer's."""
    pairs = [("encoder.embed.token.weight", "model.encoder.embed_tokens.weight"),
             ("decoder.embed.token.weight", "model.decoder.embed_tokens.weight")]  # fmt: skip
    for stack, count, names in (("encoder", config.n_encoder_layers, ENCODER),
                                ("decoder", config.n_decoder_layers, DECODER)):  # fmt: skip
        for i in range(count):
            for ours, theirs in names:
                for param in ("weight", "bias"):
                    pairs.append(
                        (f"{stack}.layers.{i}.{ours}.{param}", f"model.{stack}.layers.{i}.{theirs}.{param}")
                    )
    return pairs


def config_from_marian(marian: Any) -> TransformerConfig:
    """The attnlab `TransformerConfig` of a `MarianConfig`.

    Raises:
        ValueError: A Marian option attnlab does not express (different encoder and decoder widths or
            heads, layer drop, an unknown activation).
    """
    if marian.encoder_attention_heads != marian.decoder_attention_heads:
        raise ValueError(
            "MarianConfig: encoder and decoder have different head counts; attnlab uses one n_heads"
        )
    if marian.encoder_ffn_dim != marian.decoder_ffn_dim:
        raise ValueError("MarianConfig: encoder_ffn_dim != decoder_ffn_dim; attnlab uses one d_ff")
    if marian.encoder_layerdrop or marian.decoder_layerdrop:
        raise ValueError("MarianConfig: layer drop is not an attnlab option; set it to 0")
    if marian.activation_function not in ACTIVATIONS:
        raise ValueError(
            f"MarianConfig.activation_function={marian.activation_function!r}: "
            f"use one of {sorted(ACTIVATIONS)}"
        )
    pad, eos = marian.pad_token_id, marian.eos_token_id
    bos = min(i for i in range(3) if i not in (pad, eos))
    shared = getattr(marian, "share_encoder_decoder_embeddings", True)
    tie = ("all" if shared else "decoder") if marian.tie_word_embeddings else "none"
    return TransformerConfig(
        src_vocab_size=marian.vocab_size, tgt_vocab_size=marian.decoder_vocab_size or marian.vocab_size,
        d_model=marian.d_model, n_heads=marian.encoder_attention_heads, d_ff=marian.encoder_ffn_dim,
        n_encoder_layers=marian.encoder_layers, n_decoder_layers=marian.decoder_layers,
        dropout=marian.dropout, attention_dropout=marian.attention_dropout,
        activation_dropout=marian.activation_dropout, activation=ACTIVATIONS[marian.activation_function],
        pe="sinusoidal", pe_layout="split", max_positions=marian.max_position_embeddings,
        scale_embeddings=marian.scale_embedding, norm_first=False, layer_norm_eps=1e-5, tie=tie,
        output_bias=True, pad_id=pad, bos_id=bos, eos_id=eos, decoder_start_id=marian.decoder_start_token_id,
    )  # fmt: skip


def from_marian(marian_model: Any) -> Transformer:
    """An attnlab `Transformer` (eval mode) with the weights of a `MarianMTModel`."""
    from attnlab.model.transformer import Transformer

    config = config_from_marian(marian_model.config)
    model = Transformer(config)
    theirs = marian_model.state_dict()
    state = {ours: theirs[key] for ours, key in _key_pairs(config)}
    state["output.weight"] = marian_model.lm_head.weight.detach()
    state["output.bias"] = marian_model.final_logits_bias.detach().reshape(-1)
    model.load_state_dict(state, strict=True)
    return model.eval()


def marian_config(config: TransformerConfig, positions: int | None = None) -> Any:
    """The `MarianConfig` of an attnlab config in Marian's form (see the module docstring), with a table
    of `positions` sinusoids (default `config.max_positions`; Marian can encode no longer sequence).

    Raises:
        ValueError: naming the attnlab option Marian cannot express.
    """
    from transformers import MarianConfig

    # MarianMT's LayerNorms have torch's default epsilon, 1e-5, which its config cannot change
    wanted = {"pe": "sinusoidal", "norm_first": False, "layer_norm_eps": 1e-5}
    for key, value in wanted.items():
        if getattr(config, key) != value:
            raise ValueError(f"MarianMT needs {key}={value!r}, the model has {key}={getattr(config, key)!r}")
    if config.d_head is not None and config.d_head * config.n_heads != config.d_model:
        raise ValueError(f"MarianMT needs n_heads x d_head = d_model, the model has n_heads={config.n_heads} "
                         f"x d_head={config.d_head} != d_model={config.d_model}")  # fmt: skip
    return MarianConfig(
        vocab_size=config.src_vocab_size, decoder_vocab_size=config.tgt_vocab_size, d_model=config.d_model,
        encoder_layers=config.n_encoder_layers, decoder_layers=config.n_decoder_layers,
        encoder_attention_heads=config.n_heads, decoder_attention_heads=config.n_heads,
        encoder_ffn_dim=config.d_ff, decoder_ffn_dim=config.d_ff, dropout=config.dropout,
        attention_dropout=config.attention_dropout, activation_dropout=config.activation_dropout,
        activation_function={"silu": "swish", "relu": "relu", "gelu": "gelu"}[config.activation],
        max_position_embeddings=positions or config.max_positions, scale_embedding=config.scale_embeddings,
        share_encoder_decoder_embeddings=config.tie == "all", tie_word_embeddings=config.tie != "none",
        pad_token_id=config.pad_id, eos_token_id=config.eos_id, forced_eos_token_id=config.eos_id,
        decoder_start_token_id=config.start_id, bos_token_id=None,
    )  # fmt: skip


def split_order(d_model: int) -> list[int]:
    """Model dimensions in `split` order: the interleaved layout's sines (even dimensions), then its
    cosines (odd ones). `split_order(d)[j]` is the interleaved dimension that becomes dimension j."""
    return [*range(0, d_model, 2), *range(1, d_model, 2)]


def _in_split_order(config: TransformerConfig, state: dict[str, Any]) -> dict[str, Any]:
    """The same function with its model dimension permuted so that the positional encoding is in the
    `split` layout: every vector of the residual stream is permuted, so weights reading it permute their
    input columns, weights writing it (and LayerNorms, biases) their output rows."""
    order = split_order(config.d_model)
    out = {}
    for key, value in state.items():
        reads = (
            key.endswith(("w_q.weight", "w_k.weight", "w_v.weight", "w_1.weight")) or key == "output.weight"
        )
        writes = key.endswith(("w_o.weight", "w_o.bias", "w_2.weight", "w_2.bias")) or ".norm." in key
        if key.endswith("embed.token.weight") or reads:
            value = value[:, order]
        elif writes:
            value = value[order]
        out[key] = value
    return out


def to_marian(model: Transformer, positions: int | None = None) -> Any:
    """A `MarianMTModel` (eval mode) computing the same function as an attnlab `Transformer`, for sequences
    of up to `positions` tokens (`marian_config`).

    A model with the paper's interleaved sinusoids is converted with its model dimension permuted into
    Marian's split layout (`split_order`), which changes no output; a model without output bias gets a zero
    `final_logits_bias`.
    """
    import torch
    from transformers import MarianMTModel

    config = model.config
    marian = MarianMTModel(marian_config(config, positions)).eval()
    ours = model.state_dict()
    if config.pe_layout == "interleaved":
        ours = _in_split_order(config, ours)
    state = marian.state_dict()
    for key, theirs in _key_pairs(config):
        state[theirs] = ours[key]
    if config.tie == "all":
        state["model.shared.weight"] = ours["encoder.embed.token.weight"]
    state["lm_head.weight"] = ours["output.weight"]
    bias = ours.get("output.bias")
    state["final_logits_bias"] = (bias if bias is not None else torch.zeros(config.tgt_vocab_size)).reshape(
        1, -1
    )
    with torch.no_grad():
        marian.load_state_dict(state, strict=False)
    return marian
