"""Evaluation end to end on a small text corpus: monitoring val/bleu, averaging, results.json, the
attnlab-eval and attnlab-translate commands, and self-contained checkpoints."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from attnlab.checkpoint import CheckpointError, epoch_checkpoints, read_checkpoint
from attnlab.cli.eval import evaluate_checkpoint
from attnlab.cli.translate import main as translate_main
from attnlab.config import ConfigError, config_dir, register_resolvers
from attnlab.metrics import corpus_bleu
from attnlab.train import train
from attnlab.translate import Translator, decode_settings, resolve_checkpoints
from helpers import compose_train, write_corpus

SPLITS = (("train", "train", 400), ("valid", "val", 40), ("test", "test2016", 30), ("test2", "val", 20))


@pytest.fixture(scope="module")
def text_run(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three epochs on 400 Multi30k lines; validation decoded every 2nd epoch, monitored by val/bleu
    with early stopping; the last 2 epoch checkpoints averaged and beam-decoded on two test sets."""
    tmp = tmp_path_factory.mktemp("text_run")
    write_corpus(shared_data, tmp / "corpus", SPLITS)
    overrides = [
        "data=files", f"data.dir={tmp / 'corpus'}", "data.src_lang=de", "data.tgt_lang=en",
        "data.test=[test,test2]",
        "data.vocab_size=300",
        f"data.cache_dir={tmp / 'cache'}", "model=tiny", "trainer.max_epochs=3", "decode.every_n_epochs=2",
        "optim.warmup_steps=10", "callbacks=early_stopping", "average_last=2", "decode.beam=3",
        "decode.max_len_a=0.5", "decode.max_len_b=4",
    ]  # fmt: skip
    cfg = compose_train(overrides, tmp / "run")
    return {"cfg": cfg, "metrics": train(cfg), "dir": tmp / "run", "corpus": tmp / "corpus", "tmp": tmp}


def compose_eval(overrides: list[str], output_dir: Path) -> Any:
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(config_dir()), job_name="test"):
        return compose("eval", overrides=[f"paths.output_dir={output_dir}", *overrides])


def test_monitor_resolves_to_val_bleu_checked_on_decoding_epochs(text_run: dict[str, Any]) -> None:
    saved = OmegaConf.load(text_run["dir"] / "config.yaml")
    assert dict(saved.monitor) == {"metric": "val/bleu", "mode": "max", "every_n_epochs": 2}
    with open(text_run["dir"] / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["val/loss"]]
    assert [bool(r["val/bleu"]) for r in rows] == [False, True, False]  # 3 epochs ran, the 2nd decoded
    best = sorted((text_run["dir"] / "checkpoints").glob("best-*.ckpt"))
    assert [p.name.split("-step")[0] for p in best] == ["best-epoch001"]  # the only epoch with a BLEU


def test_results_json_scores_every_test_set_from_the_averaged_checkpoints(text_run: dict[str, Any]) -> None:
    run = text_run["dir"]
    results = json.loads((run / "results.json").read_text())
    assert results["averaged"] is True
    assert [Path(p).name for p in results["checkpoints"]] == ["epoch001.ckpt", "epoch002.ckpt"]
    assert results["decode"]["beam"] == 3
    assert set(results["sets"]) == {"test", "test2"}
    for name, size in (("test", 30), ("test2", 20)):
        entry = results["sets"][name]
        hypotheses = (run / entry["hypotheses"]).read_text(encoding="utf-8").split("\n")[:-1]
        references = (text_run["corpus"] / f"{name}.en").read_text().split("\n")[:size]
        assert entry["sentences"] == len(hypotheses) == size
        assert entry["bleu"] == pytest.approx(corpus_bleu(hypotheses, references).score, abs=1e-9)
        assert entry["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
        assert 0.0 <= entry["chrf"] <= 100.0 and entry["chrf_signature"].startswith("nrefs:1|")
    assert text_run["metrics"]["test/test/bleu"] == results["sets"]["test"]["bleu"]
    assert "test/loss" in results["test_metrics"]


def test_attnlab_eval_reproduces_the_training_run_scores(text_run: dict[str, Any], tmp_path: Path) -> None:
    cfg = compose_eval(
        [f"ckpt_path={text_run['dir']}", "average_last=2", "decode.beam=3", "device=cpu"], tmp_path
    )
    results = evaluate_checkpoint(cfg)
    trained = json.loads((text_run["dir"] / "results.json").read_text())
    for name in ("test", "test2"):
        assert results["sets"][name]["bleu"] == trained["sets"][name]["bleu"]
        assert (tmp_path / "hypotheses" / f"{name}.txt").read_text() == (
            text_run["dir"] / "hypotheses" / f"{name}.txt"
        ).read_text()
    assert json.loads((tmp_path / "results.json").read_text())["sets"].keys() == {"test", "test2"}


def test_attnlab_eval_scores_chosen_sets_with_other_decoding_settings(
    text_run: dict[str, Any], tmp_path: Path
) -> None:
    best = next((text_run["dir"] / "checkpoints").glob("best-*.ckpt"))
    cfg = compose_eval([f"ckpt_path={best}", "sets=[val]", "decode.beam=1", "decode.lenpen=1.5"], tmp_path)
    results = evaluate_checkpoint(cfg)
    assert list(results["sets"]) == ["val"] and results["sets"]["val"]["sentences"] == 40
    assert results["decode"]["beam"] == 1 and results["decode"]["lenpen"] == 1.5
    assert results["averaged"] is False and results["checkpoints"] == [str(best.resolve())]


def test_checkpoints_carry_model_settings_and_tokenizers(text_run: dict[str, Any]) -> None:
    checkpoint = read_checkpoint(text_run["dir"] / "checkpoints" / "epochs" / "epoch002.ckpt")
    bundle = checkpoint["attnlab"]
    assert bundle["data"]["_target_"] == "attnlab.data.corpora.FilesData"
    assert list(bundle["data"]["test"]) == ["test", "test2"]
    translator = Translator.from_checkpoints([text_run["dir"] / "checkpoints" / "last.ckpt"])
    assert translator.src_tokenizer.vocab_size == checkpoint["hyper_parameters"]["model"]["src_vocab_size"]
    assert translator.translate([]) == []
    one = translator.translate(["Ein Mann fährt Fahrrad."])
    assert len(one) == 1 and isinstance(one[0], str)


def test_translation_in_a_batch_equals_translation_alone(text_run: dict[str, Any]) -> None:
    translator = Translator.from_checkpoints([text_run["dir"] / "checkpoints" / "last.ckpt"])
    lines = (text_run["corpus"] / "test.de").read_text().split("\n")[:12]
    batched = translator.translate(lines)
    assert batched == [translator.translate([line])[0] for line in lines]


def test_stream_holds_at_most_one_chunk(text_run: dict[str, Any]) -> None:
    translator = Translator.from_checkpoints([text_run["dir"] / "checkpoints" / "last.ckpt"])
    lines = (text_run["corpus"] / "test.de").read_text().split("\n")[:25]
    read = 0

    def source() -> Any:
        nonlocal read
        for line in lines:
            read += 1
            yield line + "\n"

    written = 0
    for written, _ in enumerate(translator.stream(source(), chunk_lines=4), start=1):
        assert read - written < 4 + 1  # never more than one chunk read ahead of the output
    assert written == 25


def test_attnlab_translate_reads_a_file_and_writes_in_input_order(
    text_run: dict[str, Any], tmp_path: Path
) -> None:
    lines = (text_run["corpus"] / "test.de").read_text().split("\n")[:30]
    (tmp_path / "in.de").write_text("\n".join(lines) + "\n", encoding="utf-8")
    translate_main([f"ckpt_path={text_run['dir']}", "average_last=2", "decode.beam=3", "chunk_lines=7",
                    f"input={tmp_path / 'in.de'}", f"output={tmp_path / 'out.en'}"])  # fmt: skip
    expected = (text_run["dir"] / "hypotheses" / "test.txt").read_text(encoding="utf-8")
    assert (tmp_path / "out.en").read_text(encoding="utf-8") == expected


def test_attnlab_translate_command_streams_stdin_to_stdout(text_run: dict[str, Any]) -> None:
    best = next((text_run["dir"] / "checkpoints").glob("best-*.ckpt"))
    text = "Ein Hund läuft.\nZwei Männer spielen Fußball.\n"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "attnlab.cli.translate", f"ckpt_path={best}", "decode.beam=2"]
    done = subprocess.run(
        command, input=text, capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    translator = Translator.from_checkpoints([best])
    translator.decode = decode_settings(translator.decode.to_dict(), {"beam": 2})  # the saved beam is 3
    assert done.stdout.splitlines() == translator.translate(text.splitlines())
    assert len(done.stdout.splitlines()) == 2


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
    with pytest.raises(SystemExit, match="beam_size"):
        translate_main([f"ckpt_path={text_run['dir']}", "decode.beam_size=3"])
    assert [p.name for p in epoch_checkpoints(text_run["dir"])] == ["epoch001.ckpt", "epoch002.ckpt"]


def test_translate_reports_a_missing_input_file(text_run: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"nope\.de"):
        translate_main([f"ckpt_path={text_run['dir']}", f"input={tmp_path / 'nope.de'}"])
