"""Fault injection into the training config: every wrong value fails before training starts, with a
message naming the offending key and the fix.

Each row of `CASES` is one mistake a user can type on the command line, run in-process the way
`attnlab-train <overrides>` runs it: the Hydra overrides are composed onto `conf/train.yaml` (the
defaults: `data=multi30k`, `model=mini`, `optim=linear`, ...) and the config goes to
`attnlab.training.pipeline.train`, whose first steps are the torch-free checks (`validate`, `resolve_monitor`,
`resume_path`). A row is `Case(overrides, error, key, fix)`:

    overrides  the Hydra overrides, exactly as typed after `attnlab-train`
    error      the exception: `ConfigError` from our checks, or Hydra's own exception for mistakes
               Hydra rejects while composing (an unknown preset, an unknown key without `+`)
    key        text naming the offending key that the message must contain (`model.d_model=0`)
    fix        text of the fix that the message must contain (the accepted values, the bound, the
               override to use)

Rows are grouped by config node: model, optim, decode, data, trainer, top level. "Before training
starts" is checked by the run directory: `train` creates it right after these checks, so after every
case it must not exist (and reaching the training loop fails the test outright).

`UNLOADABLE` lists config files a user writes that Hydra cannot load while composing (not YAML, a key
given twice, not a mapping, not UTF-8): each refuses the command in one line naming the file and the line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

import attnlab.io
import attnlab.training.pipeline
from attnlab.io import too_long_path
from attnlab.training.launchers import _default_job_names_fit
from attnlab.training.pipeline import train
from attnlab.typed import ConfigError
from helpers import command_here, compose_train

MISSING = "/nonexistent/attnlab-faults"  # a path that exists nowhere


class Case(NamedTuple):
    overrides: list[str]
    error: type[Exception]
    key: str
    fix: str


E = ConfigError
CASES = [
    # --- model: sizes, closed choices, probabilities, types, unknown keys ------------------------------
    Case(["model.d_model=0"], E, "model.d_model=0", "must be positive"),
    Case(["model.d_model=-8"], E, "model.d_model=-8", "must be positive"),
    Case(["model.n_heads=0"], E, "model.n_heads=0", "must be positive"),
    Case(["model.n_heads=-2"], E, "model.n_heads=-2", "must be positive"),
    Case(["model.d_ff=0"], E, "model.d_ff=0", "must be positive"),
    Case(["model.d_ff=-1"], E, "model.d_ff=-1", "must be positive"),
    Case(["model.n_encoder_layers=0"], E, "model.n_encoder_layers=0", "must be positive"),
    Case(["model.n_decoder_layers=-1"], E, "model.n_decoder_layers=-1", "must be positive"),
    Case(
        ["model.n_heads=3"],
        E,
        "model.n_heads=3",
        "choose n_heads that divides d_model, or set d_head explicitly",
    ),
    Case(["model.pe=rotary"], E, "model.pe='rotary'", "'sinusoidal' | 'learned' | 'none'"),
    Case(["model.pe_layout=zigzag"], E, "model.pe_layout='zigzag'", "'interleaved' | 'split'"),
    Case(["model.activation=tanh"], E, "model.activation='tanh'", "'relu' | 'gelu' | 'silu'"),
    Case(["model.dropout=-0.1"], E, "model.dropout=-0.1", "in [0, 1)"),
    Case(["model.dropout=1.5"], E, "model.dropout=1.5", "in [0, 1)"),
    Case(["model.attention_dropout=2"], E, "model.attention_dropout=2.0", "in [0, 1)"),
    # tie=all (the paper's shared embeddings, model=base/small) needs one joint source/target vocabulary
    Case(["data.joint_vocab=false"], E, "model.tie=all", "set data.joint_vocab=true or model.tie=decoder"),
    Case(["model.d_model=big"], E, "model.d_model='big'", "expected int"),
    Case(["model.n_heads=4.5"], E, "model.n_heads=4.5", "expected int"),
    Case(["model.n_encoder_layers=two"], E, "model.n_encoder_layers='two'", "expected int"),
    Case(["model.norm_first=3"], E, "model.norm_first=3", "expected bool"),
    Case(["+model.d_modle=64"], E, "model.d_modle", "did you mean model.d_model?"),
    Case(["model=huge"], MissingConfigException, "model/huge", "Available options in 'model'"),
    # --- optim: schedule, warm-up, learning rate, label smoothing -------------------------------------
    Case(["optim.label_smoothing=-0.1"], E, "optim.label_smoothing=-0.1", "in [0, 1)"),
    Case(["optim.label_smoothing=1.0"], E, "optim.label_smoothing=1.0", "in [0, 1)"),
    Case(["optim.warmup_steps=0"], E, "optim.warmup_steps=0", "must be positive"),
    Case(["optim.warmup_steps=-100"], E, "optim.warmup_steps=-100", "must be positive"),
    Case(["optim=linear", "optim.warmup_steps=0"], E, "optim.warmup_steps=0", "must be positive"),
    Case(["optim.warmup_steps=1.5"], E, "optim.warmup_steps=1.5", "expected int"),
    Case(["optim=inverse_sqrt", "optim.peak_lr=0"], E, "optim.peak_lr=0.0", "must be positive"),
    Case(["optim=linear", "optim.peak_lr=-1e-3"], E, "optim.peak_lr=-0.001", "must be positive"),
    Case(["optim.lr_scale=0"], E, "optim.lr_scale=0.0", "must be positive"),
    Case(["optim=linear", "optim.total_steps=100"], E, "optim.total_steps=100", "more than warmup_steps=400"),
    Case(["optim.schedule=cosine"], E, "optim.schedule='cosine'", "'noam' | 'inverse_sqrt' | 'linear'"),
    Case(["optim=adafactor"], MissingConfigException, "optim/adafactor", "Available options in 'optim'"),
    Case(["+optim.optimizer=sgd"], E, "optim.optimizer", "known keys: schedule, lr_scale"),
    # --- decode: beam search and length limits ---------------------------------------------------------
    Case(["decode.beam=0"], E, "decode.beam=0", "must be positive"),
    Case(["init_from=/no/such/file.ckpt"], E, "init_from='/no/such/file.ckpt'", "give a .ckpt file"),
    Case(["metrics.bleu_tokenize=spm"], E, "metrics.bleu_tokenize='spm'", "'13a' | 'intl' | 'zh'"),
    Case(["metrics.bleu_tokenize=ja-mecab"], E, "bleu_tokenize=ja-mecab", 'pip install "sacrebleu[ja]"'),
    Case(["decode.beam=2.0"], E, "decode.beam=2.0", "expected int"),
    Case(["decode.val_beam=0"], E, "decode.val_beam=0", "must be positive"),
    Case(["decode.alpha=-0.5"], E, "decode.alpha=-0.5", ">= 0"),
    Case(["decode.max_len_a=-1"], E, "decode.max_len_a=-1", "must be >= 0"),
    Case(["decode.max_len_a=inf"], E, "decode.max_len_a=inf", "must be >= 0 and finite"),
    Case(["decode.max_len_b=-5"], E, "decode.max_len_b=-5", "must be >= 0"),
    Case(["decode.max_tokens=0"], E, "decode.max_tokens=0", "must be positive"),
    Case(["decode.batch_size=0"], E, "decode.batch_size=0", "must be positive"),
    # --- data: batching, vocabulary, where the text is -------------------------------------------------
    Case(["data.max_tokens=0"], E, "data.max_tokens=0", "must be positive"),
    Case(["data.max_tokens=lots"], E, "data.max_tokens='lots'", "expected int | null"),
    Case(["data.batch_size=0"], E, "data.batch_size=0", "must be positive"),
    Case(["data=synthetic", "data.batch_size=0"], E, "data.batch_size=0", "must be positive"),
    Case(["data.max_tokens=null", "data.batch_size=null"], E, "data.max_tokens=null", "set max_tokens"),
    Case(["data.vocab_size=4"], E, "data.vocab_size=4", "must exceed the 4 special tokens"),
    Case([f"data.root={MISSING}"], E, f"data.root={MISSING}", "or set root=null to download them"),
    Case(["data=files", f"data.dir={MISSING}"], E, f"data.dir={MISSING}", "set dir to the directory"),
    Case(["data=files"], E, "data.dir is required", "set data.dir=<value>"),
    # (a name, not a list: taken as a sequence, its letters were test prefixes)
    Case(["data=files", f"data.dir={MISSING}", "data.test=abc"], E, "data.test='abc'", "expected [str]"),
    Case(["data=nope"], MissingConfigException, "data/nope", "Available options in 'data'"),
    # (a file name, not a split -> file mapping: an AttributeError once the run directory was written)
    Case(["data=hf", "data.name=json", "data.data_files=train.json"], E, "files='train.json'", "{str: str}"),
    # --- interpolations that cannot be resolved (an unset environment variable, a missing key) ----------
    Case(["model.d_model=${oc.env:ATTNLAB_UNSET}"], E, "model.d_model: ", "ATTNLAB_UNSET' not found"),
    Case(["trainer.max_epochs=${oc.env:ATTNLAB_UNSET}"], E, "trainer.max_epochs: ", "export it) or give"),
    Case(["optim.peak_lr=${no_such_key}"], E, "optim.peak_lr: ", "Interpolation key 'no_such_key' not found"),
    Case(["+extra=${oc.env:ATTNLAB_UNSET}"], E, "extra is not a key", "remove the +extra=..."),
    # --- trainer: epochs, accumulation, devices, presets -----------------------------------------------
    Case(["trainer.accumulate_grad_batches=0"], E, "trainer.accumulate_grad_batches=0", "positive integer"),
    Case(["trainer.accumulate_grad_batches=two"], E, "trainer.accumulate_grad_batches='two'", "positive"),
    Case(["trainer.max_epochs=-5"], E, "trainer.max_epochs=-5", "-1 for no limit"),
    Case(["trainer.max_epochs=0"], E, "trainer.max_epochs=0", "-1 for no limit"),
    Case(["trainer.max_epochs=ten"], E, "trainer.max_epochs='ten'", "positive integer"),
    Case(["trainer.check_val_every_n_epoch=0"], E, "trainer.check_val_every_n_epoch=0", "positive integer"),
    Case(["trainer.num_nodes=0"], E, "trainer.num_nodes=0", "positive integer"),
    Case(["trainer.devices=0"], E, "trainer.devices=0", "-1 (all) or 'auto'"),
    # (a mapping, as `+trainer.devices.0=1` makes: a TypeError of Lightning's once the run had started)
    Case(["+trainer.devices.0=1"], E, "trainer.devices={'0': 1}", "'auto' or a list of device ids ([0,1])"),
    # (a TypeError of Lightning's once the run had started)
    Case(
        ["trainer.accelerator=cpu", "trainer.devices=[0,1]"],
        E,
        "trainer.devices=[0, 1] lists device ids",
        "trainer.accelerator=cpu runs a number of processes: give that number (trainer.devices=2)",
    ),
    Case(["trainer.accelerator=cpu", "trainer.devices='0,1'"], E, "devices='0,1' lists", "'auto' for one"),
    Case(["trainer.accelerator=cpu", "trainer.devices=-1"], E, "trainer.devices=-1 counts GPUs", "devices=2"),
    Case(["trainer.precision=8"], E, "trainer.precision=8", "bf16-mixed"),
    Case(["trainer.accelerator=tpuu"], E, "trainer.accelerator='tpuu'", "'cpu'"),
    Case(["trainer.gradient_clip_val=-1"], E, "trainer.gradient_clip_val=-1", ">= 0 (or null)"),
    # (0 failed with a ZeroDivisionError after the first step, -1 and 1.5 when the Trainer was built)
    Case(
        ["trainer.val_check_interval=0"], E, "trainer.val_check_interval=0", "fraction of an epoch in (0, 1]"
    ),
    Case(["trainer.val_check_interval=-1"], E, "trainer.val_check_interval=-1", "training batches >= 1"),
    Case(["trainer.val_check_interval=1.5"], E, "trainer.val_check_interval=1.5", "in (0, 1]"),
    # (the linear schedule failed when the optimizer was built, once the run had started)
    Case(["trainer.max_epochs=-1"], E, "trainer.max_epochs=-1", "set trainer.max_steps or optim.total_steps"),
    # (Lightning sets no epoch limit for max_epochs=null with a time limit)
    Case(
        ["trainer.max_epochs=null", "+trainer.max_time=00:01:00:00"],
        E,
        "trainer.max_epochs=null with trainer.max_time (no epoch limit)",
        "set trainer.max_steps or optim.total_steps",
    ),
    # (refused when the callback was built, once the run had started, as a Hydra InstantiationException)
    Case(
        ["callbacks.last_checkpoint.every_n_minutes=-1"],
        E,
        "callbacks.last_checkpoint.every_n_minutes=-1",
        "a number > 0",
    ),
    Case(
        ["callbacks.last_checkpoint.every_n_train_steps=0"],
        E,
        "callbacks.last_checkpoint.every_n_train_steps=0",
        "an integer >= 1",
    ),
    Case(
        ["callbacks.last_checkpoint.every_n_train_steps=ten"],
        E,
        "callbacks.last_checkpoint.every_n_train_steps='ten'",
        "an integer >= 1",
    ),
    Case(["trainer=nope"], MissingConfigException, "trainer/nope", "Available options in 'trainer'"),
    # --- top level: unknown keys, seed, run control, monitor -------------------------------------------
    Case(["foo=1"], ConfigCompositionException, "'foo'", "+foo=1"),
    Case(["+foo=1"], E, "foo is not a key of the training config", "remove the +foo=... override"),
    Case(["+sed=3"], E, "sed is not a key of the training config", "did you mean seed?"),
    Case(["seed=abc"], E, "seed='abc'", "must be an integer"),
    Case(["seed=1.5"], E, "seed=1.5", "must be an integer"),
    # (out of NumPy's range: Lightning's seed_everything failed once the run had started)
    Case(["seed=-1"], E, "seed=-1", "an integer from 0 to 4294967295"),
    Case(["seed=4294967296"], E, "seed=4294967296", "an integer from 0 to 4294967295"),
    Case(["average_last=-1"], E, "average_last=-1", "integer >= 0"),
    Case(["average_every_n_steps=0"], E, "average_every_n_steps=0", "positive integer"),
    Case(["test=no"], E, "test='no'", "true or false"),
    Case(["resume=maybe"], E, "resume='maybe'", "use true, false or auto"),
    Case([f"ckpt_path={MISSING}.ckpt"], E, f"ckpt_path={MISSING}.ckpt", "no such checkpoint file"),
    Case(["ckpt_path=3"], E, "ckpt_path=3", "must be the path of a .ckpt file"),  # was a TypeError
    Case(["monitor=null"], E, "callbacks.model_checkpoint.monitor", "give the key a value"),  # the same
    Case(["monitor.mode=up"], E, "monitor.mode='up'", "min, max or auto"),
    Case(
        ["data=synthetic", "monitor.metric=val/bleu"], E, "monitor.metric=val/bleu", "monitor.metric=val/loss"
    ),
]


@pytest.fixture(autouse=True)
def _no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reaching the training loop means a wrong value got through: fail at once instead of training."""

    def started(*args: object, **kwargs: object) -> None:
        pytest.fail("a wrong config value reached training: validate() did not reject it", pytrace=False)

    monkeypatch.setattr(attnlab.training.pipeline, "build_data", started)


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c.overrides) for c in CASES])
def test_a_wrong_value_fails_before_training_naming_the_key_and_the_fix(case: Case, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(case.error) as excinfo:
        train(compose_train(case.overrides, run_dir, hydra_node=True))  # as under the CLI: Hydra's node too
    message = str(excinfo.value)
    assert type(excinfo.value) is case.error, f"{type(excinfo.value).__name__}: {message}"
    assert case.key in message, f"the message does not name the key {case.key!r}: {message}"
    assert case.fix in message, f"the message does not say the fix {case.fix!r}: {message}"
    assert not run_dir.exists(), "the run directory was created: the error came after the run started"


def test_the_table_covers_every_node_and_has_no_duplicates() -> None:
    keys = [" ".join(c.overrides) for c in CASES]
    assert len(keys) == len(set(keys)) and len(CASES) >= 30
    nodes = {c.overrides[-1].lstrip("+").split(".")[0].split("=")[0] for c in CASES}
    assert {"model", "optim", "decode", "data", "trainer", "seed", "monitor", "metrics"} <= nodes


@pytest.mark.parametrize(
    ("devices", "told"), [("[0,1]", "[0, 1] lists device ids"), ("-1", "-1 counts GPUs")]
)
def test_device_ids_or_every_gpu_where_auto_finds_no_gpu_fail_before_training_naming_the_fix(
    devices: str, told: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trainer.accelerator=auto` (the default) on a machine without a GPU runs on the CPU, where Lightning
    takes a number of processes: device ids or -1 failed there with its TypeError once the run had started,
    as with `trainer.accelerator=cpu`. With a GPU, `auto` is no CPU."""
    import torch

    from attnlab.training.experiment import runs_on_cpu

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert not runs_on_cpu({"accelerator": "auto"}) and runs_on_cpu({"accelerator": "cpu"})
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as refused:
        train(compose_train([f"trainer.devices={devices}"], run_dir, hydra_node=True))
    assert str(refused.value) == (
        f"trainer.devices={told}, but trainer.accelerator=auto finds no GPU here, and the CPU runs a number "
        "of processes: give that number (trainer.devices=2), or 'auto' for one"
    )
    assert not run_dir.exists()


def test_a_top_level_key_a_config_file_defines_is_not_mistaken_for_a_typo(tmp_path: Path) -> None:
    """`tags` added by `+tags=...` is a typo-class error; the same key set by an experiment file (no `+`
    override: here the override is taken out of Hydra's record, as if a file had defined it) is not."""
    from omegaconf import open_dict

    from attnlab.training.experiment import validate

    cfg = compose_train(["+tags=[ablation]"], tmp_path, hydra_node=True)
    with pytest.raises(ConfigError, match="tags is not a key of the training config"):
        validate(cfg)
    with open_dict(cfg):
        cfg.hydra.overrides.task = [o for o in cfg.hydra.overrides.task if not o.startswith("+tags")]
    assert validate(cfg).model.d_model == 256


@pytest.mark.parametrize("value", ['"00:00:30:00"', "{minutes:30}", "2000.0"])
def test_a_time_between_validations_is_left_to_lightning(value: str, tmp_path: Path) -> None:
    """`trainer.val_check_interval` as a time (Lightning's `"DD:HH:MM:SS"` or timedelta arguments) is not a
    number of batches: the check of numbers lets it through, and Lightning's trainer takes it. So does a
    whole float above 1 (`2000.0`, YAML's `2e3`), which Lightning takes as that many batches."""
    import lightning as L

    from attnlab.training.experiment import validate

    cfg = compose_train([f"trainer.val_check_interval={value}"], tmp_path, hydra_node=True)
    validate(cfg)
    interval = cfg.trainer.val_check_interval
    plain = interval if isinstance(interval, (str, float)) else dict(interval)
    L.Trainer(val_check_interval=plain, logger=False, enable_checkpointing=False, enable_progress_bar=False)


@pytest.mark.parametrize("value", ["1e2", "100"])
def test_a_whole_float_step_count_for_last_checkpoint_is_taken_as_the_int(value: str, tmp_path: Path) -> None:
    """`callbacks.last_checkpoint.every_n_train_steps=1e2` (YAML's whole float 100.0) is a number of steps,
    as `trainer.val_check_interval=2e3` is a number of batches: checked with the config and built as 100."""
    from hydra.utils import instantiate

    from attnlab.training.experiment import check_constructor_keys

    cfg = compose_train([f"callbacks.last_checkpoint.every_n_train_steps={value}"], tmp_path, hydra_node=True)
    check_constructor_keys(cfg)
    callback = instantiate(cfg.callbacks.last_checkpoint)
    assert callback._every_n_train_steps == 100 and type(callback._every_n_train_steps) is int


# --- config files a user writes (`--config-dir`, `hydra.searchpath`) that Hydra cannot load -------------
# Each is `(file's bytes, what the one-line refusal says after the file's name)`.
UNLOADABLE = {
    "duplicate key": (
        b"# @package _global_\nmodel:\n  d_model: 64\n  d_model: 32\n",
        ": the key d_model is given twice in one mapping (again on line 4): remove one of them",
    ),
    "tab": (
        b"# @package _global_\nmodel:\n\td_model: 64\n",
        " is not valid YAML: found character '\\t' that cannot start any token (line 3): indent with spaces, "
        "YAML allows no tabs there",
    ),
    "unclosed list": (
        b"# @package _global_\nmodel:\n  pe: [learned\n",
        " is not valid YAML: expected ',' or ']', but got '<stream end>' (line 4): correct the YAML there",
    ),
    "two documents": (
        b"# @package _global_\nmodel:\n  d_model: 64\n---\nmodel:\n  d_model: 32\n",
        " holds more than one YAML document: expected a single document in the stream, but found another "
        "document (line 4): a config file is one document; join them (remove that --- line) or move the "
        "second to a file of its own",
    ),
    "list": (b"# a list\n- model: tiny\n", " holds a YAML list (line 2), not a mapping of keys to values"),
    "string": (b"model tiny\n", " holds a YAML scalar (line 1), not a mapping of keys to values"),
    "number": (b"42\n", " holds a YAML scalar (line 1), not a mapping of keys to values"),
    "latin-1": (
        b"# @package _global_\nmodel:\n  pe: caf\xe9\n",
        " is not UTF-8 text (byte 0xe9 on line 3): save it as UTF-8",
    ),
    "NUL": (
        b"# @package _global_\nmodel:\n  pe: a\x00\n",
        " holds U+0000 on line 3, which YAML does not allow",
    ),
}


def user_config(root: Path, group: str, text: bytes) -> Path:
    """A user's config directory `root` holding `<group>/mine.yaml` with `text`; the directory."""
    (root / group).mkdir(parents=True)
    (root / group / "mine.yaml").write_bytes(text)
    return root


@pytest.mark.parametrize("name", list(UNLOADABLE))
def test_a_config_file_hydra_cannot_load_refuses_the_command_in_one_line(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attnlab-train --config-dir ./mine experiment=mine` with a file that is not YAML, gives a key twice,
    holds no mapping or is not UTF-8: one line naming the file, the line, the problem and the fix (no
    traceback: PyYAML's before), and no run directory."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    text, said = UNLOADABLE[name]
    conf, run_dir = user_config(tmp_path / "mine", "experiment", text), tmp_path / "runs" / "run"
    with pytest.raises(SystemExit) as refused:
        command_here(monkeypatch, "train", "--config-dir", str(conf), "experiment=mine", "data=synthetic",
                     f"hydra.run.dir={run_dir}")  # fmt: skip
    file = conf / "experiment" / "mine.yaml"
    assert str(refused.value.code).startswith(f"attnlab-train: config error: {file}{said}"), refused.value
    assert "\n" not in str(refused.value.code) and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("group", ["model", "logger"])
def test_an_experiment_setting_a_group_to_an_option_name_refuses_the_command_in_one_line(
    group: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An experiment file's `model: small` (for `override /model: small`) replaces the group's node with
    a text: one line naming the key and the fix, no run directory (an AttributeError's traceback before)."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    conf = user_config(tmp_path / "mine", "experiment", f"# @package _global_\n{group}: small\n".encode())
    with pytest.raises(SystemExit) as refused:
        command_here(monkeypatch, "train", "--config-dir", str(conf), "experiment=mine", "data=synthetic",
                     f"hydra.run.dir={tmp_path / 'runs' / 'run'}")  # fmt: skip
    assert refused.value.code == (
        f"attnlab-train: config error: {group}='small' is not a config node: select an option of the group "
        f"with {group}=<name> (in an experiment file, `override /{group}: <name>` under defaults) or set its "
        f"keys ({group}.<key>)"
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("task", "argument", "options"),
    [
        ("train", "model=null", "base, big, mini, small, tiny"),
        ("train", "experiment=null", "multi30k_base, multi30k_fast"),
        ("train", "logger=", "csv, many, mlflow"),
        ("eval", "data=null", "files, hf, multi30k"),
    ],
)
def test_a_config_group_set_to_null_refuses_the_command_in_one_line_naming_its_options(
    task: str, argument: str, options: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`model=null` on the command line: Hydra refused it with a ValueError traceback ("Config group
    override must be a string or a list"); one line names the group's options and `~group`. A key of a
    group's node set to null (`callbacks.early_stopping=null`) is no group: not refused here."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    group = argument.split("=")[0]
    with pytest.raises(SystemExit) as refused:
        command_here(monkeypatch, task, argument, f"hydra.run.dir={tmp_path / 'run'}")
    said = f"attnlab-{task}: config error: {argument}: a config group takes one of its options by name "
    said += f"({group}=<name>: "
    assert str(refused.value.code).startswith(said + options), refused.value.code
    assert str(refused.value.code).endswith(f"); ~{group} leaves it out")
    assert not (tmp_path / "run").exists()


OPTIONS = "options: base, big, mini, small, tiny"
GRAMMAR = "https://hydra.cc/docs/1.2/advanced/override_grammar/basic"
# `(task, its arguments, the one line after "attnlab-<task>: config error: ")`
NOT_IN_THE_CONFIG = [
    ("train", ["model=smal"], f"model=smal: no option 'smal' in group model (did you mean small?); {OPTIONS}"
     ),
    ("train", ["model=zzz"], f"model=zzz: no option 'zzz' in group model; {OPTIONS}"),
    ("train", ["trainer.max_epoc=3"], "trainer.max_epoc: no such key in trainer (did you mean "
     "trainer.max_epochs?); add a new key with +trainer.max_epoc=..."),
    ("train", ["sed=3"], "sed: no such key in the config (did you mean seed?); add a new key with +sed=..."),
    ("train", ["trainr.max_epochs=3"], "trainr.max_epochs: no such key in the config (did you mean "
     "trainer.max_epochs?); add a new key with +trainr.max_epochs=..."),
    ("eval", ["data=multi30"], "data=multi30: no option 'multi30' in group data (did you mean multi30k?); "
     "options: files, hf, multi30k, synthetic, wmt14, wmt14_enfr"),
    ("eval", ["decode.bem=3"], "decode.bem: no such key in decode (did you mean decode.beam?); add a new key "
     "with +decode.bem=..."),
    ("export", ["formt=hf"], "formt: no such key in the config (did you mean format?); add a new key with "
     "+formt=..."),
    ("train", ["+seed=3"], "+seed=3: seed is already in the config: set it with seed=3 (++seed=3 sets it "
     "whether or not it is there)"),
    ("train", ["+model=small"], "+model=small: group model already has an option: choose it with "
     "model=small"),
    ("train", ["~trainer.max_epoc"], "~trainer.max_epoc: no such key in trainer to delete (did you mean "
     "~trainer.max_epochs?)"),
    ("train", ["~trainr.max_epochs"], "~trainr.max_epochs: no such key in the config to delete (did you mean "
     "~trainer.max_epochs?)"),
    ("train", ["~ckpt_path"], "~ckpt_path: ckpt_path is null, which Hydra cannot delete (it takes a null "
     "value for no key): leave it null, or set it with ckpt_path=<value>"),
    ("eval", ["model.d_model=[", "seed=1"], "model.d_model=[: not an override Hydra can parse (no viable "
     f"alternative at input '['); see {GRAMMAR}"),
    ("train", ["seed='3"], f"seed='3: not an override Hydra can parse (\"'\" at character 6 is not allowed "
     f"there); see {GRAMMAR}"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("task", "args", "said"), NOT_IN_THE_CONFIG, ids=[" ".join(c[1]) for c in NOT_IN_THE_CONFIG]
)
def test_an_option_or_key_not_in_the_config_refuses_the_command_in_one_line_with_the_closest_names(
    task: str, args: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attnlab-train model=smal`, `trainer.max_epoc=3`: Hydra printed its message of several lines (the
    options one a line, the config search path, the hint of `HYDRA_FULL_ERROR=1`); one line names the
    override, the closest option or key and the fix; exit status 1 (the text of the `SystemExit`), as
    before; no run directory. So do a key or group appended with `+` that the config has, a key deleted
    (`~key`) that it has not, and an override that is not Hydra's grammar."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as refused:
        command_here(monkeypatch, task, *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert refused.value.code == f"attnlab-{task}: config error: {said}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("entry", ["override /model: smal", "/model: smal"])
def test_an_option_not_in_its_group_chosen_by_an_experiment_file_refuses_the_command_naming_the_file(
    entry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An experiment file's `override /model: smal` (or `/model: smal`) under defaults: Hydra's message of
    several lines named the config whose default it replaces (`In 'train'`), not the file; one line names
    the file, the option, the closest one and the group's options; no run directory."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    text = f"# @package _global_\ndefaults:\n  - {entry}\n"
    conf = user_config(tmp_path / "mine", "experiment", text.encode())
    with pytest.raises(SystemExit) as refused:
        command_here(monkeypatch, "train", "--config-dir", str(conf), "experiment=mine",
                     f"hydra.run.dir={tmp_path / 'runs' / 'run'}")  # fmt: skip
    assert refused.value.code == (
        f"attnlab-train: config error: {conf}/experiment/mine.yaml: no option 'smal' in group model, which "
        f"its defaults list chooses (did you mean small?); {OPTIONS}"
    )
    assert not (tmp_path / "runs").exists()


def test_hydra_full_error_shows_the_traceback_of_an_option_not_in_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `HYDRA_FULL_ERROR=1` (set for the tests) the refusal is a `ConfigError` with the same line,
    raised from Hydra's error: both tracebacks are shown. Hydra composing outside a command (`hydra.compose`)
    raises its own error, as before."""
    with pytest.raises(
        ConfigError, match=r"^model=smal: no option 'smal' in group model \(did you"
    ) as refused:
        command_here(monkeypatch, "train", "model=smal", f"hydra.run.dir={tmp_path / 'run'}")
    assert isinstance(refused.value.__cause__, MissingConfigException)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(MissingConfigException):
        compose_train(["model=smal"], tmp_path / "run")


@pytest.mark.parametrize(
    ("task", "group", "args"), [("eval", "data", []), ("export", "paths", ["format=hf"])]
)
def test_eval_and_export_refuse_a_config_file_they_cannot_load_named_on_the_search_path(
    task: str, group: str, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attnlab-eval` and `attnlab-export` compose the same way: a file of theirs that is not YAML, on
    `hydra.searchpath`, refuses them in one line before the checkpoint is looked for."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    conf = user_config(tmp_path / "mine", group, UNLOADABLE["tab"][0])
    with pytest.raises(SystemExit) as refused:
        command_here(monkeypatch, task, f"hydra.searchpath=[file://{conf}]", f"{group}=mine", *args,
                     f"ckpt_path={tmp_path / 'none.ckpt'}", f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    said = UNLOADABLE["tab"][1]
    assert str(refused.value.code).startswith(f"attnlab-{task}: config error: {conf}/{group}/mine.yaml{said}")
    assert list(tmp_path.iterdir()) == [conf]


def test_hydra_full_error_shows_the_traceback_of_a_config_file_hydra_cannot_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `HYDRA_FULL_ERROR=1` (set for the tests) the refusal is a `ConfigError` with the same message,
    raised from PyYAML's error: both tracebacks are shown."""
    import yaml

    conf = user_config(tmp_path / "mine", "experiment", UNLOADABLE["duplicate key"][0])
    with pytest.raises(ConfigError, match="the key d_model is given twice") as refused:
        command_here(monkeypatch, "train", "--config-dir", str(conf), "experiment=mine", "data=synthetic",
                     f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert isinstance(refused.value.__cause__, yaml.constructor.ConstructorError)


def test_a_run_or_sweep_directory_the_checks_cannot_look_into_refuses_the_command_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hydra turns an error a callback raises into a warning and goes on: a run or sweep directory under a
    symlink loop stopped the up-front checks
    (`RunDirectoryCheck`) at their first step and the command went on unchecked, to Hydra's traceback, and
    a `.lock` directory where the command claims its run directory skipped the checks of a saved run there.
    Each refuses the command in one line naming what could not be checked and the error (with
    `HYDRA_FULL_ERROR=1`, after its traceback), or, the `.lock` directory, naming it; nothing is left."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    told = (
        r"^attnlab-train: cannot check the {} before it starts \({}\), so nothing ran: correct what it names"
    )
    run = told.format(r"run directory \(hydra.run.dir\) and the config", r"\w+Error: .*loop/run'?")
    with pytest.raises(SystemExit, match=run):
        command_here(monkeypatch, "train", "data=synthetic", "data.n_train=0",
                     f"hydra.run.dir={tmp_path / 'loop' / 'run'}")  # fmt: skip
    assert "Traceback" not in capsys.readouterr().err
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    sweep = told.format(
        r"sweep directory \(hydra.sweep.dir\), the sweep and the config", r"\w+Error: .*loop'?"
    )
    with pytest.raises(SystemExit, match=sweep):
        command_here(monkeypatch, "train", "-m", "data=synthetic", "data.n_train=0", "seed=1,2",
                     f"hydra.sweep.dir={tmp_path / 'loop'}")  # fmt: skip
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    (tmp_path / "run" / ".lock").mkdir(parents=True)
    lock = (
        rf"^attnlab-train: config error: {tmp_path}/run/.lock is a directory where the run writes its .lock"
    )
    with pytest.raises(SystemExit, match=lock):
        command_here(
            monkeypatch, "train", "data=synthetic", "data.n_train=0", f"hydra.run.dir={tmp_path / 'run'}"
        )
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["loop", "run", "run/.lock"]


def test_a_run_sweep_or_job_directory_too_long_for_the_file_system_is_refused_naming_its_long_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run, sweep or multirun job directory with a name longer than the file system takes (NAME_MAX), or
    a path longer than PATH_MAX, ended the command in `File name too long` (a multirun in Hydra's
    traceback, once it had made the sweep directory and its multirun.yaml): it is refused before anything is
    made, in one line naming the key, the long name (shortened), its length in bytes, the limit and the
    fix; nothing is left, and a sweep directory that existed keeps the multirun.yaml it held. A job's
    subdir is resolved as Hydra's launchers resolve it, `${hydra:...}` with the job's own Hydra config."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    limit, long = os.pathconf(tmp_path, "PC_NAME_MAX"), "x" * 300
    named = f"its name '{'x' * 20}...{'x' * 12}' is 300 bytes, over the {limit} bytes a name can have there"
    told = f"attnlab-train: config error: hydra.run.dir is too long for the file system: {named}; set a "
    with pytest.raises(SystemExit, match=f"^{re.escape(told)}shorter hydra.run.dir$"):
        command_here(monkeypatch, "train", "data=synthetic", "data.n_train=0",
                     f"hydra.run.dir={tmp_path / 'new' / long / 'run'}")  # fmt: skip
    deep = tmp_path.joinpath(*["d" * 200] * 21)  # (each name short enough)
    said = f"it is {len(str(deep))} bytes long as an absolute path, over the 4095 bytes a path can have"
    assert too_long_path(deep) == said and too_long_path(tmp_path / ("x" * limit)) is None
    sweep = tmp_path / "sweep"
    with pytest.raises(
        SystemExit, match=re.escape(f"hydra.sweep.dir is too long for the file system: {named}")
    ):
        command_here(monkeypatch, "train", "-m", "data=synthetic", "data.n_train=0", "seed=1,2",
                     f"hydra.sweep.dir={sweep / long}")  # fmt: skip
    sweep.mkdir()
    (sweep / "multirun.yaml").write_bytes(b"an earlier sweep's record\n")
    job = "the job directory of #0 (data=synthetic data.n_train=0 seed=1) is too long for the file system: "
    job += (
        f"its name '0_{'x' * 18}...{'x' * 12}' is 302 bytes, over the {limit} bytes a name can have there; "
    )
    with pytest.raises(
        SystemExit, match=f"^attnlab-train: config error: {re.escape(job)}set a shorter hydra.sweep.subdir"
    ):
        command_here(monkeypatch, "train", "-m", "data=synthetic", "data.n_train=0", "seed=1,2",
                     f"hydra.sweep.dir={sweep}", f"hydra.sweep.subdir=${{hydra:job.num}}_{long}")  # fmt: skip
    # The default subdir's names (at most JOB_DIRNAME_BYTES) without room for the longest: each job's is found
    deep, room = tmp_path / "deep", 4075 - len(str(tmp_path / "deep"))
    deep = deep.joinpath(*["d" * 200] * (room // 201), "d" * (room % 201))  # 4075 bytes, then the job's name
    job = re.escape(job[: job.index(":") + 2]) + r"it is \d+ bytes long as an absolute path, over the 4095"
    with pytest.raises(SystemExit, match=f"^attnlab-train: config error: {job}"):
        command_here(monkeypatch, "train", "-m", "data=synthetic", "data.n_train=0", "seed=1,2",
                     f"hydra.sweep.dir={deep}")  # fmt: skip
    assert "Traceback" not in capsys.readouterr().err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "sweep",
        "sweep/multirun.yaml",
    ]
    assert (sweep / "multirun.yaml").read_bytes() == b"an earlier sweep's record\n"


def test_a_directory_the_file_system_refuses_as_too_long_below_its_reported_limit_is_refused_leaving_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the file system's real name limit is below the one it reports (eCryptfs, some FUSE; stood in
    for by reporting a larger limit), a run or sweep directory passes the up-front length check and the
    file system refuses it as it is made: the command ends in one line naming the refusal as too long and
    the fix, not an `OSError` traceback of the cleanup looking at the long path, and the parents it made
    are removed (under a missing parent, and under an existing one)."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(attnlab.io, "_path_limit", lambda directory, name, default: 1 << 20)
    long = "x" * (os.pathconf(tmp_path, "PC_NAME_MAX") + 45)
    for parent, key, multirun in [("new", "run", []), ("", "run", []), ("new", "sweep", ["-m", "seed=1,2"]),
                                  ("", "sweep", ["-m", "seed=1,2"])]:  # fmt: skip
        told = f"cannot create the run directory {tmp_path / parent / long}: the file system refuses it as "
        with pytest.raises(SystemExit, match=f"^attnlab-train: config error: {re.escape(told)}too long .* — "
                           "set a shorter hydra.run.dir \\(hydra.sweep.dir for -m\\)$"):  # fmt: skip
            command_here(monkeypatch, "train", *multirun, "data=synthetic", "data.n_train=0",
                         f"hydra.{key}.dir={tmp_path / parent / long}")  # fmt: skip
        assert list(tmp_path.iterdir()) == []
    assert "Traceback" not in capsys.readouterr().err


def test_a_job_subdir_adding_to_the_default_one_is_checked_for_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `hydra.sweep.subdir` that is the default `${attnlab.job_dir:...}` and more (a suffix of 300
    bytes) names job directories longer than the default's: taken for the default (its names fit), it was
    not checked, and Hydra's `File name too long` traceback ended the multirun, leaving the sweep
    directory and its multirun.yaml. It is refused in one line before anything is made; the default subdir
    alone is still known to fit without composing each job's config."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    subdir = "'${attnlab.job_dir:${hydra.overrides.task},${hydra.sweep.dir}}_" + "x" * 300 + "'"
    job = "the job directory of #0 (data=synthetic data.n_train=0 seed=1) is too long for the file system: "
    with pytest.raises(SystemExit, match=f"^attnlab-train: config error: {re.escape(job)}its name "):
        command_here(monkeypatch, "train", "-m", "data=synthetic", "data.n_train=0", "seed=1,2",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}", f"hydra.sweep.subdir={subdir}")  # fmt: skip
    assert "Traceback" not in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    default = compose_train([], tmp_path / "run", hydra_node=True)
    assert _default_job_names_fit(default)  # the default subdir alone: no job's config composed to check it


@pytest.mark.parametrize(
    "text", [b"", b"# @package _global_\n# nothing yet\n", b"# @package _global_\nfoo: null\n"]
)
def test_an_empty_config_file_or_one_key_without_a_value_is_composed(
    text: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty file is an empty config, and a file of one key without a value is a mapping (as a file that
    is a string is not, which OmegaConf reads as that one key): neither is refused."""
    conf = user_config(tmp_path / "mine", "experiment", text)
    command_here(monkeypatch, "train", "--cfg", "job", "--config-dir", str(conf), "experiment=mine")
    assert "d_model:" in capsys.readouterr().out


@pytest.mark.parametrize("full_error", [False, True])
def test_a_sweep_whose_first_job_has_a_config_file_hydra_cannot_load_leaves_no_sweep_directory(
    full_error: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attnlab-train -m experiment=mine,...`: Hydra loads a swept option's file when it composes that job,
    after it made the sweep directory and wrote `multirun.yaml` there. The refusal (one line; with
    `HYDRA_FULL_ERROR=1` a `ConfigError`, which left the directory behind) removes that directory, which
    holds nothing else, with the parents made for it."""
    if not full_error:
        monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    conf = user_config(tmp_path / "mine", "experiment", UNLOADABLE["duplicate key"][0])
    sweep_dir = tmp_path / "sweeps" / "s"
    with pytest.raises(ConfigError if full_error else SystemExit) as refused:
        command_here(monkeypatch, "train", "-m", "--config-dir", str(conf), "experiment=mine,synthetic_pe",
                     "data=synthetic", f"hydra.sweep.dir={sweep_dir}")  # fmt: skip
    problem = f"{conf / 'experiment' / 'mine.yaml'}{UNLOADABLE['duplicate key'][1]}"
    told = str(refused.value) if full_error else refused.value.code
    assert told == (problem if full_error else f"attnlab-train: config error: {problem}")
    assert list(tmp_path.iterdir()) == [conf]


@pytest.mark.parametrize("name", ["tab", "string"])
def test_a_config_file_hydra_cannot_load_from_a_package_is_named_by_its_address(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config file of a Python package on the search path (`hydra.searchpath=[pkg://mine_conf]`) is
    refused the same way, named by its `pkg://` address; a list or a scalar in it too (read from the
    package)."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    package = f"attnlab_faults_{name}_conf"
    user_config(tmp_path / package, "experiment", UNLOADABLE[name][0])
    (tmp_path / package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as refused:
        command_here(monkeypatch, "train", f"hydra.searchpath=[pkg://{package}]", "experiment=mine",
                     "data=synthetic", f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    said = UNLOADABLE[name][1]
    assert str(refused.value.code).startswith(
        f"attnlab-train: config error: pkg://{package}/experiment/mine.yaml{said}"
    )
    assert not (tmp_path / "run").exists()
