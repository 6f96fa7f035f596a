"""`attnlab-export`: the translating model as a Hugging Face MarianMT directory and as a CTranslate2 model,
each giving attnlab's outputs; bad requests refused before anything is written."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import compose_app, file_size_limit, forced_log_probs

pytest.importorskip("transformers", reason='needs the [interop] extra: pip install -e ".[interop]"')

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Inputs beyond the corpus lines: runs of whitespace, tabs, a non-breaking space, a decomposed accent
# (NFC), characters absent from the training text (unknown ids), an empty line.
EXTRA_LINES = ["  Ein   Mann\tfährt  Fahrrad. ", "Zwei\u00a0Hunde spielen ﬁ ✓ im Schnee.", "Cafe\u0301 ☃", ""]


def attnlab_export(*args: str, env: dict[str, str] | None = None):
    """`attnlab-export` in a fresh process."""
    script = "import sys; sys.argv[0] = 'attnlab-export'\nfrom attnlab.cli.export import main; main()"
    command = [sys.executable, "-c", script, *args]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)


def export_in_process(*args: str) -> Path:
    """`attnlab-export`'s work (`export_checkpoint`) in this process, on `conf/export.yaml` composed with
    `args`: the directory written."""
    from attnlab.cli.export import export_checkpoint

    return export_checkpoint(compose_app("export", list(args)))


def refusal(*args: str) -> str:
    """The message of the ConfigError `export_in_process(*args)` must raise: what the CLI prints after
    "attnlab-export: " (`test_bad_requests_are_refused_naming_the_fix` checks that path once)."""
    from attnlab.typed import ConfigError

    with pytest.raises(ConfigError) as refused:
        export_in_process(*args)
    return str(refused.value)


@pytest.fixture(scope="module")
def exported(translating_run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The translating run exported as hf and ctranslate2 (float32) by the CLI, and as ctranslate2 int8 and
    float16 by its work in this process (`export_in_process`)."""
    tmp = tmp_path_factory.mktemp("export")
    dirs = {name: tmp / name for name in ("hf", "ct2", "int8", "float16")}
    for name, fmt in (("hf", "hf"), ("ct2", "ctranslate2")):
        done = attnlab_export(f"ckpt_path={translating_run['dir']}", f"out={dirs[name]}", f"format={fmt}",
                              f"paths.log_dir={tmp / 'logs'}")  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"wrote format={fmt}" in done.stdout
        assert "Writing model shards" not in done.stdout + done.stderr  # no progress bar of one shard
    for name in ("int8", "float16"):
        written = export_in_process(f"ckpt_path={translating_run['dir']}", f"out={dirs[name]}",
                                    "format=ctranslate2", f"quantization={name}")  # fmt: skip
        assert written == dirs[name].resolve(), written
    corpus = translating_run["corpus"]
    lines = (corpus / "test.de").read_text("utf-8").splitlines()
    references = (corpus / "test.en").read_text("utf-8").splitlines()
    return {**dirs, "lines": lines, "references": references, "tmp": tmp}


def attnlab_translator(translating_run: dict[str, Any], **decode: Any):
    from attnlab.inference.translator import Translator, resolve_checkpoints

    translator = Translator.from_checkpoints(resolve_checkpoints(translating_run["dir"]), device="cpu")
    translator.decode = dataclasses.replace(translator.decode, **decode)
    return translator


def test_hf_directory_loads_offline_and_generates_attnlab_greedy_outputs(
    translating_run: dict[str, Any], exported: dict[str, Any]
) -> None:
    import torch
    from transformers import AutoTokenizer, MarianMTModel, PreTrainedTokenizerFast

    tokenizer = AutoTokenizer.from_pretrained(exported["hf"], local_files_only=True)
    model = MarianMTModel.from_pretrained(exported["hf"], local_files_only=True).eval()
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    ours = attnlab_translator(translating_run, beam=1)
    lines = [*exported["lines"], *EXTRA_LINES]
    expected_ids = ours._source_ids(lines)  # attnlab's encoding, eos appended
    assert tokenizer(lines).input_ids == expected_ids
    assert any(3 in row for row in expected_ids)  # the unknown id is among them

    batch = tokenizer(exported["lines"], return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = model.generate(**batch, num_beams=1, do_sample=False)  # the saved generation config
    hypotheses = tokenizer.batch_decode(generated, skip_special_tokens=True)
    expected = ours.translate(exported["lines"])
    assert hypotheses == expected
    assert len(set(expected)) > len(expected) // 2 and all(expected)  # real, sentence-specific output

    # Decoding gives attnlab's text back, "<unk>" included; pad, bos and eos are skipped.
    for row in expected_ids:
        with_specials = [1, *row, 0, 0]
        assert tokenizer.decode(with_specials, skip_special_tokens=True) == ours.tgt_tokenizer.decode(row)
    assert "<unk>" in tokenizer.decode(expected_ids[-2], skip_special_tokens=True)


def test_ctranslate2_float32_gives_attnlab_greedy_and_beam_outputs(
    translating_run: dict[str, Any], exported: dict[str, Any]
) -> None:
    from attnlab.interop.ct2 import CT2Translator

    lines = [*exported["lines"], *EXTRA_LINES]
    engine = CT2Translator(exported["ct2"], intra_threads=1)
    assert engine.source_ids(lines) == attnlab_translator(translating_run)._source_ids(lines)
    for beam in (1, 3, 5):
        expected = attnlab_translator(translating_run, beam=beam, alpha=0.0).translate(lines)
        assert engine.translate(lines, beam=beam) == expected, f"beam {beam}"
        assert sum(bool(line) for line in expected) >= len(exported["lines"])  # empty for the empty line
    # The exported decoding settings are the checkpoint's (its beam, 3): the same as asking for them.
    assert engine.translate(lines) == engine.translate(lines, beam=3)


@pytest.mark.parametrize(("name", "smaller"), [("int8", 2.0), ("float16", 1.6)])
def test_quantized_ctranslate2_translates_and_its_bleu_difference_is_reported(
    exported: dict[str, Any], record_property: Any, name: str, smaller: float
) -> None:
    from attnlab.interop.ct2 import CT2Translator
    from attnlab.metrics import corpus_bleu

    settings = json.loads((exported[name] / "attnlab_export.json").read_text())
    assert settings["quantization"] == name
    float32 = CT2Translator(exported["ct2"], intra_threads=1).translate(exported["lines"], beam=5)
    quantized = CT2Translator(exported[name], intra_threads=1).translate(exported["lines"], beam=5)
    bleu32 = corpus_bleu(float32, exported["references"]).score
    bleu = corpus_bleu(quantized, exported["references"]).score
    record_property("ctranslate2_bleu_float32", bleu32)
    record_property(f"ctranslate2_bleu_{name}", bleu)
    same = sum(a == b for a, b in zip(float32, quantized, strict=True))
    print(
        f"\nCTranslate2 beam 5 on the fixture's test set: float32 BLEU {bleu32:.2f}, {name} BLEU "
        f"{bleu:.2f} (difference {bleu - bleu32:+.2f}); {same}/{len(quantized)} outputs identical"
    )
    size = {key: (exported[key] / "model.bin").stat().st_size for key in ("ct2", name)}
    assert size[name] < size["ct2"] / smaller  # the weights are stored quantized
    assert all(quantized) and bleu > 20  # it still translates (sanity, not a quality bar)


def test_average_last_exports_the_averaged_weights(
    translating_run: dict[str, Any], exported: dict[str, Any]
) -> None:
    import torch
    from safetensors.torch import load_file

    from attnlab.inference.translator import Translator, resolve_checkpoints
    from attnlab.interop.marian import to_marian

    out = exported["tmp"] / "averaged"
    done = attnlab_export(f"ckpt_path={translating_run['dir']}", "average_last=2", "format=hf", f"out={out}",
                          f"paths.log_dir={exported['tmp'] / 'logs'}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    averaged = Translator.from_checkpoints(resolve_checkpoints(translating_run["dir"], 2))
    expected = to_marian(averaged.model).state_dict()
    written, best = load_file(out / "model.safetensors"), load_file(exported["hf"] / "model.safetensors")
    key = "model.decoder.layers.0.fc1.weight"
    torch.testing.assert_close(written[key], expected[key], rtol=0, atol=0)
    assert not torch.equal(best[key], written[key])  # not the best checkpoint's weights


def test_bad_requests_are_refused_naming_the_fix(
    translating_run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI exits 1 with the message on stderr; the other requests run its work in this process."""
    run = f"ckpt_path={translating_run['dir']}"
    logs = f"paths.log_dir={tmp_path / 'logs'}"
    done = attnlab_export(run, "format=onnx", f"out={tmp_path / 'x'}", logs)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == (
        "attnlab-export: format='onnx' is not an export format: use one of hf, ctranslate2"
    )
    assert not (tmp_path / "x").exists()

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    refused = refusal(run, "format=hf", f"out={kept}", logs)
    assert "exists and is not empty" in refused and "overwrite=true" in refused
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]  # nothing lost, nothing added

    run_dir = Path(translating_run["dir"])
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    refused = refusal(run, "format=hf", f"out={run_dir}", "overwrite=true", logs)
    assert "is not an earlier export" in refused  # a run is never replaced
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before  # the run is intact

    refused = refusal(run, "format=hf", "quantization=int8", f"out={tmp_path / 'y'}", logs)
    assert "quantization=int8 applies to format=ctranslate2" in refused

    with monkeypatch.context() as hidden:
        hidden.setitem(sys.modules, "ctranslate2", None)  # as if it were not installed
        refused = refusal(run, "format=ctranslate2", f"out={tmp_path / 'z'}", logs)
    assert 'needs the ctranslate2 package: pip install "attnlab[export]"' in refused
    assert not (tmp_path / "z").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging directory left

    # A model the format cannot express fails before anything replaces `out`.
    from attnlab.decoding import DecodeConfig
    from attnlab.interop.export import ExportError, export
    from attnlab.model.config import TransformerConfig
    from attnlab.model.transformer import Transformer

    trained = attnlab_translator(translating_run)
    config = TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1,
                               pe="learned", max_positions=64)  # fmt: skip
    vocab = trained.src_tokenizer.vocab_size
    learned = type(trained)(Transformer(config.with_vocab(vocab, vocab)), trained.src_tokenizer,
                            trained.tgt_tokenizer, DecodeConfig())  # fmt: skip
    # overwrite=true replaces only an earlier export: a directory of the user's own is never removed.
    refused = refusal(run, "format=hf", f"out={kept}", "overwrite=true", logs)
    assert "is not an earlier export (it has no attnlab_export.json)" in refused
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]

    earlier = tmp_path / "earlier"
    assert export_in_process(run, "format=hf", f"out={earlier}", logs) == earlier.resolve()
    (earlier / "stale.txt").write_text("from before")
    files = sorted(p.name for p in earlier.iterdir())
    with pytest.raises(ExportError, match="format=hf: MarianMT needs pe='sinusoidal'"):
        export(learned, "hf", earlier, overwrite=True)
    assert sorted(p.name for p in earlier.iterdir()) == files  # the failed export replaced nothing
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]

    assert export_in_process(run, "format=hf", f"out={earlier}", "overwrite=true", logs) == earlier.resolve()
    assert (earlier / "tokenizer.json").is_file() and not (earlier / "stale.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_decode_overrides_choose_the_decoding_settings_an_export_carries(
    translating_run: dict[str, Any], tmp_path: Path
) -> None:
    """`decode.*` replaces the checkpoint's decoding settings in the export, also a saved value this
    version refuses (an older checkpoint's `max_len_a=inf`), of which no export could be made."""
    import torch

    checkpoint = torch.load(
        next((translating_run["dir"] / "checkpoints").glob("best-*.ckpt")), weights_only=True
    )
    checkpoint["hyper_parameters"]["decode"]["max_len_a"] = float("inf")
    torch.save(checkpoint, tmp_path / "old.ckpt")
    asked = [f"ckpt_path={tmp_path / 'old.ckpt'}", "format=ctranslate2"]
    assert "max_len_a=inf" in refusal(*asked, f"out={tmp_path / 'refused'}")
    out = export_in_process(*asked, f"out={tmp_path / 'ct2'}", "decode.max_len_a=1.5", "decode.beam=2")
    carried = json.loads((out / "attnlab_export.json").read_text())["decode"]
    assert (carried["max_len_a"], carried["beam"]) == (1.5, 2)


def test_ctranslate2_carries_a_fairseq_length_penalty(
    translating_run: dict[str, Any], tmp_path: Path
) -> None:
    """A checkpoint decoding with decode.length_penalty=fairseq exports its α as CTranslate2's length
    penalty, used by default. At α 1 both engines rank hypotheses by the same |Y|^α-normalised score, so
    an output of CTranslate2 that is not attnlab's scores lower under it (CTranslate2 stops at `beam`
    finished hypotheses, attnlab when no live one can still win: attnlab's search found a better one), and
    most outputs are the same (how many depends on the trained model: at least four in five). At α 30
    (where CTranslate2 does change its outputs) the default is the saved α, not 0."""
    from attnlab.interop.ct2 import CT2Translator
    from attnlab.interop.export import export

    lines = (translating_run["corpus"] / "test.de").read_text("utf-8").splitlines()
    engines, ours = {}, {}
    for alpha in (1.0, 30.0):
        ours[alpha] = attnlab_translator(translating_run, beam=5, length_penalty="fairseq", alpha=alpha)
        exported = export(ours[alpha], "ctranslate2", tmp_path / str(alpha))
        engines[alpha] = CT2Translator(exported, intra_threads=1)
        assert engines[alpha].settings["decode"]["length_penalty"] == alpha
        assert engines[alpha].settings["not_carried"] == []
    eos = ours[1.0].model.config.eos_id

    def normalized(line: str, out: list[int]) -> float:  # fairseq's |Y|^α, eos counted (α 1)
        return sum(forced_log_probs(ours[1.0], line, [*out, eos])) / (len(out) + 1)

    sources = engines[1.0].source_ids(lines)
    theirs = engines[1.0].translate_ids(sources)
    differ = 0
    for line, nbest, out in zip(lines, ours[1.0].nbest(lines), theirs, strict=True):
        best = nbest.hypotheses[0]  # its ids end in eos when it produced one
        ended = best.ids[-1:] == [eos]
        if ended:  # the score the search ranked it by
            assert best.normalized == pytest.approx(normalized(line, best.ids[:-1]), abs=1e-4)
        if out != best.ids[: len(best.ids) - ended]:
            differ += 1
            assert best.normalized > normalized(line, out), (best.text, out)
    print(f"\nCTranslate2 beam 5 at fairseq alpha 1: {len(lines) - differ}/{len(lines)} outputs attnlab's")
    assert differ <= len(lines) // 5, f"{differ} of {len(lines)} outputs differ"
    saved, zero = engines[30.0].translate(lines), engines[30.0].translate(lines, length_penalty=0.0)
    assert saved == engines[30.0].translate(lines, length_penalty=30.0) and saved != zero


@pytest.mark.parametrize("key", ["ckpt_path", "format", "out"])
def test_an_empty_required_value_is_refused_naming_the_key(key: str, tmp_path: Path) -> None:
    """`out=` (empty) is no directory: never the working directory, which an export would fill or
    replace."""
    given = {"ckpt_path": str(tmp_path / "a.ckpt"), "format": "hf", "out": str(tmp_path / "out")}
    refused = refusal(*(f"{k}={'' if k == key else v}" for k, v in given.items()), "overwrite=true")
    assert refused == (
        f"{key}= is required (attnlab-export ckpt_path=<run> format=hf|ctranslate2 out=<directory>)"
    )


def test_an_overwrite_not_true_or_false_is_refused_and_the_earlier_export_kept(tmp_path: Path) -> None:
    """`overwrite=no` reaches the export as the text "no", which read as true: the earlier export in `out`
    was replaced. It is refused, before the checkpoint is read."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "attnlab_export.json").write_text('{"format": "hf"}')
    refused = refusal(f"ckpt_path={tmp_path / 'a.ckpt'}", "format=hf", f"out={earlier}", "overwrite=no")
    assert refused == "overwrite='no' must be true or false (true: replace an earlier export in out=)"
    assert [p.name for p in earlier.iterdir()] == ["attnlab_export.json"]


def test_an_export_over_the_directory_holding_its_checkpoint_is_refused_and_the_checkpoint_kept(
    translating_run: dict[str, Any], tmp_path: Path
) -> None:
    """overwrite=true replaces an earlier export only once the new one is complete, which would delete
    a checkpoint kept in it: the export of that checkpoint into that directory is refused."""
    import shutil

    earlier = export_in_process(f"ckpt_path={translating_run['dir']}", "format=hf", f"out={tmp_path / 'hf'}")
    kept = earlier / "model.ckpt"
    shutil.copy(next((translating_run["dir"] / "checkpoints").glob("best-*.ckpt")), kept)
    before = sorted(p.name for p in earlier.iterdir())
    refused = refusal(f"ckpt_path={kept}", "format=hf", f"out={earlier}", "overwrite=true")
    assert refused == (
        f"out={earlier} holds the checkpoint being exported ({kept}): replacing it would delete it; "
        "choose another directory"
    )
    assert sorted(p.name for p in earlier.iterdir()) == before and "model.ckpt" in before


def test_an_export_the_file_system_stops_while_writing_is_refused_naming_out_and_leaves_nothing(
    translating_run: dict[str, Any], tmp_path: Path
) -> None:
    """A write that fails (here the file size limit, as on a full disk: EFBIG where ENOSPC) is refused
    naming `out=`, the system's reason and what to do, where attnlab-export printed the bare OSError
    ("[Errno 27] File too large", no path); no half-written directory or staging directory is left."""
    out = tmp_path / "hf"
    with file_size_limit(64):  # config.json, written first, is larger
        refused = refusal(f"ckpt_path={translating_run['dir']}", "format=hf", f"out={out}")
    assert refused == (
        f"out={out}: writing the export failed (File too large). Write to a file system that holds files "
        "this large, or choose another directory; nothing was written"
    )
    assert list(tmp_path.iterdir()) == []
