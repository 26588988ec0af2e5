"""The 2-D image/mask folder datamodule that the polyp and chest X-ray datamodules share."""

from __future__ import annotations

from robusttrain.validate import check_number

from .base import BaseSegDataModule
from .masks import check_mask_mode
from .readers import FolderSource, check_image_bits


class FolderSegDataModule(BaseSegDataModule):
    """:class:`BaseSegDataModule` over a folder of 2-D images and masks (:class:`FolderSource`).

    Adds what reading such a folder needs: ``cache_mb`` (decoded-image cache), ``mask_mode``
    (``auto`` | ``binary255`` | ``class_index``, see :mod:`robusttrain.datamodules.masks`) and
    ``image_bits`` (16-bit images with more than 8 significant bits: their bit depth). Subclasses set
    ``grey`` (read as one channel) besides what :class:`BaseSegDataModule` asks for.
    """

    grey: bool = False

    def __init__(
        self,
        root=None,
        image_size=128,
        batch_size=8,
        num_workers=0,
        val_fraction=0.2,
        seed=0,
        extra_val=None,
        n_train=None,
        n_val=None,
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
        self.image_bits = check_image_bits(image_bits)

    def _read(self, folder):
        return FolderSource(
            folder,
            grey=self.grey,
            cache_mb=self.cache_mb,
            mask_mode=self.mask_mode,
            image_bits=self.image_bits,
        )
