"""Data: the synthetic task and real corpora (specs), tokenization, batching and the data modules.

The data specs (`SyntheticData`, `Multi30kData`, `FilesData`, `HFData`) are torch-free dataclasses
validated at construction; a spec's `datamodule()` builds its `LightningDataModule`.
"""

from __future__ import annotations

from attnlab.data.corpora import CorpusData, FilesData, HFData, Multi30kData
from attnlab.data.synthetic import SyntheticData

__all__ = ["CorpusData", "FilesData", "HFData", "Multi30kData", "SyntheticData"]
