"""Credentials from the environment never reach a run's files: manifest, config, logs, W&B run files,
checkpoints, metrics. A real `attnlab-train` run with W&B offline and planted fake credentials."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SECRETS = {
    "WANDB_API_KEY": "local-0123456789abcdef0123456789abcdef01234567",  # W&B's key shape (40 hex)
    "HF_TOKEN": "hf_PlantedFakeTokenForTheSecretsTest0000",
    "AWS_SECRET_ACCESS_KEY": "PlantedFakeAwsSecretKeyForTheTest/000000",
    "GITHUB_TOKEN": "ghp_PlantedFakeGithubTokenForTheTest00000",
}


def test_planted_credentials_appear_in_no_file_of_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "attnlab.cli.train", "data=synthetic", "model=tiny", "data.n_train=64",
        "data.n_val=16", "data.n_test=16", "trainer.max_epochs=1", "logger=wandb", f"hydra.run.dir={run_dir}",
        "trainer.enable_progress_bar=false",
    ]  # fmt: skip
    env = {**os.environ, **SECRETS, "WANDB_MODE": "offline", "PYTHONPATH": str(TESTS)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    kinds = {p.suffix for p in files}
    assert {".json", ".yaml", ".log", ".ckpt", ".wandb", ".csv"} <= kinds  # every kind of file a run writes
    for path in files:
        data = path.read_bytes()
        for name, value in SECRETS.items():
            assert value.encode() not in data, f"{name} leaked into {path}"
    for name, value in SECRETS.items():
        assert value not in done.stdout + done.stderr, f"{name} leaked into the console output"
