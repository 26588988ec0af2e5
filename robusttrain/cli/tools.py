"""``check``, ``corners``, ``gallery``, ``report``: thin glue from the command line to library code."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from robusttrain.cli.errors import UsageError


def _only(overrides: list[str], allowed: set[str], command: str) -> dict[str, str]:
    out = {}
    for o in overrides:
        k, v = o.split("=", 1)
        if k not in allowed:
            raise UsageError(f"unknown key '{k}' for {command}; valid keys: {', '.join(sorted(allowed))}")
        out[k] = v
    return out


def _sample_images(datamodule, n: int) -> list[np.ndarray]:
    """First ``n`` validation images of a datamodule as HWC uint8 (for the gallery)."""
    datamodule.setup("fit")
    ds = datamodule.val_dataset
    images = []
    for i in range(min(n, len(ds))):
        img = ds[i]["image"].permute(1, 2, 0).numpy()
        if img.shape[2] == 1:
            img = np.repeat(img, 3, axis=2)
        images.append((np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8))
    return images


def gallery(recipe: str | None, overrides: list[str], positional: list[str]) -> int:
    from robusttrain.cli.build import build
    from robusttrain.cli.compose import compose_recipe
    from robusttrain.perturbations.gallery import render_gallery

    if positional:
        raise UsageError(f"unexpected argument '{positional[0]}' (expected key=value)")
    opts = [o for o in overrides if not o.startswith(("out=", "n="))]
    extra = _only([o for o in overrides if o.startswith(("out=", "n="))], {"out", "n"}, "gallery")
    cfg = compose_recipe(recipe or "polyp", opts)
    images = _sample_images(build("data", cfg.data), int(extra.get("n", 2)))
    out = render_gallery(images, extra.get("out", "gallery.png"))
    print(f"[robusttrain] gallery written to {Path(out).resolve()}")
    return 0
