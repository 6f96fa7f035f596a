"""Decoding choices on the translating model: the deprecated `decode.lenpen`, sampling and ensembles,
through `Translator`, `attnlab-eval` and `attnlab-translate`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir

from attnlab.cli.app import config_dir, register_resolvers
from attnlab.cli.eval import evaluate_checkpoint
from attnlab.cli.translate import main as translate_main
from attnlab.data.batching import pad
from attnlab.data.tokenizer import SubwordTokenizer
from attnlab.decoding import DecodeConfig
from attnlab.decoding.ensemble import Ensemble
from attnlab.decoding.search import translate
from attnlab.inference.translator import Translator, resolve_checkpoints
from attnlab.metrics import corpus_bleu
from attnlab.runs.checkpoint import CheckpointError
from attnlab.runs.results import decoding_summary
from attnlab.typed import ConfigError
from helpers import count_steps, lines


def compose_eval(overrides: list[str], output_dir: Path) -> Any:
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(config_dir()), job_name="test"):
        return compose("eval", overrides=[f"paths.output_dir={output_dir}", *overrides])


@pytest.fixture(scope="module")
def run(translating_run: dict[str, Any]) -> dict[str, Any]:
    checkpoints = translating_run["dir"] / "checkpoints"
    epochs = sorted((checkpoints / "epochs").glob("epoch*.ckpt"))
    assert len(epochs) >= 2, f"the translating run keeps one epoch checkpoint: {epochs}"
    corpus = translating_run["corpus"]
    return {
        **translating_run,
        "best": next(checkpoints.glob("best-*.ckpt")),
        "epochs": epochs,
        "sources": lines(corpus / "valid.de"),
        "refs": lines(corpus / "valid.en"),
    }


def with_decode(translator: Translator, **settings: Any) -> Translator:
    translator.decode = DecodeConfig(**{**translator.decode.to_dict(), **settings})
    return translator


def source_ids(translator: Translator, sentences: list[str]) -> torch.Tensor:
    return pad(translator._source_ids(sentences), translator.model.config.pad_id)


# --- the deprecated decode.lenpen -------------------------------------------------------------------------


def test_a_checkpoint_saved_with_lenpen_loads_as_the_gnmt_alpha(run: dict[str, Any], tmp_path: Path) -> None:
    checkpoint = torch.load(run["best"], map_location="cpu", weights_only=True)
    saved = checkpoint["hyper_parameters"]["decode"]
    assert (saved["length_penalty"], saved["alpha"]) == ("gnmt", 0.6) and "lenpen" not in saved
    old = {k: v for k, v in saved.items() if k not in ("length_penalty", "alpha", "sampling", "topk", "topp",
                                                         "temperature", "seed")}  # fmt: skip
    checkpoint["hyper_parameters"]["decode"] = {**old, "lenpen": 1.3}  # as attnlab wrote it before
    torch.save(checkpoint, tmp_path / "old.ckpt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        translator = Translator.from_checkpoints([tmp_path / "old.ckpt"])
    messages = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert (
        len(messages) == 1 and "decode.lenpen is deprecated" in messages[0] and "decode.alpha" in messages[0]
    )
    assert (translator.decode.length_penalty, translator.decode.alpha) == ("gnmt", 1.3)
    assert translator.translate(run["sources"][:5]) == Translator.from_checkpoints(
        [run["best"]], DecodeConfig(**{**saved, "alpha": 1.3})
    ).translate(run["sources"][:5])

    # attnlab-eval with the old override: the GNMT alpha, recorded under the new keys.
    cfg = compose_eval(
        [f"ckpt_path={tmp_path / 'old.ckpt'}", "sets=[val]", "decode.lenpen=0.9"], tmp_path / "e"
    )
    with pytest.warns(FutureWarning, match="decode.lenpen is deprecated"):
        results = evaluate_checkpoint(cfg)
    assert (results["decode"]["length_penalty"], results["decode"]["alpha"]) == ("gnmt", 0.9)
    assert "lenpen" not in results["decode"]
    assert "gnmt length penalty alpha 0.9" in decoding_summary(results)
    both = compose_eval([f"ckpt_path={run['best']}", "decode.lenpen=0.9", "decode.alpha=1.0"], tmp_path / "f")
    with pytest.raises(
        ConfigError, match=r"lenpen=0\.9 and alpha=1\.0 are both set: .*keep only decode\.alpha"
    ):
        evaluate_checkpoint(both)


def test_the_fairseq_penalty_is_reachable_from_attnlab_eval(run: dict[str, Any], tmp_path: Path) -> None:
    cfg = compose_eval([f"ckpt_path={run['best']}", "sets=[val]", "decode.length_penalty=fairseq",
                        "decode.alpha=1.0"], tmp_path)  # fmt: skip
    results = evaluate_checkpoint(cfg)
    assert (results["decode"]["length_penalty"], results["decode"]["alpha"]) == ("fairseq", 1.0)
    assert results["sets"]["val"]["bleu"] >= 60
    assert "beam 3, fairseq length penalty alpha 1.0" in decoding_summary(results)


# --- sampling ---------------------------------------------------------------------------------------------


def test_sampling_on_the_translating_model(run: dict[str, Any]) -> None:
    translator = Translator.from_checkpoints([run["best"]])
    sources = run["sources"]
    greedy = with_decode(translator, beam=1).translate(sources)
    hot = {"beam": 1, "sampling": True, "temperature": 2.0}
    first = with_decode(translator, **hot, seed=1).translate(sources)
    assert with_decode(translator, **hot, seed=1).translate(sources) == first  # reproducible
    assert with_decode(translator, **hot, seed=2).translate(sources) != first  # another seed, other samples
    assert first != greedy
    assert with_decode(translator, **hot, seed=1, batch_size=3).translate(sources) == first  # other batches
    assert with_decode(translator, beam=1, sampling=True, topk=1, seed=5).translate(sources) == greedy
    assert with_decode(translator, beam=1, sampling=True, topp=1e-6, seed=5).translate(sources) == greedy
    assert (
        with_decode(translator, beam=1, sampling=True, temperature=1e-3, seed=5).translate(sources) == greedy
    )
    # At temperature 1 the trained model is confident: samples stay close to the references.
    assert (
        corpus_bleu(with_decode(translator, beam=1, sampling=True).translate(sources), run["refs"]).score > 30
    )

    # The ids: no pad, bos or start id, eos only at the end, min_len honoured.
    cfg = translator.model.config
    src = source_ids(translator, sources)
    for seed in range(3):
        config = DecodeConfig(beam=1, sampling=True, temperature=3.0, min_len=4, seed=seed)
        for row in translate(translator.model, src, config):
            assert not {cfg.pad_id, cfg.bos_id, cfg.start_id, cfg.eos_id} & set(row)
            assert len(row) >= 3  # min_len 4 counts eos


def test_attnlab_translate_samples_reproducibly_and_refuses_a_beam(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.de"
    source.write_text("\n".join(run["sources"][:10]) + "\n", "utf-8")
    sample = [f"ckpt_path={run['best']}", f"input={source}", "decode.sampling=true", "decode.beam=1",
              "decode.temperature=2.0", "decode.topk=20"]  # fmt: skip
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        translate_main([*sample, f"decode.seed={seed}", f"output={tmp_path / name}"])
    assert lines(tmp_path / "a") == lines(tmp_path / "b") != lines(tmp_path / "c")
    assert len(lines(tmp_path / "a")) == 10
    with pytest.raises(
        SystemExit, match=r"beam=3 but sampling=true draws one output per sentence: set decode\.beam=1"
    ):
        translate_main([f"ckpt_path={run['best']}", f"input={source}", "decode.sampling=true"])
    with pytest.raises(SystemExit, match=r"topk=5 is a sampling setting: set decode\.sampling=true"):
        translate_main([f"ckpt_path={run['best']}", f"input={source}", "decode.topk=5"])


# --- ensembles --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("beam", [1, 3])
def test_an_ensemble_of_one_model_or_of_a_model_with_itself_is_that_model(
    run: dict[str, Any], beam: int
) -> None:
    sources = run["sources"]
    alone = with_decode(Translator.from_checkpoints([run["best"]]), beam=beam).translate(sources)
    one = Translator.from_checkpoints([run["best"]], ensemble=True)
    assert one.ensemble and isinstance(one.model, Ensemble)
    assert with_decode(one, beam=beam).translate(sources) == alone
    twice = with_decode(Translator.from_checkpoints([run["best"], run["best"]], ensemble=True), beam=beam)
    assert twice.translate(sources) == alone
    if beam == 1:  # sampling reads the ensemble's distribution too
        sampled = {"sampling": True, "temperature": 1.5, "seed": 4}
        alone_sampled = with_decode(Translator.from_checkpoints([run["best"]]), beam=1, **sampled)
        assert with_decode(twice, **sampled).translate(sources) == alone_sampled.translate(sources) != alone


def test_two_checkpoints_combine_as_the_log_of_their_mean_probability(run: dict[str, Any]) -> None:
    a, b = run["epochs"][0], run["best"]
    models = [Translator.from_checkpoints([p]).model for p in (a, b)]
    ensemble = Translator.from_checkpoints([a, b], ensemble=True)
    src = source_ids(ensemble, run["sources"][:6])
    tgt = torch.full((src.size(0), 1), ensemble.model.config.start_id)
    with torch.no_grad():
        combined = ensemble.model.decode(tgt, *ensemble.model.encode(src))
        members = [m.decode(tgt, *m.encode(src)).log_softmax(dim=-1) for m in models]
    expected = (members[0].exp() + members[1].exp()).div(2).log()
    torch.testing.assert_close(combined, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(members[0], members[1], atol=1e-3)  # two different models

    # Greedy and beam outputs: valid translations, decoded with per-model caches as without them.
    for beam in (1, 3):
        hypotheses = with_decode(ensemble, beam=beam).translate(run["sources"])
        assert corpus_bleu(hypotheses, run["refs"]).score >= 60 and all(hypotheses)
        ids = translate(ensemble.model, src, DecodeConfig(beam=beam))
        assert ids == translate(ensemble.model, src, DecodeConfig(beam=beam), use_cache=False)
        assert not {0, 1, 2} & {t for row in ids for t in row}  # no pad, bos, eos in the outputs


def test_two_checkpoints_give_another_output_than_either(run: dict[str, Any], shared_data: Path) -> None:
    """On sentences the model never saw (Multi30k validation lines) the last two epochs' checkpoints
    disagree, and their ensemble's outputs are neither model's alone; they are valid outputs."""
    sources = (shared_data / "multi30k" / "val.de").read_text("utf-8").splitlines()[:40]
    a, b = run["epochs"][0], run["best"]
    outputs = {}
    for name, paths in (("a", [a]), ("b", [b]), ("both", [a, b])):
        translator = Translator.from_checkpoints(paths, ensemble=len(paths) > 1)
        outputs[name] = with_decode(translator, beam=1).translate(sources)
    assert outputs["a"] != outputs["b"]
    assert outputs["both"] != outputs["a"] and outputs["both"] != outputs["b"]
    assert all(outputs["both"])
    src = source_ids(translator, sources)
    for beam in (1, 3):
        ids = translate(translator.model, src, DecodeConfig(beam=beam))
        assert all(ids) and not {0, 1, 2} & {t for row in ids for t in row}  # no pad, bos or eos inside


def test_attnlab_eval_and_translate_decode_an_ensemble(run: dict[str, Any], tmp_path: Path) -> None:
    a, b = run["epochs"][-1], run["best"]
    with pytest.raises(ConfigError, match=r"ckpt_path is a list of 2 checkpoints: add ensemble=true"):
        evaluate_checkpoint(compose_eval([f"ckpt_path=[{a},{b}]"], tmp_path / "x"))
    done = subprocess.run(
        [sys.executable, "-m", "attnlab.cli.eval", f"ckpt_path=[{a},{run['dir']}]", "ensemble=true",
         "sets=[val]", f"hydra.run.dir={tmp_path / 'e'}"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "e" / "results.json").read_text())
    assert (
        f"decoding: beam 3, gnmt length penalty alpha 0.6; checkpoints: ensemble of 2: {a.resolve()}"
        in done.stdout
    )
    assert results["ensemble"] == [str(a.resolve()), str(b.resolve())] == results["checkpoints"]
    assert results["averaged"] is False and results["sets"]["val"]["bleu"] >= 60
    assert f"ensemble of 2: {a.resolve()}, {b.resolve()}" in decoding_summary(results)
    single = evaluate_checkpoint(compose_eval([f"ckpt_path={b}", "sets=[val]"], tmp_path / "s"))
    assert single["ensemble"] is None

    source = tmp_path / "in.de"
    source.write_text("\n".join(run["sources"][:8]) + "\n", "utf-8")
    translate_main([f"ckpt_path=[{b},{b}]", "ensemble=true", f"input={source}", f"output={tmp_path / 'o'}"])
    translate_main([f"ckpt_path={b}", f"input={source}", f"output={tmp_path / 'p'}"])
    assert lines(tmp_path / "o") == lines(tmp_path / "p")
    with pytest.raises(SystemExit, match=r"add ensemble=true"):
        translate_main([f"ckpt_path=[{a},{b}]", f"input={source}"])
    with pytest.raises(SystemExit, match=r"average_last=2 averages one run's weights"):
        translate_main([f"ckpt_path=[{a},{b}]", "ensemble=true", "average_last=2", f"input={source}"])


def test_an_ensemble_refuses_models_with_other_vocabularies(run: dict[str, Any], tmp_path: Path) -> None:
    """Each side is checked: a checkpoint differing only in its source, or only in its target tokenizer,
    is refused, naming that side."""
    other = SubwordTokenizer.train(lines(run["corpus"] / "train.en")[:120], model="bpe", vocab_size=300)
    for side, name in (("src", "source"), ("tgt", "target")):
        checkpoint = torch.load(run["best"], map_location="cpu", weights_only=True)
        checkpoint["attnlab"][f"{side}_tokenizer"] = other.to_json()
        path = tmp_path / f"other_{side}.ckpt"
        torch.save(checkpoint, path)
        expected = f"{path} has another {name} tokenizer than {run['best']} (vocabularies of"
        with pytest.raises(CheckpointError, match=re.escape(expected)):
            Translator.from_checkpoints([run["best"], path], ensemble=True)
    with pytest.raises(ConfigError, match="must share their tokenizers and vocabularies"):
        evaluate_checkpoint(compose_eval([f"ckpt_path=[{run['best']},{tmp_path / 'other_tgt.ckpt'}]",
                                          "ensemble=true"], tmp_path / "e"))  # fmt: skip


def test_an_ensemble_refuses_models_trained_between_other_languages(
    run: dict[str, Any], tmp_path: Path
) -> None:
    """Models sharing their tokenizers (a tokenizer file) but trained for another direction (de->fr beside
    de->en) were ensembled without a word, mixing the two target languages' probabilities; refused, naming
    both directions. Language codes compare by subtag (`EN` is `en_US`)."""
    saved = torch.load(run["best"], map_location="cpu", weights_only=True)["attnlab"]["data"]
    assert (saved["src_lang"], saved["tgt_lang"]) == ("de", "en")
    cases = (("tgt_lang", "fr", True), ("src_lang", "fr", True), ("tgt_lang", "EN_us", False))
    for key, value, refused in cases:
        checkpoint = torch.load(run["best"], map_location="cpu", weights_only=True)
        checkpoint["attnlab"]["data"][key] = value
        path = tmp_path / f"{key}_{value}.ckpt"
        torch.save(checkpoint, path)
        if not refused:
            assert Translator.from_checkpoints([run["best"], path], ensemble=True).ensemble
            continue
        direction = "de -> fr" if key == "tgt_lang" else "fr -> en"
        expected = f"{path} was trained to translate {direction}, but {run['best']} de -> en: the models of"
        with pytest.raises(CheckpointError, match=re.escape(expected)):
            Translator.from_checkpoints([run["best"], path], ensemble=True)
    with pytest.raises(SystemExit, match="must translate between the same languages"):
        translate_main([f"ckpt_path=[{run['best']},{tmp_path / 'tgt_lang_fr.ckpt'}]", "ensemble=true"])


def test_the_ensemble_api_checks_vocabularies_and_needs_a_list(run: dict[str, Any]) -> None:
    from attnlab.model.transformer import Transformer
    from helpers import tiny_config

    small = Transformer(tiny_config(src_vocab_size=20, tgt_vocab_size=20))
    large = Transformer(tiny_config(src_vocab_size=30, tgt_vocab_size=30))
    with pytest.raises(ValueError, match="model 1 of the ensemble has tgt_vocab_size=30 but model 0 has 20"):
        Ensemble([small, large])
    with pytest.raises(CheckpointError, match=r"ensemble=true needs a list of checkpoints"):
        resolve_checkpoints(run["best"], ensemble=True)
    assert resolve_checkpoints([run["best"], run["dir"]], ensemble=True) == [run["best"], run["best"]]


# --- the CPU decoding step --------------------------------------------------------------------------------


def test_the_cpu_decoding_step_translates_as_the_modules(
    run: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attnlab.decoding.step.StepDecoder` (what CPU searches run) gives the translating model's
    validation set the same greedy and beam outputs, one sentence at a time and in one padded batch,
    as `Transformer.decode` over its `KVCache`."""
    from attnlab.decoding.step import StepDecoder

    translator = Translator.from_checkpoints([run["best"]])
    model = translator.model.eval()
    batch = source_ids(translator, run["sources"])
    singles = [source_ids(translator, [line]) for line in run["sources"][:8]]

    def outputs() -> list[list[list[int]]]:
        found = []
        for beam in (1, 3):
            settings = DecodeConfig(**{**translator.decode.to_dict(), "beam": beam})
            found.append(translate(model, batch, settings))
            found.append([translate(model, src, settings)[0] for src in singles])
        return found

    calls = count_steps(monkeypatch)
    stepped = outputs()
    assert calls[0] > 0  # the translating model decodes through the step
    monkeypatch.setattr(StepDecoder, "applies", staticmethod(lambda *args, **kwargs: False))
    by_modules = outputs()
    assert stepped == by_modules
    hypotheses = [translator.tgt_tokenizer.decode(row) for row in stepped[2]]  # beam 3, the batch
    assert corpus_bleu(hypotheses, run["refs"]).score >= 60
