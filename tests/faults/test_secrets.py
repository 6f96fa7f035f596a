"""Credentials from the environment never reach a run's files: manifest, config, logs, W&B run files,
checkpoints, metrics. A real `attnlab-train` run with W&B offline and planted fake credentials."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import subprocess_path

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
    env = {**os.environ, **SECRETS, "WANDB_MODE": "offline", "PYTHONPATH": subprocess_path()}
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


def test_credentials_in_the_config_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    """A W&B API key given in the config (`logger.wandb.settings.api_key`, a W&B setting) or an MLflow
    server URL with its password went into config.yaml, manifest.json, .hydra/ and the offline W&B run,
    which `wandb sync` uploads into the project's config: refused, naming the key (never the value) and
    the environment variables to use; nothing is written, single runs and sweeps alike, and a config
    composed in Python (`train`) is refused the same way."""
    from attnlab.training.pipeline import train
    from attnlab.typed import ConfigError
    from helpers import compose_train

    key = SECRETS["WANDB_API_KEY"]
    base = [sys.executable, "-m", "attnlab.cli.train", "data=synthetic", "model=tiny", "data.n_train=32",
            "data.n_val=8", "data.n_test=8", "trainer.max_epochs=1"]  # fmt: skip
    commands = {
        "logger.wandb.settings.api_key": [*base, f"+logger.wandb.settings.api_key={key}",
                                          f"hydra.run.dir={tmp_path / 'run'}"],
        "logger.mlflow.tracking_uri": [*base[:3], "-m", *base[3:], "seed=1,2", "logger=mlflow",
                                       f"logger.mlflow.tracking_uri=https://me:{key}@mlflow.example.com",
                                       f"hydra.sweep.dir={tmp_path / 'sweep'}"],
    }  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": subprocess_path()}
    for name, command in commands.items():
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 1, done.stderr[-3000:]
        told = f"attnlab-train: config error: {name} would put a credential (a key, token or password) into"
        assert told in done.stderr and "WANDB_API_KEY (W&B), MLFLOW_TRACKING_USERNAME" in done.stderr
        assert key not in done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []
    cfg = compose_train(["data=synthetic", "model=tiny", f"+logger.wandb.settings.api_key={key}"], tmp_path)
    with pytest.raises(ConfigError, match=r"^logger\.wandb\.settings\.api_key would put a credential"):
        train(cfg)
    assert list(tmp_path.iterdir()) == []


def test_credentials_by_other_spellings_or_in_hydra_s_own_node_are_refused(tmp_path: Path) -> None:
    """A credential key spelled as environment variables and libraries spell it (`WANDB_API_KEY`,
    `github_token`, `client_secret`, `apiKey`, `githubToken`, `db-password`) was taken only as one of a
    few exact names, and Hydra's own node was not looked at: `hydra.job.env_set.HF_TOKEN=<token>` went
    into manifest.json and .hydra/hydra.yaml; a credential key in a list of mappings was not looked at.
    All are refused before anything is written; a tokenizer's special tokens (`pad_token`, `padToken`),
    `max_tokens` and the shipped configs are not."""
    from attnlab.cli.app import RunDirectoryCheck
    from attnlab.runs.layout import check_no_credentials
    from attnlab.typed import ConfigError
    from helpers import compose_train

    token = SECRETS["HF_TOKEN"]
    keys = ("WANDB_API_KEY", "github_token", "client_secret", "apiKey", "githubToken", "clientSecret",
            "db-password", "private_key")  # fmt: skip
    for key in keys:
        with pytest.raises(ConfigError, match=rf"^logger\.x\.{key} would put a credential"):
            check_no_credentials({"logger": {"x": {key: token}}})
    plain = {"pad_token": "<pad>", "padToken": "<pad>", "max_tokens": 4096, "maxTokens": 4096}
    check_no_credentials({"data": {**plain, "tokenizer": "bpe"}})
    with pytest.raises(ConfigError, match=r"^logger\.x\.headers\.token would put a credential"):  # in a list
        check_no_credentials({"logger": {"x": {"headers": [{"name": "a"}, {"token": token}]}}})
    cfg = compose_train(["data=synthetic", "logger=many", "hparams_search=optuna"], tmp_path, hydra_node=True)
    RunDirectoryCheck._check(cfg, tmp_path / "ok")  # the shipped config, Hydra's node included
    cfg = compose_train(["data=synthetic", f"+hydra.job.env_set.HF_TOKEN={token}"], tmp_path, hydra_node=True)
    with pytest.raises(SystemExit, match=r"^attnlab-train: config error: hydra\.job\.env_set\.HF_TOKEN wo"):
        RunDirectoryCheck._check(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_url_whose_user_name_is_a_token_is_refused_and_a_plain_user_name_is_not() -> None:
    """`https://<token>@host` (a GitHub or Hugging Face token, a W&B key as the user name, as git and
    HTTP clients take them) passed the check, which looked for `user:password@` only: refused, naming the
    key; a URL with a plain user name (`alice`, `git`, `service-account-12345`) is no credential."""
    from attnlab.runs.layout import check_no_credentials
    from attnlab.typed import ConfigError

    tokens = [SECRETS["GITHUB_TOKEN"], SECRETS["HF_TOKEN"], "0123456789abcdef0123456789abcdef01234567",
              "glpat-Abc", "github_pat_11ABC", "x7Kq2LmP9vR4tZ8wN3yB"]  # fmt: skip
    for token in tokens:
        with pytest.raises(
            ConfigError, match=r"^data\.url would put a credential \(a key, token or password\)"
        ):
            check_no_credentials({"data": {"url": f"https://{token}@example.com/corpus.tgz"}})
    for user in ("alice", "john.doe", "git", "service-account-12345", "hf-mirror", "AKIA",
                 "christopherjohnson1985", "JOHNSMITH1985ACCOUNT"):  # fmt: skip
        check_no_credentials({"data": {"url": f"https://{user}@example.com/x", "git": f"ssh://{user}@h/r"}})


def test_an_optuna_storage_password_is_refused_naming_oc_env_which_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A password in `hydra.sweeper.storage` (Optuna's database URL) was refused with a message naming
    only W&B, MLflow and Hugging Face variables, and `${oc.env:VAR}` in its place was refused too: the
    message names `${oc.env:VAR}`, which passes, since .hydra/ records Hydra's node as written; the study
    gets the password. Elsewhere an interpolated password is still refused (config.yaml holds it
    resolved)."""
    from omegaconf import OmegaConf

    from attnlab.cli.app import RunDirectoryCheck
    from attnlab.runs.layout import check_no_credentials
    from attnlab.typed import ConfigError
    from helpers import compose_train

    monkeypatch.setenv("OPTUNA_DB_PASSWORD", "PlantedOptunaPassword")
    storage = "hydra.sweeper.storage='postgresql://optuna:{}@db.example.com/optuna'"
    cfg = compose_train(["data=synthetic", "hparams_search=optuna", storage.format("PlantedOptunaPassword")],
                        tmp_path, hydra_node=True)  # fmt: skip
    with pytest.raises(SystemExit) as caught:
        RunDirectoryCheck._check(cfg, tmp_path / "sweep")
    assert str(caught.value).startswith("attnlab-train: config error: hydra.sweeper.storage would put a")
    assert str(caught.value).endswith(
        "; in Hydra's own settings, which .hydra/ records as written, give a URL's secret as ${oc.env:VAR}: "
        "hydra.sweeper.storage='postgresql://user:${oc.env:OPTUNA_DB_PASSWORD}@host/db' (an Optuna storage)"
    )
    assert "PlantedOptunaPassword" not in str(caught.value) and not (tmp_path / "sweep").exists()
    interpolated = storage.format("${oc.env:OPTUNA_DB_PASSWORD}")
    cfg = compose_train(["data=synthetic", "hparams_search=optuna", interpolated], tmp_path, hydra_node=True)
    RunDirectoryCheck._check(cfg, tmp_path / "sweep")
    assert cfg.hydra.sweeper.storage == "postgresql://optuna:PlantedOptunaPassword@db.example.com/optuna"
    assert "PlantedOptunaPassword" not in OmegaConf.to_yaml(cfg.hydra)  # what .hydra/hydra.yaml holds
    with pytest.raises(ConfigError, match=r"^logger\.x\.uri would put a credential"):
        check_no_credentials({"logger": {"x": {"uri": "https://me:${oc.env:PASSWORD}@host"}}})
