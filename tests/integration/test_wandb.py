"""W&B for real, offline: train twice in one process, then read the run files back with wandb's protobufs."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from attnlab.metrics import corpus_bleu
from attnlab.runs.wandb import config_group, run_name
from attnlab.training.pipeline import train
from helpers import compose_train, init_from, lines
from wandb_records import WandbFileError, find_run_file, read_wandb_run


@pytest.fixture(scope="module")
def wandb_runs(
    translating_run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """Two seeds of one setting, trained one after the other in this process with W&B offline: two
    epochs at a low learning rate from the session's translating model (`translating_run`), so the
    hypotheses they log are real translations."""
    tmp = tmp_path_factory.mktemp("wandb")
    start = translating_run["dir"] / "checkpoints" / "last.ckpt"
    runs = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        for variable in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            patch.delenv(variable, raising=False)
        for seed in (1, 2):
            overrides = [
                *translating_run["data"], *init_from(start), "optim=inverse_sqrt", "optim.peak_lr=1e-4",
                "optim.warmup_steps=5", "trainer.max_epochs=2", "decode.beam=2", "logger=wandb",
                "logger.wandb.tags=[ablation,tiny]", f"seed={seed}", "trainer.log_every_n_steps=2",
            ]  # fmt: skip
            run_dir = tmp / f"run{seed}"
            metrics = train(compose_train(overrides, run_dir))
            env = {v: os.environ.get(v) for v in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR",
                                                  "WANDB_CONFIG_DIR")}  # fmt: skip
            runs.append({"dir": run_dir, "metrics": metrics, "record": read_wandb_run(find_run_file(run_dir)),
                         "env": env, "corpus": translating_run["corpus"]})  # fmt: skip
    return runs


def test_offline_run_holds_config_history_and_summary(wandb_runs: list[dict[str, Any]]) -> None:
    run = wandb_runs[0]
    record, run_dir = run["record"], run["dir"]
    assert record.config["model"]["d_model"] == 128  # the module's hyperparameters
    assert record.config["run"]["seed"] == 1 and record.config["run"]["data"]["vocab_size"] == 1000
    assert record.config["manifest"]["status"] == "running"  # the manifest as the run started
    with open(run_dir / "csv" / "metrics.csv") as f:
        csv_val = [float(r["val/loss"]) for r in csv.DictReader(f) if r["val/loss"]]
    wandb_val = [row["val/loss"] for row in record.history if "val/loss" in row]
    assert wandb_val == pytest.approx(csv_val, rel=1e-6)
    assert any("train/loss_step" in row for row in record.history)
    results = json.loads((run_dir / "results.json").read_text())
    for name in ("test", "test2"):
        hypotheses = lines(run_dir / results["sets"][name]["hypotheses"])
        refs = lines(run["corpus"] / f"{name}.en")
        assert all(hypotheses) and len(set(hypotheses)) == len(hypotheses) == len(refs)
        score = corpus_bleu(hypotheses, refs).score
        assert record.summary[f"results/{name}/bleu"] == pytest.approx(score, abs=1e-9) and score >= 60
    assert record.summary["results/test/bleu_signature"] == results["sets"]["test"]["bleu_signature"]
    logged = [row["val/bleu"] for row in record.history if "val/bleu" in row]
    assert logged[-1] == pytest.approx(run["metrics"]["val/bleu"]) and run["metrics"]["val/bleu"] >= 60
    assert record.summary["val/bleu"] == {"max": pytest.approx(max(logged))}  # the best, not the last


def test_hypotheses_go_to_a_table_and_an_artifact(wandb_runs: list[dict[str, Any]]) -> None:
    run = wandb_runs[0]
    record = run["record"]
    for name, size in (("test", 30), ("test2", 20)):
        key = f"test/{name}/hypotheses"
        (table,) = [row[key] for row in record.history if key in row]
        assert table["_type"] == "table-file" and table["nrows"] == size
        assert table["path"] in record.files
        (path,) = run["dir"].rglob(f"files/{table['path']}")
        logged = json.loads(path.read_text(encoding="utf-8"))
        assert logged["columns"] == ["line", "hypothesis"]
        hypotheses = lines(run["dir"] / "hypotheses" / f"{name}.txt")
        assert logged["data"] == [[i + 1, h] for i, h in enumerate(hypotheses)]  # every line, in order
        assert corpus_bleu([h for _, h in logged["data"]], lines(run["corpus"] / f"{name}.en")).score >= 60
    (artifact,) = [a for a in record.artifacts if a["type"] == "hypotheses"]
    assert artifact["type"] == "hypotheses" and artifact["name"] == f"hypotheses-{record.run['id']}"
    assert sorted(artifact["files"]) == ["test.txt", "test2.txt"]


def test_seeds_of_one_setting_share_a_group_and_get_their_own_runs(wandb_runs: list[dict[str, Any]]) -> None:
    first, second = (r["record"] for r in wandb_runs)
    assert first.run["id"] != second.run["id"]
    assert first.run["group"] == second.run["group"]
    resolved = OmegaConf.to_container(OmegaConf.load(wandb_runs[0]["dir"] / "config.yaml"))
    assert first.run["group"] == config_group(resolved) == resolved["logger"]["wandb"]["group"]
    assert first.run["tags"] == ["ablation", "tiny"] and first.run["project"] == "attnlab"
    assert first.exit_code == 0 and second.exit_code == 0


def test_wandb_files_stay_inside_the_run_directory(wandb_runs: list[dict[str, Any]]) -> None:
    for run in wandb_runs:
        assert find_run_file(run["dir"]).is_relative_to(run["dir"] / "wandb")
        assert len(run["env"]) == 4
        for value in run["env"].values():
            assert value is not None and Path(value).is_relative_to(run["dir"] / "wandb")


def test_group_ignores_the_seed_and_paths_but_not_the_model() -> None:
    base = {"seed": 1, "paths": {"output_dir": "/a"}, "model": {"pe": "sinusoidal"}, "ckpt": {"dir": "/a/c"}}
    other = {**base, "seed": 2, "paths": {"output_dir": "/b"}, "ckpt": {"dir": "/b/c"}}
    assert config_group(base) == config_group(other)
    assert config_group(base) != config_group({**base, "model": {"pe": "learned"}})
    assert re.fullmatch(r"[0-9a-f]{10}", config_group(base))  # (a shorter hash would split existing groups)


def test_run_name_from_overrides() -> None:
    overrides = [
        "model.pe=learned",
        "model.n_heads=4",
        "seed=2",
        "paths.log_dir=/x",
        "+logger.wandb.tags=[a]",
    ]
    assert run_name(overrides) == "pe=learned,n_heads=4,seed=2"
    assert run_name([]) is None
    assert run_name(["+seed=3", "~model.pe"]) == "seed=3,~pe"  # no + for an addition, ~ for a deletion
    assert run_name(["~seed"]) == "~seed"


def test_a_damaged_run_file_is_reported(tmp_path: Path, wandb_runs: list[dict[str, Any]]) -> None:
    data = find_run_file(wandb_runs[0]["dir"]).read_bytes()
    bad = tmp_path / "run-x.wandb"
    bad.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    with pytest.raises(WandbFileError, match="checksum"):
        read_wandb_run(bad)
    (tmp_path / "other.wandb").write_bytes(b"not a wandb file")
    with pytest.raises(WandbFileError, match="not a W&B run file"):
        read_wandb_run(tmp_path / "other.wandb")


def test_cross_attention_heatmaps_of_probe_sentences_at_each_validation_decode(
    wandb_runs: list[dict[str, Any]],
) -> None:
    record = wandb_runs[0]["record"]
    for sentence in ("0", "1"):  # one key per probe sentence (their heatmaps differ in size)
        key = f"val/attention/{sentence}"
        logged = [row[key] for row in record.history if key in row]
        assert len(logged) == 2  # two epochs, each decoding the validation set
        for entry in logged:
            assert entry["_type"] == "images/separated" and entry["count"] == 1
            assert len(entry["captions"]) == 1 and " -> " in entry["captions"][0]
    assert not any("val/attention/2" in row for row in record.history)  # decode.probe_sentences=2
    images = [f for f in record.files if f.startswith("media/images/val/attention/")]
    assert len(images) == 4 and all(f.endswith(".png") for f in images)


def test_validation_scores_are_summarised_by_their_best_value(tmp_path: Path) -> None:
    """A W&B run's summary of `val/bleu` is its maximum over the history and of the validation losses
    their minimum (`define_metric`), not the last value logged; other metrics keep the last."""
    from attnlab.runs.wandb import SUMMARIES, WandbLogger, finish_wandb

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        for variable in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            patch.delenv(variable, raising=False)
        logger = WandbLogger(save_dir=str(tmp_path), project="attnlab-test")
        history = [(10.0, 4.0, 1.0), (30.0, 3.0, 2.0), (20.0, 3.5, 3.0)]  # the best epoch is not the last
        for step, (score, loss, lr) in enumerate(history):
            values = {"val/bleu": score, "val/chrf": score + 1, "val/loss": loss, "val/nll": loss - 1,
                      "val/ppl": loss + 10, "train/lr": lr}  # fmt: skip
            logger.log_metrics(values, step=step)
        finish_wandb(0)  # (`finish` alone may return before the run file is complete)
    record = read_wandb_run(find_run_file(tmp_path))
    assert SUMMARIES == {"val/bleu": "max", "val/chrf": "max", "val/loss": "min", "val/nll": "min",
                         "val/ppl": "min"}  # fmt: skip
    assert record.summary["val/bleu"] == {"max": 30.0} and record.summary["val/chrf"] == {"max": 31.0}
    assert record.summary["val/loss"] == {"min": 3.0} and record.summary["val/nll"] == {"min": 2.0}
    assert record.summary["val/ppl"] == {"min": 13.0}
    assert record.summary["train/lr"] == 3.0
    assert [row["val/bleu"] for row in record.history if "val/bleu" in row] == [10.0, 30.0, 20.0]
    for metric, summary in SUMMARIES.items():  # charted against the trainer's step, as a resumed run needs
        assert record.metrics[metric] == {"step_metric": "trainer/global_step", "step_sync": True,
                                          "summary": [summary]}  # fmt: skip


def test_the_wandb_mode_environment_variable_wins_over_the_loggers_mode(tmp_path: Path) -> None:
    """`WANDB_MODE=disabled` in the environment keeps a run configured `mode: offline` off W&B: nothing is
    written."""
    from attnlab.runs.wandb import WandbLogger

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "disabled")
        for variable in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            patch.delenv(variable, raising=False)
        logger = WandbLogger(save_dir=str(tmp_path), project="attnlab-test", mode="offline")
        logger.log_metrics({"val/bleu": 1.0}, step=0)
        logger.experiment.finish()
    assert not list((tmp_path / "wandb").rglob("*.wandb"))
    assert not list((tmp_path / "wandb").glob("offline-run-*"))


def test_the_users_own_wandb_directories_are_kept(tmp_path: Path) -> None:
    """A W&B directory variable the user set (`WANDB_DIR`, ...) is neither replaced nor created; the unset
    ones go under `<save_dir>/wandb/`, and a later logger of the process (the next job of a multirun) moves
    those, but still not the user's."""
    from attnlab.runs.wandb import WandbLogger

    mine = tmp_path / "my-wandb-cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "disabled")
        for variable in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):
            patch.setenv(variable, "")  # (recorded: the logger's own values are undone after the test)
            patch.delenv(variable)
        patch.setenv("WANDB_CACHE_DIR", str(mine))
        for job in ("a", "b"):
            WandbLogger(save_dir=str(tmp_path / job))
            assert os.environ["WANDB_CACHE_DIR"] == str(mine)
            ours = (("WANDB_DIR", ""), ("WANDB_DATA_DIR", "data"), ("WANDB_CONFIG_DIR", "config"))
            for variable, sub in ours:
                assert os.environ[variable] == str(tmp_path / job / "wandb" / sub)
                assert (tmp_path / job / "wandb" / sub).is_dir()
    assert not mine.exists() and not (tmp_path / "a" / "wandb" / "cache").exists()


def test_results_go_to_the_summary_tables_and_artifact_and_the_exit_code_to_the_run(tmp_path: Path) -> None:
    """`log_results` puts results.json's scores into the run's summary, each set's hypotheses into a table
    (every line once, in order, an empty translation included, no row for the file's final newline) and the
    hypotheses files into one artifact; `finish_wandb` records the exit code it is given (a failed run's)."""
    from attnlab.runs.tracking import result_summary
    from attnlab.runs.wandb import WandbLogger, finish_wandb, log_results

    hypotheses = {"test": ["a b", "", "c d e"], "test2": ["x y"]}  # (an empty translation is a row too)
    (tmp_path / "hypotheses").mkdir()
    sets = {}
    for name, rows in hypotheses.items():
        text = "".join(f"{row}\n" for row in rows)
        (tmp_path / "hypotheses" / f"{name}.txt").write_text(text, encoding="utf-8")
        sets[name] = {"bleu": 12.5, "chrf": 40.0, "sentences": len(rows), "bleu_signature": "nrefs:1",
                      "hypotheses": f"hypotheses/{name}.txt"}  # fmt: skip
    results = {"sets": sets, "test_metrics": {"test/loss": 2.5}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        for variable in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
            patch.setenv(variable, "")  # (recorded: the logger's own values are undone after the test)
            patch.delenv(variable)
        logger = WandbLogger(save_dir=str(tmp_path), project="attnlab-test")
        log_results([logger.experiment], result_summary(results), results, tmp_path)
        finish_wandb(3)
    record = read_wandb_run(find_run_file(tmp_path))
    assert record.summary["results/test/bleu"] == 12.5 and record.summary["results/test2/chrf"] == 40.0
    assert record.summary["results/test/loss"] == 2.5
    for name, rows in hypotheses.items():
        key = f"test/{name}/hypotheses"
        (table,) = [row[key] for row in record.history if key in row]
        (path,) = tmp_path.rglob(f"files/{table['path']}")
        logged = json.loads(path.read_text(encoding="utf-8"))["data"]
        assert logged == [[i + 1, row] for i, row in enumerate(rows)]
    (artifact,) = [a for a in record.artifacts if a["type"] == "hypotheses"]
    assert sorted(artifact["files"]) == ["test.txt", "test2.txt"] and record.exit_code == 3
