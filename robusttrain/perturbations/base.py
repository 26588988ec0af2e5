"""The contract every perturbation follows (owned by the perturbations package).

A perturbation has one parameter schema and two ways to apply it:

* ``sample_params(images, masks, generator)`` draws *per-sample* parameters for a batch
  as a ``dict[str, torch.Tensor]`` whose tensors all have leading dimension B.
  Everything needed to replay the perturbation exactly is in there (positions in
  normalised or pixel coordinates, seeds of procedural shapes, character codes, ...).
* ``apply_batch(images, masks=None, generator=None, params=None)`` -> ``(out, params)``
  applies it to a (B,C,H,W) float tensor in [0,1] on any device. With ``params`` it
  replays exactly; without, it samples them first.
* ``apply_numpy(image, mask=None, params=None, rng=None)`` -> ``(out, params)`` applies it to
  one HWC image (uint8 or float32 in [0,1]) with the params of *one* sample
  (``index_params(params, i)``); used by the Albumentations transform and by the
  metamorphic checker on CPU. For the same params both paths agree within 2/255.

Masks are never modified. ``severity`` is an int in 1..5.

**Units.** Every spatial param is stored relative to the image, never in pixels, so a recorded
perturbation replays on an image of any size and means the same visible change at every resolution:
positions as fractions of the height / width (pixel *centres*: ``y_rel = (y_px + 0.5) / H``), lengths
(blur sigma, motion length, spot axes, object sizes, text height) as fractions of the shorter side
``min(H, W)``. The ranges are calibrated so that an image whose shorter side is :data:`REF_SIDE` = 512 px
gets the paper's pixel ranges. Such params carry a ``_rel`` suffix (``sigma_rel``, ``center_rel``, ...);
params recorded by older versions in pixels have other keys and are refused with a clear error.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

Params = dict[str, torch.Tensor]

REF_SIDE = 512  # shorter side (px) at which the relative ranges reproduce the paper's pixel ranges


def short_side(h: int, w: int) -> int:
    """The length (px) that relative sizes are fractions of: the image's shorter side."""
    return min(int(h), int(w))


def supersampling(h: int, w: int, cap: int = 4) -> int:
    """Sub-pixel grid factor for drawn shapes on an HxW image: ``round(512 / shorter side)``, 1..cap.

    Spots and objects are evaluated on an n x n grid per pixel and averaged (area sampling), so a small
    image shows what the 512-px rendering shows once downsized, instead of aliased point samples.
    """
    return int(min(max(round(REF_SIDE / short_side(h, w)), 1), cap))


def rel_to_px(v_rel, n: int):
    """Relative position along an axis of ``n`` pixels -> pixel coordinate (pixel centres are integers)."""
    return v_rel * n - 0.5


def px_to_rel(v_px, n: int):
    """Inverse of :func:`rel_to_px`."""
    return (v_px + 0.5) / n


def index_params(params: Params, i: int) -> dict[str, np.ndarray]:
    """Params of sample ``i`` as numpy arrays (the numpy path's schema)."""
    return {k: v[i].detach().cpu().numpy() for k, v in params.items()}


def stack_params(items: list[dict[str, Any]]) -> Params:
    """Inverse of :func:`index_params`: per-sample dicts -> batched tensors."""
    if not items:
        raise ValueError("stack_params: empty list of per-sample params")
    keys = items[0].keys()
    return {k: torch.as_tensor(np.stack([np.asarray(it[k]) for it in items])) for k in keys}


FamilyParams = list[tuple[torch.Tensor, Params]]  # (batch rows as a CPU long tensor, their params)


def severity_tensor(severities: Any, b: int, name: str = "perturbation") -> torch.Tensor:
    """Per-sample severities (a sequence or tensor of B ints 1..5) as a CPU long tensor, checked once."""
    return _severities(severities, b, name)[0]


def _severities(severities: Any, b: int, name: str) -> tuple[torch.Tensor, list[int]]:
    """:func:`severity_tensor` and its values as host ints (read once: every read of a tensor is ops). A numpy
    integer array (what :class:`~robusttrain.training.worst_of_k.WorstOfK` passes) is read without a tensor
    op and wrapped without a copy (one op instead of four)."""
    if isinstance(severities, np.ndarray) and severities.dtype.kind in "iu":
        arr = severities.reshape(-1)
        if arr.size != b:
            raise ValueError(f"{name}: severities must have one entry per image (B={b}), got {arr.size}")
        values = arr.tolist()
        sev = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.int64))
    else:
        sev = torch.as_tensor(severities)
        sev = sev if sev.ndim == 1 else sev.reshape(-1)
        if sev.numel() != b:
            raise ValueError(f"{name}: severities must have one entry per image (B={b}), got {sev.numel()}")
        if sev.is_floating_point() or sev.dtype == torch.bool:
            raise ValueError(f"{name}: severities must be integers 1..5, got dtype {sev.dtype}")
        values = sev.tolist()  # host data (drawn on the CPU): no device sync on this path
        sev = sev if sev.device.type == "cpu" and sev.dtype == torch.long else sev.cpu().long()
    if min(values) < 1 or max(values) > 5:
        raise ValueError(
            f"{name}: severities must be integers 1..5, got values in [{min(values)}, {max(values)}]"
        )
    _LAST_SEVERITIES[:] = [(sev, values)]
    return sev, values


# The last severity tensor read by _severities and its host values (the tensor held, so its identity is
# its own while it is here): a family's sampler that needs the values on the host gets them without ops.
_LAST_SEVERITIES: list[tuple[torch.Tensor, list[int]]] = []


def severity_values(sev: torch.Tensor) -> list[int]:
    """``sev.tolist()`` for a CPU severity tensor, without the read (two ops) when it is the one the current
    family call checked."""
    if _LAST_SEVERITIES and _LAST_SEVERITIES[0][0] is sev:
        return list(_LAST_SEVERITIES[0][1])
    return sev.tolist()


def severity_groups(sev: torch.Tensor | list[int]) -> list[tuple[int, torch.Tensor]]:
    """``(severity, rows)`` per distinct severity of a CPU long tensor (or its values as host ints), in order
    of first appearance."""
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(sev if isinstance(sev, list) else sev.tolist()):
        groups.setdefault(int(s), []).append(i)
    if len(groups) == 1:
        return [(s, all_rows(len(rows))) for s, rows in groups.items()]
    return [(s, torch.from_numpy(np.asarray(rows, dtype=np.int64))) for s, rows in groups.items()]


_ALL_ROWS: dict[int, torch.Tensor] = {}


def all_rows(b: int) -> torch.Tensor:
    """``torch.arange(b)`` (CPU long), made once per ``b``: the rows of a one-group family call. Shared, so
    :func:`_is_arange` knows it without reading it; callers must not modify it."""
    rows = _ALL_ROWS.get(b)
    if rows is None:
        rows = _ALL_ROWS[b] = torch.arange(b)
    return rows


def merge_groups(groups: FamilyParams, b: int) -> FamilyParams:
    """Groups covering rows 0..b-1 as ONE group in row order when their keys and shapes agree (a family that
    batches severities then applies them in one call); else the groups unchanged.

    >>> import torch
    >>> g = [(torch.tensor([1]), {"a": torch.tensor([5.0])}), (torch.tensor([0]), {"a": torch.tensor([7.0])})]
    >>> [(rows.tolist(), p["a"].tolist()) for rows, p in merge_groups(g, 2)]
    [([0, 1], [7.0, 5.0])]
    """
    if len(groups) < 2:
        return groups
    keys = set(groups[0][1])
    if any(
        set(p) != keys or any(p[k].shape[1:] != groups[0][1][k].shape[1:] for k in keys) for _, p in groups
    ):
        return groups
    order = torch.cat([rows for rows, _ in groups])
    if sorted(order.tolist()) != list(range(b)):
        return groups
    inv = order.argsort()
    merged = {}
    for k in keys:
        vals = [p[k] for _, p in groups]
        dev = vals[0].device
        merged[k] = torch.cat([v.to(dev) for v in vals])[inv.to(dev)]
    return [(all_rows(b), merged)]


def _is_arange(rows: torch.Tensor) -> bool:
    if rows is _ALL_ROWS.get(rows.numel()):
        return True  # the shared arange: known without reading it (a read is two ops)
    return rows.tolist() == list(range(rows.numel()))


# Open shared-map scopes (placement.SharedMaps pushes itself here while open): rows taken from a batch
# whose field-of-view maps are shared keep sharing them. The stack lives here, not in placement, so the
# base class never imports a family module (no import circle).
SHARED_SCOPES: list[Any] = []


def _take_rows(
    x: torch.Tensor, m: torch.Tensor | None, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if rows.numel() == x.shape[0] and _is_arange(rows):
        return x, m
    for shared in reversed(SHARED_SCOPES):
        hit = shared.take_from(x, m, rows)
        if hit is not None:
            return hit
    dev = rows.to(x.device)
    return x[dev], None if m is None else m[dev]


# --------------------------------------------------------------------------------------
# Shared machinery: input checks, random sources, the Perturbation base class.
# --------------------------------------------------------------------------------------

SEVERITIES = (1, 2, 3, 4, 5)


def check_severity(severity: int, name: str = "perturbation") -> int:
    """Validate a severity level (an int 1..5) and return it."""
    if (
        isinstance(severity, bool)
        or not isinstance(severity, (int, np.integer))
        or not 1 <= int(severity) <= 5
    ):
        raise ValueError(
            f"{name}: severity must be an int in 1..5 (5 = strongest clinically plausible), got {severity!r}"
        )
    return int(severity)


def check_batch(images: Any, name: str, rgb: bool, check_range: bool = True) -> torch.Tensor:
    """Validate a (B,C,H,W) float tensor in [0,1]; raise a ValueError/TypeError saying what was expected.

    The value-range check needs the data on the host, so it only runs for CPU tensors: on an
    accelerator it would force a device->host synchronisation in the hot path.
    """
    if not isinstance(images, torch.Tensor):
        raise TypeError(
            f"{name}: images must be a torch.Tensor of shape (B,C,H,W), got {type(images).__name__}"
        )
    if images.ndim != 4:
        raise ValueError(f"{name}: images must have shape (B,C,H,W), got shape {tuple(images.shape)}")
    if images.shape[0] == 0:
        raise ValueError(f"{name}: empty batch (B=0); expected at least one image")
    if not images.is_floating_point():
        raise TypeError(f"{name}: images must be a float tensor in [0,1], got dtype {images.dtype}")
    c = images.shape[1]
    if rgb and c != 3:
        raise ValueError(
            f"{name}: needs RGB images with 3 channels in dim 1 (B,3,H,W), got {c} channels "
            f"(shape {tuple(images.shape)}; channels-last input must be permuted first)"
        )
    if not rgb and c not in (1, 3):
        raise ValueError(
            f"{name}: expected 1 or 3 channels in dim 1 (B,C,H,W), got shape {tuple(images.shape)}"
        )
    if check_range and images.device.type == "cpu":
        lo, hi = torch.aminmax(images)
        if not (math.isfinite(float(lo)) and math.isfinite(float(hi))):
            # NaN compares false with everything: without this it would pass the range check
            # and flow through every perturbation into a "robustness" figure
            bad = sorted({int(i) for i in (~torch.isfinite(images)).flatten(1).any(1).nonzero().flatten()})
            raise ValueError(
                f"{name}: images contain NaN or inf (batch index {bad}); expected finite values in [0,1]"
            )
        if float(lo) < -1e-4 or float(hi) > 1 + 1e-4:
            raise ValueError(
                f"{name}: float images must lie in [0,1], got values in [{float(lo):.3g}, {float(hi):.3g}]"
            )
    return images


def check_masks(masks: Any, images: torch.Tensor, name: str) -> torch.Tensor | None:
    """Validate lesion masks (B,H,W) (or (B,1,H,W)) matching ``images``; nonzero = lesion."""
    if masks is None:
        return None
    if not isinstance(masks, torch.Tensor):
        raise TypeError(
            f"{name}: masks must be a torch.Tensor (B,H,W) of class indices, got {type(masks).__name__}"
        )
    if masks.ndim == 4 and masks.shape[1] == 1:
        masks = masks[:, 0]
    b, _, h, w = images.shape
    if masks.shape != (b, h, w):
        raise ValueError(
            f"{name}: masks must have shape (B,H,W)={(b, h, w)} to match images, got {tuple(masks.shape)}"
        )
    return masks if masks.device == images.device else masks.to(images.device)


def check_image(image: Any, name: str, rgb: bool) -> np.ndarray:
    """Validate one HWC numpy image, uint8 or float32 in [0,1]."""
    if not isinstance(image, np.ndarray):
        raise TypeError(f"{name}: image must be a numpy array (H,W,C), got {type(image).__name__}")
    if image.ndim == 2 and not rgb:
        image = image[:, :, None]
    if image.ndim != 3:
        want = "an RGB HWC image with 3 channels" if rgb else "an HWC (H,W,C) image"
        raise ValueError(f"{name}: needs {want}, got shape {image.shape}")
    c = image.shape[2]
    if rgb and c != 3:
        hint = " (it looks channels-first; pass HWC)" if image.shape[0] in (1, 3) and c not in (1, 3) else ""
        raise ValueError(f"{name}: needs an RGB HWC image with 3 channels, got shape {image.shape}{hint}")
    if not rgb and c not in (1, 3):
        raise ValueError(f"{name}: expected an HWC image with 1 or 3 channels, got shape {image.shape}")
    if image.size == 0:
        raise ValueError(f"{name}: empty image of shape {image.shape}")
    if image.dtype == np.uint8:
        return image
    if image.dtype == np.float32:
        lo, hi = float(image.min()), float(image.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"{name}: image contains NaN or inf; expected finite values in [0,1]")
        if lo < -1e-4 or hi > 1 + 1e-4:
            raise ValueError(f"{name}: float32 images must lie in [0,1], got values in [{lo:.3g}, {hi:.3g}]")
        return image
    raise TypeError(f"{name}: image dtype must be uint8 or float32 in [0,1], got {image.dtype}")


def check_mask_np(mask: Any, image: np.ndarray, name: str) -> np.ndarray | None:
    """Validate one HxW lesion mask (HxWx1 accepted) for ``image``."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.ndim == 3 and mask.shape[2] == 1:
        mask = mask[:, :, 0]
    if mask.shape != image.shape[:2]:
        raise ValueError(
            f"{name}: mask must have shape (H,W)={image.shape[:2]} to match the image, got {mask.shape}"
        )
    return mask


class TorchRandom:
    """Uniform/normal/integer draws from a torch generator, made on the generator's device.

    Parameter tensors are tiny: drawn on a CPU generator they give the same images on any device (what
    ``WorstOfK`` does). The price on an accelerator is one host-to-device copy per tensor the render
    uses, and PyTorch's blocking copy then waits for the device's stream (a synchronisation per copy;
    docs/results.md section 8 counts them per draw).
    """

    def __init__(self, generator: torch.Generator | None):
        self.g = generator
        self.device = generator.device if generator is not None else torch.device("cpu")
        # (id of a range table, id of a severity tensor) -> (the tensor, its rows' lo, span): see _rows_of
        self._rows_memo: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def uniform(self, lo: float, hi: float, shape: tuple[int, ...]) -> torch.Tensor:
        u = torch.rand(shape, generator=self.g, device=self.device)
        # skipping an exact no-op (a scale of 1, a shift of 0) gives the same values with fewer ops
        u = u if hi - lo == 1 else (hi - lo) * u
        return u if lo == 0 else lo + u

    def normal(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=self.g, device=self.device)

    def integers(self, lo: int, hi: int, shape: tuple[int, ...]) -> torch.Tensor:
        """Integers in [lo, hi)."""
        return torch.randint(lo, hi, shape, generator=self.g, device=self.device)

    def uniform_at(
        self, ranges: Mapping[int, tuple[float, float]], sev: torch.Tensor, shape: tuple[int, ...]
    ) -> torch.Tensor:
        """:meth:`uniform` with row i drawn in ``ranges[sev[i]]``: the same values as ``uniform(lo, hi, shape)``
        from the same stream when every row has that severity (``lo`` and ``hi - lo`` are rounded to float32
        as the scalar draw rounds them)."""
        u = torch.rand(shape, generator=self.g, device=self.device)
        lo, span = self._rows_of(ranges, sev)
        if len(shape) > 1:
            view = (-1,) + (1,) * (len(shape) - 1)
            lo, span = lo.view(view), span.view(view)
        return lo + span * u

    def _rows_of(
        self, ranges: Mapping[int, tuple[float, float]], sev: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's ``lo`` and ``hi - lo`` of ``ranges``, gathered once per table and severity tensor for
        this random source (a family that draws several params from one table gathers its rows once; the
        tables are indexed by the severity itself: no ``sev - 1``)."""
        table = _range_table(ranges)
        memo = self._rows_memo
        key = (id(table), id(sev))
        hit = memo.get(key)
        if hit is not None and hit[0] is sev:
            return hit[1], hit[2]
        lo, span = table
        at = sev
        if self.device != at.device:
            lo, span, at = lo.to(self.device), span.to(self.device), at.to(self.device)
        rows = lo[at], span[at]
        memo[key] = (sev, *rows)  # the severities held: their id cannot be reused meanwhile
        return rows

    def integers_upto(self, sev: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """Integers in [0, sev[i]] per row: ``integers(0, s + 1, shape)`` (the same stream) when every row has
        severity s; else ``floor(u * (sev + 1))`` on one uniform draw (torch has no per-row bound)."""
        values = sev.unique()
        if values.numel() == 1:
            return self.integers(0, int(values) + 1, shape)
        view = (-1,) + (1,) * (len(shape) - 1)
        u = torch.rand(shape, generator=self.g, device=self.device)
        return (u * (sev.to(self.device) + 1).view(view)).long()


class NumpyRandom:
    """The same draws as :class:`TorchRandom`, from a numpy Generator (returns numpy arrays).

    The numpy path samples one image at a time, so most draws have shape ``(1,)``: those take numpy's scalar
    draw (``lo + (hi - lo) * random()`` is exactly what ``uniform`` computes; scalar ``integers`` /
    ``standard_normal`` consume the stream as a size-1 draw does), several times cheaper than a size-1 array
    draw, with the same values from the same generator.

    >>> a, b = np.random.default_rng(3), np.random.default_rng(3)
    >>> r = NumpyRandom(a)
    >>> x = [r.uniform(0.5, 2.0, (1,)), r.integers(0, 7, (1,)), r.normal((1,)), r.uniform(0.0, 1.0, (2,))]
    >>> y = [b.uniform(0.5, 2.0, (1,)), b.integers(0, 7, (1,)), b.standard_normal((1,)), b.uniform(0.0, 1.0, (2,))]
    >>> all(np.array_equal(u, v.astype(u.dtype)) for u, v in zip(x, y))
    True
    """

    def __init__(self, rng: np.random.Generator | None):
        self.rng = rng if rng is not None else np.random.default_rng()

    def uniform(self, lo: float, hi: float, shape: tuple[int, ...]) -> np.ndarray:
        if shape == (1,):
            return np.array([lo + (hi - lo) * self.rng.random()], np.float32)
        return self.rng.uniform(lo, hi, shape).astype(np.float32)

    def normal(self, shape: tuple[int, ...]) -> np.ndarray:
        if shape == (1,):
            return np.array([self.rng.standard_normal()], np.float32)
        return self.rng.standard_normal(shape).astype(np.float32)

    def integers(self, lo: int, hi: int, shape: tuple[int, ...]) -> np.ndarray:
        """Integers in [lo, hi)."""
        if shape == (1,):
            return np.array([self.rng.integers(lo, hi)], np.int64)
        return self.rng.integers(lo, hi, shape).astype(np.int64)


def torch_generator_from(rng: np.random.Generator | None) -> torch.Generator:
    """A CPU torch generator seeded deterministically from a numpy Generator."""
    seed = int((rng if rng is not None else np.random.default_rng()).integers(0, 2**62))
    return torch.Generator().manual_seed(seed)


def to_float01(image: np.ndarray) -> np.ndarray:
    """HWC uint8 or float32 -> float32 in [0,1] (no copy for float32)."""
    return image.astype(np.float32) * np.float32(1 / 255) if image.dtype == np.uint8 else image


def from_float01(out: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float32 [0,1] -> ``dtype`` (uint8 rounds and saturates)."""
    if dtype == np.uint8:
        return np.clip(out * 255 + 0.5, 0, 255).astype(np.uint8)
    return np.clip(out, 0, 1, out=out).astype(np.float32, copy=False)


def image_to_batch(image: np.ndarray) -> torch.Tensor:
    """One HWC numpy image -> (1,C,H,W) float tensor in [0,1] (for families whose numpy path
    reuses the torch sampler)."""
    return torch.from_numpy(np.ascontiguousarray(to_float01(image))).permute(2, 0, 1)[None].contiguous()


def _tensor(v: Any) -> torch.Tensor:
    """``torch.as_tensor(v)`` without the op when ``v`` is a tensor already (as_tensor of a tensor costs
    one)."""
    return v if isinstance(v, torch.Tensor) else torch.as_tensor(v)


def f32(t: torch.Tensor) -> torch.Tensor:
    """``t.float()`` without the op when ``t`` is float32 already (a no-op cast still costs an op: a launch on
    an accelerator)."""
    return t if t.dtype == torch.float32 else t.float()


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` without the op when ``t`` has that dtype already."""
    return t if t.dtype == dtype else t.to(dtype)


def on_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``: itself when it is there already (a no-op ``.to`` still costs an op). To an
    accelerator the copy does not wait for the device's queue (a blocking one synchronises the stream);
    back to the host it does, as the caller reads the result next."""
    if t.device == device:
        return t
    return t.to(device, non_blocking=torch.device(device).type != "cpu")


class MovedParams(dict):
    """Params moved to a device by :func:`params_to`, with ``host``: the host tensors they came from. A render
    whose per-row tables are small maths on its params (a blur's kernels, its noise's indices) computes them
    from ``host`` on the host and moves the result in one copy, instead of a launch per step on the device."""

    host: Params


def host_params(params: Params) -> Params | None:
    """The host tensors ``params`` were moved from (see :class:`MovedParams`), or None."""
    return getattr(params, "host", None)


def with_host(params: Params, host: Params | None) -> Params:
    """``params`` remembering ``host`` as the host tensors they came from (itself when ``host`` is None)."""
    if host is None:
        return params
    out = MovedParams(params)
    out.host = host
    return out


def params_to(params: Params, device: torch.device) -> Params:
    """Move params to ``device`` (non-blocking; a no-op for those already there). The host tensors of each
    dtype travel as one buffer (one copy, then views on the device), not one copy each: a family has
    four to eight params, and on an accelerator each copy is a call into the driver.

    >>> p = {"a": torch.ones(2, 3), "b": torch.zeros(2), "n": torch.arange(2)}
    >>> params_to(p, torch.device("cpu")) == p
    True
    """
    moved = {k: v for k, v in params.items() if v.device == device}
    if len(moved) == len(params):
        return params
    by_dtype: dict[torch.dtype, list[str]] = {}
    for k, v in params.items():
        if k not in moved:
            by_dtype.setdefault(v.dtype, []).append(k)
    for keys in by_dtype.values():
        if len(keys) == 1:
            moved[keys[0]] = params[keys[0]].to(device, non_blocking=True)
            continue
        flat = torch.cat([params[k].reshape(-1) for k in keys]).to(device, non_blocking=True)
        for k, piece in zip(keys, flat.split([params[k].numel() for k in keys])):
            moved[k] = piece if piece.shape == params[k].shape else piece.view(params[k].shape)
    return with_host({k: moved[k] for k in params}, params)


@functools.cache
def _range_table_cached(items: tuple[tuple[int, float, float], ...]) -> tuple[torch.Tensor, torch.Tensor]:
    # entry 0 is unused: the tables are indexed by the severity itself
    lo = torch.tensor([0.0] + [a for _, a, _ in items], dtype=torch.float32)
    # hi - lo in double, then float32
    span = torch.tensor([0.0] + [b - a for _, a, b in items], dtype=torch.float32)
    return lo, span


def _range_table(ranges: Mapping[int, tuple[float, float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(6,) float32 ``lo`` and ``hi - lo`` at index 1..5 = the severity (cached per table)."""
    return _range_table_cached(tuple((s, float(ranges[s][0]), float(ranges[s][1])) for s in SEVERITIES))


_INIT_SIGNATURES: dict[type, inspect.Signature] = {}


def _init_signature(cls: type[Perturbation]) -> inspect.Signature:
    """``inspect.signature(cls.__init__)``, cached per class (a plain dict: ``functools.cache`` would
    need the class to type-check as ``Hashable``, which mypy does not grant a class object)."""
    sig = _INIT_SIGNATURES.get(cls)
    if sig is None:
        sig = _INIT_SIGNATURES[cls] = inspect.signature(cls.__init__)
    return sig


class Perturbation:
    """Base class of every perturbation: validation, severity, sampling and the two apply paths.

    Subclasses set ``name`` and their traits (``rgb``, ``grey_only``, ``occludes``, ``trainable``: see
    :mod:`.registry`) and implement

    * ``_draw(r, b)`` -> dict of random draws, written once against :class:`TorchRandom` /
      :class:`NumpyRandom` so both paths sample the same distribution;
    * ``_content_torch(images, masks, draws)`` / ``_content_numpy(image, mask, draws)`` -> extra params
      that depend on the image (optional);
    * ``_apply_torch(images, masks, params)`` and ``_apply_np(image, mask, params)``.

    Example:
        >>> import torch, numpy as np
        >>> from robusttrain.perturbations import get, index_params
        >>> p = get("saturation", severity=3)
        >>> x = torch.rand(2, 3, 32, 32)
        >>> out, params = p.apply_batch(x, generator=torch.Generator().manual_seed(0))
        >>> again, _ = p.apply_batch(x, params=params)      # exact replay
        >>> bool(torch.equal(out, again))
        True
        >>> img = (x[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        >>> o_np, _ = p.apply_numpy(img, params=index_params(params, 0))
        >>> o_np.dtype, o_np.shape
        (dtype('uint8'), (32, 32, 3))
    """

    name: str = "perturbation"
    # Family traits, read generically by the registry (robusttrain/perturbations/registry.py):
    rgb: bool = True  # needs 3-channel RGB input
    grey_only: bool = False  # needs 1-channel input (MRI / X-ray physics)
    occludes: bool = False  # covers image content with something opaque (worst-of-k caps its cover)
    trainable: bool = (
        True  # may be drawn as a training augmentation (not: needs the model, or deletes content)
    )
    # The param keys of this family, when fixed: replaying params with other keys (e.g. pixel-unit
    # params recorded by an older version) is refused with one clear error instead of misread.
    PARAM_KEYS: tuple[str, ...] | None = None
    # the constructor arguments, set by __new__ (read through init_args())
    _init_args: dict[str, Any]
    # Families whose ``_apply_torch`` is one shared renderer over per-row params name it here (the pasted
    # objects): a caller applying several of them to one batch may render them in one call with
    # :meth:`render_together` (the same pixels as one call per family: fewer launches on an accelerator).
    render_group: str | None = None

    def __new__(cls, *args: Any, **kwargs: Any):
        # Record the constructor arguments (defaults filled in) before __init__ runs, so any family can be
        # rebuilt exactly without each one storing its arguments under their own names (the Albumentations
        # adapter serialises them; the batch augmentation builds the other severities from them).
        obj = super().__new__(cls)
        try:
            bound = _init_signature(cls).bind(None, *args, **kwargs)
        except TypeError:
            obj._init_args = {}  # __init__ raises the proper error for these arguments
            return obj
        bound.apply_defaults()
        params = _init_signature(cls).parameters
        args_: dict[str, Any] = {}
        for k, v in list(bound.arguments.items())[1:]:
            args_.update(v if params[k].kind is inspect.Parameter.VAR_KEYWORD else {k: v})
        obj._init_args = args_
        return obj

    def __init__(self, severity: int = 3):
        self.severity = check_severity(severity, self.name)

    def init_args(self) -> dict[str, Any]:
        """The constructor arguments this perturbation was built with, defaults filled in.

        >>> from robusttrain.perturbations import get
        >>> get("blur", severity=2, noise=False).init_args()
        {'severity': 2, 'fast': False, 'noise': False}
        """
        return dict(self.__dict__.get("_init_args", {}))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(severity={self.severity})"

    # -- sampling ---------------------------------------------------------------------
    def _draw(self, r: TorchRandom | NumpyRandom, b: int) -> dict[str, Any]:
        return {}

    def _content_torch(self, images: torch.Tensor, masks: torch.Tensor | None, draws: Params) -> Params:
        return {}

    def _content_numpy(
        self, image: np.ndarray, mask: np.ndarray | None, draws: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        # Default: reuse the torch sampler on a one-image batch (exact same logic) — only when the
        # family has image-dependent params at all; the conversion costs a full-image pass.
        if type(self)._content_torch is Perturbation._content_torch:
            return {}
        t = image_to_batch(image)
        m = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask).astype(np.int64))[None]
        d = {k: torch.as_tensor(v)[None] for k, v in draws.items()}
        return index_params(self._content_torch(t, m, d), 0)

    def sample_params(
        self,
        images: torch.Tensor,
        masks: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Params:
        """Draw per-sample params for a (B,C,H,W) batch (tensors with leading dim B, on the images' device)."""
        images = check_batch(images, self.name, self.rgb, check_range=False)
        masks = check_masks(masks, images, self.name)
        # placed families draw on the host (their maps live there); the contract is the images' device
        return params_to(self._sample_torch(images, masks, generator), images.device)

    def _sample_torch(
        self, images: torch.Tensor, masks: torch.Tensor | None, generator: torch.Generator | None
    ) -> Params:
        draws = {k: _tensor(v) for k, v in self._draw(TorchRandom(generator), images.shape[0]).items()}
        params = params_to(draws, images.device)
        params.update(self._content_torch(images, masks, params))
        return params

    def sample_numpy(
        self, image: np.ndarray, mask: np.ndarray | None = None, rng: np.random.Generator | None = None
    ) -> dict[str, np.ndarray]:
        """Draw the params of one HWC image (the numpy schema: ``index_params`` of a batch)."""
        image, mask = self.check_numpy(image, mask)
        return self._sample_np(image, mask, rng)

    def _sample_np(
        self, image: np.ndarray, mask: np.ndarray | None, rng: np.random.Generator | None
    ) -> dict[str, np.ndarray]:
        """:meth:`sample_numpy` on an image and mask that :meth:`check_numpy` already returned (the hook that
        families with their own numpy sampler override; callers that checked the image skip a second check)."""
        draws = {k: np.asarray(v)[0] for k, v in self._draw(NumpyRandom(rng), 1).items()}
        draws.update(self._content_numpy(image, mask, draws))
        return draws

    # -- applying ---------------------------------------------------------------------
    def check_numpy(self, image: Any, mask: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Validate one HWC image (uint8, or float32 in [0,1]) and its lesion mask for this family.

        Returns them as the numpy path uses them: an (H,W) image of a grey-capable family as (H,W,1), an
        (H,W,1) mask as (H,W). Raises one clear ValueError / TypeError otherwise.

        >>> from robusttrain.perturbations import get
        >>> img, m = get("gamma").check_numpy(np.zeros((4, 5), np.uint8), np.zeros((4, 5, 1), np.uint8))
        >>> img.shape, m.shape
        ((4, 5, 1), (4, 5))
        """
        image = check_image(image, self.name, self.rgb)
        return image, check_mask_np(mask, image, self.name)

    def apply_batch(
        self,
        images: torch.Tensor,
        masks: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        params: Params | None = None,
    ) -> tuple[torch.Tensor, Params]:
        """Apply to a (B,C,H,W) float batch in [0,1]; replays exactly when ``params`` is given."""
        images = check_batch(images, self.name, self.rgb)
        masks = check_masks(masks, images, self.name)
        if params is None:
            params = self._sample_torch(images, masks, generator)
        else:
            self._check_params(params, images.shape[0])
        params = params_to(params, images.device)
        return self._apply_torch(images, masks, params), params

    def apply_numpy(
        self,
        image: np.ndarray,
        mask: np.ndarray | None = None,
        params: dict[str, Any] | None = None,
        rng: np.random.Generator | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Apply to one HWC image (uint8 or float32 in [0,1]); returns the same dtype and the params used."""
        squeeze = isinstance(image, np.ndarray) and image.ndim == 2 and not self.rgb
        image, mask = self.check_numpy(image, mask)
        if params is None:
            params = self._sample_np(image, mask, rng)
        else:
            params = {
                k: np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v)
                for k, v in params.items()
            }
            self._check_keys(params)
        out = self._apply_np(image, mask, params)
        return (out[:, :, 0] if squeeze and out.ndim == 3 else out), params

    def _check_keys(self, params: dict[str, Any]) -> None:
        if self.PARAM_KEYS is None or set(params) == set(self.PARAM_KEYS):
            return
        missing = sorted(set(self.PARAM_KEYS) - set(params))
        extra = sorted(set(params) - set(self.PARAM_KEYS))
        raise ValueError(
            f"{self.name}: params must have the keys {list(self.PARAM_KEYS)}; missing {missing}, "
            f"unexpected {extra} (spatial params are relative to the image size, keys *_rel; "
            f"pixel-unit params recorded by an older version cannot be replayed, re-sample them)"
        )

    def _check_params(self, params: Params, b: int) -> None:
        self._check_keys(params)
        for k, v in params.items():
            if not isinstance(v, torch.Tensor) or v.ndim == 0 or v.shape[0] != b:
                got = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
                raise ValueError(
                    f"{self.name}: params[{k!r}] must be a tensor with leading dim B={b}, got {got}"
                )

    def _apply_torch(self, images: torch.Tensor, masks: torch.Tensor | None, params: Params) -> torch.Tensor:
        raise NotImplementedError

    def _apply_np(
        self, image: np.ndarray, mask: np.ndarray | None, params: dict[str, np.ndarray]
    ) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def render_together(
        cls, images: torch.Tensor, masks: torch.Tensor | None, parts: list[tuple[Perturbation, Params, int]]
    ) -> torch.Tensor:
        """Apply several families of one :attr:`render_group` to consecutive rows of ``images`` in one call:
        ``parts`` are (family at the severity its call applies at, its params, its number of rows), in row
        order; the result equals each part's ``_apply_torch`` on its rows."""
        raise NotImplementedError(f"{cls.__name__}: no shared renderer (render_group is None)")

    # -- one call per family: rows with their own severities --------------------------------
    def at_severity(self, severity: int) -> Perturbation:
        """This family, built with the same constructor arguments, at ``severity`` (cached per instance).

        >>> from robusttrain.perturbations import get
        >>> op = get("blur", severity=2, noise=False)
        >>> op.at_severity(4).init_args(), op.at_severity(2) is op
        ({'severity': 4, 'fast': False, 'noise': False}, True)
        """
        severity = check_severity(severity, self.name)
        if severity == self.severity:
            return self
        cache = self.__dict__.setdefault("_at_severity", {})
        if severity not in cache:
            cache[severity] = type(self)(**{**self.init_args(), "severity": severity})
        return cache[severity]

    def batched_severities(self) -> bool:
        """True when this family samples a batch of mixed severities in one call (it implements ``_draw_at``)
        and applies params without reading its severity (the params fully describe the perturbation)."""
        cls = type(self)
        return cls._draw_at is not Perturbation._draw_at or cls._sample_at is not Perturbation._sample_at

    def _sample_at(
        self,
        images: torch.Tensor,
        masks: torch.Tensor | None,
        sev: torch.Tensor,
        generator: torch.Generator | None,
    ) -> Params:
        """Params of a batch whose row i has severity ``sev[i]`` (CPU long), in one call: ``_draw_at`` and
        ``_content_torch``; families whose sampler is not ``_draw`` (placed families) override this instead."""
        draws = {k: _tensor(v) for k, v in self._draw_at(TorchRandom(generator), sev).items()}
        params = params_to(draws, images.device)
        params.update(self._content_torch(images, masks, params))
        return params

    def _draw_at(self, r: TorchRandom, severities: torch.Tensor) -> dict[str, Any]:
        """``_draw`` for a batch whose row i has severity ``severities[i]`` (a CPU long tensor): the same
        draws from the same stream as ``_draw`` when all rows share a severity. Families that implement it
        must apply params without reading ``self.severity``."""
        raise NotImplementedError

    def sample_family(
        self,
        images: torch.Tensor,
        masks: torch.Tensor | None,
        severities: Any,
        generator: torch.Generator | None = None,
    ) -> FamilyParams:
        """Params for a (B,C,H,W) batch whose row i is perturbed at ``severities[i]`` (B ints 1..5).

        Returns ``[(rows, params), ...]``: groups of batch rows (CPU long tensors) and their batched params.
        A family that implements ``_draw_at`` returns one group of all rows (one call, whatever the
        severities); any other family one group per severity, in order of first appearance (the generic
        fallback: it only needs today's ``sample_params`` contract).

        >>> import torch
        >>> from robusttrain.perturbations import get
        >>> x, g = torch.rand(3, 3, 16, 16), torch.Generator().manual_seed(0)
        >>> [(rows.tolist(), sorted(p)) for rows, p in get("saturation").sample_family(x, None, [2, 5, 2], g)]
        [([0, 1, 2], ['brightness', 'factor'])]
        >>> [rows.tolist() for rows, _ in get("text").sample_family(x, None, [2, 5, 2], g)]
        [[0, 2], [1]]
        """
        images = check_batch(images, self.name, self.rgb, check_range=False)
        masks = check_masks(masks, images, self.name)
        return self._sample_family(
            images, masks, severity_tensor(severities, images.shape[0], self.name), generator
        )

    def _sample_family(
        self,
        images: torch.Tensor,
        masks: torch.Tensor | None,
        sev: torch.Tensor,
        generator: torch.Generator | None,
        sev_list: list[int] | None = None,
        taken: list[tuple[torch.Tensor, torch.Tensor | None]] | None = None,
    ) -> FamilyParams:
        """``taken``: a list that gets each group's rows of ``images`` and ``masks`` (a caller that applies the
        groups next reuses them instead of taking the rows again)."""
        if self.batched_severities():
            return [(all_rows(images.shape[0]), self._sample_at(images, masks, sev, generator))]
        out = []
        for s, rows in severity_groups(sev if sev_list is None else sev_list):
            x, m = _take_rows(images, masks, rows)
            if taken is not None:
                taken.append((x, m))
            op = self.at_severity(s)
            # the input was checked once; a family that overrides the public contract still gets called by it
            own = type(op).sample_params is not Perturbation.sample_params
            out.append(
                (
                    rows,
                    op.sample_params(x, m, generator=generator) if own else op._sample_torch(x, m, generator),
                )
            )
        return out

    def apply_family(
        self,
        images: torch.Tensor,
        masks: torch.Tensor | None,
        severities: Any,
        generator: torch.Generator | None = None,
        params: FamilyParams | None = None,
        check_range: bool = True,
    ) -> tuple[torch.Tensor, FamilyParams]:
        """Apply to a (B,C,H,W) batch whose row i has severity ``severities[i]``: one call per family for the
        families that implement ``_draw_at``, one per severity for the others; replays exactly with the
        ``params`` groups that :meth:`sample_family` (or a previous call) returned. ``check_range=False``:
        the caller checked that the images are finite and in [0, 1] (one check for several families).

        >>> import torch
        >>> from robusttrain.perturbations import get
        >>> x, op = torch.rand(4, 3, 16, 16), get("contrast")
        >>> out, groups = op.apply_family(x, None, [1, 5, 3, 5], torch.Generator().manual_seed(0))
        >>> again, _ = op.apply_family(x, None, [1, 5, 3, 5], params=groups)
        >>> bool(torch.equal(out, again)), out.shape
        (True, torch.Size([4, 3, 16, 16]))
        """
        images = check_batch(images, self.name, self.rgb, check_range=check_range)
        masks = check_masks(masks, images, self.name)
        sev, sev_list = _severities(severities, images.shape[0], self.name)
        b = images.shape[0]
        # the severity of each group, on the host, when the groups are this call's own (one per severity, in
        # order of first appearance): reading it from a group's rows would be two ops per group
        group_sev: list[int] | None = None
        taken: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        if params is None:
            params = self._sample_family(images, masks, sev, generator, sev_list, taken)
            if not self.batched_severities():
                group_sev = list(dict.fromkeys(sev_list))
        if self.batched_severities() and len(params) > 1:
            params = merge_groups(params, b)
        if self.batched_severities():
            # params fully describe the perturbation; the severity only bounds buffer sizes (kernel widths on
            # an accelerator), so the batch is applied by the family at its largest severity present
            op = self.at_severity(max(sev_list))
            if len(params) == 1 and params[0][0].numel() == b and _is_arange(params[0][0]):
                self._check_params(params[0][1], b)
                return op._apply_torch(images, masks, params_to(params[0][1], images.device)), params
        elif len(params) == 1 and params[0][0].numel() == b and _is_arange(params[0][0]):
            if len(set(sev_list)) > 1:
                raise ValueError(f"{self.name}: one params group for rows of different severities")
            return self.at_severity(sev_list[0])._apply_checked(images, masks, params[0][1]), params
        if not self.batched_severities() and len(params) > 1:
            # a family that draws rows of several severities in one pass (text): one render, not one per group
            joint = self._apply_groups(images, masks, params, sev_list)
            if joint is not None:
                return (joint if joint.dtype == images.dtype else joint.to(images.dtype)), params
        ys = []
        for i, (rows, p) in enumerate(params):
            # this call's own groups: their rows as sampling took them (not taken twice)
            x, m = taken[i] if group_sev is not None and taken else _take_rows(images, masks, rows)
            if self.batched_severities():
                self._check_params(p, x.shape[0])
                y = op._apply_torch(x, m, params_to(p, images.device))
            else:
                s = group_sev[i] if group_sev is not None else sev_list[int(rows[0])]
                y = self.at_severity(s)._apply_checked(x, m, p)
            ys.append(y if y.dtype == images.dtype else y.to(images.dtype))
        if group_sev is not None:
            # this call's groups partition the rows: the output is their results in row order (one
            # concatenation and one gather, not a copy of the batch and a scatter per group)
            order = np.fromiter((i for s in group_sev for i, v in enumerate(sev_list) if v == s), np.int64, b)
            inv = np.empty(b, dtype=np.int64)
            inv[order] = np.arange(b)
            at = torch.from_numpy(inv)
            return torch.cat(ys)[at if at.device == images.device else at.to(images.device)], params
        out = images.clone()
        for (rows, _), y in zip(params, ys):
            # a no-op .to still costs an op per group: move / cast only what differs
            out[rows if rows.device == images.device else rows.to(images.device)] = y
        return out, params

    def deferred_draw(self, images: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor | None:
        """The random values this family's sampler would take for the rows of ``images``, drawn now in one call,
        for :meth:`sample_together` to place later with other families of its :attr:`render_group` (the
        generator's stream stays that of sampling each family at its turn); None (the default): the family
        is sampled at its turn."""
        return None

    @classmethod
    def sample_together(
        cls,
        images: torch.Tensor,
        masks: torch.Tensor | None,
        parts: list[tuple[Perturbation, list[int], torch.Tensor]],
    ) -> list[Params]:
        """Each part's params (family, its rows' severities, its :meth:`deferred_draw`), the parts' rows being
        the consecutive first rows of ``images``: what each family's own sampler gives on its rows."""
        raise NotImplementedError(f"{cls.__name__}: no joint sampler")

    def _apply_groups(
        self, images: torch.Tensor, masks: torch.Tensor | None, groups: FamilyParams, sev_list: list[int]
    ) -> torch.Tensor | None:
        """Apply several severity groups (``groups`` partition the rows; row i has severity ``sev_list[i]``) in
        one pass, the output in row order; None (the default): one ``_apply_checked`` per group instead."""
        return None

    def _apply_checked(
        self, images: torch.Tensor, masks: torch.Tensor | None, params: Params
    ) -> torch.Tensor:
        """``apply_batch(images, masks, params=params)`` on input checked already (a family that overrides
        ``apply_batch`` is still called through it)."""
        if type(self).apply_batch is not Perturbation.apply_batch:
            return self.apply_batch(images, masks, params=params)[0]
        self._check_params(params, images.shape[0])
        return self._apply_torch(images, masks, params_to(params, images.device))
