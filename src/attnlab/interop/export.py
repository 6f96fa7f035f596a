"""Exporting a trained attnlab model for other runtimes (`attnlab-export`).

- `format=hf`: a Hugging Face MarianMT directory (`pip install "attnlab[interop]"`): the weights of
  `attnlab.interop.marian.to_marian`, its `config.json`, a `generation_config.json` that decodes as
  attnlab does (starting from the model's start id, never generating pad or bos, no forced eos), and the
  tokenizer as a `PreTrainedTokenizerFast` (`tokenizer.json`) that encodes text to attnlab's ids with eos
  appended and decodes ids back to attnlab's text. `MarianMTModel.from_pretrained(out)` and
  `AutoTokenizer.from_pretrained(out)` load it offline.
- `format=ctranslate2`: a CTranslate2 model directory (`pip install "attnlab[export]"`), converted by
  CTranslate2's MarianMT loader from `to_marian(model)` with three changes that make it compute what
  attnlab computes: the vocabulary keeps all its rows (the loader drops the last one, Marian's pad), the
  decoder starts from the embedding of attnlab's start id (the loader starts from a zero vector), and the
  vocabulary's tokens are the ids written as strings, so CTranslate2 is fed attnlab's ids, not text.
  attnlab's tokenizers and decoding settings are written beside it; `attnlab.interop.ct2.CT2Translator`
  translates text with them. `quantization=int8|float16` stores the weights so (CTranslate2's
  quantization); `none` keeps float32.

Both formats encode `exported_positions` positions (MarianMT's sinusoids are a table; by default the
model's `max_positions`, 1024): every source and output the exported settings allow fits. `CT2Translator`
stops outputs at that many tokens (and warns) where a call's own `max_len_a`/`max_len_b` would allow
longer ones, which attnlab decodes up to `attnlab.decoding.search.MAX_OUTPUT_TOKENS`.

`export` writes into a fresh hidden directory beside `out` and renames it into place once complete, so a
failed export leaves nothing half-written, and an existing non-empty `out` is replaced only with
`overwrite=True` (after the new export is complete). A symbolic link `out` is written through: the
directory it points to is replaced, and the link stays.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab.decoding.search import MAX_OUTPUT_TOKENS, max_output_length
from attnlab.interop.marian import to_marian
from attnlab.io import write_fix

if TYPE_CHECKING:
    from attnlab.data.tokenizer import SubwordTokenizer
    from attnlab.decoding import DecodeConfig
    from attnlab.inference.translator import Translator

FORMATS = ("hf", "ctranslate2")
QUANTIZATIONS = ("none", "int8", "float16")
EXPORT_EXTRA = 'pip install "attnlab[export]"'
INTEROP_EXTRA = 'pip install "attnlab[interop]"'
# Files attnlab writes beside a CTranslate2 model (read by `attnlab.interop.ct2.CT2Translator`); the
# settings file also marks an HF export (`{"format": "hf"}`): overwrite=true replaces only such a directory.
SETTINGS_FILE = "attnlab_export.json"
SOURCE_TOKENIZER_FILE = "attnlab_source_tokenizer.json"
TARGET_TOKENIZER_FILE = "attnlab_target_tokenizer.json"

log = logging.getLogger(__name__)


class ExportError(ValueError):
    """An export that cannot be made; the message names the problem and the fix."""


# The DecodeConfig fields a CTranslate2 export's `decode` node holds as they are (`carried_decoding` adds
# the length penalty and the sampling settings); `CT2Translator` reads them back
EXPORTED_DECODE = ("beam", "max_len_a", "max_len_b", "min_len", "batch_size")


def carried_decoding(decode: DecodeConfig, vocab_size: int) -> tuple[dict[str, Any], list[str]]:
    """What of `decode` the exports carry, and what they cannot: (settings, what is not carried).

    The settings: `length_penalty`, the exponent of fairseq's |Y|^α, which `generate()` (with beams) and
    CTranslate2 both use (`decode.alpha` with `decode.length_penalty=fairseq`; 0 otherwise, GNMT's
    ((5+|Y|)/6)^α having no equal there), and `sampling`: None, or with `decode.sampling` its `topk`
    (0: every token; a `topk` of at least the `vocab_size` target tokens is 0 too, as CTranslate2 refuses
    a larger one), `topp` and `temperature`. Not carried, said in a sentence each: a GNMT α above 0 with
    beams (they then rank by raw log-probability), the sampling `seed` (either runtime draws from its own
    generator, so its samples are not attnlab's), and `topk` with `topp` together (attnlab keeps the top
    k tokens inside the nucleus of the whole distribution; both runtimes take the nucleus of the top k
    renormalised, which can keep fewer).
    """
    fairseq = decode.length_penalty == "fairseq"
    settings: dict[str, Any] = {"length_penalty": decode.alpha if fairseq else 0.0, "sampling": None}
    lost = []
    if not fairseq and decode.alpha > 0 and decode.beam > 1:
        lost.append(f"decode.length_penalty=gnmt with alpha={decode.alpha}: neither runtime has GNMT's "
                    "penalty, so its beams rank by raw log-probability (length penalty 0); a checkpoint "
                    "decoding with decode.length_penalty=fairseq carries its alpha")  # fmt: skip
    if decode.sampling:
        topk = 0 if decode.topk >= vocab_size else decode.topk
        settings["sampling"] = {"topk": topk, "topp": decode.topp, "temperature": decode.temperature}
        lost.append(f"decode.seed={decode.seed}: the runtime samples with its own random generator, so "
                    "its samples differ from attnlab's")  # fmt: skip
        if topk > 0 and decode.topp < 1:
            lost.append(f"decode.topk={topk} with decode.topp={decode.topp} as attnlab combines them (the "
                        "top k tokens inside the nucleus of the whole distribution): the runtime takes the "
                        "nucleus of the renormalised top k, which can keep fewer tokens")  # fmt: skip
    return settings, lost


def check_request(fmt: str, quantization: str, out: str | Path, overwrite: bool) -> Path:
    """The directory a valid request writes, checked before anything is loaded: `out`, or where `out`
    points when it is a symbolic link (the export is written through the link, which stays: a link to a
    directory on a larger disk keeps its export there, and the link's target meets the rules below).

    Raises:
        ExportError: An unknown format or quantization, quantization with `format=hf`, an `out` that is a
            file, a symbolic link to nothing, or a non-empty directory without `overwrite`, whose parent is
            missing, no directory or not writable, or a missing package of the format.
    """
    if fmt not in FORMATS:
        raise ExportError(f"format={fmt!r} is not an export format: use one of {', '.join(FORMATS)}")
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"quantization={quantization!r} is unknown: use one of {', '.join(QUANTIZATIONS)}")
    if fmt == "hf" and quantization != "none":
        raise ExportError(
            f"quantization={quantization} applies to format=ctranslate2; format=hf writes float32 weights "
            "(drop quantization or set it to none)"
        )
    path = Path(out).expanduser()
    if path.is_symlink() and not path.exists():  # the finished export could not be renamed onto it
        raise ExportError(f"out={out} is a symbolic link to {os.readlink(path)}, which does not exist: name "
                          "a directory to export into (or create the link's target)")  # fmt: skip
    path = path.resolve() if path.is_symlink() else path  # written through, the link kept
    if path.exists() and not path.is_dir():
        raise ExportError(f"out={out} is a file: name a directory to export into")
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise ExportError(
                f"out={out} exists and is not empty: choose a new directory, or set overwrite=true to "
                "replace an earlier export there"
            )
        if not (path / SETTINGS_FILE).is_file():
            raise ExportError(
                f"out={out} is not an earlier export (it has no {SETTINGS_FILE}): overwrite=true replaces "
                "only a directory attnlab-export wrote; choose a new directory"
            )
    if not path.parent.exists():
        raise ExportError(f"out={out}: its parent directory {path.parent} does not exist; create it first")
    if not path.parent.is_dir() or not os.access(path.parent, os.W_OK | os.X_OK):
        raise _unwritable(out, path.parent, "not a directory" if not path.parent.is_dir() else "not writable")
    require_packages(fmt)
    return path


def _unwritable(out: str | Path, where: Path, reason: str | None) -> ExportError:
    return ExportError(f"out={out}: cannot write the export in {where} ({reason}): choose a directory you "
                       "can write in")  # fmt: skip


def require_packages(fmt: str) -> None:
    """Raises ExportError naming the extra to install when a package the format needs is missing (found
    without importing it: a refused request stays fast)."""
    if find_spec("transformers") is None:  # both formats go through to_marian
        raise ExportError(f"format={fmt} needs the transformers package: {INTEROP_EXTRA}")
    if fmt == "ctranslate2" and find_spec("ctranslate2") is None:
        raise ExportError(f"format=ctranslate2 needs the ctranslate2 package: {EXPORT_EXTRA}")


def export(translator: Translator, fmt: str, out: str | Path, quantization: str = "none",
           overwrite: bool = False) -> Path:  # fmt: skip
    """Export the translator's model, tokenizers and decoding settings to `out` (see the module
    docstring); returns `out`. A symbolic link `out` stays: the export replaces the directory it points to
    (`check_request`). What of the decoding settings the format cannot carry (`carried_decoding`) is
    logged as a warning and listed in `attnlab_export.json` (`not_carried`).

    Raises:
        ExportError: A bad request (`check_request`), a model or tokenizer the format cannot express, or a
            write that failed (a full disk).
    """
    path = check_request(fmt, quantization, out, overwrite)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as exc:  # a directory that refuses new entries for all its permission bits (/proc)
        raise _unwritable(out, path.parent, exc.strerror) from None
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # a directory's usual permissions, not mkdtemp's private ones
    try:
        if fmt == "hf":
            lost = write_hf(translator, staging)
        else:
            lost = write_ctranslate2(translator, staging, quantization)
        _move_into_place(staging, path)
    except ValueError as exc:  # to_marian's and the tokenizer's: name what the format cannot express
        raise ExportError(f"format={fmt}: {exc}") from None
    except OSError as exc:  # a full disk, a file size limit: the staging directory goes, out stays as it was
        raise ExportError(f"out={out}: writing the export failed ({exc.strerror or exc}). {write_fix(exc)}, "
                          "or choose another directory; nothing was written") from None  # fmt: skip
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for sentence in lost:
        log.warning("format=%s does not carry %s", fmt, sentence)
    return Path(out).expanduser()


def _move_into_place(staging: Path, path: Path) -> None:
    """Rename the finished `staging` directory to `path`; an existing `path` is removed only after."""
    if not path.exists():
        os.replace(staging, path)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
    os.replace(path, old / "previous")
    try:
        os.replace(staging, path)
    except BaseException:  # an error or an interrupt: the earlier export goes back (kept in `old` if not)
        os.replace(old / "previous", path)
        old.rmdir()
        raise
    shutil.rmtree(old, ignore_errors=True)  # only once the new export is in place


def exported_positions(translator: Translator) -> int:
    """The positions an export encodes. MarianMT's sinusoids are a table (attnlab computes them for any
    position): the model's `max_positions`, or more where the source limit or the longest output of the
    exported decoding settings (a·limit+b, at most `MAX_OUTPUT_TOKENS`) needs more."""
    config, decode = translator.model.config, translator.decode
    limit = translator.source_limit()[0]
    return max(config.max_positions, limit, max_output_length(limit, decode.max_len_a, decode.max_len_b))


def _marian(translator: Translator) -> Any:
    positions = exported_positions(translator)
    config = translator.model.config
    if positions > max(MAX_OUTPUT_TOKENS, config.max_positions):  # a source limit past the output cap
        size = positions * config.d_model * 4 / 2**20
        log.warning("the export holds %d sinusoid positions, %.0f MB in each of the encoder's and decoder's "
                    "tables, because %s allows sources that long: lower it for a smaller export", positions,
                    size, translator.source_limit()[1])  # fmt: skip
        _check_table_memory(positions, config.d_model, translator.source_limit()[1])
    try:
        return to_marian(translator.model.eval(), positions)  # copied to a CPU model
    except ValueError as exc:  # what MarianMT cannot hold: name what an exportable model is trained with
        raise ValueError(
            f"{exc}. Both formats go through MarianMT, which holds the paper's post-norm model with "
            "sinusoidal positions, LayerNorms of epsilon 1e-5 and heads of d_model / n_heads: a model "
            "trained with model.pe=sinusoidal, model.norm_first=false, model.layer_norm_eps=1e-5 and "
            "model.d_head=null exports; this one cannot"
        ) from None


def _check_table_memory(positions: int, d_model: int, limited_by: str) -> None:
    """A ValueError, before anything is allocated, when the encoder's and decoder's sinusoid tables (a lower
    bound of what the export holds) cannot fit in the memory this process can take: a source limit of a
    checkpoint's data settings (10^12) would otherwise fail in the allocator, or have the out-of-memory
    killer end this process or another one."""
    from attnlab.decoding.search import available_memory

    needed = 2 * positions * d_model * 4  # float32
    available = available_memory()
    if available is not None and needed > available:
        raise ValueError(
            f"its sinusoid tables of {positions} positions need {needed / 2**30:,.1f} GiB, more than the "
            f"{available / 2**30:,.1f} GiB of memory this process can take, because {limited_by} allows "
            "sources that long: export with a lower decode.max_source_tokens (the longest source it "
            "translates)"
        )


def hf_tokenizer(tokenizer: SubwordTokenizer, eos_id: int) -> Any:
    """A `transformers.PreTrainedTokenizerFast` of an attnlab tokenizer: the same ids as
    `tokenizer.encode` with eos appended (attnlab's normalisation: NFC, whitespace collapsed and stripped),
    and `decode(ids, skip_special_tokens=True)` gives `tokenizer.decode(ids)` (pad, bos and eos skipped,
    an unknown id rendered as "<unk>").

    Its `unk_token` is unset: "<unk>" is ordinary text when decoding (as in attnlab), never skipped. One
    difference: text that spells a special token ("</s>") gets that token's id here, the unknown id from
    attnlab.

    Raises:
        ValueError: A SentencePiece tokenizer (only Hugging Face `tokenizers` ones convert).
    """
    from tokenizers import Regex, Tokenizer, normalizers, processors
    from transformers import PreTrainedTokenizerFast

    from attnlab.data.tokenizer import SPECIAL_TOKENS, UNK_ID, HuggingFaceTokenizer

    if not isinstance(tokenizer, HuggingFaceTokenizer):
        raise ValueError(
            "the model's tokenizer is a SentencePiece model, which format=hf does not convert; use "
            "format=ctranslate2 (it keeps attnlab's tokenizer), or a model trained with data.tokenizer=bpe"
        )
    document = json.loads(tokenizer.to_json())
    for added in document.get("added_tokens", []):  # "<unk>" is text to decode, not a token to skip
        if added["id"] == UNK_ID:
            added["special"] = False
    inner = Tokenizer.from_str(json.dumps(document))
    # Every character Python's str.split() splits at (attnlab.data.text.normalize), found here rather
    # than at import: the scan of every code point takes ~70 ms.
    whitespace = "".join(chr(c) for c in range(0x110000) if chr(c).isspace())
    steps = [normalizers.NFC(), normalizers.Replace(Regex(f"[{whitespace}]+"), " "), normalizers.Strip()]
    if inner.normalizer is not None:
        steps.append(inner.normalizer)
    inner.normalizer = normalizers.Sequence(steps)
    eos = SPECIAL_TOKENS[eos_id]
    inner.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, eos_id)]
    )
    inner.no_padding()
    inner.no_truncation()
    return PreTrainedTokenizerFast(
        tokenizer_object=inner, pad_token=SPECIAL_TOKENS[0], bos_token=SPECIAL_TOKENS[1], eos_token=eos,
        clean_up_tokenization_spaces=False,  # no unk_token: it would be skipped as a special token
        model_input_names=["input_ids", "attention_mask"],
    )  # fmt: skip


def write_hf(translator: Translator, out: Path) -> list[str]:
    """Write the MarianMT directory of `format=hf` into the existing directory `out`; returns what of the
    decoding settings it does not carry (`carried_decoding`)."""
    config = translator.model.config
    if translator.src_tokenizer.to_json() != translator.tgt_tokenizer.to_json():
        raise ValueError(
            "the model has separate source and target vocabularies (data.joint_vocab=false), and a "
            "PreTrainedTokenizerFast is one vocabulary; use format=ctranslate2"
        )
    tokenizer = hf_tokenizer(translator.src_tokenizer, config.eos_id)  # refused before the weights convert
    marian = _marian(translator)
    generation = marian.generation_config
    generation.decoder_start_token_id = config.start_id
    generation.bos_token_id = config.bos_id
    generation.eos_token_id = config.eos_id
    generation.pad_token_id = config.pad_id
    generation.forced_eos_token_id = None  # attnlab stops at its length limit without forcing eos
    generation.suppress_tokens = [config.pad_id, config.bos_id]  # attnlab never generates them
    generation.num_beams = translator.decode.beam
    generation.min_length = translator.decode.min_len  # eos not before: counted as attnlab counts it
    carried, lost = carried_decoding(translator.decode, config.tgt_vocab_size)
    if generation.num_beams > 1:  # (generate()'s validation refuses a length penalty without beams)
        generation.length_penalty = carried["length_penalty"]
    if carried["sampling"] is not None:  # top_k 0: generate() then keeps every token, as attnlab's 0 does
        sampling = carried["sampling"]
        generation.do_sample = True
        generation.top_k, generation.top_p = sampling["topk"], sampling["topp"]
        generation.temperature = sampling["temperature"]
    limit, _ = translator.source_limit()
    longest = max_output_length(limit, translator.decode.max_len_a, translator.decode.max_len_b, None)
    generation.max_length = longest + 1  # the start id counted (no position limit: sinusoidal only)
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a "Writing model shards" bar for one shard says nothing
    try:
        marian.save_pretrained(out)
        tokenizer.save_pretrained(out)
        marker = {"format": "hf", "not_carried": lost}
        (out / SETTINGS_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    return lost


def write_ctranslate2(translator: Translator, out: Path, quantization: str) -> list[str]:
    """Write the CTranslate2 model of `format=ctranslate2` (and attnlab's files beside it) into `out`;
    returns what of the decoding settings it does not carry (`carried_decoding`)."""
    import ctranslate2

    marian = _marian(translator)
    converter = _MarianIdsConverter(marian)
    model_dir = out / ".model"
    converter.convert(str(model_dir), quantization=None if quantization == "none" else quantization)
    for item in model_dir.iterdir():
        os.replace(item, out / item.name)
    model_dir.rmdir()
    config = translator.model.config
    decode = translator.decode
    carried, lost = carried_decoding(decode, config.tgt_vocab_size)
    settings = {
        "format": "ctranslate2",
        "ctranslate2_version": ctranslate2.__version__,
        "quantization": quantization,
        "pad_id": config.pad_id, "bos_id": config.bos_id, "eos_id": config.eos_id,
        "start_id": config.start_id,
        "max_source_tokens": translator.source_limit()[0],
        "positions": marian.config.max_position_embeddings,  # the table written
        "decode": {**{name: getattr(decode, name) for name in EXPORTED_DECODE}, **carried},
        "not_carried": lost,
    }  # fmt: skip
    (out / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    (out / SOURCE_TOKENIZER_FILE).write_text(translator.src_tokenizer.to_json(), encoding="utf-8")
    (out / TARGET_TOKENIZER_FILE).write_text(translator.tgt_tokenizer.to_json(), encoding="utf-8")
    return lost


def _ids_converter_class() -> type:
    """CTranslate2's MarianMT loader and a converter of an in-memory `MarianMTModel`, changed as the module
    docstring says (defined on first use: ctranslate2 is optional)."""
    from ctranslate2.converters.converter import Converter
    from ctranslate2.converters.transformers import BartLoader, MarianMTLoader

    from attnlab.data.tokenizer import UNK_ID

    class IdsLoader(MarianMTLoader):
        def get_model_spec(self, model: Any) -> Any:
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return BartLoader.get_model_spec(self, model)  # every vocabulary row kept

        def set_decoder(self, spec: Any, decoder: Any) -> None:
            BartLoader.set_decoder(self, spec, decoder)  # starts from the start id's embedding

        def set_config(self, config: Any, model: Any, tokenizer: Any) -> None:
            config.bos_token = str(model.config.decoder_start_token_id)
            config.eos_token = str(model.config.eos_token_id)
            config.unk_token = str(UNK_ID)
            config.decoder_start_token = str(model.config.decoder_start_token_id)

        def set_vocabulary(self, spec: Any, tokens: Any) -> None:
            marian = self.model_config
            spec.register_source_vocabulary([str(i) for i in range(marian.vocab_size)])
            spec.register_target_vocabulary([str(i) for i in range(marian.decoder_vocab_size)])

        def __call__(self, model: Any, tokenizer: Any) -> Any:
            self.model_config = model.config
            spec = self.get_model_spec(model)
            self.set_config(spec.config, model, tokenizer)
            self.set_vocabulary(spec, None)
            return spec

    class Converted(Converter):
        def __init__(self, marian: Any) -> None:
            self.marian = marian

        def _load(self) -> Any:
            import torch

            with torch.no_grad():
                return IdsLoader()(self.marian, None)

    return Converted


def _MarianIdsConverter(marian: Any) -> Any:  # a class made on first use
    return _ids_converter_class()(marian)
