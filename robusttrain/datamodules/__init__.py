"""robusttrain.datamodules: LightningDataModules, synthetic generators and real-data readers.

Batches follow ``docs/design.md``: ``image`` float32 (B,C,H,W) in [0,1], ``mask`` int64 (B,H,W),
``case_id`` list[str], ``slice_index`` int64 (B,).
"""

from .acdc import ACDCDataModule
from .base import BaseSegDataModule, SegmentationDataset, split_by_case
from .cxr import CXRDataModule
from .errors import DataError
from .folder import FolderSegDataModule
from .polyp import PolypDataModule

__all__ = [
    "ACDCDataModule",
    "BaseSegDataModule",
    "CXRDataModule",
    "DataError",
    "FolderSegDataModule",
    "PolypDataModule",
    "SegmentationDataset",
    "split_by_case",
]
