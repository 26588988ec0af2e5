"""Readers for 2-D image/mask folders (Kvasir-SEG, PraNet TestDataset, CVC-ClinicDB, PolypGen, Shenzhen).

Layouts found under ``root``:
  * ``images/`` (or ``image/``, ``Original/``) + ``masks/`` (or ``mask/``, ``Ground Truth/``, ``GT/``);
    a mask is ``<stem>.<ext>`` or ``<stem>_mask.<ext>`` (PolypGen), any of jpg/jpeg/png/tif/tiff/bmp;
  * ``TrainDataset/`` holding such a pair of folders (PraNet training layout);
  * ``TestDataset/<name>/images|masks`` (PraNet test layout): all sets, case ids ``<name>/<stem>``.
Masks are read as grey (RGB masks: channel maximum) and thresholded at >127 (``mask_mode="threshold"``)
or taken as class indices (``mask_mode="index"``, checked against ``num_classes``).

Example::

    >>> src = FolderSource("/path/to/kvasir_seg")                 # doctest: +SKIP
    >>> image, mask = src.load(0); src.case_id(0)                 # doctest: +SKIP
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from .errors import DataError

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp")
IMAGE_DIRS = ("images", "image", "Original", "imgs")
MASK_DIRS = ("masks", "mask", "Ground Truth", "GroundTruth", "GT", "labels")


def _first_dir(root: Path, names: tuple[str, ...]) -> Path | None:
    for n in names:
        if (root / n).is_dir():
            return root / n
    return None


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTS)


def _pairs_in(img_dir: Path, mask_dir: Path, prefix: str = "") -> list[tuple[Path, Path, str]]:
    masks: dict[str, Path] = {}
    for m in _files(mask_dir):
        stem = m.stem[:-5] if m.stem.endswith("_mask") else m.stem
        masks.setdefault(stem, m)
    pairs = []
    for im in _files(img_dir):
        if im.stem not in masks:
            raise DataError(f"image {im} has no mask in {mask_dir} "
                            f"(expected {im.stem}.<jpg|png|tif> or {im.stem}_mask.<ext>)")
        pairs.append((im, masks[im.stem], prefix + im.stem))
    return pairs


def find_pairs(root: str | Path) -> list[tuple[Path, Path, str]]:
    """(image path, mask path, case id) for every pair under ``root``; DataError if none."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist (expected images/ and masks/ inside)")
    img_dir, mask_dir = _first_dir(root, IMAGE_DIRS), _first_dir(root, MASK_DIRS)
    if img_dir and mask_dir:
        pairs = _pairs_in(img_dir, mask_dir)
    elif (root / "TrainDataset").is_dir():
        return find_pairs(root / "TrainDataset")
    elif (root / "TestDataset").is_dir():
        pairs = []
        for sub in sorted(p for p in (root / "TestDataset").iterdir() if p.is_dir()):
            i, m = _first_dir(sub, IMAGE_DIRS), _first_dir(sub, MASK_DIRS)
            if i and m:
                pairs += _pairs_in(i, m, prefix=f"{sub.name}/")
    elif img_dir or mask_dir:
        missing = "masks/" if img_dir else "images/"
        raise DataError(f"data folder {root}: found {(img_dir or mask_dir).name}/ but no {missing} folder")
    else:
        raise DataError(f"data folder {root}: expected images/ + masks/, TrainDataset/ or "
                        f"TestDataset/<name>/images|masks inside")
    if not pairs:
        raise DataError(f"data folder {root}: empty dataset (no image files with extensions {IMAGE_EXTS})")
    return pairs


def read_image(path: Path, grey: bool = False) -> np.ndarray:
    """RGB (H,W,3) or grey (H,W,1) uint8; DataError naming the file if it cannot be decoded."""
    flag = cv2.IMREAD_GRAYSCALE if grey else cv2.IMREAD_COLOR
    img = cv2.imread(str(path), flag)
    if img is None or img.size == 0:
        raise DataError(f"cannot read image file {path} (corrupt or not an image)")
    return img[..., None] if grey else cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def read_mask(path: Path, mode: str = "threshold", num_classes: int = 2) -> np.ndarray:
    """(H,W) uint8 class indices; ``threshold``: >127 → 1, ``index``: values checked < num_classes."""
    m = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if m is None or m.size == 0:
        raise DataError(f"cannot read mask file {path} (corrupt or not an image)")
    if m.ndim == 3:
        m = m[..., :3].max(axis=2)  # RGB(A) masks: any bright channel marks foreground
    if m.dtype == np.uint16:
        m = (m // 257).astype(np.uint8) if mode == "threshold" else m
    if mode == "threshold":
        return (m > 127).astype(np.uint8)
    if int(m.max()) >= num_classes:
        raise DataError(f"mask file {path}: value {int(m.max())} outside the class range 0..{num_classes - 1}")
    return m.astype(np.uint8)


class FolderSource:
    """Image/mask pairs from a folder (see module doc), decoded lazily and cached in memory.

    ``cache_mb`` bounds the decoded bytes kept (whole dataset of small images; big ones are re-read).
    """

    def __init__(self, root: str | Path, grey: bool = False, mask_mode: str = "threshold",
                 num_classes: int = 2, cache_mb: float = 1024):
        self.root = Path(root)
        self.pairs = find_pairs(self.root)
        self.grey, self.mask_mode, self.num_classes = grey, mask_mode, num_classes
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._budget = int(cache_mb * 2 ** 20)

    def __len__(self) -> int:
        return len(self.pairs)

    def case_id(self, i: int) -> str:
        return self.pairs[i][2]

    def slice_index(self, i: int) -> int:
        return 0

    def load(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if i in self._cache:
            return self._cache[i]
        ip, mp, _ = self.pairs[i]
        img = read_image(ip, self.grey)
        mask = read_mask(mp, self.mask_mode, self.num_classes)
        if img.shape[:2] != mask.shape:
            raise DataError(f"image {ip} is {img.shape[1]}x{img.shape[0]} but its mask {mp} is "
                            f"{mask.shape[1]}x{mask.shape[0]} (expected the same size)")
        if img.nbytes + mask.nbytes <= self._budget:
            self._budget -= img.nbytes + mask.nbytes
            self._cache[i] = (img, mask)
        return img, mask
