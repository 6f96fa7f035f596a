"""oneDNN's GEMM for CPU inference products (`attnlab.model.gemm`): loaded from its package, equal to torch's
products within float rounding, writing nothing it is given, following torch's thread count, chosen by
`ATTNLAB_GEMM`, and what the decoding step really multiplies with."""

from __future__ import annotations

import os
import platform
import sys
import threading
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from attnlab.decoding.search import greedy_decode
from attnlab.model import gemm
from attnlab.model import linear as linear_module
from attnlab.model.linear import Linear, project
from attnlab.model.transformer import Transformer
from attnlab.runs.manifest import hardware
from helpers import random_source, tiny_config

# where the package is a dependency (pyproject.toml), CI must have it; elsewhere these tests skip
SUPPORTED = sys.platform == "linux" and platform.machine() == "x86_64"


@pytest.fixture
def choose(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """Set `ATTNLAB_GEMM` (None: unset) and reload the choice; the process's own choice is restored after."""

    def set_choice(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv(gemm.ENV, raising=False)
        else:
            monkeypatch.setenv(gemm.ENV, value)
        gemm._onednn.cache_clear()

    yield set_choice
    monkeypatch.undo()
    gemm._onednn.cache_clear()


@pytest.fixture
def intel(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """Make the CPU Intel's (True) or another vendor's (False) for the GEMM choice and the layouts."""

    def set_vendor(is_intel: bool) -> None:
        monkeypatch.setattr(gemm, "intel_cpu", lambda: is_intel)
        gemm._onednn.cache_clear()

    yield set_vendor
    monkeypatch.undo()
    gemm._onednn.cache_clear()


@pytest.fixture
def onednn(choose) -> None:
    if not SUPPORTED and os.environ.get("CI") != "true":
        pytest.skip("onednn-cpu-gomp is a dependency on Linux x86-64 only")
    choose("onednn")


def test_onednn_is_loaded_from_its_package_where_it_is_a_dependency(choose, intel) -> None:
    choose(None)
    intel(False)
    if not SUPPORTED:
        pytest.skip("onednn-cpu-gomp is a dependency on Linux x86-64 only")
    assert gemm.backend().startswith("oneDNN 3."), gemm.backend()
    assert gemm.available()
    assert hardware()["inference_gemm"] == gemm.backend()


def test_intel_cpus_keep_torchs_products_unless_onednn_is_asked_for(choose, intel) -> None:
    """On Intel CPUs MKL runs its own kernels, faster than oneDNN's at decoding's row counts: `auto` keeps
    torch's products there; `onednn` still loads oneDNN where it can."""
    choose("auto")
    intel(True)
    assert gemm.backend() == "torch" and not gemm.available()
    assert hardware()["inference_gemm"] == "torch"
    if not SUPPORTED and os.environ.get("CI") != "true":
        pytest.skip("onednn-cpu-gomp is a dependency on Linux x86-64 only")
    choose("onednn")
    assert gemm.backend().startswith("oneDNN 3."), gemm.backend()


def test_the_cpu_vendor_is_read_from_cpuinfo(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    amd = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\n\nprocessor\t: 1\n"
    intel = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n"
    assert gemm.vendor(amd.splitlines()) == "AuthenticAMD"
    assert gemm.vendor(intel.splitlines()) == "GenuineIntel"
    assert gemm.vendor(["processor\t: 0", "Features\t: fp asimd"]) is None  # an ARM CPU's lines
    try:
        for text, is_intel in ((amd, False), (intel, True), ("", False)):
            info = tmp_path / "cpuinfo"
            info.write_text(text)
            monkeypatch.setattr(gemm, "CPUINFO", info)
            gemm.intel_cpu.cache_clear()
            assert gemm.intel_cpu() is is_intel
        monkeypatch.setattr(gemm, "CPUINFO", tmp_path / "missing")  # not Linux
        gemm.intel_cpu.cache_clear()
        assert gemm.intel_cpu() is False
    finally:  # this machine's answer again, for the tests after this one
        monkeypatch.undo()
        gemm.intel_cpu.cache_clear()


@pytest.mark.parametrize("rows", [1, 5, 64, 320])
@pytest.mark.parametrize("with_bias", [True, False])
def test_onednn_products_equal_torchs_and_write_nothing_they_are_given(
    onednn, rows: int, with_bias: bool
) -> None:
    torch.manual_seed(rows)
    x, weight = torch.randn(rows, 256), torch.randn(256, 1100)  # one row: 281,600 ≥ MIN_PRODUCT
    bias = torch.randn(1100) if with_bias else None
    given = [t.clone() for t in (x, weight, bias) if t is not None]
    assert gemm.applies(x, weight)
    out = gemm.linear(x, weight, bias)
    want = x @ weight if bias is None else torch.addmm(bias, x, weight)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4)  # sums of 256 products of size ~1
    for before, after in zip(given, [t for t in (x, weight, bias) if t is not None], strict=True):
        assert torch.equal(before, after)  # with one row, the bias broadcast to (1, N) is the bias itself
    assert out.data_ptr() not in {t.data_ptr() for t in (x, weight, bias) if t is not None}


def test_onednn_takes_torchs_thread_count_in_every_thread(onednn, monkeypatch: pytest.MonkeyPatch) -> None:
    library = gemm._onednn()
    real = library.sgemm
    seen: list[int] = []

    def sgemm(*args):  # the OpenMP thread count oneDNN sees when it is called
        seen.append(library.max_threads())
        return real(*args)

    monkeypatch.setattr(library, "sgemm", sgemm)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)  # a count OpenMP's default (the CPUs, or OMP_NUM_THREADS) is unlikely to be
    try:
        worker = threading.Thread(target=gemm.linear, args=(torch.randn(4, 8), torch.randn(8, 4), None))
        worker.start()  # a new thread starts at OpenMP's default count
        worker.join()
    finally:
        torch.set_num_threads(threads)
    assert seen == [3]


def test_onednn_runs_on_torchs_openmp_runtime_or_is_not_used(onednn) -> None:
    threads = torch.get_num_threads()
    assert gemm._shares_torchs_threads(gemm._onednn().max_threads)
    assert not gemm._shares_torchs_threads(lambda: threads)  # another runtime: it ignores torch's count
    assert torch.get_num_threads() == threads


def test_cpu_autocast_keeps_torchs_lower_precision_products(onednn, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(gemm, "linear", lambda *args: calls.append(args))
    layer, x = Linear(256, 1100), torch.randn(5, 256)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = project(x, layer)[0]
    assert out.dtype == torch.bfloat16 and calls == []


def test_only_float32_contiguous_cpu_products_of_min_product_go_to_onednn(onednn) -> None:
    rows, inner = 4, 256
    outer = gemm.MIN_PRODUCT // (rows * inner)  # exactly MIN_PRODUCT multiply-adds
    x, weight = torch.randn(rows, inner), torch.randn(inner, outer)
    assert gemm.applies(x, weight)
    assert not gemm.applies(x[:, :-1].contiguous(), weight[:-1])  # one multiply-add per output fewer
    assert not gemm.applies(x.double(), weight.double())
    assert not gemm.applies(x.bfloat16(), weight.bfloat16())
    assert not gemm.applies(torch.randn(inner, rows).t(), weight)  # not contiguous
    assert not gemm.applies(x, torch.randn(outer, inner).t())
    assert not gemm.applies(x, weight.double())  # the operands' dtypes differ
    assert not gemm.applies(torch._neg_view(x), weight)  # memory holding -x
    assert not gemm.applies(x, torch._neg_view(weight))
    assert not gemm.applies(x, torch.randn(inner + 1, outer))  # inner sizes differ
    assert not gemm.applies(torch.randn(rows, inner, inner), weight)  # 2-d operands only
    assert not gemm.applies(x, torch.randn(inner, outer, 1))
    assert not gemm.applies(x.to("meta"), weight)  # CPU operands only
    assert not gemm.applies(x, weight.to("meta"))
    assert not gemm.takes(0, inner, 10**9, torch.float32)
    bias = torch.randn(outer)
    assert gemm.applies(x, weight, bias)
    assert not gemm.applies(x, weight, bias.double())  # never cast: torch's product refuses it
    for wrong in (bias[:-1], bias[:, None], bias.to("meta")):  # torch's product refuses these too
        with pytest.raises((RuntimeError, NotImplementedError)):
            gemm.linear(x, weight, wrong)
        with pytest.raises((RuntimeError, NotImplementedError)):
            torch.addmm(wrong, x, weight)


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_layers_of_one_product_with_another_dtype_are_refused_not_promoted(rows: int) -> None:
    """q, k and v multiplied as one product: a float16 bias in one of them is an error, as in its own
    F.linear, not a float32 result; so is a 0-d bias. Whatever the GEMM (torch.cat of the parameters)."""
    a, b = Linear(256, 600), Linear(256, 600)
    b.bias = torch.nn.Parameter(b.bias.detach().half())
    x = torch.randn(rows, 256)
    with pytest.raises(RuntimeError):
        F.linear(x, b.weight, b.bias)
    with torch.inference_mode(), pytest.raises(RuntimeError, match=r"one dtype.*float16"):
        project(x, a, b)
    b.bias = torch.nn.Parameter(torch.tensor(0.5))
    with torch.inference_mode(), pytest.raises(RuntimeError, match=r"shape \(out_features,\).*bias \(\)"):
        project(x, a, b)


def test_a_bias_of_another_dtype_is_refused_as_torch_refuses_it(onednn) -> None:
    """Inference products must not succeed where torch's training-path product raises: a float64 bias on a
    float32 layer is an error in both, not silently cast."""
    layer = Linear(256, 1100)
    layer.bias = torch.nn.Parameter(layer.bias.detach().double())
    x = torch.randn(64, 256)
    with pytest.raises(RuntimeError) as torchs:
        F.linear(x, layer.weight, layer.bias)
    with torch.inference_mode(), pytest.raises(RuntimeError) as ours:
        project(x, layer)
    assert "Double" in str(torchs.value), torchs.value
    assert "Double" in str(ours.value) or "float64" in str(ours.value), ours.value


def test_the_decoding_step_multiplies_on_onednn_and_with_attnlab_gemm_torch_never(
    choose, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not SUPPORTED and os.environ.get("CI") != "true":
        pytest.skip("onednn-cpu-gomp is a dependency on Linux x86-64 only")
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    src = random_source([5, 3])
    calls: list[tuple[int, ...]] = []
    real = gemm.linear

    def counted(flat, weight, bias):
        calls.append((*flat.shape, weight.size(1)))
        return real(flat, weight, bias)

    monkeypatch.setattr(gemm, "linear", counted)
    monkeypatch.setattr(gemm, "MIN_PRODUCT", 1)  # the tiny model's products are all small
    outputs = {}
    for choice in ("onednn", "torch"):
        choose(choice)
        calls.clear()
        with torch.inference_mode():
            outputs[choice] = greedy_decode(model, src, max_len_b=6)
        outputs[choice + " calls"] = list(calls)
    assert outputs["torch calls"] == []
    vocab = model.config.tgt_vocab_size
    assert (2, model.config.d_model, vocab) in outputs["onednn calls"]  # the output projection of 2 rows
    assert torch.equal(outputs["onednn"], outputs["torch"])


def test_rows_take_the_oneDNN_layout_at_every_count_and_mkls_layouts_without_it(
    choose, onednn, intel
) -> None:
    intel(False)
    five, outputs = torch.randn(5, 256), 1024  # 1,310,720 multiply-adds
    assert linear_module._rows_first(five, outputs)
    assert not linear_module._rows_first(five, 8)  # too small for oneDNN: MKL's layout for 2-16 rows
    assert not linear_module._rows_first(five.double(), outputs)
    choose("torch")
    assert not linear_module._rows_first(five, outputs)
    assert linear_module._rows_first(torch.randn(17, 256), outputs)
    layer = Linear(256, outputs)
    with torch.inference_mode():
        torch.testing.assert_close(project(five, layer)[0], F.linear(five, layer.weight, layer.bias))
    intel(True)  # MKL's own kernels: rows first at every count, with or without oneDNN
    for rows in (1, 2, 5, 16, 17):
        assert linear_module._rows_first(torch.randn(rows, 256), 8)
        assert linear_module._rows_first(torch.randn(rows, 256).double(), outputs)
    with torch.inference_mode():
        torch.testing.assert_close(project(five, layer)[0], F.linear(five, layer.weight, layer.bias))


def test_attnlab_gemm_choices_and_their_errors(choose, intel, monkeypatch: pytest.MonkeyPatch) -> None:
    intel(False)  # on an Intel CPU `auto` never tries the package: its fallback would go untested
    choose("torch")
    assert gemm.backend() == "torch" and not gemm.available()
    choose("fast")
    with pytest.raises(gemm.GemmUnavailable, match=r"ATTNLAB_GEMM='fast': expected one of auto, onednn, tor"):
        gemm.backend()
    monkeypatch.setattr(gemm, "DISTRIBUTION", "onednn-not-installed")
    choose("onednn")
    with pytest.raises(gemm.GemmUnavailable, match=r"onednn-not-installed is not installed \(pip install"):
        gemm.backend()
    choose("auto")
    assert gemm.backend() == "torch"  # auto falls back without the package


def test_a_library_that_does_not_load_is_an_error_under_onednn_and_skipped_under_auto(
    choose, intel, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    intel(False)
    broken = tmp_path / "libdnnl.so.3"
    broken.write_bytes(b"not a shared library")
    monkeypatch.setattr(gemm, "_library_path", lambda: str(broken))
    choose("onednn")
    with pytest.raises(
        gemm.GemmUnavailable, match=r"ATTNLAB_GEMM=onednn, but oneDNN cannot be used: .*libdnnl"
    ):
        gemm.backend()
    choose("auto")
    assert gemm.backend() == "torch"


def test_a_distribution_outside_site_packages_is_never_loaded(
    choose, intel, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """A `.dist-info` folder in the working directory (on `sys.path` under `python -m`) names files of its
    own: their library must not be loaded in place of the installed package's."""
    info = tmp_path / "onednn_cpu_gomp-2023.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: onednn-cpu-gomp\nVersion: 2023.2.0\n")
    (info / "RECORD").write_text("libdnnl.so.3,,\n")
    (tmp_path / "libdnnl.so.3").write_bytes(b"planted")
    monkeypatch.syspath_prepend(str(tmp_path))
    intel(False)
    assert gemm.metadata.distribution(gemm.DISTRIBUTION).locate_file("") == tmp_path  # it is found first
    choose("onednn")
    with pytest.raises(gemm.GemmUnavailable, match=r"outside the interpreter's site-packages"):
        gemm.backend()
    choose("auto")
    assert gemm.backend() == "torch"
