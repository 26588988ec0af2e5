"""Specular highlights (paper 000, MR1-4): soft elliptical white spots clustered around a few centres.

A spot is the ellipse ``(u/a)^2 + (v/b)^2 = d^2`` (rotated by ``angle``): fully white for ``d <= 0.55``,
then a Gaussian fall-off (the paper Gaussian-blurs hard ellipses; an analytic fall-off gives the same
look without a full-image blur) that reaches exactly 0 at ``d = 1.45``. Its opacity ``strength`` is the
"gray mask": the local brightness relative to 0.45, clipped to [0.35, 1], so spots in dark regions are
dimmer. Semi-axes are at most ``lambda * H`` (severity 1..5: lambda = 0.02..0.06, 2-4 .. 8-14 spots).

Spots sit on free cells (inside the field of view, away from the lesion) and only their windows are
touched: the numpy path blends inside the spots' bounding box only.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .base import Perturbation
from .placement import (PlacedSampling, erode_cells, erode_cells_np, gather_cells, gather_cells_np,
                        pick_cells, pick_cells_np)

CORE, EDGE, REACH = 0.55, 0.30, 1.45
_G_REACH = math.exp(-0.5 * ((REACH - CORE) / EDGE) ** 2)


def _alpha(py, px, cy, cx, a, b, ang, strength, xp):
    """Opacity of one spot at pixel coordinates (py, px); same float32 formula on both paths."""
    u, v = px - cx, py - cy
    c, s = xp.cos(ang), xp.sin(ang)
    xr, yr = u * c + v * s, v * c - u * s
    d = xp.sqrt((xr / (a + 1e-3)) ** 2 + (yr / (b + 1e-3)) ** 2)
    e = (d - CORE) / EDGE
    e = e * (e > 0)
    g = (xp.exp(-0.5 * e * e) - _G_REACH) / (1 - _G_REACH)
    return strength * g * (g > 0)


class Specularity(PlacedSampling, Perturbation):
    """Specular reflections near cluster centres, dimmed in dark regions.

    Params (pixel units, so replay on images of the same size): ``center`` (B,S,2) y,x; ``axes`` (B,S,2)
    semi-axes; ``angle`` (B,S); ``strength`` (B,S) opacity (0 for unused/invalid spots).

    Example:
        >>> import numpy as np
        >>> img = np.full((128, 128, 3), 120, np.uint8)
        >>> out, p = Specularity(severity=5).apply_numpy(img, rng=np.random.default_rng(1))
        >>> int(out.max()) > 200 and out.shape == img.shape
        True
    """

    name = "specularity"
    SPOTS = {1: (2, 4), 2: (3, 6), 3: (4, 8), 4: (6, 10), 5: (8, 14)}
    LAMBDA = {1: 0.02, 2: 0.03, 3: 0.04, 4: 0.05, 5: 0.06}

    def _place(self, luma, free, k, h, w, r, device=None) -> dict:
        """Spot params from the low-res maps; ``r`` is a TorchRandom (torch maps) or NumpyRandom (numpy)."""
        th = isinstance(luma, torch.Tensor)
        dev = (lambda t: t.to(device)) if th else (lambda t: t)  # noqa: E731
        take = (lambda a, i: a.gather(1, i)) if th else (lambda a, i: np.take_along_axis(a, i, 1))  # noqa: E731
        xp = torch if th else np
        b = luma.shape[0]
        lo, hi = self.SPOTS[self.severity]
        lam = self.LAMBDA[self.severity] * h
        rc = math.ceil(REACH * lam / k)
        ok = erode_cells(free, rc) if th else erode_cells_np(free, rc)
        score = ok * (0.15 + luma)
        cells = pick_cells(score, 3, r) if th else pick_cells_np(score, 3, r)
        wc = luma.shape[-1]
        cy, cx = (cells // wc + 0.5) * k, (cells % wc + 0.5) * k
        n_cl = dev(r.integers(1, 4, (b,)))
        which = xp.clip(dev(r.uniform(0, 1, (b, hi))) * n_cl[:, None], 0, 2)
        which = which.long() if th else which.astype(np.int64)
        spread = 0.06 * h
        y = take(cy, which) + dev(r.normal((b, hi))) * spread
        x = take(cx, which) + dev(r.normal((b, hi))) * spread
        # Mostly small spots with a few larger ones, as in real frames.
        a = (0.15 + 0.85 * dev(r.uniform(0, 1, (b, hi))) ** 2) * lam
        bb = a * dev(r.uniform(0.4, 1.0, (b, hi)))
        ang = dev(r.uniform(0, math.pi, (b, hi)))
        n = dev(r.integers(lo, hi + 1, (b,)))
        inside = (y >= 0) & (y <= h - 1) & (x >= 0) & (x <= w - 1)
        on_free = gather_cells(ok, y, x, k) if th else gather_cells_np(ok, y, x, k)
        valid = (xp.arange(hi)[None] < n[:, None]) if not th else (torch.arange(hi, device=device)[None] < n[:, None])
        valid = valid & inside & on_free
        near = gather_cells(luma, y, x, k) if th else gather_cells_np(luma, y, x, k)
        gray = xp.clip(near / 0.45, 0.35, 1.0)
        strength = gray * dev(r.uniform(0.85, 1.0, (b, hi))) * valid
        f32 = (lambda t: t.float()) if th else (lambda t: t.astype(np.float32))  # noqa: E731
        return {"center": f32(xp.stack([y, x], -1)), "axes": f32(xp.stack([a, bb], -1)),
                "angle": f32(ang), "strength": f32(strength)}


    def _window(self, h: int) -> int:
        return math.ceil(REACH * self.LAMBDA[self.severity] * h) + 1

    def _apply_torch(self, images, masks, params):
        b, c, h, w = images.shape
        half = self._window(h)
        off = torch.arange(-half, half + 1, device=images.device, dtype=torch.float32)
        cy, cx = params["center"][..., 0].float(), params["center"][..., 1].float()
        py = torch.round(cy)[..., None, None] + off[:, None]  # (B,S,P,1)
        px = torch.round(cx)[..., None, None] + off[None, :]  # (B,S,1,P)
        e = lambda t: t.float()[..., None, None]  # noqa: E731
        alpha = _alpha(py, px, e(cy), e(cx), e(params["axes"][..., 0]), e(params["axes"][..., 1]),
                       e(params["angle"]), e(params["strength"]), torch)
        inside = (py >= 0) & (py < h) & (px >= 0) & (px < w)
        alpha = alpha * inside
        idx = (py.clamp(0, h - 1) * w + px.clamp(0, w - 1)).long().expand_as(alpha)
        canvas = images.new_zeros(b, h * w)
        canvas.scatter_reduce_(1, idx.reshape(b, -1), alpha.reshape(b, -1).to(images.dtype), reduce="amax")
        canvas = canvas.view(b, 1, h, w)
        if masks is not None:
            canvas = canvas * (masks[:, None] == 0)
        # Blend towards white: x + A * (1 - x).
        return torch.addcmul(images, canvas, 1.0 - images).clamp_(0.0, 1.0)

    def _apply_np(self, image, mask, params):
        h, w = image.shape[:2]
        half = self._window(h)
        strength = np.asarray(params["strength"], np.float32)
        idx = np.flatnonzero(strength > 0)
        if idx.size == 0:
            return image.copy()
        center = np.asarray(params["center"], np.float32)[idx]
        ry, rx = np.rint(center[:, 0]).astype(int), np.rint(center[:, 1]).astype(int)
        y0, y1 = max(int(ry.min()) - half, 0), min(int(ry.max()) + half + 1, h)
        x0, x1 = max(int(rx.min()) - half, 0), min(int(rx.max()) + half + 1, w)
        canvas = np.zeros((y1 - y0, x1 - x0), np.float32)
        off = np.arange(-half, half + 1, dtype=np.float32)
        axes, ang = np.asarray(params["axes"], np.float32)[idx], np.asarray(params["angle"], np.float32)[idx]
        for j in range(idx.size):  # a handful of spots, each vectorised over its window
            py = np.float32(ry[j]) + off[:, None]
            px = np.float32(rx[j]) + off[None, :]
            a = _alpha(py, px, center[j, 0], center[j, 1], axes[j, 0], axes[j, 1], ang[j], strength[idx[j]], np)
            ys, xs = ry[j] - half, rx[j] - half
            sy0, sx0 = max(ys, y0), max(xs, x0)
            sy1, sx1 = min(ys + 2 * half + 1, y1), min(xs + 2 * half + 1, x1)
            if sy1 <= sy0 or sx1 <= sx0:
                continue
            win = a[sy0 - ys:sy1 - ys, sx0 - xs:sx1 - xs]
            dst = canvas[sy0 - y0:sy1 - y0, sx0 - x0:sx1 - x0]
            np.maximum(dst, win, out=dst)
        if mask is not None:
            canvas *= mask[y0:y1, x0:x1] == 0
        out = image.copy()
        reg = out[y0:y1, x0:x1].astype(np.float32)
        top = 255.0 if image.dtype == np.uint8 else 1.0
        reg += canvas[:, :, None] * (top - reg)
        if image.dtype == np.uint8:
            out[y0:y1, x0:x1] = np.clip(np.rint(reg), 0, 255).astype(np.uint8)
        else:
            out[y0:y1, x0:x1] = np.clip(reg, 0, 1)
        return out
