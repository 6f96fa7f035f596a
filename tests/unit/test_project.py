"""Project contracts: the README's test command is what CI runs; the shared-data policy."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from helpers import require_shared_data

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    block = re.search(r"## Quickstart.*?```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md has no Quickstart bash block"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    main_job, tests = readme_commands()
    assert main_job.endswith("attnlab-train")
    test_command = tests.split("&&")[-1].strip()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines
    assert "python -m pip install --quiet torch==2.13.0" in ci_lines  # the CPU wheel before the project
    # CI sets CI=true itself (whatever its caller set), so tests that read ../shared/data fail without it
    assert "export CI=true" in ci_lines and ci_lines.index("export CI=true") < ci_lines.index(test_command)


def test_missing_shared_data_skips_on_a_users_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="shared test data not found"):
        require_shared_data(tmp_path / "absent")


def test_missing_shared_data_fails_under_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must provide it"):
        require_shared_data(tmp_path / "absent")


def test_shared_multi30k_matches_its_checksums(shared_data: Path) -> None:
    sums = [line.split() for line in (shared_data / "SHA256SUMS").read_text().splitlines() if line.strip()]
    assert len(sums) == 9
    for digest, name in sums:
        assert hashlib.sha256((shared_data / name).read_bytes()).hexdigest() == digest, name


def test_train_help_lists_every_config_group_without_composing(capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from attnlab.cli.app import config_dir
    from attnlab.cli.train import main

    argv = sys.argv
    sys.argv = ["attnlab-train", "--help"]
    try:
        main()
    finally:
        sys.argv = argv
    text = capsys.readouterr().out
    assert text.startswith("`attnlab-train`: train and evaluate")
    for group in ("model", "data", "trainer", "experiment/table3", "hydra/launcher", "hparams_search"):
        options = sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
        assert f"  {group}: {', '.join(options)}\n" in text
    assert "--hydra-help" in text
