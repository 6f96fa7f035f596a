"""No command destroys a user's file: `attnlab-translate output=` is checked (checkpoint, input, output
directory, output not the input) before anything is written and is replaced only by a complete file;
`attnlab-compare --out` and `--plots` and attnlab-eval's hypotheses and references are written the same
way, so a run that fails (here: a write that fails as on a full disk) leaves the file there before
byte-identical, and no temporary file behind."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from attnlab.cli.compare import main as compare_main
from attnlab.cli.eval import evaluate_checkpoint
from attnlab.cli.translate import main as translate_main
from attnlab.runs.checkpoint import BUNDLE_KEY
from attnlab.training.pipeline import train
from attnlab.typed import ConfigError
from helpers import (
    command_here,
    compose_eval,
    compose_train,
    file_size_limit,
    require_shared_data,
    write_corpus,
)

SPLITS = (("train", "train", 300), ("valid", "val", 30), ("test", "test2016", 20))
OLD = b"an earlier translation\nthat must survive\n" * 40  # 1640 bytes


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One epoch of the tiny model on 300 Multi30k lines (greedy decoding, short outputs)."""
    tmp = tmp_path_factory.mktemp("output_files")
    corpus = write_corpus(require_shared_data(shared_data), tmp / "corpus", SPLITS)
    overrides = [
        "data=files", f"data.dir={corpus}", "data.src_lang=de", "data.tgt_lang=en", "data.vocab_size=300",
        f"data.cache_dir={tmp / 'cache'}", "model=tiny", "trainer.max_epochs=1", "logger=csv", "test=false",
        "decode.every_n_epochs=0", "decode.beam=1", "decode.max_len_a=0.5", "decode.max_len_b=3",
    ]  # fmt: skip
    train(compose_train(overrides, tmp / "run"))
    return {"ckpt": tmp / "run" / "checkpoints" / "last.ckpt", "corpus": corpus}


def existing(path: Path, data: bytes = OLD) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def names(directory: Path) -> list[str]:
    """Every file under `directory` (relative paths): a leftover temporary file shows here."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def translate(trained: dict[str, Any], *args: str) -> str:
    """Run attnlab-translate in-process; the message it exits with ("" when it succeeded)."""
    try:
        translate_main([f"ckpt_path={trained['ckpt']}", "device=cpu", *args])
    except SystemExit as exc:
        assert exc.code not in (None, 0)
        return str(exc.code)
    return ""


# ---------------------------------------------------------------------------------------------------------
# attnlab-translate


def source_file(trained: dict[str, Any], directory: Path, lines: int = 6) -> Path:
    text = (trained["corpus"] / "test.de").read_text("utf-8").splitlines()[:lines]
    return existing(directory / "in.de", "".join(f"{line}\n" for line in text).encode("utf-8"))


@pytest.mark.parametrize("how", ["same path", "relative path", "symbolic link", "hard link", "stdin"])
def test_output_that_is_the_input_is_refused_and_the_file_is_intact(
    trained: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    source = source_file(trained, tmp_path)
    before = source.read_bytes()
    output, args = str(source), [f"input={source}"]
    if how == "relative path":
        (tmp_path / "sub").mkdir()
        monkeypatch.chdir(tmp_path / "sub")
        output = "../in.de"
    elif how == "symbolic link":
        (tmp_path / "link.de").symlink_to(source)
        output = str(tmp_path / "link.de")
    elif how == "hard link":
        os.link(source, tmp_path / "same.de")
        output = str(tmp_path / "same.de")
    elif how == "stdin":  # attnlab-translate output=in.de < in.de
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.FileIO(source), newline="\n"))
        args = []
    files = names(tmp_path)
    message = translate(trained, *args, f"output={output}")
    if how == "stdin":
        sys.stdin.close()  # the file opened above (sys.stdin is restored after the test)
    assert f"output={output} is the input file" in message
    assert "choose another output file" in message
    assert source.read_bytes() == before
    assert names(tmp_path) == files


@pytest.mark.parametrize("how", ["the file", "its run directory", "a symbolic link", "averaged", "ensemble"])
def test_output_that_is_the_checkpoint_translating_is_refused_and_the_checkpoint_is_intact(
    trained: dict[str, Any], tmp_path: Path, how: str
) -> None:
    """`output=` naming the checkpoint being translated with replaced the trained model by the
    translations, without a word; it is refused like the input file, however the checkpoint was named
    (as one of the files averaged or ensembled, too), and the checkpoint is left byte for byte."""
    ckpt = tmp_path / "run" / "checkpoints" / "best-epoch000-step1.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(trained["ckpt"].read_bytes())
    other = existing(tmp_path / "other.ckpt", trained["ckpt"].read_bytes())
    output, named = (
        ckpt,
        {
            "the file": [f"ckpt_path={ckpt}"],
            "its run directory": [f"ckpt_path={tmp_path / 'run'}"],
            "a symbolic link": [f"ckpt_path={ckpt}"],
            "averaged": [f"ckpt_path={tmp_path / 'run'}", "average_last=1"],
            "ensemble": [f"ckpt_path=[{other},{ckpt}]", "ensemble=true"],
        }[how],
    )
    if how == "averaged":  # the run's last epoch checkpoint (averaging reads checkpoints/epochs/)
        (ckpt.parent / "epochs").mkdir()
        output = ckpt.rename(ckpt.parent / "epochs" / "epoch000.ckpt")
    if how == "a symbolic link":
        (tmp_path / "link.ckpt").symlink_to(ckpt)
        output = tmp_path / "link.ckpt"
    source = source_file(trained, tmp_path / "in")
    before, files = output.read_bytes(), names(tmp_path)
    message = translate(trained, *named, f"input={source}", f"output={output}")
    assert f"output={output} is the checkpoint being translated with" in message, message
    assert "replace the trained model; choose another output file" in message
    assert output.read_bytes() == before
    assert names(tmp_path) == files


@pytest.mark.parametrize("checkpoint", ["missing", "not a checkpoint"])
def test_a_bad_checkpoint_leaves_an_existing_output_byte_identical(
    trained: dict[str, Any], tmp_path: Path, checkpoint: str
) -> None:
    source, output = source_file(trained, tmp_path), existing(tmp_path / "out.en")
    bad = tmp_path / "bad.ckpt"
    if checkpoint == "not a checkpoint":
        bad.write_text("this is not a checkpoint\n")
    files = names(tmp_path)
    message = translate(trained, f"ckpt_path={bad}", f"input={source}", f"output={output}")
    assert str(bad) in message
    assert f"nothing was written to {output} (a file there before is unchanged)" in message
    assert output.read_bytes() == OLD
    assert names(tmp_path) == files


@pytest.mark.parametrize("where", ["missing directory", "under a file", "a directory"])
def test_an_output_that_cannot_be_written_is_refused_before_translating(
    trained: dict[str, Any], tmp_path: Path, where: str
) -> None:
    source = source_file(trained, tmp_path)
    output = {
        "missing directory": tmp_path / "no" / "such" / "out.en",
        "under a file": source / "out.en",
        "a directory": tmp_path,
    }[where]
    files = names(tmp_path)
    message = translate(trained, f"input={source}", f"output={output}")
    assert message.startswith(f"attnlab-translate: output={output}")
    assert ("choose another output" in message) or ("name a file" in message)
    assert names(tmp_path) == files
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("where", ["missing", "a directory"])
def test_an_input_that_cannot_be_read_is_named_with_the_fix(
    trained: dict[str, Any], tmp_path: Path, where: str
) -> None:
    """`input=<a directory>` ended with `[Errno 21] Is a directory: ...`, naming neither the key nor a fix."""
    source = tmp_path / "no_such.de" if where == "missing" else tmp_path
    why = "No such file or directory" if where == "missing" else "Is a directory"
    message = translate(trained, f"input={source}")
    assert message == (
        f"attnlab-translate: input={source}: {why}: give a text file, one sentence per line, or input=- "
        "(standard input)"
    )


def test_an_error_mid_stream_leaves_the_old_output_and_no_temporary_file(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """Three chunks of good lines are translated, then a line that is not UTF-8 stops the run; once the
    input is fixed, the same command replaces the output."""
    source, output = source_file(trained, tmp_path), existing(tmp_path / "out.en")
    good = source.read_bytes()
    source.write_bytes(good + b"ein Stra\xdfenfest\nnoch eine Zeile\n")
    files = names(tmp_path)
    message = translate(trained, f"input={source}", f"output={output}", "chunk_lines=2")
    assert f"{source}, line 7, byte 9: not UTF-8 text" in message
    assert f"nothing was written to {output}" in message
    assert output.read_bytes() == OLD
    assert names(tmp_path) == files
    source.write_bytes(good)
    assert translate(trained, f"input={source}", f"output={output}", "chunk_lines=2") == ""
    assert len(output.read_text("utf-8").splitlines()) == 6
    assert names(tmp_path) == files


@contextmanager
def not_a_regular_file(kind: str, directory: Path) -> Iterator[tuple[str, Path, Any]]:
    """(the output name, the path whose kind must stay, a reader of what was written to it) for
    `kind`: a FIFO, a character device (1, 3: a null device made in `directory`, never the real
    /dev/null; skipped where it cannot be made or opened), or a pipe named as /dev/stdout names it
    (/proc/self/fd/N, whose real path /proc/PID/fd/pipe:[N] names no file). The read ends are opened
    first, non-blocking: the small outputs fit in the pipe's buffer, and a pipe that was never written
    reads as empty instead of hanging."""
    if kind == "character device":
        device = directory / "null"
        try:
            os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            with open(device, "wb"):
                pass
        except OSError as exc:
            pytest.skip(f"cannot make and open a character device here: {exc}")
        yield str(device), device, lambda: b""
        return
    if kind == "fifo":
        fifo = directory / "fifo"
        os.mkfifo(fifo)
        read_end = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        name, kept = str(fifo), fifo
    else:  # "pipe"
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        name = f"/proc/self/fd/{write_end}"
        kept = Path(name)

    def received() -> bytes:
        if kind == "pipe":
            os.close(write_end)  # our own write end: the reader sees the end once every writer closed
        chunks = []
        with suppress(BlockingIOError):
            while chunk := os.read(read_end, 1 << 16):
                chunks.append(chunk)
        return b"".join(chunks)

    try:
        yield name, kept, received
    finally:
        os.close(read_end)
        if kind == "pipe":
            with suppress(OSError):
                os.close(write_end)


KINDS = {"fifo": stat.S_ISFIFO, "character device": stat.S_ISCHR, "pipe": stat.S_ISFIFO}


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_output_that_is_a_device_or_a_pipe_is_written_to_never_replaced(
    trained: dict[str, Any], tmp_path: Path, kind: str
) -> None:
    """`output=/dev/null` or `output=/dev/stdout` (on a pipe) writes there; the device or pipe stays what
    it is (a rename would put a regular file in its place), and no temporary file is left."""
    source = source_file(trained, tmp_path)
    with not_a_regular_file(kind, tmp_path) as (output, kept, received):
        before = sorted(os.listdir(tmp_path))
        assert translate(trained, f"input={source}", f"output={output}") == ""
        assert KINDS[kind](os.stat(kept).st_mode)
        if kind != "character device":
            assert len(received().decode("utf-8").splitlines()) == 6
        assert sorted(os.listdir(tmp_path)) == before
    message = translate(trained, f"input={source}", f"output={source}")  # the input is still refused
    assert "is the input file" in message


def test_compare_out_to_a_fifo_writes_the_table_into_it(sweep: Path, tmp_path: Path) -> None:
    with not_a_regular_file("fifo", tmp_path) as (output, kept, received):
        compare_main([str(sweep), "--out", output])
        assert stat.S_ISFIFO(os.stat(kept).st_mode)
        assert received().decode("utf-8").startswith("| group")


# ---------------------------------------------------------------------------------------------------------
# attnlab-eval


def eval_config(trained: dict[str, Any], out: Path, *overrides: str) -> Any:
    return compose_eval([f"ckpt_path={trained['ckpt']}", *overrides], out)


def test_a_failing_eval_leaves_earlier_hypotheses_references_and_results(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    """The file-size limit lets eval's first file (the hypotheses, one token a line) through and fails a
    later, larger one: hypotheses, references and results.json must still all be the earlier ones."""
    short = ("decode.max_len_a=0", "decode.max_len_b=1")
    evaluate_checkpoint(eval_config(trained, tmp_path / "sizes", *short))  # what it writes, without a limit
    sizes = {name: (tmp_path / "sizes" / name).stat().st_size for name in names(tmp_path / "sizes")}
    first = next(name for name in sizes if name.startswith("hypotheses/"))
    assert max(sizes.values()) > sizes[first]  # a later file cannot be written under the limit
    out = tmp_path / "eval"
    earlier = {name: OLD for name in sizes if name != "results.json"}
    earlier["results.json"] = json.dumps({"sets": {"test": {"bleu": 1.0}}}).encode()
    for name, data in earlier.items():
        existing(out / name, data)
    with file_size_limit(sizes[first]), pytest.raises(OSError, match="File too large"):
        evaluate_checkpoint(eval_config(trained, out, *short))
    assert {name: (out / name).read_bytes() for name in earlier} == earlier
    assert names(out) == sorted(earlier)


@pytest.mark.usefixtures("full_for_results")
def test_a_full_disk_ends_attnlab_eval_in_one_line_naming_the_file_and_the_fix(
    trained: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """results.json cannot be written (ENOSPC): one line, the file, what is unchanged and the fix; nothing
    written. (It ended with OSError's traceback.)"""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as failed:
        command_here(monkeypatch, "eval", f"ckpt_path={trained['ckpt']}", "decode.max_len_a=0",
                     "decode.max_len_b=1", f"hydra.run.dir={out}")  # fmt: skip
    assert str(failed.value) == (
        f"attnlab-eval: cannot write {out / 'results.json'}: No space left on device; the evaluation's "
        f"results.json, hypotheses, references and sources in {out} are as they were. Free disk space, then "
        "run attnlab-eval again"
    )
    assert not out.exists()  # (Hydra's record alone, removed: nothing else was written)


DAMAGES = {
    "empty state_dict": lambda ckpt: ckpt.update(state_dict={}),
    "wrong state_dict": lambda ckpt: ckpt["state_dict"].update(
        {key: value[:1] for key, value in ckpt["state_dict"].items() if value.dim() == 2}
    ),
    "src_tokenizer not JSON": lambda ckpt: ckpt[BUNDLE_KEY].update(src_tokenizer="not a tokenizer {"),
    "tgt_tokenizer JSON of another thing": lambda ckpt: ckpt[BUNDLE_KEY].update(tgt_tokenizer='{"a": 5}'),
    "data.max_source_tokens=0 (every source cut to nothing)": lambda ckpt: ckpt[BUNDLE_KEY]["data"].update(
        max_source_tokens=0
    ),
    "data.max_source_tokens=1 (eos alone fits)": lambda ckpt: ckpt[BUNDLE_KEY]["data"].update(
        max_source_tokens=1
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_checkpoint_with_unusable_weights_or_tokenizers_is_refused_by_translate_and_eval(
    trained: dict[str, Any], tmp_path: Path, damage: str
) -> None:
    """A checkpoint that loads but whose state_dict does not fit its model settings, or whose tokenizer
    entry is not tokenizer JSON: a message naming the file and what to do, no traceback, and nothing
    written (translate's output and eval's results stay byte-identical)."""
    checkpoint = torch.load(trained["ckpt"], weights_only=True)
    DAMAGES[damage](checkpoint)
    bad = tmp_path / "bad.ckpt"
    torch.save(checkpoint, bad)
    expected = f"{bad}: its {'' if 'state_dict' in damage else damage.split()[0]}"
    source, output = source_file(trained, tmp_path), existing(tmp_path / "out.en")
    message = translate(trained, f"ckpt_path={bad}", f"input={source}", f"output={output}")
    assert message.startswith(f"attnlab-translate: {expected}")
    assert "the file is damaged or not written by attnlab-train" in message
    assert "use another checkpoint" in message
    assert output.read_bytes() == OLD
    out = tmp_path / "eval"
    results = existing(out / "results.json")
    with pytest.raises(ConfigError) as raised:
        evaluate_checkpoint(eval_config({"ckpt": bad}, out))
    assert str(raised.value) == message.removeprefix("attnlab-translate: ").split("; nothing was written")[0]
    assert results.read_bytes() == OLD
    assert names(out) == ["results.json"]


# ---------------------------------------------------------------------------------------------------------
# attnlab-compare


def write_run(directory: Path, pe: str, seed: int, bleu: float) -> None:
    """A finished run directory as attnlab-compare reads it."""
    directory.mkdir(parents=True)
    config = {"seed": seed, "model": {"pe": pe}, "paths": {"output_dir": str(directory)}}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    (directory / "manifest.json").write_text(json.dumps({"status": "finished"}))
    (directory / "results.json").write_text(json.dumps({"sets": {"test2016": {"bleu": bleu, "chrf": 50.0}}}))
    (directory / "csv").mkdir()
    (directory / "csv" / "metrics.csv").write_text("step,epoch,val/loss\n10,0,4.0\n20,1,3.0\n")


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    for pe in ("sinusoidal", "learned"):
        for seed in (1, 2):
            write_run(tmp_path / "sweep" / f"pe={pe},seed={seed}", pe, seed, 30.0 + seed + (pe == "learned"))
    return tmp_path / "sweep"


def test_a_failing_compare_out_leaves_the_earlier_table(sweep: Path, tmp_path: Path) -> None:
    table = existing(tmp_path / "table.md")
    with file_size_limit(64), pytest.raises(SystemExit) as exited:
        compare_main([str(sweep), "--out", str(table)])
    assert str(exited.value) == (
        f"attnlab-compare: cannot write --out {table}: File too large; a file there before is unchanged. "
        "Free disk space or choose another --out"
    )
    assert table.read_bytes() == OLD
    assert names(tmp_path).count("table.md") == 1 and not any(".tmp" in n for n in names(tmp_path))
    compare_main([str(sweep), "--out", str(table)])  # without the limit: the new table
    assert table.read_text().startswith("| group")


def test_compare_out_inside_a_compared_run_directory_is_refused(sweep: Path, tmp_path: Path) -> None:
    """`--out <run>/results.json` replaced that run's results with the table, and the run was unreadable
    from then on: --out inside a run directory the comparison reads is refused, whatever way it is named
    (a symbolic link to the sweep), and nothing is written; beside the runs it is written."""
    run = sweep / "pe=learned,seed=1"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    (tmp_path / "link").symlink_to(sweep)
    for out in (run / "results.json", run / "manifest.json", tmp_path / "link" / run.name / "table.md"):
        with pytest.raises(SystemExit) as exited:
            compare_main([str(sweep), "--out", str(out)])
        assert str(exited.value) == (
            f"attnlab-compare: --out {out} is inside the run directory {run}, which this comparison reads: "
            "writing the table there could replace one of the run's files. Write it outside the run "
            "directories (e.g. into the sweep directory)"
        )
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    compare_main([str(sweep), "--out", str(sweep / "table.md")])  # the sweep directory: no run's
    assert (sweep / "table.md").read_text().startswith("| group")


def test_failing_plots_leave_the_earlier_plots(sweep: Path, tmp_path: Path) -> None:
    """The file-size limit lets the first plot through and fails a later, larger one: every plot must
    still be the earlier one."""
    import matplotlib.pyplot  # noqa: F401  (its font cache is written before the limit)

    compare_main([str(sweep), "--plots", str(tmp_path / "sizes")])  # the plots, without a limit
    sizes = {name: (tmp_path / "sizes" / name).stat().st_size for name in names(tmp_path / "sizes")}
    first = "test_test2016_bleu_by_group.png"  # drawn and written first
    assert max(sizes.values()) > sizes[first]
    plots = tmp_path / "plots"
    for name in sizes:
        existing(plots / name)
    order = [first, "validation_curves.png", "test_test2016_bleu_vs_params.png"]  # as they are written
    failing = next(name for name in order if sizes[name] > sizes[first])  # named, not the directory
    with (
        file_size_limit(sizes[first]),
        pytest.raises(
            SystemExit, match=f"cannot write plot {re.escape(str(plots / failing))}: File too large"
        ),
    ):
        compare_main([str(sweep), "--plots", str(plots)])
    assert {name: (plots / name).read_bytes() for name in sizes} == dict.fromkeys(sizes, OLD)
    assert names(plots) == sorted(sizes)


def test_file_names_are_taken_as_typed(
    trained: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`output=-` is standard output (YAML would read `-` as a list and write a file named `[None]`), and
    a number is a file name, not a file descriptor."""
    source = source_file(trained, tmp_path)
    monkeypatch.chdir(tmp_path)
    assert translate(trained, f"input={source}", "output=-") == ""
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 6 and any(printed)
    assert translate(trained, f"input={source}", "output=2024") == ""
    assert (tmp_path / "2024").read_text("utf-8").splitlines() == printed
    assert names(tmp_path) == ["2024", "in.de"]
    (tmp_path / "7").write_bytes(Path(trained["ckpt"]).read_bytes())  # a checkpoint named by a number
    translate_main(["ckpt_path=7", "device=cpu", f"input={source}", "output=-"])
    assert capsys.readouterr().out.splitlines() == printed


@pytest.mark.parametrize("umask", [0o077, 0o022, 0o002])
def test_new_files_get_the_permissions_open_would_give_and_replaced_files_keep_theirs(
    umask: int, tmp_path: Path
) -> None:
    """Atomic writes (run records, results, checkpoints) create a new file as `open` would (0o666 less the
    umask) and keep the permission bits of a file they replace."""
    from attnlab.io import atomic_write_bytes
    from attnlab.training.checkpoint_io import AtomicCheckpointIO

    previous = os.umask(umask)
    try:
        atomic_write_bytes(tmp_path / "results.json", b"{}\n")
        AtomicCheckpointIO().save_checkpoint({"step": 1}, tmp_path / "last.ckpt")
        with open(tmp_path / "plain", "wb"):
            pass
    finally:
        os.umask(previous)
    expected = stat.S_IMODE(os.stat(tmp_path / "plain").st_mode)
    assert expected == 0o666 & ~umask
    for name in ("results.json", "last.ckpt"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == expected, name
        os.chmod(tmp_path / name, 0o640)
    atomic_write_bytes(tmp_path / "results.json", b"[]\n")
    AtomicCheckpointIO().save_checkpoint({"step": 2}, tmp_path / "last.ckpt")
    for name in ("results.json", "last.ckpt"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o640, name
