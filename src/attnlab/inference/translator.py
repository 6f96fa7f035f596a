"""Translating text with a trained model, and scoring test sets into `results.json`.

`Translator` wraps a `Transformer` with its source and target tokenizers and a `DecodeConfig`: lines in,
detokenized lines out, decoded in token-limited batches of similar source length (sorted, then put back
in input order). `Translator.nbest` gives each line's n-best list (`attnlab.inference.nbest.NBest`: the
hypotheses with their scores and alignments). `Translator.stream` and `Translator.stream_nbest` read an
iterable of any length in chunks, so memory stays bounded whatever the input size. `score_sets` decodes
named test sets and scores them with sacreBLEU against the raw references, and with the paper's
tokenized compound-split BLEU (`attnlab.metrics.bleu_tok_compound`), into an `Evaluation` (a value),
which `Evaluation.write` puts into a run directory (`results.json`, hypotheses, references, sources and
n-best lists, together); `evaluate` does both. `attnlab-train` (at the end of training) and
`attnlab-eval` go through them.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import torch

from attnlab.data.batching import TokenBatchSampler, cut_source, pad
from attnlab.data.corpora import CorpusData
from attnlab.data.text import plural
from attnlab.data.tokenizer import SubwordTokenizer
from attnlab.decoding import DecodeConfig
from attnlab.decoding.ensemble import Ensemble
from attnlab.decoding.search import nbest_decode, translate
from attnlab.decoding.settings import NBEST_FORMATS, NBEST_KEYS, SAMPLING_KEYS, TRAINING_ONLY
from attnlab.inference.nbest import NBest, candidate, nbest_text
from attnlab.io import WriteError, write_fix
from attnlab.metrics import MetricsConfig, ScoringError, bleu_tok_compound, moses_rules, score_all
from attnlab.model.transformer import Transformer
from attnlab.runs.checkpoint import (
    BUNDLE_KEY,
    CheckpointError,
    check_weights_fit,
    model_weights,
    read_averaged,
    saved_settings,
)
from attnlab.runs.layout import (
    CHECKPOINTS_DIR,
    HYPOTHESES_DIR,
    REFERENCES_DIR,
    RESULTS_FILE,
    SOURCES_DIR,
    RunDir,
    nbest_file,
)
from attnlab.runs.results import results_bytes
from attnlab.typed import check_chunk_lines, is_int, language_subtag

log = logging.getLogger(__name__)


def pick_device(device: str) -> torch.device:
    """`auto`: the first CUDA GPU when there is one, else the CPU; otherwise `device` as given.

    Raises:
        ValueError: `device` names no device (`gpu`), a CUDA device where torch has none, the `meta`
            device (shapes without values), or a device torch cannot use here (`mps` off a Mac, `xpu`
            without its build, `cuda:7` past the GPUs): a tensor made there fails.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device={device!r} is not a device: use auto, cpu, cuda or cuda:N") from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device}, but torch finds no CUDA GPU here: use device=cpu (or auto)")
    if chosen.type == "meta":
        raise ValueError(f"device={device} holds shapes, not values, so nothing decodes there: use "
                         "device=cpu (or auto)")  # fmt: skip
    try:
        torch.empty(1, device=chosen)
    except Exception as exc:  # by backend a RuntimeError, an AssertionError, a ModuleNotFoundError, ...
        detail = (str(exc).strip().splitlines() or [""])[0].split(". ")[0][:200]  # its first sentence
        raise ValueError(f"device={device} cannot be used here ({type(exc).__name__}: {detail}): use "
                         "device=cpu (or auto)") from None  # fmt: skip
    return chosen


class Translator:
    """A model ready to translate: weights in eval mode, tokenizers and decoding settings.

    Args:
        model: The Transformer, or an `Ensemble` of several (put in eval mode; left on its device).
        src_tokenizer: Tokenizer of the source language.
        tgt_tokenizer: Tokenizer of the target language (for detokenizing outputs).
        decode: Beam size, length penalty, length limits and batch sizes.
        data: The data settings the model was trained with (from its checkpoint), if known: its
            `max_source_tokens` is the default source limit, its `tgt_lang` the `target_lang`.
        metrics: How `score_sets` scores its translations (the BLEU tokenizer); default `MetricsConfig()`.
    """

    def __init__(
        self,
        model: Transformer,
        src_tokenizer: SubwordTokenizer,
        tgt_tokenizer: SubwordTokenizer,
        decode: DecodeConfig,
        data: dict[str, Any] | None = None,
        metrics: MetricsConfig | None = None,
    ) -> None:
        self.model = model.eval()
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.decode = decode
        self.data = data
        self.metrics = metrics or MetricsConfig()
        self.truncated = 0  # sources cut to fit a learned position table
        self.unfinished = 0  # translations that ran to their length limit without eos (`translate`)

    @property
    def ensemble(self) -> bool:
        """Whether the model is an `Ensemble` (decoded combined per step)."""
        return isinstance(self.model, Ensemble)

    @classmethod
    def from_checkpoints(
        cls,
        paths: Sequence[str | Path],
        decode: DecodeConfig | None = None,
        device: str = "cpu",
        *,
        ensemble: bool = False,
        decode_overrides: dict[str, Any] | None = None,
    ) -> Translator:
        """A translator from one checkpoint, from the average of several (same model and tokenizers), or
        with `ensemble=True` from an `Ensemble` of them (each its own model, combined at every decoding
        step; they must share tokenizers, and may differ in architecture).

        `decode` defaults to the decoding settings saved in the (first) checkpoint, and the scoring and
        data settings are the first one's too (`MetricsConfig()` for a checkpoint without them).
        `decode_overrides` (the `decode.*` of attnlab-eval and attnlab-translate) are applied to the first
        checkpoint's saved settings as `decode_settings` applies them (`_decode`: a saved value this version
        refuses can be replaced by one), and the other members of an ensemble take the result.

        Raises:
            attnlab.runs.checkpoint.CheckpointError: A checkpoint is missing, damaged, not from attnlab-train,
                or refused (`attnlab.runs.checkpoint.read_checkpoint`: nothing in a checkpoint runs), or
                ensembled checkpoints have different tokenizers or languages (named).
            ValueError: A bad decoding override.
        """
        if decode is not None and decode_overrides is not None:
            raise ValueError("give the decoding settings (decode) or overrides of the saved ones, not both")
        chosen = decode if decode is not None else decode_overrides  # settings, or overrides (`_decode`)
        if not ensemble:
            return cls._from_checkpoint(read_averaged(paths), paths, chosen, device)
        if not paths:
            raise CheckpointError("an ensemble needs at least one checkpoint")
        members: list[Translator] = []
        for path in paths:  # the decoding settings are the first one's (with the overrides), as is the rest
            members.append(cls._from_checkpoint(read_averaged([path]), [path], chosen, device))
            chosen = members[0].decode
        first = members[0]
        for path, member in zip(paths[1:], members[1:], strict=True):
            _check_same_languages(first, member, paths[0], path)
            for side in ("src", "tgt"):
                mine, theirs = getattr(member, f"{side}_tokenizer"), getattr(first, f"{side}_tokenizer")
                if mine.to_json() != theirs.to_json():
                    raise CheckpointError(
                        f"{path} has another {'source' if side == 'src' else 'target'} tokenizer than "
                        f"{paths[0]} (vocabularies of {mine.vocab_size} and {theirs.vocab_size} subwords"
                        f"{'' if mine.vocab_size != theirs.vocab_size else ', different subwords'}): the "
                        "models of an ensemble must share their tokenizers and vocabularies"
                    )
        try:
            model = Ensemble([member.model for member in members])
        except ValueError as exc:
            raise CheckpointError(f"{', '.join(map(str, paths))}: {exc}") from None
        return cls(model, first.src_tokenizer, first.tgt_tokenizer, first.decode, data=first.data,
                   metrics=first.metrics)  # fmt: skip

    @classmethod
    def _from_checkpoint(
        cls,
        checkpoint: dict[str, Any],
        paths: Sequence[str | Path],
        decode: DecodeConfig | dict[str, Any] | None,
        device: str,
    ) -> Translator:
        """The translator of one checkpoint's content (read from `paths`, several when averaged)."""
        bundle = checkpoint[BUNDLE_KEY]
        if bundle.get("src_tokenizer") is None or bundle.get("tgt_tokenizer") is None:
            raise CheckpointError(
                f"{paths[0]} holds no tokenizers: its model was trained on data without text "
                "(data=synthetic), so it cannot translate text"
            )
        config = saved_settings(checkpoint, "model", paths[0])
        check_weights_fit(config, checkpoint["state_dict"], paths[0])  # before anything is allocated
        model = Transformer(config)
        model.load_state_dict(model_weights(checkpoint["state_dict"]))  # keys and shapes checked above
        data = bundle.get("data")
        limit = (data or {}).get("max_source_tokens")  # the default source limit (`source_limit`)
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 2):
            error = ValueError("a source length limit is a whole number of at least 2 (a token and eos)")
            raise _damaged(paths, f"its data.max_source_tokens={limit!r}", error)
        tokenizers = []
        for side in ("src_tokenizer", "tgt_tokenizer"):
            try:
                tokenizers.append(SubwordTokenizer.from_json(bundle[side]))
            except Exception as exc:  # the tokenizers library raises a bare Exception on bad JSON
                raise _damaged(paths, f"its {side} is not a valid tokenizer", exc) from None
        _check_vocabularies(tokenizers, config, paths)
        model.to(pick_device(device))
        return cls(
            model,
            *tokenizers,
            decode if isinstance(decode, DecodeConfig) else _decode(checkpoint, paths[0], decode),
            data=data,
            metrics=saved_settings(checkpoint, "metrics", paths[0]),
        )

    @property
    def target_lang(self) -> str | None:
        """The language the model translates into: the language subtag of `tgt_lang` in its data settings
        (`attnlab.typed.language_subtag`: `en_US` and `EN` are `en`); None when unknown (no data settings,
        data without languages, or a placeholder such as `data=files`' default `tgt`)."""
        return language_subtag((self.data or {}).get("tgt_lang"))

    def source_limit(self) -> tuple[int, str]:
        """The longest source decoded (in ids, eos included) and what sets it, for messages: the
        model's `max_positions` when a learned position table is smaller (`TransformerConfig.length_limit`),
        else `decode.max_source_tokens`, which defaults to the training filter's `data.max_source_tokens`
        (256, `CorpusData`'s default, when the data settings are unknown)."""
        limit, what = self.decode.max_source_tokens, "decode.max_source_tokens={}"
        if limit is None:
            limit = (self.data or {}).get("max_source_tokens")
            what = "data.max_source_tokens={} (the training filter's limit; set decode.max_source_tokens)"
        if limit is None:
            limit = CorpusData.max_source_tokens
            what = "the default decode.max_source_tokens={} (the data settings are unknown)"
        fitted = self.model.config.length_limit(int(limit))
        return (fitted, "the model's max_positions") if fitted < limit else (int(limit), what.format(limit))

    def _source_ids(self, lines: Sequence[str]) -> list[list[int]]:
        """The source ids of `lines`, eos appended, each cut to `source_limit()` (keeping eos) and
        counted in `self.truncated`."""
        eos, (limit, _) = self.model.config.eos_id, self.source_limit()
        ids = [[*row, eos] for row in self.src_tokenizer.encode_batch(lines)]
        self.truncated += sum(len(row) > limit for row in ids)
        return [cut_source(row, limit, eos) for row in ids]

    def _decoded(
        self, ids: list[list[int]], decode: Callable[[torch.Tensor], list[Any]]
    ) -> Iterator[tuple[int, Any]]:
        """`(line, output)` for each source in `ids` with more than eos, decoded by `decode` (padded
        source ids -> one output per row) in token-limited batches of similar length."""
        todo = [i for i, row in enumerate(ids) if len(row) > 1]  # more than eos
        if not todo:
            return
        cfg, device = self.decode, next(self.model.parameters()).device
        sampler = TokenBatchSampler([len(ids[i]) for i in todo], max_tokens=cfg.max_tokens,
                                    batch_size=cfg.batch_size, shuffle=False)  # fmt: skip
        for batch in sampler:
            rows = [todo[j] for j in batch]
            src = pad([ids[i] for i in rows], self.model.config.pad_id).to(device)
            yield from zip(rows, decode(src), strict=True)

    def translate(self, lines: Sequence[str]) -> list[str]:
        """Detokenized translations of `lines`, in their order. A line without source tokens (empty or
        whitespace only) translates to an empty line, without decoding. Translations that ran to their
        length limit without eos are counted in `self.unfinished`.

        Raises:
            TypeError: `lines` is one `str` (or bytes) rather than a sequence of lines: `translate([text])`
                translates one text; or a line is no `str` (named by its index and type). So do `nbest`,
                `stream` and `stream_nbest` (`_checked_lines`).
        """
        lines = list(_checked_lines(lines, "translate"))
        out = [""] * len(lines)
        unfinished: list[int] = []

        def decode(src: torch.Tensor) -> list[list[int]]:
            return translate(self.model, src, self.decode, unfinished=unfinished)

        for i, row in self._decoded(self._source_ids(lines), decode):
            out[i] = self.tgt_tokenizer.decode(row)
        self.unfinished += len(unfinished)
        return out

    def nbest(
        self, lines: Sequence[str], *, start: int = 0, references: Sequence[str] | None = None
    ) -> list[NBest]:
        """The n-best list of each line, in their order: its `decode.nbest` best hypotheses (1 when
        null) with their scores, and with `decode.print_alignment` their alignments. The first
        hypothesis is the translation `translate` gives (`nbest_decode`; with alignments the decoder
        computes its attention weights explicitly, the same outputs up to float rounding). A line
        without source tokens gets no hypotheses. `start` is the index of the first line,
        `references` their reference translations (for test sets), one a line. Lines are checked as
        `translate` checks them, and so are references.

        Raises:
            TypeError: As `translate` raises it, for `lines` or `references`.
            ValueError: `references` has not one reference a line.
        """
        lines = list(_checked_lines(lines, "nbest"))
        if references is not None:
            references = list(_checked_lines(references, "nbest", "reference"))
            if len(references) != len(lines):
                told = f"{len(references)} references for {len(lines)} lines"
                raise ValueError(f"Translator.nbest: {told}: give one reference a line, in their order")
        cfg, ids = self.decode, self._source_ids(lines)
        n_best, alignment = cfg.nbest or 1, cfg.print_alignment
        hypotheses: list[list[Any]] = [[] for _ in lines]

        def decode(src: torch.Tensor) -> list[Any]:
            return nbest_decode(self.model, src, cfg, n_best=n_best, need_attention=alignment is not None)

        for i, hyps in self._decoded(ids, decode):
            hypotheses[i] = [candidate(h, self.tgt_tokenizer, alignment) for h in hyps]
        # the translations (first hypotheses) that ran to their length limit, as `translate` counts them
        self.unfinished += sum(1 for hyps in hypotheses if hyps and not hyps[0].ended)
        return [
            NBest(start + i, line, self.src_tokenizer.id_pieces(ids[i]) if len(ids[i]) > 1 else [],
                  hypotheses[i], None if references is None else references[i])
            for i, line in enumerate(lines)
        ]  # fmt: skip

    def stream(self, lines: Iterable[str], chunk_lines: int = 2048) -> Iterator[str]:
        """Translations of `lines` in input order, read and decoded `chunk_lines` at a time.

        At most `chunk_lines` inputs and outputs are held at once, so a file of any length streams
        through in bounded memory; each chunk is sorted by length for batching. When reading `lines`
        fails (e.g. a line that is not UTF-8, or one that is no `str`), the lines read before it are
        translated first, then the error is raised.

        Raises:
            TypeError: At the call, `lines` is one `str` (or bytes), or `chunk_lines` is no integer (a bool
                or a float; a NumPy integer is one); while reading, a line that is no `str` (`translate` says
                more).
            ValueError: At the call, `chunk_lines` < 1.
        """
        chunks = _chunks(lines, chunk_lines, "stream")
        return (line for _, chunk in chunks for line in self.translate(chunk))

    def stream_nbest(self, lines: Iterable[str], chunk_lines: int = 2048) -> Iterator[NBest]:
        """The n-best lists (`nbest`) of `lines` in input order, indexed from 0, read and decoded
        `chunk_lines` at a time, as `stream` does (and refusing what it refuses)."""
        chunks = _chunks(lines, chunk_lines, "stream_nbest")
        return (n for start, chunk in chunks for n in self.nbest(chunk, start=start))


def _checked_lines(lines: Iterable[str], method: str, item: str = "line") -> Iterator[str]:
    """The lines of `lines`, each checked to be a `str` as it is read (a stream stays lazy), for
    `Translator.<method>`; `item` names them in the messages (`reference` for `nbest`'s references).

    Raises:
        TypeError: At once, `lines` is one `str` (or bytes): iterated, each character would be translated
            as a line (taken as a line's reference); the message names the fix, `<method>([text])`
            (`references=[text]`). While reading, a line is no `str` (bytes, None, a number): named by its
            index from 0 and its type.
    """
    if isinstance(lines, (str, bytes, bytearray)):
        kind = type(lines).__name__
        if item == "line":
            raise TypeError(f"Translator.{method} takes a sequence of lines, not a single {kind} (each "
                            f"character would be translated as a line): use {method}([text])")  # fmt: skip
        raise TypeError(f"Translator.{method} takes {item}s as a sequence, not a single {kind} (each "
                        f"character would be taken as a line's {item}): use {item}s=[text]")  # fmt: skip
    return (_line(index, line, method, item) for index, line in enumerate(lines))


def _line(index: int, line: Any, method: str, item: str = "line") -> str:
    """`line`, the `item` at `index` given to `Translator.<method>`, when it is a `str` (`_checked_lines`)."""
    if not isinstance(line, str):
        raise TypeError(
            f"Translator.{method}: {item} {index} (from 0) is a {type(line).__name__}, not a str: give text "
            "lines only (decode bytes first, line.decode('utf-8'))"
        )
    return line


def _chunks(lines: Iterable[str], chunk_lines: int, method: str) -> Iterator[tuple[int, list[str]]]:
    """The lines of `lines` (`_checked_lines` for `Translator.<method>`) without their line ends,
    `chunk_lines` at a time, each chunk with the index of its first line. `lines` and `chunk_lines` are
    checked at the call, each line as it is read. When reading fails, the lines read before are yielded
    first, then the error is raised.

    Raises:
        TypeError: `chunk_lines` is no integer (a bool, a float; an int or a NumPy integer is one:
            `check_chunk_lines`), or `_checked_lines` refuses `lines`.
        ValueError: `chunk_lines` < 1.
    """
    chunk_lines = check_chunk_lines(chunk_lines)
    return _read_chunks((line.rstrip("\r\n") for line in _checked_lines(lines, method)), chunk_lines)


def _read_chunks(lines: Iterator[str], chunk_lines: int) -> Iterator[tuple[int, list[str]]]:
    """`_chunks` once checked: `(start, chunk)` of up to `chunk_lines` lines, the lines read before a
    failed read yielded first, then its error raised."""
    start = 0
    while True:
        chunk: list[str] = []
        try:
            chunk.extend(islice(lines, chunk_lines))
        except Exception:
            yield start, chunk
            raise
        if not chunk:
            return
        yield start, chunk
        start += len(chunk)


def _check_same_languages(first: Translator, member: Translator, first_path: Path, path: Path) -> None:
    """Refuse a member of an ensemble trained between other languages than the first (a de->fr model
    beside a de->en one, sharing a tokenizer file): their probabilities would be mixed into neither
    language. Languages compare by subtag (`language_subtag`, as attnlab-eval compares data); a placeholder
    such as `src` matches any."""
    for key in ("src_lang", "tgt_lang"):
        codes = [language_subtag((t.data or {}).get(key)) for t in (first, member)]
        if None not in codes and codes[0] != codes[1]:
            directions = [f"{(t.data or {}).get('src_lang')} -> {(t.data or {}).get('tgt_lang')}"
                          for t in (first, member)]  # fmt: skip
            raise CheckpointError(
                f"{path} was trained to translate {directions[1]}, but {first_path} {directions[0]}: the "
                "models of an ensemble must translate between the same languages"
            )


def _check_vocabularies(tokenizers: list[SubwordTokenizer], config: Any, paths: Sequence[str | Path]) -> None:
    """Refuse tokenizers with more subwords than the model's vocabulary of their side (attnlab-train sizes
    the model by its tokenizers): source ids past it failed decoding with an IndexError, and a larger target
    tokenizer is another vocabulary's."""
    sizes = (config.src_vocab_size, config.tgt_vocab_size)
    for tokenizer, side, size in zip(tokenizers, ("source", "target"), sizes, strict=True):
        if tokenizer.vocab_size > size:
            raise CheckpointError(
                f"{paths[0]}: its {side} tokenizer has {tokenizer.vocab_size} subwords, more than the "
                f"model's {side} vocabulary of {size}: its tokenizers are not its model's — the file is "
                "damaged or not written by attnlab-train; use another checkpoint"
            )


def _damaged(paths: Sequence[str | Path], what: str, exc: Exception) -> CheckpointError:
    """The `CheckpointError` for checkpoint content that cannot be used: names the file(s), `what` is
    wrong and the first line of the error."""
    files = str(paths[0])
    if len(paths) > 1:
        files += f" (averaged with {', '.join(map(str, paths[1:]))})"
    lines = [line.strip() for line in str(exc).strip().splitlines()] or [""]
    detail = (lines[1] if lines[0].endswith(":") and len(lines) > 1 else lines[0])[:200]  # torch: a header
    return CheckpointError(
        f"{files}: {what} ({type(exc).__name__}: {detail}) — the file is damaged or not written by "
        "attnlab-train; use another checkpoint"
    )


@dataclass(frozen=True)
class Evaluation:
    """What an evaluation produced, before anything is written: the content of `results.json`, and per
    test set its hypotheses, references and sources (lines), and its n-best lists when asked for
    (`DecodeConfig.writes_nbest`), written in `nbest_format`.

    `write` puts them into a run directory together (`results.json`, `hypotheses/<set>.txt`,
    `references/<set>.txt`, `sources/<set>.txt`, `nbest/<set>.jsonl` or `.txt`): a failed write leaves
    every file there before unchanged, so all of them always belong to the same evaluation; after a
    successful one, an n-best file an earlier evaluation left for a set scored again (without n-best
    lists, or in the other format) is removed.
    """

    results: dict[str, Any]
    hypotheses: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    references: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    sources: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    nbest: dict[str, list[NBest]] = dataclasses.field(default_factory=dict)
    nbest_format: str = "jsonl"

    def with_results(self, **entries: Any) -> Evaluation:
        """A copy with `entries` added to the results (e.g. `metrics=...`)."""
        return dataclasses.replace(self, results={**self.results, **entries})

    def write(self, run: RunDir | str | Path) -> None:
        """Write every file of the evaluation into the run directory at once (`RunDir.write_files`).

        Raises:
            WriteError: A file cannot be written (a full disk): named, with every file there unchanged.
        """
        files: dict[str, bytes] = {}
        written = ((HYPOTHESES_DIR, self.hypotheses), (REFERENCES_DIR, self.references),
                   (SOURCES_DIR, self.sources))  # fmt: skip
        for directory, sets in written:
            for name, lines in sets.items():
                files[f"{directory}/{name}.txt"] = "".join(f"{line}\n" for line in lines).encode("utf-8")
        for name, lists in self.nbest.items():
            text = "".join(nbest_text(n, self.nbest_format) for n in lists)
            files[nbest_file(name, self.nbest_format)] = text.encode("utf-8")
        files[RESULTS_FILE] = results_bytes(self.results)
        run = run if isinstance(run, RunDir) else RunDir(Path(run))
        try:
            run.write_files(files)
        except OSError as exc:
            raise WriteError(
                exc.errno,
                f"cannot write {exc.filename or run.path}: {exc.strerror or exc}; the evaluation's "
                f"results.json, hypotheses, references and sources in {run.path} are as they were. "
                f"{write_fix(exc)}",
            ) from exc
        for name in self.hypotheses:  # an earlier evaluation's n-best list of a set scored again now
            for nbest_format in NBEST_FORMATS:
                if nbest_file(name, nbest_format) not in files:
                    (run.path / nbest_file(name, nbest_format)).unlink(missing_ok=True)


def score_sets(
    translator: Translator,
    sets: dict[str, tuple[Sequence[str], Sequence[str]]],
    *,
    checkpoints: Sequence[str | Path] = (),
    extra: dict[str, Any] | None = None,
) -> Evaluation:
    """Decode and score each named set (nothing is written: see `Evaluation.write`, or `evaluate`).

    Args:
        translator: The model to evaluate.
        sets: Set name -> (raw source lines, raw reference lines).
        checkpoints: The checkpoint file(s) the weights came from (several: averaged, or the models of
            an ensemble when `translator.ensemble`).
        extra: More top-level entries for the results (e.g. test loss).

    Returns:
        The `Evaluation`; its results hold per set the BLEU, chrF and TER with their sacreBLEU signatures
        (BLEU tokenized by `translator.metrics.bleu_tokenize`, also under `scoring`), the
        paper's tokenized compound-split BLEU `bleu_tok_compound` (not comparable to sacreBLEU) with the
        signature of its procedure (naming the Moses language used), sentence count, hypotheses and
        references files (relative to the run directory) and decoding time, plus the decoding settings and
        checkpoints (`averaged` true when several were averaged; `ensemble` the list of ensembled ones,
        null when the model is no ensemble), `target_lang` (`Translator.target_lang`; null when unknown,
        and then English Moses rules tokenize for `bleu_tok_compound`, with a warning), and
        `truncated_sources` when sources were cut to `Translator.source_limit` (each set's count is
        logged as a warning), and per set `unfinished`, how many translations ran to their length limit
        without eos (`Translator.unfinished`; a warning when any did; of n-best lists, the first
        hypothesis counts). With
        `decode.nbest` or `decode.print_alignment` (`DecodeConfig.writes_nbest`), each set's n-best
        lists (`Translator.nbest`, with the references) too, named under `nbest` in its results; its
        hypotheses and scores are then those of their first hypotheses (one decode gives both).
    """
    lang = translator.target_lang
    if lang is None:
        log.warning("the target language is unknown (no language code in data.tgt_lang): bleu_tok_compound "
                    "tokenizes with Moses' English rules")  # fmt: skip
    elif not moses_rules(lang):
        log.warning("Moses has no rules of its own for language %r (data.tgt_lang): bleu_tok_compound "
                    "tokenizes with its default rules", lang)  # fmt: skip
    hypotheses_of: dict[str, list[str]] = {}
    references_of: dict[str, list[str]] = {}
    sources_of: dict[str, list[str]] = {}
    nbest_of: dict[str, list[NBest]] = {}
    nbest_format = translator.decode.nbest_format
    results: dict[str, Any] = {
        "checkpoints": [str(Path(p).resolve()) for p in checkpoints],
        "averaged": len(checkpoints) > 1 and not translator.ensemble,
        "ensemble": [str(Path(p).resolve()) for p in checkpoints] if translator.ensemble else None,
        "decode": translator.decode.to_dict(),
        "scoring": translator.metrics.to_dict(),
        "target_lang": lang,
        "sets": {},
    }
    for name, (sources, references) in sets.items():
        started, truncated, unfinished = time.perf_counter(), translator.truncated, translator.unfinished
        if translator.decode.writes_nbest:
            nbest_of[name] = translator.nbest(list(sources), references=list(references))
            hypotheses = [n.best for n in nbest_of[name]]
        else:
            hypotheses = translator.translate(list(sources))
        seconds = time.perf_counter() - started
        unfinished = _warn_of_cuts(translator, name, len(hypotheses), truncated, unfinished)
        hypotheses_of[name], references_of[name] = hypotheses, list(references)
        sources_of[name] = list(sources)
        scores, paper = _scored(name, hypotheses, list(references), translator.metrics, lang or "en")
        results["sets"][name] = {
            "bleu": scores["bleu"].score,
            "chrf": scores["chrf"].score,
            "ter": scores["ter"].score,
            "bleu_signature": scores["bleu"].signature,
            "chrf_signature": scores["chrf"].signature,
            "ter_signature": scores["ter"].signature,
            "bleu_details": scores["bleu"].details,
            "bleu_tok_compound": paper.score,
            "bleu_tok_compound_signature": paper.signature,
            "sentences": len(hypotheses),
            "hypotheses": f"{HYPOTHESES_DIR}/{name}.txt",
            "references": f"{REFERENCES_DIR}/{name}.txt",  # for paired significance tests later
            "sources": f"{SOURCES_DIR}/{name}.txt",  # for reports by source length
            "decode_seconds": round(seconds, 3),
        }
        results["sets"][name]["unfinished"] = unfinished
        if name in nbest_of:
            results["sets"][name]["nbest"] = nbest_file(name, nbest_format)
        log.info("%s: BLEU %.2f chrF %.2f TER %.2f (%d %s, %.1f s; %s); the paper's tokenized BLEU "
                 "%.2f (%s)", name, scores["bleu"].score, scores["chrf"].score, scores["ter"].score,
                 len(hypotheses), plural(len(hypotheses), "sentence"), seconds,
                 scores["bleu"].signature, paper.score, paper.signature)  # fmt: skip
    if translator.truncated:
        results["truncated_sources"] = translator.truncated
    results.update(copy.deepcopy(extra or {}))
    return Evaluation(results, hypotheses_of, references_of, sources_of, nbest_of, nbest_format)


def _scored(
    name: str, hypotheses: list[str], references: list[str], metrics: MetricsConfig, lang: str
) -> tuple[dict[str, Any], Any]:
    """sacreBLEU's scores (`score_all`) and the paper's tokenized BLEU (`bleu_tok_compound` in `lang`) of
    set `name`.

    Raises:
        ScoringError: The set cannot be scored (empty, subword markers, ...), its name in the message.
    """
    try:
        return score_all(hypotheses, references, metrics), bleu_tok_compound(hypotheses, references, lang)
    except ScoringError as exc:
        raise ScoringError(f"cannot score {name}: {exc}") from None


def _warn_of_cuts(translator: Translator, name: str, count: int, truncated: int, unfinished: int) -> int:
    """Log the sources of set `name` cut to the source limit and its `count` translations that ran to their
    length limit without eos, from the translator's counts before it (`truncated`, `unfinished`); returns
    the latter's number."""
    sources = translator.truncated - truncated
    if sources:
        log.warning("%s: %d %s cut to %s", name, sources, plural(sources, "source was", "sources were"),
                    translator.source_limit()[1])  # fmt: skip
    cut, decode = translator.unfinished - unfinished, translator.decode
    if cut:
        log.warning("%s: %d of %d %s ran to their length limit without eos (decode.max_len_a=%s, "
                    "max_len_b=%s, min_len=%s)", name, cut, count, plural(count, "translation"),
                    decode.max_len_a, decode.max_len_b, decode.min_len)  # fmt: skip
    return cut


def evaluate(
    translator: Translator,
    sets: dict[str, tuple[Sequence[str], Sequence[str]]],
    output_dir: str | Path,
    *,
    checkpoints: Sequence[str | Path] = (),
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`score_sets`, written into `output_dir` (`Evaluation.write`); returns what `results.json` holds."""
    evaluation = score_sets(translator, sets, checkpoints=checkpoints, extra=extra)
    evaluation.write(output_dir)
    return evaluation.results


def resolve_checkpoints(
    ckpt_path: str | Path | Sequence[str | Path], average_last: int | None = 0, ensemble: bool | None = False
) -> list[Path]:
    """The checkpoint file(s) a `ckpt_path` (and `average_last`, `ensemble`) of the CLIs stands for.

    - with `ensemble`, a list: each entry a file, or a run directory standing for its best checkpoint;
      the models of the ensemble (`Translator.from_checkpoints(..., ensemble=True)`);
    - a file: that file, or with `average_last=N` the last N epoch checkpoints of its run (averaged);
    - a run directory (or its `checkpoints/`): its best checkpoint `best-*.ckpt` (an error where a run
      kept several, `callbacks.model_checkpoint.save_top_k` > 1), or with `average_last=N` its last N
      epoch checkpoints.

    `average_last` and `ensemble` as the commands read them: null is 0 and false; anything but a whole
    number >= 0, and true or false, is refused (`ensemble=off`, a string to Hydra, was an ensemble).

    Raises:
        CheckpointError: Nothing usable at `ckpt_path`, a list without `ensemble` (or `ensemble` without
            a list, or with `average_last`), an `average_last` that is no whole number >= 0, an
            `ensemble` that is not true or false; the message says what was looked for or what to do.
    """
    average_last = 0 if average_last is None else average_last
    if not is_int(average_last) or average_last < 0:
        raise CheckpointError(
            f"average_last={average_last!r} must be a whole number >= 0 (the last N epoch checkpoints to "
            "average; 0: none)"
        )
    ensemble = False if ensemble is None else ensemble
    if not isinstance(ensemble, bool):
        raise CheckpointError(f"ensemble={ensemble!r} must be true or false")
    listed = ckpt_path is not None and not isinstance(ckpt_path, (str, Path))  # a list (or ListConfig)
    if listed and not ensemble:
        raise CheckpointError(
            f"ckpt_path is a list of {len(ckpt_path)} {plural(len(ckpt_path), 'checkpoint')}: add "
            "ensemble=true to decode with their models combined at every step (an ensemble), or give one "
            "checkpoint or run with average_last=N to average the weights of its last N epoch checkpoints"
        )
    if ensemble and not listed:
        raise CheckpointError(
            f"ensemble=true needs a list of checkpoints or runs, ckpt_path=[a.ckpt,b.ckpt], not "
            f"ckpt_path={ckpt_path}"
        )
    if ensemble:
        if average_last:
            raise CheckpointError(
                f"ensemble=true combines models at decoding, average_last={average_last} averages one run's "
                "weights: use one of them (average_last=0 with an ensemble)"
            )
        if not ckpt_path:
            raise CheckpointError("ckpt_path=[] names no checkpoint")
        return [resolve_checkpoints(p)[0] for p in ckpt_path]
    return _one_checkpoint(ckpt_path, average_last)


def _one_checkpoint(ckpt_path: str | Path, average_last: int) -> list[Path]:
    """`resolve_checkpoints` of a single `ckpt_path`."""
    from attnlab.runs.checkpoint import last_kept_checkpoints

    if ckpt_path is None or str(ckpt_path) == "":
        raise CheckpointError("ckpt_path is required: a checkpoint file or a run directory")
    path = Path(ckpt_path).expanduser()
    if not path.exists():
        raise CheckpointError(f"ckpt_path={ckpt_path} does not exist")
    if average_last > 0:
        return last_kept_checkpoints(path.parent if path.is_file() else path, average_last)
    if not path.is_dir():  # a file (or a device, which `read_checkpoint` names: no run directory)
        return [path]
    for directory in (path / CHECKPOINTS_DIR, path):
        best = sorted(directory.glob("best-*.ckpt"))
        if len(best) > 1:  # save_top_k > 1 keeps several: their names do not say which scored best
            names = ", ".join(p.name for p in best)
            raise CheckpointError(
                f"{directory} holds {len(best)} best checkpoints ({names}), and their names do not say which "
                "scored best: give the one to use as ckpt_path=<file> (the run's log and metrics name its "
                "best epoch), or average_last=N to average the last N epoch checkpoints"
            )
        if best:
            return best
    raise CheckpointError(
        f"no best-*.ckpt under {path}: give a checkpoint file as ckpt_path, or average_last=N to average "
        "the run's last epoch checkpoints"
    )


def _chosen(cls: type, overrides: dict[str, Any] | None, key: str, what: str) -> dict[str, Any]:
    """The non-null `overrides` of settings class `cls` (config node `key`), each one of its fields."""
    fields = {f.name for f in dataclasses.fields(cls)}
    chosen = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = sorted(set(chosen) - fields)
    if unknown:
        known = ", ".join(sorted(fields))
        raise ValueError(f"{key}.{unknown[0]} is not a {what} setting: use one of {known}")
    return chosen


def metrics_settings(saved: MetricsConfig, overrides: dict[str, Any] | None) -> MetricsConfig:
    """The scoring settings saved in a checkpoint with the non-null `overrides` applied.

    Raises:
        ValueError: An override is not a `MetricsConfig` field or has a bad value, or the settings need a
            package that is not installed (checked after the overrides: a saved `ja-mecab` overridden by
            `13a` needs nothing).
    """
    chosen = _chosen(MetricsConfig, overrides, "metrics", "scoring")
    try:
        metrics = dataclasses.replace(saved, **chosen)
        metrics.check_available()
    except ValueError as exc:
        raise ValueError(f"metrics.{exc}") from None
    return metrics


def _decode(checkpoint: dict[str, Any], path: str | Path, overrides: dict[str, Any] | None) -> DecodeConfig:
    """A checkpoint's decoding settings with `overrides` applied (`decode_settings`).

    Saved settings this version accepts are read as `saved_settings` reads them (a key an older version
    did not save takes its default, an older `lenpen` becomes `alpha`) and the overrides applied to them.
    Saved settings it refuses (an older version's `max_len_a=inf`) are merged with the overrides as saved,
    and the result is checked: an override can replace the refused value.

    Raises:
        attnlab.runs.checkpoint.CheckpointError: The saved settings hold a value this version refuses, and
            no override replaces it (named, with the fix).
        ValueError: A bad override.
    """
    if overrides is None:
        return saved_settings(checkpoint, "decode", path)
    try:
        saved = saved_settings(checkpoint, "decode", path)
    except CheckpointError as refused:
        raw = checkpoint["hyper_parameters"].get("decode")
        if not isinstance(raw, dict) or not set(raw) <= {f.name for f in dataclasses.fields(DecodeConfig)}:
            raise  # damaged, or keys this version does not know: nothing to replace
        try:
            return decode_settings(raw, overrides)
        except (ValueError, TypeError) as exc:
            try:
                decode_settings({}, overrides)
            except (ValueError, TypeError) as alone:
                if str(alone) == str(exc):
                    raise exc from None  # the override is refused whatever was saved: its error
            raise CheckpointError(f"{refused}; replace it with decode.<name>=<value>") from None
    return decode_settings(saved.to_dict(), overrides)


def decode_settings(saved: dict[str, Any], overrides: dict[str, Any] | None) -> DecodeConfig:
    """The decoding settings saved in a checkpoint with the non-null `overrides` applied.

    The deprecated override `lenpen` (the GNMT α) replaces the saved `alpha` and `length_penalty`; an
    override of `length_penalty` to the other penalty without `alpha` takes that penalty's default α
    (0.6 for gnmt, 1.0 for fairseq), not the α saved for the other one. An
    override turning `sampling` on sets the saved `val_beam` (training's validation beam, unused outside
    training) to 1; one turning it off drops the saved `topk`, `topp` and `temperature` (for their
    defaults) unless they are given too. Training's validation settings (`settings.TRAINING_ONLY`) are
    refused as overrides: nothing here would use them. The saved
    `nbest`, `nbest_format` and `print_alignment` are not kept (a run trained with them would otherwise
    make every later attnlab-translate write n-best lists, with no override to turn them off: null keeps
    a saved value): n-best lists and alignments come only when, and as, the overrides ask for them.

    Raises:
        ValueError: An override is not a `DecodeConfig` field or has a bad value.
    """
    chosen = _chosen(DecodeConfig, overrides, "decode", "decoding")
    validation = sorted(set(TRAINING_ONLY) & set(chosen))
    if validation:
        raise ValueError(f"decode.{validation[0]} sets training's validation decodes, which attnlab-eval and "
                         "attnlab-translate do not run: leave it out (sets=[val] scores the validation "
                         "set)")  # fmt: skip
    fields = {f.name for f in dataclasses.fields(DecodeConfig)}
    if "lenpen" in chosen:
        fields -= {"alpha", "length_penalty"}
    elif chosen.get("length_penalty", saved.get("length_penalty")) != saved.get("length_penalty", "gnmt"):
        fields -= {"alpha"}  # another penalty without its alpha: that penalty's default, not the saved one
    if chosen.get("sampling") is True:
        chosen["val_beam"] = 1
    if chosen.get("sampling") is False:  # the saved sampling settings go with it, unless given again
        fields -= set(SAMPLING_KEYS)
    fields -= set(NBEST_KEYS)  # what this command writes, asked for here only
    return DecodeConfig(**{**{k: v for k, v in saved.items() if k in fields}, **chosen})
