"""segmentation-models-pytorch U-Nets on any of its (or timm's) encoders: ``model.network=smp_unet``.

The encoders users with internet pick: ``model=smp_unet model.backbone=resnet34 model.pretrained=true``
(ImageNet weights; a weight-set name such as ``ssl`` or ``noisy-student`` picks another), or a timm encoder
``model.backbone=tu-convnext_tiny``. Weights download at build time through smp / timm into the Hugging
Face cache (``HF_HOME``); a fit records the file it started from in ``pretrained.json`` when it finds it
there. An optional extra: ``pip install 'robusttrain[smp]'``; without it ``smp_unet`` is one line naming
that command.

Images stay in [0,1] (perturbations and the MR check see raw images): the network standardises them with
the encoder's mean / std first (ImageNet's for smp's own encoders; the timm model's pretrained config for
``tu-`` encoders) whether or not the weights are pretrained, so a run resumed from its checkpoint (built with
``pretrained`` off: the checkpoint's weights replace the download) computes the same function.

A torchvision built for another torch than the installed one (the registry's CUDA torchvision beside a
CPU torch) is made importable by :mod:`robusttrain._torchvision` when robusttrain is imported.

Every input side must be a multiple of 32 (five downsamplings):

>>> from robusttrain.models.networks import side_multiple
>>> side_multiple("smp_unet")
32

With the extra installed (tests/test_models_smp.py runs this in a subprocess beside it):

>>> import torch
>>> net = build_smp_unet(3, 2, (32, 16, 16, 8, 8), backbone="resnet18")  # doctest: +SKIP
>>> net.eval()(torch.zeros(1, 3, 64, 64)).shape, type(net.norm).__name__  # doctest: +SKIP
(torch.Size([1, 2, 64, 64]), 'ImageNetNorm')
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from robusttrain.models.networks import IMAGENET_MEAN, IMAGENET_STD, ImageNetNorm, Normalised

INSTALL = "pip install 'robusttrain[smp]'"
DECODER_NORMS = {"batch": "batchnorm", "instance": "instancenorm"}


def import_smp() -> ModuleType:
    """``segmentation_models_pytorch``, imported; ValueError (one line) when it is not installed."""
    try:
        import segmentation_models_pytorch as smp
    except ModuleNotFoundError as e:
        raise ValueError(
            f"model.network=smp_unet needs segmentation-models-pytorch and timm ({e.name} is not installed): "
            f"{INSTALL}"
        ) from None
    return smp


def encoder_names(smp: ModuleType | None = None) -> list[str]:
    """smp's own encoder names (timm's models are ``tu-<timm name>`` on top)."""
    return list((smp or import_smp()).encoders.get_encoder_names())


def _check_backbone(smp: ModuleType, backbone: str | None) -> None:
    import timm

    names = encoder_names(smp)
    if isinstance(backbone, str) and backbone.startswith("tu-"):
        if timm.is_model(backbone[3:].split(".")[0]):
            return
        close = difflib.get_close_matches(backbone[3:], timm.list_models(), n=3)
        raise ValueError(
            f"model.backbone={backbone!r}: timm has no model {backbone[3:]!r}"
            + (f" (close: {', '.join('tu-' + c for c in close)})" if close else "")
        )
    if backbone in names:
        return
    close = difflib.get_close_matches(str(backbone), names, n=3)
    raise ValueError(
        f"model.backbone={backbone!r} is not an encoder of segmentation-models-pytorch"
        + (f" (close: {', '.join(close)})" if close else "")
        + f"; {len(names)} names such as resnet34, efficientnet-b0, mit_b0, or tu-<any timm model>"
    )


def _weight_set(smp: ModuleType, backbone: str, pretrained: bool | str) -> str | bool | None:
    """What smp's ``encoder_weights`` gets: None (random init), True for a timm encoder, or a weight-set
    name of smp's encoder (``true`` = imagenet)."""
    if pretrained is False or pretrained is None:
        return None
    if backbone.startswith("tu-"):
        if pretrained is not True:
            raise ValueError(
                f"model.pretrained={pretrained!r}: a timm encoder takes true or false (its weight tag goes in "
                f"the name, e.g. model.backbone={backbone.split('.')[0]}.a1_in1k)"
            )
        return True
    sets = list(smp.encoders.encoders[backbone]["pretrained_settings"])
    name = "imagenet" if pretrained is True else pretrained
    if name not in sets:
        raise ValueError(
            f"model.pretrained={pretrained!r}: {backbone} has weights {', '.join(sets) or 'none'} "
            "(true means imagenet); or false for random init"
        )
    return name


def _mean_std(backbone: str) -> tuple[Sequence[float], Sequence[float]]:
    if backbone.startswith("tu-"):
        import timm

        cfg = timm.models.get_pretrained_cfg(backbone[3:])
        if cfg is not None and getattr(cfg, "mean", None) and getattr(cfg, "std", None):
            return tuple(cfg.mean), tuple(cfg.std)
    return IMAGENET_MEAN, IMAGENET_STD


def cached_weights(smp: ModuleType, backbone: str, weight_set: str | bool | None) -> dict[str, str] | None:
    """The file smp / timm loaded ``backbone``'s weights from (``package``, ``file``, ``sha256``), found in
    the Hugging Face cache without the network; None when it is not there."""
    from huggingface_hub import hf_hub_download

    from robusttrain.models.lite0 import sha256_of

    if weight_set is None:
        return None
    if backbone.startswith("tu-"):
        import timm

        cfg = timm.models.get_pretrained_cfg(backbone[3:])
        repo, revision = getattr(cfg, "hf_hub_id", None), None
        files: tuple[str, ...] = ("model.safetensors", "pytorch_model.bin")
    else:
        settings = smp.encoders.encoders[backbone]["pretrained_settings"][weight_set]
        repo, revision = settings["repo_id"], settings.get("revision")
        files = ("model.safetensors",)
    for name in files if repo else ():
        try:
            path = Path(hf_hub_download(repo, filename=name, revision=revision, local_files_only=True))
        except (OSError, ValueError):
            continue
        return {
            "package": f"segmentation-models-pytorch (Hugging Face {repo})",
            "file": name,
            "sha256": sha256_of(path),
        }
    return None


def build_smp_unet(
    in_channels: int,
    out_channels: int,
    features: Sequence[int] | None,
    dropout: float = 0.0,
    backbone: str | None = "resnet34",
    pretrained: bool | str = False,
    norm: str | None = None,
    **kwargs: Any,
) -> nn.Module:
    """``smp.Unet`` on ``backbone`` inside a mean/std standardisation (:class:`Normalised`); ``features`` =
    5 decoder widths (default 256-128-64-32-16); ``norm`` the decoder's (batch, default, or instance).
    Every bad value is a ValueError of one line before anything downloads."""
    smp = import_smp()
    _check_backbone(smp, backbone)
    assert isinstance(backbone, str)
    weight_set = _weight_set(smp, backbone, pretrained)
    feats = tuple(features) if features is not None else (256, 128, 64, 32, 16)
    if len(feats) != 5:
        raise ValueError(f"model.features for smp_unet needs 5 decoder widths, got {list(feats)}")
    if dropout:
        raise ValueError(
            f"model.dropout: smp_unet has no decoder dropout; set model.dropout=0, got {dropout!r}"
        )
    decoder_norm = DECODER_NORMS.get(str(norm or "batch").lower())
    if decoder_norm is None:
        raise ValueError(f"model.norm for smp_unet is batch or instance (the decoder's), got {norm!r}")
    try:
        net = smp.Unet(
            encoder_name=backbone,
            encoder_weights=weight_set,
            in_channels=in_channels,
            classes=out_channels,
            decoder_channels=feats,
            decoder_use_norm=decoder_norm,
            **kwargs,
        )
    except OSError as e:  # huggingface_hub's LocalEntryNotFoundError (offline), a proxy, a full disk
        raise ValueError(
            f"model.pretrained={pretrained!r}: the {backbone} weights could not be loaded "
            f"({type(e).__name__}: {str(e).strip().splitlines()[0][:160]}); connect to the internet once "
            "(they are cached under HF_HOME) or set model.pretrained=false"
        ) from None
    net.weights = cached_weights(smp, backbone, weight_set)  # type: ignore[assignment]
    mean, std = _mean_std(backbone)
    return Normalised(net, ImageNetNorm(mean, std)) if in_channels == 3 else net
