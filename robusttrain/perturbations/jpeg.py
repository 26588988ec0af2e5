"""JPEG compression (``jpeg``): the baseline codec's 8x8 block DCT quantisation, batched in torch.

The pipeline is the one libjpeg runs (ITU-T T.81 / JFIF): RGB -> YCbCr (full range, BT.601), chroma
subsampled 2x2 (4:2:0, OpenCV's default), level shift, 8x8 DCT per block, quantisation by the standard
Annex K luminance / chrominance tables scaled by the quality (libjpeg's ``jpeg_quality_scaling``), inverse
DCT, chroma upsampled with libjpeg's "fancy" triangle filter, back to RGB. Grey images take the luminance
path alone. The coefficients are computed in float64 on both paths, so rounding to the quantiser's grid
picks the same level on the numpy path, the CPU and an accelerator.

**Relative units.** Block artifacts are 8 px of the *encoded* frame. To mean the same at every size the
codec runs on a grid ``k = round(512 / shorter side)`` times finer than the image (bilinear up, integer
``k``) and its error there, area-averaged back down, is added to the image, so a 128-px image shows what a frame compressed at ~512 px shows once
downsized; images with a shorter side of 512 px and more are compressed on their own pixel grid. ``k`` is
capped so that the grid stays proportional to the image (:func:`grid_factor`: only thin strips are affected).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from .base import REF_SIDE, Perturbation, from_float01, short_side, to_float01

# ITU-T T.81 Annex K, tables K.1 (luminance) and K.2 (chrominance), row = vertical frequency
LUMA_TABLE = np.array(
    [
        [16, 11, 10, 16, 24, 40, 51, 61],
        [12, 12, 14, 19, 26, 58, 60, 55],
        [14, 13, 16, 24, 40, 57, 69, 56],
        [14, 17, 22, 29, 51, 87, 80, 62],
        [18, 22, 37, 56, 68, 109, 103, 77],
        [24, 35, 55, 64, 81, 104, 113, 92],
        [49, 64, 78, 87, 103, 121, 120, 101],
        [72, 92, 95, 98, 112, 100, 103, 99],
    ],
    np.float64,
)
CHROMA_TABLE = np.full((8, 8), 99.0)
CHROMA_TABLE[:4, :4] = [[17, 18, 24, 47], [18, 21, 26, 66], [24, 26, 56, 99], [47, 66, 99, 99]]

# JFIF full-range YCbCr (T.871)
RGB2YCC = np.array([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]])
YCC2RGB = np.array([[1.0, 0.0, 1.402], [1.0, -0.344136, -0.714136], [1.0, 1.772, 0.0]])


def dct_matrix() -> np.ndarray:
    """The orthonormal 8-point DCT-II matrix ``D[u, x] = c(u)/2 cos((2x+1) u pi / 16)`` (JPEG's FDCT is
    ``D f D^T``)."""
    u, x = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    d = 0.5 * np.cos((2 * x + 1) * u * np.pi / 16)
    d[0] /= math.sqrt(2)
    return d


def quant_tables(quality, xp=torch):
    """(B,2,8,8) float64 luminance / chrominance tables for integer qualities (B,) in 1..100, exactly as
    libjpeg scales them (integer arithmetic, baseline: clamped to 1..255)."""
    if xp is torch:
        q = quality.double().clamp(1, 100)
        scale = torch.where(q < 50, torch.floor(5000 / q), 200 - 2 * q)[:, None, None, None]
        base = torch.from_numpy(np.stack([LUMA_TABLE, CHROMA_TABLE])).to(q.device)[None]
        return torch.floor((base * scale + 50) / 100).clamp(1, 255)
    q = np.clip(np.asarray(quality, np.float64), 1, 100)
    scale = np.where(q < 50, np.floor(5000 / q), 200 - 2 * q)[:, None, None, None]
    return np.clip(np.floor((np.stack([LUMA_TABLE, CHROMA_TABLE])[None] * scale + 50) / 100), 1, 255)


def _linear_up(n_src: int, factor: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear upsampling by ``factor`` as (i0, i1, f) with ``out[i] = (1 - f) src[i0] + f src[i1]``
    (half-pixel centres, edges clamped, as OpenCV's INTER_LINEAR and libjpeg's fancy upsampling); outputs
    past ``factor * n_src`` repeat the last one (the codec's edge padding to whole blocks)."""
    i = np.minimum(np.arange(n_out), factor * n_src - 1)
    src = np.clip((i + 0.5) / factor - 0.5, 0.0, n_src - 1.0)
    i0 = np.floor(src).astype(np.int64)
    return i0, np.minimum(i0 + 1, n_src - 1), src - i0


@lru_cache(maxsize=16)
def codec_grid(n: int, k: int) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...], int]:
    """For an axis of ``n`` px coded on a ``k``-times finer grid padded to whole 16-px macroblocks (P samples):
    the upsampling to P and the chroma upsampling from P/2 (as :func:`_linear_up`), and P."""
    p = 16 * math.ceil(k * n / 16)
    return _linear_up(n, k, p), _linear_up(p // 2, 2, p), p


# the codec's grid holds at most this many pixels, or GRID_PER_PIXEL per image pixel when that is more
GRID_PIXELS = 4 * REF_SIDE * REF_SIDE
GRID_PER_PIXEL = 64


def grid_factor(h: int, w: int) -> int:
    """How many times finer than the image the codec's grid is: ``round(512 / shorter side)``, at least 1,
    and at most what keeps the grid within ``max(GRID_PIXELS, GRID_PER_PIXEL * h * w)`` pixels.

    The cap bites only on thin images (a 4 x 1024 strip would otherwise be coded on a 512 x 131072 grid,
    1.6 GB): the memory stays proportional to the image. Any image coded 8 times finer or less (shorter
    side 60 px and more), and every small one whose grid fits in 1024 x 1024 pixels, keeps its factor.

    >>> grid_factor(32, 32), grid_factor(128, 96), grid_factor(600, 500), grid_factor(4, 1024)
    (16, 5, 1, 16)
    """
    k = max(1, round(REF_SIDE / short_side(h, w)))
    area = int(h) * int(w)
    budget = max(GRID_PIXELS, GRID_PER_PIXEL * area)
    return k if k * k * area <= budget else max(1, math.isqrt(budget // area))


def _up(v, lin, dim: int, xp):
    """Linear resampling of ``v`` along ``dim`` (-2 or -1) by :func:`_linear_up`'s (i0, i1, f): two gathers."""
    i0, i1, f = lin
    shape = (-1, 1) if dim == -2 else (-1,)
    if xp is torch:
        i0, i1 = torch.from_numpy(i0).to(v.device), torch.from_numpy(i1).to(v.device)
        f = torch.from_numpy(f).to(v.device).reshape(shape)
        a, b = v.index_select(dim, i0), v.index_select(dim, i1)
    else:
        f = f.reshape(shape)
        a, b = np.take(v, i0, axis=dim), np.take(v, i1, axis=dim)
    return a + (b - a) * f


def _down(v, n_out: int, factor: int, dim: int):
    """Mean of each ``factor`` consecutive samples along ``dim`` (-2 or -1), the first ``n_out`` groups."""
    if dim == -2:
        v = v[..., : n_out * factor, :]
        return v.reshape(*v.shape[:-2], n_out, factor, v.shape[-1]).mean(-2)
    v = v[..., : n_out * factor]
    return v.reshape(*v.shape[:-1], n_out, factor).mean(-1)


def _einsum(xp, spec: str, *ops):
    # numpy's einsum contracts several operands naively unless asked to plan the order
    return np.einsum(spec, *ops, optimize=True) if xp is np else torch.einsum(spec, *ops)


def _blocks(planes, xp):
    """(B,P,Q) planes -> (B, P/8 * Q/8, 64) flattened 8x8 blocks."""
    b, ph, pw = planes.shape
    v = planes.reshape(b, ph // 8, 8, pw // 8, 8)
    v = v.transpose(2, 3) if xp is torch else v.transpose(0, 1, 3, 2, 4)
    return v.reshape(b, -1, 64)


def _unblocks(blocks, ph: int, pw: int, xp):
    """Inverse of :func:`_blocks`."""
    b = blocks.shape[0]
    v = blocks.reshape(b, ph // 8, pw // 8, 8, 8)
    v = v.transpose(2, 3) if xp is torch else v.transpose(0, 1, 3, 2, 4)
    return v.reshape(b, ph, pw)


def _quantise(planes, tables, kron, xp):
    """Block-DCT quantisation of (B,P,Q) planes (P, Q multiples of 8) by per-sample (B,8,8) tables; ``kron``
    is the 64x64 2-D DCT of a flattened block, so each transform is one matrix product."""
    b, ph, pw = planes.shape
    t = tables.reshape(b, 1, 64)
    coef = _blocks(planes, xp) @ kron.T
    coef = xp.round(coef / t) * t
    return _unblocks(coef @ kron, ph, pw, xp)


def jpeg_codec(x, quality, xp=torch):
    """Compress and decompress a (B,C,H,W) float batch in [0,1] (C = 1 or 3) at integer ``quality`` (B,);
    float64 inside, the input's dtype out. ``xp=np`` runs the same arithmetic on numpy arrays."""
    b, c, h, w = x.shape
    k = grid_factor(h, w)
    up_h, cu_h, ph = codec_grid(h, k)
    up_w, cu_w, pw = codec_grid(w, k)
    d = dct_matrix()
    kron, rgb2ycc, ycc2rgb = np.kron(d, d), RGB2YCC, YCC2RGB
    if xp is torch:
        kron, rgb2ycc, ycc2rgb = (torch.from_numpy(a).to(x.device) for a in (kron, rgb2ycc, ycc2rgb))
        v = x.double() * 255
    else:
        v = np.asarray(x, np.float64) * 255
    tables = quant_tables(quality, xp=xp)
    plain = k == 1 and h % 16 == 0 and w % 16 == 0  # the image is the codec's grid: no resampling
    src = v
    if not plain:
        v = _up(_up(v, up_h, -2, xp), up_w, -1, xp)
    if c == 1:
        out = (_quantise(v[:, 0] - 128, tables[:, 0], kron, xp) + 128)[:, None]
    else:
        ycc = _einsum(xp, "dc,bcpq->bdpq", rgb2ycc, v)
        y = _quantise(ycc[:, 0] - 128, tables[:, 0], kron, xp) + 128
        chroma = _down(_down(ycc[:, 1:], ph // 2, 2, -2), pw // 2, 2, -1)  # 4:2:0; centred at 0 (no +128)
        cb = _quantise(chroma[:, 0], tables[:, 1], kron, xp)
        cr = _quantise(chroma[:, 1], tables[:, 1], kron, xp)
        chroma = _up(_up(xp.stack([cb, cr], 1), cu_h, -2, xp), cu_w, -1, xp)
        ycc = xp.concatenate([y[:, None], chroma], 1) if xp is np else torch.cat([y[:, None], chroma], 1)
        out = _einsum(xp, "dc,bcpq->bdpq", ycc2rgb, ycc)
    out = xp.clip(out, 0, 255) if xp is np else out.clamp(0, 255)
    if not plain:
        # the codec's error on the fine grid, brought back down: the bilinear-up / box-down round trip is a
        # slight blur of its own, which the image must not get (without the codec the result is the image)
        out = src + _down(_down(out - v, h, k, -2), w, k, -1)
    out = out / 255
    if xp is np:
        return np.clip(out, 0, 1).astype(np.float32)
    return out.clamp_(0, 1).to(x.dtype)


class Jpeg(Perturbation):
    """JPEG compression artifacts (video frames stored or streamed as JPEG / MJPEG): 8x8 blocking, ringing at
    edges, chroma bleeding from 4:2:0 subsampling, lost fine texture.

    Params: ``quality`` (B,) the integer libjpeg quality. Severity -> quality (1: 55-70, 2: 40-55, 3: 28-40,
    4: 18-28, 5: 8-18; ImageNet-C's JPEG severities are qualities 25, 18, 15, 10, 7). Compressed on a grid
    ``round(512 / shorter side)`` times finer than the image, so the severities mean the same at any size
    (module doc); at 512 px it matches ``cv2.imencode`` + ``cv2.imdecode`` to about a grey level.

    Example:
        >>> import numpy as np
        >>> img = np.random.default_rng(0).integers(0, 256, (128, 96, 3)).astype(np.uint8)
        >>> out, p = Jpeg(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> out.shape, bool(np.abs(out.astype(int) - img).mean() > 5)
        ((128, 96, 3), True)
    """

    name = "jpeg"
    rgb = False
    QUALITY = {1: (55, 70), 2: (40, 55), 3: (28, 40), 4: (18, 28), 5: (8, 18)}
    PARAM_KEYS = ("quality",)

    def _draw(self, r, b):
        lo, hi = self.QUALITY[self.severity]
        return {"quality": r.integers(lo, hi + 1, (b,))}

    def _apply_torch(self, images, masks, params):
        return jpeg_codec(images, params["quality"])

    def _apply_np(self, image, mask, params):
        x = np.ascontiguousarray(to_float01(image).transpose(2, 0, 1))[None]
        out = jpeg_codec(x, np.asarray(params["quality"]).reshape(1), xp=np)[0].transpose(1, 2, 0)
        return from_float01(np.ascontiguousarray(out), image.dtype)


__all__ = ["Jpeg", "jpeg_codec", "quant_tables", "dct_matrix"]
