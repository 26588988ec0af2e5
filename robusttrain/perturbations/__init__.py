"""Clinical perturbation library: realistic endoscopy artifacts with a numpy path and a batched torch path.

Every perturbation shares one per-sample parameter schema across both paths (see :mod:`.base`) and is
registered by name in :mod:`.registry` (family traits such as ``occludes`` / ``trainable`` are class
attributes, read by :func:`occluding` / :func:`trainable`):

    >>> from robusttrain.perturbations import available, get
    >>> "blur" in available() and "white_balance" in available()
    True
    >>> get("blur", severity=2).severity
    2
"""

from __future__ import annotations

from . import suites
from .adversarial import Adversarial
from .base import Params, Perturbation, index_params, stack_params
from .blur import Blur, MotionBlur
from .border import fov_mask, fov_mask_np
from .colour import Contrast, Saturation, WhiteBalance
from .jpeg import Jpeg
from .melt import Melt
from .mri import BiasField, Gamma, Ghosting, Gibbs, RicianNoise, Spike
from .objects import Blood, Feces, Instrument
from .optics import Defocus, Vignetting
from .registry import available, family_class, get, occluding, trainable
from .sensor import SensorNoise
from .shift import FourierMix, RandConv
from .specularity import Specularity
from .text import Text
from .xray import Collimation, Exposure, QuantumNoise
from .xray_markers import XrayMarkers

__all__ = [
    "Params",
    "Perturbation",
    "available",
    "family_class",
    "get",
    "occluding",
    "trainable",
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
    "RandConv",
    "FourierMix",
    "Jpeg",
    "Defocus",
    "Vignetting",
    "SensorNoise",
    "suites",
]
