"""k-space helpers shared by the MRI families (ghosting, Gibbs ringing): real, point-symmetric,
separable per-sample masks applied to the spectrum of a real image, then the magnitude image.

Masks here depend on |frequency| only, so the filtered image stays real and ``rfft2`` / ``irfft2``
(half the work of a complex FFT) are exact. Frequencies are integer cycles per image (``k``) or
fractions of the Nyquist band (``k / (n/2)``), so a mask defined in those units means the same at any
image size. A separable mask is applied as 1-D passes along x and y (OpenCV row DFTs per plane on
the numpy / CPU path, ``torch.fft`` on the batch elsewhere); the paths agree far below one grey level.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch


def freqs(n: int, half: bool = False, xp=torch, device: torch.device | None = None):
    """Signed integer frequencies (cycles per image) of an n-point FFT axis (``half``: the rfft axis)."""
    if xp is torch:
        f = (
            torch.fft.rfftfreq(n, d=1.0 / n, device=device)
            if half
            else torch.fft.fftfreq(n, d=1.0 / n, device=device)
        )
        return f.round()
    f = np.fft.rfftfreq(n, d=1.0 / n) if half else np.fft.fftfreq(n, d=1.0 / n)
    return np.round(f)


def filter_axis_torch(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """Filter real (B,H,W) images along ``dim`` (-1: x, -2: y) with per-sample real multipliers ``mask``
    (B, N//2+1) on the rfft bins (a 1-D real filter: half the work of ``rfft2`` / ``irfft2``)."""
    n = x.shape[dim]
    spec = torch.fft.rfft(x.float(), dim=dim)
    m = mask.to(spec.real.dtype)
    spec.mul_(m[:, :, None] if dim == -2 else m[:, None, :])
    return torch.fft.irfft(spec, n=n, dim=dim)


def _ccs(mask_half: np.ndarray, n: int) -> np.ndarray:
    """A (N//2+1,) rfft-bin mask laid out like OpenCV's packed (CCS) row spectrum: Re0, Re1, Im1, Re2, ..."""
    return np.asarray(mask_half, np.float32)[(np.arange(n) + 1) // 2]


def filter_rows_np(x: np.ndarray, mask_half: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Filter each row of a float32 (H,W) image with the real rfft-bin mask ``mask_half`` (W//2+1,).

    ``cv2.dft`` on rows in its packed real format: on one cache-resident plane it is several times faster
    than a batched ``torch.fft`` pair on CPU (and than numpy's FFT).
    """
    spec = cv2.dft(x, flags=cv2.DFT_ROWS)
    spec *= _ccs(mask_half, x.shape[1])
    return cv2.idft(spec, dst=out, flags=cv2.DFT_ROWS | cv2.DFT_SCALE | cv2.DFT_REAL_OUTPUT)


def filter_cols_np(x: np.ndarray, mask_half: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """:func:`filter_rows_np` along the columns (mask over the H//2+1 bins of the y axis)."""
    return cv2.transpose(filter_rows_np(cv2.transpose(x), mask_half), dst=out)


def magnitude_np(y: np.ndarray) -> np.ndarray:
    """|y| clamped to [0,1], in place."""
    np.abs(y, out=y)
    return np.minimum(y, 1.0, out=y)


def lowpass_np(x: np.ndarray, keep_y: float, keep_x: float, out: np.ndarray) -> np.ndarray:
    """Keep only the bins with |ky| <= keep_y H/2 and |kx| <= keep_x W/2 of a float32 (H,W) image.

    Row DFTs first; the y pass then runs on the kept columns of the row spectrum only (its real and
    imaginary parts are filtered separately, which a real filter allows), so a strong truncation also
    costs less: about 40 % less work than two full separable passes at keep 0.4.
    """
    h, w = x.shape
    kx = int(np.floor(keep_x * w / 2 + 1e-9))
    cols = w if 2 * kx + 1 >= w else 2 * kx + 1  # CCS columns of bins 0..kx: Re0, (Re, Im) pairs
    spec = cv2.dft(x, flags=cv2.DFT_ROWS)
    ky = freqs(h, True, np)
    block = filter_rows_np(cv2.transpose(spec[:, :cols]), (ky <= keep_y * h / 2).astype(np.float32))
    spec[:, :cols] = cv2.transpose(block)
    spec[:, cols:] = 0
    return cv2.idft(spec, dst=out, flags=cv2.DFT_ROWS | cv2.DFT_SCALE | cv2.DFT_REAL_OUTPUT)
