"""Two-process DDP (gloo on CPU) through the real CLI: BLEU over the complete sets, computed once."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.inference.translator import Translator, decode_settings, evaluate, resolve_checkpoints
from attnlab.metrics import corpus_bleu
from helpers import init_from, lines, subprocess_path
from runs import run_all


def mixed_corpus(corpus: Path, multi30k: Path, out: Path) -> Path:
    """The translating run's training split (hence its vocabularies) with a validation set of 30 of its
    sentences and 7 unseen ones, and a test set of 16 of its sentences and 7 unseen ones."""
    out.mkdir()
    for lang in ("de", "en"):
        train = lines(corpus / f"train.{lang}")
        splits = {"train": train, "valid": train[:30] + lines(multi30k / f"val.{lang}")[:7],
                  "test": train[40:56] + lines(multi30k / f"test2016.{lang}")[:7]}  # fmt: skip
        for name, text in splits.items():
            (out / f"{name}.{lang}").write_text("\n".join(text) + "\n", "utf-8")
    return out


@pytest.mark.ddp
def test_ddp_bleu_equals_a_single_process_evaluation_of_the_same_checkpoint(
    translating_run: dict[str, Any], shared_data: Path, tmp_path: Path
) -> None:
    """Two epochs at a low learning rate from the session's translating model: the BLEU logged and
    written by two ranks, each decoding its own share, is that of one process decoding everything.
    Validation and test sets mix sentences the model reproduces with unseen ones (odd sizes, unequal
    shares per rank), so a score over part of a set, or over misplaced hypotheses, differs."""
    corpus = mixed_corpus(translating_run["corpus"], shared_data / "multi30k", tmp_path / "corpus")
    data = [f"data.dir={corpus}" if o.startswith("data.dir=") else o for o in translating_run["data"]]
    data = [o for o in data if not o.startswith(("data.max_tokens=", "data.test="))]
    start = translating_run["dir"] / "checkpoints" / "last.ckpt"
    env = {**os.environ, "ATTNLAB_LOG_DIR": str(tmp_path / "logs"), "OMP_NUM_THREADS": "1",
           "ATTNLAB_CACHE_DIR": str(tmp_path / "cache"), "WANDB_MODE": "offline",
           "PYTHONPATH": subprocess_path()}  # fmt: skip
    command = [
        sys.executable, "-m", "attnlab.cli.train", "trainer=ddp_cpu", *data, *init_from(start),
        "data.max_tokens=300", "trainer.max_epochs=2",
        "optim=linear", "optim.peak_lr=2e-4", "optim.warmup_steps=5", "decode.beam=2",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false", "logger=wandb",
        "+callbacks.final._target_=probes.SaveFinalWeights", f"+callbacks.final.dirpath={tmp_path / 'final'}",
        "+callbacks.count._target_=probes.CountTokens", f"+callbacks.count.dirpath={tmp_path / 'final'}",
    ]  # fmt: skip
    done = run_all(command, env=env, cwd=tmp_path)  # every rank killed at the timeout
    assert done.returncode == 0, done.stderr[-4000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in done.stderr + done.stdout  # two processes really ran
    (run,) = (tmp_path / "logs" / "train" / "runs").iterdir()  # one run directory for both ranks
    assert len(list((run / "checkpoints").glob("last*.ckpt"))) == 1  # one set of checkpoints
    assert len(list(run.rglob("run-*.wandb"))) == 1  # one W&B run, from rank 0
    ranks = [torch.load(tmp_path / "final" / f"final_weights_rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])  # the same parameters on both ranks
    # train/tokens_seen: the target tokens both ranks trained on, the same count on each rank (and
    # logged), not a rank's own tokens x 2 (the ranks' shares differ).
    counts = [json.loads((tmp_path / "final" / f"tokens_rank{r}.json").read_text()) for r in (0, 1)]
    total = counts[0]["counted"] + counts[1]["counted"]
    assert counts[0]["counted"] != counts[1]["counted"]
    assert counts[0]["tokens_seen"] == counts[1]["tokens_seen"] == total
    with open(run / "csv" / "metrics.csv") as f:
        seen = [float(r["train/tokens_seen_step"]) for r in csv.DictReader(f) if r["train/tokens_seen_step"]]
    assert seen[-1] == total
    effective = json.loads((run / "manifest.json").read_text())["effective_batch"]
    assert (effective["devices"], effective["per_optimizer_step"]) == (2, 600)  # 300 tokens x 2 ranks
    assert "effective batch: 300 tokens per device batch x 2 devices x 1 nodes x 1 accumulated" in done.stdout
    # The linear schedule runs over optimizer steps: each rank takes half the batches, and the schedule
    # ends at the run's own last step (what a 1-process run with accumulate_grad_batches=2 also takes).
    from attnlab.optim import OptimConfig

    with open(run / "csv" / "metrics.csv") as f:
        lrs = {int(r["step"]): float(r["train/lr_step"]) for r in csv.DictReader(f) if r["train/lr_step"]}
    steps = len(lrs)
    linear = OptimConfig(schedule="linear", peak_lr=2e-4, warmup_steps=5)
    # (logged after the step: the rate the next optimizer step uses)
    expected = {s: linear.lr_at(s + 2, 128, steps) for s in range(steps)}
    assert lrs == pytest.approx(expected, rel=1e-5, abs=1e-9)

    # Validation BLEU of the last epoch: sacreBLEU of all 37 sentences, as one process decodes them.
    with open(run / "csv" / "metrics.csv") as f:
        logged = [float(r["val/bleu"]) for r in csv.DictReader(f) if r["val/bleu"]]
    assert len(logged) == 2
    translator = Translator.from_checkpoints([run / "checkpoints" / "last.ckpt"])
    translator.decode = decode_settings(translator.decode.to_dict(), {"beam": 1})
    hypotheses, references = translator.translate(lines(corpus / "valid.de")), lines(corpus / "valid.en")
    assert all(hypotheses) and len(set(hypotheses)) == len(hypotheses) == 37  # sentence-specific output
    assert sum(h == r for h, r in zip(hypotheses[:30], references, strict=False)) >= 20  # reproduced
    bleu = corpus_bleu(hypotheses, references).score
    assert logged[-1] == pytest.approx(bleu, rel=1e-6)  # logged in float32
    parts = (hypotheses[:20], references[:20]), (hypotheses[20:], references[20:])
    assert all(corpus_bleu(*part).score != pytest.approx(logged[-1], abs=0.01) for part in parts)

    # Test BLEU: results.json written once, equal to a single-process evaluation of the same weights,
    # with the hypotheses of every sentence in their input order.
    results = json.loads((run / "results.json").read_text())
    paths = resolve_checkpoints(run)
    assert results["checkpoints"] == [str(p.resolve()) for p in paths]
    sets = {"test": (lines(corpus / "test.de"), lines(corpus / "test.en"))}
    single = evaluate(Translator.from_checkpoints(paths), sets, tmp_path / "single")
    assert single["decode"]["beam"] == 2
    assert results["sets"].keys() == {"test"} and results["sets"]["test"]["sentences"] == 23
    written = lines(run / results["sets"]["test"]["hypotheses"])
    assert written == lines(tmp_path / "single" / single["sets"]["test"]["hypotheses"])
    assert all(written) and len(set(written)) == 23
    assert sum(h == r for h, r in zip(written[:16], sets["test"][1], strict=False)) >= 10  # reproduced
    assert results["sets"]["test"]["bleu"] == single["sets"]["test"]["bleu"]
