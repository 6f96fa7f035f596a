"""Linear layers, y = x Wᵀ + b, with a fast path for inference on the CPU.

Training runs `F.linear` on the weight (out, in), exactly as `nn.Linear` does. Without autograd on the
CPU (decoding, validation), products run on oneDNN's GEMM where installed (`attnlab.model.gemm`), and
otherwise `project` picks the operand layout MKL is fastest with for the number of rows (one per sentence
and beam in a decoding step; see `project`); for several layers reading the
same input (W_q, W_k, W_v of self-attention), multiplies once by their concatenated weights: one wide
product reads memory better than three narrow ones. Measured on a 2-core EPYC: 8000 × 256 output
projection, one row, x @ W (in, out) 0.8 ms vs F.linear 1.9 ms (weights not in cache). The copies are
cached per layer group and rebuilt when a weight changes (its version counter or storage) and after every
optimizer step (torch's fused Adam updates parameters in place without bumping their version counters),
so they cost up to one extra copy of the linear weights while a model is used for inference.

What the cache cannot see: a write through a parameter's `.data` (`p.data.copy_(...)`), which bypasses the
version counter PyTorch tracks in-place changes with (autograd does not see it either). After such
writes, call `forget_packed()` before decoding again. Layers whose weight or bias is computed rather
than a registered parameter (pruning, `torch.nn.utils.parametrize`) and parameters made under
`torch.inference_mode()` (which have no version counter) are never packed: they run `F.linear`.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from attnlab.model import gemm

# first layer of a group -> {(layout, layer ids): (weights' versions and storages, concatenated weight, bias)}
_PACKED: weakref.WeakKeyDictionary[nn.Linear, dict[tuple, tuple[tuple, Tensor, Tensor | None]]]
_PACKED = weakref.WeakKeyDictionary()


def forget_packed(*_: object) -> None:
    """Drop every cached copy of concatenated or transposed weights: the next inference product copies the
    layers' weights again. Called after any torch optimizer's step; call it after changing weights
    through `.data` (see the module docstring)."""
    _PACKED.clear()


register_optimizer_step_post_hook(forget_packed)


def packable(layer: nn.Linear) -> bool:
    """Whether `layer`'s weight and bias are its own registered parameters (not computed by pruning or a
    parametrization) and have version counters (not made under inference mode): what the cache keys on."""
    params = layer._parameters
    weight, bias = params.get("weight"), params.get("bias")
    return (
        weight is not None
        and "bias" in params
        and not weight.is_inference()
        and (bias is None or not bias.is_inference())
    )


_compiling = getattr(torch.compiler, "is_compiling", lambda: False)  # torch >= 2.3


class Linear(nn.Linear):
    """`nn.Linear` (same parameters and state-dict keys) using `project`'s inference fast path."""

    def forward(self, x: Tensor) -> Tensor:
        return project(x, self)[0]


def project(x: Tensor, *layers: nn.Linear) -> tuple[Tensor, ...]:
    """x (..., in) through each of `layers` (all reading x): one output (..., out_i) per layer.

    With autograd, under `torch.compile`, off the CPU or for a layer that is not `packable`: `F.linear`
    per layer. Otherwise one matrix
    product with the layers' weights concatenated (cached), its result split per layer (views): for one
    row, x (1, in) @ W (in, Σ out); for 2–16 rows (the beams of one sentence), (W (Σ out, in) @ xᵀ)ᵀ,
    which MKL streams without packing the weight on the AMD CPU it was measured on — 2.2× faster than
    either layout of x Wᵀ for 5 rows of the 8000 × 256 output projection; for more rows, and for every row
    count on Intel CPUs (`gemm.intel_cpu`), x @ W (in, Σ out). Float32 products of at least
    `gemm.MIN_PRODUCT` multiply-adds run on oneDNN where `attnlab.model.gemm` loads it, as x @ W (in, Σ out)
    for any number of rows.
    """
    if torch.is_grad_enabled() or x.device.type != "cpu" or _compiling() or not all(map(packable, layers)):
        return tuple(F.linear(x, layer.weight, layer.bias) for layer in layers)
    flat = x.reshape(-1, x.size(-1))
    rows_first = _rows_first(flat, sum(layer.out_features for layer in layers))
    out = _multiply(flat, *_packed(layers, rows_first), rows_first)
    out = out.view(*x.shape[:-1], out.size(-1))
    if len(layers) == 1:
        return (out,)
    return out.split([layer.out_features for layer in layers], dim=-1)


class Product:
    """`project`'s CPU inference product of rows (N, in) with the layers' concatenated weights, as one
    (N, Σ out) result, with the weights looked up once per layout instead of once per call: a decoding
    loop (`attnlab.decoding.step`) holds one per layer group for the length of a search.

    Only for inference (no autograd) on the CPU, of `packable` layers, as `project` uses it; the layout
    follows N on each call.
    """

    __slots__ = ("_layouts", "layers", "outputs")

    def __init__(self, *layers: nn.Linear) -> None:
        self.layers = layers
        self.outputs = sum(layer.out_features for layer in layers)  # Σ out
        self._layouts: dict[bool, tuple[Tensor, Tensor | None]] = {}

    def __call__(self, flat: Tensor) -> Tensor:
        rows_first = _rows_first(flat, self.outputs)
        packed = self._layouts.get(rows_first)
        if packed is None:
            packed = self._layouts[rows_first] = _packed(self.layers, rows_first)
        return _multiply(flat, *packed, rows_first)


def _rows_first(flat: Tensor, outputs: int) -> bool:
    """Whether rows (N, in) are multiplied by a weight of `outputs` rows as x @ W (in, out): 1 row or more
    than 16 (see `project`), and any number of rows for a product oneDNN takes (`attnlab.model.gemm`),
    fastest in that layout at every row count, or on an Intel CPU (`gemm.intel_cpu`), where MKL's own
    kernels are fastest in it too (for 5 rows of 256 × 768, 147 GFLOP/s against 41 for (W xᵀ)ᵀ on a 2-core
    Xeon; docs/benchmarks.md, "On an Intel CPU"; measured in float32, taken for every dtype)."""
    return (
        not 1 < flat.size(0) <= 16
        or gemm.intel_cpu()
        or gemm.takes(flat.size(0), flat.size(1), outputs, flat.dtype)
    )


def _multiply(flat: Tensor, weight: Tensor, bias: Tensor | None, rows_first: bool) -> Tensor:
    """(N, Σ out) = flat Wᵀ + b with the weight in `_packed`'s layout for `rows_first`."""
    if rows_first:
        if gemm.applies(flat, weight, bias):
            return gemm.linear(flat, weight, bias)
        return torch.mm(flat, weight) if bias is None else torch.addmm(bias, flat, weight)
    out = torch.mm(weight, flat.t()) if bias is None else torch.addmm(bias[:, None], weight, flat.t())
    return out.t().contiguous()


def _check_packable(layers: tuple[nn.Linear, ...], params: list[Tensor]) -> None:
    """The layers of an inference product need one dtype and (out,) biases: `torch.cat` would otherwise
    promote a bias or weight of another dtype where each layer's own `F.linear` raises (or fail obscurely
    on a 0-d bias, which `F.linear` broadcasts: refused here with the same clear error)."""
    odd = len({p.dtype for p in params}) > 1 or any(
        layer.bias is not None and tuple(layer.bias.shape) != (layer.out_features,) for layer in layers
    )
    if odd:
        found = ", ".join(
            f"weight {tuple(layer.weight.shape)} {layer.weight.dtype}"
            + ("" if layer.bias is None else f", bias {tuple(layer.bias.shape)} {layer.bias.dtype}")
            for layer in layers
        )
        raise RuntimeError(
            f"the linear layers of an inference product need weights and biases of one dtype and biases of "
            f"shape (out_features,); got: {found}. Give every layer's parameters one dtype (module.to(dtype))"
        )


def _packed(layers: tuple[nn.Linear, ...], transposed: bool) -> tuple[Tensor, Tensor | None]:
    """The layers' weights concatenated, (in, Σ out) if `transposed` else (Σ out, in), and biases."""
    if len(layers) == 1 and not transposed:
        return layers[0].weight, layers[0].bias
    # every decoding step asks, once per layer group: read the parameters from each layer's dict (not
    # through nn.Module.__getattr__) and compare flat tuples of ints
    params = [p for layer in layers for p in layer._parameters.values() if p is not None]
    state = tuple(n for p in params for n in (p._version, p.data_ptr()))
    group = _PACKED.get(layers[0])
    if group is None:
        group = _PACKED[layers[0]] = {}
    key = (transposed, *map(id, layers))
    cached = group.get(key)
    if cached is not None and cached[0] == state:
        return cached[1], cached[2]
    _check_packable(layers, params)
    with torch.inference_mode(False), torch.no_grad():  # ordinary tensors, usable outside inference mode
        weight = torch.cat([layer.weight for layer in layers])  # (Σ out, in)
        weight = weight.t().contiguous() if transposed else weight
        bias = None
        if any(layer.bias is not None for layer in layers):
            bias = torch.cat([
                layer.weight.new_zeros(layer.out_features) if layer.bias is None else layer.bias
                for layer in layers
            ])  # fmt: skip
    group[key] = (state, weight, bias)
    return weight, bias
