"""Decoding settings for evaluation (torch-free): `DecodeConfig`, the `decode` config node."""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from attnlab.typed import check_fields, require, require_positive

# The α each length penalty gets when `decode.alpha` is null: GNMT's 0.6 (Vaswani et al. §6.1) and
# fairseq's `--lenpen` default, 1 (the mean log-probability per token).
DEFAULT_ALPHA = {"gnmt": 0.6, "fairseq": 1.0}
LENPEN_DEPRECATED = (
    "decode.lenpen is deprecated: it is the GNMT length-penalty exponent, now decode.alpha with "
    "decode.length_penalty=gnmt (the default); decode.length_penalty=fairseq divides by |Y|^alpha "
    "instead. Replace decode.lenpen=X by decode.alpha=X"
)
NBEST_FORMATS = ("jsonl", "fairseq")  # `DecodeConfig.nbest_format`


@dataclass(frozen=True)
class DecodeConfig:
    """How translations are produced and scored.

    Args:
        beam: Beam size for test-set evaluation (1 = greedy).
        length_penalty: What beam search divides a hypothesis' log-probability by to rank it, |Y| its
            length with eos: `gnmt`, ((5 + |Y|) / 6)^α (Wu et al. 2016, eq. 14; the paper's beam search),
            or `fairseq`, |Y|^α (fairseq's `--lenpen`; α = 1 ranks by mean log-probability per token).
        alpha: The exponent α of `length_penalty` (0: rank by raw log-probability); null: 0.6 for
            `gnmt`, 1.0 for `fairseq` (`DEFAULT_ALPHA`; the value used is what is saved and reported).
        max_len_a: Output length limit a in a · |S| + b.
        max_len_b: Output length limit b.
        min_len: Shortest output (eos included); with max_len_a = 0, more than max(1, max_len_b) is
            warned about (no output could end with eos).
        every_n_epochs: During training, decode the validation set and log `val/bleu` and `val/chrf`
            every n epochs (0: never). Needs a corpus with a tokenizer (not `data=synthetic`).
        val_beam: Beam size of those validation decodes (1 = greedy, the fast default).
        val_subset: Decode only the first n validation sentences (null: all). They are decoded by index,
            not from the validation batches, so `val/bleu` and `val/chrf` score exactly these n even
            when `trainer.limit_val_batches` (or fast_dev_run) stops validation before the batches
            that hold them (sorted by length); without a subset such a limited validation scores the
            sentences its batches held.
        batch_size: Most sentences per decoding batch outside training (each holds `beam` hypotheses).
        max_tokens: Most source tokens (padding included) per decoding batch outside training, so long
            inputs get fewer sentences per batch (null: no token budget, `batch_size` alone).
        probe_sentences: At each validation decode, the cross-attention (last decoder layer, averaged
            over heads) of the first n validation sentences goes to W&B as heatmap images, one key per
            sentence (`val/attention/<i>`; 0: none).
        max_source_tokens: Longest source (in subwords, eos included) decoded outside training; longer
            ones are cut to it, keeping eos, and counted (`truncated_sources` in results.json, a warning),
            so one huge input line cannot stall decoding. null: the training filter's limit, the
            `data.max_source_tokens` saved in the checkpoint (its default, 256, for a checkpoint without
            data settings). A learned position table cuts further, to the model's `max_positions`.
        sampling: Draw each output token from the model's distribution instead of searching (for
            back-translation and diverse outputs): one output per sentence, so `beam` (and `val_beam`)
            must be 1. Reproducible: see `seed`.
        topk: With `sampling`, draw only among the k most probable tokens (0: all).
        topp: With `sampling`, draw only among the most probable tokens whose probabilities sum to p
            (nucleus sampling, Holtzman et al. 2020; the most probable token always stays; 1.0: all).
        temperature: With `sampling`, divide the logits by it before `topk`/`topp` (< 1 sharpens,
            towards greedy; > 1 flattens).
        seed: With `sampling`, the seed of the draws. Each sentence draws from its own generator, seeded
            from `seed` and its source ids, so a sentence samples the same alone or inside any batch,
            in any order (up to floating-point rounding of batched arithmetic); identical source lines
            get the same sample (vary `seed` for several samples). It is not the run's `seed`: a
            checkpoint samples the same whatever run trained it.
        lenpen: Deprecated name of `alpha` with `length_penalty=gnmt`, still read from older configs,
            checkpoints and overrides (with a `FutureWarning` naming the new keys); null once read.
        nbest: Also write the `nbest` best hypotheses of each sentence with their scores (1 <= nbest <=
            beam; null: none unless `print_alignment` asks for alignments, then 1): test-set scoring
            (`score_sets`) writes them beside the hypotheses (`nbest/<set>.jsonl`), attnlab-translate
            instead of its plain lines; validation decodes ignore it. Not with `sampling`.
        nbest_format: How they are written: `jsonl` (one JSON object per source line) or `fairseq`
            (fairseq-generate's `S-i`, `H-i`, `D-i`, `P-i`, `A-i` lines; scores in base 2 there).
        print_alignment: Also give each hypothesis its alignment from the last decoder layer's
            cross-attention averaged over heads: `hard` (the source position each output token attends
            to most) or `soft` (the attention weights); null: none.
    """

    beam: int = 5
    length_penalty: Literal["gnmt", "fairseq"] = "gnmt"
    alpha: float | None = None
    max_len_a: float = 1.2
    max_len_b: int = 10
    min_len: int = 1
    every_n_epochs: int = 1
    val_beam: int = 1
    val_subset: int | None = None
    batch_size: int = 64
    max_tokens: int | None = 4096
    probe_sentences: int = 2
    max_source_tokens: int | None = None
    sampling: bool = False
    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0
    seed: int = 0
    lenpen: float | None = None
    nbest: int | None = None
    nbest_format: str = "jsonl"
    print_alignment: Literal["hard", "soft"] | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        if self.lenpen is not None:  # the old name of the GNMT α
            require(
                self.alpha is None,
                f"lenpen={self.lenpen} and alpha={self.alpha} are both set: lenpen is the old name of "
                "alpha; keep only decode.alpha",
            )
            require(
                self.length_penalty == "gnmt",
                f"lenpen={self.lenpen} is the GNMT exponent but length_penalty="
                f"{self.length_penalty}: use decode.alpha={self.lenpen} instead of decode.lenpen",
            )
            require(self.lenpen >= 0, f"lenpen={self.lenpen} must be >= 0")
            warnings.warn(LENPEN_DEPRECATED, FutureWarning, stacklevel=3)
            object.__setattr__(self, "alpha", self.lenpen)
            object.__setattr__(self, "lenpen", None)
        if self.alpha is None:
            object.__setattr__(self, "alpha", DEFAULT_ALPHA[self.length_penalty])
        require_positive(self, "beam", "val_beam", "min_len", "batch_size")
        require(
            self.max_tokens is None or self.max_tokens > 0, f"max_tokens={self.max_tokens} must be positive"
        )
        require(0 <= self.alpha < math.inf, f"alpha={self.alpha} must be >= 0 and finite (0: none)")
        require(0 <= self.max_len_a < math.inf, f"max_len_a={self.max_len_a} must be >= 0 and finite (output "
                "limit a·|S| + b)")  # fmt: skip
        require(self.max_len_b >= 0, f"max_len_b={self.max_len_b} must be >= 0 (output limit a·|S| + b)")
        if self.max_len_a == 0 and self.min_len > max(1, self.max_len_b):  # a warning: checkpoints keep it
            warnings.warn(f"min_len={self.min_len} is longer than every output may be (max_len_a=0: at most "
                          f"max_len_b={self.max_len_b} tokens): no output can end with eos; lower min_len or "
                          "raise max_len_b", UserWarning, stacklevel=3)  # fmt: skip
        require(
            self.max_source_tokens is None or self.max_source_tokens >= 2,
            f"max_source_tokens={self.max_source_tokens} must be >= 2 (a token and eos) or null (the "
            "training filter's data.max_source_tokens)",
        )
        require(self.topk >= 0, f"topk={self.topk} must be >= 0 (0: no top-k filter)")
        require(0 < self.topp <= 1, f"topp={self.topp} must be in (0, 1] (1.0: no nucleus filter)")
        require(0 < self.temperature < math.inf, f"temperature={self.temperature} must be > 0 and finite "
                "(1.0: the model's distribution; a small value approaches greedy decoding)")  # fmt: skip
        if self.sampling:
            for name in ("beam", "val_beam"):
                require(getattr(self, name) == 1, f"{name}={getattr(self, name)} but sampling=true draws one "
                        f"output per sentence: set decode.{name}=1 (sampling does not combine with beam "
                        "search), or decode.sampling=false to search")  # fmt: skip
        else:
            unused = [f"{name}={getattr(self, name)}" for name in SAMPLING_KEYS
                      if getattr(self, name) != _FIELD_DEFAULTS[name]]  # fmt: skip
            require(not unused, f"{unused[0] if unused else ''} is a sampling setting: set "
                    "decode.sampling=true to sample, or leave it at its default")  # fmt: skip
        require(self.probe_sentences >= 0, f"probe_sentences={self.probe_sentences} must be >= 0")
        require(self.every_n_epochs >= 0, f"every_n_epochs={self.every_n_epochs} must be >= 0 (0: never)")
        require(
            self.val_subset is None or self.val_subset > 0, f"val_subset={self.val_subset} must be positive"
        )
        self._check_nbest()

    def _check_nbest(self) -> None:
        """The n-best and alignment settings (`nbest`, `nbest_format`, `print_alignment`)."""
        require(
            self.nbest is None or 1 <= self.nbest <= self.beam,
            f"nbest={self.nbest} must be between 1 and beam={self.beam} (beam search keeps beam "
            "hypotheses): raise beam or lower nbest",
        )
        require(
            self.nbest_format in NBEST_FORMATS,
            f"nbest_format={self.nbest_format!r}: use one of {', '.join(NBEST_FORMATS)}",
        )
        require(
            not (self.sampling and self.writes_nbest),
            "sampling=true draws one output per sentence, while n-best lists and alignments come from "
            "beam search: set decode.sampling=false, or leave decode.nbest and decode.print_alignment null",
        )

    @property
    def writes_nbest(self) -> bool:
        """Whether hypotheses with scores are written (`nbest` or `print_alignment` set)."""
        return self.nbest is not None or self.print_alignment is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (for checkpoints and loggers), without the deprecated `lenpen` (read into
        `alpha`)."""
        values = dataclasses.asdict(self)
        del values["lenpen"]
        return values


# The settings only a training run reads (its validation decodes): not overridable after training.
TRAINING_ONLY = ("every_n_epochs", "val_beam", "val_subset", "probe_sentences")
# The settings that shape `sampling`'s draws (each at its default unless sampling).
SAMPLING_KEYS = ("topk", "topp", "temperature")
# What a command writes beside its translations, only when asked for there: never kept from a checkpoint,
# never carried by an export.
NBEST_KEYS = ("nbest", "nbest_format", "print_alignment")
# The `decode.*` keys attnlab-eval and attnlab-translate take over a checkpoint's saved settings, in
# DecodeConfig's order (conf/eval.yaml lists them too; tested).
DECODE_TIME_KEYS = tuple(f.name for f in dataclasses.fields(DecodeConfig) if f.name not in TRAINING_ONLY)
# Those attnlab-export takes (conf/export.yaml; tested): an export carries no n-best lists or alignments,
# and the deprecated `lenpen` is only read from older checkpoints and configs.
EXPORT_KEYS = tuple(k for k in DECODE_TIME_KEYS if k not in ("lenpen", *NBEST_KEYS))
_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DecodeConfig)}  # (__post_init__'s)
