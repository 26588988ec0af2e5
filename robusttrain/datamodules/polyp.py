"""Binary polyp segmentation datamodule (real folders or the procedural synthetic set)."""

from __future__ import annotations

from .folder import FolderSegDataModule
from .synthetic_polyp import SyntheticPolypSource


class PolypDataModule(FolderSegDataModule):
    """Polyp segmentation: ``class_names=["polyp"]``, RGB input.

    ``root=None`` → synthetic frames (``n_train`` + ``n_val``, ``hard_fraction`` planted hard cases,
    ids ``synpolyp_0000``…); otherwise a Kvasir-SEG/CVC/PolypGen/PraNet folder, split by case
    (file stem) with ``val_fraction``/``seed``. ``extra_val={"etis": "/data/ETIS"}`` adds named
    out-of-domain validation loaders. ``mask_mode``: ``auto`` (default: detected per folder from a
    sample of its masks, see :mod:`robusttrain.datamodules.masks`), ``binary255`` or ``class_index``;
    ``mask_encoding`` is the one in use. See :class:`FolderSegDataModule` and
    :class:`BaseSegDataModule` for all arguments.

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
    default_n_train = 320
    default_n_val = 80
    synthetic_source = SyntheticPolypSource
