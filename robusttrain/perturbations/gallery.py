"""A PNG grid for judging realism by eye: original + each perturbation at a few severities, per image.

For each image a block of rows, one per perturbation: the original, then that perturbation at each
severity (``name@severity``); blocks are stacked vertically.
Drawn with OpenCV (labels via cv2.putText) and written atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np

from ..io import atomic_write_bytes
from .registry import get

DEFAULT_NAMES = (
    "saturation",
    "contrast",
    "white_balance",
    "specularity",
    "blur",
    "motion_blur",
    "instrument",
    "feces",
    "blood",
    "text",
    "melt",
    "jpeg",
    "defocus",
    "vignetting",
    "sensor_noise",
    "randconv",
    "fourier_mix",
)


def render_gallery(
    images: list[np.ndarray],
    out_path: str | Path,
    names: Sequence[str] | None = None,
    severities: Sequence[int] = (1, 3, 5),
    masks: list[np.ndarray] | None = None,
    tile: int = 192,
    seed: int = 0,
    colors: int | None = None,
) -> Path:
    """Render the grid for HWC uint8 RGB ``images`` and write it to ``out_path`` (PNG); returns the path.

    ``colors``: write a palette PNG of that many colours (2..256, octree + dithering; a third of the size,
    for galleries kept in a repository) instead of full colour.

    >>> import numpy as np, tempfile, pathlib
    >>> img = np.full((64, 64, 3), 140, np.uint8)
    >>> p = render_gallery([img], pathlib.Path(tempfile.mkdtemp()) / "g.png", names=["blur"], severities=(1, 5))
    >>> p.exists()
    True
    >>> render_gallery([img], p, names=["gibbs"], severities=(5,)).exists()   # grey-only family on RGB tiles
    True
    """
    if not images:
        raise ValueError("render_gallery: no images given; expected a list of HWC uint8 RGB arrays")
    if colors is not None and not (isinstance(colors, int) and 2 <= colors <= 256):
        raise ValueError(
            f"render_gallery: colors must be an int in 2..256 (palette PNG) or None, got {colors!r}"
        )
    if not (isinstance(tile, int) and tile >= 32):
        raise ValueError(f"render_gallery: tile must be an int >= 32 (pixels per tile), got {tile!r}")
    names = list(names) if names is not None else list(DEFAULT_NAMES)
    rng = np.random.default_rng(seed)
    rows = []

    def label(t: np.ndarray, text: str) -> np.ndarray:
        t = np.ascontiguousarray(t[:, :, ::-1])  # BGR for OpenCV
        cv2.rectangle(t, (0, 0), (tile, 16), (0, 0, 0), -1)
        cv2.putText(t, text, (3, 12), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (255, 255, 255), 1, cv2.LINE_AA)
        return t

    for i, img in enumerate(images):
        if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            raise ValueError(
                f"render_gallery: image {i} must be an HWC uint8 RGB array, got "
                f"{getattr(img, 'dtype', type(img).__name__)} {getattr(img, 'shape', '')}"
            )
        mask = None if masks is None else masks[i]
        small = cv2.resize(img, (tile, tile), interpolation=cv2.INTER_AREA)
        for name in names:
            tiles = [label(small, f"original #{i}")]
            for sev in severities:
                op = get(name, severity=sev)
                if op.grey_only:  # MRI / X-ray families: on the grey image, shown as RGB
                    out = op.apply_numpy(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), mask, rng=rng)[0]
                    out = np.repeat(out.reshape(out.shape[0], out.shape[1], 1), 3, axis=2)
                else:
                    out = op.apply_numpy(img, mask, rng=rng)[0]
                tiles.append(
                    label(cv2.resize(out, (tile, tile), interpolation=cv2.INTER_AREA), f"{name}@{sev}")
                )
            rows.append(np.concatenate(tiles, 1))
    grid = np.concatenate(rows, 0)
    if colors is not None:
        import io

        from PIL import Image

        buf = io.BytesIO()
        pal = Image.fromarray(np.ascontiguousarray(grid[:, :, ::-1])).quantize(
            colors, method=Image.Quantize.FASTOCTREE
        )
        pal.save(buf, format="PNG", optimize=True)
        return atomic_write_bytes(out_path, buf.getvalue())
    ok, enc = cv2.imencode(".png", grid)
    if not ok:
        raise RuntimeError("render_gallery: PNG encoding failed")
    return atomic_write_bytes(out_path, enc.tobytes())
