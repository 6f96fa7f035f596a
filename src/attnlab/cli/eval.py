"""`attnlab-eval`: evaluate a checkpoint, or an average of several, on test sets (`conf/eval.yaml`).

Examples:
    attnlab-eval ckpt_path=logs/train/runs/<run> average_last=5
    attnlab-eval ckpt_path=<file.ckpt> decode.beam=5 decode.alpha=1.0 sets=[val]
    attnlab-eval ckpt_path=[<run a>,<run b>] ensemble=true
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, ListConfig, OmegaConf

from attnlab.cli.app import config_dir, refusal_leaves_no_run_directory, register_resolvers
from attnlab.io import WriteError
from attnlab.runs.layout import RunDir
from attnlab.runs.results import decoding_summary, results_table
from attnlab.training.allocator import check_mode, configure_allocator
from attnlab.training.experiment import build_node
from attnlab.typed import ConfigError, language_subtag

log = logging.getLogger(__name__)
register_resolvers()


def evaluate_checkpoint(cfg: DictConfig) -> dict[str, Any]:
    """Evaluate `cfg.ckpt_path` as `conf/eval.yaml` describes; returns what `results.json` holds.

    `allocator` is checked here but applied by the `attnlab-eval` command: called from Python, this leaves
    the process's malloc settings as they are (`attnlab.training.allocator.configure_allocator` sets them).

    Raises:
        ConfigError: A bad value (`ckpt_path` missing), an output directory holding a training run, a
            checkpoint or data file that cannot be used (with the fix), a set that cannot be scored, or a
            model whose scores are NaN.
    """
    if OmegaConf.is_missing(cfg, "ckpt_path") or not cfg.get("ckpt_path"):
        raise ConfigError(
            "ckpt_path=<checkpoint file or run directory> is required (ensembles: ckpt_path=[a,b] "
            "ensemble=true)"
        )
    output_dir = Path(cfg.paths.output_dir)  # a training run's results would be replaced: refused first
    RunDir(output_dir).check_no_training("attnlab-eval", "paths.output_dir",
                                         "its results.json, hypotheses and references")  # fmt: skip
    from attnlab.data.download import DataError
    from attnlab.decoding.search import NonFiniteScores
    from attnlab.inference.translator import (
        Translator,
        evaluate,
        metrics_settings,
        resolve_checkpoints,
    )
    from attnlab.metrics import ScoringError
    from attnlab.runs.checkpoint import CheckpointError, data_spec

    try:
        check_mode(cfg.get("allocator", "keep"))  # applied by the command (`_main`), not here
        ckpt_path = cfg.ckpt_path
        if OmegaConf.is_config(ckpt_path):  # a list of checkpoint files
            ckpt_path = OmegaConf.to_container(ckpt_path)
        paths = resolve_checkpoints(ckpt_path, cfg.get("average_last"), cfg.get("ensemble"))
        ensemble = bool(cfg.get("ensemble"))  # checked: true, false or null
        device = str(cfg.get("device", "auto"))
        decode = OmegaConf.to_container(cfg.decode) if cfg.get("decode") is not None else {}  # checked after
        translator = Translator.from_checkpoints(
            paths, device=device, ensemble=ensemble, decode_overrides=decode
        )
        overrides = OmegaConf.to_container(cfg.metrics) if cfg.get("metrics") is not None else None
        translator.metrics = metrics_settings(translator.metrics, overrides)  # before anything is decoded
        if cfg.get("data") is not None:
            spec = build_node(cfg.data, "data")
            check_languages(translator.data, spec)
        elif translator.data is not None:
            spec = data_spec(translator.data, paths[0])  # its class by name, never by import
        else:
            raise ConfigError(f"{paths[0]} holds no data settings: select the data, e.g. data=multi30k")
        names = split_names(cfg.get("sets"), spec)
        sets = spec.load(names)
    except (CheckpointError, DataError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    try:
        return evaluate(translator, sets, output_dir, checkpoints=paths)
    except (ScoringError, NonFiniteScores) as exc:  # nothing written: every set is scored before any file
        raise ConfigError(f"{exc}; nothing was written to {output_dir}") from None


def check_languages(saved: dict[str, Any] | None, spec: Any) -> None:
    """Refuse data given to `attnlab-eval` in other languages than the model was trained on (a model
    trained de→en scored on en→de or de→fr references): the scores would mean nothing. Only values that
    are language codes are compared, by their language subtag and in any case (`de_DE` is `DE` is `de`);
    anything else (the placeholder suffixes `src`/`tgt` of `data=files`, column names such as `source`)
    matches any language.

    Raises:
        ConfigError: A language differs, naming both and the fix.
    """
    trained = {key: (saved or {}).get(key) for key in ("src_lang", "tgt_lang")}
    for key, was in trained.items():
        given = getattr(spec, key, None)
        codes = [language_subtag(value) for value in (was, given)]
        if None not in codes and codes[0] != codes[1]:
            raise ConfigError(
                f"data.{key}={given!r}, but the model was trained to translate {trained['src_lang']} -> "
                f"{trained['tgt_lang']}: give data of those languages (data.src_lang={trained['src_lang']} "
                f"data.tgt_lang={trained['tgt_lang']})"
            )


def split_names(sets: Any, spec: Any) -> list[str]:
    """The splits `sets=` names (a single name is one split), or the data's test splits when null.

    Raises:
        ConfigError: An empty list (nothing would be scored).
    """
    if sets is None:
        return list(spec.test_split_names())
    names = [str(name) for name in sets] if isinstance(sets, (list, tuple, ListConfig)) else [str(sets)]
    if not names:
        raise ConfigError("sets=[] scores nothing: name the splits (e.g. sets=[test2016]) or leave sets=null "
                          "for the data's test sets")  # fmt: skip
    return names


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="eval")
def _main(cfg: DictConfig) -> float | None:
    try:
        configure_allocator(cfg.get("allocator", "keep"))  # before anything is loaded
    except ValueError as exc:  # an unknown value
        raise SystemExit(f"attnlab-eval: {exc}") from None
    try:
        results = evaluate_checkpoint(cfg)
    except ConfigError as exc:
        raise SystemExit(f"attnlab-eval: {exc}") from None
    except WriteError as exc:  # (a full disk: the file and the fix)
        raise SystemExit(f"attnlab-eval: {exc}, then run attnlab-eval again") from None
    print(results_table(results))
    print(decoding_summary(results))
    print(f"attnlab-eval: wrote {RunDir(Path(cfg.paths.output_dir)).results_file}")
    first = next(iter(results["sets"].values()), None)
    return first["bleu"] if first else None


def main() -> None:
    """Console-script entry point."""
    with refusal_leaves_no_run_directory("eval"):
        _main()


if __name__ == "__main__":
    main()
