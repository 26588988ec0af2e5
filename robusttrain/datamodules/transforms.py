"""Albumentations pipelines from Hydra-friendly configs.

Format (one choice, used everywhere): a list whose items are either
  * a dict with ``_target_`` naming the transform class and its keyword arguments, e.g.
    ``{"_target_": "albumentations.HorizontalFlip", "p": 0.5}``; a bare class name such as
    ``"HorizontalFlip"`` is looked up in ``albumentations``; nested ``transforms`` lists
    (for ``OneOf``/``Compose``-like wrappers) are built recursively, or
  * an already built Albumentations transform (what Hydra's recursive ``instantiate`` passes).
OmegaConf ``ListConfig``/``DictConfig`` are accepted as well.

Example::

    >>> from robusttrain.datamodules.transforms import build_pipeline
    >>> p = build_pipeline([{"_target_": "HorizontalFlip", "p": 0.5}], image_size=64)
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Sequence
from typing import Any

import albumentations as A
import cv2
import numpy as np

from .errors import DataError

RESIZE_MODES = ("stretch", "letterbox", "none")


def _plain(cfg: Any) -> Any:
    # Hydra hands over OmegaConf containers; convert so isinstance checks below work.
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(cfg, (DictConfig, ListConfig)):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - hydra is a dependency
        pass
    return cfg


def _resolve(target: str) -> Any:
    if "." not in target:
        target = f"albumentations.{target}"
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise DataError(f"transform config: cannot import '{target}' ({e})") from None


def build_transform(item: Any) -> A.BasicTransform:
    """One transform from a ``{"_target_": ..., **kwargs}`` dict (or pass a built one through)."""
    item = _plain(item)
    if not isinstance(item, dict):
        return item
    kw = dict(item)
    target = kw.pop("_target_", None)
    if target is None:
        raise DataError(f"transform config {item!r}: expected a '_target_' key naming the class")
    if "transforms" in kw:
        kw["transforms"] = [build_transform(t) for t in kw["transforms"]]
    cls = _resolve(target)
    try:
        return cls(**kw)
    except (TypeError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        raise DataError(f"transform config {target}: {_summary(e)}") from None


def _summary(e: Exception) -> str:
    """One line from a (possibly multi-line pydantic) construction error."""
    errors = getattr(e, "errors", None) or getattr(e.__cause__, "errors", None)  # albumentations wraps it
    if callable(errors):
        try:
            return "; ".join(
                f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg', '')}" for d in errors()
            )
        except Exception:  # not pydantic after all
            pass
    return " ".join(str(e).split())


def build_pipeline(
    items: Sequence[Any] | None, image_size: int | None, resize: str = "stretch", seed: int | None = 0
) -> A.Compose:
    """Compose ``resize`` (to ``image_size`` square) followed by the configured transforms.

    ``resize``: ``stretch`` (A.Resize), ``letterbox`` (keep aspect: LongestMaxSize + zero pad) or ``none``.
    The resize comes first so the augmentations run on small images (cheap). ``seed`` seeds the
    Compose's own random state (Albumentations 2 ignores the global seeds; ``None`` = unseeded).
    """
    if resize not in RESIZE_MODES:
        raise DataError(f"resize={resize!r}: expected one of {RESIZE_MODES}")
    steps: list = []
    if image_size and resize == "stretch":
        steps.append(A.Resize(image_size, image_size))
    elif image_size and resize == "letterbox":
        steps += [
            A.LongestMaxSize(max_size=image_size),
            A.PadIfNeeded(image_size, image_size, border_mode=cv2.BORDER_CONSTANT, fill=0, fill_mask=0),
        ]
    steps += [build_transform(t) for t in (_plain(items) or [])]
    pipeline = A.Compose(steps)
    if seed is not None:
        seed_pipeline(pipeline, seed)
    return pipeline


def seed_pipeline(pipeline: A.BaseCompose, seed: int) -> None:
    """Seed a pipeline with one random stream shared by all its transforms.

    Not ``A.Compose(seed=)``: albumentations 2.0 seeds every transform's own generator with that
    same seed, so e.g. HorizontalFlip and VerticalFlip (both p=0.5) would always flip together.
    """
    pipeline.set_random_state(np.random.default_rng(seed), random.Random(seed))


def apply_pipeline(
    pipeline: A.Compose, image: np.ndarray, mask: np.ndarray, image_size: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Run the pipeline; return float32 (C,H,W) image in [0,1] and int64 (H,W) mask.

    A final size fix-up guarantees that batches collate even if a configured crop changed the size.
    """
    out = pipeline(image=image, mask=mask)
    img, msk = out["image"], out["mask"]
    if image_size and img.shape[:2] != (image_size, image_size):
        img = cv2.resize(img, (image_size, image_size), interpolation=cv2.INTER_LINEAR)
        msk = cv2.resize(msk, (image_size, image_size), interpolation=cv2.INTER_NEAREST)
    if img.dtype == np.uint8:
        img = img.astype(np.float32) / 255.0
    img = np.clip(img.astype(np.float32, copy=False), 0.0, 1.0)
    if img.ndim == 2:
        img = img[..., None]
    return np.ascontiguousarray(img.transpose(2, 0, 1)), np.ascontiguousarray(msk, dtype=np.int64)
