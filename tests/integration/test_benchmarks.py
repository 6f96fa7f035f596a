"""The benchmark scripts' harnesses run (`--quick`: tiny shapes on the CPU; no timing is asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_gpu_train_quick_reports_throughput_and_mfu(capsys: pytest.CaptureFixture[str]) -> None:
    load("bench_gpu_train").main(["--quick"])
    table = capsys.readouterr().out.strip().splitlines()
    assert table[-3] == "| compile | target tokens/s | model TFLOP/s | MFU | final loss |"
    cells = [c.strip() for c in table[-1].strip("|").split("|")]
    assert cells[0] == "off" and float(cells[1].replace(",", "")) > 0 and cells[3].endswith("%")
    assert 0 < float(cells[3][:-1]) < 100  # a utilisation, measured against the same device's matmul rate
