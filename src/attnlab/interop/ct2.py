"""Translating with a model exported by `attnlab-export format=ctranslate2` (`pip install "attnlab[export]"`).

    from attnlab.interop.ct2 import CT2Translator

    translator = CT2Translator("exported/")              # CPU; compute_type="int8" etc. as CTranslate2 takes
    translator.translate(["Zwei Hunde spielen im Schnee."])   # ["Two dogs play in the snow."]

The exported model's vocabulary is attnlab's ids written as strings: `CT2Translator` encodes text with
the attnlab tokenizer saved beside it (eos appended, cut to the checkpoint's source limit, as
`attnlab.inference.translator.Translator` does), feeds the ids to `ctranslate2.Translator`, and decodes
the output ids with the target tokenizer. Decoding follows attnlab's rules: pad and bos are never
generated, the output limit is a·|S|+b per sentence (sentences of the same limit are decoded together),
`min_len` counts eos. The length penalty is CTranslate2's, fairseq's form (the score divided by
length^α): by default the exported checkpoint's `decode.alpha` when it decodes with
`decode.length_penalty=fairseq`, else 0 (GNMT's penalty has no equal in CTranslate2;
`attnlab_export.json` lists under `not_carried` what the export could not keep). Greedy and beam outputs
of float32 equal attnlab's with `decode.alpha=0` (tested). With α > 0 a few can differ: CTranslate2
ends a sentence's beam search once `beam` hypotheses are finished, attnlab once no live beam can still
outrank them. A checkpoint decoding with `decode.sampling=true` is exported with its `topk`, `topp` and
`temperature`, and `translate` then samples with them (`sampling=False` searches instead); CTranslate2
draws from its own random generator, so the samples are not attnlab's and not reproducible by seed.
"""

from __future__ import annotations

import json
import logging
import math
import struct
import typing
import warnings
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from attnlab.data.batching import cut_source
from attnlab.data.tokenizer import SubwordTokenizer
from attnlab.decoding.search import check_beam_memory, max_output_length
from attnlab.decoding.settings import SAMPLING_KEYS, DecodeConfig
from attnlab.interop.export import (
    EXPORT_EXTRA,
    EXPORTED_DECODE,
    SETTINGS_FILE,
    SOURCE_TOKENIZER_FILE,
    TARGET_TOKENIZER_FILE,
    ExportError,
)
from attnlab.typed import is_int, shown

log = logging.getLogger(__name__)
# The positions of an export written before they were recorded (`positions` of its settings): its MarianMT
# table held the model's `max_positions`, 1024 unless the model was trained with another.
OLDER_EXPORT_POSITIONS = 1024


# attnlab_export.json's fields CT2Translator reads besides the decoding settings: (name, least value,
# required); exports written before `positions` were recorded lack them
_SIZES = (("pad_id", 0, True), ("bos_id", 0, True), ("eos_id", 0, True), ("max_source_tokens", 1, True),
          ("positions", 1, False))  # fmt: skip
# DecodeConfig's integer fields: CTranslate2 takes them as C++ integers (`_MOST`)
_WHOLE = {name for name, kind in typing.get_type_hints(DecodeConfig).items() if kind is int}
_MOST = 2**31 - 1  # CTranslate2 takes sizes as C++ integers: a larger one is pybind11's TypeError


def checked_settings(settings: object, where: Path) -> None:
    """An ExportError naming the field unless `settings` (attnlab_export.json, read from `where`) holds
    every field `CT2Translator` reads with a value it can use: the file is the user's, and a damaged one
    must not surface as a KeyError, TypeError or CTranslate2's ValueError mid-translation.

    The decoding settings (`decode`'s beam, output limits, min_len, batch_size and, unless null, the
    sampling node's topk, topp and temperature) are checked by building the `DecodeConfig` they came from,
    so they obey attnlab's own rules (min_len at least 1, topp in (0, 1], beam 1 when sampling, ...);
    what is CTranslate2's is checked here: the token ids and sizes, integers of at least their least value,
    the optional `length_penalty` (its α, a finite number of at least 0), and every integer at most 2^31-1.
    (`checked_ids` and `checked_eos` check what needs the tokenizers and CTranslate2's config.json.)
    """
    top = _object(settings, "the file", where)
    for name, least, required in _SIZES:
        if required or name in top:
            value = _given(top, name, "", where)
            if not (is_int(value) and least <= value <= _MOST):
                _refuse(where, name, value, f"an integer of at least {least} and at most {_MOST}")
    decode = _object(top.get("decode"), "decode", where)
    given = {name: (f"decode.{name}", _given(decode, name, "decode.", where)) for name in EXPORTED_DECODE}
    if decode.get("sampling") is not None:
        sampling = _object(decode["sampling"], "decode.sampling", where)
        given.update({name: (f"decode.sampling.{name}", _given(sampling, name, "decode.sampling.", where))
                      for name in SAMPLING_KEYS})  # fmt: skip
    for name, (field, value) in given.items():
        if name in _WHOLE and is_int(value) and value > _MOST:
            _refuse(where, field, value, f"an integer of at most {_MOST}")
    if "length_penalty" in decode:
        value = _given(decode, "length_penalty", "decode.", where)
        if not (_finite(value) and value >= 0):
            _refuse(where, "decode.length_penalty", value, "a finite number of at least 0")
    try:
        with warnings.catch_warnings():  # what DecodeConfig only warns about was exported as it is
            warnings.simplefilter("ignore", UserWarning)
            DecodeConfig(**{name: value for name, (_, value) in given.items()}, sampling="topk" in given)
    except ValueError as exc:
        raise ExportError(
            f"{where}: decode holds settings attnlab does not decode with: {exc}; {_AGAIN}"
        ) from None


def checked_call(beam: Any, max_len_a: Any, max_len_b: Any, min_len: Any, batch_size: Any,
                 length_penalty: Any) -> None:  # fmt: skip
    """A ValueError naming the setting unless the decoding settings of a `translate_ids` call are ones
    attnlab decodes with: `beam`, `max_len_a`, `max_len_b` and `min_len` as `DecodeConfig` takes them,
    `batch_size` an integer of at least 0 (CTranslate2's 0: no limit), `length_penalty` (CTranslate2's
    α) a finite number of at least 0, `beam` at most 2^31-1. CTranslate2 took a NaN `max_len_a`
    or a negative `max_len_b` as one-token outputs and a NaN α as 0 without a word, and refused a
    negative `min_len` or `batch_size` or a fractional beam with pybind11's TypeError listing its
    signature."""
    if not (is_int(batch_size) and 0 <= batch_size <= _MOST):
        raise ValueError(f"batch_size={shown(batch_size)} must be a whole number of sentences, at least 0 "
                         f"(0: no limit) and at most {_MOST}")  # fmt: skip
    if not (_finite(length_penalty) and length_penalty >= 0):
        raise ValueError(f"length_penalty={shown(length_penalty)} must be a finite number of at least 0 "
                         "(CTranslate2's α: the score is divided by length^α; 0: none)")  # fmt: skip
    with warnings.catch_warnings():  # an unreachable min_len decodes as attnlab decodes it
        warnings.simplefilter("ignore", UserWarning)
        DecodeConfig(beam=beam, max_len_a=max_len_a, max_len_b=max_len_b, min_len=min_len)
    if beam > _MOST:
        raise ValueError(f"beam={beam} must be at most {_MOST} (CTranslate2 takes C++ integers)")


def _object(node: object, field: str, where: Path) -> dict[str, Any]:
    if not isinstance(node, dict):
        _refuse(where, field, node, "a JSON object")
    return node


def _given(node: dict[str, Any], name: str, parent: str, where: Path) -> Any:
    """`node[name]`, refused when missing or null."""
    if node.get(name) is None:
        _refuse(where, parent + name, None, "")
    return node[name]


def _finite(value: object) -> bool:
    """Whether `value` is a JSON number (not a bool) a float holds finitely (an int past 1.8e308 is not)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def checked_ids(settings: dict[str, Any], vocab_size: int, target_size: int, where: Path) -> None:
    """An ExportError unless pad_id, bos_id and eos_id are ids of the exported vocabulary (`vocab_size`, the
    smaller of the two) and a sampling `topk` is at most the `target_size` tokens it draws among, and its
    `topp` not 0 in float32: CTranslate2 raises a ValueError mid-translation for each. A pad_id or bos_id
    equal to eos_id is refused too: they are never generated, so no output would end before its limit."""
    for name in ("pad_id", "bos_id", "eos_id"):
        if settings[name] >= vocab_size:
            _refuse(where, name, settings[name], f"an id of the {vocab_size}-token vocabulary")
    for name in ("pad_id", "bos_id"):
        if settings[name] == settings["eos_id"]:
            _refuse(where, name, settings[name], "an id apart from eos_id's (pad and bos are never "
                    "generated: no output could end)")  # fmt: skip
    sampling = settings["decode"].get("sampling")
    if sampling is not None and sampling["topk"] > target_size:
        _refuse(where, "decode.sampling.topk", sampling["topk"],
                f"at most the {target_size} tokens of the target vocabulary (0: all of them)")  # fmt: skip
    if sampling is not None and struct.unpack("f", struct.pack("f", sampling["topp"]))[0] == 0:
        _refuse(where, "decode.sampling.topp", sampling["topp"], "a number that is not 0 in float32")


def checked_eos(settings: dict[str, Any], model_config: object, where: Path) -> None:
    """An ExportError unless eos_id is the end token of CTranslate2's `config.json` beside it (`model_config`,
    read from the export): another id of the vocabulary would translate, wrongly, up to the length limit."""
    token = model_config.get("eos_token") if isinstance(model_config, dict) else None
    if not isinstance(token, str):
        _refuse(where.with_name("config.json"), "eos_token", token, "CTranslate2's end token, a string")
    if str(settings["eos_id"]) != token:
        _refuse(where, "eos_id", settings["eos_id"], f"the end token of config.json beside it ({token!r})")


def _refuse(where: Path, field: str, value: object, wanted: str) -> NoReturn:
    """The ExportError for `field` (None: missing, or null)."""
    found = "is missing (or null)" if value is None else f"is {shown(value)}, not {wanted}"
    raise ExportError(f"{where}: {field} {found}; {_AGAIN}")


_AGAIN = (
    "the file is damaged or not attnlab's: export the checkpoint again with attnlab-export format=ctranslate2"
)


def _capped(groups: dict[int, list[int]], cap: int) -> dict[int, list[int]]:
    """Sentences grouped by output limit, each limit lowered to `cap`."""
    capped: dict[int, list[int]] = defaultdict(list)
    for limit, members in groups.items():
        capped[min(limit, cap)].extend(members)
    return capped


class CT2Translator:
    """Text in, text out with an exported CTranslate2 model and attnlab's tokenizers.

    Args:
        path: The directory `attnlab-export format=ctranslate2` wrote.
        device: `cpu`, `cuda` or `auto` (CTranslate2's).
        compute_type: CTranslate2's compute type (`default`: as stored, e.g. int8 for `quantization=int8`).
        intra_threads: Threads per translation (0: CTranslate2's default).
        ctranslate2_options: More keyword arguments for `ctranslate2.Translator`.

    Raises:
        ExportError: `path` holds no attnlab CTranslate2 export, its `attnlab_export.json` lacks a field
            translation reads or holds a value of the wrong kind (`checked_settings`), an id outside the
            vocabulary (`checked_ids`) or an end id other than CTranslate2's `config.json` (`checked_eos`),
            or ctranslate2 is not installed.
    """

    def __init__(self, path: str | Path, device: str = "cpu", compute_type: str = "default",
                 intra_threads: int = 0, **ctranslate2_options: Any) -> None:  # fmt: skip
        try:
            import ctranslate2
        except ImportError:
            raise ExportError(f"CT2Translator needs the ctranslate2 package: {EXPORT_EXTRA}") from None
        path = Path(path)
        try:
            self.settings = json.loads((path / SETTINGS_FILE).read_text(encoding="utf-8"))
            model_config = json.loads((path / "config.json").read_text(encoding="utf-8"))  # CTranslate2's
            self.src_tokenizer = SubwordTokenizer.from_json(
                (path / SOURCE_TOKENIZER_FILE).read_text(encoding="utf-8")
            )
            self.tgt_tokenizer = SubwordTokenizer.from_json(
                (path / TARGET_TOKENIZER_FILE).read_text(encoding="utf-8")
            )
        except Exception as exc:  # the files are the user's: json's RecursionError, tokenizers' own errors
            raise ExportError(
                f"{path} is not a directory written by attnlab-export format=ctranslate2 ({exc})"
            ) from None
        checked_settings(self.settings, path / SETTINGS_FILE)
        vocab = min(self.src_tokenizer.vocab_size, self.tgt_tokenizer.vocab_size)
        checked_ids(self.settings, vocab, self.tgt_tokenizer.vocab_size, path / SETTINGS_FILE)
        checked_eos(self.settings, model_config, path / SETTINGS_FILE)
        self.translator = ctranslate2.Translator(
            str(path), device=device, compute_type=compute_type, intra_threads=intra_threads,
            **ctranslate2_options,
        )  # fmt: skip

    def source_ids(self, lines: Sequence[str]) -> list[list[int]]:
        """attnlab's source ids of `lines`: eos appended, cut to the exported source limit."""
        eos, limit = self.settings["eos_id"], self.settings["max_source_tokens"]
        return [cut_source([*row, eos], limit, eos) for row in self.src_tokenizer.encode_batch(lines)]

    def translate_ids(
        self, ids: Sequence[Sequence[int]], beam: int | None = None, length_penalty: float | None = None,
        max_len_a: float | None = None, max_len_b: int | None = None, min_len: int | None = None,
        batch_size: int | None = None, sampling: bool | None = None,
    ) -> list[list[int]]:  # fmt: skip
        """Output ids (without eos) of source ids (each ending in eos). Settings left None are the
        exported checkpoint's decoding settings; `length_penalty` is CTranslate2's, and `sampling`
        (saved: the checkpoint's `decode.sampling`) draws each token with the saved `topk`, `topp` and
        `temperature` (see the module docstring).

        Raises:
            ValueError: `sampling` asked of an export whose checkpoint did not sample, or with beam > 1; a
                setting attnlab does not decode with (`checked_call`).
            ConfigError: On the CPU, a beam whose first step's scores cannot fit in the memory this
                process can take (`attnlab.decoding.search.check_beam_memory`), before CTranslate2 runs.
        """
        saved = self.settings["decode"]
        search = _search_options(saved, beam, length_penalty, sampling)
        a = saved["max_len_a"] if max_len_a is None else max_len_a
        b = saved["max_len_b"] if max_len_b is None else max_len_b
        min_len = saved["min_len"] if min_len is None else min_len
        batch_size = saved["batch_size"] if batch_size is None else batch_size
        checked_call(search["beam_size"], a, b, min_len, batch_size, search["length_penalty"])
        pad, bos, eos = (self.settings[k] for k in ("pad_id", "bos_id", "eos_id"))
        groups: dict[int, list[int]] = defaultdict(list)  # output limit -> sentences
        for i, row in enumerate(ids):
            groups[max_output_length(len(row), a, b)].append(i)
        positions = self.settings.get("positions", OLDER_EXPORT_POSITIONS)  # (older exports: not recorded)
        if max(groups, default=0) > positions:
            log.warning("max_len_a=%s, max_len_b=%s allow outputs of up to %d tokens, but this export "
                        "encodes %d positions: its outputs stop there (attnlab's would not)", a, b,
                        max(groups), positions)  # fmt: skip
            groups = _capped(groups, positions)
        out: list[list[int]] = [[] for _ in ids]
        for limit, members in groups.items():  # CTranslate2's lengths: eos counted in the max, not the min
            # a batch size far past the sentences made CTranslate2 fail with std::bad_alloc; 0: no limit
            at_once = len(members) if batch_size <= 0 else min(batch_size, len(members))
            self._check_memory(at_once, len(members), search["beam_size"], beam is None)
            results = self.translator.translate_batch(
                [[str(t) for t in ids[i]] for i in members],
                max_batch_size=min(batch_size, len(members)), **search, max_decoding_length=limit,
                min_decoding_length=min(min_len - 1, limit), max_input_length=0,
                suppress_sequences=[[str(pad)], [str(bos)]], end_token=str(eos),
            )  # fmt: skip
            for i, result in zip(members, results, strict=True):
                out[i] = [int(t) for t in result.hypotheses[0]]
        return out

    def _check_memory(self, at_once: int, sentences: int, beam: int, saved_beam: bool) -> None:
        """`check_beam_memory` for one `translate_batch` call on the CPU: batches of `at_once` of its
        `sentences`, as many at a time as CTranslate2 has translators (`inter_threads`), each holding its
        scores over the target vocabulary at the first step (its cache grows from empty, and the model's
        sizes are not in the export). The advice names only what lowers that count: the beam above 1, the
        batch size above 1, the translators side by side above 1 (not the length limit: it is not counted)."""
        if self.translator.device != "cpu":
            return
        batches = min(self.translator.num_translators, -(-sentences // at_once))  # run side by side
        smaller = []
        if beam > 1:
            saved = f" (this export's decode.beam is {beam})" if saved_beam else ""
            smaller.append(f"beam={saved}")
        if at_once > 1:
            smaller.append("batch_size= (fewer sentences at once)")
        if batches > 1:
            smaller.append(f"inter_threads= of CT2Translator ({batches} batches side by side)")
        fix = "free memory for this process, or raise its limit (ulimit -v, its cgroup's memory.max)"
        if smaller:
            fix = f"translate with a smaller {' or '.join(smaller)}"
        check_beam_memory(at_once * batches, beam, self.tgt_tokenizer.vocab_size,
                          "the scores over the target vocabulary", fix)  # fmt: skip

    def translate(self, lines: Sequence[str], **settings: Any) -> list[str]:
        """Detokenized translations of `lines` in their order (an empty line stays empty); `settings`
        as `translate_ids` takes them."""
        ids = self.source_ids(lines)
        todo = [i for i, row in enumerate(ids) if len(row) > 1]
        out = [""] * len(lines)
        for i, row in zip(todo, self.translate_ids([ids[i] for i in todo], **settings), strict=True):
            out[i] = self.tgt_tokenizer.decode(row)
        return out


def _search_options(saved: dict[str, Any], beam: int | None, length_penalty: float | None,
                    sampling: bool | None) -> dict[str, Any]:  # fmt: skip
    """`translate_batch`'s beam, length penalty and sampling options: those given, else the saved ones
    (an export written before they were saved: length penalty 0, no sampling)."""
    drawn = saved.get("sampling")  # the checkpoint's topk, topp and temperature, or None
    if sampling and drawn is None:
        raise ValueError("sampling=True: this export's checkpoint did not decode with decode.sampling=true, "
                         "so no topk, topp or temperature were saved; export such a checkpoint")  # fmt: skip
    if sampling is False:  # search instead
        drawn = None
    beam = saved["beam"] if beam is None else beam  # 1 when the checkpoint samples
    if drawn and beam > 1:
        raise ValueError(f"sampling draws one output per sentence, but beam={beam}: use beam=1, or "
                         "sampling=False to search")  # fmt: skip
    options: dict[str, Any] = {
        "beam_size": beam,
        "length_penalty": saved.get("length_penalty", 0.0) if length_penalty is None else length_penalty,
    }
    if drawn:  # CTranslate2's topk 0 samples among every token, as attnlab's 0 does
        options.update(sampling_topk=drawn["topk"], sampling_topp=drawn["topp"],
                       sampling_temperature=drawn["temperature"])  # fmt: skip
    return options
