"""Cheap smooth random fields (upsampled white noise) shared by the synthetic generators."""

from __future__ import annotations

import cv2
import numpy as np


def smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Zero-mean, unit-ish std field of ``size``² with about ``cells`` blobs per side (float32)."""
    g = rng.standard_normal((cells + 3, cells + 3)).astype(np.float32)
    big = cv2.resize(g, (size + 3 * size // cells, size + 3 * size // cells), interpolation=cv2.INTER_CUBIC)
    o = size // cells  # crop the border, where cubic upsampling is biased
    return big[o : o + size, o : o + size]


def fractal_noise(rng: np.random.Generator, size: int, cells: int, octaves: int = 3) -> np.ndarray:
    out = np.zeros((size, size), np.float32)
    amp = 1.0
    for _ in range(octaves):
        out += amp * smooth_noise(rng, size, min(cells, size))
        cells, amp = cells * 2, amp * 0.5
    return out


def grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """(y, x) coordinates in [0,1), float32."""
    c = (np.arange(size, dtype=np.float32) + 0.5) / size
    return np.meshgrid(c, c, indexing="ij")


def star_radius(
    rng: np.random.Generator, theta: np.ndarray, r: float, wobble: float, k_max: int = 4
) -> np.ndarray:
    """Radius r(θ) of an irregular blob: ``r`` modulated by random angular harmonics."""
    # evaluate on a 1-D angle table and look it up: cos over the full image per harmonic is slow
    t = np.linspace(-np.pi, np.pi, 1025, dtype=np.float32)
    lut = np.ones_like(t)
    for k in range(2, k_max + 1):
        lut += wobble / k * rng.uniform(-1, 1) * np.cos(k * t + rng.uniform(0, 2 * np.pi))
    idx = ((theta + np.pi) * (1024 / (2 * np.pi))).astype(np.int32)
    return r * lut[np.clip(idx, 0, 1024)]


class MemoCache:
    """Keeps generated samples (deterministic, so caching is exact) up to ``cache_mb`` of memory."""

    def __init__(self, cache_mb: float = 512):
        self._store: dict[int, tuple] = {}
        self._left = int(cache_mb * 2**20)

    def get(self, i: int, make) -> tuple:
        if i in self._store:
            return self._store[i]
        out = make()
        size = sum(a.nbytes for a in out)
        if size <= self._left:
            self._left -= size
            self._store[i] = out
        return out
