"""`train(cfg)` end to end on the synthetic task: artefacts, metrics, checkpoints, learning."""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from attnlab.data import SyntheticData
from attnlab.metrics import fit_metrics, is_final_metric
from attnlab.model import gemm
from attnlab.optim import OptimConfig
from attnlab.training.allocator import glibc
from attnlab.training.module import TranslationModule
from attnlab.training.pipeline import train
from attnlab.typed import ConfigError
from helpers import compose_train

TINY_RUN = [
    "data=synthetic",
    "model=tiny",
    "data.n_train=512",
    "data.n_val=64",
    "data.n_test=64",
    "data.batch_size=32",
    "optim.warmup_steps=20",
    "trainer.max_epochs=2",
    "trainer.log_every_n_steps=4",
]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One short training run shared by the tests below."""
    out = tmp_path_factory.mktemp("tiny_run")
    cfg = compose_train(TINY_RUN, out)
    return {"cfg": cfg, "metrics": train(cfg), "dir": out}


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_run_directory_holds_resolved_config_checkpoints_and_metrics(tiny_run: dict[str, Any]) -> None:
    run_dir = tiny_run["dir"]
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert "${" not in OmegaConf.to_yaml(saved)
    assert saved.paths.output_dir == str(run_dir)
    assert saved.model.d_model == 32 and saved.data.n_train == 512
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert "last.ckpt" in checkpoints
    assert any(name.startswith("best-") for name in checkpoints)


def test_logged_metrics(tiny_run: dict[str, Any]) -> None:
    rows = read_metrics(tiny_run["dir"])
    columns = set(rows[0])
    expected = [f"train/{m}_{when}" for m in ("loss", "nll", "ppl", "lr", "tokens_per_sec", "tokens_seen")
                for when in ("step", "epoch")]  # fmt: skip
    expected += ["val/loss", "val/nll", "val/ppl", "test/loss", "test/ppl", "test/exact_match"]
    expected += ["params/total", "params/embedding", "params/non_embedding"]
    for name in expected:
        assert name in columns, name
    assert "train/skipped_steps" not in columns  # logged only for an epoch with skipped batches
    params = next(r for r in rows if r["params/total"])
    model = TranslationModule(**torch.load(last_checkpoint(tiny_run), weights_only=True)["hyper_parameters"])
    assert {k: int(float(params[f"params/{k}"])) for k in ("total", "embedding", "non_embedding")} == (
        model.model.count_parameters()
    )
    seen = [float(r["train/tokens_seen_step"]) for r in rows if r["train/tokens_seen_step"]]
    assert seen == sorted(seen) and seen[0] > 0
    data = SyntheticData(**{k: v for k, v in tiny_run["cfg"].data.items() if k != "_target_"})
    per_epoch = sum(len(tgt) + 1 for _, tgt in data.examples("train"))  # target tokens + eos
    by_epoch = [float(r["train/tokens_seen_epoch"]) for r in rows if r["train/tokens_seen_epoch"]]
    assert by_epoch == [per_epoch, 2 * per_epoch]
    metrics = tiny_run["metrics"]
    assert math.isclose(metrics["val/ppl"], math.exp(metrics["val/nll"]), rel_tol=1e-4)
    for when in ("step", "epoch"):  # train/ppl from the NLL, not from the label-smoothed train/loss
        logged = [r for r in rows if r[f"train/ppl_{when}"]]
        assert logged and all(
            math.isclose(float(r[f"train/ppl_{when}"]), math.exp(float(r[f"train/nll_{when}"])), rel_tol=1e-4)
            for r in logged
        )
        assert any(abs(float(r[f"train/loss_{when}"]) - float(r[f"train/nll_{when}"])) > 1e-2 for r in logged)
    assert 0.0 <= metrics["test/exact_match"] <= 1.0


def test_every_metric_the_run_writes_is_a_declared_name(tiny_run: dict[str, Any]) -> None:
    """Every final metric, and every metric logged while fitting, is a name `attnlab.metrics` declares:
    what `optimized_metric` and `monitor.metric` are checked against before a run."""
    final = set(tiny_run["metrics"])
    results = json.loads((tiny_run["dir"] / "results.json").read_text())["metrics"]
    assert final == set(results) and {"best/val/loss", "train/loss_epoch", "test/exact_match"} <= final
    assert [name for name in final if not is_final_metric(name)] == []
    logged = set(read_metrics(tiny_run["dir"])[0]) - {"epoch", "step"}
    fitting = {name for name in logged if not name.startswith(("test/", "params/"))}
    assert "train/grad_norm_clipped_step" in fitting and fitting <= set(fit_metrics())


def test_results_name_the_best_checkpoint_tested_and_its_test_metrics(tiny_run: dict[str, Any]) -> None:
    """Without average_last the final evaluation tests the best checkpoint alone (not averaged), and
    `results.json` names it and holds the test metrics `train` returned, with the monitor's best value."""
    results = json.loads((tiny_run["dir"] / "results.json").read_text())
    (best,) = (tiny_run["dir"] / "checkpoints").glob("best-*.ckpt")
    assert results["checkpoints"] == [str(best.resolve())] and results["averaged"] is False
    metrics = tiny_run["metrics"]
    assert results["test_metrics"] == {k: v for k, v in metrics.items() if k.startswith("test/")}
    lowest = min(float(r["val/loss"]) for r in read_metrics(tiny_run["dir"]) if r["val/loss"])
    assert results["metrics"]["best/val/loss"] == metrics["best/val/loss"] == pytest.approx(lowest, rel=1e-6)


def test_loss_falls(tiny_run: dict[str, Any]) -> None:
    val = [float(r["val/loss"]) for r in read_metrics(tiny_run["dir"]) if r["val/loss"]]
    assert len(val) == 2 and val[1] < val[0]


def last_checkpoint(run: dict[str, Any]) -> Path:
    return run["dir"] / "checkpoints" / "last.ckpt"


def test_each_validations_nll_is_that_of_the_whole_validation_set_alone(tiny_run: dict[str, Any]) -> None:
    """The last `val/nll` is the NLL per target token of the final weights (last.ckpt, saved after that
    validation) on the validation set, computed here with plain cross-entropy: not summed with the earlier
    validations' (or the sanity check's) batches."""
    import torch.nn.functional as F

    module = TranslationModule.load_from_checkpoint(last_checkpoint(tiny_run)).eval()
    data = SyntheticData(**{k: v for k, v in tiny_run["cfg"].data.items() if k != "_target_"})
    datamodule = data.datamodule()
    datamodule.setup()
    pad, nll, tokens = module.model_config.pad_id, 0.0, 0
    with torch.no_grad():
        for batch in datamodule.val_dataloader():
            logits = module(batch["src"], batch["tgt_in"])
            target = batch["tgt_out"]
            nll += float(
                F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=pad, reduction="sum")
            )
            tokens += int((target != pad).sum())
    logged = [float(r["val/nll"]) for r in read_metrics(tiny_run["dir"]) if r["val/nll"]]
    assert len(logged) == 2 and logged[-1] == pytest.approx(nll / tokens, rel=1e-4)


def test_checkpoint_loads_with_weights_only_and_restores_the_model(tiny_run: dict[str, Any]) -> None:
    path = last_checkpoint(tiny_run)
    raw = torch.load(path, weights_only=True)
    assert raw["hyper_parameters"]["model"]["d_model"] == 32
    assert type(raw["hyper_parameters"]["optim"]["betas"]) is list
    module = TranslationModule.load_from_checkpoint(path, weights_only=True)
    state = module.state_dict()
    assert all(torch.equal(state[k], v) for k, v in raw["state_dict"].items())
    model = module.model
    assert model.output.weight is model.encoder.embed.token.weight is model.decoder.embed.token.weight


def test_training_is_reproducible_for_a_seed(tiny_run: dict[str, Any], tmp_path: Path) -> None:
    cfg = compose_train([*TINY_RUN, "trainer.max_epochs=1", "test=false"], tmp_path)
    first = train(cfg)
    second = train(compose_train([*TINY_RUN, "trainer.max_epochs=1", "test=false"], tmp_path / "again"))
    assert first["val/loss"] == second["val/loss"]


def test_tiny_model_overfits_a_fixed_batch(tmp_path: Path) -> None:
    cfg = compose_train(
        ["data=synthetic", "model=tiny", "debug=overfit", "data.batch_size=16", "callbacks=none"], tmp_path
    )
    assert cfg.optim.label_smoothing == 0.0
    metrics = train(cfg)
    assert metrics["train/loss_epoch"] < 0.05


def test_cli_fast_dev_run(tmp_path: Path) -> None:
    env = {**os.environ, "ATTNLAB_LOG_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "attnlab.cli.train", "debug=fast_dev_run", "data=synthetic", "model=tiny",
         "data.n_train=64", "optimized_metric=val/bleu"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    # README, "The console": the final metrics, test and validation, on one line at the end
    assert re.search(r"^attnlab-train: test/exact_match=\S+, .*, val/loss=", out.stdout, re.M), out.stdout
    assert "multirun" not in out.stdout + out.stderr  # one run: no sweep summary
    assert "optimized_metric" not in out.stdout + out.stderr  # a single run returns its value to no sweeper
    (run_dir,) = (tmp_path / "train" / "runs").iterdir()
    assert (run_dir / "config.yaml").is_file() and (run_dir / ".hydra" / "overrides.yaml").is_file()


@pytest.mark.slow
def test_positional_encoding_is_what_makes_the_synthetic_task_learnable(tmp_path: Path) -> None:
    """Same budget: with sinusoidal PE the order-dependent task is solved, without PE it cannot be.
    conf/experiment/synthetic_pe.yaml on sentences of 3-5 symbols (not 3-7) for 3 epochs (not 10), a
    sixth of its training: seeds 1-4 solved 0.95-0.99 with sinusoidal PE, seeds 1-2 0.09-0.11 without."""
    results = {}
    for pe in ("sinusoidal", "none"):
        overrides = ["experiment=synthetic_pe", "data.max_len=5", "trainer.max_epochs=3", f"model.pe={pe}",
                     "callbacks=none"]  # fmt: skip
        cfg = compose_train(overrides, tmp_path / pe)
        results[pe] = train(cfg)["test/exact_match"]
    assert results["sinusoidal"] >= 0.9, results
    assert results["none"] <= 0.50, results


def test_manifest_records_code_packages_hardware_data_and_a_finished_status(tiny_run: dict[str, Any]) -> None:
    manifest = json.loads((tiny_run["dir"] / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert manifest["start_time"] <= manifest["end_time"]
    assert manifest["packages"]["torch"] == metadata.version("torch")
    assert manifest["packages"]["lightning"] and manifest["packages"]["sacrebleu"]
    assert manifest["hardware"]["cpu_count"] >= 1
    assert manifest["hardware"]["inference_gemm"] == gemm.backend()  # what validation multiplied with
    assert manifest["git"]["commit"] is None or len(manifest["git"]["commit"]) == 40
    assert manifest["data"]["spec"] == "SyntheticData" and manifest["data"]["settings"]["n_train"] == 512
    assert isinstance(manifest["command"], list)
    assert manifest["cwd"] == os.getcwd()  # where the run started (the tests' working directory)
    # allocator=keep, the default, applied before the data and model were built (on glibc)
    assert manifest["allocator"] == {"mode": "keep", "glibc_options_set": glibc() is not None}


def test_a_failed_run_is_recorded_as_failed_in_its_manifest(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    cfg = compose_train(["data=files", f"data.dir={tmp_path / 'empty'}", "model=tiny"], tmp_path / "run")
    with pytest.raises(Exception, match="not found"):
        train(cfg)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "not found" in manifest["error"]
    assert manifest["end_time"] is not None


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_a_compiled_run_checkpoint_loads_into_an_uncompiled_model(backend: str, tmp_path: Path) -> None:
    """compile.enabled: graphs really compiled, and the checkpoint keys are those of the plain model.
    aot_eager needs no C compiler; inductor generates and compiles C++ (slow marker)."""
    import torch._dynamo

    from attnlab.model.config import TransformerConfig
    from attnlab.model.transformer import Transformer
    from attnlab.runs.checkpoint import model_weights, read_checkpoint

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    overrides = ["data=synthetic", "model=tiny", "data.n_train=64", "data.min_len=6", "data.max_len=6",
                 "trainer.max_epochs=1", "+trainer.limit_val_batches=0", "test=false", "logger=csv",
                 "compile.enabled=true", f"compile.backend={backend}"]  # fmt: skip
    train(compose_train(overrides, tmp_path))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the training forward was compiled
    checkpoint = read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert not any("_orig_mod" in k for k in checkpoint["state_dict"])
    model = Transformer(TransformerConfig(**checkpoint["hyper_parameters"]["model"])).eval()
    model.load_state_dict(model_weights(checkpoint["state_dict"]))  # strict: every key matches
    torch._dynamo.reset()


def test_an_unknown_compile_backend_is_named(tmp_path: Path) -> None:
    overrides = ["data=synthetic", "model=tiny", "data.n_train=64", "logger=csv", "compile.enabled=true",
                 "compile.backend=turbo"]  # fmt: skip
    with pytest.raises(ConfigError, match=r"compile.backend='turbo' is unknown to torch.compile: use one of"):
        train(compose_train(overrides, tmp_path))


def test_a_warmup_too_long_for_the_run_is_said_at_its_start_and_kept_in_the_manifest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The paper's 4000 warm-up steps in an 8-step run: a warning naming the numbers and the fixes, and
    the facts in manifest.json; a warm-up that fits says nothing."""
    base = ["data=synthetic", "model=tiny", "data.n_train=64", "data.batch_size=16", "trainer.max_epochs=2",
            "logger=csv", "test=false", "decode.every_n_epochs=0"]  # fmt: skip  # 4 steps an epoch
    with caplog.at_level(logging.WARNING, logger="attnlab.training.module"):
        train(compose_train([*base, "optim=noam", "optim.warmup_steps=4000"], tmp_path / "long"))
    warned = [r.getMessage() for r in caplog.records if "optim.warmup_steps" in r.getMessage()]
    assert warned == [
        "optim.warmup_steps=4000 is longer than this run's 8 optimizer steps, so the learning rate never "
        "reaches its peak: lower optim.warmup_steps (e.g. 1), train longer (trainer.max_epochs or "
        "trainer.max_steps), or use optim=linear (warm-up, then decay to 0 at the run's last step)"
    ]
    facts = json.loads((tmp_path / "long" / "manifest.json").read_text())["schedule"]
    assert facts["optimizer_steps"] == 8 and facts["warmup_steps"] == 4000 and facts["peak_reached"] is False
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="attnlab.training.module"):
        train(compose_train([*base, "optim=noam", "optim.warmup_steps=2"], tmp_path / "fits"))
    assert not [r for r in caplog.records if "optim.warmup_steps" in r.getMessage()]
    facts = json.loads((tmp_path / "fits" / "manifest.json").read_text())["schedule"]
    assert facts["peak_reached"] is True and facts["warning"] is None and facts["warmup_fraction"] == 0.25
    half = OptimConfig(warmup_steps=5).warmup_facts(8)  # peaks within the run, but after half of it
    assert half["peak_reached"] is True and half["warning"].startswith(
        "optim.warmup_steps=5 covers 62% of this run's 8 optimizer steps: lower optim.warmup_steps (e.g. 1)"
    )
    exactly_half = OptimConfig(warmup_steps=4).warmup_facts(8)["warning"]  # "half the run or more"
    assert exactly_half.startswith("optim.warmup_steps=4 covers 50% of this run's 8 optimizer steps")
    assert OptimConfig(warmup_steps=4).warmup_facts(9)["warning"] is None  # under half
    linear = OptimConfig(schedule="linear", warmup_steps=5).warmup_facts(8)  # already linear: not offered
    assert linear["warning"] == (
        "optim.warmup_steps=5 covers 62% of this run's 8 optimizer steps: lower optim.warmup_steps (e.g. 1), "
        "or train longer (trainer.max_epochs or trainer.max_steps)"
    )


def test_the_default_run_is_the_multi30k_fast_recipe_and_its_schedule_peaks_early_in_it(
    shared_data: Path, tmp_path: Path
) -> None:
    """`attnlab-train` with no overrides (README Quickstart) is `experiment=multi30k_fast`, and on
    Multi30k's training set its learning rate reaches its peak in the first half of the run's optimizer
    steps (no warm-up warning); the paper's schedule (`optim=noam`, 4000 absolute warm-up steps) is one
    override away and, on a run this short, never peaks, which the run says at its start."""
    from attnlab.training.experiment import validate

    root = [f"data.root={shared_data / 'multi30k'}"]
    default = compose_train(root, tmp_path / "run")
    named = compose_train([*root, "experiment=multi30k_fast"], tmp_path / "run")
    assert OmegaConf.to_container(default) == OmegaConf.to_container(named)
    experiment = validate(default)
    model, optim, decode, spec = experiment.model, experiment.optim, experiment.decode, experiment.data
    recipe = (  # the README's stated time and score are for these values
        (model.d_model, model.n_heads, model.d_ff, model.n_encoder_layers, model.n_decoder_layers),
        (model.dropout, model.tie, model.norm_first, model.pe),
        (spec.src_lang, spec.tgt_lang, spec.tokenizer, spec.vocab_size, spec.joint_vocab, spec.max_tokens),
        (optim.schedule, optim.peak_lr, optim.warmup_steps, optim.label_smoothing, optim.betas),
        (default.trainer.max_epochs, default.trainer.gradient_clip_val, default.average_last),
        (decode.beam, decode.length_penalty, decode.alpha, decode.every_n_epochs),
    )
    assert recipe == (
        (256, 4, 512, 2, 2),
        (0.1, "all", False, "sinusoidal"),
        ("de", "en", "bpe", 5000, True, 1024),
        ("linear", 1e-3, 400, 0.1, (0.9, 0.98)),
        (4, 1.0, 0),
        (5, "gnmt", 0.6, 1),
    )
    data = spec.datamodule()
    data.prepare_data()
    steps = len(data.sampler("train", shuffle=True)) * default.trainer.max_epochs
    steps //= default.trainer.accumulate_grad_batches
    facts = experiment.optim.warmup_facts(steps)
    assert facts["peak_reached"] is True and facts["warning"] is None, facts
    assert experiment.optim.schedule == "linear" and facts["warmup_fraction"] < 0.5
    paper = validate(compose_train([*root, "optim=noam"], tmp_path / "noam")).optim
    assert (paper.schedule, paper.warmup_steps) == ("noam", 4000)
    assert paper.warmup_facts(steps)["peak_reached"] is False  # the guard's warning names the numbers


def test_step_based_validation_and_averaging_of_step_checkpoints(tmp_path: Path) -> None:
    """For corpora whose epochs take hours: validation every N batches (`trainer.val_check_interval`) and
    the last `average_last` checkpoints kept every `average_every_n_steps` optimizer steps, averaged."""
    from attnlab.runs.checkpoint import read_averaged, read_checkpoint

    overrides = [*TINY_RUN, "trainer.val_check_interval=8", "trainer.check_val_every_n_epoch=null",
                 "average_last=3", "average_every_n_steps=5"]  # fmt: skip
    train(compose_train(overrides, tmp_path))  # 2 epochs of 16 steps: 32 optimizer steps
    validated = sorted({int(r["step"]) for r in read_metrics(tmp_path) if r.get("val/loss")})
    assert validated == [7, 15, 23, 31]  # after batches 8, 16, 24 and 32 (steps counted from 0)
    steps = tmp_path / "checkpoints" / "steps"
    kept = sorted(p.name for p in steps.iterdir())
    assert kept == ["step00000020.ckpt", "step00000025.ckpt", "step00000030.ckpt"]
    assert [read_checkpoint(steps / name)["global_step"] for name in kept] == [20, 25, 30]
    assert not (tmp_path / "checkpoints" / "epochs").exists()
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["averaged"] and [Path(p).name for p in results["checkpoints"]] == kept
    average = read_averaged([steps / name for name in kept])["state_dict"]
    first = read_checkpoint(steps / kept[0])["state_dict"]
    assert any(not torch.equal(average[k], first[k]) for k in first if first[k].is_floating_point())


def planned_stages(overrides: list[str], run_dir: Path) -> tuple[Any, Any]:
    """`plan_run` and `build_data` of a small synthetic run (nothing trained): the plan and its data."""
    from attnlab.training.pipeline import build_data, plan_run

    plan = plan_run(compose_train(["data=synthetic", "model=tiny", "data.n_train=64", *overrides], run_dir))
    return plan, build_data(plan)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("model.pad_id=5", "model.pad_id=5 but the data's vocabulary uses 0: set model.pad_id=0"),
        ("model.eos_id=3", "model.eos_id=3 but the data's vocabulary uses 2: set model.eos_id=2"),
        (
            "model.decoder_start_id=0",
            "model.decoder_start_id=0 but the data starts targets with bos id 1: set "
            "model.decoder_start_id=null",
        ),
    ],
)
def test_model_special_ids_other_than_the_datas_are_refused_naming_the_value_to_set(
    setting: str, message: str, tmp_path: Path
) -> None:
    """A model whose pad, eos or decoder start id is not the data's would train on the wrong ids without an
    error: `fit_model_to_data` refuses it before the model is built."""
    from attnlab.training.pipeline import fit_model_to_data

    plan, datamodule = planned_stages([setting], tmp_path)
    with pytest.raises(ConfigError) as refused:
        fit_model_to_data(plan, datamodule)
    assert str(refused.value) == message
    plan, datamodule = planned_stages([], tmp_path / "default")
    model = fit_model_to_data(plan, datamodule)  # the data's own ids, and its vocabulary sizes filled in
    sizes = (datamodule.src_vocab_size, datamodule.tgt_vocab_size)
    assert (model.src_vocab_size, model.tgt_vocab_size) == sizes


def test_a_run_without_loggers_gets_none_of_lightnings_defaults(tmp_path: Path) -> None:
    """`~logger` (no logger group): the trainer logs nowhere, not to the TensorBoard or CSV logger
    Lightning adds when it is given no logger argument."""
    from attnlab.training.pipeline import build_module, build_trainer, fit_model_to_data

    plan, datamodule = planned_stages(["~logger"], tmp_path)
    build_module(plan, fit_model_to_data(plan, datamodule))
    trainer = build_trainer(plan, datamodule)
    assert trainer.loggers == [] and trainer.logger is None
    plan, datamodule = planned_stages(["logger=csv"], tmp_path / "csv")
    assert [type(lg).__name__ for lg in build_trainer(plan, datamodule).loggers] == ["CSVLogger"]


def test_a_run_validating_after_every_batch_saves_and_checks_after_every_validation(tmp_path: Path) -> None:
    """`trainer.val_check_interval=1` (validate after every batch, which Lightning's callbacks take for once
    an epoch): the run's checkpoint and early-stopping callbacks are readied to save and check after each
    validation (`attnlab.training.callbacks.follow_every_batchs_validation`, tested there)."""
    from attnlab.training.pipeline import build_module, build_trainer, fit_model_to_data

    plan, datamodule = planned_stages(["trainer.val_check_interval=1", "callbacks=early_stopping"], tmp_path)
    build_module(plan, fit_model_to_data(plan, datamodule))
    trainer = build_trainer(plan, datamodule)
    saving = {type(c).__name__: c._save_on_train_epoch_end for c in trainer.checkpoint_callbacks}
    assert saving == {"ModelCheckpoint": False, "AveragingCheckpoints": True, "LastCheckpoint": False}
    assert [c._check_on_train_epoch_end for c in trainer.early_stopping_callbacks] == [False]
