"""Small builders shared by the tests (importable as `helpers`; see `pythonpath` in pyproject.toml)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from attnlab.config import config_dir, register_resolvers
from attnlab.model.config import TransformerConfig

TINY = {
    "src_vocab_size": 50,
    "tgt_vocab_size": 50,
    "d_model": 32,
    "n_heads": 4,
    "d_ff": 64,
    "n_encoder_layers": 2,
    "n_decoder_layers": 2,
}


def tiny_config(**overrides: Any) -> TransformerConfig:
    """The tiny test model (D=32, H=4, 2+2 layers, V=50) with `overrides` applied."""
    return TransformerConfig(**{**TINY, **overrides})


SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def require_shared_data(path: Path = SHARED_DATA) -> Path:
    """`path` if it exists; otherwise skip (a user's clone has no ../shared) or, under CI=true, fail."""
    if path.is_dir():
        return path
    reason = f"shared test data not found at {path} (it lives beside the repository as ../shared/data)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must provide it", pytrace=False)
    pytest.skip(reason)


def compose_train(overrides: list[str], output_dir: Path, *, hydra_node: bool = False) -> DictConfig:
    """Compose `conf/train.yaml` with `overrides`, writing the run into `output_dir`."""
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(config_dir()), job_name="test"):
        return compose(
            "train",
            overrides=[f"paths.output_dir={output_dir}", "trainer.enable_progress_bar=false", *overrides],
            return_hydra_config=hydra_node,
        )
