"""oneDNN's single-precision matrix product (`dnnl_sgemm`) for the CPU inference products of
`attnlab.model.linear` (decoding, validation, the encoder in translation), where it is faster than the
MKL products torch runs.

Why: on the machine the benchmarks run on (AMD EPYC, AVX2, 2 threads) MKL takes a generic code path on
non-Intel CPUs; oneDNN's own GEMM kernels ran the decoder's products 1.2-3× faster at 1-64 rows (the
(64, 256) × (256, 5000) output projection 1.4×, five rows 3×) and 0.96-1.5× at 320, and made greedy
decoding of test2016 at batch 64 1.13-1.33× faster with the same outputs (docs/benchmarks.md,
"Decoding"). This is the
library CTranslate2 multiplies with on such CPUs. On Intel CPUs MKL runs kernels of its own, and there
torch's products are kept (`intel_cpu`): on a 2-core Intel Xeon (AVX-512) oneDNN ran the decoder's 1-16-row
products at 0.5-0.9× the speed of MKL's x @ W (in, out) (but for the feed-forward layer's second, 1024
wide), and MKL with that layout at every row count decoded test2016 1.00-1.12× as fast as oneDNN
(docs/benchmarks.md, "On an Intel CPU").

Where from: the `onednn-cpu-gomp` wheel (Linux x86-64, a dependency there), the oneDNN build that runs its
threads on the GNU OpenMP runtime torch's CPU wheels ship, so both share one thread pool. The library is
looked up only among that installed package's own files, never on a search path, and only when the package
lies in the interpreter's site-packages. oneDNN takes as many
threads as torch's ops (`torch.get_num_threads()` sets the calling thread's OpenMP count first).

`ATTNLAB_GEMM` (read once per process): `auto` (default) uses oneDNN where the package is installed and the
CPU has AVX2 and is not Intel's, torch's products otherwise; `onednn` requires it (an error says why it
cannot load); `torch` never uses it. Training (autograd), CPU autocast, and every non-CPU or non-float32
product always run torch's. At its first use, the library must prove it runs on torch's OpenMP runtime
(it follows a change of torch's thread count), or it is not used.

The same function, not the same bits: oneDNN sums in another order than MKL, so products differ by float
rounding (relative ~1e-7, as between MKL's own layouts); `backend()` names the one in use and run
manifests record it (`hardware()["inference_gemm"]`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import site
import sysconfig
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

import torch
from torch import Tensor

from attnlab.typed import ConfigError

ENV = "ATTNLAB_GEMM"
CHOICES = ("auto", "onednn", "torch")
DISTRIBUTION = "onednn-cpu-gomp"
_RUNTIME_OMP = 2  # dnnl_version_t.cpu_runtime of an OpenMP build (oneDNN's DNNL_RUNTIME_OMP)
_ISA_AVX2 = 0x7  # the bits of dnnl_cpu_isa_avx2; every later x86 ISA includes them
# The smallest product (multiply-adds) oneDNN takes. Below it a call's fixed cost (ctypes, oneDNN's dispatch,
# the bias copy) outweighs the faster kernels: single-sentence greedy decoding, whose products are one row
# through 256 × 256 to 256 × 768 layers, ran at 1.05× torch's speed with 2^18, 0.98-1.01× with 2^17 and 0.95×
# with every product on oneDNN; single-sentence beam 5 at 1.12× with 2^18 (docs/benchmarks.md, "Decoding").
MIN_PRODUCT = 1 << 18


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint),
                ("gpu_runtime", ctypes.c_uint)]  # fmt: skip


class GemmUnavailable(ConfigError):
    """`ATTNLAB_GEMM` is not a choice, or `onednn` where oneDNN cannot be used (the commands print it as a
    config error)."""


class _OneDNN:
    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        version_of = lib.dnnl_version
        version_of.restype = ctypes.POINTER(_Version)
        v = version_of().contents
        if v.cpu_runtime != _RUNTIME_OMP:
            raise GemmUnavailable(f"{path} is not an OpenMP build of oneDNN (runtime {v.cpu_runtime})")
        lib.dnnl_get_effective_cpu_isa.restype = ctypes.c_int
        if lib.dnnl_get_effective_cpu_isa() & _ISA_AVX2 != _ISA_AVX2:
            raise GemmUnavailable("this CPU has no AVX2, where oneDNN's GEMM is not faster than MKL's")
        self.max_threads = lib.omp_get_max_threads  # of the OpenMP runtime oneDNN runs on
        if not _shares_torchs_threads(self.max_threads):
            raise GemmUnavailable(
                f"{path} runs on an OpenMP runtime other than torch's, whose thread count it would not follow"
            )
        self.name = f"oneDNN {v.major}.{v.minor}.{v.patch} sgemm"
        i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
        self.sgemm = lib.dnnl_sgemm
        char = ctypes.c_char
        self.sgemm.argtypes = [char, char, i64, i64, i64, f32, ptr, i64, ptr, i64, f32, ptr, i64]
        self.sgemm.restype = ctypes.c_int


def _shares_torchs_threads(max_threads: Callable[[], int]) -> bool:
    """Whether `max_threads` (the `omp_get_max_threads` oneDNN binds to) reads the OpenMP runtime torch sets:
    it must follow a change of torch's thread count. torch's count is restored."""
    threads = torch.get_num_threads()
    probe = threads + 1 if threads < 2 else threads - 1
    try:
        torch.set_num_threads(probe)
        return max_threads() == probe
    finally:
        torch.set_num_threads(threads)


def _site_directories() -> set[Path]:
    """Where the interpreter installs packages: a distribution found elsewhere (a `.dist-info` folder in the
    working directory, say) is no installed package, and its library is never loaded."""
    paths = sysconfig.get_paths()
    found = [*site.getsitepackages(), site.getusersitepackages(), paths["purelib"], paths["platlib"]]
    return {Path(p).resolve() for p in found}


def _library_path() -> str:
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise GemmUnavailable(f"{DISTRIBUTION} is not installed (pip install {DISTRIBUTION})") from None
    where = Path(dist.locate_file("")).resolve()
    if where not in _site_directories():
        raise GemmUnavailable(f"{DISTRIBUTION} was found in {where}, outside the interpreter's site-packages")
    for file in dist.files or ():
        if file.name == "libdnnl.so.3":
            return str(dist.locate_file(file))
    raise GemmUnavailable(f"{DISTRIBUTION} {dist.version} installed no libdnnl.so.3")


@functools.cache
def _onednn() -> _OneDNN | None:
    """The loaded library per `ATTNLAB_GEMM`, or None for torch's products (cached for the process)."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise GemmUnavailable(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "torch" or (choice == "auto" and intel_cpu()):
        return None
    try:
        return _OneDNN(_library_path())
    except (GemmUnavailable, OSError, AttributeError) as error:
        if choice == "onednn":
            raise GemmUnavailable(f"{ENV}=onednn, but oneDNN cannot be used: {error}") from error
        return None


CPUINFO = Path("/proc/cpuinfo")


@functools.cache
def intel_cpu() -> bool:
    """Whether the CPU is Intel's (Linux's `/proc/cpuinfo` says `vendor_id: GenuineIntel`; False where it
    cannot be read). There MKL, the library of torch's CPU products on x86, runs kernels of its own for the
    CPU, faster than oneDNN's at decoding's row counts (module docstring): `ATTNLAB_GEMM=auto` keeps torch's
    products, and `attnlab.model.linear` multiplies rows first at every row count."""
    try:
        with CPUINFO.open(encoding="utf-8", errors="replace") as info:
            return vendor(info) == "GenuineIntel"
    except OSError:
        return False


def vendor(cpuinfo: Iterable[str]) -> str | None:
    """The first `vendor_id` of `/proc/cpuinfo`'s lines, or None without one."""
    for line in cpuinfo:
        key, colon, value = line.partition(":")
        if colon and key.strip() == "vendor_id":
            return value.strip()
    return None


def backend() -> str:
    """The inference products in use: "oneDNN <version> sgemm" or "torch"."""
    library = _onednn()
    return "torch" if library is None else library.name


def available() -> bool:
    """Whether CPU float32 inference products of `MIN_PRODUCT` or more run on oneDNN (`ATTNLAB_GEMM`)."""
    return _onednn() is not None


def takes(rows: int, inner: int, outer: int, dtype: torch.dtype) -> bool:
    """Whether a CPU product (rows, inner) × (inner, outer) of `dtype` runs on oneDNN: oneDNN in use,
    float32, no CPU autocast (whose products torch runs in its lower precision), and at least
    `MIN_PRODUCT` multiply-adds (below, a call's fixed cost outweighs its kernels)."""
    return (
        _onednn() is not None
        and dtype == torch.float32
        and rows * inner * outer >= MIN_PRODUCT
        and not _cpu_autocast()
    )


def _cpu_autocast() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled()


def applies(flat: Tensor, weight: Tensor, bias: Tensor | None = None) -> bool:
    """Whether `linear(flat, weight, bias)` may run: `takes` the product, on contiguous 2-d CPU tensors,
    with no bias or one of the product's dtype (never cast: torch's product, which gets anything else,
    raises its own error). A bias of another shape or device fails in `linear` as in torch's product; only
    the dtype is checked here, as this runs on every decoding product (a 5-row product by 256 × 768 takes
    about 36 µs): shape and device checks as well made a call 5.1 instead of 3.7 µs. Reading each shape
    once and `is_cpu` instead of `device.type` took the call from 3.7 to 1.8 µs (timeit, one row by
    256 × 1024 with a bias)."""
    shape, weight_shape = flat.shape, weight.shape
    return (
        len(shape) == 2
        and len(weight_shape) == 2
        and shape[1] == weight_shape[0]
        and weight.dtype == flat.dtype
        and takes(shape[0], shape[1], weight_shape[1], flat.dtype)
        and flat.is_cpu
        and weight.is_cpu
        and flat.is_contiguous()
        and weight.is_contiguous()
        and not (flat.is_neg() or weight.is_neg())  # a lazily negated view's memory holds the other sign
        and (bias is None or bias.dtype == flat.dtype)
    )


def linear(flat: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """flat (M, K) @ weight (K, N) + bias (N,), as a new (M, N) tensor, by `dnnl_sgemm` (`applies(flat,
    weight, bias)` must hold). Nothing it is given is written to."""
    library = _onednn()
    m, k = flat.shape
    n = weight.size(1)
    out = flat.new_empty(m, n)
    beta = 0.0
    if bias is not None:  # C = bias, then C += A·B: the bias is copied in first, never written to
        out.copy_(bias.expand(m, n))
        beta = 1.0
    torch.get_num_threads()  # sets this thread's OpenMP thread count to torch's, for oneDNN to follow
    status = library.sgemm(b"N", b"N", m, n, k, 1.0, flat.data_ptr(), k, weight.data_ptr(), n, beta,
                           out.data_ptr(), n)  # fmt: skip
    if status != 0:
        raise RuntimeError(f"dnnl_sgemm failed with status {status} for ({m}, {k}) × ({k}, {n})")
    return out
