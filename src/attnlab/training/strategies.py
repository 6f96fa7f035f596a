"""Lightning strategies built for the Transformer (for the trainer presets in `conf/trainer/`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.trainer.states import TrainerFn

from attnlab.runs.checkpoint import CheckpointError


def fsdp(**kwargs: Any) -> Any:
    """Lightning's `FSDPStrategy` with one FSDP unit per `EncoderLayer` and `DecoderLayer`, reading the
    checkpoint a run continues from as every other strategy does (`AttnlabFSDPStrategy`).

    Args:
        **kwargs: Passed on to `FSDPStrategy` (`sharding_strategy`, `state_dict_type`, ...).
    """
    from attnlab.model.layers import DecoderLayer, EncoderLayer

    return AttnlabFSDPStrategy(auto_wrap_policy={EncoderLayer, DecoderLayer}, **kwargs)


class AttnlabFSDPStrategy(FSDPStrategy):
    """`FSDPStrategy` whose `load_checkpoint` (`trainer.fit(ckpt_path=...)`) reads the file through the
    run's checkpoint IO, `attnlab.training.checkpoint_io.AtomicCheckpointIO` (weights only, nothing in the
    file chooses what code runs, only trusted callback states), instead of Lightning's own unpickler, which
    would run code a file holds. Only full checkpoints (one file, `state_dict_type: full`, as the fsdp
    preset writes) are read; a directory of shards is refused (torch reads its metadata with the general
    unpickler)."""

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        from lightning.fabric.strategies.model_parallel import _load_raw_module_state

        from attnlab.training.checkpoint_io import AtomicCheckpointIO

        path = Path(self.broadcast(checkpoint_path))  # every rank loads rank 0's file
        if not path.is_file():
            raise CheckpointError(
                f"{path} is not a checkpoint file: attnlab continues FSDP runs from full checkpoints "
                "only (one file; trainer.strategy.state_dict_type=full, as trainer=fsdp writes them), never "
                "from a directory of shards, whose metadata torch reads with a loader that can run code"
            )
        io = (
            self.checkpoint_io if isinstance(self.checkpoint_io, AtomicCheckpointIO) else AtomicCheckpointIO()
        )
        checkpoint = io.load_checkpoint(path)
        assert self.model is not None and self.lightning_module is not None
        _load_raw_module_state(
            checkpoint.pop("state_dict"),
            module=self.model,
            world_size=self.world_size,
            strict=self.lightning_module.strict_loading,
        )
        optimizer_states = checkpoint.get("optimizer_states")
        if optimizer_states is not None and self.lightning_module.trainer.state.fn == TrainerFn.FITTING:
            self._load_optimizer_states(optimizer_states)
        return checkpoint

    def _load_optimizer_states(self, optimizer_states: list[dict[str, Any]]) -> None:
        """The optimizer-state part of Lightning's `FSDPStrategy.load_checkpoint` for a full checkpoint,
        as in Lightning 2.6.6 (compare with Lightning's when upgrading it). Never run here: FSDP needs
        GPUs (`scripts/gpu_check.sh`)."""
        from lightning.fabric.strategies.fsdp import _get_full_state_dict_context
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import OptimStateKeyType

        if len(self.optimizers) != len(optimizer_states):
            raise RuntimeError(
                f"You have configured {len(self.optimizers)} optimizers but the checkpoint contains"
                f" {len(optimizer_states)} optimizers to load. Please resume training with the same number"
                " of optimizers or edit the checkpoint manually to remove states."
            )
        # rank0_only=False: every rank loads the optimizer state
        with _get_full_state_dict_context(self.model, world_size=self.world_size, rank0_only=False):
            for optimizer, opt_state in zip(self.optimizers, optimizer_states, strict=True):
                if isinstance(next(iter(opt_state["state"])), int):  # saved by a plain optimizer
                    by_name = OptimStateKeyType.PARAM_NAME
                    opt_state = FSDP.rekey_optim_state_dict(opt_state, by_name, self.model)
                opt_state = FSDP.optim_state_dict_to_load(
                    model=self.model, optim=optimizer, optim_state_dict=opt_state
                )
                optimizer.load_state_dict(opt_state)
