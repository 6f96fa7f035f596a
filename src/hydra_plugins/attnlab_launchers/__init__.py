"""attnlab's launchers for `hydra/launcher=local` and `hydra/launcher=slurm`, in the namespace Hydra takes
launchers from: hydra-submitit-launcher's, collecting every job's result even when a job's process is
killed (`attnlab.training.launchers`); and its sweepers, running each job once a sweep
(`attnlab.training.launchers.OncePerSweep`): Hydra's basic one (`hydra/sweeper=basic_once`, the default)
and the one of `hparams_search=optuna`, hydra-optuna-sweeper's. Only the basic sweeper without those
plugins (the `[sweep]` extra)."""

import logging
from importlib.util import find_spec
from typing import Any

from hydra._internal.core_plugins import basic_sweeper

from attnlab.training.launchers import NO_BEST_TRIAL, OncePerSweep

log = logging.getLogger(__name__)


class BasicSweeper(basic_sweeper.BasicSweeper):
    """Hydra's basic sweeper, a job listed twice (`seed=1,1`: the same setting and seed, so the same job
    directory) launched once, the other logged and given its result (`OncePerSweep`); without this, the
    second trained again in the first one's directory (refused there as holding a finished run, or racing
    it under `hydra/launcher=local`)."""

    def setup(self, **kwargs: Any) -> None:
        super().setup(**kwargs)
        self.launcher = OncePerSweep(self.launcher)


if find_spec("hydra_plugins.hydra_submitit_launcher") is not None:
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher

    from attnlab.training.launchers import TolerantLaunch

    class LocalLauncher(TolerantLaunch, submitit_launcher.LocalLauncher):
        """Each job in its own process tree on this machine (submitit's local executor)."""

    class SlurmLauncher(TolerantLaunch, submitit_launcher.SlurmLauncher):
        """Each job a SLURM job (submitit's SLURM executor)."""


if find_spec("hydra_plugins.hydra_optuna_sweeper") is not None:
    from hydra_plugins.hydra_optuna_sweeper import optuna_sweeper

    class OptunaSweeper(optuna_sweeper.OptunaSweeper):
        """Optuna's sweeper, a trial repeating an earlier trial's parameters given its result instead of
        training again in its directory (`OncePerSweep`). A study none of whose trials returned a value
        (each failed, or its run lacks `optimized_metric`) has no best trial to write: one error line says
        so, and the sweep ends with its summary of the jobs (`attnlab.cli.train.main`), not Optuna's
        traceback, and fails (exit status 1) even where every job finished."""

        def setup(self, **kwargs: Any) -> None:
            super().setup(**kwargs)
            self.sweeper.launcher = OncePerSweep(self.sweeper.launcher)

        def sweep(self, arguments: list[str]) -> None:
            try:
                super().sweep(arguments)
            except ValueError as exc:
                if "No trials are completed yet" not in str(exc):  # (Optuna's `study.best_trial`)
                    raise
                metric = self.sweeper.config.get("optimized_metric")
                NO_BEST_TRIAL.append(str(metric))  # (the multirun fails, every job finished or not)
                log.error("no trial of this study returned optimized_metric=%s (each failed or lacks it: see "
                          "the errors above): there is no best trial, so no optimization_results.yaml",
                          metric)  # fmt: skip
