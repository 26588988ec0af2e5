"""Procedural frontal chest X-ray with a lung mask (both lungs = 1).

Body, two lung fields bounded below by the diaphragm domes and medially by the mediastinum/heart,
posterior ribs crossing the lungs, clavicles, exposure and noise. Planted hard cases
(``round(hard_fraction * n)``, at least one) carry a dense opacity (consolidation/effusion-like)
inside a lung that is still labelled lung — the lung-field analogue of ACDC's papillary muscles.

Example::

    >>> from robusttrain.datamodules.synthetic_cxr import render_cxr
    >>> img, mask = render_cxr(seed=0, index=0, size=64); img.shape, int(mask.max())
    ((64, 64), 1)
"""

from __future__ import annotations

import cv2
import numpy as np

from ._noise import MemoCache, grid, smooth_noise
from .synthetic_polyp import choose_hard


def render_cxr(seed: int, index: int, size: int = 128, hard: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """float32 (H,W) image in [0,1] and uint8 (H,W) lung mask."""
    rng = np.random.default_rng([int(seed), int(index), 17])
    y, x = grid(size)
    body = np.clip((0.47 + rng.uniform(-0.03, 0.03) - np.abs(x - 0.5)) * size / 3, 0, 1)
    img: np.ndarray = 0.15 + 0.5 * body
    lungs = np.zeros((size, size), bool)
    mid = 0.5 + rng.uniform(-0.02, 0.02)
    top, base = rng.uniform(0.12, 0.2), rng.uniform(0.72, 0.85)
    for side in (-1, 1):
        cx = mid + side * rng.uniform(0.17, 0.22)
        hw = rng.uniform(0.11, 0.15)
        inner = mid + side * (
            0.05 + (0.06 if side > 0 else 0.0) * (y > 0.5)
        )  # heart bulges left (image right)
        dome = base - rng.uniform(0.03, 0.08) * np.cos(np.clip((x - cx) / hw, -1.5, 1.5))
        t = np.clip((y - top) / (dome - top), 0, 1)
        width = hw * np.sqrt(np.clip(t * 1.8, 0, 1))  # rounded apex
        lung = (y > top) & (y < dome) & (np.abs(x - cx) < width * 1.15) & (side * (x - inner) > 0)
        lungs |= lung
    img = np.where(lungs, 0.12 + 0.06 * smooth_noise(rng, size, 24), img)  # air-filled lungs are dark
    if hard:  # dense opacity inside one lung, still lung in the label
        ys, xs = np.nonzero(lungs)
        k = int(rng.integers(len(ys)))
        r = rng.uniform(0.07, 0.12)
        blob = np.hypot(y - ys[k] / size, x - xs[k] / size) < r * (1 + 0.3 * smooth_noise(rng, size, 6))
        img = np.where(blob & lungs, 0.5 + 0.1 * rng.random(), img)
    # posterior ribs: bright curved bands sloping down laterally; clavicles on top
    sp = rng.uniform(0.06, 0.075)
    for k in range(10):
        yc = top - 0.02 + k * sp + rng.uniform(0.15, 0.3) * (x - mid) ** 2 * 4
        img = img + 0.13 * np.exp(-(((y - yc) / 0.012) ** 2)) * body
    img = img + 0.2 * np.exp(-(((y - top + 0.01 - 0.3 * np.abs(x - mid) ** 1.5) / 0.015) ** 2)) * body
    img = cv2.GaussianBlur(img.astype(np.float32), (0, 0), 0.8)
    img = img * (1 + 0.1 * smooth_noise(rng, size, 3)) * rng.uniform(0.85, 1.1)
    img += 0.02 * rng.standard_normal(img.shape, dtype=np.float32)
    return np.clip(img, 0, 1).astype(np.float32), lungs.astype(np.uint8)


class SyntheticCXRSource:
    """``n`` synthetic chest X-rays, ids ``syncxr_{start+i:04d}``; ``hard_cases`` = planted opacities."""

    def __init__(
        self, n: int, seed: int = 0, image_size: int = 128, hard_fraction: float = 0.1, start: int = 0
    ):
        self.n, self.seed, self.size, self.start = int(n), int(seed), int(image_size), int(start)
        self._cache = MemoCache()  # frames are deterministic: generate each once
        self._hard = set(choose_hard(self.n, hard_fraction, self.seed + 1, self.start))
        self.hard_cases = {self.case_id(i): "opacity" for i in self._hard}

    def __len__(self) -> int:
        return self.n

    def case_id(self, i: int) -> str:
        return f"syncxr_{self.start + i:04d}"

    def slice_index(self, i: int) -> int:
        return 0

    def load(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self._cache.get(i, lambda: render_cxr(self.seed, self.start + i, self.size, i in self._hard))
