"""Binary polyp segmentation datamodule (real folders or the procedural synthetic set)."""

from __future__ import annotations

from robusttrain.validate import check_number

from .base import BaseSegDataModule
from .masks import check_mask_mode
from .readers import FolderSource, check_image_bits
from .synthetic_polyp import SyntheticPolypSource


class PolypDataModule(BaseSegDataModule):
    """Polyp segmentation: ``class_names=["polyp"]``, RGB input.

    ``root=None`` → synthetic frames (``n_train`` + ``n_val``, ``hard_fraction`` planted hard cases,
    ids ``synpolyp_0000``…); otherwise a Kvasir-SEG/CVC/PolypGen/PraNet folder, split by case
    (file stem) with ``val_fraction``/``seed``. ``extra_val={"etis": "/data/ETIS"}`` adds named
    out-of-domain validation loaders. ``mask_mode``: ``auto`` (default: detected per folder from a
    sample of its masks, see :mod:`robusttrain.datamodules.masks`), ``binary255`` or ``class_index``;
    ``mask_encoding`` is the one in use. See :class:`BaseSegDataModule` for all arguments.

    Example (the ``smoke`` configuration)::

        >>> dm = PolypDataModule(image_size=64, batch_size=8, n_train=24, n_val=8)
        >>> dm.setup("fit"); batch = next(iter(dm.train_dataloader()))
        >>> batch["image"].shape, dm.num_classes, len(dm.planted_hard_cases)
        (torch.Size([8, 3, 64, 64]), 2, 3)
    """

    class_names = ["polyp"]
    in_channels = 3
    default_train_transforms = [
        {"_target_": "albumentations.HorizontalFlip", "p": 0.5},
        {"_target_": "albumentations.VerticalFlip", "p": 0.5},
        {"_target_": "albumentations.RandomRotate90", "p": 0.5},
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
        n_train=320,
        n_val=80,
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
        # generate at the training size: resizing afterwards would only cost time
        mk = lambda n, start: SyntheticPolypSource(n, self.seed, self.image_size, self.hard_fraction, start)
        return mk(self.n_train, 0), mk(self.n_val, self.n_train)

    def _read(self, folder):
        return FolderSource(
            folder, grey=False, cache_mb=self.cache_mb, mask_mode=self.mask_mode, image_bits=self.image_bits
        )
