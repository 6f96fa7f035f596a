"""Clear messages where there used to be a traceback (issue 14 §5): a full disk during a checkpoint save,
a damaged prepared cache (rebuilt), data errors at the command line, unreadable run files in
`attnlab-compare`, the `average_last` message, and a multirun whose jobs failed."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from helpers import command_here, subprocess_path


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (skipped where mounting is not permitted, e.g. without root)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_a_full_disk_during_a_checkpoint_save_names_the_file_and_keeps_the_previous_one(
    small_disk: Path,
) -> None:
    """A real full disk: torch.save raises RuntimeError ("unexpected pos ..."), not the OSError."""
    from attnlab.training.checkpoint_io import AtomicCheckpointIO, CheckpointWriteError

    io, last = AtomicCheckpointIO(), small_disk / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.arange(1000.0)}, last)
    with pytest.raises(CheckpointWriteError) as raised:
        io.save_checkpoint({"step": 2, "w": torch.zeros(200_000)}, last)  # 800 KB on a 256 KiB disk
    message = str(raised.value)
    assert f"cannot write checkpoint {last}: No space left on device; the previous checkpoint there is " \
        "unchanged. Free disk space" in message and "resume=auto" in message  # fmt: skip
    saved = torch.load(last, weights_only=True)
    assert saved["step"] == 1 and torch.equal(saved["w"], torch.arange(1000.0))
    assert [p.name for p in last.parent.iterdir()] == ["last.ckpt"]  # the partial file removed


def test_a_full_disk_ends_the_cli_run_with_the_checkpoint_message_and_no_traceback(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attnlab-train` on a disk that fills up at the first checkpoint ends with the save's message
    (the file, the previous checkpoint kept, the fix) as its one line, the manifest saying failed."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    run_dir = small_disk / "run"
    with pytest.raises(SystemExit) as failed:
        command_here(monkeypatch, "train", "data=synthetic", "model=tiny", "model.d_model=128",
                     "data.n_train=32", "data.n_val=8", "data.n_test=8", "trainer.max_epochs=1", "logger=csv",
                     "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}")  # fmt: skip
    told = str(failed.value)
    assert told.startswith(f"attnlab-train: cannot write checkpoint {run_dir / 'checkpoints'}/"), told
    assert "No space left on device" in told and "Free disk space" in told
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"


@pytest.mark.usefixtures("full_for_results")
@pytest.mark.parametrize("manifest_too", [False, True], ids=["results", "then-manifest"])
def test_a_full_disk_writing_the_results_ends_the_cli_run_in_one_line_and_resume_auto_evaluates_again(
    manifest_too: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """After training, results.json cannot be written: `attnlab-train` ends with one line naming the file,
    what is unchanged and the fix, the same command with resume=auto in the run's directory (hydra.run.dir);
    the checkpoints are kept and the manifest says failed, or, where the full disk refuses that write too
    (`then-manifest`), an error says so and the run's own line still ends the command. The command given again
    with resume=auto trains nothing and writes results.json with the training's and the test's metrics. (It
    ended with OSError's traceback; then it named an attnlab-eval command, which cannot translate this run's
    synthetic data.)"""
    import attnlab.runs.layout as layout
    from attnlab.io import atomic_write_files

    if manifest_too:
        write, full = layout.atomic_write_files, []

        def then_full(files: dict[Path, bytes]) -> None:
            if full and any(path.name == "manifest.json" for path in files):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            try:
                write(files)
            except OSError:
                full.append(True)
                raise

        monkeypatch.setattr(layout, "atomic_write_files", then_full)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    run_dir = tmp_path / "run"
    run = ["train", "data=synthetic", "model=tiny", "data.n_train=32", "data.n_val=8", "data.n_test=8",
           "trainer.max_epochs=1", "logger=csv", "trainer.enable_progress_bar=false",
           f"hydra.run.dir={run_dir}"]  # fmt: skip
    with pytest.raises(SystemExit) as failed:
        command_here(monkeypatch, *run)
    assert str(failed.value) == (
        f"attnlab-train: cannot write {run_dir / 'results.json'}: No space left on device; the evaluation's "
        f"results.json, hypotheses, references and sources in {run_dir} are as they were. Free disk space, "
        f"then run the same command with resume=auto hydra.run.dir={run_dir}: it trains nothing more and "
        "evaluates again"
    )
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and not (run_dir / "results.json").exists()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    if manifest_too:
        assert manifest["status"] == "running" and "cannot record the run's end (failed)" in caplog.text
    else:
        assert manifest["status"] == "failed", manifest
        assert manifest["error"] == f"WriteError: {str(failed.value).removeprefix('attnlab-train: ')}"
    monkeypatch.setattr(layout, "atomic_write_files", atomic_write_files)  # space again
    command_here(monkeypatch, *run, "resume=auto")
    results = json.loads((run_dir / "results.json").read_text())["metrics"]
    assert {"val/loss", "train/loss_epoch", "test/loss"} <= set(results), results
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "finished"


def test_a_run_directory_removed_while_training_ends_the_cli_run_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rm -r` of the run directory in the first epoch: the next write (the CSV logger's) fails, and
    `attnlab-train` ends saying the directory is gone and the run must start again. (It ended with
    FileNotFoundError's traceback, the manifest's write failing in turn.)"""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as failed:
        command_here(monkeypatch, "train", "data=synthetic", "model=tiny", "data.n_train=64",
                     "data.batch_size=32", "data.n_val=8", "data.n_test=8", "trainer.max_epochs=1",
                     "logger=csv", "trainer.enable_progress_bar=false",
                     "+callbacks.rm._target_=probes.RemoveDirectoryAt", "+callbacks.rm.step=1",
                     f"+callbacks.rm.path={run_dir}", f"hydra.run.dir={run_dir}")  # fmt: skip
    assert str(failed.value) == (
        f"attnlab-train: the run directory {run_dir} was removed while the run was running, with its "
        "checkpoints and records: nothing is left to continue; start the run again"
    )


def write_run(directory: Path, seed: int, bleu: float) -> None:
    """A finished run directory as attnlab writes it (config, manifest, results)."""
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(f"seed: {seed}\nmodel:\n  pe: sinusoidal\n")
    manifest = {"status": "finished", "start_time": "2026-01-01T00:00:00", "end_time": "2026-01-01T00:30:00"}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    results = {"sets": {"test": {"bleu": bleu, "chrf": bleu + 20}}, "metrics": {"val/ppl": 5.0}}
    (directory / "results.json").write_text(json.dumps(results))


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("results.json", b'{"sets": {"test": {"bleu": 3', "Expecting"),  # cut short
        ("results.json", b'{"sets": {"test": 31.0}}', "test set 'test' has no numeric 'bleu'"),
        ("manifest.json", b'["finished"]', "it holds a JSON array, not an object"),
        ("manifest.json", b'{"status": "fini\xff"}', "invalid start byte"),  # not UTF-8
        # not YAML: PyYAML's problem and its line (`<` escaped in the Markdown report)
        ("config.yaml", b"seed: [3\n", "expected ',' or ']', but got '\\<stream end>' (line 2)"),
        ("manifest.json", b'{"status": "failed", "error": 5}', "its 'error' is a JSON number (5), not text"),
        (
            "manifest.json",
            b'{"status": "finished", "start_time": "2026-01-01T00:00:00+00:00", '
            b'"end_time": "2026-01-01T00:30:00"}',
            "cannot be compared (one has a timezone, the other not)",
        ),
        ("csv/metrics.csv", b"step,params/total\n0,12\xff3\n", "invalid start byte"),  # not UTF-8
        ("csv/metrics.csv", b"step,params/total\n0,abc\n", "params/total='abc' is not a number"),
    ],
)
def test_compare_lists_a_run_with_an_unreadable_file_and_compares_the_others(
    name: str, content: bytes, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnlab.cli.compare import main as compare_main

    for seed, bleu in ((1, 30.0), (2, 32.0), (3, 99.0)):
        write_run(tmp_path / "sweep" / f"seed={seed}", seed, bleu)
    run_dir = tmp_path / "sweep" / "seed=3"
    broken = run_dir / name
    broken.parent.mkdir(exist_ok=True)
    broken.write_bytes(content)
    compare_main([str(tmp_path / "sweep")])
    out = capsys.readouterr().out
    assert "| all | 2 | 31.00 ± 1.41" in out  # seeds 1 and 2; seed 3's 99.0 is not in it
    unreadable = out.split("Unreadable, not compared:\n")[1]
    assert unreadable.startswith(f"- {run_dir} (cannot read {broken}: ") and reason in unreadable


def test_compare_reads_a_run_whose_metrics_csv_is_damaged_outside_the_parameter_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the parameter count is read from `csv/metrics.csv`: a damaged cell elsewhere (a cut number,
    a row with an extra cell) leaves the run in the comparison."""
    from attnlab.cli.compare import main as compare_main

    for seed, bleu in ((1, 30.0), (2, 32.0)):
        write_run(tmp_path / "sweep" / f"seed={seed}", seed, bleu)
    csv_file = tmp_path / "sweep" / "seed=2" / "csv" / "metrics.csv"
    csv_file.parent.mkdir(exist_ok=True)
    csv_file.write_text("step,params/total,val/loss\n0,1234,\n1,,1.2e\n2,,3.0,7\n")
    compare_main([str(tmp_path / "sweep")])
    out = capsys.readouterr().out
    assert "| all | 2 | 31.00 ± 1.41" in out and "Unreadable" not in out


def test_average_last_with_too_few_epoch_checkpoints_names_the_setting(tmp_path: Path) -> None:
    from attnlab.runs.checkpoint import CheckpointError, last_kept_checkpoints

    epochs = tmp_path / "run" / "checkpoints" / "epochs"
    epochs.mkdir(parents=True)
    for epoch in (0, 1):
        (epochs / f"epoch{epoch:03d}.ckpt").write_bytes(b"")
    with pytest.raises(CheckpointError) as raised:
        last_kept_checkpoints(tmp_path / "run", 5)
    message = str(raised.value)
    assert "averaging the last 5 checkpoints needs 5, found 2" in message
    assert "train with average_last=5 to keep them, or lower it" in message and "{n}" not in message


def attnlab_train(*args: str, cwd: Path, full_error: bool = False) -> subprocess.CompletedProcess[str]:
    """`attnlab-train` as a user runs it: without the test session's HYDRA_FULL_ERROR=1 unless asked."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["ATTNLAB_LOG_DIR"] = str(cwd / "logs")
    if full_error:
        env["HYDRA_FULL_ERROR"] = "1"
    flags = [a for a in args if a.startswith("-")]  # Hydra's flags (-m) come before the overrides
    overrides = [a for a in args if a not in flags]
    command = [sys.executable, "-m", "attnlab.cli.train", *flags, "model=tiny", "trainer.max_epochs=1",
               "logger=csv", "trainer.enable_progress_bar=false", *overrides]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def write_corpus(directory: Path, src: dict[str, bytes], tgt: dict[str, bytes]) -> Path:
    """A `data=files` corpus: <split>.src / <split>.tgt with the given bytes."""
    directory.mkdir(parents=True)
    for suffix, files in (("src", src), ("tgt", tgt)):
        for split, data in files.items():
            (directory / f"{split}.{suffix}").write_bytes(data)
    return directory


LINES = {split: b"ein haus\nzwei hunde\ndrei katzen\n" for split in ("train", "valid", "test")}


def test_a_data_error_ends_the_run_with_its_message_and_a_traceback_only_with_hydra_full_error(
    tmp_path: Path,
) -> None:
    corpus = write_corpus(tmp_path / "corpus", LINES, {**LINES, "train": b"a house\n"})  # 3 lines vs 1
    run_dir = tmp_path / "run"
    done = attnlab_train("data=files", f"data.dir={corpus}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 1
    expected = (
        f"attnlab-train: data error: {corpus / 'train.src'} has 3 lines but {corpus / 'train.tgt'} has 1: "
        "parallel files must be aligned line by line"
    )
    assert done.stderr.strip().splitlines()[-1] == expected and "Traceback" not in done.stderr, done.stderr
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "DataError" in manifest["error"]

    corpus = write_corpus(
        tmp_path / "utf8", {**LINES, "valid": b"gut\n\xff\xfe\n"}, {**LINES, "valid": b"a\nb\n"}
    )
    done = attnlab_train(
        "data=files",
        f"data.dir={corpus}",
        f"hydra.run.dir={tmp_path / 'run2'}",
        cwd=tmp_path,
        full_error=True,
    )
    assert done.returncode != 0 and "Traceback (most recent call last)" in done.stderr
    assert f"DataError: {corpus / 'valid.src'}:2: invalid UTF-8" in done.stderr, done.stderr[-3000:]


def test_a_multirun_with_a_failed_job_runs_every_job_then_exits_non_zero_with_a_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job refused for its config (n_heads=3) and one whose training raises (a NaN loss under
    `optim.on_nonfinite=stop`) are recorded failed, and the other jobs run: the sweep exits 1 after
    all four, its last line the summary naming the failed jobs' manifests."""
    monkeypatch.setenv("PYTHONPATH", subprocess_path())  # probes.NonFiniteAt poisons step 1's loss
    sweep_dir = tmp_path / "sweep"
    done = attnlab_train(
        "-m", "data=synthetic", "data.n_train=32", "data.n_val=8", "data.n_test=8", "data.batch_size=16",
        "model.n_heads=4,3", "optim.on_nonfinite=stop,skip", "+callbacks.nan._target_=probes.NonFiniteAt",
        "+callbacks.nan.step=1", "+callbacks.nan.what=loss", "test=false", f"hydra.sweep.dir={sweep_dir}",
        "optimized_metric=val/bleu", cwd=tmp_path,
    )  # fmt: skip
    jobs = {p.name: json.loads((p / "manifest.json").read_text()) for p in sweep_dir.iterdir() if p.is_dir()}
    failed = sorted(name for name, manifest in jobs.items() if manifest["status"] == "failed")
    finished = [name for name, manifest in jobs.items() if manifest["status"] == "finished"]
    assert len(failed) == 3 and len(finished) == 1, jobs
    assert "n_heads=4" in finished[0] and "on_nonfinite=skip" in finished[0]
    raised = next(name for name in failed if "n_heads=4" in name)
    assert "training loss is nan at optimizer step 1" in jobs[raised]["error"], jobs[raised]
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("attnlab-train: multirun: 1 finished, 3 failed (see "), last
    assert all(str(sweep_dir / name / "manifest.json") in last for name in failed), last
    # the finished job has no val/bleu to give the sweeper: said, naming the setting
    assert "optimized_metric=val/bleu is not among this run's final metrics" in done.stdout + done.stderr


def small_corpus(root: Path) -> Path:
    """train/valid/test files of 60/8/8 short German-English pairs."""
    words_de = ["der", "hund", "die", "katze", "ein", "haus", "läuft"]
    words_en = ["the", "dog", "a", "cat", "house", "runs", "fast"]
    root.mkdir(parents=True)
    for split, n in (("train", 60), ("valid", 8), ("test", 8)):
        src = [" ".join(words_de[(i + k) % 7] for k in range(2 + i % 4)) for i in range(n)]
        tgt = [" ".join(words_en[(i + k) % 7] for k in range(2 + i % 5)) for i in range(n)]
        (root / f"{split}.de").write_text("".join(f"{line}\n" for line in src), encoding="utf-8")
        (root / f"{split}.en").write_text("".join(f"{line}\n" for line in tgt), encoding="utf-8")
    return root


def damage(directory: Path, how: str) -> None:
    if how.startswith("truncated "):
        path = directory / how.removeprefix("truncated ")
        data = path.read_bytes()
        path.unlink()  # a new, shorter file: the memory maps of the first load stay readable
        path.write_bytes(data[: len(data) // 2])
    elif how == "missing val.src.ids.npy":
        (directory / "val.src.ids.npy").unlink()
    elif how == "broken tokenizer.json":  # same size, other bytes
        data = (directory / "tokenizer.json").read_bytes()
        (directory / "tokenizer.json").write_bytes(b"#" * 16 + data[16:])
    elif how == "broken stats.json":
        (directory / "stats.json").write_text('{"splits": ["train", "val"')
    elif how == "no checksums (an old directory)":
        (directory / "checksums.json").unlink()


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("truncated train.tgt.ids.npy", "train.tgt.ids.npy has "),
        ("truncated val.src.offsets.npy", "val.src.offsets.npy has "),
        ("missing val.src.ids.npy", "val.src.ids.npy cannot be read (No such file or directory)"),
        ("broken tokenizer.json", "tokenizer.json differs from what was written (its SHA-256)"),
        ("broken stats.json", "stats.json has 26 bytes"),
        ("no checksums (an old directory)", "it has no checksums.json"),
    ],
)
def test_a_damaged_prepared_cache_is_detected_and_rebuilt_with_a_warning(
    how: str, reason: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from attnlab.data.corpora import FilesData
    from attnlab.data.prepare import prepare, prepared_dir

    spec = FilesData(dir=str(small_corpus(tmp_path / "corpus")), src_lang="de", tgt_lang="en",
                     vocab_size=120, cache_dir=str(tmp_path / "cache"))  # fmt: skip
    first = prepare(spec)
    directory = prepared_dir(spec)
    written = {p.name: p.read_bytes() for p in directory.iterdir()}
    damage(directory, how)
    with caplog.at_level(logging.WARNING):
        again = prepare(spec)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"the prepared data in {directory} is damaged: {reason}"), warnings
    assert warnings[0].endswith("; building it again")
    assert again.splits == first.splits and again.stats["splits"] == first.stats["splits"]
    assert again.src_tokenizer.to_json() == first.src_tokenizer.to_json()
    rebuilt = {p.name: p.read_bytes() for p in directory.iterdir()}
    assert rebuilt.keys() == written.keys() | {"checksums.json"}  # whole again, checksums recorded
    assert {n: d for n, d in rebuilt.items() if n.endswith((".npy", ".raw.json", "tokenizer.json"))} == {
        n: d for n, d in written.items() if n.endswith((".npy", ".raw.json", "tokenizer.json"))
    }
    assert [p.name for p in directory.parent.iterdir() if p.name.startswith(".")] == []  # no leftovers


def test_a_nonfinite_loss_ends_the_cli_run_with_its_message_and_no_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attnlab-train` prints a training error whose message is complete (here a NaN loss; a full disk's
    `CheckpointWriteError` likewise) in one line, exit status 1, the manifest saying failed."""
    monkeypatch.setenv("PYTHONPATH", subprocess_path())  # probes.NonFiniteAt poisons step 3's loss
    run_dir = tmp_path / "run"
    done = attnlab_train(
        "data=synthetic", "data.n_train=64", "data.batch_size=16", "test=false", f"hydra.run.dir={run_dir}",
        "+callbacks.nan._target_=probes.NonFiniteAt", "+callbacks.nan.step=3", "+callbacks.nan.what=loss",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("attnlab-train: training loss is nan at optimizer step 3 (epoch 0, batch 2)"), last
    assert "optim.on_nonfinite=skip" in last and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"
