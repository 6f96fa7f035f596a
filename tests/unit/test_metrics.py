"""Corpus BLEU / chrF through sacreBLEU, the detokenization guard, and the paired bootstrap test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sacrebleu

from attnlab.metrics import (
    SUBWORD_MARKERS,
    ScoringError,
    check_detokenized,
    corpus_bleu,
    corpus_chrf,
    score_all,
)

REFS = [
    "A man in an orange hat is staring at something.",
    "A Boston Terrier is running on lush green grass in front of a white fence.",
    "A girl in karate uniform breaking a stick with a front kick.",
    "Five people wearing winter jackets and helmets stand in the snow, with snowmobiles in the background.",
    "People are fixing the roof of a house.",
    "A man in light colored clothing photographs a group of men wearing dark suits and hats.",
]
HYPS = [
    "A man with an orange hat is looking at something.",
    "A Boston terrier runs on green grass in front of a white fence.",
    "A girl in a karate uniform breaks a stick with a kick.",
    "Five people in winter jackets and helmets are standing in the snow with snowmobiles behind them.",
    "People fix the roof of a house.",
    "A man in light clothing takes a photo of a group of men in dark suits and hats.",
]


def reference_bleu(hyps: list[str], refs: list[str]) -> sacrebleu.BLEUScore:
    return sacrebleu.corpus_bleu(hyps, [refs], tokenize="13a", lowercase=False)


# ---------------------------------------------------------------------------------------------------------
# corpus_bleu / corpus_chrf / score_all


def test_bleu_equals_sacrebleu() -> None:
    score = corpus_bleu(HYPS, REFS)
    expected = reference_bleu(HYPS, REFS)
    assert score.name == "bleu"
    assert score.score == pytest.approx(expected.score, abs=1e-9)
    assert 0.0 < score.score < 100.0
    assert score.details["bp"] == pytest.approx(expected.bp)
    assert score.details["precisions"] == pytest.approx(expected.precisions)
    assert (score.details["sys_len"], score.details["ref_len"]) == (expected.sys_len, expected.ref_len)


def test_bleu_signature() -> None:
    signature = corpus_bleu(HYPS, REFS).signature
    for part in ("nrefs:1", "case:mixed", "tok:13a", "smooth:exp", f"version:{sacrebleu.__version__}"):
        assert part in signature.split("|")


def test_identical_hypotheses_score_100() -> None:
    assert corpus_bleu(REFS, REFS).score == pytest.approx(100.0)


def test_bleu_is_cased() -> None:
    lowered = [h.lower() for h in HYPS]
    assert corpus_bleu(lowered, REFS).score < corpus_bleu(HYPS, REFS).score


def test_chrf_equals_sacrebleu() -> None:
    score = corpus_chrf(HYPS, REFS)
    assert score.name == "chrf"
    assert score.score == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score, abs=1e-9)
    assert score.details == {"char_order": 6, "word_order": 0, "beta": 2}
    assert "nc:6" in score.signature and "nrefs:1" in score.signature
    assert f"version:{sacrebleu.__version__}" in score.signature


def test_score_all_matches_single_metrics() -> None:
    scores = score_all(HYPS, REFS)
    assert set(scores) == {"bleu", "chrf"}
    assert scores["bleu"] == corpus_bleu(HYPS, REFS)
    assert scores["chrf"] == corpus_chrf(HYPS, REFS)


def test_references_are_scored_untouched() -> None:
    refs = list(REFS)
    refs[0] = "A man  in an orange hat   is staring at something. "
    refs[4] = "People are\tfixing the roof of a house."
    before = list(refs)
    assert corpus_bleu(HYPS, refs).score == pytest.approx(reference_bleu(HYPS, refs).score, abs=1e-9)
    assert corpus_chrf(HYPS, refs).score == pytest.approx(sacrebleu.corpus_chrf(HYPS, [refs]).score, abs=1e-9)
    assert refs == before


def test_empty_hypothesis_line_is_allowed() -> None:
    hyps = [*HYPS[:-1], ""]
    assert corpus_bleu(hyps, REFS).score == pytest.approx(reference_bleu(hyps, REFS).score, abs=1e-9)


# ---------------------------------------------------------------------------------------------------------
# check_detokenized


@pytest.mark.parametrize("marker", ["▁", "@@ "])
def test_rejects_subword_markers(marker: str) -> None:
    hyps = list(HYPS)
    hyps[2] = f"A girl in a kar{marker}ate uniform."
    with pytest.raises(ScoringError, match="detokenized") as info:
        corpus_bleu(hyps, REFS)
    assert "line 3" in str(info.value) and repr(marker) in str(info.value)
    assert "decode" in str(info.value)


def test_rejects_metaspace_pieces_and_trailing_at_markers() -> None:
    with pytest.raises(ScoringError, match=r"line 1 .*'▁'"):
        check_detokenized(["▁A ▁man ▁runs ."], ["A man runs."])
    with pytest.raises(ScoringError, match=r"line 2 .*'@@'"):
        check_detokenized(["A man runs.", "A wo@@"], ["A man runs.", "A woman."])
    assert SUBWORD_MARKERS == ("▁", "@@ ", "@@")


def test_references_with_markers_are_not_checked() -> None:
    check_detokenized(["a b"], ["a@@ b▁"])


def test_rejects_count_mismatch_naming_both_counts() -> None:
    with pytest.raises(ScoringError, match=r"6 hypotheses but 5 references"):
        score_all(HYPS, REFS[:5])
    with pytest.raises(ScoringError, match=r"5 hypotheses but 6 references"):
        corpus_chrf(HYPS[:5], REFS)


def test_rejects_empty_corpus() -> None:
    for fn in (corpus_bleu, corpus_chrf, score_all):
        with pytest.raises(ScoringError, match="empty corpus"):
            fn([], [])


def test_rejects_a_single_string() -> None:
    with pytest.raises(ScoringError, match="not a single string"):
        check_detokenized("a b c", "a b c")


def test_paired_bootstrap_equals_the_sacrebleu_command(shared_data: Path, tmp_path: Path) -> None:
    import json as _json
    import subprocess
    import sys

    from attnlab.metrics import paired_bootstrap

    references = (shared_data / "multi30k" / "val.en").read_text(encoding="utf-8").split("\n")[:300]
    baseline = [" ".join(r.split()[:-1]) for r in references]  # drops each sentence's last word
    system = [r if i % 3 else " ".join(r.split()[1:]) for i, r in enumerate(references)]
    files = {}
    for name, lines in (("ref", references), ("base", baseline), ("sys", system)):
        files[name] = tmp_path / f"{name}.txt"
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    ours = paired_bootstrap(baseline, system, references, n_samples=1000)
    env = {k: v for k, v in os.environ.items() if k != "SACREBLEU_SEED"}
    command = [sys.executable, "-m", "sacrebleu", str(files["ref"]), "-i", str(files["base"]),
               str(files["sys"]), "--paired-bs", "-m", "bleu", "-f", "json"]  # fmt: skip
    printed = _json.loads(subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout)
    assert ours.p_value == printed[1]["BLEU"]["p_value"]
    assert (
        ours.system == pytest.approx(printed[1]["BLEU"]["score"])
        and ours.system_ci == printed[1]["BLEU"]["ci"]
    )
    assert ours.baseline == pytest.approx(printed[0]["BLEU"]["score"])
    assert ours.seed == "12345" and 0.0 < ours.p_value <= 1.0
