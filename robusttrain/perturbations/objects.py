"""Object families (paper 000, MR3-1..MR3-3): ``instrument``, ``feces``, ``blood`` pasted from cut-outs.

One object per image, rotated, scaled and brightness-matched: ``gain = clip((local luma / cut-out
luma)^0.6, 0.4, 1.5)``, further dimmed by the gray mask in dark regions. Feces and blood lie on a free
cell (inside the field of view, their footprint away from the lesion); an instrument enters the field
of view from its edge, pointing inwards, as a tool does from the working channel (its base lies beyond
the edge and is cut there). Edges are soft (pre-blurred alpha plus bilinear resampling). At render
time alpha is also zeroed on the lesion and on the black border, so neither is ever covered even when
params are replayed on another image.

Sizes and positions are relative (fractions of the shorter side / of H and W), and the cut-out is
area-sampled on an n x n sub-pixel grid (:func:`~robusttrain.perturbations.base.supersampling`), so the
same params draw the same object at any resolution. Both paths resample the cut-out with the same
bilinear formula (``grid_sample`` with ``align_corners=True`` / its numpy twin) inside a window around
the object only.
"""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from . import objects_joint
from .base import (
    Params,
    Perturbation,
    TorchRandom,
    cast,
    f32,
    params_to,
    rel_to_px,
    severity_values,
    short_side,
    supersampling,
)
from .border import fov_mask_np
from .colour import LUMA
from .cutouts import SIZE, load_cutouts, procedural_cutouts
from .placement import (
    PlacedSampling,
    cell_index_yx,
    erode_cells,
    erode_cells_np,
    erode_cells_rows,
    fov_mask_shared,
    gather_cells_np,
    maps_torch,
    pick_cells,
    pick_cells_np,
    window_offsets,
)

# Sub-pixel grid cap: 2 x 2 samples per pixel keep a 128-px image within 0.05 of the downsized 512-px
# rendering (tests/test_perturbations_calibration.py) at a quarter of the cost of 4 x 4.
SUPERSAMPLE = 2


class PastedObject(PlacedSampling, Perturbation):
    """Base of the cut-out families. ``cutouts``: a folder of user cut-outs (see
    :func:`~robusttrain.perturbations.cutouts.load_cutouts`), else ``n_procedural`` generated ones.

    Params: ``index`` (B,) cut-out, ``center_rel`` (B,2) y,x as fractions of H and W, ``size_rel`` (B,) the
    cut-out square's side as a fraction of the shorter side, ``angle`` (B,), ``flip`` (B,) 0/1 (mirror
    across the object's axis), ``gain`` (B,), ``visible`` (B,) 0/1.
    Severity -> size (1: .12-.18, 2: .18-.25, 3: .25-.32, 4: .32-.40, 5: .40-.50 of the shorter side).
    """

    kind = "instrument"
    occludes = True  # an opaque object over the tissue
    render_group = "pasted_object"  # instrument, feces and blood: one renderer (see render_together)
    SIZE_FRAC = {1: (0.12, 0.18), 2: (0.18, 0.25), 3: (0.25, 0.32), 4: (0.32, 0.40), 5: (0.40, 0.50)}
    PARAM_KEYS = ("index", "center_rel", "size_rel", "angle", "flip", "gain", "visible")

    def __init__(
        self,
        severity: int = 3,
        cutouts: str | Path | None = None,
        mask_channel: int = 0,
        n_procedural: int = 8,
    ):
        super().__init__(severity)
        self.cutouts = None if cutouts is None else str(cutouts)
        items = (
            load_cutouts(cutouts, mask_channel)
            if cutouts is not None
            else procedural_cutouts(self.kind, n_procedural)
        )
        self.bank = np.stack(items)  # (N,S,S,4) float32
        a = self.bank[..., 3]
        self._luma = ((self.bank[..., :3] @ LUMA) * a).sum((1, 2)) / np.maximum(a.sum((1, 2)), 1e-6)
        self._bank_on: dict[torch.device, torch.Tensor] = {}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(severity={self.severity}, cutouts={self.cutouts!r}, n={len(self.bank)})"
        )

    def _luma_on(self, device) -> torch.Tensor:
        """The cut-outs' mean luma, floored at 0.05 (as the gain uses it), as a tensor on ``device``, made once
        (not 3 ops every call)."""
        cache = self.__dict__.setdefault("_luma_dev", {})
        if device not in cache:
            cache[device] = torch.as_tensor(self._luma, device=device).clip(0.05, None)
        return cache[device]

    def _bank(self, device):
        if device not in self._bank_on:
            self._bank_on[device] = torch.from_numpy(self.bank).permute(0, 3, 1, 2).contiguous().to(device)
        return self._bank_on[device]

    # -- sampling -----------------------------------------------------------------------------
    def _gain(self, near, idx, xp, device):
        cl = self._luma_on(device)[idx] if xp is torch else np.clip(self._luma[idx], 0.05, None)
        return xp.clip((near / cl) ** 0.6, 0.4, 1.5) * xp.clip(near / 0.45, 0.5, 1.0)

    def _size(self, r, b: int, side: int, dev, sev):
        """Object sizes in px: the severity's range, or (``sev``, torch only) each row's own severity's range
        (the same values from the same stream when every row has one severity)."""
        if sev is None:
            return dev(r.uniform(*self.SIZE_FRAC[self.severity], (b,))) * side
        return dev(r.uniform_at(self.SIZE_FRAC, sev, (b,))) * side

    def _sample_at(self, images, masks, sev, generator):
        # every severity of a batch in one call (the size range and the margin are per row; rendering reads
        # only the params, and the batch is rendered by the family at its largest severity: a wider window)
        luma, free, k = maps_torch(images, masks)
        extra = {"fov": maps_torch(images, None)[1] if masks is not None else free} if self.needs_fov else {}
        h, w = images.shape[2], images.shape[3]
        return self._place(luma, free, k, h, w, TorchRandom(generator), luma.device, sev=sev, **extra)

    def _place(self, luma, free, k, h, w, r, device=None, sev=None):
        th = isinstance(luma, torch.Tensor)
        xp = torch if th else np
        # a no-op .to still costs an op (a launch on an accelerator): move only what is elsewhere
        dev = (lambda t: t if t.device == luma.device else t.to(device)) if th else (lambda t: t)  # noqa: E731
        b, side = luma.shape[0], short_side(h, w)
        size = self._size(r, b, side, dev, sev)
        # The centre keeps ~0.35*size from the lesion and the border: objects may run into the border
        # (alpha is cut there at render time) and the render also zeroes alpha on the lesion, so this
        # only keeps most of the object visible.
        if sev is None:
            rc = math.ceil(0.35 * self.SIZE_FRAC[self.severity][1] * side / k)
            ok = erode_cells(free, rc) if th else erode_cells_np(free, rc)
        else:  # each row eroded by its own severity's margin, the whole batch at once
            radii = [math.ceil(0.35 * self.SIZE_FRAC[s][1] * side / k) for s in severity_values(sev)]
            ok = erode_cells_rows(free, radii)
        # Cells with room for the whole object first; when a large object finds none (a big lesion, a
        # small field of view), any free cell (it is then partly cut at the border / lesion).
        score = ok * 1.0 + free * 1e-6
        cells = pick_cells(score, 1, r) if th else pick_cells_np(score, 1, r)
        wc = luma.shape[-1]
        jit = dev(r.uniform(0, 1, (b, 2)))
        if th:  # (y, x) pairs through each op (the same operations element for element); one index, both maps
            c0 = cells[:, 0]
            yx = (torch.stack([c0 // wc, c0 % wc], 1) + jit) * k  # continuous coordinates in [0, h) x [0, w)
            at = cell_index_yx(yx, k, luma.shape[1:]).view(b, 1)
            vis, near = free.reshape(b, -1).gather(1, at).view(b), luma.reshape(b, -1).gather(1, at).view(b)
            centre = yx / _hw_on(h, w, yx.device, (2,))
        else:
            y = ((cells[:, 0] // wc) + jit[:, 0]) * k  # continuous coordinates in [0, h)
            x = ((cells[:, 0] % wc) + jit[:, 1]) * k
            vis = gather_cells_np(free, y[:, None], x[:, None], k)[:, 0]
            near = gather_cells_np(luma, y[:, None], x[:, None], k)[:, 0]
            centre = np.stack([y / h, x / w], 1)
        idx = dev(r.integers(0, len(self.bank), (b,)))
        tf = f32 if th else (lambda t: np.asarray(t, np.float32))  # noqa: E731
        return {
            "index": idx,
            "center_rel": tf(centre),
            "size_rel": tf(size / side),
            "angle": tf(dev(r.uniform(0, 2 * math.pi, (b,)))),
            "flip": dev(r.integers(0, 2, (b,))),
            "gain": tf(self._gain(near, idx, xp, device)),
            "visible": tf(vis),
        }

    def deferred_draw(self, images, generator):
        # feces and blood: placed with the other deferred families' rows in one pass (objects_joint); the
        # instrument's ray march is sampled at its turn
        if type(self)._place is not PastedObject._place:
            return None
        return objects_joint.draw(self, images, generator)

    @classmethod
    def sample_together(cls, images, masks, parts):
        return objects_joint.place(images, masks, parts)

    # -- rendering ----------------------------------------------------------------------------
    def _half(self, h: int, w: int) -> int:
        return math.ceil(0.5 * math.sqrt(2) * self.SIZE_FRAC[self.severity][1] * short_side(h, w)) + 2

    @staticmethod
    def _source_coords(py, px, cy, cx, size, angle, flip, xp):
        """Cut-out pixel coordinates (u, v) of image pixels (py, px): inverse rotation + scale (+ mirror)."""
        return PastedObject._rotated(py - cy, px - cx, size, angle, flip, xp)

    @staticmethod
    def _rotated(dy, dx, size, angle, flip, xp):
        """:meth:`_source_coords` of pixels at offsets (dy, dx) from the object's centre."""
        c, s = xp.cos(angle), xp.sin(angle)
        rx, ry = dx * c + dy * s, dy * c - dx * s
        scale = (SIZE - 1) / size
        u = rx * scale + (SIZE - 1) / 2
        v = ry * scale + (SIZE - 1) / 2
        v = xp.where(flip > 0, (SIZE - 1) - v, v)
        return u, v

    def _apply_torch(self, images, masks, params):
        h, w = images.shape[-2:]
        return self._render(images, masks, params, self._bank(images.device), self._half(h, w), None)

    @classmethod
    def render_together(
        cls, images: torch.Tensor, masks: torch.Tensor | None, parts: list[tuple[Perturbation, Params, int]]
    ) -> torch.Tensor:
        """Several pasted-object families applied to consecutive rows of ``images`` in one render: ``parts``
        are (family at the severity its call applies at, its params, its row count), in row order. The same
        pixels as one ``_apply_torch`` per part: the window is the largest part's, and each row's alpha is
        cut to its own family's window (outside it the own window's render leaves the image as it is).
        """
        ops = [op for op, _, _ in parts]
        if not all(isinstance(op, PastedObject) for op in ops):
            names = [type(op).__name__ for op in ops]
            raise TypeError(f"render_together: pasted-object families only, got {names}")
        if len(parts) == 1:
            return ops[0]._apply_torch(images, masks, params_to(parts[0][1], images.device))
        h, w = images.shape[-2:]
        dev = images.device
        halves = [op._half(h, w) for op in ops]  # type: ignore[attr-defined]
        counts = [cnt for _, _, cnt in parts]
        bank, starts = _joined_banks(ops, dev)  # type: ignore[arg-type]
        # (2, B): each row's bank offset and window half
        per_row = torch.from_numpy(np.repeat(np.asarray([starts, halves], np.int64), counts, axis=1))
        if all(v.device.type == "cpu" for _, p, _ in parts for v in p.values()):
            # the parts joined on the host (where placement left them) and moved in one copy per dtype
            params = {k: torch.cat([p[k] for _, p, _ in parts]) for k in parts[0][1]}
            params["index"] = params["index"] + per_row[0]
            params = params_to({**params, "_half": per_row[1]}, dev)
            half = params.pop("_half")
        else:
            params = {k: torch.cat([params_to(p, dev)[k] for _, p, _ in parts]) for k in parts[0][1]}
            rows = per_row.to(dev) if dev.type != "cpu" else per_row
            params["index"] = params["index"] + rows[0]
            half = rows[1]
        own = None if len(set(halves)) == 1 else half.view(-1, 1, 1, 1)
        return ops[0]._render(images, masks, params, bank, max(halves), own)  # type: ignore[attr-defined]

    def _render(
        self,
        images: torch.Tensor,
        masks: torch.Tensor | None,
        params: Params,
        bank: torch.Tensor,
        half: int,
        own_half: torch.Tensor | None,
    ) -> torch.Tensor:
        """The render of :meth:`_apply_torch` with cut-outs ``bank`` and window ``half``; ``own_half``
        (B,1,1,1) long: each row's own window half (pixels beyond it are left as they are), None: all
        ``half``."""
        # The same float32 operations, element for element, as the per-axis formula of ``_apply_np``; the y
        # and x axes go through each step together ((B,2,...) tensors) and every reshape is one view: on an
        # accelerator each op is a launch.
        b, c, h, w = images.shape
        n = supersampling(h, w, cap=SUPERSAMPLE)
        dev = images.device
        off, win, win_abs = _window_columns(half, n, dev)  # (P*n,1), (P,1), (P,1)
        hw = _hw_on(h, w, dev)  # (1,2,1,1) float32 [h, w]
        cyx = (f32(params["center_rel"]).reshape(b, 2, 1, 1) * hw) - 0.5  # rel_to_px per axis, (B,2,1,1)
        r = torch.round(cyx)
        dy, dx = ((r + off) - cyx).unbind(1)  # (B,P*n,1): sample offsets from the centre
        u, v = self._rotated(
            dy,
            dx.transpose(1, 2),
            f32(params["size_rel"]).reshape(b, 1, 1) * short_side(h, w),
            f32(params["angle"]).reshape(b, 1, 1),
            params["flip"].reshape(b, 1, 1),
            torch,
        )
        grid = torch.stack([u, v], -1) / (SIZE - 1) * 2 - 1  # (B,P*n,P*n,2)
        src = bank[params["index"]]
        rgba = F.grid_sample(
            src,
            grid if grid.dtype == src.dtype else grid.to(src.dtype),
            mode="bilinear",
            padding_mode="zeros",
            align_corners=True,
        )
        alpha = rgba[:, 3:]
        prem = (rgba[:, :3] * f32(params["gain"]).reshape(b, 1, 1, 1)).clamp(0, 1) * alpha
        if n > 1:  # area-average the sub-pixel samples (colour premultiplied by alpha)
            alpha, prem = F.avg_pool2d(alpha, n), F.avg_pool2d(prem, n)
        colour = prem / alpha.clamp_min(1e-6)
        q = r + win  # (B,2,P,1): window pixels, y then x
        ok = (q >= 0) & (q < hw)
        if own_half is not None:  # each row's own window: |offset| <= its half, on both axes
            ok = ok & (win_abs <= own_half)
        py, px = q.unbind(1)
        px = px.transpose(1, 2)  # (B,P,1), (B,1,P)
        ok_y, ok_x = ok.unbind(1)
        inside = ok_y & ok_x.transpose(1, 2)
        alpha = alpha[:, 0] * inside * f32(params["visible"]).reshape(b, 1, 1)
        # Scatter the window into full-size canvases; out-of-image pixels go to a spare slot at index H*W.
        idx = torch.where(inside, py * w + px, h * w).long().view(b, 1, -1)
        acan = images.new_zeros(b, 1, h * w + 1).scatter_(2, idx, cast(alpha.view(b, 1, -1), images.dtype))
        ccan = images.new_zeros(b, c, h * w + 1).scatter_(
            2, idx.expand(b, c, -1), cast(colour.view(b, c, -1), images.dtype)
        )
        a = acan[..., : h * w].view(b, 1, h, w) * fov_mask_shared(images)
        if masks is not None:
            a = a * (masks[:, None] == 0)
        return torch.lerp(images, ccan[..., : h * w].view(b, c, h, w), a)

    def _apply_np(self, image, mask, params):
        h, w = image.shape[:2]
        out = image.copy()
        if float(params["visible"]) <= 0:
            return out
        half, n = self._half(h, w), supersampling(h, w, cap=SUPERSAMPLE)
        cy = np.float32(rel_to_px(np.float32(params["center_rel"][0]), h))
        cx = np.float32(rel_to_px(np.float32(params["center_rel"][1]), w))
        ry, rx = int(np.rint(cy)), int(np.rint(cx))
        y0, y1, x0, x1 = max(ry - half, 0), min(ry + half + 1, h), max(rx - half, 0), min(rx + half + 1, w)
        if y1 <= y0 or x1 <= x0:
            return out
        sub = (np.arange(n, dtype=np.float32) + np.float32(0.5)) / np.float32(n) - np.float32(0.5)
        py = (np.arange(y0, y1, dtype=np.float32)[:, None] + sub).reshape(-1)[:, None]
        px = (np.arange(x0, x1, dtype=np.float32)[:, None] + sub).reshape(-1)[None, :]
        size = np.float32(params["size_rel"]) * np.float32(short_side(h, w))
        u, v = self._source_coords(py, px, cy, cx, size, np.float32(params["angle"]), params["flip"], np)
        rgba = _bilinear_zero(self.bank[int(params["index"])], u.astype(np.float32), v.astype(np.float32))
        alpha = rgba[:, :, 3:]
        prem = np.clip(rgba[:, :, :3] * np.float32(params["gain"]), 0, 1) * alpha
        if n > 1:  # n x n box mean (avg_pool2d's twin); cv2's area resize at an integer factor is one
            hh, ww = y1 - y0, x1 - x0  # SIMD pass, ~10x a numpy mean over strided axes
            alpha = cv2.resize(np.ascontiguousarray(alpha[:, :, 0]), (ww, hh), interpolation=cv2.INTER_AREA)[
                :, :, None
            ]
            prem = cv2.resize(np.ascontiguousarray(prem), (ww, hh), interpolation=cv2.INTER_AREA)
        colour = prem / np.maximum(alpha, np.float32(1e-6))
        alpha = alpha[:, :, 0] * fov_mask_np(image)[y0:y1, x0:x1]
        if mask is not None:
            alpha = alpha * (mask[y0:y1, x0:x1] == 0)
        reg = out[y0:y1, x0:x1].astype(np.float32)
        if image.dtype == np.uint8:
            colour = colour * 255
        reg += alpha[:, :, None] * (colour - reg)
        out[y0:y1, x0:x1] = np.clip(np.rint(reg), 0, 255) if image.dtype == np.uint8 else np.clip(reg, 0, 1)
        return out


_JOINED: dict[tuple[int, ...], tuple[list[np.ndarray], torch.Tensor, list[int]]] = {}


def _joined_banks(ops: list[PastedObject], device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """The cut-out banks of ``ops`` as one (N,4,S,S) tensor on ``device`` and each op's first index in it,
    made once per combination (the banks are held, so their ids stay theirs)."""
    key = tuple(id(op.bank) for op in ops) + (hash(device),)
    hit = _JOINED.get(key)
    if hit is None or any(a is not op.bank for a, op in zip(hit[0], ops)):
        starts = np.cumsum([0] + [len(op.bank) for op in ops[:-1]]).tolist()
        joined = torch.cat([op._bank(device) for op in ops])
        hit = _JOINED[key] = ([op.bank for op in ops], joined, starts)
    return hit[1], hit[2]


_COLUMNS: dict[tuple[int, int, torch.device], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _window_columns(
    half: int, n: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`~robusttrain.perturbations.placement.window_offsets` as columns ((P*n,1) sub-pixel offsets,
    (P,1) pixel offsets) and the pixel offsets' magnitudes (P,1), made once per window, grid and device."""
    key = (half, n, device)
    if key not in _COLUMNS:
        off, win = window_offsets(half, n, device)
        _COLUMNS[key] = (off.view(-1, 1), win.view(-1, 1), win.abs().view(-1, 1))
    return _COLUMNS[key]


_HW: dict[tuple[int, int, torch.device, tuple[int, ...]], torch.Tensor] = {}


def _hw_on(h: int, w: int, device: torch.device, shape: tuple[int, ...] = (1, 2, 1, 1)) -> torch.Tensor:
    """float32 ``[h, w]`` shaped ``shape`` on ``device``, made once (a constant built per call costs ops)."""
    key = (h, w, device, shape)
    if key not in _HW:
        _HW[key] = torch.tensor([h, w], dtype=torch.float32, device=device).view(shape)
    return _HW[key]


def _bilinear_zero(img: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Bilinear sample of (S,S,C) ``img`` at pixel coords (u=x, v=y); outside counts as 0 (grid_sample twin).

    ``cv2.remap`` (SIMD; its 1/32-px interpolation table moves a soft cut-out edge by well under a grey
    level) instead of four numpy gathers, which cost ~4x more on a large instrument window.
    """
    u = np.ascontiguousarray(np.broadcast_to(u, np.broadcast_shapes(u.shape, v.shape)), np.float32)
    v = np.ascontiguousarray(np.broadcast_to(v, u.shape), np.float32)
    out = cv2.remap(img, u, v, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    return out.reshape(u.shape + (img.shape[2],))


class Instrument(PastedObject):
    """Surgical instrument (MR3-1). Procedural: a shaded metallic shaft with a jaw tip.

    It enters the field of view from its edge, as a tool does from the working channel: an entry
    direction is drawn around the image centre, the entry point is where that ray leaves the field of
    view (the black border's edge, or the image edge), and the shaft points inwards (within ±17° of the
    centre) with its base 15 % of the cut-out beyond the edge (cut there at render time). Of 8 entry
    directions, the first whose shaft stays off the lesion is used. Severity -> the cut-out square's side
    (1: .30-.38 .. 5: .62-.72 of the shorter side): the shaft is 4-16 % of the side wide and reaches
    about 15-50 % of it into the view, as forceps and snares do when close to the lens.

    Example:
        >>> import numpy as np
        >>> img = np.full((128, 128, 3), 140, np.uint8)
        >>> out, p = Instrument(severity=4).apply_numpy(img, rng=np.random.default_rng(0))
        >>> bool((out != img).any())
        True
    """

    name = kind = "instrument"
    SIZE_FRAC = {1: (0.30, 0.38), 2: (0.38, 0.46), 3: (0.46, 0.54), 4: (0.54, 0.62), 5: (0.62, 0.72)}
    needs_fov = True
    CANDIDATES, STEPS, OVERHANG, JITTER = 8, 48, 0.15, 0.3

    def _place(self, luma, free, k, h, w, r, device=None, fov=None, sev=None):
        if isinstance(luma, torch.Tensor):
            return self._place_torch(luma, free, k, h, w, r, device, fov, sev)
        b, side, nc = luma.shape[0], short_side(h, w), self.CANDIDATES
        size = self._size(r, b, side, lambda t: t, sev)
        j = np.arange(nc, dtype=np.float32)
        theta = r.uniform(0, 2 * math.pi, (b, 1)) + j[None] * (2 * math.pi / nc)  # (B,C) entry directions
        inward = theta + math.pi + r.uniform(-self.JITTER, self.JITTER, (b, nc))
        idx = r.integers(0, len(self.bank), (b,))
        flip = r.integers(0, 2, (b,))
        # March each ray from the centre; the entry point is the farthest ray point inside the view.
        cy0, cx0 = h / 2, w / 2
        steps = np.arange(1, self.STEPS + 1, dtype=np.float32) * (0.5 * math.hypot(h, w) / self.STEPS)
        sy, sx = np.sin(theta)[..., None], np.cos(theta)[..., None]
        py, px = cy0 + steps * sy, cx0 + steps * sx  # (B,C,T)
        inside = (py >= 0) & (py < h) & (px >= 0) & (px < w)
        in_view = gather_cells_np(fov, py.reshape(b, -1), px.reshape(b, -1), k).reshape(py.shape) & inside
        t_edge = (steps * in_view).max(-1)  # (B,C)
        ey, ex = cy0 + t_edge * sy[..., 0], cx0 + t_edge * sx[..., 0]
        dy, dx = np.sin(inward), np.cos(inward)
        # The shaft (entry point to ~60 % of the cut-out inwards) must stay off the lesion.
        fr = np.linspace(0.05, 0.6, 8).astype(np.float32)
        along = size[:, None, None] * fr  # (B,1,8)
        qy, qx = ey[..., None] + dy[..., None] * along, ex[..., None] + dx[..., None] * along
        okf = gather_cells_np(free, qy.reshape(b, -1), qx.reshape(b, -1), k).reshape(qy.shape)
        okf = okf.astype(np.float32).mean(-1)  # (B,C)
        score = (okf >= 1) * (2.0 * nc) + okf * nc - j[None]  # first fully free candidate, else the freest
        pick = score.argmax(1)
        take = lambda a: np.take_along_axis(a, pick[:, None], 1)[:, 0]  # noqa: E731
        ey, ex, dy, dx, ang, ok = take(ey), take(ex), take(dy), take(dx), take(inward), take(okf)
        base = self.OVERHANG * size
        cy, cx = ey - dy * base + dy * size / 2, ex - dx * base + dx * size / 2
        my, mx = ey + dy * 0.35 * size, ex + dx * 0.35 * size  # mid-shaft: brightness reference
        near = gather_cells_np(luma, my[:, None], mx[:, None], k)[:, 0]
        tf = lambda t: np.asarray(t, np.float32)  # noqa: E731
        return {
            "index": idx,
            "center_rel": tf(np.stack([cy / h, cx / w], 1)),
            "size_rel": tf(size / side),
            "angle": tf(ang),
            "flip": flip,
            "gain": tf(self._gain(near, idx, np, device)),
            "visible": tf(ok >= 0.5),
        }

    def _place_torch(self, luma, free, k, h, w, r, device, fov, sev):
        """:meth:`_place` on torch maps: the same operations element for element, with (y, x) pairs in
        (..., 2) tensors through each step (one op per step for both axes, one cell index per map)."""
        dev = lambda t: t if t.device == luma.device else t.to(device)  # noqa: E731
        b, side, nc = luma.shape[0], short_side(h, w), self.CANDIDATES
        size = self._size(r, b, side, dev, sev)
        c = self._ray_consts(h, w, luma.device)
        theta = dev(r.uniform(0, 2 * math.pi, (b, 1))) + c["turn"]  # (B,C) entry directions
        inward = theta + math.pi + dev(r.uniform(-self.JITTER, self.JITTER, (b, nc)))
        idx = dev(r.integers(0, len(self.bank), (b,)))
        flip = dev(r.integers(0, 2, (b,)))
        # March each ray from the centre; the entry point is the farthest ray point inside the view.
        ray = torch.stack([torch.sin(theta), torch.cos(theta)], -1)  # (B,C,2)
        pts = c["steps_col"] * ray.unsqueeze(2) + c["centre"]  # (B,C,T,2)
        inside = ((pts >= 0) & (pts < c["hw"])).all(-1)
        at = cell_index_yx(pts, k, fov.shape[1:]).view(b, -1)
        in_view = fov.reshape(b, -1).gather(1, at).view(inside.shape) & inside
        t_edge = (c["steps"] * in_view).amax(-1)  # (B,C)
        edge = c["centre"] + t_edge.unsqueeze(-1) * ray  # (B,C,2)
        d = torch.stack([torch.sin(inward), torch.cos(inward)], -1)  # (B,C,2)
        # The shaft (entry point to ~60 % of the cut-out inwards) must stay off the lesion.
        along = (size.view(b, 1, 1) * c["fr"]).unsqueeze(-1)  # (B,1,8,1)
        q = edge.unsqueeze(2) + d.unsqueeze(2) * along  # (B,C,8,2)
        okf = free.reshape(b, -1).gather(1, cell_index_yx(q, k, free.shape[1:]).view(b, -1))
        okf = okf.view(b, nc, -1).float().mean(-1)  # (B,C)
        score = (okf >= 1) * (2.0 * nc) + okf * nc - c["j"]  # first fully free candidate, else the freest
        pick = score.argmax(1)
        # the picked candidate's entry point, direction, angle and free fraction: one gather
        both = torch.cat([edge, d, torch.stack([inward, okf], -1)], -1)  # (B,C,6)
        got = both.gather(1, pick.view(b, 1, 1).expand(b, 1, 6)).view(b, 6)
        edge, d = got[:, 0:2], got[:, 2:4]
        s1 = size.view(b, 1)
        centre = edge - d * (self.OVERHANG * s1) + d * s1 / 2
        mid = edge + d * 0.35 * s1  # mid-shaft: brightness reference
        near = luma.reshape(b, -1).gather(1, cell_index_yx(mid, k, luma.shape[1:]).view(b, 1)).view(b)
        return {
            "index": idx,
            "center_rel": f32(centre / c["hw"]),
            "size_rel": f32(size / side),
            "angle": got[:, 4].contiguous(),
            "flip": flip,
            "gain": f32(self._gain(near, idx, torch, device)),
            "visible": f32(got[:, 5] >= 0.5),
        }

    def _ray_consts(self, h: int, w: int, device: torch.device) -> dict[str, torch.Tensor]:
        """The ray march's constants on ``device``, made once per image size and device (the same values the
        per-call arange / linspace gave): candidate numbers ``j`` (C,) and their turns ``j * 2 pi / C``
        (1,C); ray ``steps`` in px (T,) and as a column (T,1); shaft fractions ``fr`` (8,); the image
        ``centre`` and size ``hw`` as (y, x) pairs."""
        key = (h, w, device)
        cache = self.__dict__.setdefault("_rays_on", {})
        if key not in cache:
            nc = self.CANDIDATES
            j = torch.arange(nc, device=device, dtype=torch.float32)
            step = 0.5 * math.hypot(h, w) / self.STEPS
            steps = torch.arange(1, self.STEPS + 1, device=device).float() * step
            cache[key] = {
                "j": j,
                "turn": j[None] * (2 * math.pi / nc),
                "steps": steps,
                "steps_col": steps[:, None],
                "fr": torch.linspace(0.05, 0.6, 8, device=device),
                "centre": torch.tensor([h / 2, w / 2], dtype=torch.float32, device=device),
                "hw": torch.tensor([h, w], dtype=torch.float32, device=device),
            }
        return cache[key]


class Feces(PastedObject):
    """Residual feces (MR3-2). Procedural: a mottled yellow-brown blob.

    Example:
        >>> import numpy as np
        >>> out, p = Feces(severity=2).apply_numpy(np.full((96, 96, 3), 150, np.uint8), rng=np.random.default_rng(0))
        >>> out.shape
        (96, 96, 3)
    """

    name = kind = "feces"


class Blood(PastedObject):
    """Blood (MR3-3). Procedural: a translucent dark red pool with streaks.

    Example:
        >>> import numpy as np
        >>> out, p = Blood(severity=2).apply_numpy(np.full((96, 96, 3), 150, np.uint8), rng=np.random.default_rng(0))
        >>> out.dtype
        dtype('uint8')
    """

    name = kind = "blood"
