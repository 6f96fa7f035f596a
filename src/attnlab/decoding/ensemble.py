"""Ensembles: several Transformers decoding as one model, combined at every step (fairseq's
`EnsembleModel`, `fairseq-generate --path a.pt:b.pt`).

Notation: `B` decoder rows, `T` decoder inputs, `S` source length, `V` target vocabulary size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnlab.model.cache import KVCache
from attnlab.model.config import TransformerConfig
from attnlab.model.transformer import Transformer

SHARED = ("tgt_vocab_size", "src_vocab_size", "pad_id", "bos_id", "eos_id", "start_id")


class Ensemble(nn.Module):
    """Models decoding together: at each step the next-token distribution is the mean of the models'
    probabilities, returned as its log, logsumexp_m(log p_m) - log n, as fairseq's `EnsembleModel` does.
    Not weight averaging (`average_last`): each model runs whole, with its own encoder output and its
    own K/V cache.

    It offers what greedy decoding and beam search use of a `Transformer` (`config`, `encode`,
    `decode`, `new_cache`), so both decode an ensemble unchanged: `encode` concatenates the models'
    encoder outputs along the feature axis (B, S, D_1 + ... + D_n), so that selecting sentences or beams
    selects them for every model; `new_cache` holds every model's decoder layers in one `KVCache`, each
    model reading and growing its own slice of it. `decode` returns the combined log-probabilities
    (B, T, V) in place of logits (a log-softmax leaves them unchanged) and, with `need_weights`, one
    cross-attention map, the models' last-layer maps averaged over heads and models (B, 1, T, S); one
    model goes through the same combination (its log-softmax), so an ensemble of one tests it.

    Args:
        models: The models; they must share the vocabularies and special ids (`SHARED`). The ensemble's
            `config` is the first model's, with the smallest position limit of them all.

    Raises:
        ValueError: No model, or models whose vocabularies or special ids differ (named).
    """

    def __init__(self, models: Sequence[Transformer]) -> None:
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        first = models[0].config
        for i, model in enumerate(models[1:], start=1):
            for name in SHARED:
                if getattr(model.config, name) != getattr(first, name):
                    raise ValueError(
                        f"model {i} of the ensemble has {name}={getattr(model.config, name)} but model 0 "
                        f"has {getattr(first, name)}: an ensemble's models must share vocabularies and ids"
                    )
        self.models = nn.ModuleList(models)
        limits = [m.config for m in models if m.config.position_limit is not None]
        self.config: TransformerConfig = min(limits, key=lambda c: c.position_limit) if limits else first
        self._widths = [m.config.d_model for m in models]
        self._layers = [m.config.n_decoder_layers for m in models]

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> the models' encoder outputs side by side (B, S, ΣD) and the source mask (B, S)."""
        outputs = [model.encode(src) for model in self.models]
        return torch.cat([memory for memory, _ in outputs], dim=-1), outputs[0][1]

    def new_cache(self, beams: int = 1) -> KVCache:
        """One cache holding every model's decoder layers, model after model."""
        return KVCache([layer for model in self.models for layer in model.new_cache(beams).layers])

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        *,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """The combined next-token log-probabilities (B, T, V) for decoder inputs `tgt` (B, T)."""
        lprobs, maps, start = [], [], 0
        for model, part, n in zip(self.models, memory.split(self._widths, dim=-1), self._layers, strict=True):
            own = None if cache is None else KVCache(cache.layers[start : start + n])  # shares the layers
            start += n
            out = model.decode(tgt, part, src_mask, cache=own, need_weights=need_weights)
            logits, weights = out if need_weights else (out, None)
            lprobs.append(logits.float().log_softmax(dim=-1))
            if weights:
                maps.append(weights[-1].float().mean(dim=1, keepdim=True))  # (B, 1, T, S)
        combined = torch.logsumexp(torch.stack(lprobs), dim=0) - math.log(len(lprobs))  # (B, T, V)
        return (combined, [torch.stack(maps).mean(dim=0)]) if need_weights else combined
