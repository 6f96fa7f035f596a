"""Command-line entry points (thin `@hydra.main` wrappers), and the Hydra callback they share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
