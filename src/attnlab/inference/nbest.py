"""N-best lists: a sentence's best hypotheses with their scores and alignments (`NBest`, `Candidate`), made
from beam search's `Hypothesis`, and the two ways they are written (`nbest_text`: JSON Lines, or
fairseq-generate's `S-i` / `T-i` / `H-i` / `D-i` / `P-i` / `A-i` lines).

Positions are subword positions, counted from 0: a source position indexes `NBest.source_tokens` (the
source's pieces, its eos "</s>" last), an output position `Candidate.tokens` (the hypothesis' pieces,
"</s>" last when it ended with eos; a hypothesis cut at the length limit has none). Alignments come from
the last decoder layer's cross-attention averaged over heads, one row per output token: the attention of
the decoding step that produced it.

- soft: every row in full, over all source positions (eos included: a row sums to 1), eos's row too;
- hard: `(source, output)` pairs, one per output token other than eos: the source token it attends to
  most, the source eos left out (fairseq's `extract_hard_alignment` leaves out eos on both sides too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnlab.data.text import json_line, one_line
from attnlab.data.tokenizer import EOS_ID

if TYPE_CHECKING:
    from torch import Tensor

    from attnlab.data.tokenizer import SubwordTokenizer
    from attnlab.decoding.search import Hypothesis

SOFT_DECIMALS = 6  # decimals of the soft alignment weights written


@dataclass(frozen=True)
class Candidate:
    """One hypothesis of an n-best list.

    Attributes:
        text: The detokenized translation (eos removed), as `Translator.translate` gives it.
        tokens: Its subword pieces, "</s>" last when it ended with eos.
        ids: Their ids.
        score: Sum of the tokens' log-probabilities (natural log, eos included).
        normalized: The length-normalised score hypotheses are ranked by (`Hypothesis.normalized`).
        token_scores: Each token's log-probability (natural log), one per token.
        alignment: With `decode.print_alignment`: `hard`, the `(source, output)` position pairs; `soft`,
            one row of source weights per token (see the module docstring); else None.
    """

    text: str
    tokens: list[str]
    ids: list[int]
    score: float
    normalized: float
    token_scores: list[float]
    alignment: list[tuple[int, int]] | list[list[float]] | None = None

    @property
    def ended(self) -> bool:
        """Whether it ended with eos (not cut at the length limit)."""
        return bool(self.ids) and self.ids[-1] == EOS_ID

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this hypothesis (`alignment` only when there is one)."""
        out: dict[str, Any] = {
            "text": self.text, "tokens": self.tokens, "ids": self.ids, "score": self.score,
            "normalized": self.normalized, "token_scores": self.token_scores,
        }  # fmt: skip
        if self.alignment is not None:
            out["alignment"] = [list(pair) for pair in self.alignment]
        return out


@dataclass(frozen=True)
class NBest:
    """The n-best list of one source sentence.

    Attributes:
        index: The sentence's line number in its input (from 0).
        source: The source line.
        source_tokens: The source's subword pieces as decoded (eos "</s>" last; cut to the source
            limit when it was longer); empty for a line without source tokens.
        hypotheses: Best first; empty for a line without source tokens (it translates to "").
        reference: The reference translation, when scoring a test set.
    """

    index: int
    source: str
    source_tokens: list[str]
    hypotheses: list[Candidate]
    reference: str | None = None

    @property
    def best(self) -> str:
        """The 1-best translation ("" when there are no hypotheses)."""
        return self.hypotheses[0].text if self.hypotheses else ""

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this list (`reference` only when there is one)."""
        out: dict[str, Any] = {
            "index": self.index,
            "source": self.source,
            "source_tokens": self.source_tokens,
        }
        if self.reference is not None:
            out["reference"] = self.reference
        out["hypotheses"] = [h.to_json() for h in self.hypotheses]
        return out


def hard_alignment(attention: Tensor, ids: Sequence[int], eos_id: int) -> list[tuple[int, int]]:
    """`(source, output)` position pairs: for each output token but eos, the source position (the
    source's eos, its last, left out) with the most weight in its row of `attention` (T, S_real)."""
    if attention.size(1) < 2:  # only eos in the source: nothing to align to
        return []
    best = attention[:, :-1].argmax(dim=1).tolist()  # (T,)
    return [(best[j], j) for j, token in enumerate(ids) if token != eos_id]


def soft_alignment(attention: Tensor) -> list[list[float]]:
    """Every row of `attention` (T, S_real), rounded to `SOFT_DECIMALS` decimals."""
    return [[round(w, SOFT_DECIMALS) for w in row] for row in attention.float().tolist()]


def candidate(hypothesis: Hypothesis, tokenizer: SubwordTokenizer, alignment: str | None) -> Candidate:
    """The `Candidate` of a beam-search `Hypothesis` (with `alignment` hard or soft: from its attention)."""
    aligned = None
    if alignment is not None and hypothesis.attention is not None:
        attention = hypothesis.attention
        aligned = (hard_alignment(attention, hypothesis.tokens, EOS_ID) if alignment == "hard"
                   else soft_alignment(attention))  # fmt: skip
    return Candidate(
        text=tokenizer.decode(hypothesis.tokens),
        tokens=tokenizer.id_pieces(hypothesis.tokens),
        ids=list(hypothesis.tokens),
        score=float(hypothesis.score),
        normalized=float(hypothesis.normalized),
        token_scores=[float(s) for s in hypothesis.token_scores],
        alignment=aligned,
    )


def nbest_text(nbest: NBest, nbest_format: str) -> str:
    """The text of one n-best list in `nbest_format` (newline-terminated):

    - `jsonl`: one line, the JSON object of `NBest.to_json` (`attnlab.data.text.json_line`: UTF-8 text,
      not escaped, but for the line breaks U+0085, U+2028 and U+2029);
    - `fairseq`: fairseq-generate's lines, tab-separated: `S-i` the source, `T-i` the reference (when
      known), then per hypothesis best first `H-i` its normalized score and pieces without eos, `D-i` the
      same normalized score and the detokenized text, `P-i` each token's log-probability (eos included),
      and with an alignment `A-i` (hard: `source-output` pairs; soft: per token its weights joined by
      commas). Scores there are in base 2, as fairseq prints them (JSON Lines: natural log). A line
      break or a tab inside a field's text (a raw source or reference may hold a tab, a lone "\\r",
      U+0085, U+2028 or U+2029) is written as a space (`attnlab.data.text.one_line`), so that each of
      these lines stays one line, of the same fields, for readers that split on universal newlines or on
      tabs (JSON Lines escapes them).
    """
    if nbest_format == "jsonl":
        return json_line(nbest.to_json())
    i, lines = nbest.index, [[f"S-{nbest.index}", nbest.source]]
    if nbest.reference is not None:
        lines.append([f"T-{i}", nbest.reference])
    for h in nbest.hypotheses:
        score = f"{h.normalized / math.log(2)}"
        pieces = h.tokens[:-1] if h.ended else h.tokens
        lines.append([f"H-{i}", score, " ".join(pieces)])
        lines.append([f"D-{i}", score, h.text])
        lines.append([f"P-{i}", " ".join(f"{s / math.log(2):.4f}" for s in h.token_scores)])
        if h.alignment is not None:  # hard: (source, output) tuples; soft: rows of weights
            pairs = all(isinstance(a, tuple) for a in h.alignment)
            cells = (
                f"{a[0]}-{a[1]}" if pairs else ",".join(f"{w:.{SOFT_DECIMALS}f}" for w in a)
                for a in h.alignment
            )
            lines.append([f"A-{i}", " ".join(cells)])
    return "".join("\t".join(map(one_line, fields)) + "\n" for fields in lines)
