"""Shared machinery of the single-channel (MRI / X-ray) families: the grey-only input check, the float
round trip of the numpy path, a fixed noise texture for exactly replayable noise, and tone curves.

Grey families take (B,1,H,W) batches and (H,W) / (H,W,1) numpy images and refuse colour input with
one clear message: an RGB frame reaching an MRI artifact is a configuration mistake, not data to guess
about. Every spatial quantity they use is relative to the image size (normalised coordinates, cycles
per image, fractions of the shorter side), so params sampled at one size replay at any other.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import torch

from .base import Params, Perturbation, from_float01, to_float01


def grey_error(name: str, what: str) -> ValueError:
    """The one-line refusal of colour input by a single-channel family (``what``: what was expected, got)."""
    return ValueError(
        f"{name}: needs single-channel (grey) images — MRI / X-ray intensities — "
        f"{what}; convert colour images to grey first or use a colour family"
    )


class GreyPerturbation(Perturbation):
    """Base of the single-channel families: refuses colour input, then defers to :class:`Perturbation`.

    Subclasses implement ``_grey_torch(x, masks, params)`` on (B,H,W) float tensors and
    ``_grey_np(x, mask, params)`` on one (H,W) float32 array in [0,1]; both return values in [0,1].

    ``cpu_planes``: on CPU float32 tensors (no autograd) the batch is processed plane by plane with
    ``_grey_np`` on zero-copy views — OpenCV / numpy kernels on one cache-resident plane beat a chain of
    full-batch torch passes several times (the same choice as ``blur``). Set it to False (class or
    instance) to run the torch kernels on CPU too, as the tests do to compare them with the numpy path.
    """

    rgb = False
    grey_only = True
    cpu_planes = True

    def _check_channels_torch(self, images: Any) -> None:
        if isinstance(images, torch.Tensor) and images.ndim == 4 and images.shape[1] != 1:
            raise grey_error(
                self.name,
                f"a (B,1,H,W) batch, got shape {tuple(images.shape)} with {images.shape[1]} channels",
            )

    def _check_channels_np(self, image: Any) -> None:
        if isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[2] != 1:
            raise grey_error(self.name, f"an (H,W) or (H,W,1) image, got shape {image.shape}")

    def sample_params(self, images, masks=None, generator=None):
        self._check_channels_torch(images)
        return super().sample_params(images, masks, generator)

    def apply_batch(self, images, masks=None, generator=None, params=None):
        self._check_channels_torch(images)
        return super().apply_batch(images, masks, generator, params)

    def check_numpy(self, image, mask=None):
        self._check_channels_np(image)
        return super().check_numpy(image, mask)

    def _apply_torch(self, images: torch.Tensor, masks: torch.Tensor | None, params: Params) -> torch.Tensor:
        if (
            self.cpu_planes
            and images.device.type == "cpu"
            and images.dtype == torch.float32
            and not images.requires_grad
        ):
            x = images.detach().contiguous().numpy()
            out = torch.empty(
                images.shape, dtype=images.dtype
            )  # contiguous planes, whatever the input strides
            o = out.numpy()
            mk = None if masks is None else masks.detach().cpu().numpy()
            pn = {k: v.detach().cpu().numpy() for k, v in params.items()}
            for i in range(x.shape[0]):
                self._grey_np(
                    x[i, 0], None if mk is None else mk[i], {k: v[i] for k, v in pn.items()}, out=o[i, 0]
                )
            return out
        return self._grey_torch(images[:, 0], masks, params).unsqueeze(1)

    def _apply_np(
        self, image: np.ndarray, mask: np.ndarray | None, params: dict[str, np.ndarray]
    ) -> np.ndarray:
        x = np.ascontiguousarray(to_float01(image)[:, :, 0])
        out = self._grey_np(x, mask, params, out=np.empty_like(x))
        return from_float01(out, image.dtype)[:, :, None]

    def _grey_torch(self, x: torch.Tensor, masks: torch.Tensor | None, params: Params) -> torch.Tensor:
        raise NotImplementedError

    def _grey_np(
        self, x: np.ndarray, mask: np.ndarray | None, params: dict[str, np.ndarray], out: np.ndarray
    ) -> np.ndarray:
        """Write the result for one float32 (H,W) plane ``x`` into ``out`` (same shape) and return it."""
        raise NotImplementedError


def pixel_centres(n: int, xp=torch, device: torch.device | None = None) -> Any:
    """Normalised pixel-centre coordinates ``(i + 0.5) / n`` in (0, 1), float32."""
    if xp is torch:
        return (torch.arange(n, device=device, dtype=torch.float32) + 0.5) / n
    return ((np.arange(n, dtype=np.float32) + 0.5) / n).astype(np.float32)


# --------------------------------------------------------------------------------------
# Noise: a fixed standard-normal texture, windowed at a per-sample offset.
# --------------------------------------------------------------------------------------
# Replay must give the identical noise on the numpy path, on the CPU and on any accelerator, so noise
# is not drawn per call: a sample's noise is a window of this seeded field at ``offset`` (params),
# wrapping around. 1024 px per side keeps windows of images up to 1024 px free of repeats.
NOISE_SIDE = 1024


@lru_cache(maxsize=1)
def noise_texture() -> np.ndarray:
    """(2, 1024, 1024) float32 standard-normal fields (two independent ones, e.g. real / imaginary)."""
    return np.random.default_rng(20261122).standard_normal((2, NOISE_SIDE, NOISE_SIDE), dtype=np.float32)


@lru_cache(maxsize=4)
def _noise_padded(h: int, w: int) -> np.ndarray:
    """The texture wrapped out to (2, 1024 + h, 1024 + w), so any offset's window is a plain slice."""
    t = noise_texture()
    reps = (1, math.ceil((NOISE_SIDE + h) / NOISE_SIDE), math.ceil((NOISE_SIDE + w) / NOISE_SIDE))
    return np.ascontiguousarray(np.tile(t, reps)[:, : NOISE_SIDE + h, : NOISE_SIDE + w])


def noise_window_np(offset: np.ndarray, h: int, w: int, field: int = 0) -> np.ndarray:
    """One sample's (H,W) noise (a read-only view) at integer ``offset`` (oy, ox)."""
    oy, ox = int(offset[0]) % NOISE_SIDE, int(offset[1]) % NOISE_SIDE
    return _noise_padded(h, w)[field, oy : oy + h, ox : ox + w]


_TEXTURE_ON: dict[torch.device, torch.Tensor] = {}


def noise_windows(offset: torch.Tensor, h: int, w: int, field: int = 0) -> torch.Tensor:
    """(B,H,W) noise for per-sample offsets (B,2) on ``offset``'s device (same values as the numpy path)."""
    dev = offset.device
    if dev.type == "cpu":  # slices of the cached wrapped texture: one copy, no index arithmetic
        return torch.from_numpy(np.stack([noise_window_np(o, h, w, field) for o in offset.tolist()]))
    if dev not in _TEXTURE_ON:
        _TEXTURE_ON[dev] = torch.from_numpy(noise_texture()).to(dev)
    tex = _TEXTURE_ON[dev][field]
    iy = (torch.arange(h, device=dev)[None] + offset[:, :1]) % NOISE_SIDE  # (B,H)
    ix = (torch.arange(w, device=dev)[None] + offset[:, 1:]) % NOISE_SIDE  # (B,W)
    return tex[iy[:, :, None], ix[:, None, :]]


# --------------------------------------------------------------------------------------
# Tone curves: out = clip(gain * x**gamma + offset).
# --------------------------------------------------------------------------------------
def tone_torch(
    x: torch.Tensor, gamma: torch.Tensor, gain: torch.Tensor, offset: torch.Tensor
) -> torch.Tensor:
    """Per-sample tone curve on a (B,H,W) batch."""
    s = (slice(None),) + (None,) * (x.ndim - 1)
    # exp(gamma log x + log gain): several times faster than pow with a per-sample exponent tensor;
    # log 0 = -inf gives exp(-inf) = 0, as x**gamma does
    out = torch.log(x.clamp(min=0))
    out = torch.addcmul(torch.log(gain.to(x.dtype))[s], out, gamma.to(x.dtype)[s], out=out)
    return out.exp_().add_(offset.to(x.dtype)[s]).clamp_(0.0, 1.0)


def tone_np(
    x: np.ndarray, gamma: float, gain: float, offset: float, out: np.ndarray | None = None
) -> np.ndarray:
    """The same curve on one float32 image (x >= 0), written into ``out`` when given."""
    # exp(gamma log x + log gain) in three OpenCV passes: twice as fast as cv2.pow alone. x is floored
    # (inputs may undershoot 0 by float noise, and log 0 = -inf would turn addWeighted's 0 * -inf into
    # NaN) at a level whose power is e^-80 (a normal float: denormals would slow every later pass by
    # orders of magnitude on black backgrounds), or 1e-30 for small gamma; both are 0 in any image.
    # (the cv2 stubs type src2 as an array only; OpenCV takes a Python scalar there, as a Scalar)
    out = cv2.max(x, max(math.exp(-80.0 / float(gamma)), 1e-30), dst=out)  # type: ignore[call-overload]
    cv2.log(out, dst=out)
    cv2.addWeighted(out, float(gamma), out, 0.0, math.log(float(gain)), dst=out)
    cv2.exp(out, dst=out)
    if offset != 0.0:
        cv2.add(out, float(offset), dst=out)  # type: ignore[call-overload]  # scalar src2: as cv2.max above
        if offset < 0:
            np.maximum(out, 0.0, out=out)
    if gain + offset > 0.999:  # x <= 1 (+1e-4), so the curve stays below gain + offset: else nothing to cut
        cv2.threshold(out, 1.0, 1.0, cv2.THRESH_TRUNC, dst=out)
    return out


def tone_lut_u8(gamma: float, gain: float, offset: float) -> np.ndarray:
    """The curve as a 256-entry uint8 lookup table (uint8 images: one ``cv2.LUT`` pass)."""
    v = tone_np(np.arange(256, dtype=np.float32) / np.float32(255), gamma, gain, offset)
    return np.clip(v * 255 + 0.5, 0, 255).astype(np.uint8)


def apply_tone_image(image: np.ndarray, gamma: float, gain: float, offset: float) -> np.ndarray:
    """Tone curve on one HWC (C = 1 or 3) uint8 / float32 image, the same curve on every channel;
    returned in the same dtype and shape."""
    c = image.shape[2]
    x = np.ascontiguousarray(image[:, :, 0] if c == 1 else image)
    if image.dtype == np.uint8:
        out = cv2.LUT(x, tone_lut_u8(gamma, gain, offset))
    else:
        out = tone_np(x, gamma, gain, offset)
    return out.reshape(image.shape)
