"""Object families (paper 000, MR3-1..MR3-3): ``instrument``, ``feces``, ``blood`` pasted from cut-outs.

One object per image, placed on a free cell (inside the field of view, its whole footprint away from
the lesion), rotated, scaled and brightness-matched: ``gain = clip((local luma / cut-out luma)^0.6,
0.4, 1.5)``, further dimmed by the gray mask in dark regions. Edges are soft (pre-blurred alpha plus
bilinear resampling). At render time alpha is also zeroed on the lesion and on the black border, so
neither is ever covered even when params are replayed on another image.

Both paths resample the cut-out with the same bilinear formula (``grid_sample`` with
``align_corners=True`` / its numpy twin) inside a window around the object only.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .base import Perturbation
from .border import fov_mask, fov_mask_np
from .colour import LUMA
from .cutouts import SIZE, load_cutouts, procedural_cutouts
from .placement import (PlacedSampling, erode_cells, erode_cells_np, gather_cells, gather_cells_np,
                        pick_cells, pick_cells_np)


class PastedObject(PlacedSampling, Perturbation):
    """Base of the cut-out families. ``cutouts``: a folder of user cut-outs (see
    :func:`~robusttrain.perturbations.cutouts.load_cutouts`), else ``n_procedural`` generated ones.

    Params: ``index`` (B,) cut-out, ``center`` (B,2) y,x px, ``size`` (B,) px (the cut-out square's side on
    the image), ``angle`` (B,), ``flip`` (B,) 0/1, ``gain`` (B,), ``visible`` (B,) 0/1.
    Severity -> object size as a fraction of H (1: .12-.18, 2: .18-.25, 3: .25-.32, 4: .32-.40, 5: .40-.50).
    """

    kind = "instrument"
    SIZE_FRAC = {1: (0.12, 0.18), 2: (0.18, 0.25), 3: (0.25, 0.32), 4: (0.32, 0.40), 5: (0.40, 0.50)}

    def __init__(self, severity: int = 3, cutouts: str | Path | None = None, mask_channel: int = 0,
                 n_procedural: int = 8):
        super().__init__(severity)
        self.cutouts = None if cutouts is None else str(cutouts)
        items = (load_cutouts(cutouts, mask_channel) if cutouts is not None
                 else procedural_cutouts(self.kind, n_procedural))
        self.bank = np.stack(items)  # (N,S,S,4) float32
        a = self.bank[..., 3]
        self._luma = ((self.bank[..., :3] @ LUMA) * a).sum((1, 2)) / np.maximum(a.sum((1, 2)), 1e-6)
        self._bank_on: dict[torch.device, torch.Tensor] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(severity={self.severity}, cutouts={self.cutouts!r}, n={len(self.bank)})"

    def _bank(self, device):
        if device not in self._bank_on:
            self._bank_on[device] = torch.from_numpy(self.bank).permute(0, 3, 1, 2).contiguous().to(device)
        return self._bank_on[device]

    # -- sampling -----------------------------------------------------------------------------
    def _place(self, luma, free, k, h, w, r, device=None):
        th = isinstance(luma, torch.Tensor)
        xp = torch if th else np
        dev = (lambda t: t.to(device)) if th else (lambda t: t)  # noqa: E731
        b = luma.shape[0]
        lo, hi = self.SIZE_FRAC[self.severity]
        size = dev(r.uniform(lo, hi, (b,))) * h
        # The centre keeps ~0.35*size from the lesion and the border: objects may run into the border
        # (alpha is cut there at render time, like an instrument entering the view) and the render
        # also zeroes alpha on the lesion, so this only keeps most of the object visible.
        rc = math.ceil(0.35 * hi * h / k)
        ok = erode_cells(free, rc) if th else erode_cells_np(free, rc)
        cells = pick_cells(ok * (1.0 + 0 * luma), 1, r) if th else pick_cells_np(ok * (1.0 + 0 * luma), 1, r)
        wc = luma.shape[-1]
        jit = dev(r.uniform(0, 1, (b, 2)))
        y = ((cells[:, 0] // wc) + jit[:, 0]) * k
        x = ((cells[:, 0] % wc) + jit[:, 1]) * k
        vis = (gather_cells(ok, y[:, None], x[:, None], k) if th else gather_cells_np(ok, y[:, None], x[:, None], k))[:, 0]
        near = (gather_cells(luma, y[:, None], x[:, None], k) if th else gather_cells_np(luma, y[:, None], x[:, None], k))[:, 0]
        idx = dev(r.integers(0, len(self.bank), (b,)))
        cl = torch.as_tensor(self._luma, device=device)[idx] if th else self._luma[idx]
        gain = xp.clip((near / xp.clip(cl, 0.05, None)) ** 0.6, 0.4, 1.5) * xp.clip(near / 0.45, 0.5, 1.0)
        f32 = (lambda t: t.float()) if th else (lambda t: np.asarray(t, np.float32))  # noqa: E731
        return {"index": idx, "center": f32(xp.stack([y, x], 1)), "size": f32(size),
                "angle": f32(dev(r.uniform(0, 2 * math.pi, (b,)))), "flip": dev(r.integers(0, 2, (b,))),
                "gain": f32(gain), "visible": f32(vis)}


    # -- rendering ----------------------------------------------------------------------------
    def _half(self, h: int) -> int:
        return math.ceil(0.5 * math.sqrt(2) * self.SIZE_FRAC[self.severity][1] * h) + 2

    @staticmethod
    def _source_coords(py, px, cy, cx, size, angle, flip, xp):
        """Cut-out pixel coordinates (u, v) of image pixels (py, px): inverse rotation + scale (+ mirror)."""
        dy, dx = py - cy, px - cx
        c, s = xp.cos(angle), xp.sin(angle)
        rx, ry = dx * c + dy * s, dy * c - dx * s
        scale = (SIZE - 1) / size
        u = rx * scale + (SIZE - 1) / 2
        v = ry * scale + (SIZE - 1) / 2
        u = xp.where(flip > 0, (SIZE - 1) - u, u)
        return u, v

    def _apply_torch(self, images, masks, params):
        b, c, h, w = images.shape
        half = self._half(h)
        dev = images.device
        off = torch.arange(-half, half + 1, device=dev, dtype=torch.float32)
        cy, cx = params["center"][:, 0].float(), params["center"][:, 1].float()
        py = torch.round(cy)[:, None, None] + off[None, :, None]  # (B,P,1)
        px = torch.round(cx)[:, None, None] + off[None, None, :]  # (B,1,P)
        e = lambda t: t.float()[:, None, None]  # noqa: E731
        u, v = self._source_coords(py, px, e(cy), e(cx), e(params["size"]), e(params["angle"]), e(params["flip"]), torch)
        grid = torch.stack([u / (SIZE - 1) * 2 - 1, v / (SIZE - 1) * 2 - 1], -1)  # (B,P,P,2)
        src = self._bank(dev)[params["index"]]
        rgba = F.grid_sample(src, grid.to(src.dtype), mode="bilinear", padding_mode="zeros", align_corners=True)
        inside = ((py >= 0) & (py < h) & (px >= 0) & (px < w))
        alpha = rgba[:, 3] * inside * params["visible"].float()[:, None, None]
        colour = (rgba[:, :3] * params["gain"].float()[:, None, None, None]).clamp(0, 1)
        # Scatter the window into full-size canvases; out-of-image pixels go to a spare slot at index H*W.
        idx = torch.where(inside, py * w + px, torch.full_like(py * px, h * w)).long().reshape(b, -1)
        acan = images.new_zeros(b, h * w + 1).scatter_(1, idx, alpha.reshape(b, -1).to(images.dtype))
        ccan = images.new_zeros(b, c, h * w + 1).scatter_(
            2, idx[:, None].expand(b, c, -1), colour.reshape(b, c, -1).to(images.dtype))
        a = acan[:, : h * w].view(b, 1, h, w) * fov_mask(images)
        if masks is not None:
            a = a * (masks[:, None] == 0)
        return torch.lerp(images, ccan[:, :, : h * w].view(b, c, h, w), a)

    def _apply_np(self, image, mask, params):
        h, w = image.shape[:2]
        out = image.copy()
        if float(params["visible"]) <= 0:
            return out
        half = self._half(h)
        cy, cx = np.float32(params["center"][0]), np.float32(params["center"][1])
        ry, rx = int(np.rint(cy)), int(np.rint(cx))
        y0, y1, x0, x1 = max(ry - half, 0), min(ry + half + 1, h), max(rx - half, 0), min(rx + half + 1, w)
        if y1 <= y0 or x1 <= x0:
            return out
        py = np.arange(y0, y1, dtype=np.float32)[:, None]
        px = np.arange(x0, x1, dtype=np.float32)[None, :]
        u, v = self._source_coords(py, px, cy, cx, np.float32(params["size"]), np.float32(params["angle"]),
                                   params["flip"], np)
        rgba = _bilinear_zero(self.bank[int(params["index"])], u.astype(np.float32), v.astype(np.float32))
        alpha = rgba[:, :, 3] * fov_mask_np(image)[y0:y1, x0:x1]
        if mask is not None:
            alpha = alpha * (mask[y0:y1, x0:x1] == 0)
        colour = np.clip(rgba[:, :, :3] * np.float32(params["gain"]), 0, 1)
        reg = out[y0:y1, x0:x1].astype(np.float32)
        if image.dtype == np.uint8:
            colour = colour * 255
        reg += alpha[:, :, None] * (colour - reg)
        out[y0:y1, x0:x1] = np.clip(np.rint(reg), 0, 255) if image.dtype == np.uint8 else np.clip(reg, 0, 1)
        return out


def _bilinear_zero(img: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Bilinear sample of (S,S,C) ``img`` at pixel coords (u=x, v=y); outside counts as 0 (grid_sample twin)."""
    s = img.shape[0]
    x0, y0 = np.floor(u), np.floor(v)
    wx, wy = (u - x0)[..., None], (v - y0)[..., None]
    x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
    out = np.zeros(u.shape + (img.shape[2],), np.float32)
    for dy, dx, wgt in ((0, 0, (1 - wy) * (1 - wx)), (0, 1, (1 - wy) * wx), (1, 0, wy * (1 - wx)), (1, 1, wy * wx)):
        yy, xx = y0 + dy, x0 + dx
        ok = (yy >= 0) & (yy < s) & (xx >= 0) & (xx < s)
        out += np.where(ok[..., None], img[np.clip(yy, 0, s - 1), np.clip(xx, 0, s - 1)], 0) * wgt
    return out


class Instrument(PastedObject):
    """Surgical instrument (MR3-1). Procedural: a shaded metallic shaft with a jaw tip.

    Example:
        >>> import numpy as np
        >>> img = np.full((128, 128, 3), 140, np.uint8)
        >>> out, p = Instrument(severity=4).apply_numpy(img, rng=np.random.default_rng(0))
        >>> bool((out != img).any())
        True
    """

    name = kind = "instrument"


class Feces(PastedObject):
    """Residual feces (MR3-2). Procedural: a mottled yellow-brown blob.

    Example:
        >>> import numpy as np
        >>> out, p = Feces(severity=2).apply_numpy(np.full((96, 96, 3), 150, np.uint8), rng=np.random.default_rng(0))
        >>> out.shape
        (96, 96, 3)
    """

    name = kind = "feces"


class Blood(PastedObject):
    """Blood (MR3-3). Procedural: a translucent dark red pool with streaks.

    Example:
        >>> import numpy as np
        >>> out, p = Blood(severity=2).apply_numpy(np.full((96, 96, 3), 150, np.uint8), rng=np.random.default_rng(0))
        >>> out.dtype
        dtype('uint8')
    """

    name = kind = "blood"
