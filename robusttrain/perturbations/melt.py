"""``melt`` (paper 003's melting relation): remove specular highlights by inpainting; the lesion must not change.

Highlights are detected as bright, low-saturation pixels (``max >= threshold`` and ``max - min <= 0.25``),
dilated, kept off the lesion and the black border, and filled with OpenCV inpainting (Telea or
Navier-Stokes). The dilation and the inpainting radius are fractions of the shorter side (1..5 and
3..5 px on a 512-px image), rounded to whole pixels on the image. The torch path round-trips each image through this numpy path (OpenCV has no
batched GPU inpainting), so it synchronises with the host; melt is a checker relation, not a hot-path
augmentation.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch

from .base import REF_SIDE, Perturbation, short_side
from .border import fov_mask_np


class Melt(Perturbation):
    """Inpaint away specular highlights (non-lesion objects). Severity lowers the detection threshold
    (1: 0.96 .. 5: 0.80) and grows the dilation (1..5 px on a 512-px image), removing more.

    Params: ``threshold`` (B,), ``dilate_rel`` (B,) and ``radius_rel`` (B,) fractions of the shorter side,
    ``method`` (B,) 0 = Telea, 1 = Navier-Stokes.

    Example:
        >>> import numpy as np
        >>> img = np.full((64, 64, 3), 120, np.uint8); img[30:34, 30:34] = 255
        >>> out, _ = Melt(severity=3).apply_numpy(img, rng=np.random.default_rng(0))
        >>> int(out[31, 31, 0]) < 200
        True
    """

    name = "melt"
    trainable = False  # removes content (highlights) it cannot put back: a check, not an augmentation
    THRESH = {1: 0.96, 2: 0.92, 3: 0.88, 4: 0.84, 5: 0.80}
    PARAM_KEYS = ("threshold", "dilate_rel", "method", "radius_rel")

    def _draw(self, r, b):
        th = isinstance(r.uniform(0, 1, (1,)), torch.Tensor)
        zeros = torch.zeros(b, device=r.device) if th else np.zeros(b, np.float32)
        dilate = r.integers(self.severity, self.severity + 1, (b,)) / REF_SIDE
        radius = r.integers(3, 6, (b,)) / REF_SIDE
        f32 = (lambda t: t.float()) if th else (lambda t: np.asarray(t, np.float32))  # noqa: E731
        return {
            "threshold": zeros + self.THRESH[self.severity],
            "dilate_rel": f32(dilate),
            "method": r.integers(0, 2, (b,)),
            "radius_rel": f32(radius),
        }

    def region(self, image: np.ndarray, mask: np.ndarray | None, params: dict) -> np.ndarray:
        """uint8 (H,W) inpainting mask (255 = melt) for one image."""
        f = image.astype(np.float32) / 255 if image.dtype == np.uint8 else image
        hi, lo = f.max(2), f.min(2)
        spot = ((hi >= float(params["threshold"])) & (hi - lo <= 0.25)).astype(np.uint8) * 255
        d = int(round(float(params["dilate_rel"]) * short_side(*image.shape[:2])))
        if d > 0:
            spot = cv2.dilate(spot, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * d + 1, 2 * d + 1)))
        spot[~fov_mask_np(image)] = 0
        if mask is not None:
            spot[mask != 0] = 0
        return spot

    def _apply_np(self, image, mask, params):
        region = self.region(image, mask, params)
        if not region.any():
            return image.copy()
        u8 = image if image.dtype == np.uint8 else np.clip(np.rint(image * 255), 0, 255).astype(np.uint8)
        flag = cv2.INPAINT_NS if int(params["method"]) == 1 else cv2.INPAINT_TELEA
        radius = max(1, int(round(float(params["radius_rel"]) * short_side(*image.shape[:2]))))
        out = cv2.inpaint(np.ascontiguousarray(u8), region, radius, flag)
        if mask is not None:
            out[mask != 0] = u8[mask != 0]  # the lesion is never touched
        if image.dtype == np.uint8:
            return out
        # float input: change only the melted pixels, keep the rest bit-identical
        res = image.copy()
        sel = region > 0
        res[sel] = out[sel].astype(np.float32) / 255
        return res

    def _apply_torch(self, images, masks, params):
        # Round-trip through the numpy path (documented: OpenCV inpainting, host sync).
        outs = []
        for i in range(images.shape[0]):
            img = images[i].permute(1, 2, 0).detach().cpu().numpy().astype(np.float32)
            m = None if masks is None else masks[i].cpu().numpy()
            p = {k: v[i].cpu().numpy() for k, v in params.items()}
            outs.append(torch.from_numpy(self._apply_np(np.ascontiguousarray(img), m, p)).permute(2, 0, 1))
        return torch.stack(outs).to(images.device, images.dtype)
