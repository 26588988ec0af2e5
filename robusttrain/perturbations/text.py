"""Burned-in overlay text (paper 000, MR4-1): date/time, device parameters and ids in corner blocks.

Glyphs are rendered once per font size with ``cv2.putText`` into a fixed-width atlas; a text block is
then a gather from the atlas (one small array op), which both paths do identically. Blocks sit in the
image corners like the video processor's overlay on real frames — which in real frames is often on the
black border, so this family deliberately ignores the border estimate — and never over the lesion.
"""
from __future__ import annotations

from functools import lru_cache

import cv2
import numpy as np
import torch

from .base import Perturbation, TorchRandom, check_image, check_mask_np

CHARS = " 0123456789/:<>%.-ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_IDX = {c: i for i, c in enumerate(CHARS)}
# Placeholders: d = 0-9, m = 0-5, t = 0-2, o = 0-1; anything else is literal.
BLOCKS = (("td/od/20td", "<td:md:md>", "CVP:d", "EH:Ad  CM:d", "CT:d  EF:d"),
          ("ID:dddddd", "SN dddddd", "FR:dd%", "AGE:dd", "M"))
LINES = {1: (2, 0), 2: (3, 0), 3: (4, 0), 4: (4, 2), 5: (5, 3)}
FONT_PX = {1: 11, 2: 12, 3: 13, 4: 14, 5: 16}  # glyph cell height at H = 512
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
            cv2.putText(atlas[i], ch, (0, int(font_px * 0.78)), cv2.FONT_HERSHEY_PLAIN, scale, 255, 1, cv2.LINE_AA)
    return atlas.astype(np.float32) / 255.0


_ATLAS_ON: dict[tuple[int, torch.device], torch.Tensor] = {}


def _atlas_on(font_px: int, device: torch.device) -> torch.Tensor:
    key = (font_px, device)
    if key not in _ATLAS_ON:
        _ATLAS_ON[key] = torch.from_numpy(glyph_atlas(font_px)).to(device)
    return _ATLAS_ON[key]


class Text(Perturbation):
    """Endoscope-style overlay text in one or two corner blocks.

    Params: ``codes`` (B,2,5,12) character indices into :data:`CHARS` (0 = blank), ``corner`` (B,2) in
    0..3 (top-left, top-right, bottom-left, bottom-right), ``visible`` (B,2) 0/1, ``level`` (B,) text
    brightness. Severity -> lines per block (1: 2, 2: 3, 3: 4, 4: 4+2, 5: 5+3) and font size
    (11..16 px at H = 512, scaled with H). ``inplace=True`` draws into the given uint8/float32 array
    instead of a copy (the fast path for the checker; Albumentations always gets a copy).

    Example:
        >>> import numpy as np
        >>> img = np.zeros((256, 256, 3), np.uint8)
        >>> out, p = Text(severity=3).apply_numpy(img, rng=np.random.default_rng(0))
        >>> int(out.max()) > 150 and p["codes"].shape == (2, 5, 12)
        True
    """

    name = "text"

    def __init__(self, severity: int = 3, inplace: bool = False):
        super().__init__(severity)
        self.inplace = bool(inplace)

    def font_px(self, h: int) -> int:
        return max(int(round(FONT_PX[self.severity] * h / 512)), 6)

    def _layout(self, h: int, w: int) -> tuple[int, int, int, int, int]:
        """(font_px, glyph width, block height, block width, margin) for an HxW image."""
        fp = self.font_px(h)
        gw = glyph_atlas(fp).shape[2]
        bh, bw = max(LINES[self.severity]) * (fp + 2), L * gw  # only the lines this severity shows
        m = max(int(0.015 * min(h, w)), 1)
        # Clip the block inside the margins: on small images an unclipped block would start at a
        # negative corner origin (w - bw - m < 0) and slice nothing.
        bh, bw = min(bh, h - 2 * m), min(bw, w - 2 * m)
        return fp, gw, bh, bw, m

    def _draw(self, r, b):
        th = isinstance(r, TorchRandom)
        xp = torch if th else np
        asx = (lambda a: torch.as_tensor(a)) if th else (lambda a: a)  # noqa: E731
        u = r.uniform(0, 1, (b, 2, 5, L))
        digit = (u * asx(_SPAN)).long() if th else (u * _SPAN).astype(np.int64)
        codes = xp.where(asx(_FIXED) >= 0, asx(_FIXED), digit + asx(_LO) + 1)  # '0' is index 1
        n0, n1 = LINES[self.severity]
        shown = asx(np.stack([np.arange(5) < n0, np.arange(5) < n1])[:, :, None])  # (2,5,1)
        codes = codes * shown
        # Two distinct corners: a random permutation's first two entries.
        keys = r.uniform(0, 1, (b, 4))
        order = keys.argsort(1) if th else np.argsort(keys, 1)
        return {"codes": codes, "order": order, "level": r.uniform(0.75, 1.0, (b,))}

    def _corners(self, order, free, xp):
        """First two corners of ``order`` that are free of lesion (else invisible)."""
        th = xp is torch
        fo = free.gather(1, order) if th else np.take_along_axis(free, order, 1)
        rank = (fo.long() if th else fo.astype(np.int64)).cumsum(1)
        # position of the first and second free corner (or 3 when missing)
        first = ((rank < 1).sum(1)).clamp(max=3) if th else np.minimum((rank < 1).sum(1), 3)
        second = ((rank < 2).sum(1)).clamp(max=3) if th else np.minimum((rank < 2).sum(1), 3)
        take = (lambda i: order.gather(1, i[:, None])[:, 0]) if th else (lambda i: np.take_along_axis(order, i[:, None], 1)[:, 0])  # noqa: E731
        corner = xp.stack([take(first), take(second)], 1)
        n0, n1 = LINES[self.severity]
        vis = xp.stack([rank[:, -1] >= 1, (rank[:, -1] >= 2) & (n1 > 0)], 1)
        return corner, (vis.float() if th else vis.astype(np.float32))

    def _origins(self, corner, h, w):
        _, _, bh, bw, m = self._layout(h, w)
        y0 = (corner >= 2) * (h - bh - m) + (corner < 2) * m
        x0 = (corner % 2 == 1) * (w - bw - m) + (corner % 2 == 0) * m
        return y0, x0

    def _free_corners_torch(self, masks, h, w):
        b = masks.shape[0]
        _, _, bh, bw, m = self._layout(h, w)
        c = torch.arange(4, device=masks.device)
        y0, x0 = self._origins(c, h, w)
        les = masks != 0
        out = []
        for i in range(4):  # four fixed corner regions, each a tensor reduction
            y, x = int(y0[i]), int(x0[i])
            out.append(~les[:, y:y + bh, x:x + bw].flatten(1).any(1))
        return torch.stack(out, 1)

    def _sample_torch(self, images, masks, generator):
        b, _, h, w = images.shape
        p = {k: v.to(images.device) for k, v in self._draw(TorchRandom(generator), b).items()}
        free = (self._free_corners_torch(masks, h, w) if masks is not None
                else torch.ones(b, 4, dtype=torch.bool, device=images.device))
        p["corner"], p["visible"] = self._corners(p.pop("order"), free, torch)
        return p

    def sample_numpy(self, image, mask=None, rng=None):
        # Hand-written numpy twin of _draw/_corners: this family's numpy path is meant to cost about as
        # much as one cv2.putText call, so it avoids generic helpers.
        image = check_image(image, self.name, self.rgb)
        mask = check_mask_np(mask, image, self.name)
        rng = rng if rng is not None else np.random.default_rng()
        u = rng.random((2, 5, L))
        codes = np.where(_FIXED >= 0, _FIXED, (u * _SPAN).astype(np.int64) + _LO + 1) * _SHOWN[self.severity]
        order = rng.permutation(4)
        if mask is not None:
            h, w = image.shape[:2]
            _, _, bh, bw, _ = self._layout(h, w)
            y0, x0 = self._origins(order, h, w)
            order = [c for c, y, x in zip(order, y0, x0) if not mask[y:y + bh, x:x + bw].any()]
        n1 = LINES[self.severity][1]
        corner = np.array((list(order) + [3, 3])[:2], np.int64)
        visible = np.array([len(order) >= 1, len(order) >= 2 and n1 > 0], np.float32)
        return {"codes": codes, "level": np.float32(0.75 + 0.25 * rng.random()), "corner": corner, "visible": visible}

    def _apply_torch(self, images, masks, params):
        b, c, h, w = images.shape
        fp, gw, bh, bw, _ = self._layout(h, w)
        atlas = _atlas_on(fp, images.device)  # (N, fp, gw)
        cell = fp + 2
        glyphs = atlas[params["codes"]]  # (B,2,5,L,fp,gw)
        glyphs = torch.nn.functional.pad(glyphs, (0, 0, 0, 2))  # line spacing
        blocks = glyphs.permute(0, 1, 2, 4, 3, 5).reshape(b, 2, 5 * cell, L * gw)[:, :, :bh, :bw]
        blocks = blocks * params["visible"][:, :, None, None].to(blocks.dtype)
        y0, x0 = self._origins(params["corner"], h, w)  # (B,2)
        yy = y0[..., None, None] + torch.arange(bh, device=images.device)[:, None]
        xx = x0[..., None, None] + torch.arange(bw, device=images.device)[None, :]
        idx = (yy * w + xx).expand(b, 2, bh, bw).reshape(b, -1)
        canvas = images.new_zeros(b, h * w)
        canvas.scatter_reduce_(1, idx, blocks.reshape(b, -1).to(images.dtype), reduce="amax")
        canvas = canvas.view(b, 1, h, w)
        if masks is not None:
            canvas = canvas * (masks[:, None] == 0)
        level = params["level"].to(images.dtype)[:, None, None, None]
        return torch.lerp(images, level.expand_as(images), canvas)

    def _apply_np(self, image, mask, params):
        h, w = image.shape[:2]
        fp, gw, bh, bw, _ = self._layout(h, w)
        atlas = _spaced_atlas(fp)  # (N, fp+2, gw)
        out = image if self.inplace else image.copy()
        level = float(params["level"]) * (255.0 if image.dtype == np.uint8 else 1.0)
        codes, vis = params["codes"], params["visible"]
        y0s, x0s = self._origins(np.asarray(params["corner"]), h, w)
        for k in range(2):  # at most two blocks
            n = LINES[self.severity][k]
            if vis[k] <= 0 or n == 0:
                continue
            rows = min(n * (fp + 2), bh)  # only the lines this severity shows
            a = atlas[codes[k, :n]].transpose(0, 2, 1, 3).reshape(n * (fp + 2), L * gw)[:rows, :bw]
            y, x = int(y0s[k]), int(x0s[k])
            if mask is not None:
                a = a * (mask[y:y + rows, x:x + bw] == 0)
            reg = out[y:y + rows, x:x + bw]
            blended = reg + a[:, :, None] * (level - reg)
            reg[...] = np.rint(blended) if image.dtype == np.uint8 else blended
        return out


@lru_cache(maxsize=32)
def _spaced_atlas(font_px: int) -> np.ndarray:
    """Glyph atlas with two blank rows under each glyph (the line spacing)."""
    g = glyph_atlas(font_px)
    return np.pad(g, ((0, 0), (0, 2), (0, 0)))


_SHOWN = {s: np.stack([np.arange(5) < n0, np.arange(5) < n1])[:, :, None].astype(np.int64)
          for s, (n0, n1) in LINES.items()}
