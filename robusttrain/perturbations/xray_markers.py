"""Burned-in radiograph annotations (``xray_markers``): a boxed lead L/R side marker in an upper corner
and technologist annotations ("PORTABLE", "AP SUPINE", "110KV", ...) along the top and bottom edges.

Glyphs are rendered once per size with ``cv2.putText`` (bold Hershey, like the endoscopy ``text`` family's
atlas but heavier strokes); a block is a gather from the atlas, done identically on both paths. Sizes are
fractions of the shorter image side and positions normalised, so params replay at any size. Annotations
never cover labelled anatomy (the mask), which is left unchanged.
"""

from __future__ import annotations

from functools import lru_cache

import cv2
import numpy as np
import torch

from .base import TorchRandom
from .grey import GreyPerturbation

CHARS = " ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:./-"
_IDX = {c: i for i, c in enumerate(CHARS)}
LMAX = 10  # characters per annotation
VOCAB = (
    "PORTABLE",
    "AP",
    "PA",
    "SUPINE",
    "ERECT",
    "UPRIGHT",
    "SEMI-ERECT",
    "AP SUPINE",
    "INSP",
    "CHEST",
    "110KV",
    "2.5MAS",
    "1.8MAS",
    "180 CM",
    "12:04",
    "BEDSIDE",
)
_VOCAB_CODES = np.array([[_IDX[c] for c in v.ljust(LMAX)] for v in VOCAB], np.int64)
MARKERS = ("L", "R")
WORDS = {1: 0, 2: 1, 3: 2, 4: 3, 5: 4}  # annotations shown at each severity (plus the side marker)
FONT_FRAC = {1: 0.030, 2: 0.032, 3: 0.035, 4: 0.038, 5: 0.042}  # glyph height / shorter side
MARKER_FRAC = {1: 0.060, 2: 0.065, 3: 0.070, 4: 0.075, 5: 0.080}  # marker box side / shorter side
KMAX = 4


@lru_cache(maxsize=32)
def stamp_atlas(font_px: int) -> np.ndarray:
    """(len(CHARS), font_px, glyph width) float32 alphas of bold upper-case glyphs."""
    gw = max(int(round(font_px * 0.7)), 4)
    scale = font_px * 0.8 / 22.0
    thick = max(1, int(round(font_px / 12)))
    atlas = np.zeros((len(CHARS), font_px, gw), np.uint8)
    for i, ch in enumerate(CHARS):
        if ch != " ":
            cv2.putText(
                atlas[i],
                ch,
                (0, int(round(font_px * 0.88))),
                cv2.FONT_HERSHEY_SIMPLEX,
                scale,
                255,
                thick,
                cv2.LINE_AA,
            )
    return atlas.astype(np.float32) / 255.0


@lru_cache(maxsize=32)
def marker_stamps(side_px: int) -> np.ndarray:
    """(2, side, side) float32 alphas: a boxed 'L' and a boxed 'R' lead marker."""
    out = np.zeros((2, side_px, side_px), np.uint8)
    t = max(1, side_px // 12)
    scale = side_px * 0.62 / 22.0
    thick = max(1, side_px // 8)
    for i, ch in enumerate(MARKERS):
        cv2.rectangle(out[i], (0, 0), (side_px - 1, side_px - 1), 255, t)
        (tw, th), _ = cv2.getTextSize(ch, cv2.FONT_HERSHEY_SIMPLEX, scale, thick)
        org = ((side_px - tw) // 2, (side_px + th) // 2)
        cv2.putText(out[i], ch, org, cv2.FONT_HERSHEY_SIMPLEX, scale, 255, thick, cv2.LINE_AA)
    return out.astype(np.float32) / 255.0


_ON: dict[tuple, torch.Tensor] = {}


def _on(key: tuple, arr_fn, device: torch.device) -> torch.Tensor:
    k = key + (device,)
    if k not in _ON:
        _ON[k] = torch.from_numpy(arr_fn(key[1])).to(device)
    return _ON[k]


class XrayMarkers(GreyPerturbation):
    """Burned-in side marker and annotations on a radiograph.

    Params: ``marker`` 0/1 (L/R), ``marker_pos`` (2,) normalised top-left corner (upper-left or upper-right
    corner zone), ``codes`` (4, 10) character indices into :data:`CHARS` (0 = blank; hidden annotations
    are all blank), ``word_pos`` (4, 2) normalised top-left corners (top or bottom band), ``level`` the
    brightness of the burned-in pixels. Severity -> annotations shown (1: 0, 2: 1, 3: 2, 4: 3, 5: 4) and
    size (glyphs 3.0-4.2 %, marker box 6-8 % of the shorter side).

    Example:
        >>> import numpy as np
        >>> img = np.full((256, 256), 60, np.uint8)
        >>> out, p = XrayMarkers(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> int(out.max()) > 180 and p["codes"].shape == (4, 10)
        True
    """

    name = "xray_markers"
    occludes = True  # burned-in markers and text hide what lies under them

    def sizes(self, h: int, w: int) -> tuple[int, int, int, int]:
        """(glyph height, glyph width, annotation block width, marker side) in pixels for an HxW image."""
        s = min(h, w)
        fp = min(max(int(round(FONT_FRAC[self.severity] * s)), 6), h)
        mp = min(max(int(round(MARKER_FRAC[self.severity] * s)), 8), s)
        gw = stamp_atlas(fp).shape[2]
        return fp, gw, min(LMAX * gw, w), mp

    def _draw(self, r, b):
        th = isinstance(r, TorchRandom)
        xp = torch if th else np
        vocab = r.integers(0, len(VOCAB), (b, KMAX))
        shown = np.arange(KMAX) < WORDS[self.severity]
        table, shown = (
            (torch.as_tensor(_VOCAB_CODES, device=r.device), torch.as_tensor(shown, device=r.device))
            if th  # constants on the draw's device: a CUDA generator draws on the GPU
            else (_VOCAB_CODES, shown)
        )
        codes = table[vocab] * shown[None, :, None]
        band = r.integers(0, 2, (b, KMAX)) == 0
        wy = xp.where(band, r.uniform(0.015, 0.08, (b, KMAX)), r.uniform(0.88, 0.95, (b, KMAX)))
        word_pos = xp.stack([wy, r.uniform(0.02, 0.6, (b, KMAX))], -1)
        right = r.integers(0, 2, (b,)) == 1
        mx = xp.where(right, r.uniform(0.82, 0.9, (b,)), r.uniform(0.03, 0.12, (b,)))
        marker_pos = xp.stack([r.uniform(0.03, 0.15, (b,)), mx], -1)
        f32 = (lambda a: a.float()) if th else (lambda a: a.astype(np.float32))  # noqa: E731
        return {
            "marker": r.integers(0, 2, (b,)),
            "marker_pos": f32(marker_pos),
            "codes": codes,
            "word_pos": f32(word_pos),
            "level": r.uniform(0.8, 1.0, (b,)),
        }

    @staticmethod
    def _origin(pos, n: int, size: int, xp):
        o = (pos * n).floor() if xp is torch else np.floor(np.asarray(pos, np.float32) * np.float32(n))
        o = o.long() if xp is torch else o.astype(np.int64)
        return o.clamp(0, n - size) if xp is torch else np.clip(o, 0, n - size)

    def _grey_torch(self, x, masks, params):
        b, h, w = x.shape
        fp, gw, bw, mp = self.sizes(h, w)
        dev = x.device
        atlas = _on(("atlas", fp), stamp_atlas, dev)
        stamps = _on(("marker", mp), marker_stamps, dev)
        glyphs = atlas[params["codes"]]  # (B,K,L,fp,gw)
        blocks = glyphs.permute(0, 1, 3, 2, 4).reshape(b, KMAX, fp, LMAX * gw)[:, :, :fp, :bw]
        wy = self._origin(params["word_pos"][..., 0], h, fp, torch)
        wx = self._origin(params["word_pos"][..., 1], w, bw, torch)
        yy = wy[..., None, None] + torch.arange(fp, device=dev)[:, None]
        xx = wx[..., None, None] + torch.arange(bw, device=dev)[None, :]
        idx_w = (yy * w + xx).reshape(b, -1)
        my = self._origin(params["marker_pos"][:, 0], h, mp, torch)
        mx = self._origin(params["marker_pos"][:, 1], w, mp, torch)
        ar = torch.arange(mp, device=dev)
        idx_m = ((my[:, None, None] + ar[:, None]) * w + mx[:, None, None] + ar[None, :]).reshape(b, -1)
        val = torch.cat([blocks.reshape(b, -1), stamps[params["marker"]].reshape(b, -1)], 1)
        canvas = x.new_zeros(b, h * w)
        canvas.scatter_reduce_(1, torch.cat([idx_w, idx_m], 1), val.to(x.dtype), reduce="amax")
        canvas = canvas.view(b, h, w)
        if masks is not None:
            canvas = canvas * (masks == 0)
        return torch.lerp(x, params["level"].to(x.dtype)[:, None, None].expand_as(x), canvas)

    def _grey_np(self, x, mask, params, out):
        h, w = x.shape
        fp, gw, bw, mp = self.sizes(h, w)
        atlas = stamp_atlas(fp)
        canvas = np.zeros((h, w), np.float32)
        codes = np.asarray(params["codes"])
        wy = self._origin(params["word_pos"][:, 0], h, fp, np)
        wx = self._origin(params["word_pos"][:, 1], w, bw, np)
        for k in range(KMAX):
            if not codes[k].any():
                continue
            block = atlas[codes[k]].transpose(1, 0, 2).reshape(fp, LMAX * gw)[:fp, :bw]
            reg = canvas[wy[k] : wy[k] + fp, wx[k] : wx[k] + bw]
            np.maximum(reg, block, out=reg)
        my = int(self._origin(params["marker_pos"][0], h, mp, np))
        mx = int(self._origin(params["marker_pos"][1], w, mp, np))
        reg = canvas[my : my + mp, mx : mx + mp]
        np.maximum(reg, marker_stamps(mp)[int(params["marker"])], out=reg)
        if mask is not None:
            canvas *= mask == 0
        np.subtract(np.float32(params["level"]), x, out=out)
        np.multiply(out, canvas, out=out)
        return np.add(out, x, out=out)
