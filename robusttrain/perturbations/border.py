"""Fast estimate of the endoscope's dark border (the field-of-view mask), shared by every family.

Endoscopy frames show the scene through a roughly circular/octagonal opening inside a black frame.
Artifacts must not be drawn on that frame. The estimate works on a low-resolution grid (cells of
``k = max(1, min(H,W)//64)`` pixels): a cell is *dark* when every channel's mean is at most 20 grey
levels, and the border is the set of dark cells connected to the image edge (a dark lumen in the middle
of the scene is not border). The torch version grows the border from the edge by a fixed number of
3x3 geodesic dilations, stopping at the fixed point (on an accelerator the tiny grid goes to the host
for this: one copy each way instead of hundreds of kernel launches); the numpy version labels 8-connected
components, which the dilations converge to — the two agree unless the border is a maze.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch
import torch.nn.functional as F

# Cell mean <= 20 grey levels is dark. Comparing against 20.5 makes the float path agree with OpenCV's
# rounded uint8 cell means.
DARK = 20.5 / 255.0


def cell_size(h: int, w: int) -> int:
    """Side in pixels of one low-resolution cell for an HxW image."""
    return max(1, min(h, w) // 64)


def _iterations(hc: int, wc: int) -> int:
    # Enough dilations to follow any border region that is not a maze (hc + wc steps); the numpy twin
    # uses exact connected components, which is what these converge to.
    return hc + wc


def dilate3(x: torch.Tensor) -> torch.Tensor:
    """3x3 binary dilation of a (..., H, W) bool tensor (zero outside).

    Written as two separable maxima of shifted views: on CPU this is ~100x faster than
    ``max_pool2d(kernel=3, stride=1)`` on small grids.
    """
    p = F.pad(x, (1, 1, 1, 1))
    r = p[..., :, :-2] | p[..., :, 1:-1] | p[..., :, 2:]
    return r[..., :-2, :] | r[..., 1:-1, :] | r[..., 2:, :]


_RIMS: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _rim(hc: int, wc: int, device: torch.device) -> torch.Tensor:
    """(Hc,Wc) bool, True on the grid's outer ring (first / last row and column), made once per grid."""
    key = (hc, wc, device)
    if key not in _RIMS:
        rim = torch.zeros(hc, wc, dtype=torch.bool, device=device)
        rim[0, :] = rim[-1, :] = rim[:, 0] = rim[:, -1] = True
        _RIMS[key] = rim
    return _RIMS[key]


def fov_lowres(images: torch.Tensor) -> torch.Tensor:
    """(B,C,H,W) in [0,1] -> (B,1,Hc,Wc) bool, True inside the field of view (cells of :func:`cell_size`)."""
    return fov_from_cells(cell_means(images))


def cell_means(images: torch.Tensor) -> torch.Tensor:
    """(B,C,H,W) -> (B,C,Hc,Wc) per-cell channel means (cells of :func:`cell_size`)."""
    _, _, h, w = images.shape
    k = cell_size(h, w)
    hc, wc = h // k, w // k
    return F.avg_pool2d(images[:, :, : hc * k, : wc * k], k) if k > 1 else images


def fov_from_cells(low: torch.Tensor, stop_at_fixed_point: bool = True) -> torch.Tensor:
    """(B,C,Hc,Wc) cell means -> (B,1,Hc,Wc) bool field of view.

    ``stop_at_fixed_point=False`` runs all hc + wc dilations (the same result; a reference for tests
    and for counting what the loop costs without its early exit)."""
    if low.device.type != "cpu":
        # Without the early exit below (it reads a flag: a host sync) an accelerator runs all hc + wc
        # dilations, ~7 tiny kernels each: at 256 px that made one metamorphic-training step ~11 000
        # launches instead of ~2 300 (k=1), 80-99 ms of an H200 step (docs/results/evidence_v3.md "GPU"). The grid
        # is tiny (64 x 64 cells), so one round trip to the host, where the loop stops at its fixed
        # point, is far cheaper. Same result: the fixed point does not move.
        return fov_from_cells(low.detach().cpu(), stop_at_fixed_point).to(low.device)
    hc, wc = low.shape[-2:]
    dark = low.amax(dim=1, keepdim=True) < DARK
    reach = dark & _rim(hc, wc, dark.device)  # the dark cells on the grid's outer ring
    if stop_at_fixed_point and not bool(reach.any()):
        # no dark cell on the rim (no border: a cropped frame): nothing grows, every cell is in view (what the
        # loop and the margin dilation give, in two ops instead of ~25; this runs on the host)
        return torch.ones_like(dark)
    for it in range(_iterations(hc, wc)):
        grown = dilate3(reach) & dark
        # checked on the first step too: a frame without a dark rim (cropped) stops after one dilation
        if stop_at_fixed_point and it % 4 == 0 and torch.equal(grown, reach):
            break  # fixed point: the remaining dilations would change nothing
        reach = grown
    # One more cell of margin so nothing is drawn on the blurry rim of the opening.
    return ~dilate3(reach)


def fov_mask(images: torch.Tensor) -> torch.Tensor:
    """(B,C,H,W) float in [0,1] -> (B,1,H,W) bool, True where the scene is visible (not the black border).

    >>> import torch
    >>> x = torch.full((1, 3, 128, 128), 0.6); x[..., :, :16] = 0.0   # black band on the left
    >>> m = fov_mask(x)
    >>> bool(m[0, 0, 64, 4]), bool(m[0, 0, 64, 100])
    (False, True)
    """
    return fov_cells_to_mask(fov_lowres(images), *images.shape[-2:])


def fov_cells_to_mask(cells: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(B,1,Hc,Wc) bool field-of-view cells -> (B,1,H,W) bool pixels (the last partial cells replicate)."""
    k = cell_size(h, w)
    low = cells.to(torch.uint8)
    full = low.repeat_interleave(k, 2).repeat_interleave(k, 3) if k > 1 else low
    ph, pw = h - full.shape[2], w - full.shape[3]
    if ph or pw:
        full = F.pad(full.float(), (0, pw, 0, ph), mode="replicate").to(torch.uint8)
    return full.bool()


def fov_lowres_np(image: np.ndarray) -> np.ndarray:
    """One HWC image (uint8 or float32 [0,1]) -> (Hc,Wc) bool field-of-view cells; same algorithm as torch."""
    return fov_from_cells_np(cell_means_np(image))


def cell_means_np(image: np.ndarray) -> np.ndarray:
    """One HWC image -> (Hc,Wc,C) per-cell means, same dtype (uint8 means are rounded by OpenCV)."""
    h, w = image.shape[:2]
    k = cell_size(h, w)
    hc, wc = h // k, w // k
    crop = image[: hc * k, : wc * k]
    low = cv2.resize(crop, (wc, hc), interpolation=cv2.INTER_AREA) if k > 1 else crop
    return low[:, :, None] if low.ndim == 2 else low


def fov_from_cells_np(low: np.ndarray) -> np.ndarray:
    """(Hc,Wc,C) cell means (uint8 or float [0,1]) -> (Hc,Wc) bool field of view."""
    thr = DARK * 255 if low.dtype == np.uint8 else DARK
    dark = (low.max(axis=2) < thr).astype(np.uint8)
    # Dark components (8-connected, like the 3x3 dilations of the torch path) touching the edge.
    n, labels = cv2.connectedComponents(dark, connectivity=8)
    edge = np.zeros(n, np.uint8)
    edge[labels[0, :]] = 1
    edge[labels[-1, :]] = 1
    edge[labels[:, 0]] = 1
    edge[labels[:, -1]] = 1
    edge[0] = 0  # label 0 is "not dark"
    reach = edge[labels]
    border = cv2.dilate(reach, np.ones((3, 3), np.uint8), borderType=cv2.BORDER_CONSTANT, borderValue=0)
    return border == 0


def fov_mask_np(image: np.ndarray) -> np.ndarray:
    """One HWC image -> (H,W) bool field-of-view mask (numpy twin of :func:`fov_mask`).

    >>> import numpy as np
    >>> img = np.full((128, 128, 3), 150, np.uint8); img[:, :16] = 0
    >>> m = fov_mask_np(img); bool(m[64, 4]), bool(m[64, 100])
    (False, True)
    """
    h, w = image.shape[:2]
    k = cell_size(h, w)
    low = fov_lowres_np(image).astype(np.uint8)
    full = np.repeat(np.repeat(low, k, 0), k, 1) if k > 1 else low
    ph, pw = h - full.shape[0], w - full.shape[1]
    if ph or pw:
        full = np.pad(full, ((0, ph), (0, pw)), mode="edge")
    return full.astype(bool)
