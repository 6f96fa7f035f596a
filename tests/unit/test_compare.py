"""attnlab-compare on run directories with known numbers."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnlab.cli.compare import main as compare_main
from attnlab.cli.compare import report
from attnlab.reports.compare import load_runs, render, shell_word, summarize, varying_keys
from attnlab.reports.stats import t_quantile

BLEU = {("sinusoidal", 1): 30.0, ("sinusoidal", 2): 32.0, ("sinusoidal", 3): 34.0,
        ("none", 1): 20.0, ("none", 2): 21.0, ("none", 3): 25.0}  # fmt: skip


REFS = [f"a man in shirt number {i} rides a red bike down the street ." for i in range(60)]


def hypotheses(pe: str, seed: int) -> list[str]:
    """The references, with the last word dropped from every `k`-th line (worse without positions)."""
    k = 2 if pe == "none" else 5 + seed
    return [" ".join(r.split()[:-2]) if i % k == 0 else r for i, r in enumerate(REFS)]


def write_run(directory: Path, pe: str, seed: int, bleu: float | None, status: str = "finished") -> None:
    directory.mkdir(parents=True)
    config = {"seed": seed, "model": {"pe": pe, "d_model": 32}, "paths": {"output_dir": str(directory)},
              "callbacks": {"last": {"dirpath": f"{directory}/checkpoints"}}}  # fmt: skip
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    manifest = {
        "status": status,
        "start_time": "2026-01-01T00:00:00+00:00",
        "end_time": "2026-01-01T00:30:00+00:00",
    }
    if status == "failed":
        manifest["error"] = "RuntimeError: out of memory"
    (directory / "manifest.json").write_text(json.dumps(manifest))
    if bleu is not None:
        results = {
            "sets": {"test2016": {"bleu": bleu, "chrf": bleu + 20}},
            "metrics": {"val/ppl": 10.0 - seed},
        }
        (directory / "results.json").write_text(json.dumps(results))
        for sub, lines in (("references", REFS), ("hypotheses", hypotheses(pe, seed))):
            (directory / sub).mkdir()
            (directory / sub / "test2016.txt").write_text("".join(f"{line}\n" for line in lines))
    (directory / "csv").mkdir()
    curve = "".join(f",{10 * (e + 1)},{e},{5.0 - e - (pe == 'sinusoidal')}\n" for e in range(3))
    (directory / "csv" / "metrics.csv").write_text(f"params/total,step,epoch,val/loss\n1234.0,0,,\n{curve}")


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    for (pe, seed), bleu in BLEU.items():
        write_run(tmp_path / "sweep" / f"pe={pe},seed={seed}", pe, seed, bleu)
    write_run(tmp_path / "sweep" / "pe=learned,seed=1", "learned", 1, None, status="failed")
    write_run(tmp_path / "sweep" / "pe=learned,seed=2", "learned", 2, None, status="running")
    return tmp_path / "sweep"


def test_groups_by_the_varying_keys_with_seed_statistics(sweep: Path) -> None:
    runs = load_runs([sweep])
    assert len(runs) == 8
    assert varying_keys([r for r in runs if r.status == "finished"]) == ["model.pe"]
    groups, others = summarize(runs, baseline="model.pe=sinusoidal")
    by_name = {g.name: g for g in groups}
    assert set(by_name) == {"model.pe=sinusoidal", "model.pe=none"}
    none = by_name["model.pe=none"].stats["test/test2016/bleu"]
    values = [20.0, 21.0, 25.0]
    assert none.n == 3 and none.mean == pytest.approx(22.0)
    assert none.std == pytest.approx(statistics.stdev(values))
    assert none.half_width == pytest.approx(4.302653 * statistics.stdev(values) / math.sqrt(3), rel=1e-6)
    assert by_name["model.pe=none"].delta["test/test2016/bleu"] == pytest.approx(22.0 - 32.0)
    assert by_name["model.pe=none"].stats["train_minutes"].mean == pytest.approx(30.0)
    assert by_name["model.pe=none"].stats["params"].mean == 1234.0
    assert sorted(r.status for r in others) == ["failed", "running"]


def test_report_lists_unfinished_runs_and_renders_three_formats(sweep: Path) -> None:
    text = report([sweep], baseline="model.pe=sinusoidal")
    assert "| model.pe=none | 3 | 22.00 ± 2.65 [±6.57] | -10.00 |" in text
    assert "| 1234 ± 0 [±0] | +0 |" in text  # a parameter count: a whole number
    rows = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| model.pe=")]
    assert rows == ["| model.pe=sinusoidal", "| model.pe=none"]  # the baseline first
    assert "Not finished:" in text and "failed: RuntimeError: out of memory" in text and "(running)" in text
    rows = [["group", "x"], ["a_b", "1.00 ± 0.50 [±1.00]"]]
    assert render(rows, "csv").splitlines() == ["group,x", "a_b,1.00 ± 0.50 [±1.00]"]
    latex = render(rows, "latex")
    assert "a\\_b & 1.00 $\\pm$ 0.50 [$\\pm$1.00] \\\\" in latex and latex.startswith("\\begin{tabular}{ll}")


def test_cli_writes_a_file_and_reports_bad_input(sweep: Path, tmp_path: Path) -> None:
    compare_main([str(sweep), "--format", "csv", "--out", str(tmp_path / "t.csv")])
    assert (tmp_path / "t.csv").read_text().startswith("group,seeds,test/test2016/bleu")
    with pytest.raises(SystemExit, match=r"no group named 'model\.pe=rotary'"):
        compare_main([str(sweep), "--baseline", "model.pe=rotary"])
    with pytest.raises(SystemExit, match="no such run or sweep directory"):
        compare_main([str(tmp_path / "nothing")])


def test_the_baseline_is_its_config_value_and_an_unknown_one_lists_the_groups_quoted(sweep: Path) -> None:
    """`--baseline` takes a group's values as the runs' config.yaml holds them, though the Markdown table
    shows `|`, `<` and `\\` escaped; an unknown one lists the groups each quoted as one shell word (on one
    line: they were joined by commas, which the names hold too) and suggests the one the escaped form
    meant."""
    value = "a|b\\c<d e"
    for seed in (1, 2, 3):
        path = sweep / f"pe=none,seed={seed}" / "config.yaml"
        path.write_text(path.read_text().replace("pe: none", f"pe: {json.dumps(value)}"))
    text = report([sweep], baseline=f"model.pe={value}")
    assert text.splitlines()[2].startswith("| model.pe=a\\|b\\\\c\\<d e | 3 |")  # the baseline first
    with pytest.raises(SystemExit) as refused:
        compare_main([str(sweep), "--baseline", "model.pe=a\\|b\\\\c\\<d e"])  # as the table shows it
    told = str(refused.value)
    assert told == (
        "attnlab-compare: no group named 'model.pe=a\\|b\\\\c\\<d e': did you mean 'model.pe=a|b\\c<d e'? "
        "give one of 'model.pe=a|b\\c<d e', 'model.pe=sinusoidal' (its config values as in the runs' "
        "config.yaml, not as the Markdown table escapes them)"
    )
    path.write_text(path.read_text().replace(json.dumps(value), json.dumps("it's\nnew")))
    with pytest.raises(
        SystemExit, match=r"""give one of 'model\.pe=a\|b\\c<d e', 'model\.pe="it'\\''s\\nnew"'"""
    ):
        compare_main([str(sweep), "--baseline", "model.pe=rotary"])  # (YAML's one-line "\n" for a break)
    assert shell_word("it's\nnew") == "$'it\\'s\\U0000000anew'"  # a word holding a line break


@pytest.mark.parametrize(
    ("df", "expected"), [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (30, 2.0423)]
)
def test_t_quantiles_match_the_tables(df: int, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)


def closed_form_t_quantile(p: float, df: int) -> float:
    """Student's t quantile where it has a closed form: df=1 (Cauchy), df=2 and df=4 (Shaw 2006)."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    alpha = 4 * p * (1 - p)
    if df == 2:
        return (2 * p - 1) / math.sqrt(alpha / 2)
    q = math.cos(math.acos(math.sqrt(alpha)) / 3) / math.sqrt(alpha)
    return math.copysign(2 * math.sqrt(q - 1), p - 0.5)


@pytest.mark.parametrize("df", [1, 2, 4])
@pytest.mark.parametrize("p", [0.0005, 0.025, 0.2, 0.5, 0.9, 0.975, 0.9995])
def test_t_quantiles_of_either_tail_match_the_closed_forms(p: float, df: int) -> None:
    # abs: the CDF goes through x = df / (df + t^2), which rounds to 1 for |t| below about 1e-8
    assert t_quantile(p, df) == pytest.approx(closed_form_t_quantile(p, df), rel=1e-6, abs=1e-7)


def test_a_t_quantile_without_degrees_of_freedom_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("df=0 must be >= 1")):
        t_quantile(0.975, 0)


def test_each_seed_is_tested_against_the_same_seed_baseline_run(sweep: Path) -> None:
    from attnlab.metrics import paired_bootstrap

    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    by_name = {g.name: g for g in groups}
    assert by_name["model.pe=sinusoidal"].p_values == {}
    tested = by_name["model.pe=none"].p_values["test2016"]
    assert [seed for seed, _ in tested] == [1, 2, 3]
    for seed, p in tested:
        assert p == paired_bootstrap(hypotheses("sinusoidal", seed), hypotheses("none", seed), REFS).p_value
    assert "seed 1: " in report([sweep], baseline="model.pe=sinusoidal")


def test_the_paired_test_scores_with_the_runs_bleu_tokenizer(sweep: Path) -> None:
    """Runs scored with the `char` tokenizer are tested with it; against a baseline scored with another
    one there is no paired test (BLEU of two tokenizers), where 13a's was computed before."""
    from attnlab.metrics import paired_bootstrap

    def score_with(pe: str, tokenizer: str) -> None:
        for run in sweep.glob(f"pe={pe},*"):
            results = json.loads((run / "results.json").read_text())
            results["scoring"] = {"bleu_tokenize": tokenizer}
            (run / "results.json").write_text(json.dumps(results))

    score_with("none", "char")
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    none = {g.name: g for g in groups}["model.pe=none"]
    assert none.p_values == {}
    assert "test/test2016/bleu" not in none.delta and "test/test2016/chrf" in none.delta  # BLEU: other scales
    score_with("sinusoidal", "char")
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    tested = {g.name: g for g in groups}["model.pe=none"].p_values["test2016"]
    for seed, p in tested:
        base, system = hypotheses("sinusoidal", seed), hypotheses("none", seed)
        assert p == paired_bootstrap(base, system, REFS, tokenize="char").p_value


def test_a_baseline_with_other_references_is_named_not_paired(
    sweep: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Baseline runs that saved other references for a test set (other sentences) have no paired test
    with the runs of their seeds (the p-value of a seed was left out without a word), and the scores of
    that set no Δ (a difference of BLEU on other sentences was shown as the change the setting made)."""
    for base in sweep.glob("pe=sinusoidal,*"):
        references = base / "references" / "test2016.txt"
        references.write_text(references.read_text().replace("a man", "a woman", 1))
    with caplog.at_level("WARNING", logger="attnlab.reports.compare"):
        groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    none = {g.name: g for g in groups}["model.pe=none"]
    assert none.p_values == {} and sorted(none.delta) == ["params", "train_minutes", "val/ppl"]
    (run,) = sweep.glob("pe=none,seed=2*")
    base = sweep / "pe=sinusoidal,seed=2"
    assert (
        f"no paired test of {run} against {base} on test2016: they saved different references (other "
        "sentences)" in caplog.text
    )
    told = "no Δ of group model.pe=none against the baseline model.pe=sinusoidal for test/test2016/bleu ("
    assert told in caplog.text and "test/test2016/chrf (" in caplog.text


@pytest.mark.parametrize("unlike", ["tokenizer", "references"])
def test_a_group_whose_runs_scored_a_test_set_unlike_is_refused(sweep: Path, unlike: str) -> None:
    """Runs of one group scored with other BLEU tokenizers (one rescored with `char`) or on other references
    were averaged into one mean, shown as the group's BLEU; the comparison is refused naming both runs."""
    run = sweep / "pe=none,seed=2"
    if unlike == "tokenizer":
        results = json.loads((run / "results.json").read_text())
        (run / "results.json").write_text(json.dumps({**results, "scoring": {"bleu_tokenize": "char"}}))
        scored = "BLEU tokenizer 13a, references sha256 ", "BLEU tokenizer char, references sha256 "
    else:
        for sub in ("references", "hypotheses"):
            (run / sub / "test2016.txt").write_text(
                (run / sub / "test2016.txt").read_text().replace("man", "dog")
            )
        digest = hashlib.sha256("\n".join(REFS).encode()).hexdigest()[:12]  # of the other runs' references
        scored = f"BLEU tokenizer 13a, references sha256 {digest}", "BLEU tokenizer 13a, references sha256 "
    with pytest.raises(SystemExit) as refused:
        compare_main([str(sweep)])
    told = str(refused.value)
    assert told.startswith(
        "attnlab-compare: the runs of group model.pe=none scored test/test2016/bleu unlike ("
    )
    assert f"{sweep / 'pe=none,seed=1'}: {scored[0]}" in told and f"{run}: {scored[1]}" in told
    assert told.endswith("Compare runs scored with one BLEU tokenizer on the same references, giving the "
                         "others in another command")  # fmt: skip


def test_a_carriage_return_inside_a_saved_line_is_no_line_end(sweep: Path) -> None:
    """Saved hypotheses and references are split at "\\n" only, as written: a lone "\\r" kept from the
    data inside a reference made the by-length table count one reference more than hypotheses."""
    from attnlab.reports.compare import by_length

    for run in sweep.glob("pe=*,seed=*"):
        for sub in ("references", "hypotheses"):
            path = run / sub / "test2016.txt"
            if path.is_file():
                path.write_bytes(path.read_bytes().replace(b"a man in shirt", b"a man\rin shirt", 1))
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    (table,) = by_length(groups)
    assert sum(table.sentences) == len(REFS)
    assert len({g.name: g for g in groups}["model.pe=none"].p_values["test2016"]) == 3


def test_plots_show_groups_with_intervals_curves_and_parameters(sweep: Path, tmp_path: Path) -> None:
    from PIL import Image

    from attnlab.reports.plots import validation_curve

    runs = load_runs([sweep])
    none = next(r for r in runs if r.path.name == "pe=none,seed=1")
    assert validation_curve(none, "val/loss") == {0: 5.0, 1: 4.0, 2: 3.0}
    assert validation_curve(none, "val/bleu") == {}
    out = tmp_path / "plots"
    compare_main([str(sweep), "--plots", str(out), "--out", str(tmp_path / "t")])
    names = sorted(p.name for p in out.iterdir())
    expected = [
        "test_test2016_bleu_by_group.png",
        "test_test2016_bleu_vs_params.png",
        "validation_curves.png",
    ]
    assert names == expected
    for name in names:
        with Image.open(out / name) as image:
            assert image.format == "PNG" and image.size[0] >= 600
            assert len(image.convert("L").getcolors(maxcolors=10**6)) > 10  # drawn, not blank
    assert "validation_curves.png" in report([sweep], plots=tmp_path / "again")


def test_without_a_baseline_the_first_group_is_it(sweep: Path) -> None:
    groups, _ = summarize(load_runs([sweep]))
    assert [g.name for g in groups] == ["model.pe=none", "model.pe=sinusoidal"]  # in the order found
    assert groups[0].delta["test/test2016/bleu"] == 0.0
    assert groups[1].delta["test/test2016/bleu"] == pytest.approx(32.0 - 22.0)
    assert report([sweep]).splitlines()[2].startswith("| model.pe=none | 3 |")


def test_tokens_per_second_and_the_test_metrics_of_data_without_text_are_columns(sweep: Path) -> None:
    """Runs whose results hold test metrics but no decoded sets (data without text) get those metrics as
    columns; tokens/s is a column whenever the runs logged it."""
    for run in sweep.iterdir():
        if (run / "results.json").is_file():
            seed = int(run.name.split("seed=")[1])
            metrics = {
                "test/loss": 1.0 + seed,
                "test/exact_match": 0.5,
                "train/tokens_per_sec_epoch": 1000.0 * seed,
            }
            (run / "results.json").write_text(json.dumps({"sets": {}, "metrics": metrics}))
    header = report([sweep]).splitlines()[0]
    assert "test/exact_match" in header and "test/loss" in header and "train/tokens_per_sec_epoch" in header
    assert "| model.pe=none | 3 | 0.50 ± 0.00 [±0.00] | +0.00 | 3.00 ± 1.00" in report([sweep])


def test_validation_curves_plot_bleu_when_the_runs_logged_it(sweep: Path) -> None:
    from attnlab.reports.plots import _validation_curves

    for run in sweep.iterdir():
        seed = int(run.name.split("seed=")[1])
        rows = "".join(f",{10 * (e + 1)},{e},{4.0 - e},{20.0 + seed + e}\n" for e in range(2))
        (run / "csv" / "metrics.csv").write_text(
            f"params/total,step,epoch,val/loss,val/bleu\n1234.0,0,,,\n{rows}"
        )
    import matplotlib.pyplot as plt

    groups, _ = summarize(load_runs([sweep]))
    figure = _validation_curves(groups)
    axes = figure.axes[0]
    assert axes.get_ylabel() == "val/bleu"
    assert list(axes.lines[0].get_ydata()) == [22.0, 23.0]  # group model.pe=none: seeds 1-3, mean per epoch
    plt.close(figure)


def test_ter_is_a_column_when_the_runs_scored_it(sweep: Path) -> None:
    for run in sweep.iterdir():
        results_file = run / "results.json"
        if results_file.is_file():
            results = json.loads(results_file.read_text())
            seed = yaml.safe_load((run / "config.yaml").read_text())["seed"]
            results["sets"]["test2016"]["ter"] = 40.0 + seed
            results_file.write_text(json.dumps(results))
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    assert groups[1].stats["test/test2016/ter"].mean == pytest.approx(42.0)
    header = report([sweep]).splitlines()[0]
    assert "| test/test2016/ter | Δ test/test2016/ter |" in header


def source_lines() -> list[str]:
    """Sources of `REFS` whose word counts cycle through every length bucket at its edges: 9, 10, 20, 39,
    40 words (compare-mt's buckets: a sentence of 10 words is in 10-19, one of 40 in 40+)."""
    return [" ".join(["wort"] * (9, 10, 20, 39, 40)[i % 5]) for i in range(len(REFS))]


def test_bleu_by_length_scores_each_source_length_bucket_over_seeds(sweep: Path, tmp_path: Path) -> None:
    from PIL import Image

    from attnlab.metrics import corpus_bleu
    from attnlab.reports.compare import by_length
    from attnlab.reports.stats import stat

    sources = source_lines()
    for run in sweep.iterdir():
        if (run / "references").is_dir():
            (run / "sources").mkdir()
            (run / "sources" / "test2016.txt").write_text("".join(f"{line}\n" for line in sources))
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    (table,) = by_length(groups)
    assert (table.test_set, table.by) == ("test2016", "source")
    assert table.labels == ["<10", "10-19", "20-29", "30-39", "40+"] and table.sentences == [12] * 5
    for pe in ("sinusoidal", "none"):
        for k in range(5):
            rows = [i for i in range(len(REFS)) if i % 5 == k]
            scores = [corpus_bleu([hypotheses(pe, s)[i] for i in rows], [REFS[i] for i in rows]).score
                      for s in (1, 2, 3)]  # fmt: skip
            got = table.groups[f"model.pe={pe}"][k]
            assert got is not None and got.mean == pytest.approx(stat(scores).mean)
            assert got.half_width == pytest.approx(stat(scores).half_width)
    bucketed = table.groups["model.pe=sinusoidal"]
    assert len({round(s.mean, 6) for s in bucketed if s}) > 1  # the buckets hold different sentences

    text = report([sweep], baseline="model.pe=sinusoidal", lengths=True, plots=tmp_path / "plots")
    assert "BLEU on test2016 by source length (words):" in text and "| 40+ (n=12) |" in text
    with Image.open(tmp_path / "plots" / "bleu_by_length_test2016.png") as image:
        assert image.format == "PNG" and len(image.convert("L").getcolors(maxcolors=10**6)) > 10
    assert "by source length" not in report([sweep])  # only when asked

    for run in sweep.glob("pe=none,*"):  # runs scored with another BLEU tokenizer: their buckets too
        results = json.loads((run / "results.json").read_text())
        (run / "results.json").write_text(json.dumps({**results, "scoring": {"bleu_tokenize": "char"}}))
    (table,) = by_length(summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")[0])
    rows = [i for i in range(len(REFS)) if i % 5 == 0]
    refs = [REFS[i] for i in rows]
    chars = [
        corpus_bleu([hypotheses("none", s)[i] for i in rows], refs, tokenize="char").score for s in (1, 2, 3)
    ]
    assert table.groups["model.pe=none"][0].mean == pytest.approx(stat(chars).mean)

    for run in sweep.iterdir():  # runs written before sources were saved: bucketed by reference words
        if (run / "sources").is_dir():
            (run / "sources" / "test2016.txt").unlink()
    (table,) = by_length(summarize(load_runs([sweep]))[0])
    assert table.by == "reference" and table.sentences == [0, 60, 0, 0, 0]  # every reference has 14 words
    assert table.groups["model.pe=none"][0] is None


def test_bleu_by_length_refuses_runs_of_other_sentences(sweep: Path) -> None:
    from attnlab.reports.compare import by_length

    others = [sweep / f"pe=none,seed={seed}" / "references" / "test2016.txt" for seed in (1, 2, 3)]
    for other in others:  # a group of runs scored on other sentences (within a group: `_check_scored_alike`)
        other.write_text("".join(f"{line} !\n" for line in REFS))
    with pytest.raises(ValueError, match="the runs scored different 'test2016' sentences"):
        by_length(summarize(load_runs([sweep]))[0])
    with pytest.raises(SystemExit, match="attnlab-compare: the runs scored different"):
        compare_main([str(sweep), "--by-length"])
    for other in others[1:]:
        other.write_text("".join(f"{line}\n" for line in REFS))
    other = others[0]
    other.unlink()  # a run whose references are gone: named, not taken for other sentences
    for by_length_too in (True, False):  # (the paired test left its seed out without a word)
        listed = report([sweep], lengths=by_length_too).split("Unreadable, not compared:\n")[1]
        assert re.search(rf"{re.escape(str(other))} is missing \(the run has hypotheses", listed), listed


@pytest.mark.parametrize(
    "scoring", [{"bleu_tokenize": "flores101"}, {"bleu_tokenize": "13a", "x": 1}, "13a", [1], None]
)
def test_a_results_file_cannot_choose_a_bleu_tokenizer_outside_the_offline_list(
    sweep: Path, scoring: object
) -> None:
    """`flores101` would download a model at first use: a results file is input, not a choice of code. Its
    run is unreadable, named with the file, and the others are compared (a damaged `scoring` of one run
    stopped the whole comparison, when a paired test or a length table came to read it)."""
    path = sweep / "pe=none,seed=1" / "results.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "scoring": scoring}))
    for lengths in (False, True):
        text = report([sweep], baseline="model.pe=sinusoidal", lengths=lengths)
        assert "| model.pe=none | 2 |" in text and "seed 2: " in text
        unreadable = text.split("Unreadable, not compared:\n")[1]
        assert unreadable.startswith(f"- {path.parent} (cannot read {path}: its 'scoring' "), unreadable
        assert isinstance(scoring, dict) or 'not an object such as {"bleu_tokenize": "13a"}' in unreadable


def test_a_run_reached_twice_is_one_run(sweep: Path, tmp_path: Path) -> None:
    """The same directory given twice, or through a symbolic link, is one run: counted twice, it doubled a
    group's seeds and narrowed its interval."""
    run = sweep / "pe=none,seed=1"
    (tmp_path / "link").symlink_to(sweep)
    runs = load_runs([sweep, f"{run}/", tmp_path / "link"])
    assert [r.path for r in runs] == [r.path for r in load_runs([sweep])]
    assert "| model.pe=none | 3 |" in report([sweep, tmp_path / "link"], baseline="model.pe=sinusoidal")
    chosen = tmp_path / "chosen"  # two links to one run in one folder: the run as the first in order
    chosen.mkdir()
    for name in ("a", "b", "c"):  # (the filesystem may list them in another order: ext4 lists b first)
        (chosen / name).symlink_to(run)
    assert [r.path for r in load_runs([chosen])] == [chosen / "a"]


def test_runs_linked_below_a_directory_are_compared(sweep: Path, tmp_path: Path) -> None:
    """A folder of symbolic links to chosen runs held "no run directories", and a run linked into a sweep was
    left out without a word (the search did not follow links): both are compared; a link loop ends, and
    --out through a link into a compared run is refused."""
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    for name in ("pe=none,seed=1", "pe=none,seed=2", "pe=sinusoidal,seed=1", "pe=sinusoidal,seed=2"):
        (chosen / name).symlink_to(sweep / name)
    (chosen / "loop").symlink_to(chosen)
    text = report([chosen], baseline="model.pe=sinusoidal")
    assert "| model.pe=none | 2 | 20.50 ± 0.71" in text and "| model.pe=sinusoidal | 2 | 31.00 ± 1.41" in text
    extra = tmp_path / "extra" / "pe=none,seed=4"
    write_run(extra, "none", 4, 30.0)
    (sweep / "linked").symlink_to(extra)
    assert "| model.pe=none | 4 | 24.00 ± 4.55" in report([sweep], baseline="model.pe=sinusoidal")
    with pytest.raises(SystemExit, match=r"--out .*chosen/pe=none,seed=1/results.json is inside the run"):
        compare_main([str(chosen), "--out", str(chosen / "pe=none,seed=1" / "results.json")])
    plots = tmp_path / "plots"  # --out a directory (the sweep's): said so before plots are written
    with pytest.raises(
        SystemExit, match=rf"--out {chosen} is a directory: name the file .* --out {chosen}/table"
    ):
        compare_main([str(chosen), "--out", str(chosen), "--plots", str(plots)])
    assert not plots.exists()


def test_a_link_to_a_directory_above_is_not_followed(
    sweep: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A symbolic link in a sweep to a directory above it (`..`) took the runs of every other sweep there
    into the comparison without a word; it is named in a warning and not followed."""
    write_run(tmp_path / "other" / "pe=rotary,seed=1", "rotary", 1, 50.0)
    (sweep / "up").symlink_to(tmp_path)
    with caplog.at_level("WARNING", logger="attnlab.reports.compare"):
        text = report([sweep], baseline="model.pe=sinusoidal")
    assert "rotary" not in text and "| model.pe=none | 3 |" in text
    assert f"{sweep / 'up'} is a symbolic link to {tmp_path}, which holds it: not followed" in caplog.text


def test_runs_sharing_a_seed_are_named_and_not_paired_ambiguously(
    sweep: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two baseline runs of seed 1: a warning names both, and seed 1 of the other group has no paired test
    (it paired with whichever came last)."""
    import shutil

    shutil.copytree(sweep / "pe=sinusoidal,seed=1", sweep / "again" / "pe=sinusoidal,seed=1")
    with caplog.at_level("WARNING"):
        groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    assert "group model.pe=sinusoidal has 2 runs of seed 1" in caplog.text
    assert str(sweep / "again" / "pe=sinusoidal,seed=1") in caplog.text
    tested = {g.name: g for g in groups}["model.pe=none"].p_values["test2016"]
    assert [seed for seed, _ in tested] == [2, 3]


def test_seeds_without_a_baseline_run_are_named_not_dropped_silently(
    sweep: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Seeds of a group that the baseline has no run of get no paired test: a warning names them (with no
    seed in common the p column vanished without a word)."""
    import shutil

    with caplog.at_level("WARNING"):
        summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    assert "no paired test" not in caplog.text  # every seed pairs
    shutil.rmtree(sweep / "pe=sinusoidal,seed=3")
    caplog.clear()
    with caplog.at_level("WARNING"):
        groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    assert [seed for seed, _ in {g.name: g for g in groups}["model.pe=none"].p_values["test2016"]] == [1, 2]
    named = "no paired test for seed 3 of group model.pe=none: the baseline group model.pe=sinusoidal has"
    assert f"{named} no run of that seed" in caplog.text


def test_unpaired_seeds_are_named_in_numeric_order(sweep: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The seeds a warning names without a baseline run are in numeric order: 2, 3, 10 (as text: 10, 2, 3)."""
    import shutil

    config = sweep / "pe=none,seed=1" / "config.yaml"
    config.write_text(config.read_text().replace("seed: 1\n", "seed: 10\n"))
    for seed in (2, 3):
        shutil.rmtree(sweep / f"pe=sinusoidal,seed={seed}")
    with caplog.at_level("WARNING"):
        summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    assert "no paired test for seed 2, 3, 10 of group model.pe=none" in caplog.text, caplog.text


def test_a_seed_written_as_text_is_the_number_it_seeds(sweep: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A seed written as the text '1' in a baseline run's config.yaml (Lightning seeds with `int(seed)`: 1)
    and as 1 in another run's was another seed: that run had no paired test, with a warning of "no paired
    test for seed 1" though the baseline has a run of seed 1, and two runs of seed '2' and 2 in one group
    were not named as one seed's."""
    import shutil

    path = sweep / "pe=sinusoidal,seed=1" / "config.yaml"
    path.write_text(path.read_text().replace("seed: 1", "seed: '1'"))
    shutil.copytree(sweep / "pe=sinusoidal,seed=2", sweep / "again" / "pe=sinusoidal,seed=2")
    path = sweep / "again" / "pe=sinusoidal,seed=2" / "config.yaml"
    path.write_text(path.read_text().replace("seed: 2", "seed: '2'"))
    with caplog.at_level("WARNING"):
        groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    assert [seed for seed, _ in {g.name: g for g in groups}["model.pe=none"].p_values["test2016"]] == [1, 3]
    assert "no paired test for seed" not in caplog.text
    assert "group model.pe=sinusoidal has 2 runs of seed 2" in caplog.text


def test_a_running_run_whose_process_died_is_listed_as_stopped(sweep: Path) -> None:
    """A run's manifest says `running` until its process writes how it ended; a process killed with
    SIGKILL never does. Its run directory's lock still names it: a dead process there is shown as such."""
    run = sweep / "pe=learned,seed=2"
    holding = (
        "import sys, time\nfrom attnlab.io import FileLock\n"
        f"FileLock({str(run / '.lock')!r}, record_holder=True).acquire()\nprint('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", holding], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline() == "held\n"
        assert "pe=learned,seed=2 (running)" in report([sweep])  # alive
    finally:
        process.kill()
        process.wait()
    stopped = f"pe=learned,seed=2 (stopped: its process (pid {process.pid}) is gone: killed or crashed; "
    assert f"{stopped}no last.ckpt)" in report([sweep])  # nothing saved to continue from
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    assert f"{stopped}resume=true in its directory goes on)" in report([sweep])
    (run / ".lock").write_text(f"{process.pid} another-host\n")  # another machine's process: not known here
    assert "pe=learned,seed=2 (running)" in report([sweep])


def test_the_first_path_given_holds_the_default_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs come in the order of the paths given (each path's sorted), relative and absolute alike: the
    first group of the first path is the baseline (sorted all together, `/abs/...` came before `z/...`)."""
    for (pe, seed), bleu in BLEU.items():
        write_run(tmp_path / ("z" if pe == "none" else "a") / f"seed={seed}", pe, seed, bleu)
    monkeypatch.chdir(tmp_path)
    for paths in (["z", tmp_path / "a"], [tmp_path / "z", "a"]):
        rows = [line for line in report(paths).splitlines() if line.startswith("| model.pe=")]
        assert [row.split(" |")[0] for row in rows] == ["| model.pe=none", "| model.pe=sinusoidal"], paths
        assert "| 22.00 ± 2.65 [±6.57] | +0.00 |" in rows[0] and "| +10.00 |" in rows[1]  # Δ vs the first


def test_a_diverged_run_shows_its_nan_and_a_number_past_float_is_unreadable(
    sweep: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = sweep / "pe=none,seed=1" / "results.json"
    results = json.loads(path.read_text())
    results["metrics"].update({"val/ppl": float("nan"), "train/grad_norm_epoch": float("inf")})
    path.write_text(json.dumps(results))
    text = report([sweep], baseline="model.pe=sinusoidal")
    row = next(line for line in text.splitlines() if line.startswith("| model.pe=none"))
    assert "| nan | +nan |" in row  # val/ppl over the seeds: NaN, no interval, and its difference
    big = float("1.5e308")
    path.write_text(json.dumps({**results, "metrics": {"a": int(big), "val/ppl": 10**400}}))
    with caplog.at_level("WARNING"):
        text = report([sweep], baseline="model.pe=sinusoidal")
    assert "| model.pe=none | 2 |" in text and "Unreadable, not compared:" in text
    assert f"cannot read {path}: its 'val/ppl' is past float's range" in text
    path.write_text(json.dumps({**results, "sets": {"test2016": {"bleu": 10**400, "chrf": 1.0}}}))
    assert f"cannot read {path}: its 'test2016' bleu is past float's range" in report([sweep])


def test_csv_and_latex_name_the_runs_not_in_the_table(
    sweep: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING"):
        text = report([sweep], fmt="csv")
    assert "learned" not in text  # the table alone
    told = "not finished, not in the table: "
    assert re.search(told + r"\S*pe=learned,seed=1 \(failed: RuntimeError", caplog.text)
    assert re.search(told + r"\S*pe=learned,seed=2 \(running\)", caplog.text)
    printed = subprocess.run([sys.executable, "-m", "attnlab.cli.compare", str(sweep), "--format", "latex"],
                             capture_output=True, text=True, check=True)  # fmt: skip
    assert "learned" not in printed.stdout and re.search(told + r"\S*pe=learned,seed=2", printed.stderr)
    for fmt in ("csv", "latex"):
        with pytest.raises(SystemExit, match=r"no finished runs to tabulate under .*seed=1 \(failed\)"):
            compare_main([str(sweep / "pe=learned,seed=1"), "--format", fmt])
    assert report([sweep / "pe=learned,seed=1"]).startswith("no finished runs")  # Markdown: the list


def test_the_runs_not_in_a_csv_table_are_named_on_one_line_each(
    sweep: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A manifest's error (or a directory's name) holding a line break was written across two lines on
    stderr, the second one free to pass for a message of its own."""
    run = sweep / "pe=learned,seed=1"
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "error": "boom\nattnlab-compare: forged"}))
    with caplog.at_level("WARNING"):
        report([sweep], fmt="csv")
    told = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not finished")]
    assert f"not finished, not in the table: {run} (failed: boom attnlab-compare: forged)" in told


def test_latex_escapes_every_special_character_and_csv_length_tables_have_titles(sweep: Path) -> None:
    latex = render([["group #1", "Δ x"], ["a$b{c}~d^e<f>g\\h_i%j&k", "1 ± 2"]], "latex")
    assert "group \\#1 & $\\Delta$ x \\\\ \\hline" in latex
    assert (
        "a\\$b\\{c\\}\\textasciitilde{}d\\textasciicircum{}e\\textless{}f\\textgreater{}g\\textbackslash{}h"
        "\\_i\\%j\\&k & 1 $\\pm$ 2 \\\\" in latex
    )
    csv_text = report([sweep], fmt="csv", lengths=True)
    assert "\nBLEU on test2016 by reference length (words)\ngroup,<10 (n=0)" in csv_text
    assert "\n% BLEU on test2016 by reference length (words)\n\\begin{tabular}" in report(
        [sweep], fmt="latex", lengths=True
    )


def test_damaged_saved_lines_leave_their_run_out_naming_the_file(sweep: Path) -> None:
    """A hypotheses or sources file whose line count is not the references', that is not UTF-8, or
    hypotheses without their references, make that run unreadable, naming the file, and the others are
    compared (one damaged run stopped the whole comparison; before that, the by-length table scored half the
    set with half the sources and the paired test failed without naming a file); a last line without its
    newline is a line (it was dropped)."""
    from attnlab.reports.compare import by_length

    run = sweep / "pe=none,seed=2"
    hyps = run / "hypotheses" / "test2016.txt"
    hyps.write_text(hyps.read_text().rstrip("\n"))  # no final newline: still 60 lines
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    assert len({g.name: g for g in groups}["model.pe=none"].p_values["test2016"]) == 3
    assert sum(by_length(groups)[0].sentences) == 60
    sources = sweep / "pe=sinusoidal,seed=1" / "sources" / "test2016.txt"  # the first run's, bucketed by
    sources.parent.mkdir()
    sources.write_text("".join(f"{line}\n" for line in source_lines()))
    assert "Unreadable" not in report([sweep], lengths=True)
    damaged = [
        (hyps, "".join(f"{line}\n" for line in hypotheses("none", 2)[:-1]).encode(),
         rf"do not match: {re.escape(str(hyps))} has 59 lines, .* has 60 lines"),
        (hyps, b"\xff\n" * 60, rf"cannot read {re.escape(str(hyps))}: not UTF-8"),
        (run / "references" / "test2016.txt", None, r"test2016\.txt is missing \(the run has hypotheses"),
        (sources, "".join(f"{line}\n" for line in source_lines()[:30]).encode(),
         rf"{re.escape(str(sources))} has 30 lines"),
    ]  # fmt: skip
    for path, content, message in damaged:
        kept = path.read_bytes()
        path.unlink() if content is None else path.write_bytes(content)
        table = report([sweep], baseline="model.pe=none", lengths=True)
        listed = table.split("Unreadable, not compared:\n")[1]
        assert re.search(message, listed) and listed.count("\n- ") == 0, listed
        assert path.parent.parent.name in listed and "BLEU on test2016 by" in table
        path.write_bytes(kept)
    assert "Unreadable" not in report([sweep], lengths=True)


def test_emptied_hypotheses_and_references_leave_their_runs_out_naming_the_files(sweep: Path) -> None:
    """Saved hypotheses and references of a test set that hold no lines (emptied files: no run decodes a
    set without sentences) make their run unreadable, naming both files, and the others are compared: two
    such runs of one seed failed the paired bootstrap ("empty corpus"), and one such run the by-length
    table ("different sentences"), stopping the whole comparison."""
    emptied = [sweep / "pe=none,seed=2", sweep / "pe=sinusoidal,seed=2"]
    for run in emptied:
        for sub in ("hypotheses", "references"):
            (run / sub / "test2016.txt").write_bytes(b"")
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    assert [seed for seed, _ in {g.name: g for g in groups}["model.pe=none"].p_values["test2016"]] == [1, 3]
    table = report([sweep], baseline="model.pe=sinusoidal", lengths=True)
    listed = table.split("Unreadable, not compared:\n")[1]
    for run in emptied:
        files = (
            f"{run / 'hypotheses' / 'test2016.txt'} and {run / 'references' / 'test2016.txt'} hold no lines"
        )
        assert f"- {run} ({files}" in listed, listed
    assert "BLEU on test2016 by" in table and "seed 1: " in table and "seed 2: " not in table


def test_an_epoch_that_is_no_epoch_number_is_refused_naming_the_file(sweep: Path, tmp_path: Path) -> None:
    metrics = sweep / "pe=none,seed=3" / "csv" / "metrics.csv"
    for epoch in ("inf", "nan", "1.5", "-1.0"):
        metrics.write_text(f"params/total,step,epoch,val/loss\n1234.0,0,,\n,10,{epoch},4.0\n")
        with pytest.raises(SystemExit, match=rf"cannot read {re.escape(str(metrics))}: epoch {epoch} is no"):
            compare_main([str(sweep), "--plots", str(tmp_path / "plots")])


def test_a_length_plot_that_cannot_be_written_leaves_the_other_plots(sweep: Path, tmp_path: Path) -> None:
    """With --by-length the length plots are written together with the others: a length plot that cannot
    be written (a directory in its place) leaves every plot as it was (they were two writes)."""
    compare_main([str(sweep), "--by-length", "--plots", str(tmp_path / "fresh")])
    written = sorted(p.name for p in (tmp_path / "fresh").iterdir())
    blocked = "bleu_by_length_test2016.png"
    assert blocked in written and len(written) == 4
    plots = tmp_path / "plots"
    plots.mkdir()
    for name in written:
        (plots / name).write_bytes(b"old") if name != blocked else (plots / name).mkdir()
    with pytest.raises(SystemExit, match=rf"cannot write plot .*{blocked}"):
        compare_main([str(sweep), "--by-length", "--plots", str(plots)])
    assert all((plots / name).read_bytes() == b"old" for name in written if name != blocked)


def test_a_plot_directory_that_is_a_file_is_named_with_the_fix(sweep: Path, tmp_path: Path) -> None:
    """`--plots` naming a file (or a path below one) ended in `[Errno 17] File exists: 'p'`; it is kept."""
    (tmp_path / "p").write_text("mine")
    for plots in (tmp_path / "p", tmp_path / "p" / "sub"):
        with pytest.raises(SystemExit) as refused:
            compare_main([str(sweep), "--plots", str(plots)])
        assert str(refused.value).startswith(f"attnlab-compare: cannot make the plot directory {plots}: ")
        assert str(refused.value).endswith("; choose another --plots directory")
    assert (tmp_path / "p").read_text() == "mine"


def test_run_files_an_editor_saved_with_a_byte_order_mark_are_read(sweep: Path) -> None:
    """A results.json or manifest.json saved with a UTF-8 byte-order mark (Notepad) left its run out
    ("Unexpected UTF-8 BOM"), and one on csv/metrics.csv (a spreadsheet) hid its parameter count."""
    run = sweep / "pe=none,seed=1"
    for name in ("results.json", "manifest.json", "csv/metrics.csv"):
        (run / name).write_bytes(b"\xef\xbb\xbf" + (run / name).read_bytes())
    groups, others = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    none = {g.name: g for g in groups}["model.pe=none"]
    assert len(none.runs) == 3 and none.stats["params"].n == 3 and none.stats["train_minutes"].n == 3
    assert sorted(r.status for r in others) == ["failed", "running"]


def test_saved_lines_an_editor_saved_with_a_byte_order_mark_are_read_past_it(sweep: Path) -> None:
    """A byte-order mark an editor saved before a run's hypotheses or references stayed in the first line:
    the first hypothesis was scored changed in paired tests and by-length tables, and the references were
    taken for other sentences than the other runs'. A file that is not UTF-8 past the mark names the byte
    counted from the file's start."""
    from attnlab.metrics import corpus_bleu, paired_bootstrap
    from attnlab.reports.compare import by_length
    from attnlab.reports.stats import stat

    for sub in ("hypotheses", "references"):
        for run in ("pe=none,seed=1", "pe=sinusoidal,seed=1"):
            path = sweep / run / sub / "test2016.txt"
            path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    tested = {g.name: g for g in groups}["model.pe=none"].p_values["test2016"]
    for seed, p in tested:
        assert p == paired_bootstrap(hypotheses("sinusoidal", seed), hypotheses("none", seed), REFS).p_value
    (table,) = by_length(groups)  # (by reference words: every reference has 14)
    scores = [corpus_bleu(hypotheses("none", seed), REFS).score for seed in (1, 2, 3)]
    assert table.groups["model.pe=none"][1].mean == pytest.approx(stat(scores).mean, rel=1e-12)
    hyps = sweep / "pe=none,seed=1" / "hypotheses" / "test2016.txt"
    hyps.write_bytes(b"\xef\xbb\xbf" + b"\xff\n" * 60)
    listed = report([sweep]).split("Unreadable, not compared:\n")[1]
    assert f"cannot read {hyps}: not UTF-8 text (invalid start byte at byte 3); restore" in listed, listed


def test_a_seed_that_is_a_list_leaves_its_run_out_naming_the_file(sweep: Path) -> None:
    """A config.yaml whose seed was edited into a list ended the comparison in a traceback (unhashable
    'list', grouping the runs by seed); the run is unreadable, named, and the others are compared."""
    path = sweep / "pe=none,seed=1" / "config.yaml"
    path.write_text(path.read_text().replace("seed: 1", "seed: [1, 2]"))
    text = report([sweep], baseline="model.pe=sinusoidal")
    assert "| model.pe=none | 2 |" in text and "seed 2: " in text
    told = text.split("Unreadable, not compared:\n")[1].splitlines()[0]
    assert (
        told == f"- {path.parent} (cannot read {path}: its seed [1, 2] is a list, not a number; restore the "
        "file or leave the run out of the comparison)"
    )


def test_a_group_name_holding_dollar_signs_is_plotted_as_text(sweep: Path, tmp_path: Path) -> None:
    """A config value `$\\frac{$` in a group's name was parsed as a matplotlib formula: the comparison ended
    in a ParseException over three lines, and no table was written (`$x^2$` was drawn as x squared)."""
    for seed in (1, 2, 3):
        path = sweep / f"pe=none,seed={seed}" / "config.yaml"
        path.write_text(path.read_text().replace("pe: none", "pe: '$\\frac{$'"))
    compare_main([str(sweep), "--plots", str(tmp_path / "plots"), "--out", str(tmp_path / "t.md")])
    assert "| model.pe=$\\\\frac{$ | 3 |" in (tmp_path / "t.md").read_text()
    assert len(list((tmp_path / "plots").glob("*.png"))) == 3


def test_a_metric_some_runs_lack_says_over_how_many_and_a_finished_run_needs_its_config(sweep: Path) -> None:
    path = sweep / "pe=none,seed=3" / "results.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "metrics": {}}))  # no val/ppl
    text = report([sweep], baseline="model.pe=sinusoidal")
    row = next(line for line in text.splitlines() if line.startswith("| model.pe=none"))
    assert "| model.pe=none | 3 |" in row and "± 0.71 [±6.35] (2 runs) |" in row  # val/ppl of seeds 1, 2
    (sweep / "pe=none,seed=3" / "config.yaml").unlink()  # was a group `model.d_model=None,model.pe=None`
    text = report([sweep], baseline="model.pe=sinusoidal")
    assert "| model.pe=none | 2 |" in text and "Unreadable, not compared:" in text
    assert "a finished run without its config" in text


def test_a_config_with_yaml_aliases_is_an_unreadable_run(sweep: Path) -> None:
    """YAML aliases of aliases expand exponentially: a 500-byte config.yaml of 18 levels (`a1: {p: *a0, q:
    *a0}`, ...) kept attnlab-compare reading it for minutes. attnlab writes no aliases, so a config.yaml
    with one is unreadable, named, without being expanded; the other runs are compared."""
    lines = ["a0: &a0 {x: 1, y: 2}", *(f"a{i}: &a{i} {{p: *a{i - 1}, q: *a{i - 1}}}" for i in range(1, 4))]
    path = sweep / "pe=none,seed=1" / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    text = report([sweep])
    assert f"(cannot read {path}: it holds YAML aliases (*name), which no config.yaml attnlab writes" in text
    not_finished = text.split("Not finished:\n")[1].split("Unreadable, not compared:")[0]
    assert "pe=learned,seed=1" in not_finished and "pe=none,seed=1" not in not_finished  # listed once
    assert "| model.pe=none | 2 |" in text


def test_files_nested_past_the_recursion_limit_are_unreadable_runs(sweep: Path) -> None:
    """A manifest.json, results.json or config.yaml of lists inside lists past Python's recursion limit
    made the parsers raise RecursionError: the comparison stopped with a traceback. Such a run is listed
    as unreadable, naming the file, and the others are compared."""
    nested = {
        "pe=none,seed=1/manifest.json": "[" * 100_000 + "]" * 100_000,
        "pe=none,seed=2/results.json": '{"metrics": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "pe=none,seed=3/config.yaml": "[" * 5_000 + "]" * 5_000,
    }
    for name, text in nested.items():
        (sweep / name).write_text(text)
    text = report([sweep])
    assert "| all | 3 |" in text  # the sinusoidal runs: one group
    for name in nested:
        assert f"(cannot read {sweep / name}: it is nested too deeply (past Python's recursion limit)" in text


def test_config_values_paths_and_errors_are_text_in_the_markdown_and_latex_reports(sweep: Path) -> None:
    """A config value, run directory or error holding `|`, a line break or HTML split the Markdown table's
    cells, started rows and list items of its own, and put raw HTML in the report (and a line break, a
    paragraph inside a LaTeX cell), a Markdown image an <img> fetched from its host: they are text,
    escaped, on one line."""
    hostile = "a|b\n\n| injected | row |\n<img src=x onerror=alert(1)> ![x](https://host/p.png)"
    for seed in (1, 2, 3):
        path = sweep / f"pe=none,seed={seed}" / "config.yaml"
        path.write_text(path.read_text().replace("pe: none", f"pe: {json.dumps(hostile)}"))
    failed = sweep / "pe=learned,seed=1" / "manifest.json"
    failed.write_text(json.dumps({"status": "failed", "error": "boom\n\n# <b>heading</b>"}))
    text = report([sweep], baseline="model.pe=sinusoidal")
    cell = (
        r'model.pe="a\|b\\n\\n\| injected \| row \|\\n\<img src=x onerror=alert(1)> '
        r'![x]\(https://host/p.png)"'
    )
    # (the value as YAML writes it on one line, its line breaks `\n`)
    assert f"\n| {cell} | 3 | 22.00 ± 2.65 [±6.57] | -10.00 |" in text
    assert "(failed: boom  # \\<b>heading\\</b>)\n" in text
    lines = text.splitlines()
    assert sum(line.startswith("|") for line in lines) == 4  # header, rule, two groups: no injected rows
    assert not any(line.startswith(("#", "<")) for line in lines)
    latex = report([sweep], fmt="latex", baseline="model.pe=sinusoidal")
    assert "| injected | row |\\textbackslash{}n\\textless{}img" in latex and "\n\n" not in latex


def test_no_csv_cell_from_a_run_file_is_a_spreadsheet_formula(sweep: Path) -> None:
    """A config key or value of a run starting with `=`, `+`, `-`, `@`, a tab or a carriage return began
    the group's cell of the CSV report (keys sort before `model.pe`), which a spreadsheet runs as a formula:
    such a cell is text (a leading `'`), and the signed differences the table writes stay numbers."""
    import csv
    import io

    hostile = {'=HYPERLINK("http://host/?"&A1)': 1, "@SUM(1)": 2, "+x": 3, "-x": 4, "\tx": 5, "\r=1": 6}
    for (pe, shift), seed in itertools.product((("none", 0), ("sinusoidal", 10)), (1, 2, 3)):
        path = sweep / f"pe={pe},seed={seed}" / "config.yaml"  # (keys of every run: values that vary)
        path.write_text(path.read_text() + yaml.safe_dump({k: v + shift for k, v in hostile.items()}))
    text = report([sweep], fmt="csv", lengths=True)
    rows = [row for row in csv.reader(io.StringIO(text, newline="")) if row]
    cells = [cell for row in rows for cell in row]
    starts = ("=", "+", "-", "@", "\t", "\r")
    assert not [c for c in cells if c.startswith(starts) and not re.fullmatch(r"[+-]\d+(\.\d+)?", c)]
    groups = [row[0] for row in rows if "model.pe=" in row[0]]
    assert len(groups) == 4 and all(name.startswith("'\tx=") for name in groups)  # table and lengths
    assert "+10.00" in rows[2] and "+0" in rows[1]  # Δ BLEU, Δ params: numbers
    assert render([["-10.00", "+0", "-x", "+inf"]], "csv") == "-10.00,+0,'-x,+inf\r\n"
    for cell in hostile:  # each start (the group's name above shows the first key's alone)
        assert next(csv.reader(io.StringIO(render([[cell]], "csv"), newline=""))) == [f"'{cell}"], cell


def test_true_and_false_in_results_are_no_scores(sweep: Path) -> None:
    """JSON `true` passed for the number 1 (Python's bool is an int): a hand-edited `"bleu": true` was a
    BLEU of 1.00 and `"val/ppl": false` a perplexity of 0 in the group's mean. A test set's scores that are
    no numbers make the run unreadable, as text there does; another metric that is none is left out."""
    path = sweep / "pe=none,seed=1" / "results.json"
    results = json.loads(path.read_text())
    path.write_text(json.dumps({**results, "metrics": {"val/ppl": False}}))
    row = next(line for line in report([sweep]).splitlines() if line.startswith("| model.pe=none"))
    assert "| 7.50 ± 0.71 [±6.35] (2 runs) |" in row  # val/ppl of seeds 2 and 3, not a 0 among them
    path.write_text(json.dumps({**results, "sets": {"test2016": {"bleu": True, "chrf": True}}}))
    text = report([sweep])
    assert "| model.pe=none | 2 |" in text and "test set 'test2016' has no numeric 'bleu' and 'chrf'" in text
    path.write_text(json.dumps({**results, "sets": {"test2016": {"bleu": 30.0}}}))  # no chrF
    text = report([sweep])
    assert "| model.pe=none | 2 |" in text and "test set 'test2016' has no numeric 'bleu' and 'chrf'" in text


def test_training_minutes_of_a_resumed_run_leave_out_the_pause_before_its_resumption(sweep: Path) -> None:
    """A run interrupted after 10 minutes and resumed two days later for 20 more minutes trained 30: it
    was shown as 2 days and 20 minutes (start to end). A part killed before recording its end (SIGKILL)
    leaves the time unknown: no number rather than one with the pause in it."""
    path = sweep / "pe=none,seed=1" / "manifest.json"
    day1, day3 = "2026-01-01T00:{}:00+00:00", "2026-01-03T00:{}:00+00:00"
    manifest = {
        "status": "finished", "start_time": day1.format("00"), "end_time": day3.format("20"),
        "resumed": [{"time": day3.format("00"), "previous_end": day1.format("10")}],
    }  # fmt: skip
    path.write_text(json.dumps(manifest))
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    minutes = {g.name: g for g in groups}["model.pe=none"].stats["train_minutes"]
    assert minutes.n == 3 and minutes.mean == pytest.approx(30.0) and minutes.std == pytest.approx(0.0)
    manifest["resumed"][0]["previous_end"] = None  # killed: its end never recorded
    path.write_text(json.dumps(manifest))
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    assert {g.name: g for g in groups}["model.pe=none"].stats["train_minutes"].n == 2


def test_a_run_that_ends_before_it_starts_has_no_training_minutes(sweep: Path) -> None:
    """A manifest whose end precedes its start (edited, or a clock set back) gave the group a negative
    mean of minutes (-175170); its training time is unknown, the group's minutes are those of the others."""
    path = sweep / "pe=none,seed=1" / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "end_time": "2025-01-01T00:30:00+00:00"}))
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    minutes = {g.name: g for g in groups}["model.pe=none"].stats["train_minutes"]
    assert minutes.n == 2 and minutes.mean == pytest.approx(30.0)


def test_group_names_show_config_values_as_yaml_writes_them_and_the_baseline_matches_them(
    sweep: Path,
) -> None:
    """Group names showed config values through Python's str (`True`, `None`), while config.yaml and the
    command line say `true` and `null`: `--baseline model.tie=true` found no group. Every format and
    `--baseline` use the YAML spelling; a text YAML would read as another type stays quoted (`'true'`)."""
    from attnlab.reports.compare import yaml_value

    for pe, tie in (("none", "true"), ("sinusoidal", "null")):
        for seed in (1, 2, 3):
            path = sweep / f"pe={pe},seed={seed}" / "config.yaml"
            path.write_text(path.read_text().replace("  d_model: 32\n", f"  d_model: 32\n  tie: {tie}\n"))
    baseline = "model.pe=none,model.tie=true"
    text = report([sweep], baseline=baseline)
    assert f"\n| {baseline} | 3 |" in text and "\n| model.pe=sinusoidal,model.tie=null | 3 |" in text
    assert "True" not in text and "None" not in text
    for fmt in ("csv", "latex"):
        assert "model.tie=null" in report([sweep], fmt=fmt, baseline=baseline)
    with pytest.raises(SystemExit, match=r"did you mean 'model\.pe=none,model\.tie=true'"):
        compare_main([str(sweep), "--baseline", "model.pe=none,model.tie=True"])
    assert [yaml_value(v) for v in (True, None, "true", "1", 0.1, 1e-5, [1, "a"], "a\nb")] == [
        "true", "null", "'true'", "'1'", "0.1", "1.0e-05", "[1, a]", '"a\\nb"',
    ]  # fmt: skip


def test_a_group_names_values_stay_on_one_line_and_read_back_as_yaml() -> None:
    """A line break inside a list or mapping (YAML folded it onto new lines there) or a Unicode one
    (U+2028, U+0085: YAML wrote it raw, and `str.splitlines` splits there) is escaped too: a group's name
    stays one line (a log line, a CSV cell, the --baseline to type), and YAML reads each back as the value."""
    import yaml

    from attnlab.reports.compare import yaml_value

    values = (["a\nb", "c"], {"k\nx": "v"}, "a\u2028b", ["\x85"], "t\tab", "a\nb", [1, "a"], "it's")
    for value in values:
        text = yaml_value(value)
        assert len(text.splitlines()) == 1 and yaml.safe_load(text) == value, (value, text)


def test_a_key_that_older_runs_lack_is_no_varying_setting_unless_the_runs_having_it_differ(
    sweep: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A key a newer version added to the config (`model.tie: false` in new runs, absent in old ones) was
    a varying setting: the old and new runs of one setting were two groups, the old ones named
    `model.tie=None`. Lacking a key is no setting: it is named in a warning, and varies only when the runs
    having it differ, a run lacking it then shown as `(absent)`."""
    for pe, seed in BLEU:
        path = sweep / f"pe={pe},seed={seed}" / "config.yaml"
        if (pe, seed) != ("sinusoidal", 1):  # the one old run
            path.write_text(path.read_text().replace("  d_model: 32\n", "  d_model: 32\n  tie: false\n"))
    with caplog.at_level("WARNING", logger="attnlab.reports.compare"):
        groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    assert [(g.name, len(g.runs)) for g in groups] == [("model.pe=sinusoidal", 3), ("model.pe=none", 3)]
    assert "model.tie: in the config of some runs only" in caplog.text
    partial = [m.split(": ")[0] for m in caplog.messages if "in the config of some runs only" in m]
    assert partial == ["model.tie"]  # the keys every run holds are not named
    path = sweep / "pe=none,seed=3" / "config.yaml"
    path.write_text(path.read_text().replace("tie: false", "tie: true"))
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal,model.tie=(absent)")
    assert [(g.name, len(g.runs)) for g in groups] == [
        ("model.pe=sinusoidal,model.tie=(absent)", 1), ("model.pe=none,model.tie=false", 2),
        ("model.pe=none,model.tie=true", 1), ("model.pe=sinusoidal,model.tie=false", 2),
    ]  # fmt: skip


def test_a_run_whose_value_is_the_text_absent_is_no_run_lacking_the_key(sweep: Path) -> None:
    """A run whose setting is the text `(absent)` and a run lacking that key were both named
    `model.tie=(absent)`: one group, two settings averaged together. The text is quoted, as YAML reads it
    too; the other values look as before."""
    for pe, seed in BLEU:
        path = sweep / f"pe={pe},seed={seed}" / "config.yaml"
        tie = {1: None, 2: "'(absent)'"}.get(seed, "false") if pe == "sinusoidal" else "false"
        if tie is not None:
            path.write_text(path.read_text().replace("  d_model: 32\n", f"  d_model: 32\n  tie: {tie}\n"))
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal,model.tie=(absent)")
    assert groups[0].name == "model.pe=sinusoidal,model.tie=(absent)"
    assert {g.name: len(g.runs) for g in groups} == {
        "model.pe=sinusoidal,model.tie=(absent)": 1, "model.pe=sinusoidal,model.tie='(absent)'": 1,
        "model.pe=sinusoidal,model.tie=false": 1, "model.pe=none,model.tie=false": 3,
    }  # fmt: skip


def test_a_text_holding_a_comma_is_quoted_so_two_settings_never_share_a_name(sweep: Path) -> None:
    """Group names join `key=value` with commas: a text value holding `,<key>=` gave two settings one
    name (`model.pe=none,model.tie=x,model.tie=y` for pe `none,model.tie=x` with tie `y`, and for pe `none`
    with tie `x,model.tie=y`), their runs averaged as one group. Such a text is quoted, as YAML reads it;
    the other values look as before."""
    import yaml

    settings = {1: ("none,model.tie=x", "y"), 2: ("none", "x,model.tie=y"), 3: ("none", "it's,z")}
    for pe, seed in BLEU:
        path = sweep / f"pe={pe},seed={seed}" / "config.yaml"
        config = yaml.safe_load(path.read_text())
        config["model"]["pe"], config["model"]["tie"] = settings[seed] if pe == "none" else (pe, False)
        path.write_text(yaml.safe_dump(config))
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal,model.tie=false")
    assert {g.name: len(g.runs) for g in groups} == {
        "model.pe=sinusoidal,model.tie=false": 3, "model.pe='none,model.tie=x',model.tie=y": 1,
        "model.pe=none,model.tie='x,model.tie=y'": 1, "model.pe=none,model.tie='it''s,z'": 1,
    }  # fmt: skip
    assert yaml.safe_load("'it''s,z'") == "it's,z"


def test_only_a_running_run_can_be_stopped_and_a_finished_run_needs_its_results(sweep: Path) -> None:
    """A finished run whose process was killed after it recorded how the run ended (while a logger
    finished, say) leaves its dead pid in the lock file: it is compared, not listed as `stopped` (only a
    `running` run's dead process says it stopped). A finished run without results.json is listed as
    unfinished, not counted as a seed of its group."""
    import socket

    dead = subprocess.Popen(["true"])
    dead.wait()
    (sweep / "pe=none,seed=1" / ".lock").write_text(f"{dead.pid} {socket.gethostname()}\n")
    text = report([sweep])
    assert "| model.pe=none | 3 |" in text and "stopped" not in text
    (sweep / "pe=none,seed=2" / "results.json").unlink()
    text = report([sweep])
    assert "| model.pe=none | 2 |" in text and "pe=none,seed=2 (unfinished)" in text


def test_a_test_set_only_some_runs_decoded_has_no_paired_test_and_no_length_table(sweep: Path) -> None:
    """A run that decoded a test set the baseline run of its seed did not (an extra `test2017`) gets no
    paired test on it, and the by-length tables cover the sets every run decoded."""
    import shutil

    from attnlab.reports.compare import by_length

    run = sweep / "pe=none,seed=1"
    for sub in ("references", "hypotheses"):
        shutil.copy(run / sub / "test2016.txt", run / sub / "test2017.txt")
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    assert list({g.name: g for g in groups}["model.pe=none"].p_values) == ["test2016"]
    assert [table.test_set for table in by_length(groups)] == ["test2016"]


def test_without_test_scores_the_main_metric_is_the_validation_bleu_else_the_loss() -> None:
    """What `--plots` draws for runs that decoded no test set: `val/bleu` when they logged it."""
    from attnlab.reports.compare import GroupSummary, main_metric
    from attnlab.reports.stats import stat

    stats = {"val/loss": stat([2.0, 3.0]), "val/bleu": stat([20.0, 30.0]), "val/ppl": stat([7.0, 8.0])}
    assert main_metric([GroupSummary("all", [], stats)]) == ("val/bleu", ["val/ppl"])
    del stats["val/bleu"]
    assert main_metric([GroupSummary("all", [], stats)])[0] == "val/loss"


def test_hydras_record_is_no_run_even_when_given(sweep: Path) -> None:
    """`.hydra/` holds a config.yaml too: given as the path (or below a job killed before it wrote its
    records), it holds no run."""
    job = sweep / "killed"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "config.yaml").write_text("seed: 1\n")
    assert load_runs([job / ".hydra"]) == [] and len(load_runs([sweep])) == 8


def test_the_plots_draw_each_groups_interval_seeds_range_and_parameters(sweep: Path) -> None:
    """The numbers behind the plots, derived from the runs' values: each group's mean with its 95%
    t-interval and its seeds as dots (a group without the metric has no point), the range over seeds
    shaded around the validation curve, the metric against the parameter count, and each length bucket's
    interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlab.reports.compare import GroupSummary, LengthTable
    from attnlab.reports.plots import _by_group, _length_figure, _validation_curves, _vs_params
    from attnlab.reports.stats import stat

    for run in sweep.iterdir():  # val/loss of seed s at epoch e: 5 - e + s / 10
        seed = int(run.name.split("seed=")[1])
        rows = "".join(f",{10 * (e + 1)},{e},{5.0 - e + seed / 10}\n" for e in range(2))
        (run / "csv" / "metrics.csv").write_text(f"params/total,step,epoch,val/loss\n1234.0,0,,\n{rows}")
    groups, _ = summarize(load_runs([sweep]), baseline="model.pe=sinusoidal")
    metric = "test/test2016/bleu"
    half = 4.302653 * 2.0 / math.sqrt(3)  # seeds 30, 32, 34: std 2
    figure = _by_group([*groups, GroupSummary("no scores", [], {})], metric)
    axes = figure.axes[0]
    bar = axes.containers[0].lines[2][0].get_segments()[0]
    assert bar[0][1] == pytest.approx(32.0 - half, rel=1e-6) and bar[1][1] == pytest.approx(
        32.0 + half, rel=1e-6
    )
    dots = [sorted(c.get_offsets()[:, 1]) for c in axes.collections if len(c.get_offsets()) == 3]
    assert dots == [[30.0, 32.0, 34.0], [20.0, 21.0, 25.0]] and len(axes.containers) == 2
    figure = _validation_curves(groups)
    shaded = figure.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert (shaded.min(), shaded.max()) == pytest.approx((4.1, 5.3))  # epochs 0-1, seeds 1-3
    figure = _vs_params(groups, metric)
    assert [list(c.lines[0].get_xydata()[0]) for c in figure.axes[0].containers] == [[1234, 32], [1234, 22]]
    table = LengthTable("t", "source", ["<10", "10+"], [2, 0], {"g": [stat([10.0, 14.0]), None]})
    figure = _length_figure(table)
    bar = figure.axes[0].containers[0].lines[2][0].get_segments()[0]
    assert bar[1][1] - bar[0][1] == pytest.approx(2 * 12.7062 * statistics.stdev([10.0, 14.0]) / math.sqrt(2),
                                                  rel=1e-4)  # fmt: skip
    plt.close("all")
