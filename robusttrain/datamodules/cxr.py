"""Binary lung segmentation on chest X-ray (``images/`` + ``masks/`` folders or synthetic)."""

from __future__ import annotations

from robusttrain.validate import check_number

from .base import BaseSegDataModule
from .masks import check_mask_mode
from .readers import FolderSource, check_image_bits
from .synthetic_cxr import SyntheticCXRSource


class CXRDataModule(BaseSegDataModule):
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

    def __init__(
        self,
        root=None,
        image_size=128,
        batch_size=8,
        num_workers=0,
        val_fraction=0.2,
        seed=0,
        extra_val=None,
        n_train=120,
        n_val=40,
        hard_fraction=0.1,
        train_transforms=None,
        val_transforms=None,
        resize=None,
        pin_memory=False,
        cache_mb=1024.0,
        mask_mode="auto",
        image_bits=None,
    ):
        super().__init__(
            root,
            image_size,
            batch_size,
            num_workers,
            val_fraction,
            seed,
            extra_val,
            n_train,
            n_val,
            hard_fraction,
            train_transforms,
            val_transforms,
            resize,
            pin_memory,
        )
        self.cache_mb = check_number("cache_mb", cache_mb, owner=type(self).__name__)
        self.mask_mode = check_mask_mode(mask_mode)
        self.image_bits = check_image_bits(
            image_bits
        )  # 16-bit images with more than 8 significant bits: their bit depth

    def _synthetic_sources(self):
        mk = lambda n, start: SyntheticCXRSource(n, self.seed, self.image_size, self.hard_fraction, start)
        return mk(self.n_train, 0), mk(self.n_val, self.n_train)

    def _read(self, folder):
        return FolderSource(
            folder, grey=True, cache_mb=self.cache_mb, mask_mode=self.mask_mode, image_bits=self.image_bits
        )
