"""k-space helpers shared by the MRI families (ghosting, Gibbs ringing): a real, point-symmetric
per-sample mask applied to the half spectrum of a real image, then the magnitude image.

Masks here depend on |frequency| only, so the filtered image stays real and ``rfft2`` / ``irfft2``
(half the work of a complex FFT) are exact. Frequencies are integer cycles per image (``k``) or
fractions of the Nyquist band (``k / (n/2)``), so a mask defined in those units means the same at any
image size. Both paths compute in float32 on the torch side and float64 in numpy (pocketfft); their
difference is far below one grey level.
"""
from __future__ import annotations

import numpy as np
import torch


def freqs(n: int, half: bool = False, xp=torch, device: torch.device | None = None):
    """Signed integer frequencies (cycles per image) of an n-point FFT axis (``half``: the rfft axis)."""
    if xp is torch:
        f = torch.fft.rfftfreq(n, d=1.0 / n, device=device) if half else torch.fft.fftfreq(n, d=1.0 / n, device=device)
        return f.round()
    f = np.fft.rfftfreq(n, d=1.0 / n) if half else np.fft.fftfreq(n, d=1.0 / n)
    return np.round(f)


def filter_magnitude_torch(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``|irfft2(rfft2(x) * mask)|`` clamped to [0,1]; x (B,H,W), mask broadcastable to (B,H,W//2+1)."""
    h, w = x.shape[-2:]
    spec = torch.fft.rfft2(x.float())
    spec.mul_(mask.to(spec.real.dtype))
    return torch.fft.irfft2(spec, s=(h, w)).abs_().clamp_(max=1.0).to(x.dtype)


def filter_magnitude_np(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The numpy twin of :func:`filter_magnitude_torch` for one (H,W) float32 image."""
    h, w = x.shape
    spec = np.fft.rfft2(x) * mask
    out = np.abs(np.fft.irfft2(spec, s=(h, w))).astype(np.float32)
    return np.minimum(out, 1.0, out=out)
