"""Albumentations 2.x transforms for every registered perturbation family (image + untouched mask).

One generic adapter, :class:`PerturbationTransform`, is specialised per family by a short class statement
at the end of this module (``class BlurTransform(PerturbationTransform): family = "blur"``), one per name
in :func:`~robusttrain.perturbations.available` except those that need a model. They are declared
statically so that IDEs, type checkers and ``from robusttrain.perturbations.albu import BlurTransform``
see them; a test checks the declarations against the registry. Each takes exactly the family's
constructor arguments plus ``p``, validates them with a pydantic schema built from the family's signature
and lists every one in ``get_transform_init_args_names()``, so ``A.to_dict`` / ``A.from_dict`` round-trip
all of them (``A.from_dict`` finds the class by its full name once this module is imported).

Params are drawn straight from the transform's seeded ``random_generator`` (the one ``A.Compose(...,
seed=...)`` sets), as Albumentations' own transforms draw theirs — so ``A.Compose(..., seed=...)`` gives the
same images within a version (not promised across versions) and ``A.ReplayCompose`` replays exactly — and
the image goes through the perturbation's numpy kernel. ``FourierMixTransform`` sees one image at a time, so
its partner is the documented stand-in (:class:`~robusttrain.perturbations.shift.FourierMix`). The lesion ``mask`` (if passed) keeps objects, spots and text
off the lesion; it is returned unchanged, and so are ``masks``, ``bboxes`` and ``keypoints`` (no family moves
image content). Families that need a model (``adversarial``) have no transform.

Example:
    >>> import albumentations as A, numpy as np
    >>> from robusttrain.perturbations.albu import BlurTransform
    >>> t = A.Compose([BlurTransform(severity=2, noise=False, p=1.0)], seed=0)
    >>> out = t(image=np.zeros((32, 32, 3), np.uint8), mask=np.zeros((32, 32), np.uint8))
    >>> back = A.from_dict(A.to_dict(t)).transforms[0]
    >>> out["image"].shape, back.severity, back.noise, back.perturbation.noise
    ((32, 32, 3), 2, False, False)
"""

from __future__ import annotations

import inspect
import os
import typing
from typing import Any, ClassVar

import albumentations as A
import numpy as np
from albumentations.core.transforms_interface import BaseTransformInitSchema
from pydantic import create_model

from .base import Perturbation
from .registry import family_class, get

_P = inspect.Parameter
_FAST_KEYS = frozenset({"image", "mask"})  # the inputs PerturbationTransform.__call__ handles itself
TRANSFORMS: dict[
    str, type[PerturbationTransform]
] = {}  # family -> its transform class (filled by _FamilyMeta)


class _FamilyMeta(type(A.DualTransform)):  # type: ignore[misc]
    """Turns ``class XTransform(PerturbationTransform): family = "x"`` into family x's transform.

    Before Albumentations' own metaclass reads them from the class body, it adds an ``InitSchema`` and an
    ``__init__`` with the family's constructor signature (plus keyword-only ``p``); it then makes that
    ``__init__`` strict (a misspelt argument is an error, not a warning) and records the class in
    :data:`TRANSFORMS`.
    """

    def __new__(mcs, name: str, bases: tuple[type, ...], dct: dict[str, Any], **kwargs: Any):
        family = dct.get("family")
        if not family:
            return super().__new__(mcs, name, bases, dct, **kwargs)
        if name != _class_name(family):
            raise TypeError(
                f"{name}: the transform of family {family!r} must be called {_class_name(family)}"
            )
        sig, schema, arg_names, doc = _family_spec(family)

        def __init__(self: PerturbationTransform, *args: Any, **kw: Any) -> None:
            bound = sig.bind(self, *args, **kw)
            bound.apply_defaults()
            PerturbationTransform.__init__(**bound.arguments)

        __init__.__signature__ = sig  # type: ignore[attr-defined]  # read by the metaclass and by help()
        dct = {"__doc__": doc, **dct, "arg_names": arg_names, "InitSchema": schema, "__init__": __init__}
        cls = super().__new__(mcs, name, bases, dct, **kwargs)
        validating_init = cls.__init__  # Albumentations' validating wrapper around the __init__ above

        def strict_init(self: PerturbationTransform, *args: Any, strict: bool = True, **kw: Any) -> None:
            validating_init(self, *args, strict=strict, **kw)

        strict_init.__signature__ = sig  # type: ignore[attr-defined]
        cls.__init__ = strict_init
        TRANSFORMS[family] = cls
        return cls


class PerturbationTransform(A.DualTransform, metaclass=_FamilyMeta):
    """Base of the per-family transforms (``BlurTransform``, ...); not used directly.

    ``family_args`` holds the family's constructor arguments (paths as strings, so the dict is JSON-ready);
    each is also an attribute (``t.severity``) unless Albumentations already uses that name.
    """

    family: ClassVar[str] = ""
    arg_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, p: float = 1.0, **family_args: Any):
        if not self.family:
            raise TypeError(
                "PerturbationTransform is abstract: use transform_class(name) or e.g. BlurTransform"
            )
        super().__init__(p=p)
        self.family_args = {
            k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in family_args.items()
        }
        for k, v in self.family_args.items():
            if k not in _taken():
                setattr(self, k, v)
        self.perturbation: Perturbation = get(self.family, **self.family_args)
        # what update_transform_params adds besides the shape (only if a family argument is called so)
        self._shared_attrs = tuple(a for a in ("interpolation", "fill", "fill_mask") if hasattr(self, a))

    def __call__(self, *args: Any, force_apply: bool = False, **kwargs: Any) -> Any:
        """Albumentations' ``BasicTransform.__call__``, with a short path for the usual call.

        With only ``image`` (a numpy array) and ``mask`` given, outside ReplayCompose, it does what the
        generic call does — the ``p`` draw, ``self.params`` (``shape``, ``perturbation_params``, ``lesion``
        as :meth:`get_params_dependent_on_data` gives them), the image through the family's kernel, the mask
        unchanged, both C-contiguous — but checks the image once and skips the generic per-target dispatch,
        which together cost about as much as a small colour kernel on a 128x128 image. Any other call
        (other targets, ReplayCompose, positional arguments) goes the generic way.
        """
        image = kwargs.get("image")
        if (
            args
            or self.replay_mode
            or self.deterministic
            or type(image) is not np.ndarray
            or not _FAST_KEYS.issuperset(kwargs)
        ):
            return super().__call__(*args, force_apply=force_apply, **kwargs)
        self.params = {}
        if not self.should_apply(force_apply=force_apply):
            return kwargs
        mask = kwargs.get("mask")
        img, m, lesion, pp = self._lesion_and_params(image, mask)
        params: dict[str, Any] = {"shape": image.shape}
        for a in self._shared_attrs:
            params[a] = getattr(self, a)
        params["perturbation_params"], params["lesion"] = pp, lesion
        self.params = params
        if not image.flags.c_contiguous:  # the generic call samples on the image as given (a family's params
            img = np.ascontiguousarray(img)  # may differ in the last bit with the layout), applies on a copy
        out = self.perturbation._apply_np(img, m, pp)
        if image.ndim == 2 and out.ndim == 3:
            out = out[:, :, 0]
        res = dict(kwargs)
        res["image"] = out if out.flags.c_contiguous else np.ascontiguousarray(out)
        if mask is not None and not mask.flags.c_contiguous:
            res["mask"] = np.ascontiguousarray(mask)
        return res

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        image = data["image"] if "image" in data else data["images"][0]
        _, _, lesion, params = self._lesion_and_params(image, data.get("mask"))
        return {"perturbation_params": params, "lesion": lesion}

    def _lesion_and_params(
        self, image: np.ndarray, mask: np.ndarray | None
    ) -> tuple[Any, Any, Any, dict[str, Any]]:
        """(checked image, checked lesion, lesion as given, params) for one call: the lesion is the mask's
        first channel; the params are drawn straight from the generator Albumentations gives the transform
        (seeded by ``A.Compose(..., seed=s)``), as its own transforms draw theirs."""
        lesion = mask[:, :, 0] if mask is not None and mask.ndim == 3 else mask
        img, m = self.perturbation.check_numpy(image, lesion)
        return img, m, lesion, self.perturbation._sample_np(img, m, self.random_generator)

    def apply(
        self,
        img: np.ndarray,
        perturbation_params: dict[str, Any] | None = None,
        lesion: np.ndarray | None = None,
        **params: Any,
    ) -> np.ndarray:
        pert = self.perturbation
        if perturbation_params is None:  # called outside __call__: sample, as apply_numpy does
            out, _ = pert.apply_numpy(img, lesion)
        else:
            # The params are those just drawn (or ReplayCompose kept): straight to the kernel, without
            # apply_numpy's conversion and key check. The image is checked: "images" and replays bring
            # other arrays than the one the params were drawn on.
            image, mask = pert.check_numpy(img, lesion)
            out = pert._apply_np(image, mask, perturbation_params)
        return out[:, :, 0] if img.ndim == 2 and out.ndim == 3 else out

    def apply_to_mask(self, mask: np.ndarray, **params: Any) -> np.ndarray:
        return mask  # masks are never changed

    # No family moves image content (objects, spots and text are pasted where they are drawn, nothing is
    # warped or shifted), so boxes and points stay where they are: Albumentations' own pixel-level
    # transforms -- occluders such as RandomSunFlare, RandomShadow and TextImage included -- pass them through
    # unchanged too (as image-only transforms). Without these the DualTransform base raised
    # NotImplementedError for any pipeline carrying bboxes or keypoints.
    def apply_to_bboxes(self, bboxes: np.ndarray, **params: Any) -> np.ndarray:
        return bboxes

    def apply_to_keypoints(self, keypoints: np.ndarray, **params: Any) -> np.ndarray:
        return keypoints

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return self.arg_names

    def get_transform_init_args(self) -> dict[str, Any]:
        # Exactly the constructor arguments; Albumentations' default drops empty containers.
        return dict(self.family_args)


def _taken() -> frozenset[str]:
    global _TAKEN
    if _TAKEN is None:  # names Albumentations itself uses on a transform (class or instance)
        _TAKEN = (
            frozenset(dir(PerturbationTransform))
            | frozenset(vars(A.NoOp(p=1.0)))
            | {"family_args", "perturbation"}
        )
    return _TAKEN


_TAKEN: frozenset[str] | None = None


def _class_name(family: str) -> str:
    return "".join(w[:1].upper() + w[1:] for w in family.split("_")) + "Transform"


def _family_spec(family: str) -> tuple[inspect.Signature, type, tuple[str, ...], str]:
    """(``__init__`` signature, pydantic InitSchema, argument names, docstring) of a family's transform."""
    fam = family_class(family)
    params = list(inspect.signature(fam.__init__).parameters.values())[1:]
    if any(q.name == "model" for q in params):
        raise ValueError(
            f"{family}: has no Albumentations transform (it needs a model, which cannot go into a "
            f"serialised pipeline or data-loader workers); available: {sorted(TRANSFORMS)}"
        )
    bad = [
        q.name for q in params if q.kind in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD) or q.name in ("p", "strict")
    ]
    if bad:
        raise TypeError(
            f"{family}: constructor arguments {bad} cannot be Albumentations init args "
            "(*args/**kwargs or the reserved names p/strict)"
        )
    try:
        hints = typing.get_type_hints(fam.__init__)
    except Exception:  # unresolvable annotation: validate nothing rather than fail the import
        hints = {}
    name = _class_name(family)
    fields: dict[str, Any] = {
        q.name: (hints.get(q.name, Any), ... if q.default is _P.empty else q.default) for q in params
    }
    schema = create_model(f"{name}InitSchema", __base__=BaseTransformInitSchema, **fields)
    sig = inspect.Signature(
        [_P("self", _P.POSITIONAL_OR_KEYWORD)]
        + [
            q.replace(kind=_P.KEYWORD_ONLY)
            if q.kind is _P.KEYWORD_ONLY
            else q.replace(kind=_P.POSITIONAL_OR_KEYWORD)
            for q in params
        ]
        + [_P("p", _P.KEYWORD_ONLY, default=1.0, annotation=float)]
    )
    doc = (
        f"Albumentations transform for the ``{family}`` perturbation: arguments as "
        f":class:`{fam.__module__}.{fam.__qualname__}`, plus ``p``."
    )
    return sig, schema, tuple(q.name for q in params), doc


def transform_class(family: str) -> type[PerturbationTransform]:
    """The Albumentations transform class of a registered family.

    Its ``__init__`` signature is the family's constructor signature plus keyword-only ``p`` (default 1).

    >>> transform_class("white_balance").__name__, transform_class("white_balance")(cast="green").cast
    ('WhiteBalanceTransform', 'green')
    """
    if family not in TRANSFORMS:
        _family_spec(family)  # an unknown family, or one that needs a model: its own clear error
        raise LookupError(f"{family}: registered, but {__name__} declares no {_class_name(family)}")
    return TRANSFORMS[family]


def transform_for(perturbation: Perturbation, p: float = 1.0) -> PerturbationTransform:
    """The Albumentations transform for an existing perturbation, with all its constructor arguments.

    >>> from robusttrain.perturbations import get
    >>> transform_for(get("instrument", severity=2, n_procedural=3)).perturbation.bank.shape[0]
    3
    """
    t = transform_class(perturbation.name)(p=p, **perturbation.init_args())
    t.perturbation = perturbation  # same arguments; keep the caller's instance (and its caches)
    return t


# --------------------------------------------------------------------------------------
# One class per family, in registry order (tests/perturbations check this list against available()).
# The signature, schema and docstring come from the family's constructor, through _FamilyMeta.
# --------------------------------------------------------------------------------------
class SaturationTransform(PerturbationTransform):
    family = "saturation"


class ContrastTransform(PerturbationTransform):
    family = "contrast"


class WhiteBalanceTransform(PerturbationTransform):
    family = "white_balance"


class BlurTransform(PerturbationTransform):
    family = "blur"


class MotionBlurTransform(PerturbationTransform):
    family = "motion_blur"


class SpecularityTransform(PerturbationTransform):
    family = "specularity"


class InstrumentTransform(PerturbationTransform):
    family = "instrument"


class FecesTransform(PerturbationTransform):
    family = "feces"


class BloodTransform(PerturbationTransform):
    family = "blood"


class TextTransform(PerturbationTransform):
    family = "text"


class MeltTransform(PerturbationTransform):
    family = "melt"


class BiasFieldTransform(PerturbationTransform):
    family = "bias_field"


class GhostingTransform(PerturbationTransform):
    family = "ghosting"


class GibbsTransform(PerturbationTransform):
    family = "gibbs"


class SpikeTransform(PerturbationTransform):
    family = "spike"


class RicianNoiseTransform(PerturbationTransform):
    family = "rician_noise"


class GammaTransform(PerturbationTransform):
    family = "gamma"


class QuantumNoiseTransform(PerturbationTransform):
    family = "quantum_noise"


class ExposureTransform(PerturbationTransform):
    family = "exposure"


class XrayMarkersTransform(PerturbationTransform):
    family = "xray_markers"


class CollimationTransform(PerturbationTransform):
    family = "collimation"


class RandconvTransform(PerturbationTransform):
    family = "randconv"


class FourierMixTransform(PerturbationTransform):
    family = "fourier_mix"


class JpegTransform(PerturbationTransform):
    family = "jpeg"


class DefocusTransform(PerturbationTransform):
    family = "defocus"


class VignettingTransform(PerturbationTransform):
    family = "vignetting"


class SensorNoiseTransform(PerturbationTransform):
    family = "sensor_noise"


__all__ = [
    "PerturbationTransform",
    "TRANSFORMS",
    "transform_class",
    "transform_for",
    "SaturationTransform",
    "ContrastTransform",
    "WhiteBalanceTransform",
    "BlurTransform",
    "MotionBlurTransform",
    "SpecularityTransform",
    "InstrumentTransform",
    "FecesTransform",
    "BloodTransform",
    "TextTransform",
    "MeltTransform",
    "BiasFieldTransform",
    "GhostingTransform",
    "GibbsTransform",
    "SpikeTransform",
    "RicianNoiseTransform",
    "GammaTransform",
    "QuantumNoiseTransform",
    "ExposureTransform",
    "XrayMarkersTransform",
    "CollimationTransform",
    "RandconvTransform",
    "FourierMixTransform",
    "JpegTransform",
    "DefocusTransform",
    "VignettingTransform",
    "SensorNoiseTransform",
]
