"""The decoder's incremental step for CPU inference, as plain tensor operations over the model's own
weights: what greedy and beam search run on the CPU instead of `Transformer.decode` with a `KVCache`.

Why: a decoding step computes little per operator (one query row per sentence and beam), so on the CPU
its time goes to operator calls, module dispatch and the cache's per-step concatenation as much as to
arithmetic. `StepDecoder` computes the same function without module calls and with fewer, cheaper
operator calls (11-14% fewer in a greedy step at batch 1; docs/benchmarks.md): self-attention keys and
values are written in place into preallocated buffers, doubled when full (no per-step concatenation);
cross-attention keys and values are projected once and stored in the layout the step multiplies with;
attention is three batched products (scores with the mask and the scale in one `baddbmm`, softmax,
values); each linear layer group is one `attnlab.model.linear.Product` whose weights are looked up once
per search. Single sentences decode faster than through the modules, batches of 64 about as fast or a
little faster (measured: docs/benchmarks.md, "Decoding").

The same function, not the same bits: attention is computed in another order than
`F.scaled_dot_product_attention`, so logits differ from `Transformer.decode`'s by float rounding
(`tests/unit/test_step_decoder.py` holds them to 1e-5 and the outputs to equality on a translating model).
The searches use it only where `StepDecoder.applies`: CPU, eval mode, no autograd, not under
`torch.compile`, and no attention weights asked for (the module path returns them). Elsewhere they run
`ModuleStep`, the model's own `decode` behind the same interface; `decoding_step` picks one of the two, so
each search is written once for both.

Notation: `B` sentences, `K` beams per sentence, `N` = B·K decoder rows (sentence-major: row b·K + j is
beam j of sentence b), `H` heads, `Dh` head width, `S` source length, `L` positions the buffers hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module

from attnlab.model.linear import Product, _compiling, packable
from attnlab.model.transformer import Transformer

# modules whose training flag changes nothing they compute; any other decoder module in training mode
# keeps the searches on the modules, which may then run dropout (`StepDecoder.applies`)
_STATELESS = (nn.Embedding, nn.Linear, nn.LayerNorm)
_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}
_OWN_MODULES = ("attnlab.", "torch.nn.")  # where the classes the step may stand in for are defined
# positions a search's keys and values are first held for: `StepDecoder`'s first buffers; both steps check
# the memory before each doubling past them (`memory_check`)
FIRST_POSITIONS = 16
# every module's forward hooks (`nn.modules.module.register_module_forward_pre_hook` / `_hook`)
_global_hooks = {"pre": getattr(_module, "_global_forward_pre_hooks", None),
                 "post": getattr(_module, "_global_forward_hooks", None)}  # fmt: skip


class _Layer:
    """One decoder layer's weights as products, its norms, and its per-search state."""

    __slots__ = ("cross_keys", "cross_out", "cross_q", "cross_values", "ffn_in", "ffn_out", "keys", "norms",
                 "qkv", "self_out", "values")  # fmt: skip

    def __init__(self, layer: torch.nn.Module) -> None:
        sa, ca = layer.self_attn, layer.cross_attn
        self.qkv = Product(sa.w_q, sa.w_k, sa.w_v)
        self.self_out = Product(sa.w_o)
        self.cross_q = Product(ca.w_q)
        self.cross_out = Product(ca.w_o)
        self.ffn_in = Product(layer.ffn.w_1)
        self.ffn_out = Product(layer.ffn.w_2)
        blocks = (layer.self_attn_block, layer.cross_attn_block, layer.ffn_block)
        self.norms = [(block.norm.weight, block.norm.bias, block.norm.eps) for block in blocks]


def _reads_plain_weights(model: Transformer) -> bool:
    """Whether the step, which reads the decoder's and the output layer's weights without calling their
    modules, computes what the modules would: each of a class of attnlab or torch.nn (a user's subclass,
    a LoRA layer say, may compute something else), in eval mode (but for modules whose flag changes
    nothing, `_STATELESS`), no forward hooks (global or on a module: pruning recomputes a weight in one),
    no parametrizations, and linear layers the product cache can follow (`linear.packable`). One pass
    over the modules per search (67 µs for a 3-layer decoder, where the training flags alone took 54)."""
    if _global_hooks.get("pre") or _global_hooks.get("post"):
        return False
    for module in (*model.decoder.modules(), model.output):
        if module._forward_pre_hooks or module._forward_hooks or "parametrizations" in module._modules:
            return False
        if not type(module).__module__.startswith(_OWN_MODULES):  # a user's class may compute otherwise
            return False
        if module.training and not isinstance(module, _STATELESS):
            return False
        if isinstance(module, nn.Linear) and not packable(module):
            return False
    return True


class StepDecoder:
    """Incremental decoding for B sentences × K beams over their encoder output.

    Args:
        model: The Transformer (`applies(model, memory)` must hold).
        memory: Encoder output (B, S, D).
        src_mask: (B, S), True at real source tokens; None: no padding.
        beams: K decoder rows per sentence.
        capacity: The most positions the search may need (its longest output). Buffers for
            min(capacity, `FIRST_POSITIONS`) positions are allocated first and doubled when full: they
            hold at most max(16, 2·T) positions after T steps, where a `KVCache` holds T.
        memory_check: Called before the buffers are doubled, with the step, the decoder rows and the
            float32 numbers each row's buffers grow by (their keys and values for as many positions as
            they held, in every layer): a search's check that the memory is there (it raises if not).

    Call it with the newest token of each row (N, 1) to get the logits (N, 1, V); `reorder` follows
    surviving beams and drops finished sentences, as `KVCache.reorder` does. The first call may also take
    one row per sentence (B, 1) (`narrow_start`): beam search's first step, where only the first beam of
    each sentence is live; the first `reorder` then makes the K beams from those rows.
    """

    narrow_start = True  # the first call may take one row per sentence (see above)
    fresh_logits = True  # each call's logits are a new tensor no one else holds: a search may write into them

    def __init__(
        self,
        model: Transformer,
        memory: Tensor,
        src_mask: Tensor | None,
        *,
        beams: int = 1,
        capacity: int = 32,
        memory_check: Callable[[int, int, int], None] | None = None,
    ) -> None:
        capacity = max(1, min(capacity, FIRST_POSITIONS))
        self.memory_check = memory_check
        cfg = model.config
        self.heads, self.d_head = cfg.n_heads, cfg.head_dim
        self.inner = self.heads * self.d_head
        self.beams = beams
        self.scale = 1.0 / math.sqrt(self.d_head)
        self.norm_first = cfg.norm_first
        self.activation = _ACTIVATIONS[cfg.activation]
        embed = model.decoder.embed
        self.token, self.embed_scale = embed.token.weight, embed.scale
        self._encodings = embed.positions  # the position encoding module, or None
        self._position_limit = cfg.position_limit  # a learned table's size, None if unbounded
        self.positions = None  # (L, D) encodings of the positions the buffers hold
        self.final_norm = model.decoder.norm
        self.output = Product(model.output)
        self.length = 0
        batch, source = memory.shape[:2]
        rows, h, dh = batch * beams, self.heads, self.d_head
        flat_memory = memory.reshape(batch * source, -1)
        self.layers = [_Layer(layer) for layer in model.decoder.layers]
        for layer, module in zip(self.layers, model.decoder.layers, strict=True):
            kv = Product(module.cross_attn.w_k, module.cross_attn.w_v)(flat_memory)  # (B·S, 2·H·Dh)
            k, v = kv.view(batch, source, 2, h, dh).unbind(2)  # (B, S, H, Dh) each
            layer.cross_keys = k.permute(0, 2, 3, 1).reshape(batch * h, dh, source)  # (B·H, Dh, S)
            layer.cross_values = v.transpose(1, 2).reshape(batch * h, source, dh)  # (B·H, S, Dh)
            layer.keys = memory.new_empty(rows * h, capacity, dh)  # (N·H, L, Dh)
            layer.values = memory.new_empty(rows * h, capacity, dh)  # (N·H, L, Dh)
        self._position_table(capacity, memory)
        self.bias = None  # (B·H, 1, S): 0 where a source position may be attended, -inf at padding
        if src_mask is not None:
            # A source of padding only (no real token) gets cross-attention output 0, as from the modules'
            # fused attention, instead of a softmax over nothing but -inf (NaN): it attends evenly to
            # values set to 0.
            empty = ~src_mask.any(dim=1)  # (B,)
            if bool(empty.any()):
                for layer in self.layers:
                    layer.cross_values.view(batch, h, source, dh)[empty] = 0.0
            bias = torch.zeros(src_mask.shape, dtype=memory.dtype, device=memory.device)
            bias = bias.masked_fill_(~src_mask & ~empty[:, None], -math.inf)  # (B, S)
            self.bias = bias[:, None, None, :].expand(batch, h, 1, source).reshape(batch * h, 1, source)

    @staticmethod
    def applies(model: Transformer, memory: Tensor, need_weights: bool = False) -> bool:
        """Whether a search may decode with a `StepDecoder`: CPU inference in eval mode, no attention
        weights wanted, and the model a `Transformer` whose `decode` is `Transformer.decode` (a subclass
        that changes it is decoded through it; so are wrappers such as `torch.compile`'s). Eval mode means
        the model and every module of its decoder except embedding tables, linear layers and LayerNorms
        (whose flag changes nothing: the table may be shared with an encoder in training): the step has
        no dropout, and a decoder module left in training mode may run some, so it keeps the modules
        even where its dropout would not run after all. The step reads the weights and calls no module,
        so a decoder (or output layer) whose modules have forward hooks (pruning's among them) or
        parametrizations, or whose linear layers are not `linear.packable`, is decoded through its modules
        too. Otherwise the searches run the model's `decode` with its `KVCache`."""
        return not (
            need_weights
            or model.training
            or memory.device.type != "cpu"
            or torch.is_grad_enabled()
            or _compiling()
            or not isinstance(model, Transformer)
            or type(model).decode is not Transformer.decode
            or not _reads_plain_weights(model)
        )

    def _norm(self, x: Tensor, norm: tuple[Tensor, Tensor, float]) -> Tensor:
        return torch.layer_norm(x, x.shape[-1:], norm[0], norm[1], norm[2])

    def _add(self, x: Tensor, h: Tensor, norm: tuple[Tensor, Tensor, float]) -> Tensor:
        """The residual connection around a sublayer's output h: x + h (pre-norm), or LayerNorm(x + h)."""
        return x + h if self.norm_first else self._norm(x + h, norm)

    def _position_table(self, capacity: int, like: Tensor) -> None:
        if self._encodings is not None:  # a learned table has no positions past its size: neither do searches
            limit = capacity if self._position_limit is None else min(capacity, self._position_limit)
            self.positions = self._encodings(limit, 0, like.device).to(like.dtype)  # (L, D)

    def _grow(self) -> None:
        held = self.layers[0].keys.size(1)  # positions the buffers hold: they grow by as many
        if self.memory_check is not None:
            rows = self.layers[0].keys.size(0) // self.heads
            self.memory_check(self.length, rows, 2 * len(self.layers) * self.inner * held)
        self._position_table(2 * held, self.layers[0].keys)
        for layer in self.layers:
            for name in ("keys", "values"):
                old = getattr(layer, name)  # (N·H, L, Dh)
                new = old.new_empty(old.size(0), 2 * old.size(1), old.size(2))
                new.narrow(1, 0, self.length).copy_(old.narrow(1, 0, self.length))
                setattr(layer, name, new)

    def __call__(self, tokens: Tensor) -> Tensor:
        """Logits (N, 1, V) of the next token after each row's `tokens` (N, 1), its newest token."""
        t = self.length
        if t == self.layers[0].keys.size(1):
            self._grow()
        rows, h, dh, inner = tokens.size(0), self.heads, self.d_head, self.inner
        x = self.token.index_select(0, tokens.view(-1)) * self.embed_scale  # (N, D)
        if self.positions is not None:
            x = x + self.positions[t]
        k, first = self.beams, self.norm_first
        narrow = rows * h != self.layers[0].keys.size(0)
        if narrow:  # only a first call may take one row per sentence (`narrow_start`)
            sentences = self.layers[0].cross_keys.size(0) // h
            if t != 0 or rows != sentences:
                raise ValueError(
                    f"{rows} decoder rows at step {t} for {sentences} sentences × {k} beams: "
                    f"give {sentences * k}, or {sentences} (one per sentence) at the first step only"
                )
            k = 1
        for layer in self.layers:
            # self-attention over this row's positions so far, this step's keys and values written in place
            keys, values = layer.keys, layer.values  # (N·H, L, Dh)
            if narrow:  # one row per sentence: the buffers' first B rows
                keys, values = keys.narrow(0, 0, rows * h), values.narrow(0, 0, rows * h)
            h_in = self._norm(x, layer.norms[0]) if first else x
            qkv = layer.qkv(h_in)  # (N, 3·H·Dh)
            # (N, H, Dh) views of this step's keys and values, copied once into position t
            keys.view(rows, h, -1, dh).select(2, t).copy_(qkv.narrow(1, inner, inner).view(rows, h, dh))
            values.view(rows, h, -1, dh).select(2, t).copy_(qkv.narrow(1, 2 * inner, inner).view(rows, h, dh))
            q = qkv.narrow(1, 0, inner).reshape(rows * h, 1, dh)
            keys = keys.narrow(1, 0, t + 1).transpose(1, 2)  # (N·H, Dh, t+1)
            scores = torch.bmm(q, keys).mul_(self.scale).softmax(dim=-1)  # (N·H, 1, t+1)
            out = torch.bmm(scores, values.narrow(1, 0, t + 1)).view(rows, inner)  # (N·H, 1, Dh)
            x = self._add(x, layer.self_out(out), layer.norms[0])
            # cross-attention: the K beams of a sentence are its K queries, (B·H, K, Dh)
            h_in = self._norm(x, layer.norms[1]) if first else x
            q = layer.cross_q(h_in)
            q = q.view(rows * h, 1, dh) if k == 1 else q.view(-1, k, h, dh).transpose(1, 2).reshape(-1, k, dh)
            if self.bias is None:
                scores = torch.bmm(q, layer.cross_keys).mul_(self.scale)  # (B·H, K, S)
            else:
                scores = torch.baddbmm(self.bias, q, layer.cross_keys, alpha=self.scale)
            out = torch.bmm(scores.softmax(dim=-1), layer.cross_values)  # (B·H, K, Dh)
            out = out.view(-1, h, k, dh).transpose(1, 2) if k > 1 else out
            out = out.reshape(rows, inner)
            x = self._add(x, layer.cross_out(out), layer.norms[1])
            # position-wise feed-forward
            h_in = self._norm(x, layer.norms[2]) if first else x
            x = self._add(x, layer.ffn_out(self.activation(layer.ffn_in(h_in))), layer.norms[2])
        if self.final_norm is not None:
            x = self.final_norm(x)
        self.length = t + 1
        return self.output(x)[:, None]  # (N, 1, V)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep decoder rows `rows` (N',) and, when given, sentences `sentences` (B',) (as `KVCache`); after
        a narrow first call, `rows` index its B rows and make the N' = B'·K rows of the beams."""
        h, t = self.heads, self.length
        for layer in self.layers:  # only the t positions written so far are copied
            for name in ("keys", "values"):
                buffer = getattr(layer, name)  # (N·H, L, Dh)
                grouped = buffer.view(-1, h, *buffer.shape[1:])  # (N, H, L, Dh)
                kept = grouped.new_empty(rows.numel(), *grouped.shape[1:])  # (N', H, L, Dh)
                torch.index_select(grouped.narrow(2, 0, t), 0, rows, out=kept.narrow(2, 0, t))
                setattr(layer, name, kept.view(-1, *buffer.shape[1:]))
            if sentences is not None:
                for name in ("cross_keys", "cross_values"):
                    value = getattr(layer, name)
                    grouped = value.view(-1, h, *value.shape[1:])
                    setattr(layer, name, grouped.index_select(0, sentences).view(-1, *value.shape[1:]))
        if sentences is not None and self.bias is not None:
            self.bias = (
                self.bias.view(-1, h, 1, self.bias.size(-1))
                .index_select(0, sentences)
                .view(-1, 1, self.bias.size(-1))
            )


class ModuleStep:
    """The searches' decoding step through the model's modules: `model.decode` over a `KVCache`, or with
    `use_cache=False` over the whole prefix at every step, with `StepDecoder`'s interface (call, then
    `reorder`), so that a search is written once for both. It also keeps the encoder output and source
    mask the modules read, and drops a finished sentence's rows from them.

    Call it with the newest token of each row (N, 1), or the whole prefix (N, t) when uncached, to get the
    logits (N, 1 | t, V), and with `need_weights` also each layer's cross-attention weights. Its
    `memory_check` is called as `StepDecoder`'s: before each call at step t, a power of two from
    `FIRST_POSITIONS` on, with the float32 numbers each row's cache grows by until step 2t (as many
    positions as it holds, in every layer; none when uncached). The model is
    called as the searches always called it, so that models of its own kind (`Ensemble`, subclasses) need
    no more: `need_weights` only when given (None: left to `decode`'s default) and `new_cache()` without
    arguments for one beam.
    """

    narrow_start = False  # every call takes K rows per sentence (`StepDecoder.narrow_start`)
    fresh_logits = False  # the logits are the model's (`StepDecoder.fresh_logits`)

    def __init__(
        self,
        model: Transformer,
        memory: Tensor,
        src_mask: Tensor | None,
        *,
        beams: int = 1,
        use_cache: bool = True,
        need_weights: bool | None = None,
        memory_check: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self.model, self.beams = model, beams
        self.memory_check, self.length = memory_check, 0
        self.cache = None
        if use_cache:
            self.cache = model.new_cache(beams=beams) if beams > 1 else model.new_cache()
        self.options = {} if need_weights is None else {"need_weights": need_weights}
        if self.cache is None and beams > 1:  # the uncached decoder takes the memory once per beam
            memory = memory.repeat_interleave(beams, dim=0)  # (N, S, D)
            src_mask = None if src_mask is None else src_mask.repeat_interleave(beams, dim=0)
        self.memory, self.src_mask = memory, src_mask

    def __call__(self, fed: Tensor) -> Tensor | tuple[Tensor, list[Tensor]]:
        t = self.length
        if self.memory_check is not None and t >= FIRST_POSITIONS and t & (t - 1) == 0:
            self.memory_check(t, fed.size(0), _floats_per_position(self.cache) * t)
        self.length = t + 1
        return self.model.decode(fed, self.memory, self.src_mask, cache=self.cache, **self.options)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep decoder rows `rows` (N',) and, when given, sentences `sentences` (B',) (as `KVCache`)."""
        if sentences is not None:  # the memory is one row per sentence, or per beam when uncached
            kept = sentences
            if self.cache is None and self.beams > 1:
                beams = torch.arange(self.beams, device=sentences.device)
                kept = (sentences[:, None] * self.beams + beams).view(-1)  # (B'·K,)
            self.memory = self.memory.index_select(0, kept)
            self.src_mask = None if self.src_mask is None else self.src_mask.index_select(0, kept)
        if self.cache is not None:
            self.cache.reorder(rows, sentences)


def _floats_per_position(cache: Any) -> int:
    """Float32 numbers a decoder row of a modules' cache holds per position: the keys and values of every
    layer of a `KVCache`; 0 without a cache, or for a cache of a model's own kind, which `ModuleStep` cannot
    see into (its memory is then not counted)."""
    floats = 0
    for layer in getattr(cache, "layers", None) or []:
        keys = getattr(layer, "self_k", None)
        if isinstance(keys, Tensor) and keys.dim() == 4:  # (N, H, T, Dh)
            floats += 2 * keys.size(1) * keys.size(3)
    return floats


def decoding_step(
    model: Transformer,
    memory: Tensor,
    src_mask: Tensor | None,
    *,
    beams: int = 1,
    capacity: int = 32,
    use_cache: bool = True,
    need_weights: bool | None = None,
    memory_check: Callable[[int, int, int], None] | None = None,
) -> StepDecoder | ModuleStep:
    """The step a search decodes with: a `StepDecoder` where it `applies` (and the cache is used),
    otherwise the model's modules (`ModuleStep`; `need_weights` as there), either with `memory_check` on
    the CPU (an accelerator's allocator raises its own out-of-memory error). Both are called once per step
    and reordered after it."""
    if use_cache and StepDecoder.applies(model, memory, bool(need_weights)):
        return StepDecoder(model, memory, src_mask, beams=beams, capacity=capacity, memory_check=memory_check)
    check = memory_check if memory.device.type == "cpu" else None
    return ModuleStep(model, memory, src_mask, beams=beams, use_cache=use_cache, need_weights=need_weights,
                      memory_check=check)  # fmt: skip
