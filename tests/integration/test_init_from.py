"""Fine-tuning with `init_from=<ckpt>`: a trained model's weights, a fresh optimizer, schedule and step
counter; refused when the checkpoint does not fit the run."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from attnlab.data.tokenizer import SubwordTokenizer
from attnlab.optim import OptimConfig
from attnlab.runs.checkpoint import model_weights, read_checkpoint
from attnlab.training.module import TranslationModule
from attnlab.training.pipeline import init_weights, train
from attnlab.typed import ConfigError
from helpers import compose_train


@pytest.fixture(scope="module")
def fine_tuned(translating_run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two epochs from the translating model's last checkpoint with a new schedule (warm-up from 0), the
    README's way: its tokenizer written out with `Translator.from_checkpoints(...).src_tokenizer.save`
    and given as `data.tokenizer_path` (so the data is prepared anew, with that tokenizer)."""
    from attnlab.inference.translator import Translator

    tmp = tmp_path_factory.mktemp("fine_tuned")
    run = tmp / "run"
    start = translating_run["dir"] / "checkpoints" / "last.ckpt"
    Translator.from_checkpoints([start]).src_tokenizer.save(tmp / "tokenizer.json")
    overrides = [
        *translating_run["data"], f"data.tokenizer_path={tmp / 'tokenizer.json'}",
        f"data.cache_dir={tmp / 'cache'}", f"init_from={start}", "optim=inverse_sqrt", "optim.peak_lr=1e-4",
        "optim.warmup_steps=5", "trainer.max_epochs=2", "decode.beam=2", "logger=csv",
        "trainer.log_every_n_steps=1", "+callbacks.batches._target_=probes.RecordRankBatches",
        f"+callbacks.batches.dirpath={run.parent / 'probe'}",
    ]  # fmt: skip
    metrics = train(compose_train(overrides, run))
    return {
        "run": run,
        "start": start,
        "metrics": metrics,
        "probe": run.parent / "probe",
        "overrides": overrides,
    }


def test_init_from_starts_from_the_weights_with_a_fresh_optimizer_and_schedule(
    fine_tuned: dict[str, Any], translating_run: dict[str, Any]
) -> None:
    start = read_checkpoint(fine_tuned["start"])
    initial = torch.load(fine_tuned["probe"] / "initial_weights.pt", weights_only=True)
    weights = model_weights(start["state_dict"])
    assert weights and all(torch.equal(initial[f"model.{k}"], v) for k, v in weights.items())

    last = read_checkpoint(fine_tuned["run"] / "checkpoints" / "last.ckpt")
    with open(fine_tuned["run"] / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/lr_step")]
    steps = int(last["global_step"])
    assert 0 < steps < int(start["global_step"])  # counted from 0, not from the checkpoint's step
    schedule = OptimConfig(schedule="inverse_sqrt", peak_lr=1e-4, warmup_steps=5)
    logged = [(int(r["step"]), float(r["train/lr_step"])) for r in rows]
    # A fresh schedule, warming up from its first step (the checkpoint's would be far past it); logged after
    # each step: the rate of the next.
    assert logged[:3] == [(s, pytest.approx(schedule.lr_at(s + 2, d_model=0))) for s, _ in logged[:3]]
    assert logged[0][0] == 0
    moments = last["optimizer_states"][0]["state"]
    assert moments and all(int(state["step"]) == steps for state in moments.values())  # Adam: this run's

    manifest = json.loads((fine_tuned["run"] / "manifest.json").read_text())
    assert manifest["init_from"] == {"path": str(fine_tuned["start"].resolve()), "step": start["global_step"]}
    assert fine_tuned["metrics"]["val/bleu"] >= 60  # it still translates: the weights are the trained ones
    results = json.loads((fine_tuned["run"] / "results.json").read_text())
    assert results["sets"]["test"]["bleu"] >= 60


def test_a_fine_tuning_run_resumes_from_its_own_last_checkpoint(
    fine_tuned: dict[str, Any], tmp_path: Path
) -> None:
    """`resume=true` continues the fine-tuning run (its step counter, optimizer and schedule go on) instead
    of starting from the `init_from` weights again; the manifest keeps what it started from."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(fine_tuned["run"], run)
    before = read_checkpoint(run / "checkpoints" / "last.ckpt")
    overrides = [o for o in fine_tuned["overrides"] if not o.startswith(("trainer.max_epochs", "+callbacks"))]
    probe = tmp_path / "probe"
    overrides += [
        "+callbacks.batches._target_=probes.RecordRankBatches",
        f"+callbacks.batches.dirpath={probe}",
    ]
    train(compose_train([*overrides, "trainer.max_epochs=3", "resume=true"], run))
    after = read_checkpoint(run / "checkpoints" / "last.ckpt")
    trained = (probe / "batches_rank0.jsonl").read_text().splitlines()
    assert len(trained) == int(after["global_step"]) - int(before["global_step"]) > 0  # the third epoch only
    initial = torch.load(probe / "initial_weights.pt", weights_only=True)
    assert all(torch.equal(initial[k], v) for k, v in before["state_dict"].items() if k.startswith("model."))
    start = model_weights(read_checkpoint(fine_tuned["start"])["state_dict"])
    assert not all(torch.equal(initial[f"model.{k}"], v) for k, v in start.items())  # not init_from's
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["init_from"]["path"] == str(fine_tuned["start"].resolve())


def test_init_from_refuses_other_tokenizers_and_weights_that_do_not_fit(
    translating_run: dict[str, Any], tmp_path: Path
) -> None:
    path = translating_run["dir"] / "checkpoints" / "last.ckpt"
    module = TranslationModule.load_from_checkpoint(path)
    bundle = read_checkpoint(path)["attnlab"]
    own = SubwordTokenizer.from_json(bundle["src_tokenizer"])
    other = SubwordTokenizer.train(
        ["ein anderer Text", "another text entirely"] * 20, model="bpe", vocab_size=40
    )
    for side, tokenizers in (("src", (other, own)), ("tgt", (own, other))):
        datamodule = SimpleNamespace(src_tokenizer=tokenizers[0], tgt_tokenizer=tokenizers[1])
        with pytest.raises(ConfigError, match=f"its {side} tokenizer is not this run's"):
            init_weights(module, datamodule, str(path))
    same = SimpleNamespace(
        src_tokenizer=own, tgt_tokenizer=SubwordTokenizer.from_json(bundle["tgt_tokenizer"])
    )
    assert init_weights(module, same, str(path))["step"] == read_checkpoint(path)["global_step"]

    settings = module.model_config.to_dict()
    rates = {"dropout": 0.3, "attention_dropout": 0.1, "activation_dropout": 0.2}  # every rate may differ
    assert all(settings[name] != rate for name, rate in rates.items())
    regularised = TranslationModule(model={**settings, **rates}, optim={})
    assert init_weights(regularised, same, str(path))["step"] == read_checkpoint(path)["global_step"]
    d_ff = module.model_config.d_ff
    wider = TranslationModule(model={**module.model_config.to_dict(), "d_ff": 2 * d_ff}, optim={})
    expected = (
        f"init_from={path}: its model settings are not this run's (d_ff: {d_ff} there, {2 * d_ff} here)"
    )
    with pytest.raises(ConfigError, match=re.escape(expected)):
        init_weights(wider, same, str(path))


def test_init_from_and_ckpt_path_together_are_refused(
    translating_run: dict[str, Any], tmp_path: Path
) -> None:
    path = translating_run["dir"] / "checkpoints" / "last.ckpt"
    cfg = compose_train(
        [*translating_run["data"], f"init_from={path}", f"ckpt_path={path}"], tmp_path / "run"
    )
    with pytest.raises(ConfigError, match="give one of them — ckpt_path continues"):
        train(cfg)
    assert not (tmp_path / "run").exists()
