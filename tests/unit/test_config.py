"""The Hydra config tree: every config composes and builds, keys match targets, bad values fail early."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import yaml
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from attnlab.cli.app import config_dir
from attnlab.decoding import DecodeConfig
from attnlab.model.config import TransformerConfig
from attnlab.training.experiment import check_sweep_objective, resolve_monitor, validate
from attnlab.typed import ConfigError
from helpers import compose_train

CONF = config_dir()
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra")
OPTIONS = [(group, p.stem) for group in GROUPS for p in sorted((CONF / group).glob("*.yaml"))]
BUILDABLE_TRAINERS = {"default", "cpu", "ddp_cpu"}
REQUIRED = {"files": ["data.dir={tmp}"], "hf": ["data.name={tmp}"]}


def option(group: str, name: str, tmp: Path) -> list[str]:
    """Overrides selecting one option, with the values its config leaves required (???)."""
    return [f"{group}={name}", *(o.format(tmp=tmp) for o in REQUIRED.get(name, []) if group == "data")]


def test_every_group_has_options() -> None:
    assert {
        "model",
        "data",
        "optim",
        "trainer",
        "logger",
        "callbacks",
        "paths",
        "experiment",
        "debug",
    } <= set(GROUPS)
    assert {"tiny", "small", "base"} <= {name for group, name in OPTIONS if group == "model"}
    assert {"default", "cpu", "gpu", "ddp_cpu"} <= {name for group, name in OPTIONS if group == "trainer"}


@pytest.mark.parametrize(("group", "name"), OPTIONS, ids=[f"{g}={n}" for g, n in OPTIONS])
def test_every_config_composes_and_validates(group: str, name: str, tmp_path: Path) -> None:
    cfg = compose_train(option(group, name, tmp_path), tmp_path)
    experiment = validate(cfg)
    if name == "synthetic":
        assert experiment.model.src_vocab_size == experiment.data.fixed_vocab_size
    OmegaConf.to_container(cfg, resolve=True)  # no dangling interpolation


def _nodes(cfg: DictConfig) -> list[tuple[str, DictConfig]]:
    """Every node with a `_target_` (top-level groups and the entries of logger/callbacks)."""
    out = []
    for key in ("model", "optim", "data", "decode", "trainer"):
        out.append((key, cfg[key]))
    for key in ("logger", "callbacks"):
        out.extend((f"{key}.{name}", node) for name, node in (cfg.get(key) or {}).items())
    return out


def _parameters(cls: type) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    parameters = inspect.signature(cls).parameters
    names = set(parameters) - {"self", "args", "kwargs"}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):  # passed on to the base
        names |= set().union(*(_parameters(base) for base in cls.__bases__ if base is not object))
    return names


@pytest.mark.parametrize(("group", "name"), OPTIONS, ids=[f"{g}={n}" for g, n in OPTIONS])
def test_node_keys_are_exactly_target_arguments(group: str, name: str, tmp_path: Path) -> None:
    cfg = compose_train(option(group, name, tmp_path), tmp_path)
    for key, node in _nodes(cfg):
        keys = {k for k in node if not k.startswith("_")}
        unknown = keys - _parameters(get_class(node._target_))
        assert not unknown, f"{key} ({node._target_}) has keys that are not arguments: {unknown}"


def test_base_model_config_is_the_paper_default_and_lists_every_knob(tmp_path: Path) -> None:
    cfg = compose_train(["model=base"], tmp_path)
    node = {k: v for k, v in OmegaConf.to_container(cfg.model).items() if k != "_target_"}
    defaults = TransformerConfig().to_dict()
    assert set(node) == set(defaults) - {"src_vocab_size", "tgt_vocab_size"}
    assert all(node[k] == defaults[k] for k in node)


def test_the_default_decode_config_is_decodeconfigs_defaults_and_lists_every_knob(tmp_path: Path) -> None:
    """conf/decode/default.yaml and `DecodeConfig()` are the one default a run, attnlab-eval and a Python
    caller get (e.g. `decode.seed` 0, which the README promises), key for key."""
    cfg = compose_train([], tmp_path)
    node = {k: v for k, v in OmegaConf.to_container(cfg.decode).items() if k != "_target_"}
    defaults = {f.name: f.default for f in dataclasses.fields(DecodeConfig)}
    assert set(node) == set(defaults)
    assert {k: v for k, v in node.items() if v != defaults[k]} == {}
    assert node["seed"] == 0


@pytest.mark.parametrize(
    ("name", "tokens"),
    [("multi30k", 1024), ("files", 4096), ("hf", 4096), ("wmt14", 4096), ("wmt14_enfr", 4096)],
)
def test_token_batches_default_to_the_sizes_the_readme_gives(name: str, tokens: int, tmp_path: Path) -> None:
    """README, "Batching": `data.max_tokens` is 1024 for Multi30k and 4096 for the other corpora."""
    assert compose_train(option("data", name, tmp_path), tmp_path).data.max_tokens == tokens


def test_base_with_a_37000_joint_vocabulary_has_63_082_496_parameters(tmp_path: Path) -> None:
    from attnlab.model import Transformer

    experiment = validate(compose_train(["model=base", "data=synthetic"], tmp_path))
    assert (experiment.model.tie, experiment.model.norm_first, experiment.model.output_bias) == (
        "all",
        False,
        False,
    )
    model = Transformer(experiment.model.with_vocab(37000, 37000))
    assert sum(p.numel() for p in model.parameters()) == 63_082_496


def test_the_model_presets_and_recipes_have_the_sizes_the_readme_gives(tmp_path: Path) -> None:
    """README, "Config groups": tiny (D 32, 2+2 layers), mini (D 256, 2+2, d_ff 512), small (D 256, 3+3);
    "Results": the default recipe (mini, joint BPE 5k) has 3.9M parameters, `multi30k_small` (small,
    joint BPE 8k) 7.6M."""
    from attnlab.model import Transformer

    def shape(overrides: list[str]) -> tuple[int, ...]:
        model = validate(compose_train(["data=synthetic", *overrides], tmp_path)).model
        return (model.d_model, model.n_encoder_layers, model.n_decoder_layers, model.d_ff)

    assert shape(["model=tiny"])[:3] == (32, 2, 2)
    assert shape(["model=mini"]) == (256, 2, 2, 512)
    assert shape(["model=small"])[:3] == (256, 3, 3)
    for recipe, params in (("multi30k_fast", 3.9e6), ("multi30k_small", 7.6e6)):
        experiment = validate(compose_train([f"experiment={recipe}"], tmp_path))
        vocab = experiment.data.vocab_size
        model = Transformer(experiment.model.with_vocab(vocab, vocab))
        assert round(sum(p.numel() for p in model.parameters()), -5) == params, recipe


def test_the_optim_presets_have_the_schedules_the_readme_gives(tmp_path: Path) -> None:
    """README, "Config groups": `linear` (the default) and `inverse_sqrt` are their schedules, `noam` the
    paper's with 4000 warm-up steps."""

    def schedule(overrides: list[str]) -> tuple[str, int]:
        optim = validate(compose_train(["data=synthetic", *overrides], tmp_path)).optim
        return optim.schedule, optim.warmup_steps

    assert schedule([])[0] == schedule(["optim=linear"])[0] == "linear"
    assert schedule(["optim=inverse_sqrt"])[0] == "inverse_sqrt"
    assert schedule(["optim=noam"]) == ("noam", 4000)


def test_the_multi30k_small_recipe_decodes_as_the_readmes_result(tmp_path: Path) -> None:
    """README, "Results": `experiment=multi30k_small` trains 9 epochs and decodes test2016 from the best
    checkpoint by validation BLEU (no averaging) with beam 5, GNMT α 1.0, batch 64: its 37.45 BLEU."""
    cfg = compose_train(["experiment=multi30k_small"], tmp_path)
    decode = validate(cfg).decode
    assert (cfg.trainer.max_epochs, cfg.average_last, cfg.monitor.metric) == (9, 0, "auto")
    assert (decode.beam, decode.length_penalty, decode.alpha, decode.batch_size) == (5, "gnmt", 1.0, 64)
    assert decode.every_n_epochs == 1  # val/bleu, which `auto` monitors, is decoded every epoch


def test_the_readmes_config_groups_table_lists_every_option_and_each_default(tmp_path: Path) -> None:
    """README, "Config groups": each row names every option of its group in conf/ (`table3/*` for a folder of
    them) and marks the one a run gets by default, "(default)", "(...; default)" or "(default: ...)"."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = re.search(r"^\| group \| options \|.*?\n\n", readme, re.S | re.M)
    assert table, "README.md has no Config groups table"
    defaults = compose_train([], tmp_path, hydra_node=True).hydra.runtime.choices
    rows = [row.split(" | ")[:2] for row in table.group(0).strip().splitlines()[2:]]
    for group, options in ((g.strip("|` "), o) for g, o in rows):
        marked = re.findall(r"`(\w+)` \((?:default[:)]|[^()]*[,;] default\))", options)
        while re.search(r"\([^()]*\)", options):  # what an option is, inside parentheses: not an option
            options = re.sub(r"\([^()]*\)", "", options)
        listed = set(re.findall(r"`([\w/*]+)`", options))
        files = {p.stem for p in (CONF / group).glob("*.yaml")} | {
            f"{p.name}/*" for p in (CONF / group).glob("*/")
        }
        assert listed == files, (
            f"README's {group} row lists {sorted(listed)}, conf/{group} holds {sorted(files)}"
        )
        if defaults.get(group) not in (None, "default"):  # (an option named `default` needs no mark)
            assert marked == [defaults[group]], f"README's {group} row marks {marked} as the default"


def test_the_top_level_keys_default_to_what_the_readme_gives(tmp_path: Path) -> None:
    """README, "Config groups": `seed` 1, `test` true (the test sets evaluated after training),
    `average_last` 0 (the best checkpoint), `allocator` keep, and `monitor` auto in each of its keys."""
    cfg = compose_train([], tmp_path)
    assert (cfg.seed, cfg.test, cfg.average_last, cfg.allocator) == (1, True, 0, "keep")
    keys = ("metric", "mode", "every_n_epochs")
    assert {key: cfg.monitor.get(key, "auto") for key in keys} == dict.fromkeys(keys, "auto")


@pytest.mark.parametrize(("group", "name"), OPTIONS, ids=[f"{g}={n}" for g, n in OPTIONS])
def test_every_cpu_node_instantiates(group: str, name: str, tmp_path: Path) -> None:
    from attnlab.model import Transformer

    offline = [] if group == "experiment" else ["data=synthetic"]  # experiments choose their own data
    cfg = compose_train([*offline, *option(group, name, tmp_path)], tmp_path)
    experiment = validate(cfg)
    cfg = resolve_monitor(cfg, experiment)
    if group == "model":
        model = Transformer(experiment.model)
        assert model.config.d_model == cfg.model.d_model
    datamodule = experiment.data.datamodule()  # real corpora are prepared only in setup
    assert isinstance(datamodule, L.LightningDataModule)
    for _, node in _nodes(cfg)[5:]:  # loggers and callbacks
        instantiate(node)
    trainer_name = name if group == "trainer" else "default"
    if trainer_name in BUILDABLE_TRAINERS and cfg.trainer.accelerator != "gpu":
        trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
        assert isinstance(trainer, L.Trainer)


LOGGERS_AND_CALLBACKS = {
    ("logger", "wandb"): {"wandb": "WandbLogger", "csv": "CSVLogger"},
    ("logger", "csv"): {"csv": "CSVLogger"},
    ("logger", "tensorboard"): {"tensorboard": "TensorBoardLogger", "csv": "CSVLogger"},
    ("logger", "mlflow"): {"mlflow": "MLflowLogger", "csv": "CSVLogger"},
    ("logger", "many"): {"wandb": "WandbLogger", "tensorboard": "TensorBoardLogger", "mlflow": "MLflowLogger",
                         "csv": "CSVLogger"},
    ("callbacks", "default"): {"model_checkpoint": "ModelCheckpoint", "last_checkpoint": "LastCheckpoint",
                               "averaging_checkpoints": "AveragingCheckpoints", "preemption": "Preemption"},
    ("callbacks", "none"): {},
}  # fmt: skip
LOGGERS_AND_CALLBACKS["callbacks", "early_stopping"] = {
    **LOGGERS_AND_CALLBACKS["callbacks", "default"], "early_stopping": "EarlyStopping"}  # fmt: skip


@pytest.mark.parametrize(
    ("group", "name"), LOGGERS_AND_CALLBACKS, ids=[f"{g}={n}" for g, n in LOGGERS_AND_CALLBACKS]
)
def test_each_logger_and_callbacks_option_builds_what_the_readme_gives(
    group: str, name: str, tmp_path: Path
) -> None:
    """README, "Config groups": `csv` is the CSV log alone, `wandb`, `tensorboard` and `mlflow` add theirs
    to it and `many` all of them; `callbacks=default` keeps the last, the best and the averaged checkpoints
    (and one on preemption), `early_stopping` adds `EarlyStopping` to those, `none` has no callback."""
    node = compose_train([f"{group}={name}"], tmp_path)[group] or {}
    built = {key: value._target_.rsplit(".", 1)[1] for key, value in node.items()}
    assert built == LOGGERS_AND_CALLBACKS[group, name]


MONITORS = [
    ([], ("val/bleu", "max", 1)),
    (["decode.every_n_epochs=3"], ("val/bleu", "max", 3)),
    (["decode.every_n_epochs=0"], ("val/loss", "min", 1)),
    (["data=synthetic"], ("val/loss", "min", 1)),
    (["monitor.metric=val/chrf", "decode.every_n_epochs=2"], ("val/chrf", "max", 2)),
    (["monitor.metric=val/loss", "monitor.mode=max"], ("val/loss", "max", 1)),
]


@pytest.mark.parametrize(
    ("overrides", "expected"), MONITORS, ids=[" ".join(o) or "default" for o, _ in MONITORS]
)
def test_monitor_auto_resolves_from_the_data_and_decoding(
    overrides: list[str], expected: tuple[str, str, int], tmp_path: Path
) -> None:
    cfg = compose_train(overrides, tmp_path)
    cfg = resolve_monitor(cfg, validate(cfg))
    assert (cfg.monitor.metric, cfg.monitor.mode, cfg.monitor.every_n_epochs) == expected
    assert (cfg.callbacks.model_checkpoint.monitor, cfg.callbacks.model_checkpoint.every_n_epochs) == (
        expected[0],
        expected[2],
    )


@pytest.mark.parametrize("overrides", [[], ["data=synthetic"]], ids=["text", "synthetic"])
def test_planning_a_run_leaves_the_callers_config_as_it_was_and_freezes_its_own(
    overrides: list[str], tmp_path: Path
) -> None:
    """`plan_run` resolves the monitor into a new config and makes it read-only: no stage after
    validation changes the config, and the caller's config is untouched."""
    from omegaconf.errors import ReadonlyConfigError

    from attnlab.training.pipeline import plan_run

    cfg = compose_train(overrides, tmp_path)
    before = OmegaConf.to_yaml(cfg)
    plan = plan_run(cfg)
    assert OmegaConf.to_yaml(cfg) == before
    assert not OmegaConf.is_readonly(cfg)
    with pytest.raises(ReadonlyConfigError):
        plan.cfg.trainer.max_epochs = 7
    expected = "val/loss" if overrides else "val/bleu"
    assert plan.cfg.monitor.metric == plan.resolved["monitor"]["metric"] == expected
    assert plan.cfg.callbacks.model_checkpoint.monitor == expected
    assert not tmp_path.joinpath("config.yaml").exists()  # planning writes nothing


def test_planning_a_run_without_a_monitor_leaves_the_callers_config_writable(tmp_path: Path) -> None:
    """`monitor=null` (nothing to resolve): the plan freezes a copy, never the caller's config."""
    from omegaconf.errors import ReadonlyConfigError

    from attnlab.training.pipeline import plan_run

    cfg = compose_train(["data=synthetic", "monitor=null", "callbacks=none"], tmp_path)
    plan = plan_run(cfg)
    cfg.trainer.max_epochs = 7  # still the caller's to change
    with pytest.raises(ReadonlyConfigError):
        plan.cfg.trainer.max_epochs = 7
    assert plan.cfg.trainer.max_epochs != 7 and plan.cfg.monitor is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["data=synthetic", "monitor.metric=val/bleu"],
            "monitor.metric=val/bleu needs validation decodes, but the data",
        ),
        (["decode.every_n_epochs=0", "monitor.metric=val/chrf"], "decode.every_n_epochs=0 turns them off"),
        (["monitor.mode=up"], "monitor.mode='up'"),
        # both failed in Lightning at the end of the first validation
        (
            ["monitor.metric=val/blue"],
            "monitor.metric=val/blue is no metric logged while fitting: did you "
            "mean monitor.metric=val/bleu? use one of train/{loss,nll,ppl,",
        ),
        (["monitor.metric=test/loss"], "monitor.metric=test/loss is no metric logged while fitting"),
        (["monitor.every_n_epochs=0"], "monitor.every_n_epochs=0"),
    ],
)
def test_impossible_monitors_are_rejected(overrides: list[str], message: str, tmp_path: Path) -> None:
    cfg = compose_train(overrides, tmp_path)
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve_monitor(cfg, validate(cfg))


def test_gpu_presets_match_the_trainer_signature(tmp_path: Path) -> None:
    cfg = compose_train(["trainer=gpu"], tmp_path)
    assert get_class(cfg.trainer._target_) is L.Trainer
    parameters = inspect.signature(L.Trainer.__init__).parameters
    assert set(cfg.trainer) - {"_target_"} <= set(parameters)
    assert (cfg.trainer.accelerator, cfg.trainer.devices, cfg.trainer.precision) == ("gpu", 1, "bf16-mixed")


@pytest.mark.gpu
def test_gpu_preset_instantiates_on_a_gpu(tmp_path: Path) -> None:
    cfg = compose_train(["trainer=gpu"], tmp_path)
    trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
    assert trainer.num_devices == 1 and trainer.precision == "bf16-mixed"


def test_cpu_preset_is_one_float32_cpu_process(tmp_path: Path) -> None:
    cfg = compose_train(["trainer=cpu"], tmp_path)
    trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
    assert (type(trainer.accelerator).__name__, trainer.num_devices, trainer.precision) == (
        "CPUAccelerator", 1, "32-true"
    )  # fmt: skip


def test_ddp_cpu_preset_is_two_gloo_processes(tmp_path: Path) -> None:
    cfg = compose_train(["trainer=ddp_cpu"], tmp_path)
    trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
    assert trainer.num_devices == 2
    assert type(trainer.strategy).__name__ == "DDPStrategy"
    assert trainer.strategy._process_group_backend in (None, "gloo")


INVALID = [
    (["model.n_heads=3"], "model.n_heads=3 does not divide d_model=256"),
    (["model.d_model=-8"], "model.d_model=-8 must be positive"),
    (["model.d_ff=0"], "model.d_ff=0 must be positive"),
    (["model.n_encoder_layers=0"], "model.n_encoder_layers=0 must be positive"),
    (["model.dropout=1.5"], "model.dropout=1.5 must be in [0, 1)"),
    (["model.pe=rotary"], "model.pe='rotary' is not valid: expected 'sinusoidal' | 'learned' | 'none'"),
    (["model.activation=tanh"], "model.activation='tanh' is not valid"),
    (["model.tie=encoder"], "model.tie='encoder' is not valid"),
    (["model.d_model=big"], "model.d_model='big' is not valid: expected int"),
    (["model.norm_first=3"], "model.norm_first=3 is not valid: expected bool"),
    (["model.eos_id=0"], "model.pad_id=0, bos_id=1 and eos_id=0 must be distinct"),
    (["model.pad_id=99"], "model.pad_id=99 is outside src_vocab_size=20"),
    (["model.pe=learned", "model.max_positions=8"], "model.max_positions=8 is smaller than the 13 positions"),
    (["+model.d_modle=64"], "model.d_modle is not a parameter of attnlab.model.config.TransformerConfig"),
    (["+model.src_vocab_size=30"], "model.src_vocab_size/model.tgt_vocab_size are set by the data"),
    (["optim.warmup_steps=0"], "optim.warmup_steps=0 must be positive"),
    (["optim.label_smoothing=1.0"], "optim.label_smoothing=1.0 must be in [0, 1)"),
    (["optim.schedule=cosine"], "optim.schedule='cosine' is not valid"),
    (["optim.betas=[0.9,1.5]"], "optim.betas=[0.9, 1.5] must each be in [0, 1)"),
    (["data.min_len=9", "data.max_len=3"], "data.min_len=9 must be <= max_len=3"),
    (["data.batch_size=0"], "data.batch_size=0 must be positive"),
    (["data.task=sort"], "data.task='sort' is not valid"),
    (["trainer.max_epochs=0"], "trainer.max_epochs=0 must be a positive integer"),
    (["trainer.accelerator=tpuu"], "trainer.accelerator='tpuu' is unknown"),
    (["trainer.precision=8"], "trainer.precision=8 is unknown"),
    (["trainer.devices=0"], "trainer.devices=0 must be a positive count"),
    (["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val=-1 must be a number >= 0"),
    (["seed=abc"], "seed='abc' must be an integer"),
    # a list failed as a TypeError (unhashable) in attnlab-train once the run had trained
    (["optimized_metric=[val/loss]"], "optimized_metric=['val/loss'] must be the name of a final metric"),
    (["allocator=jemalloc"], "allocator='jemalloc' is not an allocator setting: use keep"),
    (["decode.beam=0"], "decode.beam=0 must be positive"),
    (["decode.alpha=-1"], "decode.alpha=-1.0 must be >= 0"),
    (["decode.length_penalty=wu"], "decode.length_penalty='wu' is not valid: expected 'gnmt' | 'fairseq'"),
    (["decode.lenpen=0.6", "decode.alpha=0.6"], "decode.lenpen=0.6 and alpha=0.6 are both set"),
    (["decode.lenpen=1", "decode.length_penalty=fairseq"], "use decode.alpha=1.0 instead of decode.lenpen"),
    (["decode.every_n_epochs=-1"], "decode.every_n_epochs=-1 must be >= 0"),
    (["decode.val_subset=0"], "decode.val_subset=0 must be positive"),
    (
        ["decode.print_alignment=yes"],
        "decode.print_alignment='yes' is not valid: expected 'hard' | 'soft' | null",
    ),
    # YAML's booleans: a config file's `print_alignment: yes` and the override `...=true` arrive as True
    (
        ["decode.print_alignment=true"],
        "decode.print_alignment=True is not valid: expected 'hard' | 'soft' | null "
        "(YAML reads an unquoted yes, on or true as the boolean true)",
    ),
    (["decode.print_alignment=false"], "(YAML reads an unquoted no, off or false as the boolean false)"),
    (["data._target_=attnlab.data.Nope"], "data._target_=attnlab.data.Nope cannot be imported"),
    # read as no compilation (`compile.enabled=yes` failed once the data was prepared)
    (["compile=true"], "compile=True must be a node of compile settings (or null)"),
    (["+compile.enable=true"], "compile.enable is not a compile setting: did you mean compile.enabled?"),
    (["compile.enabled=yes"], "compile.enabled='yes' must be true or false"),
]


def test_a_sweep_objective_no_run_writes_is_refused_naming_the_closest_name() -> None:
    """A misspelt `optimized_metric` was reported once each trial had trained; a name some data could
    give (a test set's scores, whatever the set) is not refused."""
    for name in ("best/val/bleu", "test/newstest2014/ter", "train/loss_epoch", "test/exact_match", None):
        check_sweep_objective(name, None)
    refusals = {
        "best/val/blue": "did you mean optimized_metric=best/val/bleu? use one of train/{",
        "test/test2016/blue": "did you mean optimized_metric=test/test2016/bleu? ",
        "val/exact_match": "did you mean optimized_metric=test/exact_match? ",
    }
    for name, closest in refusals.items():
        with pytest.raises(ConfigError, match=re.escape(f"optimized_metric={name} is no final metric of a "
                                                        f"training run: {closest}")):  # fmt: skip
            check_sweep_objective(name, "maximize")
    with pytest.raises(ConfigError, match=re.escape("test/<set>/{bleu,chrf,ter}, best/<monitor.metric>")):
        check_sweep_objective("best/test/loss", None)
    # Optuna's direction for one objective, also as a one-entry list; several objectives are not checked
    for direction in ("maximize", ["maximize"], ["MAXIMIZE"]):
        with pytest.raises(
            ConfigError, match=r"best/val/loss is better lower, but hydra\.sweeper\.direction="
        ):
            check_sweep_objective("best/val/loss", direction)
    check_sweep_objective("best/val/loss", ["maximize", "minimize"])
    check_sweep_objective("best/val/loss", "minimize")
    check_sweep_objective("best/val/loss", "MINIMIZE")  # the name of Optuna's Direction enum


def test_a_sweep_going_the_wrong_way_is_refused_for_lightnings_metric_ends_and_for_bleu_and_chrf() -> None:
    """A metric logged with Lightning's `_epoch` or `_step` end is its metric's kind (`train/loss_epoch`
    is better lower), and a minimized BLEU or chrF is refused as a maximized loss is, naming the fix."""
    for name in ("train/loss_epoch", "train/loss_step"):
        lower = f"{name} is better lower, but hydra.sweeper.direction=maximize: the search would look for"
        with pytest.raises(ConfigError, match=re.escape(lower)):
            check_sweep_objective(name, "maximize")
        check_sweep_objective(name, "minimize")
    higher = (
        "is better higher, but hydra.sweeper.direction=minimize: the search would look for the worst"
        " settings. Add hydra.sweeper.direction=maximize"
    )
    for name in ("best/val/bleu", "test/test2016/chrf"):
        with pytest.raises(ConfigError, match=re.escape(higher)):
            check_sweep_objective(name, "minimize")
        check_sweep_objective(name, "maximize")


@pytest.mark.parametrize(("overrides", "message"), INVALID, ids=[" ".join(o) for o, _ in INVALID])
def test_invalid_values_are_rejected_naming_the_key(
    overrides: list[str], message: str, tmp_path: Path
) -> None:
    cfg = compose_train(["model=small", "data=synthetic", "data.n_symbols=16", *overrides], tmp_path)
    with pytest.raises(ConfigError) as excinfo:
        validate(cfg)
    assert message in str(excinfo.value)


# Values at the edge of what the checks take, each accepted (a check one step too strict refused them).
ACCEPTED = [
    ["seed=0"],  # NumPy's smallest seed (README: 0 to 2^32 - 1)
    ["seed=4294967295"],  # NumPy's largest seed
    ["trainer.gradient_clip_val=0"],  # no clipping
    ["trainer.max_epochs=-1", "optim.total_steps=1000"],  # the linear schedule's length from optim
    ["trainer.max_epochs=null"],  # Lightning's 1000 epochs: a run of known length for the linear schedule
    ["init_from=%(file)s", "ckpt_path=last"],  # ckpt_path=last is resume=true: the fine-tuning run goes on
]


@pytest.mark.parametrize("overrides", ACCEPTED, ids=[" ".join(o) for o in ACCEPTED])
def test_values_at_the_edge_of_the_checks_are_accepted(overrides: list[str], tmp_path: Path) -> None:
    checkpoint = tmp_path / "start.ckpt"
    checkpoint.write_bytes(b"")  # (validate checks only that init_from is a file)
    overrides = [o % {"file": checkpoint} for o in overrides]
    validate(compose_train(["model=small", "data=synthetic", "data.n_symbols=16", *overrides], tmp_path))


def test_a_group_of_your_own_added_with_plus_is_not_taken_for_a_misspelt_key(tmp_path: Path) -> None:
    """`+study=a` adds a config group of your own (from `hydra.searchpath`): a config file defines its key,
    unlike `+foo=1`, which is refused as a typo."""
    (tmp_path / "conf" / "study").mkdir(parents=True)
    (tmp_path / "conf" / "study" / "a.yaml").write_text("note: x\n")
    own = [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "model=small", "data=synthetic"]
    cfg = compose_train([*own, "+study=a"], tmp_path / "run", hydra_node=True)
    assert cfg.study.note == "x"
    validate(cfg)
    with pytest.raises(ConfigError, match="foo is not a key of the training config"):
        validate(compose_train([*own, "+foo=1"], tmp_path / "run", hydra_node=True))


def test_a_null_skip_done_reads_as_false(tmp_path: Path) -> None:
    """`sweep.skip_done=null`, Hydra's way to unset a key, was refused ("must be true or false"): it is the
    default, false, as `sweep=null` is; text is still refused."""
    from attnlab.training.experiment import sweep_skip_done

    cfg = compose_train(
        ["model=small", "data=synthetic", "data.n_symbols=16", "sweep.skip_done=null"], tmp_path
    )
    assert cfg.sweep.skip_done is None and sweep_skip_done(cfg.sweep) is False
    validate(cfg)
    assert sweep_skip_done(None) is False and sweep_skip_done({"skip_done": True}) is True
    with pytest.raises(ConfigError, match=r"sweep.skip_done='no' must be true or false \(null: false\)"):
        sweep_skip_done({"skip_done": "no"})


def test_a_bad_value_is_rejected_by_the_cli_before_torch_is_imported(tmp_path: Path) -> None:
    """A mistyped value is refused with one line before torch is imported, and the refused command leaves
    no run directory (Hydra had made one, with its record and log: `refusal_leaves_no_run_directory`)."""
    script = (
        "import sys\n"
        "from attnlab.cli.train import main\n"
        f"sys.argv = ['attnlab-train', 'model.n_heads=5', 'paths.log_dir={tmp_path}']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    print('EXIT', exc)\n"
        "print('TORCH_IMPORTED', 'torch' in sys.modules, 'lightning' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "EXIT attnlab-train: config error: model.n_heads=5 does not divide d_model=256" in out.stdout, out
    assert "TORCH_IMPORTED False False" in out.stdout
    assert list(tmp_path.iterdir()) == []  # the run directory Hydra made (.hydra/, train.log) is removed


def test_help_and_cfg_job_do_not_import_torch() -> None:
    script = (
        "import sys\n"
        "from attnlab.cli.train import main\n"
        "sys.argv = ['attnlab-train', 'model=tiny', '--cfg', 'job']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('TORCH_IMPORTED', 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "d_model: 32" in out.stdout and "TORCH_IMPORTED False" in out.stdout, out


def test_your_own_configs_come_in_by_config_dir_or_the_search_path(tmp_path: Path) -> None:
    """README, "Your own configs": an experiment under `--config-dir`, a model group option through
    `hydra.searchpath`, both composed over the packaged configs (`--cfg job`: no torch import)."""
    mine = tmp_path / "my_conf"
    (mine / "experiment").mkdir(parents=True)
    (mine / "model").mkdir()
    (mine / "experiment" / "my_study.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /model: small\nmodel:\n  pe: learned\n"
    )
    (mine / "model" / "my_model.yaml").write_text(
        "defaults:\n  - base\n  - _self_\nd_model: 64\nn_heads: 2\n"
    )

    def job(*args: str) -> dict[str, Any]:
        command = [sys.executable, "-m", "attnlab.cli.train", *args, "--cfg", "job"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return yaml.safe_load(done.stdout)

    study = job("--config-dir", "./my_conf", "experiment=my_study")["model"]
    assert (study["pe"], study["d_model"], study["n_encoder_layers"]) == ("learned", 256, 3)  # small + diff
    model = job(f"hydra.searchpath=[file://{mine}]", "model=my_model")["model"]
    assert (model["d_model"], model["n_heads"], model["d_ff"]) == (64, 2, 2048)  # base's d_ff


def test_run_directories_never_collide(tmp_path: Path) -> None:
    dirs = {str(compose_train([], tmp_path, hydra_node=True).hydra.run.dir) for _ in range(5)}
    assert len(dirs) == 5
    # <date>_<time>_<pid in hex>-<6 random hex digits>
    pattern = rf"\d{{4}}-\d\d-\d\d_\d\d-\d\d-\d\d_{os.getpid():x}-[0-9a-f]{{6}}"
    assert all(re.fullmatch(pattern, Path(path).name) for path in dirs), dirs
    cfg = compose_train([], tmp_path, hydra_node=True)
    assert cfg.hydra.run.dir == cfg.hydra.run.dir  # stable within one run


def test_runs_go_under_logs_or_attnlab_log_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README, "Config groups": `paths.log_dir` is `./logs` (relative to the working directory), or the
    environment's `ATTNLAB_LOG_DIR` unless it is empty (runs went under the filesystem's root, `/train/runs`);
    a run's directory is `<log_dir>/train/runs/<date>_<time>_<id>`."""
    for unset in (False, True):
        if unset:
            monkeypatch.delenv("ATTNLAB_LOG_DIR", raising=False)
        else:
            monkeypatch.setenv("ATTNLAB_LOG_DIR", "")
        cfg = compose_train([], tmp_path, hydra_node=True)
        assert cfg.paths.log_dir == "logs" and Path(cfg.hydra.run.dir).parent == Path("logs/train/runs")
    monkeypatch.setenv("ATTNLAB_LOG_DIR", str(tmp_path / "mine"))
    cfg = compose_train([], tmp_path, hydra_node=True)
    assert Path(cfg.hydra.run.dir).parent == tmp_path / "mine" / "train" / "runs"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once (without build isolation: no network)."""
    out_dir = tmp_path_factory.mktemp("wheel")
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out_dir)]
    out = subprocess.run([*command, str(root)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (built,) = out_dir.glob("attnlab-*.whl")
    return built


def test_configs_are_packaged_into_the_wheel(wheel: Path) -> None:
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"attnlab/conf/{p.relative_to(CONF)}" for p in CONF.rglob("*.yaml")}
    assert expected <= names
    assert "attnlab/cli/train.py" in names


def test_an_installed_wheel_composes_from_its_packaged_configs(wheel: Path, tmp_path: Path) -> None:
    """`config_dir()` in a wheel install is the packaged `attnlab/conf`, not a checkout's `conf/`: a model
    option only the installed copy has composes (`--cfg job`), run outside the checkout."""
    installed = tmp_path / "site"
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(installed)]
    out = subprocess.run([*command, str(wheel)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    packaged = installed / "attnlab" / "conf"
    (packaged / "model" / "packaged_only.yaml").write_text("defaults:\n  - base\n  - _self_\nd_model: 48\n")
    script = (
        f"import sys\nsys.path.insert(0, {str(installed)!r})\n"
        "from attnlab.cli.app import config_dir\nfrom attnlab.cli.train import main\n"
        "print('CONF', config_dir())\n"
        "sys.argv = ['attnlab-train', 'model=packaged_only', '--cfg', 'job']\nmain()\n"
    )
    run = [sys.executable, "-c", script]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"CONF {packaged}\n" in done.stdout
    assert yaml.safe_load(done.stdout.split("\n", 1)[1])["model"]["d_model"] == 48


INVALID_CORPUS = [
    (["data.vocab_size=4"], "data.vocab_size=4 must exceed the 4 special tokens"),
    (["data.src_lang=cs"], "data.src_lang='cs' is not a Multi30k language: use one of de, en, fr"),
    (["data.src_lang=en"], "data.src_lang='en' equals tgt_lang"),
    (["data.max_tokens=null", "data.batch_size=null"], "data.max_tokens=null and batch_size=null"),
    (["data.max_tokens=0"], "data.max_tokens=0 must be positive"),
    (["data.max_length_ratio=-1"], "data.max_length_ratio=-1.0 must be positive"),
    (["data.tokenizer=wordpiece"], "data.tokenizer='wordpiece' is not valid: expected 'bpe' | 'unigram'"),
    (
        ["data.joint_vocab=false"],
        "model.tie=all shares one embedding between source and target, but data.joint",
    ),
    (["+model.tgt_vocab_size=8000"], "model.src_vocab_size/model.tgt_vocab_size are set by the data"),
]


@pytest.mark.parametrize(
    ("overrides", "message"), INVALID_CORPUS, ids=[" ".join(o) for o, _ in INVALID_CORPUS]
)
def test_invalid_corpus_values_are_rejected_naming_the_key(
    overrides: list[str], message: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate(compose_train(["data=multi30k", *overrides], tmp_path))
    assert message in str(excinfo.value)


def test_required_values_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.dir is required .*set data\.dir=<value>"):
        validate(compose_train(["data=files"], tmp_path))


def test_separate_vocabularies_work_with_decoder_tying(tmp_path: Path) -> None:
    experiment = validate(
        compose_train(["data=multi30k", "data.joint_vocab=false", "model.tie=decoder"], tmp_path)
    )
    assert experiment.data.joint_vocab is False and experiment.model.src_vocab_size is None


def test_launcher_presets_give_each_device_a_task(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the [sweep] extra")
    cfg = compose_train(["hydra/launcher=slurm", "trainer=ddp_cpu", "trainer.num_nodes=2"], tmp_path,
                        hydra_node=True)  # fmt: skip
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.tasks_per_node, launcher.nodes, launcher.gpus_per_node) == (2, 2, 2)
    assert launcher.max_num_timeout == 3 and launcher.signal_delay_s == 120
    local = compose_train(["hydra/launcher=local"], tmp_path, hydra_node=True).hydra.launcher
    assert local._target_.endswith("LocalLauncher") and local.tasks_per_node == 1


def test_the_optuna_search_preset_composes(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="needs the [sweep] extra")
    cfg = compose_train(["hparams_search=optuna"], tmp_path, hydra_node=True)
    assert cfg.optimized_metric == "best/val/bleu" and cfg.hydra.sweeper.direction == "maximize"
    assert cfg.hydra.sweeper.storage is None  # an in-memory study
    assert dict(cfg.hydra.sweeper.params) == {  # the search space the README gives
        "optim.peak_lr": "tag(log, interval(3e-4, 3e-3))",
        "optim.warmup_steps": "choice(250, 500, 1000)",
        "model.dropout": "choice(0.1, 0.2, 0.3)",
        "optim.label_smoothing": "choice(0.0, 0.1, 0.2)",
    }


def test_a_range_under_optuna_includes_its_stop_unlike_the_basic_sweeper() -> None:
    """README, Sweeps: Optuna's sweeper samples a whole-number `range(1,5)` from 1 to 5, its stop included;
    the basic sweeper runs 1 to 4 (a hydra-optuna-sweeper that changes this makes the README wrong)."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="needs the [sweep] extra")
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra_plugins.hydra_optuna_sweeper._impl import create_optuna_distribution_from_override

    (override,) = OverridesParser.create().parse_overrides(["seed=range(1,5)"])
    assert list(override.sweep_string_iterator()) == ["1", "2", "3", "4"]
    distribution = create_optuna_distribution_from_override(override)
    assert (distribution.low, distribution.high, distribution.step) == (1, 5, 1)


def test_multi_gpu_presets(tmp_path: Path) -> None:
    from lightning.pytorch.strategies import FSDPStrategy

    from attnlab.model.layers import DecoderLayer, EncoderLayer

    parameters = inspect.signature(L.Trainer.__init__).parameters
    ddp = compose_train(["trainer=ddp"], tmp_path).trainer
    assert set(ddp) - {"_target_"} <= set(parameters)
    assert (ddp.accelerator, ddp.devices, ddp.strategy, ddp.precision) == ("gpu", -1, "ddp", "bf16-mixed")
    fsdp = compose_train(["trainer=fsdp"], tmp_path).trainer
    assert set(fsdp) - {"_target_"} <= set(parameters)
    strategy = instantiate(fsdp.strategy)
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {EncoderLayer, DecoderLayer}
    assert strategy._state_dict_type == "full"


def test_under_submitit_on_slurm_lightning_does_not_requeue(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from attnlab.training.pipeline import cluster_plugins

    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    assert cluster_plugins() == []  # Lightning picks its environment itself (auto-requeue on SLURM)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    (plugin,) = cluster_plugins()
    assert isinstance(plugin, SLURMEnvironment) and plugin.auto_requeue is False


WMT14 = {  # experiment: (model d_model, steps, average_last, average_every_n_steps, dropout, tgt_lang, vocab)
    "wmt14_base": (512, 100_000, 5, 1500, 0.1, "de", 37000),
    "wmt14_big": (1024, 300_000, 20, 600, 0.3, "de", 37000),
    "wmt14_enfr_base": (512, 100_000, 5, 1500, 0.1, "fr", 32000),
}


@pytest.mark.parametrize("name", sorted(WMT14))
def test_the_paper_recipes_compose_validate_and_hold_the_papers_settings(name: str, tmp_path: Path) -> None:
    """The WMT14 recipes cannot run here; their settings are the paper's (§5, §6.1), from the hub and
    from local files."""
    from attnlab.data import FilesData, HFData
    from attnlab.training.pipeline import plan_run

    d_model, steps, average, every, dropout, tgt, vocab = WMT14[name]
    cfg = compose_train([f"experiment={name}"], tmp_path)
    experiment = validate(cfg)
    assert isinstance(experiment.data, HFData) and experiment.data.name == "wmt14"
    data = experiment.data
    assert (data.src_lang, data.tgt_lang, data.vocab_size) == ("en", tgt, vocab)
    model, optim, decode = experiment.model, experiment.optim, experiment.decode
    assert (model.d_model, model.n_encoder_layers, model.dropout, model.tie) == (d_model, 6, dropout, "all")
    assert (optim.schedule, optim.warmup_steps, optim.betas, optim.eps, optim.label_smoothing) == (
        "noam", 4000, (0.9, 0.98), 1e-9, 0.1)  # fmt: skip
    assert (decode.beam, decode.length_penalty, decode.alpha, decode.max_len_a, decode.max_len_b) == (
        4, "gnmt", 0.6, 1.0, 50)  # fmt: skip
    trainer = cfg.trainer
    tokens = cfg.data.max_tokens * trainer.devices * trainer.num_nodes * trainer.accumulate_grad_batches
    assert 25_000 <= tokens <= 26_000  # ~25,000 source and target tokens per optimizer step (§5.1)
    assert (trainer.max_steps, cfg.average_last, cfg.average_every_n_steps) == (steps, average, every)
    assert trainer.check_val_every_n_epoch is None and trainer.val_check_interval > 0
    one_gpu = compose_train([f"experiment={name}", "trainer.devices=1"], tmp_path)
    assert one_gpu.data.max_tokens * 8 == tokens
    local = tmp_path / "wmt14"
    local.mkdir()
    files = compose_train([f"experiment={name}", "data=files", f"data.dir={local}", "data.src_lang=en",
                           f"data.tgt_lang={tgt}", "data.valid=newstest2013", "data.test=[newstest2014]"],
                          tmp_path)  # fmt: skip
    spec = validate(files).data
    assert isinstance(spec, FilesData) and (spec.vocab_size, spec.max_tokens) == (vocab, 3200)
    if name == "wmt14_big":
        from attnlab.model import Transformer

        params = sum(p.numel() for p in Transformer(model.with_vocab(vocab, vocab)).parameters())
        assert 200e6 < params < 230e6  # Table 3: 213M
    plan_run(cfg)  # the trainer, callbacks and loggers take every key given


def test_decode_lenpen_of_older_configs_is_read_as_the_gnmt_alpha(tmp_path: Path) -> None:
    """`decode.lenpen=X` (an old override or config) still trains with GNMT α = X, with one deprecation
    message naming the new keys; what is saved and reported is the new form."""
    import warnings

    from attnlab.decoding import DecodeConfig

    cfg = compose_train(["data=synthetic", "decode.lenpen=1.2"], tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decode = validate(cfg).decode
    messages = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert len(messages) == 1 and "decode.alpha" in messages[0] and "decode.length_penalty" in messages[0]
    assert (decode.length_penalty, decode.alpha, decode.lenpen) == ("gnmt", 1.2, None)
    assert "lenpen" not in decode.to_dict() and decode.to_dict()["alpha"] == 1.2
    assert DecodeConfig(**decode.to_dict()) == decode  # re-read from a checkpoint: no message, same value
    default = validate(compose_train(["data=synthetic"], tmp_path / "d")).decode
    assert (default.length_penalty, default.alpha) == ("gnmt", 0.6)  # today's default, unchanged
    assert DecodeConfig(length_penalty="fairseq").alpha == 1.0
