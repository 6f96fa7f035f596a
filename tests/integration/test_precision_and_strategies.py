"""Mixed precision and the sharded strategy without a GPU: a bf16-mixed run on the CPU end to end, its
non-finite steps, what Lightning makes of float16 mixed precision on a CPU, and the fsdp preset (built
and checked here; it cannot train on CPUs, and the test says why)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from attnlab.inference.translator import Translator, evaluate, resolve_checkpoints
from attnlab.runs.checkpoint import read_checkpoint
from attnlab.training.module import NonFiniteError, TranslationModule
from attnlab.training.pipeline import train
from helpers import compose_train, subprocess_path, write_corpus
from runs import run_all

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPLITS = (("train", "train", 200), ("valid", "val", 20), ("test", "test2016", 20))
AUTOCAST = ["+callbacks.autocast._target_=probes.RecordAutocast"]
BF16 = (True, torch.bfloat16, torch.bfloat16)  # autocast on, in bfloat16, and the logits it made


def float_weights(checkpoint: dict) -> set[torch.dtype]:
    return {v.dtype for v in checkpoint["state_dict"].values() if v.is_floating_point()}


def test_a_bf16_mixed_cpu_run_trains_under_autocast_and_saves_float32_weights_that_decode(
    shared_data: Path, tmp_path: Path
) -> None:
    from probes import RecordAutocast

    corpus = write_corpus(shared_data, tmp_path / "corpus", SPLITS)
    overrides = [
        "trainer=cpu", "trainer.precision=bf16-mixed", "data=files", f"data.dir={corpus}",
        "data.src_lang=de", "data.tgt_lang=en", "data.vocab_size=300", "data.max_tokens=400",
        f"data.cache_dir={tmp_path / 'cache'}", "model=tiny", "trainer.max_epochs=1", "optim.warmup_steps=5",
        "logger=csv", "decode.beam=2", "decode.min_len=3", "decode.max_len_b=6", "decode.max_len_a=0.5",
        *AUTOCAST,
    ]  # fmt: skip
    run = tmp_path / "run"
    metrics = train(compose_train(overrides, run))
    last = read_checkpoint(run / "checkpoints" / "last.ckpt")
    probe = RecordAutocast.last
    assert probe is not None and len(probe.seen) == last["global_step"] > 0  # one forward per step
    assert set(probe.seen) == {BF16}  # every training step ran under bf16 autocast on the CPU
    assert {"val/loss", "test/loss", "test/test/bleu"} <= metrics.keys()
    assert all(math.isfinite(v) for v in metrics.values()), metrics

    # The weights are saved in float32 (autocast never changes them) and load into a float32 model.
    paths = resolve_checkpoints(run)
    assert float_weights(last) == {torch.float32}
    assert not last["optimizer_states"][0]["param_groups"][0]["fused"]  # Lightning clips no fused one here
    assert all(float_weights(read_checkpoint(p)) == {torch.float32} for p in paths)
    module = TranslationModule.load_from_checkpoint(run / "checkpoints" / "last.ckpt", map_location="cpu")
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    assert all(torch.equal(v, last["state_dict"][k]) for k, v in module.state_dict().items())

    # Decoding the checkpoint the run evaluated reproduces its test BLEU and hypotheses (results.json).
    results = json.loads((run / "results.json").read_text())
    assert results["checkpoints"] == [str(p.resolve()) for p in paths]
    sources, references = ((corpus / f"test.{lang}").read_text().split("\n")[:20] for lang in ("de", "en"))
    translator = Translator.from_checkpoints(paths)
    assert {p.dtype for p in translator.model.parameters()} == {torch.float32}
    single = evaluate(translator, {"test": (sources, references)}, tmp_path / "single")
    assert single["sets"]["test"]["bleu"] == results["sets"]["test"]["bleu"] == metrics["test/test/bleu"]
    hypotheses = (tmp_path / "single" / "hypotheses" / "test.txt").read_text()
    assert hypotheses == (run / "hypotheses" / "test.txt").read_text() and hypotheses.strip()


RUN = [
    "trainer=cpu", "trainer.precision=bf16-mixed", "data=synthetic", "model=tiny", "data.n_train=160",
    "data.n_val=16", "data.n_test=16", "data.batch_size=16", "trainer.max_epochs=1", "logger=csv",
    "test=false", "trainer.log_every_n_steps=1", "callbacks.last_checkpoint.every_n_train_steps=2", "seed=3",
    *AUTOCAST,
]  # fmt: skip  # 10 optimizer steps; last.ckpt at steps 2, 4, 6, 8, 10


@pytest.mark.parametrize(("what", "on_nonfinite"), [("loss", "stop"), ("grad", "skip")])
def test_nonfinite_steps_under_bf16_autocast_stop_or_are_skipped(
    what: str, on_nonfinite: str, tmp_path: Path
) -> None:
    """bf16 needs no gradient scaler: a NaN loss or an infinite gradient is caught by attnlab's own
    checks (`optim.on_nonfinite`), as in float32."""
    from probes import NonFiniteAt, RecordAutocast

    nan = ["+callbacks.nan._target_=probes.NonFiniteAt", "+callbacks.nan.step=5",
           f"+callbacks.nan.what={what}"]  # fmt: skip
    cfg = compose_train([*RUN, *nan, f"optim.on_nonfinite={on_nonfinite}"], tmp_path)
    last = tmp_path / "checkpoints" / "last.ckpt"
    if on_nonfinite == "stop":
        with pytest.raises(NonFiniteError, match=r"loss is nan at optimizer step 5 \(epoch 0, batch 4\)"):
            train(cfg)
        assert read_checkpoint(last)["global_step"] == 4  # saved before the bad step, not after
    else:
        train(cfg)
        assert NonFiniteAt.last is not None and NonFiniteAt.last.updated is False  # the step changed nothing
        assert read_checkpoint(last)["global_step"] == 10
        with open(tmp_path / "csv" / "metrics.csv") as f:
            assert "train/skipped_steps" in f.readline().split(",")
    assert RecordAutocast.last is not None and set(RecordAutocast.last.seen) == {BF16}
    weights = read_checkpoint(last)["state_dict"].values()
    assert all(bool(torch.isfinite(v).all()) for v in weights if v.is_floating_point())


def test_float16_mixed_precision_on_a_cpu_becomes_bf16_without_a_gradient_scaler(tmp_path: Path) -> None:
    """Lightning has no float16 autocast with a gradient scaler on CPUs: `16-mixed` trains as `bf16-mixed`
    with a warning, so attnlab's own non-finite checks apply (above), not the scaler's skipping. When a
    Lightning version runs the scaler on CPUs this test fails: test that path then."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    cfg = compose_train(["trainer=cpu", "trainer.precision=16-mixed"], tmp_path)
    refused = r"AMP with fp16 is not supported on CPU\. Using `precision='bf16-mixed'` instead"
    with pytest.warns(UserWarning, match=refused):
        trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
    assert trainer.precision == "bf16-mixed"
    plugin = trainer.precision_plugin
    assert isinstance(plugin, MixedPrecision) and plugin.scaler is None and plugin.device == "cpu"


FSDP_CPU = ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true"]


def test_the_fsdp_preset_builds_one_unit_per_layer_with_full_checkpoints(tmp_path: Path) -> None:
    """The fsdp preset as training builds it (`attnlab.training.pipeline.build_trainer`): validated, the
    Trainer with attnlab's strategy and checkpoint IO, sharding, state-dict type, mixed precision and
    wrapping units."""
    from lightning.pytorch.plugins.precision import FSDPPrecision
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy

    from attnlab.model.layers import DecoderLayer, EncoderLayer
    from attnlab.model.transformer import Transformer
    from attnlab.training.checkpoint_io import AtomicCheckpointIO
    from attnlab.training.experiment import validate
    from attnlab.training.strategies import AttnlabFSDPStrategy

    preset = compose_train(["trainer=fsdp", "data=synthetic", "model=tiny"], tmp_path)
    experiment = validate(preset)
    written = preset.trainer
    assert (written.accelerator, written.devices, written.precision) == ("gpu", -1, "bf16-mixed")
    if not torch.cuda.is_available():
        with pytest.raises(Exception, match="No supported gpu backend found"):  # as written, it needs GPUs
            instantiate(preset.trainer, logger=False, plugins=[AtomicCheckpointIO()])

    cfg = compose_train([*FSDP_CPU[:3], "data=synthetic", "model=tiny"], tmp_path)  # the preset's precision
    validate(cfg)
    trainer = instantiate(cfg.trainer, logger=False, plugins=[AtomicCheckpointIO()])
    strategy = trainer.strategy
    assert type(strategy) is AttnlabFSDPStrategy and trainer.num_devices == 2
    assert isinstance(strategy.checkpoint_io, AtomicCheckpointIO)  # what trainer.fit(ckpt_path=) reads with
    assert strategy.sharding_strategy == ShardingStrategy.FULL_SHARD
    assert strategy._state_dict_type == "full"  # one whole checkpoint file, saved by rank 0
    assert strategy.cpu_offload.offload_params is False and strategy.kwargs["use_orig_params"] is True
    assert isinstance(trainer.precision_plugin, FSDPPrecision) and trainer.precision == "bf16-mixed"
    bf16 = torch.bfloat16
    bf16_config = MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16)
    assert strategy.mixed_precision_config == bf16_config  # bf16 parameters, gradients and buffers
    # One FSDP unit per encoder and decoder layer; embeddings and the output layer stay in the root unit.
    model = Transformer(experiment.model)
    units = strategy.kwargs["auto_wrap_policy"]._run_policy(model, set(), {})
    layers = [m for m in model.modules() if isinstance(m, (EncoderLayer, DecoderLayer))]
    assert len(layers) == 4 and list(units) == layers


@pytest.mark.ddp
@pytest.mark.skipif(torch.cuda.is_available(), reason="torch's refusal is that of a machine without GPUs")
def test_fsdp_cannot_train_on_cpus(tmp_path: Path) -> None:
    """`trainer=fsdp` on 2 CPU processes (gloo): Lightning lets attnlab's FSDPStrategy subclass run on
    CPUs (it refuses only its own `strategy="fsdp"` there), but it gives torch's FSDP the CPU device's
    index, which is None, and torch then refuses to shard on a CPU. Both processes start and stop in the
    strategy's setup, before any step or checkpoint. When a torch or Lightning version trains FSDP on CPUs,
    this test fails: then check here that its full checkpoint loads into one process and that its losses
    equal trainer=ddp_cpu's."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": subprocess_path()}  # fmt: skip
    run = tmp_path / "run"
    command = [
        sys.executable, "-m", "attnlab.cli.train", *FSDP_CPU, "data=synthetic", "model=tiny",
        "data.n_train=64", "data.n_val=16", "data.n_test=16", "data.batch_size=8", "trainer.max_epochs=1",
        "logger=csv", "test=false", "trainer.enable_progress_bar=false", f"hydra.run.dir={run}",
    ]  # fmt: skip
    done = run_all(command, env=env, cwd=tmp_path)  # every rank killed at the timeout
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-4000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in output  # the two processes started
    assert "distributed_backend=gloo" in output
    refusal = "RuntimeError: FSDP needs a non-CPU accelerator device, but no accelerator device is detected."
    assert refusal in output, output[-4000:]
    assert "lightning/pytorch/strategies/fsdp.py" in output and "in _setup_model" in output
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "FSDP needs a non-CPU accelerator device" in manifest["error"]
    assert not list(run.rglob("*.ckpt"))  # nothing trained, nothing saved
