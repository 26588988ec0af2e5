"""Where artifacts may go: low-resolution maps of brightness and free space, and random cell picks.

Spatial families (specular spots, pasted objects) choose positions on the border-estimate grid
(:func:`robusttrain.perturbations.border.cell_size`): a cell is *free* when it lies in the field of view
and holds no lesion pixel. Picks use the Gumbel-max trick on the whole grid, so a batch is placed with
tensor ops only (no host sync). The numpy path computes the same maps with OpenCV and then reuses the
torch picker on those tiny maps with a generator seeded from its ``rng``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from .base import SHARED_SCOPES, NumpyRandom, TorchRandom, all_rows, on_device, torch_generator_from
from .border import (
    cell_means,
    cell_means_np,
    cell_size,
    fov_cells_to_mask,
    fov_from_cells,
    fov_from_cells_np,
)
from .colour import LUMA, const_on


def _tensor_key(t: torch.Tensor | None) -> tuple | None:
    # storage address + layout + the version counter that every in-place write bumps
    return None if t is None else (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device, t._version)


class _MapsMemo:
    """Maps of the images seen since the last change of storage, keyed by view (address, layout, version).

    Entries live only while their images' storage is the current one (its reference is held, so no
    address can be reused meanwhile); a call on another storage drops them, so memory stays one batch.
    """

    def __init__(self) -> None:
        self.storage: torch.UntypedStorage | None = None
        self.entries: dict = {}

    def get(self, images: torch.Tensor, masks: torch.Tensor | None, compute):
        storage = images.untyped_storage()
        if self.storage is None or storage.data_ptr() != self.storage.data_ptr():
            self.storage, self.entries = storage, {}
        key = (_tensor_key(images), _tensor_key(masks))
        if key not in self.entries:
            self.entries[key] = (compute(images, masks), masks)  # masks held: their address stays theirs
        return self.entries[key][0]


_MAPS_MEMO = _MapsMemo()


def maps_torch(images: torch.Tensor, masks: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """-> (luma (B,Hc,Wc) float, free (B,Hc,Wc) bool, cell size k).

    The metamorphic suite samples spots and the three object families for the same images one test
    after another; the maps are memoised per image view (see :class:`_MapsMemo`), so they are computed
    once per image instead of once per family. Rows taken with :meth:`SharedMaps.take` get rows of the
    maps of the whole batch. Callers must not modify the returned maps.
    """
    for shared in reversed(_SHARED):
        hit = shared.lookup(images, masks)
        if hit is not None:
            return hit
    return _MAPS_MEMO.get(images, masks, _maps_torch)


_SHARED = SHARED_SCOPES  # the open scopes (the stack lives in base, whose row taking reads it too)
_HOST = torch.device("cpu")  # the placement maps and the rows they are looked up by live here


class SharedMaps:
    """Within ``with SharedMaps(images, masks) as shared:``, the rows ``shared.take(rows)`` returns share one
    computation of the maps of the whole batch (one field-of-view step per batch, not one per family that
    draws from it), computed on first use only; the rows' maps are the batch maps' rows (exactly what the
    rows alone give: every map is per image).

    >>> import torch
    >>> x = torch.rand(4, 3, 64, 64)
    >>> with SharedMaps(x, None) as shared:
    ...     sub, _ = shared.take(torch.tensor([2, 0]))
    ...     luma, free, k = maps_torch(sub, None)
    >>> bool(torch.equal(luma, maps_torch(x[[2, 0]], None)[0])), shared.computed
    (True, 1)
    """

    def __init__(self, images: torch.Tensor, masks: torch.Tensor | None):
        self.images, self.masks = images, masks
        self.views: dict = {}
        self.computed = 0  # times the batch maps were computed (0 or 1)
        self._maps: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None
        self._fov_px: torch.Tensor | None = None

    def __enter__(self) -> SharedMaps:
        _SHARED.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _SHARED.remove(self)
        self.views.clear()

    def take(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(images[rows], masks[rows])``, remembered as those rows (the tensors are held, so their address
        cannot be reused while the context is open)."""
        at = on_device(rows, self.images.device)
        x = self.images[at]
        m = None if self.masks is None else self.masks[at]
        # the host's copy is kept: the maps the rows are looked up in live on the host
        self.views[_tensor_key(x)] = (x, m, on_device(rows, _HOST))
        return x, m

    def take_split(self, rows: list[int], sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """:meth:`take` of consecutive pieces of ``rows`` (host ints; piece i has ``sizes[i]`` rows) in one
        gather and one split (not three ops per piece); each piece is remembered as its rows, whose tensor
        is made only if that piece's maps are looked up."""
        at = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        at = on_device(at, self.images.device)
        xs = self.images[at].split(sizes)
        ms: list[torch.Tensor | None] = [None] * len(sizes)
        if self.masks is not None:
            ms = list(self.masks[at].split(sizes))
        out, start = [], 0
        for x, m, size in zip(xs, ms, sizes):
            self.views[_tensor_key(x)] = (x, m, rows[start : start + size])
            out.append((x, m))
            start += size
        return out

    def _rows(self, view: tuple) -> torch.Tensor:
        """A remembered view's rows as a host tensor (made from host ints on first use)."""
        rows = view[2]
        if isinstance(rows, torch.Tensor):
            return rows
        t = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        self.views[_tensor_key(view[0])] = (view[0], view[1], t)
        return t

    def take_from(
        self, images: torch.Tensor, masks: torch.Tensor | None, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Rows of a view this context gave out, as a view it knows too (None for an unknown ``images``)."""
        view = self.views.get(_tensor_key(images))
        if view is None:
            return None
        own = self._rows(view)
        x, m = self.take(own[on_device(rows, _HOST)])
        return x, (None if masks is None else m)

    def lookup(self, images: torch.Tensor, masks: torch.Tensor | None):
        view = self.views.get(_tensor_key(images))
        if view is None or (masks is not None and _tensor_key(masks) != _tensor_key(view[1])):
            return None
        luma, fov, free, k = self._batch_maps()
        rows = self._rows(view)
        return luma[rows], (fov if masks is None else free)[rows], k

    def fov_pixels(self, images: torch.Tensor) -> torch.Tensor | None:
        """(rows, 1, H, W) bool field-of-view pixels of a view this context gave out (None for another)."""
        view = self.views.get(_tensor_key(images))
        if view is None:
            return None
        if self._fov_px is None:
            cells = self._batch_maps()[1][:, None]
            cells = on_device(cells, self.images.device)
            self._fov_px = fov_cells_to_mask(cells, *self.images.shape[-2:])
        return self._fov_px[self._rows(view)]

    def _batch_maps(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        if self._maps is None:
            self._maps, self.computed = _host_maps(self.images, self.masks), self.computed + 1
        return self._maps


def fov_mask_shared(images: torch.Tensor) -> torch.Tensor:
    """:func:`~robusttrain.perturbations.border.fov_mask` from the maps of :func:`maps_torch` (memoised, or
    shared by an open :class:`SharedMaps`): the same mask without a second field-of-view step. Rows of an
    open :class:`SharedMaps` get rows of the batch's pixel mask, made once per scope (one gather per
    family that asks, not an upsampling each)."""
    for shared in reversed(_SHARED):
        hit = shared.fov_pixels(images)
        if hit is not None:
            return hit
    cells = maps_torch(images, None)[1][:, None]
    return fov_cells_to_mask(on_device(cells, images.device), *images.shape[-2:])


def _lesion_cells(masks: torch.Tensor, cells: Sequence[int], k: int) -> torch.Tensor:
    """(B,Hc,Wc) bool: cells holding any lesion pixel."""
    hc, wc = cells
    les = (
        F.max_pool2d((masks[:, None, : hc * k, : wc * k] != 0).float(), k)
        if k > 1
        else (masks[:, None] != 0).float()
    )
    return les[:, 0] >= 0.5


def _maps_torch(images: torch.Tensor, masks: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    luma, _, free, k = _host_maps(images, masks)
    return luma, free, k


def _host_maps(
    images: torch.Tensor, masks: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(luma, field of view, free, k) of (B,C,H,W) images: (B,Hc,Wc) maps on the host, whatever the images'
    device. On an accelerator the cell means and lesion cells come over in one read (the field-of-view loop
    runs on the host anyway); the placements that read the maps then run on the host too, beside their
    random draws (a CPU generator): a few hundred ops on tiny grids that would otherwise each be a kernel
    launch, with a blocking copy for each drawn tensor (docs/results.md section 8)."""
    _, _, h, w = images.shape
    k = cell_size(h, w)
    low = cell_means(images)
    les = None if masks is None else _lesion_cells(masks, low.shape[-2:], k)
    if low.device.type != "cpu":
        packed = low if les is None else torch.cat([low, les[:, None].to(low.dtype)], 1)
        packed = packed.detach().cpu()
        low = packed[:, : low.shape[1]]
        les = None if les is None else packed[:, -1] >= 0.5
    fov = fov_from_cells(low)[:, 0]
    luma = (low * const_on("luma", low.device, low.dtype)[:, None, None]).sum(1)
    return luma, fov, (fov if les is None else fov & ~les), k


def maps_np(image: np.ndarray, mask: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Numpy twin of :func:`maps_torch` for one image; returns 1-batch torch tensors (tiny)."""
    h, w = image.shape[:2]
    k = cell_size(h, w)
    low = cell_means_np(image)
    free = fov_from_cells_np(low)
    lowf = low.astype(np.float32) * (np.float32(1 / 255) if low.dtype == np.uint8 else np.float32(1))
    luma = lowf @ LUMA
    if mask is not None:
        hc, wc = free.shape
        les = (mask[: hc * k, : wc * k] != 0).astype(np.uint8)
        if k > 1:
            # A cell holds lesion when its mean is > 0, i.e. any pixel is lesion.
            les = cv2.resize(les * 255, (wc, hc), interpolation=cv2.INTER_AREA) > 0
        free = free & ~les.astype(bool)
    return torch.from_numpy(np.ascontiguousarray(luma))[None], torch.from_numpy(free)[None], k


def erode_cells(free: torch.Tensor, r: int) -> torch.Tensor:
    """Cells whose whole (2r+1)^2 neighbourhood is free (outside the grid counts as not free)."""
    return erode_cells_rows(free, [r] * free.shape[0])


def erode_cells_rows(free: torch.Tensor, radii: list[int]) -> torch.Tensor:
    """:func:`erode_cells` of (B,Hc,Wc) ``free`` with row i eroded by its own radius ``radii[i]`` (host ints).

    One max-pool per distinct radius over the blocked cells padded with blocked (outside the grid is not
    free): exactly ``r`` 3x3 dilations, in a few ops instead of ~10 per dilation and radius.

    >>> free = torch.ones(2, 8, 8, dtype=torch.bool); free[:, 4, 4] = False
    >>> out = erode_cells_rows(free, [0, 1])
    >>> int(out[0].sum()), int(out[1].sum()), bool(torch.equal(out[1], erode_cells(free, 1)[1]))
    (63, 27, True)
    """
    distinct = sorted(set(radii))
    if distinct == [0]:
        return free
    blocked = (~free).unsqueeze(1).float()  # (B,1,Hc,Wc)
    pooled = [
        blocked if r == 0 else F.max_pool2d(F.pad(blocked, (r, r, r, r), value=1.0), 2 * r + 1, stride=1)
        for r in distinct
    ]
    if len(pooled) == 1:
        return pooled[0][:, 0] == 0
    # each row's pool: (row, pool) index pairs, the rows the shared arange (no op to make or split them)
    which = torch.from_numpy(np.searchsorted(distinct, radii).astype(np.int64))
    rows = all_rows(len(radii))
    if free.device.type != "cpu":
        rows, which = rows.to(free.device), which.to(free.device)
    return torch.cat(pooled, 1)[rows, which] == 0


def pick_cells(score: torch.Tensor, n: int, r: TorchRandom) -> torch.Tensor:
    """Sample ``n`` distinct cells per batch item with probability proportional to ``score`` (B,Hc,Wc) >= 0.

    Returns flat cell indices (B,n). Items with no positive score get arbitrary cells; callers check
    the pick against the free map to mark them invalid.
    """
    b = score.shape[0]
    return pick_cells_from(score, n, r.uniform(1e-6, 1.0, (b, math.prod(score.shape[1:]))))


def pick_cells_from(score: torch.Tensor, n: int, u: torch.Tensor) -> torch.Tensor:
    """:func:`pick_cells` with its uniforms in [1e-6, 1) given, (B, Hc*Wc) (drawn by the caller)."""
    flat = score.reshape(score.shape[0], -1)
    u = u if u.device == flat.device else u.to(flat.device)
    # log(score) + Gumbel noise -log(-log u), added as a subtraction (the same float: negation is exact)
    keys = torch.log(flat.clamp_min(1e-12)) - torch.log(-torch.log(u))
    return keys.topk(n, dim=1).indices


_OFFSETS: dict[tuple[int, int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def window_offsets(half: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A drawn shape's window offsets on the n x n sub-pixel grid ((2 half + 1) n,) and in pixels
    (2 half + 1,), made once per window, grid and device (constants: building them costs ops every call).
    Pixel j's samples sit at j + (i + 0.5)/n - 0.5. Callers must not modify them."""
    key = (half, n, device)
    if key not in _OFFSETS:
        sub = (torch.arange(n, device=device, dtype=torch.float32) + 0.5) / n - 0.5
        win = torch.arange(-half, half + 1, device=device, dtype=torch.float32)
        _OFFSETS[key] = ((win[:, None] + sub).reshape(-1), win)
    return _OFFSETS[key]


def gather_cells(grid: torch.Tensor, y: torch.Tensor, x: torch.Tensor, k: int) -> torch.Tensor:
    """Value of ``grid`` (B,Hc,Wc) at pixel positions (y, x) (B,N) (clamped to the grid)."""
    return grid.reshape(grid.shape[0], -1).gather(1, cell_index(y, x, k, grid.shape[1:]))


def cell_index(y: torch.Tensor, x: torch.Tensor, k: int, cells: Sequence[int]) -> torch.Tensor:
    """Flat indices into an (Hc, Wc) = ``cells`` grid of pixel positions (y, x) (B,N), clamped to the grid:
    compute them once to gather several grids at the same positions."""
    hc, wc = cells
    cy = (y / k).long().clamp(0, hc - 1)
    cx = (x / k).long().clamp(0, wc - 1)
    return cy * wc + cx


_YX_CONSTS: dict[tuple[int, int, torch.device], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def cell_index_yx(yx: torch.Tensor, k: int, cells: tuple[int, int]) -> torch.Tensor:
    """:func:`cell_index` of pixel positions given as (..., 2) (y, x) pairs -> (...) flat indices: the same
    integers, both axes in each op (the constants made once per grid and device)."""
    hc, wc = cells
    key = (hc, wc, yx.device)
    if key not in _YX_CONSTS:
        _YX_CONSTS[key] = (
            torch.zeros(2, dtype=torch.long, device=yx.device),
            torch.tensor([hc - 1, wc - 1], device=yx.device),
            torch.tensor([wc, 1], device=yx.device),
        )
    zero, last, stride = _YX_CONSTS[key]
    return (torch.clamp((yx / k).long(), zero, last) * stride).sum(-1)


__all__ = [
    "SharedMaps",
    "maps_torch",
    "maps_np",
    "erode_cells",
    "erode_cells_rows",
    "cell_index",
    "cell_index_yx",
    "window_offsets",
    "pick_cells",
    "pick_cells_from",
    "gather_cells",
    "torch_generator_from",
]


# ---- numpy twins, used by the numpy path's sampler (torch op overhead dominates on such tiny maps) ----


def maps_np_arrays(image: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, int]:
    """Like :func:`maps_np` but returns (luma (1,Hc,Wc) float32, free (1,Hc,Wc) bool, k) as numpy."""
    luma, free, k = maps_np(image, mask)
    return luma.numpy(), free.numpy(), k


def erode_cells_np(free: np.ndarray, r: int) -> np.ndarray:
    """Numpy twin of :func:`erode_cells` for (B,Hc,Wc) bool."""
    if r <= 0:
        return free.copy()
    out = np.empty_like(free)
    ker = np.ones((2 * r + 1, 2 * r + 1), np.uint8)
    for i in range(free.shape[0]):
        out[i] = cv2.erode(free[i].astype(np.uint8), ker, borderType=cv2.BORDER_CONSTANT, borderValue=0) > 0
    return out


def pick_cells_np(score: np.ndarray, n: int, r) -> np.ndarray:
    """Numpy twin of :func:`pick_cells` (``r``: a NumpyRandom)."""
    b = score.shape[0]
    flat = score.reshape(b, -1)
    u = r.uniform(1e-6, 1.0, flat.shape)
    keys = np.log(np.maximum(flat, 1e-12)) - np.log(-np.log(u))
    idx = np.argpartition(-keys, n - 1, axis=1)[:, :n]
    order = np.argsort(-np.take_along_axis(keys, idx, 1), axis=1)
    return np.take_along_axis(idx, order, 1)


def gather_cells_np(grid: np.ndarray, y: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    b, hc, wc = grid.shape
    cy = np.clip((y / k).astype(np.int64), 0, hc - 1)
    cx = np.clip((x / k).astype(np.int64), 0, wc - 1)
    return np.take_along_axis(grid.reshape(b, -1), cy * wc + cx, 1)


class PlacedSampling:
    """Sampling shared by perturbations placed on the free-space / brightness maps (spots, objects).

    A subclass provides ``_place(luma, free, k, h, w, random, device=None)`` returning batched
    params; both paths then draw from the same maps with the same random stream. With
    ``needs_fov = True`` it also gets ``fov=`` the field-of-view cells (free space ignoring the lesion).
    """

    needs_fov = False

    def _sample_torch(self, images, masks, generator):
        luma, free, k = maps_torch(images, masks)
        extra = {"fov": maps_torch(images, None)[1] if masks is not None else free} if self.needs_fov else {}
        return self._place(
            luma, free, k, images.shape[2], images.shape[3], TorchRandom(generator), luma.device, **extra
        )

    def _sample_np(self, image, mask, rng):
        luma, free, k = maps_np_arrays(image, mask)
        extra = (
            {"fov": maps_np_arrays(image, None)[1] if mask is not None else free} if self.needs_fov else {}
        )
        p = self._place(luma, free, k, image.shape[0], image.shape[1], NumpyRandom(rng), **extra)
        return {key: np.asarray(v)[0] for key, v in p.items()}
