"""Motion family (paper 000, MR2-1): Gaussian ``blur`` with sensor noise, and directional ``motion_blur``.

Torch path: per-sample kernels. Small kernels run as grouped convolutions (separable for the Gaussian);
kernels wider than 15 px go through an FFT of the reflect-padded batch, whose cost does not grow with
sigma. Border handling is reflect-101 everywhere, which is OpenCV's default, so both paths agree.
"""

from __future__ import annotations

import math
from functools import lru_cache

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from .base import REF_SIDE, Perturbation, host_params, params_to, short_side

FFT_ABOVE = 15  # kernel width from which the FFT (cost independent of sigma) beats grouped convolution on CPU


def _good_fft_size(n: int) -> int:
    """Smallest m >= n whose only prime factors are 2, 3, 5 (fast FFT lengths)."""
    while True:
        m = n
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        if m == 1:
            return n
        n += 1


def reflect_pad(x: torch.Tensor, left: int, right: int, top: int, bottom: int) -> torch.Tensor:
    """``F.pad(..., mode="reflect")`` (OpenCV's BORDER_REFLECT_101) for pads of any size.

    torch's reflect padding refuses pads >= the image side; OpenCV keeps reflecting, so a large
    blur kernel on a small image must too for the two paths to agree.
    """
    h, w = x.shape[-2:]
    if left < w and right < w and top < h and bottom < h:
        return F.pad(x, (left, right, top, bottom), mode="reflect")
    return x.index_select(-2, _reflect_index(h, top, bottom, x.device)).index_select(
        -1, _reflect_index(w, left, right, x.device)
    )


def _reflect_index(n: int, before: int, after: int, device: torch.device) -> torch.Tensor:
    i = torch.arange(-before, n + after, device=device)
    if n == 1:
        return torch.zeros_like(i)
    period = 2 * (n - 1)
    j = i.remainder(period)
    return torch.where(j >= n, period - j, j)


def fft_filter(images: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """Filter each image with its own point-symmetric (K,K) kernel (kernels: (B,K,K)), reflect-101 border."""
    b, c, h, w = images.shape
    k = kernels.shape[-1]
    r = k // 2
    x = reflect_pad(images, r, r, r, r)
    fh, fw = _good_fft_size(h + 2 * r), _good_fft_size(w + 2 * r)
    kpad = images.new_zeros(b, fh, fw)
    kpad[:, :k, :k] = kernels.to(images.dtype)
    # Centre the kernel on index 0 so the circular convolution is the usual "same" filter.
    kpad = torch.roll(kpad, shifts=(-r, -r), dims=(1, 2))
    spec = torch.fft.rfft2(x, s=(fh, fw)) * torch.fft.rfft2(kpad)[:, None]
    y = torch.fft.irfft2(spec, s=(fh, fw))
    return y[:, :, r : r + h, r : r + w]


def _cpu_planes(images: torch.Tensor) -> bool:
    """True when OpenCV can filter ``images`` plane by plane in place of the torch kernels.

    On CPU, ``cv2.sepFilter2D`` / ``cv2.filter2D`` on float32 planes (zero-copy views of the tensor,
    written into one preallocated output) are exact float filters like the torch ones and several
    times faster than grouped convolution or the FFT; autograd is not needed for perturbations.
    """
    return images.device.type == "cpu" and images.dtype == torch.float32 and not images.requires_grad


def _support(k1d: np.ndarray) -> np.ndarray:
    """Trim a centred, zero-padded odd 1-D kernel to its nonzero support (still centred, odd)."""
    r = len(k1d) // 2
    nz = np.flatnonzero(k1d)
    a = int(max(r - nz[0], nz[-1] - r)) if len(nz) else 0
    return k1d[r - a : r + a + 1]


def _opencv_planes(images: torch.Tensor, kernels: torch.Tensor, prepare, filter_plane) -> torch.Tensor:
    """Run ``filter_plane(src, kernel, dst)`` on every (image, channel) plane of a CPU float32 batch,
    reading the tensor without a copy and writing into one preallocated output; ``prepare`` trims
    each sample's kernel once (a small kernel then costs less than the batch maximum)."""
    b, c, h, w = images.shape
    # tensor <-> numpy conversions cost ops (reads of the tensor): one per input, the output made in numpy
    x = (images.detach() if images.requires_grad else images).contiguous().numpy()
    o = np.empty((b, c, h, w), dtype=np.float32)
    out = torch.from_numpy(o)
    if kernels.requires_grad or kernels.device.type != "cpu" or kernels.dtype != torch.float32:
        kernels = kernels.detach().cpu().to(torch.float32)
    ks = kernels.numpy()
    for i in range(b):
        k = prepare(ks[i])
        for j in range(c):
            filter_plane(x[i, j], k, o[i, j])
    return out


def separable_filter_cpu(images: torch.Tensor, k1d: torch.Tensor) -> torch.Tensor:
    """:func:`separable_filter` with OpenCV on CPU float32: one ``sepFilter2D`` per plane."""
    return _opencv_planes(
        images,
        k1d,
        _support,
        lambda src, g, dst: cv2.sepFilter2D(
            src, cv2.CV_32F, g, g, dst=dst, borderType=cv2.BORDER_REFLECT_101
        ),
    )


def crop_kernel(k: np.ndarray) -> np.ndarray:
    """Crop a centred, point-symmetric (K,K) kernel to its nonzero bounding box (still centred).

    A motion-blur line fills only a thin band of its square, and ``cv2.filter2D`` costs (and switches to
    its DFT path) by kernel area, so the crop is several times faster and gives the same result.
    """
    r = k.shape[0] // 2
    ys, xs = np.nonzero(k)
    if len(ys) == 0:
        return k
    a, b = int(np.abs(ys - r).max()), int(np.abs(xs - r).max())
    return np.ascontiguousarray(k[r - a : r + a + 1, r - b : r + b + 1])


DIRECT_AREA = 130  # cv2.filter2D filters float kernels of at least this many taps through a DFT (slow here)


def kernel_pieces(k: np.ndarray) -> list[tuple[np.ndarray, int, int]]:
    """Split a centred kernel into pieces whose nonzero bounding boxes stay under :data:`DIRECT_AREA`
    taps: ``[(piece, dy, dx)]`` with (dy, dx) the offset of the piece's top-left from the centre.

    A diagonal motion line fills a thin band of its square: as one 13x13 kernel OpenCV takes its DFT
    path (~8 ms per 512-px plane), as two ~7x7 pieces two direct passes (~1.5 ms), same result.
    """
    r0, c0 = k.shape[0] // 2, k.shape[1] // 2
    out: list[tuple[np.ndarray, int, int]] = []

    def split(i0: int, i1: int, j0: int, j1: int) -> None:
        ys, xs = np.nonzero(k[i0:i1, j0:j1])
        if len(ys) == 0:
            return
        i0, i1, j0, j1 = (
            i0 + int(ys.min()),
            i0 + int(ys.max()) + 1,
            j0 + int(xs.min()),
            j0 + int(xs.max()) + 1,
        )
        if (i1 - i0) * (j1 - j0) < DIRECT_AREA:
            out.append((np.ascontiguousarray(k[i0:i1, j0:j1], np.float32), i0 - r0, j0 - c0))
        elif i1 - i0 >= j1 - j0:
            split(i0, (i0 + i1) // 2, j0, j1)
            split((i0 + i1) // 2, i1, j0, j1)
        else:
            split(i0, i1, j0, (j0 + j1) // 2)
            split(i0, i1, (j0 + j1) // 2, j1)

    split(0, k.shape[0], 0, k.shape[1])
    return out


def filter2d_pieces(src: np.ndarray, k: np.ndarray, dst: np.ndarray | None = None) -> np.ndarray:
    """``cv2.filter2D(src, CV_32F, k)`` with reflect-101 borders, through :func:`kernel_pieces` when the
    kernel is large enough for OpenCV's DFT path; float32 result (in ``dst`` when given)."""
    k = np.ascontiguousarray(k, np.float32)
    if k.shape[0] * k.shape[1] < DIRECT_AREA:
        return cv2.filter2D(src, cv2.CV_32F, k, dst=dst, borderType=cv2.BORDER_REFLECT_101)
    h, w = src.shape[:2]
    r0, c0 = k.shape[0] // 2, k.shape[1] // 2
    pad = cv2.copyMakeBorder(src, r0, r0, c0, c0, cv2.BORDER_REFLECT_101)
    acc = None
    for piece, dy, dx in kernel_pieces(k):
        ph, pw = piece.shape
        view = pad[r0 + dy : r0 + dy + h + ph - 1, c0 + dx : c0 + dx + w + pw - 1]
        # anchor (0, 0): out[y, x] = sum piece[i, j] * view[y + i, x + j], the top-left h x w is exact
        part = cv2.filter2D(view, cv2.CV_32F, piece, anchor=(0, 0), borderType=cv2.BORDER_CONSTANT)[:h, :w]
        if acc is None:
            if dst is None:
                acc = np.ascontiguousarray(part)
            else:
                np.copyto(dst, part)
                acc = dst
        else:
            cv2.add(acc, part, dst=acc)
    if acc is None:  # an all-zero kernel
        if dst is None:
            acc = np.zeros(src.shape, np.float32)
        else:
            dst.fill(0)
            acc = dst
    return acc


def filter2d_cpu(images: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """Per-sample point-symmetric (K,K) kernels on CPU float32 with OpenCV, per plane
    (:func:`filter2d_pieces`)."""
    return _opencv_planes(images, kernels, crop_kernel, lambda src, k, dst: filter2d_pieces(src, k, dst))


def separable_filter(images: torch.Tensor, k1d: torch.Tensor) -> torch.Tensor:
    """Filter each image with its own symmetric 1-D kernel along both axes (k1d: (B,K)), reflect-101."""
    if _cpu_planes(images):
        return separable_filter_cpu(images, k1d)
    b, c, h, w = images.shape
    k = k1d.shape[-1]
    r = k // 2
    wgt = k1d.to(images.dtype).repeat_interleave(c, 0)  # (B*C, K): one group per image channel
    x = reflect_pad(images.reshape(1, b * c, h, w), r, r, 0, 0)
    x = F.conv2d(x, wgt[:, None, None, :], groups=b * c)
    x = reflect_pad(x, 0, 0, r, r)
    x = F.conv2d(x, wgt[:, None, :, None], groups=b * c)
    return x.reshape(b, c, h, w)


PIXEL_VAR = 1 / 12  # variance (px^2) of a pixel's own footprint, a unit box


def gaussian_ksize(sigma_px):
    """Odd support of :func:`gaussian_kernel_1d`: 3 standard deviations each side."""
    if isinstance(sigma_px, torch.Tensor):
        return 2 * torch.ceil(3 * torch.sqrt(sigma_px.double() ** 2 + PIXEL_VAR)).long() + 1
    return 2 * int(math.ceil(3 * math.sqrt(float(sigma_px) ** 2 + PIXEL_VAR))) + 1


_BASIS: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _kernel_basis(kmax: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sigma-independent parts of :func:`gaussian_kernel_1d` (torch) for ``kmax``: ``cos(th) - 1``
    (1,M), the cosine basis (M,K) and ``|n|`` (1,K), made once per size and device by the same ops as
    before (the same values), instead of ~10 ops every call."""
    key = (kmax, device)
    if key not in _BASIS:
        r, m = kmax // 2, max(64, 4 * kmax)
        th = torch.arange(m, device=device, dtype=torch.float64) * (2 * math.pi / m)
        n = torch.arange(-r, r + 1, device=device, dtype=torch.float64)
        _BASIS[key] = (torch.cos(th)[None] - 1, torch.cos(n[:, None] * th[None]).T, n[None].abs())
    return _BASIS[key]


def gaussian_kernel_1d(sigma, ksize, kmax: int, xp=torch):
    """(B,kmax) discrete Gaussian weights of variance ``sigma**2 + 1/12`` px^2, truncated to each sample's
    odd ``ksize`` and normalised.

    The *discrete* Gaussian ``T(n, t) = exp(-t) I_n(t)`` (Lindeberg) has exactly the variance ``t`` even
    for sub-pixel sigma, where a point-sampled Gaussian degenerates to the identity; the extra 1/12 is
    the pixel's own footprint. Both make a blur of sigma at 512 px and of sigma/4 at 128 px look alike
    once downsized (measured in ``tests/test_perturbations_calibration.py``). Computed from its
    integral form ``(1/2pi) int exp(t (cos th - 1)) cos(n th) dth`` on ``M`` points (exact up to
    ``T(n + M)``), the same float64 formula on both paths and on any device.
    """
    r = kmax // 2
    m = max(64, 4 * kmax)
    if xp is torch:
        cos_th1, basis, n_abs = _kernel_basis(kmax, sigma.device)
        t = sigma.double()[:, None] ** 2 + PIXEL_VAR
        spec = torch.exp(t * cos_th1)  # (B,M)
        g = spec @ basis / m  # (B,K)
        g = g.clamp_min(0) * (n_abs <= (ksize[:, None] // 2)).double()
        g = 0.5 * (g + g.flip(1))  # exactly symmetric (OpenCV's fast path for symmetric kernels needs it)
        return (g / g.sum(1, keepdim=True)).float()
    th = np.arange(m, dtype=np.float64) * (2 * math.pi / m)
    n = np.arange(-r, r + 1, dtype=np.float64)
    t = np.asarray(sigma, np.float64)[:, None] ** 2 + PIXEL_VAR
    g = np.exp(t * (np.cos(th)[None] - 1)) @ np.cos(n[:, None] * th[None]).T / m
    g = np.maximum(g, 0) * (np.abs(n[None]) <= (np.asarray(ksize)[:, None] // 2))
    g = 0.5 * (g + g[:, ::-1])
    return g / g.sum(1, keepdims=True)


@lru_cache(maxsize=1)
def _noise_texture() -> np.ndarray:
    # A fixed 256x256x3 standard-normal field at the reference resolution (1 texel = 1/512 of the shorter
    # side); a sample's noise is this field, tiled, shifted by ``noise_offset`` and scaled by ``noise``.
    return np.random.default_rng(20240517).standard_normal((256, 256, 3)).astype(np.float32)


NOISE_PERIOD = 256  # texture period in reference pixels
NOISE_STEPS = 64  # offsets are in 1/64 of the period: whole pixels at 128, 256 and 512 px


def noise_period(h: int, w: int) -> int:
    """Period (px) of the noise texture on an HxW image: 256 reference px scaled to the image."""
    return max(1, int(round(NOISE_PERIOD * short_side(h, w) / REF_SIDE)))


@lru_cache(maxsize=8)
def texture_at(p: int) -> np.ndarray:
    """The reference texture resampled to period ``p`` px: on a smaller image each pixel is the *mean*
    of the reference texels it covers (area resampling), so the noise is what a 512-px noisy frame
    shows once downsized — the visible grain, not the per-pixel std, is the same at every size."""
    t = _noise_texture()
    if p == NOISE_PERIOD:
        return t
    big = np.tile(t, (3, 3, 1))  # resample a 3x3 tiling and keep the centre: the result stays periodic
    interp = cv2.INTER_AREA if p < NOISE_PERIOD else cv2.INTER_LINEAR
    return np.ascontiguousarray(cv2.resize(big, (3 * p, 3 * p), interpolation=interp)[p : 2 * p, p : 2 * p])


def _shift(offset, p: int):
    """Texture shift (px) of a ``noise_offset`` in 1/64 periods, on a texture of period ``p``."""
    return (offset * p + NOISE_STEPS // 2) // NOISE_STEPS % p


@lru_cache(maxsize=16)
def _noise_tiles_u8(level: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Positive and negative parts of ``round(level * texture)`` tiled to (h+p, w+p, 3) uint8."""
    p = noise_period(h, w)
    t = np.rint(level * texture_at(p))
    reps = (math.ceil(h / p) + 1, math.ceil(w / p) + 1, 1)
    big = np.tile(t, reps)[: h + p, : w + p]
    return np.clip(big, 0, 255).astype(np.uint8), np.clip(-big, 0, 255).astype(np.uint8)


_TEXTURE_ON: dict[tuple[torch.device, int], torch.Tensor] = {}


def _texture_on(device: torch.device, p: int) -> torch.Tensor:
    if (device, p) not in _TEXTURE_ON:
        _TEXTURE_ON[(device, p)] = torch.from_numpy(texture_at(p)).permute(2, 0, 1).contiguous().to(device)
    return _TEXTURE_ON[(device, p)]


@lru_cache(maxsize=8)
def _noise_tile_np(level: int, h: int, w: int) -> np.ndarray:
    """:func:`_noise_tile_torch` as a numpy array (read once per tile, not once per image)."""
    return _noise_tile_torch(level, h, w).numpy()


@lru_cache(maxsize=8)
def _noise_tile_torch(level: int, h: int, w: int) -> torch.Tensor:
    """``round(level * texture) / 255`` tiled to (3, h+p, w+p) float32 on CPU: a sample's noise is a
    view of it at its offset, the very values the gather below produces."""
    p = noise_period(h, w)
    t = torch.round(level * torch.from_numpy(texture_at(p)).permute(2, 0, 1)) / 255.0
    reps = (1, math.ceil(h / p) + 1, math.ceil(w / p) + 1)
    return t.repeat(*reps)[:, : h + p, : w + p].contiguous()


def noise_index(offset: torch.Tensor, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's texture rows (B,H) and columns (B,W) for its (B,2) ``offset``, on the offset's device."""
    p = noise_period(h, w)
    sh = _shift(offset.long(), p)
    iy = (torch.arange(h, device=offset.device)[None] + sh[:, :1]) % p
    ix = (torch.arange(w, device=offset.device)[None] + sh[:, 1:]) % p
    return iy, ix


def add_noise_torch(
    x: torch.Tensor,
    level: torch.Tensor,
    offset: torch.Tensor,
    index: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """x + round(level * shifted texture)/255, clamped to [0,1], in place on ``x``; ``index``: the
    :func:`noise_index` of ``offset`` made already (on ``x``'s device)."""
    b, c, h, w = x.shape
    p = noise_period(h, w)
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous() and not x.requires_grad:
        # On CPU reading the params costs nothing: add a view of a cached tile per sample instead of
        # gathering a full-size noise batch (several times faster, same values).
        # numpy ufuncs per sample (single-threaded, cache-hot) rather than a parallel torch op per
        # sample: on a busy CPU each parallel region waits for a second core.
        xn = x.numpy()
        for i, (lv, (oy, ox)) in enumerate(zip(level.tolist(), offset.tolist())):
            if lv > 0:
                oy, ox = _shift(int(oy), p), _shift(int(ox), p)
                np.add(xn[i], _noise_tile_np(int(lv), h, w)[:c, oy : oy + h, ox : ox + w], out=xn[i])
            np.clip(xn[i], 0.0, 1.0, out=xn[i])
        return x
    tex = _texture_on(x.device, p)[:c]
    iy, ix = noise_index(offset, h, w) if index is None else index
    n = tex[:, iy[:, :, None], ix[:, None, :]].permute(1, 0, 2, 3)  # (B,C,H,W)
    n = torch.round(level.to(x.dtype)[:, None, None, None] * n) / 255.0
    return x.add_(n).clamp_(0.0, 1.0)


def add_noise_np(img: np.ndarray, level: int, offset: np.ndarray, inplace: bool = False) -> np.ndarray:
    """``img`` plus the sample's noise; ``inplace=True`` writes into ``img`` (a fresh filter output)."""
    if level <= 0:
        return img
    h, w, c = img.shape
    p = noise_period(h, w)
    oy, ox = _shift(int(offset[0]), p), _shift(int(offset[1]), p)
    pos, neg = _noise_tiles_u8(int(level), h, w)
    pos, neg = pos[oy : oy + h, ox : ox + w, :c], neg[oy : oy + h, ox : ox + w, :c]
    if img.dtype == np.uint8:
        # pos and neg never overlap, so two saturating passes equal clip(x + noise).
        if inplace and img.flags.c_contiguous:
            cv2.add(img, pos, dst=img)
            return cv2.subtract(img, neg, dst=img)
        return cv2.subtract(cv2.add(img, pos), neg)
    out = img + (pos.astype(np.float32) - neg.astype(np.float32)) * np.float32(1 / 255)
    return np.clip(out, 0.0, 1.0, out=out)


class Blur(Perturbation):
    """Gaussian blur with sensor noise (MR2-1): ``x' = x * G(sigma) + n``.

    Params: ``sigma_rel`` (B,) the Gaussian's std as a fraction of the shorter side; ``noise`` (B,) the
    noise std in grey levels *at the reference resolution* (0..severity); ``noise_offset`` (B,2) the
    texture shift in 1/64 periods. Severity -> sigma (1: 0.5-1.5, 2: 1.5-3, 3: 3-5, 4: 5-8, 5: 8-15 px
    on a 512-px image, the paper's (0, 15]; i.e. 1/1024-3/1024 .. 8/512-15/512 of the shorter side).
    The noise is a fixed texture defined at the 512-px resolution and area-resampled to the image
    (see :func:`texture_at`): on a 128-px image it is the grain a 512-px noisy frame has once downsized.
    The kernel is the discrete Gaussian of variance sigma^2 + 1/12 px^2 (:func:`gaussian_kernel_1d`).
    The paper draws odd kernel sizes between sigma/3 and sigma/2, which truncates the Gaussian into a
    box; we keep the proper Gaussian for realism.

    ``fast=True`` (numpy path only, for sigma > 3 px) blurs on a half/quarter-resolution pyramid level
    (pyrDown -> Gaussian -> pyrUp): several times faster at large sigma with a mean error of a fraction of a
    grey level; parity with the torch path is only guaranteed with ``fast=False``.
    Torch kernels on an accelerator are sized for the severity's largest sigma: replay params with this
    severity or lower there.

    Example:
        >>> import numpy as np
        >>> img = np.zeros((32, 32, 3), np.uint8); img[:, 16:] = 255
        >>> out, p = Blur(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> 0 < int(out[16, 16, 0]) < 255, sorted(p)
        (True, ['noise', 'noise_offset', 'sigma_rel'])
    """

    name = "blur"
    rgb = False
    SIGMA = {1: (0.5, 1.5), 2: (1.5, 3.0), 3: (3.0, 5.0), 4: (5.0, 8.0), 5: (8.0, 15.0)}  # px at REF_SIDE
    PARAM_KEYS = ("sigma_rel", "noise", "noise_offset")

    def __init__(self, severity: int = 3, fast: bool = False, noise: bool = True):
        super().__init__(severity)
        self.fast, self.noise = bool(fast), bool(noise)

    def _draw(self, r, b):
        lo, hi = self.SIGMA[self.severity]
        sigma = r.uniform(lo / REF_SIDE, hi / REF_SIDE, (b,))
        level = r.integers(0, self.severity + 1, (b,)) * (1 if self.noise else 0)
        return {"sigma_rel": sigma, "noise": level, "noise_offset": r.integers(0, NOISE_STEPS, (b, 2))}

    def _draw_at(self, r, sev):
        b = sev.numel()
        sigma = r.uniform_at(_SIGMA_REL, sev, (b,))
        level = r.integers_upto(sev, (b,)) * (1 if self.noise else 0)
        return {"sigma_rel": sigma, "noise": level, "noise_offset": r.integers(0, NOISE_STEPS, (b, 2))}

    def _apply_torch(self, images, masks, params):
        h, w = images.shape[-2:]
        s = short_side(h, w)
        host = host_params(params) if images.device.type != "cpu" else None
        # params moved from the host: the kernels and noise indices made there (the CPU's kernel widths, no
        # read back), then moved in one copy per dtype, instead of ~40 launches of tiny maths on the device
        sigma = (params if host is None else host)["sigma_rel"].float() * s
        hi = float(sigma.max()) if sigma.device.type == "cpu" else self.SIGMA[self.severity][1] / REF_SIDE * s
        kmax = gaussian_ksize(hi)
        k1 = gaussian_kernel_1d(sigma, gaussian_ksize(sigma), kmax)
        index = None
        if host is not None:
            iy, ix = noise_index(host["noise_offset"], h, w)
            t = params_to({"k1": k1, "iy": iy, "ix": ix}, images.device)
            k1, index = t["k1"], (t["iy"], t["ix"])
        if kmax > FFT_ABOVE and not _cpu_planes(images):
            out = fft_filter(images, k1[:, :, None] * k1[:, None, :])
        else:
            out = separable_filter(images, k1)
        out = out.contiguous()
        return add_noise_torch(out, params["noise"], params["noise_offset"], index)

    def _apply_np(self, image, mask, params):
        sigma = float(params["sigma_rel"]) * short_side(*image.shape[:2])
        if self.fast and sigma > 3.0:
            out = _pyramid_blur(image, sigma)
        else:
            # sepFilter2D with a float kernel: exact to 0.5 grey level (GaussianBlur's 8-bit fixed-point
            # path is off by up to ~1.6) and faster at large sigma.
            k = gaussian_ksize(sigma)
            g = _support(gaussian_kernel_1d(np.float64([sigma]), np.int64([k]), k, xp=np)[0])[:, None]
            out = cv2.sepFilter2D(image, -1, g, g, borderType=cv2.BORDER_REFLECT_101)
        if out.ndim == 2:
            out = out[:, :, None]
        return add_noise_np(out, int(params["noise"]), params["noise_offset"], inplace=out is not image)


_SIGMA_REL = {s: (lo / REF_SIDE, hi / REF_SIDE) for s, (lo, hi) in Blur.SIGMA.items()}


def _pyramid_blur(image: np.ndarray, sigma: float) -> np.ndarray:
    """Approximate Gaussian blur for large sigma: pyrDown n times, blur the small image, pyrUp back.

    Each pyrDown/pyrUp pair is itself a blur of about 1 px (at full resolution, per level), so the small
    image is blurred with the remaining variance, rescaled to its resolution.
    """
    levels = 2 if sigma > 8 else 1
    h, w = image.shape[:2]
    small = image
    sizes = []
    for _ in range(levels):
        sizes.append((small.shape[1], small.shape[0]))
        small = cv2.pyrDown(small)
    # The [1 4 6 4 1]/16 pyramid kernel has variance 1 at its own level, i.e. 4**i at full resolution for
    # level i; down and up each add sum_i 4**i = (4**n - 1)/3.
    rest = max(sigma**2 - 2 * (4**levels - 1) / 3, 0.25)
    s = math.sqrt(rest) / (2**levels)
    ks = 2 * math.ceil(3 * s) + 1
    g = cv2.getGaussianKernel(ks, s)
    small = cv2.sepFilter2D(small, -1, g, g, borderType=cv2.BORDER_REFLECT_101)
    for size in reversed(sizes):
        small = cv2.pyrUp(small, dstsize=size)
    return small


def motion_kernel(length, angle, kmax: int, xp=torch):
    """(B,kmax,kmax) pixel-integrated line kernels, normalised.

    The continuous scene (pixels as unit boxes) is smeared along a centred segment of ``length`` px at
    ``angle`` radians and re-integrated over the pixels: the weight at offset (dy, dx) is the mean over
    the segment of ``tri(dx - t cos a) * tri(dy - t sin a)`` (``tri(u) = max(0, 1 - |u|)``), taken at
    ``max(64, 2 * kmax)`` midpoints. The identity for length -> 0, so a 1-px streak at 512 px stays a quarter-pixel
    one at 128 px; point-symmetric, so filtering and convolution coincide.
    """
    r = kmax // 2
    n = max(64, 2 * kmax)  # sub-pixel steps; the same for both paths up to 32-px kernels
    if xp is torch:
        ax = torch.arange(-r, r + 1, device=length.device, dtype=torch.float32)
        f = (torch.arange(n, device=length.device, dtype=torch.float32) + 0.5) / n - 0.5  # (N,)
        t = length.float()[:, None] * f[None]  # (B,N)
        c, s = torch.cos(angle.float())[:, None], torch.sin(angle.float())[:, None]
        wx = (1 - (ax[None, None, :] - (t * c)[:, :, None]).abs()).clamp_min(0)  # (B,N,K)
        wy = (1 - (ax[None, None, :] - (t * s)[:, :, None]).abs()).clamp_min(0)
        k = torch.einsum("bny,bnx->byx", wy, wx)
        return k / k.sum((1, 2), keepdim=True)
    # numpy path (ax_np, f_np: the torch branch above binds ax, f to tensors)
    ax_np = np.arange(-r, r + 1, dtype=np.float32)
    f_np = (np.arange(n, dtype=np.float32) + np.float32(0.5)) / np.float32(n) - np.float32(0.5)
    length, angle = np.asarray(length, np.float32), np.asarray(angle, np.float32)
    t = length[:, None] * f_np[None]
    c, s = np.cos(angle)[:, None], np.sin(angle)[:, None]
    wx = np.clip(1 - np.abs(ax_np[None, None, :] - (t * c)[:, :, None]), 0, None)
    wy = np.clip(1 - np.abs(ax_np[None, None, :] - (t * s)[:, :, None]), 0, None)
    k = np.einsum("bny,bnx->byx", wy, wx)
    return k / k.sum((1, 2), keepdims=True)


class MotionBlur(Perturbation):
    """Directional motion blur (camera or tissue moving during exposure): a line kernel.

    Params: ``length_rel`` (B,) the line's length as a fraction of the shorter side, ``angle`` (B,)
    radians. Severity -> length (1: 3-7, 2: 7-12, 3: 12-18, 4: 18-26, 5: 26-36 px on a 512-px image),
    angle uniform in [0, pi).

    Example:
        >>> import numpy as np
        >>> img = np.zeros((64, 64, 3), np.uint8); img[32, 32] = 255
        >>> out, p = MotionBlur(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> int(out[32, 32, 0]) < 255 and int(out.sum()) > 0
        True
    """

    name = "motion_blur"
    rgb = False
    LENGTH = {
        1: (3.0, 7.0),
        2: (7.0, 12.0),
        3: (12.0, 18.0),
        4: (18.0, 26.0),
        5: (26.0, 36.0),
    }  # px at REF_SIDE
    PARAM_KEYS = ("length_rel", "angle")

    def _draw(self, r, b):
        lo, hi = self.LENGTH[self.severity]
        return {
            "length_rel": r.uniform(lo / REF_SIDE, hi / REF_SIDE, (b,)),
            "angle": r.uniform(0.0, math.pi, (b,)),
        }

    @staticmethod
    def _kmax(length_px: float) -> int:
        return 2 * math.ceil(length_px / 2) + 3

    def _apply_torch(self, images, masks, params):
        s = short_side(*images.shape[-2:])
        length = params["length_rel"].float() * s
        hi = (
            float(length.max())
            if length.device.type == "cpu"
            else self.LENGTH[self.severity][1] / REF_SIDE * s
        )
        k = motion_kernel(length, params["angle"], self._kmax(hi))
        return kernel_filter(images, k)

    def _apply_np(self, image, mask, params):
        length = float(params["length_rel"]) * short_side(*image.shape[:2])
        k = motion_kernel(np.float32([length]), params["angle"][None], self._kmax(length), xp=np)[0]
        return kernel_filter_np(image, k)


def kernel_filter(images: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Filter each image of a (B,C,H,W) batch with its own centred, point-symmetric (K,K) kernel (k: (B,K,K)),
    reflect-101 borders, clamped to [0,1]: OpenCV planes on CPU, grouped convolution for small kernels and an
    FFT for large ones elsewhere (the batch's kernels share one size, so no per-image loop on an accelerator)."""
    kmax = k.shape[-1]
    if _cpu_planes(images):
        return filter2d_cpu(images, k).clamp_(0.0, 1.0)
    if kmax > FFT_ABOVE:
        return fft_filter(images, k).clamp_(0.0, 1.0).contiguous()
    b, c, h, w = images.shape
    r = kmax // 2
    x = reflect_pad(images.reshape(1, b * c, h, w), r, r, r, r)
    wgt = k.to(images.dtype).repeat_interleave(c, 0)[:, None]
    return F.conv2d(x, wgt, groups=b * c).reshape(b, c, h, w).clamp_(0.0, 1.0)


def kernel_filter_np(image: np.ndarray, k: np.ndarray) -> np.ndarray:
    """:func:`kernel_filter` on one HWC uint8 / float32 image (same dtype and shape back)."""
    k = crop_kernel(np.asarray(k, np.float32))
    if k.shape[0] * k.shape[1] < DIRECT_AREA:
        out = cv2.filter2D(image, -1, k, borderType=cv2.BORDER_REFLECT_101)
    else:  # large kernels: float planes, direct pieces instead of OpenCV's (slow) DFT path
        planes = [
            filter2d_pieces(np.ascontiguousarray(image[:, :, c], np.float32), k)
            for c in range(image.shape[2])
        ]
        out = cv2.merge(planes) if len(planes) > 1 else planes[0]
        out = cv2.convertScaleAbs(out) if image.dtype == np.uint8 else out  # rounds, saturates
    if out.ndim == 2:
        out = out[:, :, None]
    if out.dtype != np.uint8:
        np.clip(out, 0, 1, out=out)
    return out
