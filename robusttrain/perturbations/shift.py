"""Distribution-shift families for training: ``randconv`` (random shallow convolution networks, GIN / RandConv)
and ``fourier_mix`` (amplitude-spectrum mixing with another image, FDA / FACT).

They model no single clinical artifact: they change what a model should be invariant to across scanners,
centres and light sources (texture, intensity mapping, colour and low-frequency "style") while keeping
shapes, the signal domain-generalisation methods train on. Same two-path contract as every family
(:mod:`.base`): per-sample params replay exactly on both paths and on any device.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .base import Perturbation, from_float01, short_side, to_float01

# -------------------------------------------------------------------------------------- randconv
HIDDEN = 4  # channels of the two hidden layers
# weights of one random network drawn for 3-channel input/output (1-channel images use the first slice):
# layer 1 (HIDDEN x 3 x 3 x 3) + bias, layer 2 (HIDDEN x HIDDEN x 3 x 3) + bias, layer 3 (3 x HIDDEN, 1x1) + bias
_SHAPES = ((HIDDEN, 3, 3, 3), (HIDDEN,), (HIDDEN, HIDDEN, 3, 3), (HIDDEN,), (3, HIDDEN, 1, 1), (3,))
N_WEIGHTS = sum(int(np.prod(s)) for s in _SHAPES)
BIAS_STD = 0.1
SLOPE = 0.2  # leaky ReLU, as GIN


def _layers(w, c: int):
    """Split (B, N_WEIGHTS) unit normal draws into the three layers' weights and biases for ``c`` channels,
    Kaiming-scaled by the actual fan-in (works on torch tensors and numpy arrays alike)."""
    out, i = [], 0
    for s in _SHAPES:
        n = int(np.prod(s))
        out.append(w[:, i : i + n].reshape((w.shape[0],) + s))
        i += n
    w1, b1, w2, b2, w3, b3 = out
    w1, w3, b3 = w1[:, :, :c], w3[:, :c], b3[:, :c]
    return (
        (w1 * (2.0 / (9 * c)) ** 0.5, b1 * BIAS_STD),
        (w2 * (2.0 / (9 * HIDDEN)) ** 0.5, b2 * BIAS_STD),
        (w3 * (2.0 / HIDDEN) ** 0.5, b3 * BIAS_STD),
    )


def tap_spacing(h: int, w: int) -> int:
    """Spacing (px) of the 3x3 taps: 1/256 of the shorter side (2 px at 512), at least 1 px, so the random
    texture has about the same scale at every size."""
    return max(1, round(short_side(h, w) / 256))


def _standardise_like(y, x, xp):
    """Give each channel of each sample of ``y`` the mean of the same channel of ``x`` and the std of the whole
    sample of ``x``: the image's colour balance and contrast stay, its intensity mapping and texture change.
    (Rescaling all channels together, as GIN's Frobenius normalisation does, let one channel's offset eat the
    contrast: severity 5 turned endoscopy frames into flat magenta.)"""
    if xp is torch:
        ym, ys = y.mean((2, 3), keepdim=True), y.std((2, 3), keepdim=True, correction=0)
        xm, xs = x.mean((2, 3), keepdim=True), x.std((1, 2, 3), keepdim=True, correction=0)
    else:
        ym, ys = y.mean((2, 3), keepdims=True), y.std((2, 3), keepdims=True)
        xm, xs = x.mean((2, 3), keepdims=True), x.std((1, 2, 3), keepdims=True)
    return (y - ym) / (ys + 1e-6) * xs + xm


def _pad_reflect101(v: torch.Tensor, r: int) -> torch.Tensor:
    """``r`` px of reflect-101 padding on both sides of the last two dims, as numpy's ``mode="reflect"``.
    An axis of one pixel has nothing to mirror: torch refuses it, numpy repeats the pixel, and so does
    this (replicate; a spacing ``r > 1`` comes only with sides of 384 px and more, so that is the one case)."""
    h, w = v.shape[-2:]
    if h > r and w > r:
        return F.pad(v, (r, r, r, r), mode="reflect")
    v = F.pad(v, (r, r, 0, 0), mode="reflect" if w > r else "replicate")
    return F.pad(v, (0, 0, r, r), mode="reflect" if h > r else "replicate")


def randconv_torch(x: torch.Tensor, weights: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """Each sample through its own random network (grouped convolutions: one call per layer for the batch)."""
    b, c, h, w = x.shape
    d = tap_spacing(h, w)
    v = x.float()
    for j, (wt, bias) in enumerate(_layers(weights.float(), c)):
        cin = v.shape[1]
        r = (wt.shape[-1] // 2) * d
        v = _pad_reflect101(v.reshape(1, b * cin, h, w), r) if r else v.reshape(1, b * cin, h, w)
        v = F.conv2d(v, wt.reshape(-1, *wt.shape[2:]), bias.reshape(-1), dilation=d, groups=b).reshape(
            b, -1, h, w
        )
        if j < 2:
            v = F.leaky_relu(v, SLOPE)
    y = _standardise_like(v, x.float(), torch)
    m = mix.float()[:, None, None, None]
    return (x.float() * (1 - m) + y * m).clamp_(0.0, 1.0).to(x.dtype)


def randconv_np(x: np.ndarray, weights: np.ndarray, mix: float) -> np.ndarray:
    """:func:`randconv_torch` on one (C,H,W) float32 image: the 3x3 taps as shifted views (reflect-101)."""
    c, h, w = x.shape
    d = tap_spacing(h, w)
    v = x.astype(np.float32)
    for j, (wt, bias) in enumerate(_layers(np.asarray(weights, np.float32)[None], c)):
        wt, bias = wt[0], bias[0]
        k = wt.shape[-1]
        r = (k // 2) * d
        p = np.pad(v, ((0, 0), (r, r), (r, r)), mode="reflect") if r else v
        acc = np.zeros((wt.shape[0], h, w), np.float32)
        for ty in range(k):
            for tx in range(k):
                view = p[:, ty * d : ty * d + h, tx * d : tx * d + w]
                acc += np.tensordot(wt[:, :, ty, tx], view, axes=(1, 0))
        v = acc + bias[:, None, None]
        if j < 2:
            v = np.where(v > 0, v, np.float32(SLOPE) * v)
    y = _standardise_like(v[None], x[None].astype(np.float32), np)[0]
    m = np.float32(mix)
    return np.clip(x * (1 - m) + y * m, 0.0, 1.0).astype(np.float32)


class RandConv(Perturbation):
    """Random shallow convolution network (GIN, Ouyang et al. MedIA 2022 / IEEE TMI; RandConv, Xu et al. ICLR
    2021): each sample goes through its own randomly initialised 3-layer network (3x3, 3x3, 1x1 convolutions,
    4 hidden channels, leaky ReLU 0.2, Kaiming-normal weights), each output channel rescaled to the image's
    mean in that channel and the image's std, and mixed with it: ``out = clip((1 - mix) x + mix * net(x))``. A new intensity / colour mapping and texture every
    draw, with the image's shapes kept.

    Params: ``weights`` (B, 275) the network's unit-normal draws (recorded, so a replay is exact on every path
    and device; 1-channel images use the first input / output channel's slice), ``mix`` (B,). Severity ->
    ``mix`` (1: .1-.25, 2: .25-.4, 3: .4-.6, 4: .6-.8, 5: .8-1; GIN draws it uniform in [0, 1]). The 3x3 taps
    are 1/256 of the shorter side apart (2 px at 512, at least 1 px), so the texture scale is relative.

    Example:
        >>> import numpy as np
        >>> img = np.random.default_rng(0).integers(0, 256, (32, 32, 3)).astype(np.uint8)
        >>> out, p = RandConv(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> out.shape, p["weights"].shape, bool(np.abs(out.astype(int) - img).mean() > 10)
        ((32, 32, 3), (275,), True)
    """

    name = "randconv"
    rgb = False
    MIX = {1: (0.1, 0.25), 2: (0.25, 0.4), 3: (0.4, 0.6), 4: (0.6, 0.8), 5: (0.8, 1.0)}
    PARAM_KEYS = ("weights", "mix")

    def _draw(self, r, b):
        return {"weights": r.normal((b, N_WEIGHTS)), "mix": r.uniform(*self.MIX[self.severity], (b,))}

    def _apply_torch(self, images, masks, params):
        return randconv_torch(images, params["weights"], params["mix"])

    def _apply_np(self, image, mask, params):
        x = np.ascontiguousarray(to_float01(image).transpose(2, 0, 1))
        out = randconv_np(x, params["weights"], float(params["mix"]))
        return from_float01(np.ascontiguousarray(out.transpose(1, 2, 0)), image.dtype)


# -------------------------------------------------------------------------------------- fourier_mix
def _band_rows(n: int, band: int) -> tuple[int, list[int]]:
    """Usable band (frequencies -b..b fit without aliasing into n samples) and the FFT rows of -b..b."""
    b = min(band, (n - 1) // 2)
    return b, [k % n for k in range(-b, b + 1)]


def band_amplitude(x, band: int, xp=torch):
    """(B,C,2*band+1,band+1) amplitude spectrum of (B,C,H,W) images at frequencies |ky|, kx <= band (cycles per
    image, rows ky = -band..band), divided by H*W (Fourier-series magnitudes: the same at any size);
    frequencies the image is too small to hold are -1."""
    h, w = x.shape[-2:]
    bh, rows = _band_rows(h, band)
    bw = min(band, (w - 1) // 2)
    if xp is torch:
        spec = torch.fft.rfft2(x.float()).abs() / (h * w)
        out = torch.full((*x.shape[:2], 2 * band + 1, band + 1), -1.0, device=x.device)
        out[:, :, band - bh : band + bh + 1, : bw + 1] = spec[:, :, rows, : bw + 1]
        return out
    spec_np = np.abs(np.fft.rfft2(np.asarray(x, np.float32), axes=(-2, -1))).astype(np.float32) / (h * w)
    out_np = np.full((*x.shape[:2], 2 * band + 1, band + 1), -1.0, np.float32)
    out_np[:, :, band - bh : band + bh + 1, : bw + 1] = spec_np[:, :, rows, : bw + 1]
    return out_np


def fourier_mix_apply(x, amp, ratio, xp=torch):
    """Mix each image's low-frequency amplitude with the recorded partner amplitude ``amp`` (from
    :func:`band_amplitude`): ``A' = (1 - ratio) A + ratio * A_partner`` inside the band, phase kept."""
    h, w = x.shape[-2:]
    band = amp.shape[-1] - 1
    bh, rows = _band_rows(h, band)
    bw = min(band, (w - 1) // 2)
    if xp is torch:
        spec = torch.fft.rfft2(x.float())
        sub = spec[:, :, rows, : bw + 1]
        a = sub.abs()
        pa = amp[:, :, band - bh : band + bh + 1, : bw + 1].float().to(x.device) * (h * w)
        lam = ratio.float()[:, None, None, None]
        new = torch.where(pa >= 0, (1 - lam) * a + lam * pa, a)
        spec[:, :, rows, : bw + 1] = torch.polar(new, torch.angle(sub))
        return torch.fft.irfft2(spec, s=(h, w)).clamp_(0.0, 1.0).to(x.dtype)
    spec = np.fft.rfft2(np.asarray(x, np.float32), axes=(-2, -1))
    sub = spec[:, :, rows, : bw + 1]
    a = np.abs(sub)
    pa = np.asarray(amp, np.float32)[:, :, band - bh : band + bh + 1, : bw + 1] * np.float32(h * w)
    lam = np.asarray(ratio, np.float32)[:, None, None, None]
    new = np.where(pa >= 0, (1 - lam) * a + lam * pa, a)
    spec[:, :, rows, : bw + 1] = new * np.exp(1j * np.angle(sub))
    return np.clip(np.fft.irfft2(spec, s=(h, w), axes=(-2, -1)), 0.0, 1.0).astype(np.float32)


def _stand_in(x: torch.Tensor) -> torch.Tensor:
    """The partner of an image that has no other image beside it: itself mirrored left-right. Its amplitude is
    the image's own mirrored in the vertical frequency, so the mean colour stays and the low-frequency shading
    (light fall-off, haze, vignetting) takes the mirrored orientation: the weakest shift, but one that invents
    no colours (rotating the channels turned endoscopy frames green)."""
    return x.flip(-1)


class FourierMix(Perturbation):
    """Fourier amplitude mixing with another image of the batch (FDA, Yang & Soatto CVPR 2020; FACT, Xu et al.
    CVPR 2021): each image keeps its phase (shapes, edges) and takes a mix of its own and a partner's
    low-frequency amplitude spectrum (illumination, colour, contrast, haze: the "style" of a centre):
    ``A' = (1 - ratio) A + ratio * A_partner`` for |ky|, kx <= ``band`` cycles per image.

    Params: ``partner`` (B,) the partner's position in the batch the params were drawn on (the sample itself
    when it was alone: see below), ``ratio`` (B,), ``amp`` (B, C, 2 band + 1, band + 1) the partner's band
    amplitudes (Fourier-series magnitudes, size-free) as drawn — so a sample replays exactly on its own, on
    any batch, path and size, and ``partner`` says where the style came from. Severity -> ``band`` (1: 2,
    2: 3, 3: 5, 4: 8, 5: 12 cycles per image, about FDA's beta 0.004-0.024 at 512 px; its beta = 0.01 is
    5 cycles there) and ``ratio`` (1: .2-.4, 2: .35-.55, 3: .5-.7, 4: .65-.85, 5: .8-1; FDA replaces,
    ratio 1; FACT mixes, ratio uniform in [0, 1]).

    **One image alone** (the numpy / Albumentations path, or a batch of one): there is no other image, so
    the partner is a stand-in built from the image itself, mirrored left-right, recorded as ``partner`` = its
    own position. That keeps the mean colour and changes only the orientation of the low-frequency shading,
    much weaker than a real partner: for FDA-strength shifts apply the family to batches (as the training
    callbacks do), or give replayed params whose ``amp`` came from another image.

    Example:
        >>> import torch
        >>> x = torch.rand(4, 3, 32, 32) * torch.tensor([1.0, 0.5, 0.2])[None, :, None, None]
        >>> out, p = FourierMix(severity=5).apply_batch(x, generator=torch.Generator().manual_seed(0))
        >>> sorted(p), bool((p["partner"] != torch.arange(4)).all())
        (['amp', 'partner', 'ratio'], True)
    """

    name = "fourier_mix"
    rgb = False
    BAND = {1: 2, 2: 3, 3: 5, 4: 8, 5: 12}
    RATIO = {1: (0.2, 0.4), 2: (0.35, 0.55), 3: (0.5, 0.7), 4: (0.65, 0.85), 5: (0.8, 1.0)}
    PARAM_KEYS = ("partner", "ratio", "amp")

    def _draw(self, r, b):
        # "partner" is drawn as an offset 1..b-1 to the sample's own position; _content_torch turns it into
        # the position (so no sample is its own partner when it has company)
        return {
            "partner": r.integers(1, max(b, 2), (b,)),
            "ratio": r.uniform(*self.RATIO[self.severity], (b,)),
        }

    def _content_torch(self, images, masks, draws):
        b = images.shape[0]
        own = torch.arange(b, device=images.device)
        partner = (own + draws["partner"].to(images.device)) % b
        src = images[partner]
        alone = partner == own
        if bool(alone.any()):
            src = torch.where(alone[:, None, None, None], _stand_in(images), src)
        return {"partner": partner, "amp": band_amplitude(src, self.BAND[self.severity])}

    def _apply_torch(self, images, masks, params):
        self._check_amp(params["amp"], images.shape[1])
        return fourier_mix_apply(images, params["amp"], params["ratio"])

    def _apply_np(self, image, mask, params):
        self._check_amp(params["amp"][None], image.shape[2])
        x = np.ascontiguousarray(to_float01(image).transpose(2, 0, 1))[None]
        out = fourier_mix_apply(x, params["amp"][None], np.asarray(params["ratio"]).reshape(1), xp=np)[0]
        return from_float01(np.ascontiguousarray(out.transpose(1, 2, 0)), image.dtype)

    def _check_amp(self, amp, c: int) -> None:
        if amp.ndim != 4 or amp.shape[1] != c or amp.shape[2] != 2 * amp.shape[3] - 1:
            raise ValueError(
                f"{self.name}: params['amp'] must have shape (B, C={c}, 2*band+1, band+1) for {c}-channel images, "
                f"got {tuple(amp.shape)} (params recorded on images with another channel count cannot replay)"
            )


__all__ = ["RandConv", "FourierMix", "randconv_torch", "randconv_np", "band_amplitude", "fourier_mix_apply"]
