"""Decoding: greedy and beam search and `translate` (`search`, torch) and their settings
(`DecodeConfig`, torch-free).

`DecodeConfig` is importable without torch (config validation runs before heavy imports); the search
functions are loaded on first access.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from attnlab.decoding.settings import DecodeConfig

_SEARCH = (
    "greedy_decode",
    "beam_search",
    "translate",
    "nbest_decode",
    "length_penalty",
    "max_output_lengths",
    "Hypothesis",
    "Sampling",
    "NonFiniteScores",
)

__all__ = ["DecodeConfig", *_SEARCH]


def __getattr__(name: str) -> Any:
    if name in _SEARCH:
        return getattr(import_module("attnlab.decoding.search"), name)
    raise AttributeError(f"module 'attnlab.decoding' has no attribute {name!r}")
