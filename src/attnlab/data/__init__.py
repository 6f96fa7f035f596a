"""Data: the synthetic task and real corpora (specs), tokenization, batching and the data modules.

The data specs (`SyntheticData`, `Multi30kData`, `FilesData`, `HFData`) are torch-free dataclasses
validated at construction; a spec's `datamodule()` builds its `LightningDataModule`.
"""

from __future__ import annotations

from attnlab.data.corpora import CorpusData, FilesData, HFData, Multi30kData
from attnlab.data.synthetic import SyntheticData

# The data spec classes attnlab builds, by the `_target_` names a config (`conf/data`) or a checkpoint
# (`attnlab.runs.checkpoint.bundle`: the defining module's path) gives them. A closed list: a checkpoint's
# data settings are built only through it (`attnlab.runs.checkpoint.data_spec`), never by importing a name
# found in the file, so training configs are held to it too (`attnlab.training.experiment.validate`).
DATA_SPECS: dict[str, type] = {
    name: cls
    for cls in (Multi30kData, FilesData, HFData, SyntheticData)
    for name in (f"{cls.__module__}.{cls.__qualname__}", f"attnlab.data.{cls.__qualname__}")
}

__all__ = ["DATA_SPECS", "CorpusData", "FilesData", "HFData", "Multi30kData", "SyntheticData"]
