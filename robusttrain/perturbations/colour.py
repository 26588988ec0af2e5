"""Lightness families (paper 000, MR1-1..MR1-3): ``saturation``, ``contrast``, ``white_balance``.

Each is an affine map of RGB, ``out = clip(M @ rgb + offset)`` with a per-sample 3x3 ``M``, so the
uint8 numpy path is ONE fused pass (``cv2.transform``, saturating and rounding) and the torch path is
one batched matmul into a preallocated output — no chain of full-image passes.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import torch

from .base import NumpyRandom, Params, Perturbation, TorchRandom, f32
from .base import cast as as_dtype

# Rec.601 luma weights (what torchvision's rgb_to_grayscale uses) for RGB order.
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)
_F32 = np.float32
_LUMA_F32 = tuple(_F32(w) for w in LUMA)  # numpy float32 scalars: f32 arithmetic, as on the arrays


def _uniform(rng: np.random.Generator, lo: float, hi: float) -> np.float32:
    """``NumpyRandom.uniform(lo, hi, (1,))[0]`` (numpy's own formula, so the same value from the same stream)."""
    return _F32(lo + (hi - lo) * rng.random())


_CONST_ON: dict[tuple[str, torch.device, torch.dtype], torch.Tensor] = {}


def const_on(name: str, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``"luma"`` (3,) weights (``"luma_row"`` shaped (1,1,3)) or the ``"eye"`` (3, 3) identity on ``device``,
    made once (a constant built per call costs ops every call). Callers must not modify it."""
    key = (name, device, dtype)
    if key not in _CONST_ON:
        if name == "luma_row":  # (1,1,3): the weights broadcast over (B,3,3)
            value = LUMA.reshape(1, 1, 3)
        else:
            value = LUMA if name == "luma" else np.eye(3, dtype=np.float32)
        _CONST_ON[key] = torch.as_tensor(value, device=device, dtype=dtype)
    return _CONST_ON[key]


_ZEROS_ON: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _zeros_on(b: int, c: int, device: torch.device) -> torch.Tensor:
    """A (b, c) float32 zero offset on ``device``, made once per shape (callers must not modify it)."""
    key = (b, c, device)
    if key not in _ZEROS_ON:
        _ZEROS_ON[key] = torch.zeros(b, c, device=device)
    return _ZEROS_ON[key]


def _xp(v: Any):
    return torch if isinstance(v, torch.Tensor) else np


def _scaled_saturation_rows(s: np.float32, k: np.float32, off: float = 0.0) -> list[list[float]]:
    """The (3,4) affine ``[k * S(s) | off]`` of one image, in float32 scalar arithmetic.

    Each entry is computed with the same float32 operations, in the same order, as ``k[:, None, None] *
    _saturation_matrix(s, np)`` on (1,) arrays (``s*I`` adds exactly s or 0), so the matrix is bit-identical
    to the batched formula; on 12 numbers, scalars cost a fraction of the array ops.
    """
    t = [(1 - s) * w for w in _LUMA_F32]
    d = [s + x for x in t]
    r0, r1, r2 = (float(k * x) for x in t)
    return [
        [float(k * d[0]), r1, r2, off],
        [r0, float(k * d[1]), r2, off],
        [r0, r1, float(k * d[2]), off],
    ]


def _saturation_matrix(s: Any, xp) -> Any:
    """(B,3,3) matrices blending each pixel with its grey value: S = s*I + (1-s) * 1 w^T."""
    if xp is not np:  # the same products and sum, with one view of ``s`` and constant shapes (fewer ops)
        s3 = s.reshape(-1, 1, 1)
        return s3 * const_on("eye", s.device) + (1 - s3) * const_on("luma_row", s.device)
    w = xp.asarray(LUMA)
    eye = xp.eye(3, dtype=xp.float32)
    return s[:, None, None] * eye + (1 - s)[:, None, None] * w[None, None, :]


_BRIGHT = {s: (1.0, 1.0 + 0.04 * s) for s in range(1, 6)}  # Saturation's brightness range per severity


class _AffineColour(Perturbation):
    """Shared apply code for families expressed as ``matrix`` (3x3) and ``offset`` (3,) params."""

    def _affine(self, params: dict[str, Any], channels: int = 3) -> tuple[Any, Any]:
        raise NotImplementedError

    def _affine_np(self, params: dict[str, Any], channels: int, scale: float) -> list[list[float]]:
        """The (C, C+1) matrix ``[M | offset * scale]`` that cv2.transform applies to one image.

        Generic version: ``_affine`` on one-sample arrays. The three families override it with float32
        scalar arithmetic that gives the same numbers (a test checks them against this one) in a few
        microseconds less — most of a 128x128 image's cost besides the cv2 pass itself.
        """
        m, off = self._affine({k: np.asarray(v)[None] for k, v in params.items()}, channels)
        return np.concatenate([m[0], off[0][:, None] * scale], axis=1).tolist()

    def _apply_torch(self, images: torch.Tensor, masks: torch.Tensor | None, params: Params) -> torch.Tensor:
        b, c, h, w = images.shape
        m, off = self._affine(params, c)
        if (
            c == 1
            and images.device.type == "cpu"
            and images.dtype == torch.float32
            and not images.requires_grad
        ):
            # grey (MRI / X-ray) on CPU: one fused OpenCV pass per cache-resident plane beats a (1x1) bmm
            x, out = (
                images.detach().contiguous().numpy(),
                torch.empty(images.shape, dtype=images.dtype),
            )  # contiguous planes
            o = out.numpy()
            for i, (mi, oi) in enumerate(zip(m[:, 0, 0].tolist(), off[:, 0].tolist())):
                cv2.addWeighted(x[i, 0], mi, x[i, 0], 0.0, oi, dst=o[i, 0])
                if (
                    oi < 1e-3 or mi + oi > 0.999
                ):  # x in [0,1] (±1e-4) maps into [oi, mi + oi]: clip if it may leave
                    np.clip(o[i, 0], 0.0, 1.0, out=o[i, 0])
            return out
        out = torch.empty_like(images)
        # One read + one write of the batch: out = offset + M @ x, then an in-place clamp.
        torch.baddbmm(
            as_dtype(off, images.dtype).unsqueeze(2),
            as_dtype(m, images.dtype),
            images.reshape(b, c, h * w),
            out=out.view(b, c, h * w),
        )
        return out.clamp_(0.0, 1.0)

    def _apply_np(
        self, image: np.ndarray, mask: np.ndarray | None, params: dict[str, np.ndarray]
    ) -> np.ndarray:
        scale = 255.0 if image.dtype == np.uint8 else 1.0
        affine = np.array(self._affine_np(params, image.shape[2], scale), np.float64)
        out = cv2.transform(image, affine)  # uint8: rounds and saturates in the same pass
        if out.ndim == 2:  # OpenCV drops a single channel axis
            out = out[:, :, None]
        if out.dtype != np.uint8:
            np.clip(out, 0.0, 1.0, out=out)
        return out


class Saturation(_AffineColour):
    """Over-exposure (MR1-1): saturation boosted by ``factor`` > 1, brightness slightly raised.

    Severity -> ``factor`` range (1: 1.1-1.25, 2: 1.25-1.45, 3: 1.45-1.65, 4: 1.65-1.9, 5: 1.9-2.3), brightness
    in [1, 1 + 0.04*severity]. The paper draws from [s1, s2] biased above 1; we keep the whole range above 1
    so every severity is an over-exposure.

    Example:
        >>> import numpy as np
        >>> img = np.full((8, 8, 3), (120, 80, 60), np.uint8)
        >>> out, params = Saturation(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> int(out[0, 0, 0]) > 120 and int(out[0, 0, 2]) < 60   # red up, blue down: more saturated
        True
    """

    name = "saturation"
    RANGES = {1: (1.1, 1.25), 2: (1.25, 1.45), 3: (1.45, 1.65), 4: (1.65, 1.9), 5: (1.9, 2.3)}

    def _draw(self, r: TorchRandom | NumpyRandom, b: int) -> dict[str, Any]:
        lo, hi = self.RANGES[self.severity]
        return {
            "factor": r.uniform(lo, hi, (b,)),
            "brightness": r.uniform(*_BRIGHT[self.severity], (b,)),
        }

    def _draw_at(self, r, sev):
        return {
            "factor": r.uniform_at(self.RANGES, sev, (sev.numel(),)),
            "brightness": r.uniform_at(_BRIGHT, sev, (sev.numel(),)),
        }

    def _sample_np(self, image, mask, rng):
        # _draw's numpy draws as scalars (the same two uniforms from the same stream, rounded to float32)
        rng = rng if rng is not None else np.random.default_rng()
        factor = _uniform(rng, *self.RANGES[self.severity])
        return {"factor": factor, "brightness": _uniform(rng, 1.0, 1.0 + 0.04 * self.severity)}

    def _affine_np(self, params, channels, scale):
        return _scaled_saturation_rows(_F32(params["factor"]), _F32(params["brightness"]))

    def _affine(self, params, channels=3):
        f, br = params["factor"], params["brightness"]
        xp = _xp(f)
        if xp is not np:
            return br.reshape(-1, 1, 1) * _saturation_matrix(f, xp), _zeros_on(f.shape[0], 3, f.device)
        m = br[:, None, None] * _saturation_matrix(f, xp)
        return m, xp.zeros((f.shape[0], 3), dtype=xp.float32)


class Contrast(_AffineColour):
    """Under-exposure (MR1-2): contrast, brightness and saturation lowered together.

    ``out = c*b*S(s) @ x + (1-c)*b*mean`` — brightness ``b``, then contrast ``c`` around the image's mean grey
    level (stored in params as ``mean`` so a replay needs no image statistics), then saturation ``s``; all
    three factors come from the severity's range (1: 0.82-0.9, 2: 0.74-0.82, 3: 0.66-0.74, 4: 0.58-0.66, 5: 0.5-0.58).

    Example:
        >>> import numpy as np
        >>> img = np.full((8, 8, 3), 200, np.uint8)
        >>> out, _ = Contrast(severity=5).apply_numpy(img, rng=np.random.default_rng(0))
        >>> int(out.max()) < 200
        True
    """

    name = "contrast"
    rgb = False  # grey images (MRI, X-ray) get the same under-exposure without the saturation part
    RANGES = {1: (0.82, 0.9), 2: (0.74, 0.82), 3: (0.66, 0.74), 4: (0.58, 0.66), 5: (0.5, 0.58)}

    def _draw(self, r, b):
        lo, hi = self.RANGES[self.severity]
        return {k: r.uniform(lo, hi, (b,)) for k in ("contrast", "brightness", "saturation")}

    def _draw_at(self, r, sev):
        return {
            k: r.uniform_at(self.RANGES, sev, (sev.numel(),))
            for k in ("contrast", "brightness", "saturation")
        }

    def _sample_np(self, image, mask, rng):
        rng = rng if rng is not None else np.random.default_rng()
        lo, hi = self.RANGES[self.severity]
        draws = {k: _uniform(rng, lo, hi) for k in ("contrast", "brightness", "saturation")}  # as _draw
        draws.update(self._content_numpy(image, mask, draws))
        return draws

    def _affine_np(self, params, channels, scale):
        c, br = _F32(params["contrast"]), _F32(params["brightness"])
        off = float((1 - c) * br * _F32(params["mean"]) * scale)  # float32 steps, as in _affine
        k = c * br
        if channels == 1:
            return [[float(k), off]]
        return _scaled_saturation_rows(_F32(params["saturation"]), k, off)

    def _content_torch(self, images, masks, draws):
        means = images.mean(dim=(2, 3))
        if images.shape[1] == 1:
            return {"mean": means[:, 0]}
        return {"mean": means @ const_on("luma", images.device, images.dtype)}

    def _content_numpy(self, image, mask, draws):
        c = image.shape[2] if image.ndim == 3 else 1
        means = np.asarray(cv2.mean(image)[:c], dtype=np.float64)
        scale = 1 / 255 if image.dtype == np.uint8 else 1.0
        grey = means[0] if c == 1 else means @ LUMA
        return {"mean": np.float32(grey * scale)}

    def _affine(self, params, channels=3):
        c, br, s, mean = params["contrast"], params["brightness"], params["saturation"], params["mean"]
        xp = _xp(c)
        if xp is not np:  # the same products, one view each, the offset broadcast (not multiplied by 1)
            k3 = (c * br).reshape(-1, 1, 1)
            m = k3 if channels == 1 else k3 * _saturation_matrix(s, xp)
            return m, ((1 - c) * br * mean).unsqueeze(1).expand(-1, channels)
        # saturation is the identity on grey: out = c*b*x + (1-c)*b*mean
        m = (c * br)[:, None, None] if channels == 1 else (c * br)[:, None, None] * _saturation_matrix(s, xp)
        ones = (
            xp.ones((1, channels), dtype=xp.float32) if xp is np else torch.ones(1, channels, device=c.device)
        )
        return m, ((1 - c) * br * mean)[:, None] * ones


class WhiteBalance(_AffineColour):
    """Colour cast (MR1-3): green cast scales R and B down, purple cast scales R and G down.

    ``cast`` is 0 (green) or 1 (purple); the two channels are scaled by ``scale`` (severity 1: 0.85-0.9,
    2: 0.75-0.85, 3: 0.65-0.75, 4: 0.55-0.65, 5: 0.45-0.55 — the paper's "about half" is severity 5) with
    a small independent jitter (±3 %) so their proportion is kept roughly but not exactly.
    Pass ``cast="green"`` or ``"purple"`` to fix the cast.

    Example:
        >>> import numpy as np
        >>> img = np.full((4, 4, 3), 200, np.uint8)
        >>> out, p = WhiteBalance(severity=5, cast="green").apply_numpy(img, rng=np.random.default_rng(0))
        >>> out[0, 0].tolist()[1] == 200 and int(out[0, 0, 0]) < 120
        True
    """

    name = "white_balance"
    RANGES = {1: (0.85, 0.9), 2: (0.75, 0.85), 3: (0.65, 0.75), 4: (0.55, 0.65), 5: (0.45, 0.55)}
    CASTS = ("green", "purple")

    def __init__(self, severity: int = 3, cast: str | None = None):
        super().__init__(severity)
        if cast is not None and cast not in self.CASTS:
            raise ValueError(
                f"white_balance: cast must be one of {self.CASTS} or None (random), got {cast!r}"
            )
        self.cast = cast

    def _sample_np(self, image, mask, rng):
        # _draw's numpy branch with scalar draws: the same values from the same stream
        rng = rng if rng is not None else np.random.default_rng()
        fixed = self.cast is not None
        cast = np.int64(rng.integers(0, 1) + self.CASTS.index(self.cast) if fixed else rng.integers(0, 2))
        scale = _uniform(rng, *self.RANGES[self.severity])
        s1, s2 = scale * _uniform(rng, 0.97, 1.03), scale * _uniform(rng, 0.97, 1.03)
        one = _F32(1)
        gains = np.array([s1, s2, one] if cast else [s1, one, s2], np.float32)
        return {"cast": cast, "gains": gains}

    def _affine_np(self, params, channels, scale):
        g0, g1, g2 = np.asarray(params["gains"], np.float32).tolist()
        return [[g0, 0.0, 0.0, 0.0], [0.0, g1, 0.0, 0.0], [0.0, 0.0, g2, 0.0]]

    def _draw_at(self, r, sev):
        return self._draw(r, sev.numel(), sev)

    def _draw(self, r, b, sev=None):
        cast = (
            r.integers(0, 2, (b,))
            if self.cast is None
            else (r.integers(0, 1, (b,)) + self.CASTS.index(self.cast))
        )
        scale = (
            r.uniform(*self.RANGES[self.severity], (b,))
            if sev is None
            else r.uniform_at(self.RANGES, sev, (b,))
        )
        jitter = r.uniform(0.97, 1.03, (b, 2))
        if isinstance(scale, np.ndarray):  # numpy path (one image per call): the same gains in fewer tiny ops
            s12 = scale[:, None] * jitter
            gains = np.ones((b, 3), np.float32)
            gains[:, 0] = s12[:, 0]
            purple = cast != 0
            gains[:, 1] = np.where(purple, s12[:, 1], np.float32(1))
            gains[:, 2] = np.where(purple, np.float32(1), s12[:, 1])
            return {"cast": cast, "gains": gains}
        xp = _xp(scale)
        one = xp.ones_like(scale)
        s1, s2 = scale * jitter[:, 0], scale * jitter[:, 1]
        green = xp.stack([s1, one, s2], 1)  # R, G, B for a green cast
        purple = xp.stack([s1, s2, one], 1)  # R, G, B for a purple cast
        gains = xp.where((cast == 0)[:, None], green, purple)
        return {"cast": cast, "gains": gains.astype(np.float32) if xp is np else f32(gains)}

    def _affine(self, params, channels=3):
        g = params["gains"]
        xp = _xp(g)
        if xp is np:
            m = np.zeros((g.shape[0], 3, 3), np.float32)
            m[:, [0, 1, 2], [0, 1, 2]] = g
            return m, np.zeros((g.shape[0], 3), np.float32)
        return torch.diag_embed(f32(g)), _zeros_on(g.shape[0], 3, g.device)

    def _apply_torch(self, images, masks, params):
        # A diagonal matrix is just a per-channel gain: one broadcasted multiply into a fresh buffer.
        g = as_dtype(params["gains"], images.dtype)
        out = torch.mul(images, g.reshape(g.shape[0], -1, 1, 1))
        return out.clamp_(0.0, 1.0)
