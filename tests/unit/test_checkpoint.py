"""Checkpoint averaging, epoch-checkpoint discovery, decoding-setting overrides, the settings and weights
a checkpoint holds, and the generator states a resumption restores."""

from __future__ import annotations

import io
import random
import re
from pathlib import Path

import pytest
import torch

from attnlab.decoding import DecodeConfig
from attnlab.inference.translator import decode_settings, resolve_checkpoints
from attnlab.metrics import MetricsConfig
from attnlab.model.transformer import Transformer
from attnlab.runs.checkpoint import (
    CheckpointError,
    average_state_dicts,
    check_weights_fit,
    kept_checkpoints,
    last_kept_checkpoints,
    model_weights,
    rng_states,
    saved_settings,
    set_rng_states,
)
from helpers import TINY, tiny_config


def test_average_is_the_elementwise_mean_in_the_original_dtype() -> None:
    states = [
        {"w": torch.full((2, 3), float(i)), "h": torch.tensor([i], dtype=torch.float16)} for i in (1, 2, 6)
    ]
    averaged = average_state_dicts(states)
    assert torch.equal(averaged["w"], torch.full((2, 3), 3.0))
    assert averaged["h"].dtype == torch.float16 and float(averaged["h"]) == 3.0


def test_average_accumulates_in_float64() -> None:
    """In float32, 2**24 + 1 == 2**24: a float32 running sum loses the ones, and its mean 2**24 / 3 rounds to
    5592405.5 in float32, where the float64 sum's (2**24 + 2) / 3 is 5592406 exactly (a relative tolerance
    of 1e-7 let the float32 sum pass)."""
    states = [{"w": torch.tensor([2.0**24])}] + [{"w": torch.tensor([1.0])}] * 2
    averaged = average_state_dicts(states)["w"]
    assert averaged.dtype == torch.float32 and float(averaged) == (2**24 + 2) / 3 == 5592406.0


def test_non_float_tensors_must_agree() -> None:
    same = [{"n": torch.tensor([3])}, {"n": torch.tensor([3])}]
    assert torch.equal(average_state_dicts(same)["n"], torch.tensor([3]))
    with pytest.raises(CheckpointError, match="n differs"):
        average_state_dicts([{"n": torch.tensor([3])}, {"n": torch.tensor([4])}], ["a.ckpt", "b.ckpt"])


def test_average_rejects_other_models() -> None:
    with pytest.raises(CheckpointError, match=r"b\.ckpt has other parameters than a\.ckpt \(x\)"):
        average_state_dicts(
            [{"w": torch.zeros(1)}, {"w": torch.zeros(1), "x": torch.zeros(1)}], ["a.ckpt", "b.ckpt"]
        )
    with pytest.raises(CheckpointError, match=r"w is \(2,\) in b\.ckpt but \(1,\) in a\.ckpt"):
        average_state_dicts([{"w": torch.zeros(1)}, {"w": torch.zeros(2)}], ["a.ckpt", "b.ckpt"])
    with pytest.raises(CheckpointError, match="no checkpoints"):
        average_state_dicts([])


def test_model_weights_strip_the_module_prefix() -> None:
    state = {"model.w": torch.zeros(1), "sums.x": torch.zeros(1)}
    assert list(model_weights(state)) == ["w"]


def touch(directory: Path, *names: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"")


def test_epoch_checkpoints_are_found_in_epoch_order_from_any_level_of_a_run(tmp_path: Path) -> None:
    epochs = tmp_path / "run" / "checkpoints" / "epochs"
    touch(epochs, "epoch009.ckpt", "epoch010.ckpt", "epoch002.ckpt", "notes.txt", "epoch1.tmp")
    touch(epochs, "epoch010-v1.ckpt")  # (Lightning's name for a second file of one name: not kept)
    expected = [epochs / n for n in ("epoch002.ckpt", "epoch009.ckpt", "epoch010.ckpt")]
    for level in (tmp_path / "run", tmp_path / "run" / "checkpoints", epochs):
        assert kept_checkpoints(level) == expected
    assert last_kept_checkpoints(tmp_path / "run", 2) == expected[1:]
    with pytest.raises(CheckpointError, match="needs 4, found 3"):
        last_kept_checkpoints(tmp_path / "run", 4)


def test_step_checkpoints_are_found_in_step_order_and_before_epoch_ones(tmp_path: Path) -> None:
    steps = tmp_path / "run" / "checkpoints" / "steps"
    touch(steps, "step00012000.ckpt", "step00002000.ckpt", "step00100000.ckpt", "epoch001.ckpt")
    touch(tmp_path / "run" / "checkpoints" / "epochs", "epoch000.ckpt")
    expected = [steps / n for n in ("step00002000.ckpt", "step00012000.ckpt", "step00100000.ckpt")]
    for level in (tmp_path / "run", tmp_path / "run" / "checkpoints", steps):
        assert kept_checkpoints(level) == expected
    assert last_kept_checkpoints(tmp_path / "run", 2) == expected[1:]


def test_resolve_checkpoints(tmp_path: Path) -> None:
    run = tmp_path / "run"
    touch(run / "checkpoints", "best-epoch003-step90.ckpt", "last.ckpt")
    touch(run / "checkpoints" / "epochs", "epoch002.ckpt", "epoch003.ckpt")
    best = run / "checkpoints" / "best-epoch003-step90.ckpt"
    assert resolve_checkpoints(run) == [best]
    assert resolve_checkpoints(str(best)) == [best]
    assert resolve_checkpoints(best, average_last=2) == [
        run / "checkpoints" / "epochs" / f"epoch00{i}.ckpt" for i in (2, 3)
    ]
    listed = [str(best), str(run / "checkpoints" / "last.ckpt")]
    assert resolve_checkpoints(listed, ensemble=True) == [best, run / "checkpoints" / "last.ckpt"]
    assert resolve_checkpoints([run, best], ensemble=True) == [best, best]  # a run: its best checkpoint
    with pytest.raises(CheckpointError, match="ckpt_path is a list of 2 checkpoints: add ensemble=true"):
        resolve_checkpoints(listed)
    with pytest.raises(CheckpointError, match="ckpt_path is a list of 1 checkpoint: add ensemble=true"):
        resolve_checkpoints(listed[:1])
    with pytest.raises(CheckpointError, match="ensemble=true needs a list of checkpoints"):
        resolve_checkpoints(best, ensemble=True)
    with pytest.raises(CheckpointError, match="average_last=2 averages one run's weights"):
        resolve_checkpoints(listed, average_last=2, ensemble=True)
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_checkpoints(tmp_path / "nothing")
    with pytest.raises(CheckpointError, match="no best-"):
        resolve_checkpoints(tmp_path)
    with pytest.raises(CheckpointError, match="required"):
        resolve_checkpoints(None)


@pytest.mark.parametrize("value", ["-1", "1.5", "true", "abc"])
def test_average_last_that_is_no_whole_number_is_refused_by_eval_and_translate_naming_it(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`average_last=1.5` averaged the last checkpoint alone and `true` the last one too (`int()` of the
    value), `abc` ended with "invalid literal for int()", naming no setting."""
    from attnlab.cli.eval import evaluate_checkpoint
    from attnlab.cli.translate import main as translate_main
    from attnlab.typed import ConfigError
    from helpers import compose_eval

    run = tmp_path / "run"
    touch(run / "checkpoints" / "epochs", "epoch001.ckpt", "epoch002.ckpt")
    named = re.escape("must be a whole number >= 0 (the last N epoch checkpoints to average; 0: none)")
    with pytest.raises(SystemExit, match=rf"^attnlab-translate: average_last=.* {named}$"):
        translate_main([f"ckpt_path={run}", f"average_last={value}", f"input={tmp_path}"])
    with pytest.raises(ConfigError, match=rf"^average_last=.* {named}$"):
        evaluate_checkpoint(compose_eval([f"ckpt_path={run}", f"average_last={value}"], tmp_path / "eval"))


@pytest.mark.parametrize("value", ["off", "maybe", "1"])
def test_ensemble_that_is_not_true_or_false_is_refused_by_eval_and_translate_naming_it(
    value: str, tmp_path: Path
) -> None:
    """`attnlab-eval ckpt_path=[a,b] ensemble=off` decoded an ensemble: Hydra reads `off` as a string, which
    `bool()` made true (attnlab-translate reads `off` as false, `maybe` as a string)."""
    from attnlab.cli.eval import evaluate_checkpoint
    from attnlab.cli.translate import main as translate_main
    from attnlab.typed import ConfigError
    from helpers import compose_eval

    touch(tmp_path, "a.ckpt", "b.ckpt")
    listed = f"ckpt_path=[{tmp_path / 'a.ckpt'},{tmp_path / 'b.ckpt'}]"
    with pytest.raises(ConfigError, match=r"^ensemble='?[a-z0-9]+'? must be true or false$"):
        evaluate_checkpoint(compose_eval([listed, f"ensemble={value}"], tmp_path / "eval"))
    if value != "off":
        with pytest.raises(SystemExit, match=r"^attnlab-translate: ensemble=.* must be true or false$"):
            translate_main([listed, f"ensemble={value}", f"input={tmp_path}"])


def test_a_run_with_several_best_checkpoints_is_refused_not_picked_by_name(tmp_path: Path) -> None:
    """callbacks.model_checkpoint.save_top_k=2 keeps two best-*.ckpt: the later name (epoch999 after
    epoch1000, in text order) is not the better score, so the run directory alone is refused."""
    run = tmp_path / "run"
    touch(run / "checkpoints", "best-epoch999-step10.ckpt", "best-epoch1000-step11.ckpt", "last.ckpt")
    with pytest.raises(CheckpointError, match=r"2 best checkpoints \(best-epoch1000-step11.ckpt, "
                       r"best-epoch999-step10.ckpt\).*ckpt_path=<file>"):  # fmt: skip
        resolve_checkpoints(run)
    chosen = run / "checkpoints" / "best-epoch999-step10.ckpt"
    assert resolve_checkpoints(chosen) == [chosen]


def test_decode_overrides_replace_only_the_values_given() -> None:
    saved = DecodeConfig(beam=4, alpha=1.0).to_dict()
    assert decode_settings(saved, {"beam": None, "alpha": 0.6}) == DecodeConfig(beam=4, alpha=0.6)
    fairseq = DecodeConfig(beam=4, length_penalty="fairseq", alpha=0.5).to_dict()
    # Another penalty without its alpha: that penalty's default, not the alpha saved for the other one.
    assert decode_settings(fairseq, {"length_penalty": "gnmt"}).alpha == 0.6
    assert decode_settings(saved, {"length_penalty": "fairseq"}).alpha == 1.0
    assert decode_settings(saved, {"length_penalty": "fairseq", "alpha": 0.3}).alpha == 0.3
    assert decode_settings(fairseq, {"length_penalty": "fairseq"}).alpha == 0.5  # the same penalty: kept
    assert decode_settings(fairseq, {"beam": 2}).alpha == 0.5
    # The deprecated override is the GNMT α: it replaces the saved penalty and α, with one warning.
    with pytest.warns(FutureWarning, match=r"decode\.lenpen is deprecated.*decode\.alpha") as caught:
        old = decode_settings(fairseq, {"lenpen": 0.8})
    assert len(caught) == 1 and old == DecodeConfig(beam=4, length_penalty="gnmt", alpha=0.8)
    with pytest.raises(ValueError, match=r"lenpen=0\.8 and alpha=0\.6 are both set"):
        decode_settings(saved, {"lenpen": 0.8, "alpha": 0.6})
    with pytest.raises(ValueError, match=r"decode\.beam_size is not a decoding setting"):
        decode_settings(saved, {"beam_size": 2})
    with pytest.raises(ValueError, match="beam=0"):
        decode_settings(saved, {"beam": 0})


def test_sampling_overrides_a_checkpoint_saved_with_a_validation_beam() -> None:
    """val_beam is training's: attnlab-eval and attnlab-translate have no key for it, so turning sampling on
    there must not fail on a saved val_beam > 1; searching again from a sampling checkpoint is named."""
    saved = DecodeConfig(beam=4, val_beam=3).to_dict()
    sampled = decode_settings(saved, {"sampling": True, "beam": 1, "temperature": 0.5})
    assert (sampled.sampling, sampled.beam, sampled.val_beam, sampled.temperature) == (True, 1, 1, 0.5)
    for key, value in (("val_beam", 2), ("val_subset", 5), ("every_n_epochs", 2)):  # recorded, never used
        with pytest.raises(ValueError, match=rf"decode\.{key} sets training's validation decodes"):
            decode_settings(saved, {"sampling": True, "beam": 1, key: value})
    assert decode_settings(saved, {"beam": 2}).val_beam == 3  # without sampling: as saved
    sampling = sampled.to_dict()
    with pytest.raises(ValueError, match=r"beam=5 but sampling=true .*or decode\.sampling=false to search"):
        decode_settings(sampling, {"beam": 5})
    searched = decode_settings(sampling, {"beam": 5, "sampling": False})  # the saved 0.5 goes with sampling
    assert (searched.beam, searched.temperature, searched.topk, searched.topp) == (5, 1.0, 0, 1.0)
    with pytest.raises(ValueError, match=r"temperature=0\.7 is a sampling setting"):  # given: checked
        decode_settings(sampling, {"beam": 5, "sampling": False, "temperature": 0.7})


def test_a_device_that_cannot_be_used_is_named() -> None:
    from attnlab.inference.translator import pick_device

    assert pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device='gpu' is not a device: use auto, cpu, cuda or cuda:N"):
        pick_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device=cuda:1, but torch finds no CUDA GPU here"):
            pick_device("cuda:1")
    # a device type torch knows but cannot use here failed loading with its own traceback (mps:
    # RuntimeError, xpu: AssertionError, hpu: ModuleNotFoundError; meta: NotImplementedError at the copy)
    with pytest.raises(ValueError, match=r"^device=meta holds shapes, not values, .*use device=cpu"):
        pick_device("meta")
    unusable = [name for name in ("mps", "xpu", "hpu") if not getattr(torch, name, None)
                or not getattr(torch, name).is_available()]  # fmt: skip
    for name in unusable:
        with pytest.raises(ValueError, match=rf"^device={name} cannot be used here \(\w+: .*\): use device="):
            pick_device(name)
    if torch.cuda.is_available():  # an ordinal past the GPUs
        with pytest.raises(ValueError, match=r"^device=cuda:99 cannot be used here"):
            pick_device("cuda:99")


def test_saved_nbest_and_alignment_settings_are_not_kept_by_the_commands() -> None:
    """A run trained with decode.nbest (for its final test lists) must not turn every later
    attnlab-translate into n-best output: null cannot override a saved value, so they are not kept."""
    saved = DecodeConfig(beam=4, nbest=3, print_alignment="hard", nbest_format="fairseq").to_dict()
    plain = decode_settings(saved, {})
    assert (plain.nbest, plain.print_alignment, plain.writes_nbest) == (None, None, False)
    assert decode_settings(saved, {"beam": 2}).beam == 2  # not refused for the saved nbest=3 > beam
    asked = decode_settings(saved, {"nbest": 2, "print_alignment": "soft"})
    assert (asked.nbest, asked.print_alignment, asked.nbest_format) == (2, "soft", "jsonl")  # the default


def test_saved_settings_default_decoding_and_scoring_and_refuse_what_no_class_builds() -> None:
    """A checkpoint from before decoding or scoring settings were saved gets the defaults; missing model
    settings, keys that are no names, and values the class refuses are a `CheckpointError` naming the file."""
    assert saved_settings({"hyper_parameters": {}}, "metrics", "old.ckpt") == MetricsConfig()
    assert saved_settings({"hyper_parameters": {}}, "decode", "old.ckpt") == DecodeConfig()
    assert saved_settings({"hyper_parameters": {"model": dict(TINY)}}, "model", "a.ckpt") == tiny_config()
    refused = [
        ({}, r"a\.ckpt has no model settings \(hyper_parameters\.model\)"),
        ({"model": {**TINY, 1: 2}}, r"a\.ckpt has no model settings"),  # a key of no name
        ({"model": {**TINY, "d_model": "big"}},
         r"a\.ckpt holds model settings this version cannot use: model\.d_model='big' is not valid"),
    ]  # fmt: skip
    for hyper_parameters, message in refused:
        with pytest.raises(CheckpointError, match=message):
            saved_settings({"hyper_parameters": hyper_parameters}, "model", "a.ckpt")


def test_weights_outside_the_settings_are_refused_unless_strict_is_off() -> None:
    """`strict=False` allows missing and extra weights, as `load_state_dict(strict=False)` does."""
    config = tiny_config()
    weights = {f"model.{k}": v for k, v in Transformer(config).state_dict().items()}
    extra = {**weights, "model.extra.weight": torch.zeros(2)}
    missing = {k: v for k, v in weights.items() if k != "model.output.weight"}
    check_weights_fit(config, weights, "a.ckpt")
    refused = [(extra, "model.extra.weight, unexpected"), (missing, "model.output.weight, missing")]
    for state, named in refused:
        with pytest.raises(CheckpointError, match=re.escape(f"(first differing key: {named})")):
            check_weights_fit(config, state, "a.ckpt")
    check_weights_fit(config, extra, "a.ckpt", strict=False)
    check_weights_fit(config, missing, "a.ckpt", strict=False)


def test_saved_generator_states_read_back_weights_only_restore_torch_and_python_draws() -> None:
    """What `rng_states` saves goes through `torch.save` and `torch.load(weights_only=True)`, and
    `set_rng_states` makes torch's and Python's generators repeat the draws made after the save."""
    saved = io.BytesIO()
    torch.save(rng_states(), saved)
    drawn = (torch.rand(4), [random.random() for _ in range(4)])
    saved.seek(0)
    set_rng_states(torch.load(saved, weights_only=True))
    assert torch.equal(torch.rand(4), drawn[0])
    assert [random.random() for _ in range(4)] == drawn[1]
