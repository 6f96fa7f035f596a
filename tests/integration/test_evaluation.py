"""Evaluation end to end on a small text corpus: monitoring val/bleu, averaging, results.json, the
attnlab-eval and attnlab-translate commands, and self-contained checkpoints."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from attnlab.cli.eval import evaluate_checkpoint
from attnlab.cli.translate import main as translate_main
from attnlab.inference.translator import Translator, resolve_checkpoints
from attnlab.metrics import MetricsConfig, corpus_bleu, corpus_chrf, corpus_ter, fit_metrics, is_final_metric
from attnlab.runs.checkpoint import CheckpointError, kept_checkpoints, read_checkpoint
from attnlab.training.experiment import validate
from attnlab.training.module import TranslationModule
from attnlab.typed import ConfigError
from helpers import TEXT_SPLITS, compose_eval, compose_train, lines, subprocess_path, text_data, write_corpus


@pytest.fixture(scope="module")
def text_run(translating_run: dict[str, Any]) -> dict[str, Any]:
    """The session's translating model (`translating_run`): 30 epochs, validation decoded every 10th
    epoch and monitored by val/bleu with early stopping; the last 2 epoch checkpoints averaged and
    beam-decoded (beam 3) on the test sets `test` and `test2`."""
    return translating_run


def references(text_run: dict[str, Any], name: str) -> list[str]:
    return lines(text_run["corpus"] / f"{name}.en")


def assert_translates(hypotheses: list[str], refs: list[str]) -> None:
    """Sentence-specific output: non-empty, all different, and most of it the reference itself."""
    assert len(hypotheses) == len(refs) and all(hypotheses)
    assert len(set(hypotheses)) == len(hypotheses)
    assert sum(h == r for h, r in zip(hypotheses, refs, strict=True)) >= len(refs) // 2


def test_monitor_resolves_to_val_bleu_checked_on_decoding_epochs(text_run: dict[str, Any]) -> None:
    saved = OmegaConf.load(text_run["dir"] / "config.yaml")
    assert dict(saved.monitor) == {"metric": "val/bleu", "mode": "max", "every_n_epochs": 10}
    with open(text_run["dir"] / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["val/loss"]]
    assert [i for i, r in enumerate(rows) if r["val/bleu"]] == [9, 19, 29]  # 30 epochs, every 10th decoded
    scores = {i: float(r["val/bleu"]) for i, r in enumerate(rows) if r["val/bleu"]}
    first_best = min(i for i, score in scores.items() if score == max(scores.values()))
    best = sorted((text_run["dir"] / "checkpoints").glob("best-*.ckpt"))
    assert [p.name.split("-step")[0] for p in best] == [f"best-epoch{first_best:03d}"]


def greedy_validation(text_run: dict[str, Any], beam: int = 1) -> tuple[TranslationModule, Any, list[str]]:
    """The run's last.ckpt, its datamodule (set up) and the greedy decodes of its validation set, in order
    (with `beam` > 1: its beam-search decodes)."""
    module = TranslationModule.load_from_checkpoint(text_run["dir"] / "checkpoints" / "last.ckpt").eval()
    datamodule = validate(text_run["cfg"]).data.datamodule()
    datamodule.setup()
    outputs = {}
    for batch in datamodule.val_dataloader():
        outputs.update(zip(batch["index"].tolist(), module.translate(batch["src"], beam=beam), strict=True))
    return module, datamodule, [datamodule.tgt_tokenizer.decode(outputs[i]) for i in range(len(outputs))]


def test_logged_validation_bleu_is_sacrebleu_of_greedy_decodes_of_the_weights(
    text_run: dict[str, Any],
) -> None:
    """The last val/bleu is sacreBLEU of the final weights' greedy decodes against the raw references
    (last.ckpt is saved after that validation), with every metric of a text run logged."""
    metrics = text_run["metrics"]
    assert {"val/loss", "val/bleu", "val/chrf", "test/loss", "test/exact_match"} <= set(metrics)
    _, datamodule, hypotheses = greedy_validation(text_run)
    refs = references(text_run, "valid")
    assert datamodule.references["val"] == refs
    assert_translates(hypotheses, refs)
    with open(text_run["dir"] / "csv" / "metrics.csv") as f:
        logged = [float(r["val/bleu"]) for r in csv.DictReader(f) if r["val/bleu"]]
    assert logged[-1] == pytest.approx(corpus_bleu(hypotheses, refs).score, abs=1e-4)
    assert logged[-1] >= 60


def test_validation_bleu_with_val_subset_scores_the_first_sentences_only(text_run: dict[str, Any]) -> None:
    """README, "Run directory": `val/bleu` and `val/chrf` score greedy decodes of the validation set, or
    of its first `decode.val_subset` sentences; the validation loss stays the whole set's."""
    import dataclasses

    import lightning as L

    from attnlab.metrics import corpus_chrf

    module, datamodule, hypotheses = greedy_validation(text_run)
    # the sentence right after the subset gets a reference unlike its translation (the model translates
    # most validation sentences perfectly): scored with one sentence more, or the whole set, BLEU differs
    n = 10
    refs = list(datamodule.references["val"])
    refs[n] = "nothing in this line is like the translation"
    datamodule.references["val"] = refs
    bleu = {k: corpus_bleu(hypotheses[:k], refs[:k]).score for k in (n, n + 1, len(refs))}
    assert bleu[n] not in (bleu[n + 1], bleu[len(refs)])
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    logged = {}
    for subset in (n, None):
        module.decode_config = dataclasses.replace(module.decode_config, val_subset=subset, every_n_epochs=1)
        (logged[subset],) = trainer.validate(module, datamodule=datamodule, verbose=False)
    assert logged[n]["val/bleu"] == pytest.approx(bleu[n], abs=1e-4)
    assert logged[n]["val/chrf"] == pytest.approx(corpus_chrf(hypotheses[:n], refs[:n]).score, abs=1e-4)
    assert logged[None]["val/bleu"] == pytest.approx(bleu[len(refs)], abs=1e-4)
    assert logged[n]["val/loss"] == logged[None]["val/loss"]


def test_training_decodes_exactly_val_subset_sentences_and_not_in_the_sanity_check(
    text_run: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Fitting with `decode.val_subset=5` decodes the first 5 validation sentences once per decoding
    epoch, and nothing in Lightning's sanity check before training (its validation batches are scored
    for the loss only: a decode there would cost a whole validation decode and log a "val BLEU" line
    that no metric keeps)."""
    import dataclasses

    import lightning as L

    module, datamodule, _ = greedy_validation(text_run)
    module.decode_config = dataclasses.replace(module.decode_config, val_subset=5, every_n_epochs=1)
    decoded: list[list[int]] = []
    translate = module.translate

    def recorded(src: torch.Tensor, beam: int | None = None) -> list[list[int]]:
        decoded.append(src.tolist())
        return translate(src, beam)

    monkeypatch.setattr(module, "translate", recorded)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, max_epochs=1, limit_train_batches=1, num_sanity_val_steps=2,
    )  # fmt: skip
    with caplog.at_level("INFO", logger="attnlab.training.module"):
        trainer.fit(module, datamodule=datamodule)
    sources = [[t for t in row if t != datamodule.pad_id] for batch in decoded for row in batch]
    first = [src for src, _, _ in datamodule.splits["val"][:5]]
    assert sorted(sources) == sorted(first)
    assert [r.getMessage().split(" (")[0] for r in caplog.records if "val BLEU" in r.getMessage()] == [
        f"val BLEU {trainer.callback_metrics['val/bleu']:.2f}"
    ]


def test_val_subset_is_decoded_whole_when_limit_val_batches_stops_before_it(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`decode.val_subset=n` with `trainer.limit_val_batches=1`: the one validation batch (the shortest
    sentences) holds none of the first n sentences, yet the run trains its epoch, decodes exactly those n
    and logs their `val/bleu`, the metric its checkpoints monitor (README, "Run directory")."""
    from attnlab.training.pipeline import train

    decoded: list[list[int]] = []
    translate = TranslationModule.translate

    def recorded(module: TranslationModule, src: torch.Tensor, beam: int | None = None) -> list[list[int]]:
        decoded.extend([t for t in row if t != module.model_config.pad_id] for row in src.tolist())
        return translate(module, src, beam)

    monkeypatch.setattr(TranslationModule, "translate", recorded)
    corpus = write_corpus(shared_data, tmp_path / "corpus", TEXT_SPLITS)
    n = 2
    overrides = [*text_data(corpus, tmp_path / "cache"), "data.max_tokens=200", "trainer.max_epochs=1",
                 "+trainer.limit_train_batches=1", "+trainer.limit_val_batches=1", f"decode.val_subset={n}",
                 "decode.every_n_epochs=1", "monitor.metric=val/bleu", "test=false",
                 "logger=csv"]  # fmt: skip
    cfg = compose_train(overrides, tmp_path / "run")
    datamodule = validate(cfg).data.datamodule()
    assert not bool((next(iter(datamodule.val_dataloader()))["index"] < n).any())  # the batch misses them
    metrics = train(cfg)
    first = [src for src, _, _ in datamodule.splits["val"][:n]]
    assert sorted(decoded) == sorted(first)
    assert "val/bleu" in metrics and "val/chrf" in metrics
    assert list((tmp_path / "run" / "checkpoints").glob("best-epoch000-*.ckpt"))  # chosen by val/bleu


def test_validation_decodes_with_val_beam(text_run: dict[str, Any]) -> None:
    """`decode.val_beam` is the beam of the validation decodes: a validation pass with val_beam=4 logs
    the BLEU of beam 4's decodes, not greedy's. The model's greedy and beam-4 decodes of its validation set
    differ (asserted: otherwise an ignored val_beam would log the same score)."""
    import dataclasses

    import lightning as L

    module, datamodule, greedy = greedy_validation(text_run)
    beamed = greedy_validation(text_run, beam=4)[2]
    refs = datamodule.references["val"]
    bleu = {1: corpus_bleu(greedy, refs).score, 4: corpus_bleu(beamed, refs).score}
    assert bleu[1] != bleu[4], "greedy and beam 4 decode the validation set alike: choose other sentences"
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    for val_beam in (4, 1):
        module.decode_config = dataclasses.replace(module.decode_config, val_beam=val_beam, every_n_epochs=1)
        (logged,) = trainer.validate(module, datamodule=datamodule, verbose=False)
        assert logged["val/bleu"] == pytest.approx(bleu[val_beam], abs=1e-4), val_beam


def test_each_test_set_is_scored_against_its_own_references(shared_data: Path, tmp_path: Path) -> None:
    """results.json and the run's `test/<set>/<score>` metrics score each test set's hypotheses against
    that set's own references, so two test sets get their own scores. One training step from scratch:
    the outputs are poor, but two sets of other sentences score differently (tested here, so that a set
    given another set's scores cannot pass)."""
    from attnlab.training.pipeline import train

    corpus = write_corpus(shared_data, tmp_path / "corpus", TEXT_SPLITS)
    overrides = [*text_data(corpus, tmp_path / "cache"), "trainer.max_epochs=1",
                 "+trainer.limit_train_batches=1", "decode.every_n_epochs=0", "decode.beam=2",
                 "decode.max_len_b=5", "logger=csv"]  # fmt: skip
    metrics = train(compose_train(overrides, tmp_path / "run"))
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    for name in ("test", "test2"):
        entry = results["sets"][name]
        hypotheses, refs = lines(tmp_path / "run" / entry["hypotheses"]), lines(corpus / f"{name}.en")
        assert lines(tmp_path / "run" / entry["references"]) == refs
        own = {"bleu": corpus_bleu, "chrf": corpus_chrf, "ter": corpus_ter}
        assert {score: entry[score] for score in own} == {
            score: scored(hypotheses, refs).score for score, scored in own.items()
        }
        assert {score: metrics[f"test/{name}/{score}"] for score in own} == {
            score: entry[score] for score in own
        }
    assert results["sets"]["test"]["chrf"] != results["sets"]["test2"]["chrf"]


def test_results_json_scores_every_test_set_from_the_averaged_checkpoints(text_run: dict[str, Any]) -> None:
    run = text_run["dir"]
    results = json.loads((run / "results.json").read_text())
    assert results["averaged"] is True
    assert [Path(p).name for p in results["checkpoints"]] == ["epoch028.ckpt", "epoch029.ckpt"]
    assert results["decode"]["beam"] == 3
    assert set(results["sets"]) == {"test", "test2"}
    for name, size in (("test", 30), ("test2", 20)):
        entry = results["sets"][name]
        hypotheses = lines(run / entry["hypotheses"])
        refs = references(text_run, name)
        assert entry["sentences"] == len(hypotheses) == len(refs) == size
        assert_translates(hypotheses, refs)
        assert entry["bleu"] == corpus_bleu(hypotheses, refs).score >= 60
        assert lines(run / entry["references"]) == refs
        assert entry["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
        assert 0.0 <= entry["chrf"] <= 100.0 and entry["chrf_signature"].startswith("nrefs:1|")
    assert text_run["metrics"]["test/test/bleu"] == results["sets"]["test"]["bleu"]
    assert "test/loss" in results["test_metrics"]
    assert not any(key.endswith(("/bleu", "/chrf")) for key in results["test_metrics"])  # the test loss only


def test_the_final_test_loss_is_that_of_the_averaged_checkpoints(text_run: dict[str, Any]) -> None:
    """The run's test loss is that of the averaged checkpoints results.json names, not of the weights
    training ended with (last.ckpt's)."""
    import lightning as L

    from attnlab.runs.checkpoint import read_averaged

    results = json.loads((text_run["dir"] / "results.json").read_text())
    module = TranslationModule.load_from_checkpoint(text_run["dir"] / "checkpoints" / "last.ckpt")
    datamodule = validate(text_run["cfg"]).data.datamodule()
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    (last,) = trainer.test(module, datamodule=datamodule, verbose=False)
    module.load_state_dict(read_averaged(results["checkpoints"])["state_dict"])
    (averaged,) = trainer.test(module, datamodule=datamodule, verbose=False)
    loss = results["test_metrics"]["test/loss"]
    assert loss == pytest.approx(averaged["test/loss"], rel=1e-6)
    assert loss != pytest.approx(last["test/loss"], rel=1e-6)
    assert text_run["metrics"]["test/loss"] == loss == results["metrics"]["test/loss"]


def test_every_metric_a_text_run_writes_is_a_declared_name(text_run: dict[str, Any]) -> None:
    """The scores and the test sets' names too (`test/<set>/bleu`): what `optimized_metric` and
    `monitor.metric` are checked against before a run."""
    final = set(text_run["metrics"])
    assert {"val/bleu", "val/chrf", "best/val/bleu", "test/test2/ter"} <= final
    assert [name for name in final if not is_final_metric(name)] == []
    with open(text_run["dir"] / "csv" / "metrics.csv") as f:
        logged = set(next(csv.reader(f))) - {"epoch", "step"}
    fitting = {name for name in logged if not name.startswith(("test/", "params/"))}
    assert "val/bleu" in fitting and fitting <= set(fit_metrics())


def test_attnlab_eval_reproduces_the_training_run_scores(text_run: dict[str, Any], tmp_path: Path) -> None:
    cfg = compose_eval(
        [f"ckpt_path={text_run['dir']}", "average_last=2", "decode.beam=3", "device=cpu"], tmp_path
    )
    results = evaluate_checkpoint(cfg)
    trained = json.loads((text_run["dir"] / "results.json").read_text())
    # average_last=2 averages the run's last two epoch checkpoints, as training did (the converged model
    # decodes its best checkpoint alone to the same text, so only the record tells them apart)
    last_two = [str(path.resolve()) for path in kept_checkpoints(text_run["dir"])[-2:]]
    assert results["averaged"] is True and results["checkpoints"] == last_two == trained["checkpoints"]
    for name in ("test", "test2"):
        assert results["sets"][name]["bleu"] == trained["sets"][name]["bleu"]
        assert (tmp_path / "hypotheses" / f"{name}.txt").read_text() == (
            text_run["dir"] / "hypotheses" / f"{name}.txt"
        ).read_text()
    assert json.loads((tmp_path / "results.json").read_text())["sets"].keys() == {"test", "test2"}


def test_the_score_pairs_each_hypothesis_with_its_own_reference(text_run: dict[str, Any]) -> None:
    """The exact scores asserted above can only fail on a pairing bug if pairing matters: hypotheses
    moved against their references (one place, or shuffled) score far lower."""
    import random

    results = json.loads((text_run["dir"] / "results.json").read_text())
    hypotheses = lines(text_run["dir"] / results["sets"]["test"]["hypotheses"])
    refs = references(text_run, "test")
    shuffled = hypotheses[:]
    random.Random(0).shuffle(shuffled)
    paired = corpus_bleu(hypotheses, refs).score
    for moved in (hypotheses[1:] + hypotheses[:1], shuffled):
        assert corpus_bleu(moved, refs).score < paired / 3


def test_attnlab_eval_scores_chosen_sets_with_other_decoding_settings(
    text_run: dict[str, Any], tmp_path: Path
) -> None:
    best = next((text_run["dir"] / "checkpoints").glob("best-*.ckpt"))
    cfg = compose_eval([f"ckpt_path={best}", "sets=[val]", "decode.beam=1", "decode.alpha=1.5"], tmp_path)
    results = evaluate_checkpoint(cfg)
    assert list(results["sets"]) == ["val"] and results["sets"]["val"]["sentences"] == 40
    hypotheses, refs = lines(tmp_path / "hypotheses" / "val.txt"), references(text_run, "valid")
    assert_translates(hypotheses, refs)
    assert results["sets"]["val"]["bleu"] == corpus_bleu(hypotheses, refs).score >= 60
    assert results["decode"]["beam"] == 1 and results["decode"]["alpha"] == 1.5
    assert results["averaged"] is False and results["checkpoints"] == [str(best.resolve())]


def test_attnlab_eval_refuses_data_in_other_languages_and_sets_that_score_nothing(
    text_run: dict[str, Any], tmp_path: Path
) -> None:
    """A de->en model scored on en->de references gave BLEU near 0 and exit 0, recorded as target
    language en; `sets=[]` scored nothing with exit 0; `sets=val` split the name into letters."""
    best = next((text_run["dir"] / "checkpoints").glob("best-*.ckpt"))
    files = [o for o in text_run["data"] if o.startswith("data")]
    swapped = [o.replace("src_lang=de", "src_lang=en") if "src_lang" in o else o for o in files]
    swapped = [o.replace("tgt_lang=en", "tgt_lang=de") if "tgt_lang" in o else o for o in swapped]
    with pytest.raises(ConfigError, match=r"src_lang='en', but the model was trained to translate de -> en"):
        evaluate_checkpoint(compose_eval([f"ckpt_path={best}", *swapped, "sets=[val]"], tmp_path / "a"))
    with pytest.raises(ConfigError, match=r"sets=\[\] scores nothing"):
        evaluate_checkpoint(compose_eval([f"ckpt_path={best}", "sets=[]"], tmp_path / "b"))
    results = evaluate_checkpoint(compose_eval([f"ckpt_path={best}", *files, "sets=val", "decode.beam=1"],
                                               tmp_path / "c"))  # fmt: skip
    assert list(results["sets"]) == ["val"] and results["target_lang"] == "en"
    assert results["sets"]["val"]["unfinished"] == 0  # every translation ended with eos
    cut = evaluate_checkpoint(compose_eval([f"ckpt_path={best}", "sets=[val]", "decode.beam=1",
                                            "decode.min_len=500"], tmp_path / "d"))  # fmt: skip
    assert cut["sets"]["val"]["unfinished"] == cut["sets"]["val"]["sentences"] == 40  # all cut at a·|S|+b
    lists = [f"ckpt_path={best}", "sets=[val]", "decode.beam=2", "decode.nbest=2", "decode.min_len=500"]
    listed = evaluate_checkpoint(compose_eval(lists, tmp_path / "e"))
    assert listed["sets"]["val"]["unfinished"] == 40  # n-best lists: their first hypotheses


def test_results_hold_ter_and_bleu_as_the_chosen_tokenizer_splits_it(
    text_run: dict[str, Any], tmp_path: Path
) -> None:
    """Training scored TER beside BLEU with the default 13a tokenizer, saved in the checkpoints; attnlab-eval
    scores with the checkpoint's tokenizer unless `metrics.bleu_tokenize` says otherwise."""
    run = text_run["dir"]
    results = json.loads((run / "results.json").read_text())
    assert results["scoring"] == {"bleu_tokenize": "13a"}
    for name in ("test", "test2"):
        entry = results["sets"][name]
        hypotheses, refs = lines(run / entry["hypotheses"]), references(text_run, name)
        assert entry["ter"] == corpus_ter(hypotheses, refs).score < 40  # most lines are the references
        assert entry["ter_signature"].startswith("nrefs:1|case:lc|tok:tercom|")
        assert text_run["metrics"][f"test/{name}/ter"] == entry["ter"]
    best = next((run / "checkpoints").glob("best-*.ckpt"))
    assert read_checkpoint(best)["hyper_parameters"]["metrics"] == {"bleu_tokenize": "13a"}

    overrides = [f"ckpt_path={best}", "sets=[val]", "decode.beam=1", "metrics.bleu_tokenize=char"]
    cfg = compose_eval(overrides, tmp_path)
    scored = evaluate_checkpoint(cfg)
    entry, refs = scored["sets"]["val"], references(text_run, "valid")
    hypotheses = lines(tmp_path / "hypotheses" / "val.txt")
    assert_translates(hypotheses, refs)
    assert scored["scoring"] == {"bleu_tokenize": "char"} and "|tok:char|" in entry["bleu_signature"]
    assert entry["bleu"] == corpus_bleu(hypotheses, refs, tokenize="char").score  # (unit tests: != 13a)

    # A checkpoint trained with another tokenizer is scored with it when nothing is given.
    checkpoint = torch.load(best, map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"]["metrics"] = {"bleu_tokenize": "char"}
    torch.save(checkpoint, tmp_path / "char.ckpt")
    translator = Translator.from_checkpoints([tmp_path / "char.ckpt"])
    assert translator.metrics == MetricsConfig(bleu_tokenize="char")
    del checkpoint["hyper_parameters"]["metrics"]  # a checkpoint from before scoring settings were saved
    torch.save(checkpoint, tmp_path / "old.ckpt")
    assert Translator.from_checkpoints([tmp_path / "old.ckpt"]).metrics == MetricsConfig()
    with pytest.raises(ConfigError, match=re.escape("metrics.bleu_tokenize='spm' is not valid")):
        evaluate_checkpoint(compose_eval([f"ckpt_path={best}", "metrics.bleu_tokenize=spm"], tmp_path / "e"))


def test_sources_are_saved_and_bleu_is_broken_down_by_their_length(text_run: dict[str, Any]) -> None:
    from attnlab.cli.compare import report
    from attnlab.reports.compare import by_length, load_runs, summarize

    run = text_run["dir"]
    results = json.loads((run / "results.json").read_text())
    for name in ("test", "test2"):
        assert lines(run / results["sets"][name]["sources"]) == lines(text_run["corpus"] / f"{name}.de")
    (table, _) = by_length(summarize(load_runs([run]))[0])
    assert table.test_set == "test" and table.by == "source" and sum(table.sentences) == 30
    sources, refs = lines(text_run["corpus"] / "test.de"), references(text_run, "test")
    hypotheses = lines(run / "hypotheses" / "test.txt")
    for k, stats in enumerate(table.groups["all"]):
        rows = [i for i, line in enumerate(sources) if min(len(line.split()) // 10, 4) == k]
        assert (stats is None) == (not rows)
        if rows:
            expected = corpus_bleu([hypotheses[i] for i in rows], [refs[i] for i in rows]).score
            assert stats.mean == pytest.approx(expected) and stats.n == 1
    assert "BLEU on test2 by source length (words):" in report([run], lengths=True)


def test_checkpoints_carry_model_settings_and_tokenizers(text_run: dict[str, Any]) -> None:
    checkpoint = read_checkpoint(text_run["dir"] / "checkpoints" / "epochs" / "epoch029.ckpt")
    bundle = checkpoint["attnlab"]
    assert bundle["data"]["_target_"] == "attnlab.data.corpora.FilesData"
    assert list(bundle["data"]["test"]) == ["test", "test2"]
    translator = Translator.from_checkpoints([text_run["dir"] / "checkpoints" / "last.ckpt"])
    assert translator.src_tokenizer.vocab_size == checkpoint["hyper_parameters"]["model"]["src_vocab_size"]
    assert translator.translate([]) == []
    (source,), (reference,) = lines(text_run["corpus"] / "test.de")[:1], references(text_run, "test")[:1]
    assert translator.translate([source]) == [reference]  # the tokenizers and weights of the run


def test_translation_in_a_batch_equals_translation_alone(text_run: dict[str, Any]) -> None:
    translator = Translator.from_checkpoints([text_run["dir"] / "checkpoints" / "last.ckpt"])
    sources = lines(text_run["corpus"] / "test.de")[:12]
    batched = translator.translate(sources)
    assert_translates(batched, references(text_run, "test")[:12])
    assert batched == [translator.translate([line])[0] for line in sources]


def test_stream_holds_at_most_one_chunk(text_run: dict[str, Any]) -> None:
    translator = Translator.from_checkpoints([text_run["dir"] / "checkpoints" / "last.ckpt"])
    sources = lines(text_run["corpus"] / "test.de")[:25]
    read = 0

    def source() -> Any:
        nonlocal read
        for line in sources:
            read += 1
            yield line + "\n"

    written = 0
    for written, _ in enumerate(translator.stream(source(), chunk_lines=4), start=1):
        assert read - written < 4 + 1  # never more than one chunk read ahead of the output
    assert written == 25


def test_attnlab_translate_reads_a_file_and_writes_in_input_order(
    text_run: dict[str, Any], tmp_path: Path
) -> None:
    sources = lines(text_run["corpus"] / "test.de")
    (tmp_path / "in.de").write_text("\n".join(sources) + "\n", encoding="utf-8")
    translate_main([f"ckpt_path={text_run['dir']}", "average_last=2", "decode.beam=3", "chunk_lines=7",
                    f"input={tmp_path / 'in.de'}", f"output={tmp_path / 'out.en'}"])  # fmt: skip
    expected = (text_run["dir"] / "hypotheses" / "test.txt").read_text(encoding="utf-8")
    assert (tmp_path / "out.en").read_text(encoding="utf-8") == expected
    assert_translates(lines(tmp_path / "out.en"), references(text_run, "test"))  # in input order


def test_attnlab_translate_removes_invisible_characters_its_tokenizer_reads_as_unk(
    text_run: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A byte-order mark opening a line inside the input (files joined with `cat`) or a zero-width
    character inside a word is removed before translating, with a warning naming the lines: read as <unk>,
    it made the model translate the line wrongly. Characters the tokenizer knows are kept."""
    from attnlab.cli.translate import InvisibleFilter
    from attnlab.data.tokenizer import SubwordTokenizer

    clean = lines(text_run["corpus"] / "test.de")[:4]
    dirty = [clean[0], clean[1][:9] + "\u200b" + clean[1][9:], "\ufeff" + clean[2], clean[3] + "\u2060"]
    last = text_run["dir"] / "checkpoints" / "last.ckpt"
    greedy = Translator.from_checkpoints([last], decode_overrides={"beam": 1})
    assert greedy.translate(dirty)[1:3] != greedy.translate(clean)[1:3]  # <unk> changes the translations
    (tmp_path / "in.de").write_bytes(("\n".join(dirty) + "\n").encode())
    translate_main([f"ckpt_path={last}", f"input={tmp_path / 'in.de'}", f"output={tmp_path / 'out.en'}",
                    "decode.beam=1"])  # fmt: skip
    assert lines(tmp_path / "out.en") == greedy.translate(clean)
    (warned,) = [r.getMessage() for r in caplog.records if "invisible" in r.getMessage()]
    assert warned == (
        "removed invisible formatting characters the model's tokenizer does not know (U+200B zero-width "
        "space, U+2060 word joiner, U+FEFF byte-order mark) from 3 input lines, lines 2, 3, 4: they would "
        "have been read as <unk>"
    )
    persian = SubwordTokenizer.train(["می\u200cخواهم", "نمی\u200cدانم"] * 5, model="bpe", vocab_size=40)
    kept = InvisibleFilter(persian)
    assert list(kept(["می\u200cخواهم\u200b"])) == ["می\u200cخواهم"] and kept.found == {"\u200b"}


def test_the_invisible_character_filter_keeps_a_bounded_record_of_an_endless_stream() -> None:
    """`attnlab-translate` streams: the filter keeps the first lines' numbers and a count, not every
    number (memory growing with the stream), and its warning still counts every line (one line in the
    singular: `1 input line, line 3`)."""
    from attnlab.cli.translate import SHOWN_LINES, InvisibleFilter
    from attnlab.data.tokenizer import SubwordTokenizer

    tokenizer = SubwordTokenizer.train(["ein Haus", "das Haus"] * 5, model="bpe", vocab_size=30)
    invisible = InvisibleFilter(tokenizer)
    assert sum(1 for _ in invisible(f"Haus\u200b {i}" for i in range(5000))) == 5000
    assert len(invisible.lines) == SHOWN_LINES and invisible.count == 5000
    assert "from 5000 input lines, lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 4990 more:" in str(
        invisible.warning()
    )
    invisible = InvisibleFilter(tokenizer)  # one line: its count and number in the singular
    assert list(invisible(["Haus", "Haus", "Haus\u200b"])) == ["Haus"] * 3
    assert "(U+200B zero-width space) from 1 input line, line 3: they" in str(invisible.warning())


def test_attnlab_translate_command_streams_stdin_to_stdout(text_run: dict[str, Any]) -> None:
    """Translations alone on standard output, log messages on standard error: a last source longer than
    the checkpoint's source limit is cut, with a warning that must not land among the translations."""
    best = next((text_run["dir"] / "checkpoints").glob("best-*.ckpt"))
    sources = lines(text_run["corpus"] / "test2.de")
    text = "\n".join(sources) + "\n" + " ".join([sources[0]] * 60) + "\n"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "attnlab.cli.translate", f"ckpt_path={best}", "decode.beam=2"]
    done = subprocess.run(
        command, input=text, capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    translator = Translator.from_checkpoints([best], decode_overrides={"beam": 2})  # the saved beam is 3
    *translated, cut = done.stdout.splitlines()
    assert translated == translator.translate(sources) and "sources were cut" not in cut
    assert_translates(translated, references(text_run, "test2"))
    assert "WARNING" in done.stderr and "1 source was cut to" in done.stderr


def test_attnlab_translate_at_a_terminal_answers_each_line_as_it_is_typed(text_run: dict[str, Any]) -> None:
    """Standard input a pseudo-terminal: the first line's translation comes back before the second line
    is typed (on a pipe the command would wait for 2048 lines or the end of the input)."""
    import pty
    import select

    best = next((text_run["dir"] / "checkpoints").glob("best-*.ckpt"))
    sources = lines(text_run["corpus"] / "test2.de")[:2]
    expected = Translator.from_checkpoints([best]).translate(sources)
    controller, terminal = pty.openpty()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "attnlab.cli.translate", f"ckpt_path={best}"]
    process = subprocess.Popen(command, stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env)  # fmt: skip
    os.close(terminal)
    try:
        answers = []
        for source in sources:
            os.write(controller, (source + "\n").encode("utf-8"))  # typed, then Enter; nothing more yet
            ready, _, _ = select.select([process.stdout], [], [], 120)
            assert ready, "no translation came back while the terminal waited for the next line"
            answers.append(process.stdout.readline().decode("utf-8").rstrip("\n"))
        os.write(controller, b"\x04")  # Ctrl-D: the end of the input
        assert process.wait(timeout=60) == 0, process.stderr.read().decode()
    finally:
        process.kill()
        os.close(controller)
    assert answers == expected and all(answers)


def test_the_decoding_commands_keep_freed_memory_unless_told_otherwise(
    text_run: dict[str, Any], tmp_path: Path
) -> None:
    """`attnlab-translate` and `attnlab-eval` set `allocator=keep`'s malloc options (what they change in
    glibc: tests/unit/test_allocator.py) unless given `allocator=system`; `evaluate_checkpoint`, the Python
    API under `attnlab-eval`, leaves the process's settings alone. Each command's calls run in a fresh
    process, `system` first (glibc cannot undo keep's options); after each, whether they are in force."""
    (tmp_path / "in.de").write_text("\n".join(lines(text_run["corpus"] / "test2.de")) + "\n", "utf-8")
    run = f"ckpt_path={text_run['dir']}"
    translate = [run, f"input={tmp_path / 'in.de'}", f"output={tmp_path / 'out.en'}"]
    evaluate = [run, "sets=[test2]", "device=cpu"]
    eval_system = ["attnlab-eval", *evaluate, "allocator=system", f"hydra.run.dir={tmp_path / 'system'}"]
    eval_default = ["attnlab-eval", *evaluate, f"hydra.run.dir={tmp_path / 'default'}"]
    state = "from attnlab.training.allocator import in_force\nprint(in_force())\n"
    scripts = {
        "attnlab-translate": (
            f"from attnlab.cli.translate import main\nmain({[*translate, 'allocator=system']!r})\n{state}"
            f"main({translate!r})\n{state}"
        ),
        "attnlab-eval": (
            "import sys\nfrom pathlib import Path\nfrom helpers import compose_eval\n"
            "from attnlab.cli.eval import evaluate_checkpoint, main\n"
            f"sys.argv = {[*eval_default, 'allocator=tcmalloc']!r}\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    print('refused:', exc)\n"
            f"evaluate_checkpoint(compose_eval({evaluate!r}, Path({str(tmp_path / 'api')!r})))\n{state}"
            f"sys.argv = {eval_system!r}\nmain()\n{state}sys.argv = {eval_default!r}\nmain()\n{state}"
        ),
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": subprocess_path()}
    expected = {"attnlab-translate": ["False", "True"], "attnlab-eval": ["False", "False", "True"]}
    for command, script in scripts.items():
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                              timeout=180, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        said = [line for line in done.stdout.splitlines() if line in ("True", "False")]
        assert said == expected[command], (command, done.stdout[-2000:])
        if command == "attnlab-eval":  # an unknown value refused before anything, keep's options unset
            assert "refused: attnlab-eval: allocator='tcmalloc' is not an allocator setting" in done.stdout
    hypotheses = lines(tmp_path / "out.en")
    assert hypotheses == lines(tmp_path / "default" / "hypotheses" / "test2.txt")
    assert hypotheses == lines(tmp_path / "api" / "hypotheses" / "test2.txt")
    assert_translates(hypotheses, references(text_run, "test2"))


def test_bad_checkpoints_get_clear_errors(text_run: dict[str, Any], tmp_path: Path) -> None:
    damaged = tmp_path / "damaged.ckpt"
    damaged.write_bytes((text_run["dir"] / "checkpoints" / "last.ckpt").read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=r"damaged\.ckpt.*damaged"):
        read_checkpoint(damaged)
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(CheckpointError, match="not written by attnlab-train"):
        read_checkpoint(foreign)
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        read_checkpoint(tmp_path / "missing.ckpt")
    with pytest.raises(CheckpointError, match="needs 5, found 2"):
        resolve_checkpoints(text_run["dir"], average_last=5)
    with pytest.raises(ConfigError, match="damaged"):
        evaluate_checkpoint(compose_eval([f"ckpt_path={damaged}"], tmp_path / "eval"))
    with pytest.raises(ConfigError, match="beam=0"):
        evaluate_checkpoint(
            compose_eval([f"ckpt_path={text_run['dir']}", "decode.beam=0"], tmp_path / "eval")
        )
    with pytest.raises(SystemExit, match="not key=value"):
        translate_main(["ckpt_path", "x"])
    unknown = r"allocator='tcmalloc' is not an allocator setting: use keep .* or system"
    (tmp_path / "kept.en").write_text("kept\n")
    with pytest.raises(SystemExit, match=unknown + r".*; nothing was written to .*kept\.en"):
        translate_main(
            [f"ckpt_path={text_run['dir']}", "allocator=tcmalloc", f"output={tmp_path / 'kept.en'}"]
        )
    assert (tmp_path / "kept.en").read_text() == "kept\n"
    with pytest.raises(ConfigError, match=unknown):
        evaluate_checkpoint(
            compose_eval([f"ckpt_path={text_run['dir']}", "allocator=tcmalloc"], tmp_path / "e")
        )
    with pytest.raises(SystemExit, match="beam_size"):
        translate_main([f"ckpt_path={text_run['dir']}", "decode.beam_size=3"])
    assert [p.name for p in kept_checkpoints(text_run["dir"])] == ["epoch028.ckpt", "epoch029.ckpt"]


def test_a_saved_decoding_setting_this_version_refuses_is_replaced_by_an_override(
    text_run: dict[str, Any], tmp_path: Path
) -> None:
    """Older versions saved `decode.max_len_a=inf` (it decoded 1-token outputs); it is refused now. The
    checkpoint is refused naming the setting and the fix, and loads with the setting given: overrides
    apply before the saved settings are checked."""
    checkpoint = torch.load(next((text_run["dir"] / "checkpoints").glob("best-*.ckpt")), weights_only=True)
    checkpoint["hyper_parameters"]["decode"]["max_len_a"] = float("inf")
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    wanted = [f"ckpt_path={old}", "sets=[val]", "decode.beam=1"]
    with pytest.raises(
        ConfigError, match=r"old\.ckpt holds decode settings .*max_len_a=inf .*decode\.<name>="
    ):
        evaluate_checkpoint(compose_eval(wanted, tmp_path / "refused"))
    with pytest.raises(SystemExit, match=r"max_len_a=inf"):
        translate_main([f"ckpt_path={old}", f"input={tmp_path / 'none'}"])
    results = evaluate_checkpoint(compose_eval([*wanted, "decode.max_len_a=1.2"], tmp_path / "fixed"))
    hypotheses = lines(tmp_path / "fixed" / "hypotheses" / "val.txt")
    assert_translates(hypotheses, references(text_run, "valid"))
    assert results["decode"]["max_len_a"] == 1.2 and results["sets"]["val"]["unfinished"] == 0
    (tmp_path / "val.de").write_text("\n".join(lines(text_run["corpus"] / "valid.de")) + "\n", "utf-8")
    translate_main([f"ckpt_path={old}", "decode.max_len_a=1.2", "decode.beam=1",
                    f"input={tmp_path / 'val.de'}", f"output={tmp_path / 'val.en'}"])  # fmt: skip
    assert lines(tmp_path / "val.en") == hypotheses


def test_translate_reports_a_missing_input_file(text_run: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"nope\.de"):
        translate_main([f"ckpt_path={text_run['dir']}", f"input={tmp_path / 'nope.de'}"])


def test_a_set_that_cannot_be_scored_is_refused_naming_it(text_run: dict[str, Any], tmp_path: Path) -> None:
    """An empty test set reached attnlab-eval's user as a traceback (sacreBLEU's input check, after the
    decode); now a ConfigError naming the set (attnlab-eval prints it in one line), and nothing written."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for file in text_run["corpus"].iterdir():
        (corpus / file.name).symlink_to(file)
    (corpus / "empty.de").write_text("")
    (corpus / "empty.en").write_text("")
    files = [o for o in text_run["data"] if o.startswith("data")]
    files = [f"data.dir={corpus}" if o.startswith("data.dir=") else o for o in files if "data.test=" not in o]
    best = next((text_run["dir"] / "checkpoints").glob("best-*.ckpt"))
    with pytest.raises(ConfigError, match="cannot score empty: empty corpus"):
        evaluate_checkpoint(compose_eval([f"ckpt_path={best}", *files, "data.test=[empty]"], tmp_path / "a"))
    assert not (tmp_path / "a" / "results.json").exists()


def test_a_model_whose_scores_overflow_to_nan_is_named_by_eval_and_translate(
    text_run: dict[str, Any], tmp_path: Path
) -> None:
    """Finite weights so large that the logits overflow (no NaN in the file, so the checkpoint reader
    takes it) score NaN: attnlab-eval failed with beam search's ValueError as a traceback, and greedy
    decoding (beam 1) took the NaN's id as every best token, translating each line to nothing without a
    word. Both decodes name the cause, attnlab-eval as a ConfigError with nothing written, attnlab-translate
    leaves no output file."""
    checkpoint = read_checkpoint(next((text_run["dir"] / "checkpoints").glob("best-*.ckpt")))
    checkpoint["state_dict"]["model.output.weight"] *= 1e37  # finite, but its logits are not
    huge = tmp_path / "huge.ckpt"
    torch.save(checkpoint, huge)
    told = r"found no hypothesis for \d+ of \d+ sentences \(the first: 0\): the model's scores are NaN"
    for beam in (1, 3):
        out = tmp_path / f"beam{beam}"
        with pytest.raises(ConfigError, match=rf"{told}.*nothing was written to {re.escape(str(out))}$"):
            evaluate_checkpoint(compose_eval([f"ckpt_path={huge}", "sets=[val]", f"decode.beam={beam}"], out))
        assert not (out / "results.json").exists() and not (out / "hypotheses").exists()
    (tmp_path / "in.de").write_text("Ein Mann fährt Fahrrad.\n", "utf-8")
    with pytest.raises(SystemExit, match=rf"^attnlab-translate: greedy decoding {told}"):
        translate_main([f"ckpt_path={huge}", "decode.beam=1", f"input={tmp_path / 'in.de'}",
                        f"output={tmp_path / 'out.en'}"])  # fmt: skip
    assert not (tmp_path / "out.en").exists()
