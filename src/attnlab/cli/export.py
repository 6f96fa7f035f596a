"""`attnlab-export`: write a checkpoint as a Hugging Face MarianMT directory or a CTranslate2 model
(`conf/export.yaml`, `attnlab.interop.export`).

Examples:
    attnlab-export ckpt_path=logs/train/runs/<run> format=hf out=exported/hf
    attnlab-export ckpt_path=logs/train/runs/<run> format=ctranslate2 quantization=int8 out=exported/ct2
    attnlab-export ckpt_path=<run> format=ctranslate2 decode.beam=4 decode.max_len_b=50 out=exported/ct2
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from attnlab.cli.app import config_dir, refusal_leaves_no_run_directory, register_resolvers
from attnlab.typed import ConfigError

register_resolvers()


def export_checkpoint(cfg: DictConfig) -> Path:
    """Export `cfg.ckpt_path` as `conf/export.yaml` describes; returns the directory written.

    Raises:
        ConfigError: A missing or bad value, an unusable checkpoint, or a model the format cannot express
            (with the fix).
    """
    for key in ("ckpt_path", "format", "out"):
        if OmegaConf.is_missing(cfg, key) or cfg.get(key) in (None, ""):
            raise ConfigError(f"{key}= is required (attnlab-export ckpt_path=<run> format=hf|ctranslate2 "
                              "out=<directory>)")  # fmt: skip
    overwrite = cfg.get("overwrite") or False  # null: false
    if not isinstance(overwrite, bool):  # the text "no" would read as true and replace an earlier export
        raise ConfigError(f"overwrite={overwrite!r} must be true or false (true: replace an earlier export "
                          "in out=)")  # fmt: skip
    from attnlab.interop.export import check_request, export  # imports torch: not for --help or a bad key
    from attnlab.runs.checkpoint import CheckpointError

    ckpt_path = cfg.ckpt_path
    if OmegaConf.is_config(ckpt_path):  # a list: the models of an ensemble elsewhere, not one model
        raise ConfigError(
            f"ckpt_path is a list of {len(ckpt_path)} checkpoints, but attnlab-export writes one model: give "
            "one checkpoint file or run directory (average_last=N averages the run's last N epoch "
            "checkpoints); an ensemble cannot be exported"
        )
    fmt, quantization = str(cfg.format), str(cfg.quantization)
    try:
        check_request(fmt, quantization, str(cfg.out), overwrite)  # before the checkpoint is read
        from attnlab.inference.translator import Translator, resolve_checkpoints

        paths = resolve_checkpoints(ckpt_path, cfg.get("average_last"))
        out = Path(str(cfg.out)).expanduser().resolve()
        inside = [p for p in paths if out == p.resolve() or out in p.resolve().parents]
        if inside:
            raise ConfigError(f"out={cfg.out} holds the checkpoint being exported ({inside[0]}): "
                              "replacing it would delete it; choose another directory")  # fmt: skip
        decode = OmegaConf.to_container(cfg.decode) if cfg.get("decode") is not None else {}
        translator = Translator.from_checkpoints(paths, device="cpu", decode_overrides=decode)
        return export(translator, fmt, str(cfg.out), quantization, overwrite=overwrite)
    except (CheckpointError, ValueError, OSError) as exc:  # OSError: out's directory is not writable
        raise ConfigError(str(exc)) from None


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="export")
def _main(cfg: DictConfig) -> None:
    try:
        out = export_checkpoint(cfg)
    except ConfigError as exc:
        raise SystemExit(f"attnlab-export: {exc}") from None
    print(f"attnlab-export: wrote format={cfg.format} to {out}")


def main() -> None:
    """Console-script entry point."""
    with refusal_leaves_no_run_directory("export"):
        _main()


if __name__ == "__main__":
    main()
