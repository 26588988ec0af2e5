"""The one registry of perturbation families: name -> class, and the questions asked of families by trait.

A family's traits are class attributes of its :class:`~robusttrain.perturbations.base.Perturbation`
subclass, read here generically (nothing else keeps lists of family names):

* ``rgb``: needs 3-channel input; ``grey_only``: needs 1-channel input (neither: both);
* ``occludes``: covers image content with something opaque (an instrument, text, a collimator), so a
  follow-up's label is only trustworthy where the cover is small (worst-of-k caps the covered area);
* ``trainable``: may be drawn as a training augmentation (False for ``adversarial``, which needs the
  model being trained, and ``melt``, which removes image content it cannot put back).

Adding a family is one class (with its traits) and one line in :data:`_REGISTRY` (plus its
Albumentations class statement in :mod:`.albu`, which a test checks against this registry).

>>> "instrument" in occluding() and "blur" not in occluding()
True
>>> "melt" in available(channels=3) and "melt" not in trainable(channels=3)
True
"""

from __future__ import annotations

from typing import Any

from .adversarial import Adversarial
from .base import Perturbation
from .blur import Blur, MotionBlur
from .colour import Contrast, Saturation, WhiteBalance
from .jpeg import Jpeg
from .melt import Melt
from .mri import BiasField, Gamma, Ghosting, Gibbs, RicianNoise, Spike
from .objects import Blood, Feces, Instrument
from .optics import Defocus, Vignetting
from .sensor import SensorNoise
from .shift import FourierMix, RandConv
from .specularity import Specularity
from .text import Text
from .xray import Collimation, Exposure, QuantumNoise
from .xray_markers import XrayMarkers

_REGISTRY: dict[str, type[Perturbation]] = {
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
    # single-channel MRI families (mri.py); gamma also runs on RGB
    "bias_field": BiasField,
    "ghosting": Ghosting,
    "gibbs": Gibbs,
    "spike": Spike,
    "rician_noise": RicianNoise,
    "gamma": Gamma,
    # single-channel X-ray families (xray.py, xray_markers.py); exposure also runs on RGB
    "quantum_noise": QuantumNoise,
    "exposure": Exposure,
    "xray_markers": XrayMarkers,
    "collimation": Collimation,
    # distribution-shift families (shift.py) and the camera / codec artifacts (jpeg, optics, sensor)
    "randconv": RandConv,
    "fourier_mix": FourierMix,
    "jpeg": Jpeg,
    "defocus": Defocus,
    "vignetting": Vignetting,
    "sensor_noise": SensorNoise,
}


def _check_channels(channels: int | None, what: str) -> None:
    if channels is not None and channels not in (1, 3):
        raise ValueError(f"{what}: channels must be 1 or 3 (or None for all), got {channels!r}")


def _fits(cls: type[Perturbation], channels: int | None) -> bool:
    if channels == 3:
        return not cls.grey_only
    if channels == 1:
        return not cls.rgb
    return True


def available(channels: int | None = None) -> list[str]:
    """Names accepted by :func:`get`, in registry order; with ``channels``, only those that apply to images
    with that many channels (3: the colour-capable ones, 1: the grey-capable ones).

    >>> "bias_field" in available(channels=1) and "bias_field" not in available(channels=3)
    True
    """
    _check_channels(channels, "available")
    return [n for n, cls in _REGISTRY.items() if _fits(cls, channels)]


def occluding() -> list[str]:
    """Families whose class sets ``occludes``: they cover image content (objects, text, markers, collimator).

    >>> occluding()
    ['instrument', 'feces', 'blood', 'text', 'xray_markers', 'collimation']
    """
    return [n for n, cls in _REGISTRY.items() if cls.occludes]


def trainable(channels: int | None = None) -> list[str]:
    """Families that may be drawn as training augmentations (class trait ``trainable``), optionally only those
    that apply to ``channels``-channel images.

    >>> [n for n in available() if n not in trainable()]
    ['melt', 'adversarial']
    """
    _check_channels(channels, "trainable")
    return [n for n, cls in _REGISTRY.items() if cls.trainable and _fits(cls, channels)]


def family_class(name: str) -> type[Perturbation]:
    """The class registered as ``name`` (adapters expose its constructor's arguments).

    >>> family_class("blur").__name__
    'Blur'
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown perturbation {name!r}; valid choices: {', '.join(available())}")
    return _REGISTRY[name]


def get(name: str, severity: int = 3, **kwargs: Any) -> Perturbation:
    """Build the perturbation registered as ``name`` at ``severity`` (1..5); extra kwargs go to its class.

    >>> get("contrast", severity=5).name
    'contrast'
    """
    return family_class(name)(severity=severity, **kwargs)


__all__ = ["available", "family_class", "get", "occluding", "trainable"]
