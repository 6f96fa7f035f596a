"""`train(cfg)`: the training pipeline as a plain function returning its metrics.

Validation happens first and imports neither torch nor lightning, so a bad config fails in about a
second; the heavy imports happen inside `train` once the config is known to be good.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from attnlab.config import ConfigError, validate

if TYPE_CHECKING:
    from attnlab.data.datamodule import ParallelDataModule
    from attnlab.model.config import TransformerConfig

log = logging.getLogger(__name__)


def resolved_config(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain containers with every interpolation resolved (Hydra's own node left out)."""
    return {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
            for k, v in cfg.items() if k != "hydra"}  # fmt: skip


def check_special_ids(model: TransformerConfig, datamodule: ParallelDataModule) -> None:
    """The model's special-token ids must be the ones the data's vocabulary uses."""
    for name in ("pad_id", "bos_id", "eos_id"):
        ours, theirs = getattr(model, name), getattr(datamodule, name)
        if ours != theirs:
            raise ConfigError(
                f"model.{name}={ours} but the data's vocabulary uses {theirs}: set model.{name}={theirs}"
            )
    if model.start_id != datamodule.bos_id:
        raise ConfigError(
            f"model.decoder_start_id={model.decoder_start_id} but the data starts targets with bos "
            f"id {datamodule.bos_id}: set model.decoder_start_id=null"
        )


def _instantiate_all(group: DictConfig | None) -> list[Any]:
    from hydra.utils import instantiate

    if not group:
        return []
    return [instantiate(node) for node in group.values() if node is not None and "_target_" in node]


def train(cfg: DictConfig) -> dict[str, float]:
    """Train and validate the configured model, then evaluate it on the test split.

    Args:
        cfg: A composed `train.yaml` config (from the CLI or `hydra.compose`); `paths.output_dir`
            is the run directory.

    Returns:
        The final metrics (`train/*`, `val/*`, `test/*`) as floats.

    Raises:
        ConfigError: before any heavy import, for a wrong config value.
    """
    experiment = validate(cfg)
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(resolved_config(cfg)), output_dir / "config.yaml")

    import lightning as L
    from hydra.utils import instantiate

    from attnlab.module import TranslationModule

    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True)
    datamodule = experiment.data.datamodule()
    datamodule.setup("fit")  # real corpora are prepared (or loaded from the cache) here
    model = experiment.model
    if model.src_vocab_size is None:
        try:
            model = model.with_vocab(datamodule.src_vocab_size, datamodule.tgt_vocab_size)
        except ValueError as exc:
            raise ConfigError(f"model.{exc} (vocabulary sizes from the data's tokenizers)") from exc
    check_special_ids(model, datamodule)
    if model.pe == "learned" and hasattr(datamodule, "limit_positions"):
        datamodule.limit_positions(model.max_positions)
    module = TranslationModule(model=model, optim=experiment.optim, decode=experiment.decode)
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        callbacks=_instantiate_all(cfg.get("callbacks")),
        logger=_instantiate_all(cfg.get("logger")) or False,
        default_root_dir=str(output_dir),
    )
    log.info("run directory: %s", output_dir)
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if cfg.get("test", True):
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        results = trainer.test(module, datamodule=datamodule, ckpt_path=best or None, verbose=False)
        metrics.update({k: float(v) for k, v in results[0].items()})
    for split, count in getattr(datamodule, "truncated", {}).items():
        metrics[f"data/truncated/{split}"] = float(count)
    return metrics
