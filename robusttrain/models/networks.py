"""MONAI 2-D segmentation networks selectable by name from a recipe."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

NETWORKS = ("basic_unet", "attention_unet")


def build_network(
    name: str,
    in_channels: int,
    out_channels: int,
    features: Sequence[int] | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> nn.Module:
    """Build a 2-D MONAI network.

    ``basic_unet`` (default; ``features`` = 6 widths, MONAI's BasicUNet convention) or
    ``attention_unet`` (the paper's chest X-ray model family; ``features`` = channel widths
    per level, strides of 2 between levels).

    >>> net = build_network("basic_unet", 3, 2, features=(8, 8, 16, 32, 64, 8))
    >>> import torch; net(torch.zeros(1, 3, 32, 32)).shape
    torch.Size([1, 2, 32, 32])
    """
    from monai.networks.nets import AttentionUnet, BasicUNet

    if name == "basic_unet":
        feats = tuple(features) if features is not None else (16, 16, 32, 64, 128, 16)
        if len(feats) != 6:
            raise ValueError(f"model.features for basic_unet needs 6 widths, got {list(feats)}")
        return BasicUNet(
            spatial_dims=2,
            in_channels=in_channels,
            out_channels=out_channels,
            features=feats,
            dropout=dropout,
            **kwargs,
        )
    if name == "attention_unet":
        feats = tuple(features) if features is not None else (16, 32, 64, 128)
        return AttentionUnet(
            spatial_dims=2,
            in_channels=in_channels,
            out_channels=out_channels,
            channels=feats,
            strides=(2,) * (len(feats) - 1),
            dropout=dropout,
            **kwargs,
        )
    raise ValueError(f"unknown model.network '{name}'; valid choices: {', '.join(NETWORKS)}")
