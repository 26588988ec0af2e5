"""Clinical perturbation library: realistic endoscopy artifacts with a numpy path and a batched torch path.

Every perturbation shares one per-sample parameter schema across both paths (see :mod:`.base`) and is
registered by name:

    >>> from robusttrain.perturbations import available, get
    >>> "blur" in available() and "white_balance" in available()
    True
    >>> get("blur", severity=2).severity
    2
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import suites
from .adversarial import Adversarial
from .base import Params, Perturbation, index_params, stack_params
from .blur import Blur, MotionBlur
from .border import fov_mask, fov_mask_np
from .colour import Contrast, Saturation, WhiteBalance
from .melt import Melt
from .mri import BiasField, Gamma, Ghosting, Gibbs, RicianNoise, Spike
from .objects import Blood, Feces, Instrument
from .specularity import Specularity
from .text import Text
from .xray import Collimation, Exposure, QuantumNoise
from .xray_markers import XrayMarkers

_REGISTRY: dict[str, Callable[..., Perturbation]] = {
    "saturation": Saturation,
    "contrast": Contrast,
    "white_balance": WhiteBalance,
    "blur": Blur,
    "motion_blur": MotionBlur,
    "specularity": Specularity,
    "instrument": Instrument,
    "feces": Feces,
    "blood": Blood,
    "text": Text,
    "melt": Melt,
    "adversarial": Adversarial,
    # single-channel MRI families (mri.py)
    "bias_field": BiasField,
    "ghosting": Ghosting,
    "gibbs": Gibbs,
    "spike": Spike,
    "rician_noise": RicianNoise,
    "gamma": Gamma,
    # single-channel X-ray families (xray.py, xray_markers.py)
    "quantum_noise": QuantumNoise,
    "exposure": Exposure,
    "xray_markers": XrayMarkers,
    "collimation": Collimation,
}


def available(channels: int | None = None) -> list[str]:
    """Names accepted by :func:`get` (the nine paper families, ``motion_blur``, ``melt``, ``adversarial`` and
    the MRI / X-ray families); with ``channels``, only those that apply to images with that many channels
    (3: the colour-capable ones, 1: the grey-capable ones).

    >>> "bias_field" in available(channels=1) and "bias_field" not in available(channels=3)
    True
    """
    if channels is None:
        return list(_REGISTRY)
    if channels not in (1, 3):
        raise ValueError(f"available: channels must be 1 or 3 (or None for all), got {channels!r}")
    return [
        n
        for n, cls in _REGISTRY.items()
        if not (channels == 3 and getattr(cls, "grey_only", False)) and not (channels == 1 and cls.rgb)
    ]


def get(name: str, severity: int = 3, **kwargs: Any) -> Perturbation:
    """Build the perturbation registered as ``name`` at ``severity`` (1..5); extra kwargs go to its class.

    >>> get("contrast", severity=5).name
    'contrast'
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown perturbation {name!r}; valid choices: {', '.join(available())}")
    return _REGISTRY[name](severity=severity, **kwargs)


def family_class(name: str) -> Callable[..., Perturbation]:
    """The class registered as ``name`` (adapters expose its constructor's arguments).

    >>> family_class("blur").__name__
    'Blur'
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown perturbation {name!r}; valid choices: {', '.join(available())}")
    return _REGISTRY[name]


__all__ = [
    "Params",
    "Perturbation",
    "available",
    "get",
    "index_params",
    "stack_params",
    "fov_mask",
    "fov_mask_np",
    "Saturation",
    "Contrast",
    "WhiteBalance",
    "Blur",
    "MotionBlur",
    "Specularity",
    "Text",
    "Instrument",
    "Feces",
    "Blood",
    "Melt",
    "Adversarial",
    "BiasField",
    "Ghosting",
    "Gibbs",
    "Spike",
    "RicianNoise",
    "Gamma",
    "QuantumNoise",
    "Exposure",
    "XrayMarkers",
    "Collimation",
    "suites",
]
