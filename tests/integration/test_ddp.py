"""Two-process DDP (gloo on CPU) through the real CLI: BLEU over the complete sets, computed once."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.metrics import corpus_bleu
from attnlab.translate import Translator, decode_settings, evaluate, resolve_checkpoints
from helpers import write_corpus

SPLITS = (("train", "train", 300), ("valid", "val", 37), ("test", "test2016", 23))


@pytest.mark.ddp
def test_ddp_bleu_equals_a_single_process_evaluation_of_the_same_checkpoint(
    shared_data: Path, tmp_path: Path
) -> None:
    corpus = write_corpus(shared_data, tmp_path / "corpus", SPLITS)  # odd sizes: unequal shares per rank
    env = {**os.environ, "ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "OMP_NUM_THREADS": "1",
           "ATTNLAB_CACHE_DIR": str(tmp_path / "cache"), "WANDB_MODE": "offline",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # fmt: skip
    command = [
        sys.executable, "-m", "attnlab.cli.train", "trainer=ddp_cpu", "data=files", f"data.dir={corpus}",
        "data.src_lang=de", "data.tgt_lang=en",
        "data.vocab_size=300", "data.max_tokens=300", "model=tiny", "trainer.max_epochs=2",
        "optim=linear", "optim.warmup_steps=5", "decode.beam=2", "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false", "logger=wandb",
        "+callbacks.final._target_=probes.SaveFinalWeights", f"+callbacks.final.dirpath={tmp_path / 'final'}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in done.stderr + done.stdout  # two processes really ran
    (run,) = (tmp_path / "logs" / "train" / "runs").iterdir()  # one run directory for both ranks
    assert len(list((run / "checkpoints").glob("last*.ckpt"))) == 1  # one set of checkpoints
    assert len(list(run.rglob("run-*.wandb"))) == 1  # one W&B run, from rank 0
    ranks = [torch.load(tmp_path / "final" / f"final_weights_rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])  # the same parameters on both ranks
    effective = json.loads((run / "manifest.json").read_text())["effective_batch"]
    assert (effective["devices"], effective["per_optimizer_step"]) == (2, 600)  # 300 tokens x 2 ranks
    assert "effective batch: 300 tokens per device batch x 2 devices x 1 nodes x 1 accumulated" in done.stdout
    # The linear schedule runs over optimizer steps: each rank takes half the batches, and the schedule
    # ends at the run's own last step (what a 1-process run with accumulate_grad_batches=2 also takes).
    from attnlab.optim import OptimConfig

    with open(run / "csv" / "metrics.csv") as f:
        lrs = {int(r["step"]): float(r["train/lr_step"]) for r in csv.DictReader(f) if r["train/lr_step"]}
    steps = len(lrs)
    linear = OptimConfig(schedule="linear", peak_lr=1e-3, warmup_steps=5)
    # (logged after the step: the rate the next optimizer step uses)
    assert lrs == pytest.approx({s: linear.lr_at(s + 2, 32, steps) for s in range(steps)}, rel=1e-5, abs=1e-9)

    # Validation BLEU of the last epoch: sacreBLEU of all 37 sentences, as one process decodes them.
    with open(run / "csv" / "metrics.csv") as f:
        logged = [float(r["val/bleu"]) for r in csv.DictReader(f) if r["val/bleu"]]
    assert len(logged) == 2
    translator = Translator.from_checkpoints([run / "checkpoints" / "last.ckpt"])
    translator.decode = decode_settings(translator.decode.to_dict(), {"beam": 1})
    sources = (corpus / "valid.de").read_text().split("\n")[:37]
    references = (corpus / "valid.en").read_text().split("\n")[:37]
    assert logged[-1] == pytest.approx(corpus_bleu(translator.translate(sources), references).score, abs=1e-6)

    # Test BLEU: results.json written once, equal to a single-process evaluation of the same weights.
    results = json.loads((run / "results.json").read_text())
    assert results["sets"]["test"]["sentences"] == 23
    paths = resolve_checkpoints(run)
    assert results["checkpoints"] == [str(p.resolve()) for p in paths]
    single = evaluate(Translator.from_checkpoints(paths), {"test": (
        (corpus / "test.de").read_text().split("\n")[:23], (corpus / "test.en").read_text().split("\n")[:23]
    )}, tmp_path / "single")  # fmt: skip
    assert single["sets"]["test"]["bleu"] == results["sets"]["test"]["bleu"]
    assert single["decode"]["beam"] == 2
