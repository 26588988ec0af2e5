"""Albumentations 2.x transforms for every perturbation family (image + untouched mask).

Each family has its own :class:`A.DualTransform` subclass (so ``A.to_dict`` / ``A.from_dict`` find it by
its full class name once this module is imported). Params are drawn in ``get_params_dependent_on_data``
from the transform's seeded ``random_generator`` — so ``A.Compose(..., seed=...)`` is reproducible and
``A.ReplayCompose`` replays exactly — and the image goes through the perturbation's numpy path.
The lesion ``mask`` (if passed) keeps objects, spots and text off the lesion; it is returned unchanged.

Example:
    >>> import albumentations as A, numpy as np
    >>> from robusttrain.perturbations.albu import BlurTransform
    >>> t = A.Compose([BlurTransform(severity=2, p=1.0)], seed=0)
    >>> out = t(image=np.zeros((32, 32, 3), np.uint8), mask=np.zeros((32, 32), np.uint8))
    >>> out["image"].shape, A.from_dict(A.to_dict(t)).transforms[0].severity
    ((32, 32, 3), 2)
"""
from __future__ import annotations

from typing import Any

import albumentations as A
import numpy as np
from albumentations.core.transforms_interface import BaseTransformInitSchema
from pydantic import Field

from .base import Perturbation


class PerturbationTransform(A.DualTransform):
    """Base: wraps the perturbation registered as ``family``; ``options`` are its extra constructor kwargs
    (JSON-serialisable, e.g. ``{"cutouts": "/path/to/folder"}``)."""

    family = ""

    class InitSchema(BaseTransformInitSchema):
        severity: int = Field(ge=1, le=5)
        options: dict[str, Any] | None = None

    def __init__(self, severity: int = 3, options: dict[str, Any] | None = None, p: float = 1.0):
        super().__init__(p=p)
        from . import get  # late import: the registry module imports this one lazily
        self.severity = severity
        self.options = dict(options or {})
        self.perturbation: Perturbation = get(self.family, severity=severity, **self.options)

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        image = data["image"] if "image" in data else data["images"][0]
        mask = data.get("mask")
        if mask is not None and mask.ndim == 3:
            mask = mask[:, :, 0]
        seed = int(self.random_generator.integers(0, 2**32))
        pp = self.perturbation.sample_numpy(image, mask, np.random.default_rng(seed))
        return {"perturbation_params": pp, "lesion": mask}

    def apply(self, img: np.ndarray, perturbation_params: dict[str, Any] | None = None,
              lesion: np.ndarray | None = None, **params: Any) -> np.ndarray:
        squeeze = img.ndim == 2
        out, _ = self.perturbation.apply_numpy(img, lesion, params=perturbation_params)
        return out[:, :, 0] if squeeze and out.ndim == 3 else out

    def apply_to_mask(self, mask: np.ndarray, **params: Any) -> np.ndarray:
        return mask  # masks are never changed

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("severity", "options")


def _make(family: str, cls_name: str) -> type[PerturbationTransform]:
    cls = type(cls_name, (PerturbationTransform,), {"family": family, "__module__": __name__,
               "__doc__": f"Albumentations transform for the ``{family}`` perturbation (see the registry)."})
    return cls


SaturationTransform = _make("saturation", "SaturationTransform")
ContrastTransform = _make("contrast", "ContrastTransform")
WhiteBalanceTransform = _make("white_balance", "WhiteBalanceTransform")
SpecularityTransform = _make("specularity", "SpecularityTransform")
BlurTransform = _make("blur", "BlurTransform")
MotionBlurTransform = _make("motion_blur", "MotionBlurTransform")
InstrumentTransform = _make("instrument", "InstrumentTransform")
FecesTransform = _make("feces", "FecesTransform")
BloodTransform = _make("blood", "BloodTransform")
TextTransform = _make("text", "TextTransform")
MeltTransform = _make("melt", "MeltTransform")

TRANSFORMS: dict[str, type[PerturbationTransform]] = {
    c.family: c for c in (SaturationTransform, ContrastTransform, WhiteBalanceTransform, SpecularityTransform,
                          BlurTransform, MotionBlurTransform, InstrumentTransform, FecesTransform, BloodTransform,
                          TextTransform, MeltTransform)}


def transform_for(perturbation: Perturbation, p: float = 1.0) -> PerturbationTransform:
    """The Albumentations transform for an existing perturbation object (its instance is reused)."""
    if perturbation.name not in TRANSFORMS:
        raise ValueError(f"{perturbation.name}: has no Albumentations transform (it needs a model); "
                         f"available: {sorted(TRANSFORMS)}")
    options: dict[str, Any] = {}
    for key in ("cast", "fast", "noise", "inplace", "cutouts"):
        if hasattr(perturbation, key) and getattr(perturbation, key) not in (None, False) and key != "inplace":
            options[key] = getattr(perturbation, key)
    t = TRANSFORMS[perturbation.name](severity=perturbation.severity, options=options, p=p)
    t.perturbation = perturbation
    return t
