"""Multi30k end to end: download from a loopback mirror, prepare, train; offline reuse through data.root."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest

from attnlab.data.prepare import prepared_dir
from attnlab.training.experiment import validate
from attnlab.training.pipeline import train
from helpers import compose_train, serve_mirror

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
