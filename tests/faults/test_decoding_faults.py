"""Decoding faults: one huge source line must not stall translation or evaluation (it is cut to
`decode.max_source_tokens`, counted and reported), greedy decoding and beam search of size 1 generate
the same ids on random models (neither emits pad or bos), and blank input lines translate to empty
lines."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.cli.translate import main as translate_main
from attnlab.decoding import DecodeConfig
from attnlab.decoding.search import beam_search, translate
from attnlab.inference.translator import Translator, evaluate
from attnlab.model.transformer import Transformer
from attnlab.runs.checkpoint import CheckpointError
from attnlab.training.pipeline import train
from helpers import compose_train, cuts, random_source, require_shared_data, tiny_config, write_corpus

LIMIT = 40  # data.max_source_tokens of the trained model: the training filter's limit
SPLITS = (("train", "train", 300), ("valid", "val", 30), ("test", "test2016", 30))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One epoch of the tiny model on 300 Multi30k lines, with `data.max_source_tokens=LIMIT`, and the
    test sentences whose source fits that limit."""
    tmp = tmp_path_factory.mktemp("decoding_faults")
    corpus = write_corpus(require_shared_data(shared_data), tmp / "corpus", SPLITS)
    overrides = [
        "data=files", f"data.dir={corpus}", "data.src_lang=de", "data.tgt_lang=en", "data.vocab_size=300",
        f"data.max_source_tokens={LIMIT}", f"data.cache_dir={tmp / 'cache'}", "model=tiny",
        "trainer.max_epochs=1", "logger=csv", "test=false", "decode.every_n_epochs=0",
        "decode.beam=2", "decode.max_len_a=1.0", "decode.max_len_b=5",
    ]  # fmt: skip
    train(compose_train(overrides, tmp / "run"))
    ckpt = tmp / "run" / "checkpoints" / "last.ckpt"
    tokenizer = Translator.from_checkpoints([ckpt]).src_tokenizer
    pairs = zip((corpus / "test.de").read_text("utf-8").splitlines(),
                (corpus / "test.en").read_text("utf-8").splitlines(), strict=True)  # fmt: skip
    fitting = [(s, t) for s, t in pairs if len(tokenizer.encode(s)) + 1 <= LIMIT]  # not cut
    assert len(fitting) >= 10
    return {"ckpt": ckpt, "sources": [s for s, _ in fitting], "references": [t for _, t in fitting]}


def huge_line(sources: list[str]) -> str:
    """A 1 MB line of German words (about 450,000 subwords with the trained tokenizer)."""
    text = " ".join(sources)
    return (text * (1_000_000 // len(text) + 1))[:1_000_000]


def test_a_reader_of_standard_output_that_stops_early_ends_translation_quietly(
    trained: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`attnlab-translate ... | head -1`: once head exits, the next write fails with EPIPE, which printed
    `attnlab-translate: [Errno 32] Broken pipe` and, at exit, Python's own flush error."""
    source = tmp_path / "in.de"
    source.write_text("\n".join(trained["sources"] * 20) + "\n", encoding="utf-8")
    read, write = os.pipe()
    os.close(read)  # the reader is gone
    with open(write, "w", encoding="utf-8") as pipe:
        monkeypatch.setattr(sys, "stdout", pipe)
        with pytest.raises(SystemExit) as ended:
            translate_main([f"ckpt_path={trained['ckpt']}", f"input={source}", "device=cpu"])
        assert ended.value.code == 1  # a status, no message
        assert os.path.samestat(os.fstat(pipe.fileno()), os.stat(os.devnull))  # the rest goes nowhere
    assert capsys.readouterr().err == ""


def test_help_to_a_reader_that_stops_early_ends_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`attnlab-translate --help | head -1` ended with BrokenPipeError's traceback."""
    read, write = os.pipe()
    os.close(read)
    with open(write, "w", encoding="utf-8") as pipe:
        monkeypatch.setattr(sys, "stdout", pipe)
        with pytest.raises(SystemExit) as ended:
            translate_main(["--help"])
        assert ended.value.code == 1
        assert os.path.samestat(os.fstat(pipe.fileno()), os.stat(os.devnull))
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------------------
# One very long source line


def test_a_huge_line_is_cut_to_the_training_filter_limit_keeping_eos(trained: dict[str, Any]) -> None:
    translator = Translator.from_checkpoints([trained["ckpt"]])
    assert translator.source_limit()[0] == LIMIT  # decode.max_source_tokens=null: data.max_source_tokens
    line = huge_line(trained["sources"])
    full = translator.src_tokenizer.encode(line)
    assert len(full) > 100_000
    (cut,) = translator._source_ids([line])
    assert cut == [*full[: LIMIT - 1], translator.model.config.eos_id]
    assert translator.truncated == 1
    translator.truncated = 0
    short = trained["sources"][:3]
    assert translator.translate([*short, line])[:3] == translator.translate(short)
    assert translator.truncated == 1


def test_a_huge_line_through_attnlab_translate_is_cut_and_counted(
    trained: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source, target = tmp_path / "in.de", tmp_path / "out.en"
    lines = [*trained["sources"][:3], huge_line(trained["sources"]), trained["sources"][3]]
    source.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="attnlab.cli.translate"):
        translate_main([f"ckpt_path={trained['ckpt']}", f"input={source}", f"output={target}", "device=cpu"])
    out = target.read_text(encoding="utf-8").splitlines()
    assert len(out) == len(lines)
    assert len(out[3].split()) <= LIMIT + 5  # its output limit a·|S| + b (a=1, b=5) of the cut source
    messages = [r.getMessage() for r in caplog.records if r.name == "attnlab.cli.translate"]
    assert cuts(messages) == [
        f"1 source was cut to data.max_source_tokens={LIMIT} (the training filter's limit; set "
        "decode.max_source_tokens)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="attnlab.cli.translate"):
        translate_main([f"ckpt_path={trained['ckpt']}", f"input={source}", f"output={target}", "device=cpu",
                        "decode.max_source_tokens=8", "decode.beam=1"])  # fmt: skip
    messages = [r.getMessage() for r in caplog.records if r.name == "attnlab.cli.translate"]
    assert len(target.read_text(encoding="utf-8").splitlines()) == len(lines)
    tokenizer = Translator.from_checkpoints([trained["ckpt"]]).src_tokenizer
    longer = sum(len(ids) + 1 > 8 for ids in tokenizer.encode_batch(lines))  # eos included
    assert longer > 1 and cuts(messages) == [f"{longer} sources were cut to decode.max_source_tokens=8"]


def test_translations_without_eos_are_counted_in_a_warning(
    trained: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """attnlab-translate counted them without saying so (attnlab-eval records and warns); the n-best path
    counts them too."""
    source = tmp_path / "in.de"
    source.write_text("".join(f"{line}\n" for line in trained["sources"][:4]), encoding="utf-8")
    for nbest in ([], ["decode.nbest=2"]):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="attnlab.cli.translate"):
            translate_main([f"ckpt_path={trained['ckpt']}", f"input={source}", f"output={tmp_path / 'out'}",
                            "device=cpu", "decode.beam=2", "decode.min_len=500", *nbest])  # fmt: skip
        messages = [r.getMessage() for r in caplog.records if r.name == "attnlab.cli.translate"]
        assert messages == [
            "4 of 4 translations ran to their length limit without eos (decode.max_len_a=1.0, max_len_b=5, "
            "min_len=500)"
        ], nbest
    source.write_text(f"{trained['sources'][0]}\n", encoding="utf-8")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="attnlab.cli.translate"):
        translate_main([f"ckpt_path={trained['ckpt']}", f"input={source}", f"output={tmp_path / 'out'}",
                        "device=cpu", "decode.beam=1", "decode.min_len=500"])  # fmt: skip
    assert [r.getMessage() for r in caplog.records if r.name == "attnlab.cli.translate"] == [
        "1 of 1 translation ran to their length limit without eos (decode.max_len_a=1.0, max_len_b=5, "
        "min_len=500)"
    ]


def test_max_source_tokens_below_two_is_refused(trained: dict[str, Any]) -> None:
    with pytest.raises(SystemExit, match=r"max_source_tokens=1 must be >= 2 \(a token and eos\)"):
        translate_main([f"ckpt_path={trained['ckpt']}", "decode.max_source_tokens=1", "device=cpu"])


def test_a_huge_line_in_a_test_set_is_cut_and_counted_in_results(
    trained: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    translator = Translator.from_checkpoints([trained["ckpt"]])
    sources = [*trained["sources"][:5], huge_line(trained["sources"])]
    references = [*trained["references"][:5], "A very long sentence."]
    with caplog.at_level(logging.WARNING, logger="attnlab.inference.translator"):
        results = evaluate(translator, {"test": (sources, references)}, tmp_path)
    assert results["truncated_sources"] == 1
    assert results["sets"]["test"]["sentences"] == len(sources)
    assert results["decode"]["max_source_tokens"] is None
    unfinished = results["sets"]["test"]["unfinished"]  # this model rarely emits eos: also counted
    assert [r.getMessage() for r in caplog.records if r.name == "attnlab.inference.translator"] == [
        f"test: 1 source was cut to data.max_source_tokens={LIMIT} (the training filter's limit; set "
        "decode.max_source_tokens)",
        *([f"test: {unfinished} of {len(sources)} translations ran to their length limit without eos "
           "(decode.max_len_a=1.0, max_len_b=5, min_len=1)"] if unfinished else []),
    ]  # fmt: skip
    hypotheses = (tmp_path / "hypotheses" / "test.txt").read_text(encoding="utf-8")
    assert len(hypotheses.splitlines()) == len(sources)


def test_a_one_sentence_test_set_is_told_in_the_singular(
    trained: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """attnlab-eval's log of a set of one sentence that ran to its length limit: `1 sentence`, `1 of 1
    translation`, not `1 sentences`, `1 of 1 translations`."""
    translator = Translator.from_checkpoints([trained["ckpt"]], decode_overrides={"beam": 1, "min_len": 500})
    with caplog.at_level(logging.INFO, logger="attnlab.inference.translator"):
        evaluate(translator, {"one": (trained["sources"][:1], trained["references"][:1])}, tmp_path)
    said = [r.getMessage() for r in caplog.records if r.name == "attnlab.inference.translator"]
    assert [m.split(" (")[0] for m in said if "length limit" in m] == [
        "one: 1 of 1 translation ran to their length limit without eos"
    ]
    assert [m for m in said if m.startswith("one: BLEU")] and all(
        " (1 sentence, " in m for m in said if m.startswith("one: BLEU")
    ), said


def test_without_data_settings_the_limit_is_the_training_filter_default(trained: dict[str, Any]) -> None:
    translator = Translator.from_checkpoints([trained["ckpt"]])
    translator.data = None  # e.g. a checkpoint converted from elsewhere
    assert translator.source_limit() == (
        256,
        "the default decode.max_source_tokens=256 (the data settings are unknown)",
    )
    (cut,) = translator._source_ids([huge_line(trained["sources"])])
    assert len(cut) == 256 and translator.truncated == 1


# ---------------------------------------------------------------------------------------------------------
# Greedy decoding and beam search generate the same ids


def strip(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


@pytest.mark.parametrize("min_len", [1, 3])
def test_beam_one_equals_greedy_on_random_models(min_len: int) -> None:
    """Random, unsteered tiny models (no logit forced up or down; 4 seeds, vocabularies of 8 and 50) over
    40 sentences each: greedy decoding (`translate` with beam 1) never emits pad or bos, nor eos
    before `min_len`, and equals beam search with one beam."""
    differ, total = [], 0
    for seed in range(4):
        for vocab in (8, 50):
            torch.manual_seed(seed)
            model = Transformer(tiny_config(src_vocab_size=vocab, tgt_vocab_size=vocab)).eval()
            cfg = model.config
            src = random_source([1 + (7 * i + seed) % 12 for i in range(40)], vocab=vocab, seed=seed)
            kw = {"alpha": 0.0, "max_len_a": 1.0, "max_len_b": 4, "min_len": min_len}
            greedy = translate(model, src, DecodeConfig(beam=1, **kw))
            beams = [strip(hyps[0].tokens, cfg.eos_id) for hyps in beam_search(model, src, beam=1, **kw)]
            differ += [(seed, vocab, i) for i, (g, b) in enumerate(zip(greedy, beams, strict=True)) if g != b]
            total += len(greedy)
            assert not {cfg.pad_id, cfg.bos_id, cfg.start_id} & {t for row in greedy for t in row}
            assert all(len(row) >= min_len - 1 for row in greedy)  # eos is the min_len-th token or later
    assert not differ, f"{len(differ)} of {total} sentences differ (seed, vocab, sentence): {differ}"


# ---------------------------------------------------------------------------------------------------------
# Blank lines


BLANK = ["", " ", "\t \t", "\u3000\u2028", "\x0b\x0c"]


def test_blank_lines_translate_to_empty_lines(
    trained: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    translator = Translator.from_checkpoints([trained["ckpt"]])
    sentence = trained["sources"][0]
    (alone,) = translator.translate([sentence])
    assert alone != ""
    assert translator.translate([*BLANK, sentence]) == [""] * len(BLANK) + [alone]
    assert translator.translate(BLANK) == [""] * len(BLANK)
    text = "".join(f"{line}\n" for line in [sentence, *BLANK, sentence])
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), newline="\n"))
    translate_main([f"ckpt_path={trained['ckpt']}", "device=cpu"])
    assert capsys.readouterr().out == "".join(f"{line}\n" for line in [alone, *[""] * len(BLANK), alone])


# ---------------------------------------------------------------------------------------------------------
# One very long line in a validation or test set, in attnlab-train itself


def test_a_huge_line_in_the_validation_and_test_sets_is_cut_in_training(
    shared_data: Path, tmp_path: Path, trained: dict[str, Any]
) -> None:
    """The loss and the greedy validation decodes of `attnlab-train` run on validation and test sources
    cut to `data.max_source_tokens` (its default, 256, which only the 1 MB line exceeds; with sinusoidal
    positions, where no position table limits them): the run finishes in seconds and reports one cut
    sentence per set."""
    corpus = write_corpus(require_shared_data(shared_data), tmp_path / "corpus", SPLITS)
    huge = huge_line(trained["sources"])
    for split in ("valid", "test"):
        with open(corpus / f"{split}.de", "a", encoding="utf-8") as f:
            f.write(huge + "\n")
        with open(corpus / f"{split}.en", "a", encoding="utf-8") as f:
            f.write("A very long sentence.\n")
    overrides = [
        "data=files", f"data.dir={corpus}", "data.src_lang=de", "data.tgt_lang=en", "data.vocab_size=300",
        f"data.cache_dir={tmp_path / 'cache'}", "model=tiny", "model.pe=sinusoidal", "trainer.max_epochs=1",
        "logger=csv", "test=true", "decode.every_n_epochs=1", "decode.beam=1", "decode.max_len_a=1.0",
        "decode.max_len_b=5",
    ]  # fmt: skip

    def stalled(signum: int, frame: Any) -> None:
        raise TimeoutError("attnlab-train stalled on the 1 MB line (not cut)")

    previous = signal.signal(signal.SIGALRM, stalled)
    signal.alarm(180)  # the run takes seconds; without the cut it stalls for many minutes
    try:
        metrics = train(compose_train(overrides, tmp_path / "run"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert metrics["data/truncated/val"] == 1.0 and metrics["data/truncated/test"] == 1.0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["metrics"]["data/truncated/val"] == 1.0
    assert results["sets"]["test"]["sentences"] == SPLITS[2][2] + 1


DROPPED = object()


def saved_with(ckpt: Path, out: Path, decode: dict[str, Any] | None = None, **changes: Any) -> Path:
    """A copy of `ckpt` whose saved decoding settings are `decode` (None: none at all) or have `changes`
    (`DROPPED`: the key removed, as a version before it was saved)."""
    checkpoint = torch.load(ckpt, weights_only=True)
    saved = checkpoint["hyper_parameters"]["decode"]
    for key, value in changes.items():
        saved.pop(key) if value is DROPPED else saved.__setitem__(key, value)
    if decode is None and not changes:
        del checkpoint["hyper_parameters"]["decode"]
    torch.save(checkpoint, out)
    return out


def test_overrides_of_older_checkpoints_mean_what_they_meant(trained: dict[str, Any], tmp_path: Path) -> None:
    """A checkpoint of before `alpha` saved `lenpen` (the GNMT alpha): `decode.alpha` and
    `decode.length_penalty` replace it, as they did before overrides were applied before the check. A
    checkpoint without decoding settings takes the overrides over the defaults."""
    old = saved_with(
        trained["ckpt"], tmp_path / "old.ckpt", lenpen=0.8, alpha=DROPPED, length_penalty=DROPPED
    )
    with pytest.warns(FutureWarning):
        assert Translator.from_checkpoints([old], decode_overrides={}).decode.alpha == 0.8
    with pytest.warns(FutureWarning):
        assert Translator.from_checkpoints([old], decode_overrides={"alpha": 1.0}).decode.alpha == 1.0
    with pytest.warns(FutureWarning):
        fairseq = Translator.from_checkpoints([old], decode_overrides={"length_penalty": "fairseq"}).decode
    assert (fairseq.length_penalty, fairseq.alpha) == ("fairseq", 1.0)
    none = saved_with(trained["ckpt"], tmp_path / "none.ckpt")
    assert Translator.from_checkpoints([none], decode_overrides={"beam": 1}).decode.beam == 1


def test_a_bad_override_is_named_as_the_override_even_over_a_refused_saved_value(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    refused = saved_with(trained["ckpt"], tmp_path / "inf.ckpt", max_len_a=float("inf"))
    with pytest.raises(ValueError, match=r"max_len_a=-1\.0 must be >= 0") as info:
        Translator.from_checkpoints([refused], decode_overrides={"max_len_a": -1.0})
    assert not isinstance(info.value, CheckpointError)
    with pytest.raises(CheckpointError, match=r"inf\.ckpt holds decode settings .*max_len_a=inf"):
        Translator.from_checkpoints([refused], decode_overrides={"beam": 1})


def test_an_ensemble_decodes_with_the_first_checkpoints_settings_and_the_overrides(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """The other members' saved settings are not used, so overrides that fit the first's are not refused
    for theirs (the second has beam 2, the first beam 3: nbest 3 fits)."""
    first = saved_with(trained["ckpt"], tmp_path / "beam3.ckpt", beam=3)
    paths = [first, trained["ckpt"]]
    ensemble = Translator.from_checkpoints(paths, ensemble=True, decode_overrides={"nbest": 3})
    assert (ensemble.decode.beam, ensemble.decode.nbest) == (3, 3)


def test_translate_with_decode_null_writes_no_saved_nbest(
    trained: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = saved_with(trained["ckpt"], tmp_path / "nbest.ckpt", nbest=2)
    (tmp_path / "in.de").write_text(trained["sources"][0] + "\n", "utf-8")
    translate_main([f"ckpt_path={saved}", "decode=null", f"input={tmp_path / 'in.de'}", "device=cpu"])
    assert not capsys.readouterr().out.startswith("{")
