"""Mask encodings: 0/255 binary (with JPEG noise) or class indices, detected per dataset.

Two encodings are found in segmentation folders:

* ``binary255`` — background 0, foreground 255 (or 65535 in 16-bit files). JPEG masks (Kvasir-SEG,
  CVC-ColonDB, Shenzhen) carry compression noise around both values; a pixel is foreground when
  it is above half of the full scale (> 127 in 8 bit).
* ``class_index`` — each pixel holds its class id 0..K-1 (a 0/1 PNG for a binary task; 8- or 16-bit).

``mask_mode="auto"`` decodes a sample of the dataset's masks (:func:`detect_mask_mode`) and picks
the encoding they share; every mask is then checked against it when it is loaded
(:func:`decode_mask`). A mask fitting neither encoding — e.g. a 0/1 mask with a stray 7, or
0/100 — is refused with the file and the values found, never silently thresholded to empty.

>>> import numpy as np
>>> m = np.zeros((8, 8), np.uint8); m[2:5, 2:5] = 1
>>> classify(m, num_classes=2), int(decode_mask(m, "class_index", 2, "a.png").sum())
('class_index', 9)
>>> classify(m * 255, 2), classify(np.zeros((4, 4), np.uint8), 2)
('binary255', 'empty')
>>> bad = m.copy(); bad[0, 0] = 7
>>> decode_mask(bad, "class_index", 2, "b.png")
Traceback (most recent call last):
...
robusttrain.datamodules.errors.DataError: mask file b.png: values 0 (54 px), 1 (9 px), 7 (1 px) fit neither mask encoding: expected class indices 0..1 (mask_mode='class_index') or 0/255 foreground masks (mask_mode='binary255')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from robusttrain.validate import check_choice

from .errors import DataError

MASK_MODES = ("auto", "binary255", "class_index")
EMPTY, BINARY, INDEX = "empty", "binary255", "class_index"
# A low band (1..127) larger than the foreground and dominated by one value is a class id
# (0/1 mask with a stray 255), not JPEG ringing: measured ringing spreads over many values
# (the most frequent one holds <= 55 % of the band on the shared Kvasir/CVC/Shenzhen masks and
# on synthetic JPEGs of 1-30 px discs at quality 50-95).
_LABEL_DOMINANCE = 0.75


def check_mask_mode(mask_mode: str) -> str:
    return check_choice("mask_mode", mask_mode, MASK_MODES)


def _as_int(m: np.ndarray) -> np.ndarray | None:
    """Integer view of the mask values; None when they are not whole non-negative numbers."""
    if m.dtype.kind in "ui":
        return m if m.dtype.kind == "u" or m.size == 0 or m.min() >= 0 else None
    if m.dtype.kind == "f":
        if not np.isfinite(m).all() or (m < 0).any() or (m != np.round(m)).any():
            return None
        return m.astype(np.int64)
    return None


def classify(m: np.ndarray, num_classes: int) -> str | None:
    """``"empty"``, ``"class_index"``, ``"binary255"`` or None (fits neither) for one (H,W) mask."""
    v = _as_int(m)
    if v is None:
        return None
    top = int(v.max()) if v.size else 0
    if top == 0:
        return EMPTY
    if top < num_classes:
        return INDEX
    full = 65535 if top > 255 else 255  # 16-bit 0/65535 files; 0/255 stored in 16 bit too
    if top > full:
        return None
    v8 = (v.astype(np.int64) * 255 + full // 2) // full if full != 255 else v
    counts = np.bincount(v8.ravel(), minlength=256)
    fg, low = int(counts[128:].sum()), counts[1:128]
    if fg == 0:
        return None
    if low.sum() > fg and low.max() >= _LABEL_DOMINANCE * low.sum():
        return None
    return BINARY


def describe_values(m: np.ndarray) -> str:
    """Short description of the values in a mask for error messages."""
    u, n = np.unique(m, return_counts=True)
    if len(u) <= 8:  # with pixel counts, a stray value stands out: "0 (400 px), 1 (63 px), 255 (1 px)"
        return ", ".join(f"{v.item()} ({c} px)" for v, c in zip(u, n))
    return f"{len(u)} distinct values in [{u[0].item()}, {u[-1].item()}]"


def _expected(num_classes: int) -> str:
    return (
        f"class indices 0..{num_classes - 1} (mask_mode='class_index') or 0/255 foreground masks "
        f"(mask_mode='binary255')"
    )


def decode_mask(m: np.ndarray, mode: str, num_classes: int, path: str | Path) -> np.ndarray:
    """(H,W) uint8 class indices from a raw mask in encoding ``mode``; DataError naming ``path``."""
    kind = classify(m, num_classes)
    if kind is None:
        raise DataError(
            f"mask file {path}: values {describe_values(m)} fit neither mask encoding: "
            f"expected {_expected(num_classes)}"
        )
    if kind not in (EMPTY, mode):
        other = "0/255 foreground" if kind == BINARY else f"class indices 0..{num_classes - 1}"
        raise DataError(
            f"mask file {path}: values {describe_values(m)} look like {other}, but this dataset's "
            f"masks are {mode} (mask_mode={mode!r}); fix the file or pass mask_mode={kind!r}"
        )
    if mode == BINARY:
        full = 65535 if m.max() > 255 else 255
        return (m > full // 2).astype(np.uint8)
    return m.astype(np.uint8)


def detect_mask_mode(
    paths: Sequence[Path], read: Callable[[Path], np.ndarray], num_classes: int, sample: int = 16
) -> tuple[str, str]:
    """(mode, reason) from up to ``sample`` masks spread over ``paths``; DataError when they disagree.

    All-empty samples give ``binary255`` (each file is still checked when it is loaded).
    """
    if not paths:
        return BINARY, "no masks"
    pick = sorted({int(i) for i in np.linspace(0, len(paths) - 1, min(sample, len(paths)))})
    seen: dict[str, Path] = {}
    for i in pick:
        m = read(paths[i])
        kind = classify(m, num_classes)
        if kind is None:
            raise DataError(
                f"mask file {paths[i]}: values {describe_values(m)} fit neither mask encoding: "
                f"expected {_expected(num_classes)}"
            )
        if kind != EMPTY:
            seen.setdefault(kind, paths[i])
    if len(seen) > 1:
        raise DataError(
            f"masks mix encodings: {seen[INDEX]} holds class indices but {seen[BINARY]} is 0/255; "
            "convert them to one encoding (or pass mask_mode= to refuse the others by name)"
        )
    mode = next(iter(seen), BINARY)
    return mode, f"{mode} (auto, from {len(pick)} of {len(paths)} masks)"
