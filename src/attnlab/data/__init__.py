"""Data: the synthetic task (and, later, real corpora), batching and the LightningDataModule.

The data specs (e.g. `SyntheticData`) are torch-free dataclasses validated at construction; a spec's
`datamodule()` builds the `LightningDataModule`.
"""

from __future__ import annotations

from attnlab.data.synthetic import SyntheticData

__all__ = ["SyntheticData"]
