"""Camera sensor noise of a colour endoscope (``sensor_noise``): Poisson-Gaussian, signal-dependent.

Foi et al. (IEEE TIP 2008, "Practical Poissonian-Gaussian noise modeling and fitting for single-image
raw-data") model a sensor's noise as photon shot noise, whose variance grows linearly with the signal,
plus signal-independent read noise: ``var(x) = a * x + b**2``. The noise field is the fixed texture of
``blur``'s sensor noise (:func:`.blur.texture_at`): defined at the 512-px reference resolution and
area-resampled to the image, so a small image shows the grain a 512-px noisy frame has once downsized,
and a replay adds the identical noise on every path and device. Unlike ``quantum_noise`` (grey X-ray
log-attenuation images) it acts on colour frames, per channel (chroma noise) or as one luma field.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import Perturbation, from_float01, to_float01
from .blur import NOISE_STEPS, _shift, noise_period, texture_at

_TEXTURE_ON: dict[tuple[torch.device, int], torch.Tensor] = {}


def _texture_on(device: torch.device, p: int) -> torch.Tensor:
    if (device, p) not in _TEXTURE_ON:
        _TEXTURE_ON[(device, p)] = torch.from_numpy(texture_at(p)).permute(2, 0, 1).contiguous().to(device)
    return _TEXTURE_ON[(device, p)]


def noise_fields(offset: torch.Tensor, chroma: torch.Tensor, c: int, h: int, w: int) -> torch.Tensor:
    """(B,C,H,W) unit noise at per-sample ``offset`` (B,2; 1/64 periods): an independent field per channel
    where ``chroma`` (B,) is 1, the first field on every channel where it is 0 (one gather, no loop)."""
    p = noise_period(h, w)
    tex = _texture_on(offset.device, p)[:c]
    sh = _shift(offset.long(), p)
    iy = (torch.arange(h, device=offset.device)[None] + sh[:, :1]) % p  # (B,H)
    ix = (torch.arange(w, device=offset.device)[None] + sh[:, 1:]) % p  # (B,W)
    n = tex[:, iy[:, :, None], ix[:, None, :]].permute(1, 0, 2, 3)  # (B,C,H,W)
    return torch.where(chroma.bool()[:, None, None, None], n, n[:, :1])


def noise_field_np(offset: np.ndarray, chroma: int, c: int, h: int, w: int) -> np.ndarray:
    """One sample's (H,W,C) noise, the same values as :func:`noise_fields`."""
    p = noise_period(h, w)
    oy, ox = _shift(int(offset[0]), p), _shift(int(offset[1]), p)
    t = texture_at(p)
    iy, ix = (np.arange(h) + oy) % p, (np.arange(w) + ox) % p
    n = t[iy[:, None], ix[None, :], :c]
    return n if chroma else np.repeat(n[:, :, :1], c, axis=2)


class SensorNoise(Perturbation):
    """Poisson-Gaussian sensor noise: ``out = clip(x + sqrt(a x + b^2) n)`` with ``n`` the sample's window of a
    fixed unit-variance texture (per channel when ``chroma``, else one luma field on every channel).

    Params: ``shot`` (B,) ``a``, ``read`` (B,) ``b`` (intensities in [0,1] at the 512-px reference size),
    ``chroma`` (B,) 1/0, ``noise_offset`` (B,2) the texture shift in 1/64 periods. Severity -> ``a``
    (1: 2-4e-4, 2: 4-8e-4, 3: 0.8-1.6e-3, 4: 1.6-3.2e-3, 5: 3.2-6.4e-3) and ``b`` (severity x 0.002-0.004),
    i.e. a noise std at mid-grey of about 0.013 / 0.02 / 0.03 / 0.04 / 0.055 (3-14 grey levels) at 512 px,
    and a quarter of it at 128 px (the grain averages out when downsized).

    ``chroma``: draw independent noise per colour channel (a Bayer sensor's demosaiced noise is coloured);
    ``False`` gives luminance-only noise.

    Example:
        >>> import numpy as np
        >>> img = np.tile(np.linspace(0, 255, 64).astype(np.uint8)[None, :, None], (64, 1, 3))
        >>> out, p = SensorNoise(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> d = out.astype(float) - img
        >>> bool(d[:, 40:56].std() > d[:, 4:12].std() > 0)   # noisier where brighter (shot noise)
        True
    """

    name = "sensor_noise"
    rgb = False
    SHOT = {1: (2e-4, 4e-4), 2: (4e-4, 8e-4), 3: (8e-4, 1.6e-3), 4: (1.6e-3, 3.2e-3), 5: (3.2e-3, 6.4e-3)}
    PARAM_KEYS = ("shot", "read", "chroma", "noise_offset")

    def __init__(self, severity: int = 3, chroma: bool = True):
        super().__init__(severity)
        self.chroma = bool(chroma)

    def _draw(self, r, b):
        shot = r.uniform(*self.SHOT[self.severity], (b,))
        read = r.uniform(0.002 * self.severity, 0.004 * self.severity, (b,))
        flag = r.integers(
            int(self.chroma), int(self.chroma) + 1, (b,)
        )  # the constructor's choice, per sample
        return {
            "shot": shot,
            "read": read,
            "chroma": flag,
            "noise_offset": r.integers(0, NOISE_STEPS, (b, 2)),
        }

    def _apply_torch(self, images, masks, params):
        b, c, h, w = images.shape
        n = noise_fields(params["noise_offset"], params["chroma"], c, h, w).to(images.dtype)
        s = (slice(None), None, None, None)
        var = images * params["shot"].to(images.dtype)[s] + params["read"].to(images.dtype)[s] ** 2
        return (images + var.clamp_min_(0.0).sqrt_() * n).clamp_(0.0, 1.0)

    def _apply_np(self, image, mask, params):
        h, w, c = image.shape
        x = to_float01(image)
        n = noise_field_np(params["noise_offset"], int(params["chroma"]), c, h, w)
        std = np.sqrt(np.maximum(x * np.float32(params["shot"]) + np.float32(params["read"]) ** 2, 0.0))
        return from_float01((x + std * n).astype(np.float32), image.dtype)


__all__ = ["SensorNoise", "noise_fields", "noise_field_np"]
