"""X-ray families (single-channel radiographs): ``quantum_noise``, ``exposure``, ``collimation``
(burned-in markers and text live in :mod:`.xray_markers`).

Same two-path contract as every family (:mod:`.base`); params in image-size-free units (fractions of the
shorter side, normalised coordinates, intensities in [0,1]), so they replay at any size.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import torch

from .grey import GreyPerturbation, noise_window_np, noise_windows
from .mri import _Tone

# Displayed radiographs are log-attenuation images: bright = dense = few photons reach the detector.
# Quantum noise std scales with 1/sqrt(photons) = exp(DENSITY * (x - 0.5)) relative to mid-grey.
DENSITY = 1.5


class QuantumNoise(GreyPerturbation):
    """Quantum (photon) noise of a low-dose exposure: signal-dependent, strongest in dense (bright) regions.

    ``out = clip(x + sigma * exp(1.5 (x - 0.5)) * n)`` with ``n`` a window at ``offset`` of the fixed
    noise texture (identical on every path and device): ``sigma`` is the noise std at mid-grey, about
    2.1 sigma in bone / mediastinum and 0.5 sigma in the lung fields. Severity -> ``sigma``
    (1: 0.008-0.014, 2: 0.014-0.02, 3: 0.02-0.028, 4: 0.028-0.038, 5: 0.038-0.05).

    Example:
        >>> import numpy as np
        >>> img = np.tile(np.linspace(0, 255, 64).astype(np.uint8), (64, 1))
        >>> out, p = QuantumNoise(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> d = out.astype(float) - img
        >>> bool(d[:, 48:].std() > d[:, :16].std())   # noisier where denser
        True
    """

    name = "quantum_noise"
    SIGMA = {1: (0.008, 0.014), 2: (0.014, 0.02), 3: (0.02, 0.028), 4: (0.028, 0.038), 5: (0.038, 0.05)}

    def _draw(self, r, b):
        lo, hi = self.SIGMA[self.severity]
        return {"sigma": r.uniform(lo, hi, (b,)), "offset": r.integers(0, 1 << 20, (b, 2))}

    def _grey_torch(self, x, masks, params):
        h, w = x.shape[-2:]
        std = (x - 0.5).mul_(DENSITY).exp_().mul_(params["sigma"].to(x.dtype)[:, None, None])
        return noise_windows(params["offset"], h, w, 0).to(x.dtype).mul_(std).add_(x).clamp_(0.0, 1.0)

    def _grey_np(self, x, mask, params, out):
        h, w = x.shape
        # std = sigma * exp(DENSITY (x - 0.5)) = exp(DENSITY x + log sigma - DENSITY / 2), one pass each
        cv2.addWeighted(x, DENSITY, x, 0.0, math.log(float(params["sigma"])) - DENSITY / 2, dst=out)
        cv2.exp(out, dst=out)
        cv2.multiply(out, noise_window_np(params["offset"], h, w, 0), dst=out)
        cv2.add(out, x, dst=out)
        return np.clip(out, 0.0, 1.0, out=out)


class Exposure(_Tone):
    """Over- / under-exposure and processing drift: ``clip(x**gamma + offset)``, the same on every channel
    (radiographs; on RGB endoscopy frames a too bright / too dark light source).

    Over-exposure (half the samples) darkens the radiograph and burns out the lung fields (gamma > 1,
    offset < 0); under-exposure lightens it (gamma < 1, offset > 0). Severity -> |log gamma|
    (1: 0.08-0.15, 2: 0.15-0.25, 3: 0.25-0.35, 4: 0.35-0.5, 5: 0.5-0.65) and |offset| (1: 0.02-0.04,
    2: 0.04-0.07, 3: 0.07-0.1, 4: 0.1-0.13, 5: 0.13-0.17). Same schema as ``gamma`` (``gain`` is 1).

    Example:
        >>> import numpy as np
        >>> img = np.full((8, 8), 128, np.uint8)
        >>> out, p = Exposure(severity=4).apply_numpy(img, rng=np.random.default_rng(0))
        >>> abs(int(out[0, 0]) - 128) > 20
        True
    """

    name = "exposure"
    LOG_GAMMA = {1: (0.08, 0.15), 2: (0.15, 0.25), 3: (0.25, 0.35), 4: (0.35, 0.5), 5: (0.5, 0.65)}
    OFFSET = {1: (0.02, 0.04), 2: (0.04, 0.07), 3: (0.07, 0.1), 4: (0.1, 0.13), 5: (0.13, 0.17)}

    def _draw(self, r, b):
        sign = r.integers(0, 2, (b,)) * 2 - 1  # +1: over-exposed (darker)
        lg = r.uniform(*self.LOG_GAMMA[self.severity], (b,))
        off = r.uniform(*self.OFFSET[self.severity], (b,))
        if isinstance(sign, torch.Tensor):
            return {
                "gamma": torch.exp(sign * lg),
                "gain": torch.ones(b, device=lg.device),
                "offset": -sign * off,
            }
        return {
            "gamma": np.exp(sign * lg).astype(np.float32),
            "gain": np.ones(b, np.float32),
            "offset": (-sign * off).astype(np.float32),
        }


# --------------------------------------------------------------------------------------
# collimation
# --------------------------------------------------------------------------------------
SIDES = ("top", "bottom", "left", "right")


def collimation_alpha(depth, angle, soft, h: int, w: int, xp=torch, device=None):
    """(B,H,W) collimator coverage in [0,1]: a rotated rectangle whose edges lie ``depth`` (B,4) in from
    each side (units of the shorter side; 0 = no collimator on that side), with a ramp ``soft`` wide."""
    s = min(h, w)
    # pixel-centre grids and the blades' tangent: tensors or numpy arrays, as ``xp`` says
    v: torch.Tensor | np.ndarray
    u: torch.Tensor | np.ndarray
    t: torch.Tensor | np.ndarray
    if xp is torch:
        v = ((torch.arange(h, device=device, dtype=torch.float32) + 0.5) / s)[None, :, None]
        u = ((torch.arange(w, device=device, dtype=torch.float32) + 0.5) / s)[None, None, :]
        t = torch.tan(angle.float())[:, None, None]
        dep, sf = depth.float(), soft.float()[:, None, None]
    else:
        v = ((np.arange(h, dtype=np.float32) + 0.5) / s)[None, :, None]
        u = ((np.arange(w, dtype=np.float32) + 0.5) / s)[None, None, :]
        t = np.tan(np.asarray(angle, np.float32))[:, None, None]
        dep, sf = np.asarray(depth, np.float32), np.asarray(soft, np.float32)[:, None, None]
    cu, cv = w / (2 * s), h / (2 * s)
    dist = (v - t * (u - cu), (h / s - v) + t * (u - cu), u + t * (v - cv), (w / s - u) - t * (v - cv))
    alpha = None
    for k, d in enumerate(dist):
        dk = dep[:, k, None, None]
        a = (dk - d) / sf + 0.5
        a = (a.clamp(0.0, 1.0) if xp is torch else np.clip(a, 0.0, 1.0)) * (dk > 0)
        alpha = a if alpha is None else (torch.maximum(alpha, a) if xp is torch else np.maximum(alpha, a))
    return alpha


def collimation_alpha_np(depth: np.ndarray, angle: float, soft: float, h: int, w: int) -> np.ndarray:
    """:func:`collimation_alpha` of one image, computed only inside each blade's band (the ramp is 0
    beyond ``depth + soft / 2`` plus the tilt), so a narrow collimator costs a narrow strip."""
    s = min(h, w)
    alpha = np.zeros((h, w), np.float32)
    t = np.float32(np.tan(np.float32(angle)))
    sf = np.float32(soft)
    v = (np.arange(h, dtype=np.float32) + np.float32(0.5)) / np.float32(s)
    u = (np.arange(w, dtype=np.float32) + np.float32(0.5)) / np.float32(s)
    cu, cv = np.float32(w / (2 * s)), np.float32(h / (2 * s))
    for k, dk in enumerate(np.asarray(depth, np.float32)):
        if dk <= 0:
            continue
        horizontal = k < 2  # top / bottom blades span the width
        reach = float(dk) + float(sf) / 2 + abs(float(t)) * (w if horizontal else h) / (2 * s)
        n = min(int(math.ceil(reach * s)) + 1, h if horizontal else w)
        if k == 0:
            rows, cols = slice(0, n), slice(None)
            d = v[:n, None] - t * (u[None, :] - cu)
        elif k == 1:
            rows, cols = slice(h - n, h), slice(None)
            d = (np.float32(h / s) - v[h - n :, None]) + t * (u[None, :] - cu)
        elif k == 2:
            rows, cols = slice(None), slice(0, n)
            d = u[None, :n] + t * (v[:, None] - cv)
        else:
            rows, cols = slice(None), slice(w - n, w)
            d = (np.float32(w / s) - u[None, w - n :]) - t * (v[:, None] - cv)
        a = np.clip((dk - d) / sf + np.float32(0.5), 0.0, 1.0)
        np.maximum(alpha[rows, cols], a, out=alpha[rows, cols])
    return alpha


class Collimation(GreyPerturbation):
    """Collimation edges: the collimator blades shade straight bands along the image sides, slightly
    rotated, filled bright (unexposed film look, 70 %) or dark (electronic shutter, 30 %).

    Params: ``depth`` (4,) per side (top, bottom, left, right) in units of the shorter side, 0 = no blade;
    ``angle`` rotation (±3 degrees); ``soft`` penumbra width; ``level`` fill intensity. Severity -> sides
    with a blade and their depth (1: one side 0.03-0.06, 2: two 0.05-0.09, 3: two 0.08-0.12, 4: three
    0.1-0.15, 5: four 0.12-0.2). With a mask, each blade is kept clear of the labelled anatomy.

    Example:
        >>> import numpy as np
        >>> img = np.full((64, 64), 100, np.uint8)
        >>> out, p = Collimation(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> int((out != 100).sum()) > 200 and bool((out[28:36, 28:36] == 100).all())
        True
    """

    name = "collimation"
    occludes = True  # the collimator blanks the image outside its field
    SIDES_DEPTH = {
        1: (1, 0.03, 0.06),
        2: (2, 0.05, 0.09),
        3: (2, 0.08, 0.12),
        4: (3, 0.1, 0.15),
        5: (4, 0.12, 0.2),
    }

    def _draw(self, r, b):
        n, lo, hi = self.SIDES_DEPTH[self.severity]
        keys = r.uniform(0.0, 1.0, (b, 4))
        th = isinstance(keys, torch.Tensor)
        kth = (keys.sort(1).values if th else np.sort(keys, 1))[:, n - 1 : n]
        depth = r.uniform(lo, hi, (b, 4)) * (keys <= kth)
        bright = r.uniform(0.0, 1.0, (b,)) < 0.7
        lb, ld = r.uniform(0.85, 1.0, (b,)), r.uniform(0.0, 0.06, (b,))
        level = torch.where(bright, lb, ld) if th else np.where(bright, lb, ld).astype(np.float32)
        return {
            "depth": depth.float() if th else depth.astype(np.float32),
            "angle": r.uniform(-math.radians(3), math.radians(3), (b,)),
            "soft": r.uniform(0.002, 0.008, (b,)),
            "level": level,
        }

    def _content_torch(self, images, masks, draws):
        # Keep every blade (ramp included, at its tilt) off the labelled anatomy.
        if masks is None:
            return {}
        h, w = masks.shape[-2:]
        s = min(h, w)
        les = masks != 0
        rows, cols = les.any(2), les.any(1)
        ar_h, ar_w = torch.arange(h, device=masks.device), torch.arange(w, device=masks.device)
        top = torch.where(rows, ar_h, h).amin(1)
        bottom = h - 1 - torch.where(rows, ar_h, -1).amax(1)
        left = torch.where(cols, ar_w, w).amin(1)
        right = w - 1 - torch.where(cols, ar_w, -1).amax(1)
        free = torch.stack([top, bottom, left, right], 1).float() / s
        t = torch.tan(draws["angle"].float()).abs()[:, None]
        reach = torch.tensor([w, w, h, h], device=masks.device, dtype=torch.float32)[None] / (2 * s)
        slack = t * reach + draws["soft"].float()[:, None] + 1.0 / s
        return {"depth": torch.minimum(draws["depth"].float(), (free - slack).clamp_min(0.0))}

    def _grey_torch(self, x, masks, params):
        h, w = x.shape[-2:]
        a = collimation_alpha(params["depth"], params["angle"], params["soft"], h, w, torch, x.device)
        return torch.lerp(x, params["level"].to(x.dtype)[:, None, None].expand_as(x), a.to(x.dtype))

    def _grey_np(self, x, mask, params, out):
        h, w = x.shape
        a = collimation_alpha_np(params["depth"], float(params["angle"]), float(params["soft"]), h, w)
        # out = x + a (level - x)
        np.subtract(np.float32(params["level"]), x, out=out)
        np.multiply(out, a, out=out)
        return np.add(out, x, out=out)
