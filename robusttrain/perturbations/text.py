"""Burned-in overlay text (paper 000, MR4-1): date/time, device parameters and ids in corner blocks.

Glyphs are rendered once per font size with ``cv2.putText`` into a fixed-width atlas; a text block is
then a gather from the atlas (one small array op), which both paths do identically. Blocks sit in the
image corners like the video processor's overlay on real frames — which in real frames is often on the
black border, so this family deliberately ignores the border estimate — and never over the lesion.

Resolution independence: the text height and margins are fractions of the shorter side (11..16 px and
1.5 % on a 512-px image). On an image smaller than 512 px the block is rendered ``n = round(512 / side)``
times larger (at the 512-px font size) and area-averaged down by ``n``, so a 128-px frame shows what a
512-px frame with the same overlay looks like once downsized (a cv2 font cannot be drawn 3 px high).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import cv2
import numpy as np
import torch

from .base import (
    REF_SIDE,
    SEVERITIES,
    FamilyParams,
    Perturbation,
    TorchRandom,
    _take_rows,
    cast,
    on_device,
    params_to,
    severity_values,
    short_side,
)

CHARS = " 0123456789/:<>%.-ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_IDX = {c: i for i, c in enumerate(CHARS)}
# Placeholders: d = 0-9, m = 0-5, t = 0-2, o = 0-1; anything else is literal.
BLOCKS = (
    ("td/od/20td", "<td:md:md>", "CVP:d", "EH:Ad  CM:d", "CT:d  EF:d"),
    ("ID:dddddd", "SN dddddd", "FR:dd%", "AGE:dd", "M"),
)
LINES = {1: (2, 0), 2: (3, 0), 3: (4, 0), 4: (4, 2), 5: (5, 3)}
FONT_PX = {1: 11, 2: 12, 3: 13, 4: 14, 5: 16}  # glyph cell height on a 512-px image (shorter side)
MARGIN = 0.015  # block margin from the image edge, fraction of the shorter side
L = 12  # characters per line
_RANGES = {"d": (0, 9), "m": (0, 5), "t": (0, 2), "o": (0, 1)}


def _templates() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(NB,NL,L) arrays: literal char index (or -1), digit low, digit span."""
    fixed = np.zeros((2, 5, L), np.int64)
    lo = np.zeros((2, 5, L), np.int64)
    span = np.zeros((2, 5, L), np.int64)
    for b, lines in enumerate(BLOCKS):
        for li, line in enumerate(lines):
            for ci, ch in enumerate(line[:L]):
                if ch in _RANGES:
                    fixed[b, li, ci] = -1
                    lo[b, li, ci], span[b, li, ci] = _RANGES[ch][0], _RANGES[ch][1] - _RANGES[ch][0] + 1
                else:
                    fixed[b, li, ci] = _IDX[ch]
    return fixed, lo, span


_FIXED, _LO, _SPAN = _templates()


@lru_cache(maxsize=32)
def glyph_atlas(font_px: int) -> np.ndarray:
    """(len(CHARS), h, w) float32 anti-aliased glyph alphas in fixed-width cells, drawn with cv2.putText."""
    scale = font_px / 14.0
    w = max(int(round(font_px * 0.72)), 4)
    atlas = np.zeros((len(CHARS), font_px, w), np.uint8)
    for i, ch in enumerate(CHARS):
        if ch != " ":
            cv2.putText(
                atlas[i], ch, (0, int(font_px * 0.78)), cv2.FONT_HERSHEY_PLAIN, scale, 255, 1, cv2.LINE_AA
            )
    return atlas.astype(np.float32) / 255.0


def line_gap(font_px: int) -> int:
    """Blank rows under each text line (2 at the 512-px font sizes), scaled with the font."""
    return max(1, int(round(0.15 * font_px)))


@lru_cache(maxsize=32)
def spaced_atlas(font_px: int) -> np.ndarray:
    """Glyph atlas with the line gap under each glyph: (N, font_px + gap, glyph width)."""
    return np.pad(glyph_atlas(font_px), ((0, 0), (0, line_gap(font_px)), (0, 0)))


_ATLAS_ON: dict[tuple[int, torch.device], torch.Tensor] = {}
_CONST_ON: dict[tuple[str, torch.device], torch.Tensor] = {}


def _const_on(name: str, device: torch.device) -> torch.Tensor:
    """The draw's template constants as tensors on ``device``, made once (not 2 ops each per call)."""
    key = (name, device)
    if key not in _CONST_ON:
        if name == "fixed":
            value = _FIXED
        elif name == "is_fixed":
            value = _FIXED >= 0
        elif name == "lo1":
            value = _LO + 1  # '0' is index 1
        elif name == "span":
            value = _SPAN
        elif name == "nth":  # the first and second free corner: ranks below 1 and below 2
            value = np.array([[1], [2]], np.int64)
        elif name == "both":  # two blocks: the first needs one free corner, the second two
            value = np.array([1, 2], np.int64)
        elif name == "one_block":  # a severity without a second block: it is never visible
            value = np.array([1.0, 0.0], np.float32)
        else:  # "shown<severity>"
            value = _SHOWN[int(name[5:])]
        _CONST_ON[key] = torch.as_tensor(value, device=device)
    return _CONST_ON[key]


def _atlas_on(font_px: int, device: torch.device) -> torch.Tensor:
    key = (font_px, device)
    if key not in _ATLAS_ON:
        _ATLAS_ON[key] = torch.from_numpy(spaced_atlas(font_px)).to(device)
    return _ATLAS_ON[key]


def _blend(
    images: torch.Tensor, masks: torch.Tensor | None, canvas: torch.Tensor, level, n: int
) -> torch.Tensor:
    """The text's (B,1,nH,nW) fine-grid coverage ``canvas`` averaged to pixels, kept off the lesion, and
    blended towards each row's ``level``."""
    if n > 1:
        canvas = torch.nn.functional.avg_pool2d(canvas, n)
    if masks is not None:
        canvas = canvas * (masks[:, None] == 0)
    level = cast(level, images.dtype).reshape(images.shape[0], 1, 1, 1)
    return torch.lerp(images, level.expand_as(images), canvas)


class Layout(NamedTuple):
    """Where a severity's blocks go on an HxW image. ``n``: supersampling factor (the block is drawn on an
    n-times finer grid and area-averaged); ``font``, ``gw``, ``pitch``: glyph height, width and line
    pitch on that grid; ``rows``: (block 0, block 1) heights and ``bw`` the width on that grid (clipped
    to the image); ``m``: margin in image px; ``h``, ``w``: the image size."""

    n: int
    font: int
    gw: int
    pitch: int
    rows: tuple[int, int]
    bw: int
    m: int
    h: int
    w: int

    def origin_ss(self, corner, k: int):
        """Top-left of block ``k`` at ``corner`` (0..3: TL, TR, BL, BR) on the fine grid."""
        n, m = self.n, self.m
        y = (corner >= 2) * (n * (self.h - m) - self.rows[k]) + (corner < 2) * (n * m)
        x = (corner % 2 == 1) * (n * (self.w - m) - self.bw) + (corner % 2 == 0) * (n * m)
        return y, x

    def region(self, corner: int, k: int) -> tuple[int, int, int, int]:
        """Image-pixel box (y0, y1, x0, x1) that block ``k`` at ``corner`` touches."""
        y, x = self.origin_ss(corner, k)
        n = self.n
        return int(y) // n, -(-(int(y) + self.rows[k]) // n), int(x) // n, -(-(int(x) + self.bw) // n)


class Text(Perturbation):
    """Endoscope-style overlay text in one or two corner blocks.

    Params: ``codes`` (B,2,5,12) character indices into :data:`CHARS` (0 = blank), ``corner`` (B,2) in
    0..3 (top-left, top-right, bottom-left, bottom-right), ``visible`` (B,2) 0/1, ``level`` (B,) text
    brightness — no pixel quantities: the layout follows from the image size (see the module doc).
    Severity -> lines per block (1: 2, 2: 3, 3: 4, 4: 4+2, 5: 5+3) and glyph height (11..16 px on a
    512-px image, i.e. 2.1-3.1 % of the shorter side). ``inplace=True`` draws into the given uint8/float32
    array instead of a copy (the fast path for the checker; Albumentations always gets a copy).

    Example:
        >>> import numpy as np
        >>> img = np.zeros((256, 256, 3), np.uint8)
        >>> out, p = Text(severity=3).apply_numpy(img, rng=np.random.default_rng(0))
        >>> int(out.max()) > 150 and p["codes"].shape == (2, 5, 12)
        True
    """

    name = "text"
    occludes = True  # burned-in overlay hides what lies under it
    PARAM_KEYS = ("codes", "corner", "visible", "level")

    def __init__(self, severity: int = 3, inplace: bool = False):
        super().__init__(severity)
        self.inplace = bool(inplace)
        self._layouts: dict[tuple[int, int], Layout] = {}
        self._boxes: dict[tuple[int, int], dict] = {}

    def layout(self, h: int, w: int) -> Layout:
        """The :class:`Layout` of this severity on an HxW image (cached)."""
        key = (h, w)
        if key not in self._layouts:
            s = short_side(h, w)
            n = max(1, int(round(REF_SIDE / s)))
            font = max(int(round(FONT_PX[self.severity] * s * n / REF_SIDE)), 4)
            gw = spaced_atlas(font).shape[2]
            pitch = spaced_atlas(font).shape[1]
            m = max(int(round(MARGIN * s)), 1)
            # Clip the blocks inside the margins: on small images an unclipped block would start at a
            # negative corner origin and slice nothing.
            lim_h, lim_w = max(n * (h - 2 * m), 1), max(n * (w - 2 * m), 1)
            rows = tuple(min(nl * pitch, lim_h) for nl in LINES[self.severity])
            lay = self._layouts[key] = Layout(n, font, gw, pitch, rows, min(L * gw, lim_w), m, h, w)
            # per (corner, block): fine-grid origin and pixel box, so the numpy path does no layout maths
            self._boxes[key] = {
                (c, k): tuple(int(v) for v in lay.origin_ss(c, k)) + lay.region(c, k)
                for c in range(4)
                for k in range(2)
            }
        return self._layouts[key]

    def _draw(self, r, b):
        u = r.uniform(0, 1, (b, 2, 5, L))
        if isinstance(r, TorchRandom):  # constants on the draw's device: a CUDA generator draws on the GPU
            c = lambda name: _const_on(name, r.device)  # noqa: E731
            digit = (u * c("span")).long()
            codes = torch.where(c("is_fixed"), c("fixed"), digit + c("lo1")) * c(f"shown{self.severity}")
        else:
            digit = (u * _SPAN).astype(np.int64)
            codes = np.where(_FIXED >= 0, _FIXED, digit + _LO + 1) * _SHOWN[self.severity]  # '0' is index 1
        # Two distinct corners: a random permutation's first two entries.
        keys = r.uniform(0, 1, (b, 4))
        order = keys.argsort(1) if isinstance(r, TorchRandom) else np.argsort(keys, 1)
        return {"codes": codes, "order": order, "level": r.uniform(0.75, 1.0, (b,))}

    def _corners(self, order, free):
        """First two corners of ``order`` that are free of lesion (else invisible)."""
        c = lambda name: _const_on(name, order.device)  # noqa: E731
        rank = free.gather(1, order).cumsum(1)  # (B,4) long: free corners so far, in order
        # position of the first and second free corner (or 3 when missing), (B,2)
        nth = (rank[:, None, :] < c("nth")).sum(2).clamp(max=3)
        vis = (rank[:, -1:] >= c("both")).float()
        if LINES[self.severity][1] == 0:
            vis = vis * c("one_block")
        return order.gather(1, nth), vis

    def _free_corners(self, masks: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """(B,4) bool: whether corner c's box (the taller block's) holds no lesion pixel: one product of the
        lesion pixels with the four boxes (counts of 0/1 values: exact), not four slices and reductions."""
        les = (masks != 0).reshape(masks.shape[0], -1)
        return (les.to(torch.float32) @ self._corner_boxes(h, w, masks.device)) == 0

    def _corner_boxes(self, h: int, w: int, device: torch.device) -> torch.Tensor:
        """(H*W, 4) float32: 1 inside corner c's box of the taller block (:meth:`_free_corner`), cached."""
        key = (h, w, device)
        cache = self.__dict__.setdefault("_boxes_on", {})
        if key not in cache:
            lay = self.layout(h, w)
            boxes = np.zeros((4, h, w), np.float32)
            for corner in range(4):
                self._free_corner(boxes[corner], lay, corner)[...] = 1.0
            cache[key] = torch.from_numpy(boxes.reshape(4, -1).T.copy()).to(device)
        return cache[key]

    def _free_corner(self, lesion, lay: Layout, c: int):
        """Whether corner ``c`` is free of lesion for both blocks (the taller block's box)."""
        k = 0 if lay.rows[0] >= lay.rows[1] else 1
        y0, y1, x0, x1 = lay.region(c, k)
        return lesion[..., y0:y1, x0:x1]

    def _sample_torch(self, images, masks, generator):
        b, _, h, w = images.shape
        p = {
            k: (v if v.device == images.device else v.to(images.device))
            for k, v in self._draw(TorchRandom(generator), b).items()
        }
        if masks is not None:
            free = self._free_corners(masks, h, w)
        else:
            free = torch.ones(b, 4, dtype=torch.bool, device=images.device)
        p["corner"], p["visible"] = self._corners(p.pop("order"), free)
        return p

    def _sample_np(self, image, mask, rng):
        # Hand-written numpy twin of _draw/_corners: this family's numpy path is meant to cost about as
        # much as one cv2.putText call, so it avoids generic helpers.
        rng = rng if rng is not None else np.random.default_rng()
        u = rng.random(2 * 5 * L + 5)  # one draw: characters, corner order keys, level (as _draw)
        codes = (
            np.where(_FIXED >= 0, _FIXED, (u[:-5].reshape(2, 5, L) * _SPAN).astype(np.int64) + _LO + 1)
            * _SHOWN[self.severity]
        )
        order = np.argsort(u[-5:-1])
        if mask is not None:
            h, w = image.shape[:2]
            self.layout(h, w)
            boxes, k = self._boxes[(h, w)], (0 if LINES[self.severity][0] >= LINES[self.severity][1] else 1)
            free = []
            for c in order:  # the first two corners whose box holds no lesion pixel
                _, _, y0, y1, x0, x1 = boxes[(int(c), k)]
                if not np.count_nonzero(mask[y0:y1, x0:x1]):
                    free.append(c)
                    if len(free) == 2:
                        break
            order = free
        n1 = LINES[self.severity][1]
        corner = np.array((list(order) + [3, 3])[:2], np.int64)
        visible = np.array([len(order) >= 1, len(order) >= 2 and n1 > 0], np.float32)
        return {
            "codes": codes,
            "level": np.float32(0.75 + 0.25 * u[-1]),
            "corner": corner,
            "visible": visible,
        }

    def _apply_torch(self, images, masks, params):
        b, c, h, w = images.shape
        lay = self.layout(h, w)
        n, dev = lay.n, images.device
        atlas = _atlas_on(lay.font, dev)  # (N, pitch, gw)
        hs, ws = n * h, n * w
        canvas = images.new_zeros(b, hs * ws)
        blocks = [k for k in range(2) if LINES[self.severity][k] > 0]
        vis = cast(params["visible"], atlas.dtype).reshape(b, 2, 1, 1)
        # every block's fine-grid origin at its corner, (B,2,1): one gather from the (4,2) table
        start, offsets = self._block_index(lay, dev)
        origin = start.gather(0, params["corner"].reshape(b, 2)).view(b, 2, 1)
        for k in blocks:
            nl, rows = LINES[self.severity][k], lay.rows[k]
            glyphs = atlas[params["codes"][:, k, :nl]]  # (B,nl,L,pitch,gw)
            block = glyphs.permute(0, 1, 3, 2, 4).reshape(b, nl * lay.pitch, L * lay.gw)[:, :rows, : lay.bw]
            block = block * vis[:, k]
            # blocks are clipped inside the margins (see layout), so every index lies in the image: the
            # block's flat offsets on the fine grid plus its corner's origin (tables made once per layout)
            idx = origin[:, k] + offsets[k]
            canvas.scatter_reduce_(1, idx, cast(block.reshape(b, -1), images.dtype), reduce="amax")
        return _blend(images, masks, canvas.view(b, 1, hs, ws), params["level"], n)

    def _block_index(self, lay: Layout, device: torch.device) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(4,2) flat fine-grid index of block k's origin at corner c (a (B,2) gather of the corners reads
        both blocks' at once) and per block its (rows * bw,) flat offsets, cached per layout and device:
        integers, so the same indices as the per-call arithmetic."""
        key = (lay.h, lay.w, device)
        cache = self.__dict__.setdefault("_index_on", {})
        if key not in cache:
            ws = lay.n * lay.w
            origins = [[lay.origin_ss(c, k) for k in range(2)] for c in range(4)]
            start = [[int(y) * ws + int(x) for y, x in row] for row in origins]
            offsets = []
            for k in range(2):
                rows, cols = np.meshgrid(np.arange(lay.rows[k]), np.arange(lay.bw), indexing="ij")
                offsets.append(torch.from_numpy((rows * ws + cols).reshape(-1).astype(np.int64)).to(device))
            cache[key] = (torch.tensor(start, dtype=torch.long, device=device), offsets)
        return cache[key]

    # -- rows of several severities in one pass (WorstOfK draws text at mixed severities) -------------------
    def _sample_family(self, images, masks, sev, generator, sev_list=None, taken=None):
        """One group per severity, as the generic sampler returns them (their params drawn from the stream in
        the same order), but drawn and later rendered for all rows at once: one uniform draw (the groups'
        draws are consecutive uniforms: one draw of their total length gives the same values) and per-row
        tables of each row's severity, instead of ~20 ops per group for sampling and ~20 for rendering."""
        values = severity_values(sev) if sev_list is None else sev_list
        by_sev: dict[int, list[int]] = {}
        for i, s in enumerate(values):
            by_sev.setdefault(int(s), []).append(i)
        self.__dict__.pop("_joint", None)
        if len(by_sev) == 1:
            return super()._sample_family(images, masks, sev, generator, sev_list, taken)
        sizes = [len(rows) for rows in by_sev.values()]
        perm = [i for rows in by_sev.values() for i in rows]
        at = torch.from_numpy(np.asarray(perm, dtype=np.int64))
        x, m = _take_rows(images, masks, at)
        p = self._sample_rows(x, m, [values[i] for i in perm], sizes, generator)
        pieces = {k: v.split(sizes) for k, v in p.items()}
        groups = [(rows, {k: pieces[k][g] for k in p}) for g, rows in enumerate(at.split(sizes))]
        # held for _apply_groups: the rows as taken, the joint params (not split and joined again)
        self.__dict__["_joint"] = (groups, x, m, p, perm, [values[i] for i in perm])
        return groups

    def _sample_rows(self, images, masks, sev_rows: list[int], sizes: list[int], generator) -> dict:
        """The params of ``_sample_torch`` for rows whose groups (consecutive, ``sizes`` rows each) have their
        own severities ``sev_rows``: group g's draws (characters (b_g,2,5,L), corner keys (b_g,4), level
        (b_g,)) are consecutive in one uniform draw, read into per-row order with one host-made index."""
        b, _, h, w = images.shape
        dev = images.device
        r = TorchRandom(generator)
        per = 2 * 5 * L + 5
        at = np.empty((b, per), np.int64)
        row = 0
        for size in sizes:
            base, i = row * per, np.arange(size)[:, None]
            at[row : row + size, : per - 5] = base + i * (per - 5) + np.arange(per - 5)
            at[row : row + size, per - 5 : per - 1] = base + size * (per - 5) + i * 4 + np.arange(4)
            at[row : row + size, per - 1 :] = base + size * (per - 1) + i
            row += size
        # characters, level and corner order on the host, beside their draw (the render moves them over);
        # only the lesion test reads the masks on their device, and the corner pick that needs it follows
        host = r.device
        drawn = torch.rand(b * per, generator=r.g, device=host)[torch.from_numpy(at)]
        u, keys, level = drawn.split([per - 5, 4, 1], 1)
        t = _mixed_tables(h, w, host)
        sev_t = torch.from_numpy(np.asarray(sev_rows, dtype=np.int64))
        c = lambda name: _const_on(name, host)  # noqa: E731
        digit = (u * c("span").view(-1)).long()
        codes = torch.where(c("is_fixed").view(-1), c("fixed").view(-1), digit + c("lo1").view(-1))
        p = {
            "codes": codes.view(b, 2, 5, L) * t["shown"][sev_t],
            "level": (0.75 + 0.25 * level).view(b),  # uniform(0.75, 1.0): the same float ops
        }
        order = keys.argsort(1)
        one_block = t["one_block"][sev_t]
        at_dev = host
        if masks is not None:
            if dev != host:
                moved = params_to({"order": order, "sev": sev_t, "one_block": one_block}, dev)
                order, sev_t, one_block, at_dev = moved["order"], moved["sev"], moved["one_block"], dev
            les = (masks != 0).reshape(b, -1).to(torch.float32)
            # every severity's four boxes in one product (counts of 0/1 values: exact), each row's own picked
            counts = (les @ _boxes_all(h, w, dev)).view(b, len(t["shown"]), 4)
            free = counts[_all_rows_on(b, dev), sev_t] == 0
        else:
            free = torch.ones(b, 4, dtype=torch.bool, device=host)
        rank = free.gather(1, order).cumsum(1)
        nth = (rank[:, None, :] < _const_on("nth", at_dev)).sum(2).clamp(max=3)
        # x 1.0 where a severity shows two blocks (exact), x [1, 0] where it shows one (as _corners does)
        p["corner"] = order.gather(1, nth)
        p["visible"] = (rank[:, -1:] >= _const_on("both", at_dev)).float() * one_block
        return p

    def _apply_groups(self, images, masks, groups: FamilyParams, sev_list):
        joint = self.__dict__.pop("_joint", None)
        b = images.shape[0]
        if joint is not None and joint[0] is groups:
            _, x, m, p, perm, sev_rows = joint
        else:
            at = torch.cat([rows for rows, _ in groups])
            perm = at.tolist()
            if sorted(perm) != list(range(b)):
                return None
            x, m = _take_rows(images, masks, at)
            p = {k: torch.cat([gp[k] for _, gp in groups]) for k in groups[0][1]}
            sev_rows = [sev_list[i] for i in perm]
        self._check_params(p, b)
        y = self._render_rows(x, m, params_to(p, images.device), sev_rows)
        inv = np.empty(b, dtype=np.int64)
        inv[np.asarray(perm, dtype=np.int64)] = np.arange(b)
        return y[on_device(torch.from_numpy(inv), y.device)]

    def _render_rows(self, images, masks, params, sev_rows: list[int]):
        """``_apply_torch`` for rows of their own severities ``sev_rows``: each row's block pixels from its
        severity's table (source in the joined glyph atlases, destination on the fine grid, block), padded
        with pixels that read a zero; the same products and maxima as the per-severity render, per pixel."""
        b, c, h, w = images.shape
        dev = images.device
        t = _mixed_tables(h, w, dev)
        n = t["n"]
        sev_t = on_device(torch.from_numpy(np.asarray(sev_rows, dtype=np.int64)), dev)
        slot, mult, add, dst, blk = t["pixels"][sev_t].unbind(1)  # (B,P) each
        code = params["codes"].reshape(b, -1).gather(1, slot)
        vis = cast(params["visible"], torch.float32)
        val = t["atlas"][code * mult + add] * vis.gather(1, blk)
        # each block's fine-grid origin at its corner: row s of the (6,4,2) table, then (corner, block)
        origin = t["start"][sev_t].gather(1, params["corner"].reshape(b, 1, 2)).view(b, 2)
        canvas = images.new_zeros(b, n * h * n * w)
        canvas.scatter_reduce_(1, origin.gather(1, blk) + dst, cast(val, images.dtype), reduce="amax")
        return _blend(images, masks, canvas.view(b, 1, n * h, n * w), params["level"], n)

    def _apply_np(self, image, mask, params):
        h, w = image.shape[:2]
        lay = self.layout(h, w)
        n = lay.n
        atlas = spaced_atlas(lay.font)
        out = image if self.inplace else image.copy()
        level = float(params["level"]) * (255.0 if image.dtype == np.uint8 else 1.0)
        codes, vis, corner = params["codes"], params["visible"], np.asarray(params["corner"])
        boxes = self._boxes[(h, w)]
        for k in range(2):  # at most two blocks
            nl, rows = LINES[self.severity][k], lay.rows[k]
            if vis[k] <= 0 or nl == 0:
                continue
            a = (
                atlas[codes[k, :nl]]
                .transpose(0, 2, 1, 3)
                .reshape(nl * lay.pitch, L * lay.gw)[:rows, : lay.bw]
            )
            ys, xs, y0, y1, x0, x1 = boxes[(int(corner[k]), k)]
            if n > 1:  # place the block on the fine grid of its pixel box, then area-average by n
                fine = np.zeros(((y1 - y0) * n, (x1 - x0) * n), np.float32)
                fine[ys - y0 * n : ys - y0 * n + rows, xs - x0 * n : xs - x0 * n + lay.bw] = a
                a = fine.reshape(y1 - y0, n, x1 - x0, n).mean((1, 3))
            if mask is not None and np.count_nonzero(mask[y0:y1, x0:x1]):  # (sampled corners hold none)
                a = a * (mask[y0:y1, x0:x1] == 0)
            reg = out[y0:y1, x0:x1]
            if image.dtype == np.uint8:  # one fused OpenCV pass: (1 - a) * reg + a * level, rounded
                a = np.ascontiguousarray(a, np.float32)
                top = np.full_like(reg, int(round(level)))
                reg[...] = cv2.blendLinear(np.ascontiguousarray(reg), top, 1 - a, a).reshape(reg.shape)
            else:
                reg += a[:, :, None] * (level - reg)
        return out


_SHOWN = {
    s: np.stack([np.arange(5) < n0, np.arange(5) < n1])[:, :, None].astype(np.int64)
    for s, (n0, n1) in LINES.items()
}


_MIXED: dict[tuple[int, int, torch.device], dict] = {}
_ROWS_ON: dict[tuple[int, torch.device], torch.Tensor] = {}


def _all_rows_on(b: int, device: torch.device) -> torch.Tensor:
    key = (b, device)
    if key not in _ROWS_ON:
        _ROWS_ON[key] = torch.arange(b, device=device)
    return _ROWS_ON[key]


def _mixed_tables(h: int, w: int, device: torch.device) -> dict:
    """Tables for rows of mixed severities on an HxW image, indexed by the severity (row 0 unused), made once
    per size and device: ``shown`` (6,2,5,1) lines shown, ``one_block`` (6,2) visibility factor, ``atlas``
    every severity's glyph atlas flattened and joined plus a trailing 0, ``pixels`` (6,5,P) per block pixel
    its code slot in (2*5*L), its atlas stride per code, its atlas offset, its fine-grid offset from its
    block's origin and its block (padding: stride 0, offset at the trailing 0), ``start`` (6,4,2) each
    block's fine-grid origin index per corner, and ``n`` the supersampling factor."""
    key = (h, w, device)
    if key in _MIXED:
        return _MIXED[key]
    lays = {s: Text(severity=s).layout(h, w) for s in SEVERITIES}
    n = lays[1].n
    ws = n * w
    atlases, base, per_sev = [], 0, {}
    start = np.zeros((6, 4, 2), np.int64)
    for s, lay in lays.items():
        atlas = spaced_atlas(lay.font)
        cols = []
        for k in range(2):
            if LINES[s][k] == 0:
                continue
            grid = np.meshgrid(np.arange(lay.rows[k]), np.arange(lay.bw), indexing="ij")
            yy, xx = grid[0].reshape(-1), grid[1].reshape(-1)
            slot = k * 5 * L + (yy // lay.pitch) * L + xx // lay.gw
            off = base + (yy % lay.pitch) * lay.gw + xx % lay.gw
            stride = np.full_like(slot, lay.pitch * lay.gw)
            cols.append(np.stack([slot, stride, off, yy * ws + xx, np.full_like(slot, k)]))
        per_sev[s] = np.concatenate(cols, 1)
        origins = [[lay.origin_ss(c, k) for k in range(2)] for c in range(4)]
        start[s] = [[int(y) * ws + int(x) for y, x in row] for row in origins]
        atlases.append(atlas.reshape(-1))
        base += atlas.size
    zero = base  # the trailing 0 that padding pixels read
    width = max(v.shape[1] for v in per_sev.values())
    pixels = np.zeros((6, 5, width), np.int64)
    pixels[:, 2] = zero
    for s, v in per_sev.items():
        pixels[s, :, : v.shape[1]] = v
    shown = np.zeros((6, 2, 5, 1), np.int64)
    one_block = np.zeros((6, 2), np.float32)
    for s in SEVERITIES:
        shown[s] = _SHOWN[s]
        one_block[s] = [1.0, 1.0 if LINES[s][1] > 0 else 0.0]
    _MIXED[key] = {
        "n": n,
        "shown": torch.from_numpy(shown).to(device),
        "one_block": torch.from_numpy(one_block).to(device),
        "atlas": torch.from_numpy(np.concatenate(atlases + [np.zeros(1, np.float32)])).to(device),
        "pixels": torch.from_numpy(pixels).to(device),
        "start": torch.from_numpy(start).to(device),
    }
    return _MIXED[key]


_BOXES_ALL: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _boxes_all(h: int, w: int, device: torch.device) -> torch.Tensor:
    """(H*W, 6*4) float32: :meth:`Text._corner_boxes` of every severity side by side (columns 0..3 unused),
    so one product gives each row the lesion count in its own severity's boxes."""
    key = (h, w, device)
    if key not in _BOXES_ALL:
        cols = [torch.zeros(h * w, 4, device=device)]
        cols += [Text(severity=s)._corner_boxes(h, w, device) for s in SEVERITIES]
        _BOXES_ALL[key] = torch.cat(cols, 1)
    return _BOXES_ALL[key]
