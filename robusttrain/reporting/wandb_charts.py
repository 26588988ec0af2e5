"""W&B objects built from run-directory data: corner-case line series, failure-table rows, summary.

No Lightning here (the callback in ``robusttrain.callbacks.reporting`` decides *when* to log);
``wandb`` is imported lazily so the rest of reporting works without it.

>>> import pandas as pd
>>> from robusttrain.rundir.corner_cases import Corners
>>> h = pd.DataFrame({"case_id": ["a", "b"] * 2, "epoch": [0, 0, 1, 1], "dice_lv": [.5, .9, .3, .9]})
>>> sorted(corner_case_charts(h, Corners(cases=["a"], balanced_epoch=0)))
['corners/dice_lv']
>>> summary_items(Corners(cases=["a"], balanced_epoch=0, policy="maximin"))["corners/cases"]
'a'
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from robusttrain.metamorphic.efr import efr_metrics
from robusttrain.metamorphic.records import relative_drop
from robusttrain.reporting import load
from robusttrain.rundir import efr as efr_file
from robusttrain.rundir.corner_cases import Corners
from robusttrain.rundir.history import dice_columns

FAILURE_COLUMNS = [
    "epoch",
    "case_id",
    "split",
    "perturbation",
    "severity",
    "src_dice",
    "fol_dice",
    "dice_drop",
    "source",
    "followup",
]


def corner_case_charts(history: pd.DataFrame, corners: Corners) -> dict[str, Any]:
    """``{"corners/dice_<class>": wandb.plot.line_series}``: each flagged case's Dice over epochs,
    the cohort mean, and the least-loss / balanced epochs as vertical 0–1 segments (line series
    cannot draw markers, and a vertical series reads as one in the W&B panel)."""
    import wandb

    charts = {}
    epochs = sorted(int(e) for e in history["epoch"].unique())
    known = set(history["case_id"])
    for col in dice_columns(history):
        xs, ys, keys = [], [], []
        for cid in corners.cases:
            if cid not in known:
                continue
            case = history[history["case_id"] == cid].sort_values("epoch")
            xs.append(case["epoch"].astype(int).tolist())
            ys.append(case[col].astype(float).tolist())
            keys.append(str(cid))
        if not keys:
            continue
        mean = load.cohort_mean(history, col)
        xs.append([int(e) for e in mean.index])
        ys.append(mean.astype(float).tolist())
        keys.append("cohort mean")
        for label, ep in (
            ("least-loss epoch", corners.least_loss_epoch),
            ("balanced epoch", corners.balanced_epoch),
        ):
            if ep is not None:
                xs.append([int(ep), int(ep)])
                ys.append([0.0, 1.0])
                keys.append(f"{label} {ep}")
        title = f"Corner cases: {col} vs cohort mean (epochs {epochs[0]}–{epochs[-1]})"
        charts[f"corners/{col}"] = wandb.plot.line_series(xs=xs, ys=ys, keys=keys, title=title, xname="epoch")
    return charts


def summary_items(corners: Corners) -> dict[str, Any]:
    """Run-summary entries: balanced / least-loss epoch, policy, flagged cases (comma-joined so the
    W&B runs table can show and filter them)."""
    out: dict[str, Any] = {"corners/cases": ",".join(corners.cases), "corners/n_cases": len(corners.cases)}
    if corners.balanced_epoch is not None:
        out["corners/balanced_epoch"] = int(corners.balanced_epoch)
    if corners.least_loss_epoch is not None:
        out["corners/least_loss_epoch"] = int(corners.least_loss_epoch)
    if corners.policy:
        out["corners/policy"] = str(corners.policy)
    return out


def efr_scalars(efr: pd.DataFrame, epoch: int | None = None, split: str = "val") -> dict[str, float]:
    """``mr/efr/<perturbation>/<metric>@<t>`` (severities pooled) of one epoch of ``efr.csv`` and beside
    them ``mr/perturbed_dice/<perturbation | all | heldout | trained | worst_family>`` (the mean Dice
    on the perturbed images; absent where an old file did not record it) — the documented keys
    (:func:`robusttrain.metamorphic.efr.efr_metrics`), for when no MetamorphicCallback logged them itself."""
    frame = efr_file.pool_severities(efr)
    if "split" in frame:
        frame = frame[frame["split"] == split]
    if not len(frame):
        return {}
    epoch = int(frame["epoch"].max()) if epoch is None else epoch
    frame = frame[frame["epoch"] == epoch].assign(severity=0)
    return {k: v for k, v in efr_metrics(frame).items() if np.isfinite(v)}


def _mask_image(
    image: np.ndarray,
    gt: np.ndarray | None,
    pred: np.ndarray | None,
    class_labels: dict[int, str],
    caption: str,
) -> Any:
    import wandb

    masks = {}
    if gt is not None:
        masks["ground_truth"] = {"mask_data": np.asarray(gt, dtype=np.uint8), "class_labels": class_labels}
    if pred is not None:
        masks["prediction"] = {"mask_data": np.asarray(pred, dtype=np.uint8), "class_labels": class_labels}
    return wandb.Image(np.asarray(image), masks=masks or None, caption=caption)


def class_labels_for(names: list[str] | None, masks: list[np.ndarray | None]) -> dict[int, str]:
    """``{0: "background", 1: name, …}`` covering every label value present in ``masks``."""
    top = max([int(np.max(m)) for m in masks if m is not None and np.size(m)] + [1])
    names = list(names or [])
    return {
        0: "background",
        **{k: names[k - 1] if k - 1 < len(names) else f"class{k}" for k in range(1, top + 1)},
    }


def failure_row(
    record: dict[str, Any],
    images: dict[str, np.ndarray] | None = None,
    class_names: list[str] | None = None,
    thumb: str | None = None,
) -> list[Any]:
    """One failure-table row (:data:`FAILURE_COLUMNS`).

    ``images`` is the MR callback's failure dict (``source``/``followup`` HWC uint8,
    ``gt``/``pred_source``/``pred_followup`` HW label maps): source and follow-up are logged with
    ground truth and the respective prediction as mask overlays. Without it, the failure bank's
    thumbnail strip (when given) stands in as the source image and the follow-up cell is empty.
    """
    import wandb

    src, fol = float(record.get("src_dice", np.nan)), float(record.get("fol_dice", np.nan))
    drop = record.get("drop")
    drop = float(drop) if drop is not None else relative_drop(src, fol)
    source = followup = None
    if images and images.get("source") is not None:
        gt = images.get("gt")
        labels = class_labels_for(class_names, [gt, images.get("pred_source"), images.get("pred_followup")])
        source = _mask_image(
            images["source"], gt, images.get("pred_source"), labels, f"source Dice {src:.3f}"
        )
        if images.get("followup") is not None:
            followup = _mask_image(
                images["followup"], gt, images.get("pred_followup"), labels, f"follow-up Dice {fol:.3f}"
            )
    elif thumb:
        source = wandb.Image(thumb, caption="source | follow-up | GT | pred(source) | pred(follow-up)")
    return [
        int(record.get("epoch", -1)),
        str(record.get("case_id")),
        str(record.get("split")),
        str(record.get("perturbation")),
        int(record.get("severity", 0)),
        src,
        fol,
        drop,
        source,
        followup,
    ]
