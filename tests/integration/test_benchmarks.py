"""The benchmark scripts' harnesses run (`--quick`: tiny shapes on the CPU; no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import torch

from attnlab.model import gemm
from attnlab.training.allocator import glibc

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(autouse=True)
def same_torch_threads():
    """The scripts set torch's thread count (`--threads`) in this process: later tests of the session
    (bitwise comparisons with runs in subprocesses) need the count they started with."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_gpu_train_quick_reports_throughput_and_mfu(capsys: pytest.CaptureFixture[str]) -> None:
    load("bench_gpu_train").main(["--quick"])
    table = capsys.readouterr().out.strip().splitlines()
    assert table[-3] == "| compile | target tokens/s | model TFLOP/s | MFU | final loss |"
    cells = [c.strip() for c in table[-1].strip("|").split("|")]
    assert cells[0] == "off" and float(cells[1].replace(",", "")) > 0 and cells[3].endswith("%")
    assert 0 < float(cells[3][:-1]) < 100  # a utilisation, measured against the same device's matmul rate
    assert 0 < float(cells[4]) < 10  # the label-smoothed loss per target token (ln 50 = 3.9 at the start)


def test_bench_train_quick_compares_three_models_doing_the_same_arithmetic(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("transformers", reason="MarianMT needs the [interop] extra")
    bench = load("bench_train")
    counts = {f: bench.trainable(bench.build(f, "tiny")) for f in bench.DEFAULT_FRAMEWORKS}
    assert len(set(counts.values())) == 1, counts  # the same parameters in all three
    bench.main(["--quick", "--no-memory", "--out", str(tmp_path / "t.md")])  # the default: these three
    rows = [line for line in (tmp_path / "t.md").read_text().splitlines() if line.startswith("| tiny")]
    assert [r.split("|")[2].strip() for r in rows] == ["attnlab", "MarianMT", "nn.Transformer"]
    assert all("×" in r.split("|")[8] for r in rows[1:])  # speed-ups with their intervals
    losses = []  # attnlab's fused loss is the loss the others compute from their logits
    for loss_of in ("framework", "logits"):
        torch.manual_seed(0)
        model = bench.build("attnlab", "tiny")
        step = bench.make_step("attnlab", model, "tiny", loss_of)
        torch.manual_seed(1)  # the same dropout masks
        losses.append(step())
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    ratio, low, high = bench.interval([(1.0, 2.0), (1.0, 2.0), (1.0, 2.0)])
    assert (ratio, low, high) == (2.0, 2.0, 2.0)  # half the step time = twice the speed
    # the memory process (a fresh interpreter) answers three numbers: peak resident set, its growth, page
    # faults a step (their values depend on the machine; the table below checks where each one goes)
    rss, growth, faults = bench.peak_memory("attnlab", "tiny", 1, "framework", "keep")
    result = {"size": "tiny", "params": 1e6, "models": {"attnlab": {
        "median_s": 0.01, "tokens_per_s": 100.0, "mfu": 0.5, "peak_rss_mb": [rss, growth],
        "page_faults_per_step": faults}}}  # fmt: skip
    row = bench.table([result]).splitlines()[-1].split("|")
    assert row[7].strip() == f"{rss:.0f} MB (+{growth:.0f} MB)" and row[9].strip() == f"{faults:,.0f}"


def test_bench_train_frameworks_picks_the_models_and_names_what_is_missing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--frameworks: any set with attnlab, in the table's order, without the packages of the others (no
    transformers needed for attnlab and nn.Transformer); fairseq, no dependency, is refused naming its
    own virtual environment where it is not installed, and matches attnlab's parameters where it is."""
    bench = load("bench_train")
    out = tmp_path / "t.md"
    bench.main(["--quick", "--no-memory", "--frameworks", "torch", "attnlab", "--out", str(out)])
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| tiny")]
    assert [r[2].strip() for r in rows] == ["attnlab", "nn.Transformer"]
    assert rows[0][8].strip() == "" and "×" in rows[1][8]
    (result,) = json.loads(Path(str(out) + ".json").read_text())
    assert list(result["models"]) == ["attnlab", "torch"]
    assert [k for k in result if k.startswith("speedup_vs_")] == ["speedup_vs_torch"]
    for argv, message in [
        (["--frameworks", "torch", "marian"], "add attnlab"),
        (["--frameworks", "attnlab", "torch", "torch"], "each framework once"),
        (["--frameworks", "attnlab", "opennmt"], "invalid choice: 'opennmt'"),
    ]:
        with pytest.raises(SystemExit):
            bench.main(["--quick", "--no-memory", *argv])
        assert message in capsys.readouterr().err
    if importlib.util.find_spec("fairseq") is None:
        with pytest.raises(SystemExit):
            bench.main(["--quick", "--no-memory", "--frameworks", "attnlab", "fairseq"])
        err = capsys.readouterr().err
        assert "fairseq cannot be imported" in err and "'fairseq anchor'" in err
    else:
        fairseq, attnlab = (bench.trainable(bench.build(f, "tiny")) for f in ("fairseq", "attnlab"))
        assert fairseq == attnlab


def test_bench_train_profile_splits_each_step_into_groups_and_bounds_the_speed_up(tmp_path: Path) -> None:
    """--profile: every model's profiled step split into the groups (they add up to the step), attnlab's
    ceiling = the other's median step over attnlab's time in the kernels all share, and the op groups."""
    bench = load("bench_train")
    assert bench.op_group("aten::addmm_") == bench.op_group("aten::baddbmm") == "matrix products"
    assert bench.op_group("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention kernels"
    assert bench.op_group("aten::_fused_adamw_") == "optimizer"
    assert bench.op_group("aten::bernoulli_") == bench.op_group("aten::random_") == "dropout randomness"
    assert bench.op_group("aten::native_layer_norm") == bench.op_group("aten::ge") == "other ops"
    out = tmp_path / "t.md"
    bench.main(["--quick", "--no-memory", "--frameworks", "attnlab", "torch", "--profile", "--profile-rounds",
                "2", "--out", str(out)])  # fmt: skip
    (result,) = json.loads(Path(str(out) + ".json").read_text())
    profile = result["profile"]
    assert list(profile) == ["attnlab", "torch"]
    for groups in profile.values():
        assert set(groups) == {"step", *bench.GROUPS}
        assert sum(groups[g] for g in bench.GROUPS) == pytest.approx(groups["step"], rel=1e-9)
        assert groups["matrix products"] > 0 and groups["attention kernels"] > 0 and groups["optimizer"] > 0
        assert groups["outside ops"] > 0  # Python and autograd between the ops
    attnlab_shared = result["models"]["attnlab"]["median_s"] * bench.shared_share(profile["attnlab"])
    shares = profile["attnlab"]
    assert bench.shared_share(shares) == pytest.approx(sum(shares[g] for g in bench.SHARED) / shares["step"])
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| tiny")]
    profiled = [r for r in rows if len(r) > 11]  # the profile table's rows (the timing table has 9 cells)
    assert [r[2].strip() for r in profiled] == ["attnlab", "nn.Transformer"]
    assert profiled[0][-2].strip() == ""
    assert profiled[1][-2].strip() == f"{result['models']['torch']['median_s'] / attnlab_shared:.3f}×"


def test_bench_train_products_times_each_steps_matrix_products_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--products: the products recorded are the step's (their FLOPs are the step's matrix-multiply FLOPs),
    replaying them runs those products, each round replays them right after its steps, and the table's
    ceiling is the other's step over attnlab's products alone. The loss's output layer runs in chunks of 64
    of the 96 target rows here, so the second chunk's weight gradient is added in place (`addmm_`), as at
    the benchmark's sizes."""
    from attnlab.training import loss

    monkeypatch.setitem(loss.CHUNK_ELEMENTS, "cpu", 64 * 500)  # 64 rows of the tiny vocabulary
    bench = load("bench_train")
    torch.manual_seed(0)
    model = bench.build("attnlab", "tiny")
    step = bench.make_step("attnlab", model, "tiny")
    products = bench.recorded_products(step)
    assert {func._schema.name for func, _, _ in products} == {"aten::mm", "aten::addmm", "aten::addmm_"}
    d, _, ff, layers, vocab, (batch, src_len, tgt_len) = bench.SIZES["tiny"]
    flops = sum(2 * args[-2].shape[0] * args[-2].shape[1] * args[-1].shape[1] for _, args, _ in products)
    # the linear layers' forward and backward products and the output layer's (attention runs in its fused
    # kernels): 3 × (2 · weights · tokens), as the stacks and the output layer see them
    encoder = layers * (4 * d * d + 2 * d * ff) * batch * src_len
    decoder = layers * (8 * d * d + 2 * d * ff) * batch * tgt_len + d * vocab * batch * tgt_len
    assert flops == 3 * 2 * (encoder + decoder)

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ran = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            Count.ran += func._schema.name in ("aten::mm", "aten::addmm", "aten::addmm_")
            return func(*args, **kwargs or {})

    with Count():  # a replay runs the step's products, and nothing else of the step
        assert bench.replay_products(products) > 0
    assert Count.ran == len(products)
    # the replays are timed in each round, right after that round's steps (not after all the rounds)
    events: list[str] = []
    make_step, replay = bench.make_step, bench.replay_products

    def logged_step(framework: str, *args: object) -> object:
        step = make_step(framework, *args)

        def run() -> object:
            events.append(f"step {framework}")
            return step()

        return run

    def logged_replay(recorded: list) -> float:
        events.append(f"products {'attnlab' if recorded is replays[0] else 'torch'}")
        return replay(recorded)

    replays: list[list] = []
    recorded_products = bench.recorded_products

    def recording(step: object) -> list:
        replays.append(recorded_products(step))
        return replays[-1]

    monkeypatch.setattr(bench, "make_step", logged_step)
    monkeypatch.setattr(bench, "replay_products", logged_replay)
    monkeypatch.setattr(bench, "recorded_products", recording)
    out = tmp_path / "t.md"
    bench.main(
        ["--quick", "--no-memory", "--frameworks", "attnlab", "torch", "--products", "--out", str(out)]
    )
    assert events == [
        "step attnlab", "step torch", "step attnlab", "step torch",  # --quick's 1 warm-up, then recorded
        "step attnlab", "step torch", "products attnlab", "products torch",  # round 1
        "step torch", "step attnlab", "products torch", "products attnlab",  # round 2, order rotated
    ]  # fmt: skip
    (result,) = json.loads(Path(str(out) + ".json").read_text())
    alone = result["products"]
    assert list(alone) == ["attnlab", "torch"]
    for f, seconds in alone.items():
        assert 0 < seconds < result["models"][f]["median_s"]  # a part of the step
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| tiny")]
    split = [r for r in rows if len(r) == 8]  # the products table's rows (the timing table has 11 cells)
    assert [r[2].strip() for r in split] == ["attnlab", "nn.Transformer"]
    assert split[0][4].strip() == f"{alone['attnlab'] * 1000:.0f} ms" and split[0][6].strip() == ""
    assert split[1][6].strip() == f"{result['models']['torch']['median_s'] / alone['attnlab']:.3f}×"


def test_bench_decode_compares_with_marian_generate(
    shared_data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--marian on a random model=small (outputs run to the length limit): the harness, not the speed.

    The model is seeded and its greedy top-2 log-probability margins on these sentences are above 1e-3,
    far above the float differences between attnlab and MarianMT: every output is the same token sequence
    (the script itself exits naming the settings where one is not)."""
    pytest.importorskip("transformers", reason="MarianMT needs the [interop] extra")
    import sys

    argv = ["bench_decode.py", "--root", str(shared_data / "multi30k"), "--marian", "--quick"]
    monkeypatch.setattr(sys, "argv", argv)
    load("bench_decode").main()
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| greedy", "| beam"))]
    assert len(rows) == 4  # greedy and beam 5, at batch 64 and 1
    for row in rows:
        n = {"64": 6, "1": 2}[row.split("|")[2].strip()]  # every sentence compared: 6 at batch 64, 2 at 1
        assert row.split("|")[6].strip() == f"{n}/{n} (100.0%)", row  # and every output identical
    assert "greedy differences: 0;" in out
    in_force = "yes" if glibc() is not None else "no"  # --allocator keep, the default, for MarianMT too
    assert f"C heap: --allocator keep; glibc's malloc options in force: this process {in_force}\n" in out


def test_bench_decode_profile_needs_ctranslate2(
    shared_data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    argv = ["bench_decode.py", "--root", str(shared_data / "multi30k"), "--profile"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        load("bench_decode").main()
    assert exit_info.value.code == 2 and "give --ctranslate2 too" in capsys.readouterr().err


def test_bench_decode_compares_with_ctranslate2_float32_and_int8(
    shared_data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--ctranslate2 on the seeded random model=small (outputs run to the 60-token limit, so the limit means
    the same on both sides): every float32 output identical (the script exits naming the settings where
    one is not), int8 reported beside it; the harness, not the speed. `--allocator system` reaches each
    CTranslate2 worker, a fresh process: glibc's options are not set there (the default, keep, would set
    them; this process may hold them from an earlier test, which glibc cannot undo)."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 needs the [export] extra")
    import sys

    argv = ["bench_decode.py", "--root", str(shared_data / "multi30k"), "--ctranslate2", "--quick",
            "--threads", "1", "--profile", "--allocator", "system"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    load("bench_decode").main()
    out = capsys.readouterr().out
    rows = [line.split("|") for line in out.splitlines() if line.startswith(("| greedy", "| beam"))]
    assert sorted((r[1].strip(), r[2].strip(), r[3].strip()) for r in rows) == sorted(
        (search, batch, weights) for search in ("greedy", "beam 5") for batch in ("64", "1")
        for weights in ("float32", "int8")
    )  # fmt: skip
    for row in rows:
        n = {"64": 6, "1": 2}[row[2].strip()]
        if row[3].strip() == "float32":
            assert row[7].strip() == f"{n}/{n} (100.0%)", row
        assert float(row[5]) > 0 and row[6].strip().endswith("]")  # a rate and a ratio range per row
    # read from the log of each model's load, in the fresh process it decodes in (one per model)
    assert re.search(
        r"CTranslate2's matrix products \(its log\): float32: SGEMM \w+ \(packed: (true|false)\).*; "
        r"int8: SGEMM \w+ \(packed: (true|false)\)",
        out,
    )
    products = gemm.backend() if gemm.available() else "PyTorch's MKL"
    assert f"; attnlab's: {products} (" in out
    heap = r"C heap: --allocator system; glibc's malloc options in force: this process (yes|no), "
    assert re.search(heap + r"float32 worker no, int8 worker no\n", out)
    # --profile: per search, attnlab's op table, whose shares (with the time outside ops) add up to the wall
    profiles = out.split("\n\ngreedy, batch 64")[1].split("\n\nbeam 5, batch 64")
    assert len(profiles) == 2 and all("CTranslate2 float32" in p for p in profiles)
    for profile in profiles:
        table = [line.split("|") for line in profile.splitlines() if line.startswith("| ") and "%" in line]
        names = [r[1].strip() for r in table]
        # the linear layers' products: oneDNN's (a profiler range of their own) where installed
        assert ("attnlab::onednn_sgemm" if gemm.available() else "aten::addmm") in names
        assert names[-2:] == ["other ops", "outside ops (Python, dispatch)"]
        assert sum(float(r[3].strip().rstrip("%")) for r in table) == pytest.approx(100.0, abs=0.5)


def test_bench_decode_says_when_its_ctranslate2_process_cannot_decode(tmp_path: Path) -> None:
    """CTranslate2 decodes in a worker process of its own: one that exits (here: no model to load) is an
    error naming its exit status, not a hang or an empty table."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 needs the [export] extra")
    bench = load("bench_decode")
    with pytest.raises(RuntimeError, match=r"the CTranslate2 worker exited with status [1-9]"):
        bench.CT2Process(tmp_path / "float32", 1, tmp_path, "keep")


def test_bench_decode_reads_ctranslate2s_gemm_backends_from_its_log(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """CTranslate2 logs its backends from C++ on file descriptor 2, at info level, when it loads its first
    model: the helper turns that level on around the load, captures the lines, returns what the load
    returned, passes every other line on (CTranslate2's warnings too), and restores the level and the
    descriptor, also when the load fails."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="CTranslate2 needs the [export] extra")
    import logging
    import os

    helper = load("bench_decode").ct2_gemm_backends
    before = ctranslate2.get_log_level()

    def first_model() -> str:  # writes what CTranslate2 writes at the level it is set to
        lines = [
            b"[ctranslate2] [thread 1] [warning] int8 is not efficiently supported",
            b"an export warning",
        ]
        if ctranslate2.get_log_level() == logging.INFO:
            lines[1:1] = [
                b"[02:09:55.185] [ctranslate2] [thread 1] [info]  - SGEMM backend: DNNL (packed: false)",
                b"[ctranslate2] [info]  - GEMM_S8 backend: MKL (packed: true)",
            ]
        os.write(2, b"\n".join(lines) + b"\n")
        return "loaded"

    loaded, backends = helper(first_model)
    assert (loaded, backends) == ("loaded", "SGEMM DNNL (packed: false); GEMM_S8 MKL (packed: true)")
    assert capfd.readouterr().err == (
        "[ctranslate2] [thread 1] [warning] int8 is not efficiently supported\nan export warning\n"
    )
    assert ctranslate2.get_log_level() == before
    assert helper(lambda: 1) == (1, "not reported")
    ctranslate2.set_log_level(logging.INFO)  # asked for already (CT2_VERBOSE=1): nothing is kept back
    try:
        assert helper(first_model)[1] == "SGEMM DNNL (packed: false); GEMM_S8 MKL (packed: true)"
        assert capfd.readouterr().err.count("\n") == 4
    finally:
        ctranslate2.set_log_level(before)

    def failing() -> None:
        os.write(2, b"terminate: the model is broken\n")
        raise RuntimeError("no model")

    with pytest.raises(RuntimeError, match="no model"):
        helper(failing)
    os.write(2, b"after\n")  # the descriptor is stderr again
    assert capfd.readouterr().err == "terminate: the model is broken\nafter\n"
    assert ctranslate2.get_log_level() == before


def test_bench_epoch_quick_compares_token_batches_with_padded_sentence_batches(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load("bench_epoch").main(["--root", str(shared_data / "multi30k"), "--quick"])
    out = capsys.readouterr().out
    rows = {
        line.split("|")[1].strip(): line.split("|")[2:-1]
        for line in out.splitlines()
        if line.startswith("| ")
    }
    ours, theirs = rows["attnlab"], rows["Hugging Face-style"]
    assert ours[1].strip() == theirs[1].strip()  # the same number of batches per epoch
    assert float(ours[3].strip().rstrip("%")) < float(theirs[3].strip().rstrip("%"))  # less padding
    assert "attnlab / HF-style:" in out


def test_bench_data_quick_batches_every_training_pair_once_with_less_padding(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load("bench_data")
    bench.main(["--root", str(shared_data / "multi30k"), "--quick"])
    out = capsys.readouterr().out
    assert f"{bench.QUICK_LINES['train']} training pairs" in out  # the quick corpus, no pair filtered out
    cells = [line.split("|")[1:3] for line in out.splitlines() if line.startswith("| ")]
    rows = {name.strip(): value.strip() for name, value in cells}
    loader, token, sentence = (
        next(value for name, value in rows.items() if name.startswith(prefix))
        for prefix in ("DataLoader batches/s", "padding, token batches", "padding, shuffled batches of ")
    )
    counts = [re.search(r"\((\d+) batches, (\d+) pairs\)$", v).groups() for v in (loader, token, sentence)]
    assert counts[0] == counts[1]  # the padding is measured on the batches the DataLoader serves
    assert {pairs for _, pairs in counts} == {str(bench.QUICK_LINES["train"])}  # each pair in one batch
    per_batch = int(re.search(r"shuffled batches of (\d+) sentences", out).group(1))
    assert int(counts[2][0]) == math.ceil(bench.QUICK_LINES["train"] / per_batch)
    assert per_batch == round(bench.QUICK_LINES["train"] / int(counts[1][0]))  # the token batches' average
    token_padding, sentence_padding = (float(v.split("%")[0]) for v in (token, sentence))
    assert 0 <= token_padding < sentence_padding < 100  # length-sorted batches pad less


def test_bench_data_at_scale_measures_each_stage_in_its_own_process(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The `--pairs` harness on a tiny corpus (preparation and opening; the datasets pipeline and the DDP
    runs are left out here): every row filled from what its process measured."""
    bench = load("bench_data")
    source = str(shared_data / "multi30k")
    bench.main(["--pairs", "2000", "--work", str(tmp_path), "--skip", "hf,ddp", "--vocab-size", "800",
                "--tokenizer-sample", "500", "--loader-batches", "10", "--source", source])  # fmt: skip
    out = capsys.readouterr().out
    results = json.loads((tmp_path / "bench_data.json").read_text())
    prepared, opened = results["prepare"], results["open"]
    assert prepared["stats"]["tokenizer_pairs"] == 500 and prepared["stats"]["train_lines"] == 2000
    assert opened["examples"] == prepared["examples"] == prepared["stats"]["train_examples"] > 1900
    assert 0 < prepared["peak_pss_anon"] <= prepared["peak_pss"] <= prepared["peak_rss"]
    assert prepared["steady_processes"] >= 1 and 0 < prepared["steady_pss_anon"] <= prepared["peak_pss_anon"]
    assert opened["loader_batches"] == 10 and opened["loader_tokens"] > 0 and opened["epoch_batches"] > 10
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert any(row.startswith("| preparation, 2k pairs (BPE trained on a 0.5k-pair sample)") for row in rows)
    assert any(f"({prepared['examples']:,} training examples)" in row for row in rows)
    assert any(row.startswith("| DataLoader, 2 workers") and "(10 batches;" in row for row in rows)


def test_bench_data_memory_readings_cover_the_whole_process_tree(tmp_path: Path) -> None:
    """`monitored` sums a process and its children: two children each holding 64 MB of their own count
    in the median taken while all three ran, and the peak is at least that median."""
    import sys

    script = (
        "import multiprocessing as mp, time\n"
        "def hold():\n    block = bytearray(64 << 20)\n    time.sleep(3)\n"
        "if __name__ == '__main__':\n"
        "    children = [mp.get_context('fork').Process(target=hold) for _ in range(2)]\n"
        "    [c.start() for c in children]; [c.join() for c in children]\n"
    )
    run = load("bench_data").monitored([sys.executable, "-c", script], tmp_path / "log")
    assert run["steady_processes"] == 3
    assert 128 << 20 < run["steady_pss_anon"] <= run["peak_pss_anon"] <= run["peak_rss"]


def test_bench_decode_quick_reports_cache_speed_up_and_every_setting(
    shared_data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setattr(sys, "argv", ["bench_decode.py", "--root", str(shared_data / "multi30k"), "--quick"])
    load("bench_decode").main()
    out = capsys.readouterr().out
    assert "| cached |" in out and "| uncached |" in out
    rows = [line for line in out.splitlines() if line.startswith(("| greedy", "| beam"))]
    assert len(rows) == 2 * 2 * 2  # greedy and beam 5, batch 1 and 4, cached and uncached
    assert "test2016, 12 sentences, beam 5" in out and "BLEU" in out
    assert "C heap: --allocator keep; glibc's malloc options in force: this process " in out
