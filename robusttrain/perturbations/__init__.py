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

from typing import Any, Callable

from .base import Params, Perturbation, index_params, stack_params
from .border import fov_mask, fov_mask_np
from .adversarial import Adversarial
from .blur import Blur, MotionBlur
from .colour import Contrast, Saturation, WhiteBalance
from .melt import Melt
from .objects import Blood, Feces, Instrument
from .specularity import Specularity
from .text import Text

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
}


def available() -> list[str]:
    """Names accepted by :func:`get` (the nine paper families plus ``motion_blur``, ``melt``, ``adversarial``)."""
    return list(_REGISTRY)


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


__all__ = ["Params", "Perturbation", "available", "get", "index_params", "stack_params", "fov_mask", "fov_mask_np",
           "Saturation", "Contrast", "WhiteBalance", "Blur", "MotionBlur", "Specularity", "Text", "Instrument", "Feces", "Blood", "Melt", "Adversarial"]
