"""`attnlab-train`: train and evaluate a Transformer from the Hydra config `conf/train.yaml`.

A multirun (`-m`) runs every job even when some fail (a failed job's manifest.json says why); with
`hydra.sweep.dir` fixed, `sweep.skip_done=true` skips the jobs that already finished.

Examples:
    attnlab-train model=tiny trainer.max_epochs=3
    attnlab-train -m model.pe=sinusoidal,learned,none seed=1,2,3 hydra.sweep.dir=logs/sweeps/pe
    attnlab-train model.pe=learned model.n_heads=4 --cfg job
    attnlab-train --config-dir ./my_conf experiment=my_ablation
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from attnlab.config import ConfigError, config_dir, register_resolvers

log = logging.getLogger(__name__)
register_resolvers()


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="train")
def _main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    output_dir = Path(cfg.paths.output_dir)
    metric = cfg.get("optimized_metric")
    if (cfg.get("sweep") or {}).get("skip_done"):
        done = finished_results(output_dir)
        if done is not None:
            print(f"attnlab-train: {output_dir} already finished (sweep.skip_done=true): skipped")
            return done.get("metrics", {}).get(metric) if metric else None
    from attnlab.train import train  # heavy imports happen only after validation, inside train()

    try:
        metrics = train(cfg)
    except ConfigError as exc:
        if not multirun:
            raise SystemExit(f"attnlab-train: config error: {exc}") from None
        record_failure(output_dir, f"ConfigError: {exc}")
        log.error("job %s failed: config error: %s", output_dir.name, exc)
        return None
    except Exception:
        if not multirun:
            raise
        # The run's manifest.json already says failed, with the error; the other jobs go on.
        log.exception("job %s failed; the sweep goes on", output_dir.name)
        return None
    summary = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k.startswith(("val/", "test/")))
    print(f"attnlab-train: {summary}")
    if metric and metric not in metrics:
        available = ", ".join(sorted(metrics))
        log.error("optimized_metric=%s is not among this run's final metrics (%s): nothing to return to the "
                  "sweeper; set optimized_metric to one of them", metric, available)  # fmt: skip
        return None
    return metrics.get(metric) if metric else None


def finished_results(output_dir: Path) -> dict[str, Any] | None:
    """The `results.json` of a run that finished (manifest status `finished`), else None."""
    results, manifest = output_dir / "results.json", output_dir / "manifest.json"
    try:
        if json.loads(manifest.read_text()).get("status") != "finished":
            return None
        return json.loads(results.read_text())
    except (OSError, ValueError):
        return None


def record_failure(output_dir: Path, error: str) -> None:
    """A manifest saying the job failed, for failures before its run started (config errors)."""
    from attnlab.manifest import now, write_manifest

    output_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(output_dir, {"status": "failed", "error": error.splitlines()[0], "end_time": now()})


def main() -> None:
    """Console-script entry point."""
    _main()


if __name__ == "__main__":
    main()
