"""Autoregressive decoding over the incremental K/V cache.

Notation: `B` batch, `S` source length, `T` output length, `V` vocabulary size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.model.transformer import Transformer


def max_output_lengths(src: Tensor, pad_id: int, a: float, b: int) -> Tensor:
    """Longest output allowed for each sentence (B,): a · |S| + b, |S| its non-pad source length.

    Per sentence, so that a sentence decodes the same alone as inside a padded batch.
    """
    return (a * (src != pad_id).sum(dim=1) + b).long().clamp(min=1)


@torch.inference_mode()
def greedy_decode(model: Transformer, src: Tensor, *, max_len_a: float = 1.0, max_len_b: int = 10) -> Tensor:
    """Pick the most probable token at each step until every sentence has produced eos.

    Args:
        model: The Transformer (its mode is left unchanged; call `.eval()` first for inference).
        src: Source ids (B, S), padded with the model's pad id.
        max_len_a: Output length limit a in a · |S| + b (per sentence, eos included).
        max_len_b: Output length limit b.

    Returns:
        Output ids (B, T) without the start token, eos included, padded with pad after eos.
    """
    cfg = model.config
    memory, src_mask = model.encode(src)
    cache = model.new_cache()
    batch = src.size(0)
    token = torch.full((batch, 1), cfg.start_id, dtype=torch.long, device=src.device)
    limits = max_output_lengths(src, cfg.pad_id, max_len_a, max_len_b)  # (B,)
    if cfg.pe == "learned":
        limits = limits.clamp(max=cfg.max_positions)  # decoder inputs need a position each
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
    steps = []
    for step in range(int(limits.max())):
        logits = model.decode(token, memory, src_mask, cache=cache)  # (B, 1, V)
        token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        token = token.masked_fill(finished[:, None], cfg.pad_id)
        steps.append(token)
        finished |= (token.squeeze(1) == cfg.eos_id) | (limits <= step + 1)
        if bool(finished.all()):
            break
    return torch.cat(steps, dim=1)
