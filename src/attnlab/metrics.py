"""Corpus BLEU, chrF and TER with sacreBLEU, on detokenized text, with their full signatures.

Scores are only comparable across papers when computed by sacreBLEU on detokenized hypotheses against
untouched references (Post, 2018). `check_detokenized` refuses subword pieces (a Metaspace `▁` or a
subword-nmt `@@`) so a forgotten `SubwordTokenizer.decode` fails loudly instead of scoring low. BLEU is
cased with exponential smoothing and tokenized by `MetricsConfig.bleu_tokenize` (sacreBLEU's 13a by
default; `intl`, `zh`, `char`, `none`, and `ja-mecab` / `ko-mecab` where their extras are installed),
which its signature records (`tok:intl`); chrF is sacreBLEU's default chrF2; TER is sacreBLEU's default
TER (tercom: case-insensitive, punctuation kept, no normalisation; lower is better).

`bleu_tok_compound` is the paper's procedure (tensor2tensor's `get_ende_bleu.sh`, behind the 27.3 on
WMT14 en-de): Moses-tokenized, compound-split BLEU. It is reported beside sacreBLEU to compare with the
paper's table and is not comparable to sacreBLEU scores (nor to other papers' tokenized BLEU).

Under DDP each rank's validation hypotheses are gathered and scored as one corpus, and the test sets are
decoded whole by one process: a corpus score is never an average of per-shard scores.

sacreBLEU 2.6 API relied on: public `BLEU`, `CHRF`, `TER`, `Metric.corpus_score`, `Metric.get_signature` and
`sacrebleu.significance.PairedTest`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib.metadata import version
from typing import Any, Literal

from sacrebleu.metrics import BLEU, CHRF, TER

from attnlab.typed import ConfigError, check_fields, did_you_mean

SUBWORD_MARKERS = ("▁", "@@ ", "@@")  # Metaspace/SentencePiece and subword-nmt markers
MAX_NGRAM_ORDER = 4
# sacreBLEU's BLEU tokenizers that need no download (`spm`/`flores*` fetch a model from the network at
# first use: not offered). The mecab ones need `pip install "sacrebleu[ja]"` / `"sacrebleu[ko]"`.
BleuTokenize = Literal["13a", "intl", "zh", "char", "none", "ja-mecab", "ko-mecab"]


# The names of the metrics a training run writes: to its loggers (`csv/metrics.csv`) and as its final
# metrics (`results.json`, what a sweeper optimizes: `optimized_metric`). They are made only by the
# `*_metric` functions below, from these tuples; `check_metric_name` refuses a name no run writes.
# `train/<name>`, logged per step and per epoch: Lightning also writes `train/<name>_step` and
# `train/<name>_epoch` (the averaged ones: the epoch's mean, `attnlab.training.epoch_metrics`)
TRAIN_AVERAGED = ("loss", "nll", "ppl", "grad_norm", "grad_norm_clipped", "lr", "tokens_per_sec")
TRAIN_STEPPED = (*TRAIN_AVERAGED, "tokens_seen")
LIGHTNING_ENDS = ("_step", "_epoch")
TRAIN_EPOCH = ("skipped_steps",)  # `train/<name>`, per epoch (one that skipped steps)
LOSSES = ("loss", "nll", "ppl")  # `val/<name>`, `test/<name>`: over the split's target tokens
VAL_SCORES = ("bleu", "chrf")  # `val/<name>`: on the epochs that decode the validation set
TEST_MATCHES = ("exact_match",)  # `test/<name>`: greedy test decodes equal to their targets
SET_SCORES = ("bleu", "chrf", "ter")  # `test/<set>/<name>`: each test set, decoded after training
# ... and `best/<monitor.metric>` (the monitor's value at the selected checkpoint), `data/truncated/<split>`
# (sentences cut in the validation split or a test set). Test sets are never named train or val.
SPLIT_NAMES = {"val": (*LOSSES, *VAL_SCORES), "test": (*LOSSES, *TEST_MATCHES)}
_SET = r"(?!(?:train|val)/)[^/]+"  # a test set's name (then a /)
_FINAL_PATTERNS = (rf"test/{_SET}/({'|'.join(SET_SCORES)})", r"data/truncated/(?!train$)[^/]+")


def train_metric(name: str, end: str = "") -> str:
    """`train/<name>`, or with `end` (Lightning's `_step` or `_epoch`) the name Lightning logs it as."""
    known = name in TRAIN_STEPPED if end else name in (*TRAIN_STEPPED, *TRAIN_EPOCH)
    return _declared(f"train/{name}{end}", known and end in ("", *LIGHTNING_ENDS))


def split_metric(split: str, name: str) -> str:
    """`val/<name>` or `test/<name>` (`SPLIT_NAMES`)."""
    return _declared(f"{split}/{name}", name in SPLIT_NAMES.get(split, ()))


def set_metric(test_set: str, score: str) -> str:
    """`test/<set>/<score>`: a test set's corpus score after training (`SET_SCORES`)."""
    name = f"test/{test_set}/{score}"
    return _declared(name, re.fullmatch(_FINAL_PATTERNS[0], name))


def best_metric(monitor: str) -> str:
    """`best/<monitor>`: the value of the monitored metric (one `fit_metrics` names) at the selected
    checkpoint."""
    return _declared(f"best/{monitor}", monitor in fit_metrics())


def truncated_metric(split: str) -> str:
    """`data/truncated/<split>`: sentences cut in the validation split or a test set."""
    name = f"data/truncated/{split}"
    return _declared(name, re.fullmatch(_FINAL_PATTERNS[1], name))


def _declared(name: str, known: Any) -> str:
    if not known:
        raise ValueError(f"{name} is not a declared metric name (attnlab.metrics)")
    return name


@cache
def fit_metrics() -> tuple[str, ...]:
    """Every name fitting logs (what `monitor.metric` may name), in the order of `describe_metrics`."""
    stepped = [train_metric(name, end) for name in TRAIN_STEPPED for end in ("", *LIGHTNING_ENDS)]
    epoch = [train_metric(name) for name in TRAIN_EPOCH]
    return (*stepped, *epoch, *(split_metric("val", name) for name in SPLIT_NAMES["val"]))


def describe_metrics(fitting: bool = False) -> str:
    """The names a training run writes as one line (with `fitting`, those fitting logs), patterns for the
    data-dependent parts: `test/<set>/{bleu,chrf,ter}`."""
    parts = [
        f"train/{{{','.join(TRAIN_STEPPED)}}} (each also with _step or _epoch)",
        *(f"train/{name}" for name in TRAIN_EPOCH),
        f"val/{{{','.join(SPLIT_NAMES['val'])}}}",
    ]
    if not fitting:
        parts += [f"test/{{{','.join(SPLIT_NAMES['test'])}}}", f"test/<set>/{{{','.join(SET_SCORES)}}}",
                  "best/<monitor.metric>", "data/truncated/<split>"]  # fmt: skip
    return ", ".join(parts)


def is_final_metric(name: str) -> bool:
    """Whether some training run has `name` among its final metrics (`train`'s result, `results.json`):
    a fixed name, or one whose data-dependent part (a test set, a split) some data could give."""
    fixed = (*fit_metrics(), *(split_metric("test", n) for n in SPLIT_NAMES["test"]))
    if name in fixed or (name.startswith("best/") and name.removeprefix("best/") in fit_metrics()):
        return True
    return any(re.fullmatch(pattern, name) for pattern in _FINAL_PATTERNS)


def check_metric_name(name: Any, key: str, fitting: bool = False) -> None:
    """Refuse a name no training run writes (with `fitting`, one fitting does not log: `monitor.metric`);
    a name valid for some data only (`test/<set>/bleu`) is accepted.

    Raises:
        ConfigError: Naming `key`, the closest known name and the names a run writes.
    """
    text = str(name)
    if (text in fit_metrics()) if fitting else is_final_metric(text):
        return
    known = list(fit_metrics())
    if not fitting:
        known += [split_metric("test", n) for n in SPLIT_NAMES["test"]] + [best_metric(n) for n in known]
        parts = text.split("/")
        if len(parts) == 3:  # the test set or split it names, with the known scores
            filled = [f"test/{parts[1]}/{score}" for score in SET_SCORES] + [f"data/truncated/{parts[2]}"]
            known += [candidate for candidate in filled if is_final_metric(candidate)]
    which = "metric logged while fitting" if fitting else "final metric of a training run"
    raise ConfigError(
        f"{key}={text} is no {which}: {did_you_mean(text, known, f'{key}=')}use one of "
        f"{describe_metrics(fitting)}"
    )


# Which way a metric improves, by the end of its name (`val/bleu`, `best/val/loss`, `test/test2016/ter`):
# what `monitor.mode=auto` picks and what a sweeper's direction must be for `optimized_metric` (`better`)
HIGHER_IS_BETTER = ("bleu", "chrf", "exact_match")
LOWER_IS_BETTER = ("loss", "nll", "ppl", "ter")


def better(metric: str) -> Literal["max", "min"] | None:
    """`max` for a metric that is better higher (`HIGHER_IS_BETTER`: BLEU, chrF, exact matches), `min` for
    one better lower (`LOWER_IS_BETTER`: losses, perplexity, TER), None for another (a learning rate,
    tokens per second). Lightning's `_epoch` and `_step` ends (`train/loss_epoch`) are the metric's own."""
    metric = metric.removesuffix("_epoch").removesuffix("_step")
    if metric.endswith(HIGHER_IS_BETTER):
        return "max"
    return "min" if metric.endswith(LOWER_IS_BETTER) else None


class ScoringError(ValueError):
    """Inputs that cannot be scored as they are (count mismatch, empty corpus, subword pieces), or a BLEU
    tokenizer whose package is not installed."""


@dataclass(frozen=True)
class MetricsConfig:
    """How hypotheses are scored (the `metrics` config node; saved in checkpoints, so `attnlab-eval`
    scores as training did unless told otherwise).

    Args:
        bleu_tokenize: sacreBLEU's BLEU tokenizer (`BleuTokenize`): `13a` (the default, WMT's
            mteval-v13a), `intl` (mteval-v14 international: Unicode punctuation and symbols split), `zh`
            (Chinese characters split), `char` (every character), `none` (pre-tokenized text), `ja-mecab`,
            `ko-mecab` (morphological analysers, where installed). chrF and TER have their own
            tokenization and do not depend on it.
    """

    bleu_tokenize: BleuTokenize = "13a"

    def __post_init__(self) -> None:
        check_fields(self)

    def check_available(self) -> None:
        """Raise unless this machine can score with these settings (a mecab tokenizer needs its package).
        Called where scoring is about to happen (training's config check, attnlab-eval, `score_all`), not
        when settings are read: a checkpoint trained with `ja-mecab` still loads and translates anywhere.

        Raises:
            ScoringError: (a ValueError) naming the tokenizer and the package to install.
        """
        _bleu(tokenize=self.bleu_tokenize)

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (for checkpoints and loggers)."""
        return {"bleu_tokenize": self.bleu_tokenize}


@dataclass(frozen=True)
class Score:
    """One corpus-level score with the sacreBLEU signature that makes it reproducible.

    Attributes:
        name: "bleu", "chrf", "ter" or "bleu_tok_compound".
        score: The score in [0, 100].
        signature: The full sacreBLEU signature, e.g.
            "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0" (bleu_tok_compound: the procedure
            first, see `bleu_tok_compound`).
        details: bleu, bleu_tok_compound: precisions, bp, sys_len, ref_len; chrf: char_order, word_order,
            beta.
    """

    name: str
    score: float
    signature: str
    details: dict[str, Any]


def check_detokenized(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    """Check that the inputs can be scored; references are only counted, never modified.

    Args:
        hypotheses: One detokenized hypothesis per line (a line may be empty).
        references: One reference per hypothesis.

    Raises:
        ScoringError: When the corpus is empty, the counts differ, or a hypothesis contains a subword marker.
    """
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise ScoringError("hypotheses and references must be sequences of lines, not a single string")
    if len(hypotheses) != len(references):
        raise ScoringError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: "
            "score one hypothesis per reference line"
        )
    if not hypotheses:
        raise ScoringError("empty corpus: no hypotheses and no references to score")
    for line_number, hypothesis in enumerate(hypotheses, start=1):
        for marker in SUBWORD_MARKERS:
            if marker in hypothesis:
                raise ScoringError(
                    f"hypothesis line {line_number} contains the subword marker {marker!r}: BLEU must be "
                    "computed on detokenized text — decode with the tokenizer first "
                    f"(line: {hypothesis[:80]!r})"
                )


def _bleu(references: Sequence[str] | None = None, tokenize: BleuTokenize = "13a") -> BLEU:
    """sacreBLEU's BLEU with attnlab's settings; a tokenizer whose package is missing (mecab) is a
    `ScoringError` naming the package (sacreBLEU checks when the tokenizer is built)."""
    refs = None if references is None else [list(references)]
    try:
        return BLEU(tokenize=tokenize, lowercase=False, smooth_method="exp", max_ngram_order=MAX_NGRAM_ORDER,
                    references=refs)  # fmt: skip
    except (RuntimeError, ImportError) as exc:
        raise ScoringError(
            f"bleu_tokenize={tokenize} needs a package that is not installed (sacreBLEU: "
            f'{str(exc).strip().splitlines()[0]}): pip install "sacrebleu[{tokenize.split("-")[0]}]", or '
            "choose another tokenizer"
        ) from None


def _bleu_score(bleu: BLEU, result: Any, name: str = "bleu", procedure: str = "") -> Score:
    details = {
        "precisions": list(result.precisions),
        "bp": result.bp,
        "sys_len": result.sys_len,
        "ref_len": result.ref_len,
    }
    signature = procedure + str(bleu.get_signature())
    return Score(name=name, score=result.score, signature=signature, details=details)


def _corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], tokenize: BleuTokenize) -> Score:
    bleu = _bleu(tokenize=tokenize)
    return _bleu_score(bleu, bleu.corpus_score(list(hypotheses), [list(references)]))


def _corpus_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    chrf = CHRF()
    result = chrf.corpus_score(list(hypotheses), [list(references)])
    details = {"char_order": chrf.char_order, "word_order": chrf.word_order, "beta": chrf.beta}
    return Score(name="chrf", score=result.score, signature=str(chrf.get_signature()), details=details)


def _corpus_ter(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    ter = TER()
    result = ter.corpus_score(list(hypotheses), [list(references)])
    details = {"num_edits": result.num_edits, "ref_length": result.ref_length}
    return Score(name="ter", score=result.score, signature=str(ter.get_signature()), details=details)


def corpus_bleu(
    hypotheses: Sequence[str], references: Sequence[str], tokenize: BleuTokenize = "13a"
) -> Score:
    """Cased corpus BLEU with exponential smoothing (sacreBLEU `BLEU()`), tokenized by `tokenize` (see
    `MetricsConfig`; 13a by default).

    Args:
        hypotheses: Detokenized hypotheses, one per line.
        references: One untouched reference per hypothesis.
        tokenize: sacreBLEU's tokenizer name, recorded in the signature (`tok:13a`).

    Returns:
        The "bleu" `Score`.

    Raises:
        ScoringError: See `check_detokenized`.
    """
    check_detokenized(hypotheses, references)
    return _corpus_bleu(hypotheses, references, tokenize)


def corpus_ter(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    """Corpus TER with sacreBLEU's `TER()` defaults: word edits (insertions, deletions, substitutions and
    shifts of word sequences) per reference word, x 100; case-insensitive (`case:lc` in its signature),
    punctuation kept. Lower is better, and it can exceed 100.

    Returns:
        The "ter" `Score` (details: `num_edits`, `ref_length`).

    Raises:
        ScoringError: See `check_detokenized`.
    """
    check_detokenized(hypotheses, references)
    return _corpus_ter(hypotheses, references)


def corpus_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    """Corpus chrF2 with sacreBLEU's `CHRF()` defaults (character 6-grams, no word n-grams, beta 2).

    Args:
        hypotheses: Detokenized hypotheses, one per line.
        references: One untouched reference per hypothesis.

    Returns:
        The "chrf" `Score`.

    Raises:
        ScoringError: See `check_detokenized`.
    """
    check_detokenized(hypotheses, references)
    return _corpus_chrf(hypotheses, references)


def score_all(
    hypotheses: Sequence[str],
    references: Sequence[str],
    metrics: MetricsConfig | None = None,
    *,
    ter: bool = True,
) -> dict[str, Score]:
    """BLEU, chrF and (with `ter`) TER after one `check_detokenized`.

    Args:
        hypotheses: Detokenized hypotheses, one per line.
        references: One untouched reference per hypothesis.
        metrics: The scoring settings (the BLEU tokenizer); default `MetricsConfig()`.
        ter: Compute TER too (validation during training leaves it out: its shift search is the slowest
            of the three).

    Returns:
        {"bleu": ..., "chrf": ..., "ter": ...}.

    Raises:
        ScoringError: See `check_detokenized`; or the BLEU tokenizer's package is missing.
    """
    check_detokenized(hypotheses, references)
    tokenize = (metrics or MetricsConfig()).bleu_tokenize
    scores = {
        "bleu": _corpus_bleu(hypotheses, references, tokenize),
        "chrf": _corpus_chrf(hypotheses, references),
    }
    if ter:
        scores["ter"] = _corpus_ter(hypotheses, references)
    return scores


# tensor2tensor's compound split, `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'`: the same leftmost,
# non-overlapping matches as perl's /g, and perl's byte-string \S (anything but ASCII whitespace).
_COMPOUND_HYPHEN = re.compile(r"(\S)-(\S)", re.ASCII)
COMPOUND_HYPHEN = " ##AT##-##AT## "


def split_compounds(line: str) -> str:
    """A tokenized line with every hyphen between two non-space characters written ` ##AT##-##AT## `,
    exactly as tensor2tensor's perl one-liner does.

    Consecutive compounds split whole ("Mercedes-Benz-Chef" -> "Mercedes ##AT##-##AT## Benz ##AT##-##AT##
    Chef"), except that, as in perl, a one-character part between two hyphens is consumed by the first
    match and its second hyphen stays ("3-D-Brille" -> "3 ##AT##-##AT## D-Brille").
    """
    return _COMPOUND_HYPHEN.sub(lambda m: f"{m[1]}{COMPOUND_HYPHEN}{m[2]}", line)


def moses_rules(lang: str) -> bool:
    """Whether Moses (sacremoses) has rules of its own for language code `lang` (its non-breaking
    prefixes: `de`, `en`, `fr`, ...); for other codes (`deu`, `und`) it tokenizes with its default rules."""
    from sacremoses.corpus import NonbreakingPrefixes

    return lang in NonbreakingPrefixes().available_langs


def tokenize_compound_split(lines: Sequence[str], lang: str) -> list[str]:
    """`lines` Moses-tokenized for `lang` (sacremoses, no escaping), then `split_compounds`.

    `tokenizer.perl` escapes `&`, quotes, brackets and pipes by default; each escape replaces a token
    by another without touching spaces or hyphens, so BLEU is the same with or without it.
    """
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    return [split_compounds(tokenizer.tokenize(line, escape=False, return_str=True)) for line in lines]


def bleu_tok_compound(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> Score:
    """The paper's procedure, not comparable to sacreBLEU: tokenized, compound-split BLEU.

    tensor2tensor's `get_ende_bleu.sh`, which gave the paper's 27.3 on WMT14 en-de: hypotheses and
    references are Moses-tokenized for the target language (`tokenizer.perl -l de`), compounds are
    split (`split_compounds`), and `multi-bleu.perl` scores the result: corpus BLEU on whitespace tokens,
    4-grams, cased, no smoothing (an n-gram order without a match gives 0), the usual brevity penalty.
    sacreBLEU with `tokenize="none"` and `smooth_method="none"` computes the same on the prepared text.

    Args:
        hypotheses: Detokenized hypotheses, one per line.
        references: One raw reference per hypothesis.
        lang: Target language whose Moses rules tokenize both sides ("de", "en", ...).

    Returns:
        The "bleu_tok_compound" `Score`; its signature names the procedure and language, then the
        sacreBLEU signature of the scoring step, e.g.
        "t2t-get_ende_bleu|moses:de|atat:yes|sacremoses:0.2.0|nrefs:1|case:mixed|eff:no|tok:none|...".

    Raises:
        ScoringError: See `check_detokenized`.
    """
    check_detokenized(hypotheses, references)
    # force=True: sacreBLEU's warning about tokenized input does not apply, the text is tokenized on purpose
    bleu = BLEU(tokenize="none", lowercase=False, smooth_method="none", max_ngram_order=MAX_NGRAM_ORDER,
                force=True)  # fmt: skip
    result = bleu.corpus_score(tokenize_compound_split(hypotheses, lang),
                               [tokenize_compound_split(references, lang)])  # fmt: skip
    procedure = f"t2t-get_ende_bleu|moses:{lang}|atat:yes|sacremoses:{version('sacremoses')}|"
    return _bleu_score(bleu, result, name="bleu_tok_compound", procedure=procedure)


@dataclass(frozen=True)
class PairedResult:
    """A paired bootstrap comparison of two systems' corpus BLEU on the same sentences.

    Attributes:
        p_value: Probability of a difference at least as large by chance (sacreBLEU's paired bootstrap).
        baseline: BLEU of the baseline; system: BLEU of the compared system.
        baseline_ci, system_ci: Half-widths of their 95% bootstrap confidence intervals.
        n_samples: Bootstrap resamples; seed: the resampling seed (`SACREBLEU_SEED`, default 12345).
    """

    p_value: float
    baseline: float
    system: float
    baseline_ci: float
    system_ci: float
    n_samples: int
    seed: str


def paired_bootstrap(
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[str],
    n_samples: int = 1000,
    tokenize: BleuTokenize = "13a",
) -> PairedResult:
    """sacreBLEU's paired bootstrap resampling test of `system` against `baseline` (Koehn, 2004), the
    same computation as `sacrebleu REF -i BASELINE SYSTEM --paired-bs -m bleu --tokenize TOKENIZE` (cased).

    Raises:
        ScoringError: See `check_detokenized` (for either system).
    """
    from sacrebleu.significance import PairedTest

    check_detokenized(baseline, references)
    check_detokenized(system, references)
    test = PairedTest([("baseline", list(baseline)), ("system", list(system))],
                      {"BLEU": _bleu(references, tokenize)}, references=None, test_type="bs",
                      n_samples=n_samples)  # fmt: skip
    _, scores = test()
    base, other = scores["BLEU"]
    return PairedResult(p_value=float(other.p_value), baseline=base.score, system=other.score,
                        baseline_ci=base.ci, system_ci=other.ci, n_samples=n_samples,
                        seed=os.environ.get("SACREBLEU_SEED", "12345"))  # fmt: skip
