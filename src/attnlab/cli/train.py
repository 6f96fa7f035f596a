"""`attnlab-train`: train and evaluate a Transformer from the Hydra config `conf/train.yaml`.

Examples:
    attnlab-train model=tiny trainer.max_epochs=3
    attnlab-train model.pe=learned model.n_heads=4 --cfg job
    attnlab-train --config-dir ./my_conf experiment=my_ablation
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from attnlab.config import ConfigError, config_dir, register_resolvers

log = logging.getLogger(__name__)
register_resolvers()


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="train")
def _main(cfg: DictConfig) -> float | None:
    from attnlab.train import train  # heavy imports happen only after validation, inside train()

    try:
        metrics = train(cfg)
    except ConfigError as exc:
        raise SystemExit(f"attnlab-train: config error: {exc}") from None
    summary = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k.startswith(("val/", "test/")))
    print(f"attnlab-train: {summary}")
    metric = cfg.get("optimized_metric")
    return metrics.get(metric) if metric else None


def main() -> None:
    """Console-script entry point."""
    _main()


if __name__ == "__main__":
    main()
