"""Multi30k end to end: download from a loopback mirror, prepare, train; offline reuse through data.root."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path
from typing import Any

import pytest

from attnlab.config import validate
from attnlab.data.prepare import prepared_dir
from attnlab.metrics import corpus_bleu
from attnlab.module import TranslationModule
from attnlab.train import train
from helpers import compose_train, serve_mirror, write_corpus

NAMES = [f"{split}.{lang}" for split in ("train", "val", "test2016") for lang in ("de", "en")]
FAST = ["model=tiny", "debug=fast_dev_run", "data.vocab_size=2000"]


@pytest.fixture(scope="module")
def downloaded_run(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`attnlab-train data=multi30k` on a fresh cache, downloading through a loopback mirror."""
    tmp = tmp_path_factory.mktemp("multi30k")
    gzipped = {name: gzip.compress((shared_data / "multi30k" / name).read_bytes(), 1) for name in NAMES}
    with serve_mirror(tmp / "www", gzipped) as mirror:
        overrides = [*FAST, f"data.base_url={mirror.base_url}", f"data.cache_dir={tmp / 'cache'}"]
        cfg = compose_train(["data=multi30k", *overrides], tmp / "run")
        metrics = train(cfg)
        requests = sum(mirror.counts.values())
    return {"cfg": cfg, "metrics": metrics, "requests": requests, "tmp": tmp}


def test_default_data_is_multi30k_de_en(tmp_path: Path) -> None:
    data = validate(compose_train([], tmp_path)).data
    assert (type(data).__name__, data.src_lang, data.tgt_lang, data.root) == (
        "Multi30kData",
        "de",
        "en",
        None,
    )


def test_first_run_downloads_prepares_and_trains(downloaded_run: dict[str, Any]) -> None:
    assert downloaded_run["requests"] == len(NAMES)
    metrics = downloaded_run["metrics"]
    assert {"val/loss", "test/loss", "test/exact_match"} <= set(metrics)
    assert metrics["val/loss"] > 0


def test_offline_root_reuses_the_prepared_cache_without_network(
    downloaded_run: dict[str, Any], shared_data: Path
) -> None:
    cache = downloaded_run["tmp"] / "cache"
    overrides = [*FAST, f"data.cache_dir={cache}", f"data.root={shared_data / 'multi30k'}",
                 "data.base_url=http://127.0.0.1:9/unreachable"]  # fmt: skip
    cfg = compose_train(["data=multi30k", *overrides], downloaded_run["tmp"] / "offline")
    spec = validate(cfg).data
    first = validate(downloaded_run["cfg"]).data
    assert prepared_dir(spec) == prepared_dir(first)  # same content, same key, whatever the path
    built = prepared_dir(spec).stat().st_mtime
    datamodule = spec.datamodule()
    datamodule.setup()  # loads: a rebuild would replace the directory (and its mtime)
    assert prepared_dir(spec).stat().st_mtime == built
    assert len(datamodule.references["test2016"]) == 1000
    assert datamodule.references["val"][0] == (shared_data / "multi30k" / "val.en").read_text().split("\n")[0]
    assert len(datamodule.splits["train"]) == 29000


def test_files_corpus_trains_with_several_test_sets_and_logs_validation_bleu(
    shared_data: Path, tmp_path: Path
) -> None:
    splits = (("train", "train", 400), ("valid", "val", 40), ("test", "test2016", 30), ("test2", "val", 20))
    corpus = write_corpus(shared_data, tmp_path / "corpus", splits)
    overrides = [
        "data=files", f"data.dir={corpus}", "data.src_lang=de", "data.tgt_lang=en", "data.test=[test,test2]",
        "data.vocab_size=300", f"data.cache_dir={tmp_path / 'cache'}", "model=tiny", "trainer.max_epochs=2",
        "decode.every_n_epochs=2", "optim.warmup_steps=10",
    ]  # fmt: skip
    cfg = compose_train(overrides, tmp_path / "run")
    metrics = train(cfg)
    assert {"val/loss", "val/bleu", "val/chrf", "test/loss", "test/exact_match"} <= set(metrics)
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["val/loss"]]
    assert [bool(r["val/bleu"]) for r in rows] == [False, True]  # decoded on the 2nd epoch only

    # The logged score is sacreBLEU of the greedy decodes of the final weights against the raw references.
    module = TranslationModule.load_from_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt").eval()
    datamodule = validate(cfg).data.datamodule()
    datamodule.setup()
    outputs = {}
    for batch in datamodule.val_dataloader():
        outputs.update(zip(batch["index"].tolist(), module.translate(batch["src"], beam=1), strict=True))
    hypotheses = [datamodule.tgt_tokenizer.decode(outputs[i]) for i in range(len(outputs))]
    references = (corpus / "valid.en").read_text().split("\n")[:40]
    assert datamodule.references["val"] == references
    assert float(rows[1]["val/bleu"]) == pytest.approx(corpus_bleu(hypotheses, references).score, abs=1e-4)
