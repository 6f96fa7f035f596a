"""scripts/make_corpus.py: WMT-like line lengths from joined Multi30k pairs, aligned and reproducible."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from attnlab.data.corpora import read_lines

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_corpus.py"
PAIRS = 2000


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("make_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_corpus"] = module
    spec.loader.exec_module(module)
    return module


def test_corpus_is_aligned_reproducible_and_wmt_like(
    script, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    multi30k = shared_data / "multi30k"
    script.main(
        ["--pairs", str(PAIRS), "--out", str(tmp_path / "a"), "--seed", "3", "--source", str(multi30k)]
    )
    printed = capsys.readouterr().out
    out = tmp_path / "a"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{prefix}.{lang}" for prefix in ("train", "valid", "test") for lang in ("de", "en")
    )
    src, tgt = read_lines(out / "train.de"), read_lines(out / "train.en")
    assert len(src) == len(tgt) == PAIRS
    for prefix, split in (("valid", "val"), ("test", "test2016")):
        for lang in ("de", "en"):
            assert (out / f"{prefix}.{lang}").read_bytes() == (multi30k / f"{split}.{lang}").read_bytes()

    # Alignment: line i joins the same Multi30k pairs on both sides, those the seed draws, each pair used
    # once while the pool lasts.
    pool_src, pool_tgt = read_lines(multi30k / "train.de"), read_lines(multi30k / "train.en")
    groups = list(script.pair_groups([len(s.split()) for s in pool_src], PAIRS, 3))
    assert src == [" ".join(pool_src[i] for i in group) for group in groups]
    assert tgt == [" ".join(pool_tgt[i] for i in group) for group in groups]
    used = [i for group in groups for i in group]
    assert len(used) == len(set(used)) < len(pool_src)
    assert max(len(group) for group in groups) > 3 and min(len(group) for group in groups) == 1

    words = [len(line.split()) for line in src]
    mean = sum(words) / len(words)
    assert 20 <= mean <= 35
    assert max(words) <= script.MAX_WORDS and sorted(words)[len(words) // 2] < mean  # a right tail
    assert f"train.de: {PAIRS} lines, words per line: mean {mean:.1f} p50=" in printed

    # Determinism: the same seed writes the same files; another seed, other lines.
    same = script.make_corpus(PAIRS, tmp_path / "b", seed=3, source=multi30k)
    other = script.make_corpus(PAIRS, tmp_path / "c", seed=4, source=multi30k)
    for lang in ("de", "en"):
        assert (tmp_path / "b" / f"train.{lang}").read_bytes() == (out / f"train.{lang}").read_bytes()
        assert (tmp_path / "c" / f"train.{lang}").read_bytes() != (out / f"train.{lang}").read_bytes()
    assert sum(same["de"]) == PAIRS and sum(w * n for w, n in enumerate(same["de"])) == sum(words)
    assert other["de"] != same["de"]


def test_refuses_bad_arguments(script, shared_data: Path, tmp_path: Path) -> None:
    multi30k = shared_data / "multi30k"
    with pytest.raises(SystemExit, match="--pairs=0 must be at least 1"):
        script.main(["--pairs", "0", "--out", str(tmp_path), "--source", str(multi30k)])
    with pytest.raises(SystemExit, match=r"data file not found: .*train\.xx"):
        script.main(["--pairs", "5", "--out", str(tmp_path), "--tgt", "xx", "--source", str(multi30k)])
    assert not list(tmp_path.iterdir())
