"""Cut-outs for the object families: procedural generators (no assets needed) and user folders.

A cut-out is an RGBA float32 array (S,S,4) in [0,1], S = :data:`SIZE`, the object centred and fitted into
the square with its aspect ratio kept; the alpha edge is pre-blurred so pasted objects have soft edges.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

SIZE = 128
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


def _soft(alpha: np.ndarray, sigma: float) -> np.ndarray:
    return cv2.GaussianBlur(alpha.astype(np.float32), (0, 0), sigma)


def _smooth_noise(rng: np.random.Generator, cells: int, ch: int = 1) -> np.ndarray:
    n = rng.standard_normal((cells, cells, ch)).astype(np.float32)
    up = cv2.resize(n, (SIZE, SIZE), interpolation=cv2.INTER_CUBIC)
    return up.reshape(SIZE, SIZE, ch)


def _blob(
    rng: np.random.Generator, rx: float, ry: float, harmonics: int = 5, rough: float = 0.25
) -> np.ndarray:
    """Filled irregular blob: a radius modulated by a few random harmonics."""
    t = np.linspace(0, 2 * np.pi, 90, endpoint=False)
    r = np.ones_like(t)
    for k in range(2, 2 + harmonics):
        r += rough / k * rng.standard_normal() * np.cos(k * t + rng.uniform(0, 2 * np.pi))
    pts = np.stack([SIZE / 2 + rx * r * np.cos(t), SIZE / 2 + ry * r * np.sin(t)], 1)
    m = np.zeros((SIZE, SIZE), np.uint8)
    cv2.fillPoly(m, [np.round(pts).astype(np.int32)], 255)
    return m.astype(np.float32) / 255


def instrument(rng: np.random.Generator) -> np.ndarray:
    """A metallic forceps-like tool: a shaded cylindrical shaft entering from one side, with a jaw tip."""
    m = np.zeros((SIZE, SIZE), np.uint8)
    w = int(rng.uniform(0.14, 0.22) * SIZE)
    tip = int(rng.uniform(0.55, 0.75) * SIZE)
    y0 = SIZE // 2 - w // 2
    cv2.rectangle(m, (0, y0), (tip, y0 + w), 255, -1)
    jaw = int(w * rng.uniform(0.8, 1.2))
    cv2.ellipse(m, (tip, SIZE // 2 - w // 4), (jaw, w // 3), -rng.uniform(5, 25), 0, 360, 255, -1)
    cv2.ellipse(m, (tip, SIZE // 2 + w // 4), (jaw, w // 3), rng.uniform(5, 25), 0, 360, 255, -1)
    yy = np.arange(SIZE, dtype=np.float32)[:, None]
    # Cylinder shading across the shaft: a bright stripe slightly off-centre.
    across = np.clip(np.abs(yy - (SIZE / 2 - w * 0.15)) / max(w / 2, 1), 0, 1.5)
    base = rng.uniform(0.55, 0.75)
    grey = base + 0.35 * (1 - across) ** 2 + 0.03 * _smooth_noise(rng, 6)[:, :, 0]
    tint = np.array([1.0, 1.0, rng.uniform(1.0, 1.08)], np.float32)
    rgb = np.clip(grey[:, :, None] * tint, 0, 1) * np.ones((1, SIZE, 1), np.float32)
    return np.dstack([rgb, _soft(m / 255.0, 1.2)]).astype(np.float32)


def feces(rng: np.random.Generator) -> np.ndarray:
    """Residual stool: a yellow-brown irregular blob with mottled texture."""
    a = _blob(rng, SIZE * rng.uniform(0.3, 0.45), SIZE * rng.uniform(0.22, 0.4), rough=0.35)
    base = np.array([rng.uniform(0.55, 0.7), rng.uniform(0.4, 0.52), rng.uniform(0.12, 0.22)], np.float32)
    tex = 1 + 0.12 * _smooth_noise(rng, 10) + 0.05 * _smooth_noise(rng, 40)
    rgb = np.clip(base * tex, 0, 1)
    return np.dstack([rgb, _soft(a, 2.5)]).astype(np.float32)


def blood(rng: np.random.Generator) -> np.ndarray:
    """Fresh blood: a dark red, partly translucent pool with a few streaks."""
    a = _blob(rng, SIZE * rng.uniform(0.25, 0.42), SIZE * rng.uniform(0.15, 0.3), rough=0.45)
    m = (a * 255).astype(np.uint8)
    for _ in range(int(rng.integers(1, 4))):
        p0 = (int(SIZE / 2), int(SIZE / 2))
        ang = rng.uniform(0, 2 * np.pi)
        ln = rng.uniform(0.3, 0.48) * SIZE
        p1 = (int(SIZE / 2 + ln * np.cos(ang)), int(SIZE / 2 + ln * np.sin(ang)))
        cv2.line(m, p0, p1, 255, int(rng.integers(2, 6)))
    base = np.array([rng.uniform(0.45, 0.6), rng.uniform(0.02, 0.08), rng.uniform(0.03, 0.08)], np.float32)
    rgb = np.clip(base * (1 + 0.15 * _smooth_noise(rng, 8)), 0, 1)
    alpha = _soft(m / 255.0, 1.5) * rng.uniform(0.8, 0.95)
    return np.dstack([rgb, alpha]).astype(np.float32)


GENERATORS = {"instrument": instrument, "feces": feces, "blood": blood}


def procedural_cutouts(kind: str, n: int = 8, seed: int = 0) -> list[np.ndarray]:
    """``n`` deterministic procedural cut-outs of ``kind`` (instrument, feces or blood).

    >>> cs = procedural_cutouts("blood", n=2)
    >>> len(cs), cs[0].shape, cs[0].dtype
    (2, (128, 128, 4), dtype('float32'))
    """
    if kind not in GENERATORS:
        raise ValueError(f"procedural cut-outs: unknown kind {kind!r}; valid: {sorted(GENERATORS)}")
    rng = np.random.default_rng([seed, list(GENERATORS).index(kind)])
    return [GENERATORS[kind](rng) for _ in range(n)]


def fit_square(rgb: np.ndarray, alpha: np.ndarray, edge_sigma: float = 1.0) -> np.ndarray:
    """Crop an object to its alpha bounding box and fit it, centred, into a SIZExSIZE RGBA square."""
    ys, xs = np.nonzero(alpha > 0.05)
    if ys.size == 0:
        raise ValueError("cut-out has an empty mask")
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    rgba = np.dstack([rgb[y0:y1, x0:x1], alpha[y0:y1, x0:x1]]).astype(np.float32)
    h, w = rgba.shape[:2]
    s = (SIZE - 4) / max(h, w)
    nh, nw = max(int(round(h * s)), 1), max(int(round(w * s)), 1)
    resized = cv2.resize(rgba, (nw, nh), interpolation=cv2.INTER_AREA)
    out = np.zeros((SIZE, SIZE, 4), np.float32)
    oy, ox = (SIZE - nh) // 2, (SIZE - nw) // 2
    out[oy : oy + nh, ox : ox + nw] = resized.reshape(nh, nw, 4)
    out[:, :, 3] = np.clip(_soft(out[:, :, 3], edge_sigma), 0, 1)
    return out


def _read_mask(path: Path, channel: int) -> np.ndarray | None:
    """A mask file as (H,W) float in [0,1]; multi-page TIFFs (e.g. EAD2019's 5-channel masks) use ``channel``."""
    if path.suffix.lower() in (".tif", ".tiff"):
        ok, pages = cv2.imreadmulti(str(path), flags=cv2.IMREAD_UNCHANGED)
        if ok and len(pages) > 1:
            if channel >= len(pages):
                raise ValueError(
                    f"mask {path}: has {len(pages)} channels, mask_channel={channel} is out of range"
                )
            page = pages[channel]
            return (page > 0).astype(np.float32)
    m = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if m is None:
        return None
    if m.ndim == 3:
        m = m[:, :, min(channel, m.shape[2] - 1)]
    return (m > 0).astype(np.float32)


def _mask_for(img: Path, masks_dir: Path | None) -> Path | None:
    for d in ([masks_dir] if masks_dir else []) + [img.parent]:
        for stem in (img.stem + "_mask", img.stem) if d != img.parent else (img.stem + "_mask",):
            for ext in IMAGE_EXTS:
                cand = d / f"{stem}{ext}"
                if cand.exists() and cand != img:
                    return cand
    return None


def load_cutouts(folder: str | Path, mask_channel: int = 0) -> list[np.ndarray]:
    """Cut-outs from a user folder: RGBA PNGs, or image + mask pairs.

    Pairs are ``name.jpg`` + ``name_mask.png`` side by side, or ``images/name.jpg`` + ``masks/name[_mask].*``
    (any of png/jpg/bmp/tif; multi-channel TIFF masks use ``mask_channel``, e.g. 0 = instrument in EAD2019).

    >>> import tempfile, pathlib
    >>> load_cutouts(tempfile.mkdtemp())  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ValueError: cut-out folder ... has no usable files
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"cut-out folder {folder} does not exist or is not a directory")
    masks_dir = folder / "masks" if (folder / "masks").is_dir() else None
    candidates = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTS)
    if (folder / "images").is_dir():
        candidates += sorted(p for p in (folder / "images").iterdir() if p.suffix.lower() in IMAGE_EXTS)
    out: list[np.ndarray] = []
    for p in candidates:
        if p.stem.endswith("_mask"):
            continue
        img = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
        if img is None or img.ndim != 3:
            continue
        scale = 65535.0 if img.dtype == np.uint16 else 255.0
        alpha: np.ndarray | None
        if img.shape[2] == 4:
            rgba = cv2.cvtColor(img, cv2.COLOR_BGRA2RGBA).astype(np.float32) / scale
            rgb, alpha = rgba[:, :, :3], rgba[:, :, 3]
        else:
            mp = _mask_for(p, masks_dir)
            if mp is None:
                continue
            alpha = _read_mask(mp, mask_channel)
            if alpha is None or alpha.shape != img.shape[:2] or alpha.max() <= 0:
                continue
            rgb = cv2.cvtColor(img[:, :, :3], cv2.COLOR_BGR2RGB).astype(np.float32) / scale
        if alpha.max() <= 0.05:
            continue
        out.append(fit_square(rgb, alpha))
    if not out:
        raise ValueError(
            f"cut-out folder {folder} has no usable files; expected RGBA PNGs, or image + mask pairs "
            f"(name.jpg + name_mask.png, or images/name.jpg + masks/name[_mask].*) with a non-empty mask"
        )
    return out
