"""MRI artifact families (single-channel; 2-D slices, or each slice of a volume as one batch sample):
``bias_field``, ``ghosting``, ``gibbs``, ``spike``, ``rician_noise``, ``gamma``.

Each follows the two-path contract of :mod:`.base` (one param schema, numpy and batched torch paths
within 2/255, exact replay, masks untouched). Params are in image-size-free units — normalised
coordinates, cycles per image, fractions of the k-space band, intensities in [0,1] — so params drawn on
a 128 px slice replay on the same slice at 256 px. Severity 1 is a just-visible artifact, severity 5 the
strongest one a clinical scan plausibly shows; the ranges are in each class's docstring.
"""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np
import torch

from .base import Perturbation
from .grey import (
    GreyPerturbation,
    apply_tone_image,
    noise_window_np,
    noise_windows,
    pixel_centres,
    tone_torch,
)
from .kspace import filter_axis_torch, filter_cols_np, filter_rows_np, freqs, lowpass_np, magnitude_np


def _xp(v: Any):
    return torch if isinstance(v, torch.Tensor) else np


# --------------------------------------------------------------------------------------
# bias field
# --------------------------------------------------------------------------------------
# Legendre terms P_i(y) P_j(x) with i + j <= 3 (the constant term left out: a field is a shape, the
# overall level is the contrast family's business) — the same basis as TorchIO's RandomBiasField.
_TERMS = [(i, j) for i in range(4) for j in range(4) if 0 < i + j <= 3]
_NORM_GRID = 33  # the field is normalised on a fixed grid, so its peak is the same at every image size


def _legendre(t, xp):
    """(N,4) Legendre polynomials P0..P3 at t in [-1, 1]."""
    t2 = t * t
    cols = [xp.ones_like(t), t, 1.5 * t2 - 0.5, (2.5 * t2 - 1.5) * t]
    return torch.stack(cols, -1) if xp is torch else np.stack(cols, -1).astype(np.float32)


def _coef_matrix(coeffs, xp):
    """(B,9) coefficients -> (B,4,4) matrix C with log field = P(y) C P(x)^T."""
    b = coeffs.shape[0]
    idx = [4 * i + j for i, j in _TERMS]
    if xp is torch:
        c = coeffs.new_zeros(b, 16)
        c[:, idx] = coeffs.float()
        return c.view(b, 4, 4)
    c = np.zeros((b, 16), np.float32)
    c[:, idx] = coeffs
    return c.reshape(b, 4, 4)


def bias_log_field(coeffs, strength, h: int, w: int, device=None):
    """(B,H,W) log field: the polynomial, centred and scaled so its peak |value| is ``strength``."""
    xp = _xp(coeffs)
    c = _coef_matrix(coeffs, xp)
    g = _legendre(2 * pixel_centres(_NORM_GRID, xp, device) - 1, xp)  # (G,4)
    py = _legendre(2 * pixel_centres(h, xp, device) - 1, xp)
    px = _legendre(2 * pixel_centres(w, xp, device) - 1, xp)
    if xp is torch:
        grid = g @ c @ g.T  # (B,G,G)
        centre = grid.mean((1, 2), keepdim=True)
        scale = strength.float()[:, None, None] / (grid - centre).abs().amax((1, 2), keepdim=True).clamp_min(
            1e-6
        )
        return (py @ c @ px.T - centre) * scale
    grid = g @ c @ g.T
    centre = grid.mean((1, 2), keepdims=True)
    scale = np.asarray(strength, np.float32)[:, None, None] / np.maximum(
        np.abs(grid - centre).max((1, 2), keepdims=True), 1e-6
    )
    return ((py @ c @ px.T - centre) * scale).astype(np.float32)


class BiasField(GreyPerturbation):
    """Receive-coil intensity inhomogeneity: a smooth multiplicative field ``out = x * exp(f(y, x))``.

    ``f`` is a random cubic Legendre polynomial over the normalised image square (9 ``coeffs`` in
    [-1, 1]), centred and scaled so that its peak |f| is ``strength``: the brightest spot is
    ``exp(strength)`` times, the darkest ``exp(-strength)`` times the mean level (before clipping).
    Severity -> strength (1: 0.15-0.25, 2: 0.25-0.38, 3: 0.38-0.52, 4: 0.52-0.68, 5: 0.68-0.85).

    Example:
        >>> import numpy as np
        >>> img = np.full((64, 64), 100, np.uint8)
        >>> out, p = BiasField(severity=4).apply_numpy(img, rng=np.random.default_rng(0))
        >>> out.shape, int(out.max()) > 110 and int(out.min()) < 90, p["coeffs"].shape
        ((64, 64), True, (9,))
    """

    name = "bias_field"
    STRENGTH = {1: (0.15, 0.25), 2: (0.25, 0.38), 3: (0.38, 0.52), 4: (0.52, 0.68), 5: (0.68, 0.85)}

    def _draw(self, r, b):
        lo, hi = self.STRENGTH[self.severity]
        return {"coeffs": r.uniform(-1.0, 1.0, (b, len(_TERMS))), "strength": r.uniform(lo, hi, (b,))}

    def _grey_torch(self, x, masks, params):
        h, w = x.shape[-2:]
        f = bias_log_field(params["coeffs"], params["strength"], h, w, x.device)
        return f.exp_().mul_(x).clamp_(0.0, 1.0).to(x.dtype)

    def _grey_np(self, x, mask, params, out):
        h, w = x.shape
        f = bias_log_field(params["coeffs"][None], params["strength"][None], h, w)[0]
        cv2.multiply(x, cv2.exp(f, dst=f), dst=out)
        return np.clip(out, 0.0, 1.0, out=out)


# --------------------------------------------------------------------------------------
# k-space families: ghosting, Gibbs ringing
# --------------------------------------------------------------------------------------
# Lines with |k| <= RESTORE cycles per image are left untouched by ghosting (keeps the overall contrast,
# like TorchIO's ``restore``); in cycles, not a fraction of the band, so ghosts look alike at any size.
RESTORE = 1.5


def ghost_mask_1d(ghosts: float, intensity: float, n: int) -> np.ndarray:
    """(n//2+1,) multipliers on the rfft bins of the phase-encoding axis: every ``ghosts``-th line
    (outside the central band) scaled by ``1 - intensity``."""
    k = freqs(n, True, np)
    comb = (np.remainder(k, ghosts) == 0) & (np.abs(k) > RESTORE)
    return (1 - intensity * comb).astype(np.float32)


class Ghosting(GreyPerturbation):
    """Motion ghosting (periodic motion during the scan, e.g. breathing): faint copies of the anatomy
    repeated along the phase-encoding axis.

    Every ``ghosts``-th k-space line along ``axis`` (0: y, 1: x; outside the central ±1 cycle) is scaled by
    ``1 - intensity``; the magnitude image then carries ``ghosts - 1`` copies shifted by multiples of
    1/``ghosts`` of the field of view, each of amplitude ``intensity / ghosts`` of the anatomy (TorchIO's
    RandomGhosting model). ``ghosts`` is 2..5; severity sets the ghost amplitude ``intensity / ghosts``
    (1: 0.04-0.07, 2: 0.07-0.10, 3: 0.10-0.13, 4: 0.13-0.16, 5: 0.16-0.20).

    Example:
        >>> import numpy as np
        >>> img = np.zeros((64, 64), np.uint8); img[24:40, 24:40] = 200
        >>> out, p = Ghosting(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> int(p["ghosts"]) in (2, 3, 4, 5) and int((out[:20] > 8).sum() + (out[:, :20] > 8).sum()) > 0
        True
    """

    name = "ghosting"
    AMPLITUDE = {1: (0.04, 0.07), 2: (0.07, 0.10), 3: (0.10, 0.13), 4: (0.13, 0.16), 5: (0.16, 0.20)}

    def _draw(self, r, b):
        lo, hi = self.AMPLITUDE[self.severity]
        ghosts = r.integers(2, 6, (b,))
        amp = r.uniform(lo, hi, (b,))
        return {"ghosts": ghosts, "axis": r.integers(0, 2, (b,)), "intensity": amp * ghosts}

    def _grey_torch(self, x, masks, params):
        # a 1-D filter along each sample's phase-encoding axis; samples are grouped by axis
        h, w = x.shape[-2:]
        g, ax, it = params["ghosts"], params["axis"], params["intensity"]
        out = torch.empty_like(x, dtype=torch.float32)
        for a, (n, dim) in enumerate(((h, -2), (w, -1))):
            idx = (ax == a).nonzero().flatten()
            if idx.numel():
                k = freqs(n, True, torch, x.device)
                comb = (torch.remainder(k[None], g[idx].to(k.dtype)[:, None]) == 0) & (k.abs() > RESTORE)[
                    None
                ]
                out[idx] = filter_axis_torch(x[idx], 1 - it[idx].float()[:, None] * comb, dim)
        return out.abs_().clamp_(max=1.0).to(x.dtype)

    def _grey_np(self, x, mask, params, out):
        h, w = x.shape
        g, i = float(params["ghosts"]), float(params["intensity"])
        if int(params["axis"]) == 0:
            filter_cols_np(x, ghost_mask_1d(g, i, h), out)
        else:
            filter_rows_np(x, ghost_mask_1d(g, i, w), out)
        return magnitude_np(out)


class Gibbs(GreyPerturbation):
    """Gibbs ringing (truncation artifact): only the central ``keep`` fraction of k-space is acquired
    along each axis (``keep`` (2,) for y, x), so sharp edges ring and soften.

    Severity -> fraction of the band kept (1: 0.55-0.65, 2: 0.45-0.55, 3: 0.36-0.45, 4: 0.30-0.36,
    5: 0.24-0.30), drawn per axis.

    Example:
        >>> import numpy as np
        >>> img = np.zeros((64, 64), np.uint8); img[:, 32:] = 200
        >>> out, p = Gibbs(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> int(out[:, 33:36].max()) > 200 and int(out[:, 28:31].max()) > 0   # overshoot and ringing
        True
    """

    name = "gibbs"
    KEEP = {1: (0.55, 0.65), 2: (0.45, 0.55), 3: (0.36, 0.45), 4: (0.30, 0.36), 5: (0.24, 0.30)}

    def _draw(self, r, b):
        lo, hi = self.KEEP[self.severity]
        return {"keep": r.uniform(lo, hi, (b, 2))}

    def _grey_torch(self, x, masks, params):
        # the box is separable: low-pass along x, then along y, each on the kept bins only
        h, w = x.shape[-2:]
        keep = params["keep"].float()
        out = x
        for n, dim, col in ((w, -1, 1), (h, -2, 0)):
            k = freqs(n, True, torch, x.device)
            out = filter_axis_torch(out, (k[None] <= keep[:, col : col + 1] * n / 2).float(), dim)
        return out.abs().clamp_(max=1.0).to(x.dtype)

    def _grey_np(self, x, mask, params, out):
        keep = np.asarray(params["keep"], np.float64)
        return magnitude_np(lowpass_np(x, float(keep[0]), float(keep[1]), out))


# --------------------------------------------------------------------------------------
# k-space spike (herringbone)
# --------------------------------------------------------------------------------------
def _spike_factors(freq, phase, amp, h: int, w: int, xp, device=None):
    """(B,H,2S) and (B,2S,W) factors whose product is the stripe pattern
    ``sum_s amp_s cos(2 pi (fy_s v + fx_s u) + phase_s)`` (u, v: normalised pixel centres)."""
    v, u = pixel_centres(h, xp, device), pixel_centres(w, xp, device)
    fy, fx = freq[..., 0], freq[..., 1]  # (B,S)
    if xp is torch:
        by = 2 * math.pi * fy.float()[:, :, None] * v  # (B,S,H)
        ax = 2 * math.pi * fx.float()[:, :, None] * u + phase.float()[:, :, None]  # (B,S,W)
        a = amp.float()[:, :, None]
        left = torch.cat([a * torch.cos(by), -a * torch.sin(by)], 1).transpose(1, 2)
        return left, torch.cat([torch.cos(ax), torch.sin(ax)], 1)
    by = (2 * np.pi * np.asarray(fy, np.float32)[:, :, None] * v).astype(np.float32)
    ax = (
        2 * np.pi * np.asarray(fx, np.float32)[:, :, None] * u + np.asarray(phase, np.float32)[:, :, None]
    ).astype(np.float32)
    a = np.asarray(amp, np.float32)[:, :, None]
    left = np.concatenate([a * np.cos(by), -a * np.sin(by)], 1).transpose(0, 2, 1)
    return left, np.concatenate([np.cos(ax), np.sin(ax)], 1)


def white_level_torch(images: torch.Tensor) -> torch.Tensor:
    """(B,) robust white level: the 99th percentile of a 1-in-16 pixel subsample (the display white
    point; unlike the mean it does not shrink with the dark background of a slice)."""
    sub = images[:, :, ::4, ::4].reshape(images.shape[0], -1).float()
    return torch.quantile(sub, 0.99, dim=1)


def white_level_np(image: np.ndarray) -> np.float32:
    """:func:`white_level_torch` of one HWC / HW image (uint8 or float32)."""
    sub = image[::4, ::4].astype(np.float32) * np.float32(1 / 255 if image.dtype == np.uint8 else 1.0)
    return np.float32(np.quantile(sub.ravel(), 0.99))


class Spike(GreyPerturbation):
    """k-space spike (herringbone / corduroy artifact): a bad k-space sample adds a plane wave, seen as
    stripes across the whole image; two spikes cross into a herringbone.

    A spike at ``freq`` (fy, fx) cycles per image with ``phase`` adds, after the inverse FFT (real part),
    ``amplitude * white * cos(2 pi (fy v + fx u) + phase)`` — ``white`` is the image's white level (99th
    percentile, :func:`white_level_torch`), so the stripes are as strong relative to the anatomy on dark
    and bright scans. Spike radius 6-30 cycles per image, any direction. Severity -> amplitude
    (1: 0.035-0.05, 2: 0.05-0.065, 3: 0.065-0.085, 4: 0.085-0.105, 5: 0.105-0.13); severities 4-5 add a
    second spike at 0.3-0.6 of that amplitude.

    Example:
        >>> import numpy as np
        >>> img = np.full((64, 64), 200, np.uint8)
        >>> out, p = Spike(severity=3).apply_numpy(img, rng=np.random.default_rng(0))
        >>> int(out.max()) > 210 and int(out.min()) < 190 and p["freq"].shape == (2, 2)
        True
    """

    name = "spike"
    AMPLITUDE = {1: (0.035, 0.05), 2: (0.05, 0.065), 3: (0.065, 0.085), 4: (0.085, 0.105), 5: (0.105, 0.13)}
    RADIUS = (6.0, 30.0)

    def _draw(self, r, b):
        lo, hi = self.AMPLITUDE[self.severity]
        rad, ang = r.uniform(*self.RADIUS, (b, 2)), r.uniform(0.0, math.pi, (b, 2))
        xp = _xp(rad)
        freq = xp.stack([rad * xp.sin(ang), rad * xp.cos(ang)], -1)
        first = r.uniform(lo, hi, (b,))
        second = first * r.uniform(0.3, 0.6, (b,)) * (1.0 if self.severity >= 4 else 0.0)
        amp = xp.stack([first, second], 1)
        return {"freq": freq, "phase": r.uniform(0.0, 2 * math.pi, (b, 2)), "amplitude": amp}

    def _content_torch(self, images, masks, draws):
        return {"white": white_level_torch(images)}

    def _content_numpy(self, image, mask, draws):
        return {"white": white_level_np(image)}

    def _grey_torch(self, x, masks, params):
        h, w = x.shape[-2:]
        amp = params["amplitude"].float() * params["white"].float()[:, None]
        left, right = _spike_factors(params["freq"], params["phase"], amp, h, w, torch, x.device)
        return torch.baddbmm(x.float(), left, right).clamp_(0.0, 1.0).to(x.dtype)

    def _grey_np(self, x, mask, params, out):
        h, w = x.shape
        amp = (params["amplitude"] * params["white"])[None]
        left, right = _spike_factors(params["freq"][None], params["phase"][None], amp, h, w, np)
        np.matmul(left[0], right[0], out=out)
        np.add(out, x, out=out)
        return np.clip(out, 0.0, 1.0, out=out)


# --------------------------------------------------------------------------------------
# Rician noise and intensity drift
# --------------------------------------------------------------------------------------
class RicianNoise(GreyPerturbation):
    """Rician noise of magnitude MRI: ``out = sqrt((x + sigma n1)^2 + (sigma n2)^2)`` with n1, n2
    independent standard normal (real and imaginary channel noise).

    The noise is a window at ``offset`` of a fixed seeded texture (:func:`.grey.noise_windows`), so a replay
    adds the identical noise on every path and device. Severity -> ``sigma`` in intensity units
    (1: 0.012-0.02, 2: 0.02-0.032, 3: 0.032-0.048, 4: 0.048-0.068, 5: 0.068-0.095); the background becomes
    Rayleigh noise of mean 1.25 sigma.

    Example:
        >>> import numpy as np
        >>> out, p = RicianNoise(severity=3).apply_numpy(np.zeros((32, 32), np.uint8), rng=np.random.default_rng(0))
        >>> bool(0.03 < out.mean() / 255 < 0.09)
        True
    """

    name = "rician_noise"
    SIGMA = {1: (0.012, 0.02), 2: (0.02, 0.032), 3: (0.032, 0.048), 4: (0.048, 0.068), 5: (0.068, 0.095)}

    def _draw(self, r, b):
        lo, hi = self.SIGMA[self.severity]
        return {"sigma": r.uniform(lo, hi, (b,)), "offset": r.integers(0, 1 << 20, (b, 2))}

    def _grey_torch(self, x, masks, params):
        h, w = x.shape[-2:]
        s = params["sigma"].to(x.dtype)[:, None, None]
        re = noise_windows(params["offset"], h, w, 0).to(x.dtype).mul_(s).add_(x)
        im = noise_windows(params["offset"], h, w, 1).to(x.dtype).mul_(s)
        return torch.hypot(re, im).clamp_(max=1.0)

    def _grey_np(self, x, mask, params, out):
        h, w = x.shape
        s = float(params["sigma"])
        re = cv2.scaleAdd(noise_window_np(params["offset"], h, w, 0), s, x)
        im = cv2.multiply(noise_window_np(params["offset"], h, w, 1), s)
        # sqrt(re^2 + im^2) in numpy, not cv2.magnitude: OpenCV's result depended on the buffers' memory
        # alignment (1 ulp in a few pixels), so the same seed could give different float32 images.
        np.multiply(re, re, out=out)
        out += cv2.multiply(im, im)
        np.sqrt(out, out=out)
        return np.minimum(out, 1.0, out=out)


class _Tone(Perturbation):
    """Families that are a per-sample tone curve ``clip(gain * x**gamma + offset)`` (uint8: one LUT).

    The curve applies to every channel alike, so these run on grey slices and on RGB frames (a display
    gamma or an exposure error acts on each colour channel of a camera the same way); the colour balance
    at mid-grey is kept.
    """

    rgb = False  # grey and RGB

    def _apply_torch(self, images, masks, params):
        return tone_torch(images, params["gamma"], params["gain"], params["offset"])

    def _apply_np(self, image, mask, params):  # uint8: one lookup table pass
        return apply_tone_image(image, float(params["gamma"]), float(params["gain"]), float(params["offset"]))


class Gamma(_Tone):
    """Intensity drift between scans / scanners (or a camera's tone curve): a gamma curve and a gain,
    ``clip(gain * x**gamma)``, the same on every channel (grey slices and RGB frames).

    ``log(gamma)`` is drawn with a random sign, severity -> |log gamma| (1: 0.1-0.2, 2: 0.2-0.3,
    3: 0.3-0.45, 4: 0.45-0.6, 5: 0.6-0.8) and gain in ``1 ± 0.04 * severity``.

    Example:
        >>> import numpy as np
        >>> img = np.full((8, 8), 128, np.uint8)
        >>> out, p = Gamma(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> abs(int(out[0, 0]) - 128) > 20 and float(p["offset"]) == 0.0
        True
    """

    name = "gamma"
    LOG_GAMMA = {1: (0.1, 0.2), 2: (0.2, 0.3), 3: (0.3, 0.45), 4: (0.45, 0.6), 5: (0.6, 0.8)}

    def _draw(self, r, b):
        lo, hi = self.LOG_GAMMA[self.severity]
        sign = r.integers(0, 2, (b,)) * 2 - 1
        xp = torch if isinstance(sign, torch.Tensor) else np
        g = xp.exp(sign * r.uniform(lo, hi, (b,)))
        d = 0.04 * self.severity
        return {
            "gamma": g.float() if xp is torch else g.astype(np.float32),
            "gain": r.uniform(1 - d, 1 + d, (b,)),
            "offset": r.uniform(0.0, 0.0, (b,)),
        }


__all__ = ["BiasField", "Ghosting", "Gibbs", "Spike", "RicianNoise", "Gamma"]
