"""A hand-made run directory in the documented file formats (docs/design.md), shared by the
reporting tests. These are fixtures of the *file format*, not mocks of the writers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

CLASSES = ["rv", "myo", "lv"]
PERTURBATIONS = ["blur", "contrast", "specularity"]
CORNER = "patient007"


def write_png(path: Path, seed: int, size=(48, 96)) -> Path:
    import matplotlib.image

    path.parent.mkdir(parents=True, exist_ok=True)
    rgb = np.random.default_rng(seed).random((*size, 3))
    matplotlib.image.imsave(path, rgb)
    return path


def perturbed_dice(epoch: int, p_i: int, severity: int) -> float:
    """The hand-made mean perturbed Dice of a row of :func:`make_run_dir` (``endpoints=True``)."""
    return 0.9 - 0.1 * p_i - 0.05 * severity / 2 + 0.01 * epoch


def make_run_dir(
    root: Path,
    epochs: int = 6,
    cases: int = 8,
    corners: bool = True,
    failures: bool = True,
    endpoints: bool = False,
    heldout: tuple[str, ...] = (),
) -> Path:
    """``endpoints=False``: an ``efr.csv`` as written before the Dice columns existed; True: with them
    (:func:`perturbed_dice`, clean Dice 0.9), ``heldout`` families labelled."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for e in range(epochs):
        for c in range(cases):
            cid = f"patient{c:03d}"
            base = 0.4 + 0.5 * (1 - np.exp(-(e + 1) / 2))
            if cid == CORNER:  # planted collapse at the last two epochs
                base = 0.3 if e >= epochs - 2 else base - 0.2
            d = np.clip(base + 0.03 * rng.standard_normal(len(CLASSES)), 0, 1)
            rows.append(
                {
                    "case_id": cid,
                    "epoch": e,
                    **{f"dice_{k}": v for k, v in zip(CLASSES, d)},
                    **{f"iou_{k}": v / (2 - v) for k, v in zip(CLASSES, d)},
                }
            )
    pd.DataFrame(rows).to_csv(root / "history.csv", index=False)

    efr = []
    for e in range(epochs):
        for p_i, p in enumerate(PERTURBATIONS):
            for s in (2, 4):
                for metric in ("dice", "iou"):
                    for t in (0.5, 0.25):
                        errors = int(
                            max(0, cases - e - p_i)
                            * (s / 4)
                            * (1.5 if t == 0.25 else 1)
                            * (1.2 if metric == "iou" else 1)
                        ) % (cases + 1)
                        efr.append(
                            {
                                "epoch": e,
                                "split": "val",
                                "perturbation": p,
                                "severity": s,
                                "metric": metric,
                                "threshold": t,
                                "errors": errors,
                                "cases": cases,
                                "efr": errors / cases,
                                "heldout": p in heldout,
                                "mean_src_dice": 0.9,
                                "mean_fol_dice": perturbed_dice(e, p_i, s),
                            }
                        )
    efr = pd.DataFrame(efr)
    # the MetamorphicCallback also writes pooled rows: severity 0 per perturbation, and "all"
    keys = ["epoch", "split", "perturbation", "metric", "threshold"]
    # equal cases per severity: a family's mean Dice is the mean of its severities' (all: of its families')
    pooled = efr.groupby(keys, as_index=False).agg(
        errors=("errors", "sum"),
        cases=("cases", "sum"),
        heldout=("heldout", "first"),
        mean_src_dice=("mean_src_dice", "mean"),
        mean_fol_dice=("mean_fol_dice", "mean"),
    )
    pooled = pooled.assign(severity=0)
    every = pooled.groupby(["epoch", "split", "metric", "threshold"], as_index=False).agg(
        errors=("errors", "sum"),
        cases=("cases", "sum"),
        mean_src_dice=("mean_src_dice", "mean"),
        mean_fol_dice=("mean_fol_dice", "mean"),
        worst_family_dice=("mean_fol_dice", "min"),
    )
    every = every.assign(severity=0, perturbation="all", heldout=False, worst_family=PERTURBATIONS[-1])
    efr = pd.concat([efr, pooled, every], ignore_index=True)
    efr["efr"] = efr["errors"] / efr["cases"]
    if not endpoints:
        efr = efr.drop(
            columns=["heldout", "mean_src_dice", "mean_fol_dice", "worst_family", "worst_family_dice"]
        )
    efr.to_csv(root / "efr.csv", index=False)
    (root / "config.yaml").write_text(f"recipe: acdc\ntrainer:\n  max_epochs: {epochs}\n")

    if corners:
        (root / "corner_cases.json").write_text(
            json.dumps(
                {
                    # BalancedCheckpoint's schema (robusttrain.rundir.corner_cases)
                    "corner_cases": [{"case_id": CORNER, "score": 12.5}],
                    # epochs a run of this length can have (the reader refuses others)
                    "outlier_epochs": {CORNER: sorted({max(epochs - 2, 0), epochs - 1})},
                    "balanced_epoch": max(epochs - 3, 0),
                    "least_loss_epoch": epochs - 1,
                    "policy": "last_inlier",
                    "reason": "last epoch with no corner-case outlier",
                }
            )
        )
    if failures:  # the FailureBank's log: failure lines by id, batches closed by a marker
        fdir = root / "failures"
        lines = []
        for i in range(5):
            rid = f"{i:016x}"
            write_png(fdir / "thumbs" / f"{rid}.png", i, size=(48, 240))
            rec = {
                "kind": "failure",
                "id": rid,
                "last_epoch": epochs - 1,
                "count": 1,
                "case_id": f"patient{i:03d}",
                "split": "val",
                "perturbation": PERTURBATIONS[i % 3],
                "severity": 4,
                "params": {"sigma": [3.0]},
                "seed": i,
                "epoch": epochs - 1,
                "src_dice": 0.9,
                "fol_dice": 0.9 - 0.1 * (i + 3),
                "src_iou": 0.8,
                "fol_iou": 0.2,
                "index": i,
                "slice_index": 0,
                "extra": {},
            }
            rec["drop"] = (rec["src_dice"] - rec["fol_dice"]) / rec["src_dice"]
            lines.append(json.dumps(rec))
        lines.append(json.dumps({"kind": "batch", "epoch": epochs - 1, "seen": [], "n": 5}))
        (fdir / "failures.jsonl").write_text("\n".join(lines) + "\n")
    return root
