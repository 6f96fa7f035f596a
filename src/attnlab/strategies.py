"""Lightning strategies built for the Transformer (for the trainer presets in `conf/trainer/`)."""

from __future__ import annotations

from typing import Any


def fsdp(**kwargs: Any) -> Any:
    """Lightning's `FSDPStrategy` with one FSDP unit per `EncoderLayer` and `DecoderLayer`.

    Args:
        **kwargs: Passed on to `FSDPStrategy` (`sharding_strategy`, `state_dict_type`, ...).
    """
    from lightning.pytorch.strategies import FSDPStrategy

    from attnlab.model.layers import DecoderLayer, EncoderLayer

    return FSDPStrategy(auto_wrap_policy={EncoderLayer, DecoderLayer}, **kwargs)
