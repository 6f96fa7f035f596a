"""MarianMT ⇄ attnlab on small random models (saved and loaded locally: no download): equal logits,
equal greedy outputs, and a round trip back to MarianMT."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason='needs the [interop] extra: pip install -e ".[interop]"'
)

from attnlab.decoding.search import greedy_decode  # noqa: E402
from attnlab.interop.marian import config_from_marian, from_marian, to_marian  # noqa: E402

PAD, EOS = 59, 0


@pytest.fixture(scope="module")
def marian(tmp_path_factory: pytest.TempPathFactory):
    config = transformers.MarianConfig(
        vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD, scale_embedding=True,
        activation_function="swish", dropout=0.1, init_std=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    with torch.no_grad():  # random values where the initialisation leaves constants
        model.final_logits_bias.normal_(std=0.1)
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    path = tmp_path_factory.mktemp("marian") / "model"
    model.save_pretrained(path)  # what a downloaded opus-mt checkpoint is, locally
    return transformers.MarianMTModel.from_pretrained(path).eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([[5, 9, 14, 22, 31, 7, EOS], [12, 3, 8, EOS, PAD, PAD, PAD]])
    tgt = torch.tensor([[PAD, 4, 17, 23, 2, 11], [PAD, 40, 41, 42, 43, 44]])
    return src, tgt


def test_config_maps_marian_options() -> None:
    marian_config = transformers.MarianConfig(
        pad_token_id=PAD,
        eos_token_id=EOS,
        vocab_size=60,
        decoder_start_token_id=PAD,
        activation_function="swish",
    )
    config = config_from_marian(marian_config)
    assert (config.activation, config.pe_layout, config.tie, config.output_bias) == (
        "silu",
        "split",
        "all",
        True,
    )
    assert (config.pad_id, config.eos_id, config.start_id) == (PAD, EOS, PAD) and config.bos_id == 1
    with pytest.raises(ValueError, match="layer drop"):
        config_from_marian(transformers.MarianConfig(pad_token_id=PAD, vocab_size=60, encoder_layerdrop=0.1))


def test_the_config_keeps_marians_dropout_rates_and_start_token() -> None:
    """Fine-tuning a converted model drops out as MarianMT does; decoding starts where Marian's does."""
    config = config_from_marian(transformers.MarianConfig(
        pad_token_id=PAD, eos_token_id=EOS, vocab_size=60, decoder_start_token_id=3,
        activation_function="relu", dropout=0.1, attention_dropout=0.2, activation_dropout=0.3,
    ))  # fmt: skip
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.1, 0.2, 0.3)
    assert (config.decoder_start_id, config.activation) == (3, "relu")


@pytest.mark.parametrize(
    ("option", "named"),
    [({"decoder_attention_heads": 2}, "different head counts"), ({"decoder_ffn_dim": 32}, "decoder_ffn_dim"),
     ({"activation_function": "tanh"}, "activation_function='tanh'"),
     ({"decoder_layerdrop": 0.1}, "layer drop")],
)  # fmt: skip
def test_a_marian_option_attnlab_cannot_express_is_refused_naming_it(option: dict, named: str) -> None:
    """(Different head counts converted silently into another function; different feed-forward widths and
    an unknown activation would fail as a shape error or a KeyError.)"""
    options = {"encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
               "decoder_ffn_dim": 64, **option}  # fmt: skip
    with pytest.raises(ValueError, match=named):
        config_from_marian(transformers.MarianConfig(pad_token_id=PAD, vocab_size=60, d_model=32, **options))


def test_converted_model_gives_the_same_logits(marian) -> None:
    ours = from_marian(marian)
    src, tgt = batch()
    with torch.no_grad():
        theirs = marian(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt).logits
        torch.testing.assert_close(ours(src, tgt), theirs, atol=2e-5, rtol=1e-5)


def test_a_model_without_shared_embeddings_converts_with_its_own_target_embedding() -> None:
    """`share_encoder_decoder_embeddings=False`: the source embedding is the encoder's alone (here of its own
    vocabulary size), the target embedding the decoder's and the output layer's (`tie=decoder`), and the
    logits stay MarianMT's."""
    config = transformers.MarianConfig(
        vocab_size=70, decoder_vocab_size=60, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=64, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
        activation_function="swish", share_encoder_decoder_embeddings=False, init_std=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    theirs = transformers.MarianMTModel(config).eval()
    ours = from_marian(theirs)
    assert (ours.config.tie, ours.config.src_vocab_size, ours.config.tgt_vocab_size) == ("decoder", 70, 60)
    assert ours.encoder.embed.token.weight is not ours.decoder.embed.token.weight
    src, tgt = batch()
    with torch.no_grad():
        expected = theirs(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt).logits
        torch.testing.assert_close(ours(src, tgt), expected, atol=2e-5, rtol=1e-5)


def test_a_model_with_an_untied_output_layer_converts_with_its_own_output_weights() -> None:
    """`tie_word_embeddings=False`: the output layer is not the target embedding (`tie=none`)."""
    config = transformers.MarianConfig(
        vocab_size=60, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD, activation_function="swish",
        tie_word_embeddings=False, init_std=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    theirs = transformers.MarianMTModel(config).eval()
    ours = from_marian(theirs)
    assert ours.config.tie == "none"
    src, tgt = batch()
    with torch.no_grad():
        expected = theirs(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt).logits
        torch.testing.assert_close(ours(src, tgt), expected, atol=2e-5, rtol=1e-5)


def test_a_model_with_an_untied_output_layer_converts_back_with_its_own_output_weights() -> None:
    """`to_marian` of a `tie=none` model: MarianMT with `tie_word_embeddings=False` and separate embeddings,
    its output layer the model's own (not the decoder's embedding), the same logits, and `from_marian` of it
    `tie=none` again."""
    from attnlab.model.config import TransformerConfig
    from attnlab.model.transformer import Transformer

    config = TransformerConfig(src_vocab_size=70, tgt_vocab_size=60, d_model=32, n_heads=4, d_ff=64,
                               n_encoder_layers=1, n_decoder_layers=1, pad_id=PAD, bos_id=1, eos_id=EOS,
                               decoder_start_id=PAD, tie="none", pe_layout="split")  # fmt: skip
    torch.manual_seed(0)
    ours = Transformer(config).eval()
    theirs = to_marian(ours)
    assert not theirs.config.tie_word_embeddings and not theirs.config.share_encoder_decoder_embeddings
    assert torch.equal(theirs.lm_head.weight, ours.output.weight)
    assert not torch.equal(theirs.lm_head.weight, theirs.model.decoder.embed_tokens.weight)
    src, tgt = batch()
    with torch.no_grad():
        expected = ours(src, tgt)
        got = theirs(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt).logits
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(from_marian(theirs)(src, tgt), expected, atol=2e-5, rtol=1e-5)
    assert from_marian(theirs).config.tie == "none"


def test_greedy_outputs_are_the_same(marian) -> None:
    ours = from_marian(marian)
    torch.manual_seed(1)
    src = torch.randint(1, PAD, (8, 9))
    src[:, -1] = EOS
    src[4:, 6:] = PAD  # padded sentences too
    src[4:, 5] = EOS
    with torch.no_grad():
        # attnlab never generates pad or its bos id (beam search and greedy alike): mask them in generate()
        never = [[PAD], [ours.config.bos_id]]
        generated = marian.generate(input_ids=src, attention_mask=src != PAD, num_beams=1, do_sample=False,
                                    max_new_tokens=12, min_new_tokens=0, bad_words_ids=never)  # fmt: skip
        decoded = greedy_decode(ours, src, max_len_a=0.0, max_len_b=12)
    # generate() forces eos at its length limit (forced_eos_token_id): compare the steps before it
    for row, theirs in zip(decoded.tolist(), generated[:, 1:].tolist(), strict=True):  # no start token
        end = row.index(EOS) + 1 if EOS in row else 11
        assert theirs[:end] == row[:end]
    assert len({tuple(row[:11]) for row in decoded.tolist()}) > 3  # outputs depend on the source


def test_round_trip_back_to_marian(marian, tmp_path: Path) -> None:
    again = to_marian(from_marian(marian))
    src, tgt = batch()
    with torch.no_grad():
        expected = marian(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt).logits
        got = again(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt).logits
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


def test_a_model_with_the_papers_layout_converts_by_permuting_its_model_dimension() -> None:
    """Interleaved sinusoids, ReLU, no output bias (attnlab's defaults): the same logits from MarianMT."""
    from attnlab.model.config import TransformerConfig
    from attnlab.model.transformer import Transformer

    torch.manual_seed(3)
    config = TransformerConfig(src_vocab_size=60, tgt_vocab_size=60, d_model=32, n_heads=4, d_ff=64,
                               n_encoder_layers=2, n_decoder_layers=2, pad_id=PAD, bos_id=1, eos_id=EOS,
                               decoder_start_id=PAD, tie="all")  # fmt: skip
    ours = Transformer(config).eval()
    with torch.no_grad():
        for name, param in ours.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    src, tgt = batch()
    with torch.no_grad():
        expected = ours(src, tgt)
        theirs = to_marian(ours)(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt).logits
    torch.testing.assert_close(theirs, expected, atol=2e-5, rtol=1e-5)
