"""Procedural, index-addressable synthetic colonoscopy frames with polyp masks.

Every frame is drawn from ``np.random.default_rng([seed, index])`` alone, so any sample can be
regenerated without the others. Which indices are *planted hard cases* is a seeded choice of
``round(hard_fraction * n)`` indices (at least one when ``hard_fraction > 0``). Kinds:

* ``flat_pale``   – small flat polyp, slightly paler than the mucosa, no dome shading or shadow rim;
* ``glare_tissue`` – polyp with the mucosa's own colour, large specular glare patches over it;
* ``dark_edge``   – small polyp near the field-of-view border, in the vignette's shadow.

Example::

    >>> from robusttrain.datamodules.synthetic_polyp import render_polyp_frame
    >>> img, mask = render_polyp_frame(seed=0, index=7, size=128)
    >>> img.shape, img.dtype, mask.shape, int(mask.max())
    ((128, 128, 3), dtype('uint8'), (128, 128), 1)
"""

from __future__ import annotations

import cv2
import numpy as np

from ._noise import MemoCache, fractal_noise, grid, smooth_noise, star_radius

HARD_KINDS = ("flat_pale", "glare_tissue", "dark_edge")


def _field_of_view(rng, y, x, size):
    """Irregular circular scope aperture (often clipped by the frame) with a soft edge."""
    if rng.random() < 0.15:  # some frames are cropped to fill the whole image
        return np.ones_like(x), 0.5, 0.5, 0.75
    cy, cx = 0.5 + rng.uniform(-0.03, 0.03, 2)
    R = rng.uniform(0.5, 0.62)
    th = np.arctan2(y - cy, x - cx)
    d = np.hypot(y - cy, x - cx)
    r = star_radius(rng, th, R, 0.03, 6)
    fov = np.clip((r - d) * size / 2.0, 0, 1)
    c = R * rng.uniform(1.15, 1.4)  # octagon-like corner cut of many scope processors
    fov *= np.clip((c - np.abs(x - cx) - np.abs(y - cy)) * size / 2.0, 0, 1)
    return fov, cy, cx, R


def _spot(y, x, cy, cx, s):
    return np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * s * s))


def render_polyp_frame(
    seed: int, index: int, size: int = 256, hard: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One RGB frame (H,W,3 uint8) and its binary mask (H,W uint8 {0,1})."""
    rng = np.random.default_rng([int(seed), int(index)])
    y, x = grid(size)
    fov, cy, cx, R = _field_of_view(rng, y, x, size)

    # mucosa: pinkish-red base colour with multi-scale texture
    base = np.array([rng.uniform(0.72, 0.9), rng.uniform(0.3, 0.45), rng.uniform(0.25, 0.4)], np.float32)
    tex = fractal_noise(rng, size, 4, 3)
    img = base * (1 + 0.07 * tex[..., None] * np.array([1.0, 1.3, 1.3], np.float32))

    # vessels: thin tortuous lines where a smooth field crosses zero; they darken green/blue most
    v1, v2 = smooth_noise(rng, size, 5), smooth_noise(rng, size, 9)
    w = rng.uniform(0.02, 0.05)
    vessels = np.exp(-((v1 / w) ** 2)) * 0.8 + np.exp(-((v2 / (w * 0.7)) ** 2)) * 0.5
    img *= 1 - rng.uniform(0.15, 0.35) * vessels[..., None] * np.array([0.35, 1.0, 0.9], np.float32)

    # folds: warped rings around the (dark) lumen
    ang = rng.uniform(0, 2 * np.pi)
    ly, lx = cy + 0.35 * R * np.sin(ang) * rng.random(), cx + 0.35 * R * np.cos(ang) * rng.random()
    dl = np.hypot(y - ly, x - lx)
    phase = dl * rng.uniform(14, 26) + 1.5 * smooth_noise(rng, size, 4)
    folds = (0.5 + 0.5 * np.sin(phase)) ** 3
    fold_shade = 1 - rng.uniform(0.12, 0.28) * folds
    lumen = 1 - 0.9 * np.exp(-((dl / rng.uniform(0.06, 0.14)) ** 2))

    # polyp shape and placement
    kind = hard
    if kind == "dark_edge":
        r_p, far = rng.uniform(0.04, 0.07), rng.uniform(0.72, 0.85)
    elif kind == "flat_pale":
        r_p, far = rng.uniform(0.06, 0.11), rng.uniform(0.1, 0.6)
    else:
        r_p, far = (
            rng.uniform(0.06, 0.2) if rng.random() < 0.8 else rng.uniform(0.2, 0.28),
            rng.uniform(0.0, 0.55),
        )
    a = ang + np.pi + rng.uniform(-1.2, 1.2)  # keep away from the lumen
    py, px = cy + far * R * np.sin(a), cx + far * R * np.cos(a)
    aspect, rot = rng.uniform(0.75, 1.25), rng.uniform(0, np.pi)
    dy, dx = y - py, x - px
    u = (dx * np.cos(rot) + dy * np.sin(rot)) / aspect
    vv = (-dx * np.sin(rot) + dy * np.cos(rot)) * aspect
    d = np.hypot(u, vv)
    rth = star_radius(rng, np.arctan2(vv, u), r_p, 0.35 if kind != "flat_pale" else 0.5)
    dn = d / rth
    label = (dn < 1) & (fov > 0.5)
    alpha = np.clip((1 - dn) * rth * size + 0.5, 0, 1)[..., None]  # ~1 px soft edge
    h = np.sqrt(np.clip(1 - dn**2, 0, 1))  # dome height
    light = rng.uniform(0, 2 * np.pi)
    lyd, lxd = np.sin(light), np.cos(light)

    if kind == "flat_pale":
        pcol = base * 0.9 + 0.1 * np.array([0.95, 0.75, 0.7], np.float32)
        pshade, ptex_amp, rim, spec = 0.97 + 0.06 * h, 0.07, 0.0, 0.0
    elif kind == "glare_tissue":
        pcol = base * rng.uniform(0.97, 1.03, 3).astype(np.float32)
        pshade, ptex_amp, rim, spec = 0.85 + 0.2 * h, 0.08, 0.1, 0.0
    else:
        pcol = base * rng.uniform([0.85, 0.75, 0.75], [1.15, 1.35, 1.3]).astype(np.float32)
        pcol = pcol + rng.uniform(-0.05, 0.12)  # some paler, some darker/redder polyps
        pshade = 0.68 + 0.4 * h + 0.15 * (dx * lxd + dy * lyd) / r_p
        ptex_amp, rim, spec = rng.uniform(0.06, 0.16), rng.uniform(0.2, 0.4), rng.uniform(0.5, 1.0)
    ptex = smooth_noise(rng, size, 24) + 0.5 * smooth_noise(rng, size, 48)
    polyp = pcol * (pshade * (1 + ptex_amp * ptex))[..., None]
    img = img * (fold_shade * lumen)[..., None] * (1 - alpha) + polyp * alpha
    if kind == "flat_pale":  # folds run faintly over a flat lesion
        img *= (1 - 0.3 * (1 - fold_shade) * alpha[..., 0])[..., None]
    # shadow rim on the side away from the light
    side = np.clip(-(dx * lxd + dy * lyd) / (r_p + 1e-6), 0, 1)
    img *= (1 - rim * side * np.exp(-(((dn - 1.05) / 0.12) ** 2)) * (dn > 0.9))[..., None]

    # illumination: fall-off from the scope's light, darker lumen, vignette
    dc = np.hypot(y - cy, x - cx) / R
    illum = np.clip(1.08 - rng.uniform(0.35, 0.6) * dc**2, 0.12, 1.2)
    if kind == "dark_edge":
        illum *= 0.8
    img *= illum[..., None]

    # specular highlights: small glints on mucosa ridges and a highlight on the polyp dome
    glints = np.clip((smooth_noise(rng, size, 28) - 2.3) * 2.5, 0, 1) * (folds < 0.2)
    hl = spec * _spot(y, x, py - 0.35 * r_p * lyd, px - 0.35 * r_p * lxd, 0.12 * r_p) * alpha[..., 0]
    if kind == "glare_tissue":  # big saturated glare blobs over the lesion and a streak elsewhere
        for _ in range(rng.integers(2, 4)):
            gy, gx = py + rng.uniform(-0.6, 0.6) * r_p, px + rng.uniform(-0.6, 0.6) * r_p
            hl += np.clip(2.5 * _spot(y, x, gy, gx, rng.uniform(0.15, 0.3) * r_p) - 0.5, 0, 1)
        hl += np.clip(
            2 * _spot(y, x, cy + rng.uniform(-0.3, 0.3), cx + rng.uniform(-0.3, 0.3), 0.04) - 0.6, 0, 1
        )
    white = np.clip(glints + hl, 0, 1)[..., None]
    img = img * (1 - white) + white * np.array([1.0, 0.98, 0.97], np.float32)

    img *= fov[..., None]
    img += rng.uniform(0.005, 0.02) * rng.standard_normal(img.shape, dtype=np.float32)
    img = cv2.GaussianBlur(np.clip(img, 0, 1), (3, 3), 0.6)
    return (img * 255 + 0.5).astype(np.uint8), label.astype(np.uint8)


def choose_hard(n: int, hard_fraction: float, seed: int, start: int = 0) -> dict[int, str]:
    """Seeded choice of planted hard indices (local 0..n-1) → kind."""
    if hard_fraction <= 0 or n == 0:
        return {}
    k = min(n, max(1, int(round(hard_fraction * n))))
    rng = np.random.default_rng([int(seed), int(start), int(n), 7919])
    picks = sorted(rng.choice(n, k, replace=False).tolist())
    return {int(i): HARD_KINDS[(j + start) % len(HARD_KINDS)] for j, i in enumerate(picks)}


class SyntheticPolypSource:
    """``n`` synthetic frames with ids ``synpolyp_{start+i:04d}`` (a source for SegmentationDataset).

    Example::

        >>> src = SyntheticPolypSource(20, seed=1, image_size=64)
        >>> img, mask = src.load(3); src.case_id(3), sorted(src.hard_cases.values())
        ('synpolyp_0003', ['flat_pale', 'glare_tissue'])
    """

    def __init__(
        self, n: int, seed: int = 0, image_size: int = 128, hard_fraction: float = 0.1, start: int = 0
    ):
        self.n, self.seed, self.size, self.start = int(n), int(seed), int(image_size), int(start)
        self._cache = MemoCache()  # frames are deterministic: generate each once
        self._hard = choose_hard(self.n, hard_fraction, self.seed, self.start)
        self.hard_cases = {self.case_id(i): k for i, k in self._hard.items()}

    def __len__(self) -> int:
        return self.n

    def case_id(self, i: int) -> str:
        return f"synpolyp_{self.start + i:04d}"

    def slice_index(self, i: int) -> int:
        return 0

    def load(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        hard = self._hard.get(i)
        return self._cache.get(i, lambda: render_polyp_frame(self.seed, self.start + i, self.size, hard))
