"""Corpus BLEU / chrF through sacreBLEU, the detokenization guard, the paper's tokenized compound-split
BLEU, and the paired bootstrap test."""

from __future__ import annotations

import logging
import math
import os
import re
from pathlib import Path

import pytest
import sacrebleu

from attnlab.metrics import (
    SUBWORD_MARKERS,
    MetricsConfig,
    ScoringError,
    best_metric,
    bleu_tok_compound,
    check_detokenized,
    corpus_bleu,
    corpus_chrf,
    corpus_ter,
    fit_metrics,
    is_final_metric,
    score_all,
    set_metric,
    split_compounds,
    split_metric,
    tokenize_compound_split,
    train_metric,
    truncated_metric,
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


def test_metric_names_are_made_from_the_declared_ones_only() -> None:
    assert train_metric("loss", "_epoch") == "train/loss_epoch" and split_metric("val", "bleu") == "val/bleu"
    assert set_metric("test2016", "ter") == "test/test2016/ter" and best_metric("val/bleu") == "best/val/bleu"
    assert truncated_metric("val") == "data/truncated/val" and "train/tokens_seen_step" in fit_metrics()
    for build, args in [(train_metric, ("skipped_steps", "_step")), (split_metric, ("val", "exact_match")),
                        (set_metric, ("val", "bleu")), (best_metric, ("test/loss",)),
                        (truncated_metric, ("train",))]:  # fmt: skip
        with pytest.raises(ValueError, match="is not a declared metric name"):
            build(*args)


@pytest.mark.parametrize(
    ("name", "written"),
    [("best/val/bleu", True), ("train/grad_norm_clipped_epoch", True), ("test/exact_match", True),
     ("test/newstest2014/chrf", True), ("data/truncated/test2016", True), ("best/train/lr_step", True),
     ("best/val/blue", False), ("val/exact_match", False), ("best/test/loss", False),
     ("test/val/bleu", False), ("test/test2016/bleu/x", False), ("data/truncated/train", False),
     ("train/skipped_steps_step", False)],
)  # fmt: skip
def test_final_metrics_are_the_declared_names_with_any_test_set_or_split(name: str, written: bool) -> None:
    """A name some data could give (a test set's) is one; a name no run writes is not."""
    assert is_final_metric(name) is written


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
    assert set(scores) == {"bleu", "chrf", "ter"}
    assert scores["bleu"] == corpus_bleu(HYPS, REFS)
    assert scores["chrf"] == corpus_chrf(HYPS, REFS)
    assert scores["ter"] == corpus_ter(HYPS, REFS)
    assert set(score_all(HYPS, REFS, ter=False)) == {"bleu", "chrf"}
    intl = score_all(HYPS, REFS, MetricsConfig(bleu_tokenize="intl"))
    assert intl["bleu"] == corpus_bleu(HYPS, REFS, tokenize="intl") and intl["chrf"] == scores["chrf"]


def test_ter_is_sacrebleu_ter_and_counts_word_edits() -> None:
    """By hand: one substitution in four words is 25; a shift of a two-word block is one edit (TER's
    shifts); an empty hypothesis deletes every reference word (100); case is ignored (sacreBLEU's TER)."""
    assert corpus_ter(["a b x d"], ["a b c d"]).score == pytest.approx(25.0)
    assert corpus_ter(["c d a b e f"], ["a b c d e f"]).score == pytest.approx(100 / 6)
    assert corpus_ter([""], ["one two three"]).score == pytest.approx(100.0)
    assert corpus_ter(["The Cat sat"], ["the cat sat"]).score == 0.0
    score = corpus_ter(HYPS, REFS)
    expected = sacrebleu.corpus_ter(HYPS, [REFS])
    assert score.name == "ter" and score.score == pytest.approx(expected.score, abs=1e-9)
    assert score.score > 0
    assert score.details == {"num_edits": expected.num_edits, "ref_length": expected.ref_length}
    assert score.signature.startswith("nrefs:1|case:lc|tok:tercom|norm:no|punct:yes|asian:no|version:")


def test_the_bleu_tokenizer_is_chosen_and_recorded_in_the_signature() -> None:
    """13a splits ASCII punctuation only; intl splits Unicode punctuation too, so an em dash glued to a
    word scores differently, and each signature names its tokenizer."""
    hyps, refs = (
        ["Ein Hund—eine Katze rennt über die Wiese."],
        ["Ein Hund — eine Katze rennt über die Wiese."],
    )
    default, intl = corpus_bleu(hyps, refs), corpus_bleu(hyps, refs, tokenize="intl")
    assert default.score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="13a").score)
    assert intl.score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="intl").score) == 100.0
    assert default.score < 70
    assert "|tok:13a|" in default.signature and "|tok:intl|" in intl.signature
    assert "|tok:char|" in corpus_bleu(hyps, refs, tokenize="char").signature


@pytest.mark.parametrize(
    ("value", "named"),
    [("spm", "bleu_tokenize='spm' is not valid: expected '13a' | 'intl'"), ("ja-mecab", "sacrebleu[ja]")],
)
def test_metrics_config_refuses_tokenizers_it_cannot_run(value: str, named: str) -> None:
    if value == "ja-mecab":
        try:
            import MeCab  # noqa: F401

            pytest.skip("mecab is installed here")
        except ImportError:
            pass
    if value == "spm":
        with pytest.raises(ValueError, match=re.escape(named)):
            MetricsConfig(bleu_tokenize=value)
        return
    # A checkpoint trained with it still loads (and translates) here; scoring with it is refused.
    from attnlab.runs.checkpoint import saved_settings

    saved = saved_settings({"hyper_parameters": {"metrics": {"bleu_tokenize": value}}}, "metrics", "x.ckpt")
    assert saved == MetricsConfig(bleu_tokenize=value)
    with pytest.raises(ValueError, match=re.escape(named)):
        saved.check_available()
    with pytest.raises(ScoringError, match=re.escape(named)):
        score_all(HYPS, REFS, saved)
    MetricsConfig().check_available()
    assert MetricsConfig().to_dict() == {"bleu_tokenize": "13a"}


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


# ---------------------------------------------------------------------------------------------------------
# bleu_tok_compound: the paper's procedure (tensor2tensor's get_ende_bleu.sh)

DE_REFS = ["Der Mercedes-Benz-Chef lacht.", "Sie kauft eine 3-D-Brille, oder?"]
DE_HYPS = ["Der Mercedes-Chef lacht.", "Sie kauft die 3-D-Brille, oder?"]


def test_bleu_tok_compound_by_hand() -> None:
    """Moses tokenization splits off the punctuation, every hyphen between two non-space characters is
    split (but, as in perl, not the second one after the one-character "D"), then plain corpus BLEU."""
    assert tokenize_compound_split(DE_REFS, "de") == [
        "Der Mercedes ##AT##-##AT## Benz ##AT##-##AT## Chef lacht .",  # 8 tokens
        "Sie kauft eine 3 ##AT##-##AT## D-Brille , oder ?",  # 9 tokens
    ]
    assert tokenize_compound_split(DE_HYPS, "de") == [
        "Der Mercedes ##AT##-##AT## Chef lacht .",  # 6 tokens
        "Sie kauft die 3 ##AT##-##AT## D-Brille , oder ?",  # 9 tokens
    ]
    # Matches (clipped) / hypothesis n-grams, sentence 1 + sentence 2 (A = ##AT##-##AT##):
    # 1-grams: 6/6 + 8/9 ("die" unmatched)
    # 2-grams: 5/5 ("A Chef" is in "Benz A Chef") + 6/8 ("kauft die", "die 3")
    # 3-grams: 3/4 ("Mercedes A Chef") + 4/7 (the 3 with "die")
    # 4-grams: 1/3 ("A Chef lacht .") + 3/6 (the 3 with "die")
    # hypothesis 15 tokens, reference 17: BP = exp(1 - 17/15)
    expected = 100 * math.exp(1 - 17 / 15) * ((14 / 15) * (11 / 13) * (7 / 11) * (4 / 9)) ** 0.25
    score = bleu_tok_compound(DE_HYPS, DE_REFS, "de")
    assert score.name == "bleu_tok_compound"
    assert score.score == pytest.approx(expected, abs=1e-9)
    assert score.score == pytest.approx(60.165330351, abs=1e-6)
    assert score.details["precisions"] == pytest.approx([1400 / 15, 1100 / 13, 700 / 11, 400 / 9])
    assert (score.details["sys_len"], score.details["ref_len"]) == (15, 17)
    assert score.details["bp"] == pytest.approx(math.exp(1 - 17 / 15))


def test_bleu_tok_compound_has_no_smoothing() -> None:
    """multi-bleu.perl: a corpus without a matching 4-gram scores 0."""
    assert bleu_tok_compound(["Der Hund lacht."], ["Der Hund bellt."], "de").score == 0.0
    assert corpus_bleu(["Der Hund lacht."], ["Der Hund bellt."]).score > 0.0  # sacreBLEU smooths


def test_compound_split_of_consecutive_hyphens() -> None:
    assert split_compounds("Mercedes-Benz-Chef") == "Mercedes ##AT##-##AT## Benz ##AT##-##AT## Chef"
    assert split_compounds("Ende-zu-Ende-Verschlüsselung ist Baden-Württembergs Ziel") == (
        "Ende ##AT##-##AT## zu ##AT##-##AT## Ende ##AT##-##AT## Verschlüsselung ist "
        "Baden ##AT##-##AT## Württembergs Ziel"
    )
    # perl's s{(\S)-(\S)}{...}g: a one-character part between two hyphens is used by the first match
    assert (
        split_compounds("a-b-c-d 3-D-Brille")
        == "a ##AT##-##AT## b-c ##AT##-##AT## d 3 ##AT##-##AT## D-Brille"
    )
    # a hyphen beside a space (or line end) is not inside a compound
    assert split_compounds("Vor- und Nachteile - gut -") == "Vor- und Nachteile - gut -"
    # beside any other character it is, punctuation included (perl's \S, not a word character)
    assert split_compounds('"Ja"-Wort (x)-(y) 5%-Hürde') == (
        '"Ja" ##AT##-##AT## Wort (x) ##AT##-##AT## (y) 5% ##AT##-##AT## Hürde'
    )
    # perl reads bytes: a no-break space (bytes c2 a0) is no whitespace to its \S, as Unicode's is
    assert split_compounds("10\u00a0-Euro-Schein") == "10\u00a0 ##AT##-##AT## Euro ##AT##-##AT## Schein"


def test_bleu_tok_compound_is_not_sacrebleu() -> None:
    paper = bleu_tok_compound(DE_HYPS, DE_REFS, "de")
    sacre = corpus_bleu(DE_HYPS, DE_REFS)
    assert abs(paper.score - sacre.score) > 1.0
    parts = paper.signature.split("|")
    assert parts[:3] == ["t2t-get_ende_bleu", "moses:de", "atat:yes"]
    for part in ("tok:none", "smooth:none", "case:mixed", f"version:{sacrebleu.__version__}"):
        assert part in parts


def test_bleu_tok_compound_tokenizes_with_the_target_languages_rules() -> None:
    assert tokenize_compound_split(["It isn't cheap."], "en") == ["It isn 't cheap ."]
    assert tokenize_compound_split(["It isn't cheap."], "de") == ["It isn ' t cheap ."]
    assert bleu_tok_compound(["Das ist es."], ["Das ist es."], "en").signature.startswith(
        "t2t-get_ende_bleu|moses:en|"
    )


def test_bleu_tok_compound_checks_detokenized_inputs() -> None:
    with pytest.raises(ScoringError, match=r"line 2 .*subword marker"):
        bleu_tok_compound(["Der Hund.", "Die ▁Katze."], DE_REFS, "de")
    with pytest.raises(ScoringError, match="1 hypotheses but 2 references"):
        bleu_tok_compound(DE_HYPS[:1], DE_REFS, "de")


def test_score_sets_records_the_tokenized_bleu_in_the_target_language(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`score_sets` puts `bleu_tok_compound` beside sacreBLEU, with the target language of the model's
    data settings; without it, English rules, and `target_lang` null."""
    from attnlab.decoding import DecodeConfig
    from attnlab.inference.translator import Translator, score_sets

    outputs = dict(zip(["src 1", "src 2"], DE_HYPS, strict=True))

    class FixedTranslator(Translator):
        def __init__(self, data: dict | None, metrics: MetricsConfig | None = None) -> None:
            # no model: `translate` looks the output up
            self.model, self.data, self.decode = None, data, DecodeConfig()
            self.truncated = self.unfinished = 0
            self.metrics = metrics or MetricsConfig()

        def translate(self, lines: list[str]) -> list[str]:
            return [outputs[line] for line in lines]

    sets = {"test": (["src 1", "src 2"], DE_REFS)}
    results = score_sets(FixedTranslator({"tgt_lang": "de", "max_source_tokens": 256}), sets).results
    entry = results["sets"]["test"]
    assert results["target_lang"] == "de"
    assert entry["bleu_tok_compound"] == pytest.approx(60.165330351, abs=1e-6)
    assert entry["bleu_tok_compound_signature"] == bleu_tok_compound(DE_HYPS, DE_REFS, "de").signature
    assert entry["bleu"] == corpus_bleu(DE_HYPS, DE_REFS).score != entry["bleu_tok_compound"]
    assert entry["ter"] == corpus_ter(DE_HYPS, DE_REFS).score > 0
    assert entry["ter_signature"] == corpus_ter(DE_HYPS, DE_REFS).signature
    # README, "Run directory": per set BLEU, chrF and TER with their signatures, BLEU details (n-gram
    # precisions, brevity penalty, lengths), sentence count, decoding time and the saved files
    bleu, chrf = corpus_bleu(DE_HYPS, DE_REFS), corpus_chrf(DE_HYPS, DE_REFS)
    assert set(bleu.details) == {"precisions", "bp", "sys_len", "ref_len"}
    assert entry["bleu_details"] == bleu.details
    assert (entry["chrf"], entry["chrf_signature"]) == (chrf.score, chrf.signature)
    assert entry["sentences"] == 2 and entry["decode_seconds"] >= 0.0
    files = (entry["hypotheses"], entry["references"], entry["sources"])
    assert files == ("hypotheses/test.txt", "references/test.txt", "sources/test.txt")
    assert results["scoring"] == {"bleu_tokenize": "13a"} and "|tok:13a|" in entry["bleu_signature"]
    chosen = FixedTranslator({"tgt_lang": "de"}, MetricsConfig(bleu_tokenize="char"))
    results = score_sets(chosen, sets).results
    assert results["scoring"] == {"bleu_tokenize": "char"}
    assert results["sets"]["test"]["bleu"] == corpus_bleu(DE_HYPS, DE_REFS, tokenize="char").score
    assert results["sets"]["test"]["bleu"] != entry["bleu"]
    assert "|tok:char|" in results["sets"]["test"]["bleu_signature"]

    with caplog.at_level(logging.WARNING, logger="attnlab.inference.translator"):
        results = score_sets(FixedTranslator(None), sets).results
    assert results["target_lang"] is None
    assert results["sets"]["test"]["bleu_tok_compound_signature"].startswith("t2t-get_ende_bleu|moses:en|")
    assert "target language is unknown" in caplog.text
    # `data=files`' placeholder suffix is no language (its Moses rules were another language's, no warning);
    # a region or upper case is the language's
    for saved, lang in (
        ("tgt", None),
        ("tgt_de", None),
        ("日本", None),
        ("EN", "en"),
        ("en_US", "en"),
        ("de-AT", "de"),
    ):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="attnlab.inference.translator"):
            results = score_sets(FixedTranslator({"tgt_lang": saved}), sets).results
        assert results["target_lang"] == lang
        moses = results["sets"]["test"]["bleu_tok_compound_signature"].split("|")[1]
        assert moses == f"moses:{lang or 'en'}"
        assert ("target language is unknown" in caplog.text) == (lang is None)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="attnlab.inference.translator"):
        results = score_sets(FixedTranslator({"tgt_lang": "deu"}), sets).results
    assert (
        results["target_lang"] == "deu" and "Moses has no rules of its own for language 'deu'" in caplog.text
    )
    with pytest.raises(ScoringError, match="cannot score empty: empty corpus"):
        score_sets(FixedTranslator({"tgt_lang": "de"}), {"empty": ([], [])})


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


def test_metric_names_outside_attnlab_metrics_are_derived_from_it_not_spelled_by_hand() -> None:
    """The W&B summaries, attnlab-compare's columns and main metric, and the validation-curve plot spelled
    metric names by hand ("val/bleu", "train/tokens_per_sec_epoch"): a name changed in attnlab.metrics
    would leave them reading nothing. They are built with its functions now (which refuse an undeclared
    name), and no module spells one as a string literal."""
    import re
    from pathlib import Path

    from attnlab.metrics import fit_metrics
    from attnlab.reports.compare import DEFAULT_METRICS
    from attnlab.runs.wandb import SUMMARIES

    src = Path(__file__).resolve().parents[2] / "src" / "attnlab"
    literal = re.compile(r"""["'](?:val|test|best|train|data)/[A-Za-z0-9_/]+["']""")
    spelled = [
        f"{path.relative_to(src)}:{number}: {line.strip()}"
        for path in sorted(src.rglob("*.py")) if path.name != "metrics.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if literal.search(line)
    ]  # fmt: skip
    assert not spelled, "metric names spelled by hand (use attnlab.metrics):\n" + "\n".join(spelled)
    summaries = {"val/bleu": "max", "val/chrf": "max", "val/loss": "min", "val/nll": "min", "val/ppl": "min"}
    assert summaries == SUMMARIES and set(SUMMARIES) <= set(fit_metrics())
    assert DEFAULT_METRICS == ("val/ppl", "params", "train/tokens_per_sec_epoch", "train_minutes")
