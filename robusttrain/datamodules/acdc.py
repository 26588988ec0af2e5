"""4-class cardiac MRI datamodule (ACDC HDF5/NIfTI or the synthetic short-axis set)."""

from __future__ import annotations

from .acdc_readers import open_acdc
from .base import BaseSegDataModule
from .synthetic_acdc import SyntheticACDCSource


class ACDCDataModule(BaseSegDataModule):
    """ACDC: ``class_names=["rv", "myo", "lv"]``, one grey channel, 2-D slices as samples.

    Case ids are ``patient011_ED`` (real) or ``synpat012_ES`` (synthetic); the split keeps every
    slice of a case — and both phases of a patient — on one side. Slices are letterboxed
    (aspect kept, zero padded) to ``image_size``² by default. With ``root=None``, ``n_train``/``n_val``
    count synthetic *patients* (two cases each, 6–10 slices per case).

    Example::

        >>> dm = ACDCDataModule(image_size=64, n_train=4, n_val=2, batch_size=4)
        >>> dm.setup("fit"); b = next(iter(dm.val_dataloader()))
        >>> b["image"].shape, b["case_id"][0], dm.num_classes
        (torch.Size([4, 1, 64, 64]), 'synpat004_ED', 4)
    """

    class_names = ["rv", "myo", "lv"]
    in_channels = 1
    default_resize = "letterbox"
    default_train_transforms = [
        {"_target_": "albumentations.Affine", "rotate": [-15, 15], "scale": [0.9, 1.1], "p": 0.5},
    ]
    default_n_train = 30
    default_n_val = 20
    synthetic_source = SyntheticACDCSource

    def _read(self, folder):
        return open_acdc(folder)

    def _split_key(self, case_id: str) -> str:
        # both phases of a patient stay together: ES must not leak the ED anatomy into validation
        return case_id.rsplit("_", 1)[0]
