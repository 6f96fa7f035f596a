"""attnlab's launchers for `hydra/launcher=local` and `hydra/launcher=slurm`, in the namespace Hydra takes
launchers from: hydra-submitit-launcher's, collecting every job's result even when a job's process is
killed (`attnlab.training.launchers`). Empty without hydra-submitit-launcher (the `[sweep]` extra)."""

from importlib.util import find_spec

if find_spec("hydra_plugins.hydra_submitit_launcher") is not None:
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher

    from attnlab.training.launchers import TolerantLaunch

    class LocalLauncher(TolerantLaunch, submitit_launcher.LocalLauncher):
        """Each job in its own process tree on this machine (submitit's local executor)."""

    class SlurmLauncher(TolerantLaunch, submitit_launcher.SlurmLauncher):
        """Each job a SLURM job (submitit's SLURM executor)."""
