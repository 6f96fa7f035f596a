"""`attnlab.interop.export` on small random models (no training): separate source and target vocabularies
through CTranslate2, and what `format=hf` refuses."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason='needs the [interop] extra: pip install -e ".[interop]"')

from attnlab.data.tokenizer import SubwordTokenizer
from attnlab.decoding import DecodeConfig
from attnlab.inference.translator import Translator
from attnlab.interop.export import ExportError, export
from attnlab.model.config import TransformerConfig
from attnlab.model.transformer import Transformer
from attnlab.typed import ConfigError
from helpers import address_space_capped, eos_biased_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GERMAN = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."] * 3
ENGLISH = ["A man rides a bike.", "Two dogs play in the snow.", "A woman reads a book."] * 3


def separate_vocabularies(model: str = "bpe") -> tuple[SubwordTokenizer, SubwordTokenizer]:
    return (SubwordTokenizer.train(GERMAN, model=model, vocab_size=60),
            SubwordTokenizer.train(ENGLISH, model=model, vocab_size=50))  # fmt: skip


def random_translator(src: SubwordTokenizer, tgt: SubwordTokenizer, tie: str, **model: Any) -> Translator:
    torch.manual_seed(0)
    config = TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
                               tie=tie, **model)  # fmt: skip
    model = Transformer(config.with_vocab(src.vocab_size, tgt.vocab_size))
    return Translator(model, src, tgt, DecodeConfig(beam=1, alpha=0.0, max_len_a=0.0, max_len_b=8))


def test_ctranslate2_with_separate_source_and_target_vocabularies(tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.interop.ct2 import CT2Translator

    src, tgt = separate_vocabularies()
    assert src.vocab_size != tgt.vocab_size
    ours = random_translator(src, tgt, tie="decoder")
    ours.decode = DecodeConfig(beam=1, alpha=0.0, max_len_a=0.0, max_len_b=8, max_source_tokens=5)
    (tmp_path / "ct2").mkdir()  # `out` may be new or an empty directory (here the latter)
    engine = CT2Translator(export(ours, "ctranslate2", tmp_path / "ct2"), intra_threads=1)
    lines = ["Zwei Männer fahren.", "", "Ein Hund liest.", "Schnee"]
    assert engine.translate(lines) == ours.translate(lines)
    assert len(set(ours.translate(lines))) > 1  # outputs depend on the source; the empty line stays empty
    # the source limit is the translator's (not the model's 1024 positions), cut as attnlab cuts
    assert engine.source_ids(lines) == ours._source_ids(lines) and len(engine.source_ids(lines)[0]) == 5


def test_ctranslate2_reads_a_source_past_1024_tokens_whole_as_attnlab_does(tmp_path: Path) -> None:
    """CTranslate2 cuts every source to 1024 tokens unless told otherwise: a source limit above that
    (decode.max_source_tokens) is attnlab's alone, and a longer source translates as attnlab translates it."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.interop.ct2 import CT2Translator

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = random_translator(joint, joint, tie="all")
    ours.decode = DecodeConfig(beam=1, alpha=0.0, max_len_a=0.0, max_len_b=8, max_source_tokens=1500)
    engine = CT2Translator(export(ours, "ctranslate2", tmp_path / "ct2"), intra_threads=1)
    same = (" ".join(GERMAN[:3]) + " ") * 23  # over 1024 tokens, the same in every line
    lines = [same + tail * 40 for tail in ("Schnee ", "Hunde. ", "Buch ")]
    assert len(ours._source_ids([same])[0]) > 1024
    assert all(len(row) < 1500 for row in engine.source_ids(lines))  # read whole, not cut
    expected = ours.translate(lines)
    assert engine.translate(lines) == expected and len(set(expected)) > 1  # each line's end counts


def test_hf_refuses_separate_vocabularies_and_sentencepiece(tmp_path: Path) -> None:
    src, tgt = separate_vocabularies()
    with pytest.raises(ExportError, match=r"separate source and target vocabularies .* format=ctranslate2"):
        export(random_translator(src, tgt, tie="decoder"), "hf", tmp_path / "hf")
    pytest.importorskip("sentencepiece", reason='needs the [spm] extra: pip install -e ".[spm]"')
    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="sentencepiece", vocab_size=60)
    with pytest.raises(ExportError, match="SentencePiece model, which format=hf does not convert"):
        export(random_translator(joint, joint, tie="all"), "hf", tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []  # nothing written, no staging directory left


@pytest.mark.parametrize("start", [None, 0])
def test_hf_export_of_a_greedy_checkpoint_generates_attnlab_outputs(
    tmp_path: Path, start: int | None
) -> None:
    """A checkpoint decoding greedily (decode.beam=1) exports a valid generation config; on a random model
    the outputs run to the length limit, so the saved limit means attnlab's. A model starting its outputs
    from pad (MarianMT's `decoder_start_id`) starts from it in generate() too. The directory has the
    usual permissions of the umask (not those of the private staging directory it was written in)."""
    import os

    from transformers import AutoTokenizer, MarianMTModel

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = random_translator(joint, joint, tie="all", decoder_start_id=start)
    umask = os.umask(0o027)
    try:
        out = export(ours, "hf", tmp_path / "hf")
    finally:
        os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o750
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = MarianMTModel.from_pretrained(out, local_files_only=True).eval()
    lines = ["Zwei Männer fahren.", "Ein Hund liest ein Buch im Schnee."]
    with torch.no_grad():
        generated = model.generate(**tokenizer(lines, return_tensors="pt", padding=True))
    assert tokenizer.batch_decode(generated, skip_special_tokens=True) == ours.translate(lines)
    assert generated.size(1) == 1 + 8  # the start id and max_len_b tokens: no eos forced or generated


def test_a_model_with_an_untied_output_layer_exports_to_both_formats(tmp_path: Path) -> None:
    """A `tie=none` model (source, target and output weights each their own) exports: MarianMT holds it
    with `tie_word_embeddings=False` and separate embeddings, and both formats decode as attnlab does."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from transformers import AutoTokenizer, MarianMTModel

    from attnlab.interop.ct2 import CT2Translator

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = random_translator(joint, joint, tie="none")
    lines = ["Zwei Männer fahren.", "Ein Hund liest ein Buch im Schnee."]
    expected = ours.translate(lines)
    assert len(set(expected)) > 1
    engine = CT2Translator(export(ours, "ctranslate2", tmp_path / "ct2"), intra_threads=1)
    assert engine.translate(lines) == expected
    out = export(ours, "hf", tmp_path / "hf")
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    hf = MarianMTModel.from_pretrained(out, local_files_only=True).eval()
    assert not torch.equal(hf.lm_head.weight, hf.model.decoder.embed_tokens.weight)
    with torch.no_grad():
        generated = hf.generate(**tokenizer(lines, return_tensors="pt", padding=True))
    assert tokenizer.batch_decode(generated, skip_special_tokens=True) == expected


def test_the_hf_tokenizer_encodes_and_decodes_as_attnlab_does() -> None:
    """`hf_tokenizer`: whitespace around and inside the text (a no-break space, a newline) is collapsed and
    stripped as attnlab's normalisation does (a trailing space was a piece of its own), eos appended; the
    unknown id decodes as the text "<unk>", as in attnlab, not skipped as a special token."""
    from attnlab.data.tokenizer import EOS_ID, UNK_ID
    from attnlab.interop.export import hf_tokenizer

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    tokenizer = hf_tokenizer(joint, EOS_ID)
    for text in (" Zwei\u00a0 Hunde.\n", "Zwei Hunde.  "):
        assert tokenizer(text)["input_ids"] == [*joint.encode(text), EOS_ID], text
    ids = [*joint.encode("Zwei Hunde."), UNK_ID, *joint.encode("Schnee")]
    assert tokenizer.decode(ids, skip_special_tokens=True) == joint.decode(ids) == "Zwei Hunde.<unk> Schnee"


def test_min_len_means_the_same_in_both_formats(tmp_path: Path) -> None:
    """A model whose every step prefers eos: the outputs are exactly `min_len` long, eos included, in
    attnlab, CTranslate2 (greedy and beam) and generate()."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from transformers import AutoTokenizer, MarianMTModel

    from attnlab.data.batching import pad
    from attnlab.decoding.search import translate
    from attnlab.interop.ct2 import CT2Translator

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    model = eos_biased_model(joint.vocab_size, 50.0)
    config = model.config
    lines = ["Zwei Hunde spielen."]
    for min_len in (1, 4):
        ours = Translator(model, joint, joint, DecodeConfig(beam=1, alpha=0.0, min_len=min_len))
        ids = ours._source_ids(lines)
        assert [len(row) for row in translate(model, pad(ids, config.pad_id), ours.decode)] == [min_len - 1]
        engine = CT2Translator(export(ours, "ctranslate2", tmp_path / f"ct2-{min_len}"), intra_threads=1)
        for beam in (1, 4):
            assert [len(row) for row in engine.translate_ids(ids, beam=beam)] == [min_len - 1], beam
        out = export(ours, "hf", tmp_path / f"hf-{min_len}")
        tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
        hf = MarianMTModel.from_pretrained(out, local_files_only=True).eval()
        with torch.no_grad():
            generated = hf.generate(**tokenizer(lines, return_tensors="pt"))
        assert generated[0, 1:].tolist().index(config.eos_id) == min_len - 1  # eos is token min_len
        assert tokenizer.batch_decode(generated, skip_special_tokens=True) == ours.translate(lines)


def test_neither_export_generates_pad_or_bos_as_attnlab_never_does(tmp_path: Path) -> None:
    """A model whose every step prefers bos, then pad, over every other token: attnlab never generates
    them, nor does either export (generate()'s `suppress_tokens`, CTranslate2's `suppress_sequences`)."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from transformers import AutoTokenizer, MarianMTModel

    from attnlab.interop.ct2 import CT2Translator

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    model = eos_biased_model(joint.vocab_size, -50.0)
    with torch.no_grad():
        model.output.bias[model.config.bos_id] = 50.0
        model.output.bias[model.config.pad_id] = 40.0
    ours = Translator(model, joint, joint, DecodeConfig(beam=1, alpha=0.0, max_len_a=0.0, max_len_b=6))
    lines = ["Zwei Hunde spielen.", "Schnee"]
    expected = ours.translate(lines)
    assert all(expected)
    engine = CT2Translator(export(ours, "ctranslate2", tmp_path / "ct2"), intra_threads=1)
    assert engine.translate(lines) == expected
    out = export(ours, "hf", tmp_path / "hf")
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    hf = MarianMTModel.from_pretrained(out, local_files_only=True).eval()
    with torch.no_grad():
        generated = hf.generate(**tokenizer(lines, return_tensors="pt", padding=True))
    assert tokenizer.batch_decode(generated, skip_special_tokens=True) == expected


def test_outputs_long_as_the_settings_allow_decode_the_same_in_the_exports(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A model that never prefers eos. Saved settings allowing outputs longer than its 1024 positions
    (a·|S|+b = 5000, above `MAX_OUTPUT_TOKENS`): both exports encode enough positions, and attnlab and
    CTranslate2 stop at the cap (CTranslate2 failed at position 1024). A call asking more of an export
    made for shorter outputs stops at its positions, with a warning."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.data.batching import pad
    from attnlab.decoding.search import MAX_OUTPUT_TOKENS, translate
    from attnlab.interop.ct2 import CT2Translator

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    model = eos_biased_model(joint.vocab_size, -50.0)
    config = model.config
    ours = Translator(model, joint, joint, DecodeConfig(beam=1, alpha=0.0, max_len_a=0.0, max_len_b=5000))
    ids = ours._source_ids(["Zwei Hunde."])
    assert [len(row) for row in translate(model, pad(ids, config.pad_id), ours.decode)] == [MAX_OUTPUT_TOKENS]
    engine = CT2Translator(export(ours, "ctranslate2", tmp_path / "ct2"), intra_threads=1)
    assert [len(row) for row in engine.translate_ids(ids)] == [MAX_OUTPUT_TOKENS]
    hf = export(ours, "hf", tmp_path / "hf")
    assert json.loads((hf / "config.json").read_text())["max_position_embeddings"] == MAX_OUTPUT_TOKENS
    assert json.loads((hf / "generation_config.json").read_text())["max_length"] == MAX_OUTPUT_TOKENS + 1

    ours.decode = DecodeConfig(beam=1, alpha=0.0, max_len_a=0.0, max_len_b=8)
    short = CT2Translator(export(ours, "ctranslate2", tmp_path / "short"), intra_threads=1)
    assert short.settings["positions"] == config.max_positions == 1024
    with caplog.at_level(logging.WARNING, logger="attnlab.interop.ct2"):
        assert [len(row) for row in short.translate_ids(ids, max_len_b=1024)] == [1024]
        assert caplog.text == ""  # outputs as long as its positions: nothing stops early
        assert [len(row) for row in short.translate_ids(ids, max_len_b=5000)] == [1024]
    assert "allow outputs of up to 4096 tokens, but this export encodes 1024 positions" in caplog.text


def test_an_export_from_before_positions_were_recorded_stops_at_its_table(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Exports written before `positions` was recorded hold the model's 1024 sinusoids: a call allowing
    longer outputs stops there with the warning (CTranslate2 raised at position 1024), also with a
    min_len past it (CTranslate2 refuses a minimum above the maximum). A finite max_len_a whose a·|S|
    overflows exports as attnlab decodes it: capped."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.decoding.search import MAX_OUTPUT_TOKENS
    from attnlab.interop.ct2 import CT2Translator
    from attnlab.interop.export import SETTINGS_FILE

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = Translator(eos_biased_model(joint.vocab_size, -50.0), joint, joint,
                      DecodeConfig(beam=1, alpha=0.0, max_len_a=0.0, max_len_b=8))  # fmt: skip
    ids = ours._source_ids(["Zwei Hunde."])
    path = export(ours, "ctranslate2", tmp_path / "ct2")
    settings = json.loads((path / SETTINGS_FILE).read_text())
    del settings["positions"]
    (path / SETTINGS_FILE).write_text(json.dumps(settings))
    old = CT2Translator(path, intra_threads=1)
    with caplog.at_level(logging.WARNING, logger="attnlab.interop.ct2"):
        assert [len(row) for row in old.translate_ids(ids, max_len_b=2000)] == [1024]
        assert [len(row) for row in old.translate_ids(ids, max_len_b=2000, min_len=1500)] == [1024]
    assert "this export encodes 1024 positions" in caplog.text
    ours.decode = DecodeConfig(beam=1, alpha=0.0, max_len_a=1e308, max_len_b=8)
    hf = export(ours, "hf", tmp_path / "hf")
    assert json.loads((hf / "generation_config.json").read_text())["max_length"] == MAX_OUTPUT_TOKENS + 1


@pytest.mark.parametrize(
    "penalty,alpha,saved",
    [("fairseq", 1.5, 1.5), ("fairseq", None, 1.0), ("gnmt", 0.6, 0.0), ("gnmt", 0.0, 0.0)],
)
def test_hf_generation_config_carries_a_fairseq_length_penalty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, penalty: str, alpha: float | None, saved: float
) -> None:
    """generate()'s `length_penalty` is fairseq's length^α: a checkpoint decoding with
    decode.length_penalty=fairseq exports its α; GNMT's penalty has no equal there and exports 0, said in
    a warning and in `not_carried`."""
    from transformers import GenerationConfig

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = random_translator(joint, joint, tie="all")
    ours.decode = DecodeConfig(beam=4, length_penalty=penalty, alpha=alpha, max_len_a=0.0, max_len_b=8)
    with caplog.at_level(logging.WARNING, logger="attnlab.interop.export"):
        out = export(ours, "hf", tmp_path / "hf")
    generation = GenerationConfig.from_pretrained(out, local_files_only=True)
    assert (generation.num_beams, generation.length_penalty) == (4, saved)
    assert not generation.do_sample
    lost = json.loads((out / "attnlab_export.json").read_text())["not_carried"]
    if penalty == "gnmt" and alpha:  # said at the export and kept in its settings file
        assert len(lost) == 1 and lost[0].startswith("decode.length_penalty=gnmt with alpha=0.6")
        assert [r.getMessage() for r in caplog.records] == [f"format=hf does not carry {lost[0]}"]
    else:
        assert lost == [] and not caplog.records


def test_ctranslate2_decodes_with_the_saved_fairseq_length_penalty(tmp_path: Path) -> None:
    """A checkpoint decoding with decode.length_penalty=fairseq, alpha=2 and beams: CTranslate2 divides the
    scores by length^2 unless a call names another penalty. On a model whose eos is often near the top,
    without the penalty (0) some beams end at once; with the saved one each runs to its limit."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.interop.ct2 import CT2Translator

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = Translator(
        eos_biased_model(joint.vocab_size, 1.0),
        joint,
        joint,
        DecodeConfig(beam=4, length_penalty="fairseq", alpha=2.0, max_len_a=0.0, max_len_b=8),
    )
    engine = CT2Translator(export(ours, "ctranslate2", tmp_path / "ct2"), intra_threads=1)
    assert engine.settings["decode"]["length_penalty"] == 2.0
    ids = ours._source_ids(GERMAN[:3])
    assert [len(row) for row in engine.translate_ids(ids)] == [8, 8, 8]
    assert [len(row) for row in engine.translate_ids(ids, length_penalty=0.0)] == [8, 0, 8]


def test_hf_generation_config_carries_sampling(tmp_path: Path) -> None:
    """decode.sampling's topk (0: every token, as generate()'s top_k=0), topp and temperature; the seed
    cannot be carried (generate() draws from torch's generator) and is listed as not carried."""
    from transformers import GenerationConfig

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = random_translator(joint, joint, tie="all")
    ours.decode = DecodeConfig(beam=1, sampling=True, topk=0, topp=0.9, temperature=0.7, seed=4)
    out = export(ours, "hf", tmp_path / "hf")
    generation = GenerationConfig.from_pretrained(out, local_files_only=True)
    assert generation.do_sample and generation.num_beams == 1
    assert (generation.top_k, generation.top_p, generation.temperature) == (0, 0.9, 0.7)
    lost = json.loads((out / "attnlab_export.json").read_text())["not_carried"]
    assert len(lost) == 1 and lost[0].startswith("decode.seed=4")


def test_a_topk_of_every_target_token_is_carried_as_0() -> None:
    """CTranslate2 refuses a topk past the target vocabulary: one of all its tokens exports as 0 (all)."""
    from attnlab.interop.export import carried_decoding

    def carried_topk(topk: int) -> int:
        settings, _ = carried_decoding(DecodeConfig(beam=1, sampling=True, topk=topk), vocab_size=50)
        return settings["sampling"]["topk"]

    assert [carried_topk(k) for k in (0, 49, 50, 51)] == [0, 49, 0, 0]


def first_tokens(engine: Any, ids: list[int], draws: int) -> set[int]:
    """The first output token of `draws` samples of one source sentence (eos for an empty output)."""
    outputs = engine.translate_ids([ids] * draws, max_len_a=0.0, max_len_b=1, batch_size=draws)
    return {row[0] if row else engine.settings["eos_id"] for row in outputs}


def test_ctranslate2_samples_with_the_saved_topk_topp_and_temperature(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each setting alone narrowed to the most probable token gives greedy outputs, every time; with none
    narrowed, repeated calls differ; `topp` 0.3 draws only inside attnlab's nucleus of mass 0.3;
    `sampling=False` searches instead. The seed and topk-with-topp are warned about and listed."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.decoding.search import mask_ungenerable, ungenerable_ids
    from attnlab.interop.ct2 import CT2Translator

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = random_translator(joint, joint, tie="all")
    lines = ["Zwei Männer fahren.", "Ein Hund liest.", "Schnee", "Eine Frau fährt ein Buch im Schnee."]
    greedy = ours.translate(lines)
    # temperature 1e-5: this model's closest top-two logits at a greedy step are 0.0042 apart, which at
    # 1e-3 left the runner-up a 1.5% chance per draw (the test failed about one run in ten)
    for narrowed in ({"topk": 1}, {"topp": 1e-6}, {"temperature": 1e-5}, {}):
        ours.decode = DecodeConfig(beam=1, sampling=True, max_len_a=0.0, max_len_b=8, seed=3, **narrowed)
        with caplog.at_level(logging.WARNING, logger="attnlab.interop.export"):
            engine = CT2Translator(export(ours, "ctranslate2", tmp_path / str(narrowed)), intra_threads=1)
        lost = engine.settings["not_carried"]
        assert len(lost) == 1 and lost[0].startswith("decode.seed=3")
        assert caplog.messages[-1] == f"format=ctranslate2 does not carry {lost[0]}"
        saved = engine.settings["decode"]["sampling"]
        assert saved == {"topk": 0, "topp": 1.0, "temperature": 1.0, **narrowed}
        samples = {tuple(engine.translate(lines)) for _ in range(5)}
        assert (samples == {tuple(greedy)}) == bool(narrowed), (narrowed, samples)
        assert engine.translate(lines, sampling=False) == greedy
    with pytest.raises(ValueError, match="sampling draws one output per sentence, but beam=4: use beam=1"):
        engine.translate(lines, beam=4)

    source = engine.source_ids(lines[:1])[0]
    with torch.inference_mode():
        memory, mask = ours.model.encode(torch.tensor([source]))
        start = torch.tensor([[ours.model.config.start_id]])
        scores = ours.model.decode(start, memory, mask)[:, -1]  # (1, V)
        never = ungenerable_ids(ours.model.config, scores.device)
        probs = mask_ungenerable(scores, never, ours.model.config.eos_id, 1, 1).softmax(-1)[0]
    ranked = probs.sort(descending=True, stable=True)
    nucleus = {
        int(t)
        for t, before in zip(ranked.indices, ranked.values.cumsum(0) - ranked.values, strict=True)
        if before < 0.3
    }
    ours.decode = DecodeConfig(beam=1, sampling=True, topp=0.3)
    drawn = first_tokens(
        CT2Translator(export(ours, "ctranslate2", tmp_path / "topp"), intra_threads=1), source, 400
    )
    assert 1 < len(nucleus) < 10 and len(drawn) > 1 and drawn <= nucleus  # (unseeded: not all need appear)

    ours.decode = DecodeConfig(beam=1, sampling=True, topk=5, topp=0.5)  # as attnlab combines them: lost
    both = CT2Translator(export(ours, "ctranslate2", tmp_path / "both"), intra_threads=1).settings
    assert both["not_carried"][1].startswith("decode.topk=5 with decode.topp=0.5")
    ours.decode = DecodeConfig(beam=1, sampling=True, topk=1000)  # more than the 80 tokens: every token
    every = CT2Translator(export(ours, "ctranslate2", tmp_path / "every"), intra_threads=1)
    assert every.settings["decode"]["sampling"]["topk"] == 0 and len(every.settings["not_carried"]) == 1
    assert len(first_tokens(every, source, 200)) > 10
    edited = json.loads((tmp_path / "every" / "attnlab_export.json").read_text())
    edited["decode"]["sampling"]["topk"] = 80  # every one of the 80 target tokens, as a user may write it
    (tmp_path / "every" / "attnlab_export.json").write_text(json.dumps(edited))
    assert len(first_tokens(CT2Translator(tmp_path / "every", intra_threads=1), source, 200)) > 10

    ours.decode = DecodeConfig(beam=1, max_len_a=0.0, max_len_b=8)
    searching = CT2Translator(export(ours, "ctranslate2", tmp_path / "greedy"), intra_threads=1)
    with pytest.raises(ValueError, match=r"did not decode with decode\.sampling=true"):
        searching.translate(lines, sampling=True)


@pytest.mark.parametrize("fmt", ["hf", "ctranslate2"])
@pytest.mark.parametrize(
    "model,named",
    [({"pe": "learned", "max_positions": 64}, "pe='learned'"), ({"norm_first": True}, "norm_first=True"),
     ({"layer_norm_eps": 1e-6}, "layer_norm_eps=1e-06"),
     ({"d_head": 16}, "MarianMT needs n_heads x d_head = d_model, the model has n_heads=4 x d_head=16 != "
                      "d_model=32")],
    ids=["learned positions", "pre-norm", "another layernorm epsilon", "heads wider than d_model / n_heads"],
)  # fmt: skip
def test_a_model_marianmt_cannot_hold_is_refused_naming_what_exports(
    tmp_path: Path, fmt: str, model: dict[str, Any], named: str
) -> None:
    if fmt == "ctranslate2":
        pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = random_translator(joint, joint, **{"tie": "all", **model})
    with pytest.raises(ExportError) as caught:
        export(ours, fmt, tmp_path / "out")
    message = str(caught.value)
    assert named in message and f"format={fmt}" in message
    assert (
        "model.pe=sinusoidal, model.norm_first=false, model.layer_norm_eps=1e-5 and model.d_head=null exports"
    ) in message
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []  # nothing half-written


def test_an_out_that_cannot_be_written_is_refused_naming_it_and_the_fix(tmp_path: Path) -> None:
    """A dangling symbolic link (the finished export could not be renamed onto it), a file (which the
    export would have replaced), a path under a file, and a directory that takes no new entries (/proc,
    whatever the permission bits say): refused naming `out=` and what to do, not with the OSError of a
    hidden staging directory, and nothing is left."""
    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = random_translator(joint, joint, tie="all", pe_layout="split")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("mine")
    refusals = {
        tmp_path / "dangling": rf"is a symbolic link to {tmp_path / 'nowhere'}, which does not exist: name a",
        tmp_path / "file": "is a file: name a directory to export into",
        tmp_path / "file" / "out": rf"cannot write the export in {tmp_path / 'file'} \(not a directory\)",
        Path("/proc/attnlab-export"): r"cannot write the export in /proc \(.*\): choose a directory you can",
    }
    for out, message in refusals.items():
        with pytest.raises(ExportError, match=rf"^out={out}:? {message}"):
            export(ours, "hf", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "file"]  # nothing half-written
    assert (tmp_path / "file").read_text() == "mine"


def test_an_out_that_is_a_symbolic_link_is_written_through_and_the_link_kept(tmp_path: Path) -> None:
    """`out` a link to a directory (an earlier export on a larger disk, `latest -> v1`): overwrite=true
    replaced the link by a directory beside it, and the earlier export stayed, stale, where the link had
    pointed. The export replaces the link's target (without overwrite, an empty one), and the link stays."""
    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = random_translator(joint, joint, tie="all")
    (tmp_path / "store").mkdir()
    target = export(ours, "hf", tmp_path / "store" / "v1")
    (target / "stale.txt").write_text("from the earlier export")
    (tmp_path / "latest").symlink_to(target)
    assert export(ours, "hf", tmp_path / "latest", overwrite=True) == tmp_path / "latest"
    assert (tmp_path / "latest").is_symlink() and (tmp_path / "latest").resolve() == target
    assert (target / "tokenizer.json").is_file() and not (target / "stale.txt").exists()
    (tmp_path / "store" / "empty").mkdir()
    (tmp_path / "new").symlink_to(tmp_path / "store" / "empty")
    export(ours, "hf", tmp_path / "new")
    assert (tmp_path / "new").is_symlink() and (tmp_path / "store" / "empty" / "tokenizer.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "new", "store"]  # nothing left beside
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["empty", "v1"]


def test_an_interrupted_overwrite_puts_the_earlier_export_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed (KeyboardInterrupt, as SIGINT raises it) between moving the earlier export aside and moving
    the new one in: the earlier export is back in place, nothing of it lost, no directory left over."""
    import os

    from attnlab.interop import export as module

    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = random_translator(joint, joint, tie="all")
    out = export(ours, "hf", tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_replace = os.replace

    def interrupted(src, dst):  # the move of the new export into place
        if ".old." not in str(dst) and ".old." not in str(src):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(module.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export(ours, "hf", out, overwrite=True)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging or set-aside directory


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda s: s.update(positions="1024"), "positions is '1024', not an integer of at"),
        (lambda s: s.update(positions=0), "positions is 0, not an integer of at least 1"),
        (lambda s: s.update(positions=10**400), r"positions is 10{23}…0{8} \(401 characters\), not"),
        (lambda s: s.update(pad_id=True), "pad_id is True, not an integer of at least 0"),
        (lambda s: s.update(max_source_tokens=256.0), "max_source_tokens is 256.0, not an integer"),
        (lambda s: s.update(max_source_tokens=0), "max_source_tokens is 0, not an integer of at least 1"),
        (lambda s: s.update(pad_id=-1), "pad_id is -1, not an integer of at least 0"),
        (lambda s: s.pop("eos_id"), r"eos_id is missing \(or null\)"),
        (lambda s: s.update(eos_id=10**6), "eos_id is 1000000, not an id of the"),
        (lambda s: s.update(pad_id=50), "pad_id is 50, not an id of the 50-token vocabulary"),  # the smaller
        (lambda s: s.update(eos_id=3), "eos_id is 3, not the end token of config.json beside it \\('2'\\)"),
        (lambda s: s.update(pad_id=2), "pad_id is 2, not an id apart from eos_id's \\(pad and bos are never"),
        (lambda s: s.pop("decode"), r"decode is missing \(or null\)"),
        (lambda s: s.update(decode=[]), r"decode is \[\], not a JSON object"),
        (lambda s: s["decode"].pop("beam"), r"decode.beam is missing \(or null\)"),
        (lambda s: s["decode"].update(beam="5"), "decode holds .*: beam='5' is not valid: expected"),
        (lambda s: s["decode"].update(beam=2**70), f"decode.beam is {2**70}, not an integer of at most 2147"),
        (lambda s: s["decode"].update(max_len_a=-(10**400)), r"decode .*: max_len_a=-10{22}…0{8} \(402 char"),
        (lambda s: s["decode"].update(max_len_a=float("inf")), "decode holds .*: max_len_a=inf must be >= 0"),
        (lambda s: s["decode"].update(max_len_a=float("nan")), "decode holds .*: max_len_a=nan must be >= 0"),
        (lambda s: s["decode"].update(min_len=0), "decode holds .*: min_len=0 must be positive"),
        (lambda s: s["decode"].update(length_penalty=-1), "decode.length_penalty is -1, not a finite number"),
        (lambda s: s["decode"].update(length_penalty=True), "decode.length_penalty is True, not a finite"),
        (lambda s: s["decode"].update(length_penalty=10**400),
         r"decode.length_penalty is 10+…0{8} \(401 characters\), not a finite number"),
        (lambda s: s["decode"].update(sampling=[]), r"decode.sampling is \[\], not a JSON object"),
        (lambda s: s["decode"].update(sampling={"topk": 2**31, "topp": 1, "temperature": 1}, beam=1),
         "decode.sampling.topk is 2147483648, not an integer of at most"),
        (lambda s: s["decode"].update(sampling={"topk": 10**6, "topp": 1, "temperature": 1}, beam=1),
         "decode.sampling.topk is 1000000, not at most the .* tokens of the target vocabulary"),
        (lambda s: s["decode"].update(sampling={"topk": 0, "topp": 1e-50, "temperature": 1}, beam=1),
         "decode.sampling.topp is 1e-50, not a number that is not 0 in float32"),
        (lambda s: s["decode"].update(sampling={"topk": 0, "topp": 3 * 10**9, "temperature": 1}, beam=1),
         r"decode holds .*: topp=3000000000.0 must be in \(0, 1\]"),
        (lambda s: s["decode"].update(sampling={"topk": 0, "topp": 1}),
         r"decode.sampling.temperature is missing \(or null\)"),
        (lambda s: s["decode"].update(sampling={"topk": -1, "topp": 1, "temperature": 1}),
         "decode holds .*: topk=-1 must be >= 0"),
        (lambda s: s["decode"].update(sampling={"topk": 0, "topp": 5, "temperature": 1}, beam=1),
         r"decode holds .*: topp=5.0 must be in \(0, 1\]"),
        (lambda s: s["decode"].update(sampling={"topk": 0, "topp": 1, "temperature": 0}, beam=1),
         "decode holds .*: temperature=0.0 must be > 0"),
        (lambda s: s["decode"].update(sampling={"topk": 0, "topp": 1, "temperature": 1}, beam=5),
         "decode holds .*: beam=5 but sampling=true draws one output per sentence"),
    ],
)  # fmt: skip
def test_a_damaged_ctranslate2_settings_file_is_refused_naming_the_field(
    tmp_path: Path, damage: Any, message: str
) -> None:
    """attnlab_export.json is the user's file: each field CT2Translator reads is checked when it loads, and a
    damaged one is an ExportError naming it and the fix, not a KeyError or TypeError mid-translation. The
    decoding settings break DecodeConfig's own rules; the ids, sizes and length penalty CTranslate2's."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.interop.ct2 import CT2Translator
    from attnlab.interop.export import SETTINGS_FILE

    src, tgt = separate_vocabularies()
    path = export(random_translator(src, tgt, tie="decoder"), "ctranslate2", tmp_path / "ct2")
    settings = json.loads((path / SETTINGS_FILE).read_text())
    assert CT2Translator(path, intra_threads=1).translate(["Ein Hund."])  # the undamaged file loads
    damage(settings)
    (path / SETTINGS_FILE).write_text(json.dumps(settings))
    with pytest.raises(
        ExportError, match=rf"attnlab_export.json: {message}.*; the file is damaged .*attnlab-export"
    ):
        CT2Translator(path, intra_threads=1)


@pytest.mark.parametrize(
    ("config", "message"),
    [({"eos_token": 2}, "eos_token is 2, not CTranslate2's end token, a string"),
     ([], r"eos_token is missing \(or null\)")],
)  # fmt: skip
def test_a_ctranslate2_config_without_a_string_end_token_is_refused_naming_it(
    tmp_path: Path, config: Any, message: str
) -> None:
    """CTranslate2's config.json beside the settings is read for its end token: one that is no string is
    an ExportError naming config.json, not blamed on attnlab_export.json's eos_id."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.interop.ct2 import CT2Translator

    src, tgt = separate_vocabularies()
    path = export(random_translator(src, tgt, tie="decoder"), "ctranslate2", tmp_path / "ct2")
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match=rf"ct2/config.json: {message}; the file is damaged"):
        CT2Translator(path, intra_threads=1)


def test_settings_decodeconfig_only_warns_about_load_quietly_and_a_huge_batch_size_translates(
    tmp_path: Path,
) -> None:
    """An export is checked through DecodeConfig, which only warns about a min_len no output can reach:
    such an export loads without a warning (it was exported so). A batch size far past the sentences
    (2^31-1: CTranslate2 took it as room to reserve, std::bad_alloc) translates: it is capped at the number
    of sentences, which changes no batch."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.interop.ct2 import CT2Translator
    from attnlab.interop.export import SETTINGS_FILE

    src, tgt = separate_vocabularies()
    path = export(random_translator(src, tgt, tie="decoder"), "ctranslate2", tmp_path / "ct2")
    translator = CT2Translator(path, intra_threads=1)
    expected = translator.translate(["Ein Hund.", "Zwei Hunde spielen im Schnee."])
    settings = json.loads((path / SETTINGS_FILE).read_text())
    unreachable = json.loads(json.dumps(settings))
    unreachable["decode"].update(max_len_a=0, max_len_b=2, min_len=5)
    (path / SETTINGS_FILE).write_text(json.dumps(unreachable))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CT2Translator(path, intra_threads=1)
    settings["decode"]["batch_size"] = 2**31 - 1
    (path / SETTINGS_FILE).write_text(json.dumps(settings))
    huge = CT2Translator(path, intra_threads=1)
    assert huge.translate(["Ein Hund.", "Zwei Hunde spielen im Schnee."]) == expected


def test_an_exported_beam_whose_step_cannot_fit_in_memory_is_refused_before_ctranslate2_allocates(
    tmp_path: Path,
) -> None:
    """A legal but huge beam (2^31-1), in the export's decode.beam or given to `translate`, is refused on
    the CPU, naming it and the fix, before CTranslate2 tries to allocate its scores (which ended in the
    out-of-memory killer): with `device="auto"` too, and counting the sentences CTranslate2 decodes at once
    (a batch_size of 0 is no limit; `inter_threads` run batches side by side). The export still translates
    with a beam given to `translate`."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.interop.ct2 import CT2Translator
    from attnlab.interop.export import SETTINGS_FILE

    src, tgt = separate_vocabularies()
    path = export(random_translator(src, tgt, tie="decoder"), "ctranslate2", tmp_path / "ct2")
    lines = ["Ein Hund.", "Zwei Hunde spielen im Schnee."]
    engine = CT2Translator(path, intra_threads=1)
    expected = engine.translate(lines, beam=2)
    huge = 2**31 - 1
    scores = (
        rf"rows of {engine.tgt_tokenizer.vocab_size} float32 numbers: the scores over the target vocabulary"
    )

    def refused(sentences: int, fix: str) -> str:
        return rf"^beam={huge} for {sentences} sentences? needs at least [\d,.]+ GiB .*{scores}\), .*: {fix}$"

    batch = r" or batch_size= \(fewer sentences at once\)"
    with address_space_capped():  # a refusal that broke fails here, not by the out-of-memory killer
        with pytest.raises(ConfigError, match=refused(2, r"translate with a smaller beam=" + batch)):
            engine.translate(lines, beam=huge)  # the caller's beam: no word of the export's
        with pytest.raises(ConfigError, match=refused(1, r"translate with a smaller beam=")):
            engine.translate(lines, beam=huge, batch_size=1)  # one sentence at a time
        with pytest.raises(ConfigError, match=refused(2, r"translate with a smaller beam=" + batch)):
            engine.translate(lines, beam=huge, batch_size=0)  # no limit: both at once
        side_by_side = CT2Translator(path, intra_threads=1, inter_threads=2)
        threads = r" or inter_threads= of CT2Translator \(2 batches side by side\)"
        with pytest.raises(ConfigError, match=refused(2, r"translate with a smaller beam=" + threads)):
            side_by_side.translate(lines, beam=huge, batch_size=1)  # batch_size is 1 already
        settings = json.loads((path / SETTINGS_FILE).read_text())
        settings["decode"]["beam"] = huge
        (path / SETTINGS_FILE).write_text(json.dumps(settings))
        for device in ("cpu", "auto"):
            translator = CT2Translator(path, device=device, intra_threads=1)
            saved = rf"translate with a smaller beam= \(this export's decode.beam is {huge}\){batch}"
            with pytest.raises(ConfigError, match=refused(2, saved)):
                translator.translate(lines)
            assert translator.translate(lines, beam=2) == expected


def test_ctranslate2_greedy_decoding_that_cannot_fit_is_refused_naming_what_lowers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At beam 1 the refusal advised "a smaller beam=", which cannot go lower: it names the batch size or
    the translators side by side, whichever is above 1, and neither the beam nor the length limit (the
    check counts the first step's scores only). The process is told it can take 300 bytes
    (`available_memory` patched, as in test_beam_search.py): one sentence's scores over the 50 target tokens
    take 200, two 400."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    import attnlab.decoding.search as search
    from attnlab.interop.ct2 import CT2Translator

    src, tgt = separate_vocabularies()
    path = export(random_translator(src, tgt, tie="decoder"), "ctranslate2", tmp_path / "ct2")
    lines = ["Ein Hund.", "Zwei Hunde spielen im Schnee."]
    expected = CT2Translator(path, intra_threads=1).translate(lines, beam=1)
    monkeypatch.setattr(search, "_SURELY_FITS", 0)
    monkeypatch.setattr(search, "available_memory", lambda: 300)
    engine = CT2Translator(path, intra_threads=1)
    two = r"^greedy decoding for 2 sentences .*: translate with a smaller "
    with pytest.raises(ConfigError, match=two + r"batch_size= \(fewer sentences at once\)$"):
        engine.translate(lines, beam=1)
    assert engine.translate(lines, beam=1, batch_size=1) == expected  # one at a time fits
    side_by_side = CT2Translator(path, intra_threads=1, inter_threads=2)
    with pytest.raises(
        ConfigError, match=two + r"inter_threads= of CT2Translator \(2 batches side by side\)$"
    ):
        side_by_side.translate(lines, beam=1, batch_size=1)
    monkeypatch.setattr(search, "available_memory", lambda: 100)  # not even one sentence's scores
    with pytest.raises(ConfigError, match=r"^greedy decoding for 1 sentence .*: free memory for this "
                       r"process, or raise its limit \(ulimit -v, its cgroup's memory.max\)$"):  # fmt: skip
        engine.translate(lines[:1], beam=1)


BAD_CALLS: dict[str, tuple[dict[str, Any], str]] = {
    "beam 0": ({"beam": 0}, r"beam=0 must be positive"),
    "negative beam": ({"beam": -1}, r"beam=-1 must be positive"),
    "beam past 2^31-1": ({"beam": 2**31}, r"beam=2147483648 must be at most 2147483647 \(CTranslate2 takes"),
    "fractional beam": ({"beam": 2.5}, r"beam=2\.5 is not valid: expected int"),
    "min_len 0": ({"min_len": 0}, r"min_len=0 must be positive"),
    "negative max_len_b": ({"max_len_b": -20}, r"max_len_b=-20 must be >= 0"),
    "NaN max_len_a": ({"max_len_a": float("nan")}, r"max_len_a=nan must be >= 0 and finite"),
    "negative batch_size": ({"batch_size": -3}, r"batch_size=-3 must be a whole number of sentences"),
    "NaN length_penalty": ({"length_penalty": float("nan")}, r"length_penalty=nan must be a finite number"),
    "bool length_penalty": ({"length_penalty": True}, r"length_penalty=True must be a finite number"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_CALLS)
def test_ctranslate2_call_settings_attnlab_refuses_are_refused_naming_them(case: str, tmp_path: Path) -> None:
    """`CT2Translator.translate`'s own settings were passed to CTranslate2 unchecked: a NaN max_len_a or a
    negative max_len_b translated every line to one token and a NaN length penalty ran, without a word; a
    negative beam, min_len 0 or a negative batch size failed with pybind11's TypeError listing
    translate_batch's signature. Each is a ValueError naming the setting, as `decode.*` refuses it; the
    settings it takes (batch_size=0: no limit) still translate."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.interop.ct2 import CT2Translator

    src, tgt = separate_vocabularies()
    engine = CT2Translator(export(random_translator(src, tgt, tie="decoder"), "ctranslate2", tmp_path / "c"))
    lines = ["Ein Hund.", "Zwei Hunde spielen im Schnee."]
    settings, message = BAD_CALLS[case]
    with pytest.raises(ValueError, match=f"^{message}"):
        engine.translate(lines, **settings)
    assert engine.translate(lines, batch_size=0, length_penalty=0.5) == engine.translate(lines)


def test_a_ctranslate2_settings_file_that_is_no_object_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.interop.ct2 import CT2Translator
    from attnlab.interop.export import SETTINGS_FILE

    src, tgt = separate_vocabularies()
    path = export(random_translator(src, tgt, tie="decoder"), "ctranslate2", tmp_path / "ct2")
    (path / SETTINGS_FILE).write_text("[1, 2]")
    with pytest.raises(ExportError, match=r"attnlab_export.json: the file is \[1, 2\], not a JSON object"):
        CT2Translator(path, intra_threads=1)


@pytest.mark.parametrize(
    ("name", "text"),
    [("attnlab_export.json", "[" * 100_000), ("attnlab_target_tokenizer.json", "{}")],  # too deep; no model
)
def test_unreadable_ctranslate2_export_files_are_an_export_error(
    tmp_path: Path, name: str, text: str
) -> None:
    """A JSON file nested past Python's recursion limit, or a tokenizer file the tokenizers library
    refuses with its own exception, is the ExportError naming the directory, not a bare exception."""
    pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    from attnlab.interop.ct2 import CT2Translator

    src, tgt = separate_vocabularies()
    path = export(random_translator(src, tgt, tie="decoder"), "ctranslate2", tmp_path / "ct2")
    (path / name).write_text(text)
    with pytest.raises(ExportError, match=r"is not a directory written by attnlab-export format=ctranslate2"):
        CT2Translator(path, intra_threads=1)


def test_an_export_whose_source_limit_grows_its_position_table_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """MarianMT's sinusoids are a table as long as the longest source allowed: past attnlab's output cap
    the export warns with its size and the setting that asks for it; an ordinary export says nothing."""
    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = random_translator(joint, joint, tie="all")
    with caplog.at_level(logging.WARNING, logger="attnlab.interop.export"):
        export(ours, "hf", tmp_path / "ordinary")
        # a model of more positions than the output cap exports its own table as it is: nothing to say
        export(random_translator(joint, joint, tie="all", max_positions=5000), "hf", tmp_path / "long model")
    assert "sinusoid positions" not in caplog.text
    ours.decode = DecodeConfig(beam=1, alpha=0.0, max_len_a=0.0, max_len_b=8, max_source_tokens=6000)
    with caplog.at_level(logging.WARNING, logger="attnlab.interop.export"):
        hf = export(ours, "hf", tmp_path / "long")
    assert json.loads((hf / "config.json").read_text())["max_position_embeddings"] == 6000
    assert (
        "the export holds 6000 sinusoid positions, 1 MB in each of the encoder's and decoder's tables, "
        "because decode.max_source_tokens=6000 allows sources that long: lower it" in caplog.text
    )


@pytest.mark.parametrize("fmt", ["hf", "ctranslate2"])
def test_a_source_limit_whose_position_tables_cannot_fit_in_memory_is_refused_before_allocating(
    tmp_path: Path, fmt: str
) -> None:
    """A checkpoint's data settings with a source limit of 10^12 made the export allocate two tables of
    10^12 sinusoids (the allocator failed with a RuntimeError; a smaller limit past the memory could have
    the out-of-memory killer end a process): refused naming the setting and the fix, nothing written."""
    import resource

    if fmt == "ctranslate2":
        pytest.importorskip("ctranslate2", reason='needs the [export] extra: pip install -e ".[export]"')
    joint = SubwordTokenizer.train(GERMAN + ENGLISH, model="bpe", vocab_size=80)
    ours = random_translator(joint, joint, tie="all")
    ours.data = {"max_source_tokens": 10**12}  # as a checkpoint's data settings give it
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ExportError) as caught:
        export(ours, fmt, tmp_path / "out")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 500_000  # KiB: < 0.5 GB
    message = str(caught.value)
    assert message.startswith(
        f"format={fmt}: its sinusoid tables of 1000000000000 positions need 238,418.6 GiB, more than the "
    ), message  # 2 tables x 10^12 x 32 float32
    assert "because data.max_source_tokens=1000000000000" in message
    assert "export with a lower decode.max_source_tokens" in message
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_request_the_format_cannot_write_or_an_out_of_the_users_is_refused_before_loading(
    tmp_path: Path,
) -> None:
    """`check_request` alone (no model): quantization with format=hf is refused naming the fix, and
    overwrite=true replaces only an earlier export, never a directory of the user's own (nothing in it
    lost); an earlier export is replaced."""
    from attnlab.interop.export import SETTINGS_FILE, check_request

    with pytest.raises(ExportError, match=r"^quantization=int8 applies to format=ctranslate2; format=hf "
                       r"writes float32 weights \(drop quantization or set it to none\)$"):  # fmt: skip
        check_request("hf", "int8", tmp_path / "new", overwrite=False)
    assert check_request("ctranslate2", "int8", tmp_path / "new", overwrite=False) == tmp_path / "new"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(
        ExportError, match=rf"^out={mine} is not an earlier export \(it has no {SETTINGS_FILE}\)"
    ):
        check_request("hf", "none", mine, overwrite=True)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    (mine / SETTINGS_FILE).write_text('{"format": "hf"}')  # as an export writes it
    with pytest.raises(
        ExportError, match=rf"^out={mine} exists and is not empty: choose a new directory, or"
    ):
        check_request("hf", "none", mine, overwrite=False)
    assert check_request("hf", "none", mine, overwrite=True) == mine


def test_a_request_out_of_reach_or_without_its_package_is_refused_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check_request` alone: a missing parent directory is named (not "not a directory"); /proc/sys,
    where no user may add an entry, root included, is not writable (named before a staging directory is
    tried); format=ctranslate2 without ctranslate2 names the extra to install, and format=hf does not
    need it."""
    import sys

    from attnlab.interop.export import check_request

    missing = tmp_path / "missing"
    with pytest.raises(ExportError, match=rf"^out={missing / 'out'}: its parent directory {missing} does not "
                       "exist; create it first$"):  # fmt: skip
        check_request("hf", "none", missing / "out", overwrite=False)
    with pytest.raises(ExportError, match=r"^out=/proc/sys/attnlab: cannot write the export in /proc/sys "
                       r"\(not writable\)"):  # fmt: skip
        check_request("hf", "none", "/proc/sys/attnlab", overwrite=False)
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # not installed: find_spec gives None
    with pytest.raises(ExportError, match=r'^format=ctranslate2 needs the ctranslate2 package: pip install '
                       r'"attnlab\[export\]"$'):  # fmt: skip
        check_request("ctranslate2", "none", tmp_path / "out", overwrite=False)
    assert check_request("hf", "none", tmp_path / "out", overwrite=False) == tmp_path / "out"
