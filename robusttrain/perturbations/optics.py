"""Optical artifacts of the endoscope's lens and light: ``defocus`` (out-of-focus disk blur) and ``vignetting``
(radial light fall-off). Same two-path contract as every family (:mod:`.base`); lengths are fractions of the
shorter side and positions fractions of the height / width, so params replay at any size.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .base import REF_SIDE, Perturbation, from_float01, short_side, to_float01
from .blur import kernel_filter, kernel_filter_np

DISPLAY_GAMMA = 2.2  # frames are gamma-encoded; light falls off in linear light


DISK_POINTS = 256  # points of the Vogel spiral that samples the disk


def _disk_points() -> np.ndarray:
    """(2, DISK_POINTS) float32 points spread evenly over the unit disk (Vogel's sunflower spiral)."""
    j = np.arange(DISK_POINTS, dtype=np.float64)
    r, th = np.sqrt((j + 0.5) / DISK_POINTS), j * math.pi * (3 - math.sqrt(5))
    return np.stack([r * np.sin(th), r * np.cos(th)]).astype(np.float32)


def disk_kernel(radius, kmax: int, xp=torch):
    """(B,kmax,kmax) pillbox kernels of ``radius`` px (B,), pixel-integrated and normalised.

    The scene (pixels as unit boxes) is spread over a disk of ``radius`` and re-integrated over the pixels:
    the weight at offset (dy, dx) is the mean over points evenly covering the disk of
    ``tri(dx - x) * tri(dy - y)`` (``tri(u) = max(0, 1 - |u|)``), as :func:`.blur.motion_kernel` does along a
    line. The identity for radius -> 0 and smooth in the radius, so a 1-px disk at 512 px is a 1/4-px one at
    128 px, not nothing; the same float32 formula on both paths.
    """
    r = kmax // 2
    py, px = _disk_points()
    if xp is torch:
        dev = radius.device
        ax = torch.arange(-r, r + 1, device=dev, dtype=torch.float32)
        rad = radius.float()[:, None, None]
        ty = torch.from_numpy(py).to(dev)[None, :, None] * rad  # (B,M,1)
        tx = torch.from_numpy(px).to(dev)[None, :, None] * rad
        wy = (1 - (ax[None, None, :] - ty).abs()).clamp_min(0)  # (B,M,K)
        wx = (1 - (ax[None, None, :] - tx).abs()).clamp_min(0)
        k = torch.einsum("bmy,bmx->byx", wy, wx)
        return k / k.sum((1, 2), keepdim=True)
    axn = np.arange(-r, r + 1, dtype=np.float32)
    radn = np.asarray(radius, np.float32)[:, None, None]
    tyn, txn = py[None, :, None] * radn, px[None, :, None] * radn
    kn = np.einsum(
        "bmy,bmx->byx",
        np.clip(1 - np.abs(axn[None, None, :] - tyn), 0, None),
        np.clip(1 - np.abs(axn[None, None, :] - txn), 0, None),
    )
    return kn / kn.sum((1, 2), keepdims=True)


class Defocus(Perturbation):
    """Defocus (the lens focused in front of or behind the tissue): a pillbox (disk) point-spread function,
    the geometric-optics blur of an out-of-focus lens, with the hard-edged look that sets it apart from the
    Gaussian ``blur``.

    Params: ``radius_rel`` (B,) the disk's radius as a fraction of the shorter side. Severity -> radius
    (1: 1-2, 2: 2-3.5, 3: 3.5-5, 4: 5-7, 5: 7-10 px on a 512-px image; ImageNet-C's defocus radii 3-10 px at
    224 px are stronger than a clinically usable frame).

    Example:
        >>> import numpy as np
        >>> img = np.zeros((64, 64, 3), np.uint8); img[32, 32] = 255
        >>> out, p = Defocus(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> int(out[32, 32, 0]) < 255 and int((out[:, :, 0] > 0).sum()) > 1
        True
    """

    name = "defocus"
    rgb = False
    RADIUS = {1: (1.0, 2.0), 2: (2.0, 3.5), 3: (3.5, 5.0), 4: (5.0, 7.0), 5: (7.0, 10.0)}  # px at REF_SIDE
    PARAM_KEYS = ("radius_rel",)

    def _draw(self, r, b):
        lo, hi = self.RADIUS[self.severity]
        return {"radius_rel": r.uniform(lo / REF_SIDE, hi / REF_SIDE, (b,))}

    @staticmethod
    def _kmax(radius_px: float) -> int:
        return 2 * math.ceil(radius_px) + 3

    def _apply_torch(self, images, masks, params):
        s = short_side(*images.shape[-2:])
        radius = params["radius_rel"].float() * s
        # on an accelerator, size the kernels for the severity's largest radius (reading it would sync)
        hi = (
            float(radius.max())
            if radius.device.type == "cpu"
            else self.RADIUS[self.severity][1] / REF_SIDE * s
        )
        return kernel_filter(images, disk_kernel(radius, self._kmax(hi)))

    def _apply_np(self, image, mask, params):
        radius = float(params["radius_rel"]) * short_side(*image.shape[:2])
        return kernel_filter_np(image, disk_kernel(np.float32([radius]), self._kmax(radius), xp=np)[0])


def vignetting_gain(center, strength, power, h: int, w: int, xp=torch):
    """(B,1,H,W) displayed-intensity gain: linear light falls off as ``1 - strength * rho**power`` with
    ``rho`` the distance to ``center`` (B,2: y, x as fractions of H, W) over the half-diagonal (distances in
    units of the shorter side, so the shape is the same at any size); gamma-encoded pixels scale by that
    gain ** (1/2.2)."""
    s = min(h, w)
    half_diag = math.hypot(h, w) / (2 * s)
    if xp is torch:
        dev = strength.device
        yy = (torch.arange(h, device=dev, dtype=torch.float32) + 0.5) / s
        xx = (torch.arange(w, device=dev, dtype=torch.float32) + 0.5) / s
        cy, cx = center[:, 0].float() * (h / s), center[:, 1].float() * (w / s)
        d2 = (yy[None, :, None] - cy[:, None, None]) ** 2 + (xx[None, None, :] - cx[:, None, None]) ** 2
        rho = torch.sqrt(d2) / half_diag
        lin = (1 - strength.float()[:, None, None] * rho ** power.float()[:, None, None]).clamp(0.0, 1.0)
        return lin.pow(1 / DISPLAY_GAMMA)[:, None]
    yy = (np.arange(h, dtype=np.float32) + np.float32(0.5)) / np.float32(s)
    xx = (np.arange(w, dtype=np.float32) + np.float32(0.5)) / np.float32(s)
    center = np.asarray(center, np.float32)
    cy, cx = center[:, 0] * np.float32(h / s), center[:, 1] * np.float32(w / s)
    d2 = (yy[None, :, None] - cy[:, None, None]) ** 2 + (xx[None, None, :] - cx[:, None, None]) ** 2
    rho = np.sqrt(d2) / np.float32(half_diag)
    st, pw = np.asarray(strength, np.float32), np.asarray(power, np.float32)
    lin = np.clip(1 - st[:, None, None] * rho ** pw[:, None, None], 0.0, 1.0)
    return (lin ** np.float32(1 / DISPLAY_GAMMA))[:, None].astype(np.float32)


class Vignetting(Perturbation):
    """Vignetting: the light of the endoscope's tip and the lens' natural cos^4 fall-off darken the frame
    towards its edge; an off-centre optical axis or light guide moves the bright spot.

    Params: ``center_rel`` (B,2) the bright centre (y, x as fractions of H, W; 0.5 ± 0.12), ``strength``
    (B,) the linear-light loss at the half-diagonal, ``power`` (B,) the fall-off exponent (2-4: cos^4 of a
    wide-angle lens is close to ``1 - 2 rho^2`` near the axis and steeper at the edge). Severity -> strength
    (1: .15-.25, 2: .25-.40, 3: .40-.55, 4: .55-.70, 5: .70-.85). The gain applies in linear light (frames
    are gamma-encoded, gamma 2.2), so a pixel's displayed value scales by ``gain ** (1/2.2)``.

    Example:
        >>> import numpy as np
        >>> out, p = Vignetting(severity=5).apply_numpy(np.full((48, 64, 3), 200, np.uint8), rng=np.random.default_rng(0))
        >>> int(out[0, 0, 0]) < int(out[24, 32, 0]) <= 200
        True
    """

    name = "vignetting"
    rgb = False
    STRENGTH = {1: (0.15, 0.25), 2: (0.25, 0.40), 3: (0.40, 0.55), 4: (0.55, 0.70), 5: (0.70, 0.85)}
    PARAM_KEYS = ("center_rel", "strength", "power")

    def _draw(self, r, b):
        return {
            "center_rel": r.uniform(0.38, 0.62, (b, 2)),
            "strength": r.uniform(*self.STRENGTH[self.severity], (b,)),
            "power": r.uniform(2.0, 4.0, (b,)),
        }

    def _apply_torch(self, images, masks, params):
        h, w = images.shape[-2:]
        g = vignetting_gain(params["center_rel"], params["strength"], params["power"], h, w)
        return (images * g.to(images.dtype)).clamp_(0.0, 1.0)

    def _apply_np(self, image, mask, params):
        h, w = image.shape[:2]
        g = vignetting_gain(
            params["center_rel"][None], params["strength"][None], params["power"][None], h, w, xp=np
        )
        return from_float01(to_float01(image) * g[0, 0][:, :, None], image.dtype)


__all__ = ["Defocus", "Vignetting", "disk_kernel", "vignetting_gain"]
