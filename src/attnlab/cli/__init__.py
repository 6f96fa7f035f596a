"""Command-line entry points (thin `@hydra.main` wrappers), and the Hydra callback they share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class RunDirectoryCheck(Callback):
    """Refuses a run (`hydra.run.dir`) or sweep (`hydra.sweep.dir`) directory that cannot be created or
    written, before Hydra creates it (`conf/hydra/default.yaml` registers this callback): the command
    exits with one line naming the key and the fix instead of Hydra's traceback. A training run
    directory in which another live process runs is refused here too, before Hydra writes `.hydra/`
    into it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, Path(config.hydra.run.dir))
        if config.get("task_name") == "train":  # a live run there: refused before Hydra writes into it
            from attnlab.config import ConfigError
            from attnlab.train import check_run_directory_free

            try:
                check_run_directory_free(Path(config.hydra.run.dir))
            except ConfigError as exc:
                raise SystemExit(f"attnlab-train: config error: {exc}") from None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, Path(config.hydra.sweep.dir))

    @staticmethod
    def _check(config: DictConfig, directory: Path) -> None:
        from attnlab.config import ConfigError
        from attnlab.train import _writable_run_directory

        try:
            _writable_run_directory(directory)
        except ConfigError as exc:
            raise SystemExit(f"attnlab-{config.get('task_name', 'train')}: config error: {exc}") from None
