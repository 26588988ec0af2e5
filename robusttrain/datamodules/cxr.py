"""Binary lung segmentation on chest X-ray (``images/`` + ``masks/`` folders or synthetic)."""

from __future__ import annotations

from .folder import FolderSegDataModule
from .synthetic_cxr import SyntheticCXRSource


class CXRDataModule(FolderSegDataModule):
    """Chest X-ray lungs: ``class_names=["lung"]``, one grey channel (RGB files are converted).

    ``mask_mode``: ``auto`` | ``binary255`` | ``class_index`` (as :class:`PolypDataModule`).

    Example::

        >>> dm = CXRDataModule(image_size=64, n_train=8, n_val=4, batch_size=4)
        >>> dm.setup("fit"); next(iter(dm.train_dataloader()))["image"].shape
        torch.Size([4, 1, 64, 64])
    """

    class_names = ["lung"]
    in_channels = 1
    default_train_transforms = [
        {"_target_": "albumentations.Affine", "rotate": [-8, 8], "scale": [0.92, 1.08], "p": 0.5},
        {"_target_": "albumentations.RandomBrightnessContrast", "p": 0.3},
    ]
    default_n_train = 120
    default_n_val = 40
    synthetic_source = SyntheticCXRSource
    grey = True
