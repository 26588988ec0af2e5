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
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

Params = dict[str, torch.Tensor]


def index_params(params: Params, i: int) -> dict[str, np.ndarray]:
    """Params of sample ``i`` as numpy arrays (the numpy path's schema)."""
    return {k: v[i].detach().cpu().numpy() for k, v in params.items()}


def stack_params(items: list[dict[str, Any]]) -> Params:
    """Inverse of :func:`index_params`: per-sample dicts -> batched tensors."""
    if not items:
        raise ValueError("stack_params: empty list of per-sample params")
    keys = items[0].keys()
    return {k: torch.as_tensor(np.stack([np.asarray(it[k]) for it in items])) for k in keys}
