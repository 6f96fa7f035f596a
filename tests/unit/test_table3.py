"""Table 3 ablation variants: each composes on the recipe and changes what its row says."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from attnlab.cli.app import config_dir
from attnlab.training.experiment import validate
from helpers import compose_train

VARIANTS = sorted(p.stem for p in (config_dir() / "experiment" / "table3").glob("*.yaml"))
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "table3.py"


def load_script():
    spec = importlib.util.spec_from_file_location("table3", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["table3"] = module
    spec.loader.exec_module(module)
    return module


def model_of(variant: str, tmp_path: Path):
    cfg = compose_train(["experiment=multi30k_small", f"+experiment/table3={variant}"], tmp_path)
    return validate(cfg)


def test_every_row_has_variants_and_a_baseline() -> None:
    assert "base" in VARIANTS
    assert {v[0] for v in VARIANTS if v != "base"} == set("ABCDE")


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_composes_and_validates(variant: str, tmp_path: Path) -> None:
    experiment = model_of(variant, tmp_path)
    base = model_of("base", tmp_path)
    if variant == "base":
        assert experiment == base
    else:
        assert experiment != base  # every variant changes something


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.startswith("A")])
def test_row_a_varies_heads_at_constant_compute(variant: str, tmp_path: Path) -> None:
    model = model_of(variant, tmp_path).model
    base = model_of("base", tmp_path).model
    assert model.n_heads != base.n_heads
    assert model.n_heads * model.head_dim == model.d_model == base.d_model


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.startswith("B")])
def test_row_b_has_smaller_keys(variant: str, tmp_path: Path) -> None:
    model = model_of(variant, tmp_path).model
    assert model.head_dim < model_of("base", tmp_path).model.head_dim


# What each variant changes (README, "Table 3 as code"): exactly these settings and nothing else of the
# model and optimiser; d_head None means h·d_k = d_model (row A at constant compute, C4-C5 at d_model/h).
ROWS = {
    "A1": {"n_heads": 1}, "A2": {"n_heads": 2}, "A3": {"n_heads": 8}, "A4": {"n_heads": 16},
    "B1": {"d_head": 16}, "B2": {"d_head": 32},
    "C1": {"n_encoder_layers": 1, "n_decoder_layers": 1},
    "C2": {"n_encoder_layers": 2, "n_decoder_layers": 2},
    "C3": {"n_encoder_layers": 6, "n_decoder_layers": 6},
    "C4": {"d_model": 128}, "C5": {"d_model": 512}, "C6": {"d_ff": 512}, "C7": {"d_ff": 2048},
    "D1": {"dropout": 0.0}, "D2": {"dropout": 0.2},
    "D3": {"label_smoothing": 0.0}, "D4": {"label_smoothing": 0.2},
    "E1": {"pe": "learned"}, "E2": {"pe": "none"},
}  # fmt: skip


def test_every_variant_changes_what_the_readme_says_and_nothing_else(tmp_path: Path) -> None:
    assert set(ROWS) == set(VARIANTS) - {"base"}

    def settings(variant: str) -> dict[str, object]:
        experiment = model_of(variant, tmp_path)
        return {**dataclasses.asdict(experiment.model), **dataclasses.asdict(experiment.optim)}

    base = settings("base")
    for variant, changes in ROWS.items():
        found = settings(variant)
        assert {k: v for k, v in found.items() if v != base[k]} == changes, variant


def test_script_builds_one_resumable_multirun() -> None:
    table3 = load_script()
    line = table3.command(
        ["A", "E"], 3, "experiment=multi30k_small", "logs/sweeps/t3", ["trainer.max_epochs=2"]
    )
    assert line == [
        "attnlab-train", "-m", "experiment=multi30k_small", "+experiment/table3=base,A1,A2,A3,A4,E1,E2",
        "seed=1,2,3", "hydra.sweep.dir=logs/sweeps/t3", "sweep.skip_done=true", "resume=auto",
        "trainer.max_epochs=2",
    ]  # fmt: skip
