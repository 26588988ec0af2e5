"""Specular highlights (paper 000, MR1-4): soft elliptical white spots clustered around a few centres.

A spot is the ellipse ``(u/a)^2 + (v/b)^2 = d^2`` (rotated by ``angle``): fully white for ``d <= 0.55``,
then a Gaussian fall-off (the paper Gaussian-blurs hard ellipses; an analytic fall-off gives the same
look without a full-image blur) that reaches exactly 0 at ``d = 1.45``. Its opacity ``strength`` is the
"gray mask": the local brightness relative to 0.45, clipped to [0.35, 1], so spots in dark regions are
dimmer. Semi-axes are at most ``lambda * side`` (side = the shorter image side; severity 1..5:
lambda = 0.03, 0.035, 0.04, 0.05, 0.06; 3-5 .. 8-14 spots; severity 1 was raised from 0.02 / 2-4
spots, which changed under 0.1 % of the pixels, see docs/perturbations.md).

Spots sit on free cells (inside the field of view, away from the lesion: a spot's centre and the corners
of its bounding box must be free; the field of view is convex) and only their windows are touched: the numpy path blends inside the spots' bounding box only. Opacity is area-sampled on an
n x n sub-pixel grid (:func:`~robusttrain.perturbations.base.supersampling`), so a spot looks the same
at 128 px as the 512-px spot does downsized.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .base import Perturbation, TorchRandom, cast, f32, rel_to_px, severity_values, short_side, supersampling
from .placement import (
    PlacedSampling,
    cell_index_yx,
    erode_cells_np,
    erode_cells_rows,
    gather_cells_np,
    maps_torch,
    pick_cells,
    pick_cells_np,
    window_offsets,
)

CORE, EDGE, REACH = 0.55, 0.30, 1.45
_G_REACH = math.exp(-0.5 * ((REACH - CORE) / EDGE) ** 2)
# A spot's probe points: its centre and the four corners of its bounding box, (y, x) steps of one reach
_PROBE_YX = [[0.0, 0.0], [-1.0, -1.0], [-1.0, 1.0], [1.0, -1.0], [1.0, 1.0]]
_PROBES: dict[tuple[int, int, int, int, int, torch.device], dict[str, torch.Tensor]] = {}


def _probe_consts(h: int, w: int, hc: int, wc: int, s: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The probe placement's constants on ``device`` (made once per image size, grid, spot count, device):
    probe steps (1,5,1,2), the last pixel per axis, (1,S) spot numbers and the image size (y, x)."""
    key = (h, w, hc, wc, 0, device)
    if key not in _PROBES:
        _PROBES[key] = {
            "probe": torch.tensor(_PROBE_YX, device=device).view(1, 5, 1, 2),
            "last_px": torch.tensor([h - 1, w - 1], dtype=torch.float32, device=device),
            "hw": torch.tensor([h, w], dtype=torch.float32, device=device),
        }
    spots = (0, 0, 0, 0, s, device)
    if spots not in _PROBES:
        _PROBES[spots] = {"arange": torch.arange(s, device=device)[None]}
    return {**_PROBES[key], **_PROBES[spots]}


# Sub-pixel grid cap: 2 x 2 samples per pixel keep a 128-px image within 0.05 of the downsized 512-px
# rendering (tests/test_perturbations_calibration.py) at a quarter of the cost of 4 x 4.
SUPERSAMPLE = 2


def _alpha(py, px, cy, cx, a, b, ang, strength, xp):
    """Opacity of one spot at pixel coordinates (py, px); same float32 formula on both paths."""
    return _alpha_at(px - cx, py - cy, a + 1e-3, b + 1e-3, ang, strength, xp)


def _alpha_at(u, v, a_eps, b_eps, ang, strength, xp):
    """:func:`_alpha` at offsets (u, v) = (x, y) from the spot's centre, semi-axes plus 1e-3 given."""
    c, s = xp.cos(ang), xp.sin(ang)
    xr, yr = u * c + v * s, v * c - u * s
    d = xp.sqrt((xr / a_eps) ** 2 + (yr / b_eps) ** 2)
    e = (d - CORE) / EDGE
    # max(e, 0): only e * e is used, so clamping (one op) gives what masking gives (up to a zero's sign)
    e = e.clamp_min(0) if xp is torch else e * (e > 0)
    g = (xp.exp(-0.5 * e * e) - _G_REACH) / (1 - _G_REACH)
    return strength * g * (g > 0)


_AXES: dict[tuple[int, int, torch.device], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _axis_consts(
    h: int, w: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 ``[h, w]`` as (2,) and as (2,1,1), ``[h - 1, w - 1]`` and ``[w, 1]`` as (2,1,1) on ``device``,
    made once."""
    key = (h, w, device)
    if key not in _AXES:
        t = torch.tensor([[h, w], [h - 1, w - 1], [w, 1]], dtype=torch.float32, device=device)
        _AXES[key] = (t[0], t[0].view(2, 1, 1), t[1].view(2, 1, 1), t[2].view(2, 1, 1))
    return _AXES[key]


class Specularity(PlacedSampling, Perturbation):
    """Specular reflections near cluster centres, dimmed in dark regions.

    Params (relative, so they replay on any image size): ``center_rel`` (B,S,2) y,x as fractions of H, W;
    ``axes_rel`` (B,S,2) semi-axes as fractions of the shorter side; ``angle`` (B,S); ``strength`` (B,S)
    opacity (0 for unused/invalid spots).

    Example:
        >>> import numpy as np
        >>> img = np.full((128, 128, 3), 120, np.uint8)
        >>> out, p = Specularity(severity=5).apply_numpy(img, rng=np.random.default_rng(1))
        >>> int(out.max()) > 200 and out.shape == img.shape
        True
    """

    name = "specularity"
    SPOTS = {1: (3, 5), 2: (4, 7), 3: (5, 9), 4: (6, 11), 5: (8, 14)}
    LAMBDA = {1: 0.03, 2: 0.035, 3: 0.04, 4: 0.05, 5: 0.06}
    PARAM_KEYS = ("center_rel", "axes_rel", "angle", "strength")

    def _sample_at(self, images, masks, sev, generator):
        # Mixed severities in one call: spot arrays padded to the largest count present (unused spots have
        # strength 0), per-row size scale and margin. One severity: exactly the per-severity sampler.
        rows = severity_values(sev)
        if len(set(rows)) == 1:
            return self.at_severity(rows[0])._sample_torch(images, masks, generator)
        luma, free, k = maps_torch(images, masks)
        return self._place(
            luma, free, k, images.shape[2], images.shape[3], TorchRandom(generator), luma.device, sev=rows
        )

    def _place(self, luma, free, k, h, w, r, device=None, sev=None) -> dict:
        """Spot params from the low-res maps; ``r`` is a TorchRandom (torch maps) or NumpyRandom (numpy);
        ``sev`` (torch only): per-row severities (host ints) instead of this family's severity.

        The torch path is one set of batched ops for the whole batch, whatever its severities (per-row
        tables instead of a loop per severity, the five probe points of every spot in one gather); it draws
        the same values from the same stream as the loop it replaced, so a seed gives the same spots."""
        if not isinstance(luma, torch.Tensor):
            return self._place_np(luma, free, k, h, w, r)
        dev = lambda t: t if t.device == luma.device else t.to(luma.device)  # noqa: E731
        b, side = luma.shape[0], short_side(h, w)
        rows = [self.severity] * b if sev is None else list(sev)
        hi = max(self.SPOTS[s][1] for s in rows)
        # Cluster centres keep half the largest spot's reach from non-free cells; each spot is then
        # checked with its own reach (below), so large severities do not lose most spots to the margin.
        if sev is None:
            radii = [math.ceil(0.5 * REACH * (self.LAMBDA[self.severity] * side) / k)] * b
        else:  # each row eroded by its own severity's margin
            radii = [math.ceil(0.5 * REACH * self.LAMBDA[s] * side / k) for s in rows]
        ok = erode_cells_rows(free, radii)
        score = ok * (0.15 + luma)
        cells = pick_cells(score, 3, r)
        hc, wc = luma.shape[-2:]
        # y and x go through each step together: (..., 2) tensors, the same operations element for element
        centres = (torch.stack([cells // wc, cells % wc], -1) + 0.5) * k  # (B,3,2) cluster centres
        n_cl = dev(r.integers(1, 4, (b,)))
        which = (dev(r.uniform(0, 1, (b, hi))) * n_cl[:, None]).clamp(0, 2).long()
        spread = 0.06 * side
        noise = torch.stack([dev(r.normal((b, hi))), dev(r.normal((b, hi)))], -1)  # y's draw, then x's
        yx = centres.gather(1, which[..., None].expand(b, hi, 2)) + noise * spread  # (B,S,2)
        # Mostly small spots with a few larger ones, as in real frames.
        if sev is None:
            lam: float | torch.Tensor = self.LAMBDA[self.severity] * side
        else:
            lam = dev(torch.from_numpy(np.asarray([[self.LAMBDA[s] * side] for s in rows], np.float32)))
        a = (0.15 + 0.85 * dev(r.uniform(0, 1, (b, hi))) ** 2) * lam
        bb = a * dev(r.uniform(0.4, 1.0, (b, hi)))
        ang = dev(r.uniform(0, math.pi, (b, hi)))
        if sev is None:
            lo = self.SPOTS[self.severity][0]
            n = dev(r.integers(lo, hi + 1, (b,)))
        else:  # spot count in the row's own range (torch has no per-row randint bound)
            lo_span = torch.from_numpy(
                np.asarray(
                    [
                        [self.SPOTS[s][0] for s in rows],
                        [self.SPOTS[s][1] - self.SPOTS[s][0] + 1 for s in rows],
                    ]
                )
            )
            n = dev(lo_span[0] + (r.uniform(0, 1, (b,)) * lo_span[1]).long())
        # the centre and the corners of the spot's bounding box (plus a cell) must be inside and free
        c = _probe_consts(h, w, hc, wc, hi, luma.device)
        reach = (REACH * a + k).view(b, 1, hi, 1)
        pts = yx[:, None] + c["probe"] * reach  # (B,5,S,2)
        inb = ((pts >= 0) & (pts <= c["last_px"])).all(-1)
        at = cell_index_yx(pts, k, (hc, wc)).view(b, -1)
        on_free = free.reshape(b, -1).gather(1, at).view(b, 5, hi) & inb
        valid = (c["arange"] < n[:, None]) & on_free.all(1)
        near = luma.reshape(b, -1).gather(1, at[:, :hi])
        gray = (near / 0.45).clamp(0.35, 1.0)
        strength = gray * dev(r.uniform(0.85, 1.0, (b, hi))) * valid
        # y, x are continuous coordinates (cells span [i*k, (i+1)*k)), so y / h is already relative
        return {
            "center_rel": f32(yx / c["hw"]),
            "axes_rel": f32(torch.stack([a, bb], -1) / side),
            "angle": f32(ang),
            "strength": f32(strength),
        }

    def _place_np(self, luma, free, k, h, w, r) -> dict:
        """:meth:`_place` on numpy maps for one severity (``r`` a NumpyRandom): the same draws, one spot
        probe at a time (tiny arrays: numpy is faster than batching them)."""
        take = lambda a, i: np.take_along_axis(a, i, 1)  # noqa: E731
        b = luma.shape[0]
        side = short_side(h, w)
        lo, hi = self.SPOTS[self.severity]
        lam = self.LAMBDA[self.severity] * side
        rc = math.ceil(0.5 * REACH * lam / k)
        ok = erode_cells_np(free, rc)
        score = ok * (0.15 + luma)
        cells = pick_cells_np(score, 3, r)
        wc = luma.shape[-1]
        cy, cx = (cells // wc + 0.5) * k, (cells % wc + 0.5) * k
        n_cl = r.integers(1, 4, (b,))
        which = np.clip(r.uniform(0, 1, (b, hi)) * n_cl[:, None], 0, 2).astype(np.int64)
        spread = 0.06 * side
        y = take(cy, which) + r.normal((b, hi)) * spread
        x = take(cx, which) + r.normal((b, hi)) * spread
        a = (0.15 + 0.85 * r.uniform(0, 1, (b, hi)) ** 2) * lam
        bb = a * r.uniform(0.4, 1.0, (b, hi))
        ang = r.uniform(0, math.pi, (b, hi))
        n = r.integers(lo, hi + 1, (b,))
        inside = (y >= 0) & (y <= h - 1) & (x >= 0) & (x <= w - 1)
        reach = REACH * a + k  # the spot's bounding box (plus a cell): its corners and centre must be free
        on_free = gather_cells_np(free, y, x, k) > 0
        for sy, sx in ((-1, -1), (-1, 1), (1, -1), (1, 1)):
            on_free = on_free & (gather_cells_np(free, y + sy * reach, x + sx * reach, k) > 0)
            on_free = on_free & (y + sy * reach >= 0) & (y + sy * reach <= h - 1)
            on_free = on_free & (x + sx * reach >= 0) & (x + sx * reach <= w - 1)
        valid = (np.arange(hi)[None] < n[:, None]) & inside & on_free
        gray = np.clip(gather_cells_np(luma, y, x, k) / 0.45, 0.35, 1.0)
        strength = gray * r.uniform(0.85, 1.0, (b, hi)) * valid
        f32 = lambda t: t.astype(np.float32)  # noqa: E731
        return {
            "center_rel": f32(np.stack([y / h, x / w], -1)),
            "axes_rel": f32(np.stack([a, bb], -1) / side),
            "angle": f32(ang),
            "strength": f32(strength),
        }

    def _window(self, h: int, w: int) -> int:
        return math.ceil(REACH * self.LAMBDA[self.severity] * short_side(h, w)) + 1

    def _apply_torch(self, images, masks, params):
        # The float32 operations of ``_alpha``, element for element; the y and x axes go through each step
        # together ((B,S,2,...) tensors) and each reshape is one view: on an accelerator each op is a launch.
        b, c, h, w = images.shape
        half, n, side = self._window(h, w), supersampling(h, w, cap=SUPERSAMPLE), short_side(h, w)
        p = 2 * half + 1
        dev = images.device
        off, win = window_offsets(half, n, dev)
        hw, hw3, top, scale = _axis_consts(h, w, dev)  # [h, w] (2,) and (2,1,1); [h-1, w-1], [w, 1] (2,1,1)
        ns = params["strength"].shape[1]
        cyx = f32(params["center_rel"]) * hw - 0.5  # rel_to_px per axis, (B,S,2)
        r = torch.round(cyx)[..., None]  # (B,S,2,1)
        d = (r + off) - cyx[..., None]  # (B,S,2,P*n): sample offsets from the centre, y then x
        dy, dx = d.view(b, ns, 2, 1, -1).unbind(2)  # (B,S,1,P*n) each
        a_eps, b_eps = (f32(params["axes_rel"]) * side + 1e-3).view(b, ns, 2, 1, 1).unbind(2)
        alpha = _alpha_at(
            dx,
            dy.transpose(-1, -2),  # (B,S,P*n,1)
            a_eps,
            b_eps,
            f32(params["angle"]).reshape(b, ns, 1, 1),
            f32(params["strength"]).reshape(b, ns, 1, 1),
            torch,
        )
        if n > 1:
            alpha = alpha.reshape(b, -1, p, n, p, n).mean((3, 5))
        q = (r + win).view(b, ns, 2, 1, -1)  # window pixels, y then x
        ok_y, ok_x = ((q >= 0) & (q < hw3)).unbind(2)
        alpha = alpha * (ok_y.transpose(-1, -2) & ok_x)
        # clamped row offsets (y * w) and columns (x)
        lin_y, lin_x = (torch.minimum(q.clamp_min(0), top) * scale).unbind(2)
        idx = (lin_y.transpose(-1, -2) + lin_x).long().expand_as(alpha)
        canvas = images.new_zeros(b, h * w)
        canvas.scatter_reduce_(1, idx.reshape(b, -1), cast(alpha.reshape(b, -1), images.dtype), reduce="amax")
        canvas = canvas.view(b, 1, h, w)
        if masks is not None:
            canvas = canvas * (masks[:, None] == 0)
        # Blend towards white: x + A * (1 - x).
        return torch.addcmul(images, canvas, 1.0 - images).clamp_(0.0, 1.0)

    def _apply_np(self, image, mask, params):
        h, w = image.shape[:2]
        half, n, side = self._window(h, w), supersampling(h, w, cap=SUPERSAMPLE), short_side(h, w)
        strength = np.asarray(params["strength"], np.float32)
        idx = np.flatnonzero(strength > 0)
        if idx.size == 0:
            return image.copy()
        center = np.asarray(params["center_rel"], np.float32)[idx]
        cy, cx = rel_to_px(center[:, 0], h), rel_to_px(center[:, 1], w)
        ry, rx = np.rint(cy).astype(int), np.rint(cx).astype(int)
        y0, y1 = max(int(ry.min()) - half, 0), min(int(ry.max()) + half + 1, h)
        x0, x1 = max(int(rx.min()) - half, 0), min(int(rx.max()) + half + 1, w)
        if y1 <= y0 or x1 <= x0:
            return image.copy()
        canvas = np.zeros((y1 - y0, x1 - x0), np.float32)
        sub = (np.arange(n, dtype=np.float32) + np.float32(0.5)) / np.float32(n) - np.float32(0.5)
        off = (np.arange(-half, half + 1, dtype=np.float32)[:, None] + sub).reshape(-1)
        p = 2 * half + 1
        axes = np.asarray(params["axes_rel"], np.float32)[idx] * np.float32(side)
        ang = np.asarray(params["angle"], np.float32)[idx]
        for j in range(idx.size):  # a handful of spots, each vectorised over its window
            py = np.float32(ry[j]) + off[:, None]
            px = np.float32(rx[j]) + off[None, :]
            a = _alpha(py, px, cy[j], cx[j], axes[j, 0], axes[j, 1], ang[j], strength[idx[j]], np)
            if n > 1:
                a = a.reshape(p, n, p, n).mean((1, 3))
            ys, xs = ry[j] - half, rx[j] - half
            sy0, sx0 = max(ys, y0), max(xs, x0)
            sy1, sx1 = min(ys + p, y1), min(xs + p, x1)
            if sy1 <= sy0 or sx1 <= sx0:
                continue
            win = a[sy0 - ys : sy1 - ys, sx0 - xs : sx1 - xs]
            dst = canvas[sy0 - y0 : sy1 - y0, sx0 - x0 : sx1 - x0]
            np.maximum(dst, win, out=dst)
        if mask is not None:
            canvas *= mask[y0:y1, x0:x1] == 0
        out = image.copy()
        reg = out[y0:y1, x0:x1].astype(np.float32)
        top = 255.0 if image.dtype == np.uint8 else 1.0
        reg += canvas[:, :, None] * (top - reg)
        if image.dtype == np.uint8:
            out[y0:y1, x0:x1] = np.clip(np.rint(reg), 0, 255).astype(np.uint8)
        else:
            out[y0:y1, x0:x1] = np.clip(reg, 0, 1)
        return out
