"""scripts/gpu_check.py, whose first run on a GPU must not be wasted: its preconditions fail fast with
one clear line, every `attnlab-train` command it would start composes and validates, and its dry run
(`--device cpu`) writes the JSON summary and the table (the training check run here; the decoding
harness is run by test_benchmarks.py, the DDP check by hand: docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from attnlab.training.experiment import validate
from helpers import compose_train

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["gpu_check"]


def test_a_missing_package_is_named_with_how_to_get_it(gpu_check, tmp_path: Path) -> None:
    modules = {"json": "json", "attnlab_no_such_module": "no-such-dist"}
    named = r"missing Python packages in this Python: no-such-dist\. "
    how = r".*gpu_check\.py --download-wheels WHEELS --python-version 3\.\d+ no-such-dist, then pass --wheels"
    with pytest.raises(gpu_check.Precondition, match=named + how):
        gpu_check.ensure_packages(None, modules)
    with pytest.raises(gpu_check.Precondition, match=r"--wheels .*: no such directory"):
        gpu_check.ensure_packages(tmp_path / "absent", modules)
    with pytest.raises(gpu_check.Precondition, match=f"in the wheels in {tmp_path}: no-such-dist"):
        gpu_check.ensure_packages(tmp_path, modules)  # pip finds nothing there: still named
    gpu_check.ensure_packages(None, {"json": "json"})  # nothing missing: no error


def test_no_cuda_or_no_data_stops_before_any_check(
    gpu_check, tmp_path: Path, capsys: pytest.CaptureFixture[str], shared_data: Path
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "out"
    data = str(shared_data / "multi30k")
    assert gpu_check.main(["--device", "cuda", "--out", str(out), "--data", data]) == 2
    assert "gpu_check: CUDA is not available to torch" in capsys.readouterr().err
    assert gpu_check.main(["--device", "cpu", "--out", str(out), "--data", str(tmp_path)]) == 2
    assert "missing train.de, train.en, val.de" in capsys.readouterr().err
    assert not out.exists()  # nothing ran
    with pytest.raises(SystemExit):
        gpu_check.main(["--device", "cpu", "--skip", "trian"])
    assert "--skip trian: unknown" in capsys.readouterr().err


@pytest.mark.parametrize("device,devices", [("cpu", 2), ("cuda", 2), ("cuda", 8)])
def test_the_ddp_check_runs_compose_and_accumulate_as_many_batches_as_there_are_ranks(
    gpu_check, tmp_path: Path, device: str, devices: int
) -> None:
    n, runs = gpu_check.ddp_runs(device, devices, tmp_path / "multi30k")
    assert n == devices
    configs = {name: compose_train(overrides, tmp_path / name) for name, overrides in runs.items()}
    one, ddp = configs["one"].trainer, configs["ddp"].trainer
    assert (one.devices, one.accumulate_grad_batches) == (1, n)
    assert (ddp.devices, ddp.accumulate_grad_batches, ddp.strategy) == (n, 1, "ddp")
    assert one.max_steps == ddp.max_steps and one.limit_val_batches == 0
    if device == "cpu":  # the GPU runs' data is not here; their configs composed above
        for cfg in configs.values():
            validate(cfg)


def test_pytest_counts_and_losses_agree(gpu_check) -> None:
    counts = gpu_check.pytest_counts("1 passed, 2 skipped, 3 errors, 1175 deselected in 11.77s")
    assert counts == {"passed": 1, "skipped": 2, "error": 3, "deselected": 1175}
    assert gpu_check.pytest_counts("1 error in 2.0s") == {"error": 1}
    assert gpu_check.losses_agree(3.00, 3.14) and not gpu_check.losses_agree(3.00, 3.16)


def test_dry_run_on_the_cpu_writes_one_json_summary_and_a_table(
    gpu_check, tmp_path: Path, capsys: pytest.CaptureFixture[str], shared_data: Path
) -> None:
    out = tmp_path / "out"
    argv = ["--device", "cpu", "--out", str(out), "--data", str(shared_data / "multi30k"),
            "--skip", "tests,ddp,decode"]  # fmt: skip
    assert gpu_check.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    checks = {c["name"]: c for c in summary["checks"]}
    assert list(checks) == ["tests", "train", "ddp", "decode"]
    assert [checks[n]["status"] for n in ("tests", "ddp", "decode")] == ["skipped"] * 3
    train = checks["train"]
    assert train["status"] == "passed", train
    values = train["values"]
    assert values["tokens_per_s"] > 0 and values["compiled_tokens_per_s"] > 0
    assert 0 < values["mfu"] < 1 and 0 < values["compiled_mfu"] < 1
    ratio = values["compiled_tokens_per_s"] / values["tokens_per_s"]
    assert values["compile_speedup"] == pytest.approx(ratio)
    assert 0 < values["final_loss"] < 10
    assert summary["device"]["device"] == "cpu" and summary["device"]["torch"]
    table = (out / "summary.md").read_text()
    assert table in capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| train |")]
    assert len(rows) == 1 and "| passed |" in rows[0] and "compile_speedup" in rows[0]
