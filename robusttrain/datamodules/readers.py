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

Refused with a DataError naming the file(s), because they cannot be read correctly:
  * two image files with one case id (``a.jpg`` + ``a.png``), or more than one mask for an image
    (``a.png`` + ``a_mask.png``): which one is meant is unknown;
  * a 16-bit image using more than 8 significant bits (12-bit data would be cut to near-black
    8-bit): pass ``image_bits=N`` to scale ``0..2**N-1`` to 0..255;
  * an image or mask of more than :data:`MAX_PIXELS` pixels (decompression bombs), checked from the
    file header before anything is decoded.

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
MAX_PIXELS = 100_000_000  # 100 megapixels (10000 x 10000): far above any endoscopy or X-ray frame
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
        if stem in masks:
            raise DataError(
                f"more than one mask for image '{stem}': {masks[stem]} and {m} (expected one; "
                "remove or rename the other)"
            )
        masks[stem] = m
    pairs = []
    seen: dict[str, Path] = {}
    for im in _files(img_dir):
        if im.stem in seen:
            raise DataError(
                f"two images with case id '{prefix + im.stem}': {seen[im.stem]} and {im} "
                "(expected one file per case; remove or rename one)"
            )
        seen[im.stem] = im
        if im.stem not in masks:
            raise DataError(
                f"image {im} has no mask in {mask_dir} "
                f"(expected {im.stem}.<jpg|png|tif> or {im.stem}_mask.<ext>)"
            )
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
        found = img_dir or mask_dir
        assert found is not None
        raise DataError(f"data folder {root}: found {found.name}/ but no {missing} folder")
    else:
        raise DataError(
            f"data folder {root}: expected images/ + masks/, TrainDataset/ or "
            f"TestDataset/<name>/images|masks inside"
        )
    if not pairs:
        raise DataError(f"data folder {root}: empty dataset (no image files with extensions {IMAGE_EXTS})")
    return pairs


def check_image_bits(image_bits: int | None) -> int | None:
    """``image_bits`` if it is None or an integer in 8..16, else ValueError naming it."""
    if image_bits is not None and (
        isinstance(image_bits, bool) or not isinstance(image_bits, int) or not 8 <= image_bits <= 16
    ):
        raise ValueError(f"image_bits={image_bits!r}: expected null or an integer in 8..16")
    return image_bits


def check_pixels(path: Path) -> None:
    """DataError if the file's header declares more than :data:`MAX_PIXELS` pixels (read before decoding)."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # only the header is read here
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                w, h = im.size
    except (UnidentifiedImageError, OSError, ValueError):
        return  # not a format Pillow knows: the decoder below reports it
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    if w * h > MAX_PIXELS:
        raise DataError(
            f"image file {path} declares {w}x{h} pixels, more than the limit of {MAX_PIXELS:,} "
            "(a decompression bomb or a mistaken file); resize it or remove it"
        )


def read_image(path: Path, grey: bool = False, image_bits: int | None = None) -> np.ndarray:
    """RGB (H,W,3) or grey (H,W,1) uint8; DataError naming the file if it cannot be read correctly.

    16-bit files: values up to 255 are taken as they are; more significant bits are refused unless
    ``image_bits`` says how many there are (then ``0..2**image_bits-1`` is scaled to 0..255).
    """
    check_pixels(path)
    flag = (cv2.IMREAD_GRAYSCALE if grey else cv2.IMREAD_COLOR) | cv2.IMREAD_ANYDEPTH
    img = cv2.imread(str(path), flag)
    if img is None or img.size == 0:
        raise DataError(f"cannot read image file {path} (corrupt or not an image)")
    check_not_truncated(path)
    if img.dtype != np.uint8:
        img = _to_8bit(img, path, image_bits)
    return img[..., None] if grey else cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def _to_8bit(img: np.ndarray, path: Path, image_bits: int | None) -> np.ndarray:
    top = int(img.max()) if img.size else 0
    if image_bits is None:
        if top <= 255:
            return img.astype(np.uint8)
        bits = int(top).bit_length()
        raise DataError(
            f"image file {path} is {img.dtype.itemsize * 8}-bit with values up to {top} ({bits} "
            f"significant bits); set data.image_bits={bits} (or the scanner's bit depth) to scale "
            "it to 8 bits, or convert the files"
        )
    full = 2 ** int(image_bits) - 1
    if top > full:
        raise DataError(
            f"image file {path} has values up to {top}, above image_bits={image_bits} (max {full})"
        )
    return np.round(img.astype(np.float64) * (255.0 / full)).astype(np.uint8)


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
        raise DataError(
            f"image file {path} is a truncated or corrupt JPEG ({e}); re-export or remove it"
        ) from None
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = allow


def read_raw_mask(path: Path) -> np.ndarray:
    """(H,W) mask values as stored (RGB(A): channel maximum); DataError if it cannot be decoded."""
    check_pixels(path)
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

    def __init__(
        self,
        root: str | Path,
        grey: bool = False,
        mask_mode: str = "auto",
        num_classes: int = 2,
        cache_mb: float = 1024,
        image_bits: int | None = None,
    ):
        self.image_bits = check_image_bits(image_bits)
        self.root = Path(root)
        check_mask_mode(mask_mode)
        self.pairs = find_pairs(self.root)
        self.grey, self.num_classes = grey, num_classes
        if mask_mode == "auto":
            self.mask_mode, self.mask_mode_reason = detect_mask_mode(
                [p[1] for p in self.pairs], read_raw_mask, num_classes
            )
        else:
            self.mask_mode, self.mask_mode_reason = mask_mode, f"{mask_mode} (configured)"
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._budget = int(cache_mb * 2**20)

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
        img = read_image(ip, self.grey, self.image_bits)
        mask = read_mask(mp, self.mask_mode, self.num_classes)
        if img.shape[:2] != mask.shape:
            raise DataError(
                f"image {ip} is {img.shape[1]}x{img.shape[0]} but its mask {mp} is "
                f"{mask.shape[1]}x{mask.shape[0]} (expected the same size)"
            )
        if img.nbytes + mask.nbytes <= self._budget:
            self._budget -= img.nbytes + mask.nbytes
            self._cache[i] = (img, mask)
        return img, mask
