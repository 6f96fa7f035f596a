"""What `attnlab-train` prints, read from a real run's console: the command run as a user runs it (Hydra's
job logging, Lightning's own handlers, W&B offline), its output written to a file (not a terminal)."""

from __future__ import annotations

import csv
import itertools
import logging
import os
import pty
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from attnlab.training.experiment import validate
from helpers import compose_train
from wandb_records import find_run_file, read_wandb_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROGRESS = re.compile(
    r"progress: step (?P<step>\d+)/(?P<total>\d+) \((?P<percent>\d+)%\)"
    r" \| epoch (?P<epoch>\d+)/(?P<epochs>\d+) \| loss (?P<loss>[0-9.e+-]+) \| (?P<tps>\d+) tgt tok/s"
    r" \| elapsed (?P<elapsed>\d+:\d\d:\d\d) \| ETA (?P<eta>\d+:\d\d:\d\d)$"
)
HYDRA_PREFIX = re.compile(r"^\[[^\]]+\]\[[^\]]+\]\[[A-Z]+\] - ")
LIGHTNING_PREFIX = re.compile(r"^(INFO|WARNING|ERROR|DEBUG): ")


@pytest.fixture(scope="module")
def console(translating_run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two epochs from the session's translating model (so the validation decodes and the attention
    heatmaps of two probe sentences of different lengths are real), W&B offline, a progress line every 2
    optimizer steps; stdout and stderr into one file."""
    tmp = tmp_path_factory.mktemp("console")
    run = tmp / "run"
    start = translating_run["dir"] / "checkpoints" / "last.ckpt"
    command = [
        sys.executable, "-m", "attnlab.cli.train", *translating_run["data"], f"init_from={start}",
        "optim=inverse_sqrt", "optim.peak_lr=1e-4", "optim.warmup_steps=5", "trainer.max_epochs=2",
        "decode.beam=2", "logger=wandb", "progress.every_n_steps=2", "progress.every_n_seconds=null",
        f"hydra.run.dir={run}",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", OMP_NUM_THREADS="1")
    log = tmp / "console.log"
    with open(log, "w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp, timeout=600)
    text = log.read_text("utf-8")
    assert done.returncode == 0, text[-3000:]
    return {"text": text, "lines": text.splitlines(), "run": run}


def message(line: str) -> str:
    """A console line without the prefix of Hydra's or Lightning's log format."""
    return LIGHTNING_PREFIX.sub("", HYDRA_PREFIX.sub("", line))


def test_each_message_is_printed_once(console: dict[str, Any]) -> None:
    lines = [line for line in console["lines"] if line.strip() and not line.startswith("wandb:")]
    plain = [line for line in lines if LIGHTNING_PREFIX.match(line)]
    assert not plain, f"Lightning's own handler printed: {plain}"
    repeated = [a for a, b in itertools.pairwise(lines) if message(a) == message(b)]
    assert not repeated, f"printed twice: {repeated}"
    assert sum("`Trainer.fit` stopped" in line for line in lines) == 1
    # warnings printed outside the log format (Python's `path:line: message`): each once at most, and not
    # the deprecation Lightning's own code triggers in torch
    raw = Counter(line for line in lines if not HYDRA_PREFIX.match(line) and re.match(r"^/\S+:\d+: ", line))
    assert all(count == 1 for count in raw.values()), raw
    assert "LeafSpec" not in console["text"]
    # Lightning's messages reach Hydra's log file of the run too, once
    train_log = (console["run"] / "train.log").read_text("utf-8")
    assert train_log.count("`Trainer.fit` stopped") == 1


def test_the_run_says_where_it_goes_and_each_validation_bleu(console: dict[str, Any]) -> None:
    """README, "The console": a run says where it goes, and `val BLEU` at each validation decode (every
    epoch here: the values logged as val/bleu)."""
    messages = [message(line) for line in console["lines"]]
    assert messages.count(f"run directory: {console['run']}") == 1
    said = [float(m.split()[2]) for m in messages if m.startswith("val BLEU ")]
    with open(console["run"] / "csv" / "metrics.csv", newline="") as f:
        logged = [float(row["val/bleu"]) for row in csv.DictReader(f) if row.get("val/bleu")]
    assert len(logged) == 2 and said == pytest.approx(logged, abs=0.006)


def test_no_third_party_advertising(console: dict[str, Any]) -> None:
    for word in ("💡", "Tip:", "litlogger", "LitLogger", "litmodels"):
        assert word not in console["text"], word


def test_the_model_summary_has_no_column_of_zeros(console: dict[str, Any]) -> None:
    lines = console["lines"]
    start = next(i for i, line in enumerate(lines) if line.endswith("model summary:"))
    header = [cell.strip() for cell in lines[start + 1].split("|")]
    assert {"Name", "Type", "Params"} <= set(header)
    rows = []
    for line in lines[start + 3 :]:
        if line.startswith("---"):
            break
        rows.append([cell.strip() for cell in line.split("|")])
    assert rows and all(len(row) == len(header) for row in rows)
    for column, name in enumerate(header):
        if name:
            assert any(row[column] not in ("0", "") for row in rows), f"column {name} is all zeros"
    assert "FLOPs" not in console["text"] and "Total Flops" not in console["text"]


def test_no_wandb_anonymous_warning(console: dict[str, Any]) -> None:
    assert "wandb: Tracking run" in console["text"]  # W&B did run
    assert "anonymous" not in console["text"]


def test_attention_heatmaps_of_different_sizes_log_without_warning(console: dict[str, Any]) -> None:
    record = read_wandb_run(find_run_file(console["run"]))
    assert {key for row in record.history for key in row if key.startswith("val/attention/")} == {
        "val/attention/0", "val/attention/1"}  # fmt: skip
    files = find_run_file(console["run"]).parent / "files" / "media" / "images" / "val" / "attention"
    # a PNG's width and height: bytes 16-24 of its header
    sizes = {png.read_bytes()[16:24] for png in files.glob("*.png")}
    assert len(sizes) > 1, "the probe heatmaps should differ in size"
    assert "Images sizes do not match" not in console["text"]


def test_progress_lines_when_the_console_is_not_a_terminal(console: dict[str, Any]) -> None:
    found = [PROGRESS.search(message(line)) for line in console["lines"] if "progress: " in line]
    assert all(found), [line for line in console["lines"] if "progress: " in line]
    assert len(found) >= 3
    steps = [int(m["step"]) for m in found]
    total = int(found[0]["total"])
    assert steps == sorted(set(steps)) and steps[-1] == total
    assert all(b - a == 2 for a, b in itertools.pairwise(steps[:-1]))  # every 2 steps, then the end
    assert all(float(m["loss"]) > 0 and int(m["tps"]) > 0 for m in found)
    assert [m["epochs"] for m in found] == ["2"] * len(found) and found[-1]["epoch"] == "2"
    assert found[-1]["eta"] == "0:00:00" and found[-1]["percent"] == "100"
    # no redraws of Lightning's progress bar in a file
    assert "━" not in console["text"] and "it/s" not in console["text"]


@pytest.fixture
def terminal() -> Iterator[Any]:
    """Standard output on a pseudo-terminal."""
    leader, follower = pty.openpty()
    stream = os.fdopen(follower, "w")
    try:
        yield stream
    finally:
        stream.close()
        os.close(leader)


def test_a_terminal_gets_lightnings_bar_and_no_lines(terminal: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.callbacks import TQDMProgressBar

    from attnlab.training.console import ModelSummary, ProgressLines, console_callbacks, is_terminal

    progress = {"every_n_seconds": 5, "every_n_steps": None}
    added, _ = console_callbacks([], {}, progress)
    assert [type(cb) for cb in added] == [ModelSummary, ProgressLines]  # pytest's captured output: a file
    assert added[1].every_n_seconds == 5
    monkeypatch.setattr(sys, "stdout", terminal)
    assert is_terminal()
    added, arguments = console_callbacks([], {}, progress)
    assert [type(cb) for cb in added] == [ModelSummary] and arguments == {"enable_model_summary": False}
    monkeypatch.undo()
    switched_off = {"enable_progress_bar": False, "enable_model_summary": False}
    added, arguments = console_callbacks([], switched_off, {})
    assert added == [] and arguments == {}
    added, _ = console_callbacks([TQDMProgressBar()], {}, progress)  # a configured bar is kept
    assert [type(cb) for cb in added] == [ModelSummary]
    added, arguments = console_callbacks([ModelSummary(max_depth=2)], {}, progress)  # a configured summary
    assert [type(cb) for cb in added] == [ProgressLines] and arguments == {}


def test_progress_by_seconds(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`progress.every_n_seconds`: lines at least that far apart, and a last one at the end."""
    from attnlab.training.pipeline import train

    overrides = ["data=synthetic", "model=tiny", "trainer.max_epochs=1", "+trainer.limit_train_batches=120",
                 "logger=csv", "test=false", "trainer.enable_progress_bar=true",
                 "progress.every_n_seconds=0.5", "progress.every_n_steps=null"]  # fmt: skip
    with caplog.at_level("INFO", logger="attnlab.training.console"):
        train(compose_train(overrides, tmp_path / "run"))
    records = [r for r in caplog.records if r.getMessage().startswith("progress: ")]
    assert len(records) >= 3, [r.getMessage() for r in records]
    gaps = [b.created - a.created for a, b in itertools.pairwise(records[:-1])]
    # the records' times are the wall clock's, the callback's the monotonic clock's: they may differ by
    # microseconds over half a second (a gap of 0.4999995 s was read once)
    assert all(gap >= 0.5 - 1e-3 for gap in gaps), gaps
    assert PROGRESS.search(records[-1].getMessage())["step"] == "120"


@pytest.mark.parametrize(
    ("override", "error"),
    [
        ("progress.every_n_steps=0", "progress.every_n_steps=0 must be an integer >= 1"),
        ("progress.every_n_seconds=-1", "progress.every_n_seconds=-1 must be a number of seconds > 0"),
        ("progress.every_n_seconds=0", "progress.every_n_seconds=0 must be a number of seconds > 0"),
        ("+progress.every_n_step=3", "progress.every_n_step is not a progress setting: did you mean"),
    ],
)
def test_bad_progress_settings_are_refused(tmp_path: Path, override: str, error: str) -> None:
    from attnlab.typed import ConfigError

    with pytest.raises(ConfigError, match=re.escape(error)):
        validate(compose_train(["data=synthetic", "model=tiny", override], tmp_path))


# --- ProgressLines on a stub trainer and a clock the test moves ----------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def progress_run(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    lines: Any,
    events: list[tuple],
    end: bool = False,
    **trainer_state: Any,
) -> list[str]:
    """Feed `lines` (a ProgressLines) a run: ("step", time, tokens seen[, loss]) ends an optimizer step
    (of loss 2.0 unless given), ("accumulate", time, tokens seen) a batch that accumulates gradients (no
    optimizer step), ("validate", start, end) a validation, then the end of training with `end`; returns
    the progress lines it logged. `trainer_state` sets the stub trainer's attributes."""
    import torch

    from attnlab.training import console

    clock = Clock()
    monkeypatch.setattr(console, "time", clock)
    trainer = SimpleNamespace(is_global_zero=True, current_epoch=0, global_step=0, sanity_checking=False,
                              callback_metrics={"train/loss_step": torch.tensor(2.0)},
                              estimated_stepping_batches=100, max_epochs=1)  # fmt: skip
    vars(trainer).update(trainer_state)
    module = SimpleNamespace(tokens_seen=0)
    with caplog.at_level(logging.INFO, logger=console.__name__):
        caplog.clear()
        lines.on_train_start(trainer, module)
        for kind, first, second, *loss in events:
            if kind == "validate":
                clock.now = first
                lines.on_validation_start(trainer, module)
                clock.now = second
                lines.on_validation_end(trainer, module)
            else:
                clock.now, module.tokens_seen = first, second
                trainer.callback_metrics["train/loss_step"] = torch.tensor(loss[0] if loss else 2.0)
                trainer.global_step += kind == "step"
                lines.on_train_batch_end(trainer, module, None, None, trainer.global_step - 1)
        if end:
            lines.on_train_end(trainer, module)
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress: ")]


def test_progress_lines_default_to_every_30_seconds(tmp_path: Path) -> None:
    from attnlab.training.console import ProgressLines

    assert ProgressLines().every_n_seconds == 30.0 and ProgressLines().every_n_steps is None
    assert compose_train([], tmp_path).progress.every_n_seconds == 30


def test_progress_lines_come_at_whichever_period_ends_first_and_none_with_both_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from attnlab.training.console import ProgressLines

    steps = [("step", t, 100 * i) for i, t in enumerate((5.0, 11.0, 12.0, 13.0, 14.0), start=1)]
    by_seconds = progress_run(
        monkeypatch, caplog, ProgressLines(every_n_seconds=10, every_n_steps=1000), steps
    )
    assert [line.split(" | ")[0] for line in by_seconds] == ["progress: step 2/100 (2%)"]  # at 11 s
    by_steps = progress_run(monkeypatch, caplog, ProgressLines(every_n_seconds=1000, every_n_steps=2), steps)
    assert [line.split(" | ")[0] for line in by_steps] == [
        "progress: step 2/100 (2%)",
        "progress: step 4/100 (4%)",
    ]
    off = ProgressLines(every_n_seconds=None, every_n_steps=None)
    assert not off.is_enabled and progress_run(monkeypatch, caplog, off, steps) == []


def test_progress_tokens_per_second_leave_validation_time_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from attnlab.training.console import ProgressLines

    events = [("validate", 2.0, 8.0), ("step", 12.0, 600)]  # 600 tokens in 12 s, 6 of them validating
    events.append(("step", 24.0, 1800))  # then 1200 in 12 s of training
    lines = progress_run(monkeypatch, caplog, ProgressLines(every_n_seconds=10), events)
    assert [line.split(" | ")[3] for line in lines] == ["100 tgt tok/s"] * 2


def test_progress_loss_and_speed_are_since_the_previous_line_and_the_eta_counts_validation(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """README, "The console": the mean training loss and the target tokens per second since the previous
    line (validation time left out), the time since training started, and the ETA: the remaining steps
    at the average time per step so far, validation included."""
    from attnlab.training.console import ProgressLines

    events = [("step", 1.0, 100, 4.0), ("step", 2.0, 200, 2.0),  # line 1: 200 tokens in 2 s
              ("validate", 2.0, 12.0), ("step", 13.0, 1200, 1.0), ("step", 14.0, 2200, 1.0)]  # fmt: skip
    lines = progress_run(monkeypatch, caplog, ProgressLines(every_n_seconds=None, every_n_steps=2), events)
    assert lines == [
        "progress: step 2/100 (2%) | epoch 1/1 | loss 3 | 100 tgt tok/s | elapsed 0:00:02 | ETA 0:01:38",
        # 2000 tokens in the 2 s of training since line 1; 96 steps left at 14 s / 4 steps: 5 min 36 s
        "progress: step 4/100 (4%) | epoch 1/1 | loss 1 | 1000 tgt tok/s | elapsed 0:00:14 | ETA 0:05:36",
    ]


def test_progress_lines_leave_out_nan_losses_sanity_checks_and_accumulation_and_end_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A non-finite step loss is left out of the mean, a sanity check's validation is no pause in
    training, a batch that only accumulates gradients writes no line, and the last step gets one line
    (none more when it had one); rank 0 only."""
    from attnlab.training.console import ProgressLines

    events = [("validate", 0.0, 4.0), ("step", 10.0, 1000, float("nan")), ("step", 20.0, 2000, 3.0),
              ("accumulate", 40.0, 2000), ("step", 41.0, 2100, 1.0)]  # fmt: skip
    lines = progress_run(monkeypatch, caplog, ProgressLines(every_n_seconds=15), events, end=True,
                         sanity_checking=True)  # fmt: skip
    assert [line.split(" | ")[:4] for line in lines] == [
        ["progress: step 2/100 (2%)", "epoch 1/1", "loss 3", "100 tgt tok/s"],
        ["progress: step 3/100 (3%)", "epoch 1/1", "loss 1.5", "5 tgt tok/s"],  # the accumulating batch's 2
    ]
    once = progress_run(monkeypatch, caplog, ProgressLines(every_n_steps=1), events[1:3], end=True)
    assert [line.split(" | ")[0] for line in once] == [
        "progress: step 1/100 (1%)",
        "progress: step 2/100 (2%)",
    ]
    other_rank = progress_run(monkeypatch, caplog, ProgressLines(every_n_steps=1), events, end=True,
                              is_global_zero=False)  # fmt: skip
    assert other_rank == []


def test_durations_read_in_hours_minutes_and_seconds() -> None:
    from attnlab.training.console import duration

    assert [duration(s) for s in (3725.2, 59.6, 86399, -3)] == ["1:02:05", "0:01:00", "23:59:59", "0:00:00"]


def test_the_model_summary_keeps_flops_when_measured(caplog: pytest.LogCaptureFixture) -> None:
    from attnlab.training.console import ModelSummary

    data = [("Name", ["encoder", "decoder"]), ("Params", ["1.2 K", "800"]), ("FLOPs", ["3 K", "2 K"])]
    with caplog.at_level(logging.INFO, logger="attnlab.training.console"):
        ModelSummary.summarize(data, 2000, 1500, 0.008, {"train": 5, "eval": 1}, total_flops=5000)
        ModelSummary.summarize(data, 2000, 1500, 0.008, {"train": 5}, total_flops=0)
    measured, unmeasured = (r.getMessage().splitlines() for r in caplog.records)
    assert measured[1].split(" | ") == ["Name   ", "Params", "FLOPs"] and measured[3].endswith("| 3 K")
    assert [(line[:10].strip(), line[11:]) for line in measured[-7:]] == [
        ("1.5 K", "trainable params"), ("500", "non-trainable params"), ("2.0 K", "total params"),
        ("0.008", "estimated model params size (MB)"), ("5", "modules in train mode"),
        ("1", "modules in eval mode"), ("5.0 K", "FLOPs of a forward pass")]  # fmt: skip
    assert "FLOPs" not in "\n".join(unmeasured)
    assert unmeasured[-1] == f"{'0':<10} modules in eval mode"


def test_lightnings_own_handler_goes_only_when_a_root_handler_prints_its_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """README, "The console": with no logging set up (no root handler) Lightning's console handler stays,
    or its messages would be lost; with one, it goes and Lightning's records reach the root's handler
    once. The advertising tips are dropped either way."""
    from attnlab.training.console import RANK_ZERO_LOGGER, route_lightning_logging

    lightning, root = logging.getLogger("lightning.fabric"), logging.getLogger()
    own = logging.StreamHandler()
    monkeypatch.setattr(lightning, "handlers", [own])
    monkeypatch.setattr(lightning, "propagate", False)
    monkeypatch.setattr(root, "handlers", [])
    route_lightning_logging()
    assert lightning.handlers == [own] and not lightning.propagate
    monkeypatch.setattr(root, "handlers", [logging.NullHandler()])
    route_lightning_logging()
    assert lightning.handlers == [] and lightning.propagate
    rank_zero = logging.getLogger(RANK_ZERO_LOGGER)
    assert not rank_zero.filter(logging.makeLogRecord({"msg": "💡 Tip: For seamless cloud logging, try"}))
    assert rank_zero.filter(logging.makeLogRecord({"msg": "GPU available: False, used: False"}))
