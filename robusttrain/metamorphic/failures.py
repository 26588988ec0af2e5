"""Turning MR violations into FailureRecords (+ thumbnail images for the worst ones).

A violation is a test case whose mean-foreground Dice dropped by more than ``threshold``
relative to its source. For a multi-slice case the record points at the slice whose Dice
dropped most (its dataset index, slice index, exact params and seed), and lists every
slice in ``extra["slices"]`` so the whole follow-up volume can be re-created.

>>> from robusttrain.metamorphic.failures import build_failures   # used by the callback / audit
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import torch

from .batch import BatchHooks, iter_probe
from .records import FailureRecord
from .runner import ProbeResult, worst_slice
from .scoring import probabilities_to_labels
from .suite import MRSuite, _to_uint8_hwc, volume_to_slices


def _params_lists(p: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {k: v[0].tolist() for k, v in p.items()}


def build_failures(
    res: ProbeResult,
    cases: pd.DataFrame,
    suite: MRSuite,
    dataset: Any,
    hooks: BatchHooks,
    predict: Callable | None,
    path: str,
    threshold: float,
    n_images: int,
    epoch: int,
    device: Any = None,
    id_prefix: str = "idx",
) -> list[tuple[FailureRecord, dict | None]]:
    """Records of every violation in ``cases`` (worst first); images for the ``n_images`` worst.

    Images are re-created from ``dataset`` (so they work for cases scored on other ranks):
    ``source``/``followup`` HWC uint8, ``gt``/``pred_source``/``pred_followup`` HW uint8.
    """
    if not len(cases):
        return []
    bad = cases[cases["drop_dice"] > threshold].sort_values("drop_dice", ascending=False, kind="stable")
    test_of = {t: k for k, t in enumerate(suite.tests)}
    rows_of: dict[str, list[int]] = {}
    for i, c in enumerate(res.case_id):
        rows_of.setdefault(c, []).append(i)
    out = []
    for n, r in enumerate(bad.itertuples()):
        k = test_of[(r.perturbation, int(r.severity))]
        w = worst_slice(res, r.case_id, k)
        load = lambda i: next(iter_probe(dataset, [int(res.index[i])], 1, hooks, id_prefix=id_prefix))
        slices: list[dict[str, Any]] = []
        for i in rows_of[r.case_id]:
            si = int(res.slice_index[i])
            p = suite.cached(res.split, k, r.case_id, si)
            if p is None:  # scored on another rank: re-sample (deterministic) from the image
                q = load(i)
                p = suite.params_for(res.split, k, [r.case_id], [si], q.images, q.masks)[0]
            slices.append(
                {
                    "index": int(res.index[i]),
                    "slice_index": si,
                    "seed": suite.slice_seed(r.case_id, k, si),
                    "params": _params_lists(p),
                }
            )
        main = next(s for s in slices if s["index"] == int(res.index[w]))
        rec = FailureRecord(
            case_id=r.case_id,
            split=res.split,
            perturbation=r.perturbation,
            severity=int(r.severity),
            params=main["params"],
            seed=main["seed"],
            epoch=int(epoch),
            src_dice=float(r.src_dice),
            fol_dice=float(r.fol_dice),
            src_iou=float(r.src_iou),
            fol_iou=float(r.fol_iou),
            index=main["index"],
            slice_index=main["slice_index"],
            extra={
                "consistency": float(r.consistency),
                "case_seed": int(r.seed),
                "threshold": threshold,
                "slices": slices if len(slices) > 1 else [],
            },
        )
        imgs = None
        if predict is not None and n < n_images:
            imgs = _images(load(w), suite, k, res.split, predict, path, device)
        out.append((rec, imgs))
    return out


def _images(pb, suite: MRSuite, k: int, split: str, predict: Callable, path: str, device) -> dict:
    images = pb.images if device is None else pb.images.to(device)
    masks = pb.masks.to(images.device)
    params = suite.params_for(split, k, pb.case_ids, pb.slice_indices, pb.images, pb.masks)
    fol = suite.apply(k, images, masks, params, path=path)
    lab = probabilities_to_labels(predict(torch.cat([images, fol])))
    src_img, fol_img, gt, lab0, lab1 = images[0], fol[0], masks[0], lab[0], lab[1]
    if images.ndim == 5:  # a volume: show the slice (along the suite's axis) with the most foreground
        ax = suite.slice_axis
        sl = lambda t, ch: volume_to_slices(t[None], ax, channels=ch)
        j = int((sl(gt, False) > 0).flatten(1).sum(1).argmax())
        src_img, fol_img = sl(src_img, True)[j], sl(fol_img, True)[j]
        gt, lab0, lab1 = sl(gt, False)[j], sl(lab0, False)[j], sl(lab1, False)[j]
    u8 = lambda t: t.cpu().numpy().astype(np.uint8)
    return {
        "source": _to_uint8_hwc(src_img),
        "followup": _to_uint8_hwc(fol_img),
        "gt": u8(gt),
        "pred_source": u8(lab0),
        "pred_followup": u8(lab1),
    }
