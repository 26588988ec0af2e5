"""Readers for 2-D image/mask folders (Kvasir-SEG, PraNet TestDataset, CVC-ClinicDB, PolypGen, Shenzhen).

Layouts found under ``root``:
  * ``images/`` (or ``image/``, ``Original/``) + ``masks/`` (or ``mask/``, ``Ground Truth/``, ``GT/``);
    a mask is ``<stem>.<ext>`` or ``<stem>_mask.<ext>`` (PolypGen), any of jpg/jpeg/png/tif/tiff/bmp;
  * ``TrainDataset/`` holding such a pair of folders (PraNet training layout);
  * ``TestDataset/<name>/images|masks`` (PraNet test layout): all sets, case ids ``<name>/<stem>``.
Masks are read as grey (RGB masks: channel maximum) and decoded by their encoding, ``mask_mode``:
``binary255`` (0/255, JPEG noise tolerated), ``class_index`` (0..K-1, 8 or 16 bit) or ``auto``
(detected from a sample of the folder's masks; see :mod:`robusttrain.datamodules.masks`).
Truncated JPEGs (libjpeg would only warn and return a part-grey image) raise DataError.

Example::

    >>> src = FolderSource("/path/to/kvasir_seg")                 # doctest: +SKIP
    >>> image, mask = src.load(0); src.case_id(0)                 # doctest: +SKIP
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from .errors import DataError
from .masks import check_mask_mode, decode_mask, detect_mask_mode

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
    check_not_truncated(path)
    return img[..., None] if grey else cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def check_not_truncated(path: Path) -> None:
    """DataError if ``path`` is a JPEG cut short (OpenCV decodes those part-grey with a warning only).

    A JPEG ends with the EOI marker FF D9; only files without it at the end are decoded again with
    Pillow, which tells a truncated file from one with bytes appended after EOI.
    """
    with open(path, "rb") as f:
        if f.read(2) != b"\xff\xd8":  # not a JPEG (a .jpg may hold a PNG): decoders notice truncation
            return
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 64))
        tail = f.read().rstrip(b"\x00\r\n \t")
    if tail.endswith(b"\xff\xd9"):
        return
    from PIL import Image, ImageFile

    allow, ImageFile.LOAD_TRUNCATED_IMAGES = ImageFile.LOAD_TRUNCATED_IMAGES, False
    try:
        with Image.open(path) as im:
            im.load()
    except OSError as e:
        raise DataError(f"image file {path} is a truncated or corrupt JPEG ({e}); re-export or remove it") from None
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = allow


def read_raw_mask(path: Path) -> np.ndarray:
    """(H,W) mask values as stored (RGB(A): channel maximum); DataError if it cannot be decoded."""
    m = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if m is None or m.size == 0:
        raise DataError(f"cannot read mask file {path} (corrupt or not an image)")
    check_not_truncated(path)
    if m.ndim == 3:
        m = m[..., :3].max(axis=2)  # RGB(A) masks: any bright channel marks foreground
    return m


def read_mask(path: Path, mode: str = "binary255", num_classes: int = 2) -> np.ndarray:
    """(H,W) uint8 class indices from a mask file in encoding ``mode`` (``binary255``/``class_index``)."""
    return decode_mask(read_raw_mask(path), mode, num_classes, path)


class FolderSource:
    """Image/mask pairs from a folder (see module doc), decoded lazily and cached in memory.

    ``cache_mb`` bounds the decoded bytes kept (whole dataset of small images; big ones are re-read).
    ``mask_mode``: ``auto`` | ``binary255`` | ``class_index``; the encoding in use is ``mask_mode``
    after construction (``mask_mode_reason`` says how it was chosen).
    """

    def __init__(self, root: str | Path, grey: bool = False, mask_mode: str = "auto",
                 num_classes: int = 2, cache_mb: float = 1024):
        self.root = Path(root)
        check_mask_mode(mask_mode)
        self.pairs = find_pairs(self.root)
        self.grey, self.num_classes = grey, num_classes
        if mask_mode == "auto":
            self.mask_mode, self.mask_mode_reason = detect_mask_mode(
                [p[1] for p in self.pairs], read_raw_mask, num_classes)
        else:
            self.mask_mode, self.mask_mode_reason = mask_mode, f"{mask_mode} (configured)"
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
