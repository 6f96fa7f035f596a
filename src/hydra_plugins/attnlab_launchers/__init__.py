"""attnlab's launchers for `hydra/launcher=local` and `hydra/launcher=slurm`, in the namespace Hydra takes
launchers from: hydra-submitit-launcher's, collecting every job's result even when a job's process is
killed (`attnlab.training.launchers`); and the sweeper of `hparams_search=optuna`: hydra-optuna-sweeper's,
running each job once a sweep (`attnlab.training.launchers.OncePerSweep`). Empty without those plugins
(the `[sweep]` extra)."""

from importlib.util import find_spec

if find_spec("hydra_plugins.hydra_submitit_launcher") is not None:
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher

    from attnlab.training.launchers import TolerantLaunch

    class LocalLauncher(TolerantLaunch, submitit_launcher.LocalLauncher):
        """Each job in its own process tree on this machine (submitit's local executor)."""

    class SlurmLauncher(TolerantLaunch, submitit_launcher.SlurmLauncher):
        """Each job a SLURM job (submitit's SLURM executor)."""


if find_spec("hydra_plugins.hydra_optuna_sweeper") is not None:
    from typing import Any

    from hydra_plugins.hydra_optuna_sweeper import optuna_sweeper

    from attnlab.training.launchers import OncePerSweep

    class OptunaSweeper(optuna_sweeper.OptunaSweeper):
        """Optuna's sweeper, a trial repeating an earlier trial's parameters given its result instead of
        training again in its directory (`OncePerSweep`)."""

        def setup(self, **kwargs: Any) -> None:
            super().setup(**kwargs)
            self.sweeper.launcher = OncePerSweep(self.sweeper.launcher)
